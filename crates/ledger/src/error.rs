//! The ledger client's error type.
//!
//! Owns: every way a ledger operation can fail, as a typed value that can be
//! handed to each pending add (hence `Clone`).

use std::sync::Arc;

use crate::entry::EntryError;
use crate::metadata::MetadataFormatError;
use crate::transport::BookieError;
use crate::types::{BookieId, EntryId, LedgerId, QuorumError};

/// Why a ledger operation failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerError {
    /// Another client opened the ledger with recovery (fenced it): this writer
    /// can get nothing more acknowledged. An add that failed with this may or may
    /// not be in the ledger; the recovered ledger says.
    #[error("ledger {0} was fenced by a recovering reader")]
    Fenced(LedgerId),
    /// The ledger is closed: no more adds.
    #[error("ledger {0} is closed")]
    LedgerClosed(LedgerId),
    /// This writer failed earlier (or was closed) and takes no more adds; the
    /// first failure is in the log and was returned to the adds pending then.
    #[error("writer of ledger {ledger_id} is no longer usable: {reason}")]
    WriterFailed {
        /// The ledger.
        ledger_id: LedgerId,
        /// The first failure.
        reason: Arc<LedgerError>,
    },
    /// The writer task is gone (the writer was dropped while the add was pending).
    #[error("writer of ledger {0} was dropped with adds pending")]
    WriterGone(LedgerId),
    /// Not enough available bookies to place an ensemble (or a replacement).
    #[error(
        "not enough writable bookies: need {needed}, {available} usable, {read_only} read-only (disk full or failing)"
    )]
    NotEnoughBookies {
        /// Bookies needed.
        needed: usize,
        /// Bookies available, writable and not excluded.
        available: usize,
        /// Registered bookies marked read-only.
        read_only: usize,
    },
    /// A ledger's segments hit `metadata::ENSEMBLES_MAX`.
    #[error("ledger {0} has changed ensembles too often")]
    TooManyEnsembleChanges(LedgerId),
    /// No metadata for this ledger.
    #[error("no such ledger {0}")]
    NoSuchLedger(LedgerId),
    /// Invalid E / Qw / Qa.
    #[error(transparent)]
    Quorum(#[from] QuorumError),
    /// Payload bigger than a packaged entry can carry.
    #[error("payload of {len_bytes} bytes is over the {max_bytes}-byte entry limit")]
    PayloadTooLarge {
        /// Size of the payload.
        len_bytes: usize,
        /// The limit.
        max_bytes: usize,
    },
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Metadata(#[from] vela_meta::MetaError),
    /// Stored ledger metadata does not decode.
    #[error("ledger {ledger_id} metadata: {error}")]
    MetadataFormat {
        /// The ledger.
        ledger_id: LedgerId,
        /// What is wrong.
        error: MetadataFormatError,
    },
    /// A CAS on the ledger's metadata kept conflicting.
    #[error("ledger {0} metadata kept changing under us")]
    MetadataContention(LedgerId),
    /// The entry is past what may be read (the LAC, or the last entry of a closed
    /// ledger).
    #[error("entry {entry_id} of ledger {ledger_id} is past the readable end {last:?}")]
    BeyondLastConfirmed {
        /// The ledger.
        ledger_id: LedgerId,
        /// The entry asked for.
        entry_id: EntryId,
        /// The last readable entry (`None`: nothing readable).
        last: Option<EntryId>,
    },
    /// Auto-recovery could not copy an entry to its replacement bookie.
    #[error("re-replication of entry {entry_id} of ledger {ledger_id} failed: {reason}")]
    Rereplication {
        /// The ledger.
        ledger_id: LedgerId,
        /// The entry.
        entry_id: EntryId,
        /// What the target bookie answered.
        reason: String,
    },
    /// A range read with `first > last` or more than its entry limit.
    #[error("bad range {first}..={last} (at most {max_entries} entries)")]
    BadRange {
        /// First entry asked for.
        first: EntryId,
        /// Last entry asked for.
        last: EntryId,
        /// The limit.
        max_entries: u64,
    },
    /// No bookie of the write set returned the entry.
    #[error("entry {entry_id} of ledger {ledger_id} could not be read: {errors:?}")]
    EntryUnavailable {
        /// The ledger.
        ledger_id: LedgerId,
        /// The entry.
        entry_id: EntryId,
        /// What each bookie answered.
        errors: Vec<(BookieId, BookieError)>,
    },
    /// No bookie of the last ensemble answered a LAC read.
    #[error("LAC of ledger {ledger_id} could not be read: {errors:?}")]
    LacUnavailable {
        /// The ledger.
        ledger_id: LedgerId,
        /// What each bookie answered.
        errors: Vec<(BookieId, BookieError)>,
    },
    /// Too many custom properties for one ledger.
    #[error(
        "{count} ledger properties, the limit is {}",
        crate::metadata::PROPERTIES_MAX
    )]
    TooManyProperties {
        /// Properties given.
        count: usize,
    },
    /// A bookie returned bytes that fail the CRC or are another entry.
    #[error("bookie {bookie} returned a bad entry: {error}")]
    Corrupt {
        /// The bookie.
        bookie: BookieId,
        /// What is wrong.
        error: EntryError,
    },
    /// Recovery could not reach the bookies it needs (fencing coverage, or an
    /// entry whose presence stays unknown). Retry later; nothing was decided.
    #[error("recovery of ledger {ledger_id} incomplete: {reason}")]
    RecoveryIncomplete {
        /// The ledger.
        ledger_id: LedgerId,
        /// What was missing.
        reason: String,
    },
    /// Some bookies did not confirm the delete; the metadata was kept so that a
    /// retry can finish it.
    #[error("delete of ledger {ledger_id} incomplete on {failed:?}")]
    DeleteIncomplete {
        /// The ledger.
        ledger_id: LedgerId,
        /// Bookies that failed, with their errors.
        failed: Vec<(BookieId, BookieError)>,
    },
    /// A bug in this crate surfaced as an error instead of a hang (e.g. a request
    /// task panicked).
    #[error("internal error: {0}")]
    Internal(String),
}

impl LedgerError {
    /// Whether this error means the ledger was fenced by a recovery (directly, or
    /// as the reason a writer stopped).
    pub fn is_fenced(&self) -> bool {
        match self {
            LedgerError::Fenced(_) => true,
            LedgerError::WriterFailed { reason, .. } => reason.is_fenced(),
            _ => false,
        }
    }
}
