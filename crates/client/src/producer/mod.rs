//! Producers: batching, compression, pending bounds, receipts in send order,
//! reconnect with resend, key-based partition routing.
//!
//! Owns, per topic (or partition) producer: sequence ids, the open batch, the
//! queue of sent-but-unacknowledged frames (`pending`, in sequence order),
//! and its connection. A background task flushes batches when their delay is
//! up and fails sends older than the send timeout; it sleeps until the next
//! of those deadlines, and with neither (nothing pending, no open batch)
//! until a send wakes it: an idle producer costs no wake-ups (10,000 idle
//! producers ticking every 100 ms were 100,000 wake-ups a second).
//! Guarantees: receipts complete in send order; after a reconnect every
//! pending frame is sent again, in order, with its original sequence id (the
//! broker's dedup keeps one copy when enabled); a send fails only with a
//! typed error (queue full, too large, timeout, closed, a broker refusal).
//! Never: holds more than `max_pending_messages` messages (nor more bytes
//! than the client's memory limit), waits while holding its state lock, or
//! reorders frames.

mod entry;
mod flush;

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Bytes, BytesMut};
use parking_lot::Mutex;
use tokio::sync::{Notify, OwnedSemaphorePermit, Semaphore, oneshot};
use tokio::time::Instant;
use vela_wire::batch::{BatchMessage, build_batch};
use vela_wire::compression::compress;
use vela_wire::proto::{
    BaseCommand, CommandCloseProducer, CommandProducer, CommandSend, CommandSendError,
    CommandSendReceipt, CompressionType, KeyValue, MessageMetadata, ServerError,
    SingleMessageMetadata,
};
use vela_wire::{encode_payload_frame, encode_payload_frame_with};

use crate::client::{Client, partition_name};
use crate::connection::{Connection, ProducerEvents};
use crate::error::ClientError;
use crate::message::{MessageId, OutgoingMessage};

/// First pause before reconnecting; doubles up to `RECONNECT_BACKOFF_MAX`.
const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
/// Longest pause between reconnect attempts.
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Batching of a producer: a batch is sent when it holds `max_messages`
/// messages or `max_bytes` payload bytes, or `max_delay` after its first
/// message, whichever comes first.
#[derive(Debug, Clone)]
pub struct BatchingOptions {
    /// Messages per batch at most.
    pub max_messages: usize,
    /// Payload bytes per batch at most (a single larger message is sent alone).
    pub max_bytes: usize,
    /// Longest a message waits for its batch to fill.
    pub max_delay: Duration,
}

impl Default for BatchingOptions {
    /// The Java client's defaults: 1000 messages, 128 KiB, 1 ms.
    fn default() -> BatchingOptions {
        BatchingOptions {
            max_messages: 1000,
            max_bytes: 128 * 1024,
            max_delay: Duration::from_millis(1),
        }
    }
}

/// Tunables of a producer.
#[derive(Debug, Clone)]
pub struct ProducerOptions {
    /// Producer name (`None`: the broker assigns one).
    pub name: Option<String>,
    /// Batching (`None`: every message is its own entry).
    pub batching: Option<BatchingOptions>,
    /// Compression of each entry's payload.
    pub compression: CompressionType,
    /// Messages sent but not yet acknowledged, at most (per partition).
    pub max_pending_messages: usize,
    /// When the pending queue (or the client's memory limit) is full: wait
    /// (`true`) or fail the send with `QueueFull` (`false`).
    pub block_if_queue_full: bool,
    /// A send not acknowledged within this fails with `Timeout` (`None`: never).
    pub send_timeout: Option<Duration>,
}

impl Default for ProducerOptions {
    fn default() -> ProducerOptions {
        ProducerOptions {
            name: None,
            batching: Some(BatchingOptions::default()),
            compression: CompressionType::None,
            max_pending_messages: 1000,
            block_if_queue_full: true,
            send_timeout: Some(Duration::from_secs(30)),
        }
    }
}

/// Resolves to a sent message's id once the broker acknowledged it (it is
/// durable), or to why not.
#[derive(Debug)]
pub struct SendFuture(oneshot::Receiver<Result<MessageId, ClientError>>);

impl Future for SendFuture {
    type Output = Result<MessageId, ClientError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0)
            .poll(cx)
            .map(|result| result.unwrap_or(Err(ClientError::Closed)))
    }
}

/// A producer of a topic; of every partition of a partitioned topic, routing
/// keyed messages by key hash and others round-robin.
#[derive(Debug)]
pub struct Producer {
    topic: String,
    partitions: Vec<TopicProducer>,
    round_robin: AtomicUsize,
}

impl Producer {
    pub(crate) async fn create(
        client: Client,
        topic: &str,
        options: ProducerOptions,
    ) -> Result<Producer, ClientError> {
        let partition_count = client.partitions(topic).await?;
        let mut partitions = Vec::new();
        if partition_count == 0 {
            partitions.push(TopicProducer::create(client, topic.to_string(), -1, options).await?);
        } else {
            let mut creating = tokio::task::JoinSet::new();
            for index in 0..partition_count {
                let (client, options) = (client.clone(), options.clone());
                let name = partition_name(topic, index);
                creating.spawn(async move {
                    let partition = i32::try_from(index).unwrap_or(i32::MAX);
                    (
                        index,
                        TopicProducer::create(client, name, partition, options).await,
                    )
                });
            }
            let mut created = Vec::new();
            while let Some(joined) = creating.join_next().await {
                let (index, producer) =
                    joined.map_err(|e| ClientError::Protocol(format!("create task: {e}")))?;
                created.push((index, producer?));
            }
            created.sort_by_key(|(index, _)| *index);
            partitions = created.into_iter().map(|(_, p)| p).collect();
        }
        Ok(Producer {
            topic: topic.to_string(),
            partitions,
            round_robin: AtomicUsize::new(0),
        })
    }

    /// The topic.
    pub fn topic(&self) -> &str {
        &self.topic
    }

    /// Partitions produced to (1 for a non-partitioned topic).
    pub fn partition_count(&self) -> usize {
        self.partitions.len()
    }

    fn route(&self, message: &OutgoingMessage) -> &TopicProducer {
        let count = self.partitions.len();
        let index = match &message.key {
            Some(key) if count > 1 => {
                vela_wire::hash::murmur3_32_masked(key.as_bytes()) as usize % count
            }
            _ if count > 1 => self.round_robin.fetch_add(1, Ordering::Relaxed) % count,
            _ => 0,
        };
        &self.partitions[index]
    }

    /// Queues a message (waiting for room when the pending queue is full and
    /// the producer blocks) and returns the future of its receipt.
    pub async fn send(&self, message: OutgoingMessage) -> Result<SendFuture, ClientError> {
        self.route(&message).send(message).await
    }

    /// Sends a message and waits for its receipt.
    pub async fn send_and_wait(&self, message: OutgoingMessage) -> Result<MessageId, ClientError> {
        self.send(message).await?.await
    }

    /// Sends open batches now and waits until every pending message is
    /// acknowledged (or failed).
    pub async fn flush(&self) {
        for partition in &self.partitions {
            partition.flush().await;
        }
    }

    /// Flushes, then closes the producer on the broker.
    pub async fn close(&self) -> Result<(), ClientError> {
        let mut first_error = None;
        for partition in &self.partitions {
            if let Err(error) = partition.close().await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Names the broker gave (one per partition).
    pub fn names(&self) -> Vec<String> {
        self.partitions
            .iter()
            .map(|p| p.core.state.lock().producer_name.clone())
            .collect()
    }
}

/// A producer of one topic or partition.
#[derive(Debug)]
struct TopicProducer {
    core: Arc<ProducerCore>,
}

impl Drop for TopicProducer {
    fn drop(&mut self) {
        // Wake the background task: it sees the core gone and ends.
        self.core.wake.notify_one();
    }
}

struct ProducerCore {
    client: Client,
    topic: String,
    partition: i32,
    producer_id: u64,
    options: ProducerOptions,
    state: Mutex<State>,
    pending_messages: Arc<Semaphore>,
    /// Wakes the background task (a batch started, or the producer went away).
    wake: Arc<Notify>,
    /// Told whenever `pending` and the batch become empty.
    drained: Notify,
    weak_self: Weak<ProducerCore>,
}

impl std::fmt::Debug for ProducerCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProducerCore")
            .field("topic", &self.topic)
            .field("producer_id", &self.producer_id)
            .finish_non_exhaustive()
    }
}

/// Budget a message holds until it completes.
struct Permits {
    _message: OwnedSemaphorePermit,
    _memory: Option<OwnedSemaphorePermit>,
}

struct Completion {
    reply: oneshot::Sender<Result<MessageId, ClientError>>,
    _permits: Permits,
}

struct BatchEntry {
    message: OutgoingMessage,
    sequence_id: u64,
    completion: Completion,
}

/// A frame sent (or to be sent) and not yet acknowledged.
struct InFlight {
    sequence_id: u64,
    frame: Bytes,
    completions: Vec<Completion>,
    batched: bool,
    created_at: Instant,
}

struct State {
    connection: Option<Connection>,
    producer_name: String,
    next_sequence_id: u64,
    max_message_size_bytes: usize,
    batch: Vec<BatchEntry>,
    batch_bytes: usize,
    batch_started: Option<Instant>,
    /// In sequence order; `pending[..unsent_from]` are queued on `connection`.
    pending: VecDeque<InFlight>,
    unsent_from: usize,
    /// A task waits for room on the connection to send the rest.
    pumping: bool,
    /// The background task will tick again by the send timeout of the
    /// oldest pending frame (or earlier): a frame queued behind it needs no
    /// wake-up. Cleared by a tick that found nothing to wait for.
    timer_armed: bool,
    reconnecting: bool,
    /// Set when the producer is closed for good.
    closed: Option<ClientError>,
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

fn key_values(message: &OutgoingMessage) -> Vec<KeyValue> {
    message
        .properties
        .iter()
        .map(|(key, value)| KeyValue {
            key: key.clone(),
            value: value.clone(),
        })
        .collect()
}

impl TopicProducer {
    async fn create(
        client: Client,
        topic: String,
        partition: i32,
        options: ProducerOptions,
    ) -> Result<TopicProducer, ClientError> {
        let producer_id = client.next_id();
        let pending_messages = Arc::new(Semaphore::new(
            options
                .max_pending_messages
                .clamp(1, Semaphore::MAX_PERMITS),
        ));
        let core = Arc::new_cyclic(|weak_self| ProducerCore {
            client: client.clone(),
            topic,
            partition,
            producer_id,
            state: Mutex::new(State {
                connection: None,
                producer_name: options.name.clone().unwrap_or_default(),
                next_sequence_id: 0,
                max_message_size_bytes: vela_wire::MESSAGE_SIZE_MAX_DEFAULT_BYTES,
                batch: Vec::new(),
                batch_bytes: 0,
                batch_started: None,
                pending: VecDeque::new(),
                unsent_from: 0,
                pumping: false,
                timer_armed: false,
                reconnecting: true,
                closed: None,
            }),
            options,
            pending_messages,
            wake: Arc::new(Notify::new()),
            drained: Notify::new(),
            weak_self: weak_self.clone(),
        });
        // The first attempt's error goes to the caller unless it is one a
        // retry may fix; those are retried until the operation timeout.
        let deadline = Instant::now() + client.inner.config.operation_timeout;
        let mut backoff = RECONNECT_BACKOFF_MIN;
        loop {
            match core.connect_once(true).await {
                Ok(()) => break,
                Err(error) if error.is_retriable() && Instant::now() + backoff < deadline => {
                    tracing::debug!(topic = %core.topic, %error, "producer create failed; retrying");
                    tokio::time::sleep(backoff).await;
                    backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
                }
                Err(error) => return Err(error),
            }
        }
        tokio::spawn(background(Arc::downgrade(&core), Arc::clone(&core.wake)));
        Ok(TopicProducer { core })
    }

    async fn send(&self, message: OutgoingMessage) -> Result<SendFuture, ClientError> {
        let core = &self.core;
        let permits = core.acquire(message.payload.len()).await?;
        let (reply, receipt) = oneshot::channel();
        let completion = Completion {
            reply,
            _permits: permits,
        };
        let mut state = core.state.lock();
        if let Some(error) = &state.closed {
            return Err(error.clone());
        }
        if message.payload.len() > state.max_message_size_bytes {
            return Err(ClientError::MessageTooLarge {
                len_bytes: message.payload.len(),
                max_bytes: state.max_message_size_bytes,
            });
        }
        let sequence_id = state.next_sequence_id;
        state.next_sequence_id += 1;
        match &core.options.batching {
            Some(batching) => {
                let len = message.payload.len();
                if !state.batch.is_empty() && state.batch_bytes + len > batching.max_bytes {
                    core.flush_batch(&mut state);
                }
                let first = state.batch.is_empty();
                state.batch_bytes += len;
                state.batch.push(BatchEntry {
                    message,
                    sequence_id,
                    completion,
                });
                if state.batch.len() >= batching.max_messages
                    || state.batch_bytes >= batching.max_bytes
                {
                    core.flush_batch(&mut state);
                    core.pump(&mut state);
                } else if first {
                    // Its delay is due before any deadline the task waits
                    // for: always a wake-up.
                    state.batch_started = Some(Instant::now());
                    state.timer_armed = true;
                    core.wake.notify_one();
                }
            }
            None => {
                let frame = core.single_frame(&state, sequence_id, &message);
                state.pending.push_back(InFlight {
                    sequence_id,
                    frame,
                    completions: vec![completion],
                    batched: false,
                    created_at: Instant::now(),
                });
                core.pump(&mut state);
            }
        }
        core.arm_timer(&mut state);
        Ok(SendFuture(receipt))
    }

    async fn flush(&self) {
        loop {
            let drained = self.core.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            {
                let mut state = self.core.state.lock();
                self.core.flush_batch(&mut state);
                self.core.pump(&mut state);
                self.core.arm_timer(&mut state);
                if state.pending.is_empty() || state.closed.is_some() {
                    return;
                }
            }
            drained.await;
        }
    }

    async fn close(&self) -> Result<(), ClientError> {
        self.flush().await;
        let connection = {
            let mut state = self.core.state.lock();
            if state.closed.is_some() {
                return Ok(());
            }
            state.closed = Some(ClientError::Closed);
            state.connection.take()
        };
        self.core.fail_all(ClientError::Closed);
        let Some(connection) = connection else {
            return Ok(());
        };
        connection.unregister_producer(self.core.producer_id);
        let producer_id = self.core.producer_id;
        connection
            .request(
                "close producer",
                self.core.client.inner.config.operation_timeout,
                |request_id| {
                    BaseCommand::from(CommandCloseProducer {
                        producer_id,
                        request_id,
                        ..Default::default()
                    })
                },
            )
            .await
            .map(|_| ())
    }
}

impl ProducerCore {
    /// Takes the budget of a message of `payload_bytes`.
    async fn acquire(&self, payload_bytes: usize) -> Result<Permits, ClientError> {
        let block = self.options.block_if_queue_full;
        let message = if block {
            self.pending_messages
                .clone()
                .acquire_owned()
                .await
                .map_err(|_| ClientError::Closed)?
        } else {
            self.pending_messages
                .clone()
                .try_acquire_owned()
                .map_err(|_| ClientError::QueueFull("max pending messages"))?
        };
        let memory = match &self.client.inner.memory {
            None => None,
            Some(memory) => {
                // At least one permit per message; u32 holds any message size
                // (the broker's limit is far below 4 GiB).
                let bytes = u32::try_from(payload_bytes.max(1)).unwrap_or(u32::MAX);
                Some(if block {
                    memory
                        .clone()
                        .acquire_many_owned(bytes)
                        .await
                        .map_err(|_| ClientError::Closed)?
                } else {
                    memory
                        .clone()
                        .try_acquire_many_owned(bytes)
                        .map_err(|_| ClientError::QueueFull("client memory limit"))?
                })
            }
        };
        Ok(Permits {
            _message: message,
            _memory: memory,
        })
    }

    fn metadata(&self, state: &State, sequence_id: u64) -> MessageMetadata {
        let mut metadata = MessageMetadata {
            producer_name: state.producer_name.clone(),
            sequence_id,
            publish_time: now_ms(),
            ..Default::default()
        };
        if self.options.compression != CompressionType::None {
            metadata.set_compression(self.options.compression);
        }
        metadata
    }

    /// Compresses `payload` if the producer compresses. Returns the bytes to
    /// send and the uncompressed size to record.
    fn compressed(&self, payload: &[u8]) -> (Bytes, Option<u32>) {
        if self.options.compression == CompressionType::None {
            return (Bytes::copy_from_slice(payload), None);
        }
        match compress(self.options.compression, payload) {
            Ok(compressed) => (compressed, u32::try_from(payload.len()).ok()),
            Err(error) => {
                // The codecs do not fail on valid input; send uncompressed.
                tracing::warn!(%error, "compression failed; sending uncompressed");
                (Bytes::copy_from_slice(payload), None)
            }
        }
    }

    fn single_frame(&self, state: &State, sequence_id: u64, message: &OutgoingMessage) -> Bytes {
        let mut metadata = self.metadata(state, sequence_id);
        metadata.partition_key = message.key.clone();
        metadata.properties = key_values(message);
        if message.event_time_ms > 0 {
            metadata.event_time = Some(message.event_time_ms);
        }
        let (payload, uncompressed) = self.compressed(&message.payload);
        if uncompressed.is_none() {
            metadata.compression = None;
        }
        metadata.uncompressed_size = uncompressed;
        let command = BaseCommand::from(CommandSend {
            producer_id: self.producer_id,
            sequence_id,
            ..Default::default()
        });
        let mut frame = BytesMut::new();
        encode_payload_frame(&command, &metadata, &payload, &mut frame);
        frame.freeze()
    }

    /// Turns the open batch into one pending frame.
    fn flush_batch(&self, state: &mut State) {
        if state.batch.is_empty() {
            return;
        }
        let entries = std::mem::take(&mut state.batch);
        let payload_bytes = state.batch_bytes;
        state.batch_bytes = 0;
        state.batch_started = None;
        let first = entries[0].sequence_id;
        let last = entries[entries.len() - 1].sequence_id;
        let count = i32::try_from(entries.len()).unwrap_or(i32::MAX);
        let messages: Vec<BatchMessage> = entries
            .iter()
            .map(|entry| {
                let message = &entry.message;
                let single = SingleMessageMetadata {
                    properties: key_values(message),
                    partition_key: message.key.clone(),
                    event_time: (message.event_time_ms > 0).then_some(message.event_time_ms),
                    sequence_id: Some(entry.sequence_id),
                    ..Default::default()
                };
                BatchMessage::new(single, message.payload.clone())
            })
            .collect();
        let mut metadata = self.metadata(state, first);
        metadata.num_messages_in_batch = Some(count);
        metadata.highest_sequence_id = Some(last);
        let command = BaseCommand::from(CommandSend {
            producer_id: self.producer_id,
            sequence_id: first,
            num_messages: Some(count),
            highest_sequence_id: Some(last),
            ..Default::default()
        });
        let records_bytes_hint =
            payload_bytes + messages.len() * vela_wire::batch::RECORD_OVERHEAD_BYTES_HINT;
        let mut frame = BytesMut::new();
        if self.options.compression == CompressionType::None {
            // Built straight into the frame: the payloads are copied once.
            metadata.compression = None;
            encode_payload_frame_with(&command, &metadata, records_bytes_hint, &mut frame, |buf| {
                build_batch(&messages, buf)
            });
        } else {
            let mut raw = BytesMut::with_capacity(records_bytes_hint);
            build_batch(&messages, &mut raw);
            let (payload, uncompressed) = self.compressed(&raw);
            if uncompressed.is_none() {
                metadata.compression = None;
            }
            metadata.uncompressed_size = uncompressed;
            encode_payload_frame(&command, &metadata, &payload, &mut frame);
        }
        state.pending.push_back(InFlight {
            sequence_id: first,
            frame: frame.freeze(),
            completions: entries.into_iter().map(|entry| entry.completion).collect(),
            batched: true,
            created_at: Instant::now(),
        });
    }

    /// Queues unsent frames on the connection, in order, while it has room.
    /// Returns `true` when it stopped for lack of room.
    fn pump(&self, state: &mut State) -> bool {
        let Some(connection) = state.connection.clone() else {
            return false;
        };
        while state.unsent_from < state.pending.len() {
            let frame = state.pending[state.unsent_from].frame.clone();
            match connection.try_send(frame) {
                Ok(true) => state.unsent_from += 1,
                Ok(false) => {
                    if !state.pumping {
                        state.pumping = true;
                        if let Some(core) = self.weak_self.upgrade() {
                            tokio::spawn(pump_when_room(core, connection));
                        }
                    }
                    return true;
                }
                // Closed: the reconnect resends everything.
                Err(_) => return false,
            }
        }
        false
    }

    /// Fails the batch and every pending message.
    fn fail_all(&self, error: ClientError) {
        let (batch, pending) = {
            let mut state = self.state.lock();
            state.batch_bytes = 0;
            state.batch_started = None;
            state.unsent_from = 0;
            (
                std::mem::take(&mut state.batch),
                std::mem::take(&mut state.pending),
            )
        };
        for entry in batch {
            let _ = entry.completion.reply.send(Err(error.clone()));
        }
        for in_flight in pending {
            for completion in in_flight.completions {
                let _ = completion.reply.send(Err(error.clone()));
            }
        }
        self.drained.notify_waiters();
    }

    /// Looks the topic up and (re)creates the producer on its broker; on
    /// success resends every pending frame.
    async fn connect_once(&self, first: bool) -> Result<(), ClientError> {
        let connection = self.client.lookup(&self.topic).await?;
        let handler: Arc<dyn ProducerEvents> = match self.weak_self.upgrade() {
            Some(core) => Arc::new(Handler(Arc::downgrade(&core))),
            None => return Err(ClientError::Closed),
        };
        let (name, user_named) = {
            let state = self.state.lock();
            let user_named = self.options.name.is_some();
            let name = (!state.producer_name.is_empty()).then(|| state.producer_name.clone());
            (name, user_named)
        };
        connection.register_producer(self.producer_id, handler);
        let topic = self.topic.clone();
        let producer_id = self.producer_id;
        let answer = connection
            .request(
                "create producer",
                self.client.inner.config.operation_timeout,
                |request_id| {
                    BaseCommand::from(CommandProducer {
                        topic,
                        producer_id,
                        request_id,
                        producer_name: name,
                        user_provided_producer_name: Some(user_named),
                        ..Default::default()
                    })
                },
            )
            .await;
        let success = match answer {
            Ok(answer) => answer
                .producer_success
                .ok_or_else(|| ClientError::Protocol("expected PRODUCER_SUCCESS".to_string()))?,
            Err(error) => {
                connection.unregister_producer(self.producer_id);
                return Err(error);
            }
        };
        let mut state = self.state.lock();
        if let Some(error) = &state.closed {
            connection.unregister_producer(self.producer_id);
            return Err(error.clone());
        }
        state.producer_name = success.producer_name;
        if first && let Ok(last) = u64::try_from(success.last_sequence_id.unwrap_or(-1)) {
            state.next_sequence_id = last + 1;
        }
        state.max_message_size_bytes = connection.max_message_size_bytes();
        state.connection = Some(connection);
        state.reconnecting = false;
        state.unsent_from = 0;
        self.pump(&mut state);
        Ok(())
    }

    /// Wakes the background task for the send timeout of pending frames
    /// unless it already waits for a deadline at or before theirs.
    fn arm_timer(&self, state: &mut State) {
        if state.timer_armed
            || state.pending.is_empty()
            || self.options.send_timeout.is_none()
            || state.closed.is_some()
        {
            return;
        }
        state.timer_armed = true;
        self.wake.notify_one();
    }

    /// Runs the batch timer and the send timeout; returns when to run again
    /// (`None`: nothing to wait for until a send wakes the task).
    /// `timer_fired`: the task's timer woke it (a tick of tokio's timer
    /// passed), not a send.
    fn tick(&self, timer_fired: bool) -> Option<Instant> {
        let now = Instant::now();
        let mut next: Option<Instant> = None;
        let mut timed_out = None;
        {
            let mut state = self.state.lock();
            if let (Some(started), Some(batching)) = (state.batch_started, &self.options.batching) {
                // The batch goes on the timer's tick (`flush::batch_flush_at`),
                // or when a send finds it past its whole delay.
                let flush_at = flush::batch_flush_at(started, batching.max_delay);
                let due = if timer_fired {
                    flush_at
                } else {
                    started + batching.max_delay
                };
                if due <= now {
                    self.flush_batch(&mut state);
                    self.pump(&mut state);
                } else {
                    next = Some(flush_at);
                }
            }
            if let (Some(front), Some(timeout)) = (state.pending.front(), self.options.send_timeout)
            {
                let expires = front.created_at + timeout;
                if expires <= now {
                    timed_out = Some(timeout);
                } else {
                    next = Some(next.map_or(expires, |due| due.min(expires)));
                }
            }
            state.timer_armed = next.is_some();
        }
        if let Some(timeout) = timed_out {
            tracing::warn!(topic = %self.topic, ?timeout, "sends timed out; failing every pending message");
            self.fail_all(ClientError::Timeout {
                operation: "send",
                timeout,
            });
            // Sends may have come meanwhile: look again at once.
            return Some(Instant::now());
        }
        next
    }

    fn on_receipt(&self, receipt: CommandSendReceipt) {
        let mut state = self.state.lock();
        let Some(front) = state.pending.front() else {
            return;
        };
        if receipt.sequence_id < front.sequence_id {
            // A receipt for a resent or timed-out message: already settled.
            return;
        }
        if receipt.sequence_id > front.sequence_id {
            tracing::warn!(
                topic = %self.topic, got = receipt.sequence_id, expected = front.sequence_id,
                "receipt out of order; reconnecting"
            );
            if let Some(connection) = &state.connection {
                connection.close("receipt out of order");
            }
            return;
        }
        let Some(done) = state.pending.pop_front() else {
            return;
        };
        // A receipt racing a disconnect may come for a frame marked unsent.
        state.unsent_from = state.unsent_from.saturating_sub(1);
        let drained = state.pending.is_empty() && state.batch.is_empty();
        drop(state);
        let (ledger_id, entry_id) = receipt
            .message_id
            .as_ref()
            .map_or((u64::MAX, u64::MAX), |id| (id.ledger_id, id.entry_id));
        for (index, completion) in done.completions.into_iter().enumerate() {
            let id = MessageId {
                ledger_id,
                entry_id,
                batch_index: if done.batched {
                    i32::try_from(index).unwrap_or(i32::MAX)
                } else {
                    -1
                },
                partition: self.partition,
            };
            let _ = completion.reply.send(Ok(id));
        }
        if drained {
            self.drained.notify_waiters();
        }
    }

    fn on_send_error(&self, error: CommandSendError) {
        let code = error.error();
        tracing::warn!(topic = %self.topic, ?code, message = %error.message, "send error");
        let connection = self.state.lock().connection.clone();
        match code {
            // The broker will never take these: fail everything pending.
            ServerError::TopicTerminatedError
            | ServerError::ProducerBlockedQuotaExceededException
            | ServerError::NotAllowedError => {
                self.fail_all(ClientError::Server {
                    code,
                    message: error.message,
                });
            }
            // As the Java client: a fresh connection, and the pending
            // messages are sent again.
            _ => {
                if let Some(connection) = connection {
                    connection.close("send error");
                }
            }
        }
    }

    fn on_closed(&self, reason: &str) {
        let mut state = self.state.lock();
        if state.closed.is_some() {
            return;
        }
        state.connection = None;
        state.unsent_from = 0;
        if state.reconnecting {
            return;
        }
        state.reconnecting = true;
        tracing::info!(topic = %self.topic, reason, "producer disconnected; reconnecting");
        if let Some(core) = self.weak_self.upgrade() {
            tokio::spawn(reconnect(core));
        }
    }
}

/// Routes connection events to a producer that may have gone away.
struct Handler(Weak<ProducerCore>);

impl ProducerEvents for Handler {
    fn receipt(&self, receipt: CommandSendReceipt) {
        if let Some(core) = self.0.upgrade() {
            core.on_receipt(receipt);
        }
    }

    fn send_error(&self, error: CommandSendError) {
        if let Some(core) = self.0.upgrade() {
            core.on_send_error(error);
        }
    }

    fn closed(&self, reason: &str) {
        if let Some(core) = self.0.upgrade() {
            core.on_closed(reason);
        }
    }
}

async fn reconnect(core: Arc<ProducerCore>) {
    let mut backoff = RECONNECT_BACKOFF_MIN;
    loop {
        tokio::time::sleep(backoff).await;
        if core.state.lock().closed.is_some() || Arc::strong_count(&core) == 1 {
            return;
        }
        match core.connect_once(false).await {
            Ok(()) => {
                tracing::info!(topic = %core.topic, "producer reconnected");
                return;
            }
            Err(error) if error.is_retriable() => {
                tracing::debug!(topic = %core.topic, %error, "reconnect failed");
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
            }
            Err(error) => {
                tracing::warn!(topic = %core.topic, %error, "producer cannot reconnect; closing it");
                core.state.lock().closed = Some(error.clone());
                core.fail_all(error);
                return;
            }
        }
    }
}

async fn pump_when_room(core: Arc<ProducerCore>, connection: Connection) {
    let mut connection = connection;
    loop {
        connection.wait_for_room().await;
        let mut state = core.state.lock();
        // `pumping` stays set while this task runs, so `pump` spawns no other.
        if !core.pump(&mut state) {
            state.pumping = false;
            return;
        }
        match state.connection.clone() {
            Some(current) => connection = current,
            None => {
                state.pumping = false;
                return;
            }
        }
    }
}

/// Flushes due batches and fails timed-out sends until the producer is gone.
async fn background(core: Weak<ProducerCore>, wake: Arc<Notify>) {
    // One timer, moved to each next deadline (a deadline moved later is one
    // atomic store in tokio's timer), not one registered per wake-up.
    let timer = tokio::time::sleep_until(tokio::time::Instant::now());
    tokio::pin!(timer);
    let mut timer_fired = false;
    loop {
        let next = match core.upgrade() {
            Some(core) => core.tick(timer_fired),
            None => return,
        };
        timer_fired = match next {
            Some(next) => {
                timer.as_mut().reset(next);
                tokio::select! {
                    _ = &mut timer => true,
                    _ = wake.notified() => false,
                }
            }
            None => {
                wake.notified().await;
                false
            }
        };
    }
}
