//! Non-persistent topics (`non-persistent://tenant/ns/topic`): messages go
//! from producers straight to the consumers connected now, never stored.
//!
//! Owns: [`NonPersistentTopic`] (its producers: `topic::ProducerTable`;
//! its subscriptions: `subscription::NpSubscription`; its publish rate, its
//! in-flight byte budget and counters). A SEND is handed to every
//! subscription at once, on the producer connection's task; each
//! subscription gives it to one consumer or drops it (see `subscription`).
//! As in Pulsar: the producer's receipt is (0, 0) whatever became of the
//! message, or (-1, -1) when the topic dropped it as it arrived (here: the
//! topic's or the broker's in-flight bytes are full); consumers get message
//! id (0, 0); acks are answered and forgotten; a reader's subscription goes
//! with its last consumer, a durable one stays while the topic is served.
//!
//! Locks: `subscriptions` (the map, short) → each subscription's state (a
//! leaf); `fanout` is a snapshot of the map read on every publish and
//! replaced under `subscriptions`. Never held across an await.
//! Never: stores or replays a message, or waits for a consumer: a message
//! nobody can take now is dropped and counted.

mod subscription;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Mutex, RwLock};
use vela_wire::proto::{ServerError, command_subscribe::SubType};

use crate::codec::{self, Outbound};
use crate::config::TopicLimits;
use crate::error::ServiceError;
use crate::inflight::ByteBudget;
use crate::stats::{RateMeter, TopicStats};
use crate::subscription::{ConnEvent, ConsumerInfo, ConsumerKey};
use crate::topic::{Admission, ConsumerSlot, ProducerReg, ProducerTable, PublishThrottle};
use crate::topic_name::TopicName;

pub(crate) use subscription::{Notices, NpSubscription};

/// Subscriptions on one non-persistent topic (as `SUBSCRIPTIONS_PER_TOPIC_MAX`
/// of persistent ones). When reached: SUBSCRIBE gets NotAllowedError.
pub(crate) const SUBSCRIPTIONS_PER_TOPIC_MAX: usize = 10_000;

/// Producers whose drops are counted per producer (their `msgDropRate`);
/// beyond it drops still count for the topic. Bounded like the producers.
const DROP_COUNTED_PRODUCERS_MAX: usize = crate::config::PRODUCERS_PER_TOPIC_MAX;

/// What became of a published message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Published {
    /// Handed to every subscription (each sent or dropped it).
    Accepted,
    /// Dropped as it arrived: the in-flight budget was full.
    Dropped,
}

/// A non-persistent topic being served.
pub(crate) struct NonPersistentTopic {
    /// Parsed name.
    pub(crate) name: TopicName,
    /// Full name (`non-persistent://t/ns/x`).
    pub(crate) full_name: String,
    producers: ProducerTable,
    subscriptions: Mutex<HashMap<String, Arc<NpSubscription>>>,
    /// The subscriptions as of the last change, for publishing.
    fanout: RwLock<Arc<[Arc<NpSubscription>]>>,
    /// Consumers attached, over all subscriptions.
    consumer_count: Arc<AtomicUsize>,
    limits: TopicLimits,
    throttle: Option<PublishThrottle>,
    /// Bytes in flight of this topic, and of the whole broker.
    budget: Arc<ByteBudget>,
    broker_budget: Arc<ByteBudget>,
    msg_in: AtomicU64,
    bytes_in: AtomicU64,
    /// Messages dropped as they arrived (receipt (-1, -1)).
    dropped_in: AtomicU64,
    /// Producer name → (messages dropped, their rate meter).
    producer_drops: Mutex<HashMap<String, (u64, RateMeter<1>)>>,
    /// msg_in, bytes_in, msg_out, bytes_out, dropped_in → rates.
    rates: Mutex<RateMeter<5>>,
    closed: AtomicBool,
}

impl std::fmt::Debug for NonPersistentTopic {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NonPersistentTopic")
            .field("name", &self.full_name)
            .finish_non_exhaustive()
    }
}

impl NonPersistentTopic {
    pub(crate) fn new(
        name: TopicName,
        limits: TopicLimits,
        topic_inflight_bytes_max: u64,
        broker_budget: Arc<ByteBudget>,
    ) -> Arc<NonPersistentTopic> {
        let full_name = name.to_string();
        Arc::new(NonPersistentTopic {
            producers: ProducerTable::new(Arc::from(full_name.as_str()), limits.producers_max),
            full_name,
            name,
            subscriptions: Mutex::new(HashMap::new()),
            fanout: RwLock::new(Arc::from(Vec::new())),
            consumer_count: Arc::new(AtomicUsize::new(0)),
            throttle: PublishThrottle::new(limits.publish_rate, Instant::now()),
            limits,
            budget: ByteBudget::new(topic_inflight_bytes_max),
            broker_budget,
            msg_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            dropped_in: AtomicU64::new(0),
            producer_drops: Mutex::new(HashMap::new()),
            rates: Mutex::new(RateMeter::new([0; 5])),
            closed: AtomicBool::new(false),
        })
    }

    /// True once closed (unloaded, deleted): the service opens a new one.
    pub(crate) fn is_closed(&self) -> bool {
        self.closed.load(Ordering::Acquire)
    }

    /// Registers a producer (access modes and limits as persistent topics).
    pub(crate) fn add_producer(
        &self,
        name: &str,
        reg: ProducerReg,
        access_mode: vela_wire::proto::ProducerAccessMode,
        request_id: u64,
        not_ready_reply: Outbound,
    ) -> Result<Admission, ServiceError> {
        if self.is_closed() {
            return Err(closing());
        }
        self.producers
            .add(name, reg, access_mode, request_id, not_ready_reply)
    }

    /// Removes a producer if it is still the same one.
    pub(crate) fn remove_producer(&self, name: &str, conn_id: u64, producer_id: u64) {
        self.producers.remove(name, conn_id, producer_id, |_| -1);
    }

    /// How long the sending connection should stop reading for the
    /// publish rate (`None`: within it).
    pub(crate) fn publish_pause(&self, messages: u32, bytes: usize) -> Option<Duration> {
        self.throttle
            .as_ref()?
            .charge(u64::from(messages), bytes as u64, Instant::now())
    }

    /// Hands a message to every subscription now (each sends or drops
    /// it), unless the in-flight budgets are full, which drops it for all.
    pub(crate) fn publish(&self, producer: &str, entry: &Bytes, messages: u32) -> Published {
        if self.budget.is_full() || self.broker_budget.is_full() {
            self.dropped_in
                .fetch_add(u64::from(messages), Ordering::Relaxed);
            let mut drops = self.producer_drops.lock();
            if drops.len() < DROP_COUNTED_PRODUCERS_MAX || drops.contains_key(producer) {
                let (count, _) = drops
                    .entry(producer.to_string())
                    .or_insert_with(|| (0, RateMeter::new([0])));
                *count += u64::from(messages);
            }
            return Published::Dropped;
        }
        self.msg_in
            .fetch_add(u64::from(messages), Ordering::Relaxed);
        self.bytes_in
            .fetch_add(entry.len() as u64, Ordering::Relaxed);
        let fanout = Arc::clone(&self.fanout.read());
        for subscription in fanout.iter() {
            subscription.deliver(entry, messages, &self.budget, &self.broker_budget);
        }
        Published::Accepted
    }

    /// Attaches a consumer, creating its subscription when needed. The
    /// slot counts it against `TopicLimits::consumers_max` while held; the
    /// notices (Failover's ACTIVE_CONSUMER_CHANGE) go out after SUBSCRIBE
    /// is answered.
    pub(crate) fn subscribe(
        &self,
        subscription: &str,
        sub_type: SubType,
        durable: bool,
        info: ConsumerInfo,
    ) -> Result<(Arc<NpSubscription>, ConsumerSlot, Notices), ServiceError> {
        if self.is_closed() {
            return Err(closing());
        }
        let slot = ConsumerSlot::reserve(&self.consumer_count, self.limits.consumers_max)?;
        let (subscription, notices) = {
            let mut subscriptions = self.subscriptions.lock();
            let created = !subscriptions.contains_key(subscription);
            if created && subscriptions.len() >= SUBSCRIPTIONS_PER_TOPIC_MAX {
                return Err(ServiceError::new(
                    ServerError::NotAllowedError,
                    "SUBSCRIPTIONS_PER_TOPIC_MAX reached",
                ));
            }
            let entry = Arc::clone(
                subscriptions
                    .entry(subscription.to_string())
                    .or_insert_with(|| {
                        Arc::new(NpSubscription::new(
                            subscription.to_string(),
                            durable,
                            sub_type,
                            self.limits.consumers_per_subscription_max,
                            self.name.partition_index(),
                        ))
                    }),
            );
            match entry.add(info, sub_type) {
                Ok(notices) => {
                    if created {
                        self.refresh_fanout(&subscriptions);
                    }
                    (entry, notices)
                }
                Err(error) => {
                    if created {
                        subscriptions.remove(subscription);
                    }
                    return Err(error);
                }
            }
        };
        Ok((subscription, slot, notices))
    }

    /// Detaches a consumer; a reader's subscription goes with its last one.
    pub(crate) async fn remove_consumer(&self, subscription: &NpSubscription, key: ConsumerKey) {
        let (removed, notices) = subscription.remove(key);
        if removed && !subscription.durable && subscription.is_empty() {
            let mut subscriptions = self.subscriptions.lock();
            let same = subscriptions
                .get(&subscription.name)
                .is_some_and(|s| std::ptr::eq(Arc::as_ptr(s), subscription));
            if same && subscription.is_empty() {
                subscriptions.remove(&subscription.name);
                self.refresh_fanout(&subscriptions);
            }
        }
        send_notices(notices).await;
    }

    /// UNSUBSCRIBE (or the admin's delete with `force`): the subscription
    /// goes, other consumers get CLOSE_CONSUMER. Refused while others are
    /// attached unless forced. `Ok(false)` when there is no such subscription.
    pub(crate) async fn unsubscribe(
        &self,
        name: &str,
        asking: Option<ConsumerKey>,
        force: bool,
    ) -> Result<bool, ServiceError> {
        let Some(subscription) = self.subscriptions.lock().get(name).cloned() else {
            return Ok(false);
        };
        let others = match asking {
            Some(key) => subscription.has_others_than(key),
            None => !subscription.is_empty(),
        };
        if others && !force {
            return Err(ServiceError::new(
                ServerError::UnknownError,
                "subscription has other active consumers",
            ));
        }
        {
            let mut subscriptions = self.subscriptions.lock();
            subscriptions.remove(name);
            self.refresh_fanout(&subscriptions);
        }
        close_consumers(subscription.detach_all(), asking).await;
        Ok(true)
    }

    fn refresh_fanout(&self, subscriptions: &HashMap<String, Arc<NpSubscription>>) {
        let snapshot: Vec<Arc<NpSubscription>> = subscriptions.values().cloned().collect();
        debug_assert!(snapshot.len() <= SUBSCRIPTIONS_PER_TOPIC_MAX);
        *self.fanout.write() = Arc::from(snapshot);
    }

    /// Closes the topic (unload, delete, shutdown): producers get
    /// CLOSE_PRODUCER and consumers CLOSE_CONSUMER; they look it up again.
    pub(crate) async fn close(&self) {
        self.closed.store(true, Ordering::Release);
        self.producers.close_all();
        let subscriptions: Vec<Arc<NpSubscription>> = {
            let mut map = self.subscriptions.lock();
            let all = map.drain().map(|(_, s)| s).collect();
            self.refresh_fanout(&map);
            all
        };
        for subscription in subscriptions {
            close_consumers(subscription.detach_all(), None).await;
        }
    }

    /// True while producers are registered or subscriptions exist (Pulsar's
    /// `isActive`: what GET_TOPICS_OF_NAMESPACE lists).
    pub(crate) fn is_active(&self) -> bool {
        !self.producers.is_empty() || !self.subscriptions.lock().is_empty()
    }

    /// True while a producer is registered (a consumer's schema is then
    /// checked, never registered, as for persistent topics).
    pub(crate) fn has_producers(&self) -> bool {
        !self.producers.is_empty()
    }

    /// True while producers or consumers are attached.
    pub(crate) fn has_clients(&self) -> bool {
        !self.producers.is_empty() || self.consumer_count.load(Ordering::Acquire) > 0
    }

    /// Names of the subscriptions.
    pub(crate) fn subscription_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.subscriptions.lock().keys().cloned().collect();
        names.sort();
        names
    }

    /// Bytes in flight now (handed to connections, not yet written).
    #[cfg(test)]
    pub(crate) fn inflight_bytes(&self) -> u64 {
        self.budget.used_bytes()
    }

    /// A statistics snapshot, with the drop rates of Pulsar's
    /// `NonPersistentTopicStats`.
    pub(crate) fn stats(&self) -> TopicStats {
        let fanout = Arc::clone(&self.fanout.read());
        let mut subscriptions: Vec<_> = fanout.iter().map(|s| s.stats()).collect();
        subscriptions.sort_by(|a, b| a.name.cmp(&b.name));
        let mut publishers = self.producers.publishers();
        {
            let mut drops = self.producer_drops.lock();
            let now = Instant::now();
            for publisher in &mut publishers {
                let rate = drops
                    .get_mut(&publisher.producer_name)
                    .map_or(0.0, |(count, meter)| meter.rates(now, [*count])[0]);
                publisher.msg_drop_rate = Some(rate);
            }
        }
        let msg_in_counter = self.msg_in.load(Ordering::Relaxed);
        let bytes_in_counter = self.bytes_in.load(Ordering::Relaxed);
        let msg_drop_counter = self.dropped_in.load(Ordering::Relaxed);
        let msg_out_counter = subscriptions.iter().map(|s| s.msg_out_counter).sum();
        let bytes_out_counter = subscriptions.iter().map(|s| s.bytes_out_counter).sum();
        let [
            msg_rate_in,
            msg_throughput_in,
            msg_rate_out,
            msg_throughput_out,
            msg_drop_rate,
        ] = self.rates.lock().rates(
            Instant::now(),
            [
                msg_in_counter,
                bytes_in_counter,
                msg_out_counter,
                bytes_out_counter,
                msg_drop_counter,
            ],
        );
        TopicStats {
            topic: self.full_name.clone(),
            msg_in_counter,
            bytes_in_counter,
            msg_out_counter,
            bytes_out_counter,
            msg_rate_in,
            msg_throughput_in,
            msg_rate_out,
            msg_throughput_out,
            publishers,
            subscriptions,
            msg_drop_rate: Some(msg_drop_rate),
            msg_drop_counter,
            ..TopicStats::default()
        }
    }
}

fn closing() -> ServiceError {
    ServiceError::new(ServerError::ServiceNotReady, "topic is closing, retry")
}

async fn send_notices(notices: Notices) {
    for (out, frame) in notices {
        let _ = out.send(frame).await;
    }
}

/// Tells consumers the broker closed them (CLOSE_CONSUMER; their
/// connection forgets them). `except`: the one unsubscribing, which gets
/// SUCCESS instead.
async fn close_consumers(consumers: Vec<ConsumerInfo>, except: Option<ConsumerKey>) {
    for info in consumers {
        let _ = info
            .events
            .send(ConnEvent::ConsumerClosed(info.consumer_id))
            .await;
        if Some((info.conn_id, info.consumer_id)) == except {
            continue;
        }
        let frame = codec::encode_command(vela_wire::proto::CommandCloseConsumer {
            consumer_id: info.consumer_id,
            request_id: u64::MAX,
            assigned_broker_service_url: None,
            assigned_broker_service_url_tls: None,
        });
        let _ = info.out.send(frame).await;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::expect_used)]
mod tests {
    use tokio::sync::mpsc;

    use super::*;
    use crate::inflight::Charge;

    fn info(out: mpsc::Sender<Outbound>, events: mpsc::Sender<ConnEvent>) -> ConsumerInfo {
        ConsumerInfo {
            conn_id: 1,
            consumer_id: 1,
            name: "c".into(),
            priority_level: 0,
            out,
            events,
            protocol_version: 21,
            sticky_ranges: None,
            address: "test".into(),
            epoch: None,
            allow_out_of_order: false,
            handles_end_of_topic: true,
            metadata: Default::default(),
            client_version: Arc::from(""),
        }
    }

    fn entry() -> Bytes {
        let mut buf = bytes::BytesMut::new();
        let metadata = vela_wire::proto::MessageMetadata {
            producer_name: "p".into(),
            ..Default::default()
        };
        let send = vela_wire::proto::BaseCommand::from(vela_wire::proto::CommandSend::default());
        vela_wire::encode_payload_frame(&send, &metadata, &[7u8; 100], &mut buf);
        let mut decoder = vela_wire::FrameDecoder::new(1 << 20);
        let frame = decoder.decode(&mut buf).unwrap().unwrap();
        frame.payload.unwrap().into_stored_entry()
    }

    #[tokio::test]
    async fn full_budgets_drop_messages_and_written_frames_give_bytes_back() {
        let broker_budget = ByteBudget::new(10_000);
        let topic = NonPersistentTopic::new(
            TopicName::parse("non-persistent://t/ns/x").unwrap(),
            TopicLimits::default(),
            1_000,
            Arc::clone(&broker_budget),
        );
        let (out, mut frames) = mpsc::channel(16);
        let (events, _events_rx) = mpsc::channel(16);
        let (subscription, _slot, _) = topic
            .subscribe("s", SubType::Shared, true, info(out, events))
            .unwrap();
        subscription.flow((1, 1), 100);
        let entry = entry();
        assert_eq!(topic.publish("p", &entry, 1), Published::Accepted);
        let first = frames.try_recv().unwrap();
        assert!(topic.inflight_bytes() > entry.len() as u64);
        // The topic's 1000 bytes take about seven frames; the rest of the
        // subscription's share is dropped.
        for _ in 0..20 {
            assert_eq!(topic.publish("p", &entry, 1), Published::Accepted);
        }
        let stats = topic.stats();
        assert!(stats.subscriptions[0].msg_drop_counter > 0, "{stats:?}");
        assert!(topic.inflight_bytes() <= 1_000);
        // The broker's budget full: a message is dropped as it arrives.
        let hog = ByteBudget::new(u64::MAX);
        let taken = Charge::take(&hog, &broker_budget, 10_000 - broker_budget.used_bytes());
        assert!(taken.is_some());
        assert_eq!(topic.publish("p", &entry, 1), Published::Dropped);
        assert_eq!(topic.stats().msg_drop_counter, 1);
        // Frames written (here: dropped by the consumer's side) give back.
        drop(first);
        while frames.try_recv().is_ok() {}
        assert_eq!(topic.inflight_bytes(), 0);
        drop(taken);
        assert_eq!(broker_budget.used_bytes(), 0);
    }
}
