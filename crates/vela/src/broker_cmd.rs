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

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use vela_ledger::{BookieClientTransport, LedgerClient, LedgerConfig};
use vela_ledger_backend::ReplicatedLedgers;
use vela_log::LogEnv;

use crate::broker_args::BrokerFlags;
use crate::persistence_args::PersistenceArgs;
use crate::process::{StopSignals, announce};
use crate::security_args::pulsar_urls;
use crate::write_path_source::StandaloneStages;

/// Flags of `vela broker`.
#[derive(Debug, Args)]
pub(crate) struct BrokerArgs {
    /// Metadata store (`etcd://host:2379[,host:port...]`).
    #[arg(long, value_name = "URL")]
    metadata: String,
    #[command(flatten)]
    broker: BrokerFlags,
    /// Time the metadata store keeps this broker's session (its bundles)
    /// after the broker stops answering, ms. Shorter: faster failover; too
    /// short for the machine: spurious failovers. etcd rounds up to whole
    /// seconds (at least about 2 s).
    #[arg(long, default_value_t = 2000, value_parser = clap::value_parser!(u64).range(500..=600_000))]
    session_ttl_ms: u64,
    /// Split a bundle serving more topics than this.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    bundle_split_topics_max: u64,
    /// Split a bundle taking more messages per second than this.
    #[arg(long, default_value_t = 30_000)]
    bundle_split_msg_rate_max: u64,
    #[command(flatten)]
    persistence: PersistenceArgs,
    #[command(flatten)]
    bookie_tls: crate::bookie_tls_args::BookieTlsClientArgs,
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
        let flags = &args.broker;
        let log_env = flags
            .memory
            .apply(LogEnv::new(store.clone(), Arc::new(ReplicatedLedgers::new(ledgers))));
        let log_env = flags.offload.offloader(log_env)?;

        let mut config = flags.config(persistence)?;
        // Range-checked by clap: fits usize.
        config.bundle_split_topics_max = args.bundle_split_topics_max as usize;
        config.bundle_split_msg_rate_max = args.bundle_split_msg_rate_max as f64;
        let mut signals = StopSignals::install()?;
        let (broker, http) = flags.start(config, store.clone(), log_env, stages).await?;
        broker
            .join_cluster(Duration::from_millis(args.session_ttl_ms))
            .await
            .context("cannot join the cluster")?;
        announce(&format!(
            "vela broker ready in {} ms: {} {} (metadata {}, E={} Qw={} Qa={})",
            started.elapsed().as_millis(),
            pulsar_urls(&broker, &flags.security),
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
