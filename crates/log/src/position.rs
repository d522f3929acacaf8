//! `Position`: where an entry sits in a log: (ledger id, entry id).

/// The position of an entry in a managed log. Positions order by ledger, then
/// entry, which is the order entries were appended in (ledger ids of one log only
/// grow).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Position {
    /// Ledger holding the entry.
    pub ledger_id: u64,
    /// Entry id inside that ledger (from 0).
    pub entry_id: u64,
}

impl Position {
    /// Builds a position.
    pub const fn new(ledger_id: u64, entry_id: u64) -> Position {
        Position {
            ledger_id,
            entry_id,
        }
    }
}

impl std::fmt::Display for Position {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}:{}", self.ledger_id, self.entry_id)
    }
}
