//! The log's view of tiered storage: a narrow seam through which a closed
//! ledger is copied to object storage and read back (`vela-offload`'s
//! `ObjectStoreOffloader` over the `object_store` crate implements it; this
//! crate never talks to a store itself).
//!
//! Contract every offloader keeps:
//! - `offload` writes the ledger's objects under names that hold the
//!   attempt's uid, and returns only once every object is fully stored. A
//!   failed or interrupted attempt may leave objects behind; they are never
//!   read (the log records `complete` only after `offload` returned) and the
//!   next attempt deletes them (`delete`).
//! - `read` returns the entries exactly as the ledger held them, in order,
//!   from `first` on: at least one, then as many as fit in `bytes_max`, never
//!   past `last`. A missing or corrupt object is an error (counted), never
//!   made-up data.
//! - Memory: an offloader bounds what its reads and writes hold at once
//!   broker-wide (its own budgets, named in ARCHITECTURE.md).
//!
//! The policy (`OffloadPolicy`) and status (`OffloadStatus`) types are what
//! the broker's admin API maps to Pulsar's `OffloadPolicies` and
//! `OffloadProcessStatus`.

use std::fmt;
use std::time::Duration;

use bytes::Bytes;

use crate::backend::{BoxFuture, LedgerBackend, LedgerBackendError};
use crate::position::Position;

/// The objects of one offload attempt of one ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct OffloadTarget {
    /// The ledger copied.
    pub ledger_id: u64,
    /// The attempt's uid: part of every object name.
    pub uid: u128,
}

/// Why an offload (the copy, or deleting objects) failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OffloadError {
    /// The object store failed or is unreachable: worth retrying later.
    #[error("object store: {0}")]
    Store(String),
    /// Reading the ledger from the bookies failed.
    #[error("reading the ledger to offload: {0}")]
    Source(#[from] LedgerBackendError),
    /// The ledger held something the offloader cannot store (e.g. an entry
    /// over the format's size limit).
    #[error("{0}")]
    Refused(String),
}

impl OffloadError {
    /// Whether a later attempt may succeed (the store may come back).
    pub fn is_retriable(&self) -> bool {
        matches!(self, OffloadError::Store(_))
    }
}

/// Counters an offloader keeps (the broker exports them on `/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadCounters {
    /// Bytes of objects fully written (data and index).
    pub offloaded_bytes: u64,
    /// Ledgers fully written.
    pub offloaded_ledgers: u64,
    /// Offload attempts that failed.
    pub offload_errors: u64,
    /// Reads that failed (store unreachable, object missing or corrupt).
    pub read_errors: u64,
    /// Entries read back.
    pub read_entries: u64,
    /// Bytes read back (ranged GETs).
    pub read_bytes: u64,
    /// Reads answered (successful or not), and their summed latency in
    /// microseconds (index fetch included).
    pub reads: u64,
    pub read_latency_us_total: u64,
}

/// Copies closed ledgers to object storage and reads them back.
pub trait LedgerOffloader: Send + Sync + fmt::Debug {
    /// The driver's name (`filesystem`, `s3`), for logs and errors.
    fn driver_name(&self) -> &str;

    /// Copies entries `0..entries` (`size_bytes` of payload in all) of the
    /// closed ledger `target.ledger_id`, read from `source`, into the objects
    /// of `target`; resolves once they are all fully stored, with the bytes
    /// written.
    fn offload<'a>(
        &'a self,
        target: OffloadTarget,
        entries: u64,
        size_bytes: u64,
        source: &'a dyn LedgerBackend,
    ) -> BoxFuture<'a, Result<u64, OffloadError>>;

    /// Entries `first..=last` of an offloaded ledger: at least one, then as
    /// many as fit in `bytes_max`.
    fn read(
        &self,
        target: OffloadTarget,
        first_entry_id: u64,
        last_entry_id: u64,
        bytes_max: usize,
    ) -> BoxFuture<'_, Result<Vec<Bytes>, LedgerBackendError>>;

    /// Deletes the objects of `target`; absent objects are fine.
    fn delete(&self, target: OffloadTarget) -> BoxFuture<'_, Result<(), OffloadError>>;

    /// The counters so far.
    fn counters(&self) -> OffloadCounters {
        OffloadCounters::default()
    }
}

/// Pulsar's default `managedLedgerOffloadDeletionLagMs`: 4 hours.
pub const OFFLOAD_DELETION_LAG_DEFAULT: Duration = Duration::from_secs(4 * 3600);

/// When closed ledgers are offloaded and their bookie copies deleted
/// (Pulsar's `offloadThresholdInBytes`, `offloadThresholdInSeconds`,
/// `offloadDeletionLagMs`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OffloadPolicy {
    /// Keep about this many bytes of the newest ledgers on the bookies;
    /// older closed ledgers are offloaded. `None`: no size threshold.
    pub threshold_bytes: Option<u64>,
    /// Offload closed ledgers older than this. `None`: no age threshold.
    pub threshold_age: Option<Duration>,
    /// Delete the bookies' copy this long after the offload completed.
    /// `None`: keep it.
    pub deletion_lag: Option<Duration>,
}

impl Default for OffloadPolicy {
    fn default() -> OffloadPolicy {
        OffloadPolicy {
            threshold_bytes: None,
            threshold_age: None,
            deletion_lag: Some(OFFLOAD_DELETION_LAG_DEFAULT),
        }
    }
}

/// Where the last offload of a log stands (Pulsar's `LongRunningProcessStatus`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum OffloadState {
    /// No offload ran since the log was opened.
    NotRun,
    /// An offload is running.
    Running,
    /// The last offload finished.
    Success,
    /// The last offload failed, or the running one is waiting to retry.
    Error,
}

/// A log's offload status (Pulsar's `OffloadProcessStatus`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OffloadStatus {
    /// Where it stands.
    pub state: OffloadState,
    /// Why it failed (empty unless `Error`).
    pub last_error: String,
    /// After a success: the first entry not offloaded.
    pub first_unoffloaded: Option<Position>,
    /// True while an offload runs (also while it waits to retry).
    pub running: bool,
}

impl OffloadStatus {
    pub(crate) const NOT_RUN: OffloadStatus = OffloadStatus {
        state: OffloadState::NotRun,
        last_error: String::new(),
        first_unoffloaded: None,
        running: false,
    };
}
