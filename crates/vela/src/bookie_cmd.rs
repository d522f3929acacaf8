//! `vela bookie`: a storage node serving the bookie protocol.
//!
//! Owns: the `vela bookie` flags, turning them into a `BookieConfig`, the tokio
//! runtime of the process, and its life cycle: open (journal replay), serve,
//! print `vela bookie listening on ADDR` once ready (scripts and tests parse it;
//! `--port 0` picks a free port), stop cleanly on SIGINT/SIGTERM (stop
//! accepting, close connections, sync and close the journal, checkpoint), exit
//! non-zero if the bookie fails (a failed fdatasync or checkpoint).
//! Never: registers in a metadata store (issue 3 adds that).

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use clap::{Args, ValueEnum};
use vela_bookie::bookie::{Bookie, BookieConfig};
use vela_bookie::journal::{JournalBackendKind, JournalSync};
use vela_bookie::server::Server;

/// How often the serving loop checks whether the bookie has failed.
const FAILURE_POLL_INTERVAL: Duration = Duration::from_millis(500);

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
    /// When an ADD is acknowledged: after fdatasync (survives power loss), or
    /// `off`: after the write only (survives a crash of the bookie, not of the
    /// machine).
    #[arg(long, value_enum, default_value_t = SyncArg::Fdatasync)]
    journal_sync: SyncArg,
    /// Journal file backend: page cache, or O_DIRECT.
    #[arg(long, value_enum, default_value_t = BackendArg::Buffered)]
    journal_backend: BackendArg,
    /// Longest time a journal group waits for more records, in microseconds
    /// (groups are written at once when the queue is empty).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    journal_group_wait_us: u64,
    /// Adds queued for the journal at most; past it ADDs get TOO_MANY_REQUESTS.
    #[arg(long, default_value_t = vela_bookie::journal::JOURNAL_QUEUE_DEPTH_MAX as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    journal_queue_depth: u64,
    /// Write cache budget in MiB (both halves); a flush starts at a quarter of it.
    /// At least 11 (two maximal entries).
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(11..=1_048_576))]
    write_cache_mb: u64,
    /// Read cache budget in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    read_cache_mb: u64,
    /// Checkpoint (flush the write cache to entry logs) at least this often, ms.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    flush_interval_ms: u64,
    /// Run storage garbage collection this often, seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    gc_interval_s: u64,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SyncArg {
    Fdatasync,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Buffered,
    Direct,
}

impl BookieArgs {
    fn config(&self) -> BookieConfig {
        let mut config = BookieConfig::new(&self.journal_dir, &self.ledger_dir);
        config.journal.sync = match self.journal_sync {
            SyncArg::Fdatasync => JournalSync::Fdatasync,
            SyncArg::Off => JournalSync::Off,
        };
        config.journal.backend = match self.journal_backend {
            BackendArg::Buffered => JournalBackendKind::Buffered,
            BackendArg::Direct => JournalBackendKind::Direct,
        };
        config.journal.group_wait_max = Duration::from_micros(self.journal_group_wait_us);
        // Range-checked by clap (1..=1_048_576): fits usize.
        config.journal.queue_depth_max = self.journal_queue_depth as usize;
        config.storage.write_cache_bytes_max = self.write_cache_mb << 20;
        config.storage.flush_threshold_bytes = config.storage.write_cache_bytes_max / 4;
        config.storage.read_cache_bytes_max = self.read_cache_mb << 20;
        config.storage.read_ahead_bytes_max = config
            .storage
            .read_ahead_bytes_max
            .min(config.storage.read_cache_bytes_max);
        config.storage.flush_interval = Duration::from_millis(self.flush_interval_ms);
        config.gc_interval = Duration::from_secs(self.gc_interval_s);
        config
    }
}

pub(crate) fn run(args: BookieArgs) -> anyhow::Result<()> {
    if args.journal_dir == args.ledger_dir {
        anyhow::bail!(
            "--journal-dir and --ledger-dir must be different directories (each holds its own files and LOCK)"
        );
    }
    let config = args.config();
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
    let served = runtime.block_on(serve(addr, bookie.clone()));
    // Outside the runtime: shutdown blocks on the journal threads.
    drop(runtime);
    bookie.shutdown();
    let failure = bookie.failure();
    served?;
    match failure {
        Some(reason) => anyhow::bail!("bookie failed: {reason}"),
        None => {
            tracing::info!("vela bookie stopped");
            Ok(())
        }
    }
}

/// Serves until SIGINT, SIGTERM or a bookie failure.
async fn serve(addr: SocketAddr, bookie: Arc<Bookie>) -> anyhow::Result<()> {
    let server = Server::bind(addr, bookie.clone())
        .await
        .with_context(|| format!("cannot listen on {addr} (--bind, --port)"))?;
    let mut terminate = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("cannot install the SIGTERM handler")?;
    let local_addr = server.local_addr();
    {
        use std::io::Write;
        let mut stdout = std::io::stdout().lock();
        writeln!(stdout, "vela bookie listening on {local_addr}")
            .context("cannot write to stdout")?;
        stdout.flush().context("cannot write to stdout")?;
    }
    tracing::info!(%local_addr, "vela bookie serving");
    let stop = async move {
        let mut failure_poll = tokio::time::interval(FAILURE_POLL_INTERVAL);
        loop {
            tokio::select! {
                _ = tokio::signal::ctrl_c() => {
                    tracing::info!("SIGINT: stopping");
                    return;
                }
                _ = terminate.recv() => {
                    tracing::info!("SIGTERM: stopping");
                    return;
                }
                _ = failure_poll.tick() => {
                    if bookie.failure().is_some() {
                        return;
                    }
                }
            }
        }
    };
    server.run(stop).await.context("bookie server failed")?;
    Ok(())
}
