//! What `vela broker` and `vela standalone` share: the broker's flags (where
//! it listens, what it advertises, and the flag groups of topics,
//! transactions, replication, memory, offload, security, limits and
//! listeners), the `BrokerConfig` built from them, and starting the broker
//! with its write-path stages and HTTP listeners.
//!
//! Never: opens the metadata store or the ledgers (each command wires its
//! own), or waits for a stop signal (each command's life cycle does).

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use vela_broker::{Broker, BrokerConfig, BrokerHandle, PersistenceConfig};
use vela_log::LogEnv;
use vela_meta::MetadataStore;

use crate::limit_args::LimitArgs;
use crate::memory_args::MemoryArgs;
use crate::security_args::{HttpListeners, SecurityArgs};
use crate::topic_args::TopicArgs;
use crate::transaction_args::TransactionArgs;
use crate::write_path_source::StandaloneStages;

/// The broker's flags, as `vela broker` and `vela standalone` take them.
#[derive(Debug, Args)]
pub(crate) struct BrokerFlags {
    /// Address the Pulsar and HTTP listeners bind.
    #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
    pub(crate) bind: IpAddr,
    /// Pulsar protocol port (0: pick a free one; the ready line says which).
    #[arg(long, default_value_t = 6650)]
    port: u16,
    /// HTTP port: admin API, lookups and metrics (0: pick a free one).
    #[arg(long, default_value_t = 8080)]
    http_port: u16,
    /// Host put into lookup answers (and a cluster broker's registration:
    /// what clients and other brokers reach). Default: the bind address
    /// (127.0.0.1 when binding every interface).
    #[arg(long, value_name = "HOST")]
    advertised_host: Option<String>,
    /// This cluster's name (Pulsar's `clusterName`): recorded with its URLs
    /// at start, named by replication policies and by replicated messages.
    #[arg(long, default_value = vela_broker::config::CLUSTER_NAME_DEFAULT, value_name = "NAME")]
    cluster_name: String,
    /// Interval of keep-alive pings to clients, seconds (Pulsar: 30).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    keepalive_s: u64,
    #[command(flatten)]
    topics: TopicArgs,
    #[command(flatten)]
    transactions: TransactionArgs,
    #[command(flatten)]
    replication: crate::replication_args::ReplicationArgs,
    #[command(flatten)]
    pub(crate) memory: MemoryArgs,
    #[command(flatten)]
    pub(crate) offload: crate::offload_args::OffloadArgs,
    #[command(flatten)]
    pub(crate) security: SecurityArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    listeners: crate::listener_args::ListenerArgs,
}

impl BrokerFlags {
    /// The host lookups answer with.
    pub(crate) fn advertised_host(&self) -> String {
        match &self.advertised_host {
            Some(host) => host.clone(),
            None if self.bind.is_unspecified() => "127.0.0.1".to_string(),
            None => self.bind.to_string(),
        }
    }

    /// The broker's configuration from these flags, with `persistence` as
    /// its default (each command has its own default).
    pub(crate) fn config(&self, persistence: PersistenceConfig) -> anyhow::Result<BrokerConfig> {
        let mut config = BrokerConfig::new(SocketAddr::new(self.bind, self.port));
        config.advertised_host = self.advertised_host();
        config.cluster_name = self.cluster_name.clone();
        config.replication_inflight_bytes_max = self.memory.replication_inflight_bytes();
        config.default_persistence = persistence;
        config.keepalive = Duration::from_secs(self.keepalive_s);
        self.topics.apply(&mut config)?;
        self.offload.apply(&mut config);
        self.transactions.apply(&mut config)?;
        self.replication.apply(&mut config);
        self.security.apply(self.bind, &mut config)?;
        self.limits.apply(&mut config);
        self.listeners.apply(&mut config)?;
        Ok(config)
    }

    /// Starts the broker on `config` with its write-path `stages`, then its
    /// HTTP listeners; errors name the flags to look at.
    pub(crate) async fn start(
        &self,
        config: BrokerConfig,
        store: Arc<dyn MetadataStore>,
        log_env: LogEnv,
        stages: StandaloneStages,
    ) -> anyhow::Result<(BrokerHandle, HttpListeners)> {
        let broker = Broker::start(config, store, log_env)
            .await
            .with_context(|| {
                format!(
                    "cannot start the broker on {} (--bind, --port, --tls-port, --tls-cert-file, \
                     --tls-key-file)",
                    self.bind
                )
            })?;
        broker
            .add_write_path_source(Arc::new(stages))
            .context("cannot register the write-path stages")?;
        let http = HttpListeners::start(
            &broker,
            &self.security,
            self.bind,
            self.http_port,
            &self.advertised_host(),
        )
        .await?;
        Ok((broker, http))
    }
}
