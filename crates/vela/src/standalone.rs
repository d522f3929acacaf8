//! `vela standalone`: the whole system in one process on one machine.
//!
//! Owns: the data directory's layout, opening its parts in order and closing
//! them in reverse:
//! ```text
//! DATA_DIR/metadata/            embedded metadata store (redb, fsync'ed)
//! DATA_DIR/bookie-I/journal/    bookie I's write-ahead journal
//! DATA_DIR/bookie-I/ledgers/    bookie I's ledger storage
//! PMEM_PATH/bookie-I/journal.pmem  with --journal-backend pmem: bookie I's
//!                               journal region (the journal dir keeps its LOCK)
//! ```
//! Bookies run in this process and the broker reaches them directly
//! (`vela_ledger_backend::LocalBookies`): same durability and the same
//! back-pressure as over TCP (an add is acknowledged after the journal's
//! fdatasync; a full write cache holds an add up to the same bounded time),
//! one network hop less.
//! Ready line on stdout: `vela standalone ready in N ms: pulsar://H:P http://H:P`.
//! Stops cleanly on SIGINT/SIGTERM: the broker closes its topics (ledgers
//! closed), then the bookies sync their journals and checkpoint.
//! A bookie whose disk fills up (`--disk-usage-max-percent`) or fails a write
//! (ENOSPC, EIO) turns read-only: it is marked so in the registry (new ledgers
//! go elsewhere, or fail with "not enough writable bookies", which producers
//! get as a SEND_ERROR), keeps serving reads, and takes writes again once its
//! disk is below `--disk-usage-lwm-percent` (reopening its journal and storage
//! after a failed write). The process does not exit for it.
//! Never: starts with fewer bookies than the data directory holds (ledgers on
//! the missing ones would be unreadable), or binds beyond `--bind`.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use tokio::task::JoinSet;
use vela_bookie::bookie::{Bookie, BookieConfig, BookieMode};
use vela_broker::PersistenceConfig;
use vela_ledger::{BookieId, LedgerClient, LedgerConfig};
use vela_ledger_backend::{LocalBookies, ReplicatedLedgers};
use vela_log::LogEnv;
use vela_meta::registry::BookieInfo;
use vela_meta::{FileStore, MetadataStore};

use crate::broker_args::BrokerFlags;
use crate::persistence_args::PersistenceArgs;
use crate::process::{StopSignals, announce};
use crate::registration::Registration;
use crate::security_args::pulsar_urls;
use crate::storage_args::StorageArgs;
use crate::write_path_source::StandaloneStages;

// Every message the broker accepts (its largest frame's payload section) fits
// in one ledger entry: the log never has to refuse one.
const _: () = assert!(
    vela_broker::config::MAX_MESSAGE_SIZE_BYTES + vela_broker::config::FRAME_PADDING_BYTES
        <= vela_ledger::ENTRY_PAYLOAD_BYTES_MAX
);

/// Bookies one standalone process runs at most.
const BOOKIES_MAX: u8 = 16;

/// How often the serving loop copies the bookies' modes into their registry
/// marks (a bookie checks its disks every `--disk-check-interval-ms`).
const STATE_POLL_INTERVAL: Duration = Duration::from_millis(200);

/// Address recorded in the registry for in-process bookies: they have no
/// network address, and no other process can reach them.
const IN_PROCESS_ADDRESS: &str = "in-process";

/// Directory name prefix of bookie I's data.
const BOOKIE_DIR_PREFIX: &str = "bookie-";

/// Upper bound of `--worker-threads`.
const WORKER_THREADS_MAX: u16 = 1024;

/// Default `--worker-threads`: one per CPU (tokio's own default). With one
/// fewer (a single worker on a 2-vCPU machine, the default until this was
/// measured) every topic's adds, answers and receipts queue behind one
/// thread: at 1,000 topics x 20 msg/s (1 bookie, 2 vCPUs, same session,
/// alternating) ledger add p50 8.7-9.6 ms with 1 worker against 2.6-3.0 ms
/// with 2, client p50 14.3-17.2 against 10.7-11.1 ms; the price is sync
/// 1 KiB p50 +7..+15 us (0.174-0.190 against 0.189-0.197 ms). Many topics
/// are what users run, so the default favours them; `--worker-threads 1`
/// gives the single-topic figure back.
fn default_worker_threads(cpus: usize) -> usize {
    cpus.max(1)
}

/// Flags of `vela standalone`.
#[derive(Debug, Args)]
pub(crate) struct StandaloneArgs {
    /// Where metadata and bookie data live (created if absent).
    #[arg(long, default_value = "data", value_name = "DIR")]
    data_dir: PathBuf,
    #[command(flatten)]
    broker: BrokerFlags,
    /// Bookies to run, each with its own journal and ledger directories.
    #[arg(long, default_value_t = 1,
          value_parser = clap::value_parser!(u8).range(1..=BOOKIES_MAX as i64))]
    bookies: u8,
    #[command(flatten)]
    persistence: PersistenceArgs,
    /// Threads running the broker and the bookies' request handling. Default:
    /// the CPU count.
    #[arg(long, value_name = "N",
          value_parser = clap::value_parser!(u16).range(1..=WORKER_THREADS_MAX as i64))]
    worker_threads: Option<u16>,
    #[command(flatten)]
    storage: StorageArgs,
}

impl StandaloneArgs {
    /// The default persistence: E=Qw=Qa=1 with one bookie, else 2.
    fn persistence(&self) -> anyhow::Result<PersistenceConfig> {
        let default_ensemble = if self.bookies == 1 { 1 } else { 2 };
        self.persistence
            .resolve(default_ensemble, Some(self.bookies))
    }
}

/// Bookie indices already present in `data_dir` (directories `bookie-I`).
fn existing_bookies(data_dir: &Path) -> anyhow::Result<Vec<u32>> {
    let mut found = Vec::new();
    let entries = match std::fs::read_dir(data_dir) {
        Ok(entries) => entries,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(found),
        Err(error) => {
            return Err(error).with_context(|| format!("cannot read {}", data_dir.display()));
        }
    };
    for entry in entries {
        let entry = entry.with_context(|| format!("cannot read {}", data_dir.display()))?;
        if let Some(index) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.strip_prefix(BOOKIE_DIR_PREFIX))
            .and_then(|index| index.parse::<u32>().ok())
        {
            found.push(index);
        }
    }
    found.sort_unstable();
    Ok(found)
}

fn bookie_id(index: u8) -> BookieId {
    BookieId::new(format!("standalone-bookie-{index}"))
}

pub(crate) fn run(args: StandaloneArgs) -> anyhow::Result<()> {
    let started = Instant::now();
    let persistence = args.persistence()?;
    if let Some(&highest) = existing_bookies(&args.data_dir)?.last()
        && highest >= u32::from(args.bookies)
    {
        anyhow::bail!(
            "{} holds data of bookie {highest}: start with --bookies {} or more (ledgers on a \
             missing bookie could not be read)",
            args.data_dir.display(),
            highest + 1
        );
    }
    std::fs::create_dir_all(&args.data_dir)
        .with_context(|| format!("cannot create --data-dir {}", args.data_dir.display()))?;

    let worker_threads = args.worker_threads.map_or_else(
        || default_worker_threads(std::thread::available_parallelism().map_or(1, |n| n.get())),
        usize::from,
    );
    tracing::info!(worker_threads, "starting the runtime");
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(worker_threads)
        .enable_all()
        .thread_name("vela-standalone")
        .build()
        .context("cannot start the tokio runtime")?;
    let bookies = runtime.block_on(open_bookies(&args))?;
    let served = runtime.block_on(serve(&args, persistence, &bookies, started));
    // Outside the runtime: closing bookies blocks on their journal threads.
    drop(runtime);
    for (_, bookie) in &bookies {
        bookie.shutdown();
    }
    served?;
    tracing::info!("vela standalone stopped");
    Ok(())
}

/// Opens (and replays) every bookie, in parallel.
async fn open_bookies(args: &StandaloneArgs) -> anyhow::Result<Vec<(BookieId, Arc<Bookie>)>> {
    let mut opening = JoinSet::new();
    for index in 0..args.bookies {
        let dir = args.data_dir.join(format!("{BOOKIE_DIR_PREFIX}{index}"));
        let mut config = BookieConfig::new(dir.join("journal"), dir.join("ledgers"));
        args.storage.apply(&mut config)?;
        if let Some(pmem) = config.journal.pmem.as_mut() {
            // Each bookie its own region, under --journal-pmem-path.
            pmem.dir = pmem.dir.join(format!("{BOOKIE_DIR_PREFIX}{index}"));
        }
        opening.spawn_blocking(move || {
            let opened = Bookie::open(config)
                .with_context(|| format!("cannot open bookie {index} in {}", dir.display()));
            (index, opened)
        });
    }
    let mut bookies = Vec::new();
    while let Some(joined) = opening.join_next().await {
        let (index, opened) = joined.context("bookie open task failed")?;
        bookies.push((index, Arc::new(opened?)));
    }
    bookies.sort_by_key(|(index, _)| *index);
    Ok(bookies
        .into_iter()
        .map(|(index, bookie)| (bookie_id(index), bookie))
        .collect())
}

async fn serve(
    args: &StandaloneArgs,
    persistence: PersistenceConfig,
    bookies: &[(BookieId, Arc<Bookie>)],
    started: Instant,
) -> anyhow::Result<()> {
    let metadata_dir = args.data_dir.join("metadata");
    let store: Arc<dyn MetadataStore> =
        Arc::new(FileStore::open(&metadata_dir).await.with_context(|| {
            format!(
                "cannot open the metadata store in {} (is another vela standalone using \
                     this --data-dir?)",
                metadata_dir.display()
            )
        })?);
    let mut registrations = Vec::new();
    for (id, _) in bookies {
        let id = vela_meta::registry::BookieId::new(id.0.as_str())
            .context("bookie id is not a valid registry id")?;
        let info = BookieInfo {
            address: IN_PROCESS_ADDRESS.to_string(),
            rack: None,
        };
        // The store deleted the previous process's registrations when it
        // opened: nothing to wait for.
        registrations.push(Registration::start(store.clone(), id, info, Duration::ZERO).await?);
    }

    let transport = LocalBookies::new(bookies.iter().cloned());
    let ledgers = LedgerClient::new(store.clone(), Arc::new(transport), LedgerConfig::default());
    let stages = StandaloneStages::new(ledgers.clone(), bookies.to_vec());
    let flags = &args.broker;
    let log_env = flags.memory.apply(LogEnv::new(
        store.clone(),
        Arc::new(ReplicatedLedgers::new(ledgers)),
    ));
    let log_env = flags.offload.offloader(log_env)?;

    let config = flags.config(persistence)?;
    let mut signals = StopSignals::install()?;
    let (broker, http) = flags.start(config, store.clone(), log_env, stages).await?;

    announce(&format!(
        "vela standalone ready in {} ms: {} {} ({} bookie{}, E={} Qw={} Qa={}, data in {})",
        started.elapsed().as_millis(),
        pulsar_urls(&broker, &flags.security),
        http.urls,
        bookies.len(),
        if bookies.len() == 1 { "" } else { "s" },
        persistence.ensemble,
        persistence.write_quorum,
        persistence.ack_quorum,
        args.data_dir.display(),
    ))?;

    let mut state_poll = tokio::time::interval(STATE_POLL_INTERVAL);
    loop {
        tokio::select! {
            signal = signals.recv() => {
                tracing::info!("{signal}: stopping");
                break;
            }
            _ = state_poll.tick() => {
                for ((_, bookie), registration) in bookies.iter().zip(&registrations) {
                    let mode = bookie.state().mode;
                    registration.set_read_only(mode != BookieMode::Writable);
                }
            }
        }
    }
    http.stop().await;
    let closed = broker.shutdown().await;
    for registration in registrations {
        registration.close().await;
    }
    if let Err(error) = closed {
        tracing::warn!(%error, "broker shutdown left a topic unclosed (recovered at next start)");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_worker_threads_is_one_per_cpu_and_at_least_one() {
        assert_eq!(default_worker_threads(0), 1);
        assert_eq!(default_worker_threads(1), 1);
        assert_eq!(default_worker_threads(2), 2);
        assert_eq!(default_worker_threads(16), 16);
    }
}
