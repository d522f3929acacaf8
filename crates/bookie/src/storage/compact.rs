//! Compaction of one entry log, in slices (step 2 of a gc pass; `gc` module doc).
//!
//! The live records of the old log are copied to the active log a slice at a
//! time (`compaction_slice_bytes` of entries, at least one):
//! 1. read and verify (CRC, ids) the slice's entries from the old log, no lock
//!    held (the old log never changes);
//! 2. under the flush lock: append them to the active log (rotating it when
//!    full), fdatasync, and commit in one index transaction: the moved entries'
//!    records in their new log, what is left of each touched record under a new
//!    key (its first remaining entry, still in the old log), the per-log byte
//!    counts;
//! 3. sleep, no lock held, to stay within `compaction_bytes_per_s`.
//!
//! A flush therefore waits for at most one slice's append, sync and commit.
//! Once nothing live is left in the old log, the pass removes it from the index
//! and deletes the file.
//!
//! Crash safety: a commit names only fdatasync'ed copies, and the old log's
//! bytes stay as they were until the log is removed from the index, so after a
//! crash between slices every entry is indexed exactly once, in its old log or
//! its new one; copies made after the last commit are unreferenced garbage in
//! the active log. The next pass compacts what is left.
//! A record that fails verification ends the log's compaction (what moved
//! stays moved, the rest stays in place); the log is then skipped for the
//! rest of the process and counted in `compaction_errors`, never retried in a
//! loop and never blocking other logs (BookKeeper PR #2121).
//!
//! Never: merges entries of two index records into one (their key ranges may
//! interleave, `index` module doc), holds the flush lock while reading the old
//! log or while pacing.

use std::collections::HashMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;

use super::entry_log::FlushPace;
use super::format;
use super::gc::Pacer;
use super::index::{Batch, EntrySpan, NewRecord, RecordView};
use super::{FailPoint, Flusher, GcStats, LedgerStorage, StorageError};

/// Bytes compaction reads from an old log per `pread` (one entry at least):
/// large enough to amortize the syscall, small enough to bound the buffer.
const COMPACTION_READ_BYTES_MAX: u64 = 1024 * 1024;

/// Compaction's writes always yield to the journal (256 KiB pieces with
/// O_DIRECT): a slice is small, and a flush that has adds waiting takes the
/// lock as soon as the slice ends (`FlushPace` says why flushes may not).
const COMPACTION_PACE: FlushPace = FlushPace::Yield;

/// What compacting one log did.
#[derive(Debug)]
pub(super) struct Compacted {
    pub(super) entries: u64,
    pub(super) bytes: u64,
    /// Every live record moved: the log can be removed.
    pub(super) complete: bool,
}

/// One index record of the log being compacted.
#[derive(Debug)]
struct Pending {
    ledger_id: u64,
    /// The record's key when compaction began (entry deltas count from it).
    first: u64,
    value: Vec<u8>,
    /// Entries in the record.
    len: usize,
    /// Entries before this one have moved; the rest are in the old log, under
    /// the key of this entry.
    next: usize,
}

/// Entries one slice read: per record touched (its place in the pending
/// list), its entries from `next` on.
type SliceRead = Vec<(usize, Vec<(EntrySpan, Bytes)>)>;

/// What one slice's locked step did.
#[derive(Debug)]
struct SliceWritten {
    entries: u64,
    bytes: u64,
    append: Duration,
    sync: Duration,
    commit: Duration,
}

impl LedgerStorage {
    /// Copies the live records of `log_id` (those of the `live` ledgers) to the
    /// active log in slices, until all moved, `budget_bytes` are copied or
    /// `stop` is set. Outer error: fatal (the active log or the index failed).
    /// Inner error: the old log's bytes or records are bad; the slices
    /// committed before it stay.
    pub(super) fn compact_log(
        &self,
        log_id: u64,
        live: &[(u64, u64)],
        budget_bytes: u64,
        pacer: &mut Pacer,
        stop: &AtomicBool,
        stats: &mut GcStats,
    ) -> Result<Result<Compacted, StorageError>, StorageError> {
        let db = self.index.path();
        let t = Instant::now();
        let mut pending = Vec::new();
        for &(ledger_id, _) in live {
            let records = match self.index.records_in_log(ledger_id, log_id) {
                Ok(r) => r,
                Err(e) => return Ok(Err(e)),
            };
            for (first, value) in records {
                let len = match check_record(&value, first, db) {
                    Ok(len) => len,
                    Err(e) => return Ok(Err(e)),
                };
                pending.push(Pending {
                    ledger_id,
                    first,
                    value,
                    len,
                    next: 0,
                });
            }
        }
        stats.timings.compaction_read += t.elapsed();
        let mut done = Compacted {
            entries: 0,
            bytes: 0,
            complete: false,
        };
        let mut cursor = 0;
        loop {
            while pending.get(cursor).is_some_and(|p| p.next == p.len) {
                cursor += 1;
            }
            if cursor == pending.len() {
                done.complete = true;
                return Ok(Ok(done));
            }
            if done.bytes >= budget_bytes || stop.load(Ordering::Acquire) {
                return Ok(Ok(done));
            }
            let t = Instant::now();
            let slice = match self.read_slice(log_id, &pending[cursor..]) {
                Ok(s) => s,
                Err(e) => return Ok(Err(e)),
            };
            stats.timings.compaction_read += t.elapsed();
            let written = self.with_flusher(stats, |f| {
                self.write_slice(f, log_id, &pending[cursor..], &slice)
            })?;
            for (i, read) in &slice {
                let p = &mut pending[cursor + i];
                p.next += read.len();
                debug_assert!(p.next <= p.len);
            }
            stats.compaction_slices += 1;
            stats.timings.compaction_append += written.append;
            stats.timings.compaction_sync += written.sync;
            stats.timings.compaction_commit += written.commit;
            done.entries += written.entries;
            done.bytes += written.bytes;
            if *self.fail_point.lock() == Some(FailPoint::GcAfterCompactionSlice) {
                return Err(StorageError::Broken(
                    "fail point GcAfterCompactionSlice".into(),
                ));
            }
            let hook = self.gc_slice_hook.lock().clone();
            if let Some(hook) = hook {
                (hook.0)();
            }
            stats.timings.pacing += pacer.account(written.bytes, stop);
        }
    }

    /// Reads the next slice: entries of `pending` records from each one's
    /// `next` on, in order, until `compaction_slice_bytes` (at least one entry).
    /// No lock held.
    fn read_slice(&self, log_id: u64, pending: &[Pending]) -> Result<SliceRead, StorageError> {
        let db = self.index.path();
        let slice_max = self.config.compaction_slice_bytes;
        let mut out = Vec::new();
        let mut total = 0u64;
        for (i, p) in pending.iter().enumerate() {
            if total >= slice_max {
                break;
            }
            let rec = RecordView::decode(&p.value, db)?;
            let mut at = p.next;
            let mut entries = Vec::new();
            while at < p.len && total < slice_max {
                let room = (slice_max - total).min(COMPACTION_READ_BYTES_MAX);
                let chunk = self.read_chunk(&rec, p.first, log_id, p.ledger_id, &mut at, room)?;
                total += chunk.iter().map(|(s, _)| s.len).sum::<u64>();
                entries.extend(chunk);
            }
            if !entries.is_empty() {
                out.push((i, entries));
            }
        }
        debug_assert!(
            !out.is_empty(),
            "a slice is read only when entries are left"
        );
        Ok(out)
    }

    /// The locked step of a slice: append, fdatasync, one index commit.
    fn write_slice(
        &self,
        f: &mut Flusher,
        log_id: u64,
        pending: &[Pending],
        slice: &SliceRead,
    ) -> Result<SliceWritten, StorageError> {
        let db = self.index.path();
        let t = Instant::now();
        let mut batch = Batch::default();
        let mut new_bytes: HashMap<(u64, u64), u64> = HashMap::new();
        let mut old_bytes: HashMap<u64, u64> = HashMap::new();
        let (mut entries, mut bytes) = (0u64, 0u64);
        for (i, read) in slice {
            let p = &pending[*i];
            let ledger_id = p.ledger_id;
            let Some((first_moved, _)) = read.first() else {
                continue;
            };
            // The record as it stands: keyed by its first entry not yet moved.
            batch.remove_records.push((ledger_id, first_moved.entry_id));
            let mut current: Option<NewRecord> = None;
            for (span, payload) in read {
                let rec_bytes = format::record_bytes(payload.len());
                if f.writer.is_full_for(rec_bytes) {
                    let (old, size) = self.rotate(f, COMPACTION_PACE)?;
                    batch.set_log_sizes.push((old, size));
                }
                let new_log = f.writer.log_id();
                let offset = f
                    .writer
                    .append(ledger_id, span.entry_id, payload, COMPACTION_PACE)?;
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
                *new_bytes.entry((new_log, ledger_id)).or_default() += rec_bytes;
                *old_bytes.entry(ledger_id).or_default() += span.len;
                entries += 1;
                bytes += rec_bytes;
            }
            if let Some(r) = current.take() {
                batch.insert_records.push(r);
            }
            let rest = p.next + read.len();
            if rest < p.len {
                let rec = RecordView::decode(&p.value, db)?;
                batch
                    .insert_records
                    .push(remainder_record(&rec, p, rest, log_id, db)?);
            }
        }
        let append = t.elapsed();
        let t = Instant::now();
        f.writer.sync(COMPACTION_PACE)?;
        let sync = t.elapsed();
        let t = Instant::now();
        batch.add_log_ledger_bytes = new_bytes
            .iter()
            .map(|(&(log, l), &b)| (log, l, b))
            .collect();
        batch.sub_log_ledger_bytes = old_bytes.iter().map(|(&l, &b)| (log_id, l, b)).collect();
        batch
            .set_log_sizes
            .push((f.writer.log_id(), f.writer.size_bytes()));
        batch.next_log_id = Some(f.next_log_id);
        self.index.commit(&batch)?;
        Ok(SliceWritten {
            entries,
            bytes,
            append,
            sync,
            commit: t.elapsed(),
        })
    }

    /// Reads entries `*i..` of `rec` (contiguous in log `log_id`) in one `pread`
    /// of at most `bytes_max` (or one entry), verifies each, and advances `*i`
    /// past them.
    fn read_chunk(
        &self,
        rec: &RecordView<'_>,
        first: u64,
        log_id: u64,
        ledger_id: u64,
        i: &mut usize,
        bytes_max: u64,
    ) -> Result<Vec<(EntrySpan, Bytes)>, StorageError> {
        let db = self.index.path();
        let mut spans = vec![rec.span(*i, first, db)?];
        let mut total = spans[0].len;
        while *i + spans.len() < rec.len() {
            let s = rec.span(*i + spans.len(), first, db)?;
            if total + s.len > bytes_max {
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
}

/// Checks a stored record before compaction relies on it: it decodes, its
/// first entry is its key and its entry ids increase. Returns its length.
fn check_record(value: &[u8], first: u64, db: &Path) -> Result<usize, StorageError> {
    let rec = RecordView::decode(value, db)?;
    let mut last: Option<u64> = None;
    for i in 0..rec.len() {
        let s = rec.span(i, first, db)?;
        let ok = match last {
            None => s.entry_id == first,
            Some(prev) => s.entry_id > prev,
        };
        if !ok {
            return Err(StorageError::corruption(
                db,
                0,
                format!("index record ({first}) entry {i} has id {}", s.entry_id),
            ));
        }
        last = Some(s.entry_id);
    }
    Ok(rec.len())
}

/// The part of `rec` from entry `from` on, still in log `log_id`, as a record
/// of its own keyed by its first entry.
fn remainder_record(
    rec: &RecordView<'_>,
    p: &Pending,
    from: usize,
    log_id: u64,
    db: &Path,
) -> Result<NewRecord, StorageError> {
    let s0 = rec.span(from, p.first, db)?;
    let mut r = NewRecord::new(p.ledger_id, s0.entry_id, log_id, s0.offset);
    for i in from..rec.len() {
        let s = rec.span(i, p.first, db)?;
        // A part of a checked record always fits (smaller deltas, same order).
        if !r.accepts(p.ledger_id, log_id, s.entry_id, s.offset, s.len) {
            debug_assert!(false, "a record's remainder does not fit a record");
            return Err(StorageError::corruption(
                db,
                0,
                format!("index record ({}) entry {i} cannot be re-keyed", p.first),
            ));
        }
        r.push(s.entry_id, s.offset, s.len);
    }
    Ok(r)
}
