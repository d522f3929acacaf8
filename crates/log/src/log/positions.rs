//! Position arithmetic over a log's ledger list: pure functions of the list
//! (and of the last confirmed position), no locks, no I/O.
//!
//! Owns: what "next", "previous", "the n-th after" and "how many between"
//! mean across ledgers, empty ledgers skipped. The last ledger of a log being
//! written is always a target of `next_position` (its next entry is not
//! written yet).

use crate::format::LedgerInfo;
use crate::position::Position;

/// Moves `position` to the first confirmed entry at or after it; `None` when
/// there is none yet (nothing confirmed at or after it, `last_confirmed`).
pub(super) fn normalize(
    ledgers: &[LedgerInfo],
    last_confirmed: Option<Position>,
    position: Position,
) -> Option<Position> {
    let last = last_confirmed?;
    if position > last {
        return None;
    }
    for ledger in ledgers {
        if ledger.ledger_id < position.ledger_id || ledger.entries == 0 {
            continue;
        }
        if ledger.ledger_id == position.ledger_id {
            if position.entry_id < ledger.entries {
                return Some(position);
            }
            continue;
        }
        return Some(Position::new(ledger.ledger_id, 0));
    }
    None
}

pub(super) fn next_position(ledgers: &[LedgerInfo], position: Position) -> Position {
    let index = ledgers.partition_point(|ledger| ledger.ledger_id < position.ledger_id);
    match ledgers.get(index) {
        Some(ledger) if ledger.ledger_id == position.ledger_id => {
            let is_last = index + 1 == ledgers.len();
            if position.entry_id + 1 < ledger.entries || is_last {
                return Position::new(position.ledger_id, position.entry_id + 1);
            }
            // Skip empty ledgers; the last ledger (being written) is always a target.
            for (offset, later) in ledgers[index + 1..].iter().enumerate() {
                if later.entries > 0 || index + 1 + offset + 1 == ledgers.len() {
                    return Position::new(later.ledger_id, 0);
                }
            }
            Position::new(position.ledger_id, position.entry_id + 1)
        }
        Some(later) => Position::new(later.ledger_id, 0),
        None => Position::new(position.ledger_id, position.entry_id + 1),
    }
}

pub(super) fn previous_position(ledgers: &[LedgerInfo], position: Position) -> Option<Position> {
    if position.entry_id > 0 && ledgers.iter().any(|l| l.ledger_id == position.ledger_id) {
        return Some(Position::new(position.ledger_id, position.entry_id - 1));
    }
    ledgers
        .iter()
        .rev()
        .find(|ledger| ledger.ledger_id < position.ledger_id && ledger.entries > 0)
        .map(|ledger| Position::new(ledger.ledger_id, ledger.entries - 1))
}

pub(super) fn position_after(
    ledgers: &[LedgerInfo],
    after: Option<Position>,
    count: u64,
) -> Option<Position> {
    if count == 0 {
        return after;
    }
    let mut left = count;
    for ledger in ledgers {
        if ledger.entries == 0 {
            continue;
        }
        let first = match after {
            Some(after) if ledger.ledger_id < after.ledger_id => continue,
            Some(after) if ledger.ledger_id == after.ledger_id => after.entry_id + 1,
            _ => 0,
        };
        if first >= ledger.entries {
            continue;
        }
        let available = ledger.entries - first;
        if left <= available {
            return Some(Position::new(ledger.ledger_id, first + left - 1));
        }
        left -= available;
    }
    None
}

pub(super) fn entries_between(
    ledgers: &[LedgerInfo],
    after: Option<Position>,
    up_to: Position,
) -> u64 {
    let mut count = 0u64;
    for ledger in ledgers {
        if ledger.entries == 0 || ledger.ledger_id > up_to.ledger_id {
            continue;
        }
        let mut first = 0u64;
        let mut last = ledger.entries - 1;
        if ledger.ledger_id == up_to.ledger_id {
            last = last.min(up_to.entry_id);
        }
        if let Some(after) = after {
            if ledger.ledger_id < after.ledger_id {
                continue;
            }
            if ledger.ledger_id == after.ledger_id {
                first = after.entry_id + 1;
            }
        }
        if first <= last {
            count += last - first + 1;
        }
    }
    count
}
