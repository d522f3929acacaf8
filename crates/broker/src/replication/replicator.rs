//! One replicator: a topic's log, read from its durable cursor
//! `pulsar.repl.{remote}`, produced to the same topic of the remote cluster
//! by a producer named `pulsar.repl.{local}-->{remote}` (Pulsar's names).
//!
//! Owns: its task, its producer on the remote, the entries in flight (at
//! most `REPLICATOR_PENDING_MAX`, each holding its bytes of the broker-wide
//! budget until the remote stored it).
//! Guarantees: entries reach the remote in log order, each as stored here
//! (key, properties, event and publish time, batches as they are) plus
//! `replicated_from = {local}` and the property
//! `__MSG_PROP_REPL_SOURCE_POSITION = ledger:entry`; the cursor moves past
//! an entry only after the remote stored it (or the entry is not to be
//! replicated), in order, so a restart resends from the first entry not
//! known stored; each SEND carries the entry's position as its sequence id
//! (`topic::replicated_sequence_id`), which the remote's deduplication of
//! replicator producers uses to drop the resends: exactly once.
//! Skipped (acknowledged, not sent): entries that came from another cluster
//! (`replicated_from`: never sent back), entries whose `replicate_to`
//! leaves the remote out, markers other than this cluster's
//! replicated-subscription requests, responses and updates (which are
//! sent), entries whose metadata does not parse, entries of aborted
//! transactions. Replicated-subscription markers that came from this
//! replicator's remote are handed to the topic's snapshot controller
//! (`snapshots`) as they are read, then skipped. Transactions: as Pulsar's replicators
//! read up to `maxReadPosition`, nothing at or after the topic buffer's read
//! limit (the first entry of its oldest open transaction) is sent until
//! the limit moves; a committed transaction's entries go without their
//! transaction id.
//! Rate: the topic's `replicatorDispatchRate` (`rate`), asked before each
//! entry sent; past it the replicator waits for a token (entries wait in
//! the log).
//! Schemas: an entry with a schema version goes with the remote's version
//! of the same schema, registered there first (GET_OR_CREATE_SCHEMA);
//! `SCHEMA_VERSIONS_CACHED_MAX` versions remembered.
//! Partitions: a partition's replicator first makes the partitioned
//! topic's metadata on the remote (its admin API, `remote_admin`), as
//! Pulsar creates it on every replication cluster.
//! Reconnects: the client reconnects and resends a producer's pending
//! entries by itself; a producer that cannot be created or fails is
//! replaced after a back-off from `BACKOFF_MIN` doubling to `BACKOFF_MAX`
//! (Pulsar's 100 ms to 1 min), resending from the cursor.
//! Never: holds a lock across an await, sends an entry out of order, or
//! waits for budget while receipts are pending unprocessed.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, watch};
use tokio::task::JoinHandle;
use vela_client::{Client, ProducerOptions, SendFuture};
use vela_log::{Cursor, LogEntry, LogError, ManagedLog, Position};
use vela_wire::proto::{KeyValue, MessageMetadata};

use super::rate::ReplicatorRate;
use super::remote_admin::{Created, RemoteAdmin};
use super::snapshots::Controller;
use crate::codec::{self, REPL_SOURCE_POSITION_PROPERTY};
use crate::markers::{self, ReadMarker};
use crate::stats::ReplicatorStats;
use crate::topic::{Topic, replicated_sequence_id, replicator_producer_name};
use crate::txn_buffer::TxnBuffer;

/// Entries one replicator has sent and not yet seen stored (Pulsar's
/// `replicationProducerQueueSize`, 1000). When reached: it reads no more
/// until receipts come back.
pub(crate) const REPLICATOR_PENDING_MAX: usize = 1000;

/// Entries per read of the log (Pulsar's replicator reads 100 at a time).
const READ_ENTRIES_MAX: usize = 100;

/// Bytes per read of the log (about; at least one entry is read).
const READ_BYTES_MAX: usize = 4 << 20;

/// First pause before replacing a failed producer; doubles up to
/// `BACKOFF_MAX` (Pulsar's replicator back-off: 100 ms to 1 min).
const BACKOFF_MIN: Duration = Duration::from_millis(100);
const BACKOFF_MAX: Duration = Duration::from_secs(60);

/// A producer that worked this long resets the back-off.
const BACKOFF_RESET_AFTER: Duration = Duration::from_secs(10);

/// How long closing the remote producer may take before it is dropped
/// (its connection's end closes it on the remote).
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);

/// Pause when the broker-wide budget is full and this replicator has
/// nothing in flight to wait for.
const BUDGET_RETRY: Duration = Duration::from_millis(10);

/// What a replicator needs.
pub(super) struct Context {
    pub(super) topic: Arc<Topic>,
    pub(super) local: String,
    pub(super) remote: String,
    pub(super) client: Client,
    pub(super) cursor: Arc<Cursor>,
    pub(super) budget: Arc<Semaphore>,
    pub(super) stats: Arc<ReplicatorStats>,
    /// The topic's snapshot controller: replicated-subscription markers
    /// that came from this replicator's remote are handed to it.
    pub(super) controller: Arc<Controller>,
    /// The remote's admin API (`None`: its record names none).
    pub(super) remote_admin: Option<Arc<RemoteAdmin>>,
    /// The topic is a partition of a partitioned topic of this many
    /// partitions: the remote gets the same partitioned metadata first.
    pub(super) partitions: Option<u32>,
    /// The service (its schema registry: entries' schemas are registered
    /// on the remote before they go).
    pub(super) service: std::sync::Weak<crate::service::Service>,
}

/// A running replicator.
pub(super) struct Replicator {
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

impl Replicator {
    pub(super) fn start(context: Context) -> Replicator {
        let (stop, stopped) = watch::channel(false);
        let task = tokio::spawn(run(context, stopped));
        Replicator { stop, task }
    }

    /// True once its task ended by itself (its log closed).
    pub(super) fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Tells it to stop (it closes its producer, waiting at most
    /// `CLOSE_TIMEOUT`); `join` waits for that. Several are told first and
    /// joined after, so stopping many takes as long as the slowest.
    pub(super) fn signal_stop(&self) {
        let _ = self.stop.send(true);
    }

    /// Waits for its task to end (after `signal_stop`).
    pub(super) async fn join(self) {
        let _ = self.task.await;
    }
}

/// Why replication from one producer ended.
#[derive(Debug, thiserror::Error)]
enum Ended {
    #[error("stopped")]
    Stopped,
    #[error("log: {0}")]
    Log(#[from] LogError),
    #[error("remote: {0}")]
    Remote(#[from] vela_client::ClientError),
    #[error("position {0} does not fit a replication sequence id")]
    Unreplicable(Position),
    #[error("schema: {0}")]
    Schema(String),
}

/// Local schema versions whose remote version a replicator remembers.
/// When reached: forgotten all at once (asked again, one request each).
const SCHEMA_VERSIONS_CACHED_MAX: usize = 100;

async fn run(context: Context, mut stop: watch::Receiver<bool>) {
    let name = replicator_producer_name(&context.local, &context.remote);
    let mut backoff = BACKOFF_MIN;
    let mut metadata_ensured = context.partitions.is_none() || context.remote_admin.is_none();
    loop {
        if *stop.borrow() || context.topic.log.is_closed() {
            return;
        }
        // The backlog shows while the remote cannot be reached too.
        context
            .stats
            .backlog_entries
            .store(context.cursor.backlog_entries(), Ordering::Relaxed);
        if !metadata_ensured {
            metadata_ensured = tokio::select! {
                ensured = ensure_partitioned(&context) => ensured,
                _ = stop.changed() => return,
            };
        }
        let options = ProducerOptions {
            name: Some(name.clone()),
            batching: None,
            max_pending_messages: REPLICATOR_PENDING_MAX,
            block_if_queue_full: true,
            send_timeout: None,
            ..ProducerOptions::default()
        };
        let created = tokio::select! {
            created = context.client.create_producer(&context.topic.full_name, options) => created,
            _ = stop.changed() => return,
        };
        match created {
            Ok(producer) => {
                let since = Instant::now();
                context.stats.connected.store(true, Ordering::Relaxed);
                let ended = replicate(&context, &producer, &mut stop).await;
                context.stats.connected.store(false, Ordering::Relaxed);
                let _ = tokio::time::timeout(CLOSE_TIMEOUT, producer.close()).await;
                match ended {
                    Ended::Stopped => return,
                    error => tracing::warn!(
                        topic = %context.topic.full_name, remote = %context.remote, %error,
                        "replication interrupted; resuming from the cursor"
                    ),
                }
                if since.elapsed() >= BACKOFF_RESET_AFTER {
                    backoff = BACKOFF_MIN;
                }
            }
            Err(error) => tracing::warn!(
                topic = %context.topic.full_name, remote = %context.remote, %error,
                retry_in = ?backoff, "replication producer not created"
            ),
        }
        tokio::select! {
            _ = tokio::time::sleep(backoff) => {}
            _ = stop.changed() => return,
        }
        backoff = (backoff * 2).min(BACKOFF_MAX);
    }
}

/// The remote's version of the schema an entry names (`local`, this
/// cluster's version), registering it there first (GET_OR_CREATE_SCHEMA,
/// as Pulsar's replicator producer does); `None` when this cluster has no
/// such version (the entry goes as stored).
async fn remote_schema_version(
    context: &Context,
    known: &mut HashMap<u64, Bytes>,
    local: &[u8],
) -> Result<Option<Bytes>, Ended> {
    let Some(version) = crate::schema::decode_version(local) else {
        return Ok(None);
    };
    if let Some(remote) = known.get(&version) {
        return Ok(Some(remote.clone()));
    }
    let Some(service) = context.service.upgrade() else {
        return Err(Ended::Stopped);
    };
    let schema = match service
        .schemas
        .get(&context.topic.name, Some(version))
        .await
    {
        Ok(Some((_, schema))) => schema,
        Ok(None) => return Ok(None),
        Err(error) => return Err(Ended::Schema(error.to_string())),
    };
    let remote = Bytes::from(
        context
            .client
            .get_or_create_schema(&context.topic.full_name, schema)
            .await?,
    );
    if known.len() >= SCHEMA_VERSIONS_CACHED_MAX {
        known.clear();
    }
    known.insert(version, remote.clone());
    Ok(Some(remote))
}

/// Creates the partitioned topic's metadata on the remote (as Pulsar
/// does for each replication cluster); true once it is there (with the
/// same partitions or another count, which is reported).
async fn ensure_partitioned(context: &Context) -> bool {
    let (Some(admin), Some(partitions)) = (&context.remote_admin, context.partitions) else {
        return true;
    };
    let base = context.topic.name.base();
    match admin.ensure_partitioned(&base, partitions).await {
        Ok(Created::Same) => true,
        Ok(Created::Other(there)) => {
            tracing::warn!(topic = %base, remote = %context.remote, partitions, there,
                "the remote's partitioned topic has another partition count");
            true
        }
        Err(error) => {
            tracing::warn!(topic = %base, remote = %context.remote, %error,
                "partitioned metadata not created on the remote; retried with the producer");
            false
        }
    }
}

/// An entry taken from the log, sent or skipped, not yet acknowledged.
struct InFlight {
    position: Position,
    /// `None`: skipped (acknowledged as soon as everything before it is).
    send: Option<SendFuture>,
    messages: u64,
    bytes: u64,
    publish_time_ms: u64,
    _budget: Option<OwnedSemaphorePermit>,
}

/// What to do with an entry.
enum Prepared {
    Skip,
    /// A replicated-subscription marker from the remote: handed to the
    /// controller, then acknowledged like a skipped entry.
    Received(ReadMarker),
    Send {
        sequence_id: i64,
        /// Boxed: far larger than `Skip`.
        metadata: Box<MessageMetadata>,
        payload: Bytes,
    },
}

/// Sends the log from the cursor until stopped or something fails.
async fn replicate(
    context: &Context,
    producer: &vela_client::Producer,
    stop: &mut watch::Receiver<bool>,
) -> Ended {
    let log = &context.topic.log;
    let mut next = match context.cursor.mark_delete_position() {
        Some(acked) => log.next_position(acked),
        None => log.first_position().unwrap_or(Position::new(0, 0)),
    };
    let mut in_flight: VecDeque<InFlight> = VecDeque::new();
    let mut unsent: VecDeque<LogEntry> = VecDeque::new();
    let buffer = context.topic.txn_buffer();
    let mut limit_changes = buffer.map(|b| b.subscribe());
    let mut rate = ReplicatorRate::default();
    let mut schema_versions: HashMap<u64, Bytes> = HashMap::new();
    loop {
        // Send what was read, within the window, the budget, the
        // replicator dispatch rate and the transaction buffer's read limit.
        rate.refresh(context.topic.dispatch_policy());
        let mut rate_wait = None;
        let mut at_txn_limit = false;
        while in_flight.len() < REPLICATOR_PENDING_MAX {
            let Some(entry) = unsent.front() else {
                break;
            };
            let gate = txn_gate(buffer.map(|b| &**b), entry);
            if gate == TxnGate::Wait {
                at_txn_limit = true;
                break;
            }
            let prepared = if gate == TxnGate::Skip {
                Ok(Prepared::Skip)
            } else {
                prepare(context, entry)
            };
            let item = match prepared {
                Err(ended) => return ended,
                Ok(Prepared::Skip) => skipped(entry.position),
                Ok(Prepared::Received(marker)) => {
                    context
                        .controller
                        .received(&context.remote, marker, entry.position);
                    skipped(entry.position)
                }
                Ok(Prepared::Send {
                    sequence_id,
                    mut metadata,
                    payload,
                }) => {
                    let sequence_id = sequence_id as u64;
                    if sequence_id < producer.next_sequence_id() {
                        // The remote said it stored it already.
                        skipped(entry.position)
                    } else {
                        if let Some(wait) = rate.wait() {
                            rate_wait = Some(wait);
                            break;
                        }
                        let bytes = entry.data.len();
                        let permits = u32::try_from(bytes.max(1)).unwrap_or(u32::MAX);
                        let Ok(budget) =
                            Arc::clone(&context.budget).try_acquire_many_owned(permits)
                        else {
                            break;
                        };
                        if let Some(local) = metadata.schema_version.clone() {
                            match remote_schema_version(context, &mut schema_versions, &local).await
                            {
                                Ok(Some(remote)) => metadata.schema_version = Some(remote),
                                Ok(None) => {}
                                Err(ended) => return ended,
                            }
                        }
                        let messages = metadata.num_messages_in_batch.unwrap_or(1).max(1) as u64;
                        let publish_time_ms = metadata.publish_time;
                        let sent = producer.send_entry(sequence_id, *metadata, payload).await;
                        rate.charge(messages, bytes as u64);
                        match sent {
                            Ok(send) => InFlight {
                                position: entry.position,
                                send: Some(send),
                                messages,
                                bytes: bytes as u64,
                                publish_time_ms,
                                _budget: Some(budget),
                            },
                            Err(error) => return error.into(),
                        }
                    }
                }
            };
            in_flight.push_back(item);
            unsent.pop_front();
        }
        // Acknowledge, in order, what needs no receipt.
        while in_flight.front().is_some_and(|f| f.send.is_none()) {
            if let Some(done) = in_flight.pop_front()
                && let Err(error) = settle(context, done)
            {
                return error;
            }
        }
        let waiting_receipt = in_flight.front().is_some();
        let may_read = unsent.is_empty() && in_flight.len() < REPLICATOR_PENDING_MAX;
        let budget_full =
            !unsent.is_empty() && !waiting_receipt && !at_txn_limit && rate_wait.is_none();
        tokio::select! {
            biased;
            _ = stop.changed() => return Ended::Stopped,
            stored = front_receipt(&mut in_flight), if waiting_receipt => {
                if let Err(error) = stored {
                    return error.into();
                }
                if let Some(done) = in_flight.pop_front()
                    && let Err(error) = settle(context, done)
                {
                    return error;
                }
            }
            read = read_from(log, next), if may_read => match read {
                Ok(entries) => {
                    if let Some(last) = entries.last() {
                        next = log.next_position(last.position);
                    }
                    unsent.extend(entries);
                }
                Err(error) => return error.into(),
            },
            _ = tokio::time::sleep(BUDGET_RETRY), if budget_full => {}
            _ = tokio::time::sleep(rate_wait.unwrap_or_default()), if rate_wait.is_some() => {}
            _ = limit_moved(&mut limit_changes), if at_txn_limit => {}
        }
        context
            .stats
            .backlog_entries
            .store(context.cursor.backlog_entries(), Ordering::Relaxed);
    }
}

/// What the topic's transaction buffer lets a replicator do with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum TxnGate {
    /// Not a transaction's, or a committed one's: replicate it.
    Send,
    /// At or after the read limit (an open transaction): not yet.
    Wait,
    /// A marker or an aborted transaction's entry: acknowledged, never sent.
    Skip,
}

fn txn_gate(buffer: Option<&TxnBuffer>, entry: &LogEntry) -> TxnGate {
    let Some(buffer) = buffer else {
        return TxnGate::Send;
    };
    if buffer
        .read_limit()
        .is_some_and(|limit| entry.position >= limit)
    {
        TxnGate::Wait
    } else if buffer.has_txns() && buffer.is_hidden(&entry.data) {
        TxnGate::Skip
    } else {
        TxnGate::Send
    }
}

/// Resolves once the read limit changed since the last call (pending
/// forever without a buffer).
async fn limit_moved(changes: &mut Option<watch::Receiver<Option<Position>>>) {
    match changes {
        Some(changes) => {
            if changes.changed().await.is_err() {
                // The buffer is gone (the topic closes): do not spin.
                tokio::time::sleep(BUDGET_RETRY).await;
            }
        }
        None => std::future::pending().await,
    }
}

fn skipped(position: Position) -> InFlight {
    InFlight {
        position,
        send: None,
        messages: 0,
        bytes: 0,
        publish_time_ms: 0,
        _budget: None,
    }
}

/// The front entry's receipt.
async fn front_receipt(
    in_flight: &mut VecDeque<InFlight>,
) -> Result<vela_client::MessageId, vela_client::ClientError> {
    match in_flight.front_mut().and_then(|f| f.send.as_mut()) {
        Some(send) => send.await,
        None => std::future::pending().await,
    }
}

/// The entry is stored on the remote (or skipped): the cursor moves past it.
fn settle(context: &Context, done: InFlight) -> Result<(), Ended> {
    context.cursor.ack_cumulative(done.position)?;
    if done.send.is_some() {
        let stats = &context.stats;
        stats.msg_out.fetch_add(done.messages, Ordering::Relaxed);
        stats.bytes_out.fetch_add(done.bytes, Ordering::Relaxed);
        stats
            .last_stored_publish_time_ms
            .store(done.publish_time_ms, Ordering::Relaxed);
    }
    Ok(())
}

/// The next entries at `from` on, waiting for one to be written.
async fn read_from(log: &ManagedLog, from: Position) -> Result<Vec<LogEntry>, LogError> {
    log.wait_for_entry_at(from).await;
    if log.is_closed() {
        return Err(LogError::Closed(log.name().to_string()));
    }
    let entries = log.read(from, READ_ENTRIES_MAX, READ_BYTES_MAX).await?;
    if entries.is_empty() {
        // Nothing readable there yet (a ledger switch in progress): do not
        // spin.
        tokio::time::sleep(BUDGET_RETRY).await;
    }
    Ok(entries)
}

/// Decides what to do with an entry and rewrites its metadata for the
/// remote.
fn prepare(context: &Context, entry: &LogEntry) -> Result<Prepared, Ended> {
    match decide(entry, &context.local, &context.remote) {
        Ok(prepared) => prepared,
        Err(Unparsable) => {
            tracing::warn!(
                topic = %context.topic.full_name, position = %entry.position,
                "entry metadata unreadable: not replicated"
            );
            Ok(Prepared::Skip)
        }
    }
}

/// An entry whose metadata does not parse.
struct Unparsable;

/// `decide`'s work, without the replicator: skip, or what to send.
fn decide(
    entry: &LogEntry,
    local: &str,
    remote: &str,
) -> Result<Result<Prepared, Ended>, Unparsable> {
    let Some((mut metadata, payload)) = codec::split_entry(&entry.data) else {
        return Err(Unparsable);
    };
    let elsewhere =
        !metadata.replicate_to.is_empty() && !metadata.replicate_to.iter().any(|c| c == remote);
    if let Some(marker_type) = metadata.marker_type {
        let from_remote = metadata.replicated_from.as_deref() == Some(remote);
        if from_remote && marker_type != markers::SNAPSHOT {
            // A request, response or update the remote sent here.
            if let Some(marker) = markers::read_marker(&entry.data) {
                return Ok(Ok(Prepared::Received(marker)));
            }
        }
        // This cluster's requests, responses and updates go to the
        // remotes they name (snapshots stay here); every other marker
        // (transactions', another cluster's) is never sent.
        let ours = matches!(
            marker_type,
            markers::SNAPSHOT_REQUEST | markers::SNAPSHOT_RESPONSE | markers::SUBSCRIPTION_UPDATE
        );
        if !ours || metadata.replicated_from.is_some() || elsewhere {
            return Ok(Ok(Prepared::Skip));
        }
    }
    if metadata.replicated_from.is_some() || elsewhere {
        return Ok(Ok(Prepared::Skip));
    }
    let position = entry.position;
    let Some(sequence_id) = replicated_sequence_id(position.ledger_id, position.entry_id) else {
        return Ok(Err(Ended::Unreplicable(position)));
    };
    metadata.replicated_from = Some(local.to_string());
    metadata.properties.push(KeyValue {
        key: REPL_SOURCE_POSITION_PROPERTY.to_string(),
        value: format!("{}:{}", position.ledger_id, position.entry_id),
    });
    metadata.txnid_least_bits = None;
    metadata.txnid_most_bits = None;
    Ok(Ok(Prepared::Send {
        sequence_id,
        metadata: Box::new(metadata),
        payload,
    }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use prost::Message as _;

    use super::*;

    fn entry(metadata: &MessageMetadata, position: Position) -> LogEntry {
        LogEntry {
            position,
            data: vela_wire::build_stored_entry(&metadata.encode_to_vec(), b"body"),
        }
    }

    fn produced() -> MessageMetadata {
        MessageMetadata {
            producer_name: "a-0-1".into(),
            sequence_id: 3,
            publish_time: 1_700_000_000_123,
            partition_key: Some("k".into()),
            event_time: Some(42),
            num_messages_in_batch: Some(4),
            properties: vec![KeyValue {
                key: "user".into(),
                value: "v".into(),
            }],
            txnid_most_bits: Some(1),
            txnid_least_bits: Some(2),
            ..Default::default()
        }
    }

    #[test]
    fn a_local_entry_is_sent_as_stored_plus_its_origin() {
        let at = Position::new(7, 11);
        let Ok(Ok(Prepared::Send {
            sequence_id,
            metadata,
            payload,
        })) = decide(&entry(&produced(), at), "a", "b")
        else {
            panic!("not sent");
        };
        assert_eq!(sequence_id, replicated_sequence_id(7, 11).unwrap());
        assert_eq!(&payload[..], b"body");
        let mut expected = produced();
        expected.replicated_from = Some("a".into());
        expected.properties.push(KeyValue {
            key: REPL_SOURCE_POSITION_PROPERTY.into(),
            value: "7:11".into(),
        });
        expected.txnid_most_bits = None;
        expected.txnid_least_bits = None;
        assert_eq!(*metadata, expected);
    }

    #[test]
    fn replicated_marked_and_elsewhere_entries_are_skipped() {
        let at = Position::new(1, 0);
        let skipped = |metadata: MessageMetadata| {
            matches!(
                decide(&entry(&metadata, at), "a", "b"),
                Ok(Ok(Prepared::Skip))
            )
        };
        let mut replicated = produced();
        replicated.replicated_from = Some("c".into());
        assert!(skipped(replicated), "never sent on (or back)");
        let mut marker = produced();
        marker.marker_type = Some(20);
        assert!(skipped(marker));
        let mut snapshot = produced();
        snapshot.marker_type = Some(markers::SNAPSHOT);
        snapshot.replicate_to = vec!["a".into()];
        assert!(skipped(snapshot), "a snapshot stays where it was taken");
        let mut request = produced();
        request.marker_type = Some(markers::SNAPSHOT_REQUEST);
        assert!(!skipped(request.clone()), "this cluster's request goes out");
        request.replicated_from = Some("b".into());
        assert!(
            matches!(
                decide(&entry(&request, at), "a", "b"),
                Ok(Ok(Prepared::Received(_)))
            ),
            "the remote's request is handed to the controller"
        );
        request.replicated_from = Some("c".into());
        assert!(skipped(request), "a third cluster's: its own replicator's");
        let mut elsewhere = produced();
        elsewhere.replicate_to = vec!["a".into(), "c".into()];
        assert!(skipped(elsewhere));
        let mut here_too = produced();
        here_too.replicate_to = vec!["b".into()];
        assert!(!skipped(here_too));
        let garbage = LogEntry {
            position: at,
            data: Bytes::from_static(b"not an entry"),
        };
        assert!(decide(&garbage, "a", "b").is_err());
        assert!(matches!(
            decide(&entry(&produced(), Position::new(1 << 40, 0)), "a", "b"),
            Ok(Err(Ended::Unreplicable(_)))
        ));
    }

    /// A topic's buffer over in-memory ledgers and metadata.
    async fn log_and_buffer() -> (Arc<ManagedLog>, Arc<TxnBuffer>, vela_log::LogEnv) {
        let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
        let ledgers = Arc::new(vela_log::memory::MemoryBackend(
            vela_log::memory::MemoryLedgers::new(),
        ));
        let env = vela_log::LogEnv::new(Arc::clone(&meta), ledgers);
        let config = vela_log::LogConfig {
            persistence: vela_log::Persistence::SINGLE,
            ..vela_log::LogConfig::default()
        };
        let log = ManagedLog::open(&env, "t/ns/persistent/r", config)
            .await
            .unwrap();
        let budget = crate::txn_buffer::TxnBudget::new(100);
        let buffer = TxnBuffer::open(Arc::clone(&log), meta, budget)
            .await
            .unwrap();
        (log, buffer, env)
    }

    /// Appends `data` and returns it as read back.
    async fn append(log: &ManagedLog, data: Bytes) -> LogEntry {
        let position = log.append(data.clone()).await.unwrap();
        LogEntry { position, data }
    }

    fn plain() -> Bytes {
        let mut metadata = produced();
        metadata.txnid_most_bits = None;
        metadata.txnid_least_bits = None;
        vela_wire::build_stored_entry(&metadata.encode_to_vec(), b"body")
    }

    #[tokio::test]
    async fn open_transactions_wait_aborted_ones_are_skipped_committed_ones_go() {
        let (log, buffer, _env) = log_and_buffer().await;
        let before = append(&log, plain()).await;
        assert_eq!(txn_gate(None, &before), TxnGate::Send);
        assert_eq!(txn_gate(Some(&buffer), &before), TxnGate::Send);
        buffer.ensure_tracked().await.unwrap();

        let (committed, aborted) = ((0, 1), (0, 2));
        let mut entries = Vec::new();
        for txn in [committed, aborted] {
            buffer.admit(txn).unwrap();
            let data = crate::txn_buffer::with_txn_id(&plain(), txn).unwrap();
            let entry = append(&log, data).await;
            buffer.appended(txn, entry.position);
            entries.push(entry);
        }
        let after = append(&log, plain()).await;
        // Both open: the first open entry and everything after it wait.
        for entry in entries.iter().chain([&after]) {
            assert_eq!(txn_gate(Some(&buffer), entry), TxnGate::Wait);
        }
        assert_eq!(txn_gate(Some(&buffer), &before), TxnGate::Send);

        buffer.end(committed, true).await.unwrap();
        assert_eq!(txn_gate(Some(&buffer), &entries[0]), TxnGate::Send);
        assert_eq!(txn_gate(Some(&buffer), &entries[1]), TxnGate::Wait);
        assert_eq!(txn_gate(Some(&buffer), &after), TxnGate::Wait);
        // The committed entry goes without its transaction id.
        let Ok(Ok(Prepared::Send { metadata, .. })) = decide(&entries[0], "a", "b") else {
            panic!("a committed transaction's entry is replicated");
        };
        assert_eq!(metadata.txnid_most_bits, None);

        buffer.end(aborted, false).await.unwrap();
        assert_eq!(txn_gate(Some(&buffer), &entries[1]), TxnGate::Skip);
        assert_eq!(txn_gate(Some(&buffer), &after), TxnGate::Send);
        let markers = log
            .read(log.next_position(after.position), 10, 1 << 20)
            .await
            .unwrap();
        assert_eq!(markers.len(), 2, "a commit and an abort marker");
        for marker in &markers {
            assert_eq!(txn_gate(Some(&buffer), marker), TxnGate::Skip);
        }
    }
}
