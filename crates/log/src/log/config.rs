//! What a log is given: its tunables (`LogConfig`, `Retention`) and where it
//! keeps its metadata and ledgers (`LogEnv`).

use std::sync::Arc;
use std::time::Duration;

use crate::backend::{LedgerBackend, Persistence};
use crate::budget::AppendBudget;
use crate::cache::EntryCache;
use crate::offload::{LedgerOffloader, OffloadPolicy};
use crate::store::Store;

/// Entry cache of `LogEnv::new` (tests, embedders): the binary sizes its own
/// from the machine (`--managed-ledger-cache-size-mb`).
pub const ENTRY_CACHE_BYTES_DEFAULT: u64 = 64 << 20;

/// Append budget of `LogEnv::new` (tests, embedders): the binary sizes its
/// own (`--max-message-publish-buffer-mb`).
pub const APPEND_BUDGET_BYTES_DEFAULT: u64 = 256 << 20;

/// How much consumed data a log keeps (Pulsar's retention policy). A fully
/// consumed, closed ledger is deleted once it is older than `time` (since its
/// close) or the log is over `size_bytes` without it; `None` means no limit
/// on that side; both `None`: consumed data is kept forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep consumed ledgers at least this long after they closed.
    pub time: Option<Duration>,
    /// Keep consumed ledgers while the whole log is within this size.
    pub size_bytes: Option<u64>,
}

impl Retention {
    /// No retention: consumed ledgers go at once (Pulsar's default).
    pub const NONE: Retention = Retention {
        time: Some(Duration::ZERO),
        size_bytes: Some(0),
    };
}

/// Tunables of a log. `Default` gives Pulsar's defaults where they apply.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Replication of the ledgers this log creates from now on.
    pub persistence: Persistence,
    /// A ledger is full after this many entries (Pulsar's
    /// `managedLedgerMaxEntriesPerLedger`, 50 000).
    pub ledger_entries_max: u64,
    /// A ledger is full after this many payload bytes (Pulsar's
    /// `managedLedgerMaxSizePerLedgerMbytes`, 2048 MiB).
    pub ledger_bytes_max: u64,
    /// A ledger this old is full (Pulsar's
    /// `managedLedgerMaxLedgerRolloverTimeMinutes`, 240 min); checked at
    /// each append.
    pub ledger_age_max: Duration,
    /// A full ledger rolls over only once older than this (Pulsar's
    /// `managedLedgerMinLedgerRolloverTimeMinutes`, 10 min; zero: at once).
    /// On a log without cursors, a closed ledger is also kept at least this
    /// long after it closed, so readers always find the data of the last
    /// `ledger_age_min` (see `lifecycle`).
    pub ledger_age_min: Duration,
    /// Individually acknowledged entries a cursor keeps above its mark-delete
    /// position; beyond it further individual acks are refused.
    pub cursor_acked_entries_max: usize,
    /// Acked ranges persisted per cursor; holes beyond it are redelivered after
    /// a restart (at-least-once, never loss).
    pub cursor_persisted_ranges_max: usize,
    /// Minimum time between two writes of one cursor's state.
    pub cursor_persist_interval: Duration,
    /// Consumed data kept (see [`Retention`]).
    pub retention: Retention,
    /// When closed ledgers are offloaded and their bookie copies deleted
    /// (used only with an offloader in the `LogEnv`).
    pub offload: OffloadPolicy,
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig {
            persistence: Persistence::SINGLE,
            ledger_entries_max: 50_000,
            ledger_bytes_max: 2048 << 20,
            ledger_age_max: Duration::from_secs(240 * 60),
            ledger_age_min: Duration::from_secs(10 * 60),
            cursor_acked_entries_max: 100_000,
            cursor_persisted_ranges_max: 10_000,
            cursor_persist_interval: Duration::from_millis(100),
            retention: Retention::NONE,
            offload: OffloadPolicy::default(),
        }
    }
}

/// Where logs keep their metadata and their ledgers, and the memory they
/// share: the entry cache and the append budget (one each per broker).
/// One allocation shared by every log opened through it (each log holds a
/// pointer, not ~70 bytes of handles).
#[derive(Debug, Clone)]
pub struct LogEnv {
    pub(crate) parts: Arc<EnvParts>,
}

/// What a [`LogEnv`] holds.
#[derive(Debug, Clone)]
pub(crate) struct EnvParts {
    pub(crate) store: Store,
    pub(crate) ledgers: Arc<dyn LedgerBackend>,
    pub(crate) cache: EntryCache,
    pub(crate) append_budget: AppendBudget,
    /// Where closed ledgers are offloaded; `None`: nowhere (offloads fail).
    pub(crate) offloader: Option<Arc<dyn LedgerOffloader>>,
}

impl LogEnv {
    /// Logs over this metadata store and these ledgers, with a cache of
    /// `ENTRY_CACHE_BYTES_DEFAULT` and an append budget of
    /// `APPEND_BUDGET_BYTES_DEFAULT` (see `with_memory`).
    pub fn new(meta: Arc<dyn vela_meta::MetadataStore>, ledgers: Arc<dyn LedgerBackend>) -> LogEnv {
        LogEnv {
            parts: Arc::new(EnvParts {
                store: Store::new(meta),
                ledgers,
                cache: EntryCache::new(ENTRY_CACHE_BYTES_DEFAULT),
                append_budget: AppendBudget::new(APPEND_BUDGET_BYTES_DEFAULT),
                offloader: None,
            }),
        }
    }

    /// The same, with this entry cache and append budget (shared by every
    /// log opened through it). Set it before opening logs.
    pub fn with_memory(mut self, cache: EntryCache, append_budget: AppendBudget) -> LogEnv {
        let parts = Arc::make_mut(&mut self.parts);
        parts.cache = cache;
        parts.append_budget = append_budget;
        self
    }

    /// The same, offloading closed ledgers through `offloader` (shared by
    /// every log opened through it). Set it before opening logs.
    pub fn with_offloader(mut self, offloader: Arc<dyn LedgerOffloader>) -> LogEnv {
        Arc::make_mut(&mut self.parts).offloader = Some(offloader);
        self
    }

    /// The offloader, if any.
    pub fn offloader(&self) -> Option<&Arc<dyn LedgerOffloader>> {
        self.parts.offloader.as_ref()
    }

    /// The entry cache shared by the logs.
    pub fn cache(&self) -> &EntryCache {
        &self.parts.cache
    }

    /// The append budget shared by the logs.
    pub fn append_budget(&self) -> &AppendBudget {
        &self.parts.append_budget
    }

    /// In-memory metadata and ledgers: real semantics, no durability (tests).
    pub fn in_memory() -> LogEnv {
        LogEnv::new(
            Arc::new(vela_meta::MemoryStore::new()),
            Arc::new(crate::memory::MemoryBackend(
                crate::memory::MemoryLedgers::new(),
            )),
        )
    }

    /// The ledger backend (for tests that inspect ledgers).
    pub fn ledgers(&self) -> &Arc<dyn LedgerBackend> {
        &self.parts.ledgers
    }
}
