//! The broker service: the topics being served, shared by all connections.
//!
//! Owns: the map from full topic name to [`Topic`] (each opened once, even
//! when many connections ask at the same time), the rules deciding whether a
//! topic may be served (namespace exists, partition index in range,
//! auto-creation), unloading and deleting topics, broker-assigned producer
//! names, connection ids and the broker-wide metrics.
//! Never: speaks the protocol (connections do) or stores entries (logs do).

mod replicators;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::OnceCell;
use vela_log::{LogConfig, LogEnv, ManagedLog, Persistence};
use vela_meta::MetadataStore;
use vela_wire::proto::ServerError;

use crate::admin::{Admin, NamespacePolicies};
use crate::compaction::Compaction;
use crate::config::BrokerConfig;
use crate::error::ServiceError;
use crate::inflight::ByteBudget;
use crate::metrics::{Stage, StageLatency, WritePathSource};
use crate::nonpersistent::NonPersistentTopic;
use crate::ownership::{
    BrokerInfo, BundleRange, LoadReport, LookupAnswer, Ownership, OwnershipError,
};
use crate::policies::TopicPolicies;
use crate::schema::{CompatibilityStrategy, SchemaRegistry};
use crate::subscription::HeldEntries;
use crate::topic::Topic;
use crate::topic_name::{TopicDomain, TopicName};

/// Topics served at once by one broker. Each holds a log, its cursors and
/// subscription tasks (a few KiB idle; cached entries and publishes in
/// flight draw on the broker-wide budgets, not per topic); 100k topics is
/// beyond what one broker process should carry. When reached: new topics
/// get ServiceNotReady.
pub(crate) const TOPICS_MAX: usize = 100_000;

type TopicCell = Arc<OnceCell<Arc<Topic>>>;

/// Shared broker state.
#[derive(Debug)]
pub(crate) struct Service {
    /// Configuration.
    pub(crate) config: BrokerConfig,
    /// Tenants, namespaces, partitioned metadata.
    pub(crate) admin: Admin,
    /// Schemas.
    pub(crate) schemas: SchemaRegistry,
    /// Topic list watchers (WATCH_TOPIC_LIST).
    pub(crate) topic_watchers: crate::watchers::TopicListWatchers,
    /// Logs.
    pub(crate) log_env: LogEnv,
    /// `pulsar://host:port` returned by lookups.
    pub(crate) advertised_url: String,
    /// Broker-wide counters and histograms.
    pub(crate) metrics: crate::metrics::BrokerMetrics,
    /// `http://host:port` of the plain HTTP listener, once started (lookups).
    pub(crate) http_url: std::sync::OnceLock<String>,
    /// `https://host:port` of the HTTPS listener, once started (lookups).
    pub(crate) https_url: std::sync::OnceLock<String>,
    /// Write-path stages below the broker (ledger client, bookies).
    pub(crate) write_path_sources: Mutex<Vec<Arc<dyn WritePathSource>>>,
    /// The metadata store (ownership, schemas and admin records live there).
    pub(crate) meta: Arc<dyn MetadataStore>,
    /// Bundle ownership in cluster mode (unset: a standalone broker owns
    /// everything).
    pub(crate) ownership: std::sync::OnceLock<Arc<Ownership>>,
    /// Policies set by the broker's dynamic configuration, by policy key
    /// (`http::brokers` keeps them in the store and here).
    dynamic: Mutex<std::collections::BTreeMap<String, serde_json::Value>>,
    /// The subscriptions' read-ahead budget (`read_ahead_bytes_max`) and
    /// read-path stages, shared by every subscription.
    pub(crate) reads: crate::subscription::SubscriptionReads,
    topics: Mutex<HashMap<String, TopicCell>>,
    /// Entries held by all subscriptions (`BrokerConfig::held_entries_max`).
    pub(crate) held_entries: Arc<HeldEntries>,
    /// Non-persistent topics served (nothing to open: created in place).
    np_topics: Mutex<HashMap<String, Arc<NonPersistentTopic>>>,
    /// Bytes of non-persistent messages in flight, broker-wide
    /// (`NonPersistentLimits::inflight_bytes_max`).
    pub(crate) np_budget: Arc<ByteBudget>,
    /// The transaction coordinators (`None`: transactions are off).
    pub(crate) transactions: Option<Arc<crate::transaction::Coordinators>>,
    /// Wakes the replicators' reconciler (`replication`) when clusters or
    /// replication policies change.
    pub(crate) replication_wakeup: tokio::sync::Notify,
    /// Set with a wakeup when policies changed: every served topic's
    /// replication clusters are read again (a topic opening only wakes).
    pub(crate) replication_full_pass: std::sync::atomic::AtomicBool,
    /// Statistics of the running replicators by (topic, remote cluster);
    /// the reconciler keeps it in step with the replicators it runs.
    replicators: Mutex<HashMap<(String, String), Arc<crate::stats::ReplicatorStats>>>,
    /// The transaction state of every topic's buffer and pending acks
    /// (`TransactionConfig::state_entries_max`; transactions on).
    pub(crate) txn_budget: Option<Arc<crate::txn_buffer::TxnBudget>>,
    producer_names: AtomicU64,
    conn_ids: AtomicU64,
}

impl Service {
    /// Builds the service.
    pub(crate) fn new(
        config: BrokerConfig,
        meta: Arc<dyn MetadataStore>,
        log_env: LogEnv,
        advertised_url: String,
    ) -> Service {
        let metrics = crate::metrics::BrokerMetrics::default();
        let reads = crate::subscription::SubscriptionReads::new(
            config.read_ahead_bytes_max,
            Arc::clone(&metrics.reads),
        );
        let transactions = config.transactions.clone().map(|txn| {
            let persistence = config.default_persistence;
            Arc::new(crate::transaction::Coordinators::new(
                txn,
                log_env.clone(),
                Arc::clone(&meta),
                Persistence {
                    ensemble: persistence.ensemble,
                    write_quorum: persistence.write_quorum,
                    ack_quorum: persistence.ack_quorum,
                },
            ))
        });
        let admin = Admin::for_cluster(Arc::clone(&meta), &config.cluster_name);
        let txn_budget = config
            .transactions
            .as_ref()
            .map(|txn| crate::txn_buffer::TxnBudget::new(txn.state_entries_max));
        Service {
            transactions,
            txn_budget,
            held_entries: HeldEntries::new(config.held_entries_max),
            np_budget: ByteBudget::new(config.non_persistent_limits.inflight_bytes_max),
            config,
            admin,
            schemas: SchemaRegistry::new(Arc::clone(&meta)),
            topic_watchers: crate::watchers::TopicListWatchers::new(
                Admin::new(Arc::clone(&meta)),
                Arc::clone(&meta),
            ),
            log_env,
            advertised_url,
            metrics,
            reads,
            http_url: std::sync::OnceLock::new(),
            https_url: std::sync::OnceLock::new(),
            ownership: std::sync::OnceLock::new(),
            meta: Arc::clone(&meta),
            write_path_sources: Mutex::new(Vec::new()),
            dynamic: Mutex::new(std::collections::BTreeMap::new()),
            topics: Mutex::new(HashMap::new()),
            np_topics: Mutex::new(HashMap::new()),
            replication_wakeup: tokio::sync::Notify::new(),
            replication_full_pass: std::sync::atomic::AtomicBool::new(false),
            replicators: Mutex::new(HashMap::new()),
            producer_names: AtomicU64::new(0),
            conn_ids: AtomicU64::new(1),
        }
    }

    /// The policies the broker's dynamic configuration sets, by policy key.
    pub(crate) fn dynamic_policies(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        self.dynamic.lock().clone()
    }

    /// Replaces them and applies them to every served topic.
    pub(crate) async fn set_dynamic_policies(
        &self,
        policies: std::collections::BTreeMap<String, serde_json::Value>,
    ) -> Result<(), ServiceError> {
        *self.dynamic.lock() = policies;
        let mut namespaces: Vec<crate::topic_name::NamespaceName> = self
            .served_topic_handles()
            .iter()
            .map(|t| t.name.namespace.clone())
            .collect();
        namespaces.sort_by_key(|ns| ns.to_string());
        namespaces.dedup();
        for ns in namespaces {
            if let Some(policies) = self.admin.namespace_policies(&ns).await? {
                self.apply_policies(&ns, &policies);
            }
        }
        Ok(())
    }

    /// A new connection id.
    pub(crate) fn next_conn_id(&self) -> u64 {
        self.conn_ids.fetch_add(1, Ordering::Relaxed)
    }

    /// A unique producer name (`{cluster}-0-N`, as the Java broker).
    pub(crate) fn next_producer_name(&self) -> String {
        let n = self.producer_names.fetch_add(1, Ordering::Relaxed);
        format!("{}-0-{n}", self.config.cluster_name)
    }

    /// The policies of `topic`'s namespace; TopicNotFound when the namespace
    /// does not exist (what PARTITIONED_METADATA, LOOKUP and topic opens
    /// answer then).
    async fn namespace_policies_of(
        &self,
        topic: &TopicName,
    ) -> Result<NamespacePolicies, ServiceError> {
        self.admin
            .namespace_policies(&topic.namespace)
            .await?
            .ok_or_else(|| {
                ServiceError::new(
                    ServerError::TopicNotFound,
                    format!("Namespace {} does not exist", topic.namespace),
                )
            })
    }

    /// The schema compatibility strategy that applies to `topic`: its own,
    /// else its namespace's, else the broker default (FULL), as Pulsar
    /// resolves it.
    pub(crate) async fn schema_strategy(
        &self,
        topic: &TopicName,
    ) -> Result<CompatibilityStrategy, ServiceError> {
        if let Some(strategy) = self.schemas.topic_strategy(topic).await? {
            return Ok(strategy);
        }
        let policies = self.admin.namespace_policies(&topic.namespace).await?;
        let stored = policies.and_then(|p| p.schema_compatibility_strategy);
        Ok(stored
            .and_then(|name| CompatibilityStrategy::parse(&name).ok().flatten())
            .unwrap_or(CompatibilityStrategy::DEFAULT))
    }

    /// Partitions to answer in PARTITIONED_METADATA: N for a partitioned
    /// topic, 0 otherwise. Fails when the namespace does not exist.
    /// With the namespace's `autoTopicCreation` asking for partitioned
    /// topics, a topic that does not exist yet is created partitioned here
    /// (as Pulsar answers PARTITIONED_METADATA).
    pub(crate) async fn partitions_of(&self, topic: &TopicName) -> Result<u32, ServiceError> {
        let policies = self.namespace_policies_of(topic).await?;
        // A partition is itself a plain topic (as Pulsar answers): a client
        // opening `t-partition-0` must not look for its partitions.
        if topic.partition.is_some() {
            return Ok(0);
        }
        if let Some(n) = self.admin.partitions(topic).await? {
            return Ok(n);
        }
        let auto = AutoCreation::of(&policies, self.config.auto_create_topics);
        if let AutoCreation::Partitioned(n) = auto
            && !self.admin.topic_exists(topic).await?
        {
            self.check_topic_quota(topic, &policies, n as usize).await?;
            match self.admin.create_partitioned_topic(topic, n).await {
                Ok(()) | Err(crate::admin::AdminError::Exists(_)) => {}
                Err(e) => return Err(e.into()),
            }
            return Ok(self.admin.partitions(topic).await?.unwrap_or(0));
        }
        Ok(0)
    }

    /// What opening a topic of either kind checks first: its bundle is owned
    /// here (cluster mode), and of a partitioned topic only a partition in
    /// range is served. Answers the topic's partition count, if partitioned.
    async fn check_servable(&self, topic: &TopicName) -> Result<Option<u32>, ServiceError> {
        if let Some(ownership) = self.ownership.get() {
            ownership
                .check_owned(topic)
                .await
                .map_err(ownership_error)?;
        }
        let partitions = self.admin.partitions(topic).await?;
        match (topic.partition, partitions) {
            (Some(index), Some(n)) if index >= n => {
                return Err(ServiceError::new(
                    ServerError::TopicNotFound,
                    format!("partition {index} of a topic with {n} partitions"),
                ));
            }
            (None, Some(_)) => {
                return Err(ServiceError::new(
                    ServerError::NotAllowedError,
                    format!("{topic} is a partitioned topic: use its partitions"),
                ));
            }
            _ => {}
        }
        Ok(partitions)
    }

    /// The served topic for `topic`, opening (and with `create`, creating) it.
    pub(crate) async fn topic(
        &self,
        topic: &TopicName,
        create: bool,
    ) -> Result<Arc<Topic>, ServiceError> {
        let full_name = topic.to_string();
        if let Some(cell) = self.topics.lock().get(&full_name)
            && let Some(served) = cell.get()
            && !served.log.is_closed()
        {
            return Ok(Arc::clone(served));
        }
        if topic.domain == TopicDomain::NonPersistent {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                format!("{topic} is a non-persistent topic"),
            ));
        }
        let policies = self.namespace_policies_of(topic).await?;
        let partitions = self.check_servable(topic).await?;
        let exists = partitions.is_some() || self.admin.topic_exists(topic).await?;
        let may_create = create
            && AutoCreation::of(&policies, self.config.auto_create_topics) != AutoCreation::Off;
        if !exists && !may_create {
            return Err(ServiceError::new(
                ServerError::TopicNotFound,
                format!("Topic {topic} does not exist"),
            ));
        }
        let cell = {
            let mut topics = self.topics.lock();
            let stale = topics
                .get(&full_name)
                .and_then(|c| c.get())
                .is_some_and(|t| t.log.is_closed());
            if stale {
                topics.remove(&full_name);
            }
            if !topics.contains_key(&full_name)
                && topics.len() + self.np_topics.lock().len() >= TOPICS_MAX
            {
                return Err(ServiceError::new(
                    ServerError::ServiceNotReady,
                    "TOPICS_MAX topics are served already",
                ));
            }
            Arc::clone(topics.entry(full_name.clone()).or_default())
        };
        let served = cell
            .get_or_try_init(|| async {
                if !exists {
                    self.check_topic_quota(topic, &policies, 1).await?;
                }
                let record = self.admin.topic_record(topic).await?;
                let lifecycle =
                    TopicPolicies::resolve(&policies, &record, &self.dynamic_policies());
                let persistence =
                    lifecycle
                        .persistence
                        .map_or(self.config.default_persistence, |(e, w, a)| {
                            crate::config::PersistenceConfig {
                                ensemble: e,
                                write_quorum: w,
                                ack_quorum: a,
                            }
                        });
                let dedup = lifecycle.deduplication.unwrap_or(false);
                self.admin.register_topic(topic).await?;
                let config = LogConfig {
                    persistence: Persistence {
                        ensemble: persistence.ensemble,
                        write_quorum: persistence.write_quorum,
                        ack_quorum: persistence.ack_quorum,
                    },
                    ledger_entries_max: self.config.ledger_entries_max,
                    ledger_bytes_max: self.config.ledger_bytes_max,
                    ledger_age_min: self.config.ledger_rollover_min,
                    ledger_age_max: self.config.ledger_rollover_max,
                    retention: lifecycle.retention,
                    offload: lifecycle.offload_policy(self.config.offload_policy),
                    ..LogConfig::default()
                };
                let log = ManagedLog::open(&self.log_env, &topic.log_name(), config).await?;
                tracing::info!(topic = %full_name, "topic opened");
                let compaction = Compaction::new(
                    crate::admin::compaction_key(topic),
                    Arc::clone(&self.meta),
                    Arc::clone(self.log_env.ledgers()),
                );
                let txn = match &self.txn_budget {
                    Some(budget) => Some(crate::topic::TopicTxn {
                        buffer: crate::txn_buffer::TxnBuffer::open(
                            Arc::clone(&log),
                            Arc::clone(&self.meta),
                            Arc::clone(budget),
                        )
                        .await
                        .map_err(|e| {
                            ServiceError::new(ServerError::ServiceNotReady, e.to_string())
                        })?,
                        acks: crate::topic::PendingAcks::new(
                            full_name.clone(),
                            Arc::clone(&log),
                            Arc::clone(&self.meta),
                            Arc::clone(budget),
                        ),
                    }),
                    None => None,
                };
                let served = Topic::new(
                    topic.clone(),
                    log,
                    dedup,
                    compaction,
                    self.config.topic_limits,
                    self.reads.clone(),
                    Arc::clone(&self.held_entries),
                    txn,
                );
                if lifecycle.compaction_threshold_bytes.is_some() {
                    crate::compaction::compaction_cursor(&served.log).await?;
                }
                served.set_policy_record(record);
                served.set_lifecycle_policies(lifecycle);
                served.rebuild_dedup().await?;
                // Replication cursors from the moment the topic opens, so
                // nothing produced before its replicators start is missed.
                for remote in self.replication_remotes(topic).await? {
                    served
                        .log
                        .open_cursor(
                            &crate::topic::replication_cursor_name(&remote),
                            vela_log::CursorStart::Latest,
                        )
                        .await?;
                }
                self.replication_wakeup.notify_one();
                Ok::<_, ServiceError>(served)
            })
            .await?;
        Ok(Arc::clone(served))
    }

    /// The served non-persistent topic for `topic`, created in place (there
    /// is nothing to open) when `create`, auto-creation or its partitioned
    /// metadata allows. Served under the same rules as persistent topics:
    /// namespace, bundle ownership, partition range, `TOPICS_MAX`.
    pub(crate) async fn non_persistent_topic(
        &self,
        topic: &TopicName,
        create: bool,
    ) -> Result<Arc<NonPersistentTopic>, ServiceError> {
        debug_assert_eq!(topic.domain, TopicDomain::NonPersistent);
        let full_name = topic.to_string();
        if let Some(served) = self.np_topics.lock().get(&full_name)
            && !served.is_closed()
        {
            return Ok(Arc::clone(served));
        }
        self.namespace_policies_of(topic).await?;
        let partitions = self.check_servable(topic).await?;
        let partition_of_metadata = topic.partition.is_some() && partitions.is_some();
        let may_create = create && self.config.auto_create_topics;
        if !(partition_of_metadata || may_create) {
            return Err(ServiceError::new(
                ServerError::TopicNotFound,
                format!("Topic {topic} not found"),
            ));
        }
        let persistent = self.topics.lock().len();
        let mut served = self.np_topics.lock();
        if let Some(existing) = served.get(&full_name)
            && !existing.is_closed()
        {
            return Ok(Arc::clone(existing));
        }
        if persistent + served.len() >= TOPICS_MAX {
            return Err(ServiceError::new(
                ServerError::ServiceNotReady,
                "TOPICS_MAX topics are served already",
            ));
        }
        let created = NonPersistentTopic::new(
            topic.clone(),
            self.config.topic_limits,
            self.config.non_persistent_limits.topic_inflight_bytes_max,
            Arc::clone(&self.np_budget),
        );
        served.insert(full_name.clone(), Arc::clone(&created));
        tracing::info!(topic = %full_name, "non-persistent topic created");
        Ok(created)
    }

    /// The non-persistent topic if it is served now.
    pub(crate) fn served_non_persistent(&self, full_name: &str) -> Option<Arc<NonPersistentTopic>> {
        self.np_topics
            .lock()
            .get(full_name)
            .filter(|t| !t.is_closed())
            .cloned()
    }

    /// Full names of the non-persistent topics of `ns` served now, sorted;
    /// with `active_only` only those with producers or subscriptions
    /// (what Pulsar's GET_TOPICS_OF_NAMESPACE lists).
    pub(crate) fn non_persistent_topics_of(
        &self,
        ns: &crate::topic_name::NamespaceName,
        active_only: bool,
    ) -> Vec<String> {
        let mut names: Vec<String> = self
            .np_topics
            .lock()
            .values()
            .filter(|t| &t.name.namespace == ns && !t.is_closed())
            .filter(|t| !active_only || t.is_active())
            .map(|t| t.full_name.clone())
            .collect();
        names.sort();
        names
    }

    /// Closes and forgets the non-persistent topics nobody uses (no
    /// producer, no consumer): the lifecycle pass's garbage collection, as
    /// Pulsar deletes inactive topics. Their subscriptions go with them.
    pub(crate) async fn drop_idle_non_persistent_topics(&self) {
        let idle: Vec<Arc<NonPersistentTopic>> = {
            let mut served = self.np_topics.lock();
            let names: Vec<String> = served
                .iter()
                .filter(|(_, t)| t.is_closed() || !t.has_clients())
                .map(|(name, _)| name.clone())
                .collect();
            names.iter().filter_map(|n| served.remove(n)).collect()
        };
        for topic in idle {
            topic.close().await;
            tracing::debug!(topic = %topic.full_name, "idle non-persistent topic dropped");
        }
    }

    /// This broker's URLs as lookups answer them and its cluster
    /// registration publishes them: the Pulsar URL (plain, else TLS), the
    /// TLS one, the admin URL (plain, else HTTPS) and the HTTPS one (each
    /// the internal advertised listener's when it has one), and its
    /// advertised listeners. Read after the HTTP listeners started.
    pub(crate) fn me(&self) -> BrokerInfo {
        let config = &self.config;
        let https_url = config
            .listener_url(|l| &l.https_url)
            .or_else(|| self.https_url.get().cloned());
        let http_url = config
            .listener_url(|l| &l.http_url)
            .or_else(|| self.http_url.get().cloned())
            .or_else(|| https_url.clone());
        BrokerInfo {
            id: config.broker_id(),
            service_url: self.advertised_url.clone(),
            service_url_tls: config.advertised_tls_url(),
            http_url: http_url.unwrap_or_default(),
            http_url_tls: https_url,
            load: LoadReport::default(),
            listeners: config.advertised_listeners.listeners.clone(),
        }
    }

    /// Who serves `topic`, with all its URLs: `Connect` (it owns the topic;
    /// this broker itself in standalone mode) or `Redirect` (the client must
    /// ask that broker, authoritatively). Fails when the namespace does not
    /// exist.
    pub(crate) async fn lookup(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<LookupAnswer, ServiceError> {
        self.namespace_policies_of(topic).await?;
        let Some(ownership) = self.ownership.get() else {
            return Ok(LookupAnswer::Connect(self.me()));
        };
        ownership
            .lookup(topic, authoritative)
            .await
            .map_err(ownership_error)
    }

    /// Unloads every served topic of `range` in `ns`, then gives the bundle up.
    pub(crate) async fn unload_bundle(
        &self,
        ns: &crate::topic_name::NamespaceName,
        range: &BundleRange,
    ) -> Result<usize, ServiceError> {
        let Some(ownership) = self.ownership.get() else {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                "bundles are served by one broker in standalone mode",
            ));
        };
        let unloaded = self.unload_topics_of(ns, range).await?;
        ownership
            .release(ns, range)
            .await
            .map_err(ownership_error)?;
        Ok(unloaded)
    }

    /// Unloads every served topic of `range` in `ns`.
    pub(crate) async fn unload_topics_of(
        &self,
        ns: &crate::topic_name::NamespaceName,
        range: &BundleRange,
    ) -> Result<usize, ServiceError> {
        let mut unloaded = 0;
        for name in self.served_topics() {
            let Ok(topic) = TopicName::parse(&name) else {
                continue;
            };
            if &topic.namespace == ns && range.contains(crate::ownership::topic_hash(&topic)) {
                self.unload(&name).await?;
                unloaded += 1;
            }
        }
        Ok(unloaded)
    }

    /// Full names of the topics served now (persistent and
    /// non-persistent), sorted.
    pub(crate) fn served_topics(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .topics
            .lock()
            .iter()
            .filter(|(_, c)| c.get().is_some())
            .map(|(n, _)| n.clone())
            .collect();
        names.extend(self.np_topics.lock().keys().cloned());
        names.sort();
        names
    }

    /// The topics served now (opened), in no particular order.
    pub(crate) fn served_topic_handles(&self) -> Vec<Arc<Topic>> {
        self.topics
            .lock()
            .values()
            .filter_map(|c| c.get().cloned())
            .filter(|t| !t.log.is_closed())
            .collect()
    }

    /// The topic if it is served now.
    pub(crate) fn served_topic(&self, full_name: &str) -> Option<Arc<Topic>> {
        self.topics
            .lock()
            .get(full_name)
            .and_then(|c| c.get().cloned())
    }

    /// Unloads a served topic: its clients are closed (they look up again and
    /// re-attach, reopening it). False when it was not served.
    pub(crate) async fn unload(&self, full_name: &str) -> Result<bool, ServiceError> {
        let served = self
            .topics
            .lock()
            .remove(full_name)
            .and_then(|c| c.get().cloned());
        match served {
            Some(topic) => {
                topic.close().await?;
                tracing::info!(topic = full_name, "topic unloaded");
                Ok(true)
            }
            None => {
                let np = self.np_topics.lock().remove(full_name);
                let Some(topic) = np else {
                    return Ok(false);
                };
                topic.close().await;
                tracing::info!(topic = full_name, "non-persistent topic unloaded");
                Ok(true)
            }
        }
    }

    /// Deletes a (non-partitioned or partition) topic: clients closed, log,
    /// cursors and ledgers deleted, registration removed.
    pub(crate) async fn delete_topic(&self, topic: &TopicName) -> Result<(), ServiceError> {
        let full_name = topic.to_string();
        if topic.domain == TopicDomain::NonPersistent {
            // Nothing is stored: closing its clients is all there is.
            let served = self.np_topics.lock().remove(&full_name);
            let Some(served) = served else {
                return Err(ServiceError::new(
                    ServerError::TopicNotFound,
                    format!("Topic {topic} not found"),
                ));
            };
            served.close().await;
            tracing::info!(topic = %full_name, "non-persistent topic deleted");
            return Ok(());
        }
        let served = self
            .topics
            .lock()
            .remove(&full_name)
            .and_then(|c| c.get().cloned());
        let served = match served {
            Some(served) => served,
            None => {
                if !self.admin.topic_exists(topic).await? {
                    return Err(ServiceError::new(
                        ServerError::TopicNotFound,
                        format!("Topic {topic} does not exist"),
                    ));
                }
                self.topic(topic, false).await?;
                match self
                    .topics
                    .lock()
                    .remove(&full_name)
                    .and_then(|c| c.get().cloned())
                {
                    Some(served) => served,
                    None => {
                        return Err(ServiceError::new(
                            ServerError::ServiceNotReady,
                            "topic changed while deleting, retry",
                        ));
                    }
                }
            }
        };
        served.delete().await?;
        self.admin.unregister_topic(topic).await?;
        tracing::info!(topic = %full_name, "topic deleted");
        Ok(())
    }

    /// Applies a namespace's (new) policies to its served topics, each
    /// resolved with the topic's own (topic > namespace > broker): the
    /// persistence reaches each topic's next ledger (the open one keeps its
    /// replication, as in Pulsar); the publish rate applies at once, count
    /// limits at the next PRODUCER or SUBSCRIBE, TTL, backlog quotas and
    /// retention from the next lifecycle pass. Deduplication changes apply
    /// when a topic next opens.
    pub(crate) fn apply_policies(
        &self,
        ns: &crate::topic_name::NamespaceName,
        policies: &NamespacePolicies,
    ) {
        let served: Vec<Arc<Topic>> = self
            .topics
            .lock()
            .values()
            .filter_map(|c| c.get().cloned())
            .filter(|t| t.name.namespace == *ns)
            .collect();
        for topic in served {
            let record = topic.policy_record();
            self.apply_to(&topic, policies, record);
        }
    }

    /// Applies a topic's (new) own policies to it, or to each served
    /// partition of a partitioned topic, as `apply_policies` does.
    pub(crate) async fn apply_topic_record(
        &self,
        topic: &TopicName,
        record: &crate::admin::TopicRecord,
    ) -> Result<(), ServiceError> {
        let base = topic.base();
        let served: Vec<Arc<Topic>> = self
            .topics
            .lock()
            .values()
            .filter_map(|c| c.get().cloned())
            .filter(|t| t.name.base() == base)
            .collect();
        if served.is_empty() {
            return Ok(());
        }
        let policies = self.namespace_policies_of(topic).await?;
        for served in served {
            self.apply_to(&served, &policies, record.clone());
        }
        Ok(())
    }

    fn apply_to(
        &self,
        topic: &Topic,
        policies: &NamespacePolicies,
        record: crate::admin::TopicRecord,
    ) {
        let resolved = TopicPolicies::resolve(policies, &record, &self.dynamic_policies());
        let persistence = resolved.persistence.map_or(
            self.config.default_persistence,
            |(ensemble, write_quorum, ack_quorum)| crate::config::PersistenceConfig {
                ensemble,
                write_quorum,
                ack_quorum,
            },
        );
        topic.log.set_retention(resolved.retention);
        topic
            .log
            .set_offload_policy(resolved.offload_policy(self.config.offload_policy));
        topic.set_policy_record(record);
        topic.set_lifecycle_policies(resolved);
        let result = topic.log.set_persistence(Persistence {
            ensemble: persistence.ensemble,
            write_quorum: persistence.write_quorum,
            ack_quorum: persistence.ack_quorum,
        });
        if let Err(error) = result {
            tracing::warn!(topic = %topic.full_name, %error, "persistence not applied");
        }
    }

    /// Refuses `adding` new topics named `topic` past their namespace's
    /// `maxTopicsPerNamespace` (partitions count one each, as in Pulsar).
    pub(crate) async fn check_topic_quota(
        &self,
        topic: &TopicName,
        policies: &NamespacePolicies,
        adding: usize,
    ) -> Result<(), ServiceError> {
        let dynamic = self.dynamic_policies();
        let max = policies
            .policies
            .get("maxTopicsPerNamespace")
            .or_else(|| dynamic.get("maxTopicsPerNamespace"))
            .and_then(crate::admin::policy_specs::int_of)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0);
        let Some(max) = max else {
            return Ok(());
        };
        let existing = self.admin.topics_of_namespace(&topic.namespace).await?;
        if existing.iter().any(|t| *t == topic.to_string()) {
            return Ok(());
        }
        if existing.len().saturating_add(adding) > max {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                "Exceed maximum number of topics in namespace",
            ));
        }
        Ok(())
    }

    /// Registers a source of write-path stages (ledger client, bookies).
    pub(crate) fn add_write_path_source(
        &self,
        source: Arc<dyn WritePathSource>,
    ) -> Result<(), ServiceError> {
        let mut sources = self.write_path_sources.lock();
        if sources.len() >= crate::metrics::WRITE_PATH_SOURCES_MAX {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                "WRITE_PATH_SOURCES_MAX sources are registered",
            ));
        }
        sources.push(source);
        Ok(())
    }

    /// Every write-path and read-path stage: the broker's own (publish
    /// latency, the subscriptions' reads), then the registered sources'
    /// stages.
    pub(crate) fn write_path(&self) -> Vec<StageLatency> {
        let broker = |stage, latency| StageLatency {
            stage,
            instance: "broker".to_string(),
            latency,
        };
        let reads = &self.metrics.reads;
        let mut stages = vec![
            broker(
                Stage::BrokerPublish,
                self.metrics.publish_latency.snapshot(),
            ),
            broker(Stage::DispatcherReadWait, reads.read_wait.snapshot()),
            broker(Stage::DispatcherRead, reads.read.snapshot()),
        ];
        let sources: Vec<Arc<dyn WritePathSource>> = self.write_path_sources.lock().clone();
        for source in sources {
            stages.extend(source.stages());
        }
        stages
    }

    /// The registered sources' storage metrics, each source's bounded by
    /// `STORAGE_METRICS_PER_SOURCE_MAX`.
    pub(crate) fn storage_metrics(&self) -> Vec<crate::metrics::StorageMetric> {
        let sources: Vec<Arc<dyn WritePathSource>> = self.write_path_sources.lock().clone();
        let mut out = vec![
            crate::metrics::StorageMetric {
                family: crate::metrics::StorageFamily::ReadAheadBytes,
                instance: "broker".to_string(),
                label: Some(("max", self.config.read_ahead_bytes_max.to_string())),
                value: self.reads.budget.held_bytes() as f64,
            },
            crate::metrics::StorageMetric {
                family: crate::metrics::StorageFamily::ReadBytes,
                instance: "broker".to_string(),
                label: Some(("stage", Stage::DispatcherRead.as_str().to_string())),
                value: self
                    .metrics
                    .reads
                    .read_bytes
                    .load(std::sync::atomic::Ordering::Relaxed) as f64,
            },
        ];
        for source in sources {
            let mut metrics = source.storage_metrics();
            if metrics.len() > crate::metrics::STORAGE_METRICS_PER_SOURCE_MAX {
                tracing::warn!(
                    count = metrics.len(),
                    "a write-path source returned too many storage metrics; dropping the rest"
                );
                metrics.truncate(crate::metrics::STORAGE_METRICS_PER_SOURCE_MAX);
            }
            out.extend(metrics);
        }
        out
    }

    /// Closes every topic (shutdown), many at once (`shutdown::close_all`).
    pub(crate) async fn close_topics(&self) -> Vec<vela_log::LogError> {
        let topics = self
            .topics
            .lock()
            .drain()
            .filter_map(|(_, c)| c.get().cloned())
            .collect();
        let np = self.np_topics.lock().drain().map(|(_, t)| t).collect();
        crate::shutdown::close_all(topics, np).await
    }
}

/// How a topic that does not exist may be created when a client asks for
/// it: the namespace's `autoTopicCreation` policy, else the broker's flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AutoCreation {
    Off,
    NonPartitioned,
    Partitioned(u32),
}

impl AutoCreation {
    fn of(policies: &NamespacePolicies, broker_allows: bool) -> AutoCreation {
        let Some(policy) = policies.policies.get("autoTopicCreation").and_then(|v| {
            serde_json::from_value::<crate::admin::policy_specs::AutoTopicCreationJson>(v.clone())
                .ok()
        }) else {
            return if broker_allows {
                AutoCreation::NonPartitioned
            } else {
                AutoCreation::Off
            };
        };
        if !policy.allow_auto_topic_creation {
            return AutoCreation::Off;
        }
        match (policy.topic_type.as_deref(), policy.default_num_partitions) {
            (Some("partitioned"), Some(n)) => u32::try_from(n)
                .ok()
                .filter(|n| (1..=crate::admin::PARTITIONS_MAX).contains(n))
                .map_or(AutoCreation::NonPartitioned, AutoCreation::Partitioned),
            _ => AutoCreation::NonPartitioned,
        }
    }
}

/// Ownership failures as the protocol reports them: a client told
/// ServiceNotReady looks the topic up again.
pub(crate) fn ownership_error(error: OwnershipError) -> ServiceError {
    let code = match &error {
        OwnershipError::Meta(_) | OwnershipError::Corrupt { .. } => ServerError::MetadataError,
        OwnershipError::OwnedElsewhere { .. }
        | OwnershipError::NoBroker
        | OwnershipError::SessionLost => ServerError::ServiceNotReady,
        OwnershipError::CannotSplit(_) => ServerError::NotAllowedError,
    };
    ServiceError::new(code, error.to_string())
}
