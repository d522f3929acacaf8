//! Identifiers and the quorum shape of a ledger.
//!
//! Owns: `LedgerId`, `EntryId`, `BookieId`, `Quorum` and the striping rule (which
//! ensemble indices store an entry).
//! Never: does I/O or knows where a bookie lives.

use std::fmt;

/// A ledger's id, unique in the cluster (allocated by the metadata store's id
/// allocator).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LedgerId(pub u64);

impl fmt::Display for LedgerId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "L{}", self.0)
    }
}

/// Position of an entry in its ledger, from 0.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct EntryId(pub u64);

impl EntryId {
    /// The entry after this one.
    pub fn next(self) -> EntryId {
        EntryId(self.0 + 1)
    }
}

impl fmt::Display for EntryId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// The first entry after `last` (`None` = nothing yet, so entry 0).
pub fn entry_after(last: Option<EntryId>) -> EntryId {
    match last {
        None => EntryId(0),
        Some(e) => e.next(),
    }
}

/// The entry before `entry` (`None` for entry 0).
pub fn entry_before(entry: EntryId) -> Option<EntryId> {
    entry.0.checked_sub(1).map(EntryId)
}

/// A bookie's id as registered in the metadata store (`/bookies/available/<id>`).
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BookieId(pub String);

impl BookieId {
    /// Builds an id from anything string-like.
    pub fn new(id: impl Into<String>) -> BookieId {
        BookieId(id.into())
    }
}

impl fmt::Display for BookieId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// Largest ensemble a ledger may have. BookKeeper deployments use 2..5; 64 keeps
/// write sets in small arrays and bounds per-entry fan-out.
pub const ENSEMBLE_SIZE_MAX: usize = 64;

/// Ensemble size E, write quorum Qw and ack quorum Qa of a ledger, with
/// `1 <= Qa <= Qw <= E <= ENSEMBLE_SIZE_MAX`. `Quorum::new` is the only constructor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Quorum {
    ensemble_size: usize,
    write_quorum: usize,
    ack_quorum: usize,
}

/// Why a quorum shape is invalid.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid quorum E={ensemble_size} Qw={write_quorum} Qa={ack_quorum}: need 1 <= Qa <= Qw <= E <= {ENSEMBLE_SIZE_MAX}"
)]
pub struct QuorumError {
    /// Requested ensemble size.
    pub ensemble_size: usize,
    /// Requested write quorum.
    pub write_quorum: usize,
    /// Requested ack quorum.
    pub ack_quorum: usize,
}

impl Quorum {
    /// Checks `1 <= Qa <= Qw <= E <= ENSEMBLE_SIZE_MAX`.
    pub fn new(
        ensemble_size: usize,
        write_quorum: usize,
        ack_quorum: usize,
    ) -> Result<Quorum, QuorumError> {
        let ok = ack_quorum >= 1
            && ack_quorum <= write_quorum
            && write_quorum <= ensemble_size
            && ensemble_size <= ENSEMBLE_SIZE_MAX;
        if !ok {
            return Err(QuorumError {
                ensemble_size,
                write_quorum,
                ack_quorum,
            });
        }
        Ok(Quorum {
            ensemble_size,
            write_quorum,
            ack_quorum,
        })
    }

    /// E: bookies in each ensemble.
    pub fn ensemble_size(&self) -> usize {
        self.ensemble_size
    }

    /// Qw: bookies each entry is sent to.
    pub fn write_quorum(&self) -> usize {
        self.write_quorum
    }

    /// Qa: acks that complete an entry.
    pub fn ack_quorum(&self) -> usize {
        self.ack_quorum
    }

    /// Bookies of a write set that must deny an entry (or be fenced) before no
    /// writer can reach Qa there: Qw - Qa + 1.
    pub fn coverage(&self) -> usize {
        self.write_quorum - self.ack_quorum + 1
    }

    /// Ensemble indices storing `entry`: `(entry + i) mod E` for i in 0..Qw.
    pub fn write_set(&self, entry: EntryId) -> impl Iterator<Item = usize> + use<> {
        let ensemble_size = self.ensemble_size;
        // entry mod E fits usize since E <= ENSEMBLE_SIZE_MAX.
        let first = (entry.0 % ensemble_size as u64) as usize;
        (0..self.write_quorum).map(move |i| (first + i) % ensemble_size)
    }

    /// Whether ensemble index `index` stores `entry`.
    pub fn stores(&self, entry: EntryId, index: usize) -> bool {
        self.write_set(entry).any(|i| i == index)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn quorum_new_checks_the_order() {
        assert!(Quorum::new(3, 2, 2).is_ok());
        assert!(Quorum::new(1, 1, 1).is_ok());
        assert!(Quorum::new(3, 2, 3).is_err());
        assert!(Quorum::new(2, 3, 1).is_err());
        assert!(Quorum::new(3, 2, 0).is_err());
        assert!(Quorum::new(0, 0, 0).is_err());
        assert!(Quorum::new(ENSEMBLE_SIZE_MAX + 1, 1, 1).is_err());
    }

    #[test]
    fn write_sets_stripe_round_robin() {
        let q = Quorum::new(3, 2, 2).unwrap();
        let sets: Vec<Vec<usize>> = (0..4).map(|e| q.write_set(EntryId(e)).collect()).collect();
        assert_eq!(sets, vec![vec![0, 1], vec![1, 2], vec![2, 0], vec![0, 1]]);
        assert!(q.stores(EntryId(2), 0));
        assert!(!q.stores(EntryId(2), 1));
        assert_eq!(q.coverage(), 1);
        assert_eq!(Quorum::new(5, 3, 2).unwrap().coverage(), 2);
    }
}
