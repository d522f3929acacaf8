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
use std::future::Future;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use futures::Stream;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc, watch};
use tokio::task::JoinHandle;
use tokio::time::{Instant, timeout};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status, Streaming};

use crate::error::MetaError;
use crate::key::{
    CHILDREN_COUNT_MAX, children_prefix, direct_child, in_subtree, prefix_end, validate_key,
    validate_path, validate_value,
};
use crate::local::next_store_id;
use crate::session::{Session, SessionControl, SessionId, SessionState};
use crate::store::{BackendKind, BoxFuture, ExpectedVersion, MetadataStore, Version, WatchEvent};
use crate::watch::{Pushed, WatchGuard, WatchQueue, Watcher};

/// Messages and clients generated from `proto/etcd.proto` by `build.rs`.
#[allow(
    clippy::all,
    clippy::pedantic,
    unreachable_pub,
    missing_debug_implementations
)]
mod pb {
    tonic::include_proto!("etcdserverpb");
}

use pb::compare::{CompareResult, CompareTarget, TargetUnion};
use pb::kv_client::KvClient;
use pb::lease_client::LeaseClient;
use pb::watch_client::WatchClient;
use pb::{
    Compare, DeleteRangeRequest, LeaseGrantRequest, LeaseKeepAliveRequest, LeaseKeepAliveResponse,
    LeaseRevokeRequest, PutRequest, RangeRequest, RequestOp, ResponseHeader, ResponseOp,
    TxnRequest, WatchCreateRequest, WatchRequest, WatchResponse, event, request_op, response_op,
    watch_request,
};

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

/// Requests queued on one client-to-etcd stream. A watch stream carries its
/// create request only; a keep-alive stream one request per round trip (the
/// next is sent after the answer to the last). When full: the stream is
/// broken and re-created.
const STREAM_REQUESTS_QUEUED_MAX: usize = 1;

/// The gRPC connection to etcd, balanced over the endpoints. Cheap to clone:
/// clones share the connections.
#[derive(Clone)]
struct Client {
    channel: Channel,
}

impl Client {
    /// Endpoints are connected lazily, on first use, and again after a failure.
    fn new(endpoints: &[String]) -> Result<Self, MetaError> {
        let mut list = Vec::with_capacity(endpoints.len());
        for url in endpoints {
            let endpoint = Endpoint::from_shared(url.clone())
                .map_err(|error| MetaError::BadUrl {
                    url: url.clone(),
                    reason: error.to_string(),
                })?
                .timeout(ETCD_OP_TIMEOUT)
                .connect_timeout(ETCD_CONNECT_TIMEOUT);
            list.push(endpoint);
        }
        Ok(Self {
            channel: Channel::balance_list(list.into_iter()),
        })
    }

    fn kv(&self) -> KvClient<Channel> {
        KvClient::new(self.channel.clone())
    }

    fn watch(&self) -> WatchClient<Channel> {
        WatchClient::new(self.channel.clone())
    }

    fn lease(&self) -> LeaseClient<Channel> {
        LeaseClient::new(self.channel.clone())
    }
}

/// The request side of a gRPC stream: what is sent into `sender` goes to etcd,
/// and the stream stays open until the sender is dropped.
fn request_stream<T: Send + 'static>(
    first: T,
) -> (mpsc::Sender<T>, impl Stream<Item = T> + Send + 'static) {
    let (sender, receiver) = mpsc::channel(STREAM_REQUESTS_QUEUED_MAX);
    // Cannot fail: the channel is new and has room for one.
    let _ = sender.try_send(first);
    let stream = futures::stream::unfold(receiver, |mut receiver| async move {
        receiver.recv().await.map(|request| (request, receiver))
    });
    (sender, stream)
}

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

fn etcd_error(op: &'static str) -> impl Fn(Status) -> MetaError {
    move |status| {
        // A broken connection comes back as Unavailable (or Unknown), like
        // etcd's own transient answers.
        let transient = matches!(
            status.code(),
            Code::Cancelled
                | Code::Unknown
                | Code::DeadlineExceeded
                | Code::ResourceExhausted
                | Code::Aborted
                | Code::Unavailable
        );
        let detail = format!("{:?}: {}", status.code(), status.message());
        if transient {
            MetaError::Unavailable { op, detail }
        } else {
            MetaError::Backend { op, detail }
        }
    }
}

fn is_lease_not_found(status: &Status) -> bool {
    status.code() == Code::NotFound
}

fn timed_out(op: &'static str) -> MetaError {
    MetaError::Unavailable {
        op,
        detail: format!("no answer within {ETCD_OP_TIMEOUT:?}"),
    }
}

/// One call with the request timeout: the outer error is the timeout, the
/// inner one etcd's (or the connection's) answer.
async fn timed<T>(
    op: &'static str,
    call: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<Result<T, Status>, MetaError> {
    timeout(ETCD_OP_TIMEOUT, call)
        .await
        .map(|answer| answer.map(tonic::Response::into_inner))
        .map_err(|_| timed_out(op))
}

/// One unary call with the request timeout and etcd's errors typed.
async fn unary<T>(
    op: &'static str,
    call: impl Future<Output = Result<tonic::Response<T>, Status>>,
) -> Result<T, MetaError> {
    timed(op, call).await?.map_err(etcd_error(op))
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

fn header_revision(op: &'static str, header: Option<&ResponseHeader>) -> Result<i64, MetaError> {
    header.map(|h| h.revision).ok_or(MetaError::Backend {
        op,
        detail: "etcd response without a header".to_owned(),
    })
}

fn revision_of(version: Version) -> i64 {
    // Versions we hand out come from etcd's i64 revisions; anything larger can
    // never match, and i64::MAX never matches a real revision either.
    i64::try_from(version.0).unwrap_or(i64::MAX)
}

fn range_of(key: &str) -> RangeRequest {
    RangeRequest {
        key: key.as_bytes().to_vec(),
        ..RangeRequest::default()
    }
}

fn put_of(key: &str, value: &Bytes, lease_id: i64) -> PutRequest {
    PutRequest {
        key: key.as_bytes().to_vec(),
        value: value.to_vec(),
        lease: lease_id,
    }
}

/// The compare of a create: the key has no create revision (does not exist).
fn compare_absent(key: &str) -> Compare {
    Compare {
        result: CompareResult::Equal.into(),
        target: CompareTarget::Create.into(),
        key: key.as_bytes().to_vec(),
        target_union: Some(TargetUnion::CreateRevision(0)),
    }
}

/// The compare of an update: the key was last modified at `revision`.
fn compare_modified_at(key: &str, revision: i64) -> Compare {
    Compare {
        result: CompareResult::Equal.into(),
        target: CompareTarget::Mod.into(),
        key: key.as_bytes().to_vec(),
        target_union: Some(TargetUnion::ModRevision(revision)),
    }
}

fn txn_op(request: request_op::Request) -> RequestOp {
    RequestOp {
        request: Some(request),
    }
}

/// A txn that runs `then` if `compare` holds, else reads `key` (so a failure
/// can say why).
fn txn_else_read(compare: Compare, then: request_op::Request, key: &str) -> TxnRequest {
    TxnRequest {
        compare: vec![compare],
        success: vec![txn_op(then)],
        failure: vec![txn_op(request_op::Request::RequestRange(range_of(key)))],
    }
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
        let store = Self {
            client: Client::new(&endpoints)?,
            endpoints,
            store_id: next_store_id(),
            watcher_slots: Arc::new(Semaphore::new(ETCD_WATCHERS_MAX)),
            session_slots: Arc::new(Semaphore::new(ETCD_SESSIONS_MAX)),
        };
        // Fail now, naming the endpoints, rather than at the first real call.
        let probe = RangeRequest {
            keys_only: true,
            ..range_of("/")
        };
        unary("connect", store.client.kv().range(probe))
            .await
            .map_err(|error| match error {
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
        let response = unary("get", self.client.kv().range(range_of(key))).await?;
        match response.kvs.into_iter().next() {
            Some(found) => {
                let version = version_of("get", found.mod_revision)?;
                Ok(Some((Bytes::from(found.value), version)))
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
        let map_error = |status: Status| match lease {
            Some((_, session)) if is_lease_not_found(&status) => {
                MetaError::SessionExpired { session }
            }
            _ => etcd_error(OP)(status),
        };
        let put = put_of(key, &value, lease.map_or(0, |(id, _)| id));
        let compare = match expected {
            ExpectedVersion::Any => {
                let response = timed(OP, self.client.kv().put(put))
                    .await?
                    .map_err(map_error)?;
                return version_of(OP, header_revision(OP, response.header.as_ref())?);
            }
            ExpectedVersion::Absent => compare_absent(key),
            ExpectedVersion::Is(version) => compare_modified_at(key, revision_of(version)),
        };
        let txn = txn_else_read(compare, request_op::Request::RequestPut(put), key);
        let response = timed(OP, self.client.kv().txn(txn))
            .await?
            .map_err(map_error)?;
        if response.succeeded {
            return version_of(OP, header_revision(OP, response.header.as_ref())?);
        }
        Err(self.explain_failed_compare(OP, key, expected, &response.responses)?)
    }

    /// The typed error for a txn whose compare failed; its else-branch read `key`.
    fn explain_failed_compare(
        &self,
        op: &'static str,
        key: &str,
        expected: ExpectedVersion,
        responses: &[ResponseOp],
    ) -> Result<MetaError, MetaError> {
        let current = match responses.first().and_then(|r| r.response.as_ref()) {
            Some(response_op::Response::ResponseRange(range)) => match range.kvs.first() {
                Some(found) => Some(version_of(op, found.mod_revision)?),
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
        let delete = DeleteRangeRequest {
            key: key.as_bytes().to_vec(),
            range_end: Vec::new(),
        };
        let version = match expected {
            ExpectedVersion::Absent => {
                return Err(MetaError::InvalidArgument {
                    reason: "delete cannot expect the key to be absent",
                });
            }
            ExpectedVersion::Any => {
                let response = unary(OP, self.client.kv().delete_range(delete)).await?;
                if response.deleted == 0 {
                    return Err(MetaError::NotFound {
                        key: key.to_owned(),
                    });
                }
                return Ok(());
            }
            ExpectedVersion::Is(version) => version,
        };
        let txn = txn_else_read(
            compare_modified_at(key, revision_of(version)),
            request_op::Request::RequestDeleteRange(delete),
            key,
        );
        let response = unary(OP, self.client.kv().txn(txn)).await?;
        if response.succeeded {
            return Ok(());
        }
        Err(self.explain_failed_compare(OP, key, expected, &response.responses)?)
    }

    async fn children_impl(&self, path: &str) -> Result<Vec<String>, MetaError> {
        const OP: &str = "children";
        validate_path(path)?;
        let prefix = children_prefix(path);
        let end = prefix_end(&prefix);
        let mut names = Vec::new();
        let mut start = prefix.clone().into_bytes();
        // Every page reads the revision of the first: one consistent snapshot.
        let mut revision: Option<i64> = None;
        loop {
            let page = RangeRequest {
                key: start.clone(),
                range_end: end.clone(),
                limit: CHILDREN_PAGE_KEYS,
                revision: revision.unwrap_or(0),
                keys_only: true,
            };
            let response = unary(OP, self.client.kv().range(page)).await?;
            if revision.is_none() {
                revision = Some(header_revision(OP, response.header.as_ref())?);
            }
            for found in &response.kvs {
                // Keys that are not UTF-8 were not written by Vela: not children.
                let Ok(key) = std::str::from_utf8(&found.key) else {
                    continue;
                };
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
            match (response.more, response.kvs.last()) {
                (true, Some(last)) => {
                    start = last.key.clone();
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
        let granted_at = Instant::now();
        let request = LeaseGrantRequest {
            ttl: ttl_seconds,
            id: 0,
        };
        let grant = unary(OP, self.client.lease().lease_grant(request)).await?;
        if !grant.error.is_empty() {
            return Err(MetaError::Backend {
                op: OP,
                detail: grant.error,
            });
        }
        let lease_id = grant.id;
        let granted_ttl = Duration::from_secs(u64::try_from(grant.ttl).unwrap_or(1).max(1));
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

/// An open etcd watch: its events, and the request side that keeps it open
/// (etcd ends a watch stream when the client closes its side).
struct WatchStream {
    responses: Streaming<WatchResponse>,
    _requests: mpsc::Sender<WatchRequest>,
}

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
    let create = WatchCreateRequest {
        key: path.as_bytes().to_vec(),
        range_end: prefix_end(path),
        start_revision: start_revision.unwrap_or(0),
    };
    let (requests, request_stream) = request_stream(WatchRequest {
        request_union: Some(watch_request::RequestUnion::CreateRequest(create)),
    });
    let responses = unary(OP, client.watch().watch(request_stream)).await?;
    let mut stream = WatchStream {
        responses,
        _requests: requests,
    };
    let created = timeout(ETCD_OP_TIMEOUT, stream.responses.message())
        .await
        .map_err(|_| timed_out(OP))?
        .map_err(etcd_error(OP))?;
    match created {
        Some(response) if response.created && !response.canceled => {
            let now = header_revision(OP, response.header.as_ref())?;
            Ok((stream, start_revision.unwrap_or(now + 1)))
        }
        Some(response) if response.compact_revision > 0 => Err(MetaError::Backend {
            op: WATCH_COMPACTED_OP,
            detail: format!(
                "revision {start_revision:?} is compacted (compact revision {})",
                response.compact_revision
            ),
        }),
        Some(response) => Err(MetaError::Backend {
            op: OP,
            detail: format!(
                "etcd did not create the watch (canceled {}, compact revision {}, {})",
                response.canceled, response.compact_revision, response.cancel_reason
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
        let response = match current.responses.message().await {
            Ok(Some(response)) => response,
            Ok(None) => {
                tracing::warn!(%path, "etcd watch stream ended; re-creating it");
                stream = None;
                continue;
            }
            Err(status) => {
                let error = etcd_error("watch")(status);
                tracing::warn!(%path, %error, "etcd watch failed; re-creating it");
                stream = None;
                continue;
            }
        };
        if response.canceled || response.compact_revision > 0 {
            tracing::warn!(
                %path,
                compact_revision = response.compact_revision,
                reason = response.cancel_reason,
                "etcd canceled the watch; watching from now, the watcher must re-read"
            );
            if response.compact_revision > 0 {
                next_revision = None;
            }
            stream = None;
            backoff = WATCH_RETRY_BACKOFF_MIN;
            continue;
        }
        backoff = WATCH_RETRY_BACKOFF_MIN;
        for event in &response.events {
            let Some(kv) = event.kv.as_ref() else {
                continue;
            };
            next_revision = Some(kv.mod_revision + 1);
            let Ok(key) = std::str::from_utf8(&kv.key) else {
                continue;
            };
            if !in_subtree(&path, key) {
                continue;
            }
            let watch_event = match event.r#type() {
                event::EventType::Put => match version_of("watch", kv.mod_revision) {
                    Ok(version) => WatchEvent::Put {
                        key: key.to_owned(),
                        version,
                    },
                    Err(_) => continue,
                },
                event::EventType::Delete => WatchEvent::Delete {
                    key: key.to_owned(),
                },
            };
            if queue.push(watch_event) == Pushed::WatcherGone {
                return;
            }
        }
    }
}

/// An open keep-alive stream of one lease: one request, then its answer.
struct KeepAliveStream {
    requests: mpsc::Sender<LeaseKeepAliveRequest>,
    responses: Streaming<LeaseKeepAliveResponse>,
}

/// Sends one keep-alive for `lease_id` on `channel` (opened first if there is
/// none) and waits for its answer.
async fn renew_lease(
    client: &Client,
    channel: &mut Option<KeepAliveStream>,
    lease_id: i64,
) -> Result<Option<LeaseKeepAliveResponse>, Status> {
    let request = LeaseKeepAliveRequest { id: lease_id };
    let open = match channel {
        Some(open) => {
            open.requests
                .try_send(request)
                .map_err(|_| Status::unavailable("keep-alive stream closed or busy"))?;
            open
        }
        None => {
            // The first request goes out with the stream: etcd answers the
            // stream's headers only once it has something to say.
            let (requests, request_stream) = request_stream(request);
            let responses = client
                .lease()
                .lease_keep_alive(request_stream)
                .await?
                .into_inner();
            channel.insert(KeepAliveStream {
                requests,
                responses,
            })
        }
    };
    open.responses.message().await
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
        let sent_at = Instant::now();
        let answer = timeout(interval, renew_lease(&client, &mut channel, lease_id)).await;
        match answer {
            // A TTL of 0 or less: etcd no longer knows the lease.
            Ok(Ok(Some(response))) if response.ttl > 0 => acknowledged_sent_at = sent_at,
            Ok(Ok(Some(_))) => break,
            Ok(Err(status)) if is_lease_not_found(&status) => break,
            Ok(Err(status)) => {
                let error = etcd_error("keep-alive")(status);
                tracing::warn!(lease = lease_id, %error, "etcd keep-alive stream failed");
                channel = None;
            }
            Ok(Ok(None)) | Err(_) => channel = None,
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
    let _ = timed(
        "revoke",
        client
            .lease()
            .lease_revoke(LeaseRevokeRequest { id: lease_id }),
    )
    .await;
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
            let revoke = LeaseRevokeRequest { id: self.lease_id };
            let result = timed("close session", self.client.lease().lease_revoke(revoke)).await;
            // Closed either way: nothing keeps the lease alive any more, so etcd
            // drops it within the TTL even if the revoke did not arrive.
            self.state.send_replace(SessionState::Closed);
            match result? {
                Ok(_) => Ok(()),
                Err(status) if is_lease_not_found(&status) => Ok(()),
                Err(status) => Err(etcd_error("close session")(status)),
            }
        })
    }

    fn abandon(&self, _id: SessionId) {
        self.stop_keep_alive();
    }
}
