//! The broker service: the topics being served, shared by all connections.
//!
//! Owns: the `Service` state (the maps from full topic name to [`Topic`] and
//! to non-persistent topics, the broker-wide budgets and metrics),
//! broker-assigned producer names and connection ids. Its jobs are split by
//! module, each an `impl Service` over these fields:
//! - `open`: whether a topic may be served and opening it (each opened
//!   once, even when many connections ask at the same time),
//!   auto-creation, PARTITIONED_METADATA;
//! - `non_persistent`: non-persistent topics, created in place;
//! - `served`: the topics open now: listing, unloading, deleting, closing;
//! - `policies`: dynamic configuration and new policies reaching served
//!   topics, the schema compatibility strategy;
//! - `lookup`: this broker's URLs and who serves a topic;
//! - `stages`: the write- and read-path stages and storage metrics;
//! - `replicators`: the service's side of geo-replication.
//!
//! This file never names its children (they extend `Service`).
//! Never: speaks the protocol (connections do) or stores entries (logs do).

mod lookup;
mod non_persistent;
mod open;
mod policies;
mod replicators;
mod served;
mod stages;

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::OnceCell;
use vela_log::{LogEnv, Persistence};
use vela_meta::MetadataStore;
use vela_wire::proto::ServerError;

use crate::admin::{Admin, NamespacePolicies};
use crate::config::BrokerConfig;
use crate::error::ServiceError;
use crate::inflight::ByteBudget;
use crate::metrics::WritePathSource;
use crate::nonpersistent::NonPersistentTopic;
use crate::ownership::{Ownership, OwnershipError};
use crate::schema::SchemaRegistry;
use crate::subscription::HeldEntries;
use crate::topic::Topic;
use crate::topic_name::TopicName;

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
    /// One copy of each namespace's resolved policies, shared by its served
    /// topics that have none of their own.
    shared_policies: crate::policies::shared::SharedPolicies,
    /// The subscriptions' read-ahead budget (`read_ahead_bytes_max`) and
    /// read-path stages, shared by every subscription.
    pub(crate) reads: crate::subscription::SubscriptionReads,
    /// Served topics by full name (the key is the topic's own
    /// `Topic::full_name`, one copy).
    topics: Mutex<HashMap<Arc<str>, TopicCell>>,
    /// Entries held by all subscriptions (`BrokerConfig::held_entries_max`).
    pub(crate) held_entries: Arc<HeldEntries>,
    /// What topics' compactions use, shared by them.
    pub(crate) compaction_env: Arc<crate::compaction::CompactionEnv>,
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
    /// How this broker reaches the others (`BrokerConfig::broker_client`,
    /// resolved at start when transactions are on; unset: plain, no token).
    pub(crate) peer_credentials: std::sync::OnceLock<Arc<crate::broker_client::PeerCredentials>>,
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
        read_pool: Arc<crate::subscription::ReadPool>,
    ) -> Service {
        let metrics = crate::metrics::BrokerMetrics::default();
        let reads = crate::subscription::SubscriptionReads::new(
            config.read_ahead_bytes_max,
            Arc::clone(&metrics.reads),
            read_pool,
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
            compaction_env: Arc::new(crate::compaction::CompactionEnv {
                meta: Arc::clone(&meta),
                ledgers: Arc::clone(log_env.ledgers()),
            }),
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
            shared_policies: crate::policies::shared::SharedPolicies::default(),
            topics: Mutex::new(HashMap::new()),
            np_topics: Mutex::new(HashMap::new()),
            replication_wakeup: tokio::sync::Notify::new(),
            replication_full_pass: std::sync::atomic::AtomicBool::new(false),
            replicators: Mutex::new(HashMap::new()),
            peer_credentials: std::sync::OnceLock::new(),
            producer_names: AtomicU64::new(0),
            conn_ids: AtomicU64::new(1),
        }
    }

    /// How this broker reaches the other brokers of its cluster.
    pub(crate) fn peers(&self) -> Arc<crate::broker_client::PeerCredentials> {
        self.peer_credentials.get().cloned().unwrap_or_default()
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

/// A new topic past `BrokerConfig::topics_max`: ServiceNotReady, which a
/// client retries (by then another broker may own the bundle, or topics
/// were unloaded); the message names the flag that raises the bound.
pub(crate) fn topics_max_reached(topics_max: usize) -> ServiceError {
    ServiceError::new(
        ServerError::ServiceNotReady,
        format!("this broker serves {topics_max} topics already (--max-topics-per-broker)"),
    )
}
