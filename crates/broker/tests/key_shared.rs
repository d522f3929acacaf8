//! Key_Shared dispatch over the protocol: a lone consumer is never fenced
//! (Pulsar's "recently joined consumers" rule needs another consumer).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{Client, TIMEOUT, message_of, metadata, receipt_seq, start_broker_on};
use vela_broker::BrokerHandle;
use vela_wire::proto::{self, MessageIdData, command_subscribe::SubType};

/// A broker on in-memory state.
async fn broker() -> BrokerHandle {
    let env = vela_log::LogEnv::in_memory();
    start_broker_on(Arc::new(vela_meta::MemoryStore::new()), env).await
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

/// Receives a message and returns (its payload as text, its id).
async fn next_message(client: &mut Client) -> (String, MessageIdData) {
    let frame = client.recv().await;
    let (message, payload) = message_of(&frame);
    (
        String::from_utf8(payload.to_vec()).unwrap(),
        message.message_id.clone(),
    )
}

/// A consumer alone on the subscription takes every key: after a reconnect
/// with entries unacknowledged it gets them again first, then new entries at
/// once (Pulsar fences a joining consumer only beside others). Fenced, it
/// would wait for the acknowledgements of the redelivered entries, and a
/// client that acknowledges late would wait for nothing.
#[tokio::test]
async fn a_lone_consumer_is_not_fenced_after_a_reconnect() {
    let broker = broker().await;
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
    let broker = broker().await;
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
