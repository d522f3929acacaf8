//! Unit tests of the bookie: LAC tracking, fencing, and the disk-fault
//! modes (read-only on a full disk, failed on a write error, reopened when the
//! disk is healthy) with nothing acknowledged lost.
#![allow(clippy::unwrap_used)]

use super::*;
use std::sync::atomic::AtomicBool;
use std::sync::mpsc;
use std::time::Instant;
use vela_bookie_protocol::AddMode;
use vela_bookie_protocol::entry::{EntryHeader, encode_entry};

fn open(dir: &std::path::Path) -> Bookie {
    let mut config = BookieConfig::new(dir.join("journal"), dir.join("ledgers"));
    config.journal.prealloc_chunk_bytes = 1 << 20;
    config.journal.file_bytes_max = 64 << 20;
    Bookie::open(config).unwrap()
}

fn add(
    bookie: &Bookie,
    ledger_id: u64,
    entry_id: u64,
    lac: Option<u64>,
) -> Result<(u64, u64), Status> {
    let header = EntryHeader {
        ledger_id,
        entry_id,
        last_add_confirmed: lac,
        ledger_length: 0,
    };
    add_taken(bookie, &header, b"x", AddMode::Normal)
        .recv()
        .unwrap()
}

/// The header of an entry added in order: the entry before it is confirmed.
fn in_order(ledger_id: u64, entry_id: u64) -> EntryHeader {
    EntryHeader {
        ledger_id,
        entry_id,
        last_add_confirmed: entry_id.checked_sub(1),
        ledger_length: 0,
    }
}

/// Issues one add, which the bookie must take at once; its result arrives on
/// the returned receiver.
fn add_taken(
    bookie: &Bookie,
    header: &EntryHeader,
    payload: &[u8],
    mode: AddMode,
) -> mpsc::Receiver<AddResult> {
    let (done, answer) = mpsc::channel();
    assert!(
        bookie
            .add(encode_entry(header, payload), mode, move |result| {
                done.send(result).unwrap();
            })
            .is_taken()
    );
    answer
}

impl Bookie {
    /// Drops every tracked LAC, as a full stripe does.
    fn forget_known_lacs(&self) {
        for index in 0..LEDGER_STRIPES {
            self.core.stripes[index].lock().unwrap().lacs.clear();
        }
    }
}

#[test]
fn known_lac_is_the_max_carried_and_survives_forgetting_and_restart() {
    let dir = tempfile::tempdir().unwrap();
    let bookie = open(dir.path());
    // Out of order, as pipelined writers and recovery can deliver them.
    assert_eq!(add(&bookie, 1, 5, Some(4)), Ok((1, 5)));
    assert_eq!(add(&bookie, 1, 3, Some(2)), Ok((1, 3)));
    assert_eq!(add(&bookie, 1, 0, None), Ok((1, 0)));
    assert_eq!(bookie.read_lac(1), Ok(Some(4)));
    bookie.forget_known_lacs();
    // Adds while untracked raise the value that derivation then folds in.
    assert_eq!(add(&bookie, 1, 4, Some(3)), Ok((1, 4)));
    assert_eq!(bookie.read_lac(1), Ok(Some(4)));
    assert_eq!(add(&bookie, 1, 6, Some(5)), Ok((1, 6)));
    assert_eq!(bookie.read_lac(1), Ok(Some(5)));
    assert_eq!(bookie.read_entry(1, LAST_ENTRY).unwrap().entry_id, 6);
    drop(bookie);

    let bookie = open(dir.path());
    assert_eq!(bookie.read_lac(1), Ok(Some(5)));
    assert_eq!(bookie.read_lac(2), Err(Status::NoSuchLedger));
    assert_eq!(bookie.stats().add_us.count, 0);
    assert_eq!(add(&bookie, 2, 0, None), Ok((2, 0)));
    assert_eq!(bookie.read_lac(2), Ok(None));
    assert_eq!(bookie.stats().add_us.count, 1);
}

#[test]
fn a_fence_answer_covers_every_add_acknowledged_on_the_ledger() {
    // Two threads pipeline normal adds to one ledger while a third fences it.
    // Every add answered OK was accepted before the fence, so it must be
    // readable right when the fence is answered; adds after it are FENCED.
    use std::sync::atomic::AtomicUsize;
    let dir = tempfile::tempdir().unwrap();
    let bookie = Arc::new(open(dir.path()));
    let fenced = Arc::new(AtomicBool::new(false));
    let submitted = Arc::new(AtomicUsize::new(0));
    let results = Arc::new(Mutex::new(Vec::new()));
    let adders: Vec<_> = (0..2u64)
        .map(|thread| {
            let (bookie, fenced, submitted, results) = (
                bookie.clone(),
                fenced.clone(),
                submitted.clone(),
                results.clone(),
            );
            std::thread::spawn(move || {
                let mut after_fence = 0;
                for index in 0.. {
                    if fenced.load(Ordering::Acquire) {
                        after_fence += 1;
                        if after_fence > 50 {
                            break;
                        }
                    }
                    let entry_id = 2 * index + thread;
                    let header = EntryHeader {
                        ledger_id: 7,
                        entry_id,
                        last_add_confirmed: None,
                        ledger_length: 0,
                    };
                    let results = results.clone();
                    assert!(
                        bookie
                            .add(
                                encode_entry(&header, b"x"),
                                AddMode::Normal,
                                move |result| {
                                    results.lock().unwrap().push((entry_id, result));
                                },
                            )
                            .is_taken()
                    );
                    submitted.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    while submitted.load(Ordering::Relaxed) < 500 {
        std::thread::yield_now();
    }
    let (done, answer) = mpsc::channel();
    bookie.fence(7, move |result| done.send(result).unwrap());
    assert_eq!(answer.recv().unwrap(), Ok(()));
    let last_at_fence = bookie.read_entry(7, LAST_ENTRY).unwrap().entry_id;
    let readable_at_fence: std::collections::HashSet<u64> = (0..=last_at_fence)
        .filter(|&entry_id| bookie.read_entry(7, entry_id).is_ok())
        .collect();
    fenced.store(true, Ordering::Release);
    for adder in adders {
        adder.join().unwrap();
    }
    let total = submitted.load(Ordering::Relaxed);
    while results.lock().unwrap().len() < total {
        std::thread::sleep(Duration::from_millis(1));
    }
    let results = results.lock().unwrap();
    let mut acked = 0;
    let mut refused = 0;
    for (entry_id, result) in results.iter() {
        match result {
            Ok(_) => {
                acked += 1;
                assert!(
                    readable_at_fence.contains(entry_id),
                    "entry {entry_id} was acknowledged but not visible when the fence was answered"
                );
            }
            Err(Status::Fenced) => refused += 1,
            Err(other) => panic!("entry {entry_id}: unexpected {other:?}"),
        }
    }
    assert!(
        acked >= 500 && refused >= 100,
        "acked {acked}, refused {refused}"
    );
}

#[test]
fn bad_headers_are_bad_requests() {
    let dir = tempfile::tempdir().unwrap();
    let bookie = open(dir.path());
    let (done, answer) = mpsc::channel();
    assert!(
        bookie
            .add(
                Bytes::from_static(b"too short"),
                AddMode::Normal,
                move |result| {
                    done.send(result).unwrap();
                },
            )
            .is_taken()
    );
    assert_eq!(answer.recv().unwrap(), Err(Status::BadRequest));
}

// ---------------------------------------------------------------------------
// Disk faults.
// ---------------------------------------------------------------------------

/// A disk whose used fraction (per mille) the test sets.
fn simulated_disk(used_per_mille: &Arc<AtomicU64>) -> crate::disk::DiskProbe {
    let used = used_per_mille.clone();
    crate::disk::DiskProbe::new(move |_| {
        let used = used.load(Ordering::SeqCst).min(1000);
        Ok(crate::disk::DiskUsage {
            total_bytes: 1000,
            available_bytes: 1000 - used,
        })
    })
}

fn faulty_config(
    dir: &std::path::Path,
    used_per_mille: &Arc<AtomicU64>,
    plan: &Arc<crate::journal::FaultPlan>,
) -> BookieConfig {
    let mut config = BookieConfig::new(dir.join("journal"), dir.join("ledgers"));
    config.journal.prealloc_chunk_bytes = 1 << 20;
    config.journal.file_bytes_max = 64 << 20;
    config.disk.check_interval = Duration::from_millis(10);
    config.disk_probe = simulated_disk(used_per_mille);
    config.journal_faults = Some(plan.clone());
    config
}

/// Waits (up to 20 s) until `check` holds of the bookie's state.
fn wait_for_state(bookie: &Bookie, what: &str, check: impl Fn(&BookieState) -> bool) {
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        let state = bookie.state();
        if check(&state) {
            return;
        }
        assert!(Instant::now() < deadline, "waited for {what}: {state:?}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

fn add_with_mode(
    bookie: &Bookie,
    ledger_id: u64,
    entry_id: u64,
    mode: AddMode,
) -> Result<(), Status> {
    add_taken(bookie, &in_order(ledger_id, entry_id), b"payload", mode)
        .recv()
        .unwrap()
        .map(|_| ())
}

fn fence_now(bookie: &Bookie, ledger_id: u64) -> Result<(), Status> {
    let (done, answer) = mpsc::channel();
    bookie.fence(ledger_id, move |result| done.send(result).unwrap());
    answer.recv().unwrap()
}

#[test]
fn a_disk_past_the_threshold_makes_the_bookie_read_only_until_it_drops_below_the_low_water_mark() {
    let dir = tempfile::tempdir().unwrap();
    let used = Arc::new(AtomicU64::new(500));
    let plan = Arc::new(crate::journal::FaultPlan::default());
    let bookie = Bookie::open(faulty_config(dir.path(), &used, &plan)).unwrap();
    for entry_id in 0..5 {
        add_with_mode(&bookie, 1, entry_id, AddMode::Normal).unwrap();
    }
    used.store(960, Ordering::SeqCst);
    wait_for_state(&bookie, "read-only", |s| s.mode == BookieMode::ReadOnly);
    let state = bookie.state();
    let reason = state.reason.unwrap();
    assert!(
        reason.contains("96.0%") && reason.contains("95.0%"),
        "{reason}"
    );
    assert_eq!(state.read_only_entered_count, 1);
    // New adds are refused; what finishes recoveries and frees space is not.
    assert_eq!(
        add_with_mode(&bookie, 1, 5, AddMode::Normal),
        Err(Status::ReadOnly)
    );
    assert_eq!(add_with_mode(&bookie, 2, 0, AddMode::Recovery), Ok(()));
    assert_eq!(fence_now(&bookie, 2), Ok(()));
    for entry_id in 0..5 {
        assert!(bookie.read_entry(1, entry_id).is_ok());
    }
    // Between the marks: still read-only (no flapping at the threshold).
    used.store(920, Ordering::SeqCst);
    std::thread::sleep(Duration::from_millis(100));
    assert_eq!(bookie.state().mode, BookieMode::ReadOnly);
    used.store(890, Ordering::SeqCst);
    wait_for_state(&bookie, "writable", |s| s.mode == BookieMode::Writable);
    assert_eq!(add_with_mode(&bookie, 1, 5, AddMode::Normal), Ok(()));
    assert!(bookie.state().reason.is_none());
}

/// Adds `entry_ids` to ledger 1 from two threads' worth of pipelining:
/// returns the ids acknowledged.
fn add_many(bookie: &Bookie, entry_ids: std::ops::Range<u64>) -> Vec<u64> {
    let (done, answers) = mpsc::channel();
    let count = entry_ids.end - entry_ids.start;
    for entry_id in entry_ids {
        let header = EntryHeader {
            ledger_id: 1,
            entry_id,
            last_add_confirmed: None,
            ledger_length: 0,
        };
        let done = done.clone();
        assert!(
            bookie
                .add(
                    encode_entry(&header, &entry_id.to_le_bytes()),
                    AddMode::Normal,
                    move |result| done.send((entry_id, result)).unwrap(),
                )
                .is_taken()
        );
    }
    let mut acked = Vec::new();
    for _ in 0..count {
        let (entry_id, result) = answers.recv_timeout(Duration::from_secs(20)).unwrap();
        match result {
            Ok(_) => acked.push(entry_id),
            Err(status) => assert_eq!(status, Status::ReadOnly, "entry {entry_id}"),
        }
    }
    acked.sort_unstable();
    acked
}

fn assert_readable(bookie: &Bookie, acked: &[u64]) {
    for &entry_id in acked {
        let stored = bookie
            .read_entry(1, entry_id)
            .unwrap_or_else(|status| panic!("acked entry {entry_id}: {status:?}"));
        let (_, payload) = vela_bookie_protocol::entry::decode_entry(&stored.entry).unwrap();
        assert_eq!(&payload[..], &entry_id.to_le_bytes()[..]);
    }
}

#[test]
fn a_failed_journal_sync_fails_the_bookie_and_a_healthy_disk_reopens_it_losing_nothing_acked() {
    let dir = tempfile::tempdir().unwrap();
    let used = Arc::new(AtomicU64::new(500));
    let plan = Arc::new(crate::journal::FaultPlan::default());
    let config = faulty_config(dir.path(), &used, &plan);
    let bookie = Bookie::open(config.clone()).unwrap();
    let mut acked = add_many(&bookie, 0..50);
    assert_eq!(acked.len(), 50);
    // The disk fills: the journal's fdatasync fails (as ENOSPC or EIO would).
    used.store(1000, Ordering::SeqCst);
    plan.fail_syncs.store(true, Ordering::SeqCst);
    acked.extend(add_many(&bookie, 50..100));
    wait_for_state(&bookie, "failed", |s| s.mode == BookieMode::Failed);
    assert!(bookie.state().reason.unwrap().contains("journal failed"));
    // Refused while failed, even once the fault is gone: nothing is retried
    // on the broken journal.
    plan.fail_syncs.store(false, Ordering::SeqCst);
    assert_eq!(add_many(&bookie, 100..110), Vec::<u64>::new());
    assert_eq!(fence_now(&bookie, 1), Err(Status::ReadOnly));
    // Reads are served meanwhile.
    assert_readable(&bookie, &acked);
    // Space comes back: the journal and storage are reopened, writable again.
    used.store(500, Ordering::SeqCst);
    wait_for_state(&bookie, "recovered", |s| {
        s.mode == BookieMode::Writable && s.recovered_count == 1
    });
    assert_readable(&bookie, &acked);
    let more = add_many(&bookie, 200..220);
    assert_eq!(more.len(), 20);
    acked.extend(more);
    assert_readable(&bookie, &acked);
    // And after a restart.
    drop(bookie);
    let bookie = Bookie::open(config).unwrap();
    assert_readable(&bookie, &acked);
    assert_eq!(bookie.state().mode, BookieMode::Writable);
}

#[test]
fn a_failed_storage_flush_fails_the_bookie_and_a_reopen_replays_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let used = Arc::new(AtomicU64::new(500));
    let plan = Arc::new(crate::journal::FaultPlan::default());
    let mut config = faulty_config(dir.path(), &used, &plan);
    config.storage.flush_interval = Duration::from_millis(20);
    let bookie = Bookie::open(config.clone()).unwrap();
    let engine = bookie.core.engine_now().unwrap();
    engine
        .storage
        .set_fail_point(Some(crate::storage::FailPoint::FlushBeforeIndexCommit));
    drop(engine);
    // Acknowledged by the journal; the flush of these entries fails.
    let acked = add_many(&bookie, 0..30);
    assert_eq!(acked.len(), 30);
    wait_for_state(&bookie, "failed", |s| s.mode == BookieMode::Failed);
    assert!(bookie.state().reason.unwrap().contains("ledger storage"));
    assert_readable(&bookie, &acked);
    // The disk is fine: after the backoff the engine is reopened (a new
    // storage without the fail point) and the journal replayed into it.
    wait_for_state(&bookie, "recovered", |s| {
        s.mode == BookieMode::Writable && s.recovered_count == 1
    });
    assert_readable(&bookie, &acked);
    drop(bookie);
    let bookie = Bookie::open(config).unwrap();
    assert_readable(&bookie, &acked);
}

#[test]
fn a_bookie_opened_on_a_full_disk_is_read_only_and_keeps_its_data_readable() {
    let dir = tempfile::tempdir().unwrap();
    let used = Arc::new(AtomicU64::new(500));
    let plan = Arc::new(crate::journal::FaultPlan::default());
    let mut config = faulty_config(dir.path(), &used, &plan);
    let bookie = Bookie::open(config.clone()).unwrap();
    let acked = add_many(&bookie, 0..10);
    drop(bookie);
    used.store(990, Ordering::SeqCst);
    // A check interval far longer than the test: only the check at open can
    // see the full disk.
    config.disk.check_interval = Duration::from_secs(3600);
    let bookie = Bookie::open(config).unwrap();
    wait_for_state(&bookie, "read-only", |s| s.mode == BookieMode::ReadOnly);
    assert_eq!(add_many(&bookie, 10..12), Vec::<u64>::new());
    assert_readable(&bookie, &acked);
}

/// A bookie whose write cache holds about forty 256 KiB entries and flushes
/// only when full: a burst of adds overruns it.
fn open_small_cache(dir: &std::path::Path) -> Bookie {
    let mut config = BookieConfig::new(dir.join("journal"), dir.join("ledgers"));
    config.journal.prealloc_chunk_bytes = 1 << 20;
    config.journal.file_bytes_max = 64 << 20;
    // The smallest cache storage accepts (two max-size entries).
    config.storage.write_cache_bytes_max =
        2 * (u64::from(crate::storage::ENTRY_PAYLOAD_BYTES_MAX) + 4096);
    config.storage.flush_threshold_bytes = config.storage.write_cache_bytes_max;
    config.storage.flush_interval = Duration::from_secs(600);
    Bookie::open(config).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn adds_that_find_the_write_cache_full_wait_for_room_in_call_order() {
    let dir = tempfile::tempdir().unwrap();
    let bookie = open_small_cache(dir.path());
    let completed = Arc::new(Mutex::new(Vec::new()));
    let mut admissions = Vec::new();
    // 50 MiB into a ~10 MiB cache, issued at once as a ledger writer would.
    for entry_id in 0..200u64 {
        let header = in_order(9, entry_id);
        let completed = completed.clone();
        admissions.push(bookie.add(
            encode_entry(&header, &vec![entry_id as u8; 256 * 1024]),
            AddMode::Normal,
            move |result| completed.lock().unwrap().push((entry_id, result)),
        ));
    }
    assert!(
        admissions.iter().any(|admission| !admission.is_taken()),
        "a burst five times the write cache never had to wait for room"
    );
    for admission in admissions {
        admission.await;
    }
    let deadline = Instant::now() + Duration::from_secs(20);
    while completed.lock().unwrap().len() < 200 {
        assert!(Instant::now() < deadline, "adds did not complete");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
    // Journal callbacks run in append order: the adds reached the journal in
    // the order they were called, and none was refused.
    let completed = completed.lock().unwrap().clone();
    let expected: Vec<(u64, AddResult)> = (0..200).map(|e| (e, Ok((9, e)))).collect();
    assert_eq!(completed, expected);
    let stats = bookie.stats();
    assert!(
        stats.storage.write_cache_full_count > 0,
        "{:?}",
        stats.storage
    );
    tokio::task::spawn_blocking(move || bookie.shutdown())
        .await
        .unwrap();
}

/// A bookie whose journal is a small pmem ring (emulated, on tmpfs when there
/// is one) and whose storage would not checkpoint on its own for an hour:
/// the journal asks for checkpoints as the ring fills, so adds worth several
/// rings complete, and a restart reads every one back.
#[test]
fn a_pmem_journal_asks_for_checkpoints_so_adds_outrun_its_ring() {
    let dir = tempfile::tempdir().unwrap();
    let shm = std::path::Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    let pmem_dir = tempfile::tempdir_in(base).unwrap();
    let config = || {
        let mut config = BookieConfig::new(dir.path().join("journal"), dir.path().join("ledgers"));
        config.journal.backend = crate::journal::JournalBackendKind::Pmem;
        config.journal.alignment_bytes = crate::journal::PMEM_ALIGNMENT_BYTES;
        config.journal.payload_bytes_max = 16 << 10;
        config.journal.group_bytes_max = 16 << 10;
        config.journal.pmem = Some(crate::journal::PmemConfig {
            dir: pmem_dir.path().to_path_buf(),
            // Four slots of 256 KiB.
            region_bytes: 4096 + (1 << 20),
            emulation: crate::journal::PmemEmulation::Allow,
        });
        config.storage.flush_interval = Duration::from_secs(3600);
        config
    };
    let bookie = Bookie::open(config()).unwrap();
    let payload = vec![0x3cu8; 2000];
    // ~3 MB of journal: three times the ring.
    for entry_id in 0..1500u64 {
        let header = in_order(7, entry_id);
        let result = add_taken(&bookie, &header, &payload, AddMode::Normal)
            .recv_timeout(Duration::from_secs(20))
            .unwrap();
        assert_eq!(result, Ok((7, entry_id)));
    }
    assert!(
        bookie.stats().storage.flush_count > 0,
        "the journal asked for checkpoints"
    );
    bookie.shutdown();
    drop(bookie);
    let bookie = Bookie::open(config()).unwrap();
    for entry_id in [0, 749, 1499] {
        let stored = bookie.read_entry(7, entry_id).unwrap();
        let (_, read) = vela_bookie_protocol::entry::decode_entry(&stored.entry).unwrap();
        assert_eq!(&read[..], &payload[..]);
    }
}
