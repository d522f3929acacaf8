//! Broker-wide counters and the publish-latency histogram (receive of a SEND
//! → its SEND_RECEIPT queued for the socket), for `/metrics`.
//!
//! Owns: lock-free recording (relaxed atomics, one bucket increment per
//! receipt) and snapshots. Bucket bounds follow Pulsar's
//! `pulsar_storage_write_latency_le_*` buckets (ms): 0.5, 1, 5, 10, 20, 50,
//! 100, 200, 1000, overflow. Never: formats Prometheus text (the HTTP layer
//! does) or allocates on the hot path.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

/// Upper bounds of the latency buckets, in microseconds (the last bucket,
/// overflow, has none).
pub const LATENCY_BUCKET_BOUNDS_US: [u64; 9] = [
    500, 1_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000, 1_000_000,
];

/// Number of buckets (bounds + overflow).
pub const LATENCY_BUCKETS: usize = LATENCY_BUCKET_BOUNDS_US.len() + 1;

/// A fixed-bucket latency histogram.
#[derive(Debug, Default)]
pub(crate) struct LatencyHistogram {
    buckets: [AtomicU64; LATENCY_BUCKETS],
    sum_us: AtomicU64,
}

impl LatencyHistogram {
    pub(crate) fn record(&self, latency: Duration) {
        let us = u64::try_from(latency.as_micros()).unwrap_or(u64::MAX);
        let index = LATENCY_BUCKET_BOUNDS_US
            .iter()
            .position(|bound| us <= *bound)
            .unwrap_or(LATENCY_BUCKETS - 1);
        self.buckets[index].fetch_add(1, Ordering::Relaxed);
        self.sum_us.fetch_add(us, Ordering::Relaxed);
    }

    pub(crate) fn snapshot(&self) -> LatencySnapshot {
        let mut buckets = [0u64; LATENCY_BUCKETS];
        for (out, bucket) in buckets.iter_mut().zip(&self.buckets) {
            *out = bucket.load(Ordering::Relaxed);
        }
        LatencySnapshot {
            buckets,
            count: buckets.iter().sum(),
            sum_us: self.sum_us.load(Ordering::Relaxed),
        }
    }
}

/// A histogram snapshot: per-bucket counts (not cumulative), total count and
/// sum of latencies.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LatencySnapshot {
    /// Count per bucket; bucket `i` holds latencies ≤ `LATENCY_BUCKET_BOUNDS_US[i]`
    /// and above the previous bound; the last one is the overflow.
    pub buckets: [u64; LATENCY_BUCKETS],
    /// Number of recorded latencies.
    pub count: u64,
    /// Sum of recorded latencies in µs.
    pub sum_us: u64,
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
    fn latencies_land_in_their_buckets() {
        let histogram = LatencyHistogram::default();
        histogram.record(Duration::from_micros(100));
        histogram.record(Duration::from_micros(500));
        histogram.record(Duration::from_millis(3));
        histogram.record(Duration::from_secs(5));
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.buckets[0], 2);
        assert_eq!(snapshot.buckets[2], 1);
        assert_eq!(snapshot.buckets[LATENCY_BUCKETS - 1], 1);
        assert_eq!(snapshot.count, 4);
        assert_eq!(snapshot.sum_us, 100 + 500 + 3_000 + 5_000_000);
    }
}
