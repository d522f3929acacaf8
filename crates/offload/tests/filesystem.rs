//! The filesystem offloader under a real managed log (in-memory metadata
//! and ledgers): closed ledgers offloaded, their bookie copies deleted
//! (lag 0), every entry read back byte for byte (also after a reopen, and in
//! reads cut by bytes); a store failing for a while (retried, status says
//! so); an offload cut short by a crash (the next owner reads the bookies,
//! then offloads cleanly, the dead attempt's objects deleted); corrupt and
//! missing objects (clear errors, counted).
#![allow(clippy::unwrap_used)]

use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use bytes::Bytes;
use vela_log::backend::BoxFuture;
use vela_log::memory::{MemoryBackend, MemoryLedgers};
use vela_log::{
    LedgerBackend, LedgerBackendError, LedgerOffloader, LogConfig, LogEnv, ManagedLog,
    OffloadError, OffloadPolicy, OffloadState, OffloadTarget, Position, Retention,
};
use vela_offload::{Driver, ObjectStoreOffloader, OffloadConfig};

const LOG: &str = "t/ns/persistent/offloaded";
const LEDGER_ENTRIES: u64 = 10;

/// Entry `i`: sizes from empty to 200 KiB, bytes depending on `i`.
fn entry(i: u64) -> Bytes {
    let len = match i % 7 {
        0 => 0,
        1 => 1,
        2 => 200 << 10,
        n => (n as usize) * 1000 + i as usize,
    };
    Bytes::from(
        (0..len)
            .map(|b| (b as u64 * 31 + i) as u8)
            .collect::<Vec<u8>>(),
    )
}

fn config(deletion_lag: Option<Duration>) -> LogConfig {
    LogConfig {
        ledger_entries_max: LEDGER_ENTRIES,
        ledger_age_min: Duration::ZERO,
        retention: Retention {
            time: None,
            size_bytes: None,
        },
        offload: OffloadPolicy {
            threshold_bytes: None,
            threshold_age: None,
            deletion_lag,
        },
        ..LogConfig::default()
    }
}

struct World {
    meta: Arc<vela_meta::MemoryStore>,
    ledgers: Arc<MemoryLedgers>,
    dir: tempfile::TempDir,
}

impl World {
    fn new() -> World {
        World {
            meta: Arc::new(vela_meta::MemoryStore::new()),
            ledgers: MemoryLedgers::new(),
            dir: tempfile::tempdir().unwrap(),
        }
    }

    fn offloader(&self) -> Arc<ObjectStoreOffloader> {
        let driver = Driver::Filesystem {
            root: self.dir.path().to_path_buf(),
        };
        Arc::new(ObjectStoreOffloader::new(OffloadConfig::new(driver)).unwrap())
    }

    fn env(&self, offloader: Arc<dyn LedgerOffloader>) -> LogEnv {
        LogEnv::new(
            self.meta.clone(),
            Arc::new(MemoryBackend(Arc::clone(&self.ledgers))),
        )
        .with_offloader(offloader)
    }

    /// Names of the objects stored for `ledger_id`.
    fn objects_of(&self, ledger_id: u64) -> Vec<String> {
        objects(self.dir.path())
            .into_iter()
            .filter(|name| {
                name.ends_with(&format!("-ledger-{ledger_id}"))
                    || name.ends_with(&format!("-ledger-{ledger_id}-index"))
            })
            .collect()
    }
}

fn objects(dir: &Path) -> Vec<String> {
    let mut names: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.contains("-ledger-"))
        .collect();
    names.sort();
    names
}

async fn append(log: &ManagedLog, range: std::ops::Range<u64>) {
    let futures: Vec<_> = range.map(|i| log.append(entry(i))).collect();
    for future in futures {
        future.await.unwrap();
    }
}

/// Every entry from the first, `bytes_max` per read.
async fn read_all(log: &ManagedLog, bytes_max: usize) -> Result<Vec<Bytes>, vela_log::LogError> {
    let mut out = Vec::new();
    let mut from = log.first_position().unwrap();
    loop {
        let batch = log.read(from, 64, bytes_max).await?;
        let Some(last) = batch.last() else { break };
        from = log.next_position(last.position);
        out.extend(batch.into_iter().map(|e| e.data));
    }
    Ok(out)
}

fn expected(count: u64) -> Vec<Bytes> {
    (0..count).map(entry).collect()
}

#[tokio::test]
async fn offloaded_ledgers_read_back_byte_for_byte_once_bookie_copies_are_gone() {
    let world = World::new();
    let offloader = world.offloader();
    let env = world.env(offloader.clone());
    let log = ManagedLog::open(&env, LOG, config(Some(Duration::ZERO)))
        .await
        .unwrap();
    append(&log, 0..55).await;
    let ledgers = log.ledger_ids();
    assert_eq!(
        ledgers.len(),
        6,
        "five full ledgers and the one being written"
    );
    let current = *ledgers.last().unwrap();

    let first_kept = log
        .offload_prefix(log.last_confirmed().unwrap())
        .await
        .unwrap();
    assert_eq!(first_kept, Position::new(current, 0));
    let offloaded = log.offloaded_ledgers();
    assert_eq!(
        offloaded,
        ledgers[..5]
            .iter()
            .map(|&id| (id, false))
            .collect::<Vec<_>>(),
        "offloaded, bookie copies deleted at once (lag 0)"
    );
    for &id in &ledgers[..5] {
        assert!(
            !world.ledgers.ledger_ids().contains(&id),
            "ledger {id} left the bookies"
        );
        assert_eq!(
            world.objects_of(id).len(),
            2,
            "data and index of ledger {id}"
        );
    }
    assert!(world.ledgers.ledger_ids().contains(&current));
    assert_eq!(log.offload_status().state, OffloadState::Success);
    assert_eq!(log.offload_status().first_unoffloaded, Some(first_kept));

    assert_eq!(read_all(&log, 1 << 20).await.unwrap(), expected(55));
    // Reads cut by bytes: one entry at a time where entries are large.
    assert_eq!(read_all(&log, 1).await.unwrap(), expected(55));
    // A read starting in the middle of an offloaded ledger (a seek).
    let middle = Position::new(ledgers[2], 3);
    let batch = log.read(middle, 4, 1 << 20).await.unwrap();
    assert_eq!(batch[0].position, middle);
    assert_eq!(batch[0].data, entry(23));
    let counters = offloader.counters();
    assert_eq!(counters.offloaded_ledgers, 5);
    assert!(counters.read_entries >= 100 && counters.read_errors == 0);

    // A second offload finds nothing more to do.
    assert_eq!(
        log.offload_prefix(log.last_confirmed().unwrap())
            .await
            .unwrap(),
        first_kept
    );
    assert_eq!(offloader.counters().offloaded_ledgers, 5);

    // After a reopen (the record says where each ledger lives).
    log.close().await.unwrap();
    drop(log);
    let log = ManagedLog::open(&env, LOG, config(Some(Duration::ZERO)))
        .await
        .unwrap();
    assert_eq!(read_all(&log, 1 << 20).await.unwrap(), expected(55));

    // Deleting the log deletes the objects too.
    log.delete().await.unwrap();
    assert_eq!(objects(world.dir.path()), Vec::<String>::new());
}

#[tokio::test]
async fn bookie_copies_stay_until_the_deletion_lag_and_invalid_positions_are_refused() {
    let world = World::new();
    let env = world.env(world.offloader());
    let log = ManagedLog::open(&env, LOG, config(None)).await.unwrap();
    append(&log, 0..25).await;
    let ledgers = log.ledger_ids();
    // Up to the second ledger: only the first goes.
    let first_kept = log
        .offload_prefix(Position::new(ledgers[1], 4))
        .await
        .unwrap();
    assert_eq!(first_kept, Position::new(ledgers[1], 0));
    assert_eq!(log.offloaded_ledgers(), vec![(ledgers[0], true)]);
    assert!(
        world.ledgers.ledger_ids().contains(&ledgers[0]),
        "no lag: kept"
    );
    assert_eq!(read_all(&log, 1 << 20).await.unwrap(), expected(25));

    // A lag set later applies at the next trim.
    log.set_offload_policy(OffloadPolicy {
        deletion_lag: Some(Duration::ZERO),
        ..log.offload_policy()
    });
    log.trim().await;
    assert_eq!(log.offloaded_ledgers(), vec![(ledgers[0], false)]);
    assert!(!world.ledgers.ledger_ids().contains(&ledgers[0]));

    let error = log
        .offload_prefix(Position::new(ledgers[1], 99))
        .await
        .unwrap_err();
    assert_eq!(
        error.to_string(),
        format!(
            "Invalid position for offload: {}",
            Position::new(ledgers[1], 99)
        )
    );
}

/// An offloader that fails (store unreachable) a number of times, or hangs
/// after writing its objects (a process killed mid-offload).
#[derive(Debug)]
struct Faulty {
    inner: Arc<ObjectStoreOffloader>,
    failures_left: AtomicU32,
    hang: bool,
}

impl LedgerOffloader for Faulty {
    fn driver_name(&self) -> &str {
        "faulty"
    }

    fn offload<'a>(
        &'a self,
        target: OffloadTarget,
        entries: u64,
        size_bytes: u64,
        source: &'a dyn LedgerBackend,
    ) -> BoxFuture<'a, Result<u64, OffloadError>> {
        Box::pin(async move {
            if self
                .failures_left
                .fetch_update(Ordering::SeqCst, Ordering::SeqCst, |n| n.checked_sub(1))
                .is_ok()
            {
                // Half done: the data object written, then the store went.
                let _ = self
                    .inner
                    .offload(target, entries, size_bytes, source)
                    .await;
                return Err(OffloadError::Store("connection refused".to_string()));
            }
            let written = self
                .inner
                .offload(target, entries, size_bytes, source)
                .await;
            if self.hang {
                std::future::pending::<()>().await;
            }
            written
        })
    }

    fn read(
        &self,
        target: OffloadTarget,
        first: u64,
        last: u64,
        bytes_max: usize,
    ) -> BoxFuture<'_, Result<Vec<Bytes>, LedgerBackendError>> {
        self.inner.read(target, first, last, bytes_max)
    }

    fn delete(&self, target: OffloadTarget) -> BoxFuture<'_, Result<(), OffloadError>> {
        self.inner.delete(target)
    }
}

#[tokio::test]
async fn an_unreachable_store_is_retried_and_the_status_says_why() {
    let world = World::new();
    let faulty = Arc::new(Faulty {
        inner: world.offloader(),
        failures_left: AtomicU32::new(1),
        hang: false,
    });
    let env = world.env(faulty.clone());
    let log = ManagedLog::open(&env, LOG, config(Some(Duration::ZERO)))
        .await
        .unwrap();
    append(&log, 0..15).await;
    let ledgers = log.ledger_ids();
    log.start_offload(log.last_confirmed().unwrap()).unwrap();
    // While it waits to retry: ERROR with the store's message; a second
    // trigger is refused.
    let status = loop {
        let status = log.offload_status();
        if status.state == OffloadState::Error {
            break status;
        }
        assert!(status.running, "{status:?}");
        tokio::time::sleep(Duration::from_millis(5)).await;
    };
    assert!(
        status.last_error.contains("connection refused"),
        "{status:?}"
    );
    assert!(status.running);
    assert_eq!(
        log.start_offload(log.last_confirmed().unwrap())
            .unwrap_err()
            .to_string(),
        "Offload already in progress"
    );
    assert!(
        world.ledgers.ledger_ids().contains(&ledgers[0]),
        "data stays on the bookies"
    );
    while log.offload_status().running {
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    assert_eq!(log.offload_status().state, OffloadState::Success);
    assert_eq!(log.offloaded_ledgers(), vec![(ledgers[0], false)]);
    assert_eq!(
        world.objects_of(ledgers[0]).len(),
        2,
        "the failed attempt's objects are gone"
    );
    assert_eq!(read_all(&log, 1 << 20).await.unwrap(), expected(15));
}

#[tokio::test]
async fn a_crash_mid_offload_leaves_the_bookies_read_and_the_next_owner_offloads_cleanly() {
    let world = World::new();
    let hanging = Arc::new(Faulty {
        inner: world.offloader(),
        failures_left: AtomicU32::new(0),
        hang: true,
    });
    let first_env = world.env(hanging);
    let first = ManagedLog::open(&first_env, LOG, config(Some(Duration::ZERO)))
        .await
        .unwrap();
    append(&first, 0..25).await;
    let ledgers = first.ledger_ids();
    first
        .start_offload(first.last_confirmed().unwrap())
        .unwrap();
    // The objects of ledger 0 are written, `complete` never recorded.
    while world.objects_of(ledgers[0]).len() < 2 {
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    let dead_attempt = world.objects_of(ledgers[0]);

    // Another broker takes the log over (the first is as good as killed).
    let env = world.env(world.offloader());
    let log = ManagedLog::open(&env, LOG, config(Some(Duration::ZERO)))
        .await
        .unwrap();
    assert_eq!(
        log.offloaded_ledgers(),
        vec![],
        "an incomplete offload is not used"
    );
    assert_eq!(read_all(&log, 1 << 20).await.unwrap(), expected(25));
    log.offload_prefix(log.last_confirmed().unwrap())
        .await
        .unwrap();
    assert_eq!(
        log.offloaded_ledgers(),
        vec![(ledgers[0], false), (ledgers[1], false)]
    );
    let objects_now = world.objects_of(ledgers[0]);
    assert_eq!(objects_now.len(), 2);
    assert!(
        dead_attempt.iter().all(|name| !objects_now.contains(name)),
        "the dead attempt's objects were deleted: {dead_attempt:?} {objects_now:?}"
    );
    assert_eq!(read_all(&log, 1 << 20).await.unwrap(), expected(25));
}

#[tokio::test]
async fn corrupt_and_missing_objects_are_clear_read_errors() {
    let world = World::new();
    let env = world.env(world.offloader());
    let log = ManagedLog::open(&env, LOG, config(Some(Duration::ZERO)))
        .await
        .unwrap();
    append(&log, 0..15).await;
    let ledgers = log.ledger_ids();
    log.offload_prefix(log.last_confirmed().unwrap())
        .await
        .unwrap();
    log.close().await.unwrap();
    drop(log);

    // Flip one byte of entry 3's payload (a fresh offloader: no cached index).
    let data_name = world
        .objects_of(ledgers[0])
        .into_iter()
        .find(|name| !name.ends_with("-index"))
        .unwrap();
    let data_path = world.dir.path().join(&data_name);
    let mut bytes = std::fs::read(&data_path).unwrap();
    let entry3_payload_at = 32 + (16 * 3) + entry(0).len() + entry(1).len() + entry(2).len() + 16;
    bytes[entry3_payload_at] ^= 1;
    std::fs::write(&data_path, &bytes).unwrap();
    let offloader = world.offloader();
    let env = world.env(offloader.clone());
    let log = ManagedLog::open(&env, LOG, config(Some(Duration::ZERO)))
        .await
        .unwrap();
    let first = Position::new(ledgers[0], 0);
    assert_eq!(
        log.read(first, 3, 1 << 20).await.unwrap().len(),
        3,
        "entries before it read"
    );
    let error = log.read(first, 10, 1 << 20).await.unwrap_err().to_string();
    assert!(error.contains("entry 3: checksum mismatch"), "{error}");
    assert_eq!(offloader.counters().read_errors, 1);

    // The index gone (fresh offloader again).
    let index_name = format!("{data_name}-index");
    std::fs::remove_file(world.dir.path().join(index_name)).unwrap();
    let offloader = world.offloader();
    let env = world.env(offloader.clone());
    let log = ManagedLog::open(&env, LOG, config(Some(Duration::ZERO)))
        .await
        .unwrap();
    let error = log.read(first, 10, 1 << 20).await.unwrap_err().to_string();
    assert!(error.contains("is missing"), "{error}");
    assert_eq!(offloader.counters().read_errors, 1);
}

#[tokio::test]
async fn a_size_threshold_offloads_closed_ledgers_as_they_close() {
    let world = World::new();
    let env = world.env(world.offloader());
    let mut config = config(Some(Duration::ZERO));
    // Keep nothing on the bookies but the ledger being written.
    config.offload.threshold_bytes = Some(0);
    let log = ManagedLog::open(&env, LOG, config).await.unwrap();
    append(&log, 0..35).await;
    let ledgers = log.ledger_ids();
    assert_eq!(ledgers.len(), 4);
    // Rollovers started offloads; the lifecycle pass (here: this loop)
    // starts one for what closed while another ran.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while log.offloaded_ledgers().len() < 3 {
        assert!(
            std::time::Instant::now() < deadline,
            "{:?}",
            log.offloaded_ledgers()
        );
        log.offload_by_policy();
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        log.offloaded_ledgers(),
        ledgers[..3]
            .iter()
            .map(|&id| (id, false))
            .collect::<Vec<_>>()
    );
    assert_eq!(world.ledgers.ledger_ids(), vec![ledgers[3]]);
    assert_eq!(read_all(&log, 1 << 20).await.unwrap(), expected(35));
    // Nothing more to select: no offload starts.
    while log.offload_status().running {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(!log.offload_by_policy());
}
