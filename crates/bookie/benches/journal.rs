//! Journal benchmark: the journal against the raw disk, measured in the same run
//! on the same directory. The machine is shared, so each journal phase is
//! bracketed by two raw half-phases (raw, journal, raw) whose results are merged,
//! and every raw phase starts after the device has settled (see `settle`).
//!
//! Prints: raw pwrite(4 KiB block holding 1 KiB)+fdatasync latency at depth 1
//! into a zero-filled preallocated file; journal append->callback latency at
//! depth 1 with 1 KiB entries and its difference to raw; journal throughput at
//! depth 256 for 1 KiB and 64 KiB entries (fresh directory, then steady state
//! with retired files reused) beside raw sequential 8 MiB write+fdatasync
//! bandwidth into a preallocated file; stage percentiles; resident memory.
//!
//! Run: `cargo bench -p vela-bookie --bench journal` (dir: env VELA_BENCH_DIR,
//! default a temp dir under the workspace's target/; seconds per measured
//! phase: env VELA_BENCH_SECS, default 5; the whole run stays under ~60 s;
//! env VELA_BENCH_DEPTH1_ONLY=1 runs only the depth-1 comparison).
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
        .unwrap_or(5.0);
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
    settle(&file);
    file
}

/// After a large write the device's flush stays slow until its cache drains
/// (measured here: fdatasync p50 4 ms right after 144 MiB, 120 µs a few seconds
/// later). Probe with 4 KiB write+fdatasync at offset 0 until 20 in a row come
/// within 2x of the best seen, at most 5 s, so no phase (raw or journal) pays for
/// the one before it.
fn settle(file: &File) {
    let block = vec![0u8; 4096];
    let start = Instant::now();
    let mut best = u128::MAX;
    let mut good = 0;
    while good < 20 && start.elapsed() < Duration::from_secs(5) {
        let t = Instant::now();
        file.write_all_at(&block, 0).unwrap();
        file.sync_data().unwrap();
        let us = t.elapsed().as_micros();
        best = best.min(us);
        good = if us <= 2 * best { good + 1 } else { 0 };
    }
}

/// Bytes of the preallocated raw files (overwritten in a loop).
const RAW_FILE_BYTES: u64 = 128 << 20;

/// Raw depth-1 for `run`: pwrite one 4 KiB block (1 KiB of data) + fdatasync,
/// sequentially through a zero-filled file, wrapping around.
fn raw_depth1_slice(file: &File, offset: &mut u64, run: Duration, h: &mut Histogram<u64>) {
    let mut block = vec![0u8; 4096];
    block[..1024].fill(0xab);
    let start = Instant::now();
    while start.elapsed() < run {
        let t = Instant::now();
        file.write_all_at(&block, *offset).unwrap();
        file.sync_data().unwrap();
        h.record(t.elapsed().as_micros().max(1) as u64).unwrap();
        *offset = (*offset + 4096) % RAW_FILE_BYTES;
    }
}

/// Raw bandwidth for `run`: sequential 8 MiB pwrite + fdatasync through a
/// preallocated file, wrapping around. Returns bytes written.
fn raw_bandwidth_slice(file: &File, offset: &mut u64, run: Duration) -> u64 {
    let block = vec![0x5au8; 8 << 20];
    let start = Instant::now();
    let mut written = 0;
    while start.elapsed() < run {
        file.write_all_at(&block, *offset).unwrap();
        file.sync_data().unwrap();
        written += block.len() as u64;
        *offset = (*offset + block.len() as u64) % RAW_FILE_BYTES;
    }
    written
}

#[derive(Debug)]
struct Never;
impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}
impl std::error::Error for Never {}

/// Files of this size in the throughput phases, so a few seconds reach the
/// steady state where retired files are reused (with the default 512 MiB that
/// takes longer than the time budget; 64 MiB files would rotate several times a
/// second at these rates, each rotation an end-record fdatasync, a rename and a
/// directory fsync on the writer thread).
const BENCH_FILE_BYTES: u64 = 256 << 20;

fn open_journal(dir: &Path, file_bytes_max: Option<u64>) -> Journal {
    let mut cfg = JournalConfig::new(dir);
    if let Some(bytes) = file_bytes_max {
        cfg.file_bytes_max = bytes;
    }
    Journal::open(cfg, JournalMark::START, |_, _| Ok::<(), Never>(())).unwrap()
}

fn entry(entry_id: u64, payload: &Bytes) -> JournalRecord {
    JournalRecord::Entry {
        ledger_id: 1,
        entry_id,
        payload: payload.clone(),
    }
}

/// Journal depth-1 for `run`: append one 1 KiB entry, wait for its callback.
fn journal_depth1_slice(journal: &Journal, run: Duration, h: &mut Histogram<u64>) {
    let payload = Bytes::from(vec![0xabu8; 1024]);
    let (tx, rx) = mpsc::sync_channel::<()>(1);
    let start = Instant::now();
    let mut i = 0;
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
}

/// Depth-1 latency, raw and journal interleaved.
fn depth1(dir: &Path, run: Duration) -> (Latency, Latency, JournalStats) {
    let raw_file = zero_filled(&dir.join("raw-depth1"), RAW_FILE_BYTES);
    let (mut raw_h, mut journal_h) = (histogram(), histogram());
    let mut offset = 0;
    // Raw, journal, raw: the journal is closed while raw runs (its preallocator
    // must not load the disk under the raw baseline), and raw brackets it.
    raw_depth1_slice(&raw_file, &mut offset, run / 2, &mut raw_h);
    let journal = open_journal(dir, None);
    journal_depth1_slice(&journal, Duration::from_millis(200), &mut histogram());
    settle(&raw_file);
    journal_depth1_slice(&journal, run, &mut journal_h);
    let stats = journal.stats();
    journal.shutdown().unwrap();
    drop(journal);
    settle(&raw_file);
    raw_depth1_slice(&raw_file, &mut offset, run / 2, &mut raw_h);
    (latency(&raw_h), latency(&journal_h), stats)
}

/// Keeps `depth` appends in flight for `run`; returns payload bytes acked. With
/// `checkpoint`, retires synced files every 250 ms as the bookie's checkpoints do.
fn drive(journal: &Journal, run: Duration, payload: &Bytes, depth: usize, checkpoint: bool) -> u64 {
    let (tx, rx) = mpsc::channel::<()>();
    let start = Instant::now();
    let mut last_checkpoint = start;
    let mut in_flight = 0usize;
    let mut done = 0u64;
    let mut i = 0u64;
    while start.elapsed() < run {
        while in_flight < depth {
            let tx = tx.clone();
            journal
                .append(entry(i, payload), move |r| {
                    r.unwrap();
                    let _ = tx.send(());
                })
                .unwrap();
            in_flight += 1;
            i += 1;
        }
        rx.recv().unwrap();
        in_flight -= 1;
        done += 1;
        while rx.try_recv().is_ok() {
            in_flight -= 1;
            done += 1;
        }
        if checkpoint && last_checkpoint.elapsed() > Duration::from_millis(250) {
            journal
                .delete_files_before(journal.last_synced_mark())
                .unwrap();
            last_checkpoint = Instant::now();
        }
    }
    for _ in 0..in_flight {
        rx.recv().unwrap();
    }
    done * payload.len() as u64
}

/// Throughput at `depth`: the journal on a fresh directory (files zero-filled
/// before use) until two retired files wait for reuse, then raw bandwidth and the
/// steady-state journal interleaved. Returns MB/s: (fresh, raw, steady) and the
/// steady-state stats.
fn throughput(
    dir: &Path,
    raw_file: &File,
    run: Duration,
    payload_bytes: usize,
    depth: usize,
) -> (f64, f64, f64, JournalStats) {
    let payload = Bytes::from(vec![0xcdu8; payload_bytes]);
    settle(raw_file);
    let journal = open_journal(dir, Some(BENCH_FILE_BYTES));
    let start = Instant::now();
    let mut bytes = 0;
    while count_files(dir, ".jnl.free") < 2 && start.elapsed() < run * 2 {
        bytes += drive(&journal, Duration::from_millis(200), &payload, depth, true);
    }
    let fresh = bytes as f64 / start.elapsed().as_secs_f64() / 1e6;
    drop(journal);
    // Raw, steady journal, raw.
    settle(raw_file);
    let mut offset = 0;
    let t = Instant::now();
    let mut raw_bytes = raw_bandwidth_slice(raw_file, &mut offset, run / 2);
    let mut raw_time = t.elapsed();
    settle(raw_file);
    let journal = open_journal(dir, Some(BENCH_FILE_BYTES));
    let t = Instant::now();
    let journal_bytes = drive(&journal, run, &payload, depth, true);
    let journal_time = t.elapsed();
    let stats = journal.stats();
    journal.shutdown().unwrap();
    drop(journal);
    settle(raw_file);
    let t = Instant::now();
    raw_bytes += raw_bandwidth_slice(raw_file, &mut offset, run / 2);
    raw_time += t.elapsed();
    let mbps = |b: u64, t: Duration| b as f64 / t.as_secs_f64() / 1e6;
    (
        fresh,
        mbps(raw_bytes, raw_time),
        mbps(journal_bytes, journal_time),
        stats,
    )
}

fn count_files(dir: &Path, suffix: &str) -> usize {
    std::fs::read_dir(dir)
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_str()
                .unwrap()
                .ends_with(suffix)
        })
        .count()
}

fn loadavg() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .unwrap_or_default()
        .split_whitespace()
        .take(3)
        .collect::<Vec<_>>()
        .join(" ")
}

fn rss_kib() -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

fn clear_journal(dir: &Path) {
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_file() && !p.ends_with("raw-bandwidth") {
            std::fs::remove_file(p).unwrap();
        }
    }
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
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let dir = bench_dir();
    let run = phase_duration();
    println!(
        "journal bench in {} ({:.1} s per measured phase; raw half-phases before and after each journal phase)",
        dir.path().display(),
        run.as_secs_f64()
    );
    let load_before = loadavg();
    let (raw1, j1, j1_stats) = depth1(dir.path(), run);
    clear(dir.path());
    if std::env::var("VELA_BENCH_DEPTH1_ONLY").is_ok() {
        println!(
            "depth 1: raw p50/p99/p99.9 {}/{}/{} µs, journal {}/{}/{} µs, journal fdatasync {:.0}/{:.0}/{:.0} µs",
            raw1.p50,
            raw1.p99,
            raw1.p999,
            j1.p50,
            j1.p99,
            j1.p999,
            j1_stats.fdatasync_us.p50,
            j1_stats.fdatasync_us.p99,
            j1_stats.fdatasync_us.p999
        );
        return;
    }
    let raw_file = zero_filled(&dir.path().join("raw-bandwidth"), RAW_FILE_BYTES);
    let (t1k_fresh, raw_bw_1k, t1k, t1k_stats) = throughput(dir.path(), &raw_file, run, 1024, 256);
    clear_journal(dir.path());
    let (t64k_fresh, raw_bw_64k, t64k, t64k_stats) =
        throughput(dir.path(), &raw_file, run, 64 << 10, 256);
    drop(raw_file);
    clear(dir.path());
    let raw_bw = (raw_bw_1k + raw_bw_64k) / 2.0;

    println!();
    println!(
        "| depth 1 latency                            |    p50 µs |    p99 µs |  p99.9 µs |  samples |"
    );
    println!(
        "|--------------------------------------------|----------:|----------:|----------:|---------:|"
    );
    println!(
        "| raw pwrite 4 KiB + fdatasync               | {:>9} | {:>9} | {:>9} | {:>8} |",
        raw1.p50, raw1.p99, raw1.p999, raw1.count
    );
    println!(
        "| journal append 1 KiB -> callback           | {:>9} | {:>9} | {:>9} | {:>8} |",
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
    println!("| throughput (payload)                        |      MB/s | vs raw |");
    println!("|---------------------------------------------|----------:|-------:|");
    println!("| raw sequential 8 MiB write + fdatasync      | {raw_bw:>9.1} |   1.00 |");
    for (name, fresh, raw, steady) in [
        ("1 KiB", t1k_fresh, raw_bw_1k, t1k),
        ("64 KiB", t64k_fresh, raw_bw_64k, t64k),
    ] {
        println!(
            "| journal {name:>6} x256, fresh (zero-fill)     | {fresh:>9.1} | {:>6.2} |",
            fresh / raw
        );
        println!(
            "| journal {name:>6} x256, steady (reused files) | {steady:>9.1} | {:>6.2} |",
            steady / raw
        );
    }
    println!(
        "(throughput rows: {} MiB journal files, checkpoint every 250 ms)",
        BENCH_FILE_BYTES >> 20
    );
    println!();
    for (name, s) in [
        ("depth 1, 1 KiB", &j1_stats),
        ("depth 256, 1 KiB, steady", &t1k_stats),
        ("depth 256, 64 KiB, steady", &t64k_stats),
    ] {
        println!(
            "stages {name}: queue wait p50/p99 {:.0}/{:.0} µs, write {:.0}/{:.0} µs, fdatasync {:.0}/{:.0}/{:.0} µs (p50/p99/p99.9), group entries p50/p99 {:.0}/{:.0}, group KiB p50 {:.0}, groups/sync p50 {:.0}, prealloc waits {}, unfilled writes {}",
            s.queue_wait_us.p50,
            s.queue_wait_us.p99,
            s.write_us.p50,
            s.write_us.p99,
            s.fdatasync_us.p50,
            s.fdatasync_us.p99,
            s.fdatasync_us.p999,
            s.group_entries.p50,
            s.group_entries.p99,
            s.group_bytes.p50 / 1024.0,
            s.groups_per_sync.p50,
            s.prealloc_waits,
            s.unfilled_writes
        );
    }
    println!("resident memory (VmRSS): {} MiB", rss_kib() / 1024);
    println!(
        "load average before/after (shared 2-core machine): {load_before} / {}",
        loadavg()
    );
}
