//! Journal benchmark: the journal against the raw disk, measured in the same run
//! on the same directory.
//!
//! Prints: raw pwrite(4 KiB block holding 1 KiB)+fdatasync latency at depth 1
//! into a zero-filled preallocated file; journal append->callback latency at
//! depth 1 with 1 KiB entries and its difference to raw; journal throughput at
//! depth 256 for 1 KiB and 64 KiB entries beside raw sequential 1 MiB
//! write+fdatasync bandwidth; resident memory.
//!
//! Run: `cargo bench -p vela-bookie --bench journal` (dir: env VELA_BENCH_DIR,
//! default a temp dir under the workspace's target/; seconds per phase: env
//! VELA_BENCH_SECS, default 6; the whole run stays under ~60 s).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use vela_bookie::JournalMark;
use vela_bookie::journal::{Journal, JournalConfig, JournalRecord, JournalStats};

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var("VELA_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix("journal-bench-")
        .tempdir_in(base)
        .unwrap()
}

fn phase_duration() -> Duration {
    let secs = std::env::var("VELA_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(6.0);
    Duration::from_secs_f64(secs)
}

#[derive(Clone, Copy)]
struct Latency {
    p50: u64,
    p99: u64,
    p999: u64,
    count: u64,
}

fn latency(h: &Histogram<u64>) -> Latency {
    Latency {
        p50: h.value_at_quantile(0.5),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        count: h.len(),
    }
}

/// A zero-filled, synced file of `bytes` (the state the journal keeps ahead).
fn zero_filled(path: &Path, bytes: u64) -> File {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(true)
        .open(path)
        .unwrap();
    let zeros = vec![0u8; 1 << 20];
    let mut at = 0;
    while at < bytes {
        file.write_all_at(&zeros, at).unwrap();
        at += zeros.len() as u64;
    }
    file.sync_all().unwrap();
    file
}

/// Raw depth-1: pwrite one 4 KiB block (1 KiB of data) + fdatasync, sequentially.
fn raw_depth1(dir: &Path, run: Duration) -> Latency {
    let file = zero_filled(&dir.join("raw-depth1"), 256 << 20);
    let mut block = vec![0u8; 4096];
    block[..1024].fill(0xab);
    let mut h = histogram();
    let start = Instant::now();
    let mut offset = 0u64;
    while start.elapsed() < run && offset < (256 << 20) {
        let t = Instant::now();
        file.write_all_at(&block, offset).unwrap();
        file.sync_data().unwrap();
        h.record(t.elapsed().as_micros().max(1) as u64).unwrap();
        offset += 4096;
    }
    latency(&h)
}

/// Raw bandwidth: sequential 1 MiB pwrite + fdatasync into a fresh file.
fn raw_bandwidth(dir: &Path, run: Duration) -> f64 {
    let path = dir.join("raw-bandwidth");
    let file = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .open(&path)
        .unwrap();
    let block = vec![0x5au8; 1 << 20];
    let start = Instant::now();
    let mut written = 0u64;
    while start.elapsed() < run {
        file.write_all_at(&block, written).unwrap();
        file.sync_data().unwrap();
        written += block.len() as u64;
    }
    let secs = start.elapsed().as_secs_f64();
    drop(file);
    std::fs::remove_file(&path).unwrap();
    written as f64 / secs / 1e6
}

#[derive(Debug)]
struct Never;
impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}
impl std::error::Error for Never {}

fn open_journal(dir: &Path) -> Journal {
    let cfg = JournalConfig::new(dir);
    Journal::open(cfg, JournalMark::START, |_, _| Ok::<(), Never>(())).unwrap()
}

fn entry(entry_id: u64, payload: &Bytes) -> JournalRecord {
    JournalRecord::Entry {
        ledger_id: 1,
        entry_id,
        payload: payload.clone(),
    }
}

/// Journal depth-1: append one 1 KiB entry, wait for its callback, repeat.
fn journal_depth1(dir: &Path, run: Duration) -> (Latency, JournalStats) {
    let journal = open_journal(dir);
    let payload = Bytes::from(vec![0xabu8; 1024]);
    let (tx, rx) = mpsc::sync_channel::<()>(1);
    let mut h = histogram();
    // Warm-up: the first file's first chunk.
    for i in 0..200 {
        let tx = tx.clone();
        journal
            .append(entry(i, &payload), move |r| {
                r.unwrap();
                tx.send(()).unwrap();
            })
            .unwrap();
        rx.recv().unwrap();
    }
    let start = Instant::now();
    let mut i = 200;
    while start.elapsed() < run {
        let tx = tx.clone();
        let t = Instant::now();
        journal
            .append(entry(i, &payload), move |r| {
                r.unwrap();
                tx.send(()).unwrap();
            })
            .unwrap();
        rx.recv().unwrap();
        h.record(t.elapsed().as_micros().max(1) as u64).unwrap();
        i += 1;
    }
    let stats = journal.stats();
    journal.shutdown().unwrap();
    (latency(&h), stats)
}

/// Journal throughput with `depth` appends in flight; returns payload MB/s.
fn journal_throughput(
    dir: &Path,
    run: Duration,
    payload_bytes: usize,
    depth: usize,
) -> (f64, JournalStats) {
    let journal = open_journal(dir);
    let payload = Bytes::from(vec![0xcdu8; payload_bytes]);
    let (tx, rx) = mpsc::channel::<()>();
    let start = Instant::now();
    let mut in_flight = 0usize;
    let mut done = 0u64;
    let mut i = 0u64;
    while start.elapsed() < run {
        while in_flight < depth {
            let tx = tx.clone();
            match journal.append(entry(i, &payload), move |r| {
                r.unwrap();
                let _ = tx.send(());
            }) {
                Ok(()) => {
                    in_flight += 1;
                    i += 1;
                }
                Err(e) => panic!("{e}"),
            }
        }
        rx.recv().unwrap();
        in_flight -= 1;
        done += 1;
        while rx.try_recv().is_ok() {
            in_flight -= 1;
            done += 1;
        }
    }
    let secs = start.elapsed().as_secs_f64();
    for _ in 0..in_flight {
        rx.recv().unwrap();
    }
    let stats = journal.stats();
    journal.shutdown().unwrap();
    (done as f64 * payload_bytes as f64 / secs / 1e6, stats)
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn clear(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() {
            std::fs::remove_file(p).unwrap();
        }
    }
}

fn main() {
    // `cargo bench` passes --bench; `cargo test --benches` passes nothing useful.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = bench_dir();
    let run = phase_duration();
    let short = run.mul_f64(0.75);
    println!(
        "journal bench in {} ({:.1} s per phase)",
        dir.path().display(),
        run.as_secs_f64()
    );

    let raw1 = raw_depth1(dir.path(), run);
    clear(dir.path());
    let (j1, j1_stats) = journal_depth1(dir.path(), run);
    clear(dir.path());
    let raw_bw = raw_bandwidth(dir.path(), short);
    let (t1k, t1k_stats) = journal_throughput(dir.path(), short, 1024, 256);
    clear(dir.path());
    let (t64k, t64k_stats) = journal_throughput(dir.path(), short, 64 << 10, 256);
    clear(dir.path());

    println!();
    println!(
        "| measure                                   |    p50 µs |    p99 µs |  p99.9 µs |  samples |"
    );
    println!(
        "|-------------------------------------------|----------:|----------:|----------:|---------:|"
    );
    println!(
        "| raw pwrite 4 KiB + fdatasync, depth 1      | {:>9} | {:>9} | {:>9} | {:>8} |",
        raw1.p50, raw1.p99, raw1.p999, raw1.count
    );
    println!(
        "| journal append 1 KiB -> callback, depth 1  | {:>9} | {:>9} | {:>9} | {:>8} |",
        j1.p50, j1.p99, j1.p999, j1.count
    );
    println!(
        "| journal - raw                              | {:>+9} | {:>+9} | {:>+9} |          |",
        j1.p50 as i64 - raw1.p50 as i64,
        j1.p99 as i64 - raw1.p99 as i64,
        j1.p999 as i64 - raw1.p999 as i64
    );
    println!(
        "| journal / raw                              | {:>9.2} | {:>9.2} | {:>9.2} |          |",
        j1.p50 as f64 / raw1.p50 as f64,
        j1.p99 as f64 / raw1.p99 as f64,
        j1.p999 as f64 / raw1.p999 as f64
    );
    println!();
    println!("| throughput                                |      MB/s | vs raw |");
    println!("|-------------------------------------------|----------:|-------:|");
    println!("| raw sequential 1 MiB write + fdatasync    | {raw_bw:>9.1} |  1.00 |");
    println!(
        "| journal 1 KiB entries, depth 256          | {t1k:>9.1} | {:>5.2} |",
        t1k / raw_bw
    );
    println!(
        "| journal 64 KiB entries, depth 256         | {t64k:>9.1} | {:>5.2} |",
        t64k / raw_bw
    );
    println!();
    for (name, s) in [
        ("depth 1, 1 KiB", &j1_stats),
        ("depth 256, 1 KiB", &t1k_stats),
        ("depth 256, 64 KiB", &t64k_stats),
    ] {
        println!(
            "stages {name}: queue wait p50/p99 {}/{} µs, write {}/{} µs, fdatasync {}/{} µs, group entries p50/p99 {}/{}, group KiB p50 {}, groups/sync p50 {}, prealloc waits {}",
            s.queue_wait_us.p50,
            s.queue_wait_us.p99,
            s.write_us.p50,
            s.write_us.p99,
            s.fdatasync_us.p50,
            s.fdatasync_us.p99,
            s.group_entries.p50,
            s.group_entries.p99,
            s.group_bytes.p50 / 1024,
            s.groups_per_sync.p50,
            s.prealloc_waits
        );
    }
    println!("resident memory (VmRSS): {} MiB", rss_kib() / 1024);
}
