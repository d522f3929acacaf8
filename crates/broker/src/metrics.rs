//! Write-path and read-path stages and broker-wide counters, for `/metrics`,
//! `vela admin write-path` and `vela admin read-path`.
//!
//! Owns: the write-path and read-path [`Stage`] names, the per-topic and broker-wide
//! histograms (`vela_metrics::Histogram`, the one histogram every stage
//! records into), Pulsar's `pulsar_storage_write_latency_le_*` buckets read
//! from a snapshot ([`pulsar_buckets`]), and the [`WritePathSource`] seam
//! through which the process that wires the broker (standalone) hands in the
//! stages below the broker (ledger add, bookie add, journal stages), so this
//! crate never depends on the ledger client or the bookie.
//! Never: formats Prometheus text (the `prometheus` module does) or blocks.

use std::fmt;
use std::sync::atomic::{AtomicU64, Ordering};

use vela_metrics::{Histogram, Snapshot, SparseHistogram};

/// Pulsar's `pulsar_storage_write_latency_le_*` bucket bounds (µs) and the
/// metric-name suffix of each; the overflow bucket is `overflow`. Each is a
/// bound of `vela_metrics::BUCKET_BOUNDS`, so the counts are exact.
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

/// Counts of Pulsar's `le_*` buckets of a latency snapshot (µs), not
/// cumulative, overflow last.
pub fn pulsar_buckets(latency: &Snapshot) -> [u64; PULSAR_LATENCY_BUCKETS.len() + 1] {
    let mut out = [0u64; PULSAR_LATENCY_BUCKETS.len() + 1];
    let mut below = 0u64;
    for (i, (bound, _)) in PULSAR_LATENCY_BUCKETS.iter().enumerate() {
        let up_to = latency.count_le(*bound);
        out[i] = up_to - below;
        below = up_to;
    }
    out[PULSAR_LATENCY_BUCKETS.len()] = latency.count - below;
    out
}

/// A stage of the write path or the read path, outermost first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Stage {
    /// Broker: SEND read from the socket → SEND_RECEIPT written to it.
    BrokerPublish,
    /// Broker, first part of `BrokerPublish`: SEND arrived → its append
    /// issued to the log (time in the socket's receive queue, the
    /// connection reader's turn, the connection's and the broker's budgets).
    BrokerIssue,
    /// Broker, second part of `BrokerPublish`: append issued → durable (its
    /// completion told the producer's receipts).
    BrokerAppend,
    /// Broker, last part of `BrokerPublish`: append durable → its
    /// SEND_RECEIPT written to the socket (receipts before it in SEND order,
    /// the connection writer's turn and write).
    BrokerReceipt,
    /// Ledger client: add submitted → acknowledged by Qa bookies in order.
    LedgerAdd,
    /// Ledger client, first part of `LedgerAdd`: add submitted → taken by
    /// its ledger's writer task (the wait for that task's turn on a worker).
    LedgerAddWait,
    /// Bookie: add received → durable completion.
    BookieAdd,
    /// Journal: queue wait of each group's oldest record.
    JournalQueueWait,
    /// Journal: the write of each group.
    JournalWrite,
    /// Journal: each fdatasync.
    JournalFdatasync,
    /// Read path, broker: consumers had permits and the subscription had
    /// nothing to send until a log read answered (one sample per wait; with
    /// the read-ahead kept in flight most waits are none at all).
    DispatcherReadWait,
    /// Read path, broker: one subscription read of the log (issued →
    /// entries in hand, tail cache or ledgers).
    DispatcherRead,
    /// Read path, ledger client: one entry read (request → verified answer).
    LedgerRead,
    /// Read path, bookie: an entry read served from memory (write cache or
    /// read cache).
    BookieReadCache,
    /// Read path, bookie: an entry read served from an entry log (index
    /// lookup, `pread` with read-ahead, CRC check).
    BookieReadLog,
}

impl Stage {
    /// Every write-path stage, outermost first.
    pub const WRITE_PATH: [Stage; 10] = [
        Stage::BrokerPublish,
        Stage::BrokerIssue,
        Stage::BrokerAppend,
        Stage::BrokerReceipt,
        Stage::LedgerAdd,
        Stage::LedgerAddWait,
        Stage::BookieAdd,
        Stage::JournalQueueWait,
        Stage::JournalWrite,
        Stage::JournalFdatasync,
    ];

    /// Every read-path stage, outermost first.
    pub const READ_PATH: [Stage; 5] = [
        Stage::DispatcherReadWait,
        Stage::DispatcherRead,
        Stage::LedgerRead,
        Stage::BookieReadCache,
        Stage::BookieReadLog,
    ];

    /// Whether the stage belongs to the read path.
    pub fn is_read(self) -> bool {
        Stage::READ_PATH.contains(&self)
    }

    /// The `stage` label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Stage::BrokerPublish => "broker_publish",
            Stage::BrokerIssue => "broker_issue",
            Stage::BrokerAppend => "broker_append",
            Stage::BrokerReceipt => "broker_receipt",
            Stage::LedgerAdd => "ledger_add",
            Stage::LedgerAddWait => "ledger_add_wait",
            Stage::BookieAdd => "bookie_add",
            Stage::JournalQueueWait => "journal_queue_wait",
            Stage::JournalWrite => "journal_write",
            Stage::JournalFdatasync => "journal_fdatasync",
            Stage::DispatcherReadWait => "dispatcher_read_wait",
            Stage::DispatcherRead => "dispatcher_read",
            Stage::LedgerRead => "ledger_read",
            Stage::BookieReadCache => "bookie_read_cache",
            Stage::BookieReadLog => "bookie_read_log",
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
    pub latency: Snapshot,
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
    /// Counter: payload bytes read at a read-path stage (label `stage`:
    /// `ledger_read`, `bookie_read_cache`, `bookie_read_log`, or
    /// `bookie_read_log_io` for the bytes `pread` from entry logs, read-ahead
    /// included).
    ReadBytes,
    /// Gauge: bytes the subscriptions hold read ahead, against
    /// `BrokerConfig::read_ahead_bytes_max` (label `max`: the budget).
    ReadAheadBytes,
    /// Gauge: bytes in a bookie's write cache, both halves (label `max`:
    /// its budget, `--write-cache-mb`).
    BookieWriteCacheBytes,
    /// Gauge: bytes in a bookie's read cache (label `max`: its budget,
    /// `--read-cache-mb`).
    BookieReadCacheBytes,
}

impl StorageFamily {
    /// Every family, in export order.
    pub const ALL: [StorageFamily; 9] = [
        StorageFamily::CorruptReads,
        StorageFamily::BookieMode,
        StorageFamily::BookieDiskUsage,
        StorageFamily::BookieReadOnlyEntered,
        StorageFamily::EnsembleChanges,
        StorageFamily::ReadBytes,
        StorageFamily::ReadAheadBytes,
        StorageFamily::BookieWriteCacheBytes,
        StorageFamily::BookieReadCacheBytes,
    ];

    /// The Prometheus name.
    pub fn name(self) -> &'static str {
        match self {
            StorageFamily::CorruptReads => "vela_corrupt_reads_total",
            StorageFamily::BookieMode => "vela_bookie_mode",
            StorageFamily::BookieDiskUsage => "vela_bookie_disk_usage_ratio",
            StorageFamily::BookieReadOnlyEntered => "vela_bookie_read_only_entered_total",
            StorageFamily::EnsembleChanges => "vela_ledger_ensemble_changes_total",
            StorageFamily::ReadBytes => "vela_read_path_bytes_total",
            StorageFamily::ReadAheadBytes => "vela_read_ahead_bytes",
            StorageFamily::BookieWriteCacheBytes => "vela_bookie_write_cache_bytes",
            StorageFamily::BookieReadCacheBytes => "vela_bookie_read_cache_bytes",
        }
    }

    /// `counter` or `gauge`.
    pub fn kind(self) -> &'static str {
        match self {
            StorageFamily::CorruptReads
            | StorageFamily::BookieReadOnlyEntered
            | StorageFamily::EnsembleChanges
            | StorageFamily::ReadBytes => "counter",
            StorageFamily::BookieMode
            | StorageFamily::BookieDiskUsage
            | StorageFamily::ReadAheadBytes
            | StorageFamily::BookieWriteCacheBytes
            | StorageFamily::BookieReadCacheBytes => "gauge",
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
            StorageFamily::ReadBytes => "Payload bytes read at each read-path stage.",
            StorageFamily::ReadAheadBytes => {
                "Bytes the subscriptions hold read ahead of their consumers (label max: the budget)."
            }
            StorageFamily::BookieWriteCacheBytes => {
                "Bytes in a bookie's write cache, not yet flushed to entry logs (label max: the budget)."
            }
            StorageFamily::BookieReadCacheBytes => {
                "Bytes in a bookie's read cache of entry-log segments (label max: the budget)."
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
    /// When its append was known durable (`Stage::BrokerReceipt` starts).
    pub(crate) durable: std::time::Instant,
    /// The topic's histograms.
    pub(crate) topic: std::sync::Arc<TopicMetrics>,
}

impl PublishTiming {
    /// Records the publish as complete at `written`, in the topic's and the
    /// broker-wide histograms (publish and receipt stages).
    pub(crate) fn record(self, written: std::time::Instant, broker: &BrokerMetrics) {
        let latency = written.saturating_duration_since(self.received);
        broker.publish_latency.record(latency);
        broker
            .receipt_latency
            .record(written.saturating_duration_since(self.durable));
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

/// A topic's latency histogram, allocated at its first sample (a topic
/// that never published costs a pointer) and sparse until it sees many
/// distinct latencies (`vela_metrics::SparseHistogram`: ~130 bytes, where
/// a full histogram is ~0.9 KiB, of a per-topic fixed cost of a few KiB).
#[derive(Debug, Default)]
pub(crate) struct TopicHistogram(std::sync::OnceLock<Box<SparseHistogram>>);

impl TopicHistogram {
    /// Records one latency.
    pub(crate) fn record(&self, latency: std::time::Duration) {
        self.0.get_or_init(Box::default).record(latency);
    }

    /// The counts now (empty before the first sample).
    pub(crate) fn snapshot(&self) -> Snapshot {
        self.0
            .get()
            .map_or_else(Snapshot::default, |histogram| histogram.snapshot())
    }
}

/// Broker-wide counters.
#[derive(Debug, Default)]
pub(crate) struct BrokerMetrics {
    pub(crate) publish_latency: Histogram,
    /// `Stage::BrokerIssue`.
    pub(crate) issue_latency: Histogram,
    /// `Stage::BrokerAppend`.
    pub(crate) append_latency: Histogram,
    /// `Stage::BrokerReceipt`.
    pub(crate) receipt_latency: Histogram,
    pub(crate) active_connections: AtomicU64,
    pub(crate) send_errors: AtomicU64,
    /// The subscriptions' read stages (shared by every dispatcher).
    pub(crate) reads: std::sync::Arc<ReadMetrics>,
}

/// The broker's read-path stages, recorded by every subscription task.
#[derive(Debug, Default)]
pub(crate) struct ReadMetrics {
    /// `Stage::DispatcherReadWait`.
    pub(crate) read_wait: Histogram,
    /// `Stage::DispatcherRead`.
    pub(crate) read: Histogram,
    /// Payload bytes the subscriptions read from their logs.
    pub(crate) read_bytes: AtomicU64,
}

/// A snapshot of the broker-wide counters.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BrokerMetricsSnapshot {
    /// SEND received → SEND_RECEIPT queued.
    pub publish_latency: Snapshot,
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
    use std::time::Duration;

    use super::*;

    #[test]
    fn bounds_hold_pulsars() {
        for (bound, _) in PULSAR_LATENCY_BUCKETS {
            assert!(vela_metrics::BUCKET_BOUNDS.contains(&bound), "{bound}");
        }
    }

    #[test]
    fn latencies_land_in_pulsars_buckets() {
        let histogram = Histogram::default();
        for latency in [100, 500, 3_000, 500_000_000].map(Duration::from_micros) {
            histogram.record(latency);
        }
        let snapshot = histogram.snapshot();
        assert_eq!(snapshot.count, 4);
        assert_eq!(pulsar_buckets(&snapshot), [2, 0, 1, 0, 0, 0, 0, 0, 0, 1]);
    }
}
