//! Real-process crash test of `vela bookie`: pipelined adds, `kill -9` at a
//! random (seeded) moment, restart on the same directories, and every entry
//! that was acknowledged reads back byte-identical; every fence that was
//! acknowledged still refuses normal adds. Once with the file journal, once
//! with the persistent-memory journal (a region on tmpfs, emulated: msync per
//! group), whose refusal to start on a filesystem without MAP_SYNC is checked
//! too.
//!
//! 3 rounds by default, 20 with `VELA_TEST_FULL=1`. Replay a run with
//! `VELA_SEED=<seed printed> cargo test -p vela --test crash_bookie`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::task::JoinSet;
use vela_bookie_protocol::BookieError;
use vela_bookie_protocol::client::BookieClient;
use vela_bookie_protocol::entry::{EntryHeader, encode_entry};
use vela_bookie_protocol::{AddMode, LAST_ENTRY, ReadMode};

const ROUNDS: usize = 3;
const ROUNDS_FULL: usize = 20;
const LEDGERS_PER_ROUND: u64 = 4;
const PAYLOAD_BYTES: usize = 1024;
/// Adds in flight per ledger.
const ADDS_IN_FLIGHT_PER_LEDGER: usize = 64;
/// How long after the round's first acknowledged add the bookie is killed:
/// 50..550 ms.
const KILL_AFTER_MS_MIN: u64 = 50;
const KILL_AFTER_MS_SPAN: u64 = 500;

/// splitmix64: a seeded, dependency-free generator.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// The packaged entry written for (ledger, entry) in this run.
fn entry(seed: u64, ledger_id: u64, entry_id: u64) -> Bytes {
    let mut rng = Rng(seed ^ ledger_id.wrapping_mul(0x1000_0000_01B3) ^ entry_id.rotate_left(32));
    let mut payload = Vec::with_capacity(PAYLOAD_BYTES);
    while payload.len() < PAYLOAD_BYTES {
        payload.extend_from_slice(&rng.next().to_le_bytes());
    }
    let header = EntryHeader {
        ledger_id,
        entry_id,
        last_add_confirmed: entry_id.checked_sub(1),
        ledger_length: (entry_id + 1) * PAYLOAD_BYTES as u64,
    };
    encode_entry(&header, &payload)
}

/// `vela bookie` with its journal and ledger directories under `dir`.
fn bookie_command(dir: &Path) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_vela"));
    command
        .arg("bookie")
        .arg("--journal-dir")
        .arg(dir.join("journal"))
        .arg("--ledger-dir")
        .arg(dir.join("ledgers"));
    command
}

/// A running `vela bookie`; killed (SIGKILL) when dropped.
struct BookieProcess {
    child: Child,
    addr: SocketAddr,
}

impl BookieProcess {
    /// `journal_args`: the journal backend's flags.
    fn start(
        dir: &Path,
        flush_interval_ms: u64,
        journal_sync: &str,
        journal_args: &[String],
    ) -> BookieProcess {
        let mut child = bookie_command(dir)
            .args([
                "--port",
                "0",
                "--flush-interval-ms",
                &flush_interval_ms.to_string(),
                "--journal-sync",
                journal_sync,
            ])
            .args(journal_args)
            .env("VELA_LOG", "warn")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("vela bookie starts");
        let stdout = child.stdout.take().unwrap();
        let mut line = String::new();
        BufReader::new(stdout).read_line(&mut line).unwrap();
        let Some(addr) = line.trim().strip_prefix("vela bookie listening on ") else {
            let status = child.wait().unwrap();
            panic!("vela bookie did not get ready (printed {line:?}, exited {status})");
        };
        BookieProcess {
            addr: addr.parse().unwrap(),
            child,
        }
    }

    fn kill_9(mut self) {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
    }

    fn terminate(mut self) -> std::process::ExitStatus {
        let pid = self.child.id().to_string();
        let sent = Command::new("kill").args(["-TERM", &pid]).status().unwrap();
        assert!(sent.success());
        self.child.wait().unwrap()
    }
}

impl Drop for BookieProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// What the bookie acknowledged: per ledger, the acked entry ids.
#[derive(Debug, Default)]
struct Acked {
    entries: BTreeMap<u64, Vec<u64>>,
    fenced: Vec<u64>,
}

impl Acked {
    fn entry_count(&self) -> usize {
        self.entries.values().map(Vec::len).sum()
    }
}

/// Pipelines adds to one ledger until the connection breaks; records acks.
async fn load_ledger(client: BookieClient, seed: u64, ledger_id: u64, acked: Arc<Mutex<Acked>>) {
    let mut in_flight = JoinSet::new();
    let mut next_entry_id = 0u64;
    let mut broken = false;
    loop {
        while !broken && in_flight.len() < ADDS_IN_FLIGHT_PER_LEDGER {
            let entry_id = next_entry_id;
            next_entry_id += 1;
            let add = client.add(entry(seed, ledger_id, entry_id), AddMode::Normal);
            in_flight.spawn(async move { (entry_id, add.await) });
        }
        let Some(done) = in_flight.join_next().await else {
            return;
        };
        match done.unwrap() {
            (entry_id, Ok(())) => acked
                .lock()
                .unwrap()
                .entries
                .entry(ledger_id)
                .or_default()
                .push(entry_id),
            (_, Err(BookieError::TooManyRequests)) => {}
            (_, Err(_)) => broken = true,
        }
    }
}

/// Every acknowledged entry reads back byte-identical; fenced ledgers refuse
/// normal adds.
async fn verify(client: &BookieClient, seed: u64, acked: &Acked) {
    let mut reads = JoinSet::new();
    for (&ledger_id, entry_ids) in &acked.entries {
        for &entry_id in entry_ids {
            let read = client.read(ledger_id, entry_id, ReadMode::Normal);
            reads.spawn(async move { (ledger_id, entry_id, read.await) });
            if reads.len() >= 256 {
                check_read(reads.join_next().await.unwrap().unwrap(), seed);
            }
        }
    }
    while let Some(done) = reads.join_next().await {
        check_read(done.unwrap(), seed);
    }
    for &ledger_id in &acked.fenced {
        let add = client
            .add(entry(seed, ledger_id, 1000), AddMode::Normal)
            .await;
        assert!(
            matches!(add, Err(BookieError::Fenced)),
            "fenced ledger {ledger_id} took an add: {add:?}"
        );
    }
}

fn check_read(
    (ledger_id, entry_id, read): (
        u64,
        u64,
        Result<vela_bookie_protocol::client::ReadEntry, BookieError>,
    ),
    seed: u64,
) {
    match read {
        Ok(read) => assert_eq!(
            read.entry,
            entry(seed, ledger_id, entry_id),
            "acknowledged entry {ledger_id}:{entry_id} reads back different bytes"
        ),
        Err(error) => panic!("acknowledged entry {ledger_id}:{entry_id} is lost: {error}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_entries_survive_kill_9() {
    kill_9_rounds("file journal", Vec::new()).await;
}

/// A directory on tmpfs when there is one (the pmem journal's test medium).
fn pmem_test_dir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    let base = if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    };
    tempfile::Builder::new()
        .prefix("vela-pmem-bookie-")
        .tempdir_in(base)
        .unwrap()
}

/// The pmem journal's flags over `dir`, emulated: 64 MiB, four 16 MiB slots
/// (with checkpoints only every 10 minutes in half the rounds, the ring fills
/// and the journal asks for them).
fn pmem_args(dir: &Path, emulation: bool) -> Vec<String> {
    let mut args = vec![
        "--journal-backend".to_string(),
        "pmem".to_string(),
        "--journal-pmem-path".to_string(),
        dir.display().to_string(),
        "--journal-pmem-size-mb".to_string(),
        "64".to_string(),
    ];
    if emulation {
        args.push("--journal-pmem-allow-emulation".to_string());
    }
    args
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acknowledged_entries_survive_kill_9_on_the_pmem_journal() {
    let pmem_dir = pmem_test_dir();
    kill_9_rounds("pmem journal (emulated)", pmem_args(pmem_dir.path(), true)).await;
}

async fn kill_9_rounds(what: &str, journal_args: Vec<String>) {
    let seed = std::env::var("VELA_SEED")
        .ok()
        .and_then(|seed| seed.parse().ok())
        .unwrap_or_else(|| {
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .unwrap()
                .as_nanos() as u64
        });
    let rounds = if std::env::var("VELA_TEST_FULL").is_ok_and(|full| full == "1") {
        ROUNDS_FULL
    } else {
        ROUNDS
    };
    println!("crash_bookie: {what}: VELA_SEED={seed} rounds={rounds}");
    let mut rng = Rng(seed);
    let dir = tempfile::tempdir().unwrap();
    let acked = Arc::new(Mutex::new(Acked::default()));
    let started = Instant::now();
    for round in 0..rounds as u64 {
        // Half the rounds checkpoint every 20 ms (kills land in flushes), half
        // never (everything comes back through journal replay).
        let flush_interval_ms = if rng.next().is_multiple_of(2) {
            20
        } else {
            600_000
        };
        // A third of the rounds ack after the write only: documented to survive
        // kill -9 of the bookie (the page cache survives), not power loss.
        let journal_sync = if rng.next().is_multiple_of(3) {
            "off"
        } else {
            "fdatasync"
        };
        let bookie = tokio::task::spawn_blocking({
            let dir = dir.path().to_owned();
            let journal_args = journal_args.clone();
            move || BookieProcess::start(&dir, flush_interval_ms, journal_sync, &journal_args)
        })
        .await
        .unwrap();
        let client = BookieClient::connect(bookie.addr).await.unwrap();
        let snapshot = std::mem::take(&mut *acked.lock().unwrap());
        verify(&client, seed, &snapshot).await;
        *acked.lock().unwrap() = snapshot;

        // A fenced ledger: a few entries, then a fencing read.
        let fenced_ledger = 1_000_000 + round;
        for entry_id in 0..3 {
            client
                .add(entry(seed, fenced_ledger, entry_id), AddMode::Normal)
                .await
                .unwrap();
            acked
                .lock()
                .unwrap()
                .entries
                .entry(fenced_ledger)
                .or_default()
                .push(entry_id);
        }
        let last = client
            .read(fenced_ledger, LAST_ENTRY, ReadMode::Fence)
            .await
            .unwrap();
        assert_eq!(last.entry_id, 2);
        acked.lock().unwrap().fenced.push(fenced_ledger);

        let before = acked.lock().unwrap().entry_count();
        let mut load = JoinSet::new();
        for ledger_index in 0..LEDGERS_PER_ROUND {
            let ledger_id = round * LEDGERS_PER_ROUND + ledger_index + 1;
            load.spawn(load_ledger(client.clone(), seed, ledger_id, acked.clone()));
        }
        let kill_after = Duration::from_millis(KILL_AFTER_MS_MIN + rng.next() % KILL_AFTER_MS_SPAN);
        // The kill clock starts at the round's first acknowledgement, so a slow
        // machine still kills mid-load.
        let first_ack_deadline = Instant::now() + Duration::from_secs(30);
        while acked.lock().unwrap().entry_count() == before {
            assert!(
                Instant::now() < first_ack_deadline,
                "round {round}: no add acknowledged in 30 s"
            );
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
        tokio::time::sleep(kill_after).await;
        tokio::task::spawn_blocking(move || bookie.kill_9())
            .await
            .unwrap();
        while let Some(done) = load.join_next().await {
            done.unwrap();
        }
        drop(client);
        let total = acked.lock().unwrap().entry_count();
        println!(
            "t={}ms round={round} CRASH after {}ms flush_interval_ms={flush_interval_ms} journal_sync={journal_sync} acked_in_round={} acked_total={total}",
            started.elapsed().as_millis(),
            kill_after.as_millis(),
            total - before,
        );
        assert!(
            total > before,
            "round {round} acknowledged nothing before the kill"
        );
    }

    let bookie = tokio::task::spawn_blocking({
        let dir = dir.path().to_owned();
        move || BookieProcess::start(&dir, 10_000, "fdatasync", &journal_args)
    })
    .await
    .unwrap();
    let client = BookieClient::connect(bookie.addr).await.unwrap();
    let acked = std::mem::take(&mut *acked.lock().unwrap());
    verify(&client, seed, &acked).await;
    drop(client);
    let status = tokio::task::spawn_blocking(move || bookie.terminate())
        .await
        .unwrap();
    assert!(status.success(), "vela bookie exited {status} on SIGTERM");
    println!(
        "t={}ms VERIFIED {} acknowledged entries and {} fences after {rounds} kill -9 rounds",
        started.elapsed().as_millis(),
        acked.entry_count(),
        acked.fenced.len()
    );
}

/// Without --journal-pmem-allow-emulation, a bookie whose pmem path is not on
/// a DAX filesystem (tmpfs here) exits at once, saying MAP_SYNC was refused
/// and how to proceed.
#[test]
fn a_pmem_journal_without_map_sync_refuses_to_start_naming_why() {
    let dir = tempfile::tempdir().unwrap();
    let pmem_dir = pmem_test_dir();
    let output = bookie_command(dir.path())
        .args(["--port", "0"])
        .args(pmem_args(pmem_dir.path(), false))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    if stdout.contains("listening on") {
        println!(
            "note: {} is on a DAX filesystem; nothing to refuse",
            pmem_dir.path().display()
        );
        return;
    }
    assert_eq!(output.status.code(), Some(1), "{stderr}");
    for expected in [
        "cannot open the bookie",
        "journal.pmem",
        "MAP_SYNC refused",
        "not DAX",
        "--journal-pmem-allow-emulation",
    ] {
        assert!(
            stderr.contains(expected),
            "stderr lacks {expected:?}: {stderr}"
        );
    }
    // Flags that only make sense together.
    for (flags, named) in [
        (vec!["--journal-backend", "pmem"], "--journal-pmem-path"),
        (vec!["--journal-pmem-path", "/x"], "--journal-pmem-path"),
        (
            vec!["--journal-pmem-allow-emulation"],
            "--journal-pmem-allow-emulation",
        ),
    ] {
        let output = bookie_command(dir.path()).args(&flags).output().unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?} accepted");
        assert!(stderr.contains(named), "{flags:?}: {stderr}");
    }
}

#[test]
fn bad_flags_are_refused_naming_the_flag() {
    let dir = tempfile::tempdir().unwrap();
    let journal = dir.path().join("j");
    let ledgers = dir.path().join("l");
    let cases: [(&[&str], &str); 4] = [
        (&["--journal-sync", "sometimes"], "--journal-sync"),
        (&["--write-cache-mb", "3"], "--write-cache-mb"),
        (&["--port", "70000"], "--port"),
        (&["--bind", "not-an-ip"], "--bind"),
    ];
    for (flags, named) in cases {
        let output = Command::new(env!("CARGO_BIN_EXE_vela"))
            .arg("bookie")
            .arg("--journal-dir")
            .arg(&journal)
            .arg("--ledger-dir")
            .arg(&ledgers)
            .args(flags)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&output.stderr);
        assert!(!output.status.success(), "{flags:?} accepted");
        assert!(
            stderr.contains(named),
            "{flags:?}: error does not name {named}: {stderr}"
        );
    }
    let output = Command::new(env!("CARGO_BIN_EXE_vela"))
        .arg("bookie")
        .arg("--journal-dir")
        .arg(&journal)
        .arg("--ledger-dir")
        .arg(&journal)
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("--ledger-dir"));
}
