//! The write cache: entries put since the last flush, in memory, sorted by
//! (ledger, entry), double buffered.
//!
//! Owns: the active half (takes puts) and the half being flushed (immutable,
//! shared with readers through an `Arc` while the flusher writes it out). The
//! budget `write_cache_bytes_max` covers both halves together, so while a flush
//! runs the active half gets what the flushing half does not use (BookKeeper's
//! fixed halves waste half the memory during a flush, PR #3260).
//!
//! Never: copies a payload (values are the caller's `Bytes`), does I/O, blocks
//! beyond its caller's short mutex hold.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;

/// Bookkeeping bytes charged per cached entry on top of its payload (B-tree slot,
/// `Bytes` header, per-ledger max): keeps the budget honest for tiny entries.
pub(crate) const ENTRY_OVERHEAD_BYTES: u64 = 64;

/// Accounted size of an entry with this payload.
pub(crate) fn accounted_bytes(payload: &Bytes) -> u64 {
    payload.len() as u64 + ENTRY_OVERHEAD_BYTES
}

/// One half of the write cache.
#[derive(Debug, Default)]
pub(crate) struct CacheHalf {
    entries: BTreeMap<(u64, u64), Bytes>,
    /// Highest entry id per ledger in this half.
    last_entry: HashMap<u64, u64>,
    bytes: u64,
}

impl CacheHalf {
    /// Inserts unless present; returns whether it was inserted.
    pub(crate) fn insert(&mut self, ledger_id: u64, entry_id: u64, payload: Bytes) -> bool {
        use std::collections::btree_map::Entry;
        match self.entries.entry((ledger_id, entry_id)) {
            Entry::Occupied(_) => false,
            Entry::Vacant(v) => {
                self.bytes += accounted_bytes(&payload);
                v.insert(payload);
                let last = self.last_entry.entry(ledger_id).or_insert(entry_id);
                *last = (*last).max(entry_id);
                true
            }
        }
    }

    pub(crate) fn get(&self, ledger_id: u64, entry_id: u64) -> Option<&Bytes> {
        self.entries.get(&(ledger_id, entry_id))
    }

    pub(crate) fn contains(&self, ledger_id: u64, entry_id: u64) -> bool {
        self.entries.contains_key(&(ledger_id, entry_id))
    }

    pub(crate) fn last_entry_id(&self, ledger_id: u64) -> Option<u64> {
        self.last_entry.get(&ledger_id).copied()
    }

    /// Drops a ledger's entries (it was deleted).
    pub(crate) fn remove_ledger(&mut self, ledger_id: u64) {
        if self.last_entry.remove(&ledger_id).is_none() {
            return;
        }
        let keys: Vec<(u64, u64)> = self
            .entries
            .range((ledger_id, 0)..=(ledger_id, u64::MAX))
            .map(|(k, _)| *k)
            .collect();
        for k in keys {
            if let Some(v) = self.entries.remove(&k) {
                self.bytes -= accounted_bytes(&v);
            }
        }
    }

    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    pub(crate) fn entry_count(&self) -> usize {
        self.entries.len()
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// All entries in (ledger, entry) order.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (&(u64, u64), &Bytes)> {
        self.entries.iter()
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
        let order: Vec<_> = half.iter().map(|(k, _)| *k).collect();
        assert_eq!(order, vec![(1, 0), (1, 5), (2, 9)]);
        c.finish_flush();
        assert!(!c.contains(1, 5));
        c.active.remove_ledger(1);
        assert_eq!(c.bytes(), 0);
    }
}
