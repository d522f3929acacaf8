//! One eviction pass: brings the cache's count down to a target.
//!
//! Order: first the entries every active reader of their log has passed
//! (every entry of a log without active readers), then the rest; in both
//! phases the log whose lowest cached entry was inserted first gives up its
//! lowest entries first, a run at a time (up to the next log's turn).
//! Owns: nothing between passes. Takes the registry's lock once (to copy the
//! list of logs), then one log's lock at a time, briefly.
//! Never: holds two locks at once, or blocks an insert (an insert that finds
//! no room while a pass runs is skipped).

use std::cmp::Reverse;
use std::collections::BinaryHeap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Inner;
use super::log_cache::Shared;
use crate::Position;

/// Entries one turn of one log evicts at most before the next-oldest log is
/// looked at again: keeps each lock hold short (a few µs).
const EVICT_RUN_ENTRIES_MAX: usize = 256;

#[derive(Clone, Copy, PartialEq, Eq)]
enum Phase {
    /// Only entries below the log's slowest mark.
    Passed,
    /// Any entry.
    Unread,
}

/// Evicts until the cache holds at most `target_bytes` (or nothing is left
/// to evict).
pub(super) fn run_pass(inner: &Arc<Inner>, target_bytes: u64) {
    inner.counters.passes.fetch_add(1, Ordering::Relaxed);
    let logs: Vec<Arc<Shared>> = {
        let mut registry = inner.logs.lock();
        registry.retain(|_, weak| weak.strong_count() > 0);
        registry
            .values()
            .filter_map(|weak| weak.upgrade())
            .collect()
    };
    for phase in [Phase::Passed, Phase::Unread] {
        if inner.used_bytes.load(Ordering::Acquire) <= target_bytes {
            return;
        }
        evict_phase(inner, &logs, phase, target_bytes);
    }
}

/// The oldest front (insertion number) of a log's evictable entries.
fn front(log: &Shared, phase: Phase) -> Option<u64> {
    let state = log.state.lock();
    let (position, cached) = state.entries.first_key_value()?;
    if phase == Phase::Passed && state.passed_below().is_some_and(|below| *position >= below) {
        return None;
    }
    Some(cached.seq)
}

fn evict_phase(inner: &Arc<Inner>, logs: &[Arc<Shared>], phase: Phase, target_bytes: u64) {
    let mut heap: BinaryHeap<Reverse<(u64, usize)>> = logs
        .iter()
        .enumerate()
        .filter_map(|(index, log)| front(log, phase).map(|seq| Reverse((seq, index))))
        .collect();
    while let Some(Reverse((_, index))) = heap.pop() {
        if inner.used_bytes.load(Ordering::Acquire) <= target_bytes {
            return;
        }
        // This log's turn lasts while its front is older than the next log's.
        let next_turn = heap.peek().map_or(u64::MAX, |Reverse((seq, _))| *seq);
        let log = &logs[index];
        let (mut bytes, mut count) = (0u64, 0u64);
        let next_front = {
            let mut state = log.state.lock();
            // Without an active reader every entry counts as passed.
            let below: Option<Position> = match phase {
                Phase::Passed => state.passed_below(),
                Phase::Unread => None,
            };
            let mut evicted_run = 0usize;
            let still_over = |freed: u64| {
                inner
                    .used_bytes
                    .load(Ordering::Acquire)
                    .saturating_sub(freed)
                    > target_bytes
            };
            while evicted_run < EVICT_RUN_ENTRIES_MAX
                && still_over(bytes)
                && state
                    .front_seq()
                    .is_some_and(|seq| evicted_run == 0 || seq <= next_turn)
            {
                match state.pop_below(below) {
                    Some(charge) => {
                        bytes += charge;
                        count += 1;
                        evicted_run += 1;
                    }
                    None => break,
                }
            }
            match state.entries.first_key_value() {
                Some((position, cached))
                    if phase == Phase::Unread || below.is_none_or(|below| *position < below) =>
                {
                    Some(cached.seq)
                }
                _ => None,
            }
        };
        inner.release(bytes, count);
        let counter = match phase {
            Phase::Passed => &inner.counters.evicted_passed,
            Phase::Unread => &inner.counters.evicted_unread,
        };
        counter.fetch_add(count, Ordering::Relaxed);
        if let Some(seq) = next_front {
            heap.push(Reverse((seq, index)));
        }
    }
}
