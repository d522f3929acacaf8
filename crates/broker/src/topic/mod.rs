//! A served topic: its log, its producers and its subscriptions.
//!
//! Module map (the `Topic`'s state is grouped by job, each group with its
//! own lock):
//! - `publish`: appends and the SEND-order invariant (stated there), the
//!   publish rate (`throttle`), the in-counters;
//! - `dedup`: producer name → highest sequence id (deduplication), checked
//!   and recorded under the lock that issues the append;
//! - `producers`: producer names, access modes, the WaitForExclusive queue,
//!   epoch replacement;
//! - `subscriptions`: the running subscription tasks, creating them, the
//!   topic-wide consumer count;
//! - `quota`: the namespace policies the topic enforces and the backlog
//!   quota verdict behind producer admission;
//! - `cursor_admin`: admin operations on subscriptions (create, reset,
//!   skip, expire, evict);
//! - `stats`: the statistics snapshot;
//! - `pending_acks`: transactional acknowledgements held per subscription
//!   until their transaction ends.
//!
//! A non-persistent topic (`nonpersistent`) reuses `producers`, `throttle`
//! and `ConsumerSlot` and sits beside `Topic` in the service. The
//! transaction buffer (`crate::txn_buffer`, shared with the subscription
//! tasks) is held here: a transactional SEND is admitted by it, then
//! appended through `publish` like any other (dedup included). Lock order:
//! `DedupTable` → the buffer's state.
//!
//! Locks (all short `parking_lot` mutexes, never held across an await,
//! except `SubscriptionTable::create`, an async mutex held while a
//! subscription is created):
//! - `DedupTable` (with deduplication on): held around the check and
//!   `ManagedLog::append` (the issue of the add, not its completion).
//! - `ProducerTable::state` (registered and waiting producers) →
//!   `DedupTable` (read when a waiting producer gets the topic).
//! - `SubscriptionTable::create` → `SubscriptionTable::map`.
//! - `PolicyState`, `DedupTable`, the throttle's buckets, `rates`: leaves.
//!
//! Lock order is the arrows above; no other lock is taken while one is
//! held. Compaction keeps its own state (`compaction`).
//!
//! Owns: the topic's limits (producers, consumers over all subscriptions,
//! the publish rate's buckets), and closing/deleting the topic's clients and
//! log.
//! Never: waits for an append while holding a lock, parses payloads, or talks
//! to a socket (frames go through the connections' outbound queues).

pub(crate) mod cursor_admin;
mod dedup;
mod pending_acks;
mod producers;
mod publish;
mod quota;
mod replicated;
mod stats;
mod subscriptions;
mod throttle;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::oneshot;
use vela_log::{AppendPermit, Cursor, ManagedLog};
use vela_wire::proto::ProducerAccessMode;

use crate::admin::TopicRecord;
use crate::codec::Outbound;
use crate::compaction::{Compaction, TopicCompaction};
use crate::config::TopicLimits;
use crate::error::ServiceError;
use crate::metrics::TopicMetrics;
use crate::policies::{QuotaLimit, QuotaPolicy, TopicPolicies};
use crate::stats::RateMeter;
use crate::subscription::{
    ConsumerInfo, HeldEntries, ReplicatedSubscriptions, SubCommand, SubscriptionHandle,
};
use crate::topic_name::TopicName;
use crate::txn_buffer::{BufferError, TxnBuffer, TxnKey};
use dedup::{DedupTable, ReplDedup};
use publish::Publisher;
use quota::PolicyState;
use subscriptions::SubscriptionTable;
use vela_wire::proto::ServerError;

pub(crate) use dedup::{
    DEDUP_UNKNOWN_MESSAGE, DedupCheck, REPLICATOR_PREFIX, is_replicator, replicated_sequence_id,
    replication_cursor_name, replicator_producer_name, replicator_source,
};
pub(crate) use pending_acks::PendingAcks;
pub(crate) use producers::{Admission, ProducerReg, ProducerTable};
pub(crate) use subscriptions::{ConsumerSlot, SubscribeRequest};
pub(crate) use throttle::PublishThrottle;

/// A topic being served.
#[derive(Debug)]
pub(crate) struct Topic {
    /// Parsed name.
    pub(crate) name: TopicName,
    /// Full name (`persistent://t/ns/x`), one copy shared with the
    /// service's map of topics, the producer table and the subscriptions.
    pub(crate) full_name: Arc<str>,
    /// The topic's log.
    pub(crate) log: Arc<ManagedLog>,
    /// Appends, publish rate, in-counters.
    publisher: Publisher,
    /// Producer name → highest sequence id appended (deduplication).
    dedup: DedupTable,
    /// The same for replicators' producers (`pulsar.repl.` names): always
    /// on, so a replicator's re-sends after a restart are dropped; rebuilt
    /// from the log when the first one attaches. Made when a replicator's
    /// producer first comes (most topics never see one: ~100 bytes a topic
    /// otherwise).
    repl_dedup: std::sync::OnceLock<Box<ReplDedup>>,
    /// Registered and waiting producers.
    producers: ProducerTable,
    /// Running subscription tasks and the consumer count.
    subscriptions: SubscriptionTable,
    /// Namespace policies and the backlog quota verdict.
    policies: PolicyState,
    /// Publish and storage-write latencies of this topic.
    pub(crate) metrics: Arc<TopicMetrics>,
    /// msg_in, bytes_in, msg_out, bytes_out → rates.
    rates: Mutex<RateMeter<4>>,
    /// Compacted view and compaction status, made when first needed
    /// (`Topic::compaction`).
    pub(crate) compaction: TopicCompaction,
    /// A publish rate set by topic or namespace policy, replacing the
    /// broker's (`policy_rate_set` keeps SENDs off the lock when none is).
    /// Boxed: most topics have none (~100 bytes inline otherwise).
    policy_rate: Mutex<Option<Box<PublishThrottle>>>,
    policy_rate_set: AtomicBool,
    /// Delayed delivery and unacknowledged limits, shared with the
    /// subscription tasks.
    dispatch_policy: Arc<crate::subscription::DispatchPolicy>,
    /// Largest entry a SEND may carry by policy (`maxMessageSize`; 0: the
    /// broker's frame limit only), read per SEND without a lock.
    message_size_max: AtomicUsize,
    /// A termination began: producers are refused (retriably until the log
    /// is terminated, then with TopicTerminatedError).
    terminating: AtomicBool,
    /// The transaction buffer and pending acks (transactions on), boxed:
    /// ~120 bytes a topic otherwise, with transactions off too.
    txn: Option<Box<(Arc<TxnBuffer>, PendingAcks)>>,
    /// Replicated subscriptions and the snapshots they read, shared with
    /// the subscription tasks and the snapshot controller
    /// (`replication::snapshots`).
    replicated: Arc<ReplicatedSubscriptions>,
}

/// The transaction parts of a topic (transactions on).
#[derive(Debug)]
pub(crate) struct TopicTxn {
    pub(crate) buffer: Arc<TxnBuffer>,
    pub(crate) acks: PendingAcks,
}

impl Topic {
    /// Wraps an opened log.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        (name, full_name): (TopicName, Arc<str>),
        log: Arc<ManagedLog>,
        dedup_enabled: bool,
        compaction: TopicCompaction,
        limits: TopicLimits,
        reads: crate::subscription::SubscriptionReads,
        held: Arc<HeldEntries>,
        txn: Option<TopicTxn>,
    ) -> Arc<Topic> {
        debug_assert_eq!(*full_name, name.to_string());
        let txn = txn.map(|t| Box::new((t.buffer, t.acks)));
        let replicated = Arc::new(ReplicatedSubscriptions::default());
        replicated.restore(&log);
        Arc::new(Topic {
            producers: ProducerTable::new(Arc::clone(&full_name), limits.producers_max),
            full_name,
            name,
            log,
            publisher: Publisher::new(limits.publish_rate),
            dedup: DedupTable::new(dedup_enabled),
            repl_dedup: std::sync::OnceLock::new(),
            subscriptions: SubscriptionTable::new(
                limits.consumers_max,
                limits.consumers_per_subscription_max,
                reads,
                held,
                txn.as_deref().map(|(buffer, _)| Arc::clone(buffer)),
                Arc::clone(&replicated),
            ),
            policies: PolicyState::default(),
            metrics: Arc::default(),
            rates: Mutex::new(RateMeter::new([0; 4])),
            compaction,
            policy_rate: Mutex::new(None),
            policy_rate_set: AtomicBool::new(false),
            dispatch_policy: Arc::default(),
            message_size_max: AtomicUsize::new(0),
            terminating: AtomicBool::new(false),
            txn,
            replicated,
        })
    }

    /// Charges a SEND against the topic's publish rate: how long the sending
    /// connection should stop reading (`None`: within the rate).
    pub(crate) fn publish_pause(&self, messages: u32, bytes: usize) -> Option<Duration> {
        if self.policy_rate_set.load(Ordering::Acquire) {
            return self.policy_rate.lock().as_ref().and_then(|throttle| {
                throttle.charge(u64::from(messages), bytes as u64, Instant::now())
            });
        }
        self.publisher.pause(messages, bytes)
    }

    /// Appends a stored entry of `producer` unless deduplication finds
    /// `sequence_id` appended already, with its room in the broker's append
    /// budget (`ManagedLog::reserve_append`). The append is issued before
    /// this returns, in call order (`publish` states the SEND-order
    /// invariant); its future resolves once the entry is durable.
    pub(crate) fn publish(
        &self,
        producer: &str,
        sequence_id: i64,
        highest_sequence_id: i64,
        entry: Bytes,
        messages: u32,
        permit: AppendPermit,
    ) -> DedupCheck {
        // A duplicate drops `permit`: its bytes go back at once.
        self.dedup_of(producer)
            .check_and_append(producer, sequence_id, highest_sequence_id, || {
                self.publisher.publish(&self.log, entry, messages, permit)
            })
    }

    /// The table deduplicating `producer`'s SENDs.
    fn dedup_of(&self, producer: &str) -> &DedupTable {
        if is_replicator(producer) {
            &self.repl_dedup().table
        } else {
            &self.dedup
        }
    }

    /// The transaction buffer (`None` when transactions are off): what
    /// readers other than subscriptions (replicators) must respect.
    pub(crate) fn txn_buffer(&self) -> Option<&Arc<TxnBuffer>> {
        self.txn.as_deref().map(|(buffer, _)| buffer)
    }

    /// The pending acknowledgements of its subscriptions (`None` when
    /// transactions are off).
    pub(crate) fn pending_acks(&self) -> Option<&PendingAcks> {
        self.txn.as_deref().map(|(_, acks)| acks)
    }

    /// The transaction buffer, or NotAllowedError when transactions are off.
    fn buffer(&self) -> Result<&Arc<TxnBuffer>, ServiceError> {
        self.txn
            .as_deref()
            .map(|(buffer, _)| buffer)
            .ok_or_else(|| {
                ServiceError::new(
                    vela_wire::proto::ServerError::NotAllowedError,
                    "Transactions are not enabled.",
                )
            })
    }

    /// Readies the transaction buffer for this topic's transactional SENDs
    /// (a metadata write before the first one).
    pub(crate) async fn prepare_txn_publish(&self) -> Result<(), ServiceError> {
        self.buffer()?.ensure_tracked().await.map_err(buffer_error)
    }

    /// [`Topic::publish`] for a SEND of transaction `txn`, its entry with
    /// the transaction id in its metadata (`txn_buffer::with_txn_id`, before
    /// its append budget is reserved): held invisible by the buffer until
    /// the transaction ends. Call `prepare_txn_publish` first.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn publish_txn(
        &self,
        txn: TxnKey,
        producer: &str,
        sequence_id: i64,
        highest_sequence_id: i64,
        entry: Bytes,
        messages: u32,
        permit: AppendPermit,
    ) -> Result<DedupCheck, ServiceError> {
        let buffer = self.buffer()?;
        if let Err(error) = buffer.admit(txn) {
            // As Pulsar, a duplicate is answered as one before the buffer
            // is asked (a re-send of a committed transaction's entry).
            if matches!(error, BufferError::Ended(..))
                && self.dedup.is_persisted(producer, sequence_id)
            {
                return Ok(DedupCheck::Duplicate);
            }
            return Err(buffer_error(error));
        }
        let check = self.publish(
            producer,
            sequence_id,
            highest_sequence_id,
            entry,
            messages,
            permit,
        );
        if !matches!(&check, DedupCheck::Appended(append) if !append.is_refused()) {
            buffer.not_appended(txn);
        }
        Ok(check)
    }

    /// An entry of transaction `txn` is durable at `position`.
    pub(crate) fn txn_appended(&self, txn: TxnKey, position: vela_log::Position) {
        if let Some((buffer, _)) = self.txn.as_deref() {
            buffer.appended(txn, position);
        }
    }

    /// END_TXN_ON_PARTITION: the commit or abort marker, durable. With the
    /// coordinator's low water mark, later SENDs of transactions at or
    /// below it are refused (Pulsar's `appendBufferToTxn`), and its
    /// transactions still open here at or below it are aborted here (they
    /// ended without this topic hearing it; Pulsar's `handleLowWaterMark`).
    /// A failed abort fails the request: the coordinator asks again.
    pub(crate) async fn end_txn_on_partition(
        &self,
        txn: TxnKey,
        commit: bool,
        low_water: Option<u64>,
    ) -> Result<(), ServiceError> {
        let buffer = self.buffer()?;
        buffer.end(txn, commit).await.map_err(buffer_error)?;
        if let Some(low_water) = low_water {
            for stale in buffer.note_low_water(txn.0, low_water) {
                tracing::warn!(topic = %self.full_name, ?stale, low_water,
                    "aborting a transaction below its coordinator's low water mark");
                buffer.end(stale, false).await.map_err(buffer_error)?;
            }
        }
        Ok(())
    }

    /// A transactional ACK on `subscription`: held for `txn` (durably).
    pub(crate) async fn txn_ack(
        &self,
        subscription: &str,
        txn: TxnKey,
        ids: &[vela_wire::proto::MessageIdData],
        cumulative: bool,
    ) -> Result<(), ServiceError> {
        self.buffer()?;
        let Some((_, acks)) = self.txn.as_deref() else {
            return Ok(());
        };
        acks.ack(subscription, txn, ids, cumulative).await
    }

    /// END_TXN_ON_SUBSCRIPTION: a commit applies the acknowledgements
    /// `txn` holds on `subscription` (through its task when it runs, else
    /// on its cursor) and flushes the cursor; an abort sends the entries
    /// still out to consumers again. Then the record is deleted.
    /// Idempotent: a retry flushes and deletes again. With the
    /// coordinator's low water mark, acknowledgements held by transactions
    /// at or below it (they arrived after their transaction ended) are
    /// released as by an abort, and later ones refused (Pulsar's
    /// `handleLowWaterMark`).
    pub(crate) async fn end_txn_on_subscription(
        &self,
        subscription: &str,
        txn: TxnKey,
        commit: bool,
        low_water: Option<u64>,
    ) -> Result<(), ServiceError> {
        self.buffer()?;
        let Some((_, acks)) = self.txn.as_deref() else {
            return Ok(());
        };
        self.apply_txn_outcome(acks, subscription, txn, commit)
            .await?;
        if let Some(low_water) = low_water {
            for stale in acks.note_low_water(subscription, txn.0, low_water).await? {
                tracing::info!(topic = %self.full_name, subscription, ?stale, "releasing acknowledgements of an ended transaction");
                self.apply_txn_outcome(acks, subscription, stale, false)
                    .await?;
            }
        }
        Ok(())
    }

    /// Applies (commit) or releases (abort) what `txn` holds on
    /// `subscription`, then deletes its record.
    async fn apply_txn_outcome(
        &self,
        acks: &PendingAcks,
        subscription: &str,
        txn: TxnKey,
        commit: bool,
    ) -> Result<(), ServiceError> {
        let released = acks.release(subscription, txn).await?;
        if let Some(released) = released {
            if commit {
                let individual = released.individual.clone();
                let cumulative = released.cumulative;
                let applied = self
                    .subscriptions
                    .ask_live(subscription, |reply| SubCommand::TxnCommitted {
                        positions: individual,
                        cumulative,
                        reply,
                    })
                    .await;
                if !matches!(applied, Some(Some(()))) {
                    self.ack_on_cursor(subscription, &released)?;
                }
            } else if let Some(handle) = self.subscriptions.live(subscription) {
                let positions = released.individual.iter().map(|(p, _)| *p).collect();
                let _ = handle.tx.send(SubCommand::TxnAborted { positions }).await;
            }
        }
        if commit && let Some(cursor) = self.log.cursor(subscription) {
            cursor.flush().await?;
        }
        acks.forget(subscription, txn).await
    }

    /// Applies committed acknowledgements on a subscription without a task.
    fn ack_on_cursor(
        &self,
        subscription: &str,
        released: &pending_acks::Released,
    ) -> Result<(), ServiceError> {
        let Some(cursor) = self.log.cursor(subscription) else {
            // The subscription is gone: nothing to acknowledge.
            return Ok(());
        };
        for (position, ack_set) in &released.individual {
            if ack_set.is_empty() {
                cursor.ack(&[*position])?;
            } else {
                cursor.ack_batch_indexes(*position, ack_set)?;
            }
        }
        if let Some(position) = released.cumulative {
            cursor.ack_cumulative(position)?;
        }
        Ok(())
    }

    /// `producer`'s SENDs up to `sequence_id` are durable (deduplication).
    pub(crate) fn dedup_persisted(&self, producer: &str, sequence_id: i64) {
        self.dedup_of(producer)
            .mark_persisted(producer, sequence_id);
    }

    /// An append failed: deduplication forgets what is not durable.
    pub(crate) fn dedup_append_failed(&self) {
        self.dedup.append_failed();
        if let Some(repl) = self.repl_dedup.get() {
            repl.table.append_failed();
        }
    }

    /// The last sequence id to report in PRODUCER_SUCCESS (−1 without dedup).
    pub(crate) fn last_sequence_id(&self, producer: &str) -> i64 {
        self.dedup_of(producer).last_sequence_id(producer)
    }

    /// Before a replicator's producer (of a cluster replicating into this
    /// one, `local_cluster`) is admitted: the replicated table is rebuilt
    /// from the log once, so what earlier replicators sent is known.
    pub(crate) async fn prepare_replicator(
        &self,
        local_cluster: &str,
    ) -> Result<(), vela_log::LogError> {
        let repl = self.repl_dedup();
        repl.ready
            .get_or_try_init(|| repl.table.rebuild_replicated(&self.log, local_cluster))
            .await
            .map(|_| ())
    }

    /// The replicators' deduplication (made at the first call).
    fn repl_dedup(&self) -> &ReplDedup {
        self.repl_dedup.get_or_init(Box::default)
    }

    /// Deduplication after a (re)open: rebuilds the table from the log's
    /// newest entries.
    pub(crate) async fn rebuild_dedup(&self) -> Result<(), vela_log::LogError> {
        self.dedup.rebuild(&self.log).await
    }

    /// The namespace policies this topic enforces over time.
    pub(crate) fn lifecycle_policies(&self) -> Arc<TopicPolicies> {
        self.policies.policies()
    }

    /// Replaces them (topic open, namespace or topic policy change): the
    /// publish and dispatch rates at once, limits at the next PRODUCER or
    /// SUBSCRIBE, the rest at the next lifecycle pass.
    pub(crate) fn set_lifecycle_policies(&self, policies: Arc<TopicPolicies>) {
        let applied = self.policies.policies().limits;
        let dispatch = (
            policies.limits.dispatch_rate,
            policies.limits.subscription_dispatch_rate,
            policies.limits.replicator_dispatch_rate,
        );
        let dispatch_applied = (
            applied.dispatch_rate,
            applied.subscription_dispatch_rate,
            applied.replicator_dispatch_rate,
        );
        if dispatch != dispatch_applied {
            self.dispatch_policy.set_rates(
                crate::subscription::DispatchRates::new(dispatch.0, dispatch.1)
                    .with_replicator(dispatch.2),
            );
        }
        let rate = policies.limits.publish_rate;
        let unchanged = rate == applied.publish_rate
            && self.policy_rate_set.load(Ordering::Acquire) == rate.is_some();
        if !unchanged {
            let mut throttle = self.policy_rate.lock();
            // A policy rate with neither side limited is no limit (Pulsar's
            // -1/-1), also over the broker's.
            *throttle = rate
                .and_then(|r| PublishThrottle::new(r, Instant::now()))
                .map(Box::new);
            self.policy_rate_set
                .store(rate.is_some(), Ordering::Release);
        }
        self.message_size_max.store(
            policies.limits.message_size_max.unwrap_or(0),
            Ordering::Relaxed,
        );
        let dispatch = &self.dispatch_policy;
        dispatch.delayed_delivery.store(
            policies.limits.delayed_delivery.unwrap_or(true),
            Ordering::Relaxed,
        );
        dispatch.unacked_per_consumer_max.store(
            policies.limits.unacked_per_consumer_max.unwrap_or(0),
            Ordering::Relaxed,
        );
        dispatch.unacked_per_subscription_max.store(
            policies.limits.unacked_per_subscription_max.unwrap_or(0),
            Ordering::Relaxed,
        );
        self.policies.set_policies(policies);
    }

    /// The topic's own policy record, as last applied.
    pub(crate) fn policy_record(&self) -> TopicRecord {
        self.policies.record()
    }

    /// Keeps the topic's own policy record (apply with
    /// `set_lifecycle_policies`).
    pub(crate) fn set_policy_record(&self, record: TopicRecord) {
        self.policies.set_record(record);
    }

    /// The largest message a producer may send here, when a policy sets one.
    pub(crate) fn message_size_max(&self) -> Option<usize> {
        Some(self.message_size_max.load(Ordering::Relaxed)).filter(|max| *max > 0)
    }

    /// Records the lifecycle pass's verdict; true if a quota held producers
    /// off before.
    pub(crate) fn set_quota_block(&self, block: Option<(QuotaLimit, QuotaPolicy)>) -> bool {
        self.policies.set_quota_block(block)
    }

    /// The durable subscriptions (name, cursor) the policies apply to (not
    /// the `__compaction` cursor).
    pub(crate) fn policy_subscriptions(&self) -> Vec<(String, Arc<Cursor>)> {
        quota::policy_subscriptions(&self.log)
    }

    /// Backlog bytes of the slowest durable subscription.
    pub(crate) fn slowest_backlog_bytes(&self) -> u64 {
        quota::slowest_backlog_bytes(&self.log)
    }

    /// Closes every producer (they reconnect and are admitted again or not).
    pub(crate) fn disconnect_producers(&self) {
        self.producers.disconnect_all();
    }

    /// Registers a producer under `name`, once the quotas admit it.
    /// WaitForExclusive on a busy topic queues it (answered `Waiting`; a
    /// second PRODUCER_SUCCESS with `request_id` goes out when it gets the
    /// topic); ExclusiveWithFencing closes every other producer.
    pub(crate) fn add_producer(
        &self,
        name: &str,
        reg: ProducerReg,
        access_mode: ProducerAccessMode,
        request_id: u64,
        not_ready_reply: Outbound,
    ) -> Result<Admission, ServiceError> {
        if self.log.is_terminated() {
            return Err(crate::error::topic_terminated());
        }
        if self.terminating.load(Ordering::Acquire) {
            // Retriable: the client asks again and then learns the outcome.
            return Err(ServiceError::new(
                vela_wire::proto::ServerError::ServiceNotReady,
                "topic is being terminated",
            ));
        }
        self.policies.admit_producer(&self.log)?;
        if let Some(max) = self.policies.policies().limits.producers_max
            && self.producers.publishers().len() >= max
        {
            return Err(ServiceError::new(
                ServerError::ProducerBusy,
                format!("Topic reached max producers limit ({max})"),
            ));
        }
        self.producers
            .add(name, reg, access_mode, request_id, not_ready_reply)
    }

    /// True while a producer is registered (a consumer's schema is then
    /// checked, never registered, as Pulsar's `addSchemaIfIdleOrCheckCompatible`).
    pub(crate) fn has_producers(&self) -> bool {
        !self.producers.is_empty()
    }

    /// The topic epoch (PRODUCER_SUCCESS.topic_epoch).
    pub(crate) fn topic_epoch(&self) -> Option<u64> {
        self.producers.topic_epoch()
    }

    /// Removes a producer (registered or waiting) if it is still the same
    /// one; a freed topic goes to the first live waiting producer.
    pub(crate) fn remove_producer(&self, name: &str, conn_id: u64, producer_id: u64) {
        self.producers.remove(name, conn_id, producer_id, |waiter| {
            self.dedup.last_sequence_id(waiter)
        });
    }

    /// Attaches a consumer, creating the subscription when needed. The slot
    /// counts it against `TopicLimits::consumers_max` while held.
    pub(crate) async fn subscribe(
        &self,
        request: &SubscribeRequest,
        info: ConsumerInfo,
    ) -> Result<(SubscriptionHandle, ConsumerSlot), ServiceError> {
        self.check_policy_limits(request).await?;
        let attached = self
            .subscriptions
            .subscribe(
                (&self.full_name, self.name.partition_index()),
                &self.log,
                (&self.compaction, &self.name),
                request,
                info,
                &self.dispatch_policy,
            )
            .await?;
        // As Pulsar: the flag only ever turns a subscription replicated; one
        // without it keeps what the subscription is.
        if request.replicated
            && request.durable
            && let Err(error) = self.set_replicated(&request.subscription, true).await
        {
            tracing::warn!(topic = %self.full_name, subscription = %request.subscription,
                %error, "subscription not replicated");
        }
        Ok(attached)
    }

    /// Whether attaching a consumer as `request` asks would write metadata:
    /// a durable subscription whose cursor is not open yet (its creation),
    /// or one still to mark replicated. A connection then has
    /// [`Topic::prepare_subscription`] do it off its reader first.
    pub(crate) fn subscribe_writes(&self, request: &SubscribeRequest) -> bool {
        if !request.durable {
            return false;
        }
        match self.log.cursor(&request.subscription) {
            None => true,
            Some(_) => request.replicated && !self.replicated.is_replicated(&request.subscription),
        }
    }

    /// Writes what attaching a consumer as `request` asks would write,
    /// without attaching it: the new durable subscription's cursor (after
    /// the policy checks a new subscription passes) and its replicated mark.
    /// The attach ([`Topic::subscribe`]) then finds both done and writes
    /// nothing. As in Pulsar, the subscription stays when the attach is
    /// then refused (an Exclusive one taken, say).
    pub(crate) async fn prepare_subscription(
        &self,
        request: &SubscribeRequest,
    ) -> Result<(), ServiceError> {
        if !self.subscribe_writes(request) {
            return Ok(());
        }
        if self
            .subscriptions
            .live(&request.subscription)
            .is_some_and(|running| running.durable != request.durable)
        {
            // The attach refuses it; nothing to create.
            return Ok(());
        }
        self.check_policy_limits(request).await?;
        let start = if request.initial_earliest {
            vela_log::CursorStart::Earliest
        } else {
            vela_log::CursorStart::Latest
        };
        self.log.open_cursor(&request.subscription, start).await?;
        if request.replicated
            && let Err(error) = self.set_replicated(&request.subscription, true).await
        {
            tracing::warn!(topic = %self.full_name, subscription = %request.subscription,
                %error, "subscription not replicated");
        }
        Ok(())
    }

    /// The dispatch policies (the replicators read their rate there).
    pub(crate) fn dispatch_policy(&self) -> &Arc<crate::subscription::DispatchPolicy> {
        &self.dispatch_policy
    }

    /// The replicated subscriptions and their snapshots.
    pub(crate) fn replicated_subscriptions(&self) -> &Arc<ReplicatedSubscriptions> {
        &self.replicated
    }

    /// The count limits a policy sets on a new consumer (the broker's own
    /// limits are the subscription table's). Counted when asked: a SUBSCRIBE
    /// racing another may pass one over, as in Pulsar.
    async fn check_policy_limits(&self, request: &SubscribeRequest) -> Result<(), ServiceError> {
        let limits = self.policies.policies().limits;
        if limits.auto_subscription_creation == Some(false)
            && request.durable
            && !self.subscription_names().contains(&request.subscription)
        {
            return Err(ServiceError::new(
                ServerError::SubscriptionNotFound,
                "Subscription does not exist",
            ));
        }
        if let Some(max) = limits.consumers_max
            && self.subscriptions.consumer_count() >= max
        {
            return Err(ServiceError::new(
                ServerError::ConsumerBusy,
                format!("Topic reached max consumers limit ({max})"),
            ));
        }
        if let Some(max) = limits.subscriptions_max
            && request.durable
        {
            let names = self.subscription_names();
            if !names.contains(&request.subscription) && names.len() >= max {
                return Err(ServiceError::new(
                    ServerError::NotAllowedError,
                    format!(
                        "Exceed the maximum number of subscriptions of the topic: {}",
                        self.full_name
                    ),
                ));
            }
        }
        if let Some(max) = limits.consumers_per_subscription_max {
            let attached = self
                .subscriptions
                .stats()
                .await
                .into_iter()
                .find(|s| s.name == request.subscription)
                .map_or(0, |s| s.consumers.len());
            if attached >= max {
                return Err(ServiceError::new(
                    ServerError::ConsumerBusy,
                    format!("Subscription reached max consumers limit ({max})"),
                ));
            }
        }
        Ok(())
    }

    /// Terminates the topic (Pulsar's `terminate`): the log takes no more
    /// entries, also after a restart (its record says so); producers are
    /// closed (they come back and are refused with TopicTerminatedError);
    /// consumers that acknowledged everything are told they reached the
    /// end. Returns the position of the last entry. Idempotent.
    ///
    /// Producers are closed before the log refuses appends, so a client
    /// sees CLOSE_PRODUCER before any SEND_ERROR of a refused append (both
    /// go through its connection's one outbound queue): the Go client drops
    /// a producer on SEND_ERROR TopicTerminatedError without failing its
    /// pending sends, but fails them with ErrTopicTerminated when the
    /// producer it re-attaches after CLOSE_PRODUCER is refused. Meanwhile
    /// producers are refused retriably (`terminating`).
    pub(crate) async fn terminate(&self) -> Result<Option<vela_log::Position>, ServiceError> {
        self.terminating.store(true, Ordering::Release);
        self.producers.disconnect_all();
        let last = match self.log.terminate().await {
            Ok(last) => last,
            Err(error) => {
                if !self.log.is_terminated() {
                    self.terminating.store(false, Ordering::Release);
                }
                return Err(error.into());
            }
        };
        debug_assert!(self.log.is_terminated());
        // One admitted just before `terminating` was set.
        self.producers.disconnect_all();
        self.subscriptions.topic_terminated().await;
        tracing::info!(topic = %self.full_name, ?last, "topic terminated");
        Ok(last)
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
        if let Some((buffer, acks)) = self.txn.as_deref() {
            buffer.delete().await;
            if let Err(error) = acks.delete_all().await {
                tracing::warn!(topic = %self.full_name, %error, "pending acknowledgement records not deleted");
            }
        }
        if let Err(error) = self.compaction().delete().await {
            tracing::warn!(topic = %self.full_name, %error, "compacted data not deleted");
        }
        self.log.delete().await
    }

    /// Its compaction state (made at the first call).
    pub(crate) fn compaction(&self) -> &Arc<Compaction> {
        self.compaction.get(&self.name)
    }

    /// Compacts the topic in the background (admin trigger, size threshold).
    /// Fails at once when a compaction is already running.
    pub(crate) fn start_compaction(&self) -> Result<(), crate::compaction::CompactionError> {
        let compaction = Arc::clone(self.compaction());
        compaction.begin()?;
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
        self.producers.close_all();
        self.subscriptions.shut_down_all().await;
    }

    /// Drops a subscription and its cursor (admin unsubscribe): its consumers
    /// get CLOSE_CONSUMER.
    pub(crate) async fn unsubscribe(&self, subscription: &str) -> Result<bool, ServiceError> {
        if let Some(handle) = self.subscriptions.handle(subscription) {
            let (reply, answer) = oneshot::channel();
            let command = SubCommand::Unsubscribe {
                key: (0, 0),
                force: true,
                reply,
            };
            if handle.tx.send(command).await.is_ok() {
                answer.await.unwrap_or(Ok(()))?;
                self.subscription_deleted(subscription).await;
                return Ok(true);
            }
        }
        if self.log.cursor_names().iter().any(|n| n == subscription) {
            self.log.delete_cursor(subscription).await?;
            self.subscription_deleted(subscription).await;
            return Ok(true);
        }
        Ok(false)
    }

    /// A durable subscription was deleted (admin or a client's
    /// UNSUBSCRIBE): the acknowledgements its transactions held go with it
    /// (memory and records), and it is no longer replicated here. As in
    /// Pulsar, the other clusters keep their subscription of that name (an
    /// update from one of them makes it here again).
    pub(crate) async fn subscription_deleted(&self, subscription: &str) {
        self.replicated.forget(subscription);
        if let Some((_, acks)) = self.txn.as_deref()
            && let Err(error) = acks.drop_subscription(subscription).await
        {
            tracing::warn!(topic = %self.full_name, subscription, %error, "pending acknowledgement records not deleted");
        }
    }

    /// Names of the durable subscriptions (cursors) and the readers now.
    pub(crate) fn subscription_names(&self) -> Vec<String> {
        let mut names = self.log.cursor_names();
        names.retain(|name| !name.starts_with(REPLICATOR_PREFIX));
        names.extend(self.subscriptions.names());
        names.sort();
        names.dedup();
        names
    }
}

/// A buffer failure as the client hears it.
fn buffer_error(error: BufferError) -> ServiceError {
    use vela_wire::proto::ServerError;
    let code = match &error {
        BufferError::Full { .. } | BufferError::Ended(..) | BufferError::Malformed => {
            ServerError::NotAllowedError
        }
        BufferError::Log(log) => return ServiceError::from(log.clone()),
        BufferError::Meta(_) => ServerError::MetadataError,
        BufferError::Corrupt(_) => ServerError::UnknownError,
    };
    ServiceError::new(code, error.to_string())
}

#[cfg(test)]
mod size_tests {
    use super::*;

    /// A served topic's own struct is part of an idle topic's fixed cost
    /// (ARCHITECTURE.md, "Memory model"; 1,672 bytes before its rate and
    /// transaction parts were boxed, ~1,370 before its resolved policies
    /// were shared and its dedup table boxed, 688 after, 664 once its
    /// compaction and replicators' dedup were made on first use): its parts' sizes,
    /// printed for the next cut. A field that grows it past the bound belongs behind a
    /// `Box` or an `Option<Box<_>>`.
    #[test]
    fn a_served_topic_holds_little() {
        let sizes = [
            ("Topic", std::mem::size_of::<Topic>()),
            ("TopicName", std::mem::size_of::<TopicName>()),
            ("Publisher", std::mem::size_of::<Publisher>()),
            ("DedupTable", std::mem::size_of::<DedupTable>()),
            ("ProducerTable", std::mem::size_of::<ProducerTable>()),
            (
                "SubscriptionTable",
                std::mem::size_of::<SubscriptionTable>(),
            ),
            ("PolicyState", std::mem::size_of::<PolicyState>()),
            ("TopicPolicies", std::mem::size_of::<TopicPolicies>()),
            ("RateMeter<4>", std::mem::size_of::<Mutex<RateMeter<4>>>()),
            (
                "policy_rate",
                std::mem::size_of::<Mutex<Option<Box<PublishThrottle>>>>(),
            ),
            (
                "repl_dedup",
                std::mem::size_of::<std::sync::OnceLock<Box<ReplDedup>>>(),
            ),
            ("compaction", std::mem::size_of::<TopicCompaction>()),
            (
                "txn",
                std::mem::size_of::<Option<Box<(Arc<TxnBuffer>, PendingAcks)>>>(),
            ),
        ];
        eprintln!("{sizes:?}");
        assert!(sizes[0].1 <= 688, "{sizes:?}");
    }
}
