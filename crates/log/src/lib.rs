//! vela-log: a topic's managed log. A log is an ordered list of ledgers (kept in
//! the metadata store) that together hold the topic's entries; it appends through
//! one open ledger at a time, rolls over to a new ledger by entries, bytes or age,
//! recovers on load by opening the last ledger with recovery (which fences any
//! previous owner), keeps durable cursors (subscriptions), trims fully consumed
//! ledgers and caches the tail so consumers at the tail never wait on a bookie.
//!
//! Owns: the ledger list and cursor metadata of each log; the broker-wide
//! entry cache (`cache`) and append budget (`budget`); the one ordered queue
//! of appends above the ledger writer (`queue`); the
//! `LedgerBackend` seam (`backend`) with in-memory ledgers (`memory`, tests);
//! the `LedgerOffloader` seam (`offload`) through which closed ledgers go to
//! object storage and are read back (`log::offload` runs it).
//! The backend over the real ledger client is `vela-ledger-backend`'s: this
//! crate depends on neither the ledger client nor the bookie.
//! Never: parses Pulsar frames or metadata (entries are opaque bytes); acknowledges
//! an append before the ledger acknowledged it at Qa; grows a queue or cache
//! without a bound.
//!
//! API contract (used by `vela-broker`):
//! - [`ManagedLog::open`] loads (or creates) the log named e.g.
//!   `public/default/persistent/my-topic`.
//! - [`ManagedLog::append`] never waits; the order of `append` calls is the
//!   log order (no lock needed around it: calls from one task keep their
//!   order, concurrent callers are ordered by who queues first); successful
//!   appends complete in that order with increasing [`Position`]s. Only
//!   `EntryTooLarge` and `Overloaded` refuse one append and let later ones
//!   succeed; any other failure stops the log (every later append fails).
//! - [`ManagedLog::read`] returns entries from a position on (the broker's
//!   [`EntryCache`] first); [`ManagedLog::register_reader`] marks an active
//!   reader, for whom confirmed entries are cached.
//! - [`ManagedLog::entry_waiter`] registers a wake-on-append hook: a task
//!   that is not running is called once an entry at or after a position is
//!   confirmed (or the log stops).
//! - [`ManagedLog::open_cursor`] gives a durable [`Cursor`] (a subscription's
//!   acknowledgement state).

mod position;

pub use position::Position;
pub mod backend;
mod budget;
mod cache;
mod cursor;
mod error;
mod format;
mod log;
pub mod memory;
pub mod offload;
mod queue;
pub mod small_map;
mod store;

pub use backend::{
    LedgerBackend, LedgerBackendError, LedgerDescription, OpenLedger, Persistence, RecoveredLedger,
    Reserve,
};
pub use budget::{AppendBudget, AppendPermit};
pub use cache::{
    ENTRY_OVERHEAD_BYTES, EVICTION_TARGET_PERCENT, EVICTION_TRIGGER_PERCENT, EntryCache,
    EntryCacheStats, ReadMark,
};
pub use cursor::{CURSOR_PROPERTIES_MAX, Cursor, CursorStart};
pub use error::LogError;
pub use log::{
    APPEND_BUDGET_BYTES_DEFAULT, AppendFuture, AppendResult, CacheMisses,
    ENTRY_CACHE_BYTES_DEFAULT, EntryHook, EntryWaiter, LedgerSummary, LogConfig, LogEntry, LogEnv,
    LogStats, ManagedLog, Retention,
};
pub use offload::{
    LedgerOffloader, OFFLOAD_DELETION_LAG_DEFAULT, OffloadCounters, OffloadError, OffloadPolicy,
    OffloadState, OffloadStatus, OffloadTarget,
};
pub use queue::{APPENDER_BYTES_MAX, LedgerAppender};
