//! Ledger client figures for metrics: the "ledger add" stage of the write path
//! (submit to quorum ack) and counts of the protocol's rare events.
//!
//! Owns: one add-latency histogram per `LedgerClient` (`vela_metrics`: the
//! histogram every write-path stage records into) and a few counters.
//! Never: allocates per sample, locks or blocks (relaxed atomic adds).

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vela_metrics::{Histogram, Snapshot, Summary};

/// A snapshot of a client's figures.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct LedgerStats {
    /// µs from `submit` to the add's acknowledgement (Qa acks and every
    /// earlier add acknowledged).
    pub add_us: Summary,
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
    add_us: Histogram,
    /// The first part of `add_us`: submit → taken by the ledger's writer
    /// task (that task's wait for a worker).
    add_wait_us: Histogram,
    /// Entry reads: request → verified answer (the read path's ledger stage).
    read_us: Histogram,
    /// Payload bytes of the entries read.
    pub(crate) read_bytes: AtomicU64,
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
        Stats {
            add_us: Histogram::default(),
            add_wait_us: Histogram::default(),
            read_us: Histogram::default(),
            read_bytes: AtomicU64::new(0),
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
        self.add_us.record(latency);
    }

    /// The add-latency distribution (µs).
    pub(crate) fn add_latency(&self) -> Snapshot {
        self.add_us.snapshot()
    }

    pub(crate) fn record_add_wait(&self, latency: Duration) {
        self.add_wait_us.record(latency);
    }

    /// Submit → taken by the writer task (µs).
    pub(crate) fn add_wait_latency(&self) -> Snapshot {
        self.add_wait_us.snapshot()
    }

    pub(crate) fn record_read(&self, latency: Duration, payload_bytes: usize) {
        self.read_us.record(latency);
        self.read_bytes
            .fetch_add(payload_bytes as u64, Ordering::Relaxed);
    }

    /// The entry-read latency distribution (µs).
    pub(crate) fn read_latency(&self) -> Snapshot {
        self.read_us.snapshot()
    }

    pub(crate) fn snapshot(&self) -> LedgerStats {
        LedgerStats {
            add_us: self.add_us.snapshot().summary(),
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
