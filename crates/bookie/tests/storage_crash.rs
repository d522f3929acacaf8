//! kill -9 of a real process writing through ledger storage.
//!
//! The test binary re-runs itself as a child (`crash_child_workload` with
//! `VELA_STORAGE_CRASH_DIR` set) that puts entries of one ledger in order and
//! checkpoints every `CHECKPOINT_EVERY` entries, printing `ckpt N` after each
//! checkpoint returns (mark offset N = entries 0..N covered). The parent kills it
//! with SIGKILL at a random moment, reopens the dir and checks: the mark is at
//! least the last one printed, entries below the mark read back exactly, entries
//! above it are absent or exact (flushed, not yet checkpointed). The next child
//! resumes at the mark, re-putting what a journal replay would.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use vela_bookie::JournalMark;
use vela_bookie::storage::{LedgerStorage, StorageConfig, StorageError};

const CHILD_DIR_ENV: &str = "VELA_STORAGE_CRASH_DIR";
const CHILD_START_ENV: &str = "VELA_STORAGE_CRASH_START";
const CHECKPOINT_EVERY: u64 = 300;
const LEDGER: u64 = 42;
/// Upper bound on what one child writes if nobody kills it.
const CHILD_ENTRIES_MAX: u64 = 60_000;

fn config(dir: &Path) -> StorageConfig {
    let mut c = StorageConfig::new(dir);
    c.write_cache_bytes_max = 32 * 1024 * 1024;
    c.flush_threshold_bytes = 8 * 1024 * 1024;
    c.read_cache_bytes_max = 1024 * 1024;
    c.read_ahead_bytes_max = 64 * 1024;
    c.entry_log_size_max_bytes = 12 * 1024 * 1024;
    c.writeback_step_bytes = 512 * 1024;
    c
}

fn payload(e: u64) -> Bytes {
    let len = 500 + (e * 7919 % 3000) as usize;
    let mut v = vec![(e % 251) as u8; len];
    v[..8].copy_from_slice(&e.to_le_bytes());
    Bytes::from(v)
}

/// Writes entries `start..` and checkpoints; returns the entries written.
fn workload(dir: &Path, start: u64, limit: u64, report: bool) -> u64 {
    let (s, _) = LedgerStorage::open(config(dir)).unwrap();
    let mut e = start;
    while e < start + limit {
        s.put_entry(LEDGER, e, payload(e)).unwrap();
        e += 1;
        if e.is_multiple_of(CHECKPOINT_EVERY) {
            s.checkpoint(JournalMark {
                file_id: 1,
                offset: e,
            })
            .unwrap();
            if report {
                println!("ckpt {e}");
            }
        }
    }
    e - start
}

/// As a child: the workload until killed. As a test: the same workload, short,
/// then a reopen that must see every checkpointed entry.
#[test]
fn crash_child_workload() {
    if let Ok(dir) = std::env::var(CHILD_DIR_ENV) {
        let start = std::env::var(CHILD_START_ENV).unwrap().parse().unwrap();
        workload(Path::new(&dir), start, CHILD_ENTRIES_MAX, true);
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let n = workload(dir.path(), 0, 2 * CHECKPOINT_EVERY + 17, false);
    let (s, mark) = LedgerStorage::open(config(dir.path())).unwrap();
    assert_eq!(mark.offset, 2 * CHECKPOINT_EVERY);
    for e in 0..mark.offset {
        assert_eq!(s.get_entry(LEDGER, e).unwrap(), payload(e));
    }
    assert!(n > mark.offset);
}

#[test]
fn kill_9_during_writes_keeps_every_checkpointed_entry() {
    let dir = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let mut start = 0u64;
    let mut seed = std::process::id() as u64 | 1;
    let rounds = if std::env::var("VELA_TEST_FULL").is_ok_and(|v| v == "1") {
        10
    } else {
        3
    };
    for round in 0..rounds {
        let mut child = Command::new(&exe)
            .args([
                "--exact",
                "crash_child_workload",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_DIR_ENV, dir.path())
            .env(CHILD_START_ENV, start.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        // Wait for a few checkpoints, then kill at a random point in the next
        // few milliseconds (mid-put, mid-flush or mid-commit).
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        let wanted_ckpts = 2 + seed % 4;
        let delay = Duration::from_micros(seed % 20_000);
        let mut last_ckpt = start;
        let mut lines = BufReader::new(stdout).lines();
        let deadline = Instant::now() + Duration::from_secs(60);
        let mut seen = 0;
        while seen < wanted_ckpts && Instant::now() < deadline {
            let Some(Ok(line)) = lines.next() else { break };
            if let Some(n) = line.strip_prefix("ckpt ") {
                last_ckpt = n.trim().parse().unwrap();
                seen += 1;
            }
        }
        assert!(seen > 0, "round {round}: child reported no checkpoint");
        std::thread::sleep(delay);
        child.kill().unwrap(); // SIGKILL
        child.wait().unwrap();
        // Checkpoints printed after `seen` but before the kill also count.
        for line in lines.map_while(Result::ok) {
            if let Some(n) = line.strip_prefix("ckpt ") {
                last_ckpt = n.trim().parse().unwrap();
            }
        }

        let (s, mark) = LedgerStorage::open(config(dir.path())).unwrap();
        assert!(
            mark.offset >= last_ckpt,
            "round {round}: mark {mark:?} behind the last acknowledged checkpoint {last_ckpt}"
        );
        for e in 0..mark.offset {
            assert_eq!(
                s.get_entry(LEDGER, e).unwrap(),
                payload(e),
                "round {round}: entry {e}"
            );
        }
        let mut e = mark.offset;
        loop {
            match s.get_entry(LEDGER, e) {
                Ok(p) => assert_eq!(
                    p,
                    payload(e),
                    "round {round}: flushed entry {e} after the mark"
                ),
                Err(StorageError::NoSuchEntry { .. }) => break,
                Err(err) => panic!("round {round}: entry {e}: {err}"),
            }
            e += 1;
        }
        start = mark.offset;
    }
}
