//! `StorageError`: every way ledger storage can fail, typed.
//!
//! Disk bytes are input: a bad header, CRC or id read back is `Corruption` naming
//! the file and offset, never a panic. A failed `fdatasync`/`sync_file_range` is
//! fatal (`Broken` afterwards): page-cache state after a failed sync is unknown,
//! so storage refuses all further writes rather than retrying.

use std::path::PathBuf;

/// Errors of ledger storage.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StorageError {
    /// The write cache budget (`write_cache_bytes_max`, both halves together) is
    /// exhausted. Nothing was stored. The caller answers with back-pressure
    /// (TOO_MANY_REQUESTS) and the sync thread should flush.
    #[error("write cache full: {used_bytes} of {max_bytes} bytes used, entry needs {needed_bytes}")]
    WriteCacheFull {
        /// Bytes held by both cache halves.
        used_bytes: u64,
        /// `StorageConfig::write_cache_bytes_max`.
        max_bytes: u64,
        /// Accounted size of the rejected entry.
        needed_bytes: u64,
    },
    /// The ledger is unknown to this bookie, or deleted.
    #[error("no such ledger {ledger_id}")]
    NoSuchLedger {
        /// Ledger asked for.
        ledger_id: u64,
    },
    /// The ledger exists but this entry is not stored here.
    #[error("no such entry {ledger_id}:{entry_id}")]
    NoSuchEntry {
        /// Ledger asked for.
        ledger_id: u64,
        /// Entry asked for.
        entry_id: u64,
    },
    /// The ledger was deleted: puts and state changes are refused (journal replay
    /// of a record older than the delete treats this as "skip").
    #[error("ledger {ledger_id} is deleted")]
    LedgerDeleted {
        /// Ledger written to.
        ledger_id: u64,
    },
    /// The payload is larger than `ENTRY_PAYLOAD_BYTES_MAX`.
    #[error(
        "entry {ledger_id}:{entry_id} is {payload_bytes} bytes, over the {max_bytes} byte limit"
    )]
    EntryTooLarge {
        /// Ledger written to.
        ledger_id: u64,
        /// Entry written.
        entry_id: u64,
        /// Size of the rejected payload.
        payload_bytes: u64,
        /// The limit.
        max_bytes: u64,
    },
    /// Bytes read back from disk are not what storage wrote (bad magic, version,
    /// CRC, ids or lengths).
    #[error("corruption in {path} at offset {offset}: {reason}")]
    Corruption {
        /// File the bad bytes are in.
        path: PathBuf,
        /// Byte offset in that file.
        offset: u64,
        /// What check failed.
        reason: String,
    },
    /// An I/O call failed.
    #[error("{op} {path}: {source}")]
    Io {
        /// What storage was doing (`"open"`, `"pread"`, `"fdatasync"`, …).
        op: &'static str,
        /// File or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The index database (redb) failed.
    #[error("index database: {0}")]
    Index(#[from] redb::Error),
    /// Another process (or another `LedgerStorage`) holds the ledger dir's LOCK.
    #[error("ledger dir {path} is locked by another process")]
    Locked {
        /// The LOCK file.
        path: PathBuf,
    },
    /// The configuration is unusable; says which field and why.
    #[error("bad storage config: {0}")]
    BadConfig(String),
    /// An earlier sync or write failed; storage refuses further writes until it is
    /// reopened (the bookie stops). Carries the first failure's message.
    #[error("ledger storage is broken after an earlier failure: {0}")]
    Broken(String),
}

impl StorageError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        StorageError::Io {
            op,
            path: path.into(),
            source,
        }
    }

    pub(crate) fn corruption(
        path: impl Into<PathBuf>,
        offset: u64,
        reason: impl Into<String>,
    ) -> Self {
        StorageError::Corruption {
            path: path.into(),
            offset,
            reason: reason.into(),
        }
    }
}

macro_rules! from_redb {
    ($($t:ty),*) => {$(
        impl From<$t> for StorageError {
            fn from(e: $t) -> Self {
                StorageError::Index(redb::Error::from(e))
            }
        }
    )*};
}
from_redb!(
    redb::DatabaseError,
    redb::TransactionError,
    redb::TableError,
    redb::StorageError,
    redb::CommitError,
    redb::SetDurabilityError
);
