//! kill -9 of a process appending to the journal: after reopening, replay holds
//! every acknowledged record, in order, as a gap-free prefix of what was
//! appended (records appended but not acked may or may not be there). Run on
//! the file journal and on the persistent-memory backend (a region on tmpfs,
//! in emulation: the process dies, the region's pages stay).
//!
//! `harness = false`: `main` runs the test, or, when `VELA_JOURNAL_CRASH_CHILD_DIR`
//! is set, is the child process that appends until it is killed (on the pmem
//! backend when `VELA_JOURNAL_CRASH_PMEM_DIR` names the region's directory).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use bytes::Bytes;
use common::journal::{Never, on_pmem, pmem_base_dir};
use vela_bookie::JournalMark;
use vela_bookie::journal::{Journal, JournalConfig, JournalError, JournalRecord};

const CHILD_ENV: &str = "VELA_JOURNAL_CRASH_CHILD_DIR";
const PMEM_DIR_ENV: &str = "VELA_JOURNAL_CRASH_PMEM_DIR";
/// Four slots of 16 MiB: a child run (at most ~7,000 acked records of ~1.5 KiB
/// in the full suite) fits in the three a running journal may fill.
const PMEM_REGION_BYTES: u64 = 64 << 20;

fn config(dir: &Path, pmem_dir: Option<&Path>) -> JournalConfig {
    let c = common::journal::config(dir);
    match pmem_dir {
        Some(pmem_dir) => on_pmem(c, pmem_dir, PMEM_REGION_BYTES),
        None => c,
    }
}

fn record(i: u64) -> JournalRecord {
    let len = (i as usize * 131) % 3000;
    JournalRecord::Entry {
        ledger_id: 5,
        entry_id: i,
        payload: Bytes::from(vec![(i % 251) as u8; len]),
    }
}

fn main() {
    match std::env::var(CHILD_ENV) {
        Ok(dir) => {
            let pmem_dir = std::env::var(PMEM_DIR_ENV).ok();
            crash_child_process(Path::new(&dir), pmem_dir.as_deref().map(Path::new));
        }
        Err(_) => {
            acked_records_survive_kill_9(None);
            println!("journal_crash: acked_records_survive_kill_9 (file journal) ok");
            let pmem_dir = tempfile::Builder::new()
                .prefix("vela-pmem-crash-")
                .tempdir_in(pmem_base_dir())
                .unwrap();
            acked_records_survive_kill_9(Some(pmem_dir.path()));
            println!("journal_crash: acked_records_survive_kill_9 (pmem, emulated) ok");
        }
    }
}

/// The child side: appends until killed, printing `acked <id>` from each
/// callback.
fn crash_child_process(dir: &Path, pmem_dir: Option<&Path>) {
    // Replays whatever the parent left (checkpointed or not) and goes on.
    let journal = Journal::open(config(dir, pmem_dir), JournalMark::START, |_, _| {
        Ok::<(), Never>(())
    })
    .unwrap();
    let mut i = 0u64;
    loop {
        let done = move |res: Result<JournalMark, JournalError>| {
            if res.is_ok() {
                let mut out = std::io::stdout().lock();
                writeln!(out, "acked {i}").unwrap();
                out.flush().unwrap();
            }
        };
        match journal.append(record(i), done) {
            Ok(()) => i += 1,
            Err(e) if matches!(e.error, JournalError::QueueFull { .. }) => {
                std::thread::sleep(Duration::from_micros(200))
            }
            Err(e) => panic!("{e}"),
        }
    }
}

/// On the pmem backend the parent checkpoints after each round's check (the
/// ring holds a few runs, not ten), so replay then holds the last run only.
fn acked_records_survive_kill_9(pmem_dir: Option<&Path>) {
    // test.sh exports VELA_TEST_FULL=0 for the fast suite: only "1" means full.
    let rounds = if std::env::var("VELA_TEST_FULL").is_ok_and(|v| v == "1") {
        10
    } else {
        2
    };
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path(), pmem_dir);
    let mut checkpoint = JournalMark::START;
    let mut acked_max: Option<u64> = None;
    for round in 0..rounds {
        // Each round restarts from a fresh directory content: the journal is
        // reopened (and repaired) by the next child anyway, so keep one dir and
        // check replay after every kill.
        let mut command = Command::new(std::env::current_exe().unwrap());
        command
            .args([
                "crash_child_process",
                "--exact",
                "--nocapture",
                "--test-threads=1",
            ])
            .env(CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if let Some(pmem_dir) = pmem_dir {
            command.env(PMEM_DIR_ENV, pmem_dir);
        }
        let mut child = command.spawn().unwrap();
        let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
        let kill_after = 500 + round * 700;
        let start = Instant::now();
        let mut acked_this_round = 0;
        while acked_this_round < kill_after && start.elapsed() < Duration::from_secs(30) {
            let Some(line) = lines.next() else { break };
            if let Some(id) = line.unwrap().strip_prefix("acked ") {
                let id: u64 = id.parse().unwrap();
                acked_max = Some(acked_max.map_or(id, |m| m.max(id)));
                acked_this_round += 1;
            }
        }
        child.kill().unwrap(); // SIGKILL
        // Acks printed before the kill count too.
        for line in lines {
            if let Some(id) = line.unwrap().strip_prefix("acked ") {
                let id: u64 = id.parse().unwrap();
                acked_max = Some(acked_max.map_or(id, |m| m.max(id)));
            }
        }
        child.wait().unwrap();
        assert!(
            acked_this_round > 0,
            "round {round}: the child acked nothing"
        );

        // Replay: every round's child appended ids 0, 1, 2, ... again; replay
        // must hold, in order, for each run a gap-free prefix of ids, and the
        // last run's prefix must reach the last acked id.
        let mut runs: Vec<Vec<u64>> = Vec::new();
        let journal = Journal::open(cfg.clone(), checkpoint, |rec, _| {
            let JournalRecord::Entry {
                entry_id, payload, ..
            } = &rec
            else {
                panic!("unexpected {rec:?}");
            };
            assert_eq!(rec, record(*entry_id), "payload of {entry_id} intact");
            let _ = payload;
            if *entry_id == 0 {
                runs.push(Vec::new());
            }
            runs.last_mut()
                .expect("a run starts at id 0")
                .push(*entry_id);
            Ok::<(), Never>(())
        })
        .unwrap();
        let runs_expected = if pmem_dir.is_some() {
            checkpoint = journal.last_synced_mark();
            journal.delete_files_before(checkpoint).unwrap();
            1
        } else {
            round as usize + 1
        };
        drop(journal);
        assert_eq!(
            runs.len(),
            runs_expected,
            "one run per child since the checkpoint"
        );
        for run in &runs {
            assert!(
                run.iter().enumerate().all(|(k, id)| *id == k as u64),
                "gap-free prefix"
            );
        }
        let last = runs.last().unwrap();
        let acked = acked_max.unwrap();
        assert!(
            last.len() as u64 > acked,
            "round {round}: acked up to {acked} but replay holds {} records",
            last.len()
        );
        acked_max = None;
    }
}
