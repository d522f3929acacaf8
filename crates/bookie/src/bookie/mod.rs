//! `Bookie`: one storage node's journal and ledger storage tied together behind
//! the operations of the bookie protocol.
//!
//! Owns: the engine in service (`engine`: the `Journal`, the `LedgerStorage`
//! and their sync thread), the node's health (`health`: writable, read-only,
//! failed) with its disk monitor thread, the per-ledger known LAC, and the
//! one ADD entry point (`add`: `Bookie::add`, with its bounded wait for
//! write-cache room), which the TCP server and in-process callers share. On
//! open the engine replays the journal from the storage's checkpointed mark
//! into storage before serving.
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
//! - Disk full or failing: past `DiskThresholds::usage_max` the bookie turns
//!   read-only (ADD answers READ_ONLY, so writers move to other bookies); a
//!   failed journal or storage write (ENOSPC, EIO) turns it failed (nothing
//!   written, reads served); below `usage_lwm` it is writable again, a failed
//!   engine reopened first. Nothing acknowledged is lost on the way: see
//!   `health` and `engine`, and `journal`'s module docs for the seal.
//!
//! - An ADD that finds the write cache full waits (in call order) up to
//!   `ADD_ROOM_WAIT_MAX` for a flush to free room before TOO_MANY_REQUESTS,
//!   whoever calls it.
//!
//! Never: blocks in `add`, `fence`, `write_lac` or `delete_ledger` (they only take
//! short locks and enqueue: safe on a tokio worker; an add that must wait for
//! room hands back an `AddAdmission` to await instead; while the engine is
//! being replaced they refuse instead of waiting); reads disk outside `read_entry` /
//! `read_lac` (call those from a blocking-allowed thread); retries a failed
//! write or sync in place (a new engine replays the journal instead).

mod add;
mod engine;
mod health;
mod monitor;

#[cfg(test)]
mod tests;

use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::RwLock;
use vela_bookie_protocol::entry::parse_header;
use vela_bookie_protocol::{LAST_ENTRY, Status};
use vela_metrics::{Histogram, Snapshot, Summary};

pub use add::{ADD_ROOM_WAIT_MAX, ADD_ROOM_WAITERS_MAX, AddAdmission, AddResult};
pub use health::{BookieMode, BookieState};

use crate::disk::{DiskProbe, DiskThresholds};
use crate::journal::{
    AppendRefused, JournalConfig, JournalError, JournalHistograms, JournalRecord, JournalStats,
};
use crate::mark::JournalMark;
use crate::storage::{ReadSource, RecordCheck, StorageConfig, StorageError, StorageStats};
use engine::Engine;
use health::Health;
use monitor::StopSignal;

/// Stripes of the per-ledger lock (and LAC map): adds of different ledgers
/// rarely contend; a power of two so the stripe is a mask of the ledger id's hash.
const LEDGER_STRIPES: usize = 64;
const _: () = assert!(LEDGER_STRIPES.is_power_of_two());
/// Ledgers whose known LAC is tracked in memory, per stripe. 64 x 16_384 = 1M
/// ledgers x ~40 bytes = ~40 MiB at most. When a stripe is full it is cleared:
/// the LACs it held are derived again from storage when next asked for.
const LAC_TRACKED_PER_STRIPE_MAX: usize = 16_384;
/// Default period of storage garbage collection.
pub const GC_INTERVAL_DEFAULT: Duration = Duration::from_secs(60);

/// How to open a `Bookie`.
#[derive(Debug, Clone)]
pub struct BookieConfig {
    /// The journal: directory, sync policy, group commit, queue bound.
    pub journal: JournalConfig,
    /// Ledger storage: directory, cache sizes, flush interval and threshold.
    pub storage: StorageConfig,
    /// How often the gc thread runs a storage gc pass.
    pub gc_interval: Duration,
    /// When the bookie turns read-only for lack of disk space, and back.
    pub disk: DiskThresholds,
    /// How disk usage is measured (`statvfs`; tests simulate a filling disk).
    pub disk_probe: DiskProbe,
    /// Test-only: journal file faults.
    #[cfg(test)]
    pub(crate) journal_faults: Option<Arc<crate::journal::FaultPlan>>,
}

impl BookieConfig {
    /// The journal's and storage's defaults on these directories.
    pub fn new(journal_dir: impl Into<PathBuf>, ledger_dir: impl Into<PathBuf>) -> BookieConfig {
        BookieConfig {
            journal: JournalConfig::new(journal_dir),
            storage: StorageConfig::new(ledger_dir),
            gc_interval: GC_INTERVAL_DEFAULT,
            disk: DiskThresholds::default(),
            disk_probe: DiskProbe::statvfs(),
            #[cfg(test)]
            journal_faults: None,
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
    /// The sync or disk monitor thread could not be started.
    #[error("cannot start a bookie thread: {0}")]
    Thread(std::io::Error),
    /// A configuration value is out of range.
    #[error("invalid bookie config: {0}")]
    Config(String),
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
    /// "bookie add" stage of the write path: any wait for write-cache room,
    /// write cache + journal queue, write and fdatasync).
    pub add_us: Summary,
    /// µs per checkpoint of the sync thread (write cache flush to entry logs,
    /// index commit, `lastMark`).
    pub checkpoint_us: Summary,
    /// Journal stage latencies and group sizes (of the engine in service).
    pub journal: JournalStats,
    /// Storage caches, flushes and checkpoint (of the engine in service).
    pub storage: StorageStats,
    /// Reads whose stored bytes failed their CRC or id check here (answered
    /// IO_ERROR: the reader reads another replica).
    pub corrupt_reads: u64,
}

/// Latency distributions of the bookie's write-path stages (µs).
#[derive(Debug, Clone)]
pub struct BookieHistograms {
    /// `Bookie::add` to durable completion, per accepted add (including any
    /// wait for write-cache room).
    pub add_us: Snapshot,
    /// Journal stages (per group or per fdatasync), over every engine since
    /// the bookie opened.
    pub journal: JournalHistograms,
    /// Entry reads served from memory (write cache or read cache).
    pub read_cache_us: Snapshot,
    /// Entry reads served from an entry log.
    pub read_log_us: Snapshot,
    /// Payload bytes of the reads served from memory.
    pub read_cache_bytes: u64,
    /// Payload bytes of the reads served from entry logs.
    pub read_log_bytes: u64,
    /// Bytes `pread` from entry logs by the engine in service (read-ahead
    /// included).
    pub read_log_io_bytes: u64,
}

/// A storage node. `Send + Sync`: share it in an `Arc`.
#[derive(Debug)]
pub struct Bookie {
    core: Arc<Core>,
    monitor: Monitor,
}

/// What the bookie and its disk monitor share.
#[derive(Debug)]
struct Core {
    config: BookieConfig,
    /// The engine in service; `None` only while a failed one is replaced.
    /// Writers of the slot: `open`, the monitor's recovery, `shutdown`.
    engine: RwLock<Option<Arc<Engine>>>,
    health: Arc<Health>,
    /// µs per checkpoint (storage flush + lastMark); recorded by sync threads.
    checkpoint_latency: Arc<Histogram>,
    /// Journal histograms of engines closed since open (merged into exports).
    retired_journal: Mutex<JournalHistograms>,
    corrupt_reads: AtomicU64,
    /// Per-ledger lock and known LACs, `LEDGER_STRIPES` of them.
    stripes: Box<[Mutex<Stripe>]>,
    /// Adds waiting for write-cache room, in arrival order (`add`).
    room: Arc<add::RoomQueue>,
    /// Add latency in µs; recorded by the journal's force-write thread.
    add_latency: Arc<Histogram>,
    /// Entry reads served from memory / from entry logs, and their bytes.
    reads: ReadStages,
}

/// The bookie's read-path stages.
#[derive(Debug, Default)]
struct ReadStages {
    cache_latency: Histogram,
    log_latency: Histogram,
    cache_bytes: AtomicU64,
    log_bytes: AtomicU64,
}

#[derive(Debug)]
struct Monitor {
    stop: Arc<StopSignal>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

#[derive(Debug, Default)]
struct Stripe {
    lacs: crate::IdMap<u64, KnownLac>,
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

/// Which requests the current mode takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum WriteKind {
    /// A writer's add.
    NormalAdd,
    /// Recovery adds, fences, explicit LACs, deletes: small, and needed to
    /// finish recoveries and free space while read-only.
    Maintenance,
}

impl Core {
    /// The engine in service, without waiting (the write path runs on tokio
    /// workers): `None` while it is being replaced.
    fn engine_now(&self) -> Option<Arc<Engine>> {
        self.engine.try_read().and_then(|slot| slot.clone())
    }

    /// The engine in service; waits while it is being swapped (reads only).
    fn engine_blocking(&self) -> Option<Arc<Engine>> {
        self.engine.read().clone()
    }

    /// The engine for a write of `kind`, or the READ_ONLY refusal.
    fn engine_for(&self, kind: WriteKind) -> Result<Arc<Engine>, Status> {
        match (self.health.mode(), kind) {
            (BookieMode::Writable, _) | (BookieMode::ReadOnly, WriteKind::Maintenance) => {}
            _ => return Err(Status::ReadOnly),
        }
        self.engine_now().ok_or(Status::ReadOnly)
    }

    /// Keeps a closing engine's journal histograms for the exports.
    fn retire(&self, engine: &Engine) {
        let closing = engine.journal.latency_histograms();
        lock(&self.retired_journal).merge(&closing);
    }

    /// What a storage error means for the request, noting failures.
    fn storage_status(&self, engine: &Engine, error: &StorageError) -> Status {
        match error {
            StorageError::WriteCacheFull { .. } => Status::TooManyRequests,
            StorageError::NoSuchLedger { .. } | StorageError::LedgerDeleted { .. } => {
                Status::NoSuchLedger
            }
            StorageError::NoSuchEntry { .. } => Status::NoSuchEntry,
            StorageError::EntryTooLarge { .. } => Status::BadRequest,
            StorageError::Broken(reason) => {
                self.health.fail(
                    engine.generation,
                    &format!("ledger storage failed: {reason}"),
                );
                Status::ReadOnly
            }
            StorageError::Corruption { .. } => {
                tracing::warn!(%error, "stored entry failed its check; answering IO_ERROR");
                self.corrupt_reads.fetch_add(1, Ordering::Relaxed);
                Status::IoError
            }
            other => {
                tracing::warn!(error = %other, "ledger storage error");
                Status::IoError
            }
        }
    }
}

impl Bookie {
    /// Opens storage, replays the journal from storage's checkpointed mark into
    /// it (entries, fences, explicit LACs, deletions), checkpoints, and starts
    /// the journal threads, the sync thread and the disk monitor.
    pub fn open(config: BookieConfig) -> Result<Bookie, OpenError> {
        config.disk.validate().map_err(OpenError::Config)?;
        let health = Arc::new(Health::new());
        let checkpoint_latency = Arc::new(Histogram::default());
        let engine = Engine::open(&config, health.generation(), &health, &checkpoint_latency)?;
        let core = Arc::new(Core {
            config,
            engine: RwLock::new(Some(Arc::new(engine))),
            health,
            checkpoint_latency,
            retired_journal: Mutex::default(),
            corrupt_reads: AtomicU64::new(0),
            stripes: (0..LEDGER_STRIPES)
                .map(|_| Mutex::new(Stripe::default()))
                .collect(),
            room: Arc::default(),
            add_latency: Arc::default(),
            reads: ReadStages::default(),
        });
        let stop = Arc::new(StopSignal::default());
        let handle = {
            let (core, stop) = (core.clone(), stop.clone());
            std::thread::Builder::new()
                .name("bookie-disk-monitor".to_string())
                .spawn(move || monitor::run_monitor(core, stop))
        };
        let handle = match handle {
            Ok(handle) => handle,
            Err(error) => {
                if let Some(engine) = core.engine.write().take() {
                    engine.close();
                }
                return Err(OpenError::Thread(error));
            }
        };
        Ok(Bookie {
            core,
            monitor: Monitor {
                stop,
                handle: Mutex::new(Some(handle)),
            },
        })
    }

    /// Fences `ledger_id` (creating its state if this bookie never saw it) and
    /// calls `done` once the fence is durable. After that no normal add to it
    /// succeeds here, and every add accepted before is durable.
    pub fn fence(&self, ledger_id: u64, done: impl FnOnce(Result<(), Status>) + Send + 'static) {
        let engine = match self.core.engine_for(WriteKind::Maintenance) {
            Ok(engine) => engine,
            Err(status) => return done(Err(status)),
        };
        let refused = {
            let _stripe = self.core.stripe(ledger_id);
            match engine.storage.set_fenced(ledger_id) {
                Err(error) => Some(Refused::Early(
                    done,
                    self.core.storage_status(&engine, &error),
                )),
                // Journaled even when already fenced: an earlier fence's record
                // may not be durable yet, and this answer must not come before it.
                Ok(_) => self
                    .core
                    .append(&engine, JournalRecord::Fence { ledger_id }, done)
                    .err()
                    .map(Refused::Journal),
            }
        };
        if let Some(refused) = refused {
            refused.answer();
        }
    }

    /// Stores an explicit LAC for `ledger_id`; `done` once durable.
    pub fn write_lac(
        &self,
        ledger_id: u64,
        lac: u64,
        done: impl FnOnce(Result<(), Status>) + Send + 'static,
    ) {
        let engine = match self.core.engine_for(WriteKind::Maintenance) {
            Ok(engine) => engine,
            Err(status) => return done(Err(status)),
        };
        let refused = {
            let mut stripe = self.core.stripe(ledger_id);
            match engine.storage.set_explicit_lac(ledger_id, lac) {
                Err(error) => Some(Refused::Early(
                    done,
                    self.core.storage_status(&engine, &error),
                )),
                Ok(()) => {
                    stripe.note_lac(ledger_id, Some(lac));
                    let record = JournalRecord::ExplicitLac { ledger_id, lac };
                    self.core
                        .append(&engine, record, done)
                        .err()
                        .map(Refused::Journal)
                }
            }
        };
        if let Some(refused) = refused {
            refused.answer();
        }
    }

    /// Deletes `ledger_id` (idempotent); `done` once the deletion is durable.
    /// Taken while read-only: deleting is how a full disk gets space back.
    pub fn delete_ledger(
        &self,
        ledger_id: u64,
        done: impl FnOnce(Result<(), Status>) + Send + 'static,
    ) {
        let engine = match self.core.engine_for(WriteKind::Maintenance) {
            Ok(engine) => engine,
            Err(status) => return done(Err(status)),
        };
        let refused = {
            let mut stripe = self.core.stripe(ledger_id);
            match engine.storage.delete_ledger(ledger_id) {
                Err(error) => Some(Refused::Early(
                    done,
                    self.core.storage_status(&engine, &error),
                )),
                Ok(()) => {
                    stripe.lacs.remove(&ledger_id);
                    let record = JournalRecord::LedgerDeleted { ledger_id };
                    self.core
                        .append(&engine, record, done)
                        .err()
                        .map(Refused::Journal)
                }
            }
        };
        if let Some(refused) = refused {
            refused.answer();
        }
    }

    /// The engine for a read: waits while a failed one is being replaced
    /// (reads run on blocking-allowed threads); IoError if none serves.
    fn engine_for_read(&self) -> Result<Arc<Engine>, Status> {
        self.core.engine_blocking().ok_or(Status::IoError)
    }

    /// Reads entry `entry_id` (or, with `LAST_ENTRY`, the last stored one) of
    /// `ledger_id`, with the ledger's known LAC. May read disk: call it from a
    /// blocking-allowed thread. Served in every mode. Storage checks the
    /// stored record fully (`RecordCheck::Full`): what the TCP server sends.
    pub fn read_entry(&self, ledger_id: u64, entry_id: u64) -> Result<StoredEntry, Status> {
        self.read_entry_checked(ledger_id, entry_id, RecordCheck::Full)
    }

    /// `read_entry`, with storage's check of the stored record as `check`
    /// says: `RecordCheck::ReaderVerifies` only for a caller that verifies the
    /// packaged entry's CRC32C before any consumer sees it (`LocalBookies`'
    /// normal reads, answered to the ledger client's reader).
    pub fn read_entry_checked(
        &self,
        ledger_id: u64,
        entry_id: u64,
        check: RecordCheck,
    ) -> Result<StoredEntry, Status> {
        let engine = self.engine_for_read()?;
        let storage = &engine.storage;
        let entry_id = if entry_id == LAST_ENTRY {
            let last = storage
                .last_entry_id(ledger_id)
                .map_err(|error| self.core.storage_status(&engine, &error))?;
            last.ok_or(Status::NoSuchEntry)?
        } else {
            entry_id
        };
        let started = std::time::Instant::now();
        let (entry, source) = storage
            .get_entry_from(ledger_id, entry_id, check)
            .map_err(|error| self.core.storage_status(&engine, &error))?;
        let reads = &self.core.reads;
        let (latency, bytes) = match source {
            ReadSource::Cache => (&reads.cache_latency, &reads.cache_bytes),
            ReadSource::EntryLog => (&reads.log_latency, &reads.log_bytes),
        };
        latency.record(started.elapsed());
        bytes.fetch_add(entry.len() as u64, Ordering::Relaxed);
        let lac = self.read_lac_with(&engine, ledger_id)?;
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
        let engine = self.engine_for_read()?;
        self.read_lac_with(&engine, ledger_id)
    }

    fn read_lac_with(&self, engine: &Engine, ledger_id: u64) -> Result<Option<u64>, Status> {
        if !engine
            .storage
            .ledger_exists(ledger_id)
            .map_err(|error| self.core.storage_status(engine, &error))?
        {
            return Err(Status::NoSuchLedger);
        }
        if let Some(known) = self.core.stripe(ledger_id).lacs.get(&ledger_id)
            && known.complete
        {
            return Ok(known.lac);
        }
        // Derive from storage (outside the lock: this may read disk). Adds that
        // land meanwhile raise the tracked value, which is folded in below.
        let derived = self.stored_lac(engine, ledger_id)?;
        let mut stripe = self.core.stripe(ledger_id);
        stripe.make_room();
        let known = stripe.lacs.entry(ledger_id).or_default();
        known.lac = known.lac.max(derived);
        known.complete = true;
        Ok(known.lac)
    }

    /// LAC from storage alone: the LAC carried by the last stored entry (a
    /// writer's LAC grows with its entry ids) and the explicit LAC.
    fn stored_lac(&self, engine: &Engine, ledger_id: u64) -> Result<Option<u64>, Status> {
        let storage = &engine.storage;
        let explicit = match storage.explicit_lac(ledger_id) {
            Ok(lac) => lac,
            Err(error) => return Err(self.core.storage_status(engine, &error)),
        };
        let last = storage
            .last_entry_id(ledger_id)
            .map_err(|error| self.core.storage_status(engine, &error))?;
        let Some(last) = last else {
            return Ok(explicit);
        };
        let carried = match storage.get_entry(ledger_id, last) {
            Ok(entry) => match parse_header(&entry) {
                Ok(header) => header.last_add_confirmed,
                Err(error) => {
                    tracing::warn!(ledger_id, entry_id = last, %error, "stored entry has a bad header");
                    return Err(Status::IoError);
                }
            },
            // Deleted meanwhile.
            Err(StorageError::NoSuchLedger { .. }) => return Err(Status::NoSuchLedger),
            Err(error) => return Err(self.core.storage_status(engine, &error)),
        };
        Ok(carried.max(explicit))
    }

    /// The configuration it was opened with (its cache budgets among it).
    pub fn config(&self) -> &BookieConfig {
        &self.core.config
    }

    /// What the bookie accepts now and why, with the last disk measure.
    pub fn state(&self) -> BookieState {
        self.core.health.state()
    }

    /// Journal and storage figures.
    pub fn stats(&self) -> BookieStats {
        let engine = self.core.engine_now();
        BookieStats {
            add_us: self.core.add_latency.snapshot().summary(),
            checkpoint_us: self.core.checkpoint_latency.snapshot().summary(),
            journal: engine
                .as_ref()
                .map(|e| e.journal.stats())
                .unwrap_or_default(),
            storage: engine
                .as_ref()
                .map(|e| e.storage.stats())
                .unwrap_or_default(),
            corrupt_reads: self.core.corrupt_reads.load(Ordering::Relaxed),
        }
    }

    /// Whole latency distributions (µs) of the bookie's write-path stages
    /// since it opened: copies for metrics exporters (take them per scrape).
    pub fn latency_histograms(&self) -> BookieHistograms {
        let current = self
            .core
            .engine_now()
            .map(|e| e.journal.latency_histograms());
        let mut journal = *lock(&self.core.retired_journal);
        if let Some(current) = current {
            journal.merge(&current);
        }
        let reads = &self.core.reads;
        BookieHistograms {
            add_us: self.core.add_latency.snapshot(),
            journal,
            read_cache_us: reads.cache_latency.snapshot(),
            read_log_us: reads.log_latency.snapshot(),
            read_cache_bytes: reads.cache_bytes.load(Ordering::Relaxed),
            read_log_bytes: reads.log_bytes.load(Ordering::Relaxed),
            read_log_io_bytes: self
                .core
                .engine_now()
                .map_or(0, |e| e.storage.stats().entry_log_read_bytes),
        }
    }

    /// Stops the disk monitor and the sync thread, syncs and closes the
    /// journal (pending appends complete), and checkpoints storage at the
    /// journal's end so the next open replays nothing. Idempotent; `Drop` does
    /// the same.
    pub fn shutdown(&self) {
        self.monitor.stop.stop();
        let handle = lock(&self.monitor.handle).take();
        if let Some(handle) = handle
            && handle.join().is_err()
        {
            tracing::error!("bookie disk monitor panicked");
        }
        let engine = self.core.engine.write().take();
        if let Some(engine) = engine {
            engine.close();
        }
    }
}

impl Core {
    fn stripe(&self, ledger_id: u64) -> MutexGuard<'_, Stripe> {
        // Fibonacci hashing spreads sequential ledger ids over the stripes.
        let index =
            (ledger_id.wrapping_mul(0x9E37_79B9_7F4A_7C15) >> 58) as usize & (LEDGER_STRIPES - 1);
        // The guarded state is a LAC cache: consistent after any panic.
        self.stripes[index]
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Appends to the journal; `done` gets the outcome from the force-write
    /// thread. A record the journal refuses comes back with the journal's
    /// callback, for the caller to answer once it holds no lock (calling it
    /// with the refusal answers `done` with the matching status).
    fn append<F>(
        &self,
        engine: &Engine,
        record: JournalRecord,
        done: F,
    ) -> Result<(), AppendRefused<impl FnOnce(Result<JournalMark, JournalError>) + Send + 'static>>
    where
        F: FnOnce(Result<(), Status>) + Send + 'static,
    {
        let (health, generation) = (self.health.clone(), engine.generation);
        engine
            .journal
            .append(record, move |result: Result<JournalMark, JournalError>| {
                if let Err(error) = &result {
                    note_journal_failure(&health, generation, error);
                }
                done(result.map(|_| ()).map_err(|error| journal_status(&error)));
            })
    }
}

/// A write refused while a stripe lock was held, answered (`answer`) once the
/// lock is released: `done` may be anything, even a call back into this
/// bookie.
enum Refused<D, J> {
    /// Refused before the journal (storage, fence): `done` and the status.
    Early(D, Status),
    /// Refused by the journal: its callback back, and why.
    Journal(AppendRefused<J>),
}

impl<D, J> Refused<D, J>
where
    D: FnOnce(Result<(), Status>),
    J: FnOnce(Result<JournalMark, JournalError>),
{
    fn answer(self) {
        match self {
            Refused::Early(done, status) => done(Err(status)),
            Refused::Journal(refused) => (refused.done)(Err(refused.error)),
        }
    }
}

/// Records a journal failure that makes the bookie failed (not back-pressure,
/// a refused record or a shutdown).
fn note_journal_failure(health: &Health, generation: u64, error: &JournalError) {
    match error {
        JournalError::QueueFull { .. }
        | JournalError::RecordTooLarge { .. }
        | JournalError::ShutDown => {}
        _ => health.fail(generation, &format!("journal failed: {error}")),
    }
}

fn journal_status(error: &JournalError) -> Status {
    match error {
        JournalError::QueueFull { .. } => Status::TooManyRequests,
        JournalError::RecordTooLarge { .. } => Status::BadRequest,
        // Shut down, broken (a failed write or sync: ENOSPC, EIO): this bookie
        // cannot write now; the writer replaces it.
        _ => Status::ReadOnly,
    }
}

/// Locks a mutex whose state stays consistent even if a holder panicked
/// (retired histograms, a callback slot).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
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
