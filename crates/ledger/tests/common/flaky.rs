//! A metadata store wrapper whose next puts fail with `Unavailable`, either
//! before or after reaching the inner store (an unknown outcome).
#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use vela_meta::{
    BackendKind, BoxFuture, ExpectedVersion, MetaError, MetadataStore, Session, Version, Watcher,
};

#[derive(Debug)]
pub struct FlakyStore {
    pub inner: Arc<dyn MetadataStore>,
    /// Puts under `/ledgers/0` (ledger metadata) that still fail.
    pub failing_puts: AtomicU32,
    /// Whether a failing put reaches the inner store first.
    pub apply_then_fail: bool,
    /// Also fail this share (per mille) of ledger-metadata puts at random,
    /// half of them after applying. Seeded: a run replays.
    pub random_per_mille: AtomicU32,
    pub rng: parking_lot::Mutex<rand::rngs::StdRng>,
}

impl FlakyStore {
    pub fn new(inner: Arc<dyn MetadataStore>, seed: u64) -> FlakyStore {
        use rand::SeedableRng;
        FlakyStore {
            inner,
            failing_puts: AtomicU32::new(0),
            apply_then_fail: false,
            random_per_mille: AtomicU32::new(0),
            rng: parking_lot::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
        }
    }
}

fn unavailable() -> MetaError {
    MetaError::Unavailable {
        op: "put",
        detail: "injected".into(),
    }
}

impl MetadataStore for FlakyStore {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }

    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<(Bytes, Version)>, MetaError>> {
        self.inner.get(key)
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<Version, MetaError>> {
        Box::pin(async move {
            use rand::Rng;
            let ledger_key = key.starts_with("/ledgers/0");
            let counted = ledger_key
                && self
                    .failing_puts
                    .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                    .is_ok();
            let per_mille = self.random_per_mille.load(Ordering::SeqCst);
            let (random, random_apply) = if ledger_key && per_mille > 0 {
                let mut rng = self.rng.lock();
                (rng.random_range(0..1000) < per_mille, rng.random_bool(0.5))
            } else {
                (false, false)
            };
            if !counted && !random {
                return self.inner.put(key, value, expected).await;
            }
            if (counted && self.apply_then_fail) || (random && random_apply) {
                let _ = self.inner.put(key, value, expected).await;
            }
            Err(unavailable())
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a str,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<(), MetaError>> {
        self.inner.delete(key, expected)
    }

    fn children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<String>, MetaError>> {
        self.inner.children(path)
    }

    fn watch<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Watcher, MetaError>> {
        self.inner.watch(path)
    }

    fn session(&self, ttl: Duration) -> BoxFuture<'_, Result<Session, MetaError>> {
        self.inner.session(ttl)
    }

    fn put_ephemeral<'a>(
        &'a self,
        session: &'a Session,
        key: &'a str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<Version, MetaError>> {
        self.inner.put_ephemeral(session, key, value, expected)
    }
}
