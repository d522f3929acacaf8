//! The subscriptions of a topic: the map from name to running subscription
//! task, creating a subscription on first SUBSCRIBE (its cursor, its task),
//! the topic-wide consumer count, and asking a running task to do something
//! for an admin request.
//!
//! Owns: [`SubscriptionTable`] and [`ConsumerSlot`]. Locks: `create` (an
//! async mutex, held across opening a cursor and spawning a task, so two
//! SUBSCRIBEs cannot create one subscription twice) is taken before `map`
//! (a short mutex, never held across an await). Guarantees: at most
//! `SUBSCRIPTIONS_PER_TOPIC_MAX` subscriptions and `TopicLimits::
//! consumers_max` consumers; a task that ends removes its own entry, never
//! a newer one of the same name (generations).
//! Never: dispatches or acknowledges (the subscription tasks do).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use parking_lot::Mutex;
use tokio::sync::oneshot;
use vela_log::small_map::SmallMap;
use vela_log::{CursorStart, ManagedLog, Position};
use vela_wire::proto::{ServerError, command_subscribe::SubType};

use crate::compaction::TopicCompaction;
use crate::error::ServiceError;
use crate::stats::SubscriptionStats;
use crate::subscription::{
    self, ConsumerInfo, SubCommand, SubscriptionHandle, SubscriptionReads, SubscriptionSpec,
};
use crate::subscription::{HeldEntries, ReplicatedSubscriptions};
use crate::topic_name::TopicName;

/// Subscriptions on one topic (each is a task and a cursor). When reached:
/// SUBSCRIBE gets NotAllowedError.
pub(crate) const SUBSCRIPTIONS_PER_TOPIC_MAX: usize = 10_000;

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
    /// `replicate_subscription_state`: the subscription's position follows
    /// to the topic's other clusters (durable subscriptions only).
    pub(crate) replicated: bool,
}

/// A consumer's place in its topic's count (`TopicLimits::consumers_max`):
/// held by the connection as long as it keeps the consumer; dropping it
/// frees the place.
#[derive(Debug)]
pub(crate) struct ConsumerSlot(Arc<AtomicUsize>);

impl ConsumerSlot {
    /// Takes a place in `count` for one more consumer, or ConsumerBusy when
    /// `max` are there.
    pub(crate) fn reserve(
        count: &Arc<AtomicUsize>,
        max: usize,
    ) -> Result<ConsumerSlot, ServiceError> {
        let taken = count.fetch_update(Ordering::AcqRel, Ordering::Acquire, |now| {
            (now < max).then_some(now + 1)
        });
        match taken {
            Ok(_) => Ok(ConsumerSlot(Arc::clone(count))),
            Err(_) => Err(ServiceError::new(
                ServerError::ConsumerBusy,
                format!("Topic reached max consumers limit ({max})"),
            )),
        }
    }
}

impl Drop for ConsumerSlot {
    fn drop(&mut self) {
        let before = self.0.fetch_sub(1, Ordering::AcqRel);
        debug_assert!(before > 0, "a topic's consumer count went below 0");
    }
}

/// A subscription task that ended while asked to do something.
pub(crate) fn subscription_closing() -> ServiceError {
    ServiceError::new(
        ServerError::ServiceNotReady,
        "subscription is closing, retry",
    )
}

#[derive(Debug)]
struct SubEntry {
    handle: SubscriptionHandle,
    generation: u64,
}

/// Entries boxed (a hash map's first allocation, past a few
/// subscriptions, holds four slots of ~90 bytes each inline). A
/// `SmallMap`: a topic with one subscription holds one 32-byte pair, not a
/// hash map's ~150 bytes.
type SubscriptionMap = Mutex<SmallMap<String, Box<SubEntry>>>;

/// The running subscriptions of one topic.
#[derive(Debug)]
pub(crate) struct SubscriptionTable {
    /// Name → running task (durable subscriptions without a task have only
    /// their cursor, in the log).
    map: Arc<SubscriptionMap>,
    /// Serializes the creation of subscriptions; holds the last generation.
    create: tokio::sync::Mutex<u64>,
    /// Consumers attached, over all subscriptions (each holds a `ConsumerSlot`).
    consumer_count: Arc<AtomicUsize>,
    /// `TopicLimits::consumers_max`.
    consumers_max: usize,
    /// `TopicLimits::consumers_per_subscription_max`.
    consumers_per_subscription_max: usize,
    /// The broker's read-ahead budget and read-path stages.
    reads: SubscriptionReads,
    /// The broker-wide count of entries subscriptions hold.
    held: Arc<HeldEntries>,
    /// The topic's transaction buffer (transactions on).
    txn: Option<Arc<crate::txn_buffer::TxnBuffer>>,
    /// The topic's replicated subscriptions.
    replicated: Arc<ReplicatedSubscriptions>,
}

impl SubscriptionTable {
    pub(crate) fn new(
        consumers_max: usize,
        consumers_per_subscription_max: usize,
        reads: SubscriptionReads,
        held: Arc<HeldEntries>,
        txn: Option<Arc<crate::txn_buffer::TxnBuffer>>,
        replicated: Arc<ReplicatedSubscriptions>,
    ) -> SubscriptionTable {
        SubscriptionTable {
            held,
            txn,
            replicated,
            map: Arc::default(),
            create: tokio::sync::Mutex::new(0),
            consumer_count: Arc::new(AtomicUsize::new(0)),
            consumers_max,
            consumers_per_subscription_max,
            reads,
        }
    }

    /// Takes a place for one more consumer, or ConsumerBusy at the limit.
    fn reserve_consumer(&self) -> Result<ConsumerSlot, ServiceError> {
        ConsumerSlot::reserve(&self.consumer_count, self.consumers_max)
    }

    /// Attaches a consumer to the subscription of the topic named
    /// `full_name` (partition index `partition`, −1 if none; its log and
    /// compaction given), creating the subscription when needed. The slot
    /// counts it against `TopicLimits::consumers_max` while held.
    pub(crate) async fn subscribe(
        &self,
        (full_name, partition): (&Arc<str>, i32),
        log: &Arc<ManagedLog>,
        // The topic's compaction (made when a compacted reader comes).
        (compaction, topic): (&TopicCompaction, &TopicName),
        request: &SubscribeRequest,
        info: ConsumerInfo,
        policy: &Arc<crate::subscription::DispatchPolicy>,
    ) -> Result<(SubscriptionHandle, ConsumerSlot), ServiceError> {
        let slot = self.reserve_consumer()?;
        let mut generation = self.create.lock().await;
        let existing = self
            .map
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
                if self.map.lock().len() >= SUBSCRIPTIONS_PER_TOPIC_MAX {
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
                    Some(log.open_cursor(&request.subscription, start).await?)
                } else {
                    None
                };
                *generation += 1;
                let this_generation = *generation;
                let weak: Weak<SubscriptionMap> = Arc::downgrade(&self.map);
                let on_end = Box::new(move |name: &str| {
                    if let Some(map) = weak.upgrade() {
                        let mut subs = map.lock();
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
                        topic: Arc::clone(full_name),
                        partition,
                        log: Arc::clone(log),
                        cursor,
                        reader_start: request.reader_start,
                        sub_type: request.sub_type,
                        sticky: request.sticky,
                        compaction: request
                            .read_compacted
                            .then(|| Arc::clone(compaction.get(topic))),
                        consumers_max: self.consumers_per_subscription_max,
                        policy: Arc::clone(policy),
                        reads: self.reads.clone(),
                        held: Arc::clone(&self.held),
                        txn: self.txn.clone(),
                        replicated: Arc::clone(&self.replicated),
                    },
                    on_end,
                );
                let mut map = self.map.lock();
                map.insert(
                    request.subscription.clone(),
                    Box::new(SubEntry {
                        handle: handle.clone(),
                        generation: this_generation,
                    }),
                );
                debug_assert!(map.len() <= SUBSCRIPTIONS_PER_TOPIC_MAX);
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

    /// The running task of a subscription, if it still runs.
    pub(crate) fn live(&self, name: &str) -> Option<SubscriptionHandle> {
        self.map
            .lock()
            .get(name)
            .map(|e| e.handle.clone())
            .filter(|h| !h.tx.is_closed())
    }

    /// The task of a subscription (even one ending now).
    pub(crate) fn handle(&self, name: &str) -> Option<SubscriptionHandle> {
        self.map.lock().get(name).map(|e| e.handle.clone())
    }

    /// Runs `command` on the subscription's task when one is running.
    /// `None`: no task took it (the caller works on the durable cursor
    /// itself); `Some(None)`: the task ended before answering.
    pub(crate) async fn ask_live<T>(
        &self,
        name: &str,
        command: impl FnOnce(oneshot::Sender<T>) -> SubCommand,
    ) -> Option<Option<T>> {
        let handle = self.live(name)?;
        let (reply, answer) = oneshot::channel();
        handle.tx.send(command(reply)).await.ok()?;
        Some(answer.await.ok())
    }

    /// Consumers attached now, over all subscriptions.
    pub(crate) fn consumer_count(&self) -> usize {
        self.consumer_count.load(Ordering::Acquire)
    }

    /// Names of the subscriptions with a task now.
    pub(crate) fn names(&self) -> Vec<String> {
        self.map.lock().keys().cloned().collect()
    }

    /// Statistics of every running subscription (asks each task once, or
    /// reads a parked one's state).
    pub(crate) async fn stats(&self) -> Vec<SubscriptionStats> {
        let handles: Vec<SubscriptionHandle> =
            self.map.lock().values().map(|e| e.handle.clone()).collect();
        let mut subscriptions = Vec::with_capacity(handles.len());
        for handle in handles {
            // A parked subscription is read where it is: asking its task
            // would start every idle one.
            if let Some(stats) = handle.tx.parked_stats() {
                subscriptions.push(stats);
                continue;
            }
            let (reply, answer) = oneshot::channel();
            if handle.tx.send(SubCommand::SubStats { reply }).await.is_ok()
                && let Ok(stats) = answer.await
            {
                subscriptions.push(stats);
            }
        }
        subscriptions
    }

    /// Tells every running subscription the topic was terminated.
    pub(crate) async fn topic_terminated(&self) {
        let handles: Vec<SubscriptionHandle> =
            self.map.lock().values().map(|e| e.handle.clone()).collect();
        for handle in handles {
            let _ = handle.tx.send(SubCommand::TopicTerminated).await;
        }
    }

    /// Stops every subscription task (their consumers get CLOSE_CONSUMER).
    pub(crate) async fn shut_down_all(&self) {
        let handles: Vec<SubscriptionHandle> =
            self.map.lock().drain().map(|(_, e)| e.handle).collect();
        for handle in handles {
            let (reply, done) = oneshot::channel();
            if handle.tx.send(SubCommand::Shutdown { reply }).await.is_ok() {
                let _ = done.await;
            }
        }
    }
}
