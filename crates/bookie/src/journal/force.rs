//! The force-write thread: one fdatasync for every group written since its
//! last pass, then the groups' callbacks in order, and the synced mark.
//!
//! Owns: `sync_and_complete`, which the writer also runs for a lone group
//! (depth 1) while this thread is idle. Guarantees: the synced mark only
//! moves forward and only after the fdatasync that covers it; every waiter
//! of a batch is completed, in append order, with `Ok` only when nothing
//! failed. Never: retries a failed fdatasync (the journal turns broken).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use super::config::JournalSync;
use super::error::JournalError;
use super::file::JournalFile;
use super::shared::{FORCE_WRITE_GROUPS_MAX, ForceItem, GroupTimes, Shared};

/// A group whose oldest record took longer than this from its append to its
/// callbacks' end is logged at debug on target `vela::journal::slow` with
/// where the time went (queue, roll, zero-fill wait, write, hand-over, sync,
/// callbacks), to tell a journal stall from a wait before the journal.
pub(crate) const SLOW_GROUP: Duration = Duration::from_millis(10);

/// Takes every group handed over since its last pass, syncs and completes
/// them (`sync_and_complete`), then wakes the writer if it holds a group back
/// for this thread.
pub(crate) fn run_force_writer(shared: Arc<Shared>, from_writer: Receiver<ForceItem>) {
    let mut batch: Vec<ForceItem> = Vec::with_capacity(FORCE_WRITE_GROUPS_MAX);
    loop {
        let Ok(first) = from_writer.recv() else {
            return;
        };
        let received = Instant::now();
        batch.push(first);
        while batch.len() < FORCE_WRITE_GROUPS_MAX {
            let Ok(item) = from_writer.try_recv() else {
                break;
            };
            batch.push(item);
        }
        let Completed { groups, stop } = sync_and_complete(&shared, &mut batch, received);
        if groups > 0 && shared.force_pending.fetch_sub(groups, Ordering::SeqCst) == groups {
            // Idle now: wake the writer if it holds a group back for us.
            let _queue = shared.lock_queue();
            shared.queue_cv.notify_all();
        }
        if stop {
            return;
        }
    }
}

/// What one `sync_and_complete` pass did.
pub(super) struct Completed {
    /// `Written` groups completed.
    groups: usize,
    /// A `Stop` was among the items.
    stop: bool,
}

/// Does one fdatasync per file among the written groups of `batch` (one in the
/// steady state), then completes their waiters in order, advances the synced
/// mark, and drains `batch`. Callers guarantee no other thread is completing
/// groups at the same time (see the module's access rules), so waiters complete
/// in append order. `received`: when the caller had the batch's first group
/// (for the slow-group log).
pub(super) fn sync_and_complete(
    shared: &Shared,
    batch: &mut Vec<ForceItem>,
    received: Instant,
) -> Completed {
    let sync_on = shared.config.sync == JournalSync::Fdatasync;
    let mut stop = false;
    // Sync each distinct file of the written groups, oldest first.
    let mut sync_error: Option<JournalError> = None;
    let mut sync_time: Option<Duration> = None;
    let mut groups = 0usize;
    let sync_started = Instant::now();
    if sync_on && !shared.is_broken() {
        let mut last: Option<&Arc<dyn JournalFile>> = None;
        for item in batch.iter() {
            if let ForceItem::Written { file, .. } = item {
                groups += 1;
                if last.is_some_and(|l| Arc::ptr_eq(l, file)) {
                    continue;
                }
                let started = Instant::now();
                if let Err(e) = file.sync_data() {
                    let e = JournalError::io("fdatasync", file.path(), e);
                    shared.fail(&e);
                    sync_error = Some(e);
                    break;
                }
                *sync_time.get_or_insert(Duration::ZERO) += started.elapsed();
                last = Some(file);
            }
        }
    }
    if sync_error.is_none() && !shared.is_broken() {
        let end = batch.iter().rev().find_map(|item| match item {
            ForceItem::Written { end_mark, .. } => Some(*end_mark),
            _ => None,
        });
        if let Some(end) = end
            && let Ok(mut synced) = shared.synced_mark.lock()
        {
            // Groups complete in the order they were written: the synced
            // mark only moves forward.
            debug_assert!(end >= *synced, "synced mark {end:?} behind {:?}", *synced);
            *synced = (*synced).max(end);
        }
    }
    shared.stats.record_sync(sync_time, groups);
    let failure = sync_error.or_else(|| shared.is_broken().then(|| shared.broken_error()));
    let now = Instant::now();
    let batch_groups = batch.len();
    let mut groups_done = 0usize;
    let mut last_mark = None;
    for item in batch.drain(..) {
        match item {
            ForceItem::Written {
                waiters,
                oldest_enqueued,
                times,
                ..
            } => {
                groups_done += 1;
                let entries = waiters.len();
                for (done, mark) in waiters {
                    // Callbacks run in append order: marks increase.
                    debug_assert!(last_mark < Some(mark), "journal callbacks out of order");
                    last_mark = Some(mark);
                    match &failure {
                        None => done(Ok(mark)),
                        Some(e) => done(Err(e.clone())),
                    }
                }
                if let Some(t) = oldest_enqueued.filter(|_| failure.is_none()) {
                    shared.stats.record_done(now.saturating_duration_since(t));
                    if let Some(times) = times {
                        let phases = Phases {
                            enqueued: t,
                            times,
                            received,
                            sync_started,
                            synced: now,
                        };
                        phases.log_if_slow(entries, batch_groups);
                    }
                }
            }
            ForceItem::Failed { waiters, error } => {
                for done in waiters {
                    done(Err(error.clone()));
                }
            }
            ForceItem::Stop => stop = true,
        }
    }
    Completed {
        groups: groups_done,
        stop,
    }
}

/// One group's way through the journal, for `SLOW_GROUP`'s log line.
struct Phases {
    /// The group's oldest record was appended.
    enqueued: Instant,
    times: GroupTimes,
    /// The completing thread had the batch holding the group.
    received: Instant,
    /// That thread began the batch's fdatasyncs.
    sync_started: Instant,
    /// They returned (callbacks began).
    synced: Instant,
}

impl Phases {
    fn log_if_slow(&self, entries: usize, batch_groups: usize) {
        let done = Instant::now();
        let total = done.saturating_duration_since(self.enqueued);
        if total < SLOW_GROUP {
            return;
        }
        let us = |from: Instant, to: Instant| to.saturating_duration_since(from).as_micros() as u64;
        let t = &self.times;
        tracing::debug!(
            target: "vela::journal::slow",
            total_us = total.as_micros() as u64,
            queue_us = us(self.enqueued, t.taken),
            roll_us = t.roll.as_micros() as u64,
            reserve_wait_us = t.reserve_wait.as_micros() as u64,
            before_write_us = us(t.taken, t.write_started),
            write_us = us(t.write_started, t.written),
            hand_over_us = us(t.written, self.received),
            before_sync_us = us(self.received, self.sync_started),
            sync_us = us(self.sync_started, self.synced),
            callbacks_us = us(self.synced, done),
            entries,
            batch_groups,
            "slow journal group"
        );
    }
}
