//! One log's share of the entry cache: its entries by position, its readers'
//! marks, behind one short lock of its own.
//!
//! Owns: `Shared` (the entries and marks; the evictor reaches it through the
//! registry), `LogCache` (the log's handle: insert, look up, drop ledgers;
//! dropping it gives every byte back) and `ReadMark` (one active reader).
//! Never: takes another log's lock or the registry's lock while holding its
//! own, or calls into the log.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use super::{ENTRY_OVERHEAD_BYTES, Inner};
use crate::Position;

/// Bytes charged for caching `payload_bytes`.
pub(super) fn charge_of(payload_bytes: usize) -> u64 {
    payload_bytes as u64 + ENTRY_OVERHEAD_BYTES
}

pub(super) struct Cached {
    pub(super) data: Bytes,
    /// Insertion order across all logs.
    pub(super) seq: u64,
}

#[derive(Default)]
pub(super) struct State {
    pub(super) entries: BTreeMap<Position, Cached>,
    /// Bytes charged for `entries`.
    pub(super) bytes: u64,
    /// Active readers' next positions, by mark id (a handful per log).
    marks: Vec<(u64, Position)>,
    next_mark_id: u64,
    /// The log dropped its cache: nothing more is inserted.
    closed: bool,
}

impl State {
    /// Entries below this were passed by every active reader (`None`: no
    /// active reader, every entry counts as passed).
    pub(super) fn passed_below(&self) -> Option<Position> {
        self.marks.iter().map(|(_, position)| *position).min()
    }

    /// Drops the lowest entry if it is below `below`; its charge.
    pub(super) fn pop_below(&mut self, below: Option<Position>) -> Option<u64> {
        let (position, _) = self.entries.first_key_value()?;
        if below.is_some_and(|below| *position >= below) {
            return None;
        }
        let (_, cached) = self.entries.pop_first()?;
        let charge = charge_of(cached.data.len());
        self.bytes -= charge;
        if self.entries.is_empty() {
            // An emptied map keeps its root node (~600 bytes): a log read
            // at the tail is empty most of the time.
            self.entries = BTreeMap::new();
        }
        Some(charge)
    }

    /// The insertion number of the lowest entry.
    pub(super) fn front_seq(&self) -> Option<u64> {
        self.entries.first_key_value().map(|(_, cached)| cached.seq)
    }
}

/// A log's entries and marks, shared by its handle, its marks and the
/// evictor.
pub(crate) struct Shared {
    pub(super) state: Mutex<State>,
    /// Marks registered: read without the lock on every confirmed entry.
    readers: AtomicUsize,
}

impl Shared {
    pub(super) fn new() -> Shared {
        Shared {
            state: Mutex::new(State::default()),
            readers: AtomicUsize::new(0),
        }
    }
}

/// Entries found in the cache from a position on.
#[derive(Debug, Default)]
pub(crate) struct CachedRun {
    /// Consecutive cached entries from the position asked for (empty when
    /// that position is not cached).
    pub(crate) entries: Vec<(Position, Bytes)>,
    /// When `entries` is empty: the first cached position after the one
    /// asked for, up to the range's end (where a bookie read should stop).
    pub(crate) next_cached: Option<Position>,
}

/// One log's handle on the cache. Dropping it drops the log's entries.
pub(crate) struct LogCache {
    cache: Arc<Inner>,
    id: u64,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for LogCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LogCache")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl LogCache {
    pub(super) fn new(cache: Arc<Inner>, id: u64, shared: Arc<Shared>) -> LogCache {
        LogCache { cache, id, shared }
    }

    /// True while a reader has a mark on the log (confirmed entries are
    /// worth caching).
    pub(crate) fn has_readers(&self) -> bool {
        self.shared.readers.load(Ordering::Acquire) > 0
    }

    /// Caches a copy of `data` at `position` if the budget has room and no
    /// mark has passed it already; false when it was not cached.
    pub(crate) fn insert(&self, position: Position, data: &Bytes) -> bool {
        let charge = charge_of(data.len());
        {
            let state = self.shared.state.lock();
            let passed = state.passed_below().is_some_and(|below| position < below);
            if state.closed || passed || state.entries.contains_key(&position) {
                return false;
            }
        }
        if !self.cache.try_reserve(charge) {
            return false;
        }
        // The copy: an allocation of exactly the payload's size, taken
        // outside the lock.
        let copy = Bytes::copy_from_slice(data);
        let seq = self.cache.next_seq();
        let mut state = self.shared.state.lock();
        if state.closed || state.entries.contains_key(&position) {
            drop(state);
            self.cache.release(charge, 0);
            return false;
        }
        state.entries.insert(position, Cached { data: copy, seq });
        state.bytes += charge;
        drop(state);
        self.cache.entries.fetch_add(1, Ordering::Relaxed);
        self.cache.counters.inserted.fetch_add(1, Ordering::Relaxed);
        true
    }

    /// The cached entries from `from` on, consecutive in `from`'s ledger up
    /// to entry `last_entry_id`, at most `entries_max` and about `bytes_max`
    /// bytes (at least one when `from` is cached).
    pub(crate) fn run_from(
        &self,
        from: Position,
        last_entry_id: u64,
        entries_max: usize,
        bytes_max: usize,
    ) -> CachedRun {
        let last = Position::new(from.ledger_id, last_entry_id);
        let mut run = CachedRun::default();
        let state = self.shared.state.lock();
        let mut expected = from;
        let mut bytes = 0usize;
        for (position, cached) in state.entries.range(from..=last) {
            if *position != expected {
                if run.entries.is_empty() {
                    run.next_cached = Some(*position);
                }
                break;
            }
            if run.entries.len() >= entries_max || (!run.entries.is_empty() && bytes >= bytes_max) {
                break;
            }
            bytes += cached.data.len();
            run.entries.push((*position, cached.data.clone()));
            expected = Position::new(position.ledger_id, position.entry_id + 1);
        }
        drop(state);
        self.cache
            .counters
            .hits
            .fetch_add(run.entries.len() as u64, Ordering::Relaxed);
        run
    }

    /// Counts entries read from the bookies.
    pub(crate) fn count_misses(&self, entries: usize) {
        self.cache
            .counters
            .misses
            .fetch_add(entries as u64, Ordering::Relaxed);
    }

    /// Drops the entries of ledgers below `ledger_id` (trimmed).
    pub(crate) fn remove_ledgers_below(&self, ledger_id: u64) {
        let below = Some(Position::new(ledger_id, 0));
        let (mut bytes, mut count) = (0u64, 0u64);
        {
            let mut state = self.shared.state.lock();
            while let Some(charge) = state.pop_below(below) {
                bytes += charge;
                count += 1;
            }
        }
        self.cache.release(bytes, count);
    }

    /// Registers an active reader that reads next at `next`.
    pub(crate) fn register_reader(&self, next: Position) -> ReadMark {
        let mut state = self.shared.state.lock();
        let id = state.next_mark_id;
        state.next_mark_id += 1;
        // A handful per log, most often one: no spare slots kept.
        state.marks.reserve_exact(1);
        state.marks.push((id, next));
        self.shared.readers.fetch_add(1, Ordering::AcqRel);
        drop(state);
        ReadMark {
            cache: Arc::clone(&self.cache),
            shared: Arc::clone(&self.shared),
            id,
        }
    }

    /// Bytes charged for this log's entries now.
    pub(crate) fn bytes(&self) -> u64 {
        self.shared.state.lock().bytes
    }
}

impl Drop for LogCache {
    fn drop(&mut self) {
        self.cache.unregister(self.id);
        let (bytes, count) = {
            let mut state = self.shared.state.lock();
            state.closed = true;
            let count = state.entries.len() as u64;
            state.entries.clear();
            (std::mem::take(&mut state.bytes), count)
        };
        self.cache.release(bytes, count);
    }
}

/// An active reader of one log: where it reads next. While it exists the
/// log caches what it confirms; entries every mark has passed are dropped
/// when the slowest mark moves. Dropping it unregisters the reader.
///
/// For a catch-up reader (read-ahead): register a mark at the reader's
/// position, read ahead with `CacheMisses::Insert`, and `advance` the mark
/// as entries are handed on; what was read ahead stays cached (within the
/// budget) until the reader passes it.
pub struct ReadMark {
    cache: Arc<Inner>,
    shared: Arc<Shared>,
    id: u64,
}

impl std::fmt::Debug for ReadMark {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReadMark")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl ReadMark {
    /// The reader reads next at `next` (forward as it reads, back after a
    /// seek). Entries every mark of the log has passed are dropped now.
    pub fn set(&self, next: Position) {
        let (bytes, count) = {
            let mut state = self.shared.state.lock();
            if let Some(mark) = state.marks.iter_mut().find(|(id, _)| *id == self.id) {
                mark.1 = next;
            }
            drop_passed(&mut state)
        };
        self.cache.release(bytes, count);
        self.cache
            .counters
            .evicted_passed
            .fetch_add(count, Ordering::Relaxed);
    }
}

impl Drop for ReadMark {
    fn drop(&mut self) {
        let mut state = self.shared.state.lock();
        state.marks.retain(|(id, _)| *id != self.id);
        if state.marks.is_empty() {
            state.marks = Vec::new();
        }
        self.shared.readers.fetch_sub(1, Ordering::AcqRel);
        // The last reader leaves: the entries stay until the evictor needs
        // room (a reader coming back soon finds them).
        let (bytes, count) = if state.marks.is_empty() {
            (0, 0)
        } else {
            drop_passed(&mut state)
        };
        drop(state);
        self.cache.release(bytes, count);
        self.cache
            .counters
            .evicted_passed
            .fetch_add(count, Ordering::Relaxed);
    }
}

/// Drops the entries every mark has passed (none without marks); their
/// charge and count.
fn drop_passed(state: &mut State) -> (u64, u64) {
    let Some(below) = state.passed_below() else {
        return (0, 0);
    };
    let (mut bytes, mut count) = (0u64, 0u64);
    while let Some(charge) = state.pop_below(Some(below)) {
        bytes += charge;
        count += 1;
    }
    (bytes, count)
}
