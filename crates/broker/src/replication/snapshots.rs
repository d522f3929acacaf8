//! Replicated subscriptions: a topic's snapshot controller, as Pulsar's
//! `ReplicatedSubscriptionsController` and `...SnapshotBuilder`.
//!
//! How positions follow (marker types in `crate::markers`):
//! 1. Every `snapshot frequency` (`BrokerConfig::
//!    replicated_subscriptions_snapshot_frequency_ms`, Pulsar's
//!    `replicatedSubscriptionsSnapshotFrequencyMillis`, 1 s), a topic with a
//!    replicated subscription, new data since its last snapshot and every
//!    replicator connected writes a REQUEST (snapshot id, this cluster) into
//!    its own log; the replicators carry it to every remote.
//! 2. A remote's replicator back toward here reads the REQUEST in the
//!    remote's log and hands it to the remote's controller, which writes a
//!    RESPONSE naming the REQUEST's position in its log, restricted to the
//!    asking cluster; it comes back the same way.
//! 3. Once every remote answered (twice with more than one remote, so
//!    messages they exchanged among themselves are covered too), the
//!    asker writes a SNAPSHOT (its position of the last RESPONSE, each
//!    remote's position), kept in its own log only. Everything before the
//!    SNAPSHOT's local position here includes everything each remote held
//!    before its position there.
//! 4. A replicated subscription's task notes each SNAPSHOT it reads
//!    (`subscription::snapshots`; each is also handed every snapshot as it
//!    completes, for one without consumers, which reads none); when its
//!    mark-delete position has passed one (checked each tick), the
//!    controller writes an UPDATE (subscription, each remote's position),
//!    carried to every remote.
//! 5. A remote's controller, handed the UPDATE, moves its subscription of
//!    that name to its position there (creating it, marked replicated on
//!    its cursor too, when missing; never moving it back, never changing
//!    the status of one that exists).
//!
//! So a consumer failing over to a remote resumes at most one snapshot
//! interval (plus a tick and the replication lag) behind where it
//! acknowledged: what it may see again, never what it loses.
//!
//! Owns: [`Controller`] (one per topic with a replicator, made and stopped
//! by the reconciler), its pending snapshots. Bounds: `PENDING_MAX`
//! snapshots pending (each times out after `SNAPSHOT_TIMEOUT`, Pulsar's
//! `replicatedSubscriptionsSnapshotTimeoutSeconds`); one marker written per
//! request, response, completed snapshot and update.
//! Never: holds a lock across an await, or moves a subscription backwards.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use prost::Message as _;
use tokio::sync::watch;
use tokio::time::Instant;
use vela_log::Position;

use crate::markers::{
    self, ClusterPosition, MarkerPosition, ReadMarker, Snapshot, SnapshotRequest, SnapshotResponse,
    SubscriptionUpdate,
};
use crate::stats::ReplicatorStats;
use crate::subscription::RemotePositions;
use crate::topic::Topic;
use crate::topic::cursor_admin::SubscriptionStart;

/// A snapshot not completed within this time is dropped (Pulsar's
/// `replicatedSubscriptionsSnapshotTimeoutSeconds`, 30).
pub(crate) const SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(30);

/// Snapshots pending at once per topic. When reached: no new one starts
/// until one completes or times out.
const PENDING_MAX: usize = 64;

/// A snapshot waiting for responses.
#[derive(Debug)]
struct Pending {
    started: Instant,
    /// The topic's data messages (`data_in`) when it started.
    data_in: u64,
    remotes: Vec<String>,
    missing: BTreeSet<String>,
    /// Remote → its position of the (first) request.
    responses: BTreeMap<String, Position>,
    /// More than one remote and the first round not done yet.
    second_round_due: bool,
}

#[derive(Debug, Default)]
struct State {
    /// Remote cluster → its replicator's statistics (`connected`).
    remotes: BTreeMap<String, Arc<ReplicatorStats>>,
    pending: HashMap<String, Pending>,
    /// `data_in` when the last completed snapshot started.
    last_completed_data_in: Option<u64>,
}

/// One topic's snapshot controller.
#[derive(Debug)]
pub(super) struct Controller {
    topic: Arc<Topic>,
    local: String,
    state: Mutex<State>,
    /// Markers from remotes handed here (they arrived through publish and
    /// count among the topic's messages in, but are no data).
    markers_received: AtomicU64,
    /// For unique snapshot ids.
    snapshots_started: AtomicU64,
}

impl Controller {
    pub(super) fn new(topic: Arc<Topic>, local: &str) -> Arc<Controller> {
        Arc::new(Controller {
            topic,
            local: local.to_string(),
            state: Mutex::default(),
            markers_received: AtomicU64::new(0),
            snapshots_started: AtomicU64::new(0),
        })
    }

    /// The topic it serves.
    pub(super) fn topic(&self) -> &Arc<Topic> {
        &self.topic
    }

    /// The replicators running for the topic now.
    pub(super) fn set_remotes(&self, remotes: BTreeMap<String, Arc<ReplicatorStats>>) {
        self.state.lock().remotes = remotes;
    }

    /// Runs the periodic work every `frequency` until `stop`.
    pub(super) async fn run(
        self: Arc<Controller>,
        frequency: Duration,
        mut stop: watch::Receiver<bool>,
    ) {
        let mut ticks = tokio::time::interval(frequency);
        ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = ticks.tick() => {}
                _ = stop.changed() => return,
            }
            if *stop.borrow() || self.topic.log.is_closed() {
                return;
            }
            self.tick(Instant::now());
        }
    }

    /// Data messages the topic took since it opened: messages in, less
    /// the markers remotes sent.
    fn data_in(&self) -> u64 {
        self.topic
            .msg_in_total()
            .saturating_sub(self.markers_received.load(Ordering::Relaxed))
    }

    fn tick(&self, now: Instant) {
        self.maybe_start_snapshot(now);
        self.send_updates();
    }

    fn maybe_start_snapshot(&self, now: Instant) {
        let replicated = self.topic.replicated_subscriptions();
        let data_in = self.data_in();
        let mut state = self.state.lock();
        state
            .pending
            .retain(|_, p| now.duration_since(p.started) < SNAPSHOT_TIMEOUT);
        if !replicated.any() || state.remotes.is_empty() || state.pending.len() >= PENDING_MAX {
            return;
        }
        match state.last_completed_data_in {
            // Never completed: one attempt at a time (a remote that does
            // not answer is retried after the timeout), on a topic with
            // entries.
            None if !state.pending.is_empty() || self.topic.log.last_confirmed().is_none() => {
                return;
            }
            // Nothing but markers since the last snapshot.
            Some(last) if last == data_in => return,
            _ => {}
        }
        if state
            .remotes
            .values()
            .any(|r| !r.connected.load(Ordering::Relaxed))
        {
            return;
        }
        let sequence = self.snapshots_started.fetch_add(1, Ordering::Relaxed);
        let snapshot_id = format!("{}-{}-{sequence}", self.local, unique_start());
        let remotes: Vec<String> = state.remotes.keys().cloned().collect();
        let request = SnapshotRequest {
            snapshot_id: snapshot_id.clone(),
            source_cluster: Some(self.local.clone()),
        };
        self.write(markers::marker_entry(
            markers::SNAPSHOT_REQUEST,
            None,
            &request,
        ));
        state.pending.insert(
            snapshot_id,
            Pending {
                started: now,
                data_in,
                missing: remotes.iter().cloned().collect(),
                second_round_due: remotes.len() > 1,
                remotes,
                responses: BTreeMap::new(),
            },
        );
    }

    /// Writes an UPDATE for each replicated subscription whose mark-delete
    /// position passed a snapshot it read.
    fn send_updates(&self) {
        let replicated = self.topic.replicated_subscriptions();
        for name in replicated.names() {
            let Some(mark_delete) = self
                .topic
                .log
                .cursor(&name)
                .and_then(|c| c.mark_delete_position())
            else {
                continue;
            };
            let Some(remotes) = replicated.reached(&name, mark_delete) else {
                continue;
            };
            tracing::debug!(topic = %self.topic.full_name, subscription = %name, %mark_delete, "replicated subscription update");
            let update = SubscriptionUpdate {
                subscription_name: name,
                clusters: remotes
                    .into_iter()
                    .map(|(cluster, position)| ClusterPosition {
                        cluster,
                        message_id: MarkerPosition::of(position),
                    })
                    .collect(),
            };
            self.write(markers::marker_entry(
                markers::SUBSCRIPTION_UPDATE,
                None,
                &update,
            ));
        }
    }

    /// A marker that came from `from` (the remote of the replicator that
    /// read it), at `position` in this topic's log.
    pub(super) fn received(&self, from: &str, marker: ReadMarker, position: Position) {
        self.markers_received.fetch_add(1, Ordering::Relaxed);
        match marker.marker_type {
            markers::SNAPSHOT_REQUEST => {
                let Ok(request) = SnapshotRequest::decode(marker.payload) else {
                    return self.unreadable(from, "snapshot request");
                };
                let asker = request.source_cluster.unwrap_or_else(|| from.to_string());
                let response = SnapshotResponse {
                    snapshot_id: request.snapshot_id,
                    cluster: Some(ClusterPosition {
                        cluster: self.local.clone(),
                        message_id: MarkerPosition::of(position),
                    }),
                };
                self.write(markers::marker_entry(
                    markers::SNAPSHOT_RESPONSE,
                    Some(&asker),
                    &response,
                ));
            }
            markers::SNAPSHOT_RESPONSE => {
                let Ok(response) = SnapshotResponse::decode(marker.payload) else {
                    return self.unreadable(from, "snapshot response");
                };
                if let Some(cluster) = response.cluster {
                    self.response(&response.snapshot_id, cluster, position);
                }
            }
            markers::SUBSCRIPTION_UPDATE => {
                let Ok(update) = SubscriptionUpdate::decode(marker.payload) else {
                    return self.unreadable(from, "subscription update");
                };
                let Some(here) = update
                    .clusters
                    .iter()
                    .find(|c| c.cluster == self.local)
                    .map(|c| c.message_id.position())
                else {
                    return;
                };
                let topic = Arc::clone(&self.topic);
                tokio::spawn(apply_update(topic, update.subscription_name, here));
            }
            _ => {}
        }
    }

    fn response(&self, snapshot_id: &str, cluster: ClusterPosition, position: Position) {
        let mut state = self.state.lock();
        let Some(pending) = state.pending.get_mut(snapshot_id) else {
            return; // timed out, or not ours
        };
        pending
            .responses
            .entry(cluster.cluster.clone())
            .or_insert(cluster.message_id.position());
        pending.missing.remove(&cluster.cluster);
        if !pending.missing.is_empty() {
            return;
        }
        if pending.second_round_due {
            pending.second_round_due = false;
            pending.missing = pending.remotes.iter().cloned().collect();
            let request = SnapshotRequest {
                snapshot_id: snapshot_id.to_string(),
                source_cluster: Some(self.local.clone()),
            };
            self.write(markers::marker_entry(
                markers::SNAPSHOT_REQUEST,
                None,
                &request,
            ));
            return;
        }
        let Some(done) = state.pending.remove(snapshot_id) else {
            return;
        };
        state.last_completed_data_in = Some(done.data_in);
        let snapshot = Snapshot {
            snapshot_id: snapshot_id.to_string(),
            local_message_id: Some(MarkerPosition::of(position)),
            clusters: done
                .responses
                .into_iter()
                .map(|(cluster, at)| ClusterPosition {
                    cluster,
                    message_id: MarkerPosition::of(at),
                })
                .collect(),
        };
        let local = self.local.clone();
        self.write(markers::marker_entry(
            markers::SNAPSHOT,
            Some(&local),
            &snapshot,
        ));
        drop(state);
        // A replicated subscription without consumers (e.g. after a
        // restart) reads no SNAPSHOT marker: it is handed the snapshot
        // here, so a move of its cursor (skip, reset, expiry) still
        // reaches the remotes.
        let remotes: RemotePositions = snapshot
            .clusters
            .iter()
            .map(|c| (c.cluster.clone(), c.message_id.position()))
            .collect();
        self.topic
            .replicated_subscriptions()
            .snapshot_completed(position, &remotes);
    }

    fn unreadable(&self, from: &str, what: &str) {
        tracing::warn!(topic = %self.topic.full_name, %from, "{what} marker unreadable: ignored");
    }

    /// Appends a marker to the topic's log (in call order; the append is
    /// awaited in a task of its own, a failure logged: the next tick
    /// writes again what is still due).
    fn write(&self, entry: Bytes) {
        let append = self.topic.log.append(entry);
        let topic = self.topic.full_name.clone();
        tokio::spawn(async move {
            if let Err(error) = append.await {
                tracing::warn!(%topic, %error, "replicated-subscription marker not written");
            }
        });
    }
}

/// Moves subscription `name` to `position` (forward only), creating it
/// first when it does not exist here; one it creates is replicated from
/// then on.
async fn apply_update(topic: Arc<Topic>, name: String, position: Position) {
    if topic
        .log
        .last_confirmed()
        .is_none_or(|last| position > last)
    {
        tracing::warn!(topic = %topic.full_name, subscription = %name, %position,
            "replicated subscription update beyond the log: ignored");
        return;
    }
    // As Pulsar: an update only marks the subscription it creates. An
    // existing one keeps the status its admin gave it (an update racing a
    // `--disable` must not turn replication back on).
    if !topic.subscription_names().contains(&name) {
        match topic
            .create_subscription(&name, SubscriptionStart::Earliest)
            .await
        {
            Ok(()) => {
                if let Err(error) = topic.set_replicated(&name, true).await {
                    tracing::warn!(topic = %topic.full_name, subscription = %name, %error,
                        "subscription not marked replicated");
                }
            }
            Err(crate::error::AdminError::Exists(_)) => {}
            Err(error) => {
                tracing::warn!(topic = %topic.full_name, subscription = %name, %error,
                    "replicated subscription not created");
                return;
            }
        }
    }
    if let Err(error) = topic.evict_up_to(&name, position).await {
        tracing::warn!(topic = %topic.full_name, subscription = %name, %error,
            "replicated subscription not moved");
    }
}

/// Nanoseconds since the epoch when first asked: snapshot ids differ
/// across restarts.
fn unique_start() -> u128 {
    static START: std::sync::OnceLock<u128> = std::sync::OnceLock::new();
    *START.get_or_init(|| {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_nanos())
    })
}
