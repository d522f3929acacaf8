//! Ledger storage: where entries live once the journal has made them durable.
//!
//! Owns one ledger dir: the write cache (`write_cache`), entry logs (`entry_log`),
//! the index and per-ledger state in redb (`index`), the read cache
//! (`read_cache`), the checkpoint file `lastMark`, the `LOCK` file, and garbage
//! collection (`gc`). File names and byte layouts live in `format` only.
//!
//! Flow: `put_entry` inserts into the active write cache (memory only, no I/O,
//! typed `WriteCacheFull` when the budget is used; `wait_for_write_room` lets an
//! async caller wait for the flush that frees it). The bookie's sync thread calls
//! `checkpoint(mark)`: the cache halves swap, the flushed half is written sorted by
//! (ledger, entry) to the active entry log with incremental write-back, the log is
//! fdatasync'ed, the index records and ledger state are committed in one durable
//! redb transaction, then `lastMark` is replaced atomically. Reads look in the
//! active half, the flushing half, the read cache, then index + entry log.
//!
//! Durability contract (with the journal):
//! - An entry is durable through the JOURNAL when its ADD is answered. Storage
//!   makes it durable on its own only at the next flush; after a crash, entries
//!   not flushed are simply absent and come back through journal replay from the
//!   checkpointed mark, which re-puts them (`put_entry` is idempotent, and a flush
//!   drops entries the index already holds).
//! - Fenced flag, explicit LAC and deletion change memory at once and reach the
//!   index database at the next flush/checkpoint; until then the journal's record
//!   is what makes them durable. Callers must therefore call `set_fenced`,
//!   `set_explicit_lac`, `delete_ledger` (like `put_entry`) BEFORE appending the
//!   journal record: a checkpoint whose mark covers the record then also covers
//!   the state change.
//! - `checkpoint(mark)` persists `mark` only after everything put before the call
//!   is in fdatasync'ed entry logs and a committed index, so journal files before
//!   the mark may then be deleted.
//!
//! Threads: every method takes `&self` and may be called from any thread.
//! `put_entry`, state setters and cache hits hold a mutex for a few map operations
//! and never do I/O (safe on a tokio worker). `get_entry` misses do `pread`s and
//! index reads: call them via `spawn_blocking`. `flush`, `checkpoint` and `gc` do
//! heavy I/O: call them from dedicated threads. Flushes serialize on the flush
//! lock; a gc pass takes it only step by step (a snapshot, one compaction slice,
//! one index commit), so a flush waits for at most one step, and its reads,
//! pacing and file deletions run with no lock held (`gc` module doc).
//!
//! Shutdown: dropping storage flushes nothing; a clean stop calls `checkpoint`
//! first (otherwise the next open replays more journal, losing nothing).
//! Errors while writing (ENOSPC included) turn storage `Broken`: it refuses
//! writes from then on and keeps serving reads; the bookie turns failed and,
//! once the disk is healthy, opens a new `LedgerStorage` on the directory
//! (a new entry log, the journal replayed from the last checkpoint).
//!
//! Never: answers for the journal's durability, grows a cache past its budget,
//! panics on bytes read back from disk, retries a failed fsync (storage turns
//! `Broken` and the bookie replaces it).

mod compact;
mod config;
mod entry_log;
mod error;
mod format;
mod fs;
mod gc;
mod index;
mod read_cache;
mod read_gate;
mod stats;
mod write_cache;

use std::collections::{HashMap, HashSet};
use std::fs::File;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::{Condvar, Mutex};

pub use config::{
    ENTRY_PAYLOAD_BYTES_MAX, FailPoint, LOG_READ_PIECE_BYTES, LOG_READS_IN_FLIGHT_DEFAULT,
    StorageConfig,
};
pub use error::StorageError;
pub use format::RecordCheck;
pub use stats::{FlushStats, GcStats, GcTimings, StorageStats};

use crate::JournalMark;
use entry_log::{EntryLogWriter, FlushPace, LogReaders};
use index::{Batch, Index, LedgerState, NewRecord};
use read_cache::ReadCache;
use write_cache::{CacheHalf, WriteCache, accounted_bytes, accounted_bytes_of_len};

/// Where `get_entry_from` found an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ReadSource {
    /// Memory: the write cache (either half) or the read cache.
    Cache,
    /// An entry log (index lookup and `pread`, with read-ahead for a
    /// sequential reader).
    EntryLog,
}

/// Ledger storage of one ledger dir. `Send + Sync`; share it in an `Arc`.
#[derive(Debug)]
pub struct LedgerStorage {
    config: StorageConfig,
    dir: PathBuf,
    /// Holds the flock on `LOCK` for the storage's lifetime.
    _lock: File,
    state: Mutex<State>,
    /// Signalled when a flush is wanted (threshold passed or cache full).
    flush_wanted: Condvar,
    /// Wakes `wait_for_write_room` waiters: at the end of every flush (the
    /// flushed half is freed) and when storage turns broken (no room will
    /// come; their puts are refused at once).
    write_room_freed: tokio::sync::Notify,
    /// The flusher: one flush, checkpoint or gc step at a time. A gc pass
    /// takes it per step (a snapshot, one compaction slice, one commit), never
    /// for the whole pass.
    flusher: Mutex<Flusher>,
    /// One gc pass at a time (taken for the whole pass, before `flusher`).
    gc: Mutex<gc::GcState>,
    index: Index,
    readers: LogReaders,
    /// Bounds entry-log reads at the disk (`StorageConfig::log_reads_in_flight_max`).
    log_reads: read_gate::ReadGate,
    read_cache: Mutex<ReadCache>,
    counters: Counters,
    /// Test-only simulated crash point (`StorageConfig::fail_point`, or set later).
    fail_point: Mutex<Option<FailPoint>>,
    /// Test-only: called by a gc pass after each compaction slice, no lock held.
    gc_slice_hook: Mutex<Option<gc::GcSliceHook>>,
}

/// What `LedgerStorage::put_entry_unless_fenced` did with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Put {
    /// In the write cache (or there already).
    Stored,
    /// Not stored: the ledger is fenced.
    Fenced,
}

/// See `LedgerStorage::flush_pace`.
const FLUSH_CATCH_UP_FRACTION_INVERSE: u64 = 8;

/// Everything puts and reads share, behind one short-held mutex.
#[derive(Debug)]
struct State {
    cache: WriteCache,
    /// Every ledger known here (present = exists), deleted ones as tombstones.
    ledgers: crate::IdMap<u64, LedgerState>,
    /// Ledgers whose state changed since the last swap.
    dirty: crate::IdSet<u64>,
    flush_requested: bool,
    /// Set by a failed flush: the first failure, refusing all writes after it.
    broken: Option<String>,
}

#[derive(Debug)]
struct Flusher {
    writer: EntryLogWriter,
    next_log_id: u64,
    mark: JournalMark,
}

#[derive(Debug, Default)]
struct Counters {
    write_cache_full: AtomicU64,
    read_cache_hits: AtomicU64,
    entry_log_reads: AtomicU64,
    /// Bytes `pread` from entry logs (read-ahead included).
    entry_log_read_bytes: AtomicU64,
    flushes: AtomicU64,
    flushed_bytes: AtomicU64,
    /// The longest a flush waited for the flush lock, ns.
    flush_lock_wait_max_ns: AtomicU64,
    /// Copy of the flusher's active log id, readable without the flush lock.
    active_log_id: AtomicU64,
    /// The write cache's size as last seen under the state lock (by a put, a
    /// room check or the end of a flush): lets `has_write_room` answer "room"
    /// without the lock, and `flush_pace` see adds piling up.
    /// Flushes only shrink the cache, so a stale value errs towards "full",
    /// which the room check then verifies under the lock.
    write_cache_bytes_seen: AtomicU64,
    /// Copy of the flusher's checkpoint mark, readable without the flush lock.
    checkpoint_mark: Mutex<JournalMark>,
    last_flush: Mutex<FlushStats>,
}

impl LedgerStorage {
    /// Opens (creating if needed) the ledger dir; returns storage and the
    /// checkpointed journal mark (`JournalMark::START` if none): journal replay
    /// starts there. A new entry log is started on every open, so a torn tail of
    /// the previous active log is never appended to (its unindexed bytes are
    /// garbage for gc).
    pub fn open(config: StorageConfig) -> Result<(LedgerStorage, JournalMark), StorageError> {
        config.validate()?;
        let dir = config.ledger_dir.clone();
        if !dir.exists() {
            std::fs::create_dir_all(&dir).map_err(|e| StorageError::io("create dir", &dir, e))?;
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                fs::sync_dir(parent)?;
            }
        }
        let lock = fs::lock_dir(&dir.join(format::LOCK_FILE_NAME))?;
        let mark = read_last_mark(&dir)?;
        let (index, loaded) = Index::open(&dir, config.index_cache_bytes_max)?;

        let mut max_id = loaded.next_log_id.checked_sub(1);
        for id in loaded.log_ids.iter().copied().chain(list_log_ids(&dir)?) {
            max_id = max_id.max(Some(id));
        }
        let active_id = max_id.map_or(1, |m| m + 1);
        let direct = config.direct_writes
            && crate::direct_io::choose_direct_io(&dir, "ledger storage entry logs");
        let writer = EntryLogWriter::create(
            &dir,
            active_id,
            direct,
            config.writeback_step_bytes,
            config.entry_log_size_max_bytes,
        )?;
        let fail_point = config.fail_point;
        let storage = LedgerStorage {
            read_cache: Mutex::new(ReadCache::new(config.read_cache_bytes_max)),
            readers: LogReaders::new(&dir),
            log_reads: read_gate::ReadGate::new(config.log_reads_in_flight_max),
            state: Mutex::new(State {
                cache: WriteCache::default(),
                ledgers: loaded.ledgers.into_iter().collect(),
                dirty: crate::IdSet::default(),
                flush_requested: false,
                broken: None,
            }),
            flush_wanted: Condvar::new(),
            write_room_freed: tokio::sync::Notify::new(),
            flusher: Mutex::new(Flusher {
                writer,
                next_log_id: active_id + 1,
                mark,
            }),
            gc: Mutex::new(gc::GcState::default()),
            index,
            config,
            dir,
            _lock: lock,
            counters: Counters {
                active_log_id: AtomicU64::new(active_id),
                checkpoint_mark: Mutex::new(mark),
                ..Counters::default()
            },
            fail_point: Mutex::new(fail_point),
            gc_slice_hook: Mutex::new(None),
        };
        Ok((storage, mark))
    }

    /// Test-only: arms (or clears) a simulated crash point.
    #[doc(hidden)]
    pub fn set_fail_point(&self, fail_point: Option<FailPoint>) {
        *self.fail_point.lock() = fail_point;
    }

    /// Test-only: `hook` is called by gc passes after each compaction slice is
    /// committed, with no lock held (a test pauses a pass there).
    #[doc(hidden)]
    pub fn set_gc_slice_hook(&self, hook: Option<Arc<dyn Fn() + Send + Sync>>) {
        *self.gc_slice_hook.lock() = hook.map(gc::GcSliceHook);
    }

    /// The configuration storage was opened with.
    pub fn config(&self) -> &StorageConfig {
        &self.config
    }

    /// Stores an entry in the write cache. No I/O; durable only through the
    /// journal until the next flush. Idempotent: re-putting a (ledger, entry) that
    /// is cached keeps the first payload; one already flushed is dropped at the
    /// next flush. Errors: `WriteCacheFull` (back-pressure; a flush is requested),
    /// `EntryTooLarge`, `LedgerDeleted`, `Broken`.
    ///
    /// Call it BEFORE appending the entry to the journal (so a checkpoint whose
    /// mark covers the journal record also covers the entry). Journal replay,
    /// which may re-put more than the cache holds, answers `WriteCacheFull` with
    /// `flush()` and a retry, and `LedgerDeleted` by skipping the record.
    pub fn put_entry(
        &self,
        ledger_id: u64,
        entry_id: u64,
        payload: Bytes,
    ) -> Result<(), StorageError> {
        match self.put_entry_unless_fenced(ledger_id, entry_id, payload, false)? {
            Put::Stored => Ok(()),
            Put::Fenced => unreachable!("a put that ignores the fence is never refused for it"),
        }
    }

    /// As `put_entry`; with `refuse_fenced` (a writer's add), a fenced
    /// ledger's entry is not stored (`Put::Fenced`), checked under the same
    /// lock as the put (one lock per add, not two).
    pub fn put_entry_unless_fenced(
        &self,
        ledger_id: u64,
        entry_id: u64,
        payload: Bytes,
        refuse_fenced: bool,
    ) -> Result<Put, StorageError> {
        if payload.len() > ENTRY_PAYLOAD_BYTES_MAX as usize {
            return Err(StorageError::EntryTooLarge {
                ledger_id,
                entry_id,
                payload_bytes: payload.len() as u64,
                max_bytes: u64::from(ENTRY_PAYLOAD_BYTES_MAX),
            });
        }
        let needed = accounted_bytes(&payload);
        let mut st = self.state.lock();
        if let Some(reason) = &st.broken {
            return Err(StorageError::Broken(reason.clone()));
        }
        match st.ledgers.get(&ledger_id) {
            Some(l) if l.deleted => return Err(StorageError::LedgerDeleted { ledger_id }),
            Some(l) if refuse_fenced && l.fenced => return Ok(Put::Fenced),
            Some(_) => {}
            None => {
                st.ledgers.insert(ledger_id, LedgerState::default());
                st.dirty.insert(ledger_id);
            }
        }
        if st.cache.contains(ledger_id, entry_id) {
            return Ok(Put::Stored);
        }
        let used = st.cache.bytes();
        if used + needed > self.config.write_cache_bytes_max {
            self.counters
                .write_cache_full
                .fetch_add(1, Ordering::Relaxed);
            self.request_flush(&mut st);
            return Err(StorageError::WriteCacheFull {
                used_bytes: used,
                max_bytes: self.config.write_cache_bytes_max,
                needed_bytes: needed,
            });
        }
        st.cache.active.insert(ledger_id, entry_id, payload);
        debug_assert!(st.cache.bytes() <= self.config.write_cache_bytes_max);
        self.counters
            .write_cache_bytes_seen
            .store(st.cache.bytes(), Ordering::Relaxed);
        if st.cache.active.bytes() >= self.config.flush_threshold_bytes {
            self.request_flush(&mut st);
        }
        Ok(Put::Stored)
    }

    /// Whether the write cache has room now for an entry of `payload_bytes`
    /// (a flush is requested when it has not). A hint for back-pressure:
    /// `put_entry` still decides.
    pub fn has_write_room(&self, payload_bytes: usize) -> bool {
        let needed = accounted_bytes_of_len(payload_bytes);
        let max = self.config.write_cache_bytes_max;
        if self.counters.write_cache_bytes_seen.load(Ordering::Relaxed) + needed <= max {
            return true;
        }
        let mut st = self.state.lock();
        let used = st.cache.bytes();
        self.counters
            .write_cache_bytes_seen
            .store(used, Ordering::Relaxed);
        let room = used + needed <= max;
        if !room {
            self.request_flush(&mut st);
        }
        room
    }

    /// Waits until the write cache has room for an entry of `payload_bytes`
    /// (true), or until `deadline` passes or storage turns broken (false: the
    /// put that follows decides). Woken by the end of each flush, so a waiting
    /// add goes on as soon as the flushed half is freed. Never blocks the
    /// calling thread (for the bookie server's read loops).
    pub async fn wait_for_write_room(
        &self,
        payload_bytes: usize,
        deadline: tokio::time::Instant,
    ) -> bool {
        // The common case, without registering a waiter (a lock in `Notify`).
        if self.has_write_room(payload_bytes) {
            return true;
        }
        loop {
            let mut freed = std::pin::pin!(self.write_room_freed.notified());
            // Registered before the check: a flush that ends between the check
            // and the await still wakes this waiter.
            freed.as_mut().enable();
            if self.has_write_room(payload_bytes) {
                return true;
            }
            if self.state.lock().broken.is_some() {
                return false;
            }
            if tokio::time::timeout_at(deadline, freed).await.is_err() {
                return false;
            }
        }
    }

    fn request_flush(&self, st: &mut State) {
        if !st.flush_requested {
            st.flush_requested = true;
            self.flush_wanted.notify_all();
        }
    }

    /// Blocks the calling (sync) thread until a flush is wanted early (the active
    /// cache passed `flush_threshold_bytes`, or a put found the cache full) or
    /// `max_wait` passes. Returns whether a flush was requested. Typical loop:
    /// `storage.wait_for_flush_trigger(cfg.flush_interval); let mark =
    /// journal.last_synced_mark(); storage.checkpoint(mark)?;
    /// journal.delete_files_before(mark);`
    pub fn wait_for_flush_trigger(&self, max_wait: Duration) -> bool {
        let deadline = Instant::now() + max_wait;
        let mut st = self.state.lock();
        while !st.flush_requested {
            if self.flush_wanted.wait_until(&mut st, deadline).timed_out() {
                break;
            }
        }
        std::mem::take(&mut st.flush_requested)
    }

    /// Reads an entry: active cache, flushing cache, read cache, then index +
    /// entry log (verifying CRC and ids; bad bytes are `Corruption`). May do disk
    /// I/O: call from a blocking-allowed thread. `NoSuchLedger` for an unknown or
    /// deleted ledger, `NoSuchEntry` for an absent entry of a known one.
    pub fn get_entry(&self, ledger_id: u64, entry_id: u64) -> Result<Bytes, StorageError> {
        self.get_entry_from(ledger_id, entry_id, RecordCheck::Full)
            .map(|(entry, _)| entry)
    }

    /// As `get_entry`, with `check` saying whether storage checks the
    /// record's CRC32C (`RecordCheck`), and saying where the entry came from
    /// (for the read-path stages).
    pub fn get_entry_from(
        &self,
        ledger_id: u64,
        entry_id: u64,
        check: RecordCheck,
    ) -> Result<(Bytes, ReadSource), StorageError> {
        let overlapping = {
            let st = self.state.lock();
            let Some(l) = st.ledgers.get(&ledger_id).filter(|l| !l.deleted) else {
                return Err(StorageError::NoSuchLedger { ledger_id });
            };
            if let Some(b) = st.cache.get(ledger_id, entry_id) {
                return Ok((b, ReadSource::Cache));
            }
            if l.indexed_last.is_none_or(|m| entry_id > m) {
                return Err(StorageError::NoSuchEntry {
                    ledger_id,
                    entry_id,
                });
            }
            l.overlapping
        };
        let sequential = {
            let mut rc = self.read_cache.lock();
            match rc.get(ledger_id, entry_id) {
                Some((b, crc_checked)) if crc_checked || check == RecordCheck::ReaderVerifies => {
                    self.counters
                        .read_cache_hits
                        .fetch_add(1, Ordering::Relaxed);
                    return Ok((b, ReadSource::Cache));
                }
                // Read for a caller that verifies end to end, unchecked here:
                // a `Full` caller reads the record again (no read-ahead) and
                // checks it, caching the checked copy.
                Some(_) => false,
                None => rc.note_miss(ledger_id, entry_id),
            }
        };
        let read_ahead_bytes = if sequential {
            self.config.read_ahead_bytes_max
        } else {
            0
        };
        // A concurrent compaction may move the entry and delete its old log
        // between the index lookup and the read: the open fails, or the read
        // finds the file cut short (gc truncates a log in steps before the
        // unlink). Look up once more: the index then names the new log. A log
        // that is really bad fails the same way twice.
        let read_once =
            || self.read_from_log(ledger_id, entry_id, overlapping, read_ahead_bytes, check);
        let read = match read_once() {
            Err(StorageError::Io { source, .. })
                if source.kind() == std::io::ErrorKind::NotFound =>
            {
                read_once()
            }
            Err(StorageError::Corruption { .. }) => read_once(),
            r => r,
        };
        // A read-ahead that landed was marked done under the lock that cached
        // it (read_from_log); a failed one is marked done here.
        if sequential && read.is_err() {
            self.read_cache.lock().note_read_ahead_done(ledger_id);
        }
        read.map(|entry| (entry, ReadSource::EntryLog))
    }

    /// Reads the entry from its log, with up to `read_ahead_bytes` of the entries
    /// after it (same ledger, same index record) into the read cache, each
    /// record checked as `check` says.
    fn read_from_log(
        &self,
        ledger_id: u64,
        entry_id: u64,
        overlapping: bool,
        read_ahead_bytes: u64,
        check: RecordCheck,
    ) -> Result<Bytes, StorageError> {
        let Some((log_id, spans)) =
            self.index
                .find(ledger_id, entry_id, overlapping, read_ahead_bytes)?
        else {
            return Err(StorageError::NoSuchEntry {
                ledger_id,
                entry_id,
            });
        };
        self.counters
            .entry_log_reads
            .fetch_add(1, Ordering::Relaxed);
        let start = spans[0].offset;
        let Some(last) = spans.last() else {
            return Err(StorageError::NoSuchEntry {
                ledger_id,
                entry_id,
            });
        };
        let end = last.offset + last.len;
        debug_assert!(end - start <= read_ahead_bytes.max(spans[0].len));
        let buf = self.readers.read_in_pieces(
            log_id,
            start,
            end - start,
            LOG_READ_PIECE_BYTES,
            || self.log_reads.enter(),
        )?;
        self.counters
            .entry_log_read_bytes
            .fetch_add(buf.len() as u64, Ordering::Relaxed);
        let path = self.readers.path(log_id);
        let mut cached = Vec::with_capacity(spans.len());
        let mut wanted = None;
        for (i, s) in spans.iter().enumerate() {
            let rel = (s.offset - start) as usize;
            let rec = buf.slice(rel..rel + s.len as usize);
            match format::decode_record_checked(&rec, ledger_id, s.entry_id, &path, s.offset, check)
            {
                Ok(payload) => {
                    if i == 0 {
                        wanted = Some(payload.clone());
                    }
                    cached.push(((ledger_id, s.entry_id), payload));
                }
                // The wanted entry is bad: that is the caller's answer.
                Err(e) if i == 0 => return Err(e),
                // A bad read-ahead entry is reported when it is asked for.
                Err(_) => break,
            }
        }
        let mut rc = self.read_cache.lock();
        if read_ahead_bytes > 0 {
            rc.note_read_ahead_done(ledger_id);
        }
        if let Some(&((_, last), _)) = cached.last() {
            rc.note_read_ahead_end(ledger_id, last);
        }
        rc.insert_segment(buf.len() as u64, cached, check == RecordCheck::Full);
        drop(rc);
        wanted.ok_or(StorageError::NoSuchEntry {
            ledger_id,
            entry_id,
        })
    }

    /// Highest entry id stored for the ledger (cache or index), `None` if it has
    /// none; `NoSuchLedger` if unknown or deleted.
    pub fn last_entry_id(&self, ledger_id: u64) -> Result<Option<u64>, StorageError> {
        let st = self.state.lock();
        let Some(l) = st.ledgers.get(&ledger_id).filter(|l| !l.deleted) else {
            return Err(StorageError::NoSuchLedger { ledger_id });
        };
        Ok(l.indexed_last.max(st.cache.last_entry_id(ledger_id)))
    }

    /// Whether the ledger exists here (has been put, fenced or given a LAC, and
    /// not deleted).
    pub fn ledger_exists(&self, ledger_id: u64) -> Result<bool, StorageError> {
        Ok(self
            .state
            .lock()
            .ledgers
            .get(&ledger_id)
            .is_some_and(|l| !l.deleted))
    }

    /// Fences the ledger (creating it if unknown, so a recovery fence reaches
    /// bookies that never saw an entry). Returns whether it was already fenced.
    /// In memory now, in the index at the next flush; the journal's FENCE record
    /// (appended AFTER this call) is what makes it durable.
    pub fn set_fenced(&self, ledger_id: u64) -> Result<bool, StorageError> {
        self.update_ledger(ledger_id, |l| std::mem::replace(&mut l.fenced, true))
    }

    /// Whether the ledger is fenced (false for unknown ledgers).
    pub fn is_fenced(&self, ledger_id: u64) -> Result<bool, StorageError> {
        Ok(self
            .state
            .lock()
            .ledgers
            .get(&ledger_id)
            .is_some_and(|l| l.fenced && !l.deleted))
    }

    /// Records an explicit LAC; it never moves back (the larger value is kept).
    /// Durability as for `set_fenced`.
    pub fn set_explicit_lac(&self, ledger_id: u64, lac: u64) -> Result<(), StorageError> {
        self.update_ledger(ledger_id, |l| {
            l.explicit_lac = l.explicit_lac.max(Some(lac))
        })
    }

    /// The explicit LAC, if one was set. `NoSuchLedger` if unknown or deleted.
    pub fn explicit_lac(&self, ledger_id: u64) -> Result<Option<u64>, StorageError> {
        match self.state.lock().ledgers.get(&ledger_id) {
            Some(l) if !l.deleted => Ok(l.explicit_lac),
            _ => Err(StorageError::NoSuchLedger { ledger_id }),
        }
    }

    /// Deletes the ledger: reads answer `NoSuchLedger` at once, cached entries are
    /// dropped, the tombstone reaches the index at the next flush, and `gc()`
    /// later removes its index records and frees log space. Idempotent; durability
    /// as for `set_fenced`.
    pub fn delete_ledger(&self, ledger_id: u64) -> Result<(), StorageError> {
        let mut st = self.state.lock();
        if let Some(reason) = &st.broken {
            return Err(StorageError::Broken(reason.clone()));
        }
        let l = st.ledgers.entry(ledger_id).or_default();
        if l.deleted {
            return Ok(());
        }
        l.deleted = true;
        st.dirty.insert(ledger_id);
        st.cache.active.remove_ledger(ledger_id);
        Ok(())
    }

    fn update_ledger<R>(
        &self,
        ledger_id: u64,
        f: impl FnOnce(&mut LedgerState) -> R,
    ) -> Result<R, StorageError> {
        let mut st = self.state.lock();
        if let Some(reason) = &st.broken {
            return Err(StorageError::Broken(reason.clone()));
        }
        let existed = st.ledgers.contains_key(&ledger_id);
        let l = st.ledgers.entry(ledger_id).or_default();
        if l.deleted {
            return Err(StorageError::LedgerDeleted { ledger_id });
        }
        let before = *l;
        let r = f(l);
        // A ledger first seen here must be persisted even if `f` changed nothing.
        if *l != before || !existed {
            st.dirty.insert(ledger_id);
        }
        Ok(r)
    }

    /// Flushes the write cache: entries put before the call end up in
    /// fdatasync'ed entry logs with a committed index, ledger state changes in the
    /// index. Any failure turns storage `Broken` (the bookie must stop).
    pub fn flush(&self) -> Result<FlushStats, StorageError> {
        let (mut flusher, waited) = self.lock_flusher_for_flush();
        self.flush_locked(&mut flusher, waited)
    }

    /// Takes the flush lock for a flush; returns how long that took (also
    /// kept as the maximum in `StorageStats::flush_lock_wait_max`).
    fn lock_flusher_for_flush(&self) -> (parking_lot::MutexGuard<'_, Flusher>, Duration) {
        let asked = Instant::now();
        let flusher = self.flusher.lock();
        let waited = asked.elapsed();
        self.counters
            .flush_lock_wait_max_ns
            .fetch_max(waited.as_nanos() as u64, Ordering::Relaxed);
        (flusher, waited)
    }

    /// Flushes, then persists `mark` as the checkpoint (atomically: temp file,
    /// fsync, rename over `lastMark`, fsync dir). Monotonic: a mark below the
    /// current checkpoint flushes but leaves the checkpoint where it is. After
    /// return the journal may delete files wholly before the checkpoint.
    pub fn checkpoint(&self, mark: JournalMark) -> Result<FlushStats, StorageError> {
        let (mut flusher, waited) = self.lock_flusher_for_flush();
        let stats = self.flush_locked(&mut flusher, waited)?;
        if mark > flusher.mark {
            if let Err(e) = fs::replace_atomically(
                &self.dir,
                format::LAST_MARK_FILE_NAME,
                &format::encode_last_mark(mark),
            ) {
                self.set_broken(&e);
                return Err(e);
            }
            flusher.mark = mark;
            *self.counters.checkpoint_mark.lock() = mark;
        }
        Ok(stats)
    }

    /// Why storage takes no more writes, if an earlier flush failed.
    pub fn failure(&self) -> Option<String> {
        self.state.lock().broken.clone()
    }

    /// The last checkpointed mark.
    pub fn checkpoint_mark(&self) -> JournalMark {
        *self.counters.checkpoint_mark.lock()
    }

    /// Counters and sizes; cheap (takes the state and read-cache mutexes briefly).
    pub fn stats(&self) -> StorageStats {
        let (active_bytes, active_entries, flushing_bytes) = {
            let st = self.state.lock();
            (
                st.cache.active.bytes(),
                st.cache.active.entry_count() as u64,
                st.cache.flushing.as_ref().map_or(0, |f| f.bytes()),
            )
        };
        let c = &self.counters;
        let active_log_id = c.active_log_id.load(Ordering::Relaxed);
        let checkpoint_mark = *c.checkpoint_mark.lock();
        StorageStats {
            write_cache_active_bytes: active_bytes,
            write_cache_active_entries: active_entries,
            write_cache_flushing_bytes: flushing_bytes,
            write_cache_full_count: c.write_cache_full.load(Ordering::Relaxed),
            read_cache_bytes: self.read_cache.lock().bytes(),
            read_cache_hit_count: c.read_cache_hits.load(Ordering::Relaxed),
            entry_log_read_count: c.entry_log_reads.load(Ordering::Relaxed),
            entry_log_read_bytes: c.entry_log_read_bytes.load(Ordering::Relaxed),
            flush_count: c.flushes.load(Ordering::Relaxed),
            flushed_bytes_total: c.flushed_bytes.load(Ordering::Relaxed),
            last_flush: *c.last_flush.lock(),
            flush_lock_wait_max: Duration::from_nanos(
                c.flush_lock_wait_max_ns.load(Ordering::Relaxed),
            ),
            active_log_id,
            checkpoint_mark,
        }
    }

    fn set_broken(&self, e: &StorageError) {
        {
            let mut st = self.state.lock();
            if st.broken.is_some() {
                return;
            }
            tracing::error!(error = %e, dir = %self.dir.display(), "ledger storage broken");
            st.broken = Some(e.to_string());
        }
        self.write_room_freed.notify_waiters();
    }

    fn flush_locked(
        &self,
        f: &mut Flusher,
        lock_wait: Duration,
    ) -> Result<FlushStats, StorageError> {
        // Swap under the state lock; snapshot what the flush needs of each ledger.
        let (half, dirty, snapshot) = {
            let mut st = self.state.lock();
            if let Some(reason) = &st.broken {
                return Err(StorageError::Broken(reason.clone()));
            }
            st.flush_requested = false;
            let dirty: Vec<u64> = st.dirty.drain().collect();
            if st.cache.active.is_empty() && dirty.is_empty() {
                return Ok(FlushStats::default());
            }
            let half = st.cache.swap();
            let mut snapshot = HashMap::new();
            for l in half.ledger_ids() {
                snapshot.insert(l, st.ledgers.get(&l).copied().unwrap_or_default());
            }
            (half, dirty, snapshot)
        };
        match self.write_flush(f, &half, &dirty, &snapshot) {
            Ok(mut stats) => {
                stats.lock_wait_duration = lock_wait;
                self.counters.flushes.fetch_add(1, Ordering::Relaxed);
                *self.counters.last_flush.lock() = stats;
                self.counters
                    .flushed_bytes
                    .fetch_add(stats.bytes_written, Ordering::Relaxed);
                Ok(stats)
            }
            Err(e) => {
                // Keep the flushing half readable; refuse further writes.
                self.set_broken(&e);
                Err(e)
            }
        }
    }

    /// Writes one swapped half out and commits its index. See `flush`.
    fn write_flush(
        &self,
        f: &mut Flusher,
        half: &CacheHalf,
        dirty: &[u64],
        snapshot: &HashMap<u64, LedgerState>,
    ) -> Result<FlushStats, StorageError> {
        let mut stats = FlushStats::default();
        let t0 = Instant::now();
        let mut batch = Batch::default();
        // Per ledger: (lowest, highest) entry id written by this flush.
        let mut written: HashMap<u64, (u64, u64)> = HashMap::new();
        let mut log_bytes: HashMap<(u64, u64), u64> = HashMap::new();
        let mut current: Option<NewRecord> = None;

        for ((ledger_id, entry_id), payload) in half.iter() {
            let Some(l) = snapshot.get(&ledger_id) else {
                continue;
            };
            if l.deleted {
                continue;
            }
            // Journal replay (or a recovery re-add) can re-put flushed entries.
            if l.indexed_last.is_some_and(|m| entry_id <= m)
                && self.index.contains(ledger_id, entry_id, l.overlapping)?
            {
                stats.duplicate_count += 1;
                continue;
            }
            let rec_bytes = format::record_bytes(payload.len());
            let pace = self.flush_pace(half.bytes());
            if f.writer.is_full_for(rec_bytes) {
                let old = self.rotate(f, pace)?;
                batch.set_log_sizes.push((old.0, old.1));
            }
            let log_id = f.writer.log_id();
            let offset = f.writer.append(ledger_id, entry_id, payload, pace)?;
            let fits = current
                .as_ref()
                .is_some_and(|r| r.accepts(ledger_id, log_id, entry_id, offset, rec_bytes));
            if !fits {
                if let Some(r) = current.take() {
                    batch.insert_records.push(r);
                }
                current = Some(NewRecord::new(ledger_id, entry_id, log_id, offset));
            }
            if let Some(r) = current.as_mut() {
                r.push(entry_id, offset, rec_bytes);
            }
            *log_bytes.entry((log_id, ledger_id)).or_default() += rec_bytes;
            let w = written.entry(ledger_id).or_insert((entry_id, entry_id));
            w.0 = w.0.min(entry_id);
            w.1 = w.1.max(entry_id);
            stats.entry_count += 1;
            stats.bytes_written += rec_bytes;
        }
        if let Some(r) = current.take() {
            batch.insert_records.push(r);
        }
        f.writer.sync(self.flush_pace(half.bytes()))?;
        stats.log_write_duration = t0.elapsed();

        if *self.fail_point.lock() == Some(FailPoint::FlushBeforeIndexCommit) {
            return Err(StorageError::Broken(
                "fail point FlushBeforeIndexCommit".into(),
            ));
        }

        // Ledger state: the current in-memory state of dirty and flushed ledgers,
        // with what this flush adds to the index.
        let t1 = Instant::now();
        let new_states: Vec<(u64, LedgerState)> = {
            let st = self.state.lock();
            let ids: HashSet<u64> = dirty
                .iter()
                .copied()
                .chain(written.keys().copied())
                .collect();
            ids.into_iter()
                .map(|id| {
                    let mut s = st.ledgers.get(&id).copied().unwrap_or_default();
                    if let Some(&(lo, hi)) = written.get(&id) {
                        s.overlapping |= s.indexed_last.is_some_and(|m| lo < m);
                        s.indexed_last = s.indexed_last.max(Some(hi));
                    }
                    (id, s)
                })
                .collect()
        };
        stats.index_record_count = batch.insert_records.len() as u64;
        batch.add_log_ledger_bytes = log_bytes
            .iter()
            .map(|(&(log, l), &b)| (log, l, b))
            .collect();
        batch
            .set_log_sizes
            .push((f.writer.log_id(), f.writer.size_bytes()));
        batch.put_ledgers = new_states.clone();
        batch.next_log_id = Some(f.next_log_id);
        self.index.commit(&batch)?;
        stats.index_commit_duration = t1.elapsed();

        let mut st = self.state.lock();
        for (id, s) in new_states {
            if let Some(cur) = st.ledgers.get_mut(&id) {
                cur.indexed_last = s.indexed_last;
                cur.overlapping = s.overlapping;
            }
        }
        st.cache.finish_flush();
        self.counters
            .write_cache_bytes_seen
            .store(st.cache.bytes(), Ordering::Relaxed);
        drop(st);
        self.write_room_freed.notify_waiters();
        Ok(stats)
    }

    /// How a flush's write-out of entry logs shares the device (compaction
    /// always yields: `compact::COMPACTION_PACE`): `Yield` while the cache holds
    /// less than `1 / FLUSH_CATCH_UP_FRACTION_INVERSE` of a flush threshold
    /// that this write-out will not free (for a flush: what puts added since
    /// it began). Past that, whole buffers: a flush that yields under a
    /// throughput load keeps the cache full and the adds waiting (bookie
    /// bench, 64 KiB at depth 256: peak RSS 200-282 MiB when flushes yielded
    /// until the next flush was due, 124-165 MiB always at full speed).
    fn flush_pace(&self, freed_bytes: u64) -> FlushPace {
        let cache_bytes = self.counters.write_cache_bytes_seen.load(Ordering::Relaxed);
        let waiting_bytes = cache_bytes.saturating_sub(freed_bytes);
        if waiting_bytes.saturating_mul(FLUSH_CATCH_UP_FRACTION_INVERSE)
            >= self.config.flush_threshold_bytes
        {
            FlushPace::CatchUp
        } else {
            FlushPace::Yield
        }
    }

    /// Closes the active log (synced) and starts the next; returns (closed id, size).
    fn rotate(&self, f: &mut Flusher, pace: FlushPace) -> Result<(u64, u64), StorageError> {
        let size = f.writer.size_bytes();
        let id = f.next_log_id;
        f.next_log_id += 1;
        let old = f.writer.rotate(id, pace)?;
        self.counters.active_log_id.store(id, Ordering::Relaxed);
        Ok((old, size))
    }
}

/// Reads `lastMark`; `START` if there is none.
fn read_last_mark(dir: &std::path::Path) -> Result<JournalMark, StorageError> {
    let path = dir.join(format::LAST_MARK_FILE_NAME);
    match std::fs::read(&path) {
        Ok(b) => format::decode_last_mark(&b, &path),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(JournalMark::START),
        Err(e) => Err(StorageError::io("read", &path, e)),
    }
}

/// Ids of the entry logs in `dir`, by file name.
fn list_log_ids(dir: &std::path::Path) -> Result<Vec<u64>, StorageError> {
    let mut ids = Vec::new();
    for ent in std::fs::read_dir(dir).map_err(|e| StorageError::io("read dir", dir, e))? {
        let ent = ent.map_err(|e| StorageError::io("read dir", dir, e))?;
        if let Some(id) = ent
            .file_name()
            .to_str()
            .and_then(format::parse_entry_log_file_name)
        {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

const _: () = assert!(index::INDEX_RECORD_ENTRIES_MAX > 0);
#[allow(dead_code)]
fn _assert_send_sync() {
    fn is<T: Send + Sync>() {}
    is::<LedgerStorage>();
    is::<Arc<LedgerStorage>>();
}
