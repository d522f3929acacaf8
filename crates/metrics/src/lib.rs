//! vela-metrics: the one histogram every stage of the write path records
//! into (bookie add and journal stages, ledger add, broker publish and
//! storage write), its snapshot, and the one percentile summary read from
//! it (`/metrics`, `/admin/v2/vela/write-path`, `vela admin write-path`,
//! the bookie's and ledger client's stats).
//!
//! Owns: [`Histogram`] (lock-free recording: one bucket increment and one
//! sum addition, relaxed atomics, no allocation, no lock, no thread-local),
//! its plain-data [`Snapshot`] (counts per bucket, merged across instances
//! and subtracted between two scrapes) and [`Summary`] (count, mean,
//! p50/p99/p99.9 and a bound on the maximum); [`SparseHistogram`] (the same
//! buckets, counted in a few slots until more distinct buckets are hit:
//! for the per-topic histograms of topics that publish now and then).
//!
//! Buckets are log-linear: 1..9, then 14 steps per decade (1, 1.25, 1.5,
//! 1.75, 2, 2.5, 3, 3.5, 4, 5, 6, 7, 8, 9) from 10 to 9·10^7, then 10^8 and an
//! overflow bucket. In µs (latencies, [`Histogram::record`]) that is 1 µs to
//! 100 s, at most 25 % wide (quantiles are interpolated inside a bucket),
//! 109 buckets (~0.9 KiB per histogram); every bound of Pulsar's
//! `pulsar_storage_write_latency_le_*` buckets (0.5, 1, 5, 10, 20, 50, 100,
//! 200, 1000 ms) is a bucket bound, so those counts are exact. Counts and
//! sizes (entries or bytes per journal group) use the same buckets
//! ([`Histogram::record_value`]).
//!
//! Why a crate of its own: it sits below every crate that records (the
//! bookie depends on nothing of the broker's, and the wire, meta and tls
//! crates have other jobs), and it has no dependencies.
//! Never: formats Prometheus text or JSON (the broker does), or blocks.
//! Load generators (`vela perf`, benchmarks) keep HDR histograms: they
//! measure with three significant digits, which the A/B comparisons need,
//! and record off the write path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

mod sparse;
pub use sparse::{SPARSE_SLOTS, SparseHistogram};

/// Mantissas (×100) of the bounds in each decade from 10 on.
const DECADE_MANTISSAS: [u64; 14] = [
    100, 125, 150, 175, 200, 250, 300, 350, 400, 500, 600, 700, 800, 900,
];
/// Decades from 10: 10, 100, ..., 10^7 (10 µs .. 90 s for latencies).
const DECADES: usize = 7;
/// Number of bucket upper bounds: 1..9, the decades, and 10^8.
pub const BOUNDS: usize = 9 + DECADES * DECADE_MANTISSAS.len() + 1;
/// Number of buckets (bounds + overflow).
pub const BUCKETS: usize = BOUNDS + 1;

const fn bucket_bounds() -> [u64; BOUNDS] {
    let mut out = [0u64; BOUNDS];
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

/// Upper bounds of the buckets (inclusive; µs for latencies), increasing;
/// the last bucket (overflow) has none.
pub const BUCKET_BOUNDS: [u64; BOUNDS] = bucket_bounds();

fn bucket_index(value: u64) -> usize {
    BUCKET_BOUNDS.partition_point(|bound| *bound < value)
}

/// A histogram over [`BUCKET_BOUNDS`]; share it by reference or `Arc`.
#[derive(Debug)]
pub struct Histogram {
    buckets: [AtomicU64; BUCKETS],
    sum: AtomicU64,
}

impl Default for Histogram {
    fn default() -> Self {
        Histogram {
            buckets: std::array::from_fn(|_| AtomicU64::new(0)),
            sum: AtomicU64::new(0),
        }
    }
}

impl Histogram {
    /// Records one latency, in µs.
    pub fn record(&self, latency: Duration) {
        self.record_value(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
    }

    /// Records one value (µs, or a count or size).
    pub fn record_value(&self, value: u64) {
        self.buckets[bucket_index(value)].fetch_add(1, Ordering::Relaxed);
        self.sum.fetch_add(value, Ordering::Relaxed);
    }

    /// Counts one sample in bucket `index` without its value
    /// (`SparseHistogram` keeps the sum).
    fn count_in_bucket(&self, index: usize) {
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
    }

    /// The counts now.
    pub fn snapshot(&self) -> Snapshot {
        let mut buckets = [0u64; BUCKETS];
        for (out, bucket) in buckets.iter_mut().zip(&self.buckets) {
            *out = bucket.load(Ordering::Relaxed);
        }
        Snapshot {
            count: buckets.iter().sum(),
            buckets,
            sum: self.sum.load(Ordering::Relaxed),
        }
    }
}

/// A histogram's counts: per bucket (not cumulative), total and sum. Counts
/// only grow, so two snapshots subtract into the distribution of the
/// samples in between, and snapshots of one stage on several instances add
/// up.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Count per bucket; bucket `i` holds values ≤ `BUCKET_BOUNDS[i]` and
    /// above the previous bound; the last one is the overflow.
    pub buckets: [u64; BUCKETS],
    /// Number of samples.
    pub count: u64,
    /// Sum of the samples (µs for latencies).
    pub sum: u64,
}

impl Default for Snapshot {
    fn default() -> Self {
        Snapshot {
            buckets: [0; BUCKETS],
            count: 0,
            sum: 0,
        }
    }
}

impl Snapshot {
    /// Adds another snapshot's samples (e.g. the same stage on two bookies).
    pub fn merge(&mut self, other: &Snapshot) {
        for (mine, theirs) in self.buckets.iter_mut().zip(&other.buckets) {
            *mine += theirs;
        }
        self.count += other.count;
        self.sum = self.sum.saturating_add(other.sum);
    }

    /// Samples added since `earlier` (a snapshot of the same histogram).
    pub fn since(&self, earlier: &Snapshot) -> Snapshot {
        let mut out = Snapshot::default();
        for (i, bucket) in out.buckets.iter_mut().enumerate() {
            *bucket = self.buckets[i].saturating_sub(earlier.buckets[i]);
        }
        out.count = self.count.saturating_sub(earlier.count);
        out.sum = self.sum.saturating_sub(earlier.sum);
        out
    }

    /// Mean (0 without samples).
    pub fn mean(&self) -> f64 {
        if self.count == 0 {
            0.0
        } else {
            self.sum as f64 / self.count as f64
        }
    }

    /// The `quantile` (0..=1), interpolated linearly inside its bucket (0
    /// without samples; the overflow bucket answers its lower bound).
    /// `quantile(1.0)` is the upper bound of the highest non-empty bucket:
    /// the largest sample was at most that.
    pub fn quantile(&self, quantile: f64) -> f64 {
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
                let lower = if i == 0 { 0 } else { BUCKET_BOUNDS[i - 1] } as f64;
                let Some(upper) = BUCKET_BOUNDS.get(i) else {
                    return lower;
                };
                let fraction = (rank - below as f64) / *count as f64;
                return lower + (*upper as f64 - lower) * fraction;
            }
            below += count;
        }
        BUCKET_BOUNDS[BOUNDS - 1] as f64
    }

    /// Samples ≤ `bound`; exact when `bound` is one of [`BUCKET_BOUNDS`],
    /// else counted up to the nearest bound below.
    pub fn count_le(&self, bound: u64) -> u64 {
        let last = BUCKET_BOUNDS.partition_point(|b| *b <= bound);
        self.buckets[..last].iter().sum()
    }

    /// Count, mean and percentiles.
    pub fn summary(&self) -> Summary {
        Summary {
            count: self.count,
            mean: self.mean(),
            p50: self.quantile(0.5),
            p99: self.quantile(0.99),
            p999: self.quantile(0.999),
            max: self.quantile(1.0),
        }
    }
}

/// Percentiles of one histogram, in its unit (µs for latencies), all zero
/// without samples.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Summary {
    /// Samples recorded.
    pub count: u64,
    /// Mean.
    pub mean: f64,
    /// Median.
    pub p50: f64,
    /// 99th percentile.
    pub p99: f64,
    /// 99.9th percentile.
    pub p999: f64,
    /// Upper bound of the largest sample (its bucket's bound).
    pub max: f64,
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bounds_increase_from_one_to_a_hundred_million() {
        assert!(BUCKET_BOUNDS.windows(2).all(|w| w[0] < w[1]));
        assert_eq!(BUCKET_BOUNDS[0], 1);
        assert_eq!(BUCKET_BOUNDS[9], 10);
        assert_eq!(*BUCKET_BOUNDS.last().unwrap_or(&0), 100_000_000);
        // At most 25 % wide from 10 on (1..9 are exact).
        assert!(
            BUCKET_BOUNDS[9..]
                .windows(2)
                .all(|w| w[1] * 100 <= w[0] * 125)
        );
    }

    #[test]
    fn latencies_land_in_their_buckets() {
        let histogram = Histogram::default();
        histogram.record(Duration::from_micros(100));
        histogram.record(Duration::from_micros(500));
        histogram.record(Duration::from_millis(3));
        histogram.record(Duration::from_secs(500));
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count, 4);
        assert_eq!(snapshot.sum, 100 + 500 + 3_000 + 500_000_000);
        assert_eq!(snapshot.count_le(100), 1);
        assert_eq!(snapshot.count_le(500), 2);
        assert_eq!(snapshot.buckets[BUCKETS - 1], 1);
    }

    #[test]
    fn quantile_one_bounds_the_slowest_sample_from_above() {
        let histogram = Histogram::default();
        for us in [40, 90, 93_500] {
            histogram.record(Duration::from_micros(us));
        }
        let max_bound = histogram.snapshot().quantile(1.0);
        let next_bound = BUCKET_BOUNDS[bucket_index(93_500)] as f64;
        assert!((93_500.0..=next_bound).contains(&max_bound), "{max_bound}");
    }

    #[test]
    fn quantiles_interpolate_inside_buckets() {
        let histogram = Histogram::default();
        let half = Histogram::default();
        for us in 1..=1000u64 {
            histogram.record(Duration::from_micros(us));
            if us <= 500 {
                half.record_value(us);
            }
        }
        let snapshot = histogram.snapshot();
        for (q, expected) in [(0.5, 500.0), (0.99, 990.0), (0.999, 999.0)] {
            let got = snapshot.quantile(q);
            assert!(
                (got - expected).abs() <= expected * 0.13,
                "q{q}: {got} vs {expected}"
            );
        }
        assert!((snapshot.mean() - 500.5).abs() < 1e-9);
        let half = half.snapshot();
        assert_eq!(snapshot.since(&half).count, 500);
        let mut merged = half;
        merged.merge(&half);
        assert_eq!(merged.count, 1000);
    }

    #[test]
    fn a_summary_reads_the_snapshot_and_is_zero_when_empty() {
        assert_eq!(
            Histogram::default().snapshot().summary(),
            Summary::default()
        );
        let histogram = Histogram::default();
        for value in [1, 2, 3, 4] {
            histogram.record_value(value);
        }
        let summary = histogram.snapshot().summary();
        assert_eq!(summary.count, 4);
        assert!((summary.mean - 2.5).abs() < 1e-9);
        assert!((summary.p50 - 2.0).abs() < 1e-9, "{summary:?}");
        assert!((summary.max - 4.0).abs() < 1e-9, "{summary:?}");
    }
}
