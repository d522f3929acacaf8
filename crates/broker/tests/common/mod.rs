//! Test helpers shared by the integration tests: a broker on in-memory
//! metadata and ledgers, and a hand-driven protocol client.

#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vela_broker::{Broker, BrokerConfig, BrokerHandle};
use vela_wire::proto::{
    self, BaseCommand, MessageMetadata,
    base_command::Type,
    command_subscribe::{InitialPosition, SubType},
};
use vela_wire::{FrameDecoder, PayloadSection};

pub const TIMEOUT: Duration = Duration::from_secs(5);

pub async fn start_broker() -> BrokerHandle {
    start_broker_with(|_| {}).await
}

pub async fn start_broker_with(tweak: impl FnOnce(&mut BrokerConfig)) -> BrokerHandle {
    let mut config = BrokerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    tweak(&mut config);
    let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
    Broker::start(config, meta, vela_log::LogEnv::in_memory())
        .await
        .unwrap()
}

/// A frame from the broker, its command as prost's BaseCommand (the broker
/// never sends SEND, the one command `vela_wire::Command` keeps compact), so
/// that tests read `frame.command.send_receipt` and the like directly.
#[derive(Debug)]
pub struct Frame {
    pub command: BaseCommand,
    pub payload: Option<PayloadSection>,
}

impl Frame {
    pub fn command_type(&self) -> Option<Type> {
        Type::try_from(self.command.r#type).ok()
    }
}

impl From<vela_wire::Frame> for Frame {
    fn from(frame: vela_wire::Frame) -> Self {
        Frame {
            command: frame.command.into_base_command(),
            payload: frame.payload,
        }
    }
}

/// A hand-driven client: one boundary helper for every test.
pub struct Client {
    pub stream: TcpStream,
    pub buf: BytesMut,
    pub decoder: FrameDecoder,
}

impl Client {
    pub async fn raw(addr: SocketAddr) -> Client {
        Client {
            stream: TcpStream::connect(addr).await.unwrap(),
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(64 << 20),
        }
    }

    pub async fn connect(addr: SocketAddr) -> Client {
        let mut client = Client::raw(addr).await;
        client
            .send(proto::CommandConnect {
                client_version: "vela-test".into(),
                protocol_version: Some(21),
                ..Default::default()
            })
            .await;
        let connected = client.recv().await.command.connected.unwrap();
        assert_eq!(connected.protocol_version, Some(21));
        client
    }

    pub async fn send(&mut self, command: impl Into<BaseCommand>) {
        let mut buf = BytesMut::new();
        vela_wire::encode_command(&command.into(), &mut buf);
        self.stream.write_all(&buf).await.unwrap();
    }

    pub async fn send_bytes(&mut self, bytes: &[u8]) {
        let _ = self.stream.write_all(bytes).await;
    }

    pub fn send_frame(producer_id: u64, sequence_id: u64, payload: &[u8]) -> BytesMut {
        let command = BaseCommand::from(proto::CommandSend {
            producer_id,
            sequence_id,
            ..Default::default()
        });
        let metadata = MessageMetadata {
            producer_name: "p".into(),
            sequence_id,
            publish_time: 1_700_000_000_000 + sequence_id,
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        vela_wire::encode_payload_frame(&command, &metadata, payload, &mut buf);
        buf
    }

    pub async fn produce_with(
        &mut self,
        producer_id: u64,
        sequence_id: u64,
        metadata: MessageMetadata,
        payload: &[u8],
    ) {
        let command = BaseCommand::from(proto::CommandSend {
            producer_id,
            sequence_id,
            num_messages: metadata.num_messages_in_batch,
            ..Default::default()
        });
        let mut buf = BytesMut::new();
        vela_wire::encode_payload_frame(&command, &metadata, payload, &mut buf);
        self.stream.write_all(&buf).await.unwrap();
    }

    pub async fn produce(&mut self, producer_id: u64, sequence_id: u64, payload: &[u8]) {
        let frame = Client::send_frame(producer_id, sequence_id, payload);
        self.stream.write_all(&frame).await.unwrap();
    }

    pub async fn recv(&mut self) -> Frame {
        self.try_recv().await.expect("connection closed")
    }

    /// Next frame, skipping PINGs; `None` when the broker closed the connection.
    pub async fn try_recv(&mut self) -> Option<Frame> {
        tokio::time::timeout(TIMEOUT, async {
            loop {
                if let Some(frame) = self.decoder.decode(&mut self.buf).unwrap() {
                    if frame.command_type() == Some(Type::Ping) {
                        continue;
                    }
                    return Some(Frame::from(frame));
                }
                match self.stream.read_buf(&mut self.buf).await {
                    Ok(0) | Err(_) => return None,
                    Ok(_) => {}
                }
            }
        })
        .await
        .expect("no frame within the timeout")
    }

    pub async fn expect_closed(&mut self) {
        assert!(self.try_recv().await.is_none(), "connection still open");
    }

    pub async fn create_producer(
        &mut self,
        topic: &str,
        producer_id: u64,
    ) -> proto::CommandProducerSuccess {
        self.send(proto::CommandProducer {
            topic: topic.into(),
            producer_id,
            request_id: 1000 + producer_id,
            ..Default::default()
        })
        .await;
        let command = self.recv().await.command;
        match command.producer_success {
            Some(success) => *success,
            None => panic!("expected PRODUCER_SUCCESS, got {command:?}"),
        }
    }

    pub async fn subscribe(
        &mut self,
        topic: &str,
        subscription: &str,
        sub_type: SubType,
        consumer_id: u64,
    ) {
        self.send(proto::CommandSubscribe {
            topic: topic.into(),
            subscription: subscription.into(),
            sub_type: sub_type as i32,
            consumer_id,
            request_id: 2000 + consumer_id,
            consumer_name: Some(format!("c{consumer_id}")),
            initial_position: Some(InitialPosition::Earliest as i32),
            ..Default::default()
        })
        .await;
        let frame = self.recv().await;
        assert!(
            frame.command.success.is_some(),
            "SUBSCRIBE failed: {:?}",
            frame.command
        );
    }

    pub async fn flow(&mut self, consumer_id: u64, permits: u32) {
        self.send(proto::CommandFlow {
            consumer_id,
            message_permits: permits,
        })
        .await;
    }
}

pub fn receipt_seq(frame: &Frame) -> u64 {
    frame
        .command
        .send_receipt
        .as_ref()
        .expect("SEND_RECEIPT")
        .sequence_id
}

pub fn message_of(frame: &Frame) -> (&proto::CommandMessage, Bytes) {
    let message = frame.command.message.as_ref().expect("MESSAGE");
    let payload = frame.payload.as_ref().expect("payload").payload();
    (message, payload)
}

/// Metadata for a test message.
pub fn metadata(sequence_id: u64) -> MessageMetadata {
    MessageMetadata {
        producer_name: "p".into(),
        sequence_id,
        publish_time: 1_700_000_000_000 + sequence_id,
        ..Default::default()
    }
}

/// Sends PING and waits for PONG, failing on any other frame (used to check
/// that nothing was dispatched).
pub async fn expect_nothing_but_pong(client: &mut Client) {
    tokio::time::sleep(Duration::from_millis(200)).await;
    client.send(proto::CommandPing {}).await;
    let frame = client.recv().await;
    assert!(
        frame.command.pong.is_some(),
        "unexpected frame: {:?}",
        frame.command
    );
}

/// A broker on the given metadata store and logs (to restart on the same state).
pub async fn start_broker_on(
    meta: Arc<dyn vela_meta::MetadataStore>,
    log_env: vela_log::LogEnv,
) -> BrokerHandle {
    let config = BrokerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    Broker::start(config, meta, log_env).await.unwrap()
}

/// What `PutHookStore` awaits before a put of `key` goes through.
pub type PutHook = Box<dyn Fn(&str) -> vela_meta::BoxFuture<'static, ()> + Send + Sync>;

/// A metadata store that awaits `hook` before each put (to slow or hold
/// chosen writes) and hands everything else to `inner` unchanged.
pub struct PutHookStore {
    inner: Arc<dyn vela_meta::MetadataStore>,
    hook: PutHook,
}

impl PutHookStore {
    /// A memory store behind `hook`.
    pub fn new(hook: PutHook) -> Arc<PutHookStore> {
        Arc::new(PutHookStore {
            inner: Arc::new(vela_meta::MemoryStore::new()),
            hook,
        })
    }
}

impl std::fmt::Debug for PutHookStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PutHookStore")
            .field("inner", &self.inner)
            .finish()
    }
}

impl vela_meta::MetadataStore for PutHookStore {
    fn kind(&self) -> vela_meta::BackendKind {
        self.inner.kind()
    }

    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> vela_meta::BoxFuture<'a, Result<Option<(Bytes, vela_meta::Version)>, vela_meta::MetaError>>
    {
        self.inner.get(key)
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Bytes,
        expected: vela_meta::ExpectedVersion,
    ) -> vela_meta::BoxFuture<'a, Result<vela_meta::Version, vela_meta::MetaError>> {
        let wait = (self.hook)(key);
        Box::pin(async move {
            wait.await;
            self.inner.put(key, value, expected).await
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a str,
        expected: vela_meta::ExpectedVersion,
    ) -> vela_meta::BoxFuture<'a, Result<(), vela_meta::MetaError>> {
        self.inner.delete(key, expected)
    }

    fn children<'a>(
        &'a self,
        path: &'a str,
    ) -> vela_meta::BoxFuture<'a, Result<Vec<String>, vela_meta::MetaError>> {
        self.inner.children(path)
    }

    fn watch<'a>(
        &'a self,
        path: &'a str,
    ) -> vela_meta::BoxFuture<'a, Result<vela_meta::Watcher, vela_meta::MetaError>> {
        self.inner.watch(path)
    }

    fn session(
        &self,
        ttl: Duration,
    ) -> vela_meta::BoxFuture<'_, Result<vela_meta::Session, vela_meta::MetaError>> {
        self.inner.session(ttl)
    }

    fn put_ephemeral<'a>(
        &'a self,
        session: &'a vela_meta::Session,
        key: &'a str,
        value: Bytes,
        expected: vela_meta::ExpectedVersion,
    ) -> vela_meta::BoxFuture<'a, Result<vela_meta::Version, vela_meta::MetaError>> {
        self.inner.put_ephemeral(session, key, value, expected)
    }
}
