//! A backlog five times a bookie's write cache, appended to a log at once, in
//! standalone (the bookie in process, `LocalBookies`) and over TCP
//! (`BookieClientTransport` to the bookie's server): the producer is held
//! back while the cache flushes, nothing is refused or lost, and both ways
//! behave the same.
//!
//! "Held back, not refused" is what the two counters say: the bookie's write
//! cache filled (`write_cache_full_count > 0`), yet no add was answered
//! TOO_MANY_REQUESTS (`adds_overloaded == 0`): each waited in `Bookie::add`
//! for the flush that freed room. A bookie that refused adds at once when
//! its cache is full (as the in-process path once did) fails this test.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::real::bookie_config;
use common::register_at;
use vela_bookie::bookie::Bookie;
use vela_bookie::server::Server;
use vela_bookie_protocol::client::ClientConfig;
use vela_ledger::transport::BookieTransport;
use vela_ledger::{BookieClientTransport, BookieId, LedgerClient, LedgerConfig};
use vela_ledger_backend::{LocalBookies, ReplicatedLedgers};
use vela_log::{CursorStart, LogConfig, LogEnv, ManagedLog, Position};
use vela_meta::{MemoryStore, MetadataStore};

/// Entries appended and their size: 50 MiB, five times the cache below.
const ENTRIES: u64 = 400;
const ENTRY_BYTES: usize = 128 * 1024;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Transport {
    InProcess,
    Tcp,
}

fn entry(i: u64) -> Bytes {
    let mut data = vec![(i % 251) as u8; ENTRY_BYTES];
    data[..8].copy_from_slice(&i.to_be_bytes());
    Bytes::from(data)
}

/// What one run saw.
#[derive(Debug, PartialEq, Eq)]
struct Outcome {
    appended: u64,
    read_back_in_order: bool,
    adds_overloaded: u64,
    cache_filled: bool,
}

async fn append_backlog(way: Transport) -> Outcome {
    let dirs = tempfile::tempdir().unwrap();
    let mut config = bookie_config(&dirs.path().join("journal"), &dirs.path().join("ledgers"));
    // The smallest cache storage accepts (two max-size entries, ~10 MiB),
    // flushed only when full: the backlog overruns it again and again.
    config.storage.write_cache_bytes_max =
        2 * (u64::from(vela_bookie::storage::ENTRY_PAYLOAD_BYTES_MAX) + 4096);
    config.storage.flush_threshold_bytes = config.storage.write_cache_bytes_max;
    config.storage.flush_interval = Duration::from_secs(600);
    let bookie = tokio::task::spawn_blocking(move || Bookie::open(config))
        .await
        .unwrap()
        .unwrap();
    let bookie = Arc::new(bookie);
    let id = BookieId::new("bookie-0");
    let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let mut serving = None;
    let transport: Arc<dyn BookieTransport> = match way {
        Transport::InProcess => {
            register_at(&store, &id, "in-process", None).await;
            Arc::new(LocalBookies::new([(id.clone(), Arc::clone(&bookie))]))
        }
        Transport::Tcp => {
            let server = Server::bind("127.0.0.1:0".parse().unwrap(), Arc::clone(&bookie))
                .await
                .unwrap();
            register_at(&store, &id, &server.local_addr().to_string(), None).await;
            let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
            let task = tokio::spawn(async move {
                server
                    .run(async {
                        let _ = stopped.await;
                    })
                    .await
                    .unwrap();
            });
            serving = Some((stop, task));
            Arc::new(BookieClientTransport::new(
                store.clone(),
                ClientConfig::default(),
            ))
        }
    };
    let client = LedgerClient::new(
        store.clone(),
        transport,
        LedgerConfig {
            placement_seed: Some(5),
            ..LedgerConfig::default()
        },
    );
    let env = LogEnv::new(
        store.clone(),
        Arc::new(ReplicatedLedgers::new(client.clone())),
    );
    // No reader marks: nothing is cached, every read goes to the bookie.
    let config = LogConfig::default();
    let log = ManagedLog::open(&env, "t/ns/persistent/backlog", config)
        .await
        .unwrap();
    log.open_cursor("sub", CursorStart::Earliest).await.unwrap();

    // The whole backlog at once, as a broker with many producers would issue it.
    let appends: Vec<_> = (0..ENTRIES).map(|i| log.append(entry(i))).collect();
    let mut positions: Vec<Position> = Vec::new();
    for (i, append) in appends.into_iter().enumerate() {
        match append.await {
            Ok(position) => positions.push(position),
            Err(error) => panic!("{way:?}: append {i} refused or lost: {error}"),
        }
    }
    assert!(positions.windows(2).all(|pair| pair[0] < pair[1]));

    let mut read = Vec::new();
    let mut from = log.first_position().unwrap();
    while read.len() < ENTRIES as usize {
        let batch = log.read(from, 32, 8 << 20).await.unwrap();
        let Some(last) = batch.last() else { break };
        from = log.next_position(last.position);
        read.extend(batch.into_iter().map(|e| e.data));
    }
    let read_back_in_order = read == (0..ENTRIES).map(entry).collect::<Vec<_>>();

    let outcome = Outcome {
        appended: positions.len() as u64,
        read_back_in_order,
        adds_overloaded: client.stats().adds_overloaded,
        cache_filled: bookie.stats().storage.write_cache_full_count > 0,
    };
    log.close().await.unwrap();
    drop((log, env, client));
    if let Some((stop, task)) = serving {
        let _ = stop.send(());
        task.await.unwrap();
    }
    tokio::task::spawn_blocking(move || bookie.shutdown())
        .await
        .unwrap();
    outcome
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backlog_beyond_the_write_cache_is_held_back_not_refused_in_process_and_over_tcp() {
    let expected = Outcome {
        appended: ENTRIES,
        read_back_in_order: true,
        adds_overloaded: 0,
        cache_filled: true,
    };
    let in_process = append_backlog(Transport::InProcess).await;
    assert_eq!(in_process, expected, "in process (standalone)");
    let over_tcp = append_backlog(Transport::Tcp).await;
    assert_eq!(over_tcp, expected, "over TCP (cluster)");
}
