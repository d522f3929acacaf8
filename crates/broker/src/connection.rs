//! One client connection: the handshake, keep-alive, command dispatch, the
//! producers and consumers opened on it, and the socket writer.
//!
//! Tasks per connection: the reader (this module's `Connection::run`, which
//! handles commands in arrival order), the writer (`write_loop`: one vectored
//! write per wake-up of up to `frames_per_wakeup_max` frames) and one receipt
//! task per producer (answers SENDs strictly in SEND order).
//!
//! Bounds: producers and consumers per connection; pending SENDs and pending
//! SEND bytes (semaphores: when exhausted the reader stops reading, which
//! pushes back on the client through TCP); the outbound queue; a topic's
//! publish rate (past it the reader pauses after the SEND, the same way).
//! Connection counts are capped before a connection gets here (at accept).
//! Failure policy: a bad frame, a command before CONNECT, a SEND for an
//! unknown producer or an unsupported command closes this connection only,
//! with a log line; a CRC mismatch on SEND answers SEND_ERROR(ChecksumError).
//! Authentication (when configured): CONNECT's token is checked (ERROR
//! AuthenticationError and close when bad); the role is checked at each
//! PRODUCER, SUBSCRIBE, LOOKUP, PARTITIONED_METADATA, topic list and schema
//! command (AuthorizationError). An expired token is challenged
//! (AUTH_CHALLENGE "refresh") at the next refresh check; no valid
//! AUTH_RESPONSE by the check after closes the connection.
//! The same code serves plain TCP and TLS streams (`serve`, `serve_tls`).
//! Never: blocks a tokio worker, or writes to the socket outside the writer.

use std::collections::HashMap;
use std::io::IoSlice;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use bytes::{Buf, Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, oneshot, watch};
use vela_log::{AppendFuture, Position};
use vela_wire::proto::{
    self, BaseCommand, MessageIdData, ServerError,
    base_command::Type,
    command_lookup_topic_response::LookupType,
    command_partitioned_topic_metadata_response::LookupType as MetadataResult,
    command_subscribe::{InitialPosition, SubType},
};
use vela_wire::{Command, SendCommand};

use crate::auth::{self, Principal, TopicAction};
use crate::codec::{self, Decoder, FrameError, Inbound, Outbound};
use crate::config::{PROTOCOL_VERSION_MAX, SERVER_VERSION};
use crate::error::ServiceError;
use crate::ownership::LookupAnswer;
use crate::schema;
use crate::service::Service;
use crate::subscription::{ConnEvent, ConsumerInfo, SeekTarget, SubCommand, SubscriptionHandle};
use crate::topic::{Admission, ConsumerSlot, DedupCheck, ProducerReg, SubscribeRequest, Topic};
use crate::topic_name::{NamespaceName, TopicName};

/// Longest producer, subscription and consumer name kept (bytes). Names are
/// map keys, cursor names and stats fields; Pulsar sets no limit, but real
/// names are short and a bound keeps one client from pinning megabytes per
/// name. Longer producer/subscription names are refused (NotAllowedError);
/// consumer names are truncated.
const NAME_BYTES_MAX: usize = 1024;
/// Read buffer size: one read syscall takes up to this much.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// iovecs per `writev` (Linux IOV_MAX is 1024).
const IOVECS_PER_WRITE_MAX: usize = 1024;
/// Time the writer gets to flush queued frames after the reader stopped.
const WRITER_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

/// Topic loads of one connection's PRODUCER and SUBSCRIBE commands running
/// off its read loop at once. Opening a topic may take seconds (its ledger's
/// recovery waits on unreachable bookies) and clients multiplex every
/// producer and consumer over one connection per broker: loading inline
/// would stall all the client's other topics. Past the bound a command loads
/// inline again, which stops reading the connection (back-pressure).
const DEFERRED_LOADS_MAX: usize = 64;

/// A PRODUCER or SUBSCRIBE whose topic is being opened off the read loop.
enum Deferred {
    Producer(proto::CommandProducer),
    Subscribe(proto::CommandSubscribe),
}

/// The command back on the connection once its topic is open (or failed).
struct Loaded {
    command: Deferred,
    result: Result<(), ServiceError>,
}

/// A producer or consumer id with deferred commands in flight.
#[derive(Default)]
struct InFlight {
    commands: u32,
    /// CLOSE_PRODUCER / CLOSE_CONSUMER came meanwhile (answered at once, as
    /// for an unknown id): the deferred command must not open it after all.
    closed: bool,
}

/// Why a connection closes (for the log line).
#[derive(Debug)]
struct Close(String);

enum ReceiptJob {
    Send {
        sequence_id: u64,
        highest_sequence_id: u64,
        received: Instant,
        /// When the append was issued (storage write latency starts).
        issued: Instant,
        append: AppendFuture,
        topic_metrics: Arc<crate::metrics::TopicMetrics>,
        _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    },
    Duplicate {
        sequence_id: u64,
        highest_sequence_id: u64,
        _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    },
    Error {
        sequence_id: u64,
        code: ServerError,
        message: String,
    },
    Close {
        request_id: u64,
    },
}

struct ConnProducer {
    topic: Arc<Topic>,
    name: String,
    jobs: mpsc::Sender<ReceiptJob>,
}

struct ConnConsumer {
    topic: Arc<Topic>,
    sub: SubscriptionHandle,
    /// Counts it against the topic's consumer limit until dropped.
    _slot: ConsumerSlot,
}

/// Serves one accepted TCP connection until it closes or the broker stops.
pub(crate) async fn serve(
    service: Arc<Service>,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "set_nodelay failed");
    }
    // Halves sharing the socket: no lock between the reader and the writer;
    // reads carry kernel arrival stamps (publish timing starts there).
    let (read_half, write_half) = crate::arrival::split(stream);
    serve_halves(service, read_half, write_half, peer, shutdown).await;
}

/// Serves one accepted TLS connection: the handshake (bounded by the
/// handshake timeout), then the same as [`serve`].
pub(crate) async fn serve_tls(
    service: Arc<Service>,
    acceptor: tokio_rustls::TlsAcceptor,
    stream: TcpStream,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) {
    if let Err(e) = stream.set_nodelay(true) {
        tracing::debug!(%peer, error = %e, "set_nodelay failed");
    }
    let timeout = service.config.handshake_timeout;
    let stream = match vela_tls::accept_within(&acceptor, stream, timeout).await {
        Ok(stream) => stream,
        Err(error) => {
            tracing::info!(%peer, %error, "TLS handshake failed");
            return;
        }
    };
    let (read_half, write_half) = tokio::io::split(stream);
    serve_halves(service, read_half, write_half, peer, shutdown).await;
}

async fn serve_halves<R, W>(
    service: Arc<Service>,
    read_half: R,
    write_half: W,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
) where
    R: crate::arrival::ConnectionRead,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let limits = service.config.limits.clone();
    let (out, out_rx) = mpsc::channel(limits.outbound_frames_max);
    let writer = tokio::spawn(write_loop(
        write_half,
        out_rx,
        limits.frames_per_wakeup_max,
        Arc::clone(&service),
    ));
    // Events: at most one per producer and consumer of this connection
    // outstanding in practice; sized to never fill in normal operation.
    let (events_tx, events_rx) = mpsc::channel(2 * (limits.producers_max + limits.consumers_max));
    let (loaded_tx, loaded_rx) = mpsc::channel(DEFERRED_LOADS_MAX);
    let id = service.next_conn_id();
    service
        .metrics
        .active_connections
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut connection = Connection {
        id,
        peer,
        out,
        events_tx,
        events_rx,
        loaded_tx,
        loaded_rx,
        deferred_loads: Arc::new(Semaphore::new(DEFERRED_LOADS_MAX)),
        deferred_producers: HashMap::new(),
        deferred_consumers: HashMap::new(),
        connected: false,
        protocol_version: 0,
        client_version: String::new(),
        producers: HashMap::new(),
        consumers: HashMap::new(),
        pending_sends: Arc::new(Semaphore::new(limits.pending_sends_max)),
        pending_bytes: Arc::new(Semaphore::new(limits.pending_send_bytes_max)),
        auth: ConnAuth::default(),
        read_at: Instant::now(),
        service,
    };
    let reason = connection.run(read_half, shutdown).await;
    tracing::info!(conn = id, %peer, reason = %reason.0, "connection closed");
    connection.cleanup().await;
    connection
        .service
        .metrics
        .active_connections
        .fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    drop(connection);
    let mut writer = writer;
    if tokio::time::timeout(WRITER_DRAIN_TIMEOUT, &mut writer)
        .await
        .is_err()
    {
        writer.abort();
    }
}

struct Connection {
    service: Arc<Service>,
    id: u64,
    peer: SocketAddr,
    out: mpsc::Sender<Outbound>,
    events_tx: mpsc::Sender<ConnEvent>,
    events_rx: mpsc::Receiver<ConnEvent>,
    loaded_tx: mpsc::Sender<Loaded>,
    loaded_rx: mpsc::Receiver<Loaded>,
    /// Permits for topic loads off the read loop (DEFERRED_LOADS_MAX).
    deferred_loads: Arc<Semaphore>,
    /// Producer / consumer ids whose PRODUCER / SUBSCRIBE waits for its topic.
    deferred_producers: HashMap<u64, InFlight>,
    deferred_consumers: HashMap<u64, InFlight>,
    connected: bool,
    protocol_version: i32,
    client_version: String,
    producers: HashMap<u64, ConnProducer>,
    consumers: HashMap<u64, ConnConsumer>,
    pending_sends: Arc<Semaphore>,
    pending_bytes: Arc<Semaphore>,
    auth: ConnAuth,
    /// When the bytes being handled reached the broker: the kernel's receive
    /// stamp on plain TCP, else when they were read (the start of a SEND's
    /// broker publish stage).
    read_at: Instant,
}

/// Authentication state of a connection (empty when auth is off).
#[derive(Debug, Default)]
struct ConnAuth {
    /// Who the client is, after CONNECT.
    principal: Option<Principal>,
    /// The client said it answers AUTH_CHALLENGE (FeatureFlags).
    supports_refresh: bool,
    /// An AUTH_CHALLENGE went out and no valid AUTH_RESPONSE came back yet.
    challenge_pending: bool,
}

impl Connection {
    async fn run<R: crate::arrival::ConnectionRead>(
        &mut self,
        mut read_half: R,
        mut shutdown: watch::Receiver<bool>,
    ) -> Close {
        let config = &self.service.config;
        let keepalive = config.keepalive;
        let handshake_timeout = config.handshake_timeout;
        let frames_per_wakeup = config.limits.inbound_frames_per_wakeup_max.max(1);
        let mut decoder = Decoder::new(config.max_frame_bytes());
        let mut buf = BytesMut::with_capacity(READ_BUFFER_BYTES);
        let started = Instant::now();
        let mut ping_outstanding = false;
        let mut ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + keepalive, keepalive);
        let handshake_deadline = tokio::time::sleep(handshake_timeout);
        tokio::pin!(handshake_deadline);
        let auth_enabled = config.auth.is_some();
        let refresh_check = config
            .auth
            .as_ref()
            .map_or(keepalive, |a| a.refresh_check_interval);
        let mut auth_ticker =
            tokio::time::interval_at(tokio::time::Instant::now() + refresh_check, refresh_check);
        loop {
            tokio::select! {
                biased;
                _ = shutdown.changed() => return Close("broker shutting down".into()),
                Some(event) = self.events_rx.recv() => self.on_event(event),
                Some(loaded) = self.loaded_rx.recv() => {
                    if let Err(close) = self.on_loaded(loaded).await {
                        return close;
                    }
                }
                _ = &mut handshake_deadline, if !self.connected => {
                    return Close(format!("no CONNECT within {:?}", started.elapsed()));
                }
                _ = auth_ticker.tick(), if auth_enabled && self.connected => {
                    if let Err(close) = self.check_credentials().await {
                        return close;
                    }
                }
                _ = ticker.tick() => {
                    if ping_outstanding {
                        return Close("keep-alive timeout: no frame since the last PING".into());
                    }
                    if self.connected && self.protocol_version >= 1 {
                        ping_outstanding = true;
                        if self.send(proto::CommandPing {}).await.is_err() {
                            return Close("writer gone".into());
                        }
                    }
                }
                read = read_half.read_buf(&mut buf) => {
                    match read {
                        Ok(0) => return Close("peer closed the connection".into()),
                        Ok(_) => {
                            ping_outstanding = false;
                            self.read_at = read_half.arrival().unwrap_or_else(Instant::now);
                        }
                        Err(e) => return Close(format!("read error: {e}")),
                    }
                    let mut handled = 0;
                    loop {
                        let frame = match decoder.decode(&mut buf) {
                            Ok(Some(frame)) => frame,
                            Ok(None) => break,
                            Err(FrameError::ChecksumMismatch { command }) => {
                                if let Err(close) = self.on_checksum_mismatch(command).await {
                                    return close;
                                }
                                continue;
                            }
                            Err(e) => return Close(format!("bad frame: {e}")),
                        };
                        if let Err(close) = self.handle(frame).await {
                            return close;
                        }
                        handled += 1;
                        if handled % frames_per_wakeup == 0 {
                            tokio::task::yield_now().await;
                        }
                    }
                    if buf.capacity() - buf.len() < 1024 {
                        buf.reserve(READ_BUFFER_BYTES);
                    }
                }
            }
        }
    }

    fn on_event(&mut self, event: ConnEvent) {
        match event {
            ConnEvent::ConsumerClosed(consumer_id) => {
                self.consumers.remove(&consumer_id);
            }
            ConnEvent::ProducerClosed(producer_id) => {
                // The topic already registered the successor; dropping the
                // job sender lets the receipt task finish what is in flight.
                self.producers.remove(&producer_id);
            }
        }
    }

    /// Opens `topic` off the read loop when it is not served yet; `command`
    /// comes back through `on_loaded`. False: handle the command now (the
    /// topic is open, its name is bad, or DEFERRED_LOADS_MAX loads run).
    fn load_topic_off_the_read_loop(
        &mut self,
        topic: &str,
        create: bool,
        action: TopicAction,
        command: impl FnOnce() -> Deferred,
    ) -> bool {
        let Ok(name) = TopicName::parse(topic) else {
            return false;
        };
        if self
            .service
            .served_topic(&name.to_string())
            .is_some_and(|t| !t.log.is_closed())
        {
            return false;
        }
        let Ok(permit) = Arc::clone(&self.deferred_loads).try_acquire_owned() else {
            return false;
        };
        let command = command();
        let in_flight = match &command {
            Deferred::Producer(body) => self.deferred_producers.entry(body.producer_id),
            Deferred::Subscribe(body) => self.deferred_consumers.entry(body.consumer_id),
        };
        in_flight.or_default().commands += 1;
        let service = Arc::clone(&self.service);
        let role = self.auth.principal.as_ref().map(|p| p.role.clone());
        let loaded = self.loaded_tx.clone();
        tokio::spawn(async move {
            let result = async {
                // Nothing is opened for a role that may not use the topic.
                if let (Some(config), Some(role)) = (&service.config.auth, &role) {
                    config
                        .authorize_namespace(&service.admin, role, &name.namespace, action)
                        .await?;
                }
                service.topic(&name, create).await.map(|_| ())
            }
            .await;
            drop(permit);
            // A closed connection dropped its receiver: nothing to answer.
            let _ = loaded.send(Loaded { command, result }).await;
        });
        true
    }

    async fn on_loaded(&mut self, loaded: Loaded) -> Result<(), Close> {
        let (in_flight, id, request_id) = match &loaded.command {
            Deferred::Producer(b) => (&mut self.deferred_producers, b.producer_id, b.request_id),
            Deferred::Subscribe(b) => (&mut self.deferred_consumers, b.consumer_id, b.request_id),
        };
        let mut closed = false;
        if let Some(entry) = in_flight.get_mut(&id) {
            entry.commands -= 1;
            closed = entry.closed;
            if entry.commands == 0 {
                in_flight.remove(&id);
            }
        }
        if closed {
            let error = ServiceError::new(
                ServerError::ServiceNotReady,
                "closed by the client while its topic was opening",
            );
            return self.send_error(request_id, error).await;
        }
        match (loaded.command, loaded.result) {
            (Deferred::Producer(body), Ok(())) => self.on_producer(body, true).await,
            (Deferred::Subscribe(body), Ok(())) => self.on_subscribe(body, true).await,
            (Deferred::Producer(body), Err(e)) => {
                tracing::info!(conn = self.id, topic = %body.topic, error = %e, "PRODUCER refused");
                self.send_error(body.request_id, e).await
            }
            (Deferred::Subscribe(body), Err(e)) => {
                tracing::info!(conn = self.id, topic = %body.topic, subscription = %body.subscription, error = %e, "SUBSCRIBE refused");
                self.send_error(body.request_id, e).await
            }
        }
    }

    fn drain_events(&mut self) {
        while let Ok(event) = self.events_rx.try_recv() {
            self.on_event(event);
        }
    }

    async fn send(&self, command: impl Into<BaseCommand>) -> Result<(), Close> {
        self.out
            .send(codec::encode_command(command))
            .await
            .map_err(|_| Close("writer gone".into()))
    }

    async fn send_error(&self, request_id: u64, error: ServiceError) -> Result<(), Close> {
        tracing::debug!(conn = self.id, request_id, error = %error, "request failed");
        self.send(proto::CommandError {
            request_id,
            error: error.code as i32,
            message: error.message,
        })
        .await
    }

    async fn send_success(&self, request_id: u64) -> Result<(), Close> {
        self.send(proto::CommandSuccess {
            request_id,
            schema: None,
        })
        .await
    }

    async fn handle(&mut self, frame: Inbound) -> Result<(), Close> {
        let Inbound {
            command,
            entry,
            frame_bytes,
        } = frame;
        let command = match command {
            // The hot command, compact: no BaseCommand is built for it.
            Command::Send(send) => {
                if !self.connected {
                    return Err(Close(format!("{:?} before CONNECT", Type::Send)));
                }
                return match entry {
                    Some(entry) => self.on_send(send, entry, frame_bytes).await,
                    None => Err(Close("SEND without body or payload".into())),
                };
            }
            Command::Other(command) => *command,
        };
        let Ok(kind) = Type::try_from(command.r#type) else {
            return Err(Close(format!("unknown command type {}", command.r#type)));
        };
        if !self.connected && kind != Type::Connect {
            return Err(Close(format!("{kind:?} before CONNECT")));
        }
        match kind {
            Type::Connect => self.on_connect(command.connect.map(|b| *b)).await,
            Type::Ping => self.send(proto::CommandPong {}).await,
            Type::Pong => Ok(()),
            Type::AuthResponse => {
                self.on_auth_response(command.auth_response.map(|b| *b))
                    .await
            }
            Type::PartitionedMetadata => match command.partition_metadata {
                Some(body) => self.on_partitioned_metadata(*body).await,
                None => Err(missing(kind)),
            },
            Type::Lookup => match command.lookup_topic {
                Some(body) => self.on_lookup(*body).await,
                None => Err(missing(kind)),
            },
            Type::GetTopicsOfNamespace => match command.get_topics_of_namespace {
                Some(body) => self.on_topics_of_namespace(*body).await,
                None => Err(missing(kind)),
            },
            Type::Producer => match command.producer {
                Some(body) => self.on_producer(*body, false).await,
                None => Err(missing(kind)),
            },
            // The decoder hands out every SEND as `Command::Send`; a SEND
            // built some other way is still served.
            Type::Send => match (command.send.as_deref(), entry) {
                (Some(body), Some(entry)) => {
                    self.on_send(SendCommand::from(body), entry, frame_bytes)
                        .await
                }
                _ => Err(Close("SEND without body or payload".into())),
            },
            Type::CloseProducer => match command.close_producer {
                Some(body) => self.on_close_producer(*body).await,
                None => Err(missing(kind)),
            },
            Type::Subscribe => match command.subscribe {
                Some(body) => self.on_subscribe(*body, false).await,
                None => Err(missing(kind)),
            },
            Type::Flow => match command.flow {
                Some(body) => {
                    let permits = body.message_permits;
                    self.forward_to_subscription(body.consumer_id, |key| SubCommand::Flow {
                        key,
                        permits,
                    })
                    .await
                }
                None => Err(missing(kind)),
            },
            Type::Ack => match command.ack {
                Some(body) => {
                    let ack_type = proto::command_ack::AckType::try_from(body.ack_type)
                        .unwrap_or(proto::command_ack::AckType::Individual);
                    let ids = body.message_id;
                    let request_id = body.request_id;
                    self.forward_to_subscription(body.consumer_id, |key| SubCommand::Ack {
                        key,
                        ack_type,
                        ids,
                        request_id,
                    })
                    .await
                }
                None => Err(missing(kind)),
            },
            Type::RedeliverUnacknowledgedMessages => {
                match command.redeliver_unacknowledged_messages {
                    Some(body) => {
                        let ids = body.message_ids;
                        let epoch = body.consumer_epoch;
                        self.forward_to_subscription(body.consumer_id, |key| {
                            SubCommand::Redeliver { key, ids, epoch }
                        })
                        .await
                    }
                    None => Err(missing(kind)),
                }
            }
            Type::CloseConsumer => match command.close_consumer {
                Some(body) => {
                    self.on_close_consumer(body.consumer_id, body.request_id)
                        .await
                }
                None => Err(missing(kind)),
            },
            Type::Unsubscribe => match command.unsubscribe {
                Some(body) => self.on_unsubscribe(*body).await,
                None => Err(missing(kind)),
            },
            Type::Seek => match command.seek {
                Some(body) => self.on_seek(*body).await,
                None => Err(missing(kind)),
            },
            Type::GetLastMessageId => match command.get_last_message_id {
                Some(body) => {
                    self.on_get_last_message_id(body.consumer_id, body.request_id)
                        .await
                }
                None => Err(missing(kind)),
            },
            Type::ConsumerStats => match command.consumer_stats {
                Some(body) => {
                    self.on_consumer_stats(body.consumer_id, body.request_id)
                        .await
                }
                None => Err(missing(kind)),
            },
            Type::GetSchema => match command.get_schema {
                Some(body) => self.on_get_schema(*body).await,
                None => Err(missing(kind)),
            },
            Type::GetOrCreateSchema => match command.get_or_create_schema {
                Some(body) => self.on_get_or_create_schema(*body).await,
                None => Err(missing(kind)),
            },
            other => Err(Close(format!("unsupported command {other:?}"))),
        }
    }

    async fn on_connect(&mut self, body: Option<proto::CommandConnect>) -> Result<(), Close> {
        let Some(connect) = body else {
            return Err(missing(Type::Connect));
        };
        if self.connected {
            return Err(Close("second CONNECT".into()));
        }
        self.protocol_version = connect
            .protocol_version
            .unwrap_or(0)
            .clamp(0, PROTOCOL_VERSION_MAX);
        self.client_version = connect.client_version.chars().take(128).collect();
        if let Some(config) = &self.service.config.auth {
            let data = connect.auth_data.as_deref().unwrap_or_default();
            match config.authenticate(connect.auth_method_name.as_deref(), data, SystemTime::now())
            {
                Ok(principal) => self.auth.principal = Some(principal),
                Err(e) => return Err(self.refuse_credentials(e).await),
            }
            self.auth.supports_refresh = connect
                .feature_flags
                .as_ref()
                .and_then(|f| f.supports_auth_refresh)
                .unwrap_or(false);
        }
        self.connected = true;
        tracing::info!(
            conn = self.id,
            peer = %self.peer,
            client = %self.client_version,
            protocol_version = self.protocol_version,
            role = self.auth.principal.as_ref().map(|p| p.role.as_str()),
            "connected"
        );
        self.send(proto::CommandConnected {
            server_version: SERVER_VERSION.to_string(),
            protocol_version: Some(self.protocol_version),
            max_message_size: Some(self.service.config.max_message_size_bytes as i32),
            feature_flags: Some(proto::FeatureFlags {
                supports_get_partitioned_metadata_without_auto_creation: Some(true),
                ..proto::FeatureFlags::default()
            }),
        })
        .await
    }

    /// Answers bad credentials as the Java broker does: ERROR with request
    /// id −1 (u64::MAX) and AuthenticationError; the caller closes.
    async fn refuse_credentials(&self, error: ServiceError) -> Close {
        tracing::info!(conn = self.id, peer = %self.peer, error = %error.message, "authentication failed");
        let _ = self
            .send(proto::CommandError {
                request_id: u64::MAX,
                error: ServerError::AuthenticationError as i32,
                message: error.message.clone(),
            })
            .await;
        Close(format!("authentication failed: {}", error.message))
    }

    /// The refresh check: an expired token is challenged once; still
    /// expired at the next check (no valid answer) closes the connection.
    async fn check_credentials(&mut self) -> Result<(), Close> {
        let expired = self
            .auth
            .principal
            .as_ref()
            .and_then(|p| p.expires_at)
            .is_some_and(|at| at <= SystemTime::now());
        if !expired {
            return Ok(());
        }
        if self.auth.challenge_pending {
            return Err(Close("token expired and not refreshed".into()));
        }
        if !self.auth.supports_refresh {
            return Err(Close(
                "token expired; the client does not support refreshing it".into(),
            ));
        }
        self.auth.challenge_pending = true;
        tracing::debug!(conn = self.id, "token expired: AUTH_CHALLENGE");
        self.send(proto::CommandAuthChallenge {
            server_version: Some(SERVER_VERSION.to_string()),
            challenge: Some(proto::AuthData {
                auth_method_name: Some(auth::TOKEN_METHOD.to_string()),
                auth_data: Some(Bytes::from_static(auth::REFRESH_AUTH_DATA)),
            }),
            protocol_version: Some(self.protocol_version),
        })
        .await
    }

    /// A fresh token in answer to AUTH_CHALLENGE. The role may not change
    /// (as the Java broker insists); a bad token closes the connection.
    async fn on_auth_response(
        &mut self,
        body: Option<proto::CommandAuthResponse>,
    ) -> Result<(), Close> {
        let Some(config) = &self.service.config.auth else {
            return Ok(());
        };
        let response = body.and_then(|b| b.response).unwrap_or_default();
        let data = response.auth_data.as_deref().unwrap_or_default();
        let fresh = match config.authenticate(
            response.auth_method_name.as_deref(),
            data,
            SystemTime::now(),
        ) {
            Ok(fresh) => fresh,
            Err(e) => return Err(self.refuse_credentials(e).await),
        };
        let role = self.auth.principal.as_ref().map(|p| p.role.as_str());
        if role != Some(fresh.role.as_str()) {
            return Err(Close(format!(
                "AUTH_RESPONSE for role {} on a connection of role {}",
                fresh.role,
                role.unwrap_or("-")
            )));
        }
        tracing::debug!(conn = self.id, role = %fresh.role, "credentials refreshed");
        self.auth.principal = Some(fresh);
        self.auth.challenge_pending = false;
        Ok(())
    }

    /// Checks that this connection's role may do `action` on `ns`'s topics
    /// (always fine when auth or authorization is off).
    async fn authorize(&self, ns: &NamespaceName, action: TopicAction) -> Result<(), ServiceError> {
        let (Some(config), Some(principal)) = (&self.service.config.auth, &self.auth.principal)
        else {
            return Ok(());
        };
        config
            .authorize_namespace(&self.service.admin, &principal.role, ns, action)
            .await
    }

    async fn on_partitioned_metadata(
        &mut self,
        body: proto::CommandPartitionedTopicMetadata,
    ) -> Result<(), Close> {
        let request_id = body.request_id;
        let result = async {
            let topic = TopicName::parse(&body.topic)?;
            self.authorize(&topic.namespace, TopicAction::Lookup)
                .await?;
            let partitions = self.service.partitions_of(&topic).await?;
            let auto_create = body.metadata_auto_creation_enabled.unwrap_or(true);
            if partitions == 0 && !auto_create && !self.service.admin.topic_exists(&topic).await? {
                return Err(ServiceError::new(
                    ServerError::TopicNotFound,
                    format!("Topic {topic} does not exist"),
                ));
            }
            Ok::<u32, ServiceError>(partitions)
        }
        .await;
        let response = match result {
            Ok(partitions) => proto::CommandPartitionedTopicMetadataResponse {
                partitions: Some(partitions),
                request_id,
                response: Some(MetadataResult::Success as i32),
                error: None,
                message: None,
            },
            Err(e) => proto::CommandPartitionedTopicMetadataResponse {
                partitions: Some(0),
                request_id,
                response: Some(MetadataResult::Failed as i32),
                error: Some(e.code as i32),
                message: Some(e.message),
            },
        };
        self.send(response).await
    }

    async fn on_lookup(&mut self, body: proto::CommandLookupTopic) -> Result<(), Close> {
        let request_id = body.request_id;
        let authoritative = body.authoritative.unwrap_or(false);
        let result = async {
            let topic = TopicName::parse(&body.topic)?;
            self.authorize(&topic.namespace, TopicAction::Lookup)
                .await?;
            self.service.lookup(&topic, authoritative).await
        }
        .await;
        let response = match result {
            Ok(answer) => {
                let (owner, response) = match answer {
                    LookupAnswer::Connect(owner) => (owner, LookupType::Connect),
                    LookupAnswer::Redirect(chosen) => (chosen, LookupType::Redirect),
                };
                proto::CommandLookupTopicResponse {
                    // A `pulsar+ssl://` client follows the TLS URL: each broker's
                    // registration carries its own.
                    broker_service_url_tls: owner.service_url_tls,
                    broker_service_url: Some(owner.service_url),
                    response: Some(response as i32),
                    request_id,
                    authoritative: Some(true),
                    error: None,
                    message: None,
                    proxy_through_service_url: Some(false),
                }
            }
            Err(e) => proto::CommandLookupTopicResponse {
                broker_service_url: None,
                broker_service_url_tls: None,
                response: Some(LookupType::Failed as i32),
                request_id,
                authoritative: Some(false),
                error: Some(e.code as i32),
                message: Some(e.message),
                proxy_through_service_url: Some(false),
            },
        };
        self.send(response).await
    }

    async fn on_topics_of_namespace(
        &mut self,
        body: proto::CommandGetTopicsOfNamespace,
    ) -> Result<(), Close> {
        let request_id = body.request_id;
        let result = async {
            let ns = NamespaceName::parse(&body.namespace)?;
            self.authorize(&ns, TopicAction::Lookup).await?;
            let mode = body.mode.unwrap_or(0);
            if mode == proto::command_get_topics_of_namespace::Mode::NonPersistent as i32 {
                return Ok(Vec::new());
            }
            Ok::<_, ServiceError>(self.service.admin.topics_of_namespace(&ns).await?)
        }
        .await;
        match result {
            Ok(topics) => {
                self.send(proto::CommandGetTopicsOfNamespaceResponse {
                    request_id,
                    topics,
                    filtered: Some(false),
                    topics_hash: None,
                    changed: Some(true),
                })
                .await
            }
            Err(e) => self.send_error(request_id, e).await,
        }
    }

    /// `topic_loaded`: the topic was opened off the read loop already (see
    /// `load_topic_off_the_read_loop`).
    async fn on_producer(
        &mut self,
        body: proto::CommandProducer,
        topic_loaded: bool,
    ) -> Result<(), Close> {
        let request_id = body.request_id;
        let producer_id = body.producer_id;
        if let Some(existing) = self.producers.get(&producer_id) {
            // A retry of a PRODUCER that already succeeded on this connection.
            if existing.topic.full_name
                == TopicName::parse(&body.topic)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            {
                let name = existing.name.clone();
                let last_sequence_id = existing.topic.last_sequence_id(&name);
                return self
                    .send(proto::CommandProducerSuccess {
                        request_id,
                        producer_name: name,
                        last_sequence_id: Some(last_sequence_id),
                        schema_version: Some(Bytes::new()),
                        topic_epoch: None,
                        producer_ready: Some(true),
                    })
                    .await;
            }
            return self
                .send_error(
                    request_id,
                    ServiceError::new(
                        ServerError::ProducerBusy,
                        "producer id already in use on this connection",
                    ),
                )
                .await;
        }
        if self.producers.len() >= self.service.config.limits.producers_max {
            return self
                .send_error(
                    request_id,
                    ServiceError::new(
                        ServerError::NotAllowedError,
                        "producers_max reached on this connection",
                    ),
                )
                .await;
        }
        if !topic_loaded
            && self.load_topic_off_the_read_loop(&body.topic, true, TopicAction::Produce, || {
                Deferred::Producer(body.clone())
            })
        {
            return Ok(());
        }
        match self.create_producer(&body).await {
            Ok(Some(success)) => self.send(success).await,
            Ok(None) => Ok(()),
            Err(e) => {
                tracing::info!(conn = self.id, topic = %body.topic, error = %e, "PRODUCER refused");
                self.send_error(request_id, e).await
            }
        }
    }

    async fn create_producer(
        &mut self,
        body: &proto::CommandProducer,
    ) -> Result<Option<proto::CommandProducerSuccess>, ServiceError> {
        let topic_name = TopicName::parse(&body.topic)?;
        self.authorize(&topic_name.namespace, TopicAction::Produce)
            .await?;
        let topic = self.service.topic(&topic_name, true).await?;
        let schema_version = match &body.schema {
            Some(s) if !schema::is_empty_schema(s) => {
                Some(self.service.schemas.get_or_create(&topic_name, s).await?)
            }
            _ => None,
        };
        let name = match body.producer_name.as_deref() {
            Some(name) if name.len() > NAME_BYTES_MAX => {
                return Err(ServiceError::new(
                    ServerError::NotAllowedError,
                    "producer name longer than NAME_BYTES_MAX",
                ));
            }
            Some(name) if !name.is_empty() => name.to_string(),
            _ => self.service.next_producer_name(),
        };
        let access_mode = body
            .producer_access_mode
            .and_then(|m| proto::ProducerAccessMode::try_from(m).ok())
            .unwrap_or(proto::ProducerAccessMode::Shared);
        let reg = ProducerReg {
            conn_id: self.id,
            producer_id: body.producer_id,
            epoch: body.epoch.unwrap_or(0),
            exclusive: false,
            out: self.out.clone(),
            events: self.events_tx.clone(),
            address: self.peer.to_string(),
            client_version: self.client_version.clone(),
        };
        let exclusive = access_mode != proto::ProducerAccessMode::Shared;
        let last_sequence_id = topic.last_sequence_id(&name);
        let success = proto::CommandProducerSuccess {
            request_id: body.request_id,
            producer_name: name.clone(),
            last_sequence_id: Some(last_sequence_id),
            // The Java client reads schema_version unconditionally; the Java
            // broker sends an empty one for a topic without schema.
            schema_version: Some(
                schema_version
                    .map(schema::encode_version)
                    .unwrap_or_default(),
            ),
            topic_epoch: exclusive.then_some(0),
            producer_ready: Some(true),
        };
        // A waiting producer's "not ready" answer is queued by the topic
        // under its lock, so it always precedes the later "ready" one.
        let not_ready = codec::encode_command(proto::CommandProducerSuccess {
            producer_ready: Some(false),
            ..success.clone()
        });
        let admission = topic.add_producer(&name, reg, access_mode, body.request_id, not_ready)?;
        let (jobs, jobs_rx) =
            mpsc::channel(self.service.config.limits.pending_sends_max.max(1) + 1);
        tokio::spawn(receipt_loop(
            body.producer_id,
            jobs_rx,
            self.out.clone(),
            Arc::clone(&self.service),
        ));
        tracing::debug!(conn = self.id, topic = %topic.full_name, producer = %name, "producer created");
        self.producers.insert(
            body.producer_id,
            ConnProducer {
                topic,
                name: name.clone(),
                jobs,
            },
        );
        Ok((admission == Admission::Ready).then_some(success))
    }

    async fn on_send(
        &mut self,
        body: SendCommand,
        entry: Bytes,
        frame_bytes: usize,
    ) -> Result<(), Close> {
        let Some(producer) = self.producers.get(&body.producer_id) else {
            return Err(Close(format!(
                "SEND for unknown producer id {}",
                body.producer_id
            )));
        };
        let received = self.read_at;
        let jobs = producer.jobs.clone();
        let sequence_id = body.sequence_id;
        let highest_sequence_id = body.highest_sequence_id().unwrap_or(0);
        // Size: the frame decoder already refused frames above
        // max_message_size + FRAME_PADDING_BYTES (closing the connection), as
        // the Java broker's frame decoder does; chunks of exactly
        // max_message_size plus their metadata must pass, so nothing more is
        // checked here.
        // Back-pressure: wait (not reading) until earlier sends drain.
        let bytes_limit = self.service.config.limits.pending_send_bytes_max;
        let bytes = u32::try_from(frame_bytes.min(bytes_limit)).unwrap_or(u32::MAX);
        let (Ok(send_permit), Ok(bytes_permit)) = (
            Arc::clone(&self.pending_sends).acquire_owned().await,
            Arc::clone(&self.pending_bytes)
                .acquire_many_owned(bytes)
                .await,
        ) else {
            return Err(Close("pending-send semaphores closed".into()));
        };
        let Some(producer) = self.producers.get(&body.producer_id) else {
            return Ok(());
        };
        let messages = body.num_messages().unwrap_or(1).max(1) as u32;
        // Publish rate: past it, this connection stops reading for the pause
        // (Pulsar's throttling: TCP back-pressure, nothing refused).
        let pause = producer.topic.publish_pause(messages, entry.len());
        let job = match producer.topic.dedup_check(
            &producer.name,
            sequence_id as i64,
            highest_sequence_id as i64,
        ) {
            DedupCheck::Duplicate => ReceiptJob::Duplicate {
                sequence_id,
                highest_sequence_id,
                _permits: (send_permit, bytes_permit),
            },
            DedupCheck::Fresh => ReceiptJob::Send {
                sequence_id,
                highest_sequence_id,
                received,
                issued: Instant::now(),
                append: producer.topic.publish(entry, messages),
                topic_metrics: Arc::clone(&producer.topic.metrics),
                _permits: (send_permit, bytes_permit),
            },
        };
        let _ = jobs.send(job).await;
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        Ok(())
    }

    async fn on_checksum_mismatch(&mut self, command: Command) -> Result<(), Close> {
        let Some(send) = command.as_send() else {
            return Err(Close("checksum mismatch on a non-SEND frame".into()));
        };
        tracing::warn!(
            conn = self.id,
            producer_id = send.producer_id,
            sequence_id = send.sequence_id,
            "SEND checksum mismatch"
        );
        let Some(producer) = self.producers.get(&send.producer_id) else {
            return Err(Close(format!(
                "SEND for unknown producer id {}",
                send.producer_id
            )));
        };
        let job = ReceiptJob::Error {
            sequence_id: send.sequence_id,
            code: ServerError::ChecksumError,
            message: "Checksum failed on the broker".into(),
        };
        let _ = producer.jobs.send(job).await;
        Ok(())
    }

    async fn on_close_producer(&mut self, body: proto::CommandCloseProducer) -> Result<(), Close> {
        if let Some(deferred) = self.deferred_producers.get_mut(&body.producer_id) {
            deferred.closed = true;
        }
        match self.producers.remove(&body.producer_id) {
            Some(producer) => {
                producer
                    .topic
                    .remove_producer(&producer.name, self.id, body.producer_id);
                // SUCCESS goes out after every receipt in flight.
                let _ = producer
                    .jobs
                    .send(ReceiptJob::Close {
                        request_id: body.request_id,
                    })
                    .await;
                Ok(())
            }
            None => self.send_success(body.request_id).await,
        }
    }

    /// `topic_loaded`: as for `on_producer`.
    async fn on_subscribe(
        &mut self,
        body: proto::CommandSubscribe,
        topic_loaded: bool,
    ) -> Result<(), Close> {
        let request_id = body.request_id;
        self.drain_events();
        if let Some(existing) = self.consumers.get(&body.consumer_id) {
            if existing.sub.name == body.subscription
                && TopicName::parse(&body.topic)
                    .is_ok_and(|t| t.to_string() == existing.topic.full_name)
            {
                return self.send_success(request_id).await;
            }
            return self
                .send_error(
                    request_id,
                    ServiceError::new(
                        ServerError::ConsumerBusy,
                        "consumer id already in use on this connection",
                    ),
                )
                .await;
        }
        if self.consumers.len() >= self.service.config.limits.consumers_max {
            return self
                .send_error(
                    request_id,
                    ServiceError::new(
                        ServerError::NotAllowedError,
                        "consumers_max reached on this connection",
                    ),
                )
                .await;
        }
        if !topic_loaded
            && self.load_topic_off_the_read_loop(
                &body.topic,
                body.force_topic_creation.unwrap_or(true),
                TopicAction::Consume,
                || Deferred::Subscribe(body.clone()),
            )
        {
            return Ok(());
        }
        match self.create_consumer(&body).await {
            Ok(()) => self.send_success(request_id).await,
            Err(e) => {
                tracing::info!(conn = self.id, topic = %body.topic, subscription = %body.subscription, error = %e, "SUBSCRIBE refused");
                self.send_error(request_id, e).await
            }
        }
    }

    async fn create_consumer(
        &mut self,
        body: &proto::CommandSubscribe,
    ) -> Result<(), ServiceError> {
        let topic_name = TopicName::parse(&body.topic)?;
        self.authorize(&topic_name.namespace, TopicAction::Consume)
            .await?;
        if body.subscription.is_empty() || body.subscription.len() > NAME_BYTES_MAX {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                "subscription name empty or longer than NAME_BYTES_MAX",
            ));
        }
        let topic = self
            .service
            .topic(&topic_name, body.force_topic_creation.unwrap_or(true))
            .await?;
        if let Some(s) = &body.schema
            && !schema::is_empty_schema(s)
        {
            self.service.schemas.get_or_create(&topic_name, s).await?;
        }
        let sub_type = SubType::try_from(body.sub_type).map_err(|_| {
            ServiceError::new(ServerError::NotAllowedError, "unknown subscription type")
        })?;
        let durable = body.durable.unwrap_or(true);
        let reader_start = if durable {
            None
        } else {
            reader_start(body.start_message_id.as_ref())
        };
        let (sticky, sticky_ranges) = match &body.key_shared_meta {
            Some(meta) if meta.key_shared_mode == proto::KeySharedMode::Sticky as i32 => {
                let ranges: Vec<(i32, i32)> =
                    meta.hash_ranges.iter().map(|r| (r.start, r.end)).collect();
                (true, Some(ranges))
            }
            _ => (false, None),
        };
        let allow_out_of_order = body
            .key_shared_meta
            .as_ref()
            .and_then(|m| m.allow_out_of_order_delivery)
            .unwrap_or(false);
        let request = SubscribeRequest {
            subscription: body.subscription.clone(),
            sub_type,
            durable,
            initial_earliest: body.initial_position == Some(InitialPosition::Earliest as i32),
            reader_start,
            sticky,
            read_compacted: body.read_compacted.unwrap_or(false),
        };
        let info = ConsumerInfo {
            conn_id: self.id,
            consumer_id: body.consumer_id,
            name: body
                .consumer_name
                .as_deref()
                .unwrap_or_default()
                .chars()
                .take(NAME_BYTES_MAX)
                .collect(),
            priority_level: body.priority_level.unwrap_or(0),
            out: self.out.clone(),
            events: self.events_tx.clone(),
            protocol_version: self.protocol_version,
            sticky_ranges,
            address: self.peer.to_string(),
            epoch: body.consumer_epoch,
            allow_out_of_order,
        };
        let (sub, slot) = topic.subscribe(&request, info).await?;
        tracing::debug!(conn = self.id, topic = %topic.full_name, subscription = %sub.name, "consumer created");
        self.consumers.insert(
            body.consumer_id,
            ConnConsumer {
                topic,
                sub,
                _slot: slot,
            },
        );
        Ok(())
    }

    async fn forward_to_subscription(
        &mut self,
        consumer_id: u64,
        make: impl FnOnce((u64, u64)) -> SubCommand,
    ) -> Result<(), Close> {
        let Some(consumer) = self.consumers.get(&consumer_id) else {
            tracing::debug!(
                conn = self.id,
                consumer_id,
                "command for an unknown consumer ignored"
            );
            return Ok(());
        };
        let _ = consumer.sub.tx.send(make((self.id, consumer_id))).await;
        Ok(())
    }

    async fn on_close_consumer(&mut self, consumer_id: u64, request_id: u64) -> Result<(), Close> {
        if let Some(deferred) = self.deferred_consumers.get_mut(&consumer_id) {
            deferred.closed = true;
        }
        if let Some(consumer) = self.consumers.remove(&consumer_id) {
            let (reply, done) = oneshot::channel();
            let command = SubCommand::Remove {
                key: (self.id, consumer_id),
                reply: Some(reply),
            };
            if consumer.sub.tx.send(command).await.is_ok() {
                let _ = done.await;
            }
        }
        self.send_success(request_id).await
    }

    async fn on_unsubscribe(&mut self, body: proto::CommandUnsubscribe) -> Result<(), Close> {
        let Some(consumer) = self.consumers.get(&body.consumer_id) else {
            return self
                .send_error(
                    body.request_id,
                    ServiceError::new(ServerError::ConsumerNotFound, "unknown consumer"),
                )
                .await;
        };
        let (reply, answer) = oneshot::channel();
        let command = SubCommand::Unsubscribe {
            key: (self.id, body.consumer_id),
            force: body.force.unwrap_or(false),
            reply,
        };
        let result = match consumer.sub.tx.send(command).await {
            Ok(()) => answer.await.unwrap_or(Ok(())),
            Err(_) => Ok(()),
        };
        match result {
            Ok(()) => {
                self.consumers.remove(&body.consumer_id);
                self.send_success(body.request_id).await
            }
            Err(e) => self.send_error(body.request_id, e).await,
        }
    }

    async fn on_seek(&mut self, body: proto::CommandSeek) -> Result<(), Close> {
        let Some(consumer) = self.consumers.get(&body.consumer_id) else {
            return self
                .send_error(
                    body.request_id,
                    ServiceError::new(ServerError::ConsumerNotFound, "unknown consumer"),
                )
                .await;
        };
        let target = match (&body.message_id, body.message_publish_time) {
            (Some(id), _) => SeekTarget::MessageId {
                ledger_id: id.ledger_id,
                entry_id: id.entry_id,
            },
            (None, Some(time_ms)) => SeekTarget::PublishTime(time_ms),
            (None, None) => {
                return self
                    .send_error(
                        body.request_id,
                        ServiceError::new(ServerError::NotAllowedError, "SEEK without a target"),
                    )
                    .await;
            }
        };
        let (reply, answer) = oneshot::channel();
        let result = match consumer
            .sub
            .tx
            .send(SubCommand::Seek { target, reply })
            .await
        {
            Ok(()) => answer.await.unwrap_or_else(|_| {
                Err(ServiceError::new(
                    ServerError::ServiceNotReady,
                    "subscription closed",
                ))
            }),
            Err(_) => Err(ServiceError::new(
                ServerError::ServiceNotReady,
                "subscription closed",
            )),
        };
        self.drain_events();
        match result {
            Ok(()) => self.send_success(body.request_id).await,
            Err(e) => self.send_error(body.request_id, e).await,
        }
    }

    async fn on_get_last_message_id(
        &mut self,
        consumer_id: u64,
        request_id: u64,
    ) -> Result<(), Close> {
        let Some(consumer) = self.consumers.get(&consumer_id) else {
            return self
                .send_error(
                    request_id,
                    ServiceError::new(ServerError::ConsumerNotFound, "unknown consumer"),
                )
                .await;
        };
        let topic = Arc::clone(&consumer.topic);
        let partition = topic.name.partition_index();
        let (reply, answer) = oneshot::channel();
        let mark_delete = match consumer.sub.tx.send(SubCommand::MarkDelete { reply }).await {
            Ok(()) => answer.await.ok().flatten(),
            Err(_) => None,
        };
        let last_message_id = match topic.log.last_confirmed() {
            Some(last) => {
                let batch_index = match topic.log.read(last, 1, usize::MAX).await {
                    Ok(entries) => entries
                        .first()
                        .filter(|e| e.position == last)
                        .and_then(|e| codec::entry_metadata(&e.data))
                        .and_then(|m| m.num_messages_in_batch)
                        .map(|n| n - 1),
                    Err(_) => None,
                };
                MessageIdData {
                    ledger_id: last.ledger_id,
                    entry_id: last.entry_id,
                    partition: Some(partition),
                    batch_index,
                    ..MessageIdData::default()
                }
            }
            None => MessageIdData {
                ledger_id: u64::MAX,
                entry_id: u64::MAX,
                partition: Some(partition),
                ..MessageIdData::default()
            },
        };
        self.send(proto::CommandGetLastMessageIdResponse {
            last_message_id,
            request_id,
            consumer_mark_delete_position: mark_delete.map(|p: Position| MessageIdData {
                ledger_id: p.ledger_id,
                entry_id: p.entry_id,
                partition: Some(partition),
                ..MessageIdData::default()
            }),
        })
        .await
    }

    async fn on_consumer_stats(&mut self, consumer_id: u64, request_id: u64) -> Result<(), Close> {
        let snapshot = match self.consumers.get(&consumer_id) {
            Some(consumer) => {
                let (reply, answer) = oneshot::channel();
                let key = (self.id, consumer_id);
                match consumer.sub.tx.send(SubCommand::Stats { key, reply }).await {
                    Ok(()) => answer.await.ok().flatten(),
                    Err(_) => None,
                }
            }
            None => None,
        };
        let response = match snapshot {
            Some(s) => proto::CommandConsumerStatsResponse {
                request_id,
                consumer_name: Some(s.name),
                available_permits: Some(u64::try_from(s.available_permits.max(0)).unwrap_or(0)),
                unacked_messages: Some(s.unacked_messages),
                blocked_consumer_on_unacked_msgs: Some(false),
                address: Some(s.address),
                msg_backlog: Some(s.backlog),
                msg_rate_out: Some(0.0),
                msg_throughput_out: Some(0.0),
                msg_rate_redeliver: Some(0.0),
                msg_rate_expired: Some(0.0),
                message_ack_rate: Some(0.0),
                ..proto::CommandConsumerStatsResponse::default()
            },
            None => proto::CommandConsumerStatsResponse {
                request_id,
                error_code: Some(ServerError::ConsumerNotFound as i32),
                error_message: Some("unknown consumer".into()),
                ..proto::CommandConsumerStatsResponse::default()
            },
        };
        self.send(response).await
    }

    async fn on_get_schema(&mut self, body: proto::CommandGetSchema) -> Result<(), Close> {
        let request_id = body.request_id;
        let result = async {
            let topic = TopicName::parse(&body.topic)?;
            self.authorize(&topic.namespace, TopicAction::Lookup)
                .await?;
            let version = body
                .schema_version
                .as_deref()
                .and_then(schema::decode_version);
            self.service.schemas.get(&topic, version).await
        }
        .await;
        let response = match result {
            Ok(Some((version, schema))) => proto::CommandGetSchemaResponse {
                request_id,
                error_code: None,
                error_message: None,
                schema: Some(schema),
                schema_version: Some(schema::encode_version(version)),
            },
            Ok(None) => proto::CommandGetSchemaResponse {
                request_id,
                error_code: Some(ServerError::TopicNotFound as i32),
                error_message: Some("Topic not found or no-schema".into()),
                schema: None,
                schema_version: None,
            },
            Err(e) => proto::CommandGetSchemaResponse {
                request_id,
                error_code: Some(e.code as i32),
                error_message: Some(e.message),
                schema: None,
                schema_version: None,
            },
        };
        self.send(response).await
    }

    async fn on_get_or_create_schema(
        &mut self,
        body: proto::CommandGetOrCreateSchema,
    ) -> Result<(), Close> {
        let request_id = body.request_id;
        let result = async {
            let topic = TopicName::parse(&body.topic)?;
            self.authorize(&topic.namespace, TopicAction::Produce)
                .await?;
            self.service
                .schemas
                .get_or_create(&topic, &body.schema)
                .await
        }
        .await;
        let response = match result {
            Ok(version) => proto::CommandGetOrCreateSchemaResponse {
                request_id,
                error_code: None,
                error_message: None,
                schema_version: Some(schema::encode_version(version)),
            },
            Err(e) => proto::CommandGetOrCreateSchemaResponse {
                request_id,
                error_code: Some(e.code as i32),
                error_message: Some(e.message),
                schema_version: None,
            },
        };
        self.send(response).await
    }

    /// Detaches every producer and consumer of this connection.
    async fn cleanup(&mut self) {
        for (producer_id, producer) in self.producers.drain() {
            producer
                .topic
                .remove_producer(&producer.name, self.id, producer_id);
        }
        let consumers: Vec<(u64, ConnConsumer)> = self.consumers.drain().collect();
        for (consumer_id, consumer) in consumers {
            let command = SubCommand::Remove {
                key: (self.id, consumer_id),
                reply: None,
            };
            let _ = consumer.sub.tx.send(command).await;
        }
    }
}

fn missing(kind: Type) -> Close {
    Close(format!("{kind:?} without its sub-message"))
}

/// Reader start: the first position to deliver. Earliest (−1,−1) → the head;
/// latest or absent → `None` (after the last entry); any other id → that
/// entry itself. The Java broker turns every start id into a batch id and
/// steps back one entry, so the start entry is always delivered and the
/// client drops it unless its reader is inclusive (and drops the batch
/// indexes before the start index).
fn reader_start(start: Option<&MessageIdData>) -> Option<Position> {
    let id = start?;
    if id.ledger_id == u64::MAX && id.entry_id == u64::MAX {
        return Some(Position::new(0, 0));
    }
    if id.ledger_id == i64::MAX as u64 && id.entry_id == i64::MAX as u64 {
        return None;
    }
    if id.ledger_id > i64::MAX as u64 || id.entry_id > i64::MAX as u64 {
        // Other negative ids: treat as earliest.
        return Some(Position::new(0, 0));
    }
    Some(Position::new(id.ledger_id, id.entry_id))
}

async fn receipt_loop(
    producer_id: u64,
    mut jobs: mpsc::Receiver<ReceiptJob>,
    out: mpsc::Sender<Outbound>,
    service: Arc<Service>,
) {
    let metrics = &service.metrics;
    while let Some(job) = jobs.recv().await {
        let frame = match job {
            ReceiptJob::Send {
                sequence_id,
                highest_sequence_id,
                received,
                issued,
                append,
                topic_metrics,
                _permits,
            } => match append.await {
                Ok(position) => {
                    let durable = Instant::now();
                    topic_metrics
                        .storage_write_latency
                        .record(durable.saturating_duration_since(issued));
                    let frame = receipt(
                        producer_id,
                        sequence_id,
                        highest_sequence_id,
                        position.ledger_id,
                        position.entry_id,
                    );
                    match frame {
                        // Recorded by the writer once the receipt is out.
                        Outbound::Simple(frame) => Outbound::Receipt {
                            frame,
                            timing: crate::metrics::PublishTiming {
                                received,
                                topic: topic_metrics,
                            },
                        },
                        other => other,
                    }
                }
                Err(e) => {
                    metrics
                        .send_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(producer_id, sequence_id, error = %e, "append failed");
                    // The reason goes to the client (e.g. "not enough writable
                    // bookies ... read-only (disk full or failing)").
                    let error = ServiceError::from(e);
                    codec::encode_command(proto::CommandSendError {
                        producer_id,
                        sequence_id,
                        error: error.code as i32,
                        message: format!("persistence failure: {}", error.message),
                    })
                }
            },
            ReceiptJob::Duplicate {
                sequence_id,
                highest_sequence_id,
                _permits,
            } => receipt(
                producer_id,
                sequence_id,
                highest_sequence_id,
                u64::MAX,
                u64::MAX,
            ),
            ReceiptJob::Error {
                sequence_id,
                code,
                message,
            } => {
                metrics
                    .send_errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                codec::encode_command(proto::CommandSendError {
                    producer_id,
                    sequence_id,
                    error: code as i32,
                    message,
                })
            }
            ReceiptJob::Close { request_id } => {
                let _ = out
                    .send(codec::encode_command(proto::CommandSuccess {
                        request_id,
                        schema: None,
                    }))
                    .await;
                return;
            }
        };
        if out.send(frame).await.is_err() {
            return;
        }
    }
}

fn receipt(
    producer_id: u64,
    sequence_id: u64,
    highest_sequence_id: u64,
    ledger_id: u64,
    entry_id: u64,
) -> Outbound {
    codec::encode_command(proto::CommandSendReceipt {
        producer_id,
        sequence_id,
        message_id: Some(MessageIdData {
            ledger_id,
            entry_id,
            ..MessageIdData::default()
        }),
        highest_sequence_id: Some(highest_sequence_id),
    })
}

async fn write_loop<W: AsyncWrite + Unpin>(
    mut writer: W,
    mut frames: mpsc::Receiver<Outbound>,
    frames_per_wakeup: usize,
    service: Arc<Service>,
) {
    let budget = frames_per_wakeup.max(1);
    let mut batch: Vec<Bytes> = Vec::with_capacity(budget * 2);
    let mut timings: Vec<crate::metrics::PublishTiming> = Vec::with_capacity(budget);
    while let Some(first) = frames.recv().await {
        push_frame(&mut batch, &mut timings, first);
        let mut count = 1;
        while count < budget {
            match frames.try_recv() {
                Ok(frame) => {
                    push_frame(&mut batch, &mut timings, frame);
                    count += 1;
                }
                Err(_) => break,
            }
        }
        if let Err(e) = write_all(&mut writer, &mut batch).await {
            tracing::debug!(error = %e, "write failed");
            return;
        }
        let written = Instant::now();
        for timing in timings.drain(..) {
            timing.record(written, &service.metrics.publish_latency);
        }
        batch.clear();
    }
    let _ = writer.shutdown().await;
}

fn push_frame(
    batch: &mut Vec<Bytes>,
    timings: &mut Vec<crate::metrics::PublishTiming>,
    frame: Outbound,
) {
    match frame {
        Outbound::Simple(bytes) => batch.push(bytes),
        Outbound::Message { header, entry } => {
            batch.push(header);
            batch.push(entry);
        }
        Outbound::Receipt { frame, timing } => {
            batch.push(frame);
            timings.push(timing);
        }
    }
}

/// Writes every buffer with vectored writes, handling partial writes.
async fn write_all<W: AsyncWrite + Unpin>(
    writer: &mut W,
    buffers: &mut [Bytes],
) -> std::io::Result<()> {
    let mut index = 0;
    while index < buffers.len() {
        if buffers[index].is_empty() {
            index += 1;
            continue;
        }
        let slices: Vec<IoSlice<'_>> = buffers[index..]
            .iter()
            .take(IOVECS_PER_WRITE_MAX)
            .map(|b| IoSlice::new(b))
            .collect();
        let mut written = writer.write_vectored(&slices).await?;
        if written == 0 {
            return Err(std::io::ErrorKind::WriteZero.into());
        }
        while written > 0 && index < buffers.len() {
            let len = buffers[index].len();
            if written >= len {
                written -= len;
                index += 1;
            } else {
                buffers[index].advance(written);
                written = 0;
            }
        }
    }
    Ok(())
}
