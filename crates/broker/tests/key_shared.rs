//! Key_Shared dispatch over the protocol, counting the entries the broker
//! reads from its log (the entry cache's hits and misses: every read goes
//! through it): entries held for a fenced consumer are not read again while
//! they wait, a lone consumer is never fenced (Pulsar's "recently joined
//! consumers" rule needs another consumer), and entries nobody has permits
//! for stay read ahead instead of being read again one by one.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{Client, TIMEOUT, message_of, metadata, receipt_seq, start_broker_on};
use vela_broker::BrokerHandle;
use vela_log::EntryCache;
use vela_wire::proto::{self, MessageIdData, command_ack::AckType, command_subscribe::SubType};

/// A broker on in-memory state, and its entry cache (to count log reads).
async fn broker_counting_reads() -> (BrokerHandle, EntryCache) {
    let env = vela_log::LogEnv::in_memory();
    let cache = env.cache().clone();
    let broker = start_broker_on(Arc::new(vela_meta::MemoryStore::new()), env).await;
    (broker, cache)
}

/// Entries the broker has read from its logs so far.
fn entries_read(cache: &EntryCache) -> u64 {
    let stats = cache.stats();
    stats.hits_total + stats.misses_total
}

/// A key in the lower half of the hash space: a second consumer takes it over.
fn key_of_the_second_consumer() -> String {
    (0..1000)
        .map(|i| format!("key-{i}"))
        .find(|k| vela_broker::key_shared::slot_of(k.as_bytes()) <= 32_768)
        .unwrap()
}

fn keyed(key: &str, seq: u64) -> proto::MessageMetadata {
    proto::MessageMetadata {
        ordering_key: Some(key.as_bytes().to_vec().into()),
        ..metadata(seq)
    }
}

/// Publishes `seqs` with `key`, each acknowledged before the next.
async fn publish(producer: &mut Client, key: &str, seqs: std::ops::RangeInclusive<u64>) {
    for seq in seqs {
        producer
            .produce_with(1, seq, keyed(key, seq), seq.to_string().as_bytes())
            .await;
        assert_eq!(receipt_seq(&producer.recv().await), seq);
    }
}

/// CONSUMER_STATS goes through the subscription task after every command
/// sent before it (and the dispatch pass each caused): its answer proves
/// they were all handled.
async fn settle(client: &mut Client, consumer_id: u64, request_id: u64) {
    client
        .send(proto::CommandConsumerStats {
            request_id,
            consumer_id,
        })
        .await;
    let frame = client.recv().await;
    assert!(
        frame.command.consumer_stats_response.is_some(),
        "expected CONSUMER_STATS_RESPONSE, got {:?}",
        frame.command
    );
}

async fn ack(client: &mut Client, consumer_id: u64, id: MessageIdData) {
    client
        .send(proto::CommandAck {
            consumer_id,
            ack_type: AckType::Individual as i32,
            message_id: vec![id],
            ..Default::default()
        })
        .await;
}

/// Receives a message and returns (its payload as text, its id).
async fn next_message(client: &mut Client) -> (String, MessageIdData) {
    let frame = client.recv().await;
    let (message, payload) = message_of(&frame);
    (
        String::from_utf8(payload.to_vec()).unwrap(),
        message.message_id.clone(),
    )
}

/// Entries held back for a consumer that joined while an earlier entry of
/// its key was out (fenced) wait in the replay set. Each command the
/// subscription handles runs a dispatch pass; a pass must not read those
/// entries from the log again just to find they still cannot go: with a
/// backlog larger than every cache each such read is a bookie read, and a
/// few commands made a pass read hundreds of entries (a Key_Shared drain
/// stalled for a minute under load).
#[tokio::test]
async fn entries_held_for_a_fenced_consumer_are_not_read_again_while_they_wait() {
    const HELD: u64 = 20;
    const COMMANDS: u32 = 10;
    let (broker, cache) = broker_counting_reads().await;
    let addr = broker.pulsar_addr();
    let key = key_of_the_second_consumer();
    let mut producer = Client::connect(addr).await;
    producer.create_producer("ks-held", 1).await;
    let mut a = Client::connect(addr).await;
    a.subscribe("ks-held", "s", SubType::KeyShared, 1).await;
    a.flow(1, 1000).await;
    publish(&mut producer, &key, 0..=0).await;
    let (first, first_id) = next_message(&mut a).await;
    assert_eq!(first, "0");
    // B joins beside A while entry 0 is out: fenced; the key moves to B.
    let mut b = Client::connect(addr).await;
    b.subscribe("ks-held", "s", SubType::KeyShared, 2).await;
    b.flow(2, 1000).await;
    publish(&mut producer, &key, 1..=HELD).await;
    settle(&mut b, 2, 100).await;
    let before = entries_read(&cache);
    for _ in 0..COMMANDS {
        b.flow(2, 1).await;
    }
    settle(&mut b, 2, 101).await;
    assert_eq!(
        entries_read(&cache) - before,
        0,
        "{COMMANDS} commands while {HELD} entries wait for a fenced consumer re-read them"
    );
    // Entry 0 acknowledged: the fence lifts and B gets the rest, in order.
    ack(&mut a, 1, first_id).await;
    for seq in 1..=HELD {
        let (payload, _) = next_message(&mut b).await;
        assert_eq!(payload, seq.to_string());
    }
    broker.shutdown().await.unwrap();
}

/// A consumer alone on the subscription takes every key: after a reconnect
/// with entries unacknowledged it gets them again first, then new entries at
/// once (Pulsar fences a joining consumer only beside others). Fenced, it
/// would wait for the acknowledgements of the redelivered entries, and a
/// client that acknowledges late would wait for nothing.
#[tokio::test]
async fn a_lone_consumer_is_not_fenced_after_a_reconnect() {
    let (broker, _cache) = broker_counting_reads().await;
    let addr = broker.pulsar_addr();
    let key = key_of_the_second_consumer();
    let mut producer = Client::connect(addr).await;
    producer.create_producer("ks-alone", 1).await;
    let mut first = Client::connect(addr).await;
    first
        .subscribe("ks-alone", "s", SubType::KeyShared, 1)
        .await;
    first.flow(1, 10).await;
    publish(&mut producer, &key, 0..=0).await;
    assert_eq!(next_message(&mut first).await.0, "0");
    first
        .send(proto::CommandCloseConsumer {
            consumer_id: 1,
            request_id: 50,
            ..Default::default()
        })
        .await;
    assert!(first.recv().await.command.success.is_some());
    let mut again = Client::connect(addr).await;
    again
        .subscribe("ks-alone", "s", SubType::KeyShared, 2)
        .await;
    again.flow(2, 10).await;
    assert_eq!(next_message(&mut again).await.0, "0", "redelivered first");
    publish(&mut producer, &key, 1..=1).await;
    // Within the helper's own receive bound (TIMEOUT), so this says why.
    let wait = TIMEOUT - std::time::Duration::from_secs(1);
    let next = tokio::time::timeout(wait, next_message(&mut again)).await;
    assert_eq!(
        next.map(|(payload, _)| payload).ok().as_deref(),
        Some("1"),
        "a lone consumer waited for the acknowledgement of a redelivered entry"
    );
    broker.shutdown().await.unwrap();
}

/// A fenced consumer left alone (the other consumer closed) takes every
/// key at once: the closed consumer's entries come first, then the held
/// ones, without waiting for its own acknowledgements.
#[tokio::test]
async fn a_fenced_consumer_left_alone_is_fenced_no_more() {
    let (broker, _cache) = broker_counting_reads().await;
    let addr = broker.pulsar_addr();
    let key = key_of_the_second_consumer();
    let mut producer = Client::connect(addr).await;
    producer.create_producer("ks-left", 1).await;
    let mut a = Client::connect(addr).await;
    a.subscribe("ks-left", "s", SubType::KeyShared, 1).await;
    a.flow(1, 10).await;
    publish(&mut producer, &key, 0..=0).await;
    assert_eq!(next_message(&mut a).await.0, "0");
    let mut b = Client::connect(addr).await;
    b.subscribe("ks-left", "s", SubType::KeyShared, 2).await;
    b.flow(2, 10).await;
    publish(&mut producer, &key, 1..=1).await;
    a.send(proto::CommandCloseConsumer {
        consumer_id: 1,
        request_id: 50,
        ..Default::default()
    })
    .await;
    assert!(a.recv().await.command.success.is_some());
    assert_eq!(next_message(&mut b).await.0, "0", "A's entry first");
    let wait = TIMEOUT - std::time::Duration::from_secs(1);
    let next = tokio::time::timeout(wait, next_message(&mut b)).await;
    assert_eq!(
        next.map(|(payload, _)| payload).ok().as_deref(),
        Some("1"),
        "alone, B still waited for the acknowledgement of entry 0"
    );
    broker.shutdown().await.unwrap();
}

/// A lone Key_Shared consumer that takes one message at a time: the entries
/// read ahead wait in memory for its permits, each read from the log once,
/// instead of being dropped into the replay set and read again one by one.
#[tokio::test]
async fn entries_nobody_has_permits_for_stay_read_ahead() {
    const ENTRIES: u64 = 30;
    let (broker, cache) = broker_counting_reads().await;
    let addr = broker.pulsar_addr();
    let key = key_of_the_second_consumer();
    let mut producer = Client::connect(addr).await;
    producer.create_producer("ks-permits", 1).await;
    let mut consumer = Client::connect(addr).await;
    consumer
        .subscribe("ks-permits", "s", SubType::KeyShared, 1)
        .await;
    publish(&mut producer, &key, 0..=ENTRIES - 1).await;
    settle(&mut consumer, 1, 100).await;
    let before = entries_read(&cache);
    for seq in 0..ENTRIES {
        consumer.flow(1, 1).await;
        assert_eq!(next_message(&mut consumer).await.0, seq.to_string());
    }
    assert_eq!(
        entries_read(&cache) - before,
        ENTRIES,
        "each entry is read from the log once"
    );
    broker.shutdown().await.unwrap();
}
