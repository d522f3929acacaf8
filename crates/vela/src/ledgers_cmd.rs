//! `vela ledgers`: operator tools over the ledger metadata and bookies.
//!
//! - `list`: every ledger with its state, quorum, entries and ensembles;
//! - `verify`: reads every entry of every ledger (or one) from *each* bookie
//!   of its write set and reports the copies missing or corrupt: the check
//!   that replication (and auto-recovery) left Qw good copies everywhere.
//!   Exit status 1 when a copy is missing.
//!
//! Never: writes anything.

use std::sync::Arc;

use anyhow::Context;
use clap::{Args, Subcommand};
use tokio::task::JoinSet;
use vela_ledger::{
    BookieClientTransport, BookieTransport, EntryId, LedgerClient, LedgerConfig, LedgerId,
    LedgerState, ReadMode,
};

/// Reads in flight during `verify`.
const VERIFY_READS_IN_FLIGHT_MAX: usize = 64;

/// Flags of `vela ledgers`.
#[derive(Debug, Args)]
pub(crate) struct LedgersArgs {
    /// Metadata store (`etcd://host:2379`, `file:///dir`).
    #[arg(long, value_name = "URL", global = true, default_value = "")]
    metadata: String,
    #[command(flatten)]
    bookie_tls: crate::bookie_tls_args::BookieTlsClientArgs,
    #[command(subcommand)]
    command: LedgersCommand,
}

#[derive(Debug, Subcommand)]
enum LedgersCommand {
    /// List ledgers with their state and ensembles.
    List,
    /// Read each entry from each bookie of its write set; report missing copies.
    Verify {
        /// Only this ledger.
        #[arg(long)]
        ledger: Option<u64>,
    },
}

pub(crate) fn run(args: LedgersArgs) -> anyhow::Result<()> {
    if args.metadata.is_empty() {
        anyhow::bail!("--metadata URL is required (e.g. etcd://127.0.0.1:2379)");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async move {
        let store = vela_meta::open_store(&args.metadata)
            .await
            .with_context(|| {
                format!(
                    "cannot open the metadata store (--metadata {})",
                    args.metadata
                )
            })?;
        let transport = Arc::new(BookieClientTransport::new(
            store.clone(),
            args.bookie_tls.client_config()?,
        ));
        let client = LedgerClient::new(store, transport.clone(), LedgerConfig::default());
        match args.command {
            LedgersCommand::List => list(&client).await,
            LedgersCommand::Verify { ledger } => verify(&client, transport, ledger).await,
        }
    })
}

async fn list(client: &LedgerClient) -> anyhow::Result<()> {
    use std::io::Write;
    let mut out = std::io::stdout().lock();
    for id in client.ledger_ids().await? {
        let Ok(metadata) = client.metadata(id).await else {
            continue;
        };
        let ensembles: Vec<String> = metadata
            .ensembles
            .iter()
            .map(|(first, bookies)| {
                let names: Vec<&str> = bookies.iter().map(|b| b.0.as_str()).collect();
                format!("{}:[{}]", first.0, names.join(","))
            })
            .collect();
        let written = writeln!(
            out,
            "{id} {:?} E={} Qw={} Qa={} last_entry={} ensembles={}",
            metadata.state,
            metadata.quorum.ensemble_size(),
            metadata.quorum.write_quorum(),
            metadata.quorum.ack_quorum(),
            metadata
                .last_entry
                .map_or("none".to_string(), |e| e.0.to_string()),
            ensembles.join(" ")
        );
        if written.is_err() {
            // The reader went away (`| head`): stop quietly.
            return Ok(());
        }
    }
    Ok(())
}

async fn verify(
    client: &LedgerClient,
    transport: Arc<BookieClientTransport>,
    only: Option<u64>,
) -> anyhow::Result<()> {
    let ids = match only {
        Some(id) => vec![LedgerId(id)],
        None => client.ledger_ids().await?,
    };
    let (mut ledgers, mut copies, mut missing) = (0u64, 0u64, 0u64);
    for id in ids {
        let Ok(metadata) = client.metadata(id).await else {
            continue;
        };
        // Entries that must be there: all of a closed ledger; up to the LAC
        // of an open one.
        let last = match metadata.state {
            LedgerState::Closed => metadata.last_entry,
            _ => match client.open_for_read(id).await {
                Ok(reader) => reader.last_readable(),
                Err(error) => {
                    println!("{id}: cannot read its LAC: {error}");
                    missing += 1;
                    continue;
                }
            },
        };
        ledgers += 1;
        let Some(last) = last else { continue };
        let metadata = Arc::new(metadata);
        let mut reads = JoinSet::new();
        let mut entries = 0..=last.0;
        loop {
            while reads.len() < VERIFY_READS_IN_FLIGHT_MAX {
                let Some(entry) = entries.next() else { break };
                for bookie in metadata.write_set(EntryId(entry)) {
                    let transport = Arc::clone(&transport);
                    reads.spawn(async move {
                        let read = transport
                            .read(&bookie, id, EntryId(entry), ReadMode::Normal)
                            .await;
                        (entry, bookie, read)
                    });
                }
            }
            let Some(joined) = reads.join_next().await else {
                break;
            };
            let (entry, bookie, read) = joined.context("read task failed")?;
            copies += 1;
            let good = read.is_ok_and(|packaged| {
                vela_bookie_protocol::entry::decode_expected_entry(&packaged, id.0, entry).is_ok()
            });
            if !good {
                missing += 1;
                println!("{id}: entry {entry} missing or corrupt on {bookie}");
            }
        }
    }
    println!("verified {ledgers} ledgers: {copies} copies checked, {missing} missing or corrupt");
    if missing > 0 {
        anyhow::bail!("{missing} copies missing or corrupt");
    }
    Ok(())
}
