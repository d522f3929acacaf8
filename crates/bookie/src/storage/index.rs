//! The entry index and persistent per-ledger state, in one redb database.
//!
//! Tables:
//! - `locations`: key (ledger_id, first_entry_id) → one *index record* per ledger
//!   per flush (split at `INDEX_RECORD_ENTRIES_MAX`, at entry-log rotation, or when
//!   a delta outgrows u32). A flush writes each ledger's entries contiguously, so
//!   the record holds the log id, the offset of the first record and, densely,
//!   each entry's id and offset delta. Lookups take the record with the greatest
//!   key <= (ledger, entry) and binary-search it; BookKeeper's one-key-per-entry
//!   index is what makes its flushes stall (PR #3103), this is one key per ledger.
//! - `ledgers`: ledger_id → `LedgerState` (fenced, deleted, explicit LAC, highest
//!   indexed entry, overlap flag).
//! - `log_ledgers`: (log_id, ledger_id) → bytes that ledger has in that log, so gc
//!   knows each log's live bytes without scanning it.
//! - `logs`: log_id → bytes committed to that log.
//! - `meta`: "next_log_id".
//!
//! Entry sets of records never overlap (flush drops entries the index already
//! holds), but their key ranges may interleave when a ledger's entries arrive out
//! of order across flushes (recovery adds); such a ledger carries the `overlapping`
//! flag and lookups then walk further back than one record.
//!
//! Never: written on the ADD path (only flush and gc write, each in one durable
//! transaction), trusts a stored value's lengths without checking them.

use std::path::{Path, PathBuf};

use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use super::config::ENTRY_PAYLOAD_BYTES_MAX;
use super::error::StorageError;
use super::format::{self, RECORD_HEADER_BYTES, le_u32, le_u64};

const LOCATIONS: TableDefinition<(u64, u64), &[u8]> = TableDefinition::new("locations");
const LEDGERS: TableDefinition<u64, &[u8]> = TableDefinition::new("ledgers");
const LOG_LEDGERS: TableDefinition<(u64, u64), u64> = TableDefinition::new("log_ledgers");
const LOGS: TableDefinition<u64, u64> = TableDefinition::new("logs");
const META: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_NEXT_LOG_ID: &str = "next_log_id";

/// Entries per index record at most: a record value is then at most
/// 25 + 8 * 16384 = 128 KiB, a cheap read for a lookup.
pub(crate) const INDEX_RECORD_ENTRIES_MAX: usize = 16_384;

// ---------------------------------------------------------------------------
// Index record
// { version u8 = 1 | log_id u64 | base_offset u64 | count u32 | end_delta u32 |
//   [entry_delta u32 | offset_delta u32] * count }
// entry_delta = entry_id - first_entry_id (the key's), strictly increasing from 0;
// offset_delta = record offset - base_offset, strictly increasing from 0;
// end_delta = end of the last record - base_offset. Record i spans
// [offset_delta_i, offset_delta_{i+1} or end_delta).

const RECORD_VERSION: u8 = 1;
const RECORD_FIXED_BYTES: usize = 25;

/// An index record being built by a flush or compaction.
#[derive(Debug, Clone)]
pub(crate) struct NewRecord {
    pub(crate) ledger_id: u64,
    pub(crate) first_entry_id: u64,
    pub(crate) log_id: u64,
    pub(crate) base_offset: u64,
    pub(crate) end_offset: u64,
    /// (entry_delta, offset_delta)
    pub(crate) pairs: Vec<(u32, u32)>,
}

impl NewRecord {
    pub(crate) fn new(
        ledger_id: u64,
        first_entry_id: u64,
        log_id: u64,
        base_offset: u64,
    ) -> NewRecord {
        NewRecord {
            ledger_id,
            first_entry_id,
            log_id,
            base_offset,
            end_offset: base_offset,
            pairs: Vec::new(),
        }
    }

    /// Whether entry `entry_id`, written at `offset` (must be this record's end)
    /// with `record_bytes`, fits this record.
    pub(crate) fn accepts(
        &self,
        ledger_id: u64,
        log_id: u64,
        entry_id: u64,
        offset: u64,
        record_bytes: u64,
    ) -> bool {
        ledger_id == self.ledger_id
            && log_id == self.log_id
            && offset == self.end_offset
            && self.pairs.len() < INDEX_RECORD_ENTRIES_MAX
            && entry_id >= self.first_entry_id
            && entry_id - self.first_entry_id <= u64::from(u32::MAX)
            && offset + record_bytes - self.base_offset <= u64::from(u32::MAX)
    }

    pub(crate) fn push(&mut self, entry_id: u64, offset: u64, record_bytes: u64) {
        debug_assert!(self.accepts(self.ledger_id, self.log_id, entry_id, offset, record_bytes));
        debug_assert!(
            self.pairs
                .last()
                .is_none_or(|&(d, _)| u64::from(d) < entry_id - self.first_entry_id)
        );
        self.pairs.push((
            (entry_id - self.first_entry_id) as u32,
            (offset - self.base_offset) as u32,
        ));
        self.end_offset = offset + record_bytes;
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(RECORD_FIXED_BYTES + 8 * self.pairs.len());
        v.push(RECORD_VERSION);
        v.extend_from_slice(&self.log_id.to_le_bytes());
        v.extend_from_slice(&self.base_offset.to_le_bytes());
        v.extend_from_slice(&(self.pairs.len() as u32).to_le_bytes());
        v.extend_from_slice(&((self.end_offset - self.base_offset) as u32).to_le_bytes());
        for &(e, o) in &self.pairs {
            v.extend_from_slice(&e.to_le_bytes());
            v.extend_from_slice(&o.to_le_bytes());
        }
        v
    }
}

/// A decoded view of a stored index record.
#[derive(Debug)]
pub(crate) struct RecordView<'a> {
    pub(crate) log_id: u64,
    base_offset: u64,
    count: usize,
    end_delta: u32,
    pairs: &'a [u8],
}

/// One entry's place in a log, from the index.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct EntrySpan {
    pub(crate) entry_id: u64,
    pub(crate) offset: u64,
    pub(crate) len: u64,
}

impl<'a> RecordView<'a> {
    pub(crate) fn decode(v: &'a [u8], db_path: &Path) -> Result<RecordView<'a>, StorageError> {
        let bad = |reason: String| Err(StorageError::corruption(db_path, 0, reason));
        if v.len() < RECORD_FIXED_BYTES || v[0] != RECORD_VERSION {
            return bad(format!(
                "index record of {} bytes / version {:?}",
                v.len(),
                v.first()
            ));
        }
        let count = le_u32(&v[17..21]) as usize;
        if count == 0 || v.len() != RECORD_FIXED_BYTES + 8 * count {
            return bad(format!(
                "index record of {} bytes claims {count} entries",
                v.len()
            ));
        }
        Ok(RecordView {
            log_id: le_u64(&v[1..9]),
            base_offset: le_u64(&v[9..17]),
            count,
            end_delta: le_u32(&v[21..25]),
            pairs: &v[RECORD_FIXED_BYTES..],
        })
    }

    fn pair(&self, i: usize) -> (u32, u32) {
        (
            le_u32(&self.pairs[8 * i..]),
            le_u32(&self.pairs[8 * i + 4..]),
        )
    }

    pub(crate) fn len(&self) -> usize {
        self.count
    }

    /// Index of entry delta `delta` in this record.
    pub(crate) fn position(&self, delta: u64) -> Option<usize> {
        let delta = u32::try_from(delta).ok()?;
        let (mut lo, mut hi) = (0usize, self.count);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            let d = self.pair(mid).0;
            if d == delta {
                return Some(mid);
            }
            if d < delta {
                lo = mid + 1;
            } else {
                hi = mid;
            }
        }
        None
    }

    /// Span of the i-th entry, checked: a span that is empty, backwards or too
    /// large for any record is corruption.
    pub(crate) fn span(
        &self,
        i: usize,
        first_entry_id: u64,
        db_path: &Path,
    ) -> Result<EntrySpan, StorageError> {
        let (e, o) = self.pair(i);
        let end = if i + 1 < self.count {
            self.pair(i + 1).1
        } else {
            self.end_delta
        };
        let len = u64::from(end).saturating_sub(u64::from(o));
        if len < RECORD_HEADER_BYTES
            || len > RECORD_HEADER_BYTES + u64::from(ENTRY_PAYLOAD_BYTES_MAX)
        {
            return Err(StorageError::corruption(
                db_path,
                0,
                format!("index record entry {i} spans {o}..{end}"),
            ));
        }
        Ok(EntrySpan {
            entry_id: first_entry_id + u64::from(e),
            offset: self.base_offset + u64::from(o),
            len,
        })
    }
}

// ---------------------------------------------------------------------------
// Ledger state
// { version u8 = 1 | flags u8 | explicit_lac u64 | indexed_last u64 }
// flags: 1 fenced, 2 deleted, 4 has explicit LAC, 8 has indexed_last,
//        16 overlapping, 32 purged (index records of a deleted ledger removed).

const LEDGER_STATE_VERSION: u8 = 1;
const LEDGER_STATE_BYTES: usize = 18;

/// What storage knows of one ledger. Present in the map = the ledger exists here.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct LedgerState {
    pub(crate) fenced: bool,
    pub(crate) deleted: bool,
    pub(crate) explicit_lac: Option<u64>,
    /// Highest entry id in the index (not counting the write cache).
    pub(crate) indexed_last: Option<u64>,
    /// Some index records' key ranges interleave (see module doc).
    pub(crate) overlapping: bool,
    /// Deleted and its index records are gone.
    pub(crate) purged: bool,
}

impl LedgerState {
    pub(crate) fn encode(&self) -> [u8; LEDGER_STATE_BYTES] {
        let mut b = [0u8; LEDGER_STATE_BYTES];
        b[0] = LEDGER_STATE_VERSION;
        let mut flags = 0u8;
        for (on, bit) in [
            (self.fenced, 1),
            (self.deleted, 2),
            (self.explicit_lac.is_some(), 4),
            (self.indexed_last.is_some(), 8),
            (self.overlapping, 16),
            (self.purged, 32),
        ] {
            if on {
                flags |= bit;
            }
        }
        b[1] = flags;
        b[2..10].copy_from_slice(&self.explicit_lac.unwrap_or(0).to_le_bytes());
        b[10..18].copy_from_slice(&self.indexed_last.unwrap_or(0).to_le_bytes());
        b
    }

    pub(crate) fn decode(b: &[u8], db_path: &Path) -> Result<LedgerState, StorageError> {
        if b.len() != LEDGER_STATE_BYTES || b[0] != LEDGER_STATE_VERSION || b[1] & !63 != 0 {
            return Err(StorageError::corruption(
                db_path,
                0,
                format!("ledger state {b:?}"),
            ));
        }
        let f = b[1];
        Ok(LedgerState {
            fenced: f & 1 != 0,
            deleted: f & 2 != 0,
            explicit_lac: (f & 4 != 0).then(|| le_u64(&b[2..10])),
            indexed_last: (f & 8 != 0).then(|| le_u64(&b[10..18])),
            overlapping: f & 16 != 0,
            purged: f & 32 != 0,
        })
    }
}

/// One committed entry log as gc sees it.
#[derive(Debug)]
pub(crate) struct LogUsage {
    pub(crate) log_id: u64,
    /// Bytes committed to it (the file may be longer: unindexed garbage).
    pub(crate) committed_bytes: u64,
    /// (ledger_id, bytes) of every ledger with records in it.
    pub(crate) ledger_bytes: Vec<(u64, u64)>,
}

/// Everything read from the database at open.
#[derive(Debug, Default)]
pub(crate) struct Loaded {
    pub(crate) ledgers: Vec<(u64, LedgerState)>,
    pub(crate) next_log_id: u64,
    pub(crate) log_ids: Vec<u64>,
}

/// One flush's or gc step's changes, committed in one durable transaction.
#[derive(Debug, Default)]
pub(crate) struct Batch {
    pub(crate) insert_records: Vec<NewRecord>,
    pub(crate) remove_records: Vec<(u64, u64)>,
    /// (log_id, ledger_id, bytes) added to `log_ledgers`.
    pub(crate) add_log_ledger_bytes: Vec<(u64, u64, u64)>,
    /// (log_id, ledger_id, bytes) taken off `log_ledgers` (compaction moved
    /// them out of that log); a row that is absent stays absent.
    pub(crate) sub_log_ledger_bytes: Vec<(u64, u64, u64)>,
    /// log_id → committed size.
    pub(crate) set_log_sizes: Vec<(u64, u64)>,
    pub(crate) remove_logs: Vec<u64>,
    pub(crate) put_ledgers: Vec<(u64, LedgerState)>,
    /// Ledgers whose `locations` records are all removed.
    pub(crate) purge_ledgers: Vec<u64>,
    pub(crate) next_log_id: Option<u64>,
}

/// The index database.
#[derive(Debug)]
pub(crate) struct Index {
    db: Database,
    path: PathBuf,
}

impl Index {
    /// Opens (creating if needed) `dir/index.redb` and makes sure all tables exist.
    pub(crate) fn open(dir: &Path, cache_bytes: u64) -> Result<(Index, Loaded), StorageError> {
        let path = dir.join(format::INDEX_FILE_NAME);
        let existed = path.exists();
        let db = redb::Builder::new()
            .set_cache_size(usize::try_from(cache_bytes).unwrap_or(usize::MAX))
            .create(&path)?;
        if !existed {
            super::fs::sync_dir(dir)?;
        }
        let txn = db.begin_write()?;
        {
            txn.open_table(LOCATIONS)?;
            txn.open_table(LEDGERS)?;
            txn.open_table(LOG_LEDGERS)?;
            txn.open_table(LOGS)?;
            txn.open_table(META)?;
        }
        txn.commit()?;
        let index = Index { db, path };
        let loaded = index.load()?;
        Ok((index, loaded))
    }

    fn load(&self) -> Result<Loaded, StorageError> {
        let txn = self.db.begin_read()?;
        let mut loaded = Loaded::default();
        for item in txn.open_table(LEDGERS)?.iter()? {
            let (k, v) = item?;
            loaded
                .ledgers
                .push((k.value(), LedgerState::decode(v.value(), &self.path)?));
        }
        for item in txn.open_table(LOGS)?.iter()? {
            loaded.log_ids.push(item?.0.value());
        }
        loaded.next_log_id = txn
            .open_table(META)?
            .get(META_NEXT_LOG_ID)?
            .map_or(0, |v| v.value());
        Ok(loaded)
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Commits `batch` durably (fsync'ed before return).
    pub(crate) fn commit(&self, batch: &Batch) -> Result<(), StorageError> {
        let mut txn = self.db.begin_write()?;
        txn.set_durability(Durability::Immediate)?;
        {
            let mut loc = txn.open_table(LOCATIONS)?;
            for &(l, e) in &batch.remove_records {
                loc.remove((l, e))?;
            }
            for r in &batch.insert_records {
                loc.insert((r.ledger_id, r.first_entry_id), r.encode().as_slice())?;
            }
            for &l in &batch.purge_ledgers {
                loc.retain_in((l, 0)..=(l, u64::MAX), |_, _| false)?;
            }
            let mut ll = txn.open_table(LOG_LEDGERS)?;
            let mut logs = txn.open_table(LOGS)?;
            for &log_id in &batch.remove_logs {
                ll.retain_in((log_id, 0)..=(log_id, u64::MAX), |_, _| false)?;
                logs.remove(log_id)?;
            }
            for &(log_id, ledger_id, bytes) in &batch.add_log_ledger_bytes {
                let old = ll.get((log_id, ledger_id))?.map_or(0, |v| v.value());
                ll.insert((log_id, ledger_id), old + bytes)?;
            }
            for &(log_id, ledger_id, bytes) in &batch.sub_log_ledger_bytes {
                let old = ll.get((log_id, ledger_id))?.map(|v| v.value());
                if let Some(old) = old {
                    ll.insert((log_id, ledger_id), old.saturating_sub(bytes))?;
                }
            }
            for &(log_id, size) in &batch.set_log_sizes {
                logs.insert(log_id, size)?;
            }
            let mut ledgers = txn.open_table(LEDGERS)?;
            for (id, st) in &batch.put_ledgers {
                ledgers.insert(*id, st.encode().as_slice())?;
            }
            if let Some(n) = batch.next_log_id {
                txn.open_table(META)?.insert(META_NEXT_LOG_ID, n)?;
            }
        }
        txn.commit()?;
        Ok(())
    }

    /// Finds entry (`ledger_id`, `entry_id`) and up to `read_ahead_bytes_max`
    /// worth of the entries after it in the same record (always the entry itself).
    /// `overlapping`: the ledger's flag (walk back past the first candidate).
    pub(crate) fn find(
        &self,
        ledger_id: u64,
        entry_id: u64,
        overlapping: bool,
        read_ahead_bytes_max: u64,
    ) -> Result<Option<(u64, Vec<EntrySpan>)>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(LOCATIONS)?;
        for item in table.range((ledger_id, 0)..=(ledger_id, entry_id))?.rev() {
            let (k, v) = item?;
            let first = k.value().1;
            let rec = RecordView::decode(v.value(), &self.path)?;
            if let Some(i) = rec.position(entry_id - first) {
                let mut spans = vec![rec.span(i, first, &self.path)?];
                let mut total = spans[0].len;
                for j in i + 1..rec.len() {
                    let s = rec.span(j, first, &self.path)?;
                    if total + s.len > read_ahead_bytes_max {
                        break;
                    }
                    total += s.len;
                    spans.push(s);
                }
                return Ok(Some((rec.log_id, spans)));
            }
            if !overlapping {
                break;
            }
        }
        Ok(None)
    }

    /// Whether the index holds this entry (flush's duplicate check).
    pub(crate) fn contains(
        &self,
        ledger_id: u64,
        entry_id: u64,
        overlapping: bool,
    ) -> Result<bool, StorageError> {
        Ok(self.find(ledger_id, entry_id, overlapping, 0)?.is_some())
    }

    /// Per-ledger bytes of every committed log.
    pub(crate) fn log_usage(&self) -> Result<Vec<LogUsage>, StorageError> {
        let txn = self.db.begin_read()?;
        let logs = txn.open_table(LOGS)?;
        let ll = txn.open_table(LOG_LEDGERS)?;
        let mut out = Vec::new();
        for item in logs.iter()? {
            let (k, v) = item?;
            let log_id = k.value();
            let mut per_ledger = Vec::new();
            for row in ll.range((log_id, 0)..=(log_id, u64::MAX))? {
                let (rk, rv) = row?;
                per_ledger.push((rk.value().1, rv.value()));
            }
            out.push(LogUsage {
                log_id,
                committed_bytes: v.value(),
                ledger_bytes: per_ledger,
            });
        }
        Ok(out)
    }

    /// All records of `ledger_id` stored in log `log_id`: (first_entry_id, encoded value).
    pub(crate) fn records_in_log(
        &self,
        ledger_id: u64,
        log_id: u64,
    ) -> Result<Vec<(u64, Vec<u8>)>, StorageError> {
        let txn = self.db.begin_read()?;
        let table = txn.open_table(LOCATIONS)?;
        let mut out = Vec::new();
        for item in table.range((ledger_id, 0)..=(ledger_id, u64::MAX))? {
            let (k, v) = item?;
            let rec = RecordView::decode(v.value(), &self.path)?;
            if rec.log_id == log_id {
                out.push((k.value().1, v.value().to_vec()));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_lookup() {
        let p = Path::new("index.redb");
        let mut r = NewRecord::new(7, 10, 3, 512);
        let mut off = 512;
        for e in [10u64, 11, 13, 20] {
            let len = 24 + e;
            assert!(r.accepts(7, 3, e, off, len));
            r.push(e, off, len);
            off += len;
        }
        assert!(!r.accepts(8, 3, 21, off, 30), "other ledger");
        assert!(!r.accepts(7, 4, 21, off, 30), "other log");
        assert!(!r.accepts(7, 3, 21, off + 1, 30), "not contiguous");
        let enc = r.encode();
        let v = RecordView::decode(&enc, p).unwrap();
        assert_eq!(v.len(), 4);
        assert_eq!(v.position(3), Some(2));
        assert_eq!(v.position(2), None);
        assert_eq!(
            v.span(2, 10, p).unwrap(),
            EntrySpan {
                entry_id: 13,
                offset: 512 + 34 + 35,
                len: 37
            }
        );
        assert_eq!(v.span(3, 10, p).unwrap().len, 44);
        assert!(RecordView::decode(&enc[..enc.len() - 1], p).is_err());
    }

    #[test]
    fn ledger_state_round_trip() {
        let p = Path::new("index.redb");
        let s = LedgerState {
            fenced: true,
            deleted: false,
            explicit_lac: Some(17),
            indexed_last: Some(0),
            overlapping: true,
            purged: false,
        };
        assert_eq!(LedgerState::decode(&s.encode(), p).unwrap(), s);
        assert_eq!(
            LedgerState::decode(&LedgerState::default().encode(), p).unwrap(),
            LedgerState::default()
        );
        let mut bad = s.encode();
        bad[1] |= 128;
        assert!(LedgerState::decode(&bad, p).is_err());
    }

    proptest::proptest! {
        /// Index bytes are disk input: any value decodes to an error or to spans
        /// that stay within the record, never a panic.
        #[test]
        fn arbitrary_index_values_never_panic(v in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
            let p = Path::new("index.redb");
            if let Ok(r) = RecordView::decode(&v, p) {
                for i in 0..r.len() {
                    let _ = r.span(i, 5, p);
                }
                let _ = r.position(3);
            }
            let _ = LedgerState::decode(&v, p);
        }
    }
}
