//! Latency histograms, write-path stages and broker-wide counters, for
//! `/metrics` and `vela admin write-path`.
//!
//! Owns: [`LatencyHistogram`] (lock-free recording: one bucket increment and
//! one sum addition, relaxed atomics, no allocation), its plain-data
//! [`LatencySnapshot`] (percentiles, mean, Pulsar's `le_*` buckets), the
//! write-path [`Stage`] names, and the [`WritePathSource`] seam through which
//! the process that wires the broker (standalone) hands in the stages below
//! the broker (ledger add, bookie add, journal stages), so this crate never
//! depends on the ledger client or the bookie.
//!
//! Buckets are log-linear in µs: 1..9 µs, then 14 steps per decade (1, 1.25,
//! 1.5, 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 9) from 10 µs to 90 s, then
//! 100 s and an overflow bucket: at most 25 % wide (percentiles are
//! interpolated inside a bucket), 109 buckets (~0.9 KiB per histogram), and
//! every bound of Pulsar's `pulsar_storage_write_latency_le_*` buckets (0.5,
//! 1, 5, 10, 20, 50, 100, 200, 1000 ms) is a bucket bound, so those are exact.
//! Never: formats Prometheus text (the `prometheus` module does) or blocks.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Mantissas (×100) of the bounds in each decade from 10 µs on.
const DECADE_MANTISSAS: [u64; 14] = [
    100, 125, 150, 175, 200, 250, 300, 350, 400, 500, 600, 700, 800, 900,
];
/// Decades from 10 µs: 10 µs, 100 µs, 1 ms, 10 ms, 100 ms, 1 s, 10 s.
const DECADES: usize = 7;
/// Number of bucket upper bounds: 1..9 µs, the decades, and 100 s.
pub const LATENCY_BOUNDS: usize = 9 + DECADES * DECADE_MANTISSAS.len() + 1;
/// Number of buckets (bounds + overflow).
pub const LATENCY_BUCKETS: usize = LATENCY_BOUNDS + 1;

const fn latency_bounds() -> [u64; LATENCY_BOUNDS] {
    let mut out = [0u64; LATENCY_BOUNDS];
    let mut i = 0;
    while i < 9 {
        out[i] = i as u64 + 1;
        i += 1;
    }
    let mut scale = 1u64;
    let mut decade = 0;
    while decade < DECADES {
        let mut j = 0;
        while j < DECADE_MANTISSAS.len() {
            out[i] = DECADE_MANTISSAS[j] * scale / 10;
            i += 1;
            j += 1;
        }
        scale *= 10;
        decade += 1;
    }
    out[i] = 100_000_000;
    out
}

/// Upper bounds of the latency buckets in µs (inclusive), increasing; the
/// last bucket (overflow) has none.
pub const LATENCY_BOUNDS_US: [u64; LATENCY_BOUNDS] = latency_bounds();

/// Pulsar's `pulsar_storage_write_latency_le_*` bucket bounds (µs) and the
/// metric-name suffix of each; the overflow bucket is `overflow`.
pub const PULSAR_LATENCY_BUCKETS: [(u64, &str); 9] = [
    (500, "0_5"),
    (1_000, "1"),
    (5_000, "5"),
    (10_000, "10"),
    (20_000, "20"),
    (50_000, "50"),
    (100_000, "100"),
    (200_000, "200"),
    (1_000_000, "1000"),
];

fn bucket_index(us: u64) -> usize {
    LATENCY_BOUNDS_US.partition_point(|bound| *bound < us)
}

/// A latency histogram over [`LATENCY_BOUNDS_US`].
#[derive(Debug)]
pub struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

impl Default for LatencyHistogram {
    fn default() -> Self {
        LatencyHistogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum_us: AtomicU64::new(0),
        }
    }
}

impl LatencyHistogram {
    /// Records one latency.
    pub fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        self.buckets[bucket_index(us)].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> LatencySnapshot {
        let mut buckets = [0u64; LATENCY_BUCKETS];
        for (out, bucket) in buckets.iter_mut().zip(&self.buckets) {
            *out = bucket.load(Ordering::Relaxed);
        }
        LatencySnapshot {
            count: buckets.iter().sum(),
            buckets,
            sum_us: self.sum_us.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's counts: per bucket (not cumulative), total and sum. Counts
/// only grow, so two snapshots subtract into the distribution of the
/// samples in between.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LatencySnapshot {
    /// Count per bucket; bucket `i` holds latencies ≤ `LATENCY_BOUNDS_US[i]`
    /// and above the previous bound; the last one is the overflow.
    pub buckets: [u64; LATENCY_BUCKETS],
    /// Number of samples.
    pub count: u64,
    /// Sum of the samples in µs.
    pub sum_us: u64,
}

impl Default for LatencySnapshot {
    fn default() -> Self {
        LatencySnapshot {
            buckets: [0; LATENCY_BUCKETS],
            count: 0,
            sum_us: 0,
        }
    }
}

impl LatencySnapshot {
    /// Builds a snapshot from (value µs, count) pairs, e.g. the recorded
    /// values of another histogram implementation.
    pub fn from_values(values: impl IntoIterator<Item = (u64, u64)>) -> LatencySnapshot {
        let mut out = LatencySnapshot::default();
        for (us, count) in values {
            out.buckets[bucket_index(us)] += count;
            out.count += count;
            out.sum_us = out.sum_us.saturating_add(us.saturating_mul(count));
        }
        out
    }

    /// Adds another snapshot's samples (e.g. the same stage on two bookies).
    pub fn merge(&mut self, other: &LatencySnapshot) {
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum_us = self.sum_us.saturating_add(other.sum_us);
    }

    /// Samples added since `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &LatencySnapshot) -> LatencySnapshot {
        let mut out = LatencySnapshot::default();
        for (i, bucket) in out.buckets.iter_mut().enumerate() {
            *bucket = self.buckets[i].saturating_sub(earlier.buckets[i]);
        }
        out.count = self.count.saturating_sub(earlier.count);
        out.sum_us = self.sum_us.saturating_sub(earlier.sum_us);
        out
    }

    /// Mean in µs (0 without samples).
    pub fn mean_us(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum_us as f64 / self.count as f64
        }
    }

    /// The `quantile` (0..=1) in µs, interpolated linearly inside its bucket
    /// (0 without samples; the overflow bucket answers its lower bound).
    pub fn quantile_us(&self, quantile: f64) -> f64 {
        if self.count == 0 {
            return 0.0;
        }
        let rank = (quantile.clamp(0.0, 1.0) * self.count as f64).max(1.0);
        let mut below = 0u64;
        for (i, count) in self.buckets.iter().enumerate() {
            if *count == 0 {
                continue;
            }
            if (below + count) as f64 >= rank {
                let lower = if i == 0 { 0 } else { LATENCY_BOUNDS_US[i - 1] } as f64;
                let Some(upper) = LATENCY_BOUNDS_US.get(i) else {
                    return lower;
                };
                let fraction = (rank - below as f64) / *count as f64;
                return lower + (*upper as f64 - lower) * fraction;
            }
            below += count;
        }
        LATENCY_BOUNDS_US[LATENCY_BOUNDS - 1] as f64
    }

    /// Samples ≤ `bound_us`; exact when `bound_us` is one of
    /// [`LATENCY_BOUNDS_US`], else counted up to the nearest bound below.
    pub fn count_le(&self, bound_us: u64) -> u64 {
        let last = LATENCY_BOUNDS_US.partition_point(|bound| *bound <= bound_us);
        self.buckets[..last].iter().sum()
    }

    /// Counts of Pulsar's `le_*` buckets (not cumulative), overflow last.
    pub fn pulsar_buckets(&self) -> [u64; PULSAR_LATENCY_BUCKETS.len() + 1] {
        let mut out = [0u64; PULSAR_LATENCY_BUCKETS.len() + 1];
        let mut below = 0u64;
        for (i, (bound, _)) in PULSAR_LATENCY_BUCKETS.iter().enumerate() {
            let up_to = self.count_le(*bound);
            out[i] = up_to - below;
            below = up_to;
        }
        out[PULSAR_LATENCY_BUCKETS.len()] = self.count - below;
        out
    }
}

/// A stage of the write path (DESIGN §8), outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Broker: SEND read from the socket → SEND_RECEIPT written to it.
    BrokerPublish,
    /// Ledger client: add submitted → acknowledged by Qa bookies in order.
    LedgerAdd,
    /// Bookie: add received → durable completion.
    BookieAdd,
    /// Journal: queue wait of each group's oldest record.
    JournalQueueWait,
    /// Journal: the write of each group.
    JournalWrite,
    /// Journal: each fdatasync.
    JournalFdatasync,
}

impl Stage {
    /// Every stage, outermost first.
    pub const ALL: [Stage; 6] = [
        Stage::BrokerPublish,
        Stage::LedgerAdd,
        Stage::BookieAdd,
        Stage::JournalQueueWait,
        Stage::JournalWrite,
        Stage::JournalFdatasync,
    ];

    /// The `stage` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::BrokerPublish => "broker_publish",
            Stage::LedgerAdd => "ledger_add",
            Stage::BookieAdd => "bookie_add",
            Stage::JournalQueueWait => "journal_queue_wait",
            Stage::JournalWrite => "journal_write",
            Stage::JournalFdatasync => "journal_fdatasync",
        }
    }
}

impl fmt::Display for Stage {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One stage's distribution on one instance (a bookie, the ledger client,
/// the broker).
#[derive(Debug, Clone, PartialEq)]
pub struct StageLatency {
    /// Which stage.
    pub stage: Stage,
    /// Which instance (`broker`, `ledger-client`, a bookie id).
    pub instance: String,
    /// Samples since the instance started.
    pub latency: LatencySnapshot,
}

/// Stages below the broker, read at each scrape. Implemented by the process
/// that owns the ledger client and the bookies (standalone); must be cheap
/// enough to call per scrape and never block on I/O.
pub trait WritePathSource: Send + Sync + fmt::Debug {
    /// The current distributions (cumulative since start).
    fn stages(&self) -> Vec<StageLatency>;

    /// Counters and gauges of the parts below the broker (corrupt reads,
    /// bookie modes, disk usage). None by default.
    fn storage_metrics(&self) -> Vec<StorageMetric> {
        Vec::new()
    }
}

/// A metric family of the storage below the broker. A closed set: sources
/// choose values and instances, never names.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum StorageFamily {
    /// Counter: entries read back that failed their CRC or id check (the
    /// reader served them from another replica). Instance: `ledger-client`
    /// (checked by the client) or a bookie (checked by its storage).
    CorruptReads,
    /// Gauge: 1 for the bookie's current mode (label `mode`: `writable`,
    /// `read_only`, `failed`), 0 for the others.
    BookieMode,
    /// Gauge: used fraction of the filesystem of a bookie directory (label
    /// `dir`).
    BookieDiskUsage,
    /// Counter: times a bookie stopped taking adds (disk full or failing).
    BookieReadOnlyEntered,
    /// Counter: ensemble changes of the ledger client's writers (a bookie
    /// failed or turned read-only under a writer).
    EnsembleChanges,
}

impl StorageFamily {
    /// Every family, in export order.
    pub const ALL: [StorageFamily; 5] = [
        StorageFamily::CorruptReads,
        StorageFamily::BookieMode,
        StorageFamily::BookieDiskUsage,
        StorageFamily::BookieReadOnlyEntered,
        StorageFamily::EnsembleChanges,
    ];

    /// The Prometheus name.
    pub fn name(self) -> &'static str {
        match self {
            StorageFamily::CorruptReads => "vela_corrupt_reads_total",
            StorageFamily::BookieMode => "vela_bookie_mode",
            StorageFamily::BookieDiskUsage => "vela_bookie_disk_usage_ratio",
            StorageFamily::BookieReadOnlyEntered => "vela_bookie_read_only_entered_total",
            StorageFamily::EnsembleChanges => "vela_ledger_ensemble_changes_total",
        }
    }

    /// `counter` or `gauge`.
    pub fn kind(self) -> &'static str {
        match self {
            StorageFamily::CorruptReads
            | StorageFamily::BookieReadOnlyEntered
            | StorageFamily::EnsembleChanges => "counter",
            StorageFamily::BookieMode | StorageFamily::BookieDiskUsage => "gauge",
        }
    }

    /// The HELP line.
    pub fn help(self) -> &'static str {
        match self {
            StorageFamily::CorruptReads => {
                "Entries read back that failed their CRC or id check (served from another replica)."
            }
            StorageFamily::BookieMode => {
                "1 for the bookie's mode (writable, read_only: disk almost full, failed: a disk write failed), 0 for the others."
            }
            StorageFamily::BookieDiskUsage => {
                "Used fraction of the filesystem of a bookie directory."
            }
            StorageFamily::BookieReadOnlyEntered => {
                "Times a bookie stopped taking adds (disk full or failing)."
            }
            StorageFamily::EnsembleChanges => {
                "Bookies replaced under ledger writers (failed or read-only)."
            }
        }
    }
}

/// One sample of a storage family.
#[derive(Debug, Clone, PartialEq)]
pub struct StorageMetric {
    /// Which family.
    pub family: StorageFamily,
    /// Which instance (`ledger-client`, a bookie id).
    pub instance: String,
    /// One more label, for families that have one (`mode`, `dir`).
    pub label: Option<(&'static str, String)>,
    /// The value.
    pub value: f64,
}

/// Storage samples taken from one source per scrape: a few per bookie, and
/// a process runs at most a few dozen bookies. Beyond it the rest is dropped
/// (and logged) rather than letting a buggy source bloat every scrape.
pub const STORAGE_METRICS_PER_SOURCE_MAX: usize = 1024;

/// Sources registered on one broker. A process has one ledger client and a
/// handful of bookies; 64 bounds the list. When reached: registration fails.
pub const WRITE_PATH_SOURCES_MAX: usize = 64;

/// A publish on its way out: recorded by the connection's writer right after
/// the SEND_RECEIPT went into the socket, so the broker publish stage spans
/// everything the broker does for a SEND (socket read → socket write).
#[derive(Debug, Clone)]
pub(crate) struct PublishTiming {
    /// When the bytes holding the SEND were read from the socket.
    pub(crate) received: std::time::Instant,
    /// The topic's histograms.
    pub(crate) topic: std::sync::Arc<TopicMetrics>,
}

impl PublishTiming {
    /// Records the publish as complete at `written`, in the topic's and the
    /// broker-wide (`broker`) histograms.
    pub(crate) fn record(self, written: std::time::Instant, broker: &LatencyHistogram) {
        let latency = written.saturating_duration_since(self.received);
        broker.record(latency);
        self.topic.publish_latency.record(latency);
    }
}

/// Per-topic latencies.
#[derive(Debug, Default)]
pub(crate) struct TopicMetrics {
    /// SEND read from the socket → its receipt written (the topic's share of
    /// broker publish).
    pub(crate) publish_latency: TopicHistogram,
    /// Append issued → durable (Pulsar's storage write latency).
    pub(crate) storage_write_latency: TopicHistogram,
}

/// A topic's latency histogram, allocated at its first sample: a topic
/// that never published costs a pointer, not ~0.9 KiB (of a per-topic
/// fixed cost of a few KiB).
#[derive(Debug, Default)]
pub(crate) struct TopicHistogram(std::sync::OnceLock<Box<LatencyHistogram>>);

impl TopicHistogram {
    /// Records one latency.
    pub(crate) fn record(&self, latency: Duration) {
        self.0.get_or_init(Box::default).record(latency);
    }

    /// The counts now (empty before the first sample).
    pub(crate) fn snapshot(&self) -> LatencySnapshot {
        self.0
            .get()
            .map_or_else(LatencySnapshot::default, |histogram| histogram.snapshot())
    }
}

/// Broker-wide counters.
#[derive(Debug, Default)]
pub(crate) struct BrokerMetrics {
    pub(crate) publish_latency: LatencyHistogram,
    pub(crate) active_connections: AtomicU64,
    pub(crate) send_errors: AtomicU64,
}

/// A snapshot of the broker-wide counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BrokerMetricsSnapshot {
    /// SEND received → SEND_RECEIPT queued.
    pub publish_latency: LatencySnapshot,
    /// Open client connections.
    pub active_connections: u64,
    /// SEND_ERRORs sent (checksum, persistence failures).
    pub send_errors: u64,
}

impl BrokerMetrics {
    pub(crate) fn snapshot(&self) -> BrokerMetricsSnapshot {
        BrokerMetricsSnapshot {
            publish_latency: self.publish_latency.snapshot(),
            active_connections: self.active_connections.load(Ordering::Relaxed),
            send_errors: self.send_errors.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounds_increase_and_hold_pulsars() {
        assert!(LATENCY_BOUNDS_US.windows(2).all(|w| w[0] < w[1]));
        for (bound, _) in PULSAR_LATENCY_BUCKETS {
            assert!(LATENCY_BOUNDS_US.contains(&bound), "{bound}");
        }
        assert_eq!(LATENCY_BOUNDS_US[9], 10);
        assert_eq!(*LATENCY_BOUNDS_US.last().unwrap_or(&0), 100_000_000);
    }

    #[test]
    fn latencies_land_in_their_buckets() {
        let histogram = LatencyHistogram::default();
        histogram.record(Duration::from_micros(100));
        histogram.record(Duration::from_micros(500));
        histogram.record(Duration::from_millis(3));
        histogram.record(Duration::from_secs(500));
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count, 4);
        assert_eq!(snapshot.sum_us, 100 + 500 + 3_000 + 500_000_000);
        assert_eq!(snapshot.count_le(100), 1);
        assert_eq!(snapshot.count_le(500), 2);
        assert_eq!(snapshot.buckets[LATENCY_BUCKETS - 1], 1);
        assert_eq!(snapshot.pulsar_buckets(), [2, 0, 1, 0, 0, 0, 0, 0, 0, 1]);
    }

    #[test]
    fn quantile_one_bounds_the_slowest_sample_from_above() {
        let histogram = LatencyHistogram::default();
        for us in [40, 90, 93_500] {
            histogram.record(Duration::from_micros(us));
        }
        let max_bound = histogram.snapshot().quantile_us(1.0);
        let next_bound = LATENCY_BOUNDS_US[bucket_index(93_500)] as f64;
        assert!((93_500.0..=next_bound).contains(&max_bound), "{max_bound}");
    }

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let histogram = LatencyHistogram::default();
        for us in 1..=1000u64 {
            histogram.record(Duration::from_micros(us));
        }
        let snapshot = histogram.snapshot();
        for (q, expected) in [(0.5, 500.0), (0.99, 990.0), (0.999, 999.0)] {
            let got = snapshot.quantile_us(q);
            assert!(
                (got - expected).abs() <= expected * 0.13,
                "q{q}: {got} vs {expected}"
            );
        }
        assert!((snapshot.mean_us() - 500.5).abs() < 1e-9);
        let half = LatencySnapshot::from_values((1..=500u64).map(|us| (us, 1)));
        assert_eq!(snapshot.since(&half).count, 500);
        let mut merged = half;
        merged.merge(&half);
        assert_eq!(merged.count, 1000);
    }
}
