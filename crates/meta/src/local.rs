//! The engine shared by the in-process stores ([`crate::MemoryStore`],
//! [`crate::FileStore`]): CAS rules, store-wide revisions, sessions, ephemeral
//! keys and watch notification, over a [`LocalBackend`] that only reads and
//! atomically commits records.
//!
//! Owns: `LocalState`, behind one mutex. Every operation but `watch` takes it, so
//! writes are serialized: a write reads the current record, checks the
//! expectation, commits, then notifies watchers, all under the lock, which is
//! what makes CAS atomic and watch events arrive in commit order. The watcher
//! list has its own mutex (taken inside the state lock, never the other way), so
//! creating a watcher never waits for a commit's fsync. A backend whose calls block on disk runs
//! under `spawn_blocking`, at most `BLOCKING_OPS_IN_FLIGHT_MAX` at a time.
//!
//! Sessions live in this process only: a session is alive while its handle is;
//! a dropped handle expires one TTL later on a tokio timer. A failed commit
//! (I/O error, fsync failure) is never retried: the store answers every later
//! call with that error.

use std::collections::{BTreeSet, HashMap};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{Semaphore, watch};

use crate::error::MetaError;
use crate::key::{children_prefix, validate_key, validate_path, validate_value};
use crate::session::{Session, SessionControl, SessionId, SessionState};
use crate::store::{BoxFuture, ExpectedVersion, Version, WatchEvent};
use crate::watch::{LocalWatchers, Watcher};

/// Sessions one local store keeps. A process opens a few (one per bookie, broker
/// or test component); the bound only stops a leak. When full: `LimitReached`.
const LOCAL_SESSIONS_MAX: usize = 65_536;

/// Ephemeral keys one session may own. A broker owns one key per namespace
/// bundle it serves (thousands at most). When full: `LimitReached`.
const SESSION_EPHEMERAL_KEYS_MAX: usize = 100_000;

/// Blocking backend calls queued on tokio's blocking pool at once. A commit is an
/// fsync (~1-10 ms) and commits are serialized anyway, so more in flight only
/// holds threads; further callers wait for a permit (back-pressure).
const BLOCKING_OPS_IN_FLIGHT_MAX: usize = 64;

static STORE_ID_NEXT: AtomicU64 = AtomicU64::new(1);

/// A fresh id for a store instance, so a session can tell which store made it.
pub(crate) fn next_store_id() -> u64 {
    STORE_ID_NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A stored record as the engine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Record {
    pub(crate) value: Bytes,
    pub(crate) version: Version,
    /// Bound to a session (which one is tracked in memory only).
    pub(crate) ephemeral: bool,
}

/// One change in an atomic commit.
#[derive(Debug)]
pub(crate) enum Mutation<'a> {
    Put { key: &'a str, record: &'a Record },
    Delete { key: &'a str },
}

/// Storage under the engine: reads and atomic, durable commits. Never sees
/// sessions or watchers.
pub(crate) trait LocalBackend: Send + fmt::Debug + 'static {
    /// True when calls block on disk I/O (run them on the blocking pool).
    const BLOCKING: bool;
    /// The record at `key`.
    fn get(&self, key: &str) -> Result<Option<Record>, MetaError>;
    /// Direct children of `path` (whose children prefix is `prefix`), sorted,
    /// at most `CHILDREN_COUNT_MAX`.
    fn children(&self, path: &str, prefix: &str) -> Result<Vec<String>, MetaError>;
    /// Applies all mutations atomically and durably, recording `revision` as the
    /// store's last revision.
    fn commit(&mut self, mutations: &[Mutation<'_>], revision: u64) -> Result<(), MetaError>;
}

#[derive(Debug)]
struct LocalSession {
    ttl: Duration,
    keys: BTreeSet<String>,
    state: watch::Sender<SessionState>,
}

#[derive(Debug)]
pub(crate) struct LocalState<B> {
    backend: B,
    /// Revision of the last commit; the next write gets `revision + 1`.
    revision: u64,
    watchers: Arc<Mutex<LocalWatchers>>,
    sessions: HashMap<SessionId, LocalSession>,
    /// Which session owns each ephemeral key.
    owners: HashMap<String, SessionId>,
    session_id_next: u64,
    /// Set by the first failed commit; every later call fails with it.
    failed: Option<MetaError>,
}

#[derive(Debug)]
pub(crate) struct LocalInner<B> {
    store_id: u64,
    state: Mutex<LocalState<B>>,
    /// The same list as `state.watchers`, reachable without the state lock.
    watchers: Arc<Mutex<LocalWatchers>>,
    blocking_ops: Arc<Semaphore>,
}

/// The engine; cheap to clone (shared state).
#[derive(Debug)]
pub(crate) struct LocalStore<B> {
    inner: Arc<LocalInner<B>>,
}

impl<B> Clone for LocalStore<B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<B: LocalBackend> LocalStore<B> {
    /// Wraps `backend` whose last committed revision is `revision`.
    pub(crate) fn new(backend: B, revision: u64) -> Self {
        let watchers = Arc::new(Mutex::new(LocalWatchers::default()));
        let state = LocalState {
            backend,
            revision,
            watchers: Arc::clone(&watchers),
            sessions: HashMap::new(),
            owners: HashMap::new(),
            session_id_next: 1,
            failed: None,
        };
        Self {
            inner: Arc::new(LocalInner {
                store_id: next_store_id(),
                state: Mutex::new(state),
                watchers,
                blocking_ops: Arc::new(Semaphore::new(BLOCKING_OPS_IN_FLIGHT_MAX)),
            }),
        }
    }

    pub(crate) fn downgrade(&self) -> Weak<LocalInner<B>> {
        Arc::downgrade(&self.inner)
    }

    pub(crate) fn upgrade(weak: &Weak<LocalInner<B>>) -> Option<Self> {
        weak.upgrade().map(|inner| Self { inner })
    }

    /// Runs `f` on the locked state: inline for memory, on the blocking pool for
    /// a disk backend.
    async fn run<T, F>(&self, op: &'static str, f: F) -> Result<T, MetaError>
    where
        T: Send + 'static,
        F: FnOnce(&mut LocalState<B>) -> Result<T, MetaError> + Send + 'static,
    {
        if !B::BLOCKING {
            return self.inner.with_state(op, f);
        }
        // Owned and moved into the task: a caller that gives up waiting does
        // not free the slot while its operation still runs.
        let permit = Arc::clone(&self.inner.blocking_ops)
            .acquire_owned()
            .await
            .map_err(|_| MetaError::Backend {
                op,
                detail: "store is shutting down".to_owned(),
            })?;
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let result = inner.with_state(op, f);
            drop(permit);
            result
        })
        .await
        .map_err(|join_error| MetaError::Backend {
            op,
            detail: format!("store task failed: {join_error}"),
        })?
    }

    pub(crate) async fn get(&self, key: &str) -> Result<Option<(Bytes, Version)>, MetaError> {
        validate_key(key)?;
        let key = key.to_owned();
        let record = self
            .run("get", move |state| state.backend.get(&key))
            .await?;
        Ok(record.map(|r| (r.value, r.version)))
    }

    pub(crate) async fn put(
        &self,
        key: &str,
        value: Bytes,
        expected: ExpectedVersion,
        owner: Option<&Session>,
    ) -> Result<Version, MetaError> {
        validate_key(key)?;
        validate_value(key, value.len())?;
        let owner = match owner {
            Some(session) => {
                session.check_usable(self.inner.store_id)?;
                Some(session.id())
            }
            None => None,
        };
        let key = key.to_owned();
        self.run("put", move |state| state.put(&key, value, expected, owner))
            .await
    }

    pub(crate) async fn delete(
        &self,
        key: &str,
        expected: ExpectedVersion,
    ) -> Result<(), MetaError> {
        validate_key(key)?;
        if expected == ExpectedVersion::Absent {
            return Err(MetaError::InvalidArgument {
                reason: "delete cannot expect the key to be absent",
            });
        }
        let key = key.to_owned();
        self.run("delete", move |state| state.delete(&key, expected))
            .await
    }

    pub(crate) async fn children(&self, path: &str) -> Result<Vec<String>, MetaError> {
        validate_path(path)?;
        let path = path.to_owned();
        self.run("children", move |state| {
            state.backend.children(&path, &children_prefix(&path))
        })
        .await
    }

    pub(crate) async fn watch(&self, path: &str) -> Result<Watcher, MetaError> {
        validate_path(path)?;
        // No I/O and no state lock: never waits for a commit.
        lock_watchers(&self.inner.watchers).add(path)
    }

    pub(crate) async fn session(&self, ttl: Duration) -> Result<Session, MetaError> {
        let (id, state_rx) = self
            .run("session", move |state| {
                if state.sessions.len() >= LOCAL_SESSIONS_MAX {
                    return Err(MetaError::LimitReached {
                        what: "sessions",
                        limit: LOCAL_SESSIONS_MAX,
                    });
                }
                let id = SessionId(state.session_id_next);
                state.session_id_next += 1;
                let (tx, rx) = watch::channel(SessionState::Alive);
                state.sessions.insert(
                    id,
                    LocalSession {
                        ttl,
                        keys: BTreeSet::new(),
                        state: tx,
                    },
                );
                Ok((id, rx))
            })
            .await?;
        let control = LocalSessionControl {
            inner: Arc::downgrade(&self.inner),
            ttl,
        };
        Ok(Session::new(
            id,
            ttl,
            self.inner.store_id,
            state_rx,
            Arc::new(control),
        ))
    }

    /// Ends session `id` now, deleting its ephemeral keys: `Expired` as if its
    /// lease lapsed, or `Closed`. Unknown or already ended sessions: `Ok`.
    pub(crate) async fn end_session(
        &self,
        id: SessionId,
        end: SessionState,
    ) -> Result<(), MetaError> {
        self.run("end_session", move |state| state.end_session(id, end))
            .await
    }
}

impl<B: LocalBackend> LocalInner<B> {
    fn lock(&self) -> MutexGuard<'_, LocalState<B>> {
        // A panic while holding the lock leaves `failed` as the only trustworthy
        // field; `with_state` refuses to go on after one (see below).
        self.state.lock().unwrap_or_else(|poisoned| {
            let mut guard = poisoned.into_inner();
            if guard.failed.is_none() {
                guard.failed = Some(MetaError::Backend {
                    op: "lock",
                    detail: "a metadata operation panicked".to_owned(),
                });
            }
            guard
        })
    }

    fn with_state<T>(
        &self,
        _op: &'static str,
        f: impl FnOnce(&mut LocalState<B>) -> Result<T, MetaError>,
    ) -> Result<T, MetaError> {
        let mut state = self.lock();
        if let Some(failed) = &state.failed {
            return Err(failed.clone());
        }
        f(&mut state)
    }
}

impl<B: LocalBackend> LocalState<B> {
    fn commit(&mut self, mutations: &[Mutation<'_>], revision: u64) -> Result<(), MetaError> {
        debug_assert_eq!(revision, self.revision + 1);
        if let Err(error) = self.backend.commit(mutations, revision) {
            // Never retried: after a failed fsync the file's state is unknown.
            tracing::error!(%error, "metadata commit failed; the store refuses further operations");
            self.failed = Some(error.clone());
            return Err(error);
        }
        self.revision = revision;
        Ok(())
    }

    fn put(
        &mut self,
        key: &str,
        value: Bytes,
        expected: ExpectedVersion,
        owner: Option<SessionId>,
    ) -> Result<Version, MetaError> {
        let current = self.backend.get(key)?;
        check_expected(key, current.as_ref().map(|r| r.version), expected)?;
        if let Some(id) = owner {
            let session = self
                .sessions
                .get(&id)
                .filter(|s| *s.state.borrow() == SessionState::Alive)
                .ok_or(MetaError::SessionExpired { session: id })?;
            if session.keys.len() >= SESSION_EPHEMERAL_KEYS_MAX && !session.keys.contains(key) {
                return Err(MetaError::LimitReached {
                    what: "ephemeral keys in one session",
                    limit: SESSION_EPHEMERAL_KEYS_MAX,
                });
            }
        }
        let revision = self.revision + 1;
        let version = Version(revision);
        let record = Record {
            value,
            version,
            ephemeral: owner.is_some(),
        };
        self.commit(
            &[Mutation::Put {
                key,
                record: &record,
            }],
            revision,
        )?;
        self.set_owner(key, owner);
        lock_watchers(&self.watchers).notify(
            key,
            &WatchEvent::Put {
                key: key.to_owned(),
                version,
            },
        );
        Ok(version)
    }

    fn delete(&mut self, key: &str, expected: ExpectedVersion) -> Result<(), MetaError> {
        let current = self.backend.get(key)?;
        match current {
            None => {
                return Err(MetaError::NotFound {
                    key: key.to_owned(),
                });
            }
            Some(record) => check_expected(key, Some(record.version), expected)?,
        }
        let revision = self.revision + 1;
        self.commit(&[Mutation::Delete { key }], revision)?;
        self.set_owner(key, None);
        lock_watchers(&self.watchers).notify(
            key,
            &WatchEvent::Delete {
                key: key.to_owned(),
            },
        );
        Ok(())
    }

    fn set_owner(&mut self, key: &str, owner: Option<SessionId>) {
        if let Some(previous) = self.owners.remove(key)
            && let Some(session) = self.sessions.get_mut(&previous)
        {
            session.keys.remove(key);
        }
        if let Some(id) = owner {
            self.owners.insert(key.to_owned(), id);
            if let Some(session) = self.sessions.get_mut(&id) {
                session.keys.insert(key.to_owned());
            }
        }
    }

    fn end_session(&mut self, id: SessionId, end: SessionState) -> Result<(), MetaError> {
        debug_assert_ne!(end, SessionState::Alive);
        let Some(session) = self.sessions.get(&id) else {
            return Ok(());
        };
        if *session.state.borrow() != SessionState::Alive {
            return Ok(());
        }
        let keys: Vec<String> = session.keys.iter().cloned().collect();
        if !keys.is_empty() {
            let mutations: Vec<Mutation<'_>> =
                keys.iter().map(|key| Mutation::Delete { key }).collect();
            let revision = self.revision + 1;
            self.commit(&mutations, revision)?;
        }
        for key in &keys {
            self.owners.remove(key);
            lock_watchers(&self.watchers).notify(key, &WatchEvent::Delete { key: key.clone() });
        }
        if let Some(session) = self.sessions.remove(&id) {
            tracing::info!(session = %id, ?end, ttl = ?session.ttl, keys = keys.len(), "metadata session ended");
            session.state.send_replace(end);
        }
        Ok(())
    }
}

fn lock_watchers(watchers: &Mutex<LocalWatchers>) -> MutexGuard<'_, LocalWatchers> {
    // The list stays consistent even if a holder panicked (push/retain only).
    watchers
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Checks `expected` against the key's current version (`None`: absent).
pub(crate) fn check_expected(
    key: &str,
    current: Option<Version>,
    expected: ExpectedVersion,
) -> Result<(), MetaError> {
    match (expected, current) {
        (ExpectedVersion::Any, _) | (ExpectedVersion::Absent, None) => Ok(()),
        (ExpectedVersion::Absent, Some(actual)) => Err(MetaError::Exists {
            key: key.to_owned(),
            actual,
        }),
        (ExpectedVersion::Is(_), None) => Err(MetaError::NotFound {
            key: key.to_owned(),
        }),
        (ExpectedVersion::Is(wanted), Some(actual)) if wanted == actual => Ok(()),
        (ExpectedVersion::Is(_), Some(actual)) => Err(MetaError::BadVersion {
            key: key.to_owned(),
            expected,
            actual,
        }),
    }
}

/// The session handle's way back to a local store. Weak: a session does not
/// keep its store (and a database file) open.
#[derive(Debug)]
struct LocalSessionControl<B> {
    inner: Weak<LocalInner<B>>,
    ttl: Duration,
}

impl<B: LocalBackend> SessionControl for LocalSessionControl<B> {
    fn close(&self, id: SessionId) -> BoxFuture<'_, Result<(), MetaError>> {
        Box::pin(async move {
            match self.inner.upgrade() {
                Some(inner) => {
                    LocalStore { inner }
                        .end_session(id, SessionState::Closed)
                        .await
                }
                None => Ok(()),
            }
        })
    }

    fn abandon(&self, id: SessionId) {
        let ttl = self.ttl;
        let weak = Weak::clone(&self.inner);
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    tokio::time::sleep(ttl).await;
                    if let Some(inner) = weak.upgrade() {
                        let store = LocalStore { inner };
                        if let Err(error) = store.end_session(id, SessionState::Expired).await {
                            tracing::warn!(session = %id, %error, "expiring an abandoned session failed");
                        }
                    }
                });
            }
            Err(_) => {
                // No runtime (dropped during shutdown): no timer to wait on, and
                // blocking here is allowed, so expire now.
                if let Some(inner) = weak.upgrade() {
                    let result = inner.with_state("end_session", |state| {
                        state.end_session(id, SessionState::Expired)
                    });
                    if let Err(error) = result {
                        tracing::warn!(session = %id, %error, "expiring an abandoned session failed");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expectations() {
        let v = Some(Version(5));
        assert_eq!(check_expected("/k", None, ExpectedVersion::Any), Ok(()));
        assert_eq!(check_expected("/k", v, ExpectedVersion::Any), Ok(()));
        assert_eq!(check_expected("/k", None, ExpectedVersion::Absent), Ok(()));
        assert!(matches!(
            check_expected("/k", v, ExpectedVersion::Absent),
            Err(MetaError::Exists {
                actual: Version(5),
                ..
            })
        ));
        assert!(matches!(
            check_expected("/k", None, ExpectedVersion::Is(Version(5))),
            Err(MetaError::NotFound { .. })
        ));
        assert_eq!(
            check_expected("/k", v, ExpectedVersion::Is(Version(5))),
            Ok(())
        );
        assert!(matches!(
            check_expected("/k", v, ExpectedVersion::Is(Version(4))),
            Err(MetaError::BadVersion {
                actual: Version(5),
                ..
            })
        ));
    }
}
