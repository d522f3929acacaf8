//! Producer deduplication (when the namespace enables it): producer name →
//! highest sequence id appended, so a re-sent SEND (a producer reconnecting
//! and resending what it had in flight) is answered without appending
//! again.
//!
//! Owns: [`DedupTable`]. Guarantees: a sequence id is recorded exactly when
//! its entry was issued to the log, under the lock that also issues the
//! append (`check_and_append`), so the recorded ids agree with the log's
//! order (`topic::publish` states the SEND-order invariant); a producer's
//! recorded sequence id only moves forward, and an append the log refused
//! at once is un-recorded (both checked in debug builds); the table is
//! rebuilt from the newest `DEDUP_REBUILD_ENTRIES_MAX` entries of the log
//! when the topic opens (no snapshot is kept); it holds at most
//! `DEDUP_PRODUCERS_MAX` names, dropping the one updated longest ago (a
//! producer silent that long loses its dedup state, as Pulsar drops
//! inactive producers). Lock: one short mutex, held while the append is
//! issued (`ManagedLog::append` never waits), a leaf otherwise (taken under
//! the producer table's lock when a waiting producer is admitted).
//! Never: waits while holding its lock, or allocates per SEND of a known
//! producer.

use std::collections::HashMap;

use parking_lot::Mutex;
use vela_log::{AppendFuture, ManagedLog};

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

/// Outcome of a SEND under deduplication.
#[derive(Debug)]
pub(crate) enum DedupCheck {
    /// New: its append, issued.
    Appended(AppendFuture),
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

    /// Puts back what `get` said before a `set` (`None`: the name goes).
    fn restore(&mut self, producer: &str, previous: Option<i64>) {
        match (previous, self.map.get_mut(producer)) {
            (Some(last), Some(slot)) => slot.0 = last,
            _ => {
                self.map.remove(producer);
            }
        }
    }
}

impl DedupTable {
    pub(crate) fn new(enabled: bool) -> DedupTable {
        DedupTable(enabled.then(|| Mutex::new(Names::default())))
    }

    pub(crate) fn is_enabled(&self) -> bool {
        self.0.is_some()
    }

    /// Issues `append` unless `sequence_id` was already appended for
    /// `producer`, and records `highest_sequence_id` for it, all under the
    /// table's lock (without dedup: issues it, no lock). An append the log
    /// refuses at once leaves the table as it was.
    pub(crate) fn check_and_append(
        &self,
        producer: &str,
        sequence_id: i64,
        highest_sequence_id: i64,
        append: impl FnOnce() -> AppendFuture,
    ) -> DedupCheck {
        let Some(table) = &self.0 else {
            return DedupCheck::Appended(append());
        };
        let mut table = table.lock();
        let previous = table.get(producer);
        let last = previous.unwrap_or(-1);
        if sequence_id <= last {
            return DedupCheck::Duplicate;
        }
        let recorded = highest_sequence_id.max(sequence_id);
        debug_assert!(recorded > last, "a producer's sequence id moved back");
        table.set(producer, recorded);
        let appended = append();
        if appended.is_refused() {
            // Not in the log: a re-send must not be taken for a duplicate.
            // Nobody recorded since (the lock is held), so this is exact
            // (but for a name `set` dropped to make room, which stays gone).
            debug_assert_eq!(table.get(producer), Some(recorded));
            table.restore(producer, previous);
        }
        DedupCheck::Appended(appended)
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
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use bytes::Bytes;
    use vela_log::memory::{MemoryBackend, MemoryLedgers};
    use vela_log::{LogConfig, LogEnv};

    use super::*;

    async fn open_log() -> Arc<ManagedLog> {
        let env = LogEnv::new(
            Arc::new(vela_meta::MemoryStore::new()),
            Arc::new(MemoryBackend(MemoryLedgers::new())),
        );
        ManagedLog::open(&env, "t/ns/persistent/dedup", LogConfig::default())
            .await
            .unwrap()
    }

    /// True when the SEND was appended, false when it was a duplicate.
    fn fresh(
        table: &DedupTable,
        log: &ManagedLog,
        producer: &str,
        sequence_id: i64,
        highest: i64,
    ) -> bool {
        let outcome = table.check_and_append(producer, sequence_id, highest, || {
            log.append(Bytes::from_static(b"entry"))
        });
        matches!(outcome, DedupCheck::Appended(_))
    }

    #[tokio::test]
    async fn sequence_ids_move_forward_per_producer() {
        let log = open_log().await;
        let table = DedupTable::new(true);
        assert_eq!(table.last_sequence_id("p"), -1);
        assert!(fresh(&table, &log, "p", 0, 0));
        assert!(!fresh(&table, &log, "p", 0, 0));
        // A batch: its highest sequence id is recorded.
        assert!(fresh(&table, &log, "p", 1, 5));
        assert!(!fresh(&table, &log, "p", 4, 4));
        assert!(fresh(&table, &log, "q", 4, 4));
        assert_eq!(table.last_sequence_id("p"), 5);
        let off = DedupTable::new(false);
        assert!(fresh(&off, &log, "p", 0, 0));
        assert!(fresh(&off, &log, "p", 0, 0));
        assert_eq!(off.last_sequence_id("p"), -1);
    }

    #[tokio::test]
    async fn the_table_keeps_the_names_updated_last() {
        let log = open_log().await;
        let table = DedupTable::new(true);
        for i in 0..DEDUP_PRODUCERS_MAX + 10 {
            assert!(fresh(&table, &log, &format!("p{i}"), 1, 1));
            // p0 stays the most recently updated.
            assert!(fresh(&table, &log, "p0", i as i64 + 2, i as i64 + 2));
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

    #[tokio::test]
    async fn an_append_the_log_refuses_is_not_recorded() {
        let log = open_log().await;
        let table = DedupTable::new(true);
        assert!(fresh(&table, &log, "p", 0, 0));
        log.close().await.unwrap();
        // Refused at once (the log stopped): the re-send after the topic is
        // reloaded must be appended, not answered as a duplicate.
        assert!(fresh(&table, &log, "p", 1, 3));
        assert_eq!(table.last_sequence_id("p"), 0);
        assert!(fresh(&table, &log, "new", 7, 7));
        assert_eq!(table.last_sequence_id("new"), -1);
    }
}
