//! One TCP connection to a broker (TLS when the client's service URL is
//! `pulsar+ssl://`; a token at CONNECT when given): the CONNECT handshake,
//! a reader task that routes every incoming command, and a writer task that
//! coalesces outgoing frames into few writes.
//!
//! Owns: the socket, the request-id → waiter map, and the producer-id and
//! consumer-id → handler maps of this connection. Answers PING with PONG.
//! Guarantees: frames leave in the order they were queued; when the
//! connection ends every waiting request fails with `Disconnected` and every
//! registered producer and consumer is told (`closed`), exactly once.
//! Never: retries (producers and consumers decide), blocks in a handler call
//! (handlers take short locks), or holds more than `REQUESTS_IN_FLIGHT_MAX`
//! waiting requests or `OUTBOUND_FRAMES_MAX` queued frames.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, oneshot, watch};
use vela_wire::proto::base_command::Type;
use vela_wire::proto::{
    BaseCommand, CommandConnect, CommandMessage, CommandPong, CommandSendError, CommandSendReceipt,
    ServerError,
};
use vela_wire::{
    FRAME_HEADER_ROOM_BYTES, FrameDecoder, MESSAGE_SIZE_MAX_DEFAULT_BYTES, PayloadSection,
    encode_command,
};

use crate::error::ClientError;

/// Protocol version we speak (Pulsar 3.x/4.x clients send 21).
pub(crate) const PROTOCOL_VERSION: i32 = 21;

/// Requests waiting for an answer on one connection. A client with more in
/// flight is misbehaving (or the broker stopped answering): refuse more.
pub(crate) const REQUESTS_IN_FLIGHT_MAX: usize = 50_000;

/// Frames queued for the writer. Producers bound their own in-flight frames;
/// this bounds the sum, and a full queue makes senders wait (or a producer
/// park its frames until there is room).
pub(crate) const OUTBOUND_FRAMES_MAX: usize = 65_536;

/// Bytes the writer gathers before one write: enough to batch thousands of
/// small frames per syscall under load, small enough to stay cache-resident.
const WRITE_COALESCE_BYTES_MAX: usize = 256 * 1024;

/// Frames at least this large are written from their own buffer, not copied
/// into the coalescing buffer.
const WRITE_DIRECT_BYTES_MIN: usize = 64 * 1024;

/// Read buffer growth step.
const READ_CHUNK_BYTES: usize = 64 * 1024;

/// What a producer is told by its connection.
pub(crate) trait ProducerEvents: Send + Sync {
    /// A SEND_RECEIPT for this producer.
    fn receipt(&self, receipt: CommandSendReceipt);
    /// A SEND_ERROR for this producer.
    fn send_error(&self, error: CommandSendError);
    /// The broker closed the producer, or the connection ended.
    fn closed(&self, reason: &str);
}

/// What a consumer is told by its connection.
pub(crate) trait ConsumerEvents: Send + Sync {
    /// A MESSAGE for this consumer (payload checksum already verified).
    fn message(&self, command: CommandMessage, payload: PayloadSection);
    /// ACTIVE_CONSUMER_CHANGE (failover subscriptions).
    fn active_change(&self, active: bool);
    /// The broker closed the consumer, or the connection ended.
    fn closed(&self, reason: &str);
}

type Waiter = oneshot::Sender<Result<BaseCommand, ClientError>>;

/// A connection to a broker. Cheap to clone.
#[derive(Clone)]
pub(crate) struct Connection {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for Connection {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Connection")
            .field("addr", &self.shared.addr)
            .field("closed", &self.is_closed())
            .finish()
    }
}

struct Shared {
    addr: String,
    outbound: mpsc::Sender<Bytes>,
    next_request_id: AtomicU64,
    requests: Mutex<HashMap<u64, Waiter>>,
    producers: Mutex<HashMap<u64, Arc<dyn ProducerEvents>>>,
    consumers: Mutex<HashMap<u64, Arc<dyn ConsumerEvents>>>,
    closed: AtomicBool,
    /// Set once by `close`: stops the reader and writer tasks.
    stop: watch::Sender<bool>,
    max_message_size_bytes: usize,
}

/// How a connection authenticates and protects itself.
#[derive(Debug, Clone, Default)]
pub(crate) struct Security {
    /// TLS with these roots (`None`: plain TCP).
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    /// A token sent at CONNECT.
    pub(crate) token: Option<String>,
}

impl Connection {
    /// Connects to `addr` (`host:port`), over TLS when `security` says so,
    /// and completes the CONNECT handshake.
    pub(crate) async fn connect(
        addr: &str,
        connect_timeout: Duration,
        security: &Security,
    ) -> Result<Connection, ClientError> {
        let failed = |reason: String| ClientError::Connect {
            addr: addr.to_string(),
            reason,
        };
        let stream = tokio::time::timeout(connect_timeout, TcpStream::connect(addr))
            .await
            .map_err(|_| failed(format!("no TCP connection within {connect_timeout:?}")))?
            .map_err(|e| failed(e.to_string()))?;
        stream
            .set_nodelay(true)
            .map_err(|e| failed(e.to_string()))?;
        let Some(tls) = &security.tls else {
            let (reader, writer) = stream.into_split();
            return Connection::start(addr, connect_timeout, security, reader, writer).await;
        };
        let host = addr.rsplit_once(':').map_or(addr, |(host, _)| host);
        let host = host.trim_start_matches('[').trim_end_matches(']');
        let name = rustls::pki_types::ServerName::try_from(host.to_string())
            .map_err(|e| failed(format!("not a TLS server name: {e}")))?;
        let connector = tokio_rustls::TlsConnector::from(Arc::clone(tls));
        let stream = tokio::time::timeout(connect_timeout, connector.connect(name, stream))
            .await
            .map_err(|_| failed(format!("no TLS handshake within {connect_timeout:?}")))?
            .map_err(|e| failed(format!("TLS: {e}")))?;
        let (reader, writer) = tokio::io::split(stream);
        Connection::start(addr, connect_timeout, security, reader, writer).await
    }

    /// The CONNECT handshake on an open stream, then the reader and
    /// writer tasks.
    async fn start<R, W>(
        addr: &str,
        connect_timeout: Duration,
        security: &Security,
        mut reader: R,
        mut writer: W,
    ) -> Result<Connection, ClientError>
    where
        R: AsyncRead + Unpin + Send + 'static,
        W: AsyncWrite + Unpin + Send + 'static,
    {
        let failed = |reason: String| ClientError::Connect {
            addr: addr.to_string(),
            reason,
        };
        let mut decoder =
            FrameDecoder::new(MESSAGE_SIZE_MAX_DEFAULT_BYTES + FRAME_HEADER_ROOM_BYTES);
        let mut buf = BytesMut::with_capacity(READ_CHUNK_BYTES);
        let handshake = async {
            let mut frame = BytesMut::new();
            encode_command(
                &BaseCommand::from(CommandConnect {
                    client_version: concat!("vela-client/", env!("CARGO_PKG_VERSION")).into(),
                    protocol_version: Some(PROTOCOL_VERSION),
                    auth_method_name: security.token.as_ref().map(|_| "token".to_string()),
                    auth_data: security
                        .token
                        .as_ref()
                        .map(|t| Bytes::copy_from_slice(t.as_bytes())),
                    ..Default::default()
                }),
                &mut frame,
            );
            writer
                .write_all(&frame)
                .await
                .map_err(|e| failed(e.to_string()))?;
            loop {
                if let Some(frame) = decoder
                    .decode(&mut buf)
                    .map_err(|e| failed(format!("bad frame in the handshake: {e}")))?
                {
                    let command = frame.command.into_base_command();
                    return match (command.r#type(), command.connected, command.error) {
                        (Type::Connected, Some(connected), _) => Ok(connected),
                        (Type::Error, _, Some(error)) => Err(failed(format!(
                            "refused: {:?}: {}",
                            error.error(),
                            error.message
                        ))),
                        (other, _, _) => Err(failed(format!("expected CONNECTED, got {other:?}"))),
                    };
                }
                buf.reserve(READ_CHUNK_BYTES);
                let read = reader
                    .read_buf(&mut buf)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                if read == 0 {
                    return Err(failed("closed during the handshake".into()));
                }
            }
        };
        let connected = tokio::time::timeout(connect_timeout, handshake)
            .await
            .map_err(|_| failed(format!("no CONNECTED within {connect_timeout:?}")))??;
        let max_message_size_bytes = connected
            .max_message_size
            .and_then(|size| usize::try_from(size).ok())
            .filter(|size| *size > 0)
            .unwrap_or(MESSAGE_SIZE_MAX_DEFAULT_BYTES);
        decoder.set_max_frame_bytes(max_message_size_bytes + FRAME_HEADER_ROOM_BYTES);

        let (outbound, outbound_rx) = mpsc::channel(OUTBOUND_FRAMES_MAX);
        let shared = Arc::new(Shared {
            addr: addr.to_string(),
            outbound,
            next_request_id: AtomicU64::new(1),
            requests: Mutex::new(HashMap::new()),
            producers: Mutex::new(HashMap::new()),
            consumers: Mutex::new(HashMap::new()),
            closed: AtomicBool::new(false),
            stop: watch::channel(false).0,
            max_message_size_bytes,
        });
        tokio::spawn(write_loop(Arc::clone(&shared), writer, outbound_rx));
        tokio::spawn(read_loop(Arc::clone(&shared), reader, decoder, buf));
        tracing::debug!(addr, server = %connected.server_version, "connected");
        Ok(Connection { shared })
    }

    /// Whether the connection has ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Largest message the broker accepts (from CONNECTED).
    pub(crate) fn max_message_size_bytes(&self) -> usize {
        self.shared.max_message_size_bytes
    }

    fn disconnected(&self, reason: &str) -> ClientError {
        ClientError::Disconnected {
            addr: self.shared.addr.clone(),
            reason: reason.to_string(),
        }
    }

    /// Queues a frame without waiting. `Ok(false)`: the outbound queue is full
    /// (try again once `wait_for_room` resolves).
    pub(crate) fn try_send(&self, frame: Bytes) -> Result<bool, ClientError> {
        match self.shared.outbound.try_send(frame) {
            Ok(()) => Ok(true),
            Err(mpsc::error::TrySendError::Full(_)) => Ok(false),
            Err(mpsc::error::TrySendError::Closed(_)) => Err(self.disconnected("closed")),
        }
    }

    /// Queues a frame, waiting while the outbound queue is full.
    pub(crate) async fn send(&self, frame: Bytes) -> Result<(), ClientError> {
        self.shared
            .outbound
            .send(frame)
            .await
            .map_err(|_| self.disconnected("closed"))
    }

    /// Resolves once the outbound queue has room (or the connection closed).
    pub(crate) async fn wait_for_room(&self) {
        // A reserved slot is given back when the permit drops.
        let _ = self.shared.outbound.reserve().await;
    }

    /// Queues a command frame, waiting for room.
    pub(crate) async fn send_command(&self, command: BaseCommand) -> Result<(), ClientError> {
        let mut frame = BytesMut::new();
        encode_command(&command, &mut frame);
        self.send(frame.freeze()).await
    }

    /// Sends the command `build(request_id)` and waits for the answer that
    /// carries its request id. An ERROR answer becomes `ClientError::Server`.
    pub(crate) async fn request(
        &self,
        operation: &'static str,
        timeout: Duration,
        build: impl FnOnce(u64) -> BaseCommand,
    ) -> Result<BaseCommand, ClientError> {
        let request_id = self.shared.next_request_id.fetch_add(1, Ordering::Relaxed);
        let (waiter, answer) = oneshot::channel();
        {
            let mut requests = self.shared.requests.lock();
            if requests.len() >= REQUESTS_IN_FLIGHT_MAX {
                return Err(ClientError::TooManyRequests(self.shared.addr.clone()));
            }
            requests.insert(request_id, waiter);
        }
        // Registered before the check: `close` drains the map after setting
        // the flag, so a request is either refused here or failed there.
        if self.is_closed() {
            self.shared.requests.lock().remove(&request_id);
            return Err(self.disconnected("closed"));
        }
        if let Err(error) = self.send_command(build(request_id)).await {
            self.shared.requests.lock().remove(&request_id);
            return Err(error);
        }
        match tokio::time::timeout(timeout, answer).await {
            Ok(Ok(answer)) => answer,
            Ok(Err(_)) => Err(self.disconnected("closed")),
            Err(_) => {
                self.shared.requests.lock().remove(&request_id);
                Err(ClientError::Timeout { operation, timeout })
            }
        }
    }

    /// Routes this producer id's events to `handler` until `unregister_producer`.
    pub(crate) fn register_producer(&self, producer_id: u64, handler: Arc<dyn ProducerEvents>) {
        self.shared.producers.lock().insert(producer_id, handler);
        if self.is_closed() {
            // Closed meanwhile: the close pass may have missed this handler.
            if let Some(handler) = self.shared.producers.lock().remove(&producer_id) {
                handler.closed("connection closed");
            }
        }
    }

    pub(crate) fn unregister_producer(&self, producer_id: u64) {
        self.shared.producers.lock().remove(&producer_id);
    }

    /// Routes this consumer id's events to `handler` until `unregister_consumer`.
    pub(crate) fn register_consumer(&self, consumer_id: u64, handler: Arc<dyn ConsumerEvents>) {
        self.shared.consumers.lock().insert(consumer_id, handler);
        if self.is_closed()
            && let Some(handler) = self.shared.consumers.lock().remove(&consumer_id)
        {
            handler.closed("connection closed");
        }
    }

    pub(crate) fn unregister_consumer(&self, consumer_id: u64) {
        self.shared.consumers.lock().remove(&consumer_id);
    }

    /// Closes the connection: waiting requests fail, handlers are told.
    pub(crate) fn close(&self, reason: &str) {
        self.shared.close(reason);
    }
}

impl Shared {
    fn close(&self, reason: &str) {
        if self.closed.swap(true, Ordering::AcqRel) {
            return;
        }
        tracing::debug!(addr = %self.addr, reason, "connection closed");
        self.stop.send_replace(true);
        let requests: Vec<Waiter> = self.requests.lock().drain().map(|(_, w)| w).collect();
        for waiter in requests {
            let _ = waiter.send(Err(ClientError::Disconnected {
                addr: self.addr.clone(),
                reason: reason.to_string(),
            }));
        }
        let producers: Vec<_> = self.producers.lock().drain().map(|(_, h)| h).collect();
        for handler in producers {
            handler.closed(reason);
        }
        let consumers: Vec<_> = self.consumers.lock().drain().map(|(_, h)| h).collect();
        for handler in consumers {
            handler.closed(reason);
        }
    }

    fn answer(&self, request_id: u64, answer: Result<BaseCommand, ClientError>) {
        if let Some(waiter) = self.requests.lock().remove(&request_id) {
            let _ = waiter.send(answer);
        }
    }

    fn producer(&self, producer_id: u64) -> Option<Arc<dyn ProducerEvents>> {
        self.producers.lock().get(&producer_id).cloned()
    }

    fn consumer(&self, consumer_id: u64) -> Option<Arc<dyn ConsumerEvents>> {
        self.consumers.lock().get(&consumer_id).cloned()
    }
}

/// The request id an answer carries, for the answers that carry one.
fn answer_request_id(command: &BaseCommand) -> Option<u64> {
    Some(match command.r#type() {
        Type::Success => command.success.as_ref()?.request_id,
        Type::Error => command.error.as_ref()?.request_id,
        Type::ProducerSuccess => command.producer_success.as_ref()?.request_id,
        Type::LookupResponse => command.lookup_topic_response.as_ref()?.request_id,
        Type::PartitionedMetadataResponse => {
            command.partition_metadata_response.as_ref()?.request_id
        }
        Type::GetLastMessageIdResponse => command.get_last_message_id_response.as_ref()?.request_id,
        Type::GetTopicsOfNamespaceResponse => {
            command
                .get_topics_of_namespace_response
                .as_ref()?
                .request_id
        }
        Type::GetSchemaResponse => command.get_schema_response.as_ref()?.request_id,
        Type::GetOrCreateSchemaResponse => {
            command.get_or_create_schema_response.as_ref()?.request_id
        }
        Type::ConsumerStatsResponse => command.consumer_stats_response.as_ref()?.request_id,
        Type::AckResponse => command.ack_response.as_ref()?.request_id?,
        _ => return None,
    })
}

async fn read_loop(
    shared: Arc<Shared>,
    mut reader: impl AsyncRead + Unpin,
    mut decoder: FrameDecoder,
    mut buf: BytesMut,
) {
    let mut stop = shared.stop.subscribe();
    let reason = loop {
        match decoder.decode(&mut buf) {
            Ok(Some(frame)) => {
                if let Err(reason) =
                    dispatch(&shared, frame.command.into_base_command(), frame.payload)
                {
                    break reason;
                }
                continue;
            }
            Ok(None) => {}
            Err(error) => break format!("bad frame from the broker: {error}"),
        }
        buf.reserve(READ_CHUNK_BYTES);
        tokio::select! {
            read = reader.read_buf(&mut buf) => match read {
                Ok(0) => break "closed by the broker".to_string(),
                Ok(_) => {}
                Err(error) => break error.to_string(),
            },
            _ = stop.wait_for(|stopped| *stopped) => break "closed".to_string(),
        }
    };
    shared.close(&reason);
}

/// Routes one incoming command. `Err`: the connection must close.
fn dispatch(
    shared: &Shared,
    command: BaseCommand,
    payload: Option<PayloadSection>,
) -> Result<(), String> {
    match command.r#type() {
        Type::Ping => {
            let mut frame = BytesMut::new();
            encode_command(&BaseCommand::from(CommandPong {}), &mut frame);
            // A full queue means plenty of traffic: the broker sees we live.
            let _ = shared.outbound.try_send(frame.freeze());
        }
        Type::Pong => {}
        Type::SendReceipt => {
            let receipt = command.send_receipt.ok_or("SEND_RECEIPT without body")?;
            if let Some(handler) = shared.producer(receipt.producer_id) {
                handler.receipt(*receipt);
            }
        }
        Type::SendError => {
            let error = command.send_error.ok_or("SEND_ERROR without body")?;
            if let Some(handler) = shared.producer(error.producer_id) {
                handler.send_error(*error);
            }
        }
        Type::Message => {
            let message = command.message.ok_or("MESSAGE without body")?;
            let payload = payload.ok_or("MESSAGE without payload")?;
            if let Some(handler) = shared.consumer(message.consumer_id) {
                handler.message(*message, payload);
            }
        }
        Type::ActiveConsumerChange => {
            let change = command
                .active_consumer_change
                .ok_or("ACTIVE_CONSUMER_CHANGE without body")?;
            if let Some(handler) = shared.consumer(change.consumer_id) {
                handler.active_change(change.is_active.unwrap_or(false));
            }
        }
        Type::CloseProducer => {
            let close = command
                .close_producer
                .ok_or("CLOSE_PRODUCER without body")?;
            let handler = shared.producers.lock().remove(&close.producer_id);
            if let Some(handler) = handler {
                handler.closed("closed by the broker");
            }
        }
        Type::CloseConsumer => {
            let close = command
                .close_consumer
                .ok_or("CLOSE_CONSUMER without body")?;
            let handler = shared.consumers.lock().remove(&close.consumer_id);
            if let Some(handler) = handler {
                handler.closed("closed by the broker");
            }
        }
        Type::ReachedEndOfTopic => {}
        Type::Error => {
            let error = command.error.as_ref().ok_or("ERROR without body")?;
            let answer = Err(ClientError::Server {
                code: error.error(),
                message: error.message.clone(),
            });
            shared.answer(error.request_id, answer);
        }
        other => match answer_request_id(&command) {
            Some(request_id) => {
                // Some answers carry an error in their own body.
                let answer = match server_error_in(&command) {
                    Some(error) => Err(error),
                    None => Ok(command),
                };
                shared.answer(request_id, answer);
            }
            None => tracing::debug!(addr = %shared.addr, ?other, "ignoring a command"),
        },
    }
    Ok(())
}

/// The error of an answer that reports failure in its own body.
fn server_error_in(command: &BaseCommand) -> Option<ClientError> {
    let failed = |code: Option<i32>, message: &Option<String>| ClientError::Server {
        code: code
            .and_then(|c| ServerError::try_from(c).ok())
            .unwrap_or(ServerError::UnknownError),
        message: message.clone().unwrap_or_default(),
    };
    use vela_wire::proto::command_lookup_topic_response::LookupType as Lookup;
    use vela_wire::proto::command_partitioned_topic_metadata_response::LookupType as Partitions;
    match command.r#type() {
        Type::LookupResponse => {
            let response = command.lookup_topic_response.as_ref()?;
            (response.response() == Lookup::Failed)
                .then(|| failed(response.error, &response.message))
        }
        Type::PartitionedMetadataResponse => {
            let response = command.partition_metadata_response.as_ref()?;
            (response.response() == Partitions::Failed)
                .then(|| failed(response.error, &response.message))
        }
        Type::GetOrCreateSchemaResponse => {
            let response = command.get_or_create_schema_response.as_ref()?;
            response
                .error_code
                .map(|code| failed(Some(code), &response.error_message))
        }
        _ => None,
    }
}

async fn write_loop(
    shared: Arc<Shared>,
    mut writer: impl AsyncWrite + Unpin,
    mut frames: mpsc::Receiver<Bytes>,
) {
    let mut buf = BytesMut::with_capacity(WRITE_COALESCE_BYTES_MAX);
    let mut stop = shared.stop.subscribe();
    let result: std::io::Result<()> = async {
        loop {
            let first = tokio::select! {
                frame = frames.recv() => match frame {
                    Some(frame) => frame,
                    None => break,
                },
                _ = stop.wait_for(|stopped| *stopped) => break,
            };
            let mut next = Some(first);
            // Gather what is queued now into as few writes as possible.
            while let Some(frame) = next.take() {
                if frame.len() >= WRITE_DIRECT_BYTES_MIN {
                    if !buf.is_empty() {
                        writer.write_all(&buf).await?;
                        buf.clear();
                    }
                    writer.write_all(&frame).await?;
                } else {
                    buf.extend_from_slice(&frame);
                }
                if buf.len() < WRITE_COALESCE_BYTES_MAX {
                    next = frames.try_recv().ok();
                }
            }
            if !buf.is_empty() {
                writer.write_all(&buf).await?;
                buf.clear();
            }
        }
        Ok(())
    }
    .await;
    let _ = writer.shutdown().await;
    if let Err(error) = result {
        shared.close(&format!("write failed: {error}"));
    }
}
