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
pub(crate) struct DedupTable(Option<Box<Mutex<Names>>>);

/// Deduplication of replicators' producers (`pulsar.repl.` names, always
/// on): the table, and whether it was rebuilt from the log (once, before
/// the first replicator is admitted).
#[derive(Debug)]
pub(crate) struct ReplDedup {
    pub(crate) table: DedupTable,
    pub(crate) ready: tokio::sync::OnceCell<()>,
}

impl Default for ReplDedup {
    fn default() -> ReplDedup {
        ReplDedup {
            table: DedupTable::new(true),
            ready: tokio::sync::OnceCell::new(),
        }
    }
}

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
        // Boxed: most topics run without deduplication (~60 bytes inline
        // otherwise).
        DedupTable(enabled.then(|| Box::new(Mutex::new(Names::default()))))
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

    /// True when `producer`'s `sequence_id` is durable already (a re-send is
    /// a duplicate); false without dedup.
    pub(crate) fn is_persisted(&self, producer: &str, sequence_id: i64) -> bool {
        self.0.as_ref().is_some_and(|table| {
            sequence_id <= table.lock().sequences(producer).map_or(-1, |s| s.persisted)
        })
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
        if self.0.is_none() {
            return Ok(());
        }
        let mut rebuilt: HashMap<String, i64> = HashMap::new();
        scan_newest(log, |entry| {
            if let Some((producer, highest)) = codec::entry_producer_sequence(entry) {
                let slot = rebuilt.entry(producer).or_insert(-1);
                *slot = (*slot).max(highest);
            }
        })
        .await?;
        self.record_durable(rebuilt);
        Ok(())
    }

    /// The table of replicators' producers (`REPLICATOR_PREFIX` names):
    /// rebuilt from the newest `DEDUP_REBUILD_ENTRIES_MAX` entries that
    /// came from other clusters. Each carries its cluster (`replicated_from`)
    /// and its source position (`codec::REPL_SOURCE_POSITION_PROPERTY`), which its
    /// replicator sent as the sequence id ([`replicated_sequence_id`]).
    pub(crate) async fn rebuild_replicated(
        &self,
        log: &ManagedLog,
        local_cluster: &str,
    ) -> Result<(), vela_log::LogError> {
        if self.0.is_none() {
            return Ok(());
        }
        let mut rebuilt: HashMap<String, i64> = HashMap::new();
        scan_newest(log, |entry| {
            let Some((from, ledger_id, entry_id)) = codec::entry_replication_source(entry) else {
                return;
            };
            let Some(sequence_id) = replicated_sequence_id(ledger_id, entry_id) else {
                return;
            };
            let producer = replicator_producer_name(&from, local_cluster);
            let slot = rebuilt.entry(producer).or_insert(-1);
            *slot = (*slot).max(sequence_id);
        })
        .await?;
        self.record_durable(rebuilt);
        Ok(())
    }

    /// Records sequence ids read back from the log (durable).
    fn record_durable(&self, rebuilt: HashMap<String, i64>) {
        let Some(table) = &self.0 else {
            return;
        };
        let mut table = table.lock();
        for (producer, highest) in rebuilt {
            let known = table.sequences(&producer);
            let pushed = known.map_or(-1, |s| s.pushed).max(highest);
            let persisted = known.map_or(-1, |s| s.persisted).max(highest);
            table.set_both(&producer, pushed, Some(persisted));
        }
    }
}

/// Prefix of the replicators' producer names and cursors (Pulsar's
/// `replicatorPrefix` default).
pub(crate) const REPLICATOR_PREFIX: &str = "pulsar.repl";

/// The producer name of `from`'s replicator producing to `to`, as Pulsar
/// names it: `pulsar.repl.{from}-->{to}`.
pub(crate) fn replicator_producer_name(from: &str, to: &str) -> String {
    format!("{REPLICATOR_PREFIX}.{from}-->{to}")
}

/// The name of the cursor replicating to `remote` (Pulsar's
/// `pulsar.repl.{remote}`).
pub(crate) fn replication_cursor_name(remote: &str) -> String {
    format!("{REPLICATOR_PREFIX}.{remote}")
}

/// True for a replicator's producer (`pulsar.repl.` names): its SENDs are
/// always deduplicated, on the topic's replicated table.
pub(crate) fn is_replicator(producer: &str) -> bool {
    producer
        .strip_prefix(REPLICATOR_PREFIX)
        .is_some_and(|rest| rest.starts_with('.'))
}

/// The cluster a replicator's producer brings messages from (Pulsar's
/// `Producer.parseRemoteClusterName`: what follows the prefix, up to
/// `-->`); `None` for any other producer.
pub(crate) fn replicator_source(producer: &str) -> Option<&str> {
    let rest = producer
        .strip_prefix(REPLICATOR_PREFIX)?
        .strip_prefix('.')?;
    Some(rest.split_once("-->").map_or(rest, |(from, _)| from))
}

/// The sequence id a replicator sends for the entry at (`ledger_id`,
/// `entry_id`) of its source log: the position packed into 63 bits,
/// increasing with the position, so the receiving side's dedup drops a
/// re-send after a replicator restart. `None` when the position does not
/// fit (ledger ids ≥ 2^31 or entry ids ≥ 2^32: never with a ledger id
/// counter and `ledger_entries_max` entries a ledger).
pub(crate) fn replicated_sequence_id(ledger_id: u64, entry_id: u64) -> Option<i64> {
    if ledger_id >= 1 << 31 || entry_id >= 1 << 32 {
        return None;
    }
    i64::try_from((ledger_id << 32) | entry_id).ok()
}

/// Reads the newest `DEDUP_REBUILD_ENTRIES_MAX` entries, oldest first.
async fn scan_newest(
    log: &ManagedLog,
    mut each: impl FnMut(&[u8]),
) -> Result<(), vela_log::LogError> {
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
    let mut from = start;
    loop {
        let entries = log
            .read(from, READ_BATCH_ENTRIES_MAX, REBUILD_READ_BYTES_MAX)
            .await?;
        let Some(newest) = entries.last().map(|e| e.position) else {
            break;
        };
        for entry in &entries {
            each(&entry.data);
        }
        if newest >= last {
            break;
        }
        from = log.next_position(newest);
    }
    Ok(())
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

    #[test]
    fn a_replicator_producer_names_its_source_cluster() {
        let name = replicator_producer_name("east", "west");
        assert_eq!(replicator_source(&name), Some("east"));
        assert_eq!(replicator_source("pulsar.repl.a"), Some("a"));
        assert_eq!(replicator_source("pulsar.replica"), None);
        assert_eq!(replicator_source("app"), None);
    }

    #[test]
    fn replicated_sequence_ids_follow_source_positions() {
        let a = replicated_sequence_id(7, 49_999).unwrap();
        let b = replicated_sequence_id(8, 0).unwrap();
        let c = replicated_sequence_id(8, 1).unwrap();
        assert!(a < b && b < c);
        assert_eq!(replicated_sequence_id(1 << 31, 0), None);
        assert_eq!(replicated_sequence_id(0, 1 << 32), None);
        assert!(replicated_sequence_id((1 << 31) - 1, (1 << 32) - 1).is_some());
        assert!(is_replicator("pulsar.repl.a-->b"));
        assert!(!is_replicator("pulsar.replx"));
        assert!(!is_replicator("standalone-0-1"));
        assert_eq!(replicator_producer_name("a", "b"), "pulsar.repl.a-->b");
    }

    /// A stored entry replicated from `from` at source (`ledger`, `entry`),
    /// or a local one (`from` = `None`).
    fn stored(from: Option<&str>, source: (u64, u64)) -> Bytes {
        use prost::Message as _;
        let mut metadata = vela_wire::proto::MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 5,
            publish_time: 1,
            ..Default::default()
        };
        if let Some(from) = from {
            metadata.replicated_from = Some(from.into());
            metadata.properties.push(vela_wire::proto::KeyValue {
                key: codec::REPL_SOURCE_POSITION_PROPERTY.into(),
                value: format!("{}:{}", source.0, source.1),
            });
        }
        vela_wire::build_stored_entry(&metadata.encode_to_vec(), b"payload")
    }

    #[tokio::test]
    async fn the_replicated_table_is_rebuilt_from_source_positions() {
        let log = open_log().await;
        for entry in [
            stored(Some("a"), (3, 7)),
            stored(None, (0, 0)),
            stored(Some("a"), (4, 0)),
            stored(Some("c"), (9, 9)),
        ] {
            log.append(entry).await.unwrap();
        }
        let table = DedupTable::new(true);
        table.rebuild_replicated(&log, "b").await.unwrap();
        let from_a = replicator_producer_name("a", "b");
        assert_eq!(
            table.last_sequence_id(&from_a),
            replicated_sequence_id(4, 0).unwrap()
        );
        assert_eq!(
            table.last_sequence_id(&replicator_producer_name("c", "b")),
            replicated_sequence_id(9, 9).unwrap()
        );
        assert_eq!(
            table.last_sequence_id("p"),
            -1,
            "local producers are not in it"
        );
        // A replicator's resend of what the log holds is a duplicate.
        let resend =
            table.check_and_append(&from_a, replicated_sequence_id(3, 7).unwrap(), 0, || {
                log.append(Bytes::from_static(b"entry"))
            });
        assert!(matches!(resend, DedupCheck::Duplicate));
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
