//! The bookie's write-ahead journal.
//!
//! Owns: the journal directory (numbered `.jnl` files, the `LOCK` file) and three
//! OS threads: the writer (drains the append queue, encodes a group into one
//! aligned block, writes it), the force-write thread (one fdatasync for every
//! group written since the last one, then runs their callbacks in order) and the
//! preallocator (zero-fills space ahead of the writer and prepares the next file).
//! A group with nothing to pipeline with (the force-write thread idle, no record
//! queued: depth 1) is synced and completed by the writer itself, saving a
//! thread wake-up on the latency path.
//!
//! Guarantees: an append's callback gets `Ok(mark)` only after an fdatasync
//! covering the record (unless `JournalSync::Off`); callbacks run in append order,
//! from the force-write thread or the writer (never both at once); a failed write or fdatasync is fatal to this
//! `Journal` (every waiter fails, later appends return `Broken`, nothing is
//! retried).
//!
//! After a failure (ENOSPC, EIO): `shutdown` seals the file being written at the
//! last synced mark (a FileEnd record there, synced). Invariants:
//! - every acknowledged record ends at or before the synced mark (the completing
//!   thread advances the mark before it runs any `Ok` callback of the batch, and
//!   only when nothing has failed);
//! - groups are padded to whole aligned blocks, so the block at the synced mark
//!   holds no acknowledged byte and writing the seal there cannot damage one;
//! - bytes past the synced mark are never trusted: after a failed write or
//!   fdatasync the page cache may hold records the disk does not (Linux marks
//!   such pages clean), so the seal goes at the mark, not after a scan that
//!   would read them back as valid;
//! - a new `Journal::open` on the same directory then replays the sealed file
//!   as a clean older file and appends to a new file, exactly as after a crash.
//!
//! So a bookie whose journal failed can shut it down, wait for the disk, and
//! open it again (replaying into storage) without losing an acknowledged
//! record, and a kill -9 at any point of that leaves what a crash would.
//!
//! Alignment: every group is followed by a Padding record up to the next
//! `alignment_bytes` boundary, so each group is one pwrite of whole aligned blocks
//! and no write ever touches a block that holds acknowledged records (a torn write
//! cannot damage acked data; O_DIRECT needs no read-modify-write). The other way,
//! keeping the partial tail block in memory and rewriting it with the next group,
//! saves file space but rewrites acked bytes on every group. The price here is up
//! to one block per group: at depth 1 a 1 KiB entry takes a 4 KiB block (the
//! device writes 4 KiB either way; files fill 4x faster), under load groups are
//! hundreds of KiB and the padding is under 2%.
//!
//! Files: a new file per open (replay never appends to an old one), rotation at
//! `file_bytes_max`, a FileEnd record synced into a file before the next one gets
//! its name; retired files are reused (`recycle_files_max`) or deleted. On the
//! persistent-memory backend (`pmem`) the files are the slots of a mapped
//! region, named through the same `file::Backend` calls, and "fdatasync" is a
//! cache-line flush and fence (or msync when emulated).
//!
//! I/O priority: the writer and force-write threads run at class realtime
//! where the kernel allows it (`JournalConfig::realtime_io`, `io_priority`):
//! a journal write never waits in the block scheduler behind page-cache
//! writeback or the storage's bulk I/O.
//!
//! Never: reads ledger storage; blocks a tokio worker (`append` only takes a
//! mutex to enqueue); fsyncs per record; grows the queue past `queue_depth_max`.
//! Only the thread completing groups (see above) advances the synced mark.

mod config;
mod error;
mod file;
mod force;
pub mod format;
mod io_priority;
pub mod pmem;
mod prealloc;
mod replay;
mod shared;
mod stats;
mod writer;

#[cfg(test)]
mod tests;

pub use config::{
    JOURNAL_ALIGNMENT_BYTES, JOURNAL_PAYLOAD_BYTES_MAX, JOURNAL_QUEUE_DEPTH_MAX,
    JOURNAL_RECYCLE_FILES_MAX, JournalBackendKind, JournalConfig, JournalSync,
};
pub use error::JournalError;
pub use format::JournalRecord;
pub use pmem::{PMEM_ALIGNMENT_BYTES, PMEM_REGION_BYTES_DEFAULT, PmemConfig, PmemEmulation};
pub use stats::{JournalHistograms, JournalStats};

#[cfg(test)]
pub(crate) use file::faulty::FaultPlan;

use std::fs::File;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::thread::JoinHandle;
use std::time::Instant;

use crate::mark::JournalMark;
pub(crate) use file::Backend;
use shared::{Pending, QueueState, Shared, SpaceState};
use stats::StatsCell;

/// Called once per append with the mark just past the record (durable unless
/// sync is off) or the error that lost it. Runs on the force-write thread or
/// the writer thread, in append order: keep it short (hand the result to a
/// channel or a task); it may call `append` (which never blocks) but must not
/// call `shutdown` (which joins those threads).
pub type AppendCallback = Box<dyn FnOnce(Result<JournalMark, JournalError>) + Send + 'static>;

/// An append the journal did not queue: why, and the callback it was given
/// (never called: the caller answers the refusal with it).
pub struct AppendRefused<F> {
    /// Why the record was not queued.
    pub error: JournalError,
    /// The append's callback, back.
    pub done: F,
}

impl<F> std::fmt::Debug for AppendRefused<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppendRefused")
            .field("error", &self.error)
            .finish_non_exhaustive()
    }
}

impl<F> std::fmt::Display for AppendRefused<F> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "journal refused the append: {}", self.error)
    }
}

/// The write-ahead journal. `Send + Sync`: share it behind an `Arc`.
#[derive(Debug)]
pub struct Journal {
    shared: Arc<Shared>,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Held (flock) for the journal's lifetime; dropping it releases the lock.
    _lock: File,
}

impl Journal {
    /// Opens (creating if needed) the journal in `config.dir`, takes the `LOCK`,
    /// replays every record after `from` in order through `on_record` (with the
    /// mark just past each record), repairs a torn tail of the newest file
    /// (warning with file and offset) and starts the threads. Appends go to a new
    /// file. Refuses to start on corruption anywhere else.
    pub fn open<E, F>(
        config: JournalConfig,
        from: JournalMark,
        on_record: F,
    ) -> Result<Journal, JournalError>
    where
        E: std::error::Error + Send + Sync + 'static,
        F: FnMut(JournalRecord, JournalMark) -> Result<(), E>,
    {
        let mut config = config;
        let backend = match config.backend {
            JournalBackendKind::Auto => {
                config.backend = resolve_auto_backend(&config);
                Backend::Kind(config.backend)
            }
            JournalBackendKind::Pmem => {
                config.validate()?;
                let region = pmem::Region::open(&config, from)?;
                // Each slot of the ring is one journal file.
                config.file_bytes_max = region.slot_bytes();
                Backend::Pmem(region)
            }
            kind => Backend::Kind(kind),
        };
        Journal::open_with_backend(config, backend, from, on_record)
    }

    pub(crate) fn open_with_backend<E, F>(
        config: JournalConfig,
        backend: Backend,
        from: JournalMark,
        mut on_record: F,
    ) -> Result<Journal, JournalError>
    where
        E: std::error::Error + Send + Sync + 'static,
        F: FnMut(JournalRecord, JournalMark) -> Result<(), E>,
    {
        config.validate()?;
        let dir = config.dir.clone();
        std::fs::create_dir_all(&dir).map_err(|e| JournalError::io("create_dir", &dir, e))?;
        let lock = lock_dir(&dir)?;
        let outcome = replay::replay(&config, &backend, from, &mut on_record)?;
        let file_id = outcome.next_file_id;
        let (file, allocated_end) = prealloc::prepare_file(
            &config,
            &backend,
            &prealloc::Zeros::new(&config),
            file_id,
            true,
        )?;
        prealloc::install_file(&backend, &dir, file_id, file.as_ref())?;
        let start_mark = JournalMark {
            file_id,
            offset: config.data_offset(),
        };
        let shared = Arc::new(Shared {
            backend,
            queue: Mutex::new(QueueState::default()),
            queue_cv: Condvar::new(),
            space: Mutex::new(SpaceState {
                file_id,
                file: file.clone(),
                allocated_end,
                writer_reserved: config.data_offset(),
                filling: None,
                writer_offset: config.data_offset(),
                written_bytes_total: 0,
                next: None,
                stop: false,
            }),
            space_cv: Condvar::new(),
            synced_mark: Mutex::new(outcome.end_mark.max(start_mark)),
            broken: AtomicBool::new(false),
            broken_reason: Mutex::new(None),
            sealed: AtomicBool::new(false),
            force_pending: AtomicUsize::new(0),
            writer_file_id: AtomicU64::new(file_id),
            stats: StatsCell::new(),
            config,
        });
        let (to_force, from_writer) = std::sync::mpsc::sync_channel(shared::FORCE_WRITE_GROUPS_MAX);
        let mut threads = Vec::with_capacity(3);
        let spawn = |name: &str, f: Box<dyn FnOnce() + Send>| {
            std::thread::Builder::new()
                .name(name.to_string())
                .spawn(f)
                .map_err(|e| JournalError::io("spawn thread", &dir, e))
        };
        let s = shared.clone();
        let realtime_io = shared.config.realtime_io;
        threads.push(spawn(
            "journal-force",
            Box::new(move || {
                io_priority::apply(realtime_io, "journal-force", &s.stats);
                force::run_force_writer(s, from_writer)
            }),
        )?);
        let s = shared.clone();
        threads.push(spawn(
            "journal-prealloc",
            Box::new(move || prealloc::run_preallocator(s)),
        )?);
        let s = shared.clone();
        let writer = spawn(
            "journal-writer",
            Box::new(move || {
                io_priority::apply(realtime_io, "journal-writer", &s.stats);
                writer::run_writer(s, to_force, file_id, file)
            }),
        );
        match writer {
            Ok(handle) => threads.push(handle),
            Err(e) => {
                // The force-write thread exits with the dropped sender; stop the
                // preallocator too.
                shared.space.lock().unwrap_or_else(|p| p.into_inner()).stop = true;
                shared.space_cv.notify_all();
                return Err(e);
            }
        }
        Ok(Journal {
            shared,
            threads: Mutex::new(threads),
            _lock: lock,
        })
    }

    /// Queues `record`; `done` runs after the fdatasync that covers it. A
    /// record the journal does not queue (`QueueFull`: answer
    /// TOO_MANY_REQUESTS; `RecordTooLarge`, `Broken`, `ShutDown`) comes back
    /// as `AppendRefused`, with `done` uncalled for the caller to answer (once
    /// it holds no lock, say).
    pub fn append<F>(&self, record: JournalRecord, done: F) -> Result<(), AppendRefused<F>>
    where
        F: FnOnce(Result<JournalMark, JournalError>) + Send + 'static,
    {
        let config = &self.shared.config;
        let payload_bytes = record.payload_len();
        if payload_bytes > config.payload_bytes_max {
            let error = JournalError::RecordTooLarge {
                payload_bytes,
                payload_bytes_max: config.payload_bytes_max,
            };
            return Err(AppendRefused { error, done });
        }
        if self.shared.broken.load(Ordering::SeqCst) {
            let error = self.shared.broken_error();
            return Err(AppendRefused { error, done });
        }
        let mut queue = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
        if queue.closed {
            drop(queue);
            let error = JournalError::ShutDown;
            return Err(AppendRefused { error, done });
        }
        if queue.items.len() >= config.queue_depth_max {
            drop(queue);
            let error = JournalError::QueueFull {
                depth_max: config.queue_depth_max,
            };
            return Err(AppendRefused { error, done });
        }
        queue.bytes += record.encoded_len();
        queue.items.push_back(Pending {
            record,
            done: Box::new(done),
            enqueued: Instant::now(),
        });
        let wake = queue.should_wake_writer();
        drop(queue);
        if wake {
            self.shared.queue_cv.notify_one();
        }
        Ok(())
    }

    /// Why the journal takes no more appends, if an earlier write or sync
    /// failed.
    pub fn failure(&self) -> Option<String> {
        if !self.shared.broken.load(Ordering::SeqCst) {
            return None;
        }
        match self.shared.broken_error() {
            JournalError::Broken { reason } => Some(reason),
            other => Some(other.to_string()),
        }
    }

    /// Every record ending at or before this mark is durable (written, when sync is
    /// off). A checkpoint passes it to ledger storage, then to `delete_files_before`.
    pub fn last_synced_mark(&self) -> JournalMark {
        self.shared
            .synced_mark
            .lock()
            .map(|m| *m)
            .unwrap_or_else(|p| *p.into_inner())
    }

    /// Retires the journal files whose id is below `mark.file_id` (never the file
    /// being written): up to `recycle_files_max` are kept for reuse, the rest
    /// deleted. Returns how many were retired; they are no longer replayed.
    pub fn delete_files_before(&self, mark: JournalMark) -> Result<usize, JournalError> {
        let dir = &self.shared.config.dir;
        let backend = &self.shared.backend;
        let writer_file_id = self.shared.writer_file_id.load(Ordering::SeqCst);
        let limit = mark.file_id.min(writer_file_id);
        let mut free = backend.list_free_files(dir)?.len();
        let mut deleted = 0;
        for id in backend.list_file_ids(dir)? {
            if id >= limit {
                break;
            }
            let path = dir.join(format::file_name(id));
            if free < self.shared.config.recycle_files_max {
                // Keep it for reuse as a later file.
                backend.rename(&path, &dir.join(format::free_file_name(id)))?;
                free += 1;
            } else {
                backend.remove(&path)?;
            }
            deleted += 1;
        }
        if deleted > 0 {
            backend.sync_dir(dir)?;
            // A preallocator waiting for a free pmem slot may go on.
            self.shared.space_cv.notify_all();
        }
        Ok(deleted)
    }

    /// Whether the journal needs ledger storage to checkpoint (and then
    /// `delete_files_before`) soon to keep taking appends: a pmem ring more
    /// than half full. The bookie's sync thread checks it between flushes.
    pub fn wants_checkpoint(&self) -> bool {
        self.shared.backend.wants_checkpoint()
    }

    /// Stage latency and group size percentiles.
    pub fn stats(&self) -> JournalStats {
        self.shared.stats.snapshot()
    }

    /// Snapshots of the stage latency histograms (for metrics exporters).
    pub fn latency_histograms(&self) -> JournalHistograms {
        self.shared.stats.latency_histograms()
    }

    /// Writes and syncs everything queued, closes the file with an end record and
    /// joins the threads. Idempotent; later appends return `ShutDown`. `Drop` does
    /// the same. Returns `Broken` if the journal failed earlier, after sealing
    /// the current file at the last synced mark (see the module docs; a seal
    /// that fails is logged and retried by the next `shutdown`).
    pub fn shutdown(&self) -> Result<(), JournalError> {
        {
            let mut queue = self.shared.queue.lock().unwrap_or_else(|p| p.into_inner());
            queue.closed = true;
        }
        self.shared.queue_cv.notify_all();
        let threads: Vec<JoinHandle<()>> = self
            .threads
            .lock()
            .map(|mut t| t.drain(..).collect())
            .unwrap_or_default();
        for t in threads {
            // A panicked journal thread already failed its waiters by dropping them.
            let _ = t.join();
        }
        if self.shared.broken.load(Ordering::SeqCst) {
            if !self.shared.sealed.load(Ordering::SeqCst) {
                match self.seal() {
                    Ok(mark) => {
                        tracing::info!(
                            ?mark,
                            "journal: failed file sealed at the last synced mark"
                        );
                        self.shared.sealed.store(true, Ordering::SeqCst);
                    }
                    Err(error) => {
                        tracing::error!(%error, "journal: cannot seal the failed file (the next open treats it as after a crash)");
                    }
                }
            }
            return Err(self.shared.broken_error());
        }
        Ok(())
    }

    /// Writes a synced FileEnd record into the writer's file at the last synced
    /// mark (or right after its header when nothing in it was synced). Only
    /// after the threads stopped: nothing else writes the file then.
    fn seal(&self) -> Result<JournalMark, JournalError> {
        let config = &self.shared.config;
        let file_id = self.shared.writer_file_id.load(Ordering::SeqCst);
        let synced = self.last_synced_mark();
        debug_assert!(synced.file_id <= file_id);
        let mark = JournalMark {
            file_id,
            offset: if synced.file_id == file_id {
                synced.offset
            } else {
                config.data_offset()
            },
        };
        debug_assert!(mark.offset.is_multiple_of(config.alignment_bytes as u64));
        let path = config.dir.join(format::file_name(file_id));
        replay::write_file_end(config, &self.shared.backend, &path, file_id, mark.offset)?;
        Ok(mark)
    }
}

// Shared behind an `Arc` by the bookie's network tasks.
const _: () = {
    const fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<Journal>();
};

impl Drop for Journal {
    fn drop(&mut self) {
        let _ = self.shutdown();
    }
}

/// Takes the directory lock (flock on `LOCK`, held by the returned file).
fn lock_dir(dir: &Path) -> Result<File, JournalError> {
    let path = dir.join(format::LOCK_FILE_NAME);
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| JournalError::io("open", &path, e))?;
    match file.try_lock() {
        Ok(()) => Ok(file),
        Err(std::fs::TryLockError::WouldBlock) => Err(JournalError::Locked {
            dir: dir.to_path_buf(),
        }),
        Err(std::fs::TryLockError::Error(e)) => Err(JournalError::io("flock", &path, e)),
    }
}

/// `JournalBackendKind::Auto`: O_DIRECT if the directory's filesystem takes
/// it and the alignment suits it, else buffered, with a log line either way.
fn resolve_auto_backend(config: &JournalConfig) -> JournalBackendKind {
    let dir = &config.dir;
    if !config
        .alignment_bytes
        .is_multiple_of(crate::direct_io::DIRECT_IO_ALIGNMENT_BYTES)
    {
        tracing::info!(dir = %dir.display(), alignment_bytes = config.alignment_bytes,
            "journal: writing through the page cache (O_DIRECT needs 4 KiB alignment)");
        return JournalBackendKind::Buffered;
    }
    if let Err(error) = std::fs::create_dir_all(dir) {
        tracing::info!(dir = %dir.display(), %error, "journal: cannot probe O_DIRECT; writing through the page cache");
        return JournalBackendKind::Buffered;
    }
    if crate::direct_io::choose_direct_io(dir, "journal") {
        JournalBackendKind::Direct
    } else {
        JournalBackendKind::Buffered
    }
}
