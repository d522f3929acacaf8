//! Producer deduplication (when the namespace enables it): producer name →
//! highest sequence id appended, so a re-sent SEND (a producer reconnecting
//! and resending what it had in flight) is answered without appending
//! again.
//!
//! Owns: [`DedupTable`]. Per producer it keeps two sequence ids, as Pulsar's
//! `MessageDeduplication` does: *pushed* (issued to the log) and *persisted*
//! (the log said durable). Only a SEND at or below *persisted* is a
//! duplicate (a (−1, −1) receipt); one above it but at or below *pushed* is
//! unknown (its first copy is still in flight: answered with a retriable
//! error, never a receipt), and a failed append resets every producer's
//! *pushed* to *persisted*, so the client's re-send is appended again. So a
//! receipt is never given for a SEND whose entry is not durable.
//! Guarantees: a sequence id is recorded as pushed exactly when
//! its entry was issued to the log, under the lock that also issues the
//! append (`check_and_append`), so the recorded ids agree with the log's
//! order (`topic::publish` states the SEND-order invariant); a producer's
//! pushed sequence id only moves forward between failures, and an append the log refused
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
    /// Already appended and durable: answer with a (−1, −1) receipt.
    Duplicate,
    /// Issued before but not yet durable: answer with a retriable error
    /// ([`DEDUP_UNKNOWN_MESSAGE`]); the client re-sends later.
    Unknown,
}

/// Pulsar's `MessageDupUnknownException` message.
pub(crate) const DEDUP_UNKNOWN_MESSAGE: &str =
    "Cannot determine whether the message is a duplicate at this time";

/// Producer name → highest sequence id appended (`None`: dedup off).
#[derive(Debug)]
pub(crate) struct DedupTable(Option<Mutex<Names>>);

/// One producer's sequence ids and when it was last updated (a counter).
#[derive(Debug, Clone, Copy)]
struct Sequences {
    pushed: i64,
    persisted: i64,
    updated: u64,
}

/// The names, with when each was last updated (a counter).
#[derive(Debug, Default)]
pub(crate) struct Names {
    map: HashMap<String, Sequences>,
    updates: u64,
}

impl Names {
    /// The pushed sequence id.
    fn get(&self, producer: &str) -> Option<i64> {
        self.map.get(producer).map(|s| s.pushed)
    }

    /// Both sequence ids, in one lookup.
    fn sequences(&self, producer: &str) -> Option<Sequences> {
        self.map.get(producer).copied()
    }

    /// Records `sequence_id` as pushed (a new name: persisted up to it too
    /// only when `persisted` says so).
    fn set(&mut self, producer: &str, sequence_id: i64) {
        self.set_both(producer, sequence_id, None);
    }

    fn set_both(&mut self, producer: &str, pushed: i64, persisted: Option<i64>) {
        self.updates += 1;
        let stamp = self.updates;
        if let Some(slot) = self.map.get_mut(producer) {
            slot.pushed = pushed;
            if let Some(persisted) = persisted {
                slot.persisted = persisted;
            }
            slot.updated = stamp;
            return;
        }
        if self.map.len() >= DEDUP_PRODUCERS_MAX {
            // Rare (a new name with the table full): one scan.
            let oldest = self
                .map
                .iter()
                .min_by_key(|(_, s)| s.updated)
                .map(|(name, _)| name.clone());
            if let Some(oldest) = oldest {
                self.map.remove(&oldest);
            }
        }
        self.map.insert(
            producer.to_string(),
            Sequences {
                pushed,
                persisted: persisted.unwrap_or(-1),
                updated: stamp,
            },
        );
        debug_assert!(self.map.len() <= DEDUP_PRODUCERS_MAX);
    }

    /// Puts back what `get` said before a `set` (`None`: the name goes).
    fn restore(&mut self, producer: &str, previous: Option<i64>) {
        match (previous, self.map.get_mut(producer)) {
            (Some(last), Some(slot)) => slot.pushed = last,
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
        let known = table.sequences(producer);
        if sequence_id <= known.map_or(-1, |s| s.persisted) {
            return DedupCheck::Duplicate;
        }
        let previous = known.map(|s| s.pushed);
        let last = previous.unwrap_or(-1);
        if sequence_id <= last {
            return DedupCheck::Unknown;
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
            Some(table) => table.lock().sequences(producer).map_or(-1, |s| s.persisted),
            None => -1,
        }
    }

    /// `producer`'s SENDs up to `sequence_id` are durable (their append
    /// resolved): they are duplicates from now on.
    pub(crate) fn mark_persisted(&self, producer: &str, sequence_id: i64) {
        let Some(table) = &self.0 else {
            return;
        };
        let mut table = table.lock();
        let known = table.sequences(producer);
        let pushed = known.map_or(-1, |s| s.pushed).max(sequence_id);
        let persisted = known.map_or(-1, |s| s.persisted).max(sequence_id);
        table.set_both(producer, pushed, Some(persisted));
        debug_assert!(persisted <= pushed);
    }

    /// An append failed: what was pushed but is not durable is forgotten for
    /// every producer (Pulsar's `resetHighestSequenceIdPushed`), so the
    /// clients' re-sends are appended, not answered as duplicates.
    pub(crate) fn append_failed(&self) {
        let Some(table) = &self.0 else {
            return;
        };
        for slot in table.lock().map.values_mut() {
            slot.pushed = slot.persisted;
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
            // Read back from the log: durable.
            let known = table.sequences(&producer);
            let pushed = known.map_or(-1, |s| s.pushed).max(highest);
            let persisted = known.map_or(-1, |s| s.persisted).max(highest);
            table.set_both(&producer, pushed, Some(persisted));
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

    /// True when the SEND was appended (and is then taken as durable, as
    /// the receipt loop reports it), false when it was a duplicate.
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
        match outcome {
            DedupCheck::Appended(append) => {
                if !append.is_refused() {
                    table.mark_persisted(producer, sequence_id.max(highest));
                }
                true
            }
            DedupCheck::Duplicate | DedupCheck::Unknown => false,
        }
    }

    #[tokio::test]
    async fn a_resend_of_a_send_not_yet_durable_is_unknown_and_after_a_failure_appended_again() {
        let log = open_log().await;
        let table = DedupTable::new(true);
        let issue = |sequence_id: i64| {
            table.check_and_append("p", sequence_id, sequence_id, || {
                log.append(Bytes::from_static(b"entry"))
            })
        };
        assert!(matches!(issue(0), DedupCheck::Appended(_)));
        table.mark_persisted("p", 0);
        assert!(matches!(issue(1), DedupCheck::Appended(_)));
        // 1 is in flight: a re-send is neither a duplicate nor appended.
        assert!(matches!(issue(1), DedupCheck::Unknown));
        assert!(matches!(issue(0), DedupCheck::Duplicate));
        assert_eq!(
            table.last_sequence_id("p"),
            0,
            "PRODUCER_SUCCESS names what is durable"
        );
        // Its append failed: the re-send must be appended, never receipted
        // as a duplicate of an entry that is not in the log.
        table.append_failed();
        assert!(matches!(issue(1), DedupCheck::Appended(_)));
        table.mark_persisted("p", 1);
        assert!(matches!(issue(1), DedupCheck::Duplicate));
        assert_eq!(table.last_sequence_id("p"), 1);
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
