//! `vela bookie`: a storage node serving the bookie protocol.
//!
//! Owns: the `vela bookie` flags, turning them into a `BookieConfig`, the tokio
//! runtime of the process, and its life cycle: open (journal replay), serve,
//! print `vela bookie listening on ADDR` once ready (scripts and tests parse it;
//! `--port 0` picks a free port), stop cleanly on SIGINT/SIGTERM (stop
//! accepting, close connections, sync and close the journal, checkpoint). A
//! full or failing disk does not stop it: the bookie turns read-only (ADDs
//! answered READ_ONLY, reads served) and, with `--metadata URL`, is marked
//! read-only in the registry until it takes writes again. With `--metadata`
//! it registers itself as available (an ephemeral key, gone when the process
//! stops or its session expires) so ledger clients find it.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::Args;
use vela_bookie::bookie::{Bookie, BookieConfig, BookieMode};
use vela_bookie::server::Server;
use vela_meta::registry::{BookieId, BookieInfo};

use crate::process::{StopSignals, announce};
use crate::registration::{REGISTRATION_TTL, Registration};
use crate::storage_args::StorageArgs;

/// How often the serving loop copies the bookie's mode into its registry mark.
const STATE_POLL_INTERVAL: Duration = Duration::from_millis(500);

/// Flags of `vela bookie`.
#[derive(Debug, Args)]
pub(crate) struct BookieArgs {
    /// Directory of the write-ahead journal (ideally on its own disk).
    #[arg(long, value_name = "DIR")]
    journal_dir: PathBuf,
    /// Directory of ledger storage (entry logs, index).
    #[arg(long, value_name = "DIR")]
    ledger_dir: PathBuf,
    /// Address to listen on.
    #[arg(long, default_value = "127.0.0.1", value_name = "IP")]
    bind: IpAddr,
    /// Port to listen on (0: pick a free one; the ready line says which).
    #[arg(long, default_value_t = 3181)]
    port: u16,
    /// Metadata store to register in (`etcd://host:2379[,host:port...]`,
    /// `file:///dir`); without it the bookie does not register.
    #[arg(long, value_name = "URL")]
    metadata: Option<String>,
    /// Id the bookie registers under (what ledger metadata records). Keep it
    /// stable across restarts. Default: the advertised address.
    #[arg(long, value_name = "ID")]
    bookie_id: Option<String>,
    /// `host:port` clients connect to. Default: the bound address and port.
    #[arg(long, value_name = "HOST:PORT")]
    advertised_address: Option<String>,
    /// Rack (failure domain) label for placement.
    #[arg(long, value_name = "RACK")]
    rack: Option<String>,
    /// Do not take part in auto-recovery (which, with --metadata, runs in one
    /// bookie at a time and copies a lost bookie's entries elsewhere).
    #[arg(long)]
    no_autorecovery: bool,
    /// Seconds a bookie may stay unregistered before auto-recovery copies its
    /// entries to other bookies.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(0..=86_400))]
    lost_bookie_grace_s: u64,
    /// Seconds between auto-recovery audit passes. A pass reads the metadata
    /// of new ledgers and of ledgers listing an unavailable bookie.
    #[arg(long, default_value_t = 30, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    autorecovery_interval_s: u64,
    /// Seconds between auto-recovery passes that read every ledger's metadata.
    #[arg(long, default_value_t = 3600, value_parser = clap::value_parser!(u64).range(1..=604_800))]
    autorecovery_full_audit_interval_s: u64,
    #[command(flatten)]
    storage: StorageArgs,
    #[command(flatten)]
    tls: crate::bookie_tls_args::BookieTlsServerArgs,
    #[command(flatten)]
    bookie_tls: crate::bookie_tls_args::BookieTlsClientArgs,
}

impl BookieArgs {
    fn config(&self) -> anyhow::Result<BookieConfig> {
        let mut config = BookieConfig::new(&self.journal_dir, &self.ledger_dir);
        self.storage.apply(&mut config)?;
        Ok(config)
    }
}

pub(crate) fn run(args: BookieArgs) -> anyhow::Result<()> {
    if args.journal_dir == args.ledger_dir {
        anyhow::bail!(
            "--journal-dir and --ledger-dir must be different directories (each holds its own files and LOCK)"
        );
    }
    let config = args.config()?;
    let tls = args.tls.config()?;
    // Checked before the bookie opens (and replays its journal).
    let autorecovery_client = args.bookie_tls.client_config()?;
    let addr = SocketAddr::new(args.bind, args.port);
    let bookie = Bookie::open(config).with_context(|| {
        format!(
            "cannot open the bookie (--journal-dir {}, --ledger-dir {})",
            args.journal_dir.display(),
            args.ledger_dir.display()
        )
    })?;
    let bookie = Arc::new(bookie);
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("vela-bookie-net")
        .build()
        .context("cannot start the tokio runtime")?;
    let served = runtime.block_on(serve(&args, addr, bookie.clone(), tls, autorecovery_client));
    // Outside the runtime: shutdown blocks on the journal threads.
    drop(runtime);
    bookie.shutdown();
    served?;
    tracing::info!("vela bookie stopped");
    Ok(())
}

/// Runs auto-recovery in the background for as long as the process lives
/// (it leads only while it holds the leader key).
fn start_autorecovery(
    store: Arc<dyn vela_meta::MetadataStore>,
    config: vela_ledger::AutoRecoveryConfig,
    client_config: vela_bookie_protocol::client::ClientConfig,
) {
    let transport = vela_ledger::BookieClientTransport::new(store.clone(), client_config);
    let client = vela_ledger::LedgerClient::new(
        store,
        Arc::new(transport),
        vela_ledger::LedgerConfig::default(),
    );
    // Never told to stop: it ends with the runtime.
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(async move {
        let _keep = _stop;
        vela_ledger::AutoRecovery::new(client, config)
            .run(stopped)
            .await;
    });
}

/// Serves until SIGINT or SIGTERM.
async fn serve(
    args: &BookieArgs,
    addr: SocketAddr,
    bookie: Arc<Bookie>,
    tls: Option<vela_tls::TlsConfig>,
    autorecovery_client: vela_bookie_protocol::client::ClientConfig,
) -> anyhow::Result<()> {
    let mut server = Server::bind(addr, bookie.clone())
        .await
        .with_context(|| format!("cannot listen on {addr} (--bind, --port)"))?;
    // Kept for the life of the server: the reload task stops when it goes.
    let _certs = match tls {
        None => None,
        Some(tls) => {
            let certs = vela_tls::TlsCertificates::load(tls).await?;
            tokio::spawn(vela_tls::reload_loop(
                Arc::downgrade(&certs),
                std::future::pending(),
            ));
            server = server.with_tls(certs.clone());
            Some(certs)
        }
    };
    let mut signals = StopSignals::install()?;
    let local_addr = server.local_addr();
    let registration = match &args.metadata {
        None => None,
        Some(url) => {
            let store = vela_meta::open_store(url)
                .await
                .with_context(|| format!("cannot open the metadata store (--metadata {url})"))?;
            let address = args
                .advertised_address
                .clone()
                .unwrap_or_else(|| local_addr.to_string());
            let id = BookieId::new(args.bookie_id.clone().unwrap_or_else(|| address.clone()))
                .context("bad --bookie-id")?;
            let info = BookieInfo {
                address,
                rack: args.rack.clone(),
            };
            // A previous process of this bookie may still be registered until
            // its session expires.
            let wait_max = REGISTRATION_TTL * 3;
            let registration = Registration::start(store.clone(), id, info, wait_max).await?;
            if !args.no_autorecovery {
                start_autorecovery(
                    store,
                    vela_ledger::AutoRecoveryConfig {
                        lost_grace: Duration::from_secs(args.lost_bookie_grace_s),
                        scan_interval: Duration::from_secs(args.autorecovery_interval_s),
                        full_audit_interval: Duration::from_secs(
                            args.autorecovery_full_audit_interval_s,
                        ),
                    },
                    autorecovery_client,
                );
            }
            Some(registration)
        }
    };
    announce(&format!("vela bookie listening on {local_addr}"))?;
    tracing::info!(%local_addr, "vela bookie serving");
    // On stop, deregister first: clients stop picking this bookie before it
    // closes its connections. (Dropping a registration closes it too.)
    let stop = async move {
        let mut state_poll = tokio::time::interval(STATE_POLL_INTERVAL);
        loop {
            tokio::select! {
                signal = signals.recv() => {
                    tracing::info!("{signal}: stopping");
                    break;
                }
                _ = state_poll.tick() => {
                    if let Some(registration) = &registration {
                        let mode = bookie.state().mode;
                        registration.set_read_only(mode != BookieMode::Writable);
                    }
                }
            }
        }
        if let Some(registration) = registration {
            registration.close().await;
        }
    };
    server.run(stop).await.context("bookie server failed")
}
