//! Bookie benchmark: a bookie over TCP loopback against the raw disk, measured in
//! the same run on the same directory.
//!
//! Prints: raw pwrite + fdatasync latency at depth 1 (one 4 KiB block holding
//! 1 KiB, the I/O the journal does for a lone 1 KiB entry) into a zero-filled
//! preallocated file, and bookie ADD latency at depth 1, 1 KiB, client to
//! bookie over 127.0.0.1, in alternating 250 ms slices (this machine's fsync
//! time drifts with other processes' I/O); the same while ledger storage flushes continuously (a
//! background writer on other ledgers keeps the write cache past its flush
//! threshold); ADD throughput at depth 256 for 1 KiB and 64 KiB entries beside
//! raw sequential 1 MiB write + fdatasync bandwidth, in alternating 500 ms
//! slices; the process's peak VmRSS
//! during the throughput runs beside write cache + read cache + 64 MiB (client
//! and bookie share the process, so in-flight client entries count too).
//!
//! Run: `cargo bench -p vela-bookie --bench bookie` (dir: env VELA_BENCH_DIR,
//! default a temp dir under the workspace's target/; seconds per phase: env
//! VELA_BENCH_SECS, default 5; the whole run stays under ~60 s per backend).
//! Ledger storage shares the journal's directory (so its device) unless env
//! VELA_BENCH_LEDGER_DIR names another, as a production bookie would have.
//!
//! Journal backends: env VELA_BENCH_JOURNAL_BACKEND, one of auto (default),
//! buffered, direct, pmem, or a comma list (`direct,pmem`) run one after the
//! other in this one run, with a comparison table at the end. pmem puts the
//! region in VELA_BENCH_PMEM_DIR (default /dev/shm) with emulation allowed:
//! on tmpfs a group then costs a memcpy and an msync that does nothing, which
//! is the journal with its disk taken away, not persistent memory.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::VecDeque;
use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use vela_bookie::bookie::{Bookie, BookieConfig};
use vela_bookie::journal::{
    JournalBackendKind, PMEM_ALIGNMENT_BYTES, PMEM_REGION_BYTES_DEFAULT, PmemConfig, PmemEmulation,
};
use vela_bookie::server::Server;
use vela_bookie_protocol::AddMode;
use vela_bookie_protocol::BookieError;
use vela_bookie_protocol::client::BookieClient;
use vela_bookie_protocol::entry::{EntryHeader, encode_entry};

const WRITE_CACHE_BYTES: u64 = 128 << 20;
const READ_CACHE_BYTES: u64 = 64 << 20;
/// Low, so the background writer of the "while flushing" phase triggers a
/// flush every few hundred milliseconds.
const FLUSH_THRESHOLD_BYTES: u64 = 8 << 20;
/// Background writer during the flushing phase: 64 KiB entries at this rate.
const BACKGROUND_BYTES_PER_SEC: u64 = 32 << 20;
const BACKGROUND_ENTRY_BYTES: usize = 64 << 10;
const THROUGHPUT_DEPTH: usize = 256;
/// Throughput phases alternate bookie and raw slices of this length.
const THROUGHPUT_SLICE: Duration = Duration::from_millis(500);

fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var("VELA_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix("bookie-bench-")
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

struct Latency {
    p50: u64,
    p99: u64,
    p999: u64,
    count: u64,
}

impl Latency {
    fn of(h: &Histogram<u64>) -> Latency {
        Latency {
            p50: h.value_at_quantile(0.5),
            p99: h.value_at_quantile(0.99),
            p999: h.value_at_quantile(0.999),
            count: h.len(),
        }
    }

    fn line(&self) -> String {
        format!(
            "p50 {:>6} µs  p99 {:>6} µs  p99.9 {:>6} µs  (n={})",
            self.p50, self.p99, self.p999, self.count
        )
    }
}

/// A zero-filled, synced file of `bytes`.
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

/// Right after a big zero-fill, fdatasync here can be much slower for a while;
/// the journal preallocates ahead in the background, so it never writes into
/// that state. Writes during this warm-up are not measured.
const RAW_WARM_UP: Duration = Duration::from_secs(1);
/// The depth-1 phases alternate slices of raw writes and bookie adds, so both
/// see the same machine (other processes' I/O comes and goes).
const SLICE: Duration = Duration::from_millis(250);

/// Depth-1 raw writes: one 4 KiB block holding 1 KiB + fdatasync, sequential
/// offsets in a zero-filled file.
struct RawFile {
    file: File,
    file_bytes: u64,
    offset: u64,
    block: Vec<u8>,
}

impl RawFile {
    fn create(dir: &Path) -> RawFile {
        let file_bytes: u64 = 256 << 20;
        let file = zero_filled(&dir.join("raw-depth1"), file_bytes);
        let mut block = vec![0u8; 4096];
        block[..1024].fill(0xab);
        let mut raw = RawFile {
            file,
            file_bytes,
            offset: 0,
            block,
        };
        raw.run(&mut histogram(), RAW_WARM_UP);
        raw
    }

    fn run(&mut self, h: &mut Histogram<u64>, run: Duration) {
        let start = Instant::now();
        while start.elapsed() < run {
            if self.offset + 4096 > self.file_bytes {
                self.offset = 0;
            }
            let t = Instant::now();
            self.file.write_all_at(&self.block, self.offset).unwrap();
            self.file.sync_data().unwrap();
            h.record(t.elapsed().as_micros().max(1) as u64).unwrap();
            self.offset += 4096;
        }
    }
}

/// Raw sequential bandwidth: 1 MiB pwrite + fdatasync into zero-filled space
/// (wrapping around at the end of the file).
struct RawBandwidth {
    file: File,
    file_bytes: u64,
    offset: u64,
    block: Vec<u8>,
    written_bytes: u64,
    busy: Duration,
}

impl RawBandwidth {
    fn create(dir: &Path) -> RawBandwidth {
        let file_bytes: u64 = 512 << 20;
        let file = zero_filled(&dir.join("raw-bandwidth"), file_bytes);
        let mut raw = RawBandwidth {
            file,
            file_bytes,
            offset: 0,
            block: vec![0xcdu8; 1 << 20],
            written_bytes: 0,
            busy: Duration::ZERO,
        };
        raw.run(RAW_WARM_UP);
        raw.written_bytes = 0;
        raw.busy = Duration::ZERO;
        raw
    }

    fn run(&mut self, run: Duration) {
        let start = Instant::now();
        while start.elapsed() < run {
            if self.offset + self.block.len() as u64 > self.file_bytes {
                self.offset = 0;
            }
            self.file.write_all_at(&self.block, self.offset).unwrap();
            self.file.sync_data().unwrap();
            self.offset += self.block.len() as u64;
            self.written_bytes += self.block.len() as u64;
        }
        self.busy += start.elapsed();
    }

    fn mb_per_s(&self) -> f64 {
        self.written_bytes as f64 / self.busy.as_secs_f64() / 1e6
    }
}

fn entry(ledger_id: u64, entry_id: u64, payload: &[u8]) -> Bytes {
    let header = EntryHeader {
        ledger_id,
        entry_id,
        last_add_confirmed: entry_id.checked_sub(1),
        ledger_length: (entry_id + 1) * payload.len() as u64,
    };
    encode_entry(&header, payload)
}

/// Depth-1 adds of 1 KiB to `ledger_id` for `run`, alternating with raw
/// slices when `raw` is given.
async fn add_depth1(
    client: &BookieClient,
    ledger_id: u64,
    run: Duration,
    mut raw: Option<(&mut RawFile, &mut Histogram<u64>)>,
) -> Latency {
    let payload = vec![0x5au8; 1024];
    let mut h = histogram();
    let start = Instant::now();
    let mut entry_id = 0;
    while start.elapsed() < run {
        let slice_start = Instant::now();
        while slice_start.elapsed() < SLICE {
            let entry = entry(ledger_id, entry_id, &payload);
            let t = Instant::now();
            client.add(entry, AddMode::Normal).await.unwrap();
            h.record(t.elapsed().as_micros().max(1) as u64).unwrap();
            entry_id += 1;
        }
        if let Some((file, raw_h)) = raw.as_mut() {
            // Blocks this (block_on) thread only; the server runs on workers.
            file.run(raw_h, SLICE);
        }
    }
    Latency::of(&h)
}

/// Pipelined adds at `THROUGHPUT_DEPTH` for `run`, in slices that alternate
/// with raw bandwidth slices; returns (MB/s of payload, entries/s) over the
/// bookie slices.
async fn add_throughput(
    client: &BookieClient,
    first_ledger_id: u64,
    payload_bytes: usize,
    run: Duration,
    raw: &mut RawBandwidth,
) -> (f64, f64) {
    let payload = vec![0x77u8; payload_bytes];
    let mut in_flight = VecDeque::with_capacity(THROUGHPUT_DEPTH);
    let mut acked = 0u64;
    let mut refused = 0u64;
    let mut busy = Duration::ZERO;
    let mut entry_id = 0u64;
    let start = Instant::now();
    while start.elapsed() < run {
        let slice_start = Instant::now();
        while slice_start.elapsed() < THROUGHPUT_SLICE || !in_flight.is_empty() {
            while slice_start.elapsed() < THROUGHPUT_SLICE && in_flight.len() < THROUGHPUT_DEPTH {
                // Four ledgers, round robin, as several producers would.
                let ledger_id = first_ledger_id + entry_id % 4;
                in_flight.push_back(
                    client.add(entry(ledger_id, entry_id / 4, &payload), AddMode::Normal),
                );
                entry_id += 1;
            }
            let Some(add) = in_flight.pop_front() else {
                break;
            };
            match add.await {
                Ok(()) => acked += 1,
                Err(BookieError::TooManyRequests) => refused += 1,
                Err(error) => panic!("add failed: {error}"),
            }
        }
        busy += slice_start.elapsed();
        // Blocks this (block_on) thread only; the server runs on workers.
        raw.run(THROUGHPUT_SLICE);
    }
    if refused > 0 {
        println!("    ({payload_bytes}-byte adds: {refused} refused with TOO_MANY_REQUESTS)");
    }
    let secs = busy.as_secs_f64();
    (
        acked as f64 * payload_bytes as f64 / secs / 1e6,
        acked as f64 / secs,
    )
}

/// Background writer: 64 KiB entries to other ledgers at a fixed rate.
async fn background_writer(client: BookieClient, stop: Arc<AtomicBool>, written: Arc<AtomicU64>) {
    let payload = vec![0x11u8; BACKGROUND_ENTRY_BYTES];
    let interval =
        Duration::from_secs_f64(BACKGROUND_ENTRY_BYTES as f64 / BACKGROUND_BYTES_PER_SEC as f64);
    let mut ticker = tokio::time::interval(interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Skip);
    let mut pending = VecDeque::new();
    let mut entry_id = 0u64;
    while !stop.load(Ordering::Relaxed) {
        ticker.tick().await;
        pending.push_back(client.add(
            entry(1_000_000 + entry_id % 8, entry_id / 8, &payload),
            AddMode::Normal,
        ));
        entry_id += 1;
        while pending.len() > 8 {
            if pending.pop_front().unwrap().await.is_ok() {
                written.fetch_add(BACKGROUND_ENTRY_BYTES as u64, Ordering::Relaxed);
            }
        }
    }
    for add in pending {
        let _ = add.await;
    }
}

fn vm_rss_bytes() -> u64 {
    status_bytes("VmRSS:")
}

/// Resident shared memory: the touched pages of a pmem region mapped from
/// tmpfs count here (and in VmRSS), not in the bookie's heap.
fn rss_shmem_bytes() -> u64 {
    status_bytes("RssShmem:")
}

fn status_bytes(field: &str) -> u64 {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    status
        .lines()
        .find_map(|line| line.strip_prefix(field))
        .and_then(|rest| {
            rest.trim()
                .trim_end_matches("kB")
                .trim()
                .parse::<u64>()
                .ok()
        })
        .map_or(0, |kib| kib * 1024)
}

/// The bookie's own stage latencies (cumulative since it opened).
fn print_stages(label: &str, stats: &vela_bookie::bookie::BookieStats) {
    println!(
        "    {label}: bookie add (add -> durable) {:?}",
        stats.add_us
    );
    println!(
        "    {label}: journal queue wait {:?}",
        stats.journal.queue_wait_us
    );
    println!("    {label}: journal write {:?}", stats.journal.write_us);
    println!(
        "    {label}: journal fdatasync {:?}",
        stats.journal.fdatasync_us
    );
}

/// A journal backend the bench runs the bookie phases on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum BenchBackend {
    /// The bookie's default (`auto`: O_DIRECT where the directory takes it).
    Auto,
    Buffered,
    Direct,
    /// The persistent-memory backend, region in VELA_BENCH_PMEM_DIR (default
    /// /dev/shm), emulation allowed.
    Pmem,
}

impl BenchBackend {
    fn label(self) -> &'static str {
        match self {
            BenchBackend::Auto => "auto",
            BenchBackend::Buffered => "buffered",
            BenchBackend::Direct => "direct",
            BenchBackend::Pmem => "pmem",
        }
    }
}

/// VELA_BENCH_JOURNAL_BACKEND: one backend or a comma-separated list (e.g.
/// `direct,pmem`), each run through every phase in this one run.
fn bench_backends() -> Vec<BenchBackend> {
    let list = std::env::var("VELA_BENCH_JOURNAL_BACKEND").unwrap_or_else(|_| "auto".to_string());
    list.split(',')
        .map(|name| match name.trim() {
            "auto" => BenchBackend::Auto,
            "buffered" => BenchBackend::Buffered,
            "direct" => BenchBackend::Direct,
            "pmem" => BenchBackend::Pmem,
            other => panic!(
                "VELA_BENCH_JOURNAL_BACKEND={other}: buffered, direct, pmem or auto (or a comma list)"
            ),
        })
        .collect()
}

/// What one backend measured, for the comparison table.
struct BackendFigures {
    backend: BenchBackend,
    depth1: Latency,
    depth1_adds_per_s: f64,
    flushing: Latency,
    small_entries_per_s: f64,
    big_mb_s: f64,
    journal_write_p50_us: f64,
    journal_sync_p50_us: f64,
}

fn main() {
    let dir = bench_dir();
    let run = phase_duration();
    let backends = bench_backends();
    println!(
        "bookie bench in {} ({:?} per phase), journal backends: {}",
        dir.path().display(),
        run,
        backends
            .iter()
            .map(|b| b.label())
            .collect::<Vec<_>>()
            .join(", ")
    );
    // Kept alive to the end: the ledger dirs live in it.
    let ledger_dir = std::env::var("VELA_BENCH_LEDGER_DIR").ok().map(|base| {
        let base = PathBuf::from(base);
        std::fs::create_dir_all(&base).unwrap();
        let ledger_dir = tempfile::Builder::new()
            .prefix("bookie-bench-ledgers-")
            .tempdir_in(base)
            .unwrap();
        println!(
            "ledger storage in {} (journal and raw figures: above)",
            ledger_dir.path().display()
        );
        ledger_dir
    });
    let ledger_base = ledger_dir.as_ref().map_or(dir.path(), |d| d.path());
    // Regions of the pmem backend, removed at the end.
    let pmem_dir = backends.contains(&BenchBackend::Pmem).then(|| {
        let base = std::env::var("VELA_BENCH_PMEM_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|_| PathBuf::from("/dev/shm"));
        let pmem_dir = tempfile::Builder::new()
            .prefix("bookie-bench-pmem-")
            .tempdir_in(&base)
            .unwrap();
        println!(
            "pmem journal regions in {} (emulated unless it is a DAX filesystem: see the log)",
            pmem_dir.path().display()
        );
        pmem_dir
    });

    let mut raw_file = RawFile::create(dir.path());
    let mut raw_bandwidth: Option<RawBandwidth> = None;
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let mut figures = Vec::new();
    for &backend in &backends {
        println!("--- journal backend {} ---", backend.label());
        let bench = Bench {
            journal_base: dir.path(),
            ledger_base,
            pmem_base: pmem_dir.as_ref().map(|d| d.path()),
            backend,
            run,
        };
        figures.push(bench.run_all(&runtime, &mut raw_file, &mut raw_bandwidth));
    }
    drop(runtime);
    if let Some(raw) = &raw_bandwidth {
        let raw_mb_s = raw.mb_per_s();
        println!("raw sequential 1 MiB pwrite + fdatasync:            {raw_mb_s:>8.1} MB/s");
        for f in &figures {
            println!(
                "    {}: 64 KiB ADD throughput = {:.2} x raw bandwidth",
                f.backend.label(),
                f.big_mb_s / raw_mb_s
            );
        }
    }
    if figures.len() > 1 {
        println!();
        println!("journal backends, same run (µs; entries/s):");
        println!(
            "{:<9} {:>10} {:>10} {:>10} {:>12} {:>12} {:>12} {:>14} {:>10} {:>10}",
            "backend",
            "d1 p50",
            "d1 p99",
            "d1 p99.9",
            "d1 adds/s",
            "flush p50",
            "flush p99.9",
            "1KiB d256 e/s",
            "write p50",
            "sync p50"
        );
        for f in &figures {
            println!(
                "{:<9} {:>10} {:>10} {:>10} {:>12.0} {:>12} {:>12} {:>14.0} {:>10.0} {:>10.0}",
                f.backend.label(),
                f.depth1.p50,
                f.depth1.p99,
                f.depth1.p999,
                f.depth1_adds_per_s,
                f.flushing.p50,
                f.flushing.p999,
                f.small_entries_per_s,
                f.journal_write_p50_us,
                f.journal_sync_p50_us
            );
        }
        if backends.contains(&BenchBackend::Pmem) {
            println!(
                "(pmem on tmpfs is emulated: a group costs a memcpy and an msync that tmpfs makes a \
                 no-op; not persistent-memory durability, not a measurement of Optane or CXL memory)"
            );
        }
    }
}

/// One backend's phases.
struct Bench<'a> {
    journal_base: &'a Path,
    ledger_base: &'a Path,
    pmem_base: Option<&'a Path>,
    backend: BenchBackend,
    run: Duration,
}

impl Bench<'_> {
    fn open_bookie(&self, name: &str, flush_threshold_bytes: u64) -> Arc<Bookie> {
        let name = format!("{name}-{}", self.backend.label());
        open_bookie(
            self.journal_base,
            self.ledger_base,
            self.pmem_base,
            &name,
            self.backend,
            flush_threshold_bytes,
        )
    }

    fn run_all(
        &self,
        runtime: &tokio::runtime::Runtime,
        raw_file: &mut RawFile,
        raw_bandwidth: &mut Option<RawBandwidth>,
    ) -> BackendFigures {
        let run = self.run;
        // Latency phases: a low flush threshold, so the background writer of
        // the second phase keeps storage flushing.
        let latency_bookie = self.open_bookie("latency", FLUSH_THRESHOLD_BYTES);
        let (depth1, depth1_adds_per_s, flushing) = runtime.block_on(async {
            let served = Served::start(latency_bookie.clone()).await;
            let client = BookieClient::connect(served.addr).await.unwrap();
            let mut raw_h = histogram();
            let started = Instant::now();
            let add = add_depth1(&client, 1, run, Some((&mut *raw_file, &mut raw_h))).await;
            // Bookie slices are half of the phase (the raw slices the other).
            let adds_per_s = add.count as f64 / (started.elapsed().as_secs_f64() / 2.0);
            let raw = Latency::of(&raw_h);
            println!(
                "raw pwrite 4 KiB (1 KiB data) + fdatasync, depth 1: {}",
                raw.line()
            );
            println!(
                "bookie ADD 1 KiB, depth 1, TCP loopback:           {}  p50 = raw + {} µs",
                add.line(),
                add.p50 as i64 - raw.p50 as i64
            );

            print_stages("plain phase", &latency_bookie.stats());

            let flushes_before = latency_bookie.stats().storage.flush_count;
            let stop = Arc::new(AtomicBool::new(false));
            let written = Arc::new(AtomicU64::new(0));
            let background_client = BookieClient::connect(served.addr).await.unwrap();
            let background = tokio::spawn(background_writer(
                background_client,
                stop.clone(),
                written.clone(),
            ));
            tokio::time::sleep(Duration::from_millis(300)).await;
            let flushing = add_depth1(&client, 2, run, None).await;
            stop.store(true, Ordering::Relaxed);
            background.await.unwrap();
            let flushes = latency_bookie.stats().storage.flush_count - flushes_before;
            println!(
                "bookie ADD 1 KiB, depth 1, storage flushing:       {}  p50 = raw + {} µs",
                flushing.line(),
                flushing.p50 as i64 - raw.p50 as i64
            );
            println!(
                "    (background: {} MiB of 64 KiB adds on other ledgers, {flushes} storage flushes)",
                written.load(Ordering::Relaxed) >> 20
            );
            drop(client);
            served.stop().await;
            (add, adds_per_s, flushing)
        });
        let latency_stats = latency_bookie.stats();
        print_stages("both latency phases", &latency_stats);
        latency_bookie.shutdown();
        drop(latency_bookie);

        // Throughput phases: the default flush threshold (a quarter of the cache).
        let throughput_bookie = self.open_bookie("throughput", WRITE_CACHE_BYTES / 4);
        let rss_before = vm_rss_bytes();
        let peak_rss = Arc::new(AtomicU64::new(rss_before));
        let peak_shmem = Arc::new(AtomicU64::new(rss_shmem_bytes()));
        let sampling = Arc::new(AtomicBool::new(true));
        let sampler = {
            let (peak_rss, peak_shmem) = (peak_rss.clone(), peak_shmem.clone());
            let sampling = sampling.clone();
            std::thread::spawn(move || {
                while sampling.load(Ordering::Relaxed) {
                    peak_rss.fetch_max(vm_rss_bytes(), Ordering::Relaxed);
                    peak_shmem.fetch_max(rss_shmem_bytes(), Ordering::Relaxed);
                    std::thread::sleep(Duration::from_millis(50));
                }
            })
        };
        let raw_bandwidth =
            raw_bandwidth.get_or_insert_with(|| RawBandwidth::create(self.journal_base));
        let (small_per_s, big_mb_s) = runtime.block_on(async {
            let served = Served::start(throughput_bookie.clone()).await;
            let client = BookieClient::connect(served.addr).await.unwrap();
            let (small_mb_s, small_per_s) = add_throughput(&client, 100, 1024, run, raw_bandwidth).await;
            println!(
                "bookie ADD 1 KiB, depth {THROUGHPUT_DEPTH}:                       {small_mb_s:>8.1} MB/s  ({small_per_s:.0} entries/s)"
            );
            let (big_mb_s, big_per_s) = add_throughput(&client, 200, 64 << 10, run, raw_bandwidth).await;
            println!(
                "bookie ADD 64 KiB, depth {THROUGHPUT_DEPTH}:                      {big_mb_s:>8.1} MB/s  ({big_per_s:.0} entries/s)"
            );
            drop(client);
            served.stop().await;
            (small_per_s, big_mb_s)
        });
        sampling.store(false, Ordering::Relaxed);
        sampler.join().unwrap();
        let stats = throughput_bookie.stats();
        println!(
            "    journal groups, throughput phases: entries {:?}",
            stats.journal.group_entries
        );
        println!(
            "    journal fdatasync, throughput phases: {:?}",
            stats.journal.fdatasync_us
        );
        println!(
            "    storage checkpoints, throughput phases: {:?} ({} flushes, {} MiB written, write cache full {} times, journal ring full waits {})",
            stats.checkpoint_us,
            stats.storage.flush_count,
            stats.storage.flushed_bytes_total >> 20,
            stats.storage.write_cache_full_count,
            stats.journal.ring_full_waits
        );
        throughput_bookie.shutdown();
        drop(throughput_bookie);
        let budget = WRITE_CACHE_BYTES + READ_CACHE_BYTES + (64 << 20);
        println!(
            "peak VmRSS during throughput runs:                 {:>8} MiB  (before: {} MiB; budget: write cache {} + read cache {} + 64 = {} MiB; \
             of VmRSS, shared memory peaked at {} MiB: a pmem region's touched pages on tmpfs count there)",
            peak_rss.load(Ordering::Relaxed) >> 20,
            rss_before >> 20,
            WRITE_CACHE_BYTES >> 20,
            READ_CACHE_BYTES >> 20,
            budget >> 20,
            peak_shmem.load(Ordering::Relaxed) >> 20
        );
        BackendFigures {
            backend: self.backend,
            depth1,
            depth1_adds_per_s,
            flushing,
            small_entries_per_s: small_per_s,
            big_mb_s,
            journal_write_p50_us: latency_stats.journal.write_us.p50,
            journal_sync_p50_us: latency_stats.journal.fdatasync_us.p50,
        }
    }
}

fn open_bookie(
    journal_base: &Path,
    ledger_base: &Path,
    pmem_base: Option<&Path>,
    name: &str,
    backend: BenchBackend,
    flush_threshold_bytes: u64,
) -> Arc<Bookie> {
    let mut config = BookieConfig::new(
        journal_base.join(format!("{name}-journal")),
        ledger_base.join(format!("{name}-ledgers")),
    );
    config.storage.write_cache_bytes_max = WRITE_CACHE_BYTES;
    config.storage.read_cache_bytes_max = READ_CACHE_BYTES;
    config.storage.flush_threshold_bytes = flush_threshold_bytes;
    // Comparisons of the journal's write paths on the same machine.
    match backend {
        BenchBackend::Auto => {}
        BenchBackend::Buffered => config.journal.backend = JournalBackendKind::Buffered,
        BenchBackend::Direct => config.journal.backend = JournalBackendKind::Direct,
        BenchBackend::Pmem => {
            config.journal.backend = JournalBackendKind::Pmem;
            config.journal.alignment_bytes = PMEM_ALIGNMENT_BYTES;
            config.journal.pmem = Some(PmemConfig {
                dir: pmem_base
                    .expect("a pmem directory")
                    .join(format!("{name}-pmem")),
                region_bytes: PMEM_REGION_BYTES_DEFAULT,
                emulation: PmemEmulation::Allow,
            });
        }
    }
    Arc::new(Bookie::open(config).unwrap())
}

/// A server on 127.0.0.1 over a bookie, until `stop`.
struct Served {
    addr: std::net::SocketAddr,
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<std::io::Result<()>>,
}

impl Served {
    async fn start(bookie: Arc<Bookie>) -> Served {
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), bookie)
            .await
            .unwrap();
        let addr = server.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(server.run(async {
            let _ = stopped.await;
        }));
        Served { addr, stop, task }
    }

    async fn stop(self) {
        let _ = self.stop.send(());
        self.task.await.unwrap().unwrap();
    }
}
