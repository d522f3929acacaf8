//! One client connection: the reader task that decodes frames and
//! dispatches each command to the handler of its family.
//!
//! Module map (a new command family is one module plus one arm in
//! `Connection::handle`):
//! - `session`: handshake, authentication and its refresh, authorization
//!   checks, the outbound queue (`Session`, `Close`);
//! - `lookup`: LOOKUP, PARTITIONED_METADATA;
//! - `topic_list`: GET_TOPICS_OF_NAMESPACE and topic list watchers
//!   (WATCH_TOPIC_LIST, WATCH_TOPIC_LIST_CLOSE);
//! - `producer`: PRODUCER, SEND and its receipts, CLOSE_PRODUCER;
//! - `admission`: what every producer shares (the PRODUCER admission
//!   request, the SEND_RECEIPT frame);
//! - `consumer`: SUBSCRIBE, FLOW, ACK, redelivery, seek, unsubscribe,
//!   CLOSE_CONSUMER, last message id, consumer stats;
//! - `non_persistent`: what producers and consumers of non-persistent
//!   topics do differently (used by `producer` and `consumer`);
//! - `schema`: GET_SCHEMA, GET_OR_CREATE_SCHEMA;
//! - `transaction`: the coordinator's commands (TC_CLIENT_CONNECT,
//!   NEW_TXN, ADD_PARTITION_TO_TXN, ADD_SUBSCRIPTION_TO_TXN, END_TXN);
//! - `deferred`: the topic of a PRODUCER or SUBSCRIBE opened off the reader;
//! - `writer`: the socket writer task.
//!
//! Handlers depend on `session` (`producer` and `consumer` also on
//! `deferred`), and nothing here; this module depends on them.
//!
//! Tasks per connection: the reader (`Connection::run`, which handles
//! commands in arrival order, except that a PRODUCER or SUBSCRIBE whose topic
//! is not open yet is handled once a task of its own opened it: the reader
//! never waits for a topic to open; `DEFERRED_LOADS_MAX` loads run, more
//! commands wait their turn, and past `DEFERRED_WAITING_MAX` one is answered
//! ServiceNotReady), the writer (`writer::write_loop`: one vectored write per wake-up
//! of up to `frames_per_wakeup_max` frames) and, per producer, its receipts
//! (answered by the appends' completions strictly in SEND order, a task of
//! their own only while the writer's queue is full; `receipts`).
//!
//! Bounds: producers and consumers per connection; topic loads off the
//! reader per connection (`DEFERRED_LOADS_MAX` running, `DEFERRED_WAITING_MAX`
//! commands and `DEFERRED_WAITING_BYTES_MAX` waiting; past those a command
//! is answered ServiceNotReady, which clients retry); pending SENDs and pending
//! SEND bytes (semaphores: when exhausted the reader stops reading, which
//! pushes back on the client through TCP); the outbound queue; a topic's
//! publish rate (past it the reader pauses after the SEND, the same way);
//! frames handled per read wake-up before yielding.
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

mod admission;
mod consumer;
mod deferred;
mod lookup;
mod non_persistent;
mod producer;
mod receipts;
mod schema;
mod session;
mod topic_list;
mod transaction;
mod writer;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::{mpsc, watch};
use vela_wire::proto::{self, base_command::Type};
use vela_wire::{Command, SendCommand};

use crate::auth::TransportIdentity;
use crate::codec::{Decoder, FrameError, Inbound};
use crate::service::Service;
use crate::subscription::ConnEvent;
use consumer::Consumers;
use deferred::{Deferred, DeferredLoads, Loaded, TopicOpening};
use producer::Producers;
use session::{Close, Session, required};
use topic_list::Watchers;
use transaction::TxnRequests;

/// Read buffer size: one read syscall takes up to this much.
const READ_BUFFER_BYTES: usize = 64 * 1024;
/// Time the writer gets to flush queued frames after the reader stopped.
const WRITER_DRAIN_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(5);

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
    let transport = TransportIdentity::default();
    serve_halves(service, read_half, write_half, peer, shutdown, transport).await;
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
    // The client certificate, when it sent one: the TLS provider's role.
    let transport = TransportIdentity {
        certificate_cn: stream
            .get_ref()
            .1
            .peer_certificates()
            .and_then(|chain| chain.first())
            .and_then(|leaf| vela_tls::x509::common_name(leaf)),
    };
    let (read_half, write_half) = tokio::io::split(stream);
    serve_halves(service, read_half, write_half, peer, shutdown, transport).await;
}

async fn serve_halves<R, W>(
    service: Arc<Service>,
    read_half: R,
    write_half: W,
    peer: SocketAddr,
    shutdown: watch::Receiver<bool>,
    transport: TransportIdentity,
) where
    R: crate::arrival::ConnectionRead,
    W: AsyncWrite + Unpin + Send + 'static,
{
    let limits = service.config.limits.clone();
    let (out, out_rx) = mpsc::channel(limits.outbound_frames_max);
    let writer = tokio::spawn(writer::write_loop(
        write_half,
        out_rx,
        limits.frames_per_wakeup_max,
        Arc::clone(&service),
    ));
    // Events: at most one per producer and consumer of this connection
    // outstanding in practice; sized to never fill in normal operation.
    let (events_tx, events_rx) = mpsc::channel(2 * (limits.producers_max + limits.consumers_max));
    let id = service.next_conn_id();
    service
        .metrics
        .active_connections
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let mut connection = Connection {
        session: Session::new(service, id, peer, out, events_tx, transport),
        producers: Producers::new(limits.pending_sends_max, limits.pending_send_bytes_max),
        consumers: Consumers::new(),
        watchers: Watchers::new(),
        txn_requests: TxnRequests::new(),
        deferred: DeferredLoads::new(),
        events_rx,
        read_at: Instant::now(),
    };
    let reason = connection.run(read_half, shutdown).await;
    tracing::info!(conn = id, %peer, reason = %reason.0, "connection closed");
    connection.cleanup().await;
    connection
        .session
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

/// The reader's state: the session and the connection's producers and
/// consumers, each owned by the module of its job.
struct Connection {
    session: Session,
    producers: Producers,
    consumers: Consumers,
    watchers: Watchers,
    /// Transaction coordinator requests waiting for their log record.
    txn_requests: TxnRequests,
    /// PRODUCER and SUBSCRIBE commands waiting for their topic to open.
    deferred: DeferredLoads,
    /// Producers and consumers the broker closed (see `ConnEvent`).
    events_rx: mpsc::Receiver<ConnEvent>,
    /// When the bytes being handled reached the broker: the kernel's receive
    /// stamp on plain TCP, else when they were read (the start of a SEND's
    /// broker publish stage).
    read_at: Instant,
}

impl Connection {
    async fn run<R: crate::arrival::ConnectionRead>(
        &mut self,
        mut read_half: R,
        mut shutdown: watch::Receiver<bool>,
    ) -> Close {
        let config = &self.session.service.config;
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
                Some(loaded) = self.deferred.recv() => {
                    if let Err(close) = self.on_loaded(loaded).await {
                        return close;
                    }
                }
                _ = &mut handshake_deadline, if !self.session.connected => {
                    return Close(format!("no CONNECT within {:?}", started.elapsed()));
                }
                _ = auth_ticker.tick(), if auth_enabled && self.session.connected => {
                    if let Err(close) = self.session.check_credentials().await {
                        return close;
                    }
                }
                _ = ticker.tick() => {
                    if ping_outstanding {
                        return Close("keep-alive timeout: no frame since the last PING".into());
                    }
                    if self.session.connected && self.session.protocol_version >= 1 {
                        ping_outstanding = true;
                        if self.session.send(proto::CommandPing {}).await.is_err() {
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
            ConnEvent::ConsumerClosed(consumer_id) => self.consumers.closed(consumer_id),
            ConnEvent::ProducerClosed(producer_id) => self.producers.closed(producer_id),
        }
    }

    /// A PRODUCER or SUBSCRIBE whose topic was opened off the reader (or
    /// failed to open) goes back to its handler.
    async fn on_loaded(&mut self, loaded: Loaded) -> Result<(), Close> {
        let (command, result) = self.deferred.finish(loaded);
        // Its slot is free: the next command waiting starts its load.
        self.deferred.start_waiting();
        let opening = TopicOpening::Opened(result);
        match command {
            Deferred::Producer(body) => {
                self.producers
                    .on_producer(&self.session, body, opening)
                    .await
            }
            Deferred::Subscribe(body) => {
                self.drain_events();
                self.consumers
                    .on_subscribe(&self.session, body, opening)
                    .await
            }
        }
    }

    /// Applies the events queued so far (before a command that must see
    /// the consumers the broker closed).
    fn drain_events(&mut self) {
        while let Ok(event) = self.events_rx.try_recv() {
            self.on_event(event);
        }
    }

    async fn on_checksum_mismatch(&mut self, command: Command) -> Result<(), Close> {
        self.producers
            .on_checksum_mismatch(&self.session, command)
            .await
    }

    /// Dispatches one command to the handler of its family.
    async fn handle(&mut self, frame: Inbound) -> Result<(), Close> {
        let Inbound {
            command,
            entry,
            frame_bytes,
        } = frame;
        let (session, producers, consumers, deferred) = (
            &mut self.session,
            &mut self.producers,
            &mut self.consumers,
            &mut self.deferred,
        );
        let command = match command {
            // The hot command, compact: no BaseCommand is built for it.
            Command::Send(send) => {
                if !session.connected {
                    return Err(Close(format!("{:?} before CONNECT", Type::Send)));
                }
                return match entry {
                    Some(entry) => {
                        producers
                            .on_send(session, self.read_at, send, entry, frame_bytes)
                            .await
                    }
                    None => Err(Close("SEND without body or payload".into())),
                };
            }
            Command::Other(command) => *command,
        };
        let Ok(kind) = Type::try_from(command.r#type) else {
            return Err(Close(format!("unknown command type {}", command.r#type)));
        };
        if !session.connected && kind != Type::Connect {
            return Err(Close(format!("{kind:?} before CONNECT")));
        }
        match kind {
            Type::Connect => session.on_connect(command.connect.map(|b| *b)).await,
            Type::Ping => session.send(proto::CommandPong {}).await,
            Type::Pong => Ok(()),
            Type::AuthResponse => {
                session
                    .on_auth_response(command.auth_response.map(|b| *b))
                    .await
            }
            Type::PartitionedMetadata => {
                let body = required(command.partition_metadata, kind)?;
                lookup::on_partitioned_metadata(session, body).await
            }
            Type::Lookup => lookup::on_lookup(session, required(command.lookup_topic, kind)?).await,
            Type::GetTopicsOfNamespace => {
                let body = required(command.get_topics_of_namespace, kind)?;
                topic_list::on_topics_of_namespace(session, body).await
            }
            Type::WatchTopicList => {
                let body = required(command.watch_topic_list, kind)?;
                self.watchers.on_watch(&self.session, body).await
            }
            Type::WatchTopicListClose => {
                let body = required(command.watch_topic_list_close, kind)?;
                self.watchers.on_close(&self.session, body).await
            }
            Type::Producer => {
                let body = required(command.producer, kind)?;
                let opening = TopicOpening::Arrived(deferred);
                producers.on_producer(session, body, opening).await
            }
            // The decoder hands out every SEND as `Command::Send`; a SEND
            // built some other way is still served.
            Type::Send => match (command.send.as_deref(), entry) {
                (Some(body), Some(entry)) => {
                    let send = SendCommand::from(body);
                    producers
                        .on_send(session, self.read_at, send, entry, frame_bytes)
                        .await
                }
                _ => Err(Close("SEND without body or payload".into())),
            },
            Type::CloseProducer => {
                let body = required(command.close_producer, kind)?;
                deferred.close_producer(body.producer_id);
                producers.on_close_producer(session, body).await
            }
            Type::Subscribe => {
                let body = required(command.subscribe, kind)?;
                self.drain_events();
                let opening = TopicOpening::Arrived(&mut self.deferred);
                self.consumers
                    .on_subscribe(&self.session, body, opening)
                    .await
            }
            Type::Flow => {
                let body = required(command.flow, kind)?;
                consumers.on_flow(session, body).await
            }
            Type::Ack => {
                consumers
                    .on_ack(session, required(command.ack, kind)?)
                    .await
            }
            Type::RedeliverUnacknowledgedMessages => {
                let body = required(command.redeliver_unacknowledged_messages, kind)?;
                consumers.on_redeliver(session, body).await
            }
            Type::CloseConsumer => {
                let body = required(command.close_consumer, kind)?;
                deferred.close_consumer(body.consumer_id);
                consumers.on_close_consumer(session, body).await
            }
            Type::Unsubscribe => {
                let body = required(command.unsubscribe, kind)?;
                consumers.on_unsubscribe(session, body).await
            }
            Type::Seek => {
                let body = required(command.seek, kind)?;
                let result = consumers.on_seek(session, body).await;
                // The seek closed this connection's consumers of the
                // subscription: forget them before the next frame.
                self.drain_events();
                result
            }
            Type::GetLastMessageId => {
                let body = required(command.get_last_message_id, kind)?;
                consumers.on_get_last_message_id(session, body).await
            }
            Type::ConsumerStats => {
                let body = required(command.consumer_stats, kind)?;
                consumers.on_consumer_stats(session, body).await
            }
            Type::GetSchema => {
                schema::on_get_schema(session, required(command.get_schema, kind)?).await
            }
            Type::GetOrCreateSchema => {
                let body = required(command.get_or_create_schema, kind)?;
                schema::on_get_or_create_schema(session, body).await
            }
            Type::TcClientConnectRequest => {
                let body = required(command.tc_client_connect_request, kind)?;
                self.txn_requests.on_tc_connect(&self.session, body).await
            }
            Type::NewTxn => {
                let body = required(command.new_txn, kind)?;
                self.txn_requests.on_new_txn(&self.session, body).await
            }
            Type::AddPartitionToTxn => {
                let body = required(command.add_partition_to_txn, kind)?;
                self.txn_requests
                    .on_add_partitions(&self.session, body)
                    .await
            }
            Type::AddSubscriptionToTxn => {
                let body = required(command.add_subscription_to_txn, kind)?;
                self.txn_requests
                    .on_add_subscriptions(&self.session, body)
                    .await
            }
            Type::EndTxn => {
                let body = required(command.end_txn, kind)?;
                self.txn_requests.on_end_txn(&self.session, body).await
            }
            Type::EndTxnOnPartition => {
                let body = required(command.end_txn_on_partition, kind)?;
                self.txn_requests
                    .on_end_txn_on_partition(&self.session, body)
                    .await
            }
            Type::EndTxnOnSubscription => {
                let body = required(command.end_txn_on_subscription, kind)?;
                self.txn_requests
                    .on_end_txn_on_subscription(&self.session, body)
                    .await
            }
            other => Err(Close(format!("unsupported command {other:?}"))),
        }
    }

    /// Detaches every producer and consumer of this connection.
    async fn cleanup(&mut self) {
        self.watchers.cleanup();
        self.producers.cleanup(self.session.id);
        self.consumers.cleanup(self.session.id).await;
    }
}
