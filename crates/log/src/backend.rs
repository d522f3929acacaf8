//! The log's view of ledgers: a narrow seam so the same log runs on the real
//! ledger client (replicated on bookies: `vela-ledger-backend`'s
//! `ReplicatedLedgers`) or on in-memory ledgers (`memory`: tests of this crate
//! and of the broker).
//!
//! Contract every backend keeps:
//! - `OpenLedger::add` calls are ordered: entry ids follow the call order
//!   (from 0), and the `done` callbacks run in entry order, each only once the
//!   entry is durable (acknowledged by Qa bookies for the replicated backend).
//! - An open ledger has a bounded window of adds in flight: `reserve` says
//!   whether the next add fits now or when it will, and never queues the add
//!   itself. The only queue of adds above a ledger writer is the caller's
//!   (`queue::AppendQueue`).
//! - After `recover`, the ledger is closed and no previous writer can add to it.

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bytes::Bytes;

/// A boxed, sendable future (the seam is object safe).
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// Called once per add, in entry order, with the entry id or the failure.
pub type AddCallback = Box<dyn FnOnce(Result<u64, LedgerBackendError>) + Send>;

/// Whether an open ledger's window has room for the next add.
pub enum Reserve {
    /// Room is reserved now: the next `add` spends it.
    Ready,
    /// The window is full: resolves once room is reserved (the next `add`
    /// spends it), or with the failure that ended the writer.
    Wait(BoxFuture<'static, Result<(), LedgerBackendError>>),
    /// The writer is gone: no add will be taken.
    Failed(LedgerBackendError),
}

impl fmt::Debug for Reserve {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reserve::Ready => f.write_str("Ready"),
            Reserve::Wait(_) => f.write_str("Wait"),
            Reserve::Failed(error) => write!(f, "Failed({error})"),
        }
    }
}

/// Replication of new ledgers: ensemble size, write quorum, ack quorum.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Persistence {
    /// Bookies a ledger is striped over (E).
    pub ensemble: u8,
    /// Copies of each entry (Qw).
    pub write_quorum: u8,
    /// Copies acknowledged before an add completes (Qa).
    pub ack_quorum: u8,
}

impl Persistence {
    /// One copy on one bookie: the standalone default with one bookie.
    pub const SINGLE: Persistence = Persistence {
        ensemble: 1,
        write_quorum: 1,
        ack_quorum: 1,
    };

    /// Checks `1 <= Qa <= Qw <= E`.
    pub fn validate(&self) -> Result<(), String> {
        if self.ack_quorum >= 1
            && self.ack_quorum <= self.write_quorum
            && self.write_quorum <= self.ensemble
        {
            Ok(())
        } else {
            Err(format!(
                "persistence needs 1 <= ack quorum ({}) <= write quorum ({}) <= ensemble ({})",
                self.ack_quorum, self.write_quorum, self.ensemble
            ))
        }
    }
}

/// What a ledger looked like once recovered (fenced and closed).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RecoveredLedger {
    /// Last entry id, `None` when the ledger holds no entry.
    pub last_entry_id: Option<u64>,
    /// Sum of the entries' payload sizes.
    pub size_bytes: u64,
}

/// Replication and placement of one ledger (admin internal stats).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerDescription {
    /// Replication the ledger was created with.
    pub persistence: Persistence,
    /// `OPEN`, `IN_RECOVERY` or `CLOSED`.
    pub state: String,
    /// Segments: first entry id and the bookies holding the segment.
    pub ensembles: Vec<(u64, Vec<String>)>,
    /// Creation time, ms since the Unix epoch.
    pub ctime_ms: u64,
}

/// Failures the log sees from its ledgers.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LedgerBackendError {
    /// The ledger does not exist (deleted, or never created).
    #[error("ledger {0} does not exist")]
    NoSuchLedger(u64),
    /// The entry is not (or no longer) readable.
    #[error("entry {entry_id} of ledger {ledger_id} does not exist")]
    NoSuchEntry {
        /// Ledger asked for.
        ledger_id: u64,
        /// Entry asked for.
        entry_id: u64,
    },
    /// Another writer recovered the ledger: this writer may add nothing more.
    #[error("ledger {0} was fenced by another writer")]
    Fenced(u64),
    /// The ledger is closed to adds.
    #[error("ledger {0} is closed")]
    Closed(u64),
    /// Anything else (not enough bookies, metadata failure, I/O), with context.
    #[error("{0}")]
    Other(String),
}

/// Creates, recovers, reads and deletes ledgers.
pub trait LedgerBackend: Send + Sync + fmt::Debug {
    /// Creates an open ledger with this replication, tagged with the log's
    /// name, and returns its writer (`create`, on `dyn LedgerBackend`, puts
    /// one behind an ordered queue).
    fn create_ledger(
        &self,
        persistence: Persistence,
        log_name: &str,
    ) -> BoxFuture<'_, Result<Arc<dyn OpenLedger>, LedgerBackendError>>;

    /// Opens a ledger with recovery: fences any writer, closes it at the last
    /// entry that could have been acknowledged.
    fn recover(&self, ledger_id: u64)
    -> BoxFuture<'_, Result<RecoveredLedger, LedgerBackendError>>;

    /// Reads entries `first..=last`. The caller guarantees they were confirmed.
    fn read(
        &self,
        ledger_id: u64,
        first_entry_id: u64,
        last_entry_id: u64,
    ) -> BoxFuture<'_, Result<Vec<Bytes>, LedgerBackendError>>;

    /// Deletes a ledger and its entries everywhere.
    fn delete(&self, ledger_id: u64) -> BoxFuture<'_, Result<(), LedgerBackendError>>;

    /// Replication and placement of a ledger; `None` when the backend keeps
    /// no such metadata (in-memory ledgers).
    fn describe(
        &self,
        ledger_id: u64,
    ) -> BoxFuture<'_, Result<Option<LedgerDescription>, LedgerBackendError>> {
        let _ = ledger_id;
        Box::pin(async { Ok(None) })
    }

    /// Largest entry an appender accepts. Larger appends are refused by the
    /// log before they reach the ledger (an add failing in the ledger would
    /// stop the log's appends).
    fn entry_bytes_max(&self) -> usize {
        usize::MAX
    }
}

/// The writer of one open ledger, as a backend provides it: ordered adds in a
/// bounded window. Its caller issues adds from one place at a time
/// (`queue::AppendQueue`): `reserve`, then `add`.
pub trait OpenLedger: Send + Sync + fmt::Debug {
    /// Id of the ledger written.
    fn ledger_id(&self) -> u64;

    /// Reserves room in the window of adds in flight for the next add, of
    /// `payload_bytes`. Reserving again before that add reuses the room.
    fn reserve(&self, payload_bytes: usize) -> Reserve;

    /// Issues an add into the room reserved for it. Adds are ordered by call
    /// order (entry ids from 0); `done` runs once, in entry order.
    fn add(&self, data: Bytes, done: AddCallback);

    /// Waits for the adds in flight, then closes the ledger at its last entry.
    fn close(&self) -> BoxFuture<'static, Result<(), LedgerBackendError>>;
}
