//! Garbage collection of entry logs, called periodically by the bookie's gc
//! thread (`LedgerStorage::gc`, `gc_until`).
//!
//! One pass at a time (the `gc` lock, held for the whole pass). The pass takes
//! the flush lock only for short steps, so flushes (and checkpoints) run between
//! them and never wait for more than one step:
//! 0. Snapshot (flush lock): which ledgers are deleted in the index (a deletion
//!    not yet flushed does not count) and the active log. No flush is half-way
//!    while the lock is held, so every log older than the active one is either
//!    in the index or garbage. The logs' usage is then read from the index
//!    without the lock: only gc changes what the index says of older logs.
//! 1. Log files older than the active log that the index does not know (a flush
//!    that crashed before its commit, a delete that crashed before its unlink)
//!    hold nothing reachable: deleted (no lock).
//! 2. Per committed log, live bytes = the bytes of its ledgers (from the
//!    `log_ledgers` map, no scan) that are not deleted. No live bytes: the log is
//!    removed from the index (one commit for all of them, flush lock), then its
//!    file deleted (no lock). Live fraction of the file below
//!    `compaction_live_fraction`: compacted (`compact` module), lowest fraction
//!    first, at most `COMPACTION_BYTES_PER_PASS_MAX` copied per pass.
//! 3. Index records of deleted ledgers are removed, `GC_PURGE_LEDGERS_PER_PASS_MAX`
//!    ledgers per pass, `GC_PURGE_LEDGERS_PER_COMMIT_MAX` per commit (flush lock).
//!
//! Only deletions already persisted in the index count: a ledger deleted since the
//! last flush is left alone until the next pass, so a crash can never leave a
//! live-looking ledger with its data gone.
//!
//! Deleting a log file: the index forgets it first; then the file is cut down by
//! `ftruncate` in steps of `log_delete_step_bytes`, each fdatasync'ed, at most
//! `log_delete_bytes_per_s`, then unlinked and the dir synced. Unlinking a 1 GiB
//! file at once frees (and, on a filesystem mounted with `discard`, discards)
//! all its blocks in one burst that the journal's fdatasync queues behind: on
//! the benchmark VM (ext4, `discard`, virtio) a depth-1 4 KiB write+fdatasync
//! probe went from max 10-35 ms idle to 40-105 ms (p99 38-44 ms) during a
//! 1 GiB unlink, and stayed at 16-22 ms (p99 11-18 ms) when the file was cut
//! in 16-64 MiB synced steps first (`benches/gc.rs` measures it with storage).
//! A crash half-way leaves a short file the index does not know: step 1 of a
//! later pass deletes it. A reader that looked the entry up before the log was
//! forgotten and reads after the cut sees a short file and looks up again
//! (`LedgerStorage::get_entry_from`).
//!
//! Pacing: compaction copies at most `compaction_bytes_per_s`, deletion cuts at
//! most `log_delete_bytes_per_s`; the pass sleeps (without any lock) to keep
//! to them, and `gc_until` returns at the next step once its stop flag is set.
//!
//! Never: holds the flush lock across more than one step, touches the active
//! log's existing bytes, deletes a log the index still references, runs
//! unbounded (per-pass limits above).

use std::collections::HashSet;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::index::{Batch, LogUsage};
use super::{Flusher, GcStats, LedgerStorage, StorageError, fs, list_log_ids};

/// Live bytes compaction copies per pass at most: at the default 32 MiB/s
/// that is 8 s of background copying; the rest waits for the next pass.
const COMPACTION_BYTES_PER_PASS_MAX: u64 = 256 * 1024 * 1024;

/// Deleted ledgers whose index records one pass removes: keeps one pass's
/// work small (BookKeeper PR #3646: mass deletes hurt reads for minutes).
const GC_PURGE_LEDGERS_PER_PASS_MAX: usize = 1024;

/// Deleted ledgers purged per index commit: one commit holds the flush lock.
const GC_PURGE_LEDGERS_PER_COMMIT_MAX: usize = 128;

/// Longest single sleep of the pacing, so a stop flag is seen soon.
const PACING_SLEEP_STEP: Duration = Duration::from_millis(50);

/// What gc keeps across passes (under the `gc` lock).
#[derive(Debug, Default)]
pub(super) struct GcState {
    /// Logs that failed compaction in this process; skipped by later passes.
    compaction_skip: HashSet<u64>,
}

/// A test's hook into gc passes (`LedgerStorage::set_gc_slice_hook`).
#[derive(Clone)]
pub(super) struct GcSliceHook(pub(super) std::sync::Arc<dyn Fn() + Send + Sync>);

impl std::fmt::Debug for GcSliceHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GcSliceHook")
    }
}

/// Keeps a stream of work within `bytes_per_s` by sleeping (0: no limit).
#[derive(Debug)]
pub(super) struct Pacer {
    bytes_per_s: u64,
    started: Instant,
    bytes: u64,
}

impl Pacer {
    pub(super) fn new(bytes_per_s: u64) -> Pacer {
        Pacer {
            bytes_per_s,
            started: Instant::now(),
            bytes: 0,
        }
    }

    /// Counts `bytes` done and sleeps until they fit the rate (or `stop` is
    /// set); returns the time slept.
    pub(super) fn account(&mut self, bytes: u64, stop: &AtomicBool) -> Duration {
        self.bytes += bytes;
        if self.bytes_per_s == 0 {
            return Duration::ZERO;
        }
        let due = Duration::from_secs_f64(self.bytes as f64 / self.bytes_per_s as f64);
        let slept_from = Instant::now();
        loop {
            let elapsed = self.started.elapsed();
            if elapsed >= due || stop.load(Ordering::Acquire) {
                return slept_from.elapsed();
            }
            std::thread::sleep((due - elapsed).min(PACING_SLEEP_STEP));
        }
    }
}

/// What step 0 reads under the flush lock.
struct Snapshot {
    active: u64,
    /// Ledgers whose deletion is in the index.
    deleted: HashSet<u64>,
}

impl LedgerStorage {
    /// One full garbage-collection pass (see the `gc` module doc). Heavy,
    /// paced I/O: call it from a background thread. A failed write or sync
    /// turns storage `Broken`.
    pub fn gc(&self) -> Result<GcStats, StorageError> {
        self.gc_until(&AtomicBool::new(false))
    }

    /// As `gc`, but returns early, between two steps (storage consistent), once
    /// `stop` is set; the next pass goes on from there.
    pub fn gc_until(&self, stop: &AtomicBool) -> Result<GcStats, StorageError> {
        let mut gc = self.gc.lock();
        let started = Instant::now();
        let mut stats = GcStats::default();
        let r = self.gc_pass(&mut gc, stop, &mut stats);
        stats.timings.pass = started.elapsed();
        if let Err(e) = &r {
            self.set_broken(e);
        }
        r.map(|()| stats)
    }

    /// Runs `step` under the flush lock, noting how long it was held.
    pub(super) fn with_flusher<R>(
        &self,
        stats: &mut GcStats,
        step: impl FnOnce(&mut Flusher) -> R,
    ) -> R {
        let mut f = self.flusher.lock();
        let held_from = Instant::now();
        let r = step(&mut f);
        // Hand the lock straight to a flush waiting for it.
        parking_lot::MutexGuard::unlock_fair(f);
        let held = held_from.elapsed();
        stats.timings.flush_lock_held_max = stats.timings.flush_lock_held_max.max(held);
        r
    }

    fn gc_pass(
        &self,
        gc: &mut GcState,
        stop: &AtomicBool,
        stats: &mut GcStats,
    ) -> Result<(), StorageError> {
        // 0. Snapshot.
        let t = Instant::now();
        let snap = self.with_flusher(stats, |f| {
            let st = self.state.lock();
            if let Some(reason) = &st.broken {
                return Err(StorageError::Broken(reason.clone()));
            }
            let deleted = st
                .ledgers
                .iter()
                .filter(|(id, l)| l.deleted && !st.dirty.contains(id))
                .map(|(id, _)| *id)
                .collect();
            Ok(Snapshot {
                active: f.writer.log_id(),
                deleted,
            })
        })?;
        stats.timings.snapshot = t.elapsed();
        let t = Instant::now();
        let usage = self.index.log_usage()?;
        stats.timings.usage = t.elapsed();
        let known: HashSet<u64> = usage.iter().map(|u| u.log_id).collect();
        let mut deletes = Pacer::new(self.config.log_delete_bytes_per_s);

        // 1. Unknown files older than the active log.
        for id in list_log_ids(&self.dir)? {
            if id < snap.active && !known.contains(&id) {
                stats.bytes_reclaimed += self.delete_log_file(id, &mut deletes, stop, stats)?;
                stats.logs_deleted += 1;
            }
        }

        // 2. Dead logs go; sparse ones are queued for compaction. Logs at or
        // past the snapshot's active one are left for a later pass.
        // (live fraction, the log with only its live ledgers left in it)
        let mut candidates: Vec<(f64, LogUsage)> = Vec::new();
        let mut dead: Vec<u64> = Vec::new();
        for mut u in usage {
            if u.log_id >= snap.active {
                continue;
            }
            u.ledger_bytes.retain(|(l, _)| !snap.deleted.contains(l));
            let live_bytes: u64 = u.ledger_bytes.iter().map(|(_, b)| *b).sum();
            if live_bytes == 0 {
                dead.push(u.log_id);
                continue;
            }
            let file_bytes = std::fs::metadata(self.readers.path(u.log_id))
                .map_or(u.committed_bytes, |m| m.len())
                .max(1);
            let live_fraction = live_bytes as f64 / file_bytes as f64;
            if live_fraction < self.config.compaction_live_fraction
                && !gc.compaction_skip.contains(&u.log_id)
            {
                candidates.push((live_fraction, u));
            }
        }
        if !dead.is_empty() {
            self.commit_log_removal(&dead, stats)?;
            for id in dead {
                stats.bytes_reclaimed += self.delete_log_file(id, &mut deletes, stop, stats)?;
                stats.logs_deleted += 1;
            }
        }
        candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut copies = Pacer::new(self.config.compaction_bytes_per_s);
        let mut copied_bytes = 0u64;
        for (_, u) in candidates {
            if copied_bytes >= COMPACTION_BYTES_PER_PASS_MAX || stop.load(Ordering::Acquire) {
                break;
            }
            let log_id = u.log_id;
            let budget = COMPACTION_BYTES_PER_PASS_MAX - copied_bytes;
            match self.compact_log(log_id, &u.ledger_bytes, budget, &mut copies, stop, stats)? {
                Ok(done) => {
                    stats.entries_copied += done.entries;
                    copied_bytes += done.bytes;
                    if done.complete {
                        self.commit_log_removal(&[log_id], stats)?;
                        stats.bytes_reclaimed +=
                            self.delete_log_file(log_id, &mut deletes, stop, stats)?;
                        stats.logs_compacted += 1;
                    }
                }
                Err(e) => {
                    tracing::warn!(log_id, error = %e, "entry log compaction skipped");
                    gc.compaction_skip.insert(log_id);
                    stats.compaction_errors += 1;
                }
            }
        }

        // 3. Index records of deleted ledgers.
        let purge: Vec<u64> = {
            let st = self.state.lock();
            snap.deleted
                .iter()
                .filter(|id| st.ledgers.get(id).is_some_and(|l| !l.purged))
                .take(GC_PURGE_LEDGERS_PER_PASS_MAX)
                .copied()
                .collect()
        };
        for chunk in purge.chunks(GC_PURGE_LEDGERS_PER_COMMIT_MAX) {
            let t = Instant::now();
            self.with_flusher(stats, |_| self.purge_ledgers(chunk))?;
            stats.timings.purge_commit += t.elapsed();
            stats.ledgers_purged += chunk.len() as u64;
        }
        Ok(())
    }

    /// Removes the index records of deleted ledgers `ids` and marks them
    /// purged, in one commit. Called under the flush lock, so no flush writes
    /// a ledger's state between the read here and the commit.
    fn purge_ledgers(&self, ids: &[u64]) -> Result<(), StorageError> {
        let states = {
            let st = self.state.lock();
            ids.iter()
                .filter_map(|id| {
                    st.ledgers
                        .get(id)
                        .map(|l| (*id, super::index::LedgerState { purged: true, ..*l }))
                })
                .collect()
        };
        self.index.commit(&Batch {
            purge_ledgers: ids.to_vec(),
            put_ledgers: states,
            ..Batch::default()
        })?;
        let mut st = self.state.lock();
        for id in ids {
            if let Some(l) = st.ledgers.get_mut(id) {
                l.purged = true;
            }
        }
        Ok(())
    }

    /// Removes logs `ids` (none live) from the index in one commit.
    fn commit_log_removal(&self, ids: &[u64], stats: &mut GcStats) -> Result<(), StorageError> {
        let t = Instant::now();
        self.with_flusher(stats, |_| {
            self.index.commit(&Batch {
                remove_logs: ids.to_vec(),
                ..Batch::default()
            })
        })?;
        stats.timings.log_remove_commit += t.elapsed();
        Ok(())
    }

    /// Deletes the file of log `log_id`, which the index no longer references:
    /// cut down in synced steps within the deletion rate, then unlinked and
    /// the dir synced (module doc). Returns the file's size; a file already
    /// gone is fine. No lock held.
    fn delete_log_file(
        &self,
        log_id: u64,
        pacer: &mut Pacer,
        stop: &AtomicBool,
        stats: &mut GcStats,
    ) -> Result<u64, StorageError> {
        let t = Instant::now();
        let path = self.readers.path(log_id);
        self.readers.forget(log_id);
        let size = match std::fs::metadata(&path) {
            Ok(m) => m.len(),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StorageError::io("stat", &path, e)),
        };
        let step = self.config.log_delete_step_bytes;
        if step > 0 && size > step {
            let mut slept = Duration::ZERO;
            let file = std::fs::OpenOptions::new()
                .write(true)
                .open(&path)
                .map_err(|e| StorageError::io("open", &path, e))?;
            let mut len = size;
            while len > 0 {
                let next = len.saturating_sub(step);
                cut_to(&file, &path, next)?;
                slept += pacer.account(len - next, stop);
                len = next;
            }
            stats.timings.pacing += slept;
        }
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StorageError::io("unlink", &path, e)),
        }
        fs::sync_dir(&self.dir)?;
        // A reader may have opened the file again meanwhile.
        self.readers.forget(log_id);
        stats.timings.log_delete += t.elapsed();
        tracing::debug!(log_id, size, "entry log deleted");
        Ok(size)
    }
}

/// Truncates `file` to `len` and fdatasyncs it, so the blocks freed go to the
/// device now, in this step's share.
fn cut_to(file: &std::fs::File, path: &Path, len: u64) -> Result<(), StorageError> {
    file.set_len(len)
        .map_err(|e| StorageError::io("ftruncate", path, e))?;
    file.sync_data()
        .map_err(|e| StorageError::io("fdatasync", path, e))
}
