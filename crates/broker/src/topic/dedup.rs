//! Producer deduplication (when the namespace enables it): producer name →
//! highest sequence id appended, so a re-sent SEND (a producer reconnecting
//! and resending what it had in flight) is answered without appending
//! again.
//!
//! Owns: [`DedupTable`]. Guarantees: a producer's recorded sequence id only
//! moves forward (checked in debug builds); the table is rebuilt from the
//! newest `DEDUP_REBUILD_ENTRIES_MAX` entries of the log when the topic
//! opens (no snapshot is kept). Lock: one short mutex, a leaf (taken under
//! the producer table's lock when a waiting producer is admitted).
//! Never: appends, or waits while holding its lock.

use std::collections::HashMap;

use parking_lot::Mutex;
use vela_log::ManagedLog;

use crate::codec;
use crate::subscription::READ_BATCH_ENTRIES_MAX;

/// Newest entries scanned to rebuild the deduplication table when a topic
/// with deduplication opens (Pulsar snapshots every 1000 entries and replays
/// the rest; we keep no snapshot, so the scan is bounded instead: producers
/// silent for longer than this many entries lose their dedup state).
pub(crate) const DEDUP_REBUILD_ENTRIES_MAX: usize = 100_000;

/// Bytes per read while rebuilding.
const REBUILD_READ_BYTES_MAX: usize = 4 << 20;

/// Outcome of a dedup check on SEND.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DedupCheck {
    /// Append it.
    Fresh,
    /// Already appended: answer with a (−1, −1) receipt.
    Duplicate,
}

/// Producer name → highest sequence id appended (`None`: dedup off).
#[derive(Debug)]
pub(crate) struct DedupTable(Option<Mutex<HashMap<String, i64>>>);

impl DedupTable {
    pub(crate) fn new(enabled: bool) -> DedupTable {
        DedupTable(enabled.then(|| Mutex::new(HashMap::new())))
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Records `highest_sequence_id` for `producer` unless `sequence_id`
    /// was already appended.
    pub(crate) fn check(
        &self,
        producer: &str,
        sequence_id: i64,
        highest_sequence_id: i64,
    ) -> DedupCheck {
        let Some(table) = &self.0 else {
            return DedupCheck::Fresh;
        };
        let mut table = table.lock();
        let last = table.get(producer).copied().unwrap_or(-1);
        if sequence_id <= last {
            return DedupCheck::Duplicate;
        }
        let recorded = highest_sequence_id.max(sequence_id);
        debug_assert!(recorded > last, "a producer's sequence id moved back");
        table.insert(producer.to_string(), recorded);
        DedupCheck::Fresh
    }

    /// The last sequence id to report in PRODUCER_SUCCESS (−1 without dedup).
    pub(crate) fn last_sequence_id(&self, producer: &str) -> i64 {
        match &self.0 {
            Some(table) => table.lock().get(producer).copied().unwrap_or(-1),
            None => -1,
        }
    }

    /// Deduplication after a (re)open: rebuilds the table from the newest
    /// `DEDUP_REBUILD_ENTRIES_MAX` entries of the log (producer name and
    /// highest sequence id are in each entry's metadata), so a restarted
    /// broker still drops the re-sends of producers that reconnect.
    pub(crate) async fn rebuild(&self, log: &ManagedLog) -> Result<(), vela_log::LogError> {
        let Some(table) = &self.0 else {
            return Ok(());
        };
        let Some(last) = log.last_confirmed() else {
            return Ok(());
        };
        let mut start = last;
        for _ in 1..DEDUP_REBUILD_ENTRIES_MAX {
            match log.previous_position(start) {
                Some(previous) => start = previous,
                None => break,
            }
        }
        let mut rebuilt: HashMap<String, i64> = HashMap::new();
        let mut from = start;
        loop {
            let entries = log
                .read(from, READ_BATCH_ENTRIES_MAX, REBUILD_READ_BYTES_MAX)
                .await?;
            let Some(newest) = entries.last().map(|e| e.position) else {
                break;
            };
            for entry in &entries {
                if let Some((producer, highest)) = codec::entry_producer_sequence(&entry.data) {
                    let slot = rebuilt.entry(producer).or_insert(-1);
                    *slot = (*slot).max(highest);
                }
            }
            if newest >= last {
                break;
            }
            from = log.next_position(newest);
        }
        let mut table = table.lock();
        for (producer, highest) in rebuilt {
            let slot = table.entry(producer).or_insert(-1);
            *slot = (*slot).max(highest);
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sequence_ids_move_forward_per_producer() {
        let table = DedupTable::new(true);
        assert_eq!(table.last_sequence_id("p"), -1);
        assert_eq!(table.check("p", 0, 0), DedupCheck::Fresh);
        assert_eq!(table.check("p", 0, 0), DedupCheck::Duplicate);
        // A batch: its highest sequence id is recorded.
        assert_eq!(table.check("p", 1, 5), DedupCheck::Fresh);
        assert_eq!(table.check("p", 4, 4), DedupCheck::Duplicate);
        assert_eq!(table.check("q", 4, 4), DedupCheck::Fresh);
        assert_eq!(table.last_sequence_id("p"), 5);
        let off = DedupTable::new(false);
        assert_eq!(off.check("p", 0, 0), DedupCheck::Fresh);
        assert_eq!(off.check("p", 0, 0), DedupCheck::Fresh);
        assert_eq!(off.last_sequence_id("p"), -1);
    }
}
