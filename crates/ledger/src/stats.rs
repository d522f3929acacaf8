//! Ledger client figures for metrics: the "ledger add" stage of the write path
//! (submit to quorum ack) and counts of the protocol's rare events.
//!
//! Owns: one add-latency histogram per `LedgerClient` (fixed size: 1 µs to
//! 60 s at 3 significant digits, ~50 KiB) and a few counters.
//! Never: allocates per sample or blocks (a short uncontended lock per
//! acknowledged add).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;

/// Longest latency the histogram holds; longer samples are clamped to it.
const LATENCY_US_MAX: u64 = 60_000_000;

/// Percentiles of one latency histogram, in µs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LatencySummary {
    /// Samples recorded.
    pub count: u64,
    /// Median.
    pub p50: u64,
    /// 99th percentile.
    pub p99: u64,
    /// 99.9th percentile.
    pub p999: u64,
    /// Largest sample.
    pub max: u64,
}

/// A snapshot of a client's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct LedgerStats {
    /// µs from `submit` to the add's acknowledgement (Qa acks and every
    /// earlier add acknowledged).
    pub add_us: LatencySummary,
    /// Ensemble changes recorded in ledger metadata.
    pub ensemble_changes: u64,
    /// Recoveries that closed a ledger (or found it closed by a racing one).
    pub recoveries: u64,
    /// Writers stopped because their ledger was fenced.
    pub writers_fenced: u64,
    /// Entries a bookie returned that failed their CRC or id check (read
    /// from another replica instead).
    pub corrupt_reads: u64,
    /// Entries copied to a replacement bookie by auto-recovery.
    pub entries_rereplicated: u64,
    /// Ledger segments whose lost bookie auto-recovery replaced.
    pub segments_rereplicated: u64,
    /// Adds a bookie answered TOO_MANY_REQUESTS (journal queue full, or
    /// write cache still full after the bookie's bounded wait for room);
    /// each is asked again of the same bookie until the add timeout.
    pub adds_overloaded: u64,
}

#[derive(Debug)]
pub(crate) struct Stats {
    add_us: Mutex<Histogram<u64>>,
    pub(crate) ensemble_changes: AtomicU64,
    pub(crate) recoveries: AtomicU64,
    pub(crate) writers_fenced: AtomicU64,
    pub(crate) corrupt_reads: AtomicU64,
    pub(crate) entries_rereplicated: AtomicU64,
    pub(crate) segments_rereplicated: AtomicU64,
    pub(crate) adds_overloaded: AtomicU64,
}

impl Stats {
    pub(crate) fn new() -> Stats {
        // Bounds are constants that hdrhistogram accepts; a failure here is a bug.
        let histogram = Histogram::new_with_bounds(1, LATENCY_US_MAX, 3)
            .unwrap_or_else(|e| panic!("add latency histogram: {e}"));
        Stats {
            add_us: Mutex::new(histogram),
            ensemble_changes: AtomicU64::new(0),
            recoveries: AtomicU64::new(0),
            writers_fenced: AtomicU64::new(0),
            corrupt_reads: AtomicU64::new(0),
            entries_rereplicated: AtomicU64::new(0),
            segments_rereplicated: AtomicU64::new(0),
            adds_overloaded: AtomicU64::new(0),
        }
    }

    pub(crate) fn record_add(&self, latency: Duration) {
        let us = (latency.as_micros() as u64).clamp(1, LATENCY_US_MAX);
        self.add_us.lock().saturating_record(us);
    }

    /// A copy of the add-latency histogram (µs), for exporters that need its
    /// whole distribution rather than a few percentiles.
    pub(crate) fn add_histogram(&self) -> Histogram<u64> {
        self.add_us.lock().clone()
    }

    pub(crate) fn snapshot(&self) -> LedgerStats {
        let add_us = {
            let h = self.add_us.lock();
            LatencySummary {
                count: h.len(),
                p50: h.value_at_quantile(0.5),
                p99: h.value_at_quantile(0.99),
                p999: h.value_at_quantile(0.999),
                max: h.max(),
            }
        };
        LedgerStats {
            add_us,
            ensemble_changes: self.ensemble_changes.load(Ordering::Relaxed),
            recoveries: self.recoveries.load(Ordering::Relaxed),
            writers_fenced: self.writers_fenced.load(Ordering::Relaxed),
            corrupt_reads: self.corrupt_reads.load(Ordering::Relaxed),
            entries_rereplicated: self.entries_rereplicated.load(Ordering::Relaxed),
            segments_rereplicated: self.segments_rereplicated.load(Ordering::Relaxed),
            adds_overloaded: self.adds_overloaded.load(Ordering::Relaxed),
        }
    }
}
