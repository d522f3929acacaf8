//! Latency and size histograms per journal stage, recorded once per group by the
//! thread that runs the stage (each thread owns one mutex, taken once per group),
//! read by `Journal::stats`.

use std::sync::Mutex;
use std::time::Duration;

use hdrhistogram::Histogram;

/// Percentiles of one stage. Latencies in microseconds, sizes in their unit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageSummary {
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

/// A snapshot of the journal's stage histograms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalStats {
    /// µs the oldest record of each group waited in the queue before the writer
    /// took it.
    pub queue_wait_us: StageSummary,
    /// µs per group write (pwrite of the aligned block).
    pub write_us: StageSummary,
    /// µs per fdatasync (one per batch of groups).
    pub fdatasync_us: StageSummary,
    /// µs from the oldest record's append to its callback, per group.
    pub append_to_done_us: StageSummary,
    /// Records per group.
    pub group_entries: StageSummary,
    /// Encoded bytes per group (padding included).
    pub group_bytes: StageSummary,
    /// Groups per fdatasync.
    pub groups_per_sync: StageSummary,
    /// Groups that waited for a zero-fill step in progress.
    pub prealloc_waits: u64,
    /// Groups written into space not zero-filled yet (the writer outran the
    /// preallocator; their fdatasync also commits allocation metadata).
    pub unfilled_writes: u64,
    /// Times (about every 10 ms) the pmem backend found its ring full and
    /// waited for a checkpoint to free a slot.
    pub ring_full_waits: u64,
}

/// Whole latency distributions (µs) of the journal stages since it opened,
/// for metrics exporters. One sample per group (queue wait of its oldest
/// record, its write) or per fdatasync.
#[derive(Debug, Clone)]
pub struct JournalHistograms {
    /// Queue wait of each group's oldest record.
    pub queue_wait_us: Histogram<u64>,
    /// Write of each group.
    pub write_us: Histogram<u64>,
    /// Each fdatasync.
    pub fdatasync_us: Histogram<u64>,
}

fn new_histogram() -> Histogram<u64> {
    // 1 .. 1 hour in µs (or bytes up to 3.6 GB), 3 significant digits.
    #[allow(clippy::unwrap_used)] // constant, valid bounds
    Histogram::new_with_bounds(1, 3_600_000_000, 3).unwrap()
}

fn summary(h: &Histogram<u64>) -> StageSummary {
    if h.is_empty() {
        return StageSummary::default();
    }
    StageSummary {
        count: h.len(),
        p50: h.value_at_quantile(0.50),
        p99: h.value_at_quantile(0.99),
        p999: h.value_at_quantile(0.999),
        max: h.max(),
    }
}

fn record(h: &mut Histogram<u64>, value: u64) {
    // saturating_record clamps to the bounds instead of failing.
    h.saturating_record(value.max(1));
}

pub(crate) fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX)
}

#[derive(Debug)]
pub(crate) struct WriterHistograms {
    queue_wait_us: Histogram<u64>,
    write_us: Histogram<u64>,
    group_entries: Histogram<u64>,
    group_bytes: Histogram<u64>,
    prealloc_waits: u64,
    unfilled_writes: u64,
    ring_full_waits: u64,
}

/// A full pmem ring is logged once waits add up to about a second (a brief
/// wait while a checkpoint runs is normal for a small ring) and then about
/// every 10 s of waiting: waits are ~10 ms each.
const RING_FULL_WAITS_PER_LOG: u64 = 1000;
const RING_FULL_WAITS_FIRST_LOG: u64 = 100;

#[derive(Debug)]
pub(crate) struct SyncHistograms {
    fdatasync_us: Histogram<u64>,
    append_to_done_us: Histogram<u64>,
    groups_per_sync: Histogram<u64>,
}

/// Shared histogram state.
#[derive(Debug)]
pub(crate) struct StatsCell {
    writer: Mutex<WriterHistograms>,
    sync: Mutex<SyncHistograms>,
}

impl StatsCell {
    pub(crate) fn new() -> StatsCell {
        StatsCell {
            writer: Mutex::new(WriterHistograms {
                queue_wait_us: new_histogram(),
                write_us: new_histogram(),
                group_entries: new_histogram(),
                group_bytes: new_histogram(),
                prealloc_waits: 0,
                unfilled_writes: 0,
                ring_full_waits: 0,
            }),
            sync: Mutex::new(SyncHistograms {
                fdatasync_us: new_histogram(),
                append_to_done_us: new_histogram(),
                groups_per_sync: new_histogram(),
            }),
        }
    }

    pub(crate) fn record_group(
        &self,
        queue_wait: Duration,
        write: Duration,
        entries: usize,
        bytes: usize,
    ) {
        if let Ok(mut w) = self.writer.lock() {
            record(&mut w.queue_wait_us, micros(queue_wait));
            record(&mut w.write_us, micros(write));
            record(&mut w.group_entries, entries as u64);
            record(&mut w.group_bytes, bytes as u64);
        }
    }

    pub(crate) fn record_prealloc_wait(&self) {
        if let Ok(mut w) = self.writer.lock() {
            w.prealloc_waits += 1;
        }
    }

    /// Counts a wait for a free pmem slot; whether to log this one.
    pub(crate) fn record_ring_full_wait(&self) -> bool {
        match self.writer.lock() {
            Ok(mut w) => {
                w.ring_full_waits += 1;
                w.ring_full_waits % RING_FULL_WAITS_PER_LOG == RING_FULL_WAITS_FIRST_LOG
            }
            Err(_) => false,
        }
    }

    pub(crate) fn record_unfilled_write(&self) {
        if let Ok(mut w) = self.writer.lock() {
            w.unfilled_writes += 1;
        }
    }

    pub(crate) fn record_sync(&self, fdatasync: Option<Duration>, groups: usize) {
        if let Ok(mut s) = self.sync.lock() {
            if let Some(d) = fdatasync {
                record(&mut s.fdatasync_us, micros(d));
            }
            record(&mut s.groups_per_sync, groups as u64);
        }
    }

    pub(crate) fn record_done(&self, oldest_append_to_done: Duration) {
        if let Ok(mut s) = self.sync.lock() {
            record(&mut s.append_to_done_us, micros(oldest_append_to_done));
        }
    }

    /// Copies of the stage latency histograms (µs): queue wait, write, fdatasync.
    pub(crate) fn latency_histograms(&self) -> JournalHistograms {
        let empty = new_histogram();
        let (queue_wait_us, write_us) = match self.writer.lock() {
            Ok(w) => (w.queue_wait_us.clone(), w.write_us.clone()),
            Err(_) => (empty.clone(), empty.clone()),
        };
        let fdatasync_us = match self.sync.lock() {
            Ok(s) => s.fdatasync_us.clone(),
            Err(_) => empty,
        };
        JournalHistograms {
            queue_wait_us,
            write_us,
            fdatasync_us,
        }
    }

    pub(crate) fn snapshot(&self) -> JournalStats {
        let mut out = JournalStats::default();
        if let Ok(w) = self.writer.lock() {
            out.queue_wait_us = summary(&w.queue_wait_us);
            out.write_us = summary(&w.write_us);
            out.group_entries = summary(&w.group_entries);
            out.group_bytes = summary(&w.group_bytes);
            out.prealloc_waits = w.prealloc_waits;
            out.unfilled_writes = w.unfilled_writes;
            out.ring_full_waits = w.ring_full_waits;
        }
        if let Ok(s) = self.sync.lock() {
            out.fdatasync_us = summary(&s.fdatasync_us);
            out.append_to_done_us = summary(&s.append_to_done_us);
            out.groups_per_sync = summary(&s.groups_per_sync);
        }
        out
    }
}
