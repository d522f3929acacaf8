//! Delayed delivery: an entry whose `deliver_at_time` is in the future
//! waits here, by due time, instead of going out; once due it goes to the
//! replay set and out from there.
//!
//! Owns: [`Delayed`] and the rule of which entries wait (Shared and
//! Key_Shared subscriptions, Pulsar's multi-consumer dispatchers, while the
//! topic's delayed-delivery policy is on; the time is the producer's wall
//! clock, compared with ours). Held in memory only: a
//! restart reads the entries again and delays them again.
//! Bounds: `DELAYED_ENTRIES_MAX`; when reached the dispatcher reads no new
//! entries until some are due.
//! Never: acknowledges or drops an entry.

use std::collections::BTreeSet;

use vela_log::Position;
use vela_wire::proto::command_subscribe::SubType;

use crate::codec;

/// Delayed entries (deliver_at_time in the future) held per Shared or
/// Key_Shared subscription. When reached, no new entries are read until some are due.
pub(crate) const DELAYED_ENTRIES_MAX: usize = 100_000;

/// Wall-clock time in ms (deliver_at_time is the producer's wall clock).
pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// When the entry `data` is due, if a subscription of `sub_type` must hold
/// it back now (`enabled`: the topic's delayed-delivery policy).
pub(super) fn due_later(sub_type: SubType, enabled: bool, data: &[u8]) -> Option<u64> {
    if !enabled || !matches!(sub_type, SubType::Shared | SubType::KeyShared) {
        return None;
    }
    codec::entry_deliver_at_ms(data).filter(|due_ms| *due_ms > now_ms())
}

/// Entries held back until their due time.
#[derive(Debug, Default)]
pub(super) struct Delayed {
    /// (due time in ms, entry), earliest first.
    by_due: BTreeSet<(u64, Position)>,
}

impl Delayed {
    pub(super) fn len(&self) -> usize {
        self.by_due.len()
    }

    /// The earliest due time, if an entry waits.
    pub(super) fn next_due_ms(&self) -> Option<u64> {
        self.by_due.first().map(|(due_ms, _)| *due_ms)
    }

    /// Holds `pos` back until `due_ms`.
    pub(super) fn hold(&mut self, due_ms: u64, pos: Position) {
        self.by_due.insert((due_ms, pos));
    }

    /// Takes the entries due at `now_ms`, earliest first.
    pub(super) fn take_due(&mut self, now_ms: u64) -> Vec<Position> {
        let mut due = Vec::new();
        while let Some(&(due_ms, pos)) = self.by_due.first() {
            if due_ms > now_ms {
                break;
            }
            self.by_due.pop_first();
            due.push(pos);
        }
        due
    }

    /// Forgets the entries at or before `pos` (acknowledged by an admin
    /// skip or expiry).
    pub(super) fn drop_through(&mut self, pos: Position) {
        self.by_due.retain(|(_, p)| *p > pos);
    }

    /// Forgets everything (seek).
    pub(super) fn clear(&mut self) {
        self.by_due.clear();
    }

    /// Gives back an emptied set's node (the subscription parks).
    pub(super) fn shrink_idle(&mut self) {
        if self.by_due.is_empty() {
            self.by_due = BTreeSet::new();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn entries_come_out_when_due_earliest_first() {
        let mut delayed = Delayed::default();
        delayed.hold(300, Position::new(1, 0));
        delayed.hold(100, Position::new(1, 2));
        delayed.hold(200, Position::new(1, 1));
        assert_eq!(delayed.next_due_ms(), Some(100));
        assert_eq!(
            delayed.take_due(200),
            vec![Position::new(1, 2), Position::new(1, 1)]
        );
        assert_eq!(delayed.len(), 1);
        delayed.drop_through(Position::new(1, 0));
        assert_eq!(delayed.next_due_ms(), None);
    }
}
