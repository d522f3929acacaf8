//! Producer deduplication (when the namespace enables it): producer name →
//! highest sequence id appended, so a re-sent SEND (a producer reconnecting
//! and resending what it had in flight) is answered without appending
//! again.
//!
//! Owns: [`DedupTable`]. Guarantees: a producer's recorded sequence id only
//! moves forward (checked in debug builds); the table is rebuilt from the
//! newest `DEDUP_REBUILD_ENTRIES_MAX` entries of the log when the topic
//! opens (no snapshot is kept); it holds at most `DEDUP_PRODUCERS_MAX`
//! names, dropping the one updated longest ago (a producer silent that
//! long loses its dedup state, as Pulsar drops inactive producers).
//! Lock: one short mutex, a leaf (taken under
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

/// Producer names one topic's table keeps (Pulsar's
/// brokerDeduplicationMaxNumberOfProducers is 10,000): with about 64 bytes a
/// name, at most ~64 KiB per topic. Live producers are few per topic;
/// the bound is against the names of producers gone (broker-assigned names
/// are new on every connection). Past it the name updated longest ago goes.
pub(crate) const DEDUP_PRODUCERS_MAX: usize = 1000;

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
pub(crate) struct DedupTable(Option<Mutex<Names>>);

/// The names, with when each was last updated (a counter).
#[derive(Debug, Default)]
pub(crate) struct Names {
    map: HashMap<String, (i64, u64)>,
    updates: u64,
}

impl Names {
    fn get(&self, producer: &str) -> Option<i64> {
        self.map.get(producer).map(|(sequence_id, _)| *sequence_id)
    }

    fn set(&mut self, producer: &str, sequence_id: i64) {
        self.updates += 1;
        let stamp = self.updates;
        if let Some(slot) = self.map.get_mut(producer) {
            *slot = (sequence_id, stamp);
            return;
        }
        if self.map.len() >= DEDUP_PRODUCERS_MAX {
            // Rare (a new name with the table full): one scan.
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, (_, updated))| *updated)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                self.map.remove(&oldest);
            }
        }
        self.map.insert(producer.to_string(), (sequence_id, stamp));
        debug_assert!(self.map.len() <= DEDUP_PRODUCERS_MAX);
    }
}

impl DedupTable {
    pub(crate) fn new(enabled: bool) -> DedupTable {
        DedupTable(enabled.then(|| Mutex::new(Names::default())))
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
        let last = table.get(producer).unwrap_or(-1);
        if sequence_id <= last {
            return DedupCheck::Duplicate;
        }
        let recorded = highest_sequence_id.max(sequence_id);
        debug_assert!(recorded > last, "a producer's sequence id moved back");
        table.set(producer, recorded);
        DedupCheck::Fresh
    }

    /// The last sequence id to report in PRODUCER_SUCCESS (−1 without dedup).
    pub(crate) fn last_sequence_id(&self, producer: &str) -> i64 {
        match &self.0 {
            Some(table) => table.lock().get(producer).unwrap_or(-1),
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
            let known = table.get(&producer).unwrap_or(-1);
            table.set(&producer, known.max(highest));
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

    #[test]
    fn the_table_keeps_the_names_updated_last() {
        let table = DedupTable::new(true);
        for i in 0..DEDUP_PRODUCERS_MAX + 10 {
            assert_eq!(table.check(&format!("p{i}"), 1, 1), DedupCheck::Fresh);
            // p0 stays the most recently updated.
            assert_eq!(
                table.check("p0", i as i64 + 2, i as i64 + 2),
                DedupCheck::Fresh
            );
        }
        let Some(names) = &table.0 else {
            panic!("enabled");
        };
        assert_eq!(names.lock().map.len(), DEDUP_PRODUCERS_MAX);
        assert!(table.last_sequence_id("p0") > 1);
        assert_eq!(table.last_sequence_id("p1"), -1, "the oldest name went");
        assert_eq!(
            table.last_sequence_id(&format!("p{}", DEDUP_PRODUCERS_MAX + 9)),
            1
        );
    }
}
