//! In-memory ledgers whose adds can be held back (not durable, not answered)
//! while a switch is on, until a test releases them: for tests of what a
//! broker or client does while its writes wait. For tests only; never used by
//! `vela standalone`.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;

use crate::backend::{
    AddCallback, BoxFuture, LedgerBackend, LedgerBackendError, OpenLedger, Persistence,
    RecoveredLedger, Reserve,
};
use crate::memory::{MemoryBackend, MemoryLedgers};

/// An add held back: made durable (handed to its ledger) by `release`, never
/// answered if dropped.
pub struct HeldAdd {
    /// The ledger the add was for.
    pub ledger_id: u64,
    data: Bytes,
    ledger: Arc<dyn OpenLedger>,
    done: AddCallback,
}

impl HeldAdd {
    /// Hands the add to its ledger now.
    pub fn release(self) {
        self.ledger.add(self.data, self.done);
    }
}

impl std::fmt::Debug for HeldAdd {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeldAdd")
            .field("ledger_id", &self.ledger_id)
            .field("bytes", &self.data.len())
            .finish_non_exhaustive()
    }
}

#[derive(Debug)]
struct Shared {
    hold: AtomicBool,
    held: Mutex<Vec<HeldAdd>>,
    /// Each ledger creation takes a permit first (unlimited unless gated).
    creations: tokio::sync::Semaphore,
    /// Each ledger close takes a permit first (unlimited unless gated).
    closes: tokio::sync::Semaphore,
    /// Ledgers created so far.
    created: AtomicUsize,
}

impl Shared {
    fn gated(creations: usize, closes: usize) -> Shared {
        Shared {
            hold: AtomicBool::new(false),
            held: Mutex::default(),
            creations: tokio::sync::Semaphore::new(creations),
            closes: tokio::sync::Semaphore::new(closes),
            created: AtomicUsize::new(0),
        }
    }
}

/// In-memory ledgers (`MemoryBackend`) whose adds are held, in the order they
/// came, while `set_holding(true)`. Clones share the switch and the held adds:
/// give one to the log's environment, keep one in the test.
#[derive(Debug, Clone)]
pub struct HoldingBackend {
    inner: MemoryBackend,
    shared: Arc<Shared>,
}

impl HoldingBackend {
    /// Over a fresh set of in-memory ledgers, holding nothing yet.
    pub fn new() -> HoldingBackend {
        let unlimited = tokio::sync::Semaphore::MAX_PERMITS;
        HoldingBackend::with_gates(unlimited, unlimited)
    }

    /// Like `new`, letting through at most `creations` ledger creations and
    /// `closes` ledger closes until more are allowed (the others wait).
    pub fn with_gates(creations: usize, closes: usize) -> HoldingBackend {
        HoldingBackend {
            inner: MemoryBackend(MemoryLedgers::new()),
            shared: Arc::new(Shared::gated(creations, closes)),
        }
    }

    /// Lets `count` more ledger closes through.
    pub fn allow_closes(&self, count: usize) {
        self.shared.closes.add_permits(count);
    }

    /// Ledgers created so far.
    pub fn created_count(&self) -> usize {
        self.shared.created.load(Ordering::SeqCst)
    }

    /// The in-memory ledgers underneath.
    pub fn ledgers(&self) -> Arc<MemoryLedgers> {
        Arc::clone(&self.inner.0)
    }

    /// Whether adds from now on are held (already held ones stay held).
    pub fn set_holding(&self, hold: bool) {
        self.shared.hold.store(hold, Ordering::SeqCst);
    }

    /// Takes the held adds `select` picks, in the order they came; the others
    /// stay held.
    pub fn take_held(&self, select: impl Fn(&HeldAdd) -> bool) -> Vec<HeldAdd> {
        let mut held = self.shared.held.lock();
        let (taken, kept) = held.drain(..).partition(|add| select(add));
        *held = kept;
        taken
    }

    /// The ledgers of the adds held now, each once, sorted.
    pub fn held_ledgers(&self) -> Vec<u64> {
        let mut ids: Vec<u64> = self
            .shared
            .held
            .lock()
            .iter()
            .map(|add| add.ledger_id)
            .collect();
        ids.sort_unstable();
        ids.dedup();
        ids
    }

    /// How many adds are held now.
    pub fn held_count(&self) -> usize {
        self.shared.held.lock().len()
    }
}

impl Default for HoldingBackend {
    fn default() -> HoldingBackend {
        HoldingBackend::new()
    }
}

struct HoldingLedger {
    inner: Arc<dyn OpenLedger>,
    shared: Arc<Shared>,
}

impl std::fmt::Debug for HoldingLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldingLedger")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl LedgerBackend for HoldingBackend {
    fn create_ledger(
        &self,
        persistence: Persistence,
        log_name: &str,
    ) -> BoxFuture<'_, Result<Arc<dyn OpenLedger>, LedgerBackendError>> {
        let log_name = log_name.to_string();
        let shared = Arc::clone(&self.shared);
        Box::pin(async move {
            if let Ok(permit) = shared.creations.acquire().await {
                permit.forget();
            }
            let inner = self.inner.create_ledger(persistence, &log_name).await?;
            shared.created.fetch_add(1, Ordering::SeqCst);
            Ok(Arc::new(HoldingLedger { inner, shared }) as Arc<dyn OpenLedger>)
        })
    }

    fn recover(
        &self,
        ledger_id: u64,
    ) -> BoxFuture<'_, Result<RecoveredLedger, LedgerBackendError>> {
        self.inner.recover(ledger_id)
    }

    fn read(
        &self,
        ledger_id: u64,
        first_entry_id: u64,
        last_entry_id: u64,
    ) -> BoxFuture<'_, Result<Vec<Bytes>, LedgerBackendError>> {
        self.inner.read(ledger_id, first_entry_id, last_entry_id)
    }

    fn delete(&self, ledger_id: u64) -> BoxFuture<'_, Result<(), LedgerBackendError>> {
        self.inner.delete(ledger_id)
    }
}

impl OpenLedger for HoldingLedger {
    fn ledger_id(&self) -> u64 {
        self.inner.ledger_id()
    }

    fn reserve(&self, payload_bytes: usize) -> Reserve {
        self.inner.reserve(payload_bytes)
    }

    fn add(&self, data: Bytes, done: AddCallback) {
        if self.shared.hold.load(Ordering::SeqCst) {
            let ledger_id = self.inner.ledger_id();
            self.shared.held.lock().push(HeldAdd {
                ledger_id,
                data,
                ledger: Arc::clone(&self.inner),
                done,
            });
        } else {
            self.inner.add(data, done);
        }
    }

    fn close(&self) -> BoxFuture<'static, Result<(), LedgerBackendError>> {
        let (inner, shared) = (Arc::clone(&self.inner), Arc::clone(&self.shared));
        Box::pin(async move {
            if let Ok(permit) = shared.closes.acquire().await {
                permit.forget();
            }
            inner.close().await
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn held_adds_are_answered_only_once_released_in_order() {
        let backend = HoldingBackend::new();
        let ledger = backend
            .create_ledger(Persistence::SINGLE, "t")
            .await
            .unwrap();
        backend.set_holding(true);
        let answers = Arc::new(Mutex::new(Vec::new()));
        for i in 0..3u8 {
            let answers = Arc::clone(&answers);
            ledger.add(
                Bytes::from(vec![i]),
                Box::new(move |result| answers.lock().push((i, result.is_ok()))),
            );
        }
        assert_eq!(backend.held_count(), 3);
        assert!(answers.lock().is_empty(), "a held add was answered");
        assert_eq!(backend.held_ledgers(), vec![ledger.ledger_id()]);
        backend.set_holding(false);
        for add in backend.take_held(|_| true) {
            add.release();
        }
        assert_eq!(*answers.lock(), vec![(0, true), (1, true), (2, true)]);
        let stored = backend.read(ledger.ledger_id(), 0, 2).await.unwrap();
        assert_eq!(
            stored,
            vec![
                Bytes::from(vec![0]),
                Bytes::from(vec![1]),
                Bytes::from(vec![2])
            ]
        );
    }
}
