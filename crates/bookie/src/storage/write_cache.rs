//! The write cache: entries put since the last flush, in memory, by ledger,
//! double buffered.
//!
//! Owns: the active half (takes puts) and the half being flushed (immutable,
//! shared with readers through an `Arc` while the flusher writes it out). The
//! budget `write_cache_bytes_max` covers both halves together, so while a flush
//! runs the active half gets what the flushing half does not use (BookKeeper's
//! fixed halves waste half the memory during a flush, PR #3260).
//!
//! Shape: per ledger, a vector sorted by entry id. Entries of a ledger arrive
//! almost in order (pipelined adds from one writer), so a put is a hash lookup
//! and a push; a slightly late entry is shifted into place (at most
//! `REORDER_WINDOW` moves); one far behind (a recovery re-add) goes to a small
//! per-ledger B-tree instead, so no input order costs more than O(log n) per put.
//! A flush iterates ledgers in id order and each ledger's entries in id order.
//!
//! Never: copies a payload (values are the caller's `Bytes`), does I/O, blocks
//! beyond its caller's short mutex hold.

use std::collections::BTreeMap;
use std::iter::Peekable;
use std::sync::Arc;

use bytes::Bytes;

/// Bookkeeping bytes charged per cached entry on top of its payload (vector slot,
/// `Bytes` header, map share): keeps the budget honest for tiny entries.
pub(crate) const ENTRY_OVERHEAD_BYTES: u64 = 64;

/// Late entries within this many slots of a ledger's newest are shifted into its
/// sorted vector (≤ 64 moves of 40 bytes); later ones go to the B-tree.
const REORDER_WINDOW: usize = 64;

/// Accounted size of an entry with this payload.
pub(crate) fn accounted_bytes(payload: &Bytes) -> u64 {
    accounted_bytes_of_len(payload.len())
}

/// `accounted_bytes` of a payload of `payload_bytes`.
pub(crate) fn accounted_bytes_of_len(payload_bytes: usize) -> u64 {
    payload_bytes as u64 + ENTRY_OVERHEAD_BYTES
}

/// One ledger's entries in one half.
#[derive(Debug, Default)]
struct LedgerRun {
    /// Increasing entry ids; appends land here.
    sorted: Vec<(u64, Bytes)>,
    /// Entries that arrived more than `REORDER_WINDOW` behind. Every key is below
    /// `sorted`'s last id (true when inserted; that id only grows).
    scattered: BTreeMap<u64, Bytes>,
}

impl LedgerRun {
    fn get(&self, entry_id: u64) -> Option<&Bytes> {
        // The common question on the ADD path is about a new, higher entry: answer
        // it without a binary search (each probe of a big vector is a cache miss).
        if self.sorted.last().is_none_or(|(last, _)| *last < entry_id) {
            return None;
        }
        match self.sorted.binary_search_by_key(&entry_id, |(e, _)| *e) {
            Ok(i) => Some(&self.sorted[i].1),
            Err(_) => self.scattered.get(&entry_id),
        }
    }

    /// Inserts unless present; returns whether it was inserted.
    fn insert(&mut self, entry_id: u64, payload: Bytes) -> bool {
        if self.sorted.last().is_none_or(|(last, _)| *last < entry_id) {
            self.sorted.push((entry_id, payload));
            return true;
        }
        match self.sorted.binary_search_by_key(&entry_id, |(e, _)| *e) {
            Ok(_) => false,
            Err(_) if self.scattered.contains_key(&entry_id) => false,
            Err(pos) if self.sorted.len() - pos <= REORDER_WINDOW => {
                self.sorted.insert(pos, (entry_id, payload));
                true
            }
            Err(_) => {
                self.scattered.insert(entry_id, payload);
                true
            }
        }
    }

    fn last_entry_id(&self) -> Option<u64> {
        // `scattered` keys are all below the last of `sorted`.
        self.sorted.last().map(|(e, _)| *e)
    }

    fn len(&self) -> usize {
        self.sorted.len() + self.scattered.len()
    }

    fn bytes(&self) -> u64 {
        self.sorted
            .iter()
            .map(|(_, b)| b)
            .chain(self.scattered.values())
            .map(accounted_bytes)
            .sum()
    }

    /// Entries in id order (merging the vector and the B-tree).
    fn iter(
        &self,
    ) -> MergeById<impl Iterator<Item = (u64, &Bytes)>, impl Iterator<Item = (u64, &Bytes)>> {
        MergeById {
            a: self.sorted.iter().map(|(e, b)| (*e, b)).peekable(),
            b: self.scattered.iter().map(|(e, b)| (*e, b)).peekable(),
        }
    }
}

/// Merge of two id-ordered sequences with disjoint ids.
struct MergeById<A: Iterator, B: Iterator> {
    a: Peekable<A>,
    b: Peekable<B>,
}

impl<'a, A, B> Iterator for MergeById<A, B>
where
    A: Iterator<Item = (u64, &'a Bytes)>,
    B: Iterator<Item = (u64, &'a Bytes)>,
{
    type Item = (u64, &'a Bytes);

    fn next(&mut self) -> Option<Self::Item> {
        match (self.a.peek(), self.b.peek()) {
            (Some((ea, _)), Some((eb, _))) => {
                debug_assert!(ea != eb);
                if ea < eb {
                    self.a.next()
                } else {
                    self.b.next()
                }
            }
            (Some(_), None) => self.a.next(),
            (None, _) => self.b.next(),
        }
    }
}

/// One half of the write cache.
#[derive(Debug, Default)]
pub(crate) struct CacheHalf {
    ledgers: crate::IdMap<u64, LedgerRun>,
    bytes: u64,
    entry_count: usize,
}

impl CacheHalf {
    /// Inserts unless present; returns whether it was inserted.
    pub(crate) fn insert(&mut self, ledger_id: u64, entry_id: u64, payload: Bytes) -> bool {
        let size = accounted_bytes(&payload);
        let inserted = self
            .ledgers
            .entry(ledger_id)
            .or_default()
            .insert(entry_id, payload);
        if inserted {
            self.bytes += size;
            self.entry_count += 1;
        }
        inserted
    }

    pub(crate) fn get(&self, ledger_id: u64, entry_id: u64) -> Option<&Bytes> {
        self.ledgers.get(&ledger_id)?.get(entry_id)
    }

    pub(crate) fn contains(&self, ledger_id: u64, entry_id: u64) -> bool {
        self.get(ledger_id, entry_id).is_some()
    }

    pub(crate) fn last_entry_id(&self, ledger_id: u64) -> Option<u64> {
        self.ledgers.get(&ledger_id)?.last_entry_id()
    }

    /// Drops a ledger's entries (it was deleted).
    pub(crate) fn remove_ledger(&mut self, ledger_id: u64) {
        if let Some(run) = self.ledgers.remove(&ledger_id) {
            self.bytes -= run.bytes();
            self.entry_count -= run.len();
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn entry_count(&self) -> usize {
        self.entry_count
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entry_count == 0
    }

    /// Ids of the ledgers with entries here, ascending.
    pub(crate) fn ledger_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.ledgers.keys().copied().collect();
        ids.sort_unstable();
        ids
    }

    /// All entries in (ledger, entry) order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = ((u64, u64), &Bytes)> {
        self.ledger_ids().into_iter().flat_map(move |l| {
            self.ledgers
                .get(&l)
                .into_iter()
                .flat_map(move |run| run.iter().map(move |(e, b)| ((l, e), b)))
        })
    }
}

/// Both halves. Lives inside the storage's state mutex.
#[derive(Debug, Default)]
pub(crate) struct WriteCache {
    pub(crate) active: CacheHalf,
    pub(crate) flushing: Option<Arc<CacheHalf>>,
}

impl WriteCache {
    /// Bytes held by both halves.
    pub(crate) fn bytes(&self) -> u64 {
        self.active.bytes() + self.flushing.as_ref().map_or(0, |f| f.bytes())
    }

    pub(crate) fn get(&self, ledger_id: u64, entry_id: u64) -> Option<Bytes> {
        if let Some(b) = self.active.get(ledger_id, entry_id) {
            return Some(b.clone());
        }
        self.flushing.as_ref()?.get(ledger_id, entry_id).cloned()
    }

    pub(crate) fn contains(&self, ledger_id: u64, entry_id: u64) -> bool {
        self.active.contains(ledger_id, entry_id)
            || self
                .flushing
                .as_ref()
                .is_some_and(|f| f.contains(ledger_id, entry_id))
    }

    pub(crate) fn last_entry_id(&self, ledger_id: u64) -> Option<u64> {
        let a = self.active.last_entry_id(ledger_id);
        let f = self
            .flushing
            .as_ref()
            .and_then(|f| f.last_entry_id(ledger_id));
        a.max(f)
    }

    /// Moves the active half to `flushing` and returns it. Precondition: no flush
    /// in progress (the flusher holds the flush lock).
    pub(crate) fn swap(&mut self) -> Arc<CacheHalf> {
        assert!(
            self.flushing.is_none(),
            "write cache swapped while a flush is in progress"
        );
        let half = Arc::new(std::mem::take(&mut self.active));
        self.flushing = Some(Arc::clone(&half));
        half
    }

    /// Drops the flushed half once its entries are durable in the index.
    pub(crate) fn finish_flush(&mut self) {
        self.flushing = None;
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn insert_is_idempotent_and_accounted() {
        let mut c = WriteCache::default();
        assert!(c.active.insert(1, 0, Bytes::from_static(b"abc")));
        assert!(!c.active.insert(1, 0, Bytes::from_static(b"zzzzzz")));
        assert_eq!(c.bytes(), 3 + ENTRY_OVERHEAD_BYTES);
        assert_eq!(&c.get(1, 0).unwrap()[..], b"abc");
        c.active.insert(1, 5, Bytes::from_static(b"x"));
        c.active.insert(2, 9, Bytes::from_static(b"y"));
        assert_eq!(c.last_entry_id(1), Some(5));
        let half = c.swap();
        assert_eq!(half.entry_count(), 3);
        assert!(c.active.is_empty());
        assert!(c.contains(1, 5));
        c.active.insert(1, 6, Bytes::from_static(b"z"));
        assert_eq!(c.last_entry_id(1), Some(6));
        let order: Vec<_> = half.iter().map(|(k, _)| k).collect();
        assert_eq!(order, vec![(1, 0), (1, 5), (2, 9)]);
        c.finish_flush();
        assert!(!c.contains(1, 5));
        c.active.remove_ledger(1);
        assert_eq!(c.bytes(), 0);
        assert_eq!(c.active.entry_count(), 0);
    }

    proptest::proptest! {
        /// Any put order: every entry once (first payload wins), iteration in
        /// (ledger, entry) order, counts and bytes exact.
        #[test]
        fn any_order_iterates_sorted_and_deduplicated(
            puts in proptest::collection::vec((0u64..3, 0u64..400, 0u8..255), 0..600)
        ) {
            let mut half = CacheHalf::default();
            let mut model: BTreeMap<(u64, u64), u8> = BTreeMap::new();
            for (l, e, v) in puts {
                let fresh = !model.contains_key(&(l, e));
                model.entry((l, e)).or_insert(v);
                proptest::prop_assert_eq!(half.insert(l, e, Bytes::from(vec![v; 3])), fresh);
            }
            let got: Vec<((u64, u64), u8)> = half.iter().map(|(k, b)| (k, b[0])).collect();
            let want: Vec<((u64, u64), u8)> = model.iter().map(|(k, v)| (*k, *v)).collect();
            proptest::prop_assert_eq!(&got, &want);
            proptest::prop_assert_eq!(half.entry_count(), model.len());
            proptest::prop_assert_eq!(half.bytes(), model.len() as u64 * (3 + ENTRY_OVERHEAD_BYTES));
            for l in 0..3 {
                let last = model.range((l, 0)..=(l, u64::MAX)).next_back().map(|((_, e), _)| *e);
                proptest::prop_assert_eq!(half.last_entry_id(l), last);
            }
            for ((l, e), v) in &model {
                proptest::prop_assert_eq!(half.get(*l, *e).map(|b| b[0]), Some(*v));
            }
        }
    }
}
