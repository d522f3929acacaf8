//! The seam between the ledger client and bookies.
//!
//! Owns: `BookieTransport` (the five requests the ledger protocol needs) and
//! `BookieError` (what a bookie, or the path to it, can answer).
//! Never: decides anything about quorums, retries or ensembles: one request, one
//! answer. Implementations: `sim::SimCluster` (in-memory, with faults) and
//! `bookie_client::BookieClientTransport` (the real protocol).

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

use crate::types::{BookieId, EntryId, LedgerId};

/// A request in flight to one bookie.
pub type BookieFuture<T> = Pin<Box<dyn Future<Output = Result<T, BookieError>> + Send + 'static>>;

/// How a bookie should treat an ADD.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddMode {
    /// A writer's add: refused with `Fenced` once the ledger is fenced.
    Normal,
    /// A recovery re-write: accepted on a fenced ledger.
    Recovery,
}

/// How a bookie should treat a READ or READ_LAC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadMode {
    /// Plain read.
    Normal,
    /// Fence the ledger (durably) before answering: no normal ADD is accepted
    /// after this answer.
    Fence,
}

/// What one request to one bookie can end in.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookieError {
    /// The ledger is fenced: a recovery has started; normal adds are refused.
    #[error("ledger is fenced on this bookie")]
    Fenced,
    /// The bookie knows the ledger but not this entry.
    #[error("no such entry")]
    NoSuchEntry,
    /// The bookie has nothing of this ledger.
    #[error("no such ledger")]
    NoSuchLedger,
    /// The bookie is overloaded (its queue is full); retry later or elsewhere.
    #[error("bookie is overloaded")]
    TooManyRequests,
    /// No answer within the request timeout.
    #[error("request timed out")]
    Timeout,
    /// Could not connect, or the connection broke before the answer.
    #[error("connection to bookie lost: {0}")]
    ConnectionLost(String),
    /// The bookie rejected the request as malformed (a bug on one side).
    #[error("bookie rejected the request: {0}")]
    BadRequest(String),
    /// The bookie cannot write now: its disk is almost full, or a journal or
    /// storage write failed there. Writers replace it; reads still work.
    #[error("bookie is read-only (disk full or failing)")]
    ReadOnly,
    /// The bookie failed internally (disk error, shutting down).
    #[error("bookie error: {0}")]
    Io(String),
    /// The bookie is not in the registry or has no usable address.
    #[error("unknown bookie {0}")]
    UnknownBookie(String),
}

impl BookieError {
    /// Whether the bookie positively says it does not hold the entry (as opposed
    /// to an unknown outcome). Only these answers may prove an entry missing.
    pub fn is_no_entry(&self) -> bool {
        matches!(self, BookieError::NoSuchEntry | BookieError::NoSuchLedger)
    }
}

/// The requests the ledger protocol sends to bookies. Every future is `'static`
/// (implementations clone what they need) so callers can run many in parallel.
pub trait BookieTransport: Send + Sync + std::fmt::Debug + 'static {
    /// Stores `packaged` (a packaged entry, see `crate::entry`) on `bookie`;
    /// resolves once the bookie has made it durable.
    fn add(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        packaged: Bytes,
        mode: AddMode,
    ) -> BookieFuture<()>;

    /// Reads the packaged entry `entry_id`; with `ReadMode::Fence` fences first.
    fn read(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        mode: ReadMode,
    ) -> BookieFuture<Bytes>;

    /// The bookie's last-add-confirmed for the ledger (the highest LAC carried by
    /// an entry it stores; `None` if none). With `ReadMode::Fence` fences first,
    /// and a bookie without the ledger answers `None` (it now holds a fenced,
    /// empty ledger).
    fn read_lac(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        mode: ReadMode,
    ) -> BookieFuture<Option<EntryId>>;

    /// Drops everything the bookie holds of the ledger.
    fn delete_ledger(&self, bookie: &BookieId, ledger_id: LedgerId) -> BookieFuture<()>;
}
