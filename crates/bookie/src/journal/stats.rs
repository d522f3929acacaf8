//! Latency and size histograms per journal stage, recorded once per group by the
//! thread that runs the stage (relaxed atomic adds: no lock, no allocation),
//! read by `Journal::stats` and `Journal::latency_histograms`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use vela_metrics::{Histogram, Snapshot, Summary};

/// A snapshot of the journal's stage histograms (latencies in µs, sizes in
/// their unit).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct JournalStats {
    /// µs the oldest record of each group waited in the queue before the writer
    /// took it.
    pub queue_wait_us: Summary,
    /// µs per group write (pwrite of the aligned block).
    pub write_us: Summary,
    /// µs per fdatasync (one per batch of groups).
    pub fdatasync_us: Summary,
    /// µs from the oldest record's append to its callback, per group.
    pub append_to_done_us: Summary,
    /// Records per group.
    pub group_entries: Summary,
    /// Encoded bytes per group (padding included).
    pub group_bytes: Summary,
    /// Groups per fdatasync.
    pub groups_per_sync: Summary,
    /// Groups that waited for a zero-fill step in progress.
    pub prealloc_waits: u64,
    /// Groups written into space not zero-filled yet (the writer outran the
    /// preallocator; their fdatasync also commits allocation metadata).
    pub unfilled_writes: u64,
    /// Waits of the writer for a free slot of a full pmem ring.
    pub ring_full_waits: u64,
    /// Journal threads (writer, force-write) running at I/O priority class
    /// realtime: 2 when `JournalConfig::realtime_io` is on and the kernel
    /// allowed it, once both threads started.
    pub realtime_io_threads: u64,
}

/// Whole latency distributions (µs) of the journal stages since it opened,
/// for metrics exporters. One sample per group (queue wait of its oldest
/// record, its write) or per fdatasync.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct JournalHistograms {
    /// Queue wait of each group's oldest record.
    pub queue_wait_us: Snapshot,
    /// Write of each group.
    pub write_us: Snapshot,
    /// Each fdatasync.
    pub fdatasync_us: Snapshot,
}

impl JournalHistograms {
    /// Adds another journal's samples (an engine closed since).
    pub fn merge(&mut self, other: &JournalHistograms) {
        self.queue_wait_us.merge(&other.queue_wait_us);
        self.write_us.merge(&other.write_us);
        self.fdatasync_us.merge(&other.fdatasync_us);
    }
}

/// A full pmem ring is logged once waits add up to about a second (a brief
/// wait while a checkpoint runs is normal for a small ring) and then about
/// every 10 s of waiting: waits are ~10 ms each.
const RING_FULL_WAITS_PER_LOG: u64 = 1000;
const RING_FULL_WAITS_FIRST_LOG: u64 = 100;

/// The journal's histograms and counters, shared by its threads.
#[derive(Debug, Default)]
pub(crate) struct StatsCell {
    // Recorded by the writer thread.
    queue_wait_us: Histogram,
    write_us: Histogram,
    group_entries: Histogram,
    group_bytes: Histogram,
    prealloc_waits: AtomicU64,
    unfilled_writes: AtomicU64,
    ring_full_waits: AtomicU64,
    // Recorded by the writer and force-write threads as they start.
    realtime_io_threads: AtomicU64,
    // Recorded by the force-write thread.
    fdatasync_us: Histogram,
    append_to_done_us: Histogram,
    groups_per_sync: Histogram,
}

impl StatsCell {
    pub(crate) fn new() -> StatsCell {
        StatsCell::default()
    }

    pub(crate) fn record_group(
        &self,
        queue_wait: Duration,
        write: Duration,
        entries: usize,
        bytes: usize,
    ) {
        self.queue_wait_us.record(queue_wait);
        self.write_us.record(write);
        self.group_entries.record_value(entries as u64);
        self.group_bytes.record_value(bytes as u64);
    }

    pub(crate) fn record_prealloc_wait(&self) {
        self.prealloc_waits.fetch_add(1, Ordering::Relaxed);
    }

    /// Counts a wait for a free pmem slot; whether to log this one.
    pub(crate) fn record_ring_full_wait(&self) -> bool {
        let waits = self.ring_full_waits.fetch_add(1, Ordering::Relaxed) + 1;
        waits % RING_FULL_WAITS_PER_LOG == RING_FULL_WAITS_FIRST_LOG
    }

    pub(crate) fn record_realtime_io_thread(&self) {
        self.realtime_io_threads.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_unfilled_write(&self) {
        self.unfilled_writes.fetch_add(1, Ordering::Relaxed);
    }

    pub(crate) fn record_sync(&self, fdatasync: Option<Duration>, groups: usize) {
        if let Some(d) = fdatasync {
            self.fdatasync_us.record(d);
        }
        self.groups_per_sync.record_value(groups as u64);
    }

    pub(crate) fn record_done(&self, oldest_append_to_done: Duration) {
        self.append_to_done_us.record(oldest_append_to_done);
    }

    /// The stage latency histograms (µs): queue wait, write, fdatasync.
    pub(crate) fn latency_histograms(&self) -> JournalHistograms {
        JournalHistograms {
            queue_wait_us: self.queue_wait_us.snapshot(),
            write_us: self.write_us.snapshot(),
            fdatasync_us: self.fdatasync_us.snapshot(),
        }
    }

    pub(crate) fn snapshot(&self) -> JournalStats {
        let summary = |h: &Histogram| h.snapshot().summary();
        JournalStats {
            queue_wait_us: summary(&self.queue_wait_us),
            write_us: summary(&self.write_us),
            fdatasync_us: summary(&self.fdatasync_us),
            append_to_done_us: summary(&self.append_to_done_us),
            group_entries: summary(&self.group_entries),
            group_bytes: summary(&self.group_bytes),
            groups_per_sync: summary(&self.groups_per_sync),
            prealloc_waits: self.prealloc_waits.load(Ordering::Relaxed),
            unfilled_writes: self.unfilled_writes.load(Ordering::Relaxed),
            ring_full_waits: self.ring_full_waits.load(Ordering::Relaxed),
            realtime_io_threads: self.realtime_io_threads.load(Ordering::Relaxed),
        }
    }
}
