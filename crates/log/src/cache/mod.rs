//! `EntryCache`: one byte budget over the cached entries of every log of a
//! broker (Pulsar's `managedLedgerCacheSizeMB`).
//!
//! Owns: the budget and its one byte count (`Inner::used_bytes`, an atomic
//! every insert reserves from before it stores anything), the registry of
//! the logs' caches (`LogCache`, one per open log: its entries by position
//! behind its own short lock), the readers' marks (`ReadMark`: where each
//! active reader of a log reads next) and the evictor thread.
//!
//! Who inserts: a log inserts an entry when it is confirmed, but only while
//! the log has an active reader (a reader that registered a `ReadMark`);
//! a write-only log caches nothing (as Pulsar caches nothing for a ledger
//! without active cursors). Readers that want what they read from bookies
//! kept for the next reader (read-ahead) insert it too (`ManagedLog::read`
//! with `CacheMisses::Insert`). Every insert copies the payload into an
//! allocation of its own size, so a cached entry never keeps alive the much
//! larger buffer it was sliced from (a connection's read buffer).
//!
//! Eviction, in this order:
//! 1. a reader that moves its mark drops the entries of its log that every
//!    mark of the log has passed (at once, on the reader's call);
//! 2. when the count passes `EVICTION_TRIGGER_PERCENT` of the budget, the
//!    evictor thread brings it down to `EVICTION_TARGET_PERCENT`: first the
//!    entries every active reader has passed (all entries of a log with no
//!    active reader), then the rest, oldest first: the log whose lowest cached
//!    entry was inserted first loses its lowest entries first.
//!
//! Bound: the count never exceeds the budget (an insert that does not fit is
//! skipped: the reader that wanted it reads it from the bookies), asserted at
//! each reservation; each entry is charged its payload plus
//! `ENTRY_OVERHEAD_BYTES`; a log's cache gives all its bytes back when the
//! log drops it, so the count is zero when nothing is cached.
//! Concurrency: no lock is shared by two logs on the insert or read path
//! (the registry's lock is taken when a log opens or closes and once per
//! eviction pass); an insert costs two atomic additions and the log's lock.
//! Never: blocks an insert or a read on eviction, holds a log's lock while
//! taking another's, or holds an entry that was not confirmed.

mod evict;
mod log_cache;
#[cfg(test)]
mod tests;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::{Condvar, Mutex};

pub(crate) use log_cache::LogCache;
pub use log_cache::ReadMark;

/// Memory charged per cached entry beyond its payload: the map slot (key,
/// value, tree node share) and the allocator's header of the copy, measured
/// as about 60 bytes; rounded up so the budget bounds the real memory.
pub const ENTRY_OVERHEAD_BYTES: u64 = 64;

/// The evictor starts a pass once the cache holds this share of its budget:
/// close to full, so the cache is used, but with room for the inserts that
/// arrive while the evictor wakes up (a few ms of publishing).
pub const EVICTION_TRIGGER_PERCENT: u64 = 95;

/// A pass evicts down to this share of the budget (Pulsar's
/// `managedLedgerCacheEvictionWatermark` is 0.9): each pass frees a tenth of
/// the budget, so passes are rare (about 2 a second at 50 MB/s into 256 MiB)
/// and each costs one walk over the registered logs.
pub const EVICTION_TARGET_PERCENT: u64 = 85;

const _: () = assert!(EVICTION_TARGET_PERCENT < EVICTION_TRIGGER_PERCENT);
const _: () = assert!(EVICTION_TRIGGER_PERCENT <= 100);

/// How long the idle evictor sleeps before checking that its cache still
/// exists (it ends with the cache).
const EVICTOR_IDLE_WAKE: Duration = Duration::from_secs(1);

/// Counters of the cache (a snapshot).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct EntryCacheStats {
    /// The budget.
    pub budget_bytes: u64,
    /// Bytes charged now (payloads plus `ENTRY_OVERHEAD_BYTES` each).
    pub used_bytes: u64,
    /// Entries cached now.
    pub entries: u64,
    /// Logs with a cache registered now.
    pub logs: u64,
    /// Entries inserted since start.
    pub inserted_total: u64,
    /// Inserts skipped because the budget had no room.
    pub insert_skipped_total: u64,
    /// Reads of an entry served from the cache.
    pub hits_total: u64,
    /// Reads of an entry that went to the bookies.
    pub misses_total: u64,
    /// Entries dropped because every reader of their log had passed them.
    pub evicted_passed_total: u64,
    /// Entries dropped by the evictor, oldest first, while readers still
    /// wanted them (the budget was too small for the readers' lag).
    pub evicted_unread_total: u64,
    /// Eviction passes run.
    pub eviction_passes_total: u64,
}

/// The broker-wide entry cache. Cheap to clone (an `Arc`).
#[derive(Clone)]
pub struct EntryCache {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for EntryCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntryCache")
            .field("budget_bytes", &self.inner.budget_bytes)
            .field("used_bytes", &self.inner.used_bytes.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

pub(crate) struct Inner {
    budget_bytes: u64,
    trigger_bytes: u64,
    target_bytes: u64,
    /// Bytes charged for the entries cached now; never above `budget_bytes`.
    used_bytes: AtomicU64,
    /// Insertion order across logs (what "oldest" means).
    insert_seq: AtomicU64,
    entries: AtomicU64,
    /// The logs' caches, by registration id. Taken when a log registers or
    /// drops its cache and by each eviction pass (which copies it out).
    logs: Mutex<HashMap<u64, Weak<log_cache::Shared>>>,
    next_log_id: AtomicU64,
    /// Set by the insert that passes the trigger, cleared by the evictor.
    eviction_wanted: AtomicBool,
    evictor: Mutex<EvictorState>,
    evictor_wake: Condvar,
    counters: Counters,
}

#[derive(Default)]
struct EvictorState {
    started: bool,
    wanted: bool,
}

#[derive(Default)]
struct Counters {
    inserted: AtomicU64,
    insert_skipped: AtomicU64,
    hits: AtomicU64,
    misses: AtomicU64,
    evicted_passed: AtomicU64,
    evicted_unread: AtomicU64,
    passes: AtomicU64,
}

impl EntryCache {
    /// A cache of at most `budget_bytes` (0: nothing is ever cached).
    pub fn new(budget_bytes: u64) -> EntryCache {
        EntryCache {
            inner: Arc::new(Inner {
                budget_bytes,
                trigger_bytes: budget_bytes / 100 * EVICTION_TRIGGER_PERCENT,
                target_bytes: budget_bytes / 100 * EVICTION_TARGET_PERCENT,
                used_bytes: AtomicU64::new(0),
                insert_seq: AtomicU64::new(0),
                entries: AtomicU64::new(0),
                logs: Mutex::new(HashMap::new()),
                next_log_id: AtomicU64::new(0),
                eviction_wanted: AtomicBool::new(false),
                evictor: Mutex::new(EvictorState::default()),
                evictor_wake: Condvar::new(),
                counters: Counters::default(),
            }),
        }
    }

    /// The budget in bytes.
    pub fn budget_bytes(&self) -> u64 {
        self.inner.budget_bytes
    }

    /// Bytes charged now.
    pub fn used_bytes(&self) -> u64 {
        self.inner.used_bytes.load(Ordering::Acquire)
    }

    /// Counters and sizes now.
    pub fn stats(&self) -> EntryCacheStats {
        let c = &self.inner.counters;
        EntryCacheStats {
            budget_bytes: self.inner.budget_bytes,
            used_bytes: self.used_bytes(),
            entries: self.inner.entries.load(Ordering::Relaxed),
            logs: self.inner.logs.lock().len() as u64,
            inserted_total: c.inserted.load(Ordering::Relaxed),
            insert_skipped_total: c.insert_skipped.load(Ordering::Relaxed),
            hits_total: c.hits.load(Ordering::Relaxed),
            misses_total: c.misses.load(Ordering::Relaxed),
            evicted_passed_total: c.evicted_passed.load(Ordering::Relaxed),
            evicted_unread_total: c.evicted_unread.load(Ordering::Relaxed),
            eviction_passes_total: c.passes.load(Ordering::Relaxed),
        }
    }

    /// Runs one eviction pass on the calling thread, down to `target_bytes`
    /// (what the evictor thread does past the trigger; for tests and for an
    /// operator's "clear cache").
    pub fn evict_to(&self, target_bytes: u64) {
        evict::run_pass(&self.inner, target_bytes);
    }

    /// A cache for one log, registered for eviction until dropped.
    pub(crate) fn register_log(&self) -> LogCache {
        let id = self.inner.next_log_id.fetch_add(1, Ordering::Relaxed);
        let shared = Arc::new(log_cache::Shared::new());
        self.inner.logs.lock().insert(id, Arc::downgrade(&shared));
        LogCache::new(Arc::clone(&self.inner), id, shared)
    }
}

impl Inner {
    /// Takes `bytes` of the budget; false (nothing taken) when they do not
    /// fit. Wakes the evictor when the count passes the trigger.
    fn try_reserve(self: &Arc<Self>, bytes: u64) -> bool {
        let mut used = self.used_bytes.load(Ordering::Relaxed);
        loop {
            let Some(next) = used.checked_add(bytes).filter(|n| *n <= self.budget_bytes) else {
                self.counters.insert_skipped.fetch_add(1, Ordering::Relaxed);
                self.want_eviction();
                return false;
            };
            match self.used_bytes.compare_exchange_weak(
                used,
                next,
                Ordering::AcqRel,
                Ordering::Relaxed,
            ) {
                Ok(_) => {
                    // The bound of the whole cache.
                    debug_assert!(next <= self.budget_bytes);
                    if next > self.trigger_bytes {
                        self.want_eviction();
                    }
                    return true;
                }
                Err(actual) => used = actual,
            }
        }
    }

    /// Gives back `bytes` of `entries` dropped entries.
    fn release(&self, bytes: u64, entries: u64) {
        if bytes == 0 && entries == 0 {
            return;
        }
        let before = self.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
        // Accounting: every release matches a reservation.
        debug_assert!(before >= bytes, "cache released {bytes} of {before} bytes");
        let before = self.entries.fetch_sub(entries, Ordering::Relaxed);
        debug_assert!(before >= entries);
    }

    fn next_seq(&self) -> u64 {
        self.insert_seq.fetch_add(1, Ordering::Relaxed)
    }

    fn unregister(&self, id: u64) {
        self.logs.lock().remove(&id);
    }

    /// Asks the evictor thread for a pass (started on first use); cheap when
    /// one is already wanted.
    fn want_eviction(self: &Arc<Self>) {
        if self.eviction_wanted.swap(true, Ordering::AcqRel) {
            return;
        }
        let mut evictor = self.evictor.lock();
        evictor.wanted = true;
        if !evictor.started {
            evictor.started = true;
            let weak = Arc::downgrade(self);
            let spawned = std::thread::Builder::new()
                .name("vela-cache-evict".to_string())
                .spawn(move || evictor_loop(weak));
            if let Err(error) = spawned {
                // Without the thread, readers' marks still drop passed
                // entries and inserts that do not fit are skipped: the bound
                // holds, the cache is just less useful.
                tracing::error!(%error, "cannot start the cache evictor thread");
                evictor.started = false;
                self.eviction_wanted.store(false, Ordering::Release);
            }
        }
        self.evictor_wake.notify_one();
    }
}

/// The evictor thread: waits for a wanted pass, runs it, ends with the cache.
fn evictor_loop(cache: Weak<Inner>) {
    loop {
        let Some(inner) = cache.upgrade() else {
            return;
        };
        {
            let mut evictor = inner.evictor.lock();
            if !evictor.wanted {
                inner.evictor_wake.wait_for(&mut evictor, EVICTOR_IDLE_WAKE);
            }
            if !std::mem::take(&mut evictor.wanted) {
                continue;
            }
        }
        // Cleared before the pass: an insert past the trigger during the pass
        // asks for the next one.
        inner.eviction_wanted.store(false, Ordering::Release);
        if inner.used_bytes.load(Ordering::Acquire) > inner.target_bytes {
            evict::run_pass(&inner, inner.target_bytes);
        }
    }
}
