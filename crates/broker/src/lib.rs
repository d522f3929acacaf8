//! vela-broker: the Pulsar binary-protocol server. Official Pulsar clients
//! (Java, C++/Python, Go, pulsar-rs) connect to it unchanged.
//!
//! Owns: the Pulsar listeners (`accept`) and connections (`connection`), the
//! topics being served (`service`, `topic`), subscriptions and dispatch
//! (`subscription`, `key_shared`), compaction (`compaction`), the policies
//! applied over time (`policies`, `lifecycle`), statistics snapshots
//! (`stats`), broker metrics (`metrics`), tenants/namespaces/partitioned
//! metadata and their REST JSON (`admin`), cluster ownership (`ownership`,
//! `cluster`), the HTTP admin API, lookup and `/metrics` (`http`), schemas
//! (`schema`) and topic names (`topic_name`). Frames are decoded and encoded
//! by `vela-wire` behind the small `codec` seam.
//! Never: stores entries itself (`vela-log` does), unpacks a client's batch on
//! the write path, sends 0x0e02 broker entry metadata, or lets one bad client
//! affect another connection.
//!
//! Layering (bottom first). A module uses only modules of its own layer or
//! below, and no two modules use each other, directly or not, at any depth
//! (`tests/layering.rs` checks both against this list):
//! 1. vocabulary: `topic_name`, `error`, `tls`, `auth`, `config`, `metrics`, `stats`, `codec`, `markers`, `arrival`, `key_shared`, `inflight`, `topic_list`, `listeners`, `rate_limit`
//! 2. stored state: `admin`, `authorization`, `schema`, `ownership`, `policies`, `broker_client`
//! 3. topics: `compaction`, `txn_buffer`, `subscription`, `topic`, `nonpersistent`
//! 4. the service: `transaction`, `txn_client`, `shutdown`, `service`, `txn_participants`, `lifecycle`, `cluster`, `watchers`, `policy_watch`, `replication`
//! 5. edges: `connection`, `accept`, `http`
//!
//! Inside a directory module the same holds: `mod.rs` may use its children,
//! a child its siblings, and a child that extends its parent's type (`impl
//! Topic` in `topic::stats`) is never named by the parent. New work finds its
//! layer: a command family is a module in `connection` plus one match arm; a
//! non-persistent topic or a transaction buffer sits in layer 3 beside
//! `topic`; a transaction coordinator or replicators in layer 4; REST routes
//! in `http`.
//!
//! Write path: connection reader → `Topic::publish` (issues
//! `ManagedLog::append`, under the dedup table's lock only when deduplication
//! is on; `topic::publish` states why entries keep SEND order without a lock
//! of the broker's) → the producer's receipts: each append's completion
//! answers its SEND_RECEIPT, in SEND order, with no task per SEND.
//! Read path: one task per subscription keeps a bounded read-ahead of the log
//! (one read in flight while earlier reads are delivered; all subscriptions
//! within `BrokerConfig::read_ahead_bytes_max`) and sends MESSAGE frames
//! (header + the stored entry, never copied) through each consumer
//! connection's outbound queue.
//!
//! Bounds (named constants beside their use): connections in all and per
//! client IP ([`ConnectionCaps`], checked at accept), topics
//! (`BrokerConfig::topics_max`), producers and consumers per connection and
//! pending SEND count/bytes per connection ([`ConnectionLimits`]), producers,
//! consumers and publish rate per topic and consumers per subscription
//! ([`TopicLimits`]), subscriptions per topic, unacked/replay/delayed entries
//! per subscription, read batch size, read-ahead bytes, ack_set length, name lengths, schema
//! versions per topic, bytes of non-persistent messages in flight per topic
//! and in all ([`NonPersistentLimits`]: full → dropped and counted).
//!
//! Security (off by default): TLS listeners (`tls`), token authentication
//! (`auth`) and authorization (`authorization`), checked at each command
//! handler and by the HTTP layer.
//!
//! Termination: a terminated topic's log takes no more entries (persisted
//! in its record); producers are closed and refused (TopicTerminatedError),
//! subscriptions tell their consumers REACHED_END_OF_TOPIC once everything
//! is acknowledged.
//!
//! Non-persistent topics (`nonpersistent`): a SEND is handed at once to
//! every subscription, which gives it to a consumer with permits and room or
//! drops it (counted); nothing is stored, acks are forgotten.
//!
//! Geo-replication (`replication`, layer 4): one replicator per served
//! topic and remote cluster named by the topic's or its namespace's
//! replication clusters; it reads the log from the durable cursor
//! `pulsar.repl.{remote}` and produces each entry, as stored plus
//! `replicated_from`, to the remote cluster with the native client
//! (`vela-client`), under the producer name `pulsar.repl.{local}-->{remote}`;
//! SENDs of such producers are always deduplicated (`topic::dedup`), by the
//! source position the replicator sends as sequence id. Clusters are
//! metadata (`admin::clusters`, REST in `http::clusters`).
//!
//! Topic lists: GET_TOPICS_OF_NAMESPACE honours the client's mode, pattern
//! and topics hash (`topic_list`); topic list watchers (`watchers`, one
//! feed per namespace following its topic records) tell pattern consumers
//! of created and deleted topics at once.
//!
//! Transactions (`transaction`, off unless `BrokerConfig::transactions`):
//! the coordinators (one per partition of
//! `pulsar/system/transaction_coordinator_assign`, each with a durable log
//! replayed on open, timeouts, Pulsar's errors), which carry each outcome
//! out on the partitions and subscriptions of the transaction
//! (`transaction::Participants`, served by `txn_participants`); each
//! topic's transaction buffer (`txn_buffer`: entries invisible until
//! commit, markers, the read limit) and pending acks
//! (`topic::pending_acks`).
//! Deduplication keeps no snapshot: its table is rebuilt from the newest
//! `DEDUP_REBUILD_ENTRIES_MAX` entries when a topic opens.

mod accept;
pub mod admin;
mod arrival;
pub mod auth;
mod authorization;
mod broker_client;
mod cluster;
mod codec;
mod compaction;
pub mod config;
mod connection;
mod error;
mod http;
mod inflight;
pub mod key_shared;
mod lifecycle;
pub mod listeners;
mod markers;
pub mod metrics;
mod nonpersistent;
pub mod ownership;
mod policies;
mod policy_watch;
mod rate_limit;
mod replication;
pub mod schema;
mod service;
mod shutdown;
pub mod stats;
mod subscription;
pub mod tls;
mod topic;
mod topic_list;
pub mod topic_name;
mod transaction;
mod txn_buffer;
mod txn_client;
mod txn_participants;
mod watchers;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::TcpListener;
use tokio::sync::{Semaphore, watch};
use vela_log::LogEnv;
use vela_meta::MetadataStore;

pub use admin::{Admin, AdminError, AuthAction, NamespacePolicies};
pub use auth::{AuthConfig, Authorization};
pub use config::{
    BrokerConfig, ConnectionCaps, ConnectionLimits, NonPersistentLimits, PersistenceConfig,
    PublishRate, TopicLimits, TransactionConfig,
};
pub use error::{BrokerError, ServiceError};
pub use http::HttpServer;
pub use metrics::{Stage, StageLatency, StorageFamily, StorageMetric, WritePathSource};
pub use stats::{ConsumerStats, PublisherStats, SubscriptionStats, TopicStats};
pub use tls::TlsConfig;
pub use topic_name::{NamespaceName, TopicName};

use service::Service;

/// The broker entry point.
#[derive(Debug)]
pub struct Broker;

impl Broker {
    /// Binds the Pulsar listeners (plain and/or TLS), creates `public` and
    /// `public/default` when absent, and starts serving.
    pub async fn start(
        mut config: BrokerConfig,
        meta: Arc<dyn MetadataStore>,
        log_env: LogEnv,
    ) -> Result<BrokerHandle, BrokerError> {
        if config.pulsar_tls_addr.is_some() && config.tls.is_none() {
            return Err(BrokerError::Config(
                "pulsar_tls_addr is set but tls (certificate and key files) is not".into(),
            ));
        }
        if config.pulsar_addr.is_none() && config.pulsar_tls_addr.is_none() {
            return Err(BrokerError::Config(
                "no Pulsar listener: set pulsar_addr or pulsar_tls_addr".into(),
            ));
        }
        let certs = match &config.tls {
            Some(tls) => Some(tls::TlsCertificates::load(tls.clone()).await?),
            None => None,
        };
        let plain = match config.pulsar_addr {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        let secure = match config.pulsar_tls_addr {
            Some(addr) => Some(TcpListener::bind(addr).await?),
            None => None,
        };
        // From here on the config holds the bound addresses (port 0 resolved):
        // lookups answer with them.
        config.pulsar_addr = plain.as_ref().map(TcpListener::local_addr).transpose()?;
        config.pulsar_tls_addr = secure.as_ref().map(TcpListener::local_addr).transpose()?;
        let Some(local) = config.pulsar_addr.or(config.pulsar_tls_addr) else {
            return Err(BrokerError::Config("no Pulsar listener bound".into()));
        };
        // The plain URL, else (TLS only) the TLS one.
        let Some(advertised_url) = config
            .advertised_plain_url()
            .or_else(|| config.advertised_tls_url())
        else {
            return Err(BrokerError::Config("no Pulsar URL to advertise".into()));
        };
        let local_cluster = admin::ClusterData {
            broker_service_url: config.advertised_plain_url(),
            broker_service_url_tls: config.advertised_tls_url(),
            ..admin::ClusterData::default()
        };
        // The broker-client settings are read once; with transactions on,
        // brokers reach each other with them, so they must work.
        let peers = if config.transactions.is_some() {
            let peers = broker_client::PeerCredentials::resolve(&config.broker_client)
                .await
                .map_err(|e| BrokerError::Config(format!("brokerClient settings: {e}")))?;
            Some(Arc::new(peers))
        } else {
            None
        };
        if i32::from(config.catch_up_read_nice) > subscription::READ_NICE_MAX {
            return Err(BrokerError::Config(format!(
                "catch_up_read_nice {} is over {}",
                config.catch_up_read_nice,
                subscription::READ_NICE_MAX
            )));
        }
        let read_pool = Arc::new(subscription::ReadPool::new(i32::from(
            config.catch_up_read_nice,
        ))?);
        let service = Arc::new(Service::new(
            config,
            meta,
            log_env,
            advertised_url,
            read_pool,
        ));
        if let Some(peers) = peers {
            let _ = service.peer_credentials.set(peers);
        }
        service
            .admin
            .ensure_cluster(&service.config.cluster_name, &local_cluster)
            .await?;
        service.admin.ensure_defaults().await?;
        http::load_dynamic_config(&service).await?;
        policy_watch::start(&service)
            .await
            .map_err(|e| BrokerError::Config(format!("watching stored policies: {e}")))?;
        if let Some(transactions) = &service.transactions {
            transactions.set_participants(Arc::new(txn_participants::LocalParticipants::new(
                Arc::downgrade(&service),
            )));
            service
                .admin
                .ensure_coordinator_assign(transactions.count())
                .await?;
        }
        tokio::spawn(lifecycle::run(
            Arc::downgrade(&service),
            service.config.policy_check_interval,
        ));
        let (shutdown_tx, shutdown_rx) = watch::channel(false);
        tokio::spawn(replication::run(
            Arc::downgrade(&service),
            shutdown_rx.clone(),
        ));
        let slots = Arc::new(Semaphore::new(service.config.connection_caps.total_max));
        let mut accepts = Vec::new();
        if let Some(listener) = plain {
            accepts.push(tokio::spawn(accept::accept_loop(
                listener,
                Arc::clone(&service),
                shutdown_rx.clone(),
                None,
                Arc::clone(&slots),
            )));
        }
        if let (Some(listener), Some(certs)) = (secure, &certs) {
            accepts.push(tokio::spawn(accept::accept_loop(
                listener,
                Arc::clone(&service),
                shutdown_rx.clone(),
                Some(Arc::clone(certs)),
                Arc::clone(&slots),
            )));
        }
        if let Some(certs) = &certs {
            let mut stop = shutdown_rx.clone();
            tokio::spawn(tls::reload_loop(Arc::downgrade(certs), async move {
                let _ = stop.changed().await;
            }));
        }
        tracing::info!(
            addr = ?service.config.pulsar_addr,
            tls_addr = ?service.config.pulsar_tls_addr,
            url = %service.advertised_url,
            auth = service.config.auth.is_some(),
            "broker listening"
        );
        Ok(BrokerHandle {
            pulsar_addr: local,
            service,
            shutdown_tx,
            accepts,
            certs,
        })
    }
}

/// A running broker.
#[derive(Debug)]
pub struct BrokerHandle {
    pulsar_addr: SocketAddr,
    service: Arc<Service>,
    shutdown_tx: watch::Sender<bool>,
    accepts: Vec<tokio::task::JoinHandle<()>>,
    certs: Option<Arc<tls::TlsCertificates>>,
}

impl BrokerHandle {
    /// Starts the HTTP listener (admin API, health) on `addr`.
    pub async fn start_http(&self, addr: SocketAddr) -> Result<HttpServer, BrokerError> {
        HttpServer::start(addr, Arc::clone(&self.service), None).await
    }

    /// Starts the HTTPS listener (same routes) on `addr`, with the
    /// certificate of the TLS config (reloaded as the Pulsar port's).
    pub async fn start_https(&self, addr: SocketAddr) -> Result<HttpServer, BrokerError> {
        let Some(certs) = &self.certs else {
            return Err(BrokerError::Config(
                "an HTTPS port needs tls (certificate and key files)".into(),
            ));
        };
        HttpServer::start(addr, Arc::clone(&self.service), Some(Arc::clone(certs))).await
    }

    /// Address of the TLS Pulsar listener, when there is one.
    pub fn pulsar_tls_addr(&self) -> Option<SocketAddr> {
        self.service.config.pulsar_tls_addr
    }

    /// `pulsar+ssl://host:port` of the TLS listener, when there is one.
    pub fn service_url_tls(&self) -> Option<String> {
        self.service.config.advertised_tls_url()
    }

    /// Joins the cluster: registers this broker in the metadata store (on a
    /// session of `session_ttl`) and from then on serves only the namespace
    /// bundles it owns; lookups answer with each bundle's owner. Call after
    /// `start_http` and `start_https` (their URLs go into the registration,
    /// beside the Pulsar URLs, plain and TLS). When the session
    /// ends (expired: this broker was cut off) every topic is unloaded and
    /// the broker registers again with a new session.
    pub async fn join_cluster(&self, session_ttl: Duration) -> Result<(), BrokerError> {
        let service = &self.service;
        let me = service.me();
        let ownership = ownership::Ownership::start(Arc::clone(&service.meta), me, session_ttl)
            .await
            .map_err(|e| BrokerError::Cluster(e.to_string()))?;
        if service.ownership.set(Arc::clone(&ownership)).is_err() {
            return Err(BrokerError::Cluster("already joined".to_string()));
        }
        tokio::spawn(cluster::duties(
            Arc::downgrade(service),
            ownership,
            self.shutdown_tx.subscribe(),
        ));
        Ok(())
    }

    /// Address the plain Pulsar listener is bound to (the TLS one's when
    /// there is no plain listener).
    pub fn pulsar_addr(&self) -> SocketAddr {
        self.pulsar_addr
    }

    /// The URL clients are sent to by lookups (`pulsar://host:port`).
    pub fn service_url(&self) -> &str {
        &self.service.advertised_url
    }

    /// Tenants, namespaces and partitioned-topic metadata.
    pub fn admin(&self) -> &Admin {
        &self.service.admin
    }

    /// Creates a partitioned topic with `partitions` partitions.
    pub async fn create_partitioned_topic(
        &self,
        topic: &str,
        partitions: u32,
    ) -> Result<(), BrokerError> {
        let name = TopicName::parse(topic)?;
        self.service
            .admin
            .create_partitioned_topic(&name, partitions)
            .await?;
        Ok(())
    }

    /// Registers a source of write-path stages below the broker (the ledger
    /// client's adds, the bookies' adds and journal stages) for `/metrics`
    /// and the write-path breakdown. At most `metrics::WRITE_PATH_SOURCES_MAX`.
    pub fn add_write_path_source(
        &self,
        source: Arc<dyn metrics::WritePathSource>,
    ) -> Result<(), BrokerError> {
        Ok(self.service.add_write_path_source(source)?)
    }

    /// Every write-path stage now: broker publish, then the registered sources'.
    pub fn write_path(&self) -> Vec<metrics::StageLatency> {
        self.service.write_path()
    }

    /// Broker-wide metrics (publish latency histogram, connections, send errors).
    pub fn metrics(&self) -> metrics::BrokerMetricsSnapshot {
        self.service.metrics.snapshot()
    }

    /// Full names of the topics this broker serves now.
    pub fn served_topics(&self) -> Vec<String> {
        self.service.served_topics()
    }

    /// Statistics of a served topic (`None` when it is not served now).
    pub async fn topic_stats(&self, topic: &str) -> Result<Option<stats::TopicStats>, BrokerError> {
        let name = TopicName::parse(topic)?;
        if let Some(served) = self.service.served_non_persistent(&name.to_string()) {
            return Ok(Some(served.stats()));
        }
        match self.service.served_topic(&name.to_string()) {
            Some(served) => Ok(Some(self.service.topic_stats(&served).await)),
            None => Ok(None),
        }
    }

    /// Unloads a served topic: producers and consumers get CLOSE_* and
    /// re-attach (reopening it). `Ok(false)` when it was not served.
    pub async fn unload_topic(&self, topic: &str) -> Result<bool, BrokerError> {
        let name = TopicName::parse(topic)?;
        Ok(self.service.unload(&name.to_string()).await?)
    }

    /// Deletes a topic: every partition of a partitioned topic (and its
    /// metadata), or the topic itself. Clients are closed first.
    pub async fn delete_topic(&self, topic: &str) -> Result<(), BrokerError> {
        let name = TopicName::parse(topic)?;
        if name.partition.is_none()
            && let Some(partitions) = self.service.admin.partitions(&name).await?
        {
            for index in 0..partitions {
                match self.service.delete_topic(&name.partition(index)).await {
                    Ok(()) => {}
                    Err(e) if e.code == vela_wire::proto::ServerError::TopicNotFound => {}
                    Err(e) => return Err(e.into()),
                }
            }
            self.service
                .admin
                .delete_partitioned_metadata(&name)
                .await?;
            return Ok(());
        }
        Ok(self.service.delete_topic(&name).await?)
    }

    /// Terminates a (non-partitioned or partition) persistent topic: it
    /// takes no more messages, also after a restart. Answers the
    /// (ledger, entry) of its last message, `None` when it has none.
    pub async fn terminate_topic(&self, topic: &str) -> Result<Option<(u64, u64)>, BrokerError> {
        let name = TopicName::parse(topic)?;
        let last = self.service.topic(&name, false).await?.terminate().await?;
        Ok(last.map(|p| (p.ledger_id, p.entry_id)))
    }

    /// Subscriptions of a topic (durable ones and the readers attached now);
    /// opens the topic if needed. Fails with TopicNotFound when it does not exist.
    pub async fn subscriptions(&self, topic: &str) -> Result<Vec<String>, BrokerError> {
        let name = TopicName::parse(topic)?;
        Ok(self.service.topic(&name, false).await?.subscription_names())
    }

    /// Deletes a subscription (its consumers are closed). `Ok(false)` when absent.
    pub async fn unsubscribe(&self, topic: &str, subscription: &str) -> Result<bool, BrokerError> {
        let name = TopicName::parse(topic)?;
        let served = self.service.topic(&name, false).await?;
        Ok(served.unsubscribe(subscription).await?)
    }

    /// Stops accepting, closes every connection, then closes every topic's log.
    pub async fn shutdown(self) -> Result<(), BrokerError> {
        let _ = self.shutdown_tx.send(true);
        for accept in self.accepts {
            let _ = accept.await;
        }
        let errors = self.service.close_topics().await;
        if let Some(transactions) = &self.service.transactions {
            transactions.close().await;
        }
        // Bundles are free at once for the other brokers (not at session expiry).
        if let Some(ownership) = self.service.ownership.get() {
            ownership.close().await;
        }
        match errors.into_iter().next() {
            Some(e) => Err(e.into()),
            None => Ok(()),
        }
    }
}
