//! Ledger storage through its public API: put/get across cache, flush and
//! reopen; checkpoints; crash between entry-log write and index commit; cache
//! bounds; ledger state; corruption.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use vela_bookie::JournalMark;
use vela_bookie::storage::{FailPoint, LedgerStorage, Put, StorageConfig, StorageError};

/// Small budgets so tests exercise the limits quickly.
fn config(dir: &Path) -> StorageConfig {
    let mut c = StorageConfig::new(dir);
    c.write_cache_bytes_max = 16 * 1024 * 1024;
    c.flush_threshold_bytes = 4 * 1024 * 1024;
    c.read_cache_bytes_max = 1024 * 1024;
    c.read_ahead_bytes_max = 64 * 1024;
    c.entry_log_size_max_bytes = 16 * 1024 * 1024;
    c.writeback_step_bytes = 256 * 1024;
    c
}

fn open(c: &StorageConfig) -> (LedgerStorage, JournalMark) {
    LedgerStorage::open(c.clone()).unwrap()
}

/// Deterministic payload of entry (l, e): its length and bytes depend on both.
fn payload(l: u64, e: u64) -> Bytes {
    let len = 10 + ((l * 31 + e * 7) % 300) as usize;
    Bytes::from(
        (0..len)
            .map(|i| (l as usize * 13 + e as usize * 5 + i) as u8)
            .collect::<Vec<u8>>(),
    )
}

fn put_range(s: &LedgerStorage, l: u64, entries: impl IntoIterator<Item = u64>) {
    for e in entries {
        s.put_entry(l, e, payload(l, e)).unwrap();
    }
}

fn check_range(s: &LedgerStorage, l: u64, entries: impl IntoIterator<Item = u64>) {
    for e in entries {
        assert_eq!(s.get_entry(l, e).unwrap(), payload(l, e), "entry {l}:{e}");
    }
}

fn log_files(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n.ends_with(".log"))
        .collect();
    v.sort();
    v
}

#[test]
fn put_get_from_cache_after_flush_and_after_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, mark) = open(&c);
    assert_eq!(mark, JournalMark::START);
    // Interleaved ledgers, and a striped ledger with gaps (E=3, Qw=2 pattern).
    for e in 0..200 {
        s.put_entry(1, e, payload(1, e)).unwrap();
        s.put_entry(2, e, payload(2, e)).unwrap();
    }
    let striped: Vec<u64> = (0..300).filter(|e| e % 3 != 2).collect();
    put_range(&s, 3, striped.iter().copied());
    check_range(&s, 1, 0..200);
    assert_eq!(s.last_entry_id(1).unwrap(), Some(199));

    let st = s.flush().unwrap();
    assert_eq!(st.entry_count, 400 + striped.len() as u64);
    assert_eq!(
        st.index_record_count, 3,
        "one index record per ledger per flush"
    );
    check_range(&s, 1, 0..200);
    check_range(&s, 2, 0..200);
    check_range(&s, 3, striped.iter().copied());
    assert!(matches!(
        s.get_entry(3, 2),
        Err(StorageError::NoSuchEntry {
            ledger_id: 3,
            entry_id: 2
        })
    ));
    assert!(matches!(
        s.get_entry(3, 1000),
        Err(StorageError::NoSuchEntry { .. })
    ));
    assert!(matches!(
        s.get_entry(99, 0),
        Err(StorageError::NoSuchLedger { ledger_id: 99 })
    ));

    // More entries in a second flush, then reopen.
    put_range(&s, 1, 200..250);
    s.checkpoint(JournalMark {
        file_id: 1,
        offset: 100,
    })
    .unwrap();
    drop(s);
    let (s, mark) = open(&c);
    assert_eq!(
        mark,
        JournalMark {
            file_id: 1,
            offset: 100
        }
    );
    check_range(&s, 1, 0..250);
    check_range(&s, 2, 0..200);
    check_range(&s, 3, striped.iter().copied());
    assert_eq!(s.last_entry_id(1).unwrap(), Some(249));
    assert_eq!(s.last_entry_id(3).unwrap(), Some(298));
    assert!(s.ledger_exists(2).unwrap());
    assert!(!s.ledger_exists(99).unwrap());
}

#[test]
fn checkpoint_mark_is_persisted_and_monotonic() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    put_range(&s, 1, 0..10);
    s.checkpoint(JournalMark {
        file_id: 2,
        offset: 4096,
    })
    .unwrap();
    assert_eq!(
        s.checkpoint_mark(),
        JournalMark {
            file_id: 2,
            offset: 4096
        }
    );
    // An older mark still flushes, but never moves the checkpoint back.
    put_range(&s, 1, 10..20);
    s.checkpoint(JournalMark {
        file_id: 1,
        offset: 999_999,
    })
    .unwrap();
    assert_eq!(
        s.checkpoint_mark(),
        JournalMark {
            file_id: 2,
            offset: 4096
        }
    );
    assert_eq!(s.stats().write_cache_active_entries, 0);
    s.checkpoint(JournalMark {
        file_id: 3,
        offset: 0,
    })
    .unwrap();
    drop(s);
    let (s, mark) = open(&c);
    assert_eq!(
        mark,
        JournalMark {
            file_id: 3,
            offset: 0
        }
    );
    check_range(&s, 1, 0..20);
    assert!(!dir.path().join("lastMark.tmp").exists());
}

#[test]
fn second_open_of_the_same_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (_s, _) = open(&c);
    assert!(matches!(
        LedgerStorage::open(c.clone()),
        Err(StorageError::Locked { .. })
    ));
}

#[test]
fn crash_between_entry_log_write_and_index_commit_then_replay() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    put_range(&s, 1, 0..50);
    s.checkpoint(JournalMark {
        file_id: 1,
        offset: 10,
    })
    .unwrap();
    drop(s);

    // The next flush dies after its entry-log fdatasync, before the index commit.
    let mut crashing = c.clone();
    crashing.fail_point = Some(FailPoint::FlushBeforeIndexCommit);
    let (s, mark) = open(&crashing);
    assert_eq!(
        mark,
        JournalMark {
            file_id: 1,
            offset: 10
        }
    );
    put_range(&s, 1, 50..100);
    put_range(&s, 2, 0..30);
    assert!(
        s.checkpoint(JournalMark {
            file_id: 1,
            offset: 20
        })
        .is_err()
    );
    // Broken storage refuses writes.
    assert!(matches!(
        s.put_entry(1, 100, payload(1, 100)),
        Err(StorageError::Broken(_))
    ));
    drop(s);

    // Restart: the mark did not move; unflushed entries are not there...
    let (s, mark) = open(&c);
    assert_eq!(
        mark,
        JournalMark {
            file_id: 1,
            offset: 10
        }
    );
    check_range(&s, 1, 0..50);
    assert!(matches!(
        s.get_entry(1, 50),
        Err(StorageError::NoSuchEntry { .. })
    ));
    assert!(matches!(
        s.get_entry(2, 0),
        Err(StorageError::NoSuchLedger { .. })
    ));
    // ...and journal replay re-puts everything after the mark, including entries
    // already flushed (0..50 are re-put twice: idempotent).
    put_range(&s, 1, 0..100);
    put_range(&s, 1, 40..60);
    put_range(&s, 2, 0..30);
    let st = s
        .checkpoint(JournalMark {
            file_id: 1,
            offset: 20,
        })
        .unwrap();
    assert_eq!(
        st.duplicate_count, 50,
        "entries already indexed are not written twice"
    );
    assert_eq!(st.entry_count, 80);
    drop(s);
    let (s, _) = open(&c);
    check_range(&s, 1, 0..100);
    check_range(&s, 2, 0..30);
    assert_eq!(s.last_entry_id(1).unwrap(), Some(99));
}

/// Puts 1 MiB entries into ledger `l` until one is refused: how many were
/// stored, and the refusal.
fn fill_cache(s: &LedgerStorage, l: u64) -> (u64, StorageError) {
    let big = Bytes::from(vec![1u8; 1024 * 1024]);
    let mut stored = 0u64;
    loop {
        match s.put_entry(l, stored, big.clone()) {
            Ok(()) => stored += 1,
            Err(e) => return (stored, e),
        }
        assert!(stored < 100, "cache never reported full");
    }
}

#[test]
fn write_cache_full_is_a_typed_error_and_flush_makes_room() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    let big = Bytes::from(vec![1u8; 1024 * 1024]);
    let (stored, err) = fill_cache(&s, 1);
    assert!(
        matches!(err, StorageError::WriteCacheFull { .. }),
        "{err:?}"
    );
    assert_eq!(
        stored, 15,
        "16 MiB budget holds 15 one-MiB entries plus overhead"
    );
    assert!(
        s.wait_for_flush_trigger(Duration::from_millis(0)),
        "a full cache requests a flush"
    );
    assert_eq!(s.stats().write_cache_full_count, 1);
    s.flush().unwrap();
    s.put_entry(1, stored, big.clone()).unwrap();
    // Idempotent re-put while cached does not count twice.
    let before = s.stats().write_cache_active_bytes;
    s.put_entry(1, stored, big).unwrap();
    assert_eq!(s.stats().write_cache_active_bytes, before);
}

/// Storage in `dir` with a full write cache, and a task waiting (until
/// `deadline`) for room for one more 1 MiB entry, checked to be still waiting.
async fn waiting_for_room(
    dir: &Path,
    deadline: tokio::time::Instant,
) -> (Arc<LedgerStorage>, tokio::task::JoinHandle<bool>) {
    let s = Arc::new(open(&config(dir)).0);
    fill_cache(&s, 1);
    let waiter = {
        let s = Arc::clone(&s);
        tokio::spawn(async move { s.wait_for_write_room(1024 * 1024, deadline).await })
    };
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert!(!waiter.is_finished(), "no room yet, so no answer yet");
    (s, waiter)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_room_waiter_is_woken_by_the_flush_that_frees_the_cache() {
    let dir = tempfile::tempdir().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let (s, waiter) = waiting_for_room(dir.path(), deadline).await;
    assert!(
        s.wait_for_flush_trigger(Duration::ZERO),
        "a flush was requested"
    );
    let flusher = Arc::clone(&s);
    tokio::task::spawn_blocking(move || flusher.flush().unwrap())
        .await
        .unwrap();
    assert!(
        waiter.await.unwrap(),
        "woken by the flush with room, not by the 30 s deadline"
    );
    // With room, the wait answers at once.
    assert!(s.wait_for_write_room(1024 * 1024, deadline).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_write_room_waiter_gives_up_when_storage_breaks() {
    let dir = tempfile::tempdir().unwrap();
    // Far off: only the failure can end the wait within the test's 30 s.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(3600);
    let (s, waiter) = waiting_for_room(dir.path(), deadline).await;
    s.set_fail_point(Some(FailPoint::FlushBeforeIndexCommit));
    let flusher = Arc::clone(&s);
    let flushed = tokio::task::spawn_blocking(move || flusher.checkpoint(JournalMark::START))
        .await
        .unwrap();
    assert!(flushed.is_err(), "the fail point breaks the flush");
    let answered = tokio::time::timeout(Duration::from_secs(30), waiter)
        .await
        .expect("woken by the failure: no room will come")
        .unwrap();
    assert!(!answered, "no room in a broken storage");
}

#[test]
fn flush_threshold_wakes_the_sync_thread() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    let s = Arc::new(s);
    let waiter = {
        let s = Arc::clone(&s);
        std::thread::spawn(move || s.wait_for_flush_trigger(Duration::from_secs(30)))
    };
    let chunk = Bytes::from(vec![2u8; 256 * 1024]);
    for e in 0..20 {
        s.put_entry(5, e, chunk.clone()).unwrap();
    }
    assert!(
        waiter.join().unwrap(),
        "woken by the threshold, not the 30 s timeout"
    );
    s.flush().unwrap();
    assert!(
        !s.wait_for_flush_trigger(Duration::from_millis(1)),
        "a flush answers the request"
    );
}

#[test]
fn a_writers_put_is_refused_on_a_fenced_ledger_and_a_recovery_put_taken() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open(&config(dir.path()));
    assert_eq!(
        s.put_entry_unless_fenced(7, 0, payload(7, 0), true)
            .unwrap(),
        Put::Stored
    );
    s.set_fenced(7).unwrap();
    assert_eq!(
        s.put_entry_unless_fenced(7, 1, payload(7, 1), true)
            .unwrap(),
        Put::Fenced
    );
    assert!(
        matches!(s.get_entry(7, 1), Err(StorageError::NoSuchEntry { .. })),
        "a refused put stores nothing"
    );
    assert_eq!(
        s.put_entry_unless_fenced(7, 1, payload(7, 1), false)
            .unwrap(),
        Put::Stored
    );
    check_range(&s, 7, 0..2);
    s.delete_ledger(7).unwrap();
    assert!(matches!(
        s.put_entry_unless_fenced(7, 2, payload(7, 2), true),
        Err(StorageError::LedgerDeleted { .. })
    ));
}

#[test]
fn fenced_and_lac_state_survive_flush_and_reopen() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    assert!(!s.is_fenced(7).unwrap());
    assert!(!s.set_fenced(7).unwrap(), "first fence");
    assert!(s.set_fenced(7).unwrap(), "already fenced");
    assert!(s.ledger_exists(7).unwrap(), "fencing creates the ledger");
    assert_eq!(s.last_entry_id(7).unwrap(), None);
    s.set_explicit_lac(8, 41).unwrap();
    s.set_explicit_lac(8, 40).unwrap();
    assert_eq!(s.explicit_lac(8).unwrap(), Some(41), "LAC never moves back");
    put_range(&s, 8, 0..5);
    s.flush().unwrap();
    s.set_explicit_lac(8, 42).unwrap();
    s.checkpoint(JournalMark {
        file_id: 1,
        offset: 1,
    })
    .unwrap();
    drop(s);
    let (s, _) = open(&c);
    assert!(s.is_fenced(7).unwrap());
    assert!(!s.is_fenced(8).unwrap());
    assert_eq!(s.explicit_lac(8).unwrap(), Some(42));
    assert_eq!(s.explicit_lac(7).unwrap(), None);
    assert!(matches!(
        s.explicit_lac(9),
        Err(StorageError::NoSuchLedger { .. })
    ));
    check_range(&s, 8, 0..5);
}

#[test]
fn corrupted_entry_log_byte_is_a_corruption_error_not_a_panic() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    put_range(&s, 1, 0..3);
    s.flush().unwrap();
    drop(s);
    // Flip one payload byte of the second record of the first log.
    let logs = log_files(dir.path());
    let path = dir.path().join(&logs[0]);
    let mut bytes = std::fs::read(&path).unwrap();
    let first_len = 24 + payload(1, 0).len();
    let records_start = common::records_start(&bytes, &payload(1, 0));
    let pos = records_start + first_len + 24 + 3;
    bytes[pos] ^= 0xff;
    std::fs::write(&path, &bytes).unwrap();
    let (s, _) = open(&c);
    check_range(&s, 1, 0..1);
    match s.get_entry(1, 1) {
        Err(StorageError::Corruption { offset, .. }) => {
            assert_eq!(offset, (records_start + first_len) as u64)
        }
        other => panic!("expected corruption, got {other:?}"),
    }
    // The bad record does not poison its neighbours.
    check_range(&s, 1, 2..3);
    // Truncating the log under the index is corruption too.
    drop(s);
    std::fs::write(&path, &bytes[..records_start + first_len + 10]).unwrap();
    let (s, _) = open(&c);
    assert!(matches!(
        s.get_entry(1, 2),
        Err(StorageError::Corruption { .. })
    ));
}

#[test]
fn read_cache_stays_within_its_bound_and_serves_read_ahead() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    let p = Bytes::from(vec![3u8; 8 * 1024]);
    for e in 0..1000 {
        s.put_entry(4, e, p.clone()).unwrap();
    }
    s.flush().unwrap();
    for e in 0..1000 {
        assert_eq!(s.get_entry(4, e).unwrap().len(), 8 * 1024);
        assert!(s.stats().read_cache_bytes <= c.read_cache_bytes_max);
    }
    let st = s.stats();
    // The first read is single; then a 64 KiB read-ahead holds 7 records of
    // 8 KiB + 24: one log read per 7 entries.
    assert!(st.entry_log_read_count <= 1 + 999 / 7 + 1, "{st:?}");
    assert!(st.read_cache_hit_count >= 1000 - 999 / 7 - 2, "{st:?}");
    // A random reader (fresh process) gets no read-ahead: one record per read.
    let (s, _) = {
        drop(s);
        open(&c)
    };
    for e in [500u64, 100, 900, 300, 700] {
        s.get_entry(4, e).unwrap();
    }
    let st = s.stats();
    assert_eq!((st.entry_log_read_count, st.read_cache_hit_count), (5, 0));
    assert!(st.read_cache_bytes <= 5 * (8 * 1024 + 24), "{st:?}");
}

#[test]
fn entry_log_rotates_at_its_size_limit() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    let p = Bytes::from(vec![9u8; 1024 * 1024]);
    for round in 0..4 {
        for e in 0..10 {
            s.put_entry(6, round * 10 + e, p.clone()).unwrap();
        }
        s.flush().unwrap();
    }
    let logs = log_files(dir.path());
    assert!(logs.len() >= 3, "40 MiB in 16 MiB logs: {logs:?}");
    for e in 0..40 {
        assert_eq!(s.get_entry(6, e).unwrap(), p);
    }
    for name in &logs {
        let len = std::fs::metadata(dir.path().join(name)).unwrap().len();
        assert!(len <= c.entry_log_size_max_bytes, "{name} is {len} bytes");
    }
}

#[test]
fn bad_config_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.flush_threshold_bytes = 0;
    assert!(matches!(
        LedgerStorage::open(c),
        Err(StorageError::BadConfig(_))
    ));
    let mut c = config(dir.path());
    c.write_cache_bytes_max = 1024;
    assert!(matches!(
        LedgerStorage::open(c),
        Err(StorageError::BadConfig(_))
    ));
}

#[test]
fn oversized_entry_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (s, _) = open(&config(dir.path()));
    let huge = Bytes::from(vec![
        0u8;
        vela_bookie::storage::ENTRY_PAYLOAD_BYTES_MAX as usize
            + 1
    ]);
    assert!(matches!(
        s.put_entry(1, 0, huge),
        Err(StorageError::EntryTooLarge { .. })
    ));
}

#[test]
fn entry_log_with_a_bad_header_is_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    put_range(&s, 1, 0..3);
    s.flush().unwrap();
    drop(s);
    let path = dir.path().join(&log_files(dir.path())[0]);
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[2] ^= 0x01; // inside the magic
    std::fs::write(&path, &bytes).unwrap();
    let (s, _) = open(&c);
    assert!(matches!(
        s.get_entry(1, 0),
        Err(StorageError::Corruption { offset: 0, .. })
    ));
}

#[test]
fn big_ledger_run_is_split_into_bounded_index_records() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = open(&c);
    // More entries of one ledger in one flush than one index record holds (16384).
    let p = Bytes::from_static(b"tiny");
    for e in 0..20_000 {
        s.put_entry(3, e * 2, p.clone()).unwrap();
    }
    let st = s.flush().unwrap();
    assert_eq!(st.index_record_count, 2, "{st:?}");
    for e in [0u64, 2, 16_382 * 2, 16_383 * 2, 16_384 * 2, 39_998] {
        assert_eq!(s.get_entry(3, e).unwrap(), p, "entry {e}");
        assert!(matches!(
            s.get_entry(3, e + 1),
            Err(StorageError::NoSuchEntry { .. })
        ));
    }
    assert_eq!(s.last_entry_id(3).unwrap(), Some(39_998));
}
