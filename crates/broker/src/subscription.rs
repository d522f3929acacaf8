//! A subscription: its acknowledgement state, its consumers and the dispatcher
//! that feeds them, run as one task (an actor) per subscription.
//!
//! Owns: which consumer gets which entry (Exclusive, Failover, Shared,
//! Key_Shared), flow-control permits, the entries delivered but not acked
//! (`pending`), the entries to send again (`replay`), redelivery counts, seek,
//! unsubscribe. The durable state (mark-delete position, individual and batch
//! acks) lives in the log's `Cursor`; readers (non-durable) keep it in memory.
//!
//! Guarantees: per consumer, entries go out in log order except redeliveries,
//! which go first; on Key_Shared, entries of one hash slot go out in log order
//! (an entry waits in `replay` while an earlier one of its slot waits);
//! nothing is sent to a consumer whose permits are ≤ 0.
//! Delayed delivery (Shared only, as the Java broker's default): an entry
//! whose `deliver_at_time` is in the future waits in `delayed` (in memory; a
//! restart re-reads and re-delays it) and is replayed once due.
//! Never: reads more than `READ_BATCH_ENTRIES_MAX` entries at once, holds more
//! than `UNACKED_ENTRIES_MAX` unacked entries (dispatch pauses instead), or
//! touches a connection other than through its outbound queue.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use vela_log::{Cursor, LogEntry, ManagedLog, Position};
use vela_wire::proto::{
    self, CommandActiveConsumerChange, CommandCloseConsumer, CommandMessage, MessageIdData,
    ServerError, command_ack::AckType, command_subscribe::SubType,
};

use crate::codec::{self, Outbound};
use crate::error::ServiceError;
use crate::key_shared::{self, KeySharedSelector, NONE_KEY};

/// Entries read from the log per read call. 100 entries of 1 KiB batches
/// keeps a read under ~100 KiB while amortizing the read's locking.
pub(crate) const READ_BATCH_ENTRIES_MAX: usize = 100;
/// Bytes per read call (about; at least one entry is returned).
pub(crate) const READ_BATCH_BYTES_MAX: usize = 5 * 1024 * 1024;
/// Entries delivered and not yet acknowledged, per subscription. The Java
/// broker's default is 200k messages; beyond it dispatch pauses until acks arrive.
pub(crate) const UNACKED_ENTRIES_MAX: usize = 100_000;
/// Entries waiting to be sent again. When reached no new entries are read
/// until the replay set drains (it never drops entries).
pub(crate) const REPLAY_ENTRIES_MAX: usize = 100_000;
/// Longest ack_set accepted in an ACK (64 messages per word: batches of up to
/// 65536 messages, far above the clients' 1000-message default). Longer ones
/// are refused, so a client cannot make the cursor keep megabytes per entry.
pub(crate) const ACK_SET_WORDS_MAX: usize = 1024;
/// Pause before dispatching again after a failed log read (a bookie
/// hiccup); the entries stay pending in the replay set or the log.
pub(crate) const READ_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);
/// Delayed entries (deliver_at_time in the future) held per Shared
/// subscription. When reached, no new entries are read until some are due.
pub(crate) const DELAYED_ENTRIES_MAX: usize = 100_000;
/// Commands queued for one subscription task; senders wait when it is full.
pub(crate) const SUBSCRIPTION_COMMANDS_MAX: usize = 1024;

/// A consumer as the connection describes it.
#[derive(Debug, Clone)]
pub(crate) struct ConsumerInfo {
    /// Connection the consumer lives on.
    pub(crate) conn_id: u64,
    /// Client-chosen id, unique on its connection.
    pub(crate) consumer_id: u64,
    /// Consumer name (clients always send one).
    pub(crate) name: String,
    /// Failover priority (lower first).
    pub(crate) priority_level: i32,
    /// The connection's outbound queue.
    pub(crate) out: mpsc::Sender<Outbound>,
    /// Where to tell the connection that the broker closed this consumer.
    pub(crate) events: mpsc::Sender<ConnEvent>,
    /// Negotiated protocol version of the connection.
    pub(crate) protocol_version: i32,
    /// Key_Shared: (sticky, ranges); `None` means AUTO_SPLIT.
    pub(crate) sticky_ranges: Option<Vec<(i32, i32)>>,
    /// Client address for stats.
    pub(crate) address: String,
    /// Consumer epoch from SUBSCRIBE (Java clients, Exclusive/Failover);
    /// stamped on every MESSAGE when set.
    pub(crate) epoch: Option<u64>,
    /// Key_Shared allowOutOfOrderDelivery: no fence when joining.
    pub(crate) allow_out_of_order: bool,
}

/// A consumer is identified by (connection id, consumer id).
pub(crate) type ConsumerKey = (u64, u64);

/// Events the subscription (or topic) sends to a connection.
#[derive(Debug, Clone, Copy)]
pub(crate) enum ConnEvent {
    /// The broker closed this consumer (seek, unsubscribe, topic close).
    ConsumerClosed(u64),
    /// The broker closed this producer (replaced by a newer epoch).
    ProducerClosed(u64),
}

/// Where to seek.
#[derive(Debug, Clone, Copy)]
pub(crate) enum SeekTarget {
    /// A message id: (ledger, entry) as the client sent them (u64, with the
    /// earliest/latest sentinels).
    MessageId {
        /// Ledger.
        ledger_id: u64,
        /// Entry.
        entry_id: u64,
    },
    /// First entry published at or after this time (ms).
    PublishTime(u64),
}

/// A snapshot for CONSUMER_STATS.
#[derive(Debug, Clone, Default)]
pub(crate) struct ConsumerStatsSnapshot {
    /// Permits left.
    pub(crate) available_permits: i64,
    /// Entries delivered to this consumer and not acked.
    pub(crate) unacked_messages: u64,
    /// Backlog of the subscription in entries.
    pub(crate) backlog: u64,
    /// Consumer name.
    pub(crate) name: String,
    /// Address.
    pub(crate) address: String,
}

/// Commands to a subscription task.
#[derive(Debug)]
pub(crate) enum SubCommand {
    /// Attach a consumer.
    Add {
        /// The consumer.
        info: ConsumerInfo,
        /// Subscription type the consumer asked for.
        sub_type: SubType,
        /// Outcome.
        reply: oneshot::Sender<Result<(), ServiceError>>,
    },
    /// Detach a consumer (close or disconnect); its unacked entries are replayed.
    Remove {
        /// Consumer.
        key: ConsumerKey,
        /// Answered once removed (with true if the subscription ended).
        reply: Option<oneshot::Sender<bool>>,
    },
    /// FLOW permits.
    Flow {
        /// Consumer.
        key: ConsumerKey,
        /// Messages the consumer can take.
        permits: u32,
    },
    /// ACK.
    Ack {
        /// Consumer.
        key: ConsumerKey,
        /// Individual or cumulative.
        ack_type: AckType,
        /// Acked ids (with ack_set for batch-index acks).
        ids: Vec<MessageIdData>,
        /// Set when the client wants an ACK_RESPONSE.
        request_id: Option<u64>,
    },
    /// REDELIVER_UNACKNOWLEDGED_MESSAGES (empty ids: all of this consumer's).
    Redeliver {
        /// Consumer.
        key: ConsumerKey,
        /// The client's new consumer epoch (redeliver-all from Java clients).
        epoch: Option<u64>,
        /// Entries to redeliver.
        ids: Vec<MessageIdData>,
    },
    /// SEEK: reset the position and close every consumer.
    Seek {
        /// Where.
        target: SeekTarget,
        /// Outcome (sent after the consumers were closed).
        reply: oneshot::Sender<Result<(), ServiceError>>,
    },
    /// UNSUBSCRIBE.
    Unsubscribe {
        /// Consumer asking.
        key: ConsumerKey,
        /// Unsubscribe even with other consumers attached.
        force: bool,
        /// Outcome.
        reply: oneshot::Sender<Result<(), ServiceError>>,
    },
    /// CONSUMER_STATS.
    Stats {
        /// Consumer.
        key: ConsumerKey,
        /// Snapshot (None if the consumer is unknown).
        reply: oneshot::Sender<Option<ConsumerStatsSnapshot>>,
    },
    /// Subscription statistics (admin API).
    SubStats {
        /// Snapshot.
        reply: oneshot::Sender<crate::stats::SubscriptionStats>,
    },
    /// Admin skip / expire / clear-backlog: acknowledge everything up to
    /// `position` (consumers stay attached; entries out to them at or before
    /// it are forgotten).
    AckUpTo {
        /// Last position acknowledged.
        position: Position,
        /// Count the entries acknowledged as expired (stats).
        expired: bool,
        /// Outcome.
        reply: oneshot::Sender<Result<(), ServiceError>>,
    },
    /// The mark-delete position (GET_LAST_MESSAGE_ID).
    MarkDelete {
        /// Position.
        reply: oneshot::Sender<Option<Position>>,
    },
    /// Close every consumer and stop (topic close / broker shutdown).
    Shutdown {
        /// Answered once stopped.
        reply: oneshot::Sender<()>,
    },
}

/// In-memory acknowledgement state of a non-durable subscription (reader).
#[derive(Debug, Default)]
struct MemoryAcks {
    mark_delete: Option<Position>,
    acked: BTreeSet<Position>,
    batch: BTreeMap<Position, Vec<u64>>,
}

/// Acks bounded like the durable cursor's: beyond this, individual acks above
/// the mark-delete position of a reader are ignored (readers ack cumulatively).
const MEMORY_ACKED_ENTRIES_MAX: usize = 100_000;

enum Acks {
    Durable(Arc<Cursor>),
    Memory(MemoryAcks),
}

impl std::fmt::Debug for Acks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Acks::Durable(c) => write!(f, "Durable({})", c.name()),
            Acks::Memory(m) => write!(f, "Memory({:?})", m.mark_delete),
        }
    }
}

impl Acks {
    fn mark_delete(&self) -> Option<Position> {
        match self {
            Acks::Durable(c) => c.mark_delete_position(),
            Acks::Memory(m) => m.mark_delete,
        }
    }

    fn is_acked(&self, p: Position) -> bool {
        match self {
            Acks::Durable(c) => c.is_acked(p),
            Acks::Memory(m) => Some(p) <= m.mark_delete || m.acked.contains(&p),
        }
    }

    fn batch_state(&self, p: Position) -> Option<Vec<u64>> {
        match self {
            Acks::Durable(c) => c.batch_ack_state(p),
            Acks::Memory(m) => m.batch.get(&p).cloned(),
        }
    }

    fn ack(&mut self, log: &ManagedLog, ps: &[Position]) -> Result<(), vela_log::LogError> {
        match self {
            Acks::Durable(c) => c.ack(ps),
            Acks::Memory(m) => {
                for p in ps {
                    if Some(*p) > m.mark_delete && m.acked.len() < MEMORY_ACKED_ENTRIES_MAX {
                        m.acked.insert(*p);
                        m.batch.remove(p);
                    }
                }
                m.advance(log);
                Ok(())
            }
        }
    }

    fn ack_cumulative(&mut self, log: &ManagedLog, p: Position) -> Result<(), vela_log::LogError> {
        match self {
            Acks::Durable(c) => c.ack_cumulative(p),
            Acks::Memory(m) => {
                if Some(p) > m.mark_delete {
                    m.mark_delete = Some(p);
                    let above = Position::new(p.ledger_id, p.entry_id.saturating_add(1));
                    m.acked = m.acked.split_off(&above);
                    m.batch = m.batch.split_off(&above);
                    m.advance(log);
                }
                Ok(())
            }
        }
    }

    fn ack_batch(
        &mut self,
        log: &ManagedLog,
        p: Position,
        set: &[u64],
    ) -> Result<(), vela_log::LogError> {
        match self {
            Acks::Durable(c) => c.ack_batch_indexes(p, set),
            Acks::Memory(m) => {
                if Some(p) <= m.mark_delete || m.acked.contains(&p) {
                    return Ok(());
                }
                let merged: Vec<u64> = match m.batch.get(&p) {
                    Some(old) => old
                        .iter()
                        .zip(set.iter().chain(std::iter::repeat(&0)))
                        .map(|(a, b)| a & b)
                        .collect(),
                    None => set.to_vec(),
                };
                if merged.iter().all(|w| *w == 0) {
                    m.batch.remove(&p);
                    return self.ack(log, &[p]);
                }
                if m.batch.len() < MEMORY_ACKED_ENTRIES_MAX {
                    m.batch.insert(p, merged);
                }
                Ok(())
            }
        }
    }

    async fn reset(&mut self, log: &ManagedLog, next: Position) -> Result<(), vela_log::LogError> {
        match self {
            Acks::Durable(c) => c.reset(next).await,
            Acks::Memory(m) => {
                m.mark_delete = log.previous_position(next);
                m.acked.clear();
                m.batch.clear();
                Ok(())
            }
        }
    }

    fn backlog(&self, log: &ManagedLog) -> u64 {
        match self {
            Acks::Durable(c) => c.backlog_entries(),
            Acks::Memory(m) => match log.last_confirmed() {
                Some(last) => log
                    .entries_between(m.mark_delete, last)
                    .saturating_sub(m.acked.len() as u64),
                None => 0,
            },
        }
    }
}

impl MemoryAcks {
    fn advance(&mut self, log: &ManagedLog) {
        while let Some(first) = self.acked.first().copied() {
            let next = match self.mark_delete {
                Some(md) => log.next_position(md),
                None => match log.first_position() {
                    Some(p) => p,
                    None => return,
                },
            };
            if first != next {
                return;
            }
            self.acked.remove(&first);
            self.mark_delete = Some(first);
        }
    }
}

#[derive(Debug)]
struct Slot {
    info: ConsumerInfo,
    /// Current consumer epoch (raised by redeliver-all).
    epoch: Option<u64>,
    /// Key_Shared: a consumer that joined while entries were out gets no
    /// entry at or after this position until every earlier entry is acked
    /// (the Java broker's "recently joined consumers"), so a key moving to it
    /// cannot overtake its own earlier messages.
    fence: Option<Position>,
    permits: i64,
    unacked: u64,
    msg_out: u64,
}

#[derive(Debug, Clone, Copy)]
struct PendingEntry {
    owner: ConsumerKey,
    /// Key_Shared hash slot (0 otherwise), kept so a replayed entry still
    /// blocks later entries of its key.
    slot: u32,
}

/// Handle to a running subscription task.
#[derive(Debug, Clone)]
pub(crate) struct SubscriptionHandle {
    /// Subscription name.
    pub(crate) name: String,
    /// False for readers.
    pub(crate) durable: bool,
    /// Commands.
    pub(crate) tx: mpsc::Sender<SubCommand>,
}

/// Everything needed to start a subscription task.
#[derive(Debug)]
pub(crate) struct SubscriptionSpec {
    /// Subscription name.
    pub(crate) name: String,
    /// Full topic name (for logs).
    pub(crate) topic: String,
    /// Partition index for message ids (−1 if not a partition).
    pub(crate) partition: i32,
    /// The topic's log.
    pub(crate) log: Arc<ManagedLog>,
    /// Durable cursor, or `None` for a reader starting at `reader_start`.
    pub(crate) cursor: Option<Arc<Cursor>>,
    /// Reader: the first position to deliver (None = after the last entry).
    pub(crate) reader_start: Option<Position>,
    /// The type fixed by the first consumer.
    pub(crate) sub_type: SubType,
    /// Key_Shared STICKY mode.
    pub(crate) sticky: bool,
    /// `read_compacted`: read the compacted view up to its horizon.
    pub(crate) compaction: Option<Arc<crate::compaction::Compaction>>,
    /// Consumers attached at most (`TopicLimits::consumers_per_subscription_max`,
    /// itself at most `config::CONSUMERS_PER_SUBSCRIPTION_MAX`: Key_Shared
    /// AUTO_SPLIT can split the 65536 slots at most ~16 times deep per range,
    /// and 10k consumers is far beyond any real subscription). When reached:
    /// SUBSCRIBE gets ConsumerBusy.
    pub(crate) consumers_max: usize,
}

/// Starts a subscription task. `on_end` runs when it stops by itself
/// (reader without consumers, unsubscribe).
pub(crate) fn spawn(
    spec: SubscriptionSpec,
    on_end: Box<dyn FnOnce(&str) + Send>,
) -> SubscriptionHandle {
    let (tx, rx) = mpsc::channel(SUBSCRIPTION_COMMANDS_MAX);
    let durable = spec.cursor.is_some();
    let handle = SubscriptionHandle {
        name: spec.name.clone(),
        durable,
        tx,
    };
    let read_position = match (&spec.cursor, spec.reader_start) {
        (Some(cursor), _) => match cursor.mark_delete_position() {
            // Compacted reads may sit in trimmed ledgers: the read finds
            // the next compacted entry.
            Some(md) if spec.compaction.is_some() => Position::new(md.ledger_id, md.entry_id + 1),
            Some(md) => spec.log.next_position(md),
            None => Position::new(0, 0),
        },
        (None, Some(start)) => start,
        (None, None) => match spec.log.last_confirmed() {
            Some(last) => spec.log.next_position(last),
            None => Position::new(0, 0),
        },
    };
    let acks = match spec.cursor {
        Some(cursor) => Acks::Durable(cursor),
        None => {
            let mark_delete = spec.log.previous_position(read_position);
            Acks::Memory(MemoryAcks {
                mark_delete,
                ..MemoryAcks::default()
            })
        }
    };
    let selector = match spec.sub_type {
        SubType::KeyShared if spec.sticky => Some(KeySharedSelector::sticky()),
        SubType::KeyShared => Some(KeySharedSelector::auto_split()),
        _ => None,
    };
    let dispatcher = Dispatcher {
        name: spec.name,
        topic: spec.topic,
        partition: spec.partition,
        log: spec.log,
        acks,
        durable,
        sub_type: spec.sub_type,
        consumers: Vec::new(),
        consumers_max: spec
            .consumers_max
            .min(crate::config::CONSUMERS_PER_SUBSCRIPTION_MAX),
        read_position,
        replay: BTreeMap::new(),
        pending: BTreeMap::new(),
        redelivery: HashMap::new(),
        selector,
        round_robin: 0,
        active: None,
        caught_up: false,
        msg_out: 0,
        bytes_out: 0,
        redelivered: 0,
        delayed: BTreeSet::new(),
        read_retry_at: None,
        expired: 0,
        rates: crate::stats::RateMeter::new([0; 3]),
        compaction: spec.compaction,
        compacted_horizon: None,
    };
    tokio::spawn(dispatcher.run(rx, on_end));
    handle
}

struct Dispatcher {
    name: String,
    topic: String,
    partition: i32,
    log: Arc<ManagedLog>,
    acks: Acks,
    durable: bool,
    sub_type: SubType,
    consumers: Vec<Slot>,
    consumers_max: usize,
    /// Next position to read new entries from.
    read_position: Position,
    /// Entries to send again → their Key_Shared slot (0 otherwise).
    replay: BTreeMap<Position, u32>,
    pending: BTreeMap<Position, PendingEntry>,
    redelivery: HashMap<Position, u32>,
    selector: Option<KeySharedSelector>,
    round_robin: usize,
    active: Option<ConsumerKey>,
    caught_up: bool,
    msg_out: u64,
    bytes_out: u64,
    redelivered: u64,
    /// Shared: entries whose deliver_at_time is in the future, by due time.
    delayed: BTreeSet<(u64, Position)>,
    /// When to dispatch again after a failed log read.
    read_retry_at: Option<tokio::time::Instant>,
    /// Entries acknowledged by message expiry.
    expired: u64,
    /// msg_out, bytes_out, redelivered → rates.
    rates: crate::stats::RateMeter<3>,
    /// `read_compacted`: the topic's compaction (its view is read up to its
    /// horizon instead of the log).
    compaction: Option<Arc<crate::compaction::Compaction>>,
    /// Horizon of the compacted view last read (positions at or before it
    /// follow the compacted ledger, whose ledgers may be trimmed).
    compacted_horizon: Option<Position>,
}

enum Route {
    Deliver(usize),
    /// Key_Shared: the entry's consumer cannot take it now; keep it in replay.
    Hold,
    /// Nobody can take anything now: stop this pass.
    Stop,
}

impl Dispatcher {
    async fn run(
        mut self,
        mut rx: mpsc::Receiver<SubCommand>,
        on_end: Box<dyn FnOnce(&str) + Send>,
    ) {
        tracing::debug!(topic = %self.topic, subscription = %self.name, "subscription started");
        loop {
            let waiting = self.caught_up && self.total_permits() > 0;
            let read_position = self.read_position;
            let log = Arc::clone(&self.log);
            let next_due = self.delayed.first().map(|(due_ms, _)| *due_ms);
            let delay = next_due.map_or(std::time::Duration::ZERO, |due_ms| {
                std::time::Duration::from_millis(due_ms.saturating_sub(now_ms()))
            });
            let retry_at = self.read_retry_at.unwrap_or_else(tokio::time::Instant::now);
            let command = tokio::select! {
                command = rx.recv() => match command {
                    Some(command) => Some(command),
                    None => break,
                },
                _ = log.wait_for_entry_at(read_position), if waiting => None,
                _ = tokio::time::sleep(delay), if next_due.is_some() => None,
                _ = tokio::time::sleep_until(retry_at), if self.read_retry_at.is_some() => {
                    self.read_retry_at = None;
                    None
                }
            };
            if self.log.is_closed() {
                // The topic's log closed or failed: consumers reconnect (to a
                // reopened topic) after CLOSE_CONSUMER.
                tracing::info!(topic = %self.topic, subscription = %self.name, "log closed: closing consumers");
                if let Some(SubCommand::Shutdown { reply }) = command {
                    let _ = reply.send(());
                }
                self.close_all_consumers(None).await;
                break;
            }
            match command {
                Some(command) => {
                    if let Flow::Stop = self.handle(command).await {
                        break;
                    }
                }
                None => self.caught_up = false,
            }
            self.dispatch().await;
        }
        tracing::debug!(topic = %self.topic, subscription = %self.name, "subscription stopped");
        on_end(&self.name);
    }

    async fn handle(&mut self, command: SubCommand) -> Flow {
        match command {
            SubCommand::Add {
                info,
                sub_type,
                reply,
            } => {
                let result = self.add_consumer(info, sub_type).await;
                let _ = reply.send(result);
            }
            SubCommand::Remove { key, reply } => {
                self.remove_consumer(key).await;
                let ended = !self.durable && self.consumers.is_empty();
                if let Some(reply) = reply {
                    let _ = reply.send(ended);
                }
                if ended {
                    return Flow::Stop;
                }
            }
            SubCommand::Flow { key, permits } => {
                if let Some(slot) = self.slot_mut(key) {
                    slot.permits = slot.permits.saturating_add(i64::from(permits));
                    self.caught_up = false;
                }
            }
            SubCommand::Ack {
                key,
                ack_type,
                ids,
                request_id,
            } => self.ack(key, ack_type, ids, request_id).await,
            SubCommand::Redeliver { key, ids, epoch } => self.redeliver(key, &ids, epoch),
            SubCommand::Seek { target, reply } => {
                let result = self.seek(target).await;
                let _ = reply.send(result);
            }
            SubCommand::Unsubscribe { key, force, reply } => {
                let others = self.consumers.iter().any(|s| key_of(&s.info) != key);
                if others && !force {
                    let _ = reply.send(Err(ServiceError::new(
                        ServerError::UnknownError,
                        "subscription has other active consumers",
                    )));
                    return Flow::Continue;
                }
                if let Acks::Durable(_) = self.acks
                    && let Err(e) = self.log.delete_cursor(&self.name).await
                {
                    let _ = reply.send(Err(e.into()));
                    return Flow::Continue;
                }
                self.close_all_consumers(Some(key)).await;
                let _ = reply.send(Ok(()));
                return Flow::Stop;
            }
            SubCommand::Stats { key, reply } => {
                let backlog = self.acks.backlog(&self.log);
                let snapshot = self.slot(key).map(|s| ConsumerStatsSnapshot {
                    available_permits: s.permits,
                    unacked_messages: s.unacked,
                    backlog,
                    name: s.info.name.clone(),
                    address: s.info.address.clone(),
                });
                let _ = reply.send(snapshot);
            }
            SubCommand::SubStats { reply } => {
                let _ = reply.send(self.stats());
            }
            SubCommand::AckUpTo {
                position,
                expired,
                reply,
            } => {
                let result = self.ack_up_to(position, expired);
                let _ = reply.send(result);
            }
            SubCommand::MarkDelete { reply } => {
                let _ = reply.send(self.acks.mark_delete());
            }
            SubCommand::Shutdown { reply } => {
                self.close_all_consumers(None).await;
                let _ = reply.send(());
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    /// Acknowledges everything up to `position` (admin skip/expire).
    fn ack_up_to(&mut self, position: Position, expired: bool) -> Result<(), ServiceError> {
        let backlog_before = self.acks.backlog(&self.log);
        self.acks
            .ack_cumulative(&self.log, position)
            .map_err(ServiceError::from)?;
        let done: Vec<Position> = self.pending.range(..=position).map(|(p, _)| *p).collect();
        for p in done {
            self.forget(p);
        }
        let above = Position::new(position.ledger_id, position.entry_id.saturating_add(1));
        self.replay = self.replay.split_off(&above);
        self.delayed.retain(|(_, p)| *p > position);
        self.redelivery.retain(|p, _| *p > position);
        if self.read_position <= position {
            self.read_position = self.next_after(position);
        }
        if expired {
            let backlog_after = self.acks.backlog(&self.log);
            self.expired += backlog_before.saturating_sub(backlog_after);
        }
        self.caught_up = false;
        Ok(())
    }

    fn stats(&mut self) -> crate::stats::SubscriptionStats {
        let [msg_rate_out, msg_throughput_out, msg_rate_redeliver] = self.rates.rates(
            std::time::Instant::now(),
            [self.msg_out, self.bytes_out, self.redelivered],
        );
        let sub_type = match self.sub_type {
            SubType::Exclusive => "Exclusive",
            SubType::Shared => "Shared",
            SubType::Failover => "Failover",
            SubType::KeyShared => "Key_Shared",
        };
        crate::stats::SubscriptionStats {
            name: self.name.clone(),
            sub_type: sub_type.to_string(),
            durable: self.durable,
            msg_backlog: self.acks.backlog(&self.log),
            unacked_messages: self.pending.len() as u64,
            msg_out_counter: self.msg_out,
            bytes_out_counter: self.bytes_out,
            msg_redeliver_counter: self.redelivered,
            msg_rate_out,
            msg_throughput_out,
            msg_rate_redeliver,
            msg_expired_counter: self.expired,
            mark_delete: self.acks.mark_delete(),
            read_position: Some(self.read_position),
            consumers: self
                .consumers
                .iter()
                .map(|slot| crate::stats::ConsumerStats {
                    consumer_name: slot.info.name.clone(),
                    available_permits: slot.permits,
                    unacked_messages: slot.unacked,
                    msg_out_counter: slot.msg_out,
                    address: slot.info.address.clone(),
                })
                .collect(),
        }
    }

    fn slot(&self, key: ConsumerKey) -> Option<&Slot> {
        self.consumers.iter().find(|s| key_of(&s.info) == key)
    }

    fn slot_mut(&mut self, key: ConsumerKey) -> Option<&mut Slot> {
        self.consumers.iter_mut().find(|s| key_of(&s.info) == key)
    }

    fn total_permits(&self) -> i64 {
        self.consumers
            .iter()
            .fold(0i64, |sum, s| sum.saturating_add(s.permits.max(0)))
    }

    async fn add_consumer(
        &mut self,
        info: ConsumerInfo,
        sub_type: SubType,
    ) -> Result<(), ServiceError> {
        if self.consumers.is_empty() {
            // No consumer attached: the new one decides the type (and the
            // Key_Shared mode), as in the Java broker.
            self.sub_type = sub_type;
            self.active = None;
            self.selector = match (sub_type, info.sticky_ranges.is_some()) {
                (SubType::KeyShared, true) => Some(KeySharedSelector::sticky()),
                (SubType::KeyShared, false) => Some(KeySharedSelector::auto_split()),
                _ => None,
            };
        }
        if sub_type != self.sub_type {
            return Err(ServiceError::new(
                ServerError::ConsumerBusy,
                format!(
                    "subscription {} is of type {:?}, not {:?}",
                    self.name, self.sub_type, sub_type
                ),
            ));
        }
        if self.sub_type == SubType::Exclusive && !self.consumers.is_empty() {
            return Err(ServiceError::new(
                ServerError::ConsumerBusy,
                "Exclusive consumer is already connected",
            ));
        }
        if self.consumers.len() >= self.consumers_max {
            return Err(ServiceError::new(
                ServerError::ConsumerBusy,
                format!(
                    "Subscription reached max consumers limit ({})",
                    self.consumers_max
                ),
            ));
        }
        let key = key_of(&info);
        if self.slot(key).is_some() {
            return Err(ServiceError::new(
                ServerError::ConsumerBusy,
                "consumer id already attached",
            ));
        }
        if let Some(selector) = &mut self.selector {
            match (&info.sticky_ranges, selector.is_sticky()) {
                (Some(ranges), true) => selector.add(key_hash(key), ranges),
                (None, false) => selector.add(key_hash(key), &[]),
                _ => Err(key_shared::AssignError::ModeMismatch),
            }
            .map_err(|e| ServiceError::new(ServerError::ConsumerAssignError, e.to_string()))?;
        }
        let fence = (self.sub_type == SubType::KeyShared
            && !info.allow_out_of_order
            && (!self.pending.is_empty() || !self.replay.is_empty()))
        .then_some(self.read_position);
        self.consumers.push(Slot {
            epoch: info.epoch,
            info,
            fence,
            permits: 0,
            unacked: 0,
            msg_out: 0,
        });
        if self.sub_type == SubType::Failover || self.sub_type == SubType::Exclusive {
            self.pick_active().await;
        }
        Ok(())
    }

    async fn remove_consumer(&mut self, key: ConsumerKey) {
        let Some(index) = self.consumers.iter().position(|s| key_of(&s.info) == key) else {
            return;
        };
        self.consumers.remove(index);
        if let Some(selector) = &mut self.selector {
            selector.remove(key_hash(key));
        }
        // Every entry it had not acked goes back to the replay set.
        let owned: Vec<(Position, u32)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.owner == key)
            .map(|(pos, p)| (*pos, p.slot))
            .collect();
        for (pos, slot) in owned {
            self.pending.remove(&pos);
            self.replay.insert(pos, slot);
        }
        if self.sub_type == SubType::Failover || self.sub_type == SubType::Exclusive {
            self.pick_active().await;
        }
    }

    /// Failover/Exclusive: consumers sorted by (priority, name); the active
    /// one is the first, or for a partition `partition % count` among the
    /// highest-priority ones (as the Java broker spreads partitions).
    async fn pick_active(&mut self) {
        let mut order: Vec<&Slot> = self.consumers.iter().collect();
        order.sort_by(|a, b| {
            (a.info.priority_level, &a.info.name).cmp(&(b.info.priority_level, &b.info.name))
        });
        let top_priority = order.first().map(|s| s.info.priority_level);
        order.retain(|s| Some(s.info.priority_level) == top_priority);
        let best = if order.is_empty() {
            None
        } else {
            let index = usize::try_from(self.partition).map_or(0, |p| p % order.len());
            Some(key_of(&order[index].info))
        };
        let changed = best != self.active;
        if changed && let Some(old) = self.active {
            // Entries the old active consumer had not acked go to the new one.
            let owned: Vec<(Position, u32)> = self
                .pending
                .iter()
                .filter(|(_, p)| p.owner == old)
                .map(|(pos, p)| (*pos, p.slot))
                .collect();
            for (pos, slot) in owned {
                self.pending.remove(&pos);
                self.replay.insert(pos, slot);
            }
        }
        self.active = best;
        if self.sub_type != SubType::Failover {
            return;
        }
        // Tell every consumer (clients ≥ v12) whether it is active.
        for slot in &self.consumers {
            if slot.info.protocol_version < 12 {
                continue;
            }
            let is_active = Some(key_of(&slot.info)) == self.active;
            let frame = codec::encode_command(CommandActiveConsumerChange {
                consumer_id: slot.info.consumer_id,
                is_active: Some(is_active),
            });
            let _ = slot.info.out.send(frame).await;
        }
    }

    /// The entry at `pos`: `Ok(None)` when it no longer exists (trimmed),
    /// `Err` on a read failure (the caller retries later).
    async fn read_one(&mut self, pos: Position) -> Result<Option<LogEntry>, ()> {
        match self.read_entries(pos, 1).await {
            Ok(mut entries) if !entries.is_empty() && entries[0].position == pos => {
                Ok(Some(entries.swap_remove(0)))
            }
            Ok(_) => Ok(None),
            Err(e) => {
                tracing::warn!(topic = %self.topic, subscription = %self.name, error = %e, "read failed");
                self.schedule_read_retry();
                Err(())
            }
        }
    }

    /// Entries at or after `from`, as this subscription sees the topic: with
    /// `read_compacted`, the compacted view up to its horizon, then the log.
    async fn read_entries(
        &mut self,
        from: Position,
        entries_max: usize,
    ) -> Result<Vec<LogEntry>, String> {
        let mut from = from;
        if let Some(compaction) = &self.compaction {
            let view = compaction.view().await.map_err(|e| e.to_string())?;
            self.compacted_horizon = view.as_ref().map(|v| v.horizon());
            if let Some(view) = view
                && from <= view.horizon()
            {
                let entries = view
                    .read(compaction.ledgers().as_ref(), from, entries_max)
                    .await
                    .map_err(|e| e.to_string())?;
                if !entries.is_empty() {
                    return Ok(entries);
                }
                from = self.log.next_position(view.horizon());
            }
        }
        self.log
            .read(from, entries_max, READ_BATCH_BYTES_MAX)
            .await
            .map_err(|e| e.to_string())
    }

    /// The position after `pos` in this subscription's view of the topic.
    fn next_after(&self, pos: Position) -> Position {
        match self.compacted_horizon {
            // Inside the compacted range the next compacted entry is found
            // by the read; the log's ledgers there may be gone.
            Some(horizon) if pos < horizon => Position::new(pos.ledger_id, pos.entry_id + 1),
            _ => self.log.next_position(pos),
        }
    }

    /// After a failed read: dispatch again after `READ_RETRY_DELAY` (a
    /// subscription must not stall until the next client command).
    fn schedule_read_retry(&mut self) {
        self.read_retry_at = Some(tokio::time::Instant::now() + READ_RETRY_DELAY);
    }

    async fn ack(
        &mut self,
        key: ConsumerKey,
        ack_type: AckType,
        ids: Vec<MessageIdData>,
        request_id: Option<u64>,
    ) {
        let mut error: Option<String> = None;
        let cumulative = ack_type == AckType::Cumulative;
        if cumulative && matches!(self.sub_type, SubType::Shared | SubType::KeyShared) {
            error =
                Some("cumulative ack is not allowed on Shared and Key_Shared subscriptions".into());
        } else {
            let last = self.log.last_confirmed();
            for id in &ids {
                let pos = Position::new(id.ledger_id, id.entry_id);
                if last.is_none_or(|last| pos > last) {
                    // As the Java cursor: never mark beyond the last entry
                    // (it would silently ack messages not yet published).
                    error = Some(format!("ack of {pos}, beyond the last entry"));
                    continue;
                }
                if id.ack_set.len() > ACK_SET_WORDS_MAX {
                    error = Some(format!("ack_set of {} words is too long", id.ack_set.len()));
                    continue;
                }
                let ack_set: Vec<u64> = id.ack_set.iter().map(|w| *w as u64).collect();
                let result = if cumulative {
                    if ack_set.is_empty() {
                        self.acks.ack_cumulative(&self.log, pos)
                    } else {
                        let before = self.log.previous_position(pos);
                        let r = match before {
                            Some(b) => self.acks.ack_cumulative(&self.log, b),
                            None => Ok(()),
                        };
                        r.and_then(|()| self.acks.ack_batch(&self.log, pos, &ack_set))
                    }
                } else if ack_set.is_empty() {
                    self.acks.ack(&self.log, &[pos])
                } else {
                    self.acks.ack_batch(&self.log, pos, &ack_set)
                };
                if let Err(e) = result {
                    error = Some(e.to_string());
                }
                if cumulative {
                    let done: Vec<Position> = self.pending.range(..=pos).map(|(p, _)| *p).collect();
                    for p in done {
                        if self.acks.is_acked(p) {
                            self.forget(p);
                        }
                    }
                    let replayed: Vec<Position> =
                        self.replay.range(..=pos).map(|(p, _)| *p).collect();
                    for p in replayed {
                        if self.acks.is_acked(p) {
                            self.replay.remove(&p);
                        }
                    }
                } else if self.acks.is_acked(pos) {
                    self.forget(pos);
                    self.replay.remove(&pos);
                }
            }
        }
        if let Some(message) = &error {
            tracing::info!(topic = %self.topic, subscription = %self.name, error = %message, "ack refused");
        }
        let Some(request_id) = request_id else { return };
        let Some(slot) = self.slot(key) else { return };
        // ACK_RESPONSE exists since v17; older clients never set request_id.
        if slot.info.protocol_version < 17 {
            return;
        }
        let response = proto::CommandAckResponse {
            consumer_id: key.1,
            txnid_least_bits: None,
            txnid_most_bits: None,
            error: error.as_ref().map(|_| ServerError::NotAllowedError as i32),
            message: error,
            request_id: Some(request_id),
        };
        let _ = slot.info.out.send(codec::encode_command(response)).await;
    }

    fn forget(&mut self, pos: Position) {
        if let Some(entry) = self.pending.remove(&pos)
            && let Some(slot) = self.slot_mut(entry.owner)
        {
            slot.unacked = slot.unacked.saturating_sub(1);
        }
        self.redelivery.remove(&pos);
    }

    fn redeliver(&mut self, key: ConsumerKey, ids: &[MessageIdData], epoch: Option<u64>) {
        if ids.is_empty()
            && let Some(epoch) = epoch
            && let Some(slot) = self.slot_mut(key)
        {
            // Entries stamped with an older epoch are dropped by the client;
            // they are all in `pending` and come again below.
            slot.epoch = Some(slot.epoch.map_or(epoch, |e| e.max(epoch)));
        }
        let positions: Vec<Position> = if ids.is_empty() {
            self.pending
                .iter()
                .filter(|(_, p)| p.owner == key)
                .map(|(pos, _)| *pos)
                .collect()
        } else {
            ids.iter()
                .map(|id| Position::new(id.ledger_id, id.entry_id))
                .filter(|pos| self.pending.get(pos).is_some_and(|p| p.owner == key))
                .collect()
        };
        for pos in positions {
            let hash_slot = self.pending.remove(&pos).map_or(u32::MAX, |p| p.slot);
            if let Some(slot) = self.slot_mut(key) {
                slot.unacked = slot.unacked.saturating_sub(1);
            }
            self.redelivered += 1;
            let count = self.redelivery.entry(pos).or_insert(0);
            *count = count.saturating_add(1);
            self.replay.insert(pos, hash_slot);
        }
        self.caught_up = false;
    }

    async fn seek(&mut self, target: SeekTarget) -> Result<(), ServiceError> {
        let next = resolve_seek(&self.log, target).await?;
        // As the Java broker: disconnect the consumers, then reset.
        self.close_all_consumers(None).await;
        self.acks
            .reset(&self.log, next)
            .await
            .map_err(ServiceError::from)?;
        self.pending.clear();
        self.replay.clear();
        self.redelivery.clear();
        self.delayed.clear();
        self.read_position = next;
        self.caught_up = false;
        tracing::info!(topic = %self.topic, subscription = %self.name, position = %next, "seek");
        Ok(())
    }

    async fn close_all_consumers(&mut self, except_reply_for: Option<ConsumerKey>) {
        let slots = std::mem::take(&mut self.consumers);
        for slot in &slots {
            let key = key_of(&slot.info);
            if let Some(selector) = &mut self.selector {
                selector.remove(key_hash(key));
            }
            let _ = slot
                .info
                .events
                .send(ConnEvent::ConsumerClosed(slot.info.consumer_id))
                .await;
            if Some(key) == except_reply_for {
                // The unsubscribing consumer gets SUCCESS, not CLOSE_CONSUMER.
                continue;
            }
            let frame = codec::encode_command(CommandCloseConsumer {
                consumer_id: slot.info.consumer_id,
                request_id: u64::MAX,
                assigned_broker_service_url: None,
                assigned_broker_service_url_tls: None,
            });
            let _ = slot.info.out.send(frame).await;
        }
        for (pos, pending) in std::mem::take(&mut self.pending) {
            self.replay.insert(pos, pending.slot);
        }
        self.active = None;
    }

    /// Sends entries while some consumer has permits.
    async fn dispatch(&mut self) {
        self.release_due();
        if self.consumers.is_empty() {
            return;
        }
        self.lift_fences();
        loop {
            if self.total_permits() <= 0 {
                return;
            }
            let mut progressed = false;
            if !self.replay.is_empty() {
                progressed |= self.dispatch_replay().await;
            }
            if self.total_permits() <= 0
                || self.pending.len() >= UNACKED_ENTRIES_MAX
                || self.replay.len() >= REPLAY_ENTRIES_MAX
                || self.delayed.len() >= DELAYED_ENTRIES_MAX
            {
                return;
            }
            let wanted = (self.total_permits() as usize).clamp(1, READ_BATCH_ENTRIES_MAX);
            let entries = match self.read_entries(self.read_position, wanted).await {
                Ok(entries) => entries,
                Err(e) => {
                    tracing::warn!(topic = %self.topic, subscription = %self.name, error = %e, "read failed");
                    self.caught_up = false;
                    self.schedule_read_retry();
                    return;
                }
            };
            if entries.is_empty() {
                self.caught_up = true;
                if progressed && !self.replay.is_empty() {
                    // A replay pass takes at most READ_BATCH_ENTRIES_MAX
                    // entries: go on with the rest now, as nothing else may
                    // wake this subscription (the log is caught up).
                    continue;
                }
                return;
            }
            let mut stuck_slots: HashSet<u32> = self.replay.values().copied().collect();
            for entry in entries {
                let pos = entry.position;
                if self.acks.is_acked(pos)
                    || self.pending.contains_key(&pos)
                    || self.replay.contains_key(&pos)
                {
                    self.read_position = self.next_after(pos);
                    progressed = true;
                    continue;
                }
                if self.sub_type == SubType::Shared
                    && let Some(due_ms) = codec::entry_deliver_at_ms(&entry.data)
                    && due_ms > now_ms()
                {
                    // Delayed delivery: held until due, then replayed.
                    self.delayed.insert((due_ms, pos));
                    self.read_position = self.next_after(pos);
                    progressed = true;
                    continue;
                }
                let slot = entry_slot_if(&self.selector, &entry);
                if self.selector.is_some() && stuck_slots.contains(&slot) {
                    // An earlier entry of this key slot waits: keep order.
                    self.replay.insert(pos, slot);
                    self.read_position = self.next_after(pos);
                    progressed = true;
                    continue;
                }
                match self.route(slot, pos, &HashSet::new()) {
                    Route::Deliver(index) => {
                        self.deliver(index, entry, slot).await;
                    }
                    Route::Hold => {
                        stuck_slots.insert(slot);
                        self.replay.insert(pos, slot);
                    }
                    Route::Stop => return,
                }
                self.read_position = self.next_after(pos);
                progressed = true;
            }
            if !progressed {
                return;
            }
        }
    }

    /// Moves delayed entries that are due into the replay set.
    fn release_due(&mut self) {
        let now = now_ms();
        while let Some(&(due_ms, pos)) = self.delayed.first() {
            if due_ms > now {
                return;
            }
            self.delayed.pop_first();
            self.replay.insert(pos, u32::MAX);
            self.caught_up = false;
        }
    }

    /// Key_Shared: a fence lifts once no entry before it is out or waiting.
    fn lift_fences(&mut self) {
        for index in 0..self.consumers.len() {
            let Some(fence) = self.consumers[index].fence else {
                continue;
            };
            let earlier_out = self.pending.range(..fence).next().is_some()
                || self.replay.range(..fence).next().is_some();
            if !earlier_out {
                self.consumers[index].fence = None;
            }
        }
    }

    /// Sends replay entries (in position order) to consumers that can take
    /// them; true if anything was sent or dropped.
    async fn dispatch_replay(&mut self) -> bool {
        let mut progressed = false;
        let mut stuck_slots: HashSet<u32> = HashSet::new();
        let mut stuck_consumers: HashSet<usize> = HashSet::new();
        let positions: Vec<(Position, u32)> = self
            .replay
            .iter()
            .take(READ_BATCH_ENTRIES_MAX)
            .map(|(p, s)| (*p, *s))
            .collect();
        for (pos, _) in positions {
            if self.total_permits() <= 0 {
                break;
            }
            if self.acks.is_acked(pos) {
                self.replay.remove(&pos);
                progressed = true;
                continue;
            }
            let entry = match self.read_one(pos).await {
                Ok(Some(entry)) => entry,
                Ok(None) => {
                    self.replay.remove(&pos);
                    progressed = true;
                    continue;
                }
                Err(()) => break,
            };
            let slot = entry_slot_if(&self.selector, &entry);
            self.replay.insert(pos, slot);
            if self.selector.is_some() && stuck_slots.contains(&slot) {
                continue;
            }
            match self.route(slot, pos, &stuck_consumers) {
                Route::Deliver(index) => {
                    self.replay.remove(&pos);
                    self.deliver(index, entry, slot).await;
                    progressed = true;
                }
                Route::Hold => {
                    stuck_slots.insert(slot);
                    if let Some(index) = self.selected_index(slot) {
                        stuck_consumers.insert(index);
                    }
                }
                Route::Stop => break,
            }
        }
        progressed
    }

    fn selected_index(&self, slot: u32) -> Option<usize> {
        let selector = self.selector.as_ref()?;
        let owner = selector.select(slot % key_shared::HASH_RANGE_SIZE)?;
        self.consumers
            .iter()
            .position(|s| key_hash(key_of(&s.info)) == owner)
    }

    fn route(&mut self, slot: u32, pos: Position, stuck: &HashSet<usize>) -> Route {
        match self.sub_type {
            SubType::Exclusive | SubType::Failover => {
                let Some(active) = self.active else {
                    return Route::Stop;
                };
                match self
                    .consumers
                    .iter()
                    .position(|s| key_of(&s.info) == active)
                {
                    Some(index) if self.consumers[index].permits > 0 => Route::Deliver(index),
                    _ => Route::Stop,
                }
            }
            SubType::Shared => {
                // Round robin among the consumers with permits of the best
                // (lowest) priority level, as the Java broker.
                let Some(level) = self
                    .consumers
                    .iter()
                    .filter(|c| c.permits > 0)
                    .map(|c| c.info.priority_level)
                    .min()
                else {
                    return Route::Stop;
                };
                let n = self.consumers.len();
                for step in 0..n {
                    let index = (self.round_robin + step) % n;
                    let candidate = &self.consumers[index];
                    if candidate.permits > 0 && candidate.info.priority_level == level {
                        self.round_robin = (index + 1) % n;
                        return Route::Deliver(index);
                    }
                }
                Route::Stop
            }
            SubType::KeyShared => match self.selected_index(slot) {
                Some(index)
                    if self.consumers[index].permits > 0
                        && !stuck.contains(&index)
                        && self.consumers[index].fence.is_none_or(|fence| pos < fence) =>
                {
                    Route::Deliver(index)
                }
                _ => Route::Hold,
            },
        }
    }

    async fn deliver(&mut self, index: usize, entry: LogEntry, hash_slot: u32) {
        let pos = entry.position;
        let messages = codec::entry_message_count(&entry.data);
        let redelivery_count = self.redelivery.get(&pos).copied().unwrap_or(0);
        let ack_set: Vec<i64> = self
            .acks
            .batch_state(pos)
            .map(|words| words.iter().map(|w| *w as i64).collect())
            .unwrap_or_default();
        let slot = &mut self.consumers[index];
        let message = CommandMessage {
            consumer_id: slot.info.consumer_id,
            message_id: MessageIdData {
                ledger_id: pos.ledger_id,
                entry_id: pos.entry_id,
                partition: Some(self.partition),
                ..MessageIdData::default()
            },
            redelivery_count: (redelivery_count > 0).then_some(redelivery_count),
            ack_set,
            consumer_epoch: slot.epoch,
        };
        slot.permits -= i64::from(messages);
        slot.unacked += 1;
        slot.msg_out += u64::from(messages);
        let key = key_of(&slot.info);
        let entry_bytes = entry.data.len();
        let frame = codec::encode_message(message, entry.data);
        if slot.info.out.send(frame).await.is_err() {
            // The connection is gone; its cleanup will remove the consumer.
            slot.permits = 0;
            self.replay.insert(pos, hash_slot);
            return;
        }
        self.pending.insert(
            pos,
            PendingEntry {
                owner: key,
                slot: hash_slot,
            },
        );
        self.msg_out += u64::from(messages);
        self.bytes_out += entry_bytes as u64;
    }
}

enum Flow {
    Continue,
    Stop,
}

/// Wall-clock time in ms (deliver_at_time is the producer's wall clock).
/// The next position to deliver after a seek to `target`, clamped to the
/// entries the log holds (never past the end: a reset there would count
/// future entries as acknowledged).
pub(crate) async fn resolve_seek(
    log: &ManagedLog,
    target: SeekTarget,
) -> Result<Position, ServiceError> {
    let next = match target {
        SeekTarget::MessageId {
            ledger_id,
            entry_id,
        } => {
            let earliest = ledger_id == u64::MAX && entry_id == u64::MAX;
            let latest = ledger_id == i64::MAX as u64 && entry_id == i64::MAX as u64;
            if earliest {
                Position::new(0, 0)
            } else if latest {
                match log.last_confirmed() {
                    Some(last) => log.next_position(last),
                    None => Position::new(0, 0),
                }
            } else {
                Position::new(ledger_id, entry_id)
            }
        }
        SeekTarget::PublishTime(time_ms) => first_published_at_or_after(log, time_ms)
            .await
            .map_err(ServiceError::from)?,
    };
    let next = match log.first_position() {
        Some(first) if next < first => first,
        _ => next,
    };
    let end = log
        .last_confirmed()
        .map_or(Position::new(0, 0), |last| log.next_position(last));
    Ok(next.min(end))
}

/// First position whose entry was published at or after `time_ms`, or the
/// position after the last entry when none is. A binary search over the
/// log's entries (Pulsar's message finder does the same): publish times are
/// taken as non-decreasing in log order, which holds per producer; it reads
/// about log2(entries) single entries.
pub(crate) async fn first_published_at_or_after(
    log: &ManagedLog,
    time_ms: u64,
) -> Result<Position, vela_log::LogError> {
    let Some(last) = log.last_confirmed() else {
        return Ok(Position::new(0, 0));
    };
    let end = log.next_position(last);
    let total = log.entries_between(None, last);
    // Invariant: entries before index `low` are older; from `high` on, newer.
    let (mut low, mut high) = (0u64, total);
    while low < high {
        let middle = low + (high - low) / 2;
        let Some(position) = log.position_after(None, middle + 1) else {
            high = middle;
            continue;
        };
        let entries = log.read(position, 1, 1).await?;
        let published = entries
            .first()
            .map_or(u64::MAX, |e| codec::entry_publish_time_ms(&e.data));
        if published >= time_ms {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Ok(log.position_after(None, low + 1).unwrap_or(end))
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

fn key_of(info: &ConsumerInfo) -> ConsumerKey {
    (info.conn_id, info.consumer_id)
}

/// Selector key of a consumer: a stable 64-bit mix of (connection, consumer).
fn key_hash(key: ConsumerKey) -> u64 {
    key.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ key.1
}

fn entry_slot_if(selector: &Option<KeySharedSelector>, entry: &LogEntry) -> u32 {
    if selector.is_some() {
        entry_slot(entry)
    } else {
        0
    }
}

/// Key_Shared slot of an entry: ordering_key, else partition_key (base64
/// decoded when flagged), else "NONE_KEY" (Java's `peekStickyKey`).
fn entry_slot(entry: &LogEntry) -> u32 {
    let Some(metadata) = codec::entry_metadata(&entry.data) else {
        return key_shared::slot_of(NONE_KEY);
    };
    if let Some(key) = metadata.ordering_key.as_ref() {
        return key_shared::slot_of(key);
    }
    if let Some(key) = metadata.partition_key.as_ref() {
        if metadata.partition_key_b64_encoded == Some(true)
            && let Some(decoded) = base64_decode(key)
        {
            return key_shared::slot_of(&decoded);
        }
        return key_shared::slot_of(key.as_bytes());
    }
    key_shared::slot_of(NONE_KEY)
}

/// Standard base64 (with padding) decoder; `None` on bad input.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    fn value(c: u8) -> Option<u32> {
        match c {
            b'A'..=b'Z' => Some(u32::from(c - b'A')),
            b'a'..=b'z' => Some(u32::from(c - b'a') + 26),
            b'0'..=b'9' => Some(u32::from(c - b'0') + 52),
            b'+' => Some(62),
            b'/' => Some(63),
            _ => None,
        }
    }
    let bytes: Vec<u8> = text.bytes().filter(|b| *b != b'=').collect();
    let mut out = Vec::with_capacity(bytes.len() * 3 / 4);
    for chunk in bytes.chunks(4) {
        let mut acc: u32 = 0;
        for (i, c) in chunk.iter().enumerate() {
            acc |= value(*c)? << (18 - 6 * i);
        }
        let produced = match chunk.len() {
            4 => 3,
            3 => 2,
            2 => 1,
            _ => return None,
        };
        for i in 0..produced {
            out.push((acc >> (16 - 8 * i)) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn base64_decodes() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(base64_decode("YWJj").unwrap(), b"abc");
        assert!(base64_decode("a").is_none());
        assert!(base64_decode("!!!!").is_none());
    }
}
