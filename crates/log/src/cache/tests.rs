//! The cache's bound and accounting, alone and under concurrent inserts,
//! reads and marks.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use bytes::Bytes;

use super::{ENTRY_OVERHEAD_BYTES, EntryCache};
use crate::Position;

fn entry(byte: u8, len: usize) -> Bytes {
    Bytes::from(vec![byte; len])
}

fn charge(len: usize) -> u64 {
    len as u64 + ENTRY_OVERHEAD_BYTES
}

#[test]
fn a_full_cache_skips_inserts_and_never_passes_its_budget() {
    let cache = EntryCache::new(10 * charge(100));
    let log = cache.register_log();
    let _reader = log.register_reader(Position::new(1, 0));
    let mut cached = 0;
    for entry_id in 0..20 {
        if log.insert(Position::new(1, entry_id), &entry(1, 100)) {
            cached += 1;
        }
        assert!(cache.used_bytes() <= cache.budget_bytes());
    }
    assert_eq!(cached, 10);
    assert_eq!(cache.stats().insert_skipped_total, 10);
    drop(log);
    assert_eq!(cache.used_bytes(), 0, "a dropped log gives back every byte");
    assert_eq!(cache.stats().entries, 0);
}

#[test]
fn a_cached_entry_is_a_copy_of_its_own_size() {
    let cache = EntryCache::new(1 << 20);
    let log = cache.register_log();
    let _reader = log.register_reader(Position::new(1, 0));
    let buffer = entry(7, 4096);
    assert!(log.insert(Position::new(1, 0), &buffer.slice(0..10)));
    let run = log.run_from(Position::new(1, 0), 0, 10, 1 << 20);
    assert_eq!(run.entries.len(), 1);
    let (_, data) = &run.entries[0];
    assert_eq!(data.as_ref(), &[7u8; 10]);
    assert_ne!(
        data.as_ptr(),
        buffer.as_ptr(),
        "the cache must not keep the 4 KiB buffer alive"
    );
    assert_eq!(cache.used_bytes(), charge(10));
}

#[test]
fn runs_stop_at_gaps_and_say_where_the_next_cached_entry_is() {
    let cache = EntryCache::new(1 << 20);
    let log = cache.register_log();
    let _reader = log.register_reader(Position::new(1, 0));
    for entry_id in [0, 1, 2, 5, 6] {
        assert!(log.insert(Position::new(1, entry_id), &entry(1, 10)));
    }
    let run = log.run_from(Position::new(1, 0), 9, 10, 1 << 20);
    let got: Vec<u64> = run.entries.iter().map(|(p, _)| p.entry_id).collect();
    assert_eq!(got, vec![0, 1, 2]);
    let run = log.run_from(Position::new(1, 3), 9, 10, 1 << 20);
    assert!(run.entries.is_empty());
    assert_eq!(run.next_cached, Some(Position::new(1, 5)));
    let run = log.run_from(Position::new(1, 5), 5, 10, 1 << 20);
    assert_eq!(run.entries.len(), 1, "the range's end bounds the run");
}

#[test]
fn entries_every_reader_passed_go_when_the_slowest_moves() {
    let cache = EntryCache::new(1 << 20);
    let log = cache.register_log();
    let fast = log.register_reader(Position::new(1, 0));
    let slow = log.register_reader(Position::new(1, 0));
    for entry_id in 0..10 {
        assert!(log.insert(Position::new(1, entry_id), &entry(1, 10)));
    }
    fast.set(Position::new(1, 10));
    assert_eq!(
        cache.stats().entries,
        10,
        "the slow reader still wants them"
    );
    slow.set(Position::new(1, 4));
    assert_eq!(cache.stats().entries, 6);
    assert_eq!(cache.used_bytes(), 6 * charge(10));
    assert!(
        !log.insert(Position::new(1, 2), &entry(1, 10)),
        "an entry every reader passed is not cached again"
    );
    drop(slow);
    assert_eq!(cache.stats().entries, 0, "the fast reader passed them all");
    drop(fast);
    assert!(!log.has_readers());
}

#[test]
fn eviction_takes_passed_entries_first_then_the_oldest() {
    // Three logs: `idle` has no reader left, `behind` a reader that has read
    // nothing, `read` one that has read half.
    let cache = EntryCache::new(1 << 20);
    let idle = cache.register_log();
    let behind = cache.register_log();
    let read = cache.register_log();
    let gone = idle.register_reader(Position::new(1, 0));
    let behind_reader = behind.register_reader(Position::new(2, 0));
    let read_reader = read.register_reader(Position::new(3, 0));
    for entry_id in 0..10 {
        assert!(behind.insert(Position::new(2, entry_id), &entry(2, 100)));
        assert!(idle.insert(Position::new(1, entry_id), &entry(1, 100)));
        assert!(read.insert(Position::new(3, entry_id), &entry(3, 100)));
    }
    drop(gone);
    // Moving the mark drops what it passed at once.
    read_reader.set(Position::new(3, 5));
    assert_eq!(read.bytes(), 5 * charge(100));
    // Room for 20 of the 25 entries: 5 of the idle log's (passed) go.
    cache.evict_to(20 * charge(100));
    assert_eq!(idle.bytes(), 5 * charge(100));
    assert_eq!(cache.used_bytes(), 20 * charge(100));
    // Room for 10: the idle log's other 5, then 5 of the oldest unread ones,
    // which are `behind`'s (inserted first).
    cache.evict_to(10 * charge(100));
    assert_eq!(idle.bytes(), 0);
    assert_eq!(behind.bytes(), 5 * charge(100));
    assert_eq!(read.bytes(), 5 * charge(100));
    let run = behind.run_from(Position::new(2, 0), 9, 10, 1 << 20);
    assert!(run.entries.is_empty(), "the oldest went first");
    assert_eq!(run.next_cached, Some(Position::new(2, 5)));
    cache.evict_to(0);
    assert_eq!(cache.used_bytes(), 0);
    assert_eq!(cache.stats().entries, 0);
    drop((behind_reader, read_reader));
}

#[test]
fn trimmed_ledgers_leave_the_cache() {
    let cache = EntryCache::new(1 << 20);
    let log = cache.register_log();
    let _reader = log.register_reader(Position::new(1, 0));
    for ledger_id in 1..=3 {
        for entry_id in 0..3 {
            assert!(log.insert(Position::new(ledger_id, entry_id), &entry(1, 10)));
        }
    }
    log.remove_ledgers_below(3);
    assert_eq!(log.bytes(), 3 * charge(10));
    assert_eq!(cache.used_bytes(), 3 * charge(10));
}

#[test]
fn the_evictor_keeps_the_cache_below_its_trigger_under_inserts() {
    let cache = EntryCache::new(100 * charge(1000));
    let log = cache.register_log();
    let _reader = log.register_reader(Position::new(1, 0));
    for entry_id in 0..10_000 {
        log.insert(Position::new(1, entry_id), &entry(1, 1000));
        assert!(cache.used_bytes() <= cache.budget_bytes());
    }
    // The evictor thread runs on its own: wait for it to have run once.
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while cache.stats().evicted_unread_total == 0 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
    assert!(cache.stats().eviction_passes_total > 0);
    assert!(cache.stats().evicted_unread_total > 0);
    assert!(cache.used_bytes() <= cache.budget_bytes());
}

/// Writers insert into their own logs while readers read and move marks and
/// the evictor runs: the count stays within the budget throughout, reads
/// return what was inserted, and everything is given back at the end.
#[test]
fn the_budget_holds_under_concurrent_inserts_reads_and_evictions() {
    const LOGS: u64 = 8;
    const ENTRIES: u64 = 5_000;
    let budget = 200 * charge(512);
    let cache = EntryCache::new(budget);
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (cache, stop) = (cache.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut max = 0;
            while !stop.load(Ordering::Acquire) {
                max = max.max(cache.used_bytes());
                std::hint::spin_loop();
            }
            max
        })
    };
    let evictor = {
        let (cache, stop) = (cache.clone(), Arc::clone(&stop));
        std::thread::spawn(move || {
            while !stop.load(Ordering::Acquire) {
                cache.evict_to(budget / 2);
                std::thread::yield_now();
            }
        })
    };
    let workers: Vec<_> = (0..LOGS)
        .map(|ledger_id| {
            let cache = cache.clone();
            std::thread::spawn(move || {
                let log = cache.register_log();
                let reader = log.register_reader(Position::new(ledger_id, 0));
                for entry_id in 0..ENTRIES {
                    let byte = (entry_id % 251) as u8;
                    log.insert(Position::new(ledger_id, entry_id), &entry(byte, 512));
                    if entry_id % 7 == 0 {
                        let from = Position::new(ledger_id, entry_id.saturating_sub(20));
                        let run = log.run_from(from, entry_id, 50, 1 << 20);
                        for (position, data) in run.entries {
                            let expected = (position.entry_id % 251) as u8;
                            assert!(data.iter().all(|b| *b == expected));
                        }
                        reader.set(Position::new(ledger_id, entry_id.saturating_sub(10)));
                    }
                }
                drop(reader);
                log
            })
        })
        .collect();
    let logs: Vec<_> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    stop.store(true, Ordering::Release);
    let max = watcher.join().unwrap();
    evictor.join().unwrap();
    assert!(max <= budget, "{max} > {budget}");
    assert!(cache.stats().inserted_total > 0);
    drop(logs);
    assert_eq!(cache.used_bytes(), 0);
    assert_eq!(cache.stats().entries, 0);
}
