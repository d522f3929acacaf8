//! `Bookie`: one storage node's journal and ledger storage tied together behind
//! the operations of the bookie protocol.
//!
//! Owns: the `Journal`, the `LedgerStorage`, the sync thread (checkpoints and
//! gc), and the per-ledger known LAC. On open it replays the journal from the
//! storage's checkpointed mark into storage before serving.
//!
//! Guarantees:
//! - An ADD, fence, explicit LAC or delete is answered OK only after the
//!   journal's fdatasync covers its record (unless the journal's sync is off).
//! - Storage changes first, journal second (`put_entry` / `set_fenced` /
//!   `set_explicit_lac` / `delete_ledger`, then `journal.append`), so a
//!   checkpoint at mark M (taken from the journal, then flushed) covers every
//!   record before M and journal files before M may be deleted.
//! - Adds and fences of one ledger serialize on a stripe lock across "check
//!   fenced, put, append": once a fencing read is answered, every add accepted
//!   before it is durable and visible, and no normal add after it is accepted.
//! - The known LAC of a ledger never moves back: it is the max of the LACs
//!   carried by its entries and any explicit LAC (derived from the last stored
//!   entry when not tracked in memory, e.g. after a restart).
//!
//! Never: blocks in `add`, `fence`, `write_lac` or `delete_ledger` (they only take
//! short locks and enqueue: safe on a tokio worker); reads disk outside
//! `read_entry` / `read_lac` (call those from a blocking-allowed thread); retries
//! a failed sync (a failed checkpoint marks the bookie failed: see `failure`).

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;

use crate::entry::parse_header;
use crate::journal::{
    Journal, JournalConfig, JournalError, JournalRecord, JournalStats, StageSummary,
};
use crate::mark::JournalMark;
use crate::protocol::{AddMode, LAST_ENTRY, Status};
use crate::storage::{LedgerStorage, StorageConfig, StorageError, StorageStats};

/// Stripes of the per-ledger lock (and LAC map): adds of different ledgers
/// rarely contend; a power of two so the stripe is a mask of the ledger id's hash.
const LEDGER_STRIPES: usize = 64;
const _: () = assert!(LEDGER_STRIPES.is_power_of_two());
/// Ledgers whose known LAC is tracked in memory, per stripe. 64 x 16_384 = 1M
/// ledgers x ~40 bytes = ~40 MiB at most. When a stripe is full it is cleared:
/// the LACs it held are derived again from storage when next asked for.
const LAC_TRACKED_PER_STRIPE_MAX: usize = 16_384;
/// The sync thread checks for a flush request or shutdown this often (storage's
/// trigger wait has no way to be woken for shutdown).
const SYNC_POLL_INTERVAL: Duration = Duration::from_millis(50);
/// Default period of storage garbage collection.
pub const GC_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// How to open a `Bookie`.
#[derive(Debug, Clone)]
pub struct BookieConfig {
    /// The journal: directory, sync policy, group commit, queue bound.
    pub journal: JournalConfig,
    /// Ledger storage: directory, cache sizes, flush interval and threshold.
    pub storage: StorageConfig,
    /// How often the sync thread runs storage gc.
    pub gc_interval: Duration,
}

impl BookieConfig {
    /// The journal's and storage's defaults on these directories.
    pub fn new(journal_dir: impl Into<PathBuf>, ledger_dir: impl Into<PathBuf>) -> BookieConfig {
        BookieConfig {
            journal: JournalConfig::new(journal_dir),
            storage: StorageConfig::new(ledger_dir),
            gc_interval: GC_INTERVAL_DEFAULT,
        }
    }
}

/// Why a bookie did not open.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The journal refused to open or replay.
    #[error("journal: {0}")]
    Journal(#[from] JournalError),
    /// Ledger storage refused to open, or failed the post-replay checkpoint.
    #[error("ledger storage: {0}")]
    Storage(#[from] StorageError),
    /// The sync thread could not be started.
    #[error("cannot start the sync thread: {0}")]
    Thread(std::io::Error),
}

/// An entry read from storage, with the bookie's known LAC of its ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StoredEntry {
    /// Id of the entry (the actual one when `LAST_ENTRY` was asked).
    pub entry_id: u64,
    /// The packaged entry as stored.
    pub entry: Bytes,
    /// The known LAC of the ledger.
    pub lac: Option<u64>,
}

/// Journal and storage figures.
#[derive(Debug, Clone)]
pub struct BookieStats {
    /// µs from `Bookie::add` to its durable completion, per accepted add (the
    /// "bookie add" stage of the write path: write cache + journal queue,
    /// write and fdatasync).
    pub add_us: StageSummary,
    /// µs per checkpoint of the sync thread (write cache flush to entry logs,
    /// index commit, `lastMark`).
    pub checkpoint_us: StageSummary,
    /// Journal stage latencies and group sizes.
    pub journal: JournalStats,
    /// Storage caches, flushes and checkpoint.
    pub storage: StorageStats,
}

/// Latency distributions of the bookie's write-path stages (µs).
#[derive(Debug, Clone)]
pub struct BookieHistograms {
    /// `Bookie::add` to durable completion, per accepted add.
    pub add_us: Histogram<u64>,
    /// Journal stages (per group or per fdatasync).
    pub journal: crate::journal::JournalHistograms,
}

/// A storage node. `Send + Sync`: share it in an `Arc`.
#[derive(Debug)]
pub struct Bookie {
    journal: Arc<Journal>,
    storage: Arc<LedgerStorage>,
    stripes: Box<[Mutex<Stripe>]>,
    sync: SyncThread,
    /// Add latency in µs; recorded by the journal's force-write thread.
    add_latency: Arc<Mutex<Histogram<u64>>>,
}

#[derive(Debug, Default)]
struct Stripe {
    lacs: HashMap<u64, KnownLac>,
}

/// What the bookie knows of a ledger's LAC.
#[derive(Debug, Default, Clone, Copy)]
struct KnownLac {
    /// Max LAC seen since tracking began.
    lac: Option<u64>,
    /// Whether `lac` includes what storage held when tracking began; if not,
    /// the storage-derived LAC must be folded in before answering.
    complete: bool,
}

#[derive(Debug)]
struct SyncThread {
    stop: Arc<AtomicBool>,
    failure: Arc<Mutex<Option<String>>>,
    /// µs per checkpoint (storage flush + lastMark); recorded by the thread.
    checkpoint_latency: Arc<Mutex<Histogram<u64>>>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Bookie {
    /// Opens storage, replays the journal from storage's checkpointed mark into
    /// it (entries, fences, explicit LACs, deletions), checkpoints, and starts
    /// the journal threads and the sync thread.
    pub fn open(config: BookieConfig) -> Result<Bookie, OpenError> {
        let (storage, from) = LedgerStorage::open(config.storage.clone())?;
        let storage = Arc::new(storage);
        let started = Instant::now();
        let mut replayed_count = 0u64;
        let journal = Journal::open(config.journal.clone(), from, |record, _mark| {
            replayed_count += 1;
            replay_record(&storage, record)
        })?;
        let journal = Arc::new(journal);
        // Bound the next replay: everything replayed is now in storage.
        let mark = journal.last_synced_mark();
        storage.checkpoint(mark)?;
        journal.delete_files_before(mark)?;
        tracing::info!(
            replayed_count,
            from = ?from,
            to = ?mark,
            elapsed_ms = started.elapsed().as_millis() as u64,
            "bookie journal replayed"
        );
        let sync = SyncThread::start(journal.clone(), storage.clone(), &config)?;
        let stripes = (0..LEDGER_STRIPES)
            .map(|_| Mutex::new(Stripe::default()))
            .collect();
        Ok(Bookie {
            journal,
            storage,
            stripes,
            sync,
            add_latency: Arc::new(Mutex::new(latency_histogram())),
        })
    }

    /// Stores a packaged entry and calls `done` once it is durable, with its
    /// (ledger, entry) ids, or with why not: `BadRequest` (bad header),
    /// `Fenced` (a normal add to a fenced ledger), `TooManyRequests` (journal
    /// queue or write cache full), `NoSuchLedger` (deleted), `IoError`.
    /// `done` runs exactly once: here on refusal, else on the journal's
    /// force-write thread (keep it short). Never blocks.
    pub fn add(
        &self,
        entry: Bytes,
        mode: AddMode,
        done: impl FnOnce(Result<(u64, u64), Status>) + Send + 'static,
    ) {
        let header = match parse_header(&entry) {
            Ok(header) => header,
            Err(error) => {
                tracing::debug!(%error, "ADD with a bad entry header");
                return done(Err(Status::BadRequest));
            }
        };
        let (ledger_id, entry_id) = (header.ledger_id, header.entry_id);
        let started = Instant::now();
        let add_latency = self.add_latency.clone();
        let done_after_journal = move |result: Result<(), Status>| {
            if result.is_ok() {
                let elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
                lock(&add_latency).saturating_record(elapsed_us.max(1));
            }
            done(result.map(|()| (ledger_id, entry_id)))
        };
        // Refusals are answered after the stripe lock is released: `done` may
        // be anything, even a call back into this bookie.
        let refused = {
            let mut stripe = self.stripe(ledger_id);
            match self.check_add(ledger_id, entry_id, mode, &entry) {
                Err(status) => Some((done_after_journal, status)),
                Ok(()) => {
                    stripe.note_lac(ledger_id, header.last_add_confirmed);
                    let record = JournalRecord::Entry {
                        ledger_id,
                        entry_id,
                        payload: entry,
                    };
                    self.append(record, done_after_journal)
                }
            }
        };
        if let Some((done, status)) = refused {
            done(Err(status));
        }
    }

    /// The fence check and the write-cache put of an add (under the stripe lock).
    fn check_add(
        &self,
        ledger_id: u64,
        entry_id: u64,
        mode: AddMode,
        entry: &Bytes,
    ) -> Result<(), Status> {
        if mode == AddMode::Normal
            && self
                .storage
                .is_fenced(ledger_id)
                .map_err(|error| storage_status(&error))?
        {
            return Err(Status::Fenced);
        }
        self.storage
            .put_entry(ledger_id, entry_id, entry.clone())
            .map_err(|error| storage_status(&error))
    }

    /// Fences `ledger_id` (creating its state if this bookie never saw it) and
    /// calls `done` once the fence is durable. After that no normal add to it
    /// succeeds here, and every add accepted before is durable.
    pub fn fence(&self, ledger_id: u64, done: impl FnOnce(Result<(), Status>) + Send + 'static) {
        let refused = {
            let _stripe = self.stripe(ledger_id);
            match self.storage.set_fenced(ledger_id) {
                Err(error) => Some((done, storage_status(&error))),
                // Journaled even when already fenced: an earlier fence's record
                // may not be durable yet, and this answer must not come before it.
                Ok(_) => self.append(JournalRecord::Fence { ledger_id }, done),
            }
        };
        if let Some((done, status)) = refused {
            done(Err(status));
        }
    }

    /// Stores an explicit LAC for `ledger_id`; `done` once durable.
    pub fn write_lac(
        &self,
        ledger_id: u64,
        lac: u64,
        done: impl FnOnce(Result<(), Status>) + Send + 'static,
    ) {
        let refused = {
            let mut stripe = self.stripe(ledger_id);
            match self.storage.set_explicit_lac(ledger_id, lac) {
                Err(error) => Some((done, storage_status(&error))),
                Ok(()) => {
                    stripe.note_lac(ledger_id, Some(lac));
                    self.append(JournalRecord::ExplicitLac { ledger_id, lac }, done)
                }
            }
        };
        if let Some((done, status)) = refused {
            done(Err(status));
        }
    }

    /// Deletes `ledger_id` (idempotent); `done` once the deletion is durable.
    pub fn delete_ledger(
        &self,
        ledger_id: u64,
        done: impl FnOnce(Result<(), Status>) + Send + 'static,
    ) {
        let refused = {
            let mut stripe = self.stripe(ledger_id);
            match self.storage.delete_ledger(ledger_id) {
                Err(error) => Some((done, storage_status(&error))),
                Ok(()) => {
                    stripe.lacs.remove(&ledger_id);
                    self.append(JournalRecord::LedgerDeleted { ledger_id }, done)
                }
            }
        };
        if let Some((done, status)) = refused {
            done(Err(status));
        }
    }

    /// Reads entry `entry_id` (or, with `LAST_ENTRY`, the last stored one) of
    /// `ledger_id`, with the ledger's known LAC. May read disk: call it from a
    /// blocking-allowed thread.
    pub fn read_entry(&self, ledger_id: u64, entry_id: u64) -> Result<StoredEntry, Status> {
        let entry_id = if entry_id == LAST_ENTRY {
            let last = self
                .storage
                .last_entry_id(ledger_id)
                .map_err(|error| storage_status(&error))?;
            last.ok_or(Status::NoSuchEntry)?
        } else {
            entry_id
        };
        let entry = self
            .storage
            .get_entry(ledger_id, entry_id)
            .map_err(|error| storage_status(&error))?;
        let lac = self.read_lac(ledger_id)?;
        Ok(StoredEntry {
            entry_id,
            entry,
            lac,
        })
    }

    /// The known LAC of `ledger_id`: the max of the LACs in its entries and any
    /// explicit LAC. `NoSuchLedger` if this bookie has nothing of it. May read
    /// disk (the first time after a restart): call it from a blocking-allowed
    /// thread.
    pub fn read_lac(&self, ledger_id: u64) -> Result<Option<u64>, Status> {
        if !self
            .storage
            .ledger_exists(ledger_id)
            .map_err(|error| storage_status(&error))?
        {
            return Err(Status::NoSuchLedger);
        }
        if let Some(known) = self.stripe(ledger_id).lacs.get(&ledger_id)
            && known.complete
        {
            return Ok(known.lac);
        }
        // Derive from storage (outside the lock: this may read disk). Adds that
        // land meanwhile raise the tracked value, which is folded in below.
        let derived = self.stored_lac(ledger_id)?;
        let mut stripe = self.stripe(ledger_id);
        stripe.make_room();
        let known = stripe.lacs.entry(ledger_id).or_default();
        known.lac = known.lac.max(derived);
        known.complete = true;
        Ok(known.lac)
    }

    /// LAC from storage alone: the LAC carried by the last stored entry (a
    /// writer's LAC grows with its entry ids) and the explicit LAC.
    fn stored_lac(&self, ledger_id: u64) -> Result<Option<u64>, Status> {
        let explicit = match self.storage.explicit_lac(ledger_id) {
            Ok(lac) => lac,
            Err(error) => return Err(storage_status(&error)),
        };
        let last = self
            .storage
            .last_entry_id(ledger_id)
            .map_err(|error| storage_status(&error))?;
        let Some(last) = last else {
            return Ok(explicit);
        };
        let carried = match self.storage.get_entry(ledger_id, last) {
            Ok(entry) => match parse_header(&entry) {
                Ok(header) => header.last_add_confirmed,
                Err(error) => {
                    tracing::warn!(ledger_id, entry_id = last, %error, "stored entry has a bad header");
                    return Err(Status::IoError);
                }
            },
            // Deleted meanwhile.
            Err(StorageError::NoSuchLedger { .. }) => return Err(Status::NoSuchLedger),
            Err(error) => return Err(storage_status(&error)),
        };
        Ok(carried.max(explicit))
    }

    /// The first fatal failure (a failed checkpoint, a broken journal), if any:
    /// the process should stop serving and exit.
    pub fn failure(&self) -> Option<String> {
        self.sync
            .failure
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .clone()
    }

    /// Journal and storage figures.
    pub fn stats(&self) -> BookieStats {
        BookieStats {
            add_us: summary(&lock(&self.add_latency)),
            checkpoint_us: summary(&lock(&self.sync.checkpoint_latency)),
            journal: self.journal.stats(),
            storage: self.storage.stats(),
        }
    }

    /// Whole latency distributions (µs) of the bookie's write-path stages
    /// since it opened: copies for metrics exporters (take them per scrape).
    pub fn latency_histograms(&self) -> BookieHistograms {
        BookieHistograms {
            add_us: lock(&self.add_latency).clone(),
            journal: self.journal.latency_histograms(),
        }
    }

    /// Stops the sync thread, syncs and closes the journal (pending appends
    /// complete), and checkpoints storage at the journal's end so the next open
    /// replays nothing. Idempotent; `Drop` does the same.
    pub fn shutdown(&self) {
        self.sync.stop();
        if let Err(error) = self.journal.shutdown() {
            tracing::error!(%error, "journal shutdown failed");
            return;
        }
        let mark = self.journal.last_synced_mark();
        match self.storage.checkpoint(mark) {
            Ok(_) => {
                if let Err(error) = self.journal.delete_files_before(mark) {
                    tracing::warn!(%error, "cannot delete old journal files");
                }
            }
            Err(error) => tracing::error!(%error, "final checkpoint failed"),
        }
    }

    fn stripe(&self, ledger_id: u64) -> MutexGuard<'_, Stripe> {
        // Fibonacci hashing spreads sequential ledger ids over the stripes.
        let index =
            (ledger_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize & (LEDGER_STRIPES - 1);
        // The guarded state is a LAC cache: consistent after any panic.
        self.stripes[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends to the journal; `done` gets the outcome exactly once.
    /// Appends to the journal; `done` gets the outcome from the force-write
    /// thread, or comes back with the refusal (for the caller to answer once it
    /// holds no lock).
    fn append<F>(&self, record: JournalRecord, done: F) -> Option<(F, Status)>
    where
        F: FnOnce(Result<(), Status>) + Send + 'static,
    {
        // The journal consumes its callback even when it refuses the record, so
        // share `done` between the callback and the refusal path.
        let slot = Arc::new(Mutex::new(Some(done)));
        let from_journal = slot.clone();
        let failure = self.sync.failure.clone();
        let appended =
            self.journal
                .append(record, move |result: Result<JournalMark, JournalError>| {
                    if let Err(error) = &result {
                        note_journal_failure(&failure, error);
                    }
                    if let Some(done) = take(&from_journal) {
                        done(result.map(|_| ()).map_err(|error| journal_status(&error)));
                    }
                });
        match appended {
            Ok(()) => None,
            Err(error) => {
                note_journal_failure(&self.sync.failure, &error);
                take(&slot).map(|done| (done, journal_status(&error)))
            }
        }
    }
}

/// Records a journal failure that stops the bookie (not back-pressure or a
/// refused record).
fn note_journal_failure(failure: &Mutex<Option<String>>, error: &JournalError) {
    match error {
        JournalError::QueueFull { .. }
        | JournalError::RecordTooLarge { .. }
        | JournalError::ShutDown => {}
        _ => {
            let mut failure = failure
                .lock()
                .unwrap_or_else(|poisoned| poisoned.into_inner());
            if failure.is_none() {
                tracing::error!(%error, "journal failed: the bookie must restart");
                *failure = Some(format!("journal failed: {error}"));
            }
        }
    }
}

fn take<T>(slot: &Mutex<Option<T>>) -> Option<T> {
    lock(slot).take()
}

/// Locks a mutex whose state stays consistent even if a holder panicked (a
/// histogram, a callback slot).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

fn latency_histogram() -> Histogram<u64> {
    // 1 µs .. 1 hour, 3 significant digits: constant, valid bounds.
    #[allow(clippy::unwrap_used)]
    Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap()
}

fn summary(h: &Histogram<u64>) -> StageSummary {
    if h.is_empty() {
        return StageSummary::default();
    }
    StageSummary {
        count: h.len(),
        p50: h.value_at_quantile(0.50),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
    }
}

impl Drop for Bookie {
    fn drop(&mut self) {
        self.shutdown();
    }
}

impl Stripe {
    /// Raises the tracked LAC; starts tracking (incomplete) if new.
    fn note_lac(&mut self, ledger_id: u64, lac: Option<u64>) {
        if lac.is_none() && !self.lacs.contains_key(&ledger_id) {
            return;
        }
        self.make_room();
        let known = self.lacs.entry(ledger_id).or_default();
        known.lac = known.lac.max(lac);
    }

    fn make_room(&mut self) {
        if self.lacs.len() >= LAC_TRACKED_PER_STRIPE_MAX {
            self.lacs.clear();
        }
    }
}

/// Applies one replayed journal record to storage. Records of deleted ledgers
/// are skipped (the deletion came later in the journal or in a checkpoint).
fn replay_record(storage: &LedgerStorage, record: JournalRecord) -> Result<(), StorageError> {
    let result = match record {
        JournalRecord::Entry {
            ledger_id,
            entry_id,
            payload,
        } => {
            match storage.put_entry(ledger_id, entry_id, payload.clone()) {
                Err(StorageError::WriteCacheFull { .. }) => {
                    // Replay outruns the cache: flush (no checkpoint: the mark
                    // stays, replaying again is idempotent) and put once more.
                    storage.flush()?;
                    storage.put_entry(ledger_id, entry_id, payload)
                }
                other => other,
            }
        }
        JournalRecord::Fence { ledger_id } => storage.set_fenced(ledger_id).map(|_| ()),
        JournalRecord::ExplicitLac { ledger_id, lac } => storage.set_explicit_lac(ledger_id, lac),
        JournalRecord::LedgerDeleted { ledger_id } => storage.delete_ledger(ledger_id),
    };
    match result {
        Err(StorageError::LedgerDeleted { .. }) => Ok(()),
        other => other,
    }
}

fn storage_status(error: &StorageError) -> Status {
    match error {
        StorageError::WriteCacheFull { .. } => Status::TooManyRequests,
        StorageError::NoSuchLedger { .. } | StorageError::LedgerDeleted { .. } => {
            Status::NoSuchLedger
        }
        StorageError::NoSuchEntry { .. } => Status::NoSuchEntry,
        StorageError::EntryTooLarge { .. } => Status::BadRequest,
        other => {
            tracing::warn!(error = %other, "ledger storage error");
            Status::IoError
        }
    }
}

fn journal_status(error: &JournalError) -> Status {
    match error {
        JournalError::QueueFull { .. } => Status::TooManyRequests,
        JournalError::RecordTooLarge { .. } => Status::BadRequest,
        JournalError::ShutDown => Status::ReadOnly,
        _ => Status::IoError,
    }
}

impl SyncThread {
    fn start(
        journal: Arc<Journal>,
        storage: Arc<LedgerStorage>,
        config: &BookieConfig,
    ) -> Result<SyncThread, OpenError> {
        let stop = Arc::new(AtomicBool::new(false));
        let failure = Arc::new(Mutex::new(None));
        let checkpoint_latency = Arc::new(Mutex::new(latency_histogram()));
        let flush_interval = config.storage.flush_interval;
        let gc_interval = config.gc_interval;
        let handle = {
            let stop = stop.clone();
            let failure = failure.clone();
            let checkpoint_latency = checkpoint_latency.clone();
            std::thread::Builder::new()
                .name("bookie-sync".to_string())
                .spawn(move || {
                    if let Err(reason) = sync_loop(
                        &journal,
                        &storage,
                        &stop,
                        flush_interval,
                        gc_interval,
                        &checkpoint_latency,
                    ) {
                        tracing::error!(%reason, "bookie sync thread stopped: the bookie must restart");
                        *failure.lock().unwrap_or_else(|poisoned| poisoned.into_inner()) = Some(reason);
                    }
                })
                .map_err(OpenError::Thread)?
        };
        Ok(SyncThread {
            stop,
            failure,
            checkpoint_latency,
            handle: Mutex::new(Some(handle)),
        })
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let handle = self
            .handle
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(handle) = handle
            && handle.join().is_err()
        {
            tracing::error!("bookie sync thread panicked");
        }
    }
}

/// Checkpoints every `flush_interval`, or sooner when storage asks (write cache
/// past its threshold or full), and runs gc every `gc_interval`. Returns the
/// reason on a fatal failure.
fn sync_loop(
    journal: &Journal,
    storage: &LedgerStorage,
    stop: &AtomicBool,
    flush_interval: Duration,
    gc_interval: Duration,
    checkpoint_latency: &Mutex<Histogram<u64>>,
) -> Result<(), String> {
    let mut last_checkpoint = Instant::now();
    let mut last_gc = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let requested = storage.wait_for_flush_trigger(SYNC_POLL_INTERVAL.min(flush_interval));
        if !requested && last_checkpoint.elapsed() < flush_interval {
            continue;
        }
        // Take the mark first: every record it covers was put into storage
        // before it was appended, so the flush below includes it.
        let mark = journal.last_synced_mark();
        let started = Instant::now();
        storage
            .checkpoint(mark)
            .map_err(|error| format!("checkpoint failed: {error}"))?;
        let elapsed_us = u64::try_from(started.elapsed().as_micros()).unwrap_or(u64::MAX);
        lock(checkpoint_latency).saturating_record(elapsed_us.max(1));
        if let Err(error) = journal.delete_files_before(mark) {
            tracing::warn!(%error, "cannot delete old journal files");
        }
        last_checkpoint = Instant::now();
        if last_gc.elapsed() >= gc_interval {
            match storage.gc() {
                Ok(stats) => tracing::debug!(?stats, "gc pass"),
                Err(error) => tracing::warn!(%error, "gc pass failed"),
            }
            last_gc = Instant::now();
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::entry::{EntryHeader, encode_entry};
    use std::sync::mpsc;

    fn open(dir: &std::path::Path) -> Bookie {
        let mut config = BookieConfig::new(dir.join("journal"), dir.join("ledgers"));
        config.journal.prealloc_chunk_bytes = 1 << 20;
        config.journal.file_bytes_max = 64 << 20;
        Bookie::open(config).unwrap()
    }

    fn add(
        bookie: &Bookie,
        ledger_id: u64,
        entry_id: u64,
        lac: Option<u64>,
    ) -> Result<(u64, u64), Status> {
        let header = EntryHeader {
            ledger_id,
            entry_id,
            last_add_confirmed: lac,
            ledger_length: 0,
        };
        let (done, answer) = mpsc::channel();
        bookie.add(
            encode_entry(&header, b"x"),
            AddMode::Normal,
            move |result| {
                done.send(result).unwrap();
            },
        );
        answer.recv().unwrap()
    }

    impl Bookie {
        /// Drops every tracked LAC, as a full stripe does.
        fn forget_known_lacs(&self) {
            for index in 0..LEDGER_STRIPES {
                self.stripes[index].lock().unwrap().lacs.clear();
            }
        }
    }

    #[test]
    fn known_lac_is_the_max_carried_and_survives_forgetting_and_restart() {
        let dir = tempfile::tempdir().unwrap();
        let bookie = open(dir.path());
        // Out of order, as pipelined writers and recovery can deliver them.
        assert_eq!(add(&bookie, 1, 5, Some(4)), Ok((1, 5)));
        assert_eq!(add(&bookie, 1, 3, Some(2)), Ok((1, 3)));
        assert_eq!(add(&bookie, 1, 0, None), Ok((1, 0)));
        assert_eq!(bookie.read_lac(1), Ok(Some(4)));
        bookie.forget_known_lacs();
        // Adds while untracked raise the value that derivation then folds in.
        assert_eq!(add(&bookie, 1, 4, Some(3)), Ok((1, 4)));
        assert_eq!(bookie.read_lac(1), Ok(Some(4)));
        assert_eq!(add(&bookie, 1, 6, Some(5)), Ok((1, 6)));
        assert_eq!(bookie.read_lac(1), Ok(Some(5)));
        assert_eq!(bookie.read_entry(1, LAST_ENTRY).unwrap().entry_id, 6);
        drop(bookie);

        let bookie = open(dir.path());
        assert_eq!(bookie.read_lac(1), Ok(Some(5)));
        assert_eq!(bookie.read_lac(2), Err(Status::NoSuchLedger));
        assert_eq!(bookie.stats().add_us.count, 0);
        assert_eq!(add(&bookie, 2, 0, None), Ok((2, 0)));
        assert_eq!(bookie.read_lac(2), Ok(None));
        assert_eq!(bookie.stats().add_us.count, 1);
    }

    #[test]
    fn a_fence_answer_covers_every_add_acknowledged_on_the_ledger() {
        // Two threads pipeline normal adds to one ledger while a third fences it.
        // Every add answered OK was accepted before the fence, so it must be
        // readable right when the fence is answered; adds after it are FENCED.
        use std::sync::atomic::AtomicUsize;
        let dir = tempfile::tempdir().unwrap();
        let bookie = Arc::new(open(dir.path()));
        let fenced = Arc::new(AtomicBool::new(false));
        let submitted = Arc::new(AtomicUsize::new(0));
        let results = Arc::new(Mutex::new(Vec::new()));
        let adders: Vec<_> = (0..2u64)
            .map(|thread| {
                let (bookie, fenced, submitted, results) = (
                    bookie.clone(),
                    fenced.clone(),
                    submitted.clone(),
                    results.clone(),
                );
                std::thread::spawn(move || {
                    let mut after_fence = 0;
                    for index in 0.. {
                        if fenced.load(Ordering::Acquire) {
                            after_fence += 1;
                            if after_fence > 50 {
                                break;
                            }
                        }
                        let entry_id = 2 * index + thread;
                        let header = EntryHeader {
                            ledger_id: 7,
                            entry_id,
                            last_add_confirmed: None,
                            ledger_length: 0,
                        };
                        let results = results.clone();
                        bookie.add(
                            encode_entry(&header, b"x"),
                            AddMode::Normal,
                            move |result| {
                                results.lock().unwrap().push((entry_id, result));
                            },
                        );
                        submitted.fetch_add(1, Ordering::Relaxed);
                    }
                })
            })
            .collect();
        while submitted.load(Ordering::Relaxed) < 500 {
            std::thread::yield_now();
        }
        let (done, answer) = mpsc::channel();
        bookie.fence(7, move |result| done.send(result).unwrap());
        assert_eq!(answer.recv().unwrap(), Ok(()));
        let last_at_fence = bookie.read_entry(7, LAST_ENTRY).unwrap().entry_id;
        let readable_at_fence: std::collections::HashSet<u64> = (0..=last_at_fence)
            .filter(|&entry_id| bookie.read_entry(7, entry_id).is_ok())
            .collect();
        fenced.store(true, Ordering::Release);
        for adder in adders {
            adder.join().unwrap();
        }
        let total = submitted.load(Ordering::Relaxed);
        while results.lock().unwrap().len() < total {
            std::thread::sleep(Duration::from_millis(1));
        }
        let results = results.lock().unwrap();
        let mut acked = 0;
        let mut refused = 0;
        for (entry_id, result) in results.iter() {
            match result {
                Ok(_) => {
                    acked += 1;
                    assert!(
                        readable_at_fence.contains(entry_id),
                        "entry {entry_id} was acknowledged but not visible when the fence was answered"
                    );
                }
                Err(Status::Fenced) => refused += 1,
                Err(other) => panic!("entry {entry_id}: unexpected {other:?}"),
            }
        }
        assert!(
            acked >= 500 && refused >= 100,
            "acked {acked}, refused {refused}"
        );
    }

    #[test]
    fn bad_headers_are_bad_requests() {
        let dir = tempfile::tempdir().unwrap();
        let bookie = open(dir.path());
        let (done, answer) = mpsc::channel();
        bookie.add(
            Bytes::from_static(b"too short"),
            AddMode::Normal,
            move |result| {
                done.send(result).unwrap();
            },
        );
        assert_eq!(answer.recv().unwrap(), Err(Status::BadRequest));
    }
}
