//! [`SparseHistogram`]: the same buckets as [`Histogram`], for the many
//! histograms that see few distinct values (a topic's latencies when it
//! publishes now and then): its first `SPARSE_SLOTS` distinct buckets are
//! counted in slots, and a full `Histogram` (~0.9 KiB) is allocated only
//! when a value lands in one more. A topic that carried a few messages
//! holds ~130 bytes per histogram instead of ~900.
//!
//! Slot layout: one `AtomicU64`, 0 when free, else the bucket index + 1 in
//! the top `TAG_BITS` bits and the count below. Slots are claimed in order
//! (a recorder takes only the first free one, by compare-and-swap, and
//! reads that slot again when it loses the race), so the claimed slots are
//! a prefix and no bucket is in two slots. Once the full histogram exists
//! every value goes there (a snapshot adds slots and buckets up). Recording
//! stays lock-free: a scan of at most `SPARSE_SLOTS` atomics (none once
//! full), one increment, one sum addition; the one allocation is the full
//! histogram, once.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use crate::{BUCKETS, Histogram, Snapshot, bucket_index};

/// Distinct buckets counted before the full histogram is allocated (the
/// struct is then 128 bytes: two cache lines).
pub const SPARSE_SLOTS: usize = 13;

/// Bits of a slot holding its bucket index + 1 (`BUCKETS` ≤ 127).
const TAG_BITS: u32 = 7;
/// Bits of a slot holding its count (2^57 samples: never reached).
const COUNT_BITS: u32 = 64 - TAG_BITS;
const COUNT_MASK: u64 = (1 << COUNT_BITS) - 1;

const _: () = assert!(BUCKETS < (1 << TAG_BITS));

/// A histogram over [`crate::BUCKET_BOUNDS`] that starts small (module
/// docs); share it by reference or `Arc`.
#[derive(Debug, Default)]
pub struct SparseHistogram {
    slots: [AtomicU64; SPARSE_SLOTS],
    sum: AtomicU64,
    /// Counts of the buckets that found no slot.
    full: OnceLock<Box<Histogram>>,
}

fn tag(index: usize) -> u64 {
    (index as u64 + 1) << COUNT_BITS
}

impl SparseHistogram {
    /// Records one latency, in µs.
    pub fn record(&self, latency: Duration) {
        self.record_value(u64::try_from(latency.as_micros()).unwrap_or(u64::MAX));
    }

    /// Records one value (µs, or a count or size).
    pub fn record_value(&self, value: u64) {
        self.sum.fetch_add(value, Ordering::Relaxed);
        let index = bucket_index(value);
        if let Some(full) = self.full.get() {
            // Full: no scan (a snapshot adds slots and buckets up).
            full.count_in_bucket(index);
            return;
        }
        let tag = tag(index);
        for slot in &self.slots {
            let mut current = slot.load(Ordering::Acquire);
            if current == 0 {
                match slot.compare_exchange(0, tag | 1, Ordering::AcqRel, Ordering::Acquire) {
                    Ok(_) => return,
                    // Claimed meanwhile: maybe for this bucket.
                    Err(claimed) => current = claimed,
                }
            }
            if current & !COUNT_MASK == tag {
                slot.fetch_add(1, Ordering::Relaxed);
                return;
            }
        }
        self.full.get_or_init(Box::default).count_in_bucket(index);
    }

    /// Whether the full histogram was allocated (more distinct buckets
    /// than slots were hit).
    pub fn is_full(&self) -> bool {
        self.full.get().is_some()
    }

    /// The counts now.
    pub fn snapshot(&self) -> Snapshot {
        let mut snapshot = self
            .full
            .get()
            .map_or_else(Snapshot::default, |full| full.snapshot());
        for slot in &self.slots {
            let value = slot.load(Ordering::Acquire);
            if value == 0 {
                break;
            }
            let index = (value >> COUNT_BITS) as usize - 1;
            let count = value & COUNT_MASK;
            debug_assert!(index < BUCKETS, "a slot names bucket {index}");
            if let Some(bucket) = snapshot.buckets.get_mut(index) {
                *bucket += count;
                snapshot.count += count;
            }
        }
        snapshot.sum = self.sum.load(Ordering::Relaxed);
        snapshot
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::BUCKET_BOUNDS;

    #[test]
    fn it_is_two_cache_lines_until_it_fills() {
        assert_eq!(std::mem::size_of::<SparseHistogram>(), 128);
        let histogram = SparseHistogram::default();
        for value in BUCKET_BOUNDS.iter().take(SPARSE_SLOTS) {
            histogram.record_value(*value);
            histogram.record_value(*value);
        }
        assert!(!histogram.is_full());
        histogram.record_value(BUCKET_BOUNDS[SPARSE_SLOTS]);
        assert!(histogram.is_full());
    }

    #[test]
    fn it_counts_as_the_full_histogram_does() {
        let sparse = SparseHistogram::default();
        let full = Histogram::default();
        // Few distinct buckets first, then many (past the slots), then
        // the first ones again.
        let values = (0..50u64)
            .map(|i| 100 + i % 3)
            .chain((1..=3000u64).map(|i| i * 37))
            .chain([0, 1, 5, u64::MAX / 4]);
        for value in values {
            sparse.record_value(value);
            full.record_value(value);
        }
        assert!(sparse.is_full());
        assert_eq!(sparse.snapshot(), full.snapshot());
        sparse.record(Duration::from_millis(3));
        full.record(Duration::from_millis(3));
        assert_eq!(sparse.snapshot(), full.snapshot());
        assert_eq!(SparseHistogram::default().snapshot(), Snapshot::default());
    }

    #[test]
    fn concurrent_recorders_lose_no_sample_and_share_slots() {
        let sparse = std::sync::Arc::new(SparseHistogram::default());
        let threads: Vec<_> = (0..4u64)
            .map(|t| {
                let sparse = std::sync::Arc::clone(&sparse);
                std::thread::spawn(move || {
                    for i in 0..10_000u64 {
                        // Eight distinct buckets, raced for by every thread.
                        sparse.record_value(BUCKET_BOUNDS[((i + t) % 8) as usize]);
                    }
                })
            })
            .collect();
        for thread in threads {
            thread.join().unwrap();
        }
        let snapshot = sparse.snapshot();
        assert_eq!(snapshot.count, 40_000);
        let claimed = sparse
            .slots
            .iter()
            .filter(|slot| slot.load(Ordering::Relaxed) != 0)
            .count();
        assert_eq!(claimed, 8, "a bucket took two slots");
        assert!(!sparse.is_full());
        for bucket in &snapshot.buckets[..8] {
            assert_eq!(*bucket, 5_000);
        }
    }
}
