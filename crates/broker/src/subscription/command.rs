//! The interface of a subscription task: the commands connections and the
//! topic send it, and what they describe a consumer with.
//!
//! Owns: [`SubCommand`] and its payloads, [`ConsumerInfo`] (a consumer as
//! its connection describes it), [`ConnEvent`] (what the broker tells a
//! connection it closed), [`SubscriptionHandle`] and [`SubscriptionSpec`].
//! Never: holds subscription state (the dispatcher does).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use vela_log::{Cursor, ManagedLog, Position};
use vela_wire::proto::{MessageIdData, command_ack::AckType, command_subscribe::SubType};

use crate::codec::Outbound;
use crate::compaction::Compaction;
use crate::error::ServiceError;
use crate::stats::SubscriptionStats;

use super::policy::DispatchPolicy;

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
    /// Client address for stats (shared by the connection's consumers).
    pub(crate) address: Arc<str>,
    /// Consumer epoch from SUBSCRIBE (Java clients, Exclusive/Failover);
    /// stamped on every MESSAGE when set.
    pub(crate) epoch: Option<u64>,
    /// Key_Shared allowOutOfOrderDelivery: no fence when joining.
    pub(crate) allow_out_of_order: bool,
    /// SUBSCRIBE's `metadata` (bounded by the connection), for stats.
    pub(crate) metadata: std::collections::BTreeMap<String, String>,
    /// Client version string from CONNECT, for stats (shared as `address`).
    pub(crate) client_version: Arc<str>,
    /// The client understands REACHED_END_OF_TOPIC (see
    /// `connection::session`: not C++/Python nor Go, which close the
    /// connection on it).
    pub(crate) handles_end_of_topic: bool,
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
    /// A transaction's acknowledgements committed: applied as acks
    /// (entries with an ack set: those batch indexes only).
    TxnCommitted {
        positions: Vec<(Position, Vec<u64>)>,
        cumulative: Option<Position>,
        reply: oneshot::Sender<()>,
    },
    /// A transaction's acknowledgements aborted: those entries still out
    /// to consumers are sent again.
    TxnAborted { positions: Vec<Position> },
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
        reply: oneshot::Sender<SubscriptionStats>,
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
    /// The topic was terminated: consumers that have acknowledged
    /// everything are told they reached its end (REACHED_END_OF_TOPIC).
    TopicTerminated,
    /// Close every consumer and stop (topic close / broker shutdown).
    Shutdown {
        /// Answered once stopped.
        reply: oneshot::Sender<()>,
    },
}

/// Handle to a running subscription task.
#[derive(Debug, Clone)]
pub(crate) struct SubscriptionHandle {
    /// Subscription name.
    pub(crate) name: String,
    /// False for readers.
    pub(crate) durable: bool,
    /// Commands.
    pub(crate) tx: CommandSender,
}

/// The sending side of a subscription's commands: a `vela_mailbox` (an idle
/// one is ~150 bytes, where a tokio channel's first block and padded state
/// were ~800 per subscription, idle or not). Commands travel boxed: a
/// `SubCommand` is ~150 bytes, and a queue of them moves pointers. The
/// subscription task runs only while it has work (`dispatcher`): a command
/// queued wakes it (queued first, then woken: the hand-off rule of
/// `vela_mailbox::Parking`), and so does the last sender leaving.
#[derive(Debug, Clone)]
pub(crate) struct CommandSender(Arc<SenderInner>);

struct SenderInner {
    tx: vela_mailbox::Sender<Box<SubCommand>>,
    /// Declared after `tx`, so dropped after it: the mailbox sees its last
    /// sender go before a parked task is woken to see that.
    task: WakeOnDrop,
}

impl std::fmt::Debug for SenderInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CommandSender")
            .field("tx", &self.tx)
            .finish()
    }
}

/// The task to wake; woken once more when the last sender goes (a parked
/// task then runs, finds no sender left and ends).
struct WakeOnDrop(Arc<dyn WakeTask>);

impl Drop for WakeOnDrop {
    fn drop(&mut self) {
        Arc::clone(&self.0).wake_task();
    }
}

/// Starts the subscription task if it is parked, or reads its parked
/// state (the dispatcher's `Parking` implements it).
pub(crate) trait WakeTask: Send + Sync {
    /// Called after the work for the task was made visible.
    fn wake_task(self: Arc<Self>);

    /// The statistics of a parked subscription, read without starting a
    /// run (`/metrics` and the lifecycle pass ask every subscription: a
    /// command would wake every idle one); `None` while it runs.
    fn parked_stats(&self) -> Option<SubscriptionStats>;
}

/// The receiving side (the subscription task's).
pub(crate) type CommandReceiver = vela_mailbox::Receiver<Box<SubCommand>>;

/// The subscription task is gone.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct TaskGone;

/// A command mailbox of `SUBSCRIPTION_COMMANDS_MAX` commands (the sender
/// is made with the task's `Parking`: `CommandSender::new`).
pub(crate) fn command_mailbox() -> (vela_mailbox::Sender<Box<SubCommand>>, CommandReceiver) {
    vela_mailbox::mailbox(SUBSCRIPTION_COMMANDS_MAX)
}

impl CommandSender {
    /// The sender of `tx`, waking `task` after each command.
    pub(crate) fn new(
        tx: vela_mailbox::Sender<Box<SubCommand>>,
        task: Arc<dyn WakeTask>,
    ) -> CommandSender {
        CommandSender(Arc::new(SenderInner {
            tx,
            task: WakeOnDrop(task),
        }))
    }

    /// The subscription's statistics if its task is parked (`None`: send
    /// `SubStats`).
    pub(crate) fn parked_stats(&self) -> Option<SubscriptionStats> {
        self.0.task.0.parked_stats()
    }

    /// True once the task ended.
    pub(crate) fn is_closed(&self) -> bool {
        self.0.tx.is_closed()
    }

    /// Queues a command, waiting while the queue is full, then wakes the
    /// task if it is parked.
    pub(crate) async fn send(&self, command: SubCommand) -> Result<(), TaskGone> {
        self.0
            .tx
            .send(Box::new(command))
            .await
            .map_err(|_| TaskGone)?;
        Arc::clone(&self.0.task.0).wake_task();
        Ok(())
    }
}

/// Everything needed to start a subscription task.
#[derive(Debug)]
pub(crate) struct SubscriptionSpec {
    /// Subscription name.
    pub(crate) name: String,
    /// Full topic name (for logs), shared with the topic.
    pub(crate) topic: Arc<str>,
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
    pub(crate) compaction: Option<Arc<Compaction>>,
    /// Consumers attached at most (`TopicLimits::consumers_per_subscription_max`,
    /// itself at most `config::CONSUMERS_PER_SUBSCRIPTION_MAX`: Key_Shared
    /// AUTO_SPLIT can split the 65536 slots at most ~16 times deep per range,
    /// and 10k consumers is far beyond any real subscription). When reached:
    /// SUBSCRIBE gets ConsumerBusy.
    pub(crate) consumers_max: usize,
    /// The broker's read-ahead budget and read-path stages.
    pub(crate) reads: super::read_ahead::SubscriptionReads,
    /// The broker-wide count of entries subscriptions hold.
    pub(crate) held: std::sync::Arc<super::held::HeldEntries>,
    /// The topic's transaction buffer (transactions on): entries are read
    /// up to its read limit, markers and aborted entries are skipped.
    pub(crate) txn: Option<Arc<crate::txn_buffer::TxnBuffer>>,
    /// The topic's replicated subscriptions: replicated-subscription
    /// markers are skipped, and the snapshots this subscription reads are
    /// noted there.
    pub(crate) replicated: Arc<super::snapshots::ReplicatedSubscriptions>,
    /// The topic's dispatch policies, changed while the subscription runs.
    pub(crate) policy: Arc<DispatchPolicy>,
}

/// The key of a consumer.
pub(crate) fn key_of(info: &ConsumerInfo) -> ConsumerKey {
    (info.conn_id, info.consumer_id)
}
