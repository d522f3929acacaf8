//! The entries of a subscription that are out to consumers or waiting to be
//! sent again: `pending` (delivered, not yet acknowledged, with the consumer
//! each went to), `replay` (to send again, before new entries: redelivered,
//! left behind by a consumer that went away, held back by Key_Shared
//! ordering, or delayed entries now due) and the redelivery count of each
//! entry sent more than once.
//!
//! Owns: [`Outstanding`]. Guarantees (checked in debug builds): an entry is
//! out to at most one consumer, and never both out and waiting in `replay`;
//! an entry's redelivery count only grows until it is acknowledged.
//! Bounds: `UNACKED_ENTRIES_MAX` and `REPLAY_ENTRIES_MAX` stop the
//! dispatcher from reading new entries (entries move between the two sets
//! without growing their total).
//! Never: decides who gets an entry (the dispatcher does), or reads the log.

use std::collections::{BTreeMap, HashSet};

use vela_log::Position;

use super::command::ConsumerKey;

/// Entries delivered and not yet acknowledged, per subscription. The Java
/// broker's default is 200k messages; beyond it dispatch pauses until acks arrive.
pub(crate) const UNACKED_ENTRIES_MAX: usize = 100_000;
/// Entries waiting to be sent again. When reached no new entries are read
/// until the replay set drains (it never drops entries).
pub(crate) const REPLAY_ENTRIES_MAX: usize = 100_000;

/// Key_Shared slot of a replayed entry whose slot is not known yet (a
/// delayed entry now due); the next replay pass reads it and sets it.
pub(super) const SLOT_UNKNOWN: u32 = u32::MAX;

#[derive(Debug, Clone, Copy)]
struct PendingEntry {
    owner: ConsumerKey,
    /// Key_Shared hash slot (0 otherwise), kept so a replayed entry still
    /// blocks later entries of its key.
    slot: u32,
}

/// Entries out to consumers (`pending`) and entries to send again (`replay`).
#[derive(Debug, Default)]
pub(super) struct Outstanding {
    pending: BTreeMap<Position, PendingEntry>,
    /// Entries to send again → their Key_Shared slot (0 otherwise).
    replay: BTreeMap<Position, u32>,
    /// Times an entry was sent again at a consumer's request (a
    /// `BTreeMap`: 24 bytes inline in every parked subscription where a
    /// `HashMap` is 48, and no allocation while empty).
    redelivery: BTreeMap<Position, u32>,
}

impl Outstanding {
    /// Entries out to consumers.
    pub(super) fn pending_len(&self) -> usize {
        self.pending.len()
    }

    /// Entries waiting to be sent again.
    pub(super) fn replay_len(&self) -> usize {
        self.replay.len()
    }

    /// Nothing is out and nothing waits.
    pub(super) fn is_empty(&self) -> bool {
        self.pending.is_empty() && self.replay.is_empty()
    }

    /// True if the entry is out to a consumer or waiting to be sent again.
    pub(super) fn contains(&self, pos: Position) -> bool {
        self.pending.contains_key(&pos) || self.replay.contains_key(&pos)
    }

    /// True if an entry before `pos` is out or waiting (a Key_Shared fence
    /// stays up while one is).
    pub(super) fn has_before(&self, pos: Position) -> bool {
        self.pending.range(..pos).next().is_some() || self.replay.range(..pos).next().is_some()
    }

    /// The Key_Shared slots of the entries waiting to be sent again.
    pub(super) fn replay_slots(&self) -> HashSet<u32> {
        self.replay.values().copied().collect()
    }

    /// The first `count` entries waiting to be sent again, in log order,
    /// with their Key_Shared slots (`SLOT_UNKNOWN` when not known yet).
    pub(super) fn replay_first(&self, count: usize) -> Vec<(Position, u32)> {
        self.replay
            .iter()
            .take(count)
            .map(|(pos, slot)| (*pos, *slot))
            .collect()
    }

    /// How often the entry was sent again at a consumer's request.
    pub(super) fn redelivery_count(&self, pos: Position) -> u32 {
        self.redelivery.get(&pos).copied().unwrap_or(0)
    }

    /// The entries out to `owner`, in log order.
    pub(super) fn owned_by(&self, owner: ConsumerKey) -> Vec<Position> {
        self.pending
            .iter()
            .filter(|(_, p)| p.owner == owner)
            .map(|(pos, _)| *pos)
            .collect()
    }

    /// The consumer the entry is out to.
    pub(super) fn owner(&self, pos: Position) -> Option<ConsumerKey> {
        self.pending.get(&pos).map(|p| p.owner)
    }

    /// True if the entry is out to `owner`.
    pub(super) fn is_out_to(&self, pos: Position, owner: ConsumerKey) -> bool {
        self.pending.get(&pos).is_some_and(|p| p.owner == owner)
    }

    /// The entry went out to `owner`.
    pub(super) fn sent(&mut self, pos: Position, owner: ConsumerKey, slot: u32) {
        debug_assert!(
            !self.replay.contains_key(&pos),
            "an entry sent while it waits for replay"
        );
        let previous = self.pending.insert(pos, PendingEntry { owner, slot });
        debug_assert!(previous.is_none(), "an entry out to two consumers");
    }

    /// The entry is to be sent (again) later.
    pub(super) fn queue_replay(&mut self, pos: Position, slot: u32) {
        debug_assert!(
            !self.pending.contains_key(&pos),
            "an entry waits for replay while out to a consumer"
        );
        self.replay.insert(pos, slot);
    }

    /// The entry no longer waits (acknowledged, gone from the log, or taken
    /// for delivery).
    pub(super) fn unreplay(&mut self, pos: Position) {
        self.replay.remove(&pos);
    }

    /// The entry is acknowledged: it is no longer out. Returns the consumer
    /// it was out to.
    pub(super) fn forget(&mut self, pos: Position) -> Option<ConsumerKey> {
        self.redelivery.remove(&pos);
        self.pending.remove(&pos).map(|p| p.owner)
    }

    /// A consumer asked for the entry again: it goes back to `replay` and
    /// its redelivery count grows. False if it was not out (a position
    /// named twice in one request: it waits in `replay` already, its slot
    /// now unknown, and its count grows again).
    pub(super) fn redeliver(&mut self, pos: Position) -> bool {
        let entry = self.pending.remove(&pos);
        let count = self.redelivery.entry(pos).or_insert(0);
        *count = count.saturating_add(1);
        self.replay
            .insert(pos, entry.map_or(SLOT_UNKNOWN, |entry| entry.slot));
        entry.is_some()
    }

    /// A Shared or Key_Shared consumer went away: what was out to it goes
    /// back to `replay` counted as redelivered once, unless counted already
    /// (Pulsar's `redeliveryTracker.addIfAbsent` in
    /// `PersistentDispatcherMultipleConsumers.removeConsumer`); when it was
    /// the last consumer, every count is forgotten instead (Pulsar clears its
    /// tracker: the next consumer starts from the cursor again).
    pub(super) fn requeue_left_by(&mut self, owner: ConsumerKey, consumers_left: bool) {
        if !consumers_left {
            self.requeue_owned_by(owner);
            self.redelivery.clear();
            return;
        }
        for pos in self.owned_by(owner) {
            self.redelivery.entry(pos).or_insert(1);
        }
        self.requeue_owned_by(owner);
    }

    /// Everything out to `owner` goes back to `replay` (it went away, or is
    /// no longer the active consumer).
    pub(super) fn requeue_owned_by(&mut self, owner: ConsumerKey) {
        let owned: Vec<(Position, u32)> = self
            .pending
            .iter()
            .filter(|(_, p)| p.owner == owner)
            .map(|(pos, p)| (*pos, p.slot))
            .collect();
        for (pos, slot) in owned {
            self.pending.remove(&pos);
            self.replay.insert(pos, slot);
        }
    }

    /// Everything out goes back to `replay` (every consumer closed).
    pub(super) fn requeue_all(&mut self) {
        for (pos, pending) in std::mem::take(&mut self.pending) {
            self.replay.insert(pos, pending.slot);
        }
    }

    /// A cumulative ack up to `pos`: the entries at or before it that the
    /// acks now cover are no longer out or waiting. Returns the consumers
    /// of those that were out, one per entry.
    pub(super) fn acked_through(
        &mut self,
        pos: Position,
        is_acked: impl Fn(Position) -> bool,
    ) -> Vec<ConsumerKey> {
        let done: Vec<Position> = self.pending.range(..=pos).map(|(p, _)| *p).collect();
        let mut owners = Vec::new();
        for p in done {
            if is_acked(p) {
                owners.extend(self.forget(p));
            }
        }
        let replayed: Vec<Position> = self.replay.range(..=pos).map(|(p, _)| *p).collect();
        for p in replayed {
            if is_acked(p) {
                self.replay.remove(&p);
            }
        }
        owners
    }

    /// Everything up to `pos` is acknowledged (admin skip, expiry): nothing
    /// at or before it is out or waiting any more. Returns the consumers of
    /// those that were out, one per entry.
    pub(super) fn drop_through(&mut self, pos: Position) -> Vec<ConsumerKey> {
        let done: Vec<Position> = self.pending.range(..=pos).map(|(p, _)| *p).collect();
        let owners = done.into_iter().filter_map(|p| self.forget(p)).collect();
        let above = Position::new(pos.ledger_id, pos.entry_id.saturating_add(1));
        self.replay = self.replay.split_off(&above);
        self.redelivery.retain(|p, _| *p > pos);
        owners
    }

    /// Forgets everything (seek).
    pub(super) fn clear(&mut self) {
        self.pending.clear();
        self.replay.clear();
        self.redelivery.clear();
    }

    /// Gives back the memory of what is empty (the subscription parks): a
    /// `BTreeMap` keeps its emptied node (~370 bytes for `pending`).
    pub(super) fn shrink_idle(&mut self) {
        if self.pending.is_empty() {
            self.pending = BTreeMap::new();
        }
        if self.replay.is_empty() {
            self.replay = BTreeMap::new();
        }
        if self.redelivery.is_empty() {
            self.redelivery = BTreeMap::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const A: ConsumerKey = (1, 1);
    const B: ConsumerKey = (1, 2);

    fn p(entry_id: u64) -> Position {
        Position::new(3, entry_id)
    }

    #[test]
    fn entries_move_between_out_and_replay_without_growing() {
        let mut outstanding = Outstanding::default();
        outstanding.sent(p(0), A, 7);
        outstanding.sent(p(1), B, 8);
        outstanding.sent(p(2), A, 9);
        assert_eq!(outstanding.owned_by(A), vec![p(0), p(2)]);
        assert!(outstanding.redeliver(p(0)));
        assert_eq!(outstanding.redelivery_count(p(0)), 1);
        outstanding.requeue_owned_by(A);
        assert_eq!(outstanding.pending_len() + outstanding.replay_len(), 3);
        assert_eq!(outstanding.replay_first(10), vec![(p(0), 7), (p(2), 9)]);
        assert_eq!(outstanding.replay_slots(), HashSet::from([7, 9]));
        assert!(outstanding.is_out_to(p(1), B));
        outstanding.requeue_all();
        assert_eq!(outstanding.pending_len(), 0);
        assert_eq!(outstanding.replay_len(), 3);
        assert!(outstanding.has_before(p(1)));
        assert!(!outstanding.has_before(p(0)));
    }

    #[test]
    fn a_consumer_leaving_counts_its_entries_redelivered_unless_it_was_the_last() {
        let mut outstanding = Outstanding::default();
        outstanding.sent(p(0), A, 0);
        outstanding.sent(p(1), A, 0);
        outstanding.sent(p(2), B, 0);
        for _ in 0..2 {
            assert!(outstanding.redeliver(p(1)));
            outstanding.unreplay(p(1));
            outstanding.sent(p(1), A, 0);
        }
        outstanding.requeue_left_by(A, true);
        assert_eq!(outstanding.redelivery_count(p(0)), 1);
        assert_eq!(
            outstanding.redelivery_count(p(1)),
            2,
            "counted already: kept"
        );
        assert_eq!(outstanding.redelivery_count(p(2)), 0);
        outstanding.requeue_left_by(B, false);
        assert_eq!(outstanding.replay_len(), 3);
        assert_eq!(
            outstanding.redelivery_count(p(0)),
            0,
            "the last consumer left"
        );
    }

    #[test]
    fn acks_forget_what_they_cover() {
        let mut outstanding = Outstanding::default();
        outstanding.sent(p(0), A, 0);
        outstanding.sent(p(1), A, 0);
        outstanding.queue_replay(p(2), 0);
        assert!(outstanding.redeliver(p(1)));
        assert_eq!(outstanding.acked_through(p(2), |e| e != p(1)), vec![A]);
        assert!(outstanding.contains(p(1)));
        assert!(!outstanding.contains(p(2)));
        assert_eq!(outstanding.drop_through(p(5)), Vec::<ConsumerKey>::new());
        assert!(outstanding.is_empty());
        assert_eq!(outstanding.redelivery_count(p(1)), 0);
    }
}
