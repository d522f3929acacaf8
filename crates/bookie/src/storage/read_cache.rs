//! The read cache: entries read from entry logs (with read-ahead), in FIFO
//! segments. One segment = one `pread` buffer and the entries sliced from it;
//! when the byte budget (`read_cache_bytes_max`) is reached the oldest segment
//! is dropped whole (BookKeeper's ring of segments). Segments account their
//! whole buffer, so the bound is on real memory, not on payload sizes.
//!
//! It also remembers, per ledger, the entry after the last one read from a log,
//! so storage reads ahead only for sequential readers: a random read costs one
//! record, not a whole read-ahead window.
//!
//! Never: holds more than `read_cache_bytes_max` bytes of buffers, does I/O.

use std::collections::{HashMap, HashSet, VecDeque};

use bytes::Bytes;

/// Ledgers whose read position is tracked for read-ahead decisions; when full the
/// map is cleared (those readers lose one read-ahead, nothing else).
const SEQUENTIAL_TRACK_LEDGERS_MAX: usize = 4096;
/// How far past the next expected entry a miss still counts as sequential:
/// a ledger reader keeps up to 16 reads in flight, which may arrive out of
/// order.
const SEQUENTIAL_WINDOW_ENTRIES: u64 = 32;

#[derive(Debug)]
struct Segment {
    id: u64,
    bytes: u64,
    keys: Vec<(u64, u64)>,
}

/// FIFO-segment read cache. Lives behind a mutex in storage.
#[derive(Debug)]
pub(crate) struct ReadCache {
    segments: VecDeque<Segment>,
    /// (ledger, entry) -> (segment id, payload, whether storage checked the
    /// record's CRC32C when it read it: `RecordCheck::Full`).
    map: HashMap<(u64, u64), (u64, Bytes, bool)>,
    bytes: u64,
    bytes_max: u64,
    next_segment_id: u64,
    /// ledger → entry id after the last one read from a log.
    next_expected: HashMap<u64, u64>,
    /// Ledgers with a read-ahead at the disk now. A ledger reader's pipelined
    /// misses arrive together; each reading its own window would pull the
    /// same megabytes several times, every buffer pinned by the one entry
    /// handed out of it. While one read-ahead runs, the others read their
    /// entry only. At most one key per read in flight.
    ahead_in_flight: HashSet<u64>,
}

impl ReadCache {
    pub(crate) fn new(bytes_max: u64) -> ReadCache {
        ReadCache {
            segments: VecDeque::new(),
            map: HashMap::new(),
            bytes: 0,
            bytes_max,
            next_segment_id: 0,
            next_expected: HashMap::new(),
            ahead_in_flight: HashSet::new(),
        }
    }

    /// Notes a log read of (`ledger_id`, `entry_id`) missing the cache; returns
    /// whether it continues a sequential scan (so reading ahead pays off): the
    /// entry is the next one expected or a little past it, as a ledger
    /// reader's pipelined reads (several entries in flight) arrive.
    pub(crate) fn note_miss(&mut self, ledger_id: u64, entry_id: u64) -> bool {
        if self.next_expected.len() >= SEQUENTIAL_TRACK_LEDGERS_MAX
            && !self.next_expected.contains_key(&ledger_id)
        {
            self.next_expected.clear();
        }
        let next = self.next_expected.entry(ledger_id).or_insert(u64::MAX);
        let sequential =
            *next != u64::MAX && entry_id >= *next && entry_id - *next < SEQUENTIAL_WINDOW_ENTRIES;
        // A scan goes on after the furthest entry read; a jump back or far
        // ahead starts a new one there.
        if sequential {
            *next = (*next).max(entry_id.saturating_add(1));
        } else {
            *next = entry_id.saturating_add(1);
        }
        // One read-ahead per ledger at a time: the caller reads ahead only
        // when this returns true, and then calls `note_read_ahead_done`.
        sequential && self.ahead_in_flight.insert(ledger_id)
    }

    /// The read-ahead that `note_miss` allowed for the ledger has ended (read,
    /// cached or failed).
    pub(crate) fn note_read_ahead_done(&mut self, ledger_id: u64) {
        self.ahead_in_flight.remove(&ledger_id);
    }

    /// After a read-ahead: the scan continues after the last entry read.
    pub(crate) fn note_read_ahead_end(&mut self, ledger_id: u64, last_entry_id: u64) {
        if let Some(next) = self.next_expected.get_mut(&ledger_id) {
            *next = (*next).max(last_entry_id.saturating_add(1));
        }
    }

    /// The cached payload and whether its record's CRC32C was checked when
    /// it was read (an entry read for a `RecordCheck::ReaderVerifies` caller
    /// was not: a `Full` caller must not take it as checked).
    pub(crate) fn get(&self, ledger_id: u64, entry_id: u64) -> Option<(Bytes, bool)> {
        self.map
            .get(&(ledger_id, entry_id))
            .map(|(_, b, crc_checked)| (b.clone(), *crc_checked))
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Adds a segment of `buffer_bytes` holding `entries` (slices of that buffer),
    /// whose records' CRC32C were checked or not (`crc_checked`), dropping the
    /// oldest segments to make room. A segment larger than the whole budget is
    /// not cached.
    pub(crate) fn insert_segment(
        &mut self,
        buffer_bytes: u64,
        entries: Vec<((u64, u64), Bytes)>,
        crc_checked: bool,
    ) {
        if buffer_bytes > self.bytes_max || entries.is_empty() {
            return;
        }
        while self.bytes + buffer_bytes > self.bytes_max {
            let Some(old) = self.segments.pop_front() else {
                break;
            };
            self.bytes -= old.bytes;
            for k in old.keys {
                if self.map.get(&k).is_some_and(|(seg, _, _)| *seg == old.id) {
                    self.map.remove(&k);
                }
            }
        }
        let id = self.next_segment_id;
        self.next_segment_id += 1;
        let mut keys = Vec::with_capacity(entries.len());
        for (k, b) in entries {
            keys.push(k);
            self.map.insert(k, (id, b, crc_checked));
        }
        self.segments.push_back(Segment {
            id,
            bytes: buffer_bytes,
            keys,
        });
        self.bytes += buffer_bytes;
        debug_assert!(self.bytes <= self.bytes_max);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn oldest_segment_goes_first_and_bound_holds() {
        let mut c = ReadCache::new(100);
        let buf = Bytes::from(vec![7u8; 40]);
        c.insert_segment(
            40,
            vec![((1, 0), buf.slice(0..20)), ((1, 1), buf.slice(20..40))],
            true,
        );
        c.insert_segment(40, vec![((1, 2), buf.slice(0..40))], false);
        assert_eq!(c.bytes(), 80);
        c.insert_segment(
            40,
            vec![((1, 3), buf.slice(0..40)), ((1, 1), buf.slice(0..1))],
            true,
        );
        assert!(c.bytes() <= 100);
        assert!(c.get(1, 0).is_none(), "oldest segment evicted");
        assert_eq!(
            c.get(1, 1).unwrap().0.len(),
            1,
            "re-inserted key survives its old segment"
        );
        assert_eq!(c.get(1, 2).map(|(_, checked)| checked), Some(false));
        assert_eq!(c.get(1, 3).map(|(_, checked)| checked), Some(true));
        c.insert_segment(1000, vec![((9, 9), buf.clone())], true);
        assert!(c.get(9, 9).is_none(), "oversized segment not cached");
    }

    #[test]
    fn read_ahead_only_for_sequential_readers() {
        let mut c = ReadCache::new(100);
        assert!(!c.note_miss(1, 10), "first read of a ledger");
        assert!(c.note_miss(1, 11));
        c.note_read_ahead_done(1);
        assert!(
            c.note_miss(1, 14),
            "pipelined reads arrive a little out of order"
        );
        c.note_read_ahead_done(1);
        assert!(!c.note_miss(1, 12), "behind the scan");
        assert!(!c.note_miss(1, 500), "jump");
        assert!(!c.note_miss(2, 51), "other ledger");
        assert!(c.note_miss(1, 501));
    }

    #[test]
    fn one_read_ahead_per_ledger_at_a_time() {
        let mut c = ReadCache::new(100);
        assert!(!c.note_miss(1, 10));
        assert!(c.note_miss(1, 11), "sequential: reads ahead");
        assert!(
            !c.note_miss(1, 12),
            "pipelined miss while it runs: its entry only"
        );
        assert!(!c.note_miss(2, 0));
        assert!(c.note_miss(2, 1), "other ledgers are not held back");
        c.note_read_ahead_done(1);
        assert!(c.note_miss(1, 13), "after it: the next read ahead");
    }
}
