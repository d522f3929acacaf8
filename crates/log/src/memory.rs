//! In-memory ledgers with the real semantics of the seam (ordered adds,
//! fencing on recovery, closed ledgers refuse adds) and no durability. For tests
//! of this crate and of the broker; never used by `vela standalone`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::backend::{
    AddCallback, BoxFuture, LedgerBackend, LedgerBackendError, OpenLedger, Persistence,
    RecoveredLedger, Reserve,
};

pub mod holding;
pub use holding::{HeldAdd, HoldingBackend};

/// Bound on the entries one in-memory ledger holds: tests stay small, and a
/// runaway test fails loudly instead of eating the machine's memory.
const MEMORY_LEDGER_ENTRIES_MAX: usize = 10_000_000;

#[derive(Debug, Default)]
struct MemoryLedger {
    entries: Vec<Bytes>,
    closed: bool,
    /// Bumped by recovery: appenders holding an older epoch are fenced.
    epoch: u64,
}

/// A set of in-memory ledgers.
#[derive(Debug, Default)]
pub struct MemoryLedgers {
    next_ledger_id: AtomicU64,
    ledgers: Mutex<HashMap<u64, MemoryLedger>>,
}

impl MemoryLedgers {
    /// An empty set; ledger ids start at 1.
    pub fn new() -> Arc<MemoryLedgers> {
        Arc::new(MemoryLedgers {
            next_ledger_id: AtomicU64::new(1),
            ledgers: Mutex::new(HashMap::new()),
        })
    }

    /// Ids of the ledgers that exist (sorted), for tests of trimming.
    pub fn ledger_ids(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self.ledgers.lock().keys().copied().collect();
        ids.sort_unstable();
        ids
    }
}

#[derive(Debug)]
struct MemoryAppender {
    ledgers: Arc<MemoryLedgers>,
    ledger_id: u64,
    epoch: u64,
}

impl OpenLedger for MemoryAppender {
    fn ledger_id(&self) -> u64 {
        self.ledger_id
    }

    /// In-memory ledgers have no window of adds in flight: always room.
    fn reserve(&self, _payload_bytes: usize) -> Reserve {
        Reserve::Ready
    }

    fn add(&self, data: Bytes, done: AddCallback) {
        let result = {
            let mut ledgers = self.ledgers.ledgers.lock();
            match ledgers.get_mut(&self.ledger_id) {
                None => Err(LedgerBackendError::NoSuchLedger(self.ledger_id)),
                Some(ledger) if ledger.epoch != self.epoch => {
                    Err(LedgerBackendError::Fenced(self.ledger_id))
                }
                Some(ledger) if ledger.closed => Err(LedgerBackendError::Closed(self.ledger_id)),
                Some(ledger) if ledger.entries.len() >= MEMORY_LEDGER_ENTRIES_MAX => Err(
                    LedgerBackendError::Other("in-memory ledger is full".to_string()),
                ),
                Some(ledger) => {
                    ledger.entries.push(data);
                    Ok(ledger.entries.len() as u64 - 1)
                }
            }
        };
        done(result);
    }

    fn close(&self) -> BoxFuture<'static, Result<(), LedgerBackendError>> {
        let result = {
            let mut ledgers = self.ledgers.ledgers.lock();
            match ledgers.get_mut(&self.ledger_id) {
                None => Err(LedgerBackendError::NoSuchLedger(self.ledger_id)),
                Some(ledger) if ledger.epoch != self.epoch => {
                    Err(LedgerBackendError::Fenced(self.ledger_id))
                }
                Some(ledger) => {
                    ledger.closed = true;
                    Ok(())
                }
            }
        };
        Box::pin(async move { result })
    }
}

/// `Arc<MemoryLedgers>` is the backend (appenders keep the set alive).
#[derive(Debug, Clone)]
pub struct MemoryBackend(pub Arc<MemoryLedgers>);

impl LedgerBackend for MemoryBackend {
    fn create_ledger(
        &self,
        persistence: Persistence,
        _log_name: &str,
    ) -> BoxFuture<'_, Result<Arc<dyn OpenLedger>, LedgerBackendError>> {
        let result = persistence
            .validate()
            .map_err(LedgerBackendError::Other)
            .map(|()| {
                let ledger_id = self.0.next_ledger_id.fetch_add(1, Ordering::Relaxed);
                self.0
                    .ledgers
                    .lock()
                    .insert(ledger_id, MemoryLedger::default());
                Arc::new(MemoryAppender {
                    ledgers: Arc::clone(&self.0),
                    ledger_id,
                    epoch: 0,
                }) as Arc<dyn OpenLedger>
            });
        Box::pin(async move { result })
    }

    fn recover(
        &self,
        ledger_id: u64,
    ) -> BoxFuture<'_, Result<RecoveredLedger, LedgerBackendError>> {
        let result = {
            let mut ledgers = self.0.ledgers.lock();
            match ledgers.get_mut(&ledger_id) {
                None => Err(LedgerBackendError::NoSuchLedger(ledger_id)),
                Some(ledger) => {
                    ledger.epoch += 1;
                    ledger.closed = true;
                    Ok(RecoveredLedger {
                        last_entry_id: (ledger.entries.len() as u64).checked_sub(1),
                        size_bytes: ledger.entries.iter().map(|e| e.len() as u64).sum(),
                    })
                }
            }
        };
        Box::pin(async move { result })
    }

    fn read(
        &self,
        ledger_id: u64,
        first_entry_id: u64,
        last_entry_id: u64,
    ) -> BoxFuture<'_, Result<Vec<Bytes>, LedgerBackendError>> {
        let result = {
            let ledgers = self.0.ledgers.lock();
            match ledgers.get(&ledger_id) {
                None => Err(LedgerBackendError::NoSuchLedger(ledger_id)),
                Some(ledger) => (first_entry_id..=last_entry_id)
                    .map(|entry_id| {
                        usize::try_from(entry_id)
                            .ok()
                            .and_then(|index| ledger.entries.get(index))
                            .cloned()
                            .ok_or(LedgerBackendError::NoSuchEntry {
                                ledger_id,
                                entry_id,
                            })
                    })
                    .collect(),
            }
        };
        Box::pin(async move { result })
    }

    fn delete(&self, ledger_id: u64) -> BoxFuture<'_, Result<(), LedgerBackendError>> {
        let result = match self.0.ledgers.lock().remove(&ledger_id) {
            Some(_) => Ok(()),
            None => Err(LedgerBackendError::NoSuchLedger(ledger_id)),
        };
        Box::pin(async move { result })
    }
}
