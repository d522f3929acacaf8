//! Consumers: subscribe (every partition of a partitioned topic), flow-control
//! permits, batch unpacking and decompression, acks, reconnect.
//!
//! Owns: one receive queue per consumer (all partitions feed it), the permits
//! given back to each partition's broker as the application takes messages,
//! and the per-entry ack state of batches.
//! Guarantees: messages of one partition come out in the order the broker
//! sent them; an entry of a batch is acknowledged to the broker once every
//! message of it was acknowledged; after a reconnect the broker redelivers
//! what was not acknowledged (at-least-once).
//! Never: holds more than `receiver_queue_size` messages per partition plus
//! one broker read beyond them (`READ_OVERSHOOT_BYTES_MAX` per partition: a
//! broker that sends more than that past the permits loses the connection),
//! or decompresses past `DECOMPRESSED_BYTES_MAX`.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::Notify;
use vela_wire::PayloadSection;
use vela_wire::batch::BatchIter;
use vela_wire::compression::decompress;
use vela_wire::proto::command_ack::AckType;
use vela_wire::proto::command_subscribe::{InitialPosition, SubType};
use vela_wire::proto::{
    BaseCommand, CommandAck, CommandCloseConsumer, CommandFlow, CommandMessage,
    CommandRedeliverUnacknowledgedMessages, CommandSubscribe, CommandUnsubscribe, KeyValue,
    MessageIdData,
};

use crate::client::{Client, partition_name};
use crate::connection::{Connection, ConsumerEvents};
use crate::error::ClientError;
use crate::message::{Message, MessageId};
use crate::receive_queue::ReceiveQueue;

/// Largest payload a message (or a whole batch) may decompress to: the
/// broker's default max message size times the best compression ratio worth
/// allowing. A message claiming more is refused as corrupt.
pub const DECOMPRESSED_BYTES_MAX: usize = 64 * 1024 * 1024;

/// Messages one batch may add beyond the permits (a batch counts as its
/// messages, but the broker sends it whole).
const BATCH_OVERSHOOT_MAX: usize = 10_000;

/// Bytes (payloads plus per-message overhead) one partition may queue beyond
/// its permits. Pulsar's dispatcher sizes a read by the permits over its
/// average messages per entry, which starts at 1: with 1,000 permits it reads
/// up to `dispatcherMaxReadBatchSize` (100) entries, and each may be a batch of
/// 1,000 messages, so 100,000 messages arrive for 1,000 permits. One read is
/// bounded by `dispatcherMaxReadSizeBytes` (5 MB) or one entry of at most the
/// max message size (5 MiB); this allows that, with room for the overhead
/// of many small messages, and no more.
const READ_OVERSHOOT_BYTES_MAX: usize = 64 * 1024 * 1024;

/// First pause before re-subscribing; doubles up to `RECONNECT_BACKOFF_MAX`.
const RECONNECT_BACKOFF_MIN: Duration = Duration::from_millis(100);
const RECONNECT_BACKOFF_MAX: Duration = Duration::from_secs(30);

/// Tunables of a consumer.
#[derive(Debug, Clone)]
pub struct ConsumerOptions {
    /// Subscription name.
    pub subscription: String,
    /// Exclusive, Shared, Failover or Key_Shared.
    pub sub_type: SubType,
    /// Where a new subscription starts.
    pub initial_position: InitialPosition,
    /// Messages the broker may push ahead of `receive`, per partition.
    pub receiver_queue_size: u32,
    /// Consumer name (`None`: a generated one).
    pub name: Option<String>,
}

impl ConsumerOptions {
    /// An exclusive subscription `subscription` from the latest message.
    pub fn new(subscription: impl Into<String>) -> ConsumerOptions {
        ConsumerOptions {
            subscription: subscription.into(),
            sub_type: SubType::Exclusive,
            initial_position: InitialPosition::Latest,
            receiver_queue_size: 1000,
            name: None,
        }
    }
}

/// A consumer of a topic (of every partition of a partitioned topic).
#[derive(Debug)]
pub struct Consumer {
    core: Arc<ConsumerCore>,
}

struct ConsumerCore {
    client: Client,
    options: ConsumerOptions,
    partitions: Vec<Arc<TopicConsumer>>,
    queue: Mutex<ReceiveQueue>,
    queue_messages_max: usize,
    queue_bytes_max: usize,
    arrived: Notify,
    closed: AtomicBool,
}

impl std::fmt::Debug for ConsumerCore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ConsumerCore")
            .field("subscription", &self.options.subscription)
            .field("partitions", &self.partitions.len())
            .finish_non_exhaustive()
    }
}

/// The subscription of one topic or partition.
struct TopicConsumer {
    index: usize,
    topic: String,
    partition: i32,
    consumer_id: u64,
    core: Weak<ConsumerCore>,
    state: Mutex<SubState>,
}

#[derive(Default)]
struct SubState {
    connection: Option<Connection>,
    /// Messages taken by the application since the last FLOW.
    consumed_since_flow: u32,
    reconnecting: bool,
    closed: bool,
    /// Batched entries not fully acknowledged: (ledger, entry) → (messages
    /// not yet acknowledged, messages in the batch). At most one entry per
    /// unacknowledged delivered batch.
    batches: BTreeMap<(u64, u64), (u32, u32)>,
}

impl Consumer {
    pub(crate) async fn subscribe(
        client: Client,
        topic: &str,
        options: ConsumerOptions,
    ) -> Result<Consumer, ClientError> {
        let partition_count = client.partitions(topic).await?;
        let topics: Vec<(String, i32)> = if partition_count == 0 {
            vec![(topic.to_string(), -1)]
        } else {
            (0..partition_count)
                .map(|i| {
                    (
                        partition_name(topic, i),
                        i32::try_from(i).unwrap_or(i32::MAX),
                    )
                })
                .collect()
        };
        let per_partition = options.receiver_queue_size.max(1) as usize;
        let queue_messages_max = topics.len() * (per_partition + BATCH_OVERSHOOT_MAX);
        let queue_bytes_max = topics.len() * READ_OVERSHOOT_BYTES_MAX;
        let core = Arc::new_cyclic(|weak| ConsumerCore {
            partitions: topics
                .iter()
                .enumerate()
                .map(|(index, (name, partition))| {
                    Arc::new(TopicConsumer {
                        index,
                        topic: name.clone(),
                        partition: *partition,
                        consumer_id: client.next_id(),
                        core: weak.clone(),
                        state: Mutex::new(SubState {
                            reconnecting: true,
                            ..SubState::default()
                        }),
                    })
                })
                .collect(),
            client: client.clone(),
            options,
            queue: Mutex::new(ReceiveQueue::default()),
            queue_messages_max,
            queue_bytes_max,
            arrived: Notify::new(),
            closed: AtomicBool::new(false),
        });
        for partition in &core.partitions {
            partition.connect_once(&core).await?;
        }
        Ok(Consumer { core })
    }

    /// The next message, waiting for one.
    pub async fn receive(&self) -> Result<Message, ClientError> {
        loop {
            // A message already queued is taken without registering as a
            // waiter: the Notify's waiter list (a lock to join, another to
            // leave) is paid only when the queue is empty.
            let next = self.core.queue.lock().pop_front();
            if let Some((index, message)) = next {
                self.core.partitions[index].consumed().await;
                return Ok(message);
            }
            let arrived = self.core.arrived.notified();
            tokio::pin!(arrived);
            arrived.as_mut().enable();
            // Registered: a message queued from here on wakes us. Look once
            // more for one queued before we registered.
            let next = self.core.queue.lock().pop_front();
            if let Some((index, message)) = next {
                self.core.partitions[index].consumed().await;
                return Ok(message);
            }
            if self.core.closed.load(Ordering::Acquire) {
                return Err(ClientError::Closed);
            }
            arrived.await;
        }
    }

    /// The next message, or `Ok(None)` if none comes within `timeout`.
    pub async fn receive_timeout(&self, timeout: Duration) -> Result<Option<Message>, ClientError> {
        match tokio::time::timeout(timeout, self.receive()).await {
            Ok(message) => message.map(Some),
            Err(_) => Ok(None),
        }
    }

    fn partition_of(&self, id: &MessageId) -> &Arc<TopicConsumer> {
        let index = usize::try_from(id.partition).unwrap_or(0);
        &self.core.partitions[index.min(self.core.partitions.len() - 1)]
    }

    /// Acknowledges one message.
    pub async fn ack(&self, id: &MessageId) -> Result<(), ClientError> {
        self.partition_of(id).ack(id, AckType::Individual).await
    }

    /// Acknowledges every message of its partition up to and including `id`.
    pub async fn ack_cumulative(&self, id: &MessageId) -> Result<(), ClientError> {
        self.partition_of(id).ack(id, AckType::Cumulative).await
    }

    /// Asks the broker to deliver this message's entry again (now).
    pub async fn negative_ack(&self, id: &MessageId) -> Result<(), ClientError> {
        let partition = self.partition_of(id);
        let connection = partition.connection()?;
        connection
            .send_command(BaseCommand::from(CommandRedeliverUnacknowledgedMessages {
                consumer_id: partition.consumer_id,
                message_ids: vec![MessageIdData {
                    ledger_id: id.ledger_id,
                    entry_id: id.entry_id,
                    ..Default::default()
                }],
                ..Default::default()
            }))
            .await
    }

    /// Closes the consumer on the broker; the subscription stays.
    pub async fn close(&self) -> Result<(), ClientError> {
        self.core.closed.store(true, Ordering::Release);
        self.core.arrived.notify_waiters();
        let mut first_error = None;
        for partition in &self.core.partitions {
            if let Err(error) = partition.close(&self.core.client, false).await {
                first_error.get_or_insert(error);
            }
        }
        first_error.map_or(Ok(()), Err)
    }

    /// Deletes the subscription (and closes the consumer).
    pub async fn unsubscribe(&self) -> Result<(), ClientError> {
        self.core.closed.store(true, Ordering::Release);
        self.core.arrived.notify_waiters();
        for partition in &self.core.partitions {
            partition.close(&self.core.client, true).await?;
        }
        Ok(())
    }
}

impl Drop for Consumer {
    fn drop(&mut self) {
        self.core.closed.store(true, Ordering::Release);
        for partition in &self.core.partitions {
            let connection = {
                let mut state = partition.state.lock();
                state.closed = true;
                state.connection.take()
            };
            if let Some(connection) = connection {
                connection.unregister_consumer(partition.consumer_id);
                let close = BaseCommand::from(CommandCloseConsumer {
                    consumer_id: partition.consumer_id,
                    request_id: u64::MAX,
                    ..Default::default()
                });
                let mut frame = bytes::BytesMut::new();
                vela_wire::encode_command(&close, &mut frame);
                let _ = connection.try_send(frame.freeze());
            }
        }
    }
}

impl TopicConsumer {
    fn connection(&self) -> Result<Connection, ClientError> {
        let state = self.state.lock();
        if state.closed {
            return Err(ClientError::Closed);
        }
        state.connection.clone().ok_or(ClientError::Disconnected {
            addr: String::new(),
            reason: "reconnecting".into(),
        })
    }

    /// Counts a message taken by the application; gives permits back in
    /// halves of the receiver queue.
    async fn consumed(&self) {
        let Some(core) = self.core.upgrade() else {
            return;
        };
        let threshold = (core.options.receiver_queue_size / 2).max(1);
        let flow = {
            let mut state = self.state.lock();
            state.consumed_since_flow += 1;
            if state.consumed_since_flow < threshold {
                return;
            }
            let permits = std::mem::take(&mut state.consumed_since_flow);
            state.connection.clone().map(|c| (c, permits))
        };
        if let Some((connection, permits)) = flow {
            self.flow(&connection, permits).await;
        }
    }

    async fn flow(&self, connection: &Connection, permits: u32) {
        let _ = connection
            .send_command(BaseCommand::from(CommandFlow {
                consumer_id: self.consumer_id,
                message_permits: permits,
            }))
            .await;
    }

    async fn ack(&self, id: &MessageId, ack_type: AckType) -> Result<(), ClientError> {
        let (connection, target) = {
            let mut state = self.state.lock();
            if state.closed {
                return Err(ClientError::Closed);
            }
            let key = (id.ledger_id, id.entry_id);
            let target = if id.batch_index < 0 {
                Some((id.ledger_id, id.entry_id))
            } else {
                match ack_type {
                    AckType::Individual => match state.batches.get_mut(&key) {
                        Some((remaining, _)) if *remaining > 1 => {
                            *remaining -= 1;
                            None
                        }
                        _ => {
                            state.batches.remove(&key);
                            Some(key)
                        }
                    },
                    AckType::Cumulative => {
                        let size = state.batches.get(&key).map_or(0, |(_, size)| *size);
                        let last_in_batch = u32::try_from(id.batch_index).unwrap_or(0) + 1 >= size;
                        if last_in_batch {
                            Some(key)
                        } else {
                            // Up to the entry before; this batch stays open.
                            id.entry_id.checked_sub(1).map(|e| (id.ledger_id, e))
                        }
                    }
                }
            };
            if ack_type == AckType::Cumulative
                && let Some(upto) = target
            {
                // Every batch at or below the acknowledged entry is settled.
                let settled: Vec<(u64, u64)> =
                    state.batches.range(..=upto).map(|(k, _)| *k).collect();
                for key in settled {
                    state.batches.remove(&key);
                }
            }
            (state.connection.clone(), target)
        };
        let Some((ledger_id, entry_id)) = target else {
            return Ok(());
        };
        let connection = connection.ok_or(ClientError::Disconnected {
            addr: String::new(),
            reason: "reconnecting".into(),
        })?;
        let mut ack = CommandAck {
            consumer_id: self.consumer_id,
            message_id: vec![MessageIdData {
                ledger_id,
                entry_id,
                ..Default::default()
            }],
            ..Default::default()
        };
        ack.set_ack_type(ack_type);
        connection.send_command(BaseCommand::from(ack)).await
    }

    async fn close(&self, client: &Client, unsubscribe: bool) -> Result<(), ClientError> {
        let connection = {
            let mut state = self.state.lock();
            if state.closed && !unsubscribe {
                return Ok(());
            }
            state.closed = true;
            state.connection.clone()
        };
        let Some(connection) = connection else {
            return Ok(());
        };
        let consumer_id = self.consumer_id;
        let timeout = client.inner.config.operation_timeout;
        let result = if unsubscribe {
            connection
                .request("unsubscribe", timeout, |request_id| {
                    BaseCommand::from(CommandUnsubscribe {
                        consumer_id,
                        request_id,
                        ..Default::default()
                    })
                })
                .await
        } else {
            connection
                .request("close consumer", timeout, |request_id| {
                    BaseCommand::from(CommandCloseConsumer {
                        consumer_id,
                        request_id,
                        ..Default::default()
                    })
                })
                .await
        };
        connection.unregister_consumer(consumer_id);
        self.state.lock().connection = None;
        result.map(|_| ())
    }

    /// Looks the topic up, subscribes, and grants the full receiver queue.
    async fn connect_once(self: &Arc<Self>, core: &ConsumerCore) -> Result<(), ClientError> {
        let connection = core.client.lookup(&self.topic).await?;
        connection.register_consumer(self.consumer_id, Arc::new(Handler(Arc::downgrade(self))));
        let options = &core.options;
        let (topic, consumer_id) = (self.topic.clone(), self.consumer_id);
        let answer = connection
            .request(
                "subscribe",
                core.client.inner.config.operation_timeout,
                |request_id| {
                    let mut subscribe = CommandSubscribe {
                        topic,
                        subscription: options.subscription.clone(),
                        consumer_id,
                        request_id,
                        consumer_name: options.name.clone(),
                        ..Default::default()
                    };
                    subscribe.set_sub_type(options.sub_type);
                    subscribe.set_initial_position(options.initial_position);
                    BaseCommand::from(subscribe)
                },
            )
            .await;
        if let Err(error) = answer {
            connection.unregister_consumer(self.consumer_id);
            return Err(error);
        }
        {
            let mut state = self.state.lock();
            if state.closed {
                connection.unregister_consumer(self.consumer_id);
                return Err(ClientError::Closed);
            }
            state.connection = Some(connection.clone());
            state.reconnecting = false;
            state.consumed_since_flow = 0;
        }
        self.flow(&connection, options.receiver_queue_size.max(1))
            .await;
        Ok(())
    }

    fn on_message(&self, command: CommandMessage, section: PayloadSection) {
        let Some(core) = self.core.upgrade() else {
            return;
        };
        let id = command.message_id.clone();
        let messages = match unpack(&command, &section, self.partition) {
            Ok(messages) => messages,
            Err(reason) => {
                // A corrupt message cannot be delivered; acknowledging it
                // would lose it silently. Drop the connection: the broker
                // delivers it again (and a persistent corruption shows).
                tracing::warn!(
                    topic = %self.topic, ledger = id.ledger_id, entry = id.entry_id, reason,
                    "undecodable message; reconnecting"
                );
                if let Some(connection) = &self.state.lock().connection {
                    connection.close("undecodable message");
                }
                return;
            }
        };
        if let Some(first) = messages.first()
            && first.id.batch_index >= 0
        {
            let size = section.summary().message_count().max(1) as u32;
            let delivered = u32::try_from(messages.len()).unwrap_or(u32::MAX);
            self.state
                .lock()
                .batches
                .insert((id.ledger_id, id.entry_id), (delivered, size));
        }
        let overflow = {
            let mut queue = core.queue.lock();
            queue.extend(self.index, messages);
            queue.is_past(core.queue_messages_max, core.queue_bytes_max)
        };
        core.arrived.notify_one();
        if overflow {
            tracing::warn!(topic = %self.topic, "broker sent past the permits; reconnecting");
            if let Some(connection) = &self.state.lock().connection {
                connection.close("broker sent past the permits");
            }
        }
    }

    fn on_closed(self: &Arc<Self>, reason: &str) {
        let Some(core) = self.core.upgrade() else {
            return;
        };
        {
            let mut state = self.state.lock();
            state.connection = None;
            state.batches.clear();
            if state.closed || state.reconnecting {
                return;
            }
            state.reconnecting = true;
        }
        // What was queued is delivered again after the re-subscribe.
        core.queue.lock().remove_partition(self.index);
        tracing::info!(topic = %self.topic, reason, "consumer disconnected; reconnecting");
        tokio::spawn(reconnect(Arc::clone(self)));
    }
}

async fn reconnect(partition: Arc<TopicConsumer>) {
    let mut backoff = RECONNECT_BACKOFF_MIN;
    loop {
        tokio::time::sleep(backoff).await;
        let Some(core) = partition.core.upgrade() else {
            return;
        };
        if partition.state.lock().closed {
            return;
        }
        match partition.connect_once(&core).await {
            Ok(()) => {
                tracing::info!(topic = %partition.topic, "consumer reconnected");
                return;
            }
            Err(error) if error.is_retriable() => {
                tracing::debug!(topic = %partition.topic, %error, "re-subscribe failed");
                backoff = (backoff * 2).min(RECONNECT_BACKOFF_MAX);
            }
            Err(error) => {
                tracing::warn!(topic = %partition.topic, %error, "consumer cannot re-subscribe");
                partition.state.lock().closed = true;
                core.closed.store(true, Ordering::Release);
                core.arrived.notify_waiters();
                return;
            }
        }
    }
}

struct Handler(Weak<TopicConsumer>);

impl ConsumerEvents for Handler {
    fn message(&self, command: CommandMessage, payload: PayloadSection) {
        if let Some(partition) = self.0.upgrade() {
            partition.on_message(command, payload);
        }
    }

    fn active_change(&self, _active: bool) {}

    fn closed(&self, reason: &str) {
        if let Some(partition) = self.0.upgrade() {
            partition.on_closed(reason);
        }
    }
}

fn properties(pairs: &[KeyValue]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}

/// Is batch index `index` still to be delivered? `ack_set` bits: 1 = not
/// acknowledged yet; an empty set means none is.
fn unacked(ack_set: &[i64], index: usize) -> bool {
    if ack_set.is_empty() {
        return true;
    }
    ack_set
        .get(index / 64)
        .is_some_and(|word| (*word as u64) >> (index % 64) & 1 == 1)
}

/// The application messages of one MESSAGE: one, or a batch's unacknowledged ones.
fn unpack(
    command: &CommandMessage,
    section: &PayloadSection,
    partition: i32,
) -> Result<Vec<Message>, String> {
    let metadata = section.metadata().map_err(|e| e.to_string())?;
    let compression = metadata.compression();
    let payload = if metadata.compression.is_some() {
        let uncompressed = metadata.uncompressed_size.unwrap_or(0) as usize;
        decompress(
            compression,
            section.payload_slice(),
            uncompressed,
            DECOMPRESSED_BYTES_MAX,
        )
        .map_err(|e| e.to_string())?
    } else {
        section.payload()
    };
    let id = MessageId {
        ledger_id: command.message_id.ledger_id,
        entry_id: command.message_id.entry_id,
        batch_index: -1,
        partition,
    };
    let redelivery_count = command.redelivery_count.unwrap_or(0);
    let Some(count) = metadata.num_messages_in_batch else {
        return Ok(vec![Message {
            id,
            payload,
            key: metadata.partition_key.clone(),
            properties: properties(&metadata.properties),
            publish_time_ms: metadata.publish_time,
            event_time_ms: metadata.event_time.unwrap_or(0),
            redelivery_count,
            producer_name: metadata.producer_name.clone(),
            sequence_id: metadata.sequence_id,
        }]);
    };
    let mut out = Vec::new();
    let records = BatchIter::new(payload, count).map_err(|e| e.to_string())?;
    for (index, record) in records.enumerate() {
        let record = record.map_err(|e| e.to_string())?;
        if !unacked(&command.ack_set, index) {
            continue;
        }
        let single = record.metadata;
        out.push(Message {
            id: MessageId {
                batch_index: i32::try_from(index).unwrap_or(i32::MAX),
                ..id
            },
            payload: record.payload,
            key: single.partition_key.clone(),
            properties: properties(&single.properties),
            publish_time_ms: metadata.publish_time,
            event_time_ms: single.event_time.unwrap_or(0),
            redelivery_count,
            producer_name: metadata.producer_name.clone(),
            sequence_id: single
                .sequence_id
                .unwrap_or(metadata.sequence_id + index as u64),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::unacked;

    #[test]
    fn ack_set_bits() {
        assert!(unacked(&[], 5));
        // Bits 0 and 2 unacknowledged.
        let set = [0b101_i64];
        assert!(unacked(&set, 0));
        assert!(!unacked(&set, 1));
        assert!(unacked(&set, 2));
        assert!(!unacked(&set, 64));
    }
}
