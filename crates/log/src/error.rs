//! `LogError`: what the log's callers see.

use crate::backend::LedgerBackendError;

/// Failures of a managed log or cursor.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LogError {
    /// A ledger operation failed.
    #[error("ledger: {0}")]
    Ledger(#[from] LedgerBackendError),
    /// The metadata store failed or held something unreadable.
    #[error("metadata: {0}")]
    Metadata(String),
    /// Someone else changed the log's metadata: another broker owns it now.
    #[error("log {0} was taken over by another owner")]
    Fenced(String),
    /// The log is closed (topic unloaded or deleted).
    #[error("log {0} is closed")]
    Closed(String),
    /// The log was terminated: it takes no more appends.
    #[error("log {0} is terminated")]
    Terminated(String),
    /// Appends waiting for a new ledger exceed their byte bound.
    #[error("log {0}: too many appends waiting for a ledger rollover")]
    Overloaded(String),
    /// An entry larger than the ledgers can store; refused before it is
    /// issued (the log goes on).
    #[error("entry of {len_bytes} bytes is over the {max_bytes}-byte limit of a ledger entry")]
    EntryTooLarge {
        /// Size of the refused entry.
        len_bytes: usize,
        /// The backend's limit.
        max_bytes: usize,
    },
    /// A cursor keeps too many individually acknowledged entries.
    #[error(
        "cursor {0}: too many individually acknowledged entries above the mark-delete position"
    )]
    TooManyAckHoles(String),
    /// Bad configuration.
    #[error("config: {0}")]
    Config(String),
    /// An offload cannot run or failed (not retried).
    #[error("offload: {0}")]
    Offload(String),
    /// The object store failed during an offload (retried with back-off).
    #[error("offload: object store: {0}")]
    OffloadStore(String),
    /// An offload of the log is running already (Pulsar's message).
    #[error("Offload already in progress")]
    OffloadInProgress(String),
    /// A position the operation cannot use.
    #[error("{0}")]
    InvalidPosition(String),
}
