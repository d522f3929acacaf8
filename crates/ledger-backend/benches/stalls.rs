//! Write-path stalls and the periodic work that causes them.
//!
//! One topic's log on the whole storage stack as `vela standalone` runs it
//! (a bookie in process with journal and entry logs on disk, the ledger
//! client over `LocalBookies`, the metadata in a `FileStore`), appended to
//! at a steady rate while every kind of periodic work runs often:
//! - ledger rollover every `VELA_BENCH_LEDGER_ENTRIES` entries (minimum age 0);
//! - cursor persistence (a consumer acks up to the tail every 10 ms; the
//!   cursor writes every 100 ms);
//! - trimming of consumed ledgers (at each rollover, and a policy-pass-like
//!   `trim` every second) and the deletes it sends to the bookie;
//! - the bookie's checkpoints (write-cache flush, entry log, index commit,
//!   every 250 ms), journal file rolls (16 MiB files) and storage gc passes
//!   (every 2 s, 32 MiB entry logs, so consumed logs are deleted).
//!
//! Each periodic event logs one `tracing` debug line on target
//! `vela::periodic` with its `kind` and `elapsed_us` (ARCHITECTURE.md
//! "Periodic work"); the bench collects them and, for every kind, prints
//! the longest append whose time in flight overlapped an event of that
//! kind (and the longest one that overlapped none): the longest stall per
//! event kind. It also prints the append latency percentiles and each
//! kind's count and longest duration.
//!
//! Run: `cargo bench -p vela-ledger-backend --bench stalls` (env:
//! `VELA_BENCH_SECS` run length, default 30; `VELA_BENCH_RATE` appends per
//! second, default 2000; `VELA_BENCH_ENTRY_BYTES`, default 8192;
//! `VELA_BENCH_LEDGER_ENTRIES`, default 1000; `VELA_BENCH_DIR` where the
//! data goes, default a temp dir under the workspace's target/, deleted at
//! the end). A figure, never a pass/fail: compare binaries in one window.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use parking_lot::Mutex;
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};
use tracing_subscriber::{Layer, Registry};
use vela_bookie::bookie::{Bookie, BookieConfig};
use vela_ledger::{BookieId, LedgerClient, LedgerConfig};
use vela_ledger_backend::{LocalBookies, ReplicatedLedgers};
use vela_log::{CursorStart, LogConfig, LogEnv, ManagedLog, Position, Retention};
use vela_meta::{ExpectedVersion, FileStore, MetadataStore, registry};

const PERIODIC_TARGET: &str = "vela::periodic";

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|value| value.parse().ok())
        .unwrap_or(default)
}

/// One periodic event: its kind and the span of time it covered.
#[derive(Debug, Clone)]
struct Event {
    kind: String,
    started: Instant,
    ended: Instant,
}

/// Collects the `vela::periodic` events.
#[derive(Clone, Default)]
struct Events(Arc<Mutex<Vec<Event>>>, Arc<Mutex<Steps>>);

/// The longest value of each step field, per kind.
type Steps = BTreeMap<(String, &'static str), u64>;

#[derive(Default)]
struct Fields {
    kind: Option<String>,
    elapsed_us: Option<u64>,
    /// A rollover's time until appends went to the next ledger.
    attached_us: Option<u64>,
    /// Every other `_us` field (a rollover's steps).
    steps: Vec<(&'static str, u64)>,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        if field.name() == "kind" {
            self.kind = Some(value.to_string());
        }
    }

    fn record_u64(&mut self, field: &Field, value: u64) {
        match field.name() {
            "elapsed_us" => self.elapsed_us = Some(value),
            "attached_us" => self.attached_us = Some(value),
            name if name.ends_with("_us") => self.steps.push((name, value)),
            _ => {}
        }
    }

    fn record_i64(&mut self, field: &Field, value: i64) {
        if field.name() == "elapsed_us" {
            self.elapsed_us = u64::try_from(value).ok();
        }
    }

    fn record_debug(&mut self, _field: &Field, _value: &dyn std::fmt::Debug) {}
}

impl<S: tracing::Subscriber> Layer<S> for Events {
    fn on_event(&self, event: &tracing::Event<'_>, _ctx: Context<'_, S>) {
        if event.metadata().target() != PERIODIC_TARGET {
            return;
        }
        let ended = Instant::now();
        let mut fields = Fields::default();
        event.record(&mut fields);
        if let (Some(kind), Some(elapsed_us)) = (fields.kind, fields.elapsed_us) {
            let started = ended
                .checked_sub(Duration::from_micros(elapsed_us))
                .unwrap_or(ended);
            {
                let mut steps = self.1.lock();
                for (name, value) in fields.steps {
                    let longest = steps.entry((kind.clone(), name)).or_default();
                    *longest = (*longest).max(value);
                }
            }
            let mut events = self.0.lock();
            if let Some(attached_us) = fields.attached_us {
                // The part of a rollover before appends went on.
                let attached = started + Duration::from_micros(attached_us);
                events.push(Event {
                    kind: format!("{kind}:held"),
                    started,
                    ended: attached.min(ended),
                });
            }
            events.push(Event {
                kind,
                started,
                ended,
            });
        }
    }
}

fn bench_dir() -> tempfile::TempDir {
    let base = std::env::var("VELA_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix("stalls-bench-")
        .tempdir_in(base)
        .unwrap()
}

fn bookie_config(dir: &std::path::Path) -> BookieConfig {
    let mut config = BookieConfig::new(dir.join("journal"), dir.join("ledgers"));
    config.journal.file_bytes_max = 16 << 20;
    config.journal.prealloc_chunk_bytes = 1 << 20;
    config.storage.flush_interval = Duration::from_millis(250);
    config.storage.entry_log_size_max_bytes = 32 << 20;
    config.gc_interval = Duration::from_secs(2);
    config
}

/// One append: when it was issued and when it completed.
type Timing = (Instant, Instant);

fn main() {
    let events = Events::default();
    let subscriber = Registry::default().with(
        events.clone().with_filter(
            tracing_subscriber::filter::Targets::new()
                .with_target(PERIODIC_TARGET, tracing::Level::DEBUG),
        ),
    );
    tracing::subscriber::set_global_default(subscriber).unwrap();
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let secs: u64 = env_or("VELA_BENCH_SECS", 30);
    let rate: u64 = env_or("VELA_BENCH_RATE", 2000);
    let entry_bytes: usize = env_or("VELA_BENCH_ENTRY_BYTES", 8192);
    let ledger_entries: u64 = env_or("VELA_BENCH_LEDGER_ENTRIES", 1000);
    let dir = bench_dir();
    let timings = runtime.block_on(run(
        dir.path(),
        Duration::from_secs(secs),
        rate,
        entry_bytes,
        ledger_entries,
    ));
    drop(runtime);
    let steps = events.1.lock().clone();
    let events = events.0.lock().clone();
    report(&timings, &events, secs, rate, entry_bytes, ledger_entries);
    for ((kind, name), longest_us) in &steps {
        println!("{kind} step {name}: longest {:.2} ms", ms(*longest_us));
    }
}

async fn run(
    dir: &std::path::Path,
    length: Duration,
    rate: u64,
    entry_bytes: usize,
    ledger_entries: u64,
) -> Vec<Timing> {
    let bookie_dir = dir.join("bookie");
    let bookie = tokio::task::spawn_blocking(move || Bookie::open(bookie_config(&bookie_dir)))
        .await
        .unwrap()
        .expect("bookie opens");
    let bookie = Arc::new(bookie);
    std::fs::create_dir_all(dir.join("metadata")).unwrap();
    let store: Arc<dyn MetadataStore> =
        Arc::new(FileStore::open(dir.join("metadata")).await.unwrap());
    let id = BookieId::new("bench-0");
    let info = registry::BookieInfo {
        address: "in-process".to_string(),
        rack: None,
    };
    store
        .put(
            &registry::bookie_key(&registry::BookieId::new(id.0.as_str()).unwrap()),
            registry::encode_bookie_info(&info).unwrap(),
            ExpectedVersion::Any,
        )
        .await
        .unwrap();
    let transport = LocalBookies::new([(id, Arc::clone(&bookie))]);
    let client = LedgerClient::new(store.clone(), Arc::new(transport), LedgerConfig::default());
    let env = LogEnv::new(store.clone(), Arc::new(ReplicatedLedgers::new(client)));
    let config = LogConfig {
        ledger_entries_max: ledger_entries,
        ledger_age_min: Duration::ZERO,
        cursor_persist_interval: Duration::from_millis(100),
        retention: Retention::NONE,
        ..LogConfig::default()
    };
    let log = ManagedLog::open(&env, "public/default/persistent/stalls", config)
        .await
        .unwrap();
    let cursor = log.open_cursor("sub", CursorStart::Latest).await.unwrap();

    // The consumer: acks up to the tail every 10 ms; a trim every second.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let consumer = {
        let (log, cursor, stop) = (Arc::clone(&log), Arc::clone(&cursor), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut last_trim = Instant::now();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                tokio::time::sleep(Duration::from_millis(10)).await;
                if let Some(last) = log.last_confirmed() {
                    let _ = cursor.ack_cumulative(last);
                }
                if last_trim.elapsed() >= Duration::from_secs(1) {
                    log.trim().await;
                    last_trim = Instant::now();
                }
            }
        })
    };

    let payload = Bytes::from(vec![0x5a_u8; entry_bytes]);
    let timings: Arc<Mutex<Vec<Timing>>> = Arc::new(Mutex::new(Vec::new()));
    let failures = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let started = Instant::now();
    let mut issued = 0u64;
    let mut ticker = tokio::time::interval(Duration::from_millis(1));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Burst);
    while started.elapsed() < length {
        ticker.tick().await;
        let due = (started.elapsed().as_secs_f64() * rate as f64) as u64;
        while issued < due {
            issued += 1;
            let sent = Instant::now();
            let (timings, failures) = (Arc::clone(&timings), Arc::clone(&failures));
            log.append(payload.clone()).then(
                move |result: Result<Position, vela_log::LogError>| match result {
                    Ok(_) => timings.lock().push((sent, Instant::now())),
                    Err(_) => {
                        failures.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                },
            );
        }
    }
    // Let the last appends complete.
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    consumer.await.unwrap();
    log.close().await.unwrap();
    let bookie_closing = Arc::clone(&bookie);
    tokio::task::spawn_blocking(move || bookie_closing.shutdown())
        .await
        .unwrap();
    let failed = failures.load(std::sync::atomic::Ordering::Relaxed);
    if failed > 0 {
        println!("FAILED appends: {failed}");
    }
    println!("appends issued: {issued}");
    timings.lock().clone()
}

fn ms(us: u64) -> f64 {
    us as f64 / 1e3
}

fn report(
    timings: &[Timing],
    events: &[Event],
    secs: u64,
    rate: u64,
    entry_bytes: usize,
    ledger_entries: u64,
) {
    let mut histogram = Histogram::<u64>::new_with_bounds(1, 600_000_000, 3).unwrap();
    for (sent, done) in timings {
        histogram
            .record(done.duration_since(*sent).as_micros().max(1) as u64)
            .unwrap();
    }
    println!(
        "stalls: {secs} s at {rate} appends/s of {entry_bytes} B, rollover every {ledger_entries} entries"
    );
    println!(
        "append latency: n={} p50={:.2} p99={:.2} p99.9={:.2} max={:.2} ms",
        histogram.len(),
        ms(histogram.value_at_quantile(0.5)),
        ms(histogram.value_at_quantile(0.99)),
        ms(histogram.value_at_quantile(0.999)),
        ms(histogram.max()),
    );
    // Per kind: count and longest event; the appends in flight during one
    // (their p99, how many took over 5 ms, the longest). "(none)": the
    // appends during no event, the machine's own noise.
    let mut kinds: BTreeMap<&str, (u64, u64, Vec<u64>)> = BTreeMap::new();
    for event in events {
        let entry = kinds.entry(event.kind.as_str()).or_default();
        entry.0 += 1;
        entry.1 = entry
            .1
            .max(event.ended.duration_since(event.started).as_micros() as u64);
    }
    let mut by_start: Vec<&Event> = events.iter().collect();
    by_start.sort_by_key(|event| event.started);
    let mut unattributed: Vec<u64> = Vec::new();
    let mut slow_unattributed: Vec<(f64, u64)> = Vec::new();
    let origin = timings.first().map(|(sent, _)| *sent);
    for (sent, done) in timings {
        let latency_us = done.duration_since(*sent).as_micros() as u64;
        let mut during: Vec<&str> = Vec::new();
        for event in &by_start {
            if event.started > *done {
                break;
            }
            if event.ended >= *sent && !during.contains(&event.kind.as_str()) {
                during.push(event.kind.as_str());
            }
        }
        for kind in &during {
            kinds.entry(kind).or_default().2.push(latency_us);
        }
        if during.is_empty() {
            unattributed.push(latency_us);
            if latency_us > 5_000
                && let Some(origin) = origin
            {
                slow_unattributed.push((sent.duration_since(origin).as_secs_f64(), latency_us));
            }
        }
    }
    println!(
        "{:<16} {:>7} {:>12} | {:>8} {:>9} {:>8} {:>9}",
        "event", "count", "longest ms", "appends", "p99 ms", ">5 ms", "max ms"
    );
    let row = |name: &str, count: String, longest: String, latencies: &mut Vec<u64>| {
        latencies.sort_unstable();
        let n = latencies.len();
        let p99 = if n == 0 {
            0
        } else {
            latencies[(n - 1) * 99 / 100]
        };
        let over = latencies.iter().filter(|&&l| l > 5_000).count();
        println!(
            "{name:<16} {count:>7} {longest:>12} | {n:>8} {:>9.2} {over:>8} {:>9.2}",
            ms(p99),
            ms(latencies.last().copied().unwrap_or(0))
        );
    };
    for (kind, (count, longest_us, latencies)) in kinds.iter_mut() {
        row(
            kind,
            count.to_string(),
            format!("{:.2}", ms(*longest_us)),
            latencies,
        );
    }
    row("(none)", "-".into(), "-".into(), &mut unattributed);
    // One line per 100 ms window (its longest), at most 10.
    let mut windows: BTreeMap<u64, (f64, u64)> = BTreeMap::new();
    for &(at_s, latency_us) in &slow_unattributed {
        let window = windows.entry((at_s * 10.0) as u64).or_insert((at_s, 0));
        window.1 = window.1.max(latency_us);
    }
    for (at_s, latency_us) in windows.values().take(10) {
        println!(
            "  unattributed appends over 5 ms at {at_s:.1} s: up to {:.2} ms",
            ms(*latency_us)
        );
    }
}
