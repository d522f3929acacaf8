//! Ledger storage benchmark (harness = false, ~30-60 s):
//!
//! 1. Flush throughput with and without incremental write-back and with O_DIRECT
//!    entry logs (where the filesystem takes them), the page cache's
//!    peak `Dirty:` during each flush (sampled from /proc/meminfo every 2 ms), and
//!    the latency of a journal-like probe (4 KiB pwrite + fdatasync in a loop on a
//!    zero-filled file in the same file system) while the flush runs, against the
//!    same probe measured just before each flush.
//! 2. Read latency: write cache, read cache, entry log via page cache, entry log
//!    cold (pages dropped with fadvise DONTNEED), sequential with read-ahead.
//!
//! Env: VELA_BENCH_FLUSH_MIB (default 384), VELA_BENCH_DIR (default: temp dir).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod probe;

use std::fs::File;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use bytes::Bytes;
use probe::{hist, prepare_probe_file, record, run_probe_for, spawn_probe, summary};
use vela_bookie::storage::{LedgerStorage, StorageConfig};

const ENTRY_BYTES: usize = 4096;
const LEDGERS: u64 = 64;

fn main() {
    let flush_mib: u64 = std::env::var("VELA_BENCH_FLUSH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(384);
    let base = std::env::var("VELA_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| std::env::temp_dir());
    let tmp = tempfile::tempdir_in(&base).unwrap();
    println!(
        "storage bench: {flush_mib} MiB per flush, {ENTRY_BYTES} B entries over {LEDGERS} ledgers, dir {}",
        tmp.path().display()
    );
    println!(
        "vm.dirty_background_ratio={} vm.dirty_ratio={} (kernel starts write-back on its own only past these)",
        read_trim("/proc/sys/vm/dirty_background_ratio"),
        read_trim("/proc/sys/vm/dirty_ratio")
    );

    let probe_path = tmp.path().join("probe.jnl");
    prepare_probe_file(&probe_path);
    let idle = run_probe_for(&probe_path, Duration::from_secs(1));
    println!("\nidle disk: journal probe fdatasync {}", summary(&idle));

    let mut keep = None;
    // Alternate the two modes twice: the disk is shared, so one run each would
    // mostly measure whoever else was writing at that moment.
    let step_on = 4 * 1024 * 1024;
    let modes = [
        ("no write-back steps", 0u64, false),
        ("write-back every 4 MiB", step_on, false),
        ("O_DIRECT entry logs", 0, true),
        ("no write-back steps", 0, false),
        ("write-back every 4 MiB", step_on, false),
        ("O_DIRECT entry logs", 0, true),
    ];
    for (round, (label, step, direct)) in modes.into_iter().enumerate() {
        let dir = tmp.path().join(format!("ledgers-{round}"));
        let mut c = StorageConfig::new(&dir);
        c.write_cache_bytes_max = (flush_mib + 64) * 1024 * 1024;
        c.flush_threshold_bytes = c.write_cache_bytes_max;
        c.writeback_step_bytes = step;
        c.direct_writes = direct;
        c.read_cache_bytes_max = 8 * 1024 * 1024;
        c.read_ahead_bytes_max = 256 * 1024;
        let (s, _) = LedgerStorage::open(c).unwrap();
        let payload = Bytes::from(vec![0x5au8; ENTRY_BYTES]);
        let entries = flush_mib * 1024 * 1024 / ENTRY_BYTES as u64;
        for i in 0..entries {
            s.put_entry(i % LEDGERS, i / LEDGERS, payload.clone())
                .unwrap();
        }
        // The disk is shared with other work: the probe's baseline is taken right
        // before each flush, not once.
        let idle = run_probe_for(&probe_path, Duration::from_millis(700));
        let dirty_before = meminfo_kib("Dirty:");
        let stop = Arc::new(AtomicBool::new(false));
        let dirty_max = Arc::new(AtomicU64::new(dirty_before));
        let sampler = spawn_dirty_sampler(Arc::clone(&stop), Arc::clone(&dirty_max));
        let probe = spawn_probe(probe_path.clone(), Arc::clone(&stop));
        let t0 = Instant::now();
        let st = s.flush().unwrap();
        let elapsed = t0.elapsed();
        stop.store(true, Ordering::Relaxed);
        sampler.join().unwrap();
        let probe = probe.join().unwrap();
        let mb = st.bytes_written as f64 / 1e6;
        let dmax = dirty_max.load(Ordering::Relaxed);
        println!("\nflush {}, {label}:", round + 1);
        println!(
            "  {:.0} MB in {:.2} s = {:.0} MB/s (log write + fdatasync {:.2} s, index commit {:.1} ms, {} index records for {} entries)",
            mb,
            elapsed.as_secs_f64(),
            mb / elapsed.as_secs_f64(),
            st.log_write_duration.as_secs_f64(),
            st.index_commit_duration.as_secs_f64() * 1e3,
            st.index_record_count,
            st.entry_count
        );
        println!(
            "  page cache Dirty: {} MiB before, peak {} MiB during the flush (peak - before = {} MiB)",
            dirty_before / 1024,
            dmax / 1024,
            dmax.saturating_sub(dirty_before) / 1024
        );
        println!(
            "  journal probe just before: fdatasync {}\n  journal probe during the flush: fdatasync {}; p99 during / p99 before = {:.1}x",
            summary(&idle),
            summary(&probe),
            probe.value_at_quantile(0.99) as f64 / idle.value_at_quantile(0.99).max(1) as f64
        );
        if let Some((old, old_dir, _)) = keep.take() {
            drop(old);
            std::fs::remove_dir_all(old_dir).unwrap();
        }
        keep = Some((s, dir, entries));
    }

    let (s, dir, entries) = keep.unwrap();
    println!("\nreads (us):");
    read_latencies(&s, &dir, entries);
    drop(s);
    put_throughput(tmp.path());
}

/// put_entry cost (the ADD path's share of storage): one thread, then two
/// threads on different ledgers contending for the cache mutex.
fn put_throughput(base: &Path) {
    let mut c = StorageConfig::new(base.join("puts"));
    c.write_cache_bytes_max = 512 * 1024 * 1024;
    c.flush_threshold_bytes = c.write_cache_bytes_max;
    let (s, _) = LedgerStorage::open(c).unwrap();
    let s = Arc::new(s);
    let payload = Bytes::from(vec![7u8; 1024]);
    let n = 400_000u64;
    let t = Instant::now();
    for e in 0..n {
        s.put_entry(e % LEDGERS, e / LEDGERS, payload.clone())
            .unwrap();
    }
    let one = t.elapsed();
    s.flush().unwrap();
    let t = Instant::now();
    let threads: Vec<_> = (0..2u64)
        .map(|k| {
            let (s, payload) = (Arc::clone(&s), payload.clone());
            std::thread::spawn(move || {
                for e in 0..n / 2 {
                    s.put_entry(1_000 + k, e, payload.clone()).unwrap();
                }
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    let two = t.elapsed();
    println!(
        "\nput_entry (1 KiB, no copy): 1 thread {:.0} ns/op ({:.2} M/s); 2 threads {:.0} ns/op aggregate ({:.2} M/s)",
        one.as_nanos() as f64 / n as f64,
        n as f64 / one.as_secs_f64() / 1e6,
        two.as_nanos() as f64 / n as f64,
        n as f64 / two.as_secs_f64() / 1e6
    );
}

fn read_latencies(s: &LedgerStorage, dir: &Path, entries: u64) {
    let per_ledger = entries / LEDGERS;
    let mut rng = 0x9e37_79b9_7f4a_7c15u64;
    let mut next = move || {
        rng ^= rng << 13;
        rng ^= rng >> 7;
        rng ^= rng << 17;
        rng
    };
    let n = 20_000;

    // Write cache: entries put, not flushed.
    let payload = Bytes::from(vec![1u8; ENTRY_BYTES]);
    for e in 0..10_000 {
        s.put_entry(1_000, e, payload.clone()).unwrap();
    }
    let mut h = hist();
    for _ in 0..n {
        let e = next() % 10_000;
        let t = Instant::now();
        s.get_entry(1_000, e).unwrap();
        record(&mut h, t);
    }
    println!("  write cache hit          {}", summary(&h));

    // Entry log through the page cache, random (read-ahead rarely helps).
    let before = s.stats();
    let mut h = hist();
    for _ in 0..n {
        let (l, e) = (next() % LEDGERS, next() % per_ledger);
        let t = Instant::now();
        s.get_entry(l, e).unwrap();
        record(&mut h, t);
    }
    let after = s.stats();
    println!(
        "  entry log, page cache    {}  ({} log reads, {} read-cache hits)",
        summary(&h),
        after.entry_log_read_count - before.entry_log_read_count,
        after.read_cache_hit_count - before.read_cache_hit_count
    );

    // Read cache hit: the same entry twice.
    let mut h = hist();
    for _ in 0..n {
        let (l, e) = (next() % LEDGERS, next() % per_ledger);
        s.get_entry(l, e).unwrap();
        let t = Instant::now();
        s.get_entry(l, e).unwrap();
        record(&mut h, t);
    }
    println!("  read cache hit           {}", summary(&h));

    // Cold: drop the logs' pages, then random reads.
    drop_page_cache(dir);
    let mut h = hist();
    for _ in 0..2_000 {
        let (l, e) = (next() % LEDGERS, next() % per_ledger);
        let t = Instant::now();
        s.get_entry(l, e).unwrap();
        record(&mut h, t);
    }
    println!("  entry log, cold          {}", summary(&h));

    // Sequential per ledger, cold: read-ahead turns most reads into cache hits.
    drop_page_cache(dir);
    let before = s.stats();
    let mut h = hist();
    let count = per_ledger.min(5_000);
    for e in 0..count {
        let t = Instant::now();
        s.get_entry(7, e).unwrap();
        record(&mut h, t);
    }
    let after = s.stats();
    println!(
        "  sequential, cold         {}  ({} entries, {} log reads)",
        summary(&h),
        count,
        after.entry_log_read_count - before.entry_log_read_count
    );
}

fn read_trim(p: &str) -> String {
    std::fs::read_to_string(p)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "?".into())
}

fn meminfo_kib(key: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/meminfo").unwrap_or_default();
    s.lines()
        .find(|l| l.starts_with(key))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(0)
}

fn spawn_dirty_sampler(stop: Arc<AtomicBool>, max: Arc<AtomicU64>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        while !stop.load(Ordering::Relaxed) {
            max.fetch_max(meminfo_kib("Dirty:"), Ordering::Relaxed);
            std::thread::sleep(Duration::from_millis(2));
        }
    })
}

/// Drops the page cache of every entry log in `dir`.
fn drop_page_cache(dir: &Path) {
    use std::os::fd::AsRawFd;
    for ent in std::fs::read_dir(dir).unwrap() {
        let p = ent.unwrap().path();
        if p.extension().is_some_and(|x| x == "log") {
            let f = File::open(&p).unwrap();
            // SAFETY: posix_fadvise takes a descriptor kept open by `f` and plain
            // integers; it reads or writes no memory of ours.
            #[allow(unsafe_code)]
            unsafe {
                libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
            }
        }
    }
}
