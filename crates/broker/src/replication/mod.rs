//! Geo-replication: one replicator per served topic (partition) and remote
//! cluster, as Pulsar's `PersistentReplicator`, started and stopped as the
//! replication clusters of namespaces and topics change.
//!
//! Owns: the reconciler task ([`run`]): the running replicators, one
//! `vela_client::Client` per remote cluster (from its record,
//! `admin::clusters`: `brokerServiceUrl`, or `brokerServiceUrlTls` over
//! TLS, and a token; `remote`), the broker-wide budget of bytes replicators have in
//! flight, and deleting the `pulsar.repl.{remote}` cursor of a remote no
//! longer wanted. Each replicator (`replicator`) reads its topic's log from
//! its durable cursor and produces to the same topic in the remote cluster.
//! Guarantees: a topic whose replication clusters include a remote has its
//! cursor from the moment it opens (`Service::topic` creates it), so
//! nothing produced here is missed; a replicator is running for it within
//! `RECONCILE_INTERVAL` (at once after a REST change, which wakes the
//! reconciler); a remote no longer named stops its replicator and loses
//! its cursor within the same time.
//! Bounds: `REPLICATOR_PENDING_MAX` entries in flight per replicator, and
//! `BrokerConfig::replication_inflight_bytes_max` bytes in flight over all
//! (past it replicators wait for receipts: back-pressure, never a queue);
//! one replicator per (served topic, remote), so their number follows the
//! served topics (`BrokerConfig::topics_max`) times `REPLICATION_CLUSTERS_MAX`.
//! Replicated subscriptions: one snapshot controller (`snapshots`) per
//! topic with a running replicator, started and stopped with them; the
//! replicators carry its markers and hand it those the remotes sent.
//! Never: replicates a message that came from another cluster (no
//! ping-pong), creates the remote's namespace, or blocks a worker.

mod rate;
mod remote;
mod remote_admin;
mod replicator;
mod snapshots;

use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use tokio::sync::{Semaphore, watch};
use vela_client::Client;
use vela_log::CursorStart;

use crate::admin::ClusterData;
use crate::service::Service;
use crate::stats::ReplicatorStats;
use crate::topic::{REPLICATOR_PREFIX, Topic, replication_cursor_name as cursor_name};
use replicator::Replicator;
use snapshots::Controller;

/// How often served topics are compared with the replicators running: new
/// topics are looked at each time (a store read or two each), every topic
/// on every `FULL_PASS_EVERY`-th pass (policies changed on another broker
/// of the cluster).
const RECONCILE_INTERVAL: Duration = Duration::from_secs(1);

/// Every this many passes, all served topics' replication clusters are read
/// again (~30 s).
const FULL_PASS_EVERY: u32 = 30;

/// How long after start a broker serving every bundle (standalone) opens
/// the topics that replicate, so replication resumes after a restart
/// without waiting for a client to load them. Later than the start of a
/// cluster broker, which joins its cluster right after starting: a broker
/// owning bundles (cluster mode) loads nothing (its topics load on lookup).
const RESUME_AFTER_START: Duration = Duration::from_secs(5);

struct Running {
    topic: Arc<Topic>,
    replicator: Replicator,
    stats: Arc<ReplicatorStats>,
}

/// A topic's snapshot controller and its task.
struct ControllerTask {
    controller: Arc<Controller>,
    stop: watch::Sender<bool>,
}

impl Drop for ControllerTask {
    fn drop(&mut self) {
        // Its task ends at its next wake-up.
        let _ = self.stop.send(true);
    }
}

/// A remote cluster's client, made from its record (URLs, TLS, token).
struct Remote {
    data: ClusterData,
    client: Client,
    admin: Option<Arc<remote_admin::RemoteAdmin>>,
}

/// The reconciler's state: owned by its task, no lock.
struct Reconciler {
    running: HashMap<(String, String), Running>,
    remotes: HashMap<String, Remote>,
    /// Remote clusters of each served topic, as last read. Keyed by the
    /// topic's own `full_name` (one copy of the name, where a `String` key
    /// was a copy per served topic: issue 19's per-topic cost).
    wanted: HashMap<Arc<str>, Vec<String>>,
    /// Snapshot controllers of the topics with a running replicator.
    controllers: HashMap<String, ControllerTask>,
    budget: Arc<Semaphore>,
    passes: u32,
}

/// The reconciler: runs until `shutdown`, then stops every replicator.
pub(crate) async fn run(service: Weak<Service>, mut shutdown: watch::Receiver<bool>) {
    let budget = match service.upgrade() {
        Some(service) => service.config.replication_inflight_bytes_max,
        None => return,
    };
    let started = tokio::time::Instant::now();
    let mut resumed = false;
    let mut state = Reconciler {
        running: HashMap::new(),
        remotes: HashMap::new(),
        wanted: HashMap::new(),
        controllers: HashMap::new(),
        budget: Arc::new(Semaphore::new(budget.clamp(1, Semaphore::MAX_PERMITS))),
        passes: 0,
    };
    loop {
        let Some(service) = service.upgrade() else {
            break;
        };
        // A policy changed: read every topic's clusters again.
        let asked = service
            .replication_full_pass
            .swap(false, std::sync::atomic::Ordering::AcqRel);
        let full = asked || state.passes.is_multiple_of(FULL_PASS_EVERY);
        state.passes = state.passes.wrapping_add(1);
        if !resumed && started.elapsed() >= RESUME_AFTER_START {
            resumed = true;
            resume_replicated_topics(&service).await;
        }
        state.reconcile(&service, full).await;
        tokio::select! {
            _ = service.replication_wakeup.notified() => {}
            _ = tokio::time::sleep(RECONCILE_INTERVAL) => {}
            _ = shutdown.changed() => break,
        }
    }
    state.controllers.clear();
    let stopping: Vec<Running> = state.running.drain().map(|(_, r)| r).collect();
    stop_all(stopping).await;
}

/// Opens every topic that replicates (standalone only; bounded by
/// `TOPICS_MAX`: opens past it are refused and logged).
async fn resume_replicated_topics(service: &Service) {
    if service.ownership.get().is_some() {
        return;
    }
    let topics = match service
        .admin
        .replicated_topics(&service.config.cluster_name)
        .await
    {
        Ok(topics) => topics,
        Err(error) => {
            tracing::warn!(%error, "replicated topics not listed: they resume when loaded");
            return;
        }
    };
    for name in topics {
        let Ok(topic) = crate::topic_name::TopicName::parse(&name) else {
            continue;
        };
        if let Err(error) = service.topic(&topic, false).await {
            tracing::warn!(topic = %name, %error, "replicated topic not loaded");
        }
    }
}

/// Stops replicators: all told first, then all waited for.
async fn stop_all(replicators: Vec<Running>) -> Vec<Arc<Topic>> {
    for running in &replicators {
        running.replicator.signal_stop();
    }
    let mut topics = Vec::with_capacity(replicators.len());
    for running in replicators {
        running.replicator.join().await;
        topics.push(running.topic);
    }
    topics
}

impl Reconciler {
    async fn reconcile(&mut self, service: &Arc<Service>, full: bool) {
        if full {
            self.forget_moved_remotes(service).await;
        }
        let topics = service.served_topic_handles();
        let served: HashSet<&str> = topics.iter().map(|t| &*t.full_name).collect();
        self.wanted.retain(|name, _| served.contains(&**name));
        for topic in &topics {
            if !full && self.wanted.contains_key(&*topic.full_name) {
                continue;
            }
            match service.replication_remotes(&topic.name).await {
                Ok(remotes) => {
                    self.wanted.insert(Arc::clone(&topic.full_name), remotes);
                }
                Err(error) => {
                    tracing::warn!(topic = %topic.full_name, %error, "replication clusters unreadable");
                }
            }
        }
        // Stop what is no longer wanted, or whose topic was reopened, or
        // whose replicator ended (it is started again below).
        let by_name: HashMap<&str, &Arc<Topic>> =
            topics.iter().map(|t| (&*t.full_name, t)).collect();
        let stale: Vec<(String, String)> = self
            .running
            .iter()
            .filter(|((name, remote), running)| {
                let current = by_name
                    .get(name.as_str())
                    .is_some_and(|t| Arc::ptr_eq(t, &running.topic));
                let wanted = self
                    .wanted
                    .get(name.as_str())
                    .is_some_and(|remotes| remotes.contains(remote));
                !current || !wanted || running.replicator.is_finished()
            })
            .map(|(key, _)| key.clone())
            .collect();
        let stopping: Vec<Running> = stale
            .iter()
            .filter_map(|key| self.running.remove(key))
            .collect();
        let stopped_topics = stop_all(stopping).await;
        for (key, topic) in stale.iter().zip(stopped_topics) {
            let still_served = by_name.contains_key(key.0.as_str());
            let unwanted = !self
                .wanted
                .get(key.0.as_str())
                .is_some_and(|remotes| remotes.contains(&key.1));
            if still_served && unwanted {
                delete_cursor(&topic, &key.1).await;
            }
        }
        // Start what is wanted and not running.
        let mut records: HashMap<String, Option<ClusterData>> = HashMap::new();
        for topic in &topics {
            let Some(remotes) = self
                .wanted
                .get(&*topic.full_name)
                .filter(|remotes| !remotes.is_empty())
                .cloned()
            else {
                continue;
            };
            for remote in remotes {
                let key = (topic.full_name.to_string(), remote.clone());
                if self.running.contains_key(&key) {
                    continue;
                }
                let Some((client, remote_admin)) =
                    self.client(service, &remote, &mut records).await
                else {
                    continue;
                };
                let cursor = match topic
                    .log
                    .open_cursor(&cursor_name(&remote), CursorStart::Latest)
                    .await
                {
                    Ok(cursor) => cursor,
                    Err(error) => {
                        tracing::warn!(topic = %topic.full_name, %remote, %error, "replication cursor not opened");
                        continue;
                    }
                };
                let stats = Arc::new(ReplicatorStats::default());
                service.register_replicator(&topic.full_name, &remote, Arc::clone(&stats));
                let controller = self.controller(service, topic);
                let replicator = Replicator::start(replicator::Context {
                    topic: Arc::clone(topic),
                    local: service.config.cluster_name.clone(),
                    remote: remote.clone(),
                    client,
                    cursor,
                    budget: Arc::clone(&self.budget),
                    stats: Arc::clone(&stats),
                    controller,
                    remote_admin,
                    partitions: partitions_of(service, topic).await,
                    service: Arc::downgrade(service),
                });
                tracing::info!(topic = %topic.full_name, %remote, "replicator started");
                self.running.insert(
                    key,
                    Running {
                        topic: Arc::clone(topic),
                        replicator,
                        stats,
                    },
                );
            }
        }
        self.follow_controllers();
        service.retain_replicators(|topic, remote| {
            self.running
                .contains_key(&(topic.to_string(), remote.to_string()))
        });
        if full {
            // Cursors of remotes no longer named (changed while this broker
            // did not serve the topic).
            for topic in &topics {
                // Unknown (policies unreadable): keep everything.
                let Some(wanted) = self.wanted.get(&*topic.full_name) else {
                    continue;
                };
                for name in topic.log.cursor_names() {
                    let Some(remote) = name.strip_prefix(&format!("{REPLICATOR_PREFIX}.")) else {
                        continue;
                    };
                    if !wanted.iter().any(|r| r == remote) {
                        delete_cursor(topic, remote).await;
                    }
                }
            }
        }
    }

    /// The snapshot controller of `topic`, started when it has none (or
    /// one of an earlier opening of the topic).
    fn controller(&mut self, service: &Service, topic: &Arc<Topic>) -> Arc<Controller> {
        if let Some(task) = self.controllers.get(&*topic.full_name)
            && Arc::ptr_eq(task.controller.topic(), topic)
        {
            return Arc::clone(&task.controller);
        }
        let controller = Controller::new(Arc::clone(topic), &service.config.cluster_name);
        let (stop, stopped) = watch::channel(false);
        let frequency = Duration::from_millis(
            service
                .config
                .replicated_subscriptions_snapshot_frequency_ms
                .max(1),
        );
        tokio::spawn(Arc::clone(&controller).run(frequency, stopped));
        self.controllers.insert(
            topic.full_name.to_string(),
            ControllerTask {
                controller: Arc::clone(&controller),
                stop,
            },
        );
        controller
    }

    /// Tells each controller which replicators its topic has; stops those
    /// of topics left without one.
    fn follow_controllers(&mut self) {
        let mut remotes: HashMap<&str, BTreeMap<String, Arc<ReplicatorStats>>> = HashMap::new();
        for ((name, remote), running) in &self.running {
            let current = self
                .controllers
                .get(name)
                .is_some_and(|c| Arc::ptr_eq(c.controller.topic(), &running.topic));
            if current {
                remotes
                    .entry(name.as_str())
                    .or_default()
                    .insert(remote.clone(), Arc::clone(&running.stats));
            }
        }
        self.controllers
            .retain(|name, _| remotes.contains_key(name.as_str()));
        for (name, task) in &self.controllers {
            if let Some(of_topic) = remotes.remove(name.as_str()) {
                task.controller.set_remotes(of_topic);
            }
        }
    }

    /// Remotes whose record changed (URLs, TLS, credentials) or that are
    /// gone: their clients are dropped and their replicators stopped
    /// (started again with a new client on this pass).
    async fn forget_moved_remotes(&mut self, service: &Service) {
        let mut moved = Vec::new();
        for (remote, known) in &self.remotes {
            let data = match service.admin.cluster(remote).await {
                Ok(data) => data,
                Err(_) => continue,
            };
            if data.as_ref() != Some(&known.data) {
                moved.push(remote.clone());
            }
        }
        for remote in moved {
            self.remotes.remove(&remote);
            let keys: Vec<(String, String)> = self
                .running
                .keys()
                .filter(|(_, r)| *r == remote)
                .cloned()
                .collect();
            let stopping: Vec<Running> = keys
                .iter()
                .filter_map(|key| self.running.remove(key))
                .collect();
            stop_all(stopping).await;
        }
    }

    /// The client of `remote`, made (again) when its record is new.
    async fn client(
        &mut self,
        service: &Service,
        remote: &str,
        records: &mut HashMap<String, Option<ClusterData>>,
    ) -> Option<(Client, Option<Arc<remote_admin::RemoteAdmin>>)> {
        if !records.contains_key(remote) {
            let data = match service.admin.cluster(remote).await {
                Ok(data) => data,
                Err(error) => {
                    tracing::warn!(%remote, %error, "cluster record unreadable");
                    None
                }
            };
            records.insert(remote.to_string(), data);
        }
        let Some(data) = records.get(remote).cloned().flatten() else {
            tracing::warn!(%remote, "no record of the cluster: not replicating to it");
            return None;
        };
        if let Some(known) = self.remotes.get(remote)
            && known.data == data
        {
            return Some((known.client.clone(), known.admin.clone()));
        }
        let made = match remote::setup(&service.config.broker_client, &data).await {
            Ok(setup) => Client::new(&setup.url, setup.config)
                .map(|client| (client, setup.admin))
                .map_err(|e| e.to_string()),
            Err(error) => Err(error.to_string()),
        };
        match made {
            Ok((client, admin)) => {
                self.remotes.insert(
                    remote.to_string(),
                    Remote {
                        data,
                        client: client.clone(),
                        admin: admin.clone(),
                    },
                );
                Some((client, admin))
            }
            Err(error) => {
                tracing::warn!(%remote, %error, "cannot replicate to this cluster");
                None
            }
        }
    }
}

/// Partitions of the partitioned topic `topic` is a partition of (`None`
/// for a topic that is not a partition, or when unreadable).
async fn partitions_of(service: &Service, topic: &Topic) -> Option<u32> {
    topic.name.partition?;
    match service.admin.partitions(&topic.name.base()).await {
        Ok(partitions) => partitions,
        Err(error) => {
            tracing::warn!(topic = %topic.full_name, %error, "partitioned metadata unreadable");
            None
        }
    }
}

async fn delete_cursor(topic: &Topic, remote: &str) {
    match topic.log.delete_cursor(&cursor_name(remote)).await {
        Ok(()) => {
            tracing::info!(topic = %topic.full_name, %remote, "replication stopped; cursor deleted")
        }
        Err(error) => {
            tracing::warn!(topic = %topic.full_name, %remote, %error, "replication cursor not deleted")
        }
    }
}
