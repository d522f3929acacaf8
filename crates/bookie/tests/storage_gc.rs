//! Ledger deletion, garbage collection and compaction through the public API.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, mpsc};
use std::time::Duration;

use bytes::Bytes;
use vela_bookie::JournalMark;
use vela_bookie::storage::{FailPoint, LedgerStorage, StorageConfig, StorageError};

fn config(dir: &Path) -> StorageConfig {
    let mut c = StorageConfig::new(dir);
    c.write_cache_bytes_max = 32 * 1024 * 1024;
    c.flush_threshold_bytes = 8 * 1024 * 1024;
    c.read_cache_bytes_max = 1024 * 1024;
    c.read_ahead_bytes_max = 64 * 1024;
    c.entry_log_size_max_bytes = 12 * 1024 * 1024;
    c.writeback_step_bytes = 1024 * 1024;
    c.compaction_live_fraction = 0.5;
    // Deleted logs are cut in several steps before the unlink.
    c.log_delete_step_bytes = 1024 * 1024;
    c
}

fn payload(l: u64, e: u64) -> Bytes {
    let mut v = vec![(l as u8).wrapping_mul(17) ^ (e as u8); 4000 + (e % 97) as usize];
    v[..8].copy_from_slice(&e.to_le_bytes());
    Bytes::from(v)
}

fn put_range(s: &LedgerStorage, l: u64, entries: std::ops::Range<u64>) {
    for e in entries {
        s.put_entry(l, e, payload(l, e)).unwrap();
    }
}

fn check_range(s: &LedgerStorage, l: u64, entries: std::ops::Range<u64>) {
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
fn delete_then_gc_removes_dead_logs_and_reads_say_no_such_ledger() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = LedgerStorage::open(c.clone()).unwrap();
    // Ledger 1 alone fills the first logs; ledger 2 lands in later ones.
    put_range(&s, 1, 0..5000); // ~20 MB: two logs
    s.flush().unwrap();
    put_range(&s, 2, 0..100);
    s.flush().unwrap();
    let before = log_files(dir.path());
    assert!(before.len() >= 2, "{before:?}");

    // Cached entries of a deleted ledger vanish at once.
    put_range(&s, 1, 5000..5010);
    s.delete_ledger(1).unwrap();
    s.delete_ledger(1).unwrap();
    assert!(matches!(
        s.get_entry(1, 0),
        Err(StorageError::NoSuchLedger { ledger_id: 1 })
    ));
    assert!(matches!(
        s.get_entry(1, 5005),
        Err(StorageError::NoSuchLedger { .. })
    ));
    assert!(matches!(
        s.last_entry_id(1),
        Err(StorageError::NoSuchLedger { .. })
    ));
    assert!(!s.ledger_exists(1).unwrap());
    assert!(matches!(
        s.put_entry(1, 6000, payload(1, 6000)),
        Err(StorageError::LedgerDeleted { .. })
    ));
    assert!(matches!(
        s.set_fenced(1),
        Err(StorageError::LedgerDeleted { .. })
    ));

    // The tombstone is not persisted yet: gc leaves ledger 1's data alone.
    let st = s.gc().unwrap();
    assert_eq!(st.logs_deleted, 0, "{st:?}");
    s.checkpoint(JournalMark {
        file_id: 1,
        offset: 1,
    })
    .unwrap();
    let st = s.gc().unwrap();
    assert!(st.logs_deleted >= 1, "{st:?}");
    assert_eq!(st.ledgers_purged, 1);
    let after = log_files(dir.path());
    assert!(
        after.len() < before.len() + 1,
        "before {before:?} after {after:?}"
    );
    assert!(
        !after.contains(&before[0]),
        "the first log held only ledger 1: {after:?}"
    );
    check_range(&s, 2, 0..100);

    // Survives reopen: ledger 1 stays deleted, ledger 2 readable.
    drop(s);
    let (s, _) = LedgerStorage::open(c).unwrap();
    assert!(matches!(
        s.get_entry(1, 0),
        Err(StorageError::NoSuchLedger { .. })
    ));
    check_range(&s, 2, 0..100);
    let st = s.gc().unwrap();
    assert_eq!(st.ledgers_purged, 0, "already purged");
}

#[test]
fn compaction_keeps_live_entries_readable_and_frees_the_log() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = LedgerStorage::open(c.clone()).unwrap();
    // One log: ledger 10 (small, live) interleaved with ledger 11 (big, deleted)
    // across two flushes so ledger 10 has two index records in it.
    put_range(&s, 10, 0..100);
    put_range(&s, 11, 0..1200);
    s.flush().unwrap();
    put_range(&s, 10, 100..200);
    put_range(&s, 11, 1200..2000);
    s.flush().unwrap();
    // Force a rotation so the log above is no longer active.
    put_range(&s, 12, 0..1200);
    s.flush().unwrap();
    let logs_before = log_files(dir.path());
    s.delete_ledger(11).unwrap();
    s.flush().unwrap();

    let st = s.gc().unwrap();
    assert!(st.logs_compacted >= 1, "{st:?}");
    assert!(st.entries_copied >= 200, "{st:?}");
    assert_eq!(st.compaction_errors, 0);
    let logs_after = log_files(dir.path());
    assert!(
        !logs_after.contains(&logs_before[0]),
        "{logs_before:?} -> {logs_after:?}"
    );
    check_range(&s, 10, 0..200);
    check_range(&s, 12, 0..1200);
    assert_eq!(s.last_entry_id(10).unwrap(), Some(199));

    drop(s);
    let (s, _) = LedgerStorage::open(c).unwrap();
    check_range(&s, 10, 0..200);
    check_range(&s, 12, 0..1200);
    // Writing more after compaction, and a second pass, still agree.
    put_range(&s, 10, 200..300);
    s.flush().unwrap();
    s.gc().unwrap();
    check_range(&s, 10, 0..300);
}

#[test]
fn orphan_log_of_a_crashed_flush_is_collected() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    {
        let (s, _) = LedgerStorage::open(c.clone()).unwrap();
        put_range(&s, 1, 0..10);
        s.flush().unwrap();
    }
    // Each open starts a fresh log; the previous open's empty active log is
    // unreferenced once a newer one exists.
    drop(LedgerStorage::open(c.clone()).unwrap());
    let (s, _) = LedgerStorage::open(c).unwrap();
    let before = log_files(dir.path());
    let st = s.gc().unwrap();
    assert!(st.logs_deleted >= 1, "{st:?} {before:?}");
    check_range(&s, 1, 0..10);
}

#[test]
fn compaction_skips_a_log_with_a_corrupt_record_and_storage_stays_usable() {
    let dir = tempfile::tempdir().unwrap();
    let c = config(dir.path());
    let (s, _) = LedgerStorage::open(c.clone()).unwrap();
    put_range(&s, 10, 0..100);
    put_range(&s, 11, 0..2000);
    s.flush().unwrap();
    put_range(&s, 12, 0..1200); // rotates: the first log is no longer active
    s.flush().unwrap();
    s.delete_ledger(11).unwrap();
    s.flush().unwrap();
    drop(s);
    // Flip a payload byte of ledger 10's entry 50 in the first log (ledger 10's
    // records come first: ledgers are written in id order).
    let first_log = dir.path().join(&log_files(dir.path())[0]);
    let mut bytes = std::fs::read(&first_log).unwrap();
    let records_start = common::records_start(&bytes, &payload(10, 0));
    let offset: usize = records_start + (0..50).map(|e| 24 + payload(10, e).len()).sum::<usize>();
    bytes[offset + 24 + 100] ^= 0xff;
    std::fs::write(&first_log, &bytes).unwrap();

    let (s, _) = LedgerStorage::open(c).unwrap();
    let st = s.gc().unwrap();
    assert_eq!(st.compaction_errors, 1, "{st:?}");
    assert_eq!(st.logs_compacted, 0, "{st:?}");
    assert!(first_log.exists(), "a log that failed compaction is kept");
    // The bad entry reads as corruption, its neighbours as data; writes go on.
    assert!(matches!(
        s.get_entry(10, 50),
        Err(StorageError::Corruption { .. })
    ));
    check_range(&s, 10, 0..50);
    check_range(&s, 10, 51..100);
    put_range(&s, 13, 0..10);
    s.flush().unwrap();
    check_range(&s, 13, 0..10);
    // Later passes do not retry it in a loop.
    assert_eq!(s.gc().unwrap().compaction_errors, 0);
}

/// Ledger 10 (live, ~800 KB in two index records) and ledger 11 (deleted,
/// ~8 MB) interleaved in the first log, which rotation then closes (ledger 12
/// fills the rest of it and the next log): a log for compaction.
fn sparse_first_log(s: &LedgerStorage) {
    put_range(s, 10, 0..100);
    put_range(s, 11, 0..1200);
    s.flush().unwrap();
    put_range(s, 10, 100..200);
    put_range(s, 11, 1200..2000);
    s.flush().unwrap();
    put_range(s, 12, 0..1200);
    s.flush().unwrap();
    s.delete_ledger(11).unwrap();
    s.flush().unwrap();
}

/// A gc pass takes the flush lock one compaction slice at a time: with the
/// pass held between two slices, puts, a flush and a checkpoint complete. (With
/// the lock held for the whole pass, as gc once did, the flush waits for the
/// pass and the watchdog below fails the test.)
#[test]
fn a_flush_completes_while_a_compaction_is_paused_between_slices() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.compaction_slice_bytes = 64 * 1024;
    let (s, _) = LedgerStorage::open(c.clone()).unwrap();
    let s = Arc::new(s);
    sparse_first_log(&s);
    let first_log = dir.path().join(&log_files(dir.path())[0]);

    let (paused_tx, paused_rx) = mpsc::channel::<()>();
    let (resume_tx, resume_rx) = mpsc::channel::<()>();
    let resume_rx = Mutex::new(resume_rx);
    let first = AtomicBool::new(true);
    s.set_gc_slice_hook(Some(Arc::new(move || {
        if first.swap(false, Ordering::SeqCst) {
            paused_tx.send(()).unwrap();
            resume_rx.lock().unwrap().recv().unwrap();
        }
    })));
    let gc = {
        let s = Arc::clone(&s);
        std::thread::spawn(move || s.gc().unwrap())
    };
    paused_rx
        .recv_timeout(Duration::from_secs(60))
        .expect("the pass committed a first compaction slice");

    let (flushed_tx, flushed_rx) = mpsc::channel();
    let writer = {
        let s = Arc::clone(&s);
        std::thread::spawn(move || {
            put_range(&s, 13, 0..50);
            let flushed = s.flush().unwrap();
            s.checkpoint(JournalMark {
                file_id: 1,
                offset: 7,
            })
            .unwrap();
            flushed_tx.send(flushed).unwrap();
        })
    };
    let flushed = flushed_rx.recv_timeout(Duration::from_secs(60)).expect(
        "a flush and a checkpoint complete while a gc pass is paused between compaction slices",
    );
    assert_eq!(flushed.entry_count, 50);
    assert!(first_log.exists(), "the pass is still compacting the log");
    check_range(&s, 13, 0..50);
    check_range(&s, 10, 0..200);
    resume_tx.send(()).unwrap();
    writer.join().unwrap();
    let st = gc.join().unwrap();
    assert!(st.compaction_slices >= 2, "{st:?}");
    assert!(st.logs_compacted >= 1, "{st:?}");
    assert!(!first_log.exists());
    check_range(&s, 10, 0..200);
    check_range(&s, 12, 0..1200);
    check_range(&s, 13, 0..50);

    let s = Arc::into_inner(s).unwrap();
    drop(s);
    let (s, mark) = LedgerStorage::open(c).unwrap();
    assert_eq!(mark.offset, 7);
    check_range(&s, 10, 0..200);
    check_range(&s, 12, 0..1200);
    check_range(&s, 13, 0..50);
}

/// kill -9 right after the first compaction slice is committed: after reopen
/// every entry reads back (moved or not), and the next pass finishes the log.
#[test]
fn a_crash_between_compaction_slices_loses_nothing_and_the_next_pass_finishes() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.compaction_slice_bytes = 64 * 1024;
    c.compaction_bytes_per_s = 0;
    let (s, _) = LedgerStorage::open(c.clone()).unwrap();
    sparse_first_log(&s);
    let first_log = dir.path().join(&log_files(dir.path())[0]);
    s.set_fail_point(Some(FailPoint::GcAfterCompactionSlice));
    assert!(matches!(s.gc(), Err(StorageError::Broken(_))));
    assert!(matches!(
        s.put_entry(20, 0, payload(20, 0)),
        Err(StorageError::Broken(_))
    ));
    drop(s);

    let (s, _) = LedgerStorage::open(c.clone()).unwrap();
    assert!(first_log.exists());
    check_range(&s, 10, 0..200);
    check_range(&s, 12, 0..1200);
    assert_eq!(s.last_entry_id(10).unwrap(), Some(199));
    let st = s.gc().unwrap();
    assert!(st.logs_compacted >= 1, "{st:?}");
    assert!(!first_log.exists());
    check_range(&s, 10, 0..200);
    check_range(&s, 12, 0..1200);
    drop(s);
    let (s, _) = LedgerStorage::open(c).unwrap();
    check_range(&s, 10, 0..200);
    check_range(&s, 12, 0..1200);
}
