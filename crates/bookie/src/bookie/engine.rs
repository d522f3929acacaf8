//! `Engine`: one opening of a bookie's journal and ledger storage, with the
//! threads that checkpoint them and collect garbage.
//!
//! Owns: the `Journal`, the `LedgerStorage`, the sync thread (checkpoints) and
//! the gc thread (storage gc passes, beside checkpoints: a long paced pass
//! never delays a flush by more than one of its steps) for as long as they are
//! healthy. A bookie whose journal or storage failed closes its engine
//! and opens a new one on the same directories (`Bookie`'s disk monitor), so
//! opening is exactly what a restart does: storage loads its index and
//! checkpointed mark, the journal replays every record after the mark into
//! storage (a broken journal was sealed at its last synced mark by its
//! shutdown), and appends go to a new journal file and a new entry log.
//! Never: decides whether the bookie takes writes (the bookie's health does);
//! retries a failed sync (it reports the failure and the engine is replaced).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use vela_metrics::Histogram;

use super::health::Health;
use super::{BookieConfig, OpenError, lock};
use crate::journal::{Journal, JournalRecord};
use crate::storage::{LedgerStorage, StorageError};

/// The sync thread checks for a flush request or shutdown this often (storage's
/// trigger wait has no way to be woken for shutdown).
const SYNC_POLL_INTERVAL: Duration = Duration::from_millis(50);

/// A journal and a ledger storage opened together, and their sync thread.
#[derive(Debug)]
pub(super) struct Engine {
    /// Which opening this is (failures are reported with it).
    pub(super) generation: u64,
    pub(super) journal: Arc<Journal>,
    pub(super) storage: Arc<LedgerStorage>,
    sync: SyncThread,
    gc: SyncThread,
}

/// A background thread of the engine and its stop flag.
#[derive(Debug)]
struct SyncThread {
    stop: Arc<AtomicBool>,
    handle: Mutex<Option<JoinHandle<()>>>,
}

impl Engine {
    /// Opens storage, replays the journal from storage's checkpointed mark into
    /// it (entries, fences, explicit LACs, deletions), checkpoints, and starts
    /// the journal threads and the sync thread. A sync failure is reported to
    /// `health`.
    pub(super) fn open(
        config: &BookieConfig,
        generation: u64,
        health: &Arc<Health>,
        checkpoint_latency: &Arc<Histogram>,
    ) -> Result<Engine, OpenError> {
        let (storage, from) = LedgerStorage::open(config.storage.clone())?;
        let storage = Arc::new(storage);
        let started = Instant::now();
        let mut replayed_count = 0u64;
        let on_record = |record, _mark| {
            replayed_count += 1;
            replay_record(&storage, record)
        };
        #[cfg(test)]
        let journal = match &config.journal_faults {
            Some(plan) => Journal::open_with_backend(
                config.journal.clone(),
                crate::journal::Backend::Faulty(plan.clone()),
                from,
                on_record,
            )?,
            None => Journal::open(config.journal.clone(), from, on_record)?,
        };
        #[cfg(not(test))]
        let journal = Journal::open(config.journal.clone(), from, on_record)?;
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
        let sync = SyncThread::start(
            journal.clone(),
            storage.clone(),
            config,
            (health.clone(), generation),
            checkpoint_latency.clone(),
        )?;
        let gc = SyncThread::start_gc(storage.clone(), config.gc_interval)?;
        Ok(Engine {
            generation,
            journal,
            storage,
            sync,
            gc,
        })
    }

    /// Why this engine cannot write, if its journal or storage failed.
    pub(super) fn failure(&self) -> Option<String> {
        if let Some(reason) = self.journal.failure() {
            return Some(format!("journal failed: {reason}"));
        }
        self.storage
            .failure()
            .map(|reason| format!("ledger storage failed: {reason}"))
    }

    /// Stops the sync thread, syncs and closes the journal (pending appends
    /// complete; a broken journal is sealed at its last synced mark), and
    /// checkpoints storage at the journal's end so the next open replays
    /// nothing. After a failure the checkpoint is skipped or fails: the next
    /// open replays from the last good checkpoint instead, losing nothing.
    pub(super) fn close(&self) {
        self.gc.stop();
        self.sync.stop();
        if let Err(error) = self.journal.shutdown() {
            tracing::warn!(%error, "journal closed after a failure");
            return;
        }
        let mark = self.journal.last_synced_mark();
        match self.storage.checkpoint(mark) {
            Ok(_) => {
                if let Err(error) = self.journal.delete_files_before(mark) {
                    tracing::warn!(%error, "cannot delete old journal files");
                }
            }
            Err(error) => tracing::warn!(%error, "final checkpoint failed"),
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

impl SyncThread {
    fn start(
        journal: Arc<Journal>,
        storage: Arc<LedgerStorage>,
        config: &BookieConfig,
        (health, generation): (Arc<Health>, u64),
        checkpoint_latency: Arc<Histogram>,
    ) -> Result<SyncThread, OpenError> {
        let stop = Arc::new(AtomicBool::new(false));
        let flush_interval = config.storage.flush_interval;
        let handle = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("bookie-sync".to_string())
                .spawn(move || {
                    if let Err(reason) = sync_loop(
                        &journal,
                        &storage,
                        &stop,
                        flush_interval,
                        &checkpoint_latency,
                    ) {
                        health.fail(generation, &reason);
                    }
                })
                .map_err(OpenError::Thread)?
        };
        Ok(SyncThread {
            stop,
            handle: Mutex::new(Some(handle)),
        })
    }

    /// Starts the gc thread: a pass every `gc_interval` (a pass in progress
    /// returns at its next step once stopped).
    fn start_gc(
        storage: Arc<LedgerStorage>,
        gc_interval: Duration,
    ) -> Result<SyncThread, OpenError> {
        let stop = Arc::new(AtomicBool::new(false));
        let handle = {
            let stop = stop.clone();
            std::thread::Builder::new()
                .name("bookie-gc".to_string())
                .spawn(move || gc_loop(&storage, &stop, gc_interval))
                .map_err(OpenError::Thread)?
        };
        Ok(SyncThread {
            stop,
            handle: Mutex::new(Some(handle)),
        })
    }

    fn stop(&self) {
        self.stop.store(true, Ordering::Release);
        let handle = lock(&self.handle).take();
        if let Some(handle) = handle
            && handle.join().is_err()
        {
            tracing::error!("bookie background thread panicked");
        }
    }
}

/// Checkpoints every `flush_interval`, or sooner when storage asks (write cache
/// past its threshold or full) or the journal does (a pmem ring more than half
/// full). Returns the reason on a failed checkpoint (storage is `Broken` then:
/// the engine must be replaced).
fn sync_loop(
    journal: &Journal,
    storage: &LedgerStorage,
    stop: &AtomicBool,
    flush_interval: Duration,
    checkpoint_latency: &Histogram,
) -> Result<(), String> {
    let mut last_checkpoint = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let requested = storage.wait_for_flush_trigger(SYNC_POLL_INTERVAL.min(flush_interval))
            || journal.wants_checkpoint();
        if !requested && last_checkpoint.elapsed() < flush_interval {
            continue;
        }
        // Take the mark first: every record it covers was put into storage
        // before it was appended, so the flush below includes it.
        let mark = journal.last_synced_mark();
        let started = Instant::now();
        let flushed = storage
            .checkpoint(mark)
            .map_err(|error| format!("ledger storage checkpoint failed: {error}"))?;
        checkpoint_latency.record(started.elapsed());
        if let Err(error) = journal.delete_files_before(mark) {
            tracing::warn!(%error, "cannot delete old journal files");
        }
        // One line per periodic event, for correlating write-path stalls
        // (ARCHITECTURE.md "Periodic work"): the checkpoint and the journal
        // files it let go.
        tracing::debug!(
            target: "vela::periodic",
            kind = "checkpoint",
            elapsed_us = started.elapsed().as_micros() as u64,
            bytes = flushed.bytes_written,
            log_write_us = flushed.log_write_duration.as_micros() as u64,
            index_commit_us = flushed.index_commit_duration.as_micros() as u64,
            lock_wait_us = flushed.lock_wait_duration.as_micros() as u64,
            "storage checkpoint"
        );
        last_checkpoint = Instant::now();
    }
    Ok(())
}

/// Runs a storage gc pass every `gc_interval` until `stop`. A failed pass
/// turns storage `Broken` (the next checkpoint reports it); a pass that did
/// something is logged at info with where its time went.
fn gc_loop(storage: &LedgerStorage, stop: &AtomicBool, gc_interval: Duration) {
    let mut last_gc = Instant::now();
    while !stop.load(Ordering::Acquire) {
        std::thread::sleep(SYNC_POLL_INTERVAL.min(gc_interval));
        if last_gc.elapsed() < gc_interval {
            continue;
        }
        let started = Instant::now();
        let passed = storage.gc_until(stop);
        tracing::debug!(
            target: "vela::periodic",
            kind = "gc_pass",
            elapsed_us = started.elapsed().as_micros() as u64,
            "storage gc pass ended"
        );
        match passed {
            Ok(stats) => {
                let t = &stats.timings;
                let worked = stats.logs_deleted + stats.logs_compacted + stats.ledgers_purged > 0
                    || stats.compaction_slices > 0;
                let flush_lock_wait_max_ms =
                    storage.stats().flush_lock_wait_max.as_secs_f64() * 1e3;
                if worked {
                    tracing::info!(
                        logs_deleted = stats.logs_deleted,
                        logs_compacted = stats.logs_compacted,
                        slices = stats.compaction_slices,
                        entries_copied = stats.entries_copied,
                        reclaimed_mib = stats.bytes_reclaimed >> 20,
                        ledgers_purged = stats.ledgers_purged,
                        pass_ms = ms(t.pass),
                        snapshot_ms = ms(t.snapshot),
                        usage_ms = ms(t.usage),
                        log_remove_commit_ms = ms(t.log_remove_commit),
                        log_delete_ms = ms(t.log_delete),
                        compaction_read_ms = ms(t.compaction_read),
                        compaction_append_ms = ms(t.compaction_append),
                        compaction_sync_ms = ms(t.compaction_sync),
                        compaction_commit_ms = ms(t.compaction_commit),
                        pacing_ms = ms(t.pacing),
                        purge_commit_ms = ms(t.purge_commit),
                        flush_lock_held_max_ms = ms(t.flush_lock_held_max),
                        flush_lock_wait_max_ms,
                        "storage gc pass"
                    );
                } else {
                    tracing::debug!(?stats, "storage gc pass");
                }
            }
            Err(error) => tracing::warn!(%error, "storage gc pass failed"),
        }
        last_gc = Instant::now();
    }
}

/// A duration in ms with µs precision, for log lines.
fn ms(d: Duration) -> f64 {
    (d.as_micros() as f64) / 1e3
}
