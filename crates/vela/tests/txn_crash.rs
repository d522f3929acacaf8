//! Real-process crash test of the transaction coordinator: a `vela
//! standalone` with `--transaction-coordinator-enabled` gets transactions
//! over the Pulsar protocol (TC_CLIENT_CONNECT, NEW_TXN,
//! ADD_PARTITION_TO_TXN, END_TXN), is killed with SIGKILL, restarts on the
//! same data directory, and then: the open transaction is still OPEN with
//! its partition (admin API), the committed one is gone (a second commit is
//! TransactionNotFound), the open one commits, and new transaction ids are
//! not reused. And a consume-transform-produce loop in transactions (input
//! topic → output topic, acks and sends in one transaction each batch),
//! killed with SIGKILL at a random transaction, restarted and continued:
//! the output holds every input exactly once, in order.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::VecDeque;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::path::Path;
use std::time::Duration;

use bytes::BytesMut;
use common::Standalone;
use vela_wire::proto::MessageIdData;
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
    /// MESSAGE frames read while waiting for an answer: (id, payload).
    messages: VecDeque<(MessageIdData, String)>,
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
            messages: VecDeque::new(),
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

    /// The next command other than PING and MESSAGE (kept in `messages`).
    fn receive(&mut self) -> BaseCommand {
        loop {
            if let Some(command) = self.receive_any(None) {
                return command;
            }
        }
    }

    /// The next frame's command, MESSAGE frames kept in `messages` (then
    /// `None`); `None` too when `wait` passes without a frame.
    fn receive_any(&mut self, wait: Option<Duration>) -> Option<BaseCommand> {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf).unwrap() {
                let payload = frame.payload.as_ref().map(|p| p.payload());
                let command = frame.command.into_base_command();
                if command.ping.is_some() {
                    self.send(BaseCommand::from(proto::CommandPong {}));
                    continue;
                }
                if command.active_consumer_change.is_some() {
                    continue;
                }
                if let Some(message) = &command.message {
                    let payload = String::from_utf8_lossy(&payload.unwrap()).into_owned();
                    self.messages
                        .push_back((message.message_id.clone(), payload));
                    return None;
                }
                return Some(command);
            }
            self.stream
                .set_read_timeout(Some(wait.unwrap_or(IO_TIMEOUT)))
                .unwrap();
            let mut chunk = [0u8; 4096];
            let n = match self.stream.read(&mut chunk) {
                Ok(n) => n,
                Err(e)
                    if wait.is_some()
                        && matches!(
                            e.kind(),
                            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                        ) =>
                {
                    return None;
                }
                Err(e) => panic!("reading from the broker: {e}"),
            };
            assert!(n > 0, "the broker closed the connection");
            self.buf.extend_from_slice(&chunk[..n]);
        }
    }

    /// The next message, waiting at most `wait`.
    fn next_message(&mut self, wait: Duration) -> Option<(MessageIdData, String)> {
        while self.messages.is_empty() {
            if let Some(command) = self.receive_any(Some(wait)) {
                panic!("unexpected {command:?}");
            }
            if self.messages.is_empty() {
                return None; // nothing within `wait`
            }
        }
        self.messages.pop_front()
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
        self.new_txn_timing_out(600_000)
    }

    fn new_txn_timing_out(&mut self, timeout_ms: u64) -> (u64, u64) {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandNewTxn {
            request_id,
            txn_ttl_seconds: Some(timeout_ms),
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

    fn add_subscription(&mut self, txn: (u64, u64), topic: &str, subscription: &str) {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandAddSubscriptionToTxn {
            request_id,
            txnid_most_bits: Some(txn.0),
            txnid_least_bits: Some(txn.1),
            subscription: vec![proto::Subscription {
                topic: topic.to_string(),
                subscription: subscription.to_string(),
            }],
        }));
        let response = self.receive().add_subscription_to_txn_response.unwrap();
        assert_eq!(response.error, None, "{:?}", response.message);
    }

    fn create_producer(&mut self, topic: &str, producer_id: u64) {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandProducer {
            topic: topic.to_string(),
            producer_id,
            request_id,
            ..Default::default()
        }));
        let answer = self.receive();
        assert!(answer.producer_success.is_some(), "{answer:?}");
    }

    /// Sends one message (in `txn`, if any) and waits for its receipt.
    fn publish(&mut self, producer_id: u64, seq: u64, txn: Option<(u64, u64)>, payload: &str) {
        let command = BaseCommand::from(proto::CommandSend {
            producer_id,
            sequence_id: seq,
            txnid_most_bits: txn.map(|t| t.0),
            txnid_least_bits: txn.map(|t| t.1),
            ..Default::default()
        });
        let metadata = proto::MessageMetadata {
            producer_name: format!("p{producer_id}"),
            sequence_id: seq,
            publish_time: 1_700_000_000_000,
            ..Default::default()
        };
        let mut out = BytesMut::new();
        vela_wire::encode_payload_frame(&command, &metadata, payload.as_bytes(), &mut out);
        self.stream.write_all(&out).unwrap();
        let receipt = self.receive();
        assert!(receipt.send_receipt.is_some(), "{receipt:?}");
    }

    /// Subscribes (Exclusive, from the earliest message) and asks for
    /// `permits` messages.
    fn subscribe(&mut self, topic: &str, subscription: &str, consumer_id: u64, permits: u32) {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandSubscribe {
            topic: topic.to_string(),
            subscription: subscription.to_string(),
            sub_type: proto::command_subscribe::SubType::Exclusive as i32,
            consumer_id,
            request_id,
            consumer_name: Some(format!("c{consumer_id}")),
            initial_position: Some(proto::command_subscribe::InitialPosition::Earliest as i32),
            ..Default::default()
        }));
        let answer = self.receive();
        assert!(answer.success.is_some(), "{answer:?}");
        self.send(BaseCommand::from(proto::CommandFlow {
            consumer_id,
            message_permits: permits,
        }));
    }

    /// A transactional ACK: the error code, if any.
    fn ack_in(&mut self, consumer_id: u64, id: &MessageIdData, txn: (u64, u64)) -> Option<i32> {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandAck {
            consumer_id,
            ack_type: proto::command_ack::AckType::Individual as i32,
            message_id: vec![MessageIdData {
                ledger_id: id.ledger_id,
                entry_id: id.entry_id,
                ..Default::default()
            }],
            txnid_most_bits: Some(txn.0),
            txnid_least_bits: Some(txn.1),
            request_id: Some(request_id),
            ..Default::default()
        }));
        let response = self.receive().ack_response.unwrap();
        assert_eq!(response.request_id, Some(request_id));
        response.error
    }

    /// END_TXN(ABORT): the error code, if any.
    fn abort(&mut self, txn: (u64, u64)) -> Option<i32> {
        let request_id = self.request_id();
        self.send(BaseCommand::from(proto::CommandEndTxn {
            request_id,
            txnid_most_bits: Some(txn.0),
            txnid_least_bits: Some(txn.1),
            txn_action: Some(proto::TxnAction::Abort as i32),
        }));
        self.receive().end_txn_response.unwrap().error
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

/// Messages the consume-transform-produce loop moves.
const CTP_MESSAGES: usize = 60;
/// Input messages handled per transaction.
const CTP_PER_TXN: usize = 5;
/// Timeout of the loop's transactions: one the crash left open aborts soon.
const CTP_TXN_TIMEOUT_MS: u64 = 2_000;

/// Runs the loop until the output holds `CTP_MESSAGES` messages (as far as
/// the loop can tell: no input arrives for a while), or until `kill_at`
/// transactions were committed: then the broker is killed mid-transaction
/// (its messages sent, its acks held, no commit) and `false` returned.
fn transform(broker: &Standalone, input: &str, output: &str, kill_at: Option<usize>) -> bool {
    let mut tc = Conn::connect(broker.pulsar_addr);
    tc.tc_connect(0);
    let mut consumer = Conn::connect(broker.pulsar_addr);
    consumer.subscribe(input, "transform", 1, 1000);
    let mut producer = Conn::connect(broker.pulsar_addr);
    producer.create_producer(output, 1);
    let mut seq = 0;
    let mut committed = 0;
    loop {
        let mut batch = Vec::new();
        while batch.len() < CTP_PER_TXN {
            match consumer.next_message(Duration::from_secs(3)) {
                Some(message) => batch.push(message),
                None => break,
            }
        }
        if batch.is_empty() {
            return true;
        }
        let txn = tc.new_txn_timing_out(CTP_TXN_TIMEOUT_MS);
        tc.add_partition(txn, output);
        tc.add_subscription(txn, input, "transform");
        let mut conflict = false;
        for (id, payload) in &batch {
            producer.publish(1, seq, Some(txn), payload);
            seq += 1;
            if let Some(error) = consumer.ack_in(1, id, txn) {
                // Held by a transaction the crash left open: it times out.
                assert_eq!(error, ServerError::TransactionConflict as i32);
                conflict = true;
                break;
            }
        }
        if kill_at == Some(committed) {
            return false;
        }
        if conflict {
            assert_eq!(tc.abort(txn), None);
            // Start over on new connections: everything not acknowledged
            // comes again, in order, once the crash's transaction is gone.
            drop((tc, consumer, producer));
            std::thread::sleep(Duration::from_millis(CTP_TXN_TIMEOUT_MS));
            return transform(broker, input, output, None);
        }
        assert_eq!(tc.commit(txn), None);
        committed += 1;
    }
}

#[test]
fn consume_transform_produce_is_exactly_once_across_kill_9() {
    let dir = tempfile::tempdir().unwrap();
    let (input, output) = (
        "persistent://public/default/ctp-in",
        "persistent://public/default/ctp-out",
    );
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as usize;
    let kill_at = 1 + seed % (CTP_MESSAGES / CTP_PER_TXN - 2);
    eprintln!("killing after {kill_at} committed transactions (seed {seed})");

    let broker = start_with_coordinator(dir.path());
    let mut producer = Conn::connect(broker.pulsar_addr);
    producer.create_producer(input, 1);
    let inputs: Vec<String> = (0..CTP_MESSAGES).map(|i| format!("m{i:03}")).collect();
    for (seq, payload) in inputs.iter().enumerate() {
        producer.publish(1, seq as u64, None, payload);
    }
    drop(producer);
    assert!(!transform(&broker, input, output, Some(kill_at)));
    broker.kill_9();

    let broker = start_with_coordinator(dir.path());
    assert!(transform(&broker, input, output, None));

    let mut check = Conn::connect(broker.pulsar_addr);
    check.subscribe(output, "check", 1, 1000);
    let mut outputs = Vec::new();
    while let Some((_, payload)) = check.next_message(Duration::from_secs(3)) {
        outputs.push(payload);
    }
    assert_eq!(outputs, inputs, "every input exactly once, in order");
}
