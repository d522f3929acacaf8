//! A subscription: its acknowledgement state, its consumers and the dispatcher
//! that feeds them, run as one task (an actor) per subscription.
//!
//! Module map:
//! - `command`: the task's interface (`SubCommand`, `ConsumerInfo`,
//!   `ConnEvent`, `SubscriptionHandle`, `SubscriptionSpec`);
//! - `dispatcher`: the task (`spawn`): its command loop and the dispatch of
//!   entries to consumers;
//! - `consumers`: who may take what (subscription type, active consumer,
//!   round robin, Key_Shared selector and fences, permits);
//! - `acks`: what is acknowledged (the durable cursor, or a reader's
//!   in-memory state);
//! - `redelivery`: what is out to consumers (`pending`) and what is to be
//!   sent again (`replay`), with redelivery counts;
//! - `delayed`: delayed delivery;
//! - `held`: the broker-wide count of entries subscriptions hold (out,
//!   to replay, delayed) and its bound;
//! - `policy`: the topic's policies a running subscription reads (delayed
//!   delivery, unacknowledged limits, dispatch rates);
//! - `reader`: where entries are read from (the log, or the compacted view)
//!   and the read position;
//! - `read_ahead`: entries read ahead and the read in flight, within the
//!   broker-wide read-ahead budget;
//! - `read_pool`: the lower-priority threads catch-up reads run on;
//! - `seek`: finding positions by message id or publish time;
//! - `txn_view`: what the task skips or waits for in the log: the topic's
//!   transaction buffer (read limit, markers and aborted entries) and
//!   replicated-subscription markers (snapshots noted in `snapshots`);
//! - `snapshots`: the topic's replicated subscriptions and the snapshots
//!   each has read (shared with the topic and its snapshot controller).
//!
//! Dependencies point down that list; this module only re-exports.  A
//! transaction's pending acks are the topic's (`topic::pending_acks`): the
//! task applies them when their transaction commits (`TxnCommitted`). `consumers` (who may
//! take an entry) is shared with non-persistent subscriptions.
//!
//! Owns: which consumer gets which entry (Exclusive, Failover, Shared,
//! Key_Shared), flow-control permits, the entries delivered but not acked,
//! the entries to send again, redelivery counts, seek, unsubscribe. The
//! durable state (mark-delete position, individual and batch acks) lives in
//! the log's `Cursor`; readers (non-durable) keep it in memory.
//! Never: touches a connection other than through its outbound queue, or
//! holds more entries than its named bounds.

mod acks;
mod command;
mod consumers;
mod delayed;
mod dispatcher;
mod held;
mod policy;
mod read_ahead;
mod read_pool;
mod reader;
mod redelivery;
mod seek;
mod snapshots;
mod txn_view;

pub(crate) use command::{
    ConnEvent, ConsumerInfo, ConsumerKey, ConsumerStatsSnapshot, SeekTarget, SubCommand,
    SubscriptionHandle, SubscriptionSpec, key_of,
};
pub(crate) use consumers::{Consumers, Route};
pub(crate) use delayed::now_ms;
pub(crate) use dispatcher::spawn;
pub(crate) use held::HeldEntries;
pub(crate) use policy::{DispatchPolicy, DispatchRates, limiter as dispatch_limiter};
pub(crate) use read_ahead::SubscriptionReads;
pub(crate) use read_pool::{READ_NICE_MAX, ReadPool};
pub(crate) use reader::READ_BATCH_ENTRIES_MAX;
pub(crate) use seek::{first_published_at_or_after, resolve_seek};
pub(crate) use snapshots::{
    REPLICATED_SUBSCRIPTION_PROPERTY, REPLICATED_SUBSCRIPTIONS_MAX, RemotePositions,
    ReplicatedStatusError, ReplicatedSubscriptions,
};
