//! A served topic: its log, its producers and its subscriptions.
//!
//! Owns: the single-writer order of appends (one short lock around
//! `ManagedLog::append`, which only issues the add), producer name uniqueness
//! and access modes (Shared, Exclusive, WaitForExclusive queue,
//! ExclusiveWithFencing), epoch-based producer replacement, the
//! deduplication table (rebuilt from the log's newest entries on open), the
//! map of subscription tasks, the topic's limits (producers, consumers over
//! all subscriptions, the publish rate's buckets), and closing/deleting the
//! topic's clients and log.
//! Never: waits for an append while holding a lock, parses payloads, or talks
//! to a socket (frames go through the connections' outbound queues).

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot};
use vela_log::{AppendFuture, CursorStart, ManagedLog, Position};
use vela_wire::proto::{
    CommandCloseProducer, ProducerAccessMode, ServerError, command_subscribe::SubType,
};

use crate::admin::AdminError;
use crate::codec::{self, Outbound};
use crate::compaction::Compaction;
use crate::config::TopicLimits;
use crate::error::ServiceError;
use crate::policies::{QuotaLimit, QuotaPolicy, TopicPolicies};
use crate::subscription::{
    self, ConnEvent, ConsumerInfo, SubCommand, SubscriptionHandle, SubscriptionSpec,
};
use crate::throttle::PublishThrottle;
use crate::topic_name::TopicName;

/// Subscriptions on one topic (each is a task and a cursor). When reached:
/// SUBSCRIBE gets NotAllowedError.
pub(crate) const SUBSCRIPTIONS_PER_TOPIC_MAX: usize = 10_000;

/// A producer registered on the topic.
#[derive(Debug, Clone)]
pub(crate) struct ProducerReg {
    /// Connection holding it.
    pub(crate) conn_id: u64,
    /// Its id on that connection.
    pub(crate) producer_id: u64,
    /// Reconnect epoch (a higher epoch replaces a lower one).
    pub(crate) epoch: u64,
    /// Exclusive access mode.
    pub(crate) exclusive: bool,
    /// The connection's outbound queue (for CLOSE_PRODUCER on replacement).
    pub(crate) out: mpsc::Sender<Outbound>,
    /// The connection's event queue.
    pub(crate) events: mpsc::Sender<ConnEvent>,
    /// Client address (stats).
    pub(crate) address: String,
    /// Client version (stats).
    pub(crate) client_version: String,
}

/// Newest entries scanned to rebuild the deduplication table when a topic
/// with deduplication opens (Pulsar snapshots every 1000 entries and replays
/// the rest; we keep no snapshot, so the scan is bounded instead: producers
/// silent for longer than this many entries lose their dedup state).
pub(crate) const DEDUP_REBUILD_ENTRIES_MAX: usize = 100_000;

/// Producers waiting for exclusive access (WaitForExclusive), per topic.
/// When reached: PRODUCER gets ProducerBusy.
pub(crate) const WAITING_PRODUCERS_MAX: usize = 1000;

/// Outcome of registering a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// It may send now.
    Ready,
    /// WaitForExclusive: queued; answered later.
    Waiting,
}

#[derive(Debug)]
struct Waiter {
    name: String,
    reg: ProducerReg,
    request_id: u64,
}

/// A subscription task that ended while asked to do something.
fn subscription_closing() -> ServiceError {
    ServiceError::new(
        ServerError::ServiceNotReady,
        "subscription is closing, retry",
    )
}

/// Tells a producer's connection the broker closed it.
fn close_producer(reg: &ProducerReg) {
    let _ = reg
        .events
        .try_send(ConnEvent::ProducerClosed(reg.producer_id));
    let _ = reg
        .out
        .try_send(codec::encode_command(CommandCloseProducer {
            producer_id: reg.producer_id,
            request_id: u64::MAX,
            assigned_broker_service_url: None,
            assigned_broker_service_url_tls: None,
        }));
}

/// How a subscription is requested.
#[derive(Debug, Clone)]
pub(crate) struct SubscribeRequest {
    /// Subscription name.
    pub(crate) subscription: String,
    /// Type asked for.
    pub(crate) sub_type: SubType,
    /// Durable subscription (false: reader).
    pub(crate) durable: bool,
    /// Where a new durable subscription starts.
    pub(crate) initial_earliest: bool,
    /// Reader: where to start (already resolved to the first position to
    /// deliver; `None` = latest).
    pub(crate) reader_start: Option<Position>,
    /// Key_Shared STICKY.
    pub(crate) sticky: bool,
    /// Reads the compacted view (set by the subscription's first consumer).
    pub(crate) read_compacted: bool,
}

#[derive(Debug)]
struct SubEntry {
    handle: SubscriptionHandle,
    generation: u64,
}

/// A topic being served.
#[derive(Debug)]
pub(crate) struct Topic {
    /// Parsed name.
    pub(crate) name: TopicName,
    /// Full name (`persistent://t/ns/x`).
    pub(crate) full_name: String,
    /// The topic's log.
    pub(crate) log: Arc<ManagedLog>,
    append_lock: Mutex<()>,
    producers: Mutex<HashMap<String, ProducerReg>>,
    waiters: Mutex<VecDeque<Waiter>>,
    subscriptions: Mutex<HashMap<String, SubEntry>>,
    subscribe_lock: tokio::sync::Mutex<u64>,
    /// Producer name → highest sequence id appended (deduplication enabled).
    dedup: Option<Mutex<HashMap<String, i64>>>,
    self_ref: Weak<Topic>,
    msg_in: AtomicU64,
    bytes_in: AtomicU64,
    /// Publish and storage-write latencies of this topic.
    pub(crate) metrics: Arc<crate::metrics::TopicMetrics>,
    /// msg_in, bytes_in, msg_out, bytes_out → rates.
    rates: Mutex<crate::stats::RateMeter<4>>,
    /// TTL, backlog quotas and retention of the namespace (`lifecycle`).
    lifecycle: Mutex<TopicPolicies>,
    /// The exceeded quota holding producers off, as of the last lifecycle pass.
    quota_block: Mutex<Option<(QuotaLimit, QuotaPolicy)>>,
    /// Compacted view and compaction status.
    pub(crate) compaction: Arc<Compaction>,
    /// Producer, consumer and publish-rate limits.
    limits: TopicLimits,
    /// Consumers attached, over all subscriptions (each holds a `ConsumerSlot`).
    consumer_count: Arc<AtomicUsize>,
    /// The publish rate's buckets (`None`: unlimited).
    throttle: Option<PublishThrottle>,
}

/// A consumer's place in its topic's count (`TopicLimits::consumers_max`):
/// held by the connection as long as it keeps the consumer; dropping it
/// frees the place.
#[derive(Debug)]
pub(crate) struct ConsumerSlot(Arc<AtomicUsize>);

impl Drop for ConsumerSlot {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Outcome of a dedup check on SEND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DedupCheck {
    /// Append it.
    Fresh,
    /// Already appended: answer with a (−1, −1) receipt.
    Duplicate,
}

impl Topic {
    /// Messages published to this topic since it opened (for load reports).
    pub(crate) fn msg_in_total(&self) -> u64 {
        self.msg_in.load(Ordering::Relaxed)
    }

    /// Wraps an opened log.
    pub(crate) fn new(
        name: TopicName,
        log: Arc<ManagedLog>,
        dedup_enabled: bool,
        compaction: Compaction,
        limits: TopicLimits,
    ) -> Arc<Topic> {
        Arc::new_cyclic(|self_ref| Topic {
            full_name: name.to_string(),
            name,
            log,
            append_lock: Mutex::new(()),
            producers: Mutex::new(HashMap::new()),
            waiters: Mutex::new(VecDeque::new()),
            subscriptions: Mutex::new(HashMap::new()),
            subscribe_lock: tokio::sync::Mutex::new(0),
            dedup: dedup_enabled.then(|| Mutex::new(HashMap::new())),
            self_ref: self_ref.clone(),
            msg_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            metrics: Arc::default(),
            rates: Mutex::new(crate::stats::RateMeter::new([0; 4])),
            lifecycle: Mutex::new(TopicPolicies::default()),
            quota_block: Mutex::new(None),
            compaction: Arc::new(compaction),
            limits,
            consumer_count: Arc::new(AtomicUsize::new(0)),
            throttle: PublishThrottle::new(limits.publish_rate, Instant::now()),
        })
    }

    /// Charges a SEND against the topic's publish rate: how long the sending
    /// connection should stop reading (`None`: within the rate).
    pub(crate) fn publish_pause(&self, messages: u32, bytes: usize) -> Option<Duration> {
        self.throttle
            .as_ref()?
            .charge(u64::from(messages), bytes as u64, Instant::now())
    }

    /// Takes a place for one more consumer, or ConsumerBusy at the limit.
    fn reserve_consumer(&self) -> Result<ConsumerSlot, ServiceError> {
        let max = self.limits.consumers_max;
        let taken =
            self.consumer_count
                .fetch_update(Ordering::AcqRel, Ordering::Acquire, |count| {
                    (count < max).then_some(count + 1)
                });
        match taken {
            Ok(_) => Ok(ConsumerSlot(Arc::clone(&self.consumer_count))),
            Err(_) => Err(ServiceError::new(
                ServerError::ConsumerBusy,
                format!("Topic reached max consumers limit ({max})"),
            )),
        }
    }

    /// The namespace policies this topic enforces over time.
    pub(crate) fn lifecycle_policies(&self) -> TopicPolicies {
        self.lifecycle.lock().clone()
    }

    /// Replaces them (topic open, namespace policy change).
    pub(crate) fn set_lifecycle_policies(&self, policies: TopicPolicies) {
        *self.lifecycle.lock() = policies;
    }

    /// The exceeded quota holding producers off, if any.
    pub(crate) fn quota_block(&self) -> Option<(QuotaLimit, QuotaPolicy)> {
        *self.quota_block.lock()
    }

    /// Records the lifecycle pass's verdict; true if a quota held producers
    /// off before.
    pub(crate) fn set_quota_block(&self, block: Option<(QuotaLimit, QuotaPolicy)>) -> bool {
        std::mem::replace(&mut *self.quota_block.lock(), block).is_some()
    }

    /// Checks a new producer against the topic's quotas: size quotas now, age
    /// quotas as of the last lifecycle pass (finding the oldest message
    /// takes reads).
    fn admit_producer(&self) -> Result<(), ServiceError> {
        if let Some((limit @ QuotaLimit::AgeSeconds(_), policy)) = self.quota_block() {
            return Err(policy.refusal(limit));
        }
        for (limit, policy) in self.lifecycle_policies().quotas {
            if policy == QuotaPolicy::ConsumerBacklogEviction {
                continue;
            }
            if let QuotaLimit::SizeBytes(bytes) = limit
                && self.slowest_backlog_bytes() > bytes
            {
                return Err(policy.refusal(limit));
            }
        }
        Ok(())
    }

    /// The durable subscriptions (name, cursor) the policies apply to. Not the
    /// `__compaction` cursor (as in Pulsar): it is no consumer, and moving it by
    /// TTL or eviction would let the log trim what the next compaction needs.
    pub(crate) fn policy_subscriptions(&self) -> Vec<(String, Arc<vela_log::Cursor>)> {
        self.log
            .cursor_names()
            .into_iter()
            .filter(|name| name != crate::compaction::COMPACTION_SUBSCRIPTION)
            .filter_map(|name| self.log.cursor(&name).map(|cursor| (name, cursor)))
            .collect()
    }

    /// Backlog bytes of the slowest durable subscription.
    pub(crate) fn slowest_backlog_bytes(&self) -> u64 {
        self.policy_subscriptions()
            .iter()
            .map(|(_, cursor)| self.log.bytes_after(cursor.mark_delete_position()))
            .max()
            .unwrap_or(0)
    }

    /// Closes every producer (they reconnect and are admitted again or not).
    pub(crate) fn disconnect_producers(&self) {
        let producers: Vec<ProducerReg> = self.producers.lock().drain().map(|(_, r)| r).collect();
        for reg in &producers {
            close_producer(reg);
        }
    }

    /// Appends a stored entry. The append is issued before this returns, in
    /// call order; the future resolves once the entry is durable.
    pub(crate) fn publish(&self, entry: Bytes, messages: u32) -> AppendFuture {
        self.msg_in
            .fetch_add(u64::from(messages), Ordering::Relaxed);
        self.bytes_in
            .fetch_add(entry.len() as u64, Ordering::Relaxed);
        let _writer = self.append_lock.lock();
        self.log.append(entry)
    }

    /// Deduplication after a (re)open: rebuilds the table from the newest
    /// `DEDUP_REBUILD_ENTRIES_MAX` entries of the log (producer name and
    /// highest sequence id are in each entry's metadata), so a restarted
    /// broker still drops the re-sends of producers that reconnect.
    pub(crate) async fn rebuild_dedup(&self) -> Result<(), vela_log::LogError> {
        let Some(table) = &self.dedup else {
            return Ok(());
        };
        let Some(last) = self.log.last_confirmed() else {
            return Ok(());
        };
        let mut start = last;
        for _ in 1..DEDUP_REBUILD_ENTRIES_MAX {
            match self.log.previous_position(start) {
                Some(previous) => start = previous,
                None => break,
            }
        }
        let mut rebuilt: HashMap<String, i64> = HashMap::new();
        let mut from = start;
        loop {
            let entries = self
                .log
                .read(from, crate::subscription::READ_BATCH_ENTRIES_MAX, 4 << 20)
                .await?;
            let Some(newest) = entries.last().map(|e| e.position) else {
                break;
            };
            for entry in &entries {
                if let Some((producer, highest)) = codec::entry_producer_sequence(&entry.data) {
                    let slot = rebuilt.entry(producer).or_insert(-1);
                    *slot = (*slot).max(highest);
                }
            }
            if newest >= last {
                break;
            }
            from = self.log.next_position(newest);
        }
        let mut table = table.lock();
        for (producer, highest) in rebuilt {
            let slot = table.entry(producer).or_insert(-1);
            *slot = (*slot).max(highest);
        }
        Ok(())
    }

    /// Deduplication: records `highest_sequence_id` for `producer` unless it
    /// was already appended.
    pub(crate) fn dedup_check(
        &self,
        producer: &str,
        sequence_id: i64,
        highest_sequence_id: i64,
    ) -> DedupCheck {
        let Some(table) = &self.dedup else {
            return DedupCheck::Fresh;
        };
        let mut table = table.lock();
        let last = table.get(producer).copied().unwrap_or(-1);
        if sequence_id <= last {
            return DedupCheck::Duplicate;
        }
        table.insert(producer.to_string(), highest_sequence_id.max(sequence_id));
        DedupCheck::Fresh
    }

    /// The last sequence id to report in PRODUCER_SUCCESS (−1 without dedup).
    pub(crate) fn last_sequence_id(&self, producer: &str) -> i64 {
        match &self.dedup {
            Some(table) => table.lock().get(producer).copied().unwrap_or(-1),
            None => -1,
        }
    }

    /// Registers a producer under `name`. WaitForExclusive on a busy topic
    /// queues it (answered `Waiting`; a second PRODUCER_SUCCESS with
    /// `request_id` goes out when it gets the topic); ExclusiveWithFencing
    /// closes every other producer.
    pub(crate) fn add_producer(
        &self,
        name: &str,
        reg: ProducerReg,
        access_mode: ProducerAccessMode,
        request_id: u64,
        not_ready_reply: Outbound,
    ) -> Result<Admission, ServiceError> {
        self.admit_producer()?;
        let mut producers = self.producers.lock();
        if let Some(existing) = producers.get(name) {
            if existing.conn_id == reg.conn_id && existing.producer_id == reg.producer_id {
                return Ok(Admission::Ready);
            }
            if reg.epoch > existing.epoch {
                // A reconnect of the same producer: the old one is replaced.
                let exclusive = existing.exclusive;
                close_producer(existing);
                tracing::info!(topic = %self.full_name, producer = name, "producer replaced by a newer epoch");
                producers.insert(name.to_string(), ProducerReg { exclusive, ..reg });
                return Ok(Admission::Ready);
            }
            return Err(ServiceError::new(
                ServerError::ProducerBusy,
                format!("Producer with name '{name}' is already connected to topic"),
            ));
        }
        let wants_exclusive = access_mode != ProducerAccessMode::Shared;
        if access_mode == ProducerAccessMode::ExclusiveWithFencing {
            for (_, other) in producers.drain() {
                close_producer(&other);
            }
            tracing::info!(topic = %self.full_name, producer = name, "exclusive producer fenced the others");
        }
        let exclusive_holder = producers
            .iter()
            .find(|(_, r)| r.exclusive)
            .map(|(n, _)| n.clone());
        let busy = match &exclusive_holder {
            Some(_) => true,
            None => wants_exclusive && !producers.is_empty(),
        };
        if busy && access_mode == ProducerAccessMode::WaitForExclusive {
            let mut waiters = self.waiters.lock();
            if waiters.len() >= WAITING_PRODUCERS_MAX {
                return Err(ServiceError::new(
                    ServerError::ProducerBusy,
                    "WAITING_PRODUCERS_MAX producers wait for this topic",
                ));
            }
            if reg.out.try_send(not_ready_reply).is_err() {
                return Err(ServiceError::new(
                    ServerError::ServiceNotReady,
                    "connection outbound queue full, retry",
                ));
            }
            waiters.push_back(Waiter {
                name: name.to_string(),
                reg: ProducerReg {
                    exclusive: true,
                    ..reg
                },
                request_id,
            });
            return Ok(Admission::Waiting);
        }
        if let Some(holder) = exclusive_holder {
            return Err(ServiceError::new(
                ServerError::ProducerBusy,
                format!("exclusive producer '{holder}' is already connected"),
            ));
        }
        if busy {
            return Err(ServiceError::new(
                ServerError::ProducerBusy,
                "topic has existing shared producers",
            ));
        }
        if producers.len() >= self.limits.producers_max {
            return Err(ServiceError::new(
                ServerError::ProducerBusy,
                format!(
                    "Topic reached max producers limit ({})",
                    self.limits.producers_max
                ),
            ));
        }
        producers.insert(
            name.to_string(),
            ProducerReg {
                exclusive: wants_exclusive,
                ..reg
            },
        );
        Ok(Admission::Ready)
    }

    /// Removes a producer (registered or waiting) if it is still the same
    /// one; a freed topic goes to the first live waiting producer.
    pub(crate) fn remove_producer(&self, name: &str, conn_id: u64, producer_id: u64) {
        let mut producers = self.producers.lock();
        if producers
            .get(name)
            .is_some_and(|r| r.conn_id == conn_id && r.producer_id == producer_id)
        {
            producers.remove(name);
        }
        let mut waiters = self.waiters.lock();
        waiters.retain(|w| !(w.reg.conn_id == conn_id && w.reg.producer_id == producer_id));
        if !producers.is_empty() {
            return;
        }
        while let Some(waiter) = waiters.pop_front() {
            if waiter.reg.out.is_closed() {
                continue;
            }
            let success = codec::encode_command(vela_wire::proto::CommandProducerSuccess {
                request_id: waiter.request_id,
                producer_name: waiter.name.clone(),
                last_sequence_id: Some(self.last_sequence_id(&waiter.name)),
                schema_version: Some(Bytes::new()),
                topic_epoch: Some(0),
                producer_ready: Some(true),
            });
            if waiter.reg.out.try_send(success).is_ok() {
                tracing::info!(topic = %self.full_name, producer = %waiter.name, "waiting exclusive producer got the topic");
                producers.insert(waiter.name, waiter.reg);
                return;
            }
        }
    }

    /// Attaches a consumer, creating the subscription when needed. The slot
    /// counts it against `TopicLimits::consumers_max` while held.
    pub(crate) async fn subscribe(
        &self,
        request: &SubscribeRequest,
        info: ConsumerInfo,
    ) -> Result<(SubscriptionHandle, ConsumerSlot), ServiceError> {
        let slot = self.reserve_consumer()?;
        let mut generation = self.subscribe_lock.lock().await;
        let existing = self
            .subscriptions
            .lock()
            .get(&request.subscription)
            .map(|e| e.handle.clone());
        let handle = match existing {
            Some(handle) if !handle.tx.is_closed() => {
                if handle.durable != request.durable {
                    return Err(ServiceError::new(
                        ServerError::NotAllowedError,
                        "a subscription with this name and another durability exists",
                    ));
                }
                handle
            }
            _ => {
                if self.subscriptions.lock().len() >= SUBSCRIPTIONS_PER_TOPIC_MAX {
                    return Err(ServiceError::new(
                        ServerError::NotAllowedError,
                        "SUBSCRIPTIONS_PER_TOPIC_MAX reached",
                    ));
                }
                let cursor = if request.durable {
                    let start = if request.initial_earliest {
                        CursorStart::Earliest
                    } else {
                        CursorStart::Latest
                    };
                    Some(self.log.open_cursor(&request.subscription, start).await?)
                } else {
                    None
                };
                *generation += 1;
                let this_generation = *generation;
                let weak = self.self_ref.clone();
                let on_end = Box::new(move |name: &str| {
                    if let Some(topic) = weak.upgrade() {
                        let mut subs = topic.subscriptions.lock();
                        if subs
                            .get(name)
                            .is_some_and(|e| e.generation == this_generation)
                        {
                            subs.remove(name);
                        }
                    }
                });
                let handle = subscription::spawn(
                    SubscriptionSpec {
                        name: request.subscription.clone(),
                        topic: self.full_name.clone(),
                        partition: self.name.partition_index(),
                        log: Arc::clone(&self.log),
                        cursor,
                        reader_start: request.reader_start,
                        sub_type: request.sub_type,
                        sticky: request.sticky,
                        compaction: request.read_compacted.then(|| Arc::clone(&self.compaction)),
                        consumers_max: self.limits.consumers_per_subscription_max,
                    },
                    on_end,
                );
                self.subscriptions.lock().insert(
                    request.subscription.clone(),
                    SubEntry {
                        handle: handle.clone(),
                        generation: this_generation,
                    },
                );
                handle
            }
        };
        drop(generation);
        let (reply, answer) = oneshot::channel();
        let command = SubCommand::Add {
            info,
            sub_type: request.sub_type,
            reply,
        };
        if handle.tx.send(command).await.is_err() {
            return Err(subscription_closing());
        }
        match answer.await {
            Ok(Ok(())) => Ok((handle, slot)),
            Ok(Err(e)) => Err(e),
            Err(_) => Err(subscription_closing()),
        }
    }

    /// A statistics snapshot (asks every subscription task once).
    pub(crate) async fn stats(&self) -> crate::stats::TopicStats {
        let mut publishers: Vec<crate::stats::PublisherStats> = self
            .producers
            .lock()
            .iter()
            .map(|(name, reg)| crate::stats::PublisherStats {
                producer_name: name.clone(),
                producer_id: reg.producer_id,
                access_mode: if reg.exclusive { "Exclusive" } else { "Shared" }.to_string(),
                address: reg.address.clone(),
                client_version: reg.client_version.clone(),
            })
            .collect();
        publishers.sort_by(|a, b| a.producer_name.cmp(&b.producer_name));
        let handles: Vec<SubscriptionHandle> = self
            .subscriptions
            .lock()
            .values()
            .map(|e| e.handle.clone())
            .collect();
        let mut subscriptions = Vec::with_capacity(handles.len());
        for handle in handles {
            let (reply, answer) = oneshot::channel();
            if handle.tx.send(SubCommand::SubStats { reply }).await.is_ok()
                && let Ok(stats) = answer.await
            {
                subscriptions.push(stats);
            }
        }
        // Durable subscriptions without consumers have no task: their
        // cursor still holds a backlog.
        for name in self.log.cursor_names() {
            if subscriptions.iter().any(|s| s.name == name) {
                continue;
            }
            if let Some(cursor) = self.log.cursor(&name) {
                let mark_delete = cursor.mark_delete_position();
                subscriptions.push(crate::stats::SubscriptionStats {
                    name,
                    sub_type: "Exclusive".to_string(),
                    durable: true,
                    msg_backlog: cursor.backlog_entries(),
                    mark_delete,
                    read_position: Some(match mark_delete {
                        Some(md) => self.log.next_position(md),
                        None => self.log.first_position().unwrap_or(Position::new(0, 0)),
                    }),
                    ..Default::default()
                });
            }
        }
        subscriptions.sort_by(|a, b| a.name.cmp(&b.name));
        let log = self.log.stats();
        let msg_in_counter = self.msg_in.load(Ordering::Relaxed);
        let bytes_in_counter = self.bytes_in.load(Ordering::Relaxed);
        let msg_out_counter = subscriptions.iter().map(|s| s.msg_out_counter).sum();
        let bytes_out_counter = subscriptions.iter().map(|s| s.bytes_out_counter).sum();
        let [
            msg_rate_in,
            msg_throughput_in,
            msg_rate_out,
            msg_throughput_out,
        ] = self.rates.lock().rates(
            std::time::Instant::now(),
            [
                msg_in_counter,
                bytes_in_counter,
                msg_out_counter,
                bytes_out_counter,
            ],
        );
        crate::stats::TopicStats {
            topic: self.full_name.clone(),
            msg_in_counter,
            bytes_in_counter,
            msg_out_counter,
            bytes_out_counter,
            entries: log.entries,
            storage_size_bytes: log.size_bytes,
            ledgers: log.ledgers,
            msg_rate_in,
            msg_throughput_in,
            msg_rate_out,
            msg_throughput_out,
            deduplication_enabled: self.dedup.is_some(),
            publish_latency: self.metrics.publish_latency.snapshot(),
            storage_write_latency: self.metrics.storage_write_latency.snapshot(),
            publishers,
            subscriptions,
        }
    }

    /// Closes every producer (CLOSE_PRODUCER: clients look up again and
    /// re-attach), stops every subscription task (consumers get
    /// CLOSE_CONSUMER) and closes the log.
    pub(crate) async fn close(&self) -> Result<(), vela_log::LogError> {
        self.detach_clients().await;
        self.log.close().await
    }

    /// As [`Topic::close`], then deletes the log, its cursors and ledgers.
    pub(crate) async fn delete(&self) -> Result<(), vela_log::LogError> {
        self.detach_clients().await;
        if let Err(error) = self.compaction.delete().await {
            tracing::warn!(topic = %self.full_name, %error, "compacted data not deleted");
        }
        self.log.delete().await
    }

    /// Compacts the topic in the background (admin trigger, size threshold).
    /// Fails at once when a compaction is already running.
    pub(crate) fn start_compaction(&self) -> Result<(), crate::compaction::CompactionError> {
        self.compaction.begin()?;
        let compaction = Arc::clone(&self.compaction);
        let log = Arc::clone(&self.log);
        let name = self.full_name.clone();
        tokio::spawn(async move {
            if let Err(error) = compaction.run(&log).await {
                tracing::warn!(topic = %name, %error, "compaction failed");
            }
        });
        Ok(())
    }

    async fn detach_clients(&self) {
        let producers: Vec<ProducerReg> = self.producers.lock().drain().map(|(_, r)| r).collect();
        for reg in &producers {
            close_producer(reg);
        }
        self.waiters.lock().clear();
        let handles: Vec<SubscriptionHandle> = self
            .subscriptions
            .lock()
            .drain()
            .map(|(_, e)| e.handle)
            .collect();
        for handle in handles {
            let (reply, done) = oneshot::channel();
            if handle.tx.send(SubCommand::Shutdown { reply }).await.is_ok() {
                let _ = done.await;
            }
        }
    }

    /// Drops a subscription and its cursor (admin unsubscribe): its consumers
    /// get CLOSE_CONSUMER.
    pub(crate) async fn unsubscribe(&self, subscription: &str) -> Result<bool, ServiceError> {
        let handle = self
            .subscriptions
            .lock()
            .get(subscription)
            .map(|e| e.handle.clone());
        if let Some(handle) = handle {
            let (reply, answer) = oneshot::channel();
            let command = SubCommand::Unsubscribe {
                key: (0, 0),
                force: true,
                reply,
            };
            if handle.tx.send(command).await.is_ok() {
                answer.await.unwrap_or(Ok(()))?;
                return Ok(true);
            }
        }
        if self.log.cursor_names().iter().any(|n| n == subscription) {
            self.log.delete_cursor(subscription).await?;
            return Ok(true);
        }
        Ok(false)
    }

    /// Names of the durable subscriptions (cursors) and the readers now.
    pub(crate) fn subscription_names(&self) -> Vec<String> {
        let mut names = self.log.cursor_names();
        names.extend(self.subscriptions.lock().keys().cloned());
        names.sort();
        names.dedup();
        names
    }
}

/// Where an admin-created subscription starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SubscriptionStart {
    /// Before the oldest entry.
    Earliest,
    /// After the newest entry.
    Latest,
    /// At this entry (it is the first delivered).
    At(Position),
}

/// Admin operations on subscriptions (pulsar-admin `topics create-subscription`,
/// `reset-cursor`, `skip`, `clear-backlog`, `expire-messages`). A subscription
/// with a running task (consumers attached, or a reader) is changed by that
/// task; a durable one without consumers through its cursor directly.
impl Topic {
    fn live_subscription(&self, name: &str) -> Option<SubscriptionHandle> {
        self.subscriptions
            .lock()
            .get(name)
            .map(|e| e.handle.clone())
            .filter(|h| !h.tx.is_closed())
    }

    /// Runs `command` on the subscription's task when one is running.
    /// `None`: no task took it (the caller works on the durable cursor
    /// itself); `Some(None)`: the task ended before answering.
    async fn ask_live<T>(
        &self,
        name: &str,
        command: impl FnOnce(oneshot::Sender<T>) -> SubCommand,
    ) -> Option<Option<T>> {
        let handle = self.live_subscription(name)?;
        let (reply, answer) = oneshot::channel();
        handle.tx.send(command(reply)).await.ok()?;
        Some(answer.await.ok())
    }

    fn not_found(&self, name: &str) -> AdminError {
        AdminError::NotFound(format!(
            "Subscription {name} not found for topic {}",
            self.full_name
        ))
    }

    /// True while producers or consumers are attached.
    pub(crate) async fn has_clients(&self) -> bool {
        if !self.producers.lock().is_empty() {
            return true;
        }
        let stats = self.stats().await;
        stats.subscriptions.iter().any(|s| !s.consumers.is_empty())
    }

    /// Creates a durable subscription (its cursor) without a consumer.
    pub(crate) async fn create_subscription(
        &self,
        name: &str,
        start: SubscriptionStart,
    ) -> Result<(), AdminError> {
        if name.is_empty() {
            return Err(AdminError::BadRequest("empty subscription name".into()));
        }
        if self.subscription_names().iter().any(|n| n == name) {
            return Err(AdminError::Exists(format!(
                "Subscription {name} for topic {}",
                self.full_name
            )));
        }
        let cursor_start = match start {
            SubscriptionStart::Earliest => CursorStart::Earliest,
            SubscriptionStart::Latest | SubscriptionStart::At(_) => CursorStart::Latest,
        };
        let cursor = self
            .log
            .open_cursor(name, cursor_start)
            .await
            .map_err(ServiceError::from)?;
        if let SubscriptionStart::At(position) = start {
            let target = crate::subscription::SeekTarget::MessageId {
                ledger_id: position.ledger_id,
                entry_id: position.entry_id,
            };
            let next = crate::subscription::resolve_seek(&self.log, target).await?;
            cursor.reset(next).await.map_err(ServiceError::from)?;
        }
        Ok(())
    }

    /// Moves a subscription to `target` (its consumers are disconnected and
    /// re-attach there, as on SEEK).
    pub(crate) async fn reset_cursor(
        &self,
        name: &str,
        target: crate::subscription::SeekTarget,
    ) -> Result<(), AdminError> {
        match self
            .ask_live(name, |reply| SubCommand::Seek { target, reply })
            .await
        {
            Some(Some(result)) => return Ok(result?),
            Some(None) => return Err(subscription_closing().into()),
            None => {}
        }
        let Some(cursor) = self.log.cursor(name) else {
            return Err(self.not_found(name));
        };
        let next = crate::subscription::resolve_seek(&self.log, target).await?;
        cursor.reset(next).await.map_err(ServiceError::from)?;
        tracing::info!(topic = %self.full_name, subscription = name, position = %next, "cursor reset");
        Ok(())
    }

    /// The subscription's mark-delete position (`Ok(None)`: nothing acked).
    async fn mark_delete_of(&self, name: &str) -> Result<Option<Position>, AdminError> {
        if let Some(Some(position)) = self
            .ask_live(name, |reply| SubCommand::MarkDelete { reply })
            .await
        {
            return Ok(position);
        }
        match self.log.cursor(name) {
            Some(cursor) => Ok(cursor.mark_delete_position()),
            None => Err(self.not_found(name)),
        }
    }

    /// Acknowledges everything up to `position`.
    async fn ack_up_to(
        &self,
        name: &str,
        position: Position,
        expired: bool,
    ) -> Result<(), AdminError> {
        let command = |reply| SubCommand::AckUpTo {
            position,
            expired,
            reply,
        };
        match self.ask_live(name, command).await {
            Some(Some(result)) => return Ok(result?),
            Some(None) => return Err(subscription_closing().into()),
            None => {}
        }
        let Some(cursor) = self.log.cursor(name) else {
            return Err(self.not_found(name));
        };
        cursor
            .ack_cumulative(position)
            .map_err(ServiceError::from)?;
        Ok(())
    }

    /// Skips `count` entries after the mark-delete position (`None`: the
    /// whole backlog, pulsar-admin `clear-backlog`). Entries acknowledged
    /// individually in that range count among the skipped ones.
    pub(crate) async fn skip(&self, name: &str, count: Option<u64>) -> Result<(), AdminError> {
        let mark_delete = self.mark_delete_of(name).await?;
        let Some(last) = self.log.last_confirmed() else {
            return Ok(());
        };
        let target = match count {
            None => last,
            Some(0) => return Ok(()),
            Some(count) => self.log.position_after(mark_delete, count).unwrap_or(last),
        };
        if Some(target) <= mark_delete {
            return Ok(());
        }
        self.ack_up_to(name, target, false).await?;
        tracing::info!(topic = %self.full_name, subscription = name, up_to = %target, "skipped entries");
        Ok(())
    }

    /// Backlog eviction (quota): acknowledges everything up to `target`.
    pub(crate) async fn evict_up_to(&self, name: &str, target: Position) -> Result<(), AdminError> {
        let mark_delete = self.mark_delete_of(name).await?;
        if Some(target) <= mark_delete {
            return Ok(());
        }
        self.ack_up_to(name, target, false).await
    }

    /// Acknowledges every entry published more than `age` ago.
    pub(crate) async fn expire(
        &self,
        name: &str,
        age: std::time::Duration,
    ) -> Result<(), AdminError> {
        let mark_delete = self.mark_delete_of(name).await?;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let cutoff_ms = now_ms.saturating_sub(age.as_millis() as u64);
        let first_kept = crate::subscription::first_published_at_or_after(&self.log, cutoff_ms)
            .await
            .map_err(ServiceError::from)?;
        let Some(target) = self.log.previous_position(first_kept) else {
            return Ok(());
        };
        if Some(target) <= mark_delete {
            return Ok(());
        }
        self.ack_up_to(name, target, true).await?;
        tracing::info!(topic = %self.full_name, subscription = name, up_to = %target, "expired entries");
        Ok(())
    }
}
