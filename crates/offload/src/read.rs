//! Reads of offloaded entries: the ledger's index (cached), then one ranged
//! GET of the entries' bytes, checked entry by entry.
//!
//! Bounds: a read takes its bytes from the broker-wide read budget
//! (`read_bytes_in_flight_max`) before its GET and gives them back once the
//! entries are handed over, so GETs in flight never hold more; a read asks
//! for at most that many bytes (and at least one entry). Indexes are cached
//! within `index_cache_bytes_max`, the oldest loaded going first; one larger
//! than the whole cache is used for its read and not kept.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use object_store::ObjectStoreExt;
use parking_lot::Mutex;
use vela_log::{LedgerBackendError, OffloadTarget};

use crate::ObjectStoreOffloader;
use crate::format::{self, FormatError, INDEX_BYTES_MAX, Index};

#[derive(Debug, Default)]
struct CacheState {
    indexes: HashMap<OffloadTarget, Arc<Index>>,
    /// Load order, oldest first (each target once).
    order: VecDeque<OffloadTarget>,
    bytes: u64,
}

/// Decoded indexes within a byte budget.
#[derive(Debug)]
pub(crate) struct IndexCache {
    bytes_max: u64,
    state: Mutex<CacheState>,
}

impl IndexCache {
    pub(crate) fn new(bytes_max: u64) -> IndexCache {
        IndexCache {
            bytes_max,
            state: Mutex::new(CacheState::default()),
        }
    }

    fn get(&self, target: OffloadTarget) -> Option<Arc<Index>> {
        self.state.lock().indexes.get(&target).cloned()
    }

    fn insert(&self, target: OffloadTarget, index: Arc<Index>) {
        let bytes = index.memory_bytes();
        if bytes > self.bytes_max {
            return;
        }
        let mut state = self.state.lock();
        if state.indexes.contains_key(&target) {
            return;
        }
        while state.bytes + bytes > self.bytes_max {
            let Some(oldest) = state.order.pop_front() else {
                break;
            };
            if let Some(gone) = state.indexes.remove(&oldest) {
                state.bytes -= gone.memory_bytes();
            }
        }
        state.bytes += bytes;
        state.order.push_back(target);
        state.indexes.insert(target, index);
        debug_assert!(state.bytes <= self.bytes_max);
    }

    pub(crate) fn remove(&self, target: OffloadTarget) {
        let mut state = self.state.lock();
        if let Some(gone) = state.indexes.remove(&target) {
            state.bytes -= gone.memory_bytes();
            state.order.retain(|t| *t != target);
        }
    }

    #[cfg(test)]
    fn bytes(&self) -> u64 {
        self.state.lock().bytes
    }
}

fn read_error(target: OffloadTarget, message: impl std::fmt::Display) -> LedgerBackendError {
    LedgerBackendError::Other(format!(
        "offloaded ledger {} (uid {:032x}): {message}",
        target.ledger_id, target.uid
    ))
}

impl ObjectStoreOffloader {
    async fn index(&self, target: OffloadTarget) -> Result<Arc<Index>, LedgerBackendError> {
        if let Some(index) = self.indexes.get(target) {
            return Ok(index);
        }
        let path = format::index_path(&self.prefix, target);
        let found = self.store.get(&path).await.map_err(|error| match error {
            object_store::Error::NotFound { .. } => {
                read_error(target, format!("index object {path} is missing"))
            }
            other => read_error(target, format!("{}: {other}", self.driver)),
        })?;
        if found.meta.size > INDEX_BYTES_MAX {
            return Err(read_error(
                target,
                format!("index object of {} bytes is corrupt", found.meta.size),
            ));
        }
        let bytes = found
            .bytes()
            .await
            .map_err(|error| read_error(target, format!("{}: {error}", self.driver)))?;
        let index = Index::decode(&bytes, target)
            .map_err(|FormatError::Corrupt(message)| read_error(target, message))?;
        let index = Arc::new(index);
        self.indexes.insert(target, Arc::clone(&index));
        Ok(index)
    }

    pub(crate) async fn read_entries(
        &self,
        target: OffloadTarget,
        first: u64,
        last: u64,
        bytes_max: usize,
    ) -> Result<Vec<Bytes>, LedgerBackendError> {
        if first > last {
            return Err(read_error(target, format!("empty read {first}..={last}")));
        }
        let index = self.index(target).await?;
        if last >= index.entry_count() {
            return Err(LedgerBackendError::NoSuchEntry {
                ledger_id: target.ledger_id,
                entry_id: last,
            });
        }
        let wanted_bytes = (bytes_max as u64).min(self.read_bytes_max);
        let last = index.last_fitting(first, last, wanted_bytes);
        let start = index.offsets[first as usize];
        let end = index.offsets[last as usize + 1];
        // At least one entry: a single entry larger than the budget takes
        // the whole budget (and waits for it).
        let permits = u32::try_from((end - start).min(self.read_bytes_max)).unwrap_or(u32::MAX);
        let _budget = self
            .read_budget
            .acquire_many(permits)
            .await
            .map_err(|_| read_error(target, "offloader closed"))?;
        let path = format::data_path(&self.prefix, target);
        let bytes = self
            .store
            .get_range(&path, start..end)
            .await
            .map_err(|error| match error {
                object_store::Error::NotFound { .. } => {
                    read_error(target, format!("data object {path} is missing"))
                }
                other => read_error(target, format!("{}: {other}", self.driver)),
            })?;
        if bytes.len() as u64 != end - start {
            return Err(read_error(
                target,
                format!(
                    "ranged read of {} bytes returned {}",
                    end - start,
                    bytes.len()
                ),
            ));
        }
        format::split_entries(bytes, first, last - first + 1)
            .map_err(|FormatError::Corrupt(message)| read_error(target, message))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn index(ledger_id: u64, entries: usize) -> (OffloadTarget, Arc<Index>) {
        let target = OffloadTarget { ledger_id, uid: 1 };
        let offsets = (0..=entries as u64).map(|i| 32 + i * 16).collect();
        let index = Index {
            ledger_id,
            uid: 1,
            offsets,
        };
        (target, Arc::new(index))
    }

    #[test]
    fn the_index_cache_keeps_its_budget() {
        // Each index of 9 entries: 10 offsets = 80 + 64 bytes.
        let cache = IndexCache::new(300);
        let (a, ia) = index(1, 9);
        let (b, ib) = index(2, 9);
        let (c, ic) = index(3, 9);
        cache.insert(a, ia);
        cache.insert(b, ib);
        assert_eq!(cache.bytes(), 288);
        cache.insert(c, ic);
        assert_eq!(cache.bytes(), 288, "the oldest went");
        assert!(cache.get(a).is_none());
        assert!(cache.get(b).is_some() && cache.get(c).is_some());
        let (d, id) = index(4, 100);
        cache.insert(d, id);
        assert!(cache.get(d).is_none(), "larger than the cache: not kept");
        cache.remove(b);
        assert_eq!(cache.bytes(), 144);
    }
}
