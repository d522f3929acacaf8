//! A topic's replicated subscriptions (SUBSCRIBE with
//! `replicate_subscription_state`) and, for each, the snapshots it has
//! read, as Pulsar's `ReplicatedSubscriptionSnapshotCache`: a snapshot
//! (marker `SNAPSHOT`, written by `replication::snapshots`) ties a
//! position of this log to a position of each remote cluster's; once the
//! subscription's mark-delete position reaches a snapshot's local
//! position, the remote positions are where the same subscription may
//! stand in each remote cluster.
//!
//! Owns: [`ReplicatedSubscriptions`], one per topic, shared by the
//! topic, its subscription tasks (which add the snapshots they read,
//! `TxnView`) and the topic's snapshot controller (which asks which
//! snapshot a mark-delete position reached).
//! Bounds: `SNAPSHOTS_PER_SUBSCRIPTION_MAX` snapshots per subscription
//! (the oldest goes first), `REPLICATED_SUBSCRIPTIONS_MAX` subscriptions.
//! Never: moves a cursor, writes a marker, or holds its lock across an
//! await. The replicated flag lives while the topic is served: clients
//! send it again with every SUBSCRIBE, and an update from a remote marks
//! the subscription it moves.

use std::collections::{BTreeMap, HashMap};

use parking_lot::Mutex;
use vela_log::Position;

/// Snapshots kept per replicated subscription (Pulsar's
/// `replicatedSubscriptionsSnapshotMaxCachedPerSubscription`, 10). When
/// full, the oldest is dropped: a subscription then reaches the next one.
pub(crate) const SNAPSHOTS_PER_SUBSCRIPTION_MAX: usize = 10;

/// Replicated subscriptions per topic (a topic's subscriptions are bounded
/// by the same number, `SUBSCRIPTIONS_PER_TOPIC_MAX`). When reached: a
/// further one is served, not replicated (logged).
pub(crate) const REPLICATED_SUBSCRIPTIONS_MAX: usize = 10_000;

/// Remote cluster → position in its log.
pub(crate) type RemotePositions = Vec<(String, Position)>;

#[derive(Debug, Default)]
struct Cache {
    /// Local position → the remotes' positions.
    snapshots: BTreeMap<Position, RemotePositions>,
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
        cache.snapshots.insert(local, remotes);
        while cache.snapshots.len() > SNAPSHOTS_PER_SUBSCRIPTION_MAX {
            cache.snapshots.pop_first();
        }
    }

    /// The mark-delete position of `name` is `mark_delete`: the newest
    /// snapshot at or before it, if one was read since the last call
    /// (taken out with every older one, so each is answered once).
    pub(crate) fn reached(&self, name: &str, mark_delete: Position) -> Option<RemotePositions> {
        let mut subscriptions = self.subscriptions.lock();
        let cache = subscriptions.get_mut(name)?;
        let mut reached = None;
        while let Some(entry) = cache.snapshots.first_entry() {
            if *entry.key() > mark_delete {
                break;
            }
            reached = Some(entry.remove());
        }
        reached
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
