//! The engine shared by the in-process stores ([`crate::MemoryStore`],
//! [`crate::FileStore`]): CAS rules, store-wide revisions, sessions, ephemeral
//! keys, watch notification and group commit, over a [`LocalBackend`] that
//! only reads and atomically commits records.
//!
//! Owns: `LocalState`, behind one mutex that is never held across a commit.
//! A write is *staged* under the lock: its expectation is checked against the
//! staged overlay (writes staged, not yet durable) and then the backend, it
//! gets the next revision, and it joins the commit queue. One committer at a
//! time (`commit::commit_staged`, on the blocking pool for a disk backend)
//! takes the queued writes in revision order, at most
//! `COMMIT_BATCH_WRITES_MAX` writes or `COMMIT_BATCH_BYTES_MAX` bytes, and
//! commits them as one atomic, durable backend commit (one fsync for all);
//! writers staged meanwhile form the next batch. So CAS stays atomic, watch
//! events arrive in commit order, and concurrent writers share fsyncs.
//!
//! Durability rule: a writer's call returns `Ok` only after the commit that
//! holds its write returned `Ok` from the backend (then it is on disk); an
//! error that was caused by a staged write (a CAS that lost to it) is returned
//! only once that write is durable, so nobody acts on state that a crash could
//! take back. Reads go to the backend: they see durable state only. Crash
//! safety: a backend commit is atomic (redb: one write transaction), so after
//! a crash either a whole batch is on disk or none of it; every writer of a
//! lost batch was still waiting (none was told `Ok`). A failed commit (I/O
//! error, fsync failure) is never retried: the writers of that batch and of
//! every later one get the error, which means "outcome unknown" (the batch may
//! or may not be on disk, as with a write to etcd that timed out), and the
//! store answers every later call with it. Staged writes wait in at most
//! `STAGED_WRITE_BYTES_MAX` bytes; further writers wait for room.
//!
//! The watcher list has its own mutex (taken inside the state lock, never the
//! other way), so creating a watcher never waits for a commit. A backend whose
//! calls block on disk runs them under `spawn_blocking`, at most
//! `BLOCKING_OPS_IN_FLIGHT_MAX` at a time besides the committer.
//!
//! Sessions live in this process only: a session is alive while its handle is;
//! a dropped handle expires one TTL later on a tokio timer.

mod commit;
#[cfg(test)]
mod tests;

use std::collections::{BTreeSet, HashMap, VecDeque};
use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::Duration;

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};

use crate::error::MetaError;
use crate::key::{
    KEY_BYTES_MAX, VALUE_BYTES_MAX, children_prefix, validate_key, validate_path, validate_value,
};
use crate::session::{Session, SessionControl, SessionId, SessionState};
use crate::store::{BoxFuture, ExpectedVersion, Version, WatchEvent};
use crate::watch::{LocalWatchers, Watcher};

/// Sessions one local store keeps. A process opens a few (one per bookie, broker
/// or test component); the bound only stops a leak. When full: `LimitReached`.
const LOCAL_SESSIONS_MAX: usize = 65_536;

/// Ephemeral keys one session may own. A broker owns one key per namespace
/// bundle it serves (thousands at most). When full: `LimitReached`.
const SESSION_EPHEMERAL_KEYS_MAX: usize = 100_000;

/// Blocking backend calls (reads, staging) queued on tokio's blocking pool at
/// once. Each is short (a read of cached pages) now that no commit holds the
/// lock; more in flight only holds threads; further callers wait for a permit
/// (back-pressure).
const BLOCKING_OPS_IN_FLIGHT_MAX: usize = 64;

/// Bytes of staged writes (key + value + `STAGED_WRITE_OVERHEAD_BYTES` each)
/// waiting for their commit, in all. A writer waits for room before it is
/// staged. 32 MiB is 100,000 small topic records, or a few dozen of the
/// largest values.
pub(crate) const STAGED_WRITE_BYTES_MAX: usize = 32 * 1024 * 1024;

/// What one staged write costs besides its key and value (the queue entry,
/// the overlay entry, the watch event).
const STAGED_WRITE_OVERHEAD_BYTES: usize = 256;

/// Writes one commit takes at most: enough that 16-1,000 concurrent creators
/// share an fsync, few enough that one commit (and the lock-free time of the
/// writers behind it) stays short.
pub(crate) const COMMIT_BATCH_WRITES_MAX: usize = 1024;

/// Bytes (as charged to `STAGED_WRITE_BYTES_MAX`) one commit takes at most;
/// a single larger write is committed alone.
pub(crate) const COMMIT_BATCH_BYTES_MAX: usize = 4 * 1024 * 1024;

// The largest single write must fit the staging budget, or it would wait forever.
const _: () = assert!(
    KEY_BYTES_MAX + VALUE_BYTES_MAX + STAGED_WRITE_OVERHEAD_BYTES <= STAGED_WRITE_BYTES_MAX
);

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
/// sessions or watchers. Reads may run while a commit runs (they see the state
/// before or after it, never part of it); commits never overlap.
pub(crate) trait LocalBackend: Send + Sync + fmt::Debug + 'static {
    /// True when calls block on disk I/O (run them on the blocking pool).
    const BLOCKING: bool;
    /// The record at `key`.
    fn get(&self, key: &str) -> Result<Option<Record>, MetaError>;
    /// Direct children of `path` (whose children prefix is `prefix`), sorted,
    /// at most `CHILDREN_COUNT_MAX`.
    fn children(&self, path: &str, prefix: &str) -> Result<Vec<String>, MetaError>;
    /// Applies all mutations atomically and durably, recording `revision` as the
    /// store's last revision. Mutations of one key apply in order.
    fn commit(&self, mutations: &[Mutation<'_>], revision: u64) -> Result<(), MetaError>;
}

#[derive(Debug)]
struct LocalSession {
    ttl: Duration,
    keys: BTreeSet<String>,
    state: watch::Sender<SessionState>,
}

/// A change staged for the next commit, owning its key.
#[derive(Debug)]
enum StagedMutation {
    Put { key: String, record: Record },
    Delete { key: String },
}

impl StagedMutation {
    fn key(&self) -> &str {
        match self {
            Self::Put { key, .. } | Self::Delete { key } => key,
        }
    }

    fn as_mutation(&self) -> Mutation<'_> {
        match self {
            Self::Put { key, record } => Mutation::Put { key, record },
            Self::Delete { key } => Mutation::Delete { key },
        }
    }

    fn event(&self) -> WatchEvent {
        match self {
            Self::Put { key, record } => WatchEvent::Put {
                key: key.clone(),
                version: record.version,
            },
            Self::Delete { key } => WatchEvent::Delete { key: key.clone() },
        }
    }
}

/// One write waiting in the commit queue: its revision, its changes, and its
/// share of the staging budget (released when its commit is done).
#[derive(Debug)]
struct StagedWrite {
    revision: u64,
    mutations: Vec<StagedMutation>,
    charged_bytes: usize,
    _room: Option<OwnedSemaphorePermit>,
}

/// What a key will be once the staged writes are durable.
#[derive(Debug)]
struct Overlaid {
    /// `None`: deleted.
    record: Option<Record>,
    /// The revision of the staged write that set it.
    revision: u64,
}

/// The result of a staged operation and the revision that must be durable
/// before the caller may see it (0: none).
#[derive(Debug)]
pub(crate) struct Outcome<T> {
    result: Result<T, MetaError>,
    wait_for: u64,
}

impl<T> Outcome<T> {
    fn now(result: Result<T, MetaError>) -> Self {
        Self {
            result,
            wait_for: 0,
        }
    }
}

/// What the committer published last: the store's durable revision, or the
/// error of the commit that failed.
#[derive(Clone, Debug)]
struct Durable {
    revision: u64,
    failed: Option<MetaError>,
}

#[derive(Debug)]
pub(crate) struct LocalState {
    /// The last revision handed out (staged or durable); the next write gets
    /// `revision + 1`.
    revision: u64,
    /// The revision of the last durable commit.
    durable_revision: u64,
    /// Keys changed by staged writes not yet durable, as they will be.
    overlay: HashMap<String, Overlaid>,
    /// Staged writes not yet taken by the committer, in revision order.
    queue: VecDeque<StagedWrite>,
    /// A committer is running (it empties the queue before it stops).
    committing: bool,
    sessions: HashMap<SessionId, LocalSession>,
    /// Which session owns each ephemeral key (staged writes included).
    owners: HashMap<String, SessionId>,
    session_id_next: u64,
    /// Set by the first failed commit; every later call fails with it.
    failed: Option<MetaError>,
}

#[derive(Debug)]
pub(crate) struct LocalInner<B> {
    store_id: u64,
    backend: B,
    state: Mutex<LocalState>,
    /// Watchers, notified by the committer. Their lock is taken inside the
    /// state lock, never the other way round.
    watchers: Arc<Mutex<LocalWatchers>>,
    blocking_ops: Arc<Semaphore>,
    /// Room for staged writes, in bytes (`STAGED_WRITE_BYTES_MAX`).
    staging_room: Arc<Semaphore>,
    durable: Arc<watch::Sender<Durable>>,
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

fn shutting_down(op: &'static str) -> MetaError {
    MetaError::Backend {
        op,
        detail: "store is shutting down".to_owned(),
    }
}

impl<B: LocalBackend> LocalStore<B> {
    /// Wraps `backend` whose last committed revision is `revision`.
    pub(crate) fn new(backend: B, revision: u64) -> Self {
        let watchers = Arc::new(Mutex::new(LocalWatchers::default()));
        let state = LocalState {
            revision,
            durable_revision: revision,
            overlay: HashMap::new(),
            queue: VecDeque::new(),
            committing: false,
            sessions: HashMap::new(),
            owners: HashMap::new(),
            session_id_next: 1,
            failed: None,
        };
        let (durable, _) = watch::channel(Durable {
            revision,
            failed: None,
        });
        Self {
            inner: Arc::new(LocalInner {
                store_id: next_store_id(),
                backend,
                state: Mutex::new(state),
                watchers,
                blocking_ops: Arc::new(Semaphore::new(BLOCKING_OPS_IN_FLIGHT_MAX)),
                staging_room: Arc::new(Semaphore::new(STAGED_WRITE_BYTES_MAX)),
                durable: Arc::new(durable),
            }),
        }
    }

    pub(crate) fn downgrade(&self) -> Weak<LocalInner<B>> {
        Arc::downgrade(&self.inner)
    }

    pub(crate) fn upgrade(weak: &Weak<LocalInner<B>>) -> Option<Self> {
        weak.upgrade().map(|inner| Self { inner })
    }

    /// Runs `f` inline for memory, on the blocking pool for a disk backend.
    async fn blocking<T, F>(&self, op: &'static str, f: F) -> Result<T, MetaError>
    where
        T: Send + 'static,
        F: FnOnce(&Arc<LocalInner<B>>) -> Result<T, MetaError> + Send + 'static,
    {
        if !B::BLOCKING {
            return f(&self.inner);
        }
        // Owned and moved into the task: a caller that gives up waiting does
        // not free the slot while its operation still runs.
        let permit = Arc::clone(&self.inner.blocking_ops)
            .acquire_owned()
            .await
            .map_err(|_| shutting_down(op))?;
        let inner = Arc::clone(&self.inner);
        tokio::task::spawn_blocking(move || {
            let result = f(&inner);
            drop(permit);
            result
        })
        .await
        .map_err(|join_error| MetaError::Backend {
            op,
            detail: format!("store task failed: {join_error}"),
        })?
    }

    /// Reads the durable state (no state lock, so never behind a commit).
    async fn read<T, F>(&self, op: &'static str, f: F) -> Result<T, MetaError>
    where
        T: Send + 'static,
        F: FnOnce(&B) -> Result<T, MetaError> + Send + 'static,
    {
        self.inner.check_usable()?;
        self.blocking(op, move |inner| f(&inner.backend)).await
    }

    /// Stages a write with `f` (under the state lock), starts the committer if
    /// none runs, and returns once the outcome may be seen (see the module doc).
    async fn write<T, F>(
        &self,
        op: &'static str,
        charged_bytes: usize,
        f: F,
    ) -> Result<T, MetaError>
    where
        T: Send + 'static,
        F: FnOnce(&mut LocalState, &B, Staging) -> Result<Outcome<T>, MetaError> + Send + 'static,
    {
        let charged_bytes = charged_bytes.clamp(1, STAGED_WRITE_BYTES_MAX);
        let room = Arc::clone(&self.inner.staging_room)
            .acquire_many_owned(u32::try_from(charged_bytes).unwrap_or(u32::MAX))
            .await
            .map_err(|_| shutting_down(op))?;
        let runtime = tokio::runtime::Handle::current();
        let outcome = self
            .blocking(op, move |inner| {
                let (outcome, lead) = {
                    let mut state = inner.lock_usable()?;
                    let staging = Staging {
                        charged_bytes,
                        room: Some(room),
                    };
                    let outcome = f(&mut state, &inner.backend, staging)?;
                    let lead = !state.committing && !state.queue.is_empty();
                    if lead {
                        state.committing = true;
                    }
                    (outcome, lead)
                };
                // Started here, not by the caller: a caller that gives up
                // waiting must not leave `committing` set with no committer.
                if lead {
                    let inner = Arc::clone(inner);
                    if B::BLOCKING {
                        runtime.spawn_blocking(move || inner.commit_staged());
                    } else {
                        inner.commit_staged();
                    }
                }
                Ok(outcome)
            })
            .await?;
        self.inner.outcome(outcome).await
    }

    pub(crate) async fn get(&self, key: &str) -> Result<Option<(Bytes, Version)>, MetaError> {
        validate_key(key)?;
        let key = key.to_owned();
        let record = self.read("get", move |backend| backend.get(&key)).await?;
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
        let charged = key.len() + value.len() + STAGED_WRITE_OVERHEAD_BYTES;
        let key = key.to_owned();
        self.write("put", charged, move |state, backend, staging| {
            state.put(backend, staging, key, value, expected, owner)
        })
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
        let charged = key.len() + STAGED_WRITE_OVERHEAD_BYTES;
        let key = key.to_owned();
        self.write("delete", charged, move |state, backend, staging| {
            state.delete(backend, staging, key, expected)
        })
        .await
    }

    pub(crate) async fn children(&self, path: &str) -> Result<Vec<String>, MetaError> {
        validate_path(path)?;
        let path = path.to_owned();
        self.read("children", move |backend| {
            backend.children(&path, &children_prefix(&path))
        })
        .await
    }

    pub(crate) async fn watch(&self, path: &str) -> Result<Watcher, MetaError> {
        validate_path(path)?;
        // No I/O and no state lock: never waits for a commit.
        lock_watchers(&self.inner.watchers).add(path)
    }

    pub(crate) async fn session(&self, ttl: Duration) -> Result<Session, MetaError> {
        // No I/O: inline for every backend.
        let (id, state_rx) = {
            let mut state = self.inner.lock_usable()?;
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
            (id, rx)
        };
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
        // The deleted keys are already held in the session's key set (bounded
        // by SESSION_EPHEMERAL_KEYS_MAX): only the write itself is charged.
        let holder = self
            .write(
                "end_session",
                STAGED_WRITE_OVERHEAD_BYTES,
                move |state, _backend, staging| Ok(state.end_session(staging, id, end)),
            )
            .await?;
        if let Some(holder) = holder {
            holder.send_replace(end);
        }
        Ok(())
    }
}

/// A write's share of the staging budget, handed to the staging function and
/// moved into the queue entry it stages (dropped unused when it stages none).
#[derive(Debug)]
pub(crate) struct Staging {
    charged_bytes: usize,
    room: Option<OwnedSemaphorePermit>,
}

impl<B: LocalBackend> LocalInner<B> {
    fn lock(&self) -> MutexGuard<'_, LocalState> {
        // A panic while holding the lock leaves `failed` as the only trustworthy
        // field; `lock_usable` refuses to go on after one.
        self.state.lock().unwrap_or_else(|poisoned| {
            let mut guard = poisoned.into_inner();
            if guard.failed.is_none() {
                let error = MetaError::Backend {
                    op: "lock",
                    detail: "a metadata operation panicked".to_owned(),
                };
                guard.fail(&self.durable, error);
            }
            guard
        })
    }

    /// The state, unless a commit failed before.
    fn lock_usable(&self) -> Result<MutexGuard<'_, LocalState>, MetaError> {
        let state = self.lock();
        match &state.failed {
            Some(failed) => Err(failed.clone()),
            None => Ok(state),
        }
    }

    fn check_usable(&self) -> Result<(), MetaError> {
        self.lock_usable().map(drop)
    }

    /// Waits until the outcome's revision is durable, then hands it out; the
    /// commit's error instead when that commit failed.
    async fn outcome<T>(&self, outcome: Outcome<T>) -> Result<T, MetaError> {
        if outcome.wait_for == 0 {
            return outcome.result;
        }
        let mut durable = self.durable.subscribe();
        let published = durable
            .wait_for(|d| d.revision >= outcome.wait_for || d.failed.is_some())
            .await
            .map_err(|_| shutting_down("commit"))?;
        if published.revision >= outcome.wait_for {
            return outcome.result;
        }
        Err(published
            .failed
            .clone()
            .unwrap_or_else(|| shutting_down("commit")))
    }

    /// Stages a write and commits it on this thread when no committer runs,
    /// without waiting for another committer (no runtime to wait on): for a
    /// handle dropped while the runtime shuts down.
    fn write_now<T>(
        self: &Arc<Self>,
        f: impl FnOnce(&mut LocalState) -> Outcome<T>,
    ) -> Result<T, MetaError> {
        let (outcome, lead) = {
            let mut state = self.lock_usable()?;
            let outcome = f(&mut state);
            let lead = !state.committing && !state.queue.is_empty();
            if lead {
                state.committing = true;
            }
            (outcome, lead)
        };
        if lead {
            Arc::clone(self).commit_staged();
        }
        let result = outcome.result?;
        self.check_usable()?;
        Ok(result)
    }
}

impl LocalState {
    /// The record `key` will have once every staged write is durable, and the
    /// revision of the staged write that decides it (0: the backend's).
    fn current<B: LocalBackend>(
        &self,
        backend: &B,
        key: &str,
    ) -> Result<(Option<Record>, u64), MetaError> {
        match self.overlay.get(key) {
            Some(staged) => Ok((staged.record.clone(), staged.revision)),
            None => Ok((backend.get(key)?, 0)),
        }
    }

    /// Queues `mutations` as the write of `revision` (the next one).
    fn stage(&mut self, revision: u64, staging: Staging, mutations: Vec<StagedMutation>) {
        debug_assert_eq!(revision, self.revision + 1);
        debug_assert!(!mutations.is_empty());
        self.revision = revision;
        for mutation in &mutations {
            let record = match mutation {
                StagedMutation::Put { record, .. } => Some(record.clone()),
                StagedMutation::Delete { .. } => None,
            };
            self.overlay
                .insert(mutation.key().to_owned(), Overlaid { record, revision });
        }
        self.queue.push_back(StagedWrite {
            revision,
            mutations,
            charged_bytes: staging.charged_bytes,
            _room: staging.room,
        });
    }

    /// Marks the store failed and tells every waiting writer.
    fn fail(&mut self, durable: &watch::Sender<Durable>, error: MetaError) {
        self.failed = Some(error.clone());
        self.queue.clear();
        self.overlay.clear();
        durable.send_modify(|d| d.failed = Some(error));
    }

    fn put<B: LocalBackend>(
        &mut self,
        backend: &B,
        staging: Staging,
        key: String,
        value: Bytes,
        expected: ExpectedVersion,
        owner: Option<SessionId>,
    ) -> Result<Outcome<Version>, MetaError> {
        let (current, decided_by) = self.current(backend, &key)?;
        if let Err(error) = check_expected(&key, current.as_ref().map(|r| r.version), expected) {
            return Ok(Outcome {
                result: Err(error),
                wait_for: decided_by,
            });
        }
        if let Some(id) = owner {
            let Some(session) = self
                .sessions
                .get(&id)
                .filter(|s| *s.state.borrow() == SessionState::Alive)
            else {
                return Ok(Outcome::now(Err(MetaError::SessionExpired { session: id })));
            };
            if session.keys.len() >= SESSION_EPHEMERAL_KEYS_MAX && !session.keys.contains(&key) {
                return Ok(Outcome::now(Err(MetaError::LimitReached {
                    what: "ephemeral keys in one session",
                    limit: SESSION_EPHEMERAL_KEYS_MAX,
                })));
            }
        }
        let revision = self.revision + 1;
        let version = Version(revision);
        let record = Record {
            value,
            version,
            ephemeral: owner.is_some(),
        };
        self.set_owner(&key, owner);
        self.stage(revision, staging, vec![StagedMutation::Put { key, record }]);
        Ok(Outcome {
            result: Ok(version),
            wait_for: revision,
        })
    }

    fn delete<B: LocalBackend>(
        &mut self,
        backend: &B,
        staging: Staging,
        key: String,
        expected: ExpectedVersion,
    ) -> Result<Outcome<()>, MetaError> {
        let (current, decided_by) = self.current(backend, &key)?;
        let checked = match current {
            None => Err(MetaError::NotFound { key: key.clone() }),
            Some(record) => check_expected(&key, Some(record.version), expected),
        };
        if let Err(error) = checked {
            return Ok(Outcome {
                result: Err(error),
                wait_for: decided_by,
            });
        }
        let revision = self.revision + 1;
        self.set_owner(&key, None);
        self.stage(revision, staging, vec![StagedMutation::Delete { key }]);
        Ok(Outcome {
            result: Ok(()),
            wait_for: revision,
        })
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

    /// Stages the deletes of the session's keys and forgets the session;
    /// returns its holder's channel, to be told once the deletes are durable
    /// (`None`: unknown or already ended).
    fn end_session(
        &mut self,
        staging: Staging,
        id: SessionId,
        end: SessionState,
    ) -> Outcome<Option<watch::Sender<SessionState>>> {
        debug_assert_ne!(end, SessionState::Alive);
        let Some(session) = self.sessions.remove(&id) else {
            return Outcome::now(Ok(None));
        };
        if *session.state.borrow() != SessionState::Alive {
            return Outcome::now(Ok(None));
        }
        let keys = session.keys.len();
        let mut wait_for = 0;
        if !session.keys.is_empty() {
            let revision = self.revision + 1;
            let mutations = session
                .keys
                .iter()
                .map(|key| {
                    self.owners.remove(key);
                    StagedMutation::Delete { key: key.clone() }
                })
                .collect();
            self.stage(revision, staging, mutations);
            wait_for = revision;
        }
        tracing::info!(session = %id, ?end, ttl = ?session.ttl, keys, "metadata session ended");
        Outcome {
            result: Ok(Some(session.state)),
            wait_for,
        }
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
                    // Not charged to the staging budget: waiting for room
                    // needs the runtime that is gone.
                    let staging = Staging {
                        charged_bytes: 0,
                        room: None,
                    };
                    let result = inner
                        .write_now(|state| state.end_session(staging, id, SessionState::Expired));
                    if let Ok(Some(holder)) = &result {
                        holder.send_replace(SessionState::Expired);
                    }
                    if let Err(error) = result {
                        tracing::warn!(session = %id, %error, "expiring an abandoned session failed");
                    }
                }
            }
        }
    }
}
