//! `vela broker`: a stateless broker of a cluster.
//!
//! Owns: the flags, wiring the metadata store (etcd in production), the
//! ledger client over registered bookies (TCP), the broker and its HTTP
//! listener, joining the cluster (registration, bundle ownership), and the
//! life cycle: ready line `vela broker ready in N ms: pulsar://H:P http://H:P`,
//! clean stop on SIGINT/SIGTERM (topics closed, bundles released at once).
//! A broker whose metadata session expires (cut off long enough for others
//! to take its bundles) unloads every topic and registers again.
//! Never: stores data (bookies do), or serves a topic whose bundle it does
//! not hold.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use vela_broker::{Broker, BrokerConfig};
use vela_ledger::{BookieClientTransport, LedgerClient, LedgerConfig};
use vela_ledger_backend::ReplicatedLedgers;
use vela_log::LogEnv;

use crate::limit_args::LimitArgs;
use crate::memory_args::MemoryArgs;
use crate::persistence_args::PersistenceArgs;
use crate::process::{StopSignals, announce};
use crate::security_args::{HttpListeners, SecurityArgs, pulsar_urls};
use crate::topic_args::TopicArgs;
use crate::transaction_args::TransactionArgs;
use crate::write_path_source::StandaloneStages;

/// Flags of `vela broker`.
#[derive(Debug, Args)]
pub(crate) struct BrokerArgs {
    /// Metadata store (`etcd://host:2379[,host:port...]`).
    #[arg(long, value_name = "URL")]
    metadata: String,
    /// Address the Pulsar and HTTP listeners bind.
    #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
    bind: IpAddr,
    /// Pulsar protocol port (0: pick a free one; the ready line says which).
    #[arg(long, default_value_t = 6650)]
    port: u16,
    /// HTTP port: admin API, lookups and metrics (0: pick a free one).
    #[arg(long, default_value_t = 8080)]
    http_port: u16,
    /// Host put into lookup answers and the registration (what clients and
    /// other brokers reach). Default: the bind address (127.0.0.1 when
    /// binding every interface).
    #[arg(long, value_name = "HOST")]
    advertised_host: Option<String>,
    /// This cluster's name (Pulsar's `clusterName`): recorded with its URLs
    /// at start, named by replication policies and by replicated messages.
    #[arg(long, default_value = vela_broker::config::CLUSTER_NAME_DEFAULT, value_name = "NAME")]
    cluster_name: String,
    /// Time the metadata store keeps this broker's session (its bundles)
    /// after the broker stops answering, ms. Shorter: faster failover; too
    /// short for the machine: spurious failovers. etcd rounds up to whole
    /// seconds (at least about 2 s).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(500..=600_000))]
    session_ttl_ms: u64,
    /// Interval of keep-alive pings to clients, seconds (Pulsar: 30).
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=3600))]
    keepalive_s: u64,
    /// Split a bundle serving more topics than this.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    bundle_split_topics_max: u64,
    /// Split a bundle taking more messages per second than this.
    #[arg(long, default_value_t = 30_000)]
    bundle_split_msg_rate_max: u64,
    #[command(flatten)]
    persistence: PersistenceArgs,
    #[command(flatten)]
    topics: TopicArgs,
    #[command(flatten)]
    transactions: TransactionArgs,
    #[command(flatten)]
    replication: crate::replication_args::ReplicationArgs,
    #[command(flatten)]
    memory: MemoryArgs,
    #[command(flatten)]
    offload: crate::offload_args::OffloadArgs,
    #[command(flatten)]
    security: SecurityArgs,
    #[command(flatten)]
    limits: LimitArgs,
    #[command(flatten)]
    listeners: crate::listener_args::ListenerArgs,
    #[command(flatten)]
    bookie_tls: crate::bookie_tls_args::BookieTlsClientArgs,
}

impl BrokerArgs {
    fn advertised_host(&self) -> String {
        match &self.advertised_host {
            Some(host) => host.clone(),
            None if self.bind.is_unspecified() => "127.0.0.1".to_string(),
            None => self.bind.to_string(),
        }
    }
}

pub(crate) fn run(args: BrokerArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    // Pulsar's cluster default: two copies of everything.
    let persistence = args.persistence.resolve(2, None)?;
    let bookie_client = args.bookie_tls.client_config()?;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("vela-broker")
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async move {
        let store = vela_meta::open_store(&args.metadata)
            .await
            .with_context(|| format!("cannot open the metadata store (--metadata {})", args.metadata))?;
        let transport = BookieClientTransport::new(store.clone(), bookie_client);
        let ledgers = LedgerClient::new(store.clone(), Arc::new(transport), LedgerConfig::default());
        let stages = StandaloneStages::new(ledgers.clone(), Vec::new());
        let log_env = args
            .memory
            .apply(LogEnv::new(store.clone(), Arc::new(ReplicatedLedgers::new(ledgers))));
        let log_env = args.offload.offloader(log_env)?;

        let mut config = BrokerConfig::new(SocketAddr::new(args.bind, args.port));
        config.advertised_host = args.advertised_host();
        config.cluster_name = args.cluster_name.clone();
        config.replication_inflight_bytes_max = args.memory.replication_inflight_bytes();
        config.default_persistence = persistence;
        config.keepalive = Duration::from_secs(args.keepalive_s);
        // Range-checked by clap: fits usize.
        config.bundle_split_topics_max = args.bundle_split_topics_max as usize;
        config.bundle_split_msg_rate_max = args.bundle_split_msg_rate_max as f64;
        args.topics.apply(&mut config)?;
    args.offload.apply(&mut config);
        args.transactions.apply(&mut config)?;
        args.replication.apply(&mut config);
        args.security.apply(args.bind, &mut config)?;
        args.limits.apply(&mut config);
        args.listeners.apply(&mut config)?;
        let mut signals = StopSignals::install()?;
        let broker = Broker::start(config, store.clone(), log_env)
            .await
            .with_context(|| {
                format!(
                    "cannot start the broker on {} (--bind, --port, --tls-port, --tls-cert-file, \
                     --tls-key-file)",
                    args.bind
                )
            })?;
        broker
            .add_write_path_source(Arc::new(stages))
            .context("cannot register the write-path stages")?;
        let advertised_host = args.advertised_host();
        let http =
            HttpListeners::start(&broker, &args.security, args.bind, args.http_port, &advertised_host)
                .await?;
        broker
            .join_cluster(Duration::from_millis(args.session_ttl_ms))
            .await
            .context("cannot join the cluster")?;
        announce(&format!(
            "vela broker ready in {} ms: {} {} (metadata {}, E={} Qw={} Qa={})",
            started.elapsed().as_millis(),
            pulsar_urls(&broker, &args.security),
            http.urls,
            args.metadata,
            persistence.ensemble,
            persistence.write_quorum,
            persistence.ack_quorum,
        ))?;

        let signal = signals.recv().await;
        tracing::info!("{signal}: stopping");
        http.stop().await;
        if let Err(error) = broker.shutdown().await {
            tracing::warn!(%error, "broker shutdown left a topic unclosed (recovered by its next owner)");
        }
        tracing::info!("vela broker stopped");
        Ok(())
    })
}
