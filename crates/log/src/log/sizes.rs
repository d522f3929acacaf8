//! Sizes of a log's backlog in bytes: what a subscription has left, and
//! where to cut a backlog down to a quota. Exact per whole ledger,
//! proportional within a ledger.

use super::ManagedLog;
use crate::position::Position;

impl ManagedLog {
    /// Payload bytes of the confirmed entries after `after` (all of them for
    /// `None`): a subscription's backlog size. Exact per whole ledger,
    /// proportional by entry count within the ledger holding `after`.
    pub fn bytes_after(&self, after: Option<Position>) -> u64 {
        let state = self.shared.state.lock();
        let mut bytes = 0u64;
        for ledger in &state.ledgers {
            match after {
                Some(after) if ledger.ledger_id < after.ledger_id => {}
                Some(after) if ledger.ledger_id == after.ledger_id => {
                    let remaining = ledger.entries.saturating_sub(after.entry_id + 1);
                    bytes += (ledger.size_bytes * remaining)
                        .checked_div(ledger.entries)
                        .unwrap_or(0);
                }
                _ => bytes += ledger.size_bytes,
            }
        }
        bytes
    }

    /// The position up to which entries must be consumed so that at most
    /// `bytes` of the newest entries remain after it (`None`: nothing needs
    /// to go). Used to evict a backlog down to a quota.
    pub fn position_keeping_bytes(&self, bytes: u64) -> Option<Position> {
        let state = self.shared.state.lock();
        let mut kept = 0u64;
        for ledger in state.ledgers.iter().rev() {
            if ledger.entries == 0 {
                continue;
            }
            if kept + ledger.size_bytes <= bytes {
                kept += ledger.size_bytes;
                continue;
            }
            // Within this ledger: keep the newest entries that fit.
            let average = (ledger.size_bytes / ledger.entries).max(1);
            let keep_entries = (bytes - kept) / average;
            let drop_entries = ledger.entries - keep_entries.min(ledger.entries);
            return drop_entries
                .checked_sub(1)
                .map(|last| Position::new(ledger.ledger_id, last))
                .or_else(|| {
                    // Nothing of this ledger goes: the end of the one before.
                    let index = state
                        .ledgers
                        .iter()
                        .position(|l| l.ledger_id == ledger.ledger_id)?;
                    state.ledgers[..index]
                        .iter()
                        .rev()
                        .find(|l| l.entries > 0)
                        .map(|l| Position::new(l.ledger_id, l.entries - 1))
                });
        }
        None
    }
}
