//! The buffer over in-memory ledgers and metadata: the read limit, markers,
//! aborted entries hidden, recovery from the log, the budget.

use std::sync::Arc;

use vela_log::{LogConfig, LogEnv, ManagedLog, Persistence, Position};
use vela_meta::{MemoryStore, MetadataStore};

use super::*;

async fn log_and_meta() -> (Arc<ManagedLog>, Arc<dyn MetadataStore>, LogEnv) {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let ledgers = Arc::new(vela_log::memory::MemoryBackend(
        vela_log::memory::MemoryLedgers::new(),
    ));
    let env = LogEnv::new(Arc::clone(&meta), ledgers);
    let config = LogConfig {
        persistence: Persistence::SINGLE,
        ..LogConfig::default()
    };
    let log = ManagedLog::open(&env, "t/ns/persistent/x", config)
        .await
        .unwrap();
    (log, meta, env)
}

/// A stored entry with no transaction id (what a client sends).
fn plain_entry(seq: u64) -> Bytes {
    let metadata = vela_wire::proto::MessageMetadata {
        producer_name: "p".into(),
        sequence_id: seq,
        publish_time: 1,
        ..Default::default()
    };
    vela_wire::build_stored_entry(&prost::Message::encode_to_vec(&metadata), b"payload")
}

/// Appends an entry of `txn` as the broker does: admit, add the id, append,
/// tell the buffer where it landed.
async fn send_txn(buffer: &TxnBuffer, log: &ManagedLog, txn: TxnKey, seq: u64) -> Position {
    buffer.admit(txn).unwrap();
    let entry = with_txn_id(&plain_entry(seq), txn).unwrap();
    let position = log.append(entry).await.unwrap();
    buffer.appended(txn, position);
    position
}

#[tokio::test]
async fn limit_holds_at_the_first_open_entry_and_markers_release_it() {
    let (log, meta, _env) = log_and_meta().await;
    let budget = TxnBudget::new(100);
    let buffer = TxnBuffer::open(Arc::clone(&log), meta, Arc::clone(&budget))
        .await
        .unwrap();
    assert!(!buffer.has_txns());
    let before = log.append(plain_entry(0)).await.unwrap();
    buffer.ensure_tracked().await.unwrap();
    assert!(buffer.has_txns());

    let t1 = (0, 1);
    buffer.admit(t1).unwrap();
    // Issued, not durable: nothing after the last confirmed entry is readable.
    assert_eq!(
        buffer.read_limit(),
        Some(Position::new(before.ledger_id, before.entry_id + 1))
    );
    let entry = with_txn_id(&plain_entry(1), t1).unwrap();
    let first = log.append(entry.clone()).await.unwrap();
    buffer.appended(t1, first);
    assert_eq!(buffer.read_limit(), Some(first));
    assert_eq!(classify(&entry), Kind::Data(t1));
    assert!(!buffer.is_hidden(&entry));
    assert_eq!(budget.used(), 1);

    // A second transaction after it does not move the limit.
    let t2 = (0, 2);
    let second = send_txn(&buffer, &log, t2, 2).await;
    assert_eq!(buffer.read_limit(), Some(first));
    let after_plain = log.append(plain_entry(3)).await.unwrap();

    // Aborting t1: the limit moves to t2's first entry; t1's entries are hidden.
    buffer.end(t1, false).await.unwrap();
    assert_eq!(buffer.read_limit(), Some(second));
    assert!(buffer.is_hidden(&entry));
    assert_eq!(budget.used(), 2, "an aborted transaction is still held");

    // Committing t2: no limit; its entries are visible; the marker is hidden.
    buffer.end(t2, true).await.unwrap();
    assert_eq!(buffer.read_limit(), None);
    let t2_entry = with_txn_id(&plain_entry(2), t2).unwrap();
    assert!(!buffer.is_hidden(&t2_entry));
    let marker = log
        .read(log.next_position(after_plain), 10, 1 << 20)
        .await
        .unwrap();
    assert_eq!(marker.len(), 2, "an abort and a commit marker");
    assert!(marker.iter().all(|m| buffer.is_hidden(&m.data)));
    assert_eq!(classify(&marker[0].data), Kind::Abort(t1));
    assert_eq!(classify(&marker[1].data), Kind::Commit(t2));
    assert_eq!(
        budget.used(),
        2,
        "the aborted one, and the committed one until the low water mark passes it"
    );

    // Ending again (a coordinator's retry) writes nothing more.
    let last = log.last_confirmed();
    buffer.end(t2, true).await.unwrap();
    buffer.end(t1, false).await.unwrap();
    assert_eq!(log.last_confirmed(), last);
    // Ended transactions take no more entries.
    assert!(matches!(buffer.admit(t1), Err(BufferError::Ended(0, 1))));
    assert!(matches!(buffer.admit(t2), Err(BufferError::Ended(0, 2))));
}

#[tokio::test]
async fn recovery_rebuilds_open_and_aborted_transactions_from_the_log() {
    let (log, meta, _env) = log_and_meta().await;
    let budget = TxnBudget::new(100);
    let buffer = TxnBuffer::open(Arc::clone(&log), Arc::clone(&meta), Arc::clone(&budget))
        .await
        .unwrap();
    buffer.ensure_tracked().await.unwrap();
    let (open, aborted, committed) = ((1, 1), (1, 2), (1, 3));
    let open_first = send_txn(&buffer, &log, open, 0).await;
    send_txn(&buffer, &log, aborted, 1).await;
    send_txn(&buffer, &log, committed, 2).await;
    buffer.end(aborted, false).await.unwrap();
    buffer.end(committed, true).await.unwrap();
    assert_eq!(buffer.counts(), (1, 1));
    drop(buffer);
    assert_eq!(budget.used(), 0, "a dropped buffer gives its records back");

    let recovered = TxnBuffer::open(Arc::clone(&log), meta, Arc::clone(&budget))
        .await
        .unwrap();
    assert!(recovered.has_txns());
    assert_eq!(recovered.counts(), (1, 1));
    assert_eq!(recovered.read_limit(), Some(open_first));
    let aborted_entry = with_txn_id(&plain_entry(1), aborted).unwrap();
    assert!(recovered.is_hidden(&aborted_entry));
    assert_eq!(recovered.ended_count(), 1, "the commit marker is read back");
    assert_eq!(budget.used(), 3);
    recovered.end(open, true).await.unwrap();
    assert_eq!(recovered.read_limit(), None);
}

#[tokio::test]
async fn the_budget_refuses_new_transactions_when_full() {
    let (log, meta, _env) = log_and_meta().await;
    let budget = TxnBudget::new(1);
    let buffer = TxnBuffer::open(Arc::clone(&log), meta, Arc::clone(&budget))
        .await
        .unwrap();
    buffer.ensure_tracked().await.unwrap();
    buffer.admit((0, 1)).unwrap();
    // More entries of an open transaction need no room.
    buffer.admit((0, 1)).unwrap();
    assert!(matches!(
        buffer.admit((0, 2)),
        Err(BufferError::Full { max: 1 })
    ));
    // Entries not appended after all: the transaction is forgotten.
    buffer.not_appended((0, 1));
    buffer.not_appended((0, 1));
    assert_eq!(buffer.counts(), (0, 0));
    assert_eq!(buffer.read_limit(), None);
    buffer.admit((0, 2)).unwrap();
}

#[test]
fn with_txn_id_keeps_the_payload_and_adds_the_id() {
    let entry = plain_entry(7);
    let tagged = with_txn_id(&entry, (3, 300)).unwrap();
    let metadata = metadata_slice(&tagged).unwrap();
    let summary = vela_wire::MetadataSummary::scan(metadata).unwrap();
    assert_eq!(summary.txnid_most_bits, Some(3));
    assert_eq!(summary.txnid_least_bits, Some(300));
    assert_eq!(summary.sequence_id, Some(7));
    assert!(tagged.ends_with(b"payload"));
    let checksum = u32::from_be_bytes(tagged[2..6].try_into().unwrap());
    assert_eq!(checksum, crc32c::crc32c(&tagged[6..]));
    assert!(matches!(
        with_txn_id(b"short", (0, 0)),
        Err(BufferError::Malformed)
    ));
}

#[tokio::test]
async fn sends_below_the_low_water_mark_are_refused_and_stats_show_the_buffer() {
    let (log, meta, _env) = log_and_meta().await;
    let budget = TxnBudget::new(100);
    let buffer = TxnBuffer::open(Arc::clone(&log), meta, Arc::clone(&budget))
        .await
        .unwrap();
    assert!(!buffer.stats().tracked);
    buffer.ensure_tracked().await.unwrap();
    let t3 = (1, 3);
    let first = send_txn(&buffer, &log, t3, 0).await;
    let stats = buffer.stats();
    assert!(stats.tracked);
    assert_eq!(stats.open, 1);
    assert_eq!(stats.max_read_position, log.previous_position(first));
    assert_eq!(buffer.txn_stats(t3), (Some(first), false));

    // Coordinator 1 says everything up to 2 ended: (1,2) is refused with
    // Pulsar's message, (1,3) and other coordinators' transactions are not.
    buffer.note_low_water(1, 2);
    buffer.note_low_water(1, 1);
    let refused = buffer.admit((1, 2)).unwrap_err();
    assert!(matches!(refused, BufferError::Ended(1, 2)));
    assert_eq!(
        refused.to_string(),
        "Transaction [(1,2)] has been ended. Please use a new transaction to send message."
    );
    buffer.admit(t3).unwrap();
    buffer.not_appended(t3);
    buffer.admit((0, 1)).unwrap();
    buffer.not_appended((0, 1));
    assert_eq!(buffer.stats().low_water_marks, vec![(1, 2)]);

    buffer.end(t3, false).await.unwrap();
    assert_eq!(buffer.txn_stats(t3), (None, true));
    let stats = buffer.stats();
    assert_eq!(stats.open, 0);
    assert_eq!(stats.max_read_position, log.last_confirmed());
}

#[tokio::test]
async fn a_late_send_of_an_ended_transaction_is_refused_and_never_hides_committed_entries() {
    let (log, meta, _env) = log_and_meta().await;
    let budget = TxnBudget::new(100);
    let buffer = TxnBuffer::open(Arc::clone(&log), Arc::clone(&meta), Arc::clone(&budget))
        .await
        .unwrap();
    buffer.ensure_tracked().await.unwrap();
    let (committed, unsent, stale) = ((2, 5), (2, 6), (2, 7));
    send_txn(&buffer, &log, committed, 0).await;
    buffer.end(committed, true).await.unwrap();
    // Ended with no entry here (registered, never sent to).
    buffer.end(unsent, true).await.unwrap();
    // The coordinator's mark (sent with the end) is below both.
    assert!(buffer.note_low_water(2, 4).is_empty());
    let committed_entry = with_txn_id(&plain_entry(0), committed).unwrap();

    // A late SEND of either: Pulsar's error, nothing opened, nothing hidden.
    for txn in [committed, unsent] {
        let refused = buffer.admit(txn).unwrap_err();
        assert_eq!(
            refused.to_string(),
            format!(
                "Transaction [({},{})] has been ended. Please use a new transaction to send message.",
                txn.0, txn.1
            )
        );
    }
    assert_eq!(buffer.counts(), (0, 0));
    assert_eq!(buffer.read_limit(), None);
    assert!(!buffer.is_hidden(&committed_entry));

    // After a reload (the topic moved, or the broker restarted) as well.
    drop(buffer);
    let buffer = TxnBuffer::open(Arc::clone(&log), Arc::clone(&meta), Arc::clone(&budget))
        .await
        .unwrap();
    assert!(matches!(
        buffer.admit(committed),
        Err(BufferError::Ended(2, 5))
    ));
    assert_eq!(buffer.read_limit(), None);

    // A transaction sent to without ending here, then passed by the mark:
    // it is handed back to be aborted, and the ended ones are forgotten
    // (the mark refuses them now).
    let stale_first = send_txn(&buffer, &log, stale, 1).await;
    assert_eq!(buffer.read_limit(), Some(stale_first));
    assert_eq!(buffer.note_low_water(2, 7), vec![stale]);
    buffer.end(stale, false).await.unwrap();
    assert_eq!(buffer.read_limit(), None);
    assert_eq!(buffer.ended_count(), 0);
    assert!(matches!(
        buffer.admit(committed),
        Err(BufferError::Ended(2, 5))
    ));
    assert!(!buffer.is_hidden(&committed_entry));
    assert_eq!(budget.used(), 1, "only the aborted one is held");

    // The snapshot keeps the marks and the ended set across a reload even
    // when no marker is scanned again.
    let snapshot = buffer.snapshot_now();
    assert_eq!(snapshot.low_water, vec![(2, 7)]);
    buffer.write_snapshot(&snapshot).await.unwrap();
    drop(buffer);
    let buffer = TxnBuffer::open(Arc::clone(&log), meta, Arc::clone(&budget))
        .await
        .unwrap();
    assert!(matches!(
        buffer.admit(unsent),
        Err(BufferError::Ended(2, 6))
    ));
}
