//! `MemoryStore`: the metadata store in process memory, for tests and
//! in-process clusters.
//!
//! Owns: a `BTreeMap` of records under the local engine. Guarantees: the full
//! `MetadataStore` contract except durability (everything is lost with the
//! process). Sessions expire by [`MemoryStore::expire_session`] (a test's lease
//! loss) or one TTL after their handle is dropped.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use bytes::Bytes;

use crate::error::MetaError;
use crate::key::{CHILDREN_COUNT_MAX, direct_child};
use crate::local::{LocalBackend, LocalInner, LocalStore, Mutation, Record};
use crate::session::{Session, SessionId, SessionState};
use crate::store::{BackendKind, BoxFuture, ExpectedVersion, MetadataStore, Version};
use crate::watch::Watcher;

#[derive(Debug, Default)]
pub(crate) struct MemoryBackend {
    records: Mutex<BTreeMap<String, Record>>,
}

impl MemoryBackend {
    fn records(&self) -> MutexGuard<'_, BTreeMap<String, Record>> {
        // Every change is one insert or remove: the map is whole after a panic.
        self.records
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl LocalBackend for MemoryBackend {
    const BLOCKING: bool = false;

    fn get(&self, key: &str) -> Result<Option<Record>, MetaError> {
        Ok(self.records().get(key).cloned())
    }

    fn children(&self, path: &str, prefix: &str) -> Result<Vec<String>, MetaError> {
        let mut names = Vec::new();
        let records = self.records();
        let below = records
            .range::<str, _>((
                std::ops::Bound::Included(prefix),
                std::ops::Bound::Unbounded,
            ))
            .take_while(|(key, _)| key.starts_with(prefix));
        for (key, _) in below {
            if let Some(name) = direct_child(prefix, key) {
                if names.len() >= CHILDREN_COUNT_MAX {
                    return Err(MetaError::TooManyChildren {
                        parent: path.to_owned(),
                        children_count_max: CHILDREN_COUNT_MAX,
                    });
                }
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn commit(&self, mutations: &[Mutation<'_>], _revision: u64) -> Result<(), MetaError> {
        let mut records = self.records();
        for mutation in mutations {
            match mutation {
                Mutation::Put { key, record } => {
                    records.insert((*key).to_owned(), (*record).clone());
                }
                Mutation::Delete { key } => {
                    records.remove(*key);
                }
            }
        }
        Ok(())
    }
}

/// The metadata store in process memory. Cheap to clone: clones share the data.
#[derive(Debug, Clone)]
pub struct MemoryStore {
    engine: LocalStore<MemoryBackend>,
}

impl Default for MemoryStore {
    fn default() -> Self {
        Self::new()
    }
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self {
            engine: LocalStore::new(MemoryBackend::default(), 0),
        }
    }

    pub(crate) fn downgrade(&self) -> WeakMemoryStore {
        WeakMemoryStore(self.engine.downgrade())
    }

    /// Expires session `id` now, as if its lease had lapsed: its ephemeral keys
    /// are deleted (watchers see the deletes) and its handle reports `Expired`.
    pub async fn expire_session(&self, id: SessionId) -> Result<(), MetaError> {
        self.engine.end_session(id, SessionState::Expired).await
    }
}

/// A handle that does not keep a [`MemoryStore`] alive.
#[derive(Debug, Clone)]
pub(crate) struct WeakMemoryStore(std::sync::Weak<LocalInner<MemoryBackend>>);

impl WeakMemoryStore {
    pub(crate) fn upgrade(&self) -> Option<MemoryStore> {
        LocalStore::upgrade(&self.0).map(|engine| MemoryStore { engine })
    }
}

/// Implements `MetadataStore` for a newtype over `LocalStore` (field `engine`).
macro_rules! local_metadata_store {
    ($store:ty, $kind:expr) => {
        impl MetadataStore for $store {
            fn kind(&self) -> BackendKind {
                $kind
            }

            fn get<'a>(
                &'a self,
                key: &'a str,
            ) -> BoxFuture<'a, Result<Option<(Bytes, Version)>, MetaError>> {
                Box::pin(self.engine.get(key))
            }

            fn put<'a>(
                &'a self,
                key: &'a str,
                value: Bytes,
                expected: ExpectedVersion,
            ) -> BoxFuture<'a, Result<Version, MetaError>> {
                Box::pin(self.engine.put(key, value, expected, None))
            }

            fn delete<'a>(
                &'a self,
                key: &'a str,
                expected: ExpectedVersion,
            ) -> BoxFuture<'a, Result<(), MetaError>> {
                Box::pin(self.engine.delete(key, expected))
            }

            fn children<'a>(
                &'a self,
                path: &'a str,
            ) -> BoxFuture<'a, Result<Vec<String>, MetaError>> {
                Box::pin(self.engine.children(path))
            }

            fn watch<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Watcher, MetaError>> {
                Box::pin(self.engine.watch(path))
            }

            fn session(&self, ttl: Duration) -> BoxFuture<'_, Result<Session, MetaError>> {
                Box::pin(self.engine.session(ttl))
            }

            fn put_ephemeral<'a>(
                &'a self,
                session: &'a Session,
                key: &'a str,
                value: Bytes,
                expected: ExpectedVersion,
            ) -> BoxFuture<'a, Result<Version, MetaError>> {
                Box::pin(self.engine.put(key, value, expected, Some(session)))
            }
        }
    };
}
pub(crate) use local_metadata_store;

local_metadata_store!(MemoryStore, BackendKind::Memory);
