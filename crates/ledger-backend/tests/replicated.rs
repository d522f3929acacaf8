//! The managed log on replicated ledgers (`ReplicatedLedgers` over the ledger
//! client and a simulated bookie cluster): order through the writer's budget
//! and the log's append queue, reads from bookies, recovery that fences the
//! previous owner, and appends that go on when a bookie dies.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use vela_ledger::sim::SimCluster;
use vela_ledger::{BookieId, LedgerClient, LedgerConfig};
use vela_ledger_backend::ReplicatedLedgers;
use vela_log::{CursorStart, LogConfig, LogEnv, LogError, ManagedLog, Persistence, Position};
use vela_meta::{ExpectedVersion, MemoryStore, MetadataStore, registry};

struct Cluster {
    sim: SimCluster,
    store: Arc<dyn MetadataStore>,
}

impl Cluster {
    async fn new(bookies: usize) -> Cluster {
        let sim = SimCluster::new(7);
        let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        for i in 0..bookies {
            let id = BookieId::new(format!("bookie-{i}"));
            sim.add_bookie(&id);
            let rid = registry::BookieId::new(id.0.as_str()).unwrap();
            let info = registry::BookieInfo {
                address: format!("sim://{id}"),
                rack: None,
            };
            store
                .put(
                    &registry::bookie_key(&rid),
                    registry::encode_bookie_info(&info).unwrap(),
                    ExpectedVersion::Any,
                )
                .await
                .unwrap();
        }
        Cluster { sim, store }
    }

    /// A log environment as one broker process would have it.
    fn env(&self, pending_adds_max: usize) -> LogEnv {
        let config = LedgerConfig {
            add_timeout: Duration::from_millis(200),
            read_timeout: Duration::from_millis(200),
            pending_adds_max,
            placement_seed: Some(3),
            ..LedgerConfig::default()
        };
        let client = LedgerClient::new(self.store.clone(), Arc::new(self.sim.clone()), config);
        LogEnv::new(self.store.clone(), Arc::new(ReplicatedLedgers::new(client)))
    }
}

fn config(persistence: Persistence) -> LogConfig {
    LogConfig {
        persistence,
        ledger_entries_max: 50,
        ledger_age_min: Duration::ZERO,
        // No reader marks: nothing is cached, every read goes to the bookies.
        cursor_persist_interval: Duration::from_millis(1),
        ..LogConfig::default()
    }
}

fn entry(i: u64) -> Bytes {
    Bytes::from(format!("entry-{i}-{}", "v".repeat((i % 13) as usize)))
}

async fn read_all(log: &ManagedLog) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut from = log.first_position().unwrap_or(Position::new(0, 0));
    loop {
        let batch = log.read(from, 64, 1 << 20).await.unwrap();
        let Some(last) = batch.last() else { break };
        from = log.next_position(last.position);
        out.extend(batch.into_iter().map(|e| e.data));
    }
    out
}

#[tokio::test]
async fn appends_beyond_the_writer_budget_keep_their_order() {
    let cluster = Cluster::new(3).await;
    // A budget of 2 adds per ledger: almost every append waits in the log's
    // append queue for room.
    let env = cluster.env(2);
    let log = ManagedLog::open(
        &env,
        "t/ns/persistent/order",
        config(Persistence {
            ensemble: 3,
            write_quorum: 2,
            ack_quorum: 2,
        }),
    )
    .await
    .unwrap();
    log.open_cursor("keep", CursorStart::Earliest)
        .await
        .unwrap();
    let futures: Vec<_> = (0..500).map(|i| log.append(entry(i))).collect();
    let mut positions = Vec::new();
    for future in futures {
        positions.push(future.await.unwrap());
    }
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    // Rollover every 50 entries.
    let ledgers: std::collections::BTreeSet<u64> = positions.iter().map(|p| p.ledger_id).collect();
    assert!(ledgers.len() >= 10, "{ledgers:?}");
    assert_eq!(
        read_all(&log).await,
        (0..500).map(entry).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn reopen_elsewhere_fences_the_previous_owner_and_keeps_every_acked_entry() {
    let cluster = Cluster::new(3).await;
    let persistence = Persistence {
        ensemble: 2,
        write_quorum: 2,
        ack_quorum: 2,
    };
    let first_env = cluster.env(64);
    let first = ManagedLog::open(&first_env, "t/ns/persistent/owner", config(persistence))
        .await
        .unwrap();
    first
        .open_cursor("sub", CursorStart::Earliest)
        .await
        .unwrap();
    for i in 0..30 {
        first.append(entry(i)).await.unwrap();
    }

    // Another broker takes the topic over without the first one closing it.
    let second_env = cluster.env(64);
    let second = ManagedLog::open(&second_env, "t/ns/persistent/owner", config(persistence))
        .await
        .unwrap();
    assert_eq!(
        read_all(&second).await,
        (0..30).map(entry).collect::<Vec<_>>()
    );

    // The deposed owner gets nothing more acknowledged.
    let late = first.append(entry(999)).await;
    assert!(
        matches!(late, Err(LogError::Fenced(_)) | Err(LogError::Ledger(_))),
        "{late:?}"
    );
    for i in 30..40 {
        second.append(entry(i)).await.unwrap();
    }
    assert_eq!(
        read_all(&second).await,
        (0..40).map(entry).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn appends_go_on_when_a_bookie_dies() {
    let cluster = Cluster::new(3).await;
    let env = cluster.env(64);
    let log = ManagedLog::open(
        &env,
        "t/ns/persistent/survive",
        config(Persistence {
            ensemble: 2,
            write_quorum: 2,
            ack_quorum: 2,
        }),
    )
    .await
    .unwrap();
    log.open_cursor("sub", CursorStart::Earliest).await.unwrap();
    for i in 0..10 {
        log.append(entry(i)).await.unwrap();
    }
    // Kill a bookie of the current ensemble: the writer replaces it.
    cluster.sim.kill(&BookieId::new("bookie-0"));
    for i in 10..20 {
        log.append(entry(i)).await.unwrap();
    }
    assert_eq!(read_all(&log).await, (0..20).map(entry).collect::<Vec<_>>());
}

#[tokio::test]
async fn an_entry_too_large_for_a_ledger_is_refused_and_the_log_goes_on() {
    let cluster = Cluster::new(1).await;
    let env = cluster.env(64);
    let log = ManagedLog::open(&env, "t/ns/persistent/large", config(Persistence::SINGLE))
        .await
        .unwrap();
    let too_large = Bytes::from(vec![7u8; vela_ledger::ENTRY_PAYLOAD_BYTES_MAX + 1]);
    let refused = log.append(too_large).await;
    assert!(
        matches!(refused, Err(LogError::EntryTooLarge { .. })),
        "{refused:?}"
    );
    let largest = Bytes::from(vec![8u8; vela_ledger::ENTRY_PAYLOAD_BYTES_MAX]);
    log.append(largest.clone()).await.unwrap();
    log.append(entry(1)).await.unwrap();
}
