//! Real-process crash test of the transaction coordinator: a `vela
//! standalone` with `--transaction-coordinator-enabled` gets transactions
//! over the Pulsar protocol (TC_CLIENT_CONNECT, NEW_TXN,
//! ADD_PARTITION_TO_TXN, END_TXN), is killed with SIGKILL, restarts on the
//! same data directory, and then: the open transaction is still OPEN with
//! its partition (admin API), the committed one is gone (a second commit is
//! TransactionNotFound), the open one commits, and new transaction ids are
//! not reused.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use common::Standalone;
use vela_wire::proto::{self, BaseCommand, ServerError};
use vela_wire::{FrameDecoder, encode_command};

const IO_TIMEOUT: Duration = Duration::from_secs(30);

/// A standalone with the transaction coordinator on `dir`, which outlives it.
fn start_with_coordinator(dir: &Path) -> Standalone {
    Standalone::start_in(dir, &["--transaction-coordinator-enabled"])
}

/// One Pulsar protocol connection, one request at a time.
struct Conn {
    stream: TcpStream,
    decoder: FrameDecoder,
    buf: BytesMut,
    next_request: u64,
}

impl Conn {
    fn connect(addr: SocketAddr) -> Conn {
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(IO_TIMEOUT)).unwrap();
        let mut conn = Conn {
            stream,
            decoder: FrameDecoder::new(vela_wire::FRAME_SIZE_MAX_DEFAULT_BYTES),
            buf: BytesMut::new(),
            next_request: 1,
        };
        conn.send(BaseCommand::from(proto::CommandConnect {
            client_version: "txn-crash-test".into(),
            protocol_version: Some(21),
            ..Default::default()
        }));
        let connected = conn.receive();
        assert!(connected.connected.is_some(), "{connected:?}");
        conn
    }

    fn send(&mut self, command: BaseCommand) {
        let mut out = BytesMut::new();
        encode_command(&command, &mut out);
        self.stream.write_all(&out).unwrap();
    }

    fn receive(&mut self) -> BaseCommand {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf).unwrap() {
                let command = frame.command.into_base_command();
                if command.ping.is_some() {
                    self.send(BaseCommand::from(proto::CommandPong {}));
                    continue;
                }
                return command;
            }
            let mut chunk = [0u8; 4096];
            let n = self.stream.read(&mut chunk).unwrap();
            assert!(n > 0, "the broker closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    fn tc_connect(&mut self, tc_id: u64) {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandTcClientConnectRequest {
            request_id,
            tc_id,
        }));
        let response = self.receive().tc_client_connect_response.unwrap();
        assert_eq!(response.request_id, request_id);
        assert_eq!(response.error, None, "{:?}", response.message);
    }

    fn new_txn(&mut self) -> (u64, u64) {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandNewTxn {
            request_id,
            txn_ttl_seconds: Some(600_000),
            tc_id: Some(0),
        }));
        let response = self.receive().new_txn_response.unwrap();
        assert_eq!(response.error, None, "{:?}", response.message);
        (
            response.txnid_most_bits.unwrap(),
            response.txnid_least_bits.unwrap(),
        )
    }

    fn add_partition(&mut self, txn: (u64, u64), topic: &str) {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandAddPartitionToTxn {
            request_id,
            txnid_most_bits: Some(txn.0),
            txnid_least_bits: Some(txn.1),
            partitions: vec![topic.to_string()],
        }));
        let response = self.receive().add_partition_to_txn_response.unwrap();
        assert_eq!(response.error, None, "{:?}", response.message);
    }

    /// END_TXN(COMMIT): the error code, if any.
    fn commit(&mut self, txn: (u64, u64)) -> Option<i32> {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandEndTxn {
            request_id,
            txnid_most_bits: Some(txn.0),
            txnid_least_bits: Some(txn.1),
            txn_action: Some(proto::TxnAction::Commit as i32),
        }));
        let response = self.receive().end_txn_response.unwrap();
        assert_eq!(response.request_id, request_id);
        response.error
    }
}

fn metadata_path(txn: (u64, u64)) -> String {
    format!(
        "/admin/v3/transactions/transactionMetadata/{}/{}",
        txn.0, txn.1
    )
}

#[test]
fn transactions_survive_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let topic = "persistent://public/default/txn-crash";

    let broker = start_with_coordinator(dir.path());
    let mut conn = Conn::connect(broker.pulsar_addr);
    conn.tc_connect(0);
    let open = conn.new_txn();
    conn.add_partition(open, topic);
    let committed = conn.new_txn();
    assert_eq!(conn.commit(committed), None);
    let (status, body) = broker.http_get(&metadata_path(open));
    assert_eq!(status, 200, "{body}");
    assert!(body.contains("\"OPEN\""), "{body}");
    drop(conn);
    broker.kill_9();

    let broker = start_with_coordinator(dir.path());
    let mut conn = Conn::connect(broker.pulsar_addr);
    conn.tc_connect(0);
    let (status, body) = broker.http_get(&metadata_path(open));
    assert_eq!(status, 200, "the open transaction is recovered: {body}");
    assert!(body.contains("\"OPEN\"") && body.contains(topic), "{body}");
    assert_eq!(broker.http_get(&metadata_path(committed)).0, 404);
    assert_eq!(
        conn.commit(committed),
        Some(ServerError::TransactionNotFound as i32),
        "a committed transaction stays ended"
    );
    let next = conn.new_txn();
    assert!(
        next.1 > open.1 && next.1 > committed.1,
        "ids are not reused: {next:?} after {open:?}, {committed:?}"
    );
    assert_eq!(conn.commit(open), None);
    assert_eq!(broker.http_get(&metadata_path(open)).0, 404);
}
