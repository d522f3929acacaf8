//! `EtcdStore`: the metadata store on an etcd cluster (v3 API, etcd >= 3.4).
//!
//! Owns: the mapping of the `MetadataStore` contract onto etcd. Keys are stored
//! as-is (`/ledgers/...`). A key's version is its `mod_revision`. CAS is one txn:
//! compare `create_revision == 0` (create) or `mod_revision == v` (update), else
//! read the key to say why it failed. `children` pages through a keys-only
//! prefix range pinned to one revision. Watches are etcd prefix watches fed to a
//! bounded [`crate::Watcher`] queue by one task per watcher, which re-creates a
//! broken watch from the next unseen revision (no loss), or from now after a
//! compaction (then the watcher gets `Lagged`). A session is a lease kept alive
//! by a task; ephemeral keys are attached to it. The holder is told `Expired` as
//! soon as the last acknowledged keep-alive is older than the TTL (measured from
//! when the request was sent, so the holder never believes in a lease etcd has
//! already dropped) or etcd reports the lease gone.
//!
//! Never does: consensus or retries of writes (a write that fails with
//! `Unavailable` has an unknown outcome; the caller re-reads).

use std::fmt;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use etcd_client::{
    Client, Compare, CompareOp, ConnectOptions, EventType, GetOptions, PutOptions, Txn, TxnOp,
    TxnOpResponse, WatchOptions, WatchStream,
};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};

use crate::error::MetaError;
use crate::key::{
    CHILDREN_COUNT_MAX, children_prefix, direct_child, in_subtree, prefix_end, validate_key,
    validate_path, validate_value,
};
use crate::local::next_store_id;
use crate::session::{Session, SessionControl, SessionId, SessionState};
use crate::store::{BackendKind, BoxFuture, ExpectedVersion, MetadataStore, Version, WatchEvent};
use crate::watch::{Pushed, WatchGuard, WatchQueue, Watcher};

/// Timeout of one etcd request. Generous next to etcd's own election timeout
/// (1 s by default), so a leader change completes inside it.
pub const ETCD_OP_TIMEOUT: Duration = Duration::from_secs(10);

/// Timeout of establishing a connection to one endpoint.
const ETCD_CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// Keys per `children` page. Keys are at most 1 KiB, so a page is at most about
/// 1 MiB, well under the gRPC client's 4 MiB message limit.
const CHILDREN_PAGE_KEYS: i64 = 1000;

/// Re-creating a broken watch backs off from the first to the last value, doubling.
const WATCH_RETRY_BACKOFF_MIN: Duration = Duration::from_millis(100);
const WATCH_RETRY_BACKOFF_MAX: Duration = Duration::from_secs(5);

/// Watchers one store serves at once: each is a task and a gRPC stream, and a
/// process watches a handful of paths. When full, `watch` fails with
/// `LimitReached`.
const ETCD_WATCHERS_MAX: usize = 4096;

/// Sessions one store keeps alive at once: each is a lease and a keep-alive
/// task, and a process needs one per component. When full: `LimitReached`.
const ETCD_SESSIONS_MAX: usize = 1024;

/// Keep-alives per TTL: three tries before the lease can lapse.
const KEEPALIVES_PER_TTL: u32 = 3;

/// gRPC status codes we tell apart (google.rpc.Code).
const GRPC_CANCELLED: i32 = 1;
const GRPC_UNKNOWN: i32 = 2;
const GRPC_DEADLINE_EXCEEDED: i32 = 4;
const GRPC_NOT_FOUND: i32 = 5;
const GRPC_RESOURCE_EXHAUSTED: i32 = 8;
const GRPC_ABORTED: i32 = 10;
const GRPC_UNAVAILABLE: i32 = 14;

/// The metadata store on etcd. Cheap to clone: clones share the connection.
#[derive(Clone)]
pub struct EtcdStore {
    client: Client,
    endpoints: Vec<String>,
    store_id: u64,
    watcher_slots: Arc<Semaphore>,
    session_slots: Arc<Semaphore>,
}

impl fmt::Debug for EtcdStore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdStore")
            .field("endpoints", &self.endpoints)
            .field("store_id", &self.store_id)
            .finish()
    }
}

fn etcd_error(op: &'static str) -> impl Fn(etcd_client::Error) -> MetaError {
    move |error| {
        let transient = match &error {
            etcd_client::Error::GRpcStatus(status) => matches!(
                i32::from(status.code()),
                GRPC_CANCELLED
                    | GRPC_UNKNOWN
                    | GRPC_DEADLINE_EXCEEDED
                    | GRPC_RESOURCE_EXHAUSTED
                    | GRPC_ABORTED
                    | GRPC_UNAVAILABLE
            ),
            etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => true,
            _ => false,
        };
        let detail = error.to_string();
        if transient {
            MetaError::Unavailable { op, detail }
        } else {
            MetaError::Backend { op, detail }
        }
    }
}

fn is_lease_not_found(error: &etcd_client::Error) -> bool {
    match error {
        etcd_client::Error::GRpcStatus(status) => i32::from(status.code()) == GRPC_NOT_FOUND,
        etcd_client::Error::LeaseKeepAliveError(message) => message.contains("not found"),
        _ => false,
    }
}

fn timed_out(op: &'static str) -> MetaError {
    MetaError::Unavailable {
        op,
        detail: format!("no answer within {ETCD_OP_TIMEOUT:?}"),
    }
}

/// A revision from etcd as a version; revisions of existing keys are >= 1.
fn version_of(op: &'static str, revision: i64) -> Result<Version, MetaError> {
    match u64::try_from(revision) {
        Ok(v) if v > 0 => Ok(Version(v)),
        _ => Err(MetaError::Backend {
            op,
            detail: format!("etcd returned revision {revision}"),
        }),
    }
}

fn header_revision(
    op: &'static str,
    header: Option<&etcd_client::ResponseHeader>,
) -> Result<i64, MetaError> {
    header.map(|h| h.revision()).ok_or(MetaError::Backend {
        op,
        detail: "etcd response without a header".to_owned(),
    })
}

fn revision_of(version: Version) -> i64 {
    // Versions we hand out come from etcd's i64 revisions; anything larger can
    // never match, and i64::MAX never matches a real revision either.
    i64::try_from(version.0).unwrap_or(i64::MAX)
}

impl EtcdStore {
    /// Connects to etcd at `endpoints` (`host:port` or `http://host:port`) and
    /// checks that it answers.
    pub async fn connect(endpoints: &[String]) -> Result<Self, MetaError> {
        if endpoints.is_empty() {
            return Err(MetaError::BadUrl {
                url: String::new(),
                reason: "no etcd endpoints".to_owned(),
            });
        }
        let endpoints: Vec<String> = endpoints
            .iter()
            .map(|e| {
                if e.contains("://") {
                    e.clone()
                } else {
                    format!("http://{e}")
                }
            })
            .collect();
        let options = ConnectOptions::new()
            .with_timeout(ETCD_OP_TIMEOUT)
            .with_connect_timeout(ETCD_CONNECT_TIMEOUT);
        let client = timeout(ETCD_OP_TIMEOUT, Client::connect(&endpoints, Some(options)))
            .await
            .map_err(|_| timed_out("connect"))?
            .map_err(etcd_error("connect"))?;
        let store = Self {
            client,
            endpoints,
            store_id: next_store_id(),
            watcher_slots: Arc::new(Semaphore::new(ETCD_WATCHERS_MAX)),
            session_slots: Arc::new(Semaphore::new(ETCD_SESSIONS_MAX)),
        };
        // Fail now, naming the endpoints, rather than at the first real call.
        let mut kv = store.client.kv_client();
        timeout(
            ETCD_OP_TIMEOUT,
            kv.get("/", Some(GetOptions::new().with_keys_only())),
        )
        .await
        .map_err(|_| timed_out("connect"))?
        .map_err(|error| match etcd_error("connect")(error) {
            MetaError::Unavailable { op, detail } => MetaError::Unavailable {
                op,
                detail: format!("{}: {detail}", store.endpoints.join(",")),
            },
            other => other,
        })?;
        Ok(store)
    }

    /// The endpoints this store talks to.
    pub fn endpoints(&self) -> &[String] {
        &self.endpoints
    }

    async fn get_impl(&self, key: &str) -> Result<Option<(Bytes, Version)>, MetaError> {
        validate_key(key)?;
        let mut kv = self.client.kv_client();
        let mut response = timeout(ETCD_OP_TIMEOUT, kv.get(key, None))
            .await
            .map_err(|_| timed_out("get"))?
            .map_err(etcd_error("get"))?;
        match response.take_kvs().into_iter().next() {
            Some(found) => {
                let version = version_of("get", found.mod_revision())?;
                let (_, value) = found.into_key_value();
                Ok(Some((Bytes::from(value), version)))
            }
            None => Ok(None),
        }
    }

    async fn put_impl(
        &self,
        key: &str,
        value: Bytes,
        expected: ExpectedVersion,
        lease: Option<(i64, SessionId)>,
    ) -> Result<Version, MetaError> {
        const OP: &str = "put";
        let options = lease.map(|(id, _)| PutOptions::new().with_lease(id));
        let map_error = |error: etcd_client::Error| match lease {
            Some((_, session)) if is_lease_not_found(&error) => {
                MetaError::SessionExpired { session }
            }
            _ => etcd_error(OP)(error),
        };
        let mut kv = self.client.kv_client();
        let compare = match expected {
            ExpectedVersion::Any => {
                let response = timeout(ETCD_OP_TIMEOUT, kv.put(key, value.to_vec(), options))
                    .await
                    .map_err(|_| timed_out(OP))?
                    .map_err(map_error)?;
                return version_of(OP, header_revision(OP, response.header())?);
            }
            ExpectedVersion::Absent => Compare::create_revision(key, CompareOp::Equal, 0),
            ExpectedVersion::Is(version) => {
                Compare::mod_revision(key, CompareOp::Equal, revision_of(version))
            }
        };
        let txn = Txn::new()
            .when([compare])
            .and_then([TxnOp::put(key, value.to_vec(), options)])
            .or_else([TxnOp::get(key, None)]);
        let response = timeout(ETCD_OP_TIMEOUT, kv.txn(txn))
            .await
            .map_err(|_| timed_out(OP))?
            .map_err(map_error)?;
        if response.succeeded() {
            return version_of(OP, header_revision(OP, response.header())?);
        }
        Err(self.explain_failed_compare(OP, key, expected, &response.op_responses())?)
    }

    /// The typed error for a txn whose compare failed; its else-branch read `key`.
    fn explain_failed_compare(
        &self,
        op: &'static str,
        key: &str,
        expected: ExpectedVersion,
        responses: &[TxnOpResponse],
    ) -> Result<MetaError, MetaError> {
        let current = match responses.first() {
            Some(TxnOpResponse::Get(get)) => match get.kvs().first() {
                Some(found) => Some(version_of(op, found.mod_revision())?),
                None => None,
            },
            _ => {
                return Err(MetaError::Backend {
                    op,
                    detail: "etcd txn failed without the read of its else branch".to_owned(),
                });
            }
        };
        match crate::local::check_expected(key, current, expected) {
            Err(error) => Ok(error),
            // The key changed between the compare and the read: say so as a
            // version conflict, the caller re-reads either way.
            Ok(()) => Ok(MetaError::BadVersion {
                key: key.to_owned(),
                expected,
                actual: current.unwrap_or(Version(0)),
            }),
        }
    }

    async fn delete_impl(&self, key: &str, expected: ExpectedVersion) -> Result<(), MetaError> {
        const OP: &str = "delete";
        validate_key(key)?;
        let mut kv = self.client.kv_client();
        let version = match expected {
            ExpectedVersion::Absent => {
                return Err(MetaError::InvalidArgument {
                    reason: "delete cannot expect the key to be absent",
                });
            }
            ExpectedVersion::Any => {
                let response = timeout(ETCD_OP_TIMEOUT, kv.delete(key, None))
                    .await
                    .map_err(|_| timed_out(OP))?
                    .map_err(etcd_error(OP))?;
                if response.deleted() == 0 {
                    return Err(MetaError::NotFound {
                        key: key.to_owned(),
                    });
                }
                return Ok(());
            }
            ExpectedVersion::Is(version) => version,
        };
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key,
                CompareOp::Equal,
                revision_of(version),
            )])
            .and_then([TxnOp::delete(key, None)])
            .or_else([TxnOp::get(key, None)]);
        let response = timeout(ETCD_OP_TIMEOUT, kv.txn(txn))
            .await
            .map_err(|_| timed_out(OP))?
            .map_err(etcd_error(OP))?;
        if response.succeeded() {
            return Ok(());
        }
        Err(self.explain_failed_compare(OP, key, expected, &response.op_responses())?)
    }

    async fn children_impl(&self, path: &str) -> Result<Vec<String>, MetaError> {
        const OP: &str = "children";
        validate_path(path)?;
        let prefix = children_prefix(path);
        let end = prefix_end(&prefix);
        let mut kv = self.client.kv_client();
        let mut names = Vec::new();
        let mut start = prefix.clone().into_bytes();
        // Every page reads the revision of the first: one consistent snapshot.
        let mut revision: Option<i64> = None;
        loop {
            let mut options = GetOptions::new()
                .with_range(end.clone())
                .with_keys_only()
                .with_limit(CHILDREN_PAGE_KEYS);
            if let Some(revision) = revision {
                options = options.with_revision(revision);
            }
            let response = timeout(ETCD_OP_TIMEOUT, kv.get(start.clone(), Some(options)))
                .await
                .map_err(|_| timed_out(OP))?
                .map_err(etcd_error(OP))?;
            if revision.is_none() {
                revision = Some(header_revision(OP, response.header())?);
            }
            for found in response.kvs() {
                // Keys that are not UTF-8 were not written by Vela: not children.
                let Ok(key) = found.key_str() else { continue };
                if let Some(name) = direct_child(&prefix, key) {
                    if names.len() >= CHILDREN_COUNT_MAX {
                        return Err(MetaError::TooManyChildren {
                            parent: path.to_owned(),
                            children_count_max: CHILDREN_COUNT_MAX,
                        });
                    }
                    names.push(name.to_owned());
                }
            }
            match (response.more(), response.kvs().last()) {
                (true, Some(last)) => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => return Ok(names),
            }
        }
    }

    async fn watch_impl(&self, path: &str) -> Result<Watcher, MetaError> {
        validate_path(path)?;
        let slot = Arc::clone(&self.watcher_slots)
            .try_acquire_owned()
            .map_err(|_| MetaError::LimitReached {
                what: "etcd watchers",
                limit: ETCD_WATCHERS_MAX,
            })?;
        let (stream, next_revision) = open_watch(&self.client, path, None).await?;
        let queue = Arc::new(WatchQueue::default());
        let task = tokio::spawn(run_watch(
            self.client.clone(),
            path.to_owned(),
            Arc::clone(&queue),
            stream,
            next_revision,
        ));
        let guard = AbortOnDrop { task, _slot: slot };
        Ok(Watcher::new(path.to_owned(), queue, Some(Box::new(guard))))
    }

    async fn session_impl(&self, ttl: Duration) -> Result<Session, MetaError> {
        const OP: &str = "session";
        let slot = Arc::clone(&self.session_slots)
            .try_acquire_owned()
            .map_err(|_| MetaError::LimitReached {
                what: "etcd sessions",
                limit: ETCD_SESSIONS_MAX,
            })?;
        let ttl_seconds = i64::try_from(ttl.as_millis().div_ceil(1000).max(1)).unwrap_or(i64::MAX);
        let mut lease = self.client.lease_client();
        let granted_at = Instant::now();
        let grant = timeout(ETCD_OP_TIMEOUT, lease.grant(ttl_seconds, None))
            .await
            .map_err(|_| timed_out(OP))?
            .map_err(etcd_error(OP))?;
        let lease_id = grant.id();
        let granted_ttl = Duration::from_secs(u64::try_from(grant.ttl()).unwrap_or(1).max(1));
        let session_id = SessionId(u64::try_from(lease_id).map_err(|_| MetaError::Backend {
            op: OP,
            detail: format!("etcd granted lease id {lease_id}"),
        })?);
        let (state_tx, state_rx) = watch::channel(SessionState::Alive);
        let state_tx = Arc::new(state_tx);
        let task = tokio::spawn(keep_alive(
            self.client.clone(),
            lease_id,
            granted_ttl,
            granted_at,
            Arc::clone(&state_tx),
        ));
        let control = EtcdSessionControl {
            client: self.client.clone(),
            lease_id,
            state: state_tx,
            task: Mutex::new(Some(task)),
            _slot: slot,
        };
        Ok(Session::new(
            session_id,
            granted_ttl,
            self.store_id,
            state_rx,
            Arc::new(control),
        ))
    }

    async fn put_ephemeral_impl(
        &self,
        session: &Session,
        key: &str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> Result<Version, MetaError> {
        validate_key(key)?;
        validate_value(key, value.len())?;
        session.check_usable(self.store_id)?;
        let lease_id = i64::try_from(session.id().0).map_err(|_| MetaError::ForeignSession {
            session: session.id(),
        })?;
        self.put_impl(key, value, expected, Some((lease_id, session.id())))
            .await
    }
}

impl MetadataStore for EtcdStore {
    fn kind(&self) -> BackendKind {
        BackendKind::Etcd
    }

    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<(Bytes, Version)>, MetaError>> {
        Box::pin(self.get_impl(key))
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<Version, MetaError>> {
        Box::pin(async move {
            validate_key(key)?;
            validate_value(key, value.len())?;
            self.put_impl(key, value, expected, None).await
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a str,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<(), MetaError>> {
        Box::pin(self.delete_impl(key, expected))
    }

    fn children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<String>, MetaError>> {
        Box::pin(self.children_impl(path))
    }

    fn watch<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Watcher, MetaError>> {
        Box::pin(self.watch_impl(path))
    }

    fn session(&self, ttl: Duration) -> BoxFuture<'_, Result<Session, MetaError>> {
        Box::pin(self.session_impl(ttl))
    }

    fn put_ephemeral<'a>(
        &'a self,
        session: &'a Session,
        key: &'a str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<Version, MetaError>> {
        Box::pin(self.put_ephemeral_impl(session, key, value, expected))
    }
}

/// Aborts the task feeding a watcher, and frees its slot, when the watcher is
/// dropped.
#[derive(Debug)]
struct AbortOnDrop {
    task: JoinHandle<()>,
    _slot: OwnedSemaphorePermit,
}

impl WatchGuard for AbortOnDrop {}

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// The `op` of the error `open_watch` returns when the start revision is
/// compacted: the caller must watch from now instead (and report `Lagged`).
const WATCH_COMPACTED_OP: &str = "watch from a compacted revision";

/// Creates an etcd watch on `path` and its subtree, from `start_revision` or
/// from now, and waits for etcd to confirm it. Returns the stream and the first
/// revision it will report.
async fn open_watch(
    client: &Client,
    path: &str,
    start_revision: Option<i64>,
) -> Result<(WatchStream, i64), MetaError> {
    const OP: &str = "watch";
    // [path, prefix_end(path)) covers path and path/...; siblings such as
    // `path-x` fall in the range too and are filtered out by `in_subtree`.
    let mut options = WatchOptions::new().with_range(prefix_end(path));
    if let Some(revision) = start_revision {
        options = options.with_start_revision(revision);
    }
    let mut watch_client = client.watch_client();
    let mut stream = timeout(ETCD_OP_TIMEOUT, watch_client.watch(path, Some(options)))
        .await
        .map_err(|_| timed_out(OP))?
        .map_err(etcd_error(OP))?;
    let created = timeout(ETCD_OP_TIMEOUT, stream.message())
        .await
        .map_err(|_| timed_out(OP))?
        .map_err(etcd_error(OP))?;
    match created {
        Some(response) if response.created() && !response.canceled() => {
            let now = header_revision(OP, response.header())?;
            Ok((stream, start_revision.unwrap_or(now + 1)))
        }
        Some(response) if response.compact_revision() > 0 => Err(MetaError::Backend {
            op: WATCH_COMPACTED_OP,
            detail: format!(
                "revision {start_revision:?} is compacted (compact revision {})",
                response.compact_revision()
            ),
        }),
        Some(response) => Err(MetaError::Backend {
            op: OP,
            detail: format!(
                "etcd did not create the watch (canceled {}, compact revision {}, {})",
                response.canceled(),
                response.compact_revision(),
                response.cancel_reason()
            ),
        }),
        None => Err(MetaError::Unavailable {
            op: OP,
            detail: "watch stream closed before it was created".to_owned(),
        }),
    }
}

/// Feeds `queue` from an etcd watch until the watcher is dropped (the task is
/// aborted) or its queue reports the watcher gone.
async fn run_watch(
    client: Client,
    path: String,
    queue: Arc<WatchQueue>,
    stream: WatchStream,
    next_revision: i64,
) {
    let mut stream = Some(stream);
    // The first revision not yet delivered; `None` after a compaction lost events.
    let mut next_revision = Some(next_revision);
    let mut backoff = WATCH_RETRY_BACKOFF_MIN;
    loop {
        let Some(current) = stream.as_mut() else {
            tokio::time::sleep(backoff).await;
            backoff = (backoff * 2).min(WATCH_RETRY_BACKOFF_MAX);
            if queue.is_watcher_dropped() {
                return;
            }
            match open_watch(&client, &path, next_revision).await {
                Ok((reopened, first_revision)) => {
                    if next_revision.is_none() {
                        // Watching from now: tell the consumer to re-read, after
                        // the new watch exists so the re-read misses nothing.
                        next_revision = Some(first_revision);
                        if queue.push(WatchEvent::Lagged) == Pushed::WatcherGone {
                            return;
                        }
                    }
                    tracing::info!(%path, "etcd watch re-established");
                    stream = Some(reopened);
                }
                Err(MetaError::Backend {
                    op: WATCH_COMPACTED_OP,
                    ..
                }) => {
                    tracing::warn!(%path, "etcd compacted past the watch; watching from now");
                    next_revision = None;
                    backoff = WATCH_RETRY_BACKOFF_MIN;
                }
                Err(error) => tracing::warn!(%path, %error, "re-creating etcd watch failed"),
            }
            continue;
        };
        let response = match current.message().await {
            Ok(Some(response)) => response,
            Ok(None) => {
                tracing::warn!(%path, "etcd watch stream ended; re-creating it");
                stream = None;
                continue;
            }
            Err(error) => {
                tracing::warn!(%path, %error, "etcd watch failed; re-creating it");
                stream = None;
                continue;
            }
        };
        if response.canceled() || response.compact_revision() > 0 {
            tracing::warn!(
                %path,
                compact_revision = response.compact_revision(),
                reason = response.cancel_reason(),
                "etcd canceled the watch; watching from now, the watcher must re-read"
            );
            if response.compact_revision() > 0 {
                next_revision = None;
            }
            stream = None;
            backoff = WATCH_RETRY_BACKOFF_MIN;
            continue;
        }
        backoff = WATCH_RETRY_BACKOFF_MIN;
        for event in response.events() {
            let Some(kv) = event.kv() else { continue };
            next_revision = Some(kv.mod_revision() + 1);
            let Ok(key) = kv.key_str() else { continue };
            if !in_subtree(&path, key) {
                continue;
            }
            let watch_event = match event.event_type() {
                EventType::Put => match version_of("watch", kv.mod_revision()) {
                    Ok(version) => WatchEvent::Put {
                        key: key.to_owned(),
                        version,
                    },
                    Err(_) => continue,
                },
                EventType::Delete => WatchEvent::Delete {
                    key: key.to_owned(),
                },
            };
            if queue.push(watch_event) == Pushed::WatcherGone {
                return;
            }
        }
    }
}

/// Keeps lease `lease_id` alive until it is lost, then publishes `Expired`.
/// Aborted by `close` (and by dropping the session handle).
async fn keep_alive(
    client: Client,
    lease_id: i64,
    ttl: Duration,
    granted_at: Instant,
    state: Arc<watch::Sender<SessionState>>,
) {
    let interval = ttl / KEEPALIVES_PER_TTL;
    // When the last keep-alive that etcd acknowledged was *sent*: etcd's own
    // deadline is no earlier than this plus the TTL.
    let mut acknowledged_sent_at = granted_at;
    let mut channel = None;
    loop {
        tokio::time::sleep(interval).await;
        if Instant::now() >= acknowledged_sent_at + ttl {
            break;
        }
        if channel.is_none() {
            let mut lease = client.lease_client();
            match timeout(interval, lease.keep_alive(lease_id)).await {
                Ok(Ok(pair)) => channel = Some(pair),
                Ok(Err(error)) if is_lease_not_found(&error) => break,
                Ok(Err(error)) => {
                    tracing::warn!(lease = lease_id, %error, "etcd keep-alive stream failed");
                    continue;
                }
                Err(_) => continue,
            }
        }
        let Some((keeper, responses)) = channel.as_mut() else {
            continue;
        };
        let sent_at = Instant::now();
        let answer = timeout(interval, async {
            keeper.keep_alive().await?;
            responses.message().await
        })
        .await;
        match answer {
            Ok(Ok(Some(response))) if response.ttl() > 0 => acknowledged_sent_at = sent_at,
            Ok(Ok(Some(_))) => break,
            Ok(Err(error)) if is_lease_not_found(&error) => break,
            Ok(Ok(None)) | Ok(Err(_)) | Err(_) => channel = None,
        }
    }
    tracing::warn!(lease = lease_id, ?ttl, "etcd session expired");
    // Tell the holder first: it must stop acting as owner now.
    state.send_if_modified(|s| {
        if *s == SessionState::Alive {
            *s = SessionState::Expired;
            true
        } else {
            false
        }
    });
    // Best effort: if etcd still holds the lease (a leader change refreshes
    // lease deadlines), drop it now so its keys go with the holder's belief.
    let mut lease = client.lease_client();
    let _ = timeout(ETCD_OP_TIMEOUT, lease.revoke(lease_id)).await;
}

struct EtcdSessionControl {
    client: Client,
    lease_id: i64,
    state: Arc<watch::Sender<SessionState>>,
    task: Mutex<Option<JoinHandle<()>>>,
    _slot: OwnedSemaphorePermit,
}

impl fmt::Debug for EtcdSessionControl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EtcdSessionControl")
            .field("lease_id", &self.lease_id)
            .field("state", &*self.state.borrow())
            .finish()
    }
}

impl EtcdSessionControl {
    fn stop_keep_alive(&self) {
        let task = self
            .task
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
            .take();
        if let Some(task) = task {
            task.abort();
        }
    }
}

impl SessionControl for EtcdSessionControl {
    fn close(&self, _id: SessionId) -> BoxFuture<'_, Result<(), MetaError>> {
        Box::pin(async move {
            self.stop_keep_alive();
            let mut lease = self.client.lease_client();
            let result = timeout(ETCD_OP_TIMEOUT, lease.revoke(self.lease_id)).await;
            // Closed either way: nothing keeps the lease alive any more, so etcd
            // drops it within the TTL even if the revoke did not arrive.
            self.state.send_replace(SessionState::Closed);
            match result {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(error)) if is_lease_not_found(&error) => Ok(()),
                Ok(Err(error)) => Err(etcd_error("close session")(error)),
                Err(_) => Err(timed_out("close session")),
            }
        })
    }

    fn abandon(&self, _id: SessionId) {
        self.stop_keep_alive();
    }
}
