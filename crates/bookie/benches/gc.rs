//! Storage GC benchmark (harness = false, ~1-2 min): what a gc pass does to the
//! journal, measured by a journal-like probe (4 KiB pwrite + fdatasync at depth
//! 1 on a zero-filled file in the same directory, so the same device), and to
//! flushes, measured by a writer that flushes every 50 ms during the pass.
//!
//! Each round builds the same ledger dir: one entry log holding only a ledger
//! that is then deleted (dead: deleted by the pass) and one holding the rest of
//! that ledger plus a small live one (sparse: compacted by the pass). Then the
//! probe runs 1 s idle and on through the pass. Two ways, alternating (the disk
//! is shared with other work):
//! - "at once": each log unlinked in one go, compaction in one unpaced slice
//!   (one flush-lock hold for the whole log): what gc did before slices;
//! - "stepped": the defaults: deleted logs cut in synced `ftruncate` steps at
//!   most `log_delete_bytes_per_s`, compaction in paced 4 MiB slices.
//!
//! Prints per round the probe's fdatasync during the pass against its idle
//! figures, the longest flush-lock wait of the writer's flushes, the pass's
//! step timings, and at the end stepped / at once ratios of the probe's max and
//! p99.9 over all rounds.
//!
//! Env: VELA_BENCH_GC_LOG_MIB (entry-log size, default 512; a round writes
//! ~2.3 logs), VELA_BENCH_GC_ROUNDS (rounds per way, default 2), VELA_BENCH_DIR
//! (default: the workspace's target/).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod probe;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use probe::{hist, prepare_probe_file, run_probe_for, spawn_probe, summary};
use vela_bookie::storage::{GcStats, LedgerStorage, StorageConfig};

const ENTRY_BYTES: usize = 64 * 1024;
/// The ledger the pass frees, the live one left in the sparse log, the one
/// that fills the next log (so the sparse one is closed), and the writer's.
const DEAD_LEDGER: u64 = 1;
const LIVE_LEDGER: u64 = 2;
const FILL_LEDGER: u64 = 3;
const WRITER_LEDGER: u64 = 4;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Way {
    AtOnce,
    Stepped,
}

impl Way {
    fn label(self) -> &'static str {
        match self {
            Way::AtOnce => "at once",
            Way::Stepped => "stepped",
        }
    }
}

fn env_u64(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn main() {
    let log_mib = env_u64("VELA_BENCH_GC_LOG_MIB", 512);
    let rounds = env_u64("VELA_BENCH_GC_ROUNDS", 2);
    let base = std::env::var("VELA_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&base).unwrap();
    let tmp = tempfile::Builder::new()
        .prefix("gc-bench-")
        .tempdir_in(&base)
        .unwrap();
    println!(
        "gc bench: {log_mib} MiB entry logs, {ENTRY_BYTES} B entries, {rounds} rounds per way, dir {}",
        tmp.path().display()
    );
    let probe_path = tmp.path().join("probe.jnl");
    prepare_probe_file(&probe_path);
    let mut during = [hist(), hist()];
    for round in 0..rounds {
        for way in [Way::AtOnce, Way::Stepped] {
            let h = run_round(tmp.path(), &probe_path, log_mib, way, round);
            during[way as usize].add(&h).unwrap();
        }
    }
    let (old, new) = (
        &during[Way::AtOnce as usize],
        &during[Way::Stepped as usize],
    );
    println!("\nall rounds, probe fdatasync during the passes:");
    println!("  at once: {}", summary(old));
    println!("  stepped: {}", summary(new));
    println!(
        "  stepped / at once: max {:.2}x, p99.9 {:.2}x, p99 {:.2}x",
        new.max() as f64 / old.max().max(1) as f64,
        new.value_at_quantile(0.999) as f64 / old.value_at_quantile(0.999).max(1) as f64,
        new.value_at_quantile(0.99) as f64 / old.value_at_quantile(0.99).max(1) as f64,
    );
}

fn config(dir: &Path, log_mib: u64, way: Way) -> StorageConfig {
    let mut c = StorageConfig::new(dir);
    c.entry_log_size_max_bytes = log_mib << 20;
    c.write_cache_bytes_max = 256 << 20;
    c.flush_threshold_bytes = 64 << 20;
    c.read_cache_bytes_max = 8 << 20;
    c.read_ahead_bytes_max = 256 << 10;
    if way == Way::AtOnce {
        c.log_delete_step_bytes = 0;
        c.log_delete_bytes_per_s = 0;
        c.compaction_slice_bytes = u64::MAX;
        c.compaction_bytes_per_s = 0;
    }
    c
}

/// Puts `bytes` of entries of `ledger` from `first` on, flushing whenever the
/// cache would fill; returns the next entry id.
fn put_bytes(s: &LedgerStorage, ledger: u64, first: u64, bytes: u64) -> u64 {
    let payload = Bytes::from(vec![0x5au8; ENTRY_BYTES]);
    let n = bytes / ENTRY_BYTES as u64;
    for e in first..first + n {
        if !s.has_write_room(ENTRY_BYTES) {
            s.flush().unwrap();
        }
        s.put_entry(ledger, e, payload.clone()).unwrap();
    }
    s.flush().unwrap();
    first + n
}

fn run_round(base: &Path, probe_path: &Path, log_mib: u64, way: Way, round: u64) -> Histogram<u64> {
    let dir = base.join(format!("ledgers-{round}-{}", way as u8));
    let log_bytes = log_mib << 20;
    let (s, _) = LedgerStorage::open(config(&dir, log_mib, way)).unwrap();
    // Log 1: the dead ledger only; log 2: the rest of it (90%) + the live one.
    put_bytes(&s, DEAD_LEDGER, 0, log_bytes * 19 / 10);
    put_bytes(&s, LIVE_LEDGER, 0, log_bytes / 20);
    put_bytes(&s, FILL_LEDGER, 0, log_bytes / 4);
    s.delete_ledger(DEAD_LEDGER).unwrap();
    s.flush().unwrap();
    let s = Arc::new(s);
    // Let the device settle after the writes.
    std::thread::sleep(Duration::from_secs(1));
    let idle = run_probe_for(probe_path, Duration::from_secs(1));

    let stop = Arc::new(AtomicBool::new(false));
    let probe = spawn_probe(probe_path.to_path_buf(), Arc::clone(&stop));
    let writer = spawn_writer(Arc::clone(&s), Arc::clone(&stop));
    let t0 = Instant::now();
    let st = s.gc().unwrap();
    let elapsed = t0.elapsed();
    stop.store(true, Ordering::Release);
    let during = probe.join().unwrap();
    let (flushes, lock_wait_max) = writer.join().unwrap();
    println!(
        "\nround {}, {}: pass {:.2} s, {} logs deleted, {} compacted ({} slices, {} MiB copied), {} MiB freed",
        round + 1,
        way.label(),
        elapsed.as_secs_f64(),
        st.logs_deleted,
        st.logs_compacted,
        st.compaction_slices,
        entries_mib(&st),
        st.bytes_reclaimed >> 20
    );
    println!("  steps: {}", timings(&st));
    println!(
        "  writer: {flushes} flushes during the pass, longest flush-lock wait {:.1} ms",
        lock_wait_max.as_secs_f64() * 1e3
    );
    println!("  probe idle:   fdatasync {}", summary(&idle));
    println!("  probe in gc:  fdatasync {}", summary(&during));
    println!(
        "  in gc / idle: max {:.1}x, p99.9 {:.1}x",
        during.max() as f64 / idle.max().max(1) as f64,
        during.value_at_quantile(0.999) as f64 / idle.value_at_quantile(0.999).max(1) as f64
    );
    drop(s);
    std::fs::remove_dir_all(&dir).unwrap();
    during
}

fn entries_mib(st: &GcStats) -> u64 {
    (st.entries_copied * ENTRY_BYTES as u64) >> 20
}

fn timings(st: &GcStats) -> String {
    let t = &st.timings;
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    format!(
        "log remove commits {:.1} ms, log deletes {:.1} ms, compaction read {:.1} / append {:.1} / sync {:.1} / commit {:.1} ms, pacing {:.1} ms, flush lock held at most {:.1} ms",
        ms(t.log_remove_commit),
        ms(t.log_delete),
        ms(t.compaction_read),
        ms(t.compaction_append),
        ms(t.compaction_sync),
        ms(t.compaction_commit),
        ms(t.pacing),
        ms(t.flush_lock_held_max)
    )
}

/// Puts 1 MiB and flushes every 50 ms until `stop`; returns the flushes and
/// their longest wait for the flush lock.
fn spawn_writer(s: Arc<LedgerStorage>, stop: Arc<AtomicBool>) -> JoinHandle<(u64, Duration)> {
    std::thread::spawn(move || {
        let payload = Bytes::from(vec![0x33u8; ENTRY_BYTES]);
        let (mut e, mut flushes, mut wait_max) = (0u64, 0u64, Duration::ZERO);
        while !stop.load(Ordering::Acquire) {
            for _ in 0..(1 << 20) / ENTRY_BYTES {
                s.put_entry(WRITER_LEDGER, e, payload.clone()).unwrap();
                e += 1;
            }
            let st = s.flush().unwrap();
            flushes += 1;
            wait_max = wait_max.max(st.lock_wait_duration);
            std::thread::sleep(Duration::from_millis(50));
        }
        (flushes, wait_max)
    })
}
