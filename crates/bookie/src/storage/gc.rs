//! Garbage collection of entry logs, called periodically by the bookie's
//! background thread (`LedgerStorage::gc`).
//!
//! One pass, under the flush lock (so it never interleaves with a flush's writes
//! or index commits):
//! 1. Log files older than the active log that the index does not know (a flush
//!    that crashed before its commit, a delete that crashed before its unlink)
//!    hold nothing reachable: deleted.
//! 2. Per committed log, live bytes = the bytes of its ledgers (from the
//!    `log_ledgers` map, no scan) that are not deleted. No live bytes: the log is
//!    removed from the index, then unlinked. Live fraction of the file below
//!    `compaction_live_fraction`: compacted, lowest fraction first, at most
//!    `COMPACTION_BYTES_PER_PASS_MAX` copied per pass.
//! 3. Index records of deleted ledgers are removed, `GC_PURGE_LEDGERS_PER_PASS_MAX`
//!    ledgers per pass.
//!
//! Only deletions already persisted in the index count: a ledger deleted since the
//! last flush is left alone until the next pass, so a crash can never leave a
//! live-looking ledger with its data gone.
//!
//! Compaction copies each live record (CRC and ids verified) to the active log,
//! fdatasyncs it, commits the moved index records and the log's removal in one
//! transaction, then unlinks the old file. A crash before the commit leaves the
//! copies as unreferenced garbage in the active log; after it, the old file as an
//! unknown file (step 1). A log whose records fail verification is skipped for
//! the rest of the process and counted in `compaction_errors`, never retried in a
//! loop and never blocking other logs (BookKeeper PR #2121).
//!
//! Never: touches the active log's existing bytes, deletes a log the index still
//! references for a live ledger, runs unbounded (per-pass limits above).

use std::collections::{HashMap, HashSet};

use super::format;
use super::fs;
use bytes::Bytes;

use super::index::{Batch, EntrySpan, LogUsage, NewRecord, RecordView};
use super::{Flusher, GcStats, LedgerStorage, StorageError, list_log_ids};

/// Live bytes compaction copies per pass at most: at ~200 MB/s of disk this is
/// about a second of background I/O, and flushes wait behind the flush lock for
/// no longer than that.
const COMPACTION_BYTES_PER_PASS_MAX: u64 = 256 * 1024 * 1024;

/// Deleted ledgers whose index records one pass removes: keeps one pass's
/// transaction small (BookKeeper PR #3646: mass deletes hurt reads for minutes).
const GC_PURGE_LEDGERS_PER_PASS_MAX: usize = 1024;

/// Bytes compaction reads from an old log per `pread` (one entry at least):
/// large enough to amortize the syscall, small enough to bound the buffer.
const COMPACTION_READ_BYTES_MAX: u64 = 1024 * 1024;

impl LedgerStorage {
    /// One garbage-collection pass (see the `gc` module doc). Heavy I/O: call it
    /// from the bookie's background thread. A failed write or sync turns storage
    /// `Broken`.
    pub fn gc(&self) -> Result<GcStats, StorageError> {
        let mut f = self.flusher.lock();
        let deleted: HashSet<u64> = {
            let st = self.state.lock();
            if let Some(reason) = &st.broken {
                return Err(StorageError::Broken(reason.clone()));
            }
            st.ledgers
                .iter()
                .filter(|(id, l)| l.deleted && !st.dirty.contains(id))
                .map(|(id, _)| *id)
                .collect()
        };
        let r = self.gc_locked(&mut f, &deleted);
        if let Err(e) = &r {
            self.set_broken(e);
        }
        r
    }

    fn gc_locked(&self, f: &mut Flusher, deleted: &HashSet<u64>) -> Result<GcStats, StorageError> {
        let mut stats = GcStats::default();
        let active = f.writer.log_id();
        let usage = self.index.log_usage()?;
        let known: HashSet<u64> = usage.iter().map(|u| u.log_id).collect();

        // 1. Unknown files older than the active log.
        for id in list_log_ids(&self.dir)? {
            if id < active && !known.contains(&id) {
                stats.bytes_reclaimed += self.unlink_log(id)?;
                stats.logs_deleted += 1;
            }
        }

        // 2. Dead logs go; sparse ones are queued for compaction.
        // (live fraction, the log with only its live ledgers left in it)
        let mut candidates: Vec<(f64, LogUsage)> = Vec::new();
        for mut u in usage {
            if u.log_id == active {
                continue;
            }
            u.ledger_bytes.retain(|(l, _)| !deleted.contains(l));
            let live_bytes: u64 = u.ledger_bytes.iter().map(|(_, b)| *b).sum();
            if live_bytes == 0 {
                self.index.commit(&Batch {
                    remove_logs: vec![u.log_id],
                    ..Batch::default()
                })?;
                stats.bytes_reclaimed += self.unlink_log(u.log_id)?;
                stats.logs_deleted += 1;
                continue;
            }
            let file_bytes = std::fs::metadata(self.readers.path(u.log_id))
                .map_or(u.committed_bytes, |m| m.len())
                .max(1);
            let live_fraction = live_bytes as f64 / file_bytes as f64;
            if live_fraction < self.config.compaction_live_fraction
                && !f.compaction_skip.contains(&u.log_id)
            {
                candidates.push((live_fraction, u));
            }
        }
        candidates.sort_by(|a, b| a.0.total_cmp(&b.0));
        let mut copied_bytes = 0u64;
        for (_, u) in candidates {
            if copied_bytes >= COMPACTION_BYTES_PER_PASS_MAX {
                break;
            }
            let log_id = u.log_id;
            match self.compact_log(f, log_id, &u.ledger_bytes)? {
                Ok((entries, bytes)) => {
                    stats.entries_copied += entries;
                    copied_bytes += bytes;
                    stats.bytes_reclaimed += self.unlink_log(log_id)?;
                    stats.logs_compacted += 1;
                }
                Err(e) => {
                    tracing::warn!(log_id, error = %e, "entry log compaction skipped");
                    f.compaction_skip.insert(log_id);
                    stats.compaction_errors += 1;
                }
            }
        }

        // 3. Index records of deleted ledgers.
        let purge: Vec<u64> = {
            let st = self.state.lock();
            deleted
                .iter()
                .filter(|id| st.ledgers.get(id).is_some_and(|l| !l.purged))
                .take(GC_PURGE_LEDGERS_PER_PASS_MAX)
                .copied()
                .collect()
        };
        if !purge.is_empty() {
            let states = {
                let st = self.state.lock();
                purge
                    .iter()
                    .filter_map(|id| {
                        st.ledgers
                            .get(id)
                            .map(|l| (*id, super::index::LedgerState { purged: true, ..*l }))
                    })
                    .collect()
            };
            self.index.commit(&Batch {
                purge_ledgers: purge.clone(),
                put_ledgers: states,
                ..Batch::default()
            })?;
            let mut st = self.state.lock();
            for id in &purge {
                if let Some(l) = st.ledgers.get_mut(id) {
                    l.purged = true;
                }
            }
            stats.ledgers_purged = purge.len() as u64;
        }
        Ok(stats)
    }

    /// Copies the live records of `log_id` to the active log and commits their
    /// new places. Outer error: fatal (the active log or index failed). Inner
    /// error: the old log's bytes are bad or unreadable; nothing was committed.
    /// Ok: (entries copied, bytes copied).
    fn compact_log(
        &self,
        f: &mut Flusher,
        log_id: u64,
        live: &[(u64, u64)],
    ) -> Result<Result<(u64, u64), StorageError>, StorageError> {
        let mut batch = Batch::default();
        let mut log_bytes: HashMap<(u64, u64), u64> = HashMap::new();
        let (mut entries, mut bytes) = (0u64, 0u64);
        for &(ledger_id, _) in live {
            let records = match self.index.records_in_log(ledger_id, log_id) {
                Ok(r) => r,
                Err(e) => return Ok(Err(e)),
            };
            for (first, value) in records {
                let rec = match RecordView::decode(&value, self.index.path()) {
                    Ok(r) => r,
                    Err(e) => return Ok(Err(e)),
                };
                batch.remove_records.push((ledger_id, first));
                let mut current: Option<NewRecord> = None;
                // Read the record's entries in chunks of up to
                // COMPACTION_READ_BYTES_MAX (always at least one entry).
                let mut i = 0;
                let mut chunk: Vec<(EntrySpan, Bytes)> = Vec::new();
                while i < rec.len() || !chunk.is_empty() {
                    if chunk.is_empty() {
                        match self.read_chunk(&rec, first, log_id, ledger_id, &mut i) {
                            Ok(c) => chunk = c,
                            Err(e) => return Ok(Err(e)),
                        }
                        chunk.reverse();
                    }
                    let Some((span, payload)) = chunk.pop() else {
                        break;
                    };
                    let rec_bytes = format::record_bytes(payload.len());
                    let pace = self.flush_pace(0);
                    if f.writer.is_full_for(rec_bytes) {
                        let (old, size) = self.rotate(f, pace)?;
                        batch.set_log_sizes.push((old, size));
                    }
                    let new_log = f.writer.log_id();
                    let offset = f.writer.append(ledger_id, span.entry_id, &payload, pace)?;
                    let fits = current.as_ref().is_some_and(|r| {
                        r.accepts(ledger_id, new_log, span.entry_id, offset, rec_bytes)
                    });
                    if !fits {
                        if let Some(r) = current.take() {
                            batch.insert_records.push(r);
                        }
                        current = Some(NewRecord::new(ledger_id, span.entry_id, new_log, offset));
                    }
                    if let Some(r) = current.as_mut() {
                        r.push(span.entry_id, offset, rec_bytes);
                    }
                    *log_bytes.entry((new_log, ledger_id)).or_default() += rec_bytes;
                    entries += 1;
                    bytes += rec_bytes;
                }
                if let Some(r) = current.take() {
                    batch.insert_records.push(r);
                }
            }
        }
        f.writer.sync(self.flush_pace(0))?;
        batch.add_log_ledger_bytes = log_bytes
            .iter()
            .map(|(&(log, l), &b)| (log, l, b))
            .collect();
        batch
            .set_log_sizes
            .push((f.writer.log_id(), f.writer.size_bytes()));
        batch.remove_logs.push(log_id);
        batch.next_log_id = Some(f.next_log_id);
        self.index.commit(&batch)?;
        Ok(Ok((entries, bytes)))
    }

    /// Reads entries `*i..` of `rec` (contiguous in log `log_id`) in one `pread`
    /// of at most `COMPACTION_READ_BYTES_MAX` (or one entry), verifies each, and
    /// advances `*i` past them.
    fn read_chunk(
        &self,
        rec: &RecordView<'_>,
        first: u64,
        log_id: u64,
        ledger_id: u64,
        i: &mut usize,
    ) -> Result<Vec<(EntrySpan, Bytes)>, StorageError> {
        let db = self.index.path();
        let mut spans = vec![rec.span(*i, first, db)?];
        let mut total = spans[0].len;
        while *i + spans.len() < rec.len() {
            let s = rec.span(*i + spans.len(), first, db)?;
            if total + s.len > COMPACTION_READ_BYTES_MAX {
                break;
            }
            total += s.len;
            spans.push(s);
        }
        let start = spans[0].offset;
        let buf = self.readers.read(log_id, start, total)?;
        let path = self.readers.path(log_id);
        let mut out = Vec::with_capacity(spans.len());
        for s in spans {
            let rel = (s.offset - start) as usize;
            let record = buf.slice(rel..rel + s.len as usize);
            out.push((
                s,
                format::decode_record(&record, ledger_id, s.entry_id, &path, s.offset)?,
            ));
        }
        *i += out.len();
        Ok(out)
    }

    /// Unlinks log `log_id` (the index no longer references it) and syncs the
    /// dir; returns the file's size. A file already gone is fine.
    fn unlink_log(&self, log_id: u64) -> Result<u64, StorageError> {
        let path = self.readers.path(log_id);
        self.readers.forget(log_id);
        let size = std::fs::metadata(&path).map_or(0, |m| m.len());
        match std::fs::remove_file(&path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(0),
            Err(e) => return Err(StorageError::io("unlink", &path, e)),
        }
        fs::sync_dir(&self.dir)?;
        tracing::debug!(log_id, size, "entry log deleted");
        Ok(size)
    }
}
