//! A topic's replicated subscriptions (SUBSCRIBE with
//! `replicate_subscription_state`) and, for each, the snapshots it has
//! read, as Pulsar's `ReplicatedSubscriptionSnapshotCache`: a snapshot
//! (marker `SNAPSHOT`, written by `replication::snapshots`) ties a
//! position of this log to a position of each remote cluster's; once the
//! subscription's mark-delete position reaches a snapshot's local
//! position, the remote positions are where the same subscription may
//! stand in each remote cluster.
//!
//! Owns: [`ReplicatedSubscriptions`] (and [`ReplicatedStatusError`]), one
//! per topic, restored from the cursors' marks at load, shared by the
//! topic, its subscription tasks (which add the snapshots they read,
//! `TxnView`) and the topic's snapshot controller (which asks which
//! snapshot a mark-delete position reached).
//! Bounds: `SNAPSHOTS_PER_SUBSCRIPTION_MAX` snapshots per subscription
//! (the oldest goes first), `REPLICATED_SUBSCRIPTIONS_MAX` subscriptions.
//! Never: moves a cursor, writes a marker, or holds its lock across an
//! await. The replicated flag is also kept on the subscription's cursor
//! (`REPLICATED_SUBSCRIPTION_PROPERTY`, written by `topic::replicated`,
//! read back when the topic loads), so it outlives a restart with no
//! consumer; clients send it again with every SUBSCRIBE, and an update
//! from a remote marks the subscription it moves.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use vela_log::{LogError, ManagedLog, Position};

/// Snapshots kept per replicated subscription (Pulsar's
/// `replicatedSubscriptionsSnapshotMaxCachedPerSubscription`, 10). When
/// full, the oldest is dropped: a subscription then reaches the next one.
pub(crate) const SNAPSHOTS_PER_SUBSCRIPTION_MAX: usize = 10;

/// The cursor property that marks a subscription replicated (Pulsar's
/// `PersistentSubscription.REPLICATED_SUBSCRIPTION_PROPERTY`, value 1).
pub(crate) const REPLICATED_SUBSCRIPTION_PROPERTY: &str = "pulsar.replicated.subscription";

/// Replicated subscriptions per topic (a topic's subscriptions are bounded
/// by the same number, `SUBSCRIPTIONS_PER_TOPIC_MAX`). When reached: a
/// further one is served, not replicated (logged).
pub(crate) const REPLICATED_SUBSCRIPTIONS_MAX: usize = 10_000;

/// Remote cluster → position in its log.
pub(crate) type RemotePositions = Vec<(String, Position)>;

/// Why a subscription's replicated status could not be read or set.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ReplicatedStatusError {
    /// No subscription of that name on the topic.
    #[error("Subscription {subscription} not found for topic {topic}")]
    NotFound {
        /// The subscription asked for.
        subscription: String,
        /// The topic.
        topic: String,
    },
    /// A reader (non-durable): nothing to keep the status on.
    #[error("Cannot enable/disable replicated subscriptions on non-durable subscriptions")]
    NotDurable,
    /// `REPLICATED_SUBSCRIPTIONS_MAX` others are replicated.
    #[error("{0} subscriptions of this topic are replicated (REPLICATED_SUBSCRIPTIONS_MAX)")]
    Limit(usize),
    /// The cursor could not be written (Pulsar answers 500 with its
    /// message).
    #[error("Failed to update cursor properties: {0}")]
    Persist(LogError),
}

#[derive(Debug, Default)]
struct Cache {
    /// Local position → the remotes' positions: the snapshots the
    /// subscription's task read (near where it reads).
    snapshots: BTreeMap<Position, RemotePositions>,
    /// The same, as the controller completed them (at the log's head): what
    /// a subscription without consumers, which reads nothing, reaches
    /// when its cursor is moved. Apart, so they never push out what a
    /// lagging reader noted.
    completed: BTreeMap<Position, RemotePositions>,
}

/// Adds a snapshot to `snapshots`, dropping the oldest past
/// `SNAPSHOTS_PER_SUBSCRIPTION_MAX`.
fn keep(
    snapshots: &mut BTreeMap<Position, RemotePositions>,
    local: Position,
    remotes: RemotePositions,
) {
    snapshots.insert(local, remotes);
    while snapshots.len() > SNAPSHOTS_PER_SUBSCRIPTION_MAX {
        snapshots.pop_first();
    }
}

/// Takes out every snapshot at or before `mark_delete`: the newest of them.
fn take_reached(
    snapshots: &mut BTreeMap<Position, RemotePositions>,
    mark_delete: Position,
) -> Option<(Position, RemotePositions)> {
    let mut reached = None;
    while let Some(entry) = snapshots.first_entry() {
        if *entry.key() > mark_delete {
            break;
        }
        reached = Some(entry.remove_entry());
    }
    reached
}

/// The replicated subscriptions of one topic and their snapshots.
#[derive(Debug, Default)]
pub(crate) struct ReplicatedSubscriptions {
    subscriptions: Mutex<HashMap<String, Cache>>,
}

impl ReplicatedSubscriptions {
    /// Marks `name` as replicated (idempotent); false when
    /// `REPLICATED_SUBSCRIPTIONS_MAX` others are.
    pub(crate) fn mark(&self, name: &str) -> bool {
        let mut subscriptions = self.subscriptions.lock();
        if subscriptions.contains_key(name) {
            return true;
        }
        if subscriptions.len() >= REPLICATED_SUBSCRIPTIONS_MAX {
            return false;
        }
        subscriptions.insert(name.to_string(), Cache::default());
        true
    }

    /// Marks replicated the subscriptions whose cursor says so (at topic
    /// load: every cursor of the log is open by then; replicators' cursors
    /// never carry the mark).
    pub(crate) fn restore(&self, log: &ManagedLog) {
        for name in log.cursor_names() {
            let marked = log
                .cursor(&name)
                .and_then(|cursor| cursor.property(REPLICATED_SUBSCRIPTION_PROPERTY));
            if marked == Some(1) && !self.mark(&name) {
                tracing::warn!(log = log.name(), subscription = %name,
                    "REPLICATED_SUBSCRIPTIONS_MAX reached: subscription not replicated");
            }
        }
    }

    /// Forgets `name` (unsubscribed).
    pub(crate) fn forget(&self, name: &str) {
        self.subscriptions.lock().remove(name);
    }

    /// True if `name` is replicated.
    pub(crate) fn is_replicated(&self, name: &str) -> bool {
        self.subscriptions.lock().contains_key(name)
    }

    /// True if the topic has a replicated subscription.
    pub(crate) fn any(&self) -> bool {
        !self.subscriptions.lock().is_empty()
    }

    /// Names of the replicated subscriptions.
    pub(crate) fn names(&self) -> Vec<String> {
        self.subscriptions.lock().keys().cloned().collect()
    }

    /// Subscription `name` read a snapshot (ignored unless replicated).
    pub(crate) fn snapshot_read(&self, name: &str, local: Position, remotes: RemotePositions) {
        let mut subscriptions = self.subscriptions.lock();
        let Some(cache) = subscriptions.get_mut(name) else {
            return;
        };
        keep(&mut cache.snapshots, local, remotes);
    }

    /// The controller completed a snapshot: every replicated subscription
    /// may reach it, read or not.
    pub(crate) fn snapshot_completed(&self, local: Position, remotes: &RemotePositions) {
        for cache in self.subscriptions.lock().values_mut() {
            keep(&mut cache.completed, local, remotes.clone());
        }
    }

    /// The mark-delete position of `name` is `mark_delete`: the newest
    /// snapshot at or before it, if one was read since the last call
    /// (taken out with every older one, so each is answered once).
    pub(crate) fn reached(&self, name: &str, mark_delete: Position) -> Option<RemotePositions> {
        let mut subscriptions = self.subscriptions.lock();
        let cache = subscriptions.get_mut(name)?;
        let read = take_reached(&mut cache.snapshots, mark_delete);
        let completed = take_reached(&mut cache.completed, mark_delete);
        // The newer of the two (by local position).
        match (read, completed) {
            (Some(a), Some(b)) => Some(if a.0 >= b.0 { a.1 } else { b.1 }),
            (a, b) => a.or(b).map(|(_, remotes)| remotes),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn remote(entry: u64) -> RemotePositions {
        vec![("b".to_string(), Position::new(9, entry))]
    }

    #[test]
    fn the_newest_snapshot_a_mark_delete_passed_is_answered_once() {
        let subs = ReplicatedSubscriptions::default();
        subs.snapshot_read("s", Position::new(1, 5), remote(5));
        assert!(
            subs.reached("s", Position::new(1, 9)).is_none(),
            "not replicated"
        );
        assert!(subs.mark("s"));
        assert!(subs.any() && subs.is_replicated("s"));
        for entry in [5, 10, 15] {
            subs.snapshot_read("s", Position::new(1, entry), remote(entry));
        }
        assert_eq!(subs.reached("s", Position::new(1, 4)), None);
        assert_eq!(subs.reached("s", Position::new(1, 12)), Some(remote(10)));
        assert_eq!(subs.reached("s", Position::new(1, 12)), None);
        assert_eq!(subs.reached("s", Position::new(2, 0)), Some(remote(15)));
        subs.forget("s");
        assert!(!subs.any());
    }

    #[test]
    fn completed_snapshots_reach_a_subscription_that_reads_none() {
        let subs = ReplicatedSubscriptions::default();
        assert!(subs.mark("idle") && subs.mark("reading"));
        for entry in 0..(SNAPSHOTS_PER_SUBSCRIPTION_MAX as u64 + 3) {
            subs.snapshot_completed(Position::new(2, entry), &remote(100 + entry));
        }
        // A lagging reader's own snapshots are not pushed out by them.
        subs.snapshot_read("reading", Position::new(1, 7), remote(7));
        assert_eq!(
            subs.reached("reading", Position::new(1, 9)),
            Some(remote(7))
        );
        // The oldest completed ones went; the newest passed is answered.
        assert_eq!(subs.reached("idle", Position::new(2, 2)), None);
        assert_eq!(subs.reached("idle", Position::new(2, 5)), Some(remote(105)));
        assert_eq!(subs.reached("idle", Position::new(2, 5)), None);
        // Read and completed both passed: the newer wins.
        subs.snapshot_read("reading", Position::new(2, 20), remote(20));
        subs.snapshot_completed(Position::new(2, 30), &remote(30));
        assert_eq!(
            subs.reached("reading", Position::new(3, 0)),
            Some(remote(30))
        );
        subs.snapshot_read("reading", Position::new(4, 9), remote(49));
        subs.snapshot_completed(Position::new(4, 1), &remote(41));
        assert_eq!(
            subs.reached("reading", Position::new(5, 0)),
            Some(remote(49))
        );
    }

    #[test]
    fn the_cache_keeps_the_newest_snapshots() {
        let subs = ReplicatedSubscriptions::default();
        assert!(subs.mark("s"));
        for entry in 0..(SNAPSHOTS_PER_SUBSCRIPTION_MAX as u64 + 5) {
            subs.snapshot_read("s", Position::new(1, entry), remote(entry));
        }
        let cache_len = subs.subscriptions.lock()["s"].snapshots.len();
        assert_eq!(cache_len, SNAPSHOTS_PER_SUBSCRIPTION_MAX);
        assert_eq!(subs.reached("s", Position::new(1, 4)), None, "dropped");
    }
}
