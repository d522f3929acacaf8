//! What appends wait for at a rollover: neither the next ledger's creation
//! (it is created ahead, while the current ledger is nearly full) nor the
//! full ledger's close. In-memory ledgers whose creations and closes a test
//! holds back.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use vela_log::memory::HoldingBackend;
use vela_log::{LogConfig, LogEnv, ManagedLog, Position};

/// In-memory ledgers whose creations and closes the test lets through
/// (`HoldingBackend::with_gates`), and the logs' metadata, kept across
/// reopens.
struct Gated {
    backend: HoldingBackend,
    meta: Arc<vela_meta::MemoryStore>,
}

impl Gated {
    fn new(creations: usize, closes: usize) -> Gated {
        Gated {
            backend: HoldingBackend::with_gates(creations, closes),
            meta: Arc::new(vela_meta::MemoryStore::new()),
        }
    }
}

/// Ledgers full at 4 entries (nearly full at 3), rolled over at once.
fn config() -> LogConfig {
    LogConfig {
        ledger_entries_max: 4,
        ledger_age_min: Duration::ZERO,
        ..LogConfig::default()
    }
}

fn env(backend: &Gated) -> LogEnv {
    LogEnv::new(backend.meta.clone(), Arc::new(backend.backend.clone()))
}

/// A guard against a hang: what is awaited here must come without any
/// held creation or close being let through.
async fn without_a_hang<T>(future: impl std::future::Future<Output = T>) -> T {
    tokio::time::timeout(Duration::from_secs(20), future)
        .await
        .expect("waited for something the test holds")
}

async fn append_all(log: &ManagedLog, range: std::ops::Range<u64>) -> Vec<Position> {
    let futures: Vec<_> = range
        .map(|i| log.append(Bytes::from(format!("entry-{i}"))))
        .collect();
    let mut positions = Vec::new();
    for future in futures {
        positions.push(without_a_hang(future).await.unwrap());
    }
    positions
}

#[tokio::test]
async fn the_next_ledger_is_created_before_the_current_one_is_full() {
    // Creations: the first ledger and the next one; nothing after.
    let backend = Gated::new(2, usize::MAX >> 4);
    let log = ManagedLog::open(&env(&backend), "t/created-ahead", config())
        .await
        .unwrap();
    let first = append_all(&log, 0..3).await;
    assert!(first.iter().all(|p| p.ledger_id == first[0].ledger_id));
    // Three of four entries: the next ledger is made now, before the
    // rollover (before, it was made only once the ledger was full).
    without_a_hang(async {
        while backend.backend.created_count() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    // The rollover at the fourth entry takes it; appends past it complete
    // while the creation of the ledger after it is held.
    let rest = append_all(&log, 3..8).await;
    let second = rest[1].ledger_id;
    assert!(second > first[0].ledger_id);
    let expected: Vec<Position> = (0..4)
        .map(|e| Position::new(first[0].ledger_id, e))
        .chain((0..4).map(|e| Position::new(second, e)))
        .collect();
    let all: Vec<Position> = first.into_iter().chain(rest).collect();
    assert_eq!(all, expected);
    assert_eq!(log.ledger_ids(), vec![expected[0].ledger_id, second]);
    // The second ledger is nearly full too: its successor's creation is
    // held. Closing the log waits for none of it.
    without_a_hang(log.close()).await.unwrap();
}

#[tokio::test]
async fn appends_after_a_rollover_do_not_wait_for_the_full_ledger_s_close() {
    // Every creation goes through; no close does.
    let backend = Gated::new(usize::MAX >> 4, 0);
    let log = ManagedLog::open(&env(&backend), "t/close-beside", config())
        .await
        .unwrap();
    let positions = append_all(&log, 0..6).await;
    assert_eq!(positions[3].entry_id, 3);
    assert_eq!(positions[4], Position::new(positions[4].ledger_id, 0));
    assert!(positions[4].ledger_id > positions[3].ledger_id);
    assert_eq!(log.last_confirmed(), Some(positions[5]));
    // The close goes through once let: the log goes on.
    backend.backend.allow_closes(usize::MAX >> 4);
    let more = append_all(&log, 6..10).await;
    assert_eq!(more.last().unwrap().entry_id, 1);
    assert!(!log.is_closed());
}

#[tokio::test]
async fn a_next_ledger_nobody_took_is_deleted_when_the_log_closes() {
    let backend = Gated::new(usize::MAX >> 4, usize::MAX >> 4);
    let ledgers = backend.backend.ledgers();
    let log = ManagedLog::open(&env(&backend), "t/discarded", config())
        .await
        .unwrap();
    let positions = append_all(&log, 0..3).await;
    without_a_hang(async {
        while backend.backend.created_count() < 2 {
            tokio::task::yield_now().await;
        }
    })
    .await;
    assert_eq!(ledgers.ledger_ids().len(), 2, "the current and the next");
    log.close().await.unwrap();
    assert_eq!(
        ledgers.ledger_ids(),
        vec![positions[0].ledger_id],
        "the unused next ledger is gone"
    );
    // Reopened, the log has its three entries and goes on.
    let log = ManagedLog::open(&env(&backend), "t/discarded", config())
        .await
        .unwrap();
    assert_eq!(log.last_confirmed(), Some(positions[2]));
}
