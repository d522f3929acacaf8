//! The subscription's read-ahead: entries read from the log before
//! consumers asked for them, and the one log read in flight that fetches
//! more, so a catch-up consumer is fed from memory while the next batch is
//! on its way from the bookies, however its permits arrive.
//!
//! Owns: [`ReadAhead`] (the buffered entries, in log order and contiguous
//! from the subscription's read position, and the read in flight) and
//! [`ReadAheadBudget`], the broker-wide byte budget every subscription's
//! read-ahead draws on (`BrokerConfig::read_ahead_bytes_max`, the one knob;
//! the broker-wide memory budget can later hand it its share).
//! Guarantees: at most one read in flight per subscription; a read that
//! reads ahead (beyond what consumers wait for now) is issued only after its
//! bytes were reserved in the budget, and the buffered entries hold their
//! reservation until they are taken (delivered, skipped) or dropped (seek,
//! no consumers left). A subscription whose consumers have permits and whose
//! buffer is empty may read one batch without a reservation when the budget
//! is used up (a demand read, as a read without read-ahead would): it never
//! stalls because other subscriptions hold the budget.
//! Bounds: `READ_AHEAD_READS_MAX` reads of `READ_AHEAD_ENTRIES_MAX` entries
//! and about `READ_AHEAD_BYTES_PER_READ_MAX` bytes per subscription,
//! buffered and in flight together; the sum over subscriptions of reserved
//! bytes stays within the budget (a read may return one entry past its
//! estimate: that overshoot is charged too, and is at most one entry).
//! Never: decides what is delivered, or moves the subscription's read
//! position (the dispatcher does, as it takes entries).

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Instant;

use tokio::task::JoinHandle;
use vela_log::{LogEntry, ManagedLog, Position};

use super::read_pool::ReadPool;
use crate::metrics::ReadMetrics;

/// Reads' worth of entries a subscription keeps read ahead, buffered and in
/// flight: the next read starts while two are still buffered, so a read
/// slower than usual (a disk hiccup, a busy core) is hidden too.
pub(crate) const READ_AHEAD_READS_MAX: usize = 3;
/// Entries per read-ahead read: the ledger reader pipelines them over the
/// bookies (`vela_ledger::READ_RANGE_PARALLELISM` at once), so small entries
/// cost one pass, not one round trip each.
pub(crate) const READ_AHEAD_ENTRIES_MAX: usize = 500;
/// Bytes per read-ahead read (about; at least one entry): eight 1 MiB
/// batches, read from the bookie in parallel.
pub(crate) const READ_AHEAD_BYTES_PER_READ_MAX: usize = 8 * 1024 * 1024;

/// Bytes of read-ahead held across the broker's subscriptions.
#[derive(Debug)]
pub(crate) struct ReadAheadBudget {
    held_bytes: AtomicU64,
    max_bytes: u64,
}

impl ReadAheadBudget {
    pub(crate) fn new(max_bytes: u64) -> ReadAheadBudget {
        ReadAheadBudget {
            held_bytes: AtomicU64::new(0),
            max_bytes,
        }
    }

    /// Reserves `bytes` if they fit.
    fn try_reserve(&self, bytes: u64) -> bool {
        self.held_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |held| {
                (held + bytes <= self.max_bytes).then_some(held + bytes)
            })
            .is_ok()
    }

    /// Charges `bytes` unconditionally (a read's overshoot of its estimate).
    fn charge(&self, bytes: u64) {
        self.held_bytes.fetch_add(bytes, Ordering::AcqRel);
    }

    fn release(&self, bytes: u64) {
        let before = self.held_bytes.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "read-ahead budget released twice");
    }

    /// Bytes reserved now.
    pub(crate) fn held_bytes(&self) -> u64 {
        self.held_bytes.load(Ordering::Relaxed)
    }
}

/// What a subscription's reads share with the broker: the budget, the
/// read-path stages and the threads the reads run on.
#[derive(Debug, Clone)]
pub(crate) struct SubscriptionReads {
    pub(crate) budget: Arc<ReadAheadBudget>,
    pub(crate) metrics: Arc<ReadMetrics>,
    pub(crate) pool: Arc<ReadPool>,
}

impl SubscriptionReads {
    pub(crate) fn new(
        budget_bytes: u64,
        metrics: Arc<ReadMetrics>,
        pool: Arc<ReadPool>,
    ) -> SubscriptionReads {
        SubscriptionReads {
            budget: Arc::new(ReadAheadBudget::new(budget_bytes)),
            metrics,
            pool,
        }
    }
}

type ReadResult = Result<Vec<LogEntry>, String>;

#[derive(Debug)]
struct InFlight {
    task: JoinHandle<ReadResult>,
    /// Bytes reserved in the budget for it (0: a demand read).
    reserved_bytes: u64,
    started: Instant,
}

/// What a finished read brought.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Fetched {
    /// Entries were added to the buffer.
    Entries,
    /// The log has nothing more now (caught up).
    Nothing,
    /// The read failed (retry later).
    Failed(String),
}

/// One subscription's read-ahead.
#[derive(Debug)]
pub(super) struct ReadAhead {
    reads: SubscriptionReads,
    /// Entries read and not yet taken, contiguous in log order, each with
    /// whether its bytes are charged to the budget (not those of a demand
    /// read).
    entries: VecDeque<(LogEntry, bool)>,
    /// Their payload bytes.
    entries_bytes: u64,
    /// The part of them charged to the budget.
    charged_bytes: u64,
    in_flight: Option<InFlight>,
    /// Since when consumers with permits wait for a read (nothing buffered).
    wait_started: Option<Instant>,
}

impl ReadAhead {
    pub(super) fn new(reads: SubscriptionReads) -> ReadAhead {
        ReadAhead {
            reads,
            entries: VecDeque::new(),
            entries_bytes: 0,
            charged_bytes: 0,
            in_flight: None,
            wait_started: None,
        }
    }

    pub(super) fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    pub(super) fn in_flight(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Whether another read may start now: none in flight and fewer than
    /// `READ_AHEAD_READS_MAX - 1` reads' worth buffered.
    pub(super) fn has_room(&self) -> bool {
        self.in_flight.is_none()
            && self.entries.len() < (READ_AHEAD_READS_MAX - 1) * READ_AHEAD_ENTRIES_MAX
            && self.entries_bytes
                < ((READ_AHEAD_READS_MAX - 1) * READ_AHEAD_BYTES_PER_READ_MAX) as u64
    }

    /// Where the next read starts: after the last buffered entry, or at the
    /// subscription's read position when nothing is buffered.
    pub(super) fn next_read_after(&self) -> Option<Position> {
        self.entries.back().map(|(e, _)| e.position)
    }

    /// Starts a read of the next batch from `from` (no read may be in
    /// flight). `demand`: consumers wait on an empty buffer, so the read may
    /// go without a reservation when the budget is used up. Returns whether
    /// a read was started.
    pub(super) fn start(&mut self, log: &Arc<ManagedLog>, from: Position, demand: bool) -> bool {
        debug_assert!(self.in_flight.is_none(), "two reads in flight");
        let batch_bytes = READ_AHEAD_BYTES_PER_READ_MAX as u64;
        let reserved_bytes = if self.reads.budget.try_reserve(batch_bytes) {
            batch_bytes
        } else if demand && self.entries.is_empty() {
            0
        } else {
            return false;
        };
        let log = Arc::clone(log);
        // On the catch-up threads (`read_pool`): below the publish path's
        // priority when the machine is busy.
        let task = self.reads.pool.spawn(async move {
            log.read(from, READ_AHEAD_ENTRIES_MAX, READ_AHEAD_BYTES_PER_READ_MAX)
                .await
                .map_err(|e| e.to_string())
        });
        self.in_flight = Some(InFlight {
            task,
            reserved_bytes,
            started: Instant::now(),
        });
        true
    }

    /// Resolves when the read in flight finishes (pending forever when none
    /// is: guard the `select!` branch with `in_flight`).
    pub(super) async fn finished(&mut self) -> ReadResult {
        match self.in_flight.as_mut() {
            Some(in_flight) => match (&mut in_flight.task).await {
                Ok(result) => result,
                Err(error) => Err(format!("read task failed: {error}")),
            },
            None => std::future::pending().await,
        }
    }

    /// Takes the result of the read in flight: entries at or after
    /// `position` (the subscription's read position, which a skip may have
    /// moved past some of them) join the buffer.
    pub(super) fn complete(&mut self, result: ReadResult, position: Position) -> Fetched {
        let Some(in_flight) = self.in_flight.take() else {
            return Fetched::Nothing;
        };
        let metrics = &self.reads.metrics;
        metrics.read.record(in_flight.started.elapsed());
        let entries = match result {
            Ok(entries) => entries,
            Err(error) => {
                self.reads.budget.release(in_flight.reserved_bytes);
                return Fetched::Failed(error);
            }
        };
        let read_bytes: u64 = entries.iter().map(|e| e.data.len() as u64).sum();
        metrics.read_bytes.fetch_add(read_bytes, Ordering::Relaxed);
        let after = self.next_read_after();
        let charged = in_flight.reserved_bytes > 0;
        let mut kept_bytes = 0u64;
        for entry in entries {
            if entry.position < position || after.is_some_and(|last| entry.position <= last) {
                continue;
            }
            kept_bytes += entry.data.len() as u64;
            self.entries.push_back((entry, charged));
        }
        self.entries_bytes += kept_bytes;
        if charged {
            // Hold what was kept; give back the rest of the estimate, or
            // charge the overshoot (at most one entry past the estimate).
            if kept_bytes >= in_flight.reserved_bytes {
                self.reads
                    .budget
                    .charge(kept_bytes - in_flight.reserved_bytes);
            } else {
                self.reads
                    .budget
                    .release(in_flight.reserved_bytes - kept_bytes);
            }
            self.charged_bytes += kept_bytes;
        }
        debug_assert!(
            self.entries
                .iter()
                .zip(self.entries.iter().skip(1))
                .all(|((a, _), (b, _))| a.position < b.position),
            "read-ahead out of order"
        );
        if self.entries.is_empty() {
            Fetched::Nothing
        } else {
            Fetched::Entries
        }
    }

    /// Adds entries read inline (a compacted view) to the empty buffer.
    pub(super) fn push_unreserved(&mut self, entries: Vec<LogEntry>) {
        debug_assert!(self.entries.is_empty() && self.in_flight.is_none());
        for entry in entries {
            self.entries_bytes += entry.data.len() as u64;
            self.entries.push_back((entry, false));
        }
    }

    /// The next buffered entry at or after `position`; entries before it
    /// (skipped by an admin ack) are dropped.
    pub(super) fn take(&mut self, position: Position) -> Option<LogEntry> {
        while let Some((entry, charged)) = self.entries.pop_front() {
            let bytes = entry.data.len() as u64;
            self.entries_bytes -= bytes;
            if charged {
                self.charged_bytes -= bytes;
                self.reads.budget.release(bytes);
            }
            if entry.position >= position {
                return Some(entry);
            }
        }
        None
    }

    /// Puts back an entry just taken (its consumer could not take it).
    pub(super) fn put_back(&mut self, entry: LogEntry) {
        debug_assert!(
            self.entries
                .front()
                .is_none_or(|(next, _)| entry.position < next.position)
        );
        let bytes = entry.data.len() as u64;
        self.entries_bytes += bytes;
        let charged = self.reads.budget.try_reserve(bytes);
        if charged {
            self.charged_bytes += bytes;
        }
        self.entries.push_front((entry, charged));
    }

    /// Drops everything buffered and the read in flight (seek, no consumer
    /// left, shutdown).
    pub(super) fn clear(&mut self) {
        if let Some(in_flight) = self.in_flight.take() {
            in_flight.task.abort();
            self.reads.budget.release(in_flight.reserved_bytes);
        }
        self.entries.clear();
        self.entries_bytes = 0;
        self.reads.budget.release(self.charged_bytes);
        self.charged_bytes = 0;
        self.wait_started = None;
    }

    /// Gives back an emptied buffer's slots (the subscription parks).
    pub(super) fn shrink_idle(&mut self) {
        if self.entries.is_empty() {
            self.entries = VecDeque::new();
        }
    }

    /// Consumers with permits found nothing buffered: a wait for a read
    /// starts (if none runs yet).
    pub(super) fn note_waiting(&mut self) {
        self.wait_started.get_or_insert_with(Instant::now);
    }

    /// Entries arrived for waiting consumers: the wait is recorded.
    pub(super) fn note_fed(&mut self) {
        if let Some(started) = self.wait_started.take() {
            self.reads.metrics.read_wait.record(started.elapsed());
        }
    }

    /// The wait ended without entries (the log is caught up): not a read
    /// wait.
    pub(super) fn note_caught_up(&mut self) {
        self.wait_started = None;
    }
}

impl Drop for ReadAhead {
    fn drop(&mut self) {
        self.clear();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use bytes::Bytes;
    use vela_log::memory::{MemoryBackend, MemoryLedgers};
    use vela_log::{LogConfig, LogEnv};

    use super::*;

    /// A log of `count` 1 KiB entries, none in the entry cache (reads go to
    /// the ledgers).
    async fn log_of(count: u8) -> Arc<ManagedLog> {
        let env = LogEnv::new(
            Arc::new(vela_meta::MemoryStore::new()),
            Arc::new(MemoryBackend(MemoryLedgers::new())),
        );
        // No reader registered: nothing is cached for one.
        let log = ManagedLog::open(&env, "t/ns/persistent/read-ahead", LogConfig::default())
            .await
            .unwrap();
        for i in 0..count {
            log.append(Bytes::from(vec![i; 1024])).await.unwrap();
        }
        log
    }

    fn reads(budget_bytes: u64) -> SubscriptionReads {
        SubscriptionReads::new(budget_bytes, Arc::default(), Arc::new(ReadPool::inline()))
    }

    /// Read-ahead is reserved in the shared budget and given back as entries
    /// are taken; a demand read goes without a reservation when the budget
    /// is used up; entries come out in log order.
    #[tokio::test]
    async fn budget_bounds_read_ahead_and_demand_reads_still_progress() {
        let log = log_of(20).await;
        let shared = reads(READ_AHEAD_BYTES_PER_READ_MAX as u64);
        let budget = Arc::clone(&shared.budget);
        let mut first = ReadAhead::new(shared.clone());
        let mut second = ReadAhead::new(shared);
        let start = log.first_position().unwrap();
        assert!(first.start(&log, start, false));
        assert_eq!(budget.held_bytes(), READ_AHEAD_BYTES_PER_READ_MAX as u64);
        assert!(
            !second.start(&log, start, false),
            "budget used: no read-ahead"
        );
        assert!(second.start(&log, start, true), "a demand read still goes");
        let result = first.finished().await;
        assert_eq!(first.complete(result, start), Fetched::Entries);
        assert_eq!(budget.held_bytes(), 20 * 1024, "only what was read is held");
        let mut position = start;
        for i in 0..20u8 {
            let entry = first.take(position).unwrap();
            assert_eq!(entry.position, position);
            assert_eq!(entry.data[0], i);
            position = log.next_position(position);
        }
        assert!(first.take(position).is_none());
        assert_eq!(budget.held_bytes(), 0);
        let result = second.finished().await;
        assert_eq!(second.complete(result, start), Fetched::Entries);
        assert_eq!(budget.held_bytes(), 0, "a demand read holds no budget");
        second.clear();
        assert!(second.is_empty());
    }

    /// A skip past buffered entries drops them; a put-back entry comes next.
    #[tokio::test]
    async fn take_skips_entries_before_the_position_and_put_back_comes_first() {
        let log = log_of(5).await;
        let shared = reads(1 << 30);
        let budget = Arc::clone(&shared.budget);
        let mut ahead = ReadAhead::new(shared);
        let start = log.first_position().unwrap();
        assert!(ahead.start(&log, start, false));
        let result = ahead.finished().await;
        assert_eq!(ahead.complete(result, start), Fetched::Entries);
        let third = log.next_position(log.next_position(start));
        let entry = ahead.take(third).unwrap();
        assert_eq!(entry.data[0], 2);
        ahead.put_back(entry);
        assert_eq!(ahead.take(third).unwrap().data[0], 2);
        drop(ahead);
        assert_eq!(budget.held_bytes(), 0, "dropping gives the budget back");
    }

    #[test]
    fn budget_reserves_only_what_fits_and_releases() {
        let budget = ReadAheadBudget::new(10);
        assert!(budget.try_reserve(6));
        assert!(!budget.try_reserve(5));
        assert!(budget.try_reserve(4));
        budget.release(6);
        assert_eq!(budget.held_bytes(), 4);
        budget.charge(7);
        assert_eq!(budget.held_bytes(), 11);
        assert!(!budget.try_reserve(1));
    }
}
