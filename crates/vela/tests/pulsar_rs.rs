//! The official Rust client (the `pulsar` crate from crates.io) against a real
//! `vela standalone`: produce, consume and acknowledge as a Rust user does.
//!
//! Each test starts its own broker (`vela standalone` on a fresh temporary
//! directory, free ports on 127.0.0.1), killed when the test ends. Timeouts
//! only bound a failure; no test waits for time to pass to be correct.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use common::Standalone;
use futures::StreamExt;
use pulsar::compression::{Compression, CompressionSnappy, CompressionZstd};
use pulsar::consumer::{DeadLetterPolicy, InitialPosition, Message};
use pulsar::proto::CompressionType;
use pulsar::routing_policy::RoutingPolicy;
use pulsar::{
    Consumer, ConsumerOptions, Producer, ProducerOptions, Pulsar, SubType, TokioExecutor,
};

/// Failure bound for one expected message or one send receipt.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(30);
/// Messages per produce/consume round.
const MESSAGE_COUNT: usize = 200;
/// Messages per batch when the producer batches (not a divisor of
/// `MESSAGE_COUNT`: the last batch is a partial one, flushed explicitly).
const BATCH_MESSAGES: u32 = 16;

impl Standalone {
    async fn client(&self) -> Pulsar<TokioExecutor> {
        Pulsar::builder(self.pulsar_url.clone(), TokioExecutor)
            .build()
            .await
            .expect("the client connects")
    }
}

fn topic(name: &str) -> String {
    format!("persistent://public/default/{name}")
}

/// Message `index` of round `tag`: a unique prefix, then a compressible body
/// whose length varies from 0 to ~3 KiB.
fn payload(tag: &str, index: usize) -> Vec<u8> {
    let mut bytes = format!("{tag}-{index:05}:").into_bytes();
    let body_bytes = (index * 97) % 3000;
    bytes.extend((0..body_bytes).map(|i| b'a' + ((i / 7 + index) % 26) as u8));
    bytes
}

async fn subscribe(
    client: &Pulsar<TokioExecutor>,
    topic: &str,
    subscription: &str,
    sub_type: SubType,
) -> Consumer<Vec<u8>, TokioExecutor> {
    client
        .consumer()
        .with_topic(topic)
        .with_subscription(subscription)
        .with_subscription_type(sub_type)
        .with_options(ConsumerOptions::default().with_initial_position(InitialPosition::Earliest))
        .build()
        .await
        .expect("subscribe")
}

/// A producer with `options`; a pipelined send waits for room in the
/// client's outbound queue instead of failing with `SlowDown`.
async fn producer(
    client: &Pulsar<TokioExecutor>,
    topic: &str,
    options: ProducerOptions,
) -> Producer<TokioExecutor> {
    let options = ProducerOptions {
        block_queue_if_full: true,
        ..options
    };
    client
        .producer()
        .with_topic(topic)
        .with_options(options)
        .build()
        .await
        .expect("create producer")
}

/// Sends every payload (pipelined), flushes a partial batch, and waits for
/// every receipt.
async fn send_all(producer: &mut Producer<TokioExecutor>, payloads: &[Vec<u8>]) {
    let mut receipts = Vec::with_capacity(payloads.len());
    for payload in payloads {
        receipts.push(producer.send_non_blocking(payload.clone()).await.unwrap());
    }
    if producer.options().batch_size.is_some() {
        producer.send_batch().await.unwrap();
    }
    for (index, receipt) in receipts.into_iter().enumerate() {
        let receipt = tokio::time::timeout(RECEIVE_TIMEOUT, receipt)
            .await
            .unwrap_or_else(|_| panic!("no receipt for message {index}"))
            .unwrap_or_else(|e| panic!("send of message {index} failed: {e}"));
        assert!(
            receipt.message_id.is_some(),
            "receipt {index} carries no message id"
        );
    }
}

async fn next_message(consumer: &mut Consumer<Vec<u8>, TokioExecutor>) -> Message<Vec<u8>> {
    tokio::time::timeout(RECEIVE_TIMEOUT, consumer.next())
        .await
        .unwrap_or_else(|_| panic!("no message within {RECEIVE_TIMEOUT:?}"))
        .expect("the consumer stream ended")
        .expect("the consumer failed")
}

fn properties(message: &Message<Vec<u8>>) -> BTreeMap<String, String> {
    message
        .metadata()
        .properties
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}

/// Sends a sentinel, reopens `subscription` and asserts the sentinel is the
/// first message it gets: everything before it was acknowledged.
async fn assert_nothing_left_but_sentinel(
    client: &Pulsar<TokioExecutor>,
    producer: &mut Producer<TokioExecutor>,
    topic: &str,
    subscription: &str,
    sub_type: SubType,
) {
    let sentinel = b"sentinel".to_vec();
    send_all(producer, std::slice::from_ref(&sentinel)).await;
    let mut consumer = subscribe(client, topic, subscription, sub_type).await;
    let first = next_message(&mut consumer).await;
    assert_eq!(
        String::from_utf8_lossy(&first.payload.data),
        "sentinel",
        "{topic}/{subscription}: an acknowledged message came again"
    );
    consumer.ack(&first).await.unwrap();
    consumer.close().await.unwrap();
}

/// Produces `MESSAGE_COUNT` messages with `options`, consumes them all in
/// order with exact payloads, acks each one individually, and checks the
/// subscription holds nothing more.
async fn produce_consume_in_order(name: &str, options: ProducerOptions) {
    let broker = Standalone::start(&[]);
    let client = broker.client().await;
    let topic = topic(name);
    let batched = options.batch_size.is_some();
    let compression = match options.compression {
        Some(Compression::Zstd(_)) => CompressionType::Zstd,
        Some(Compression::Snappy(_)) => CompressionType::Snappy,
        _ => CompressionType::None,
    };
    let mut consumer = subscribe(&client, &topic, "sub", SubType::Exclusive).await;
    let mut producer = producer(&client, &topic, options).await;
    let payloads: Vec<Vec<u8>> = (0..MESSAGE_COUNT).map(|i| payload(name, i)).collect();
    send_all(&mut producer, &payloads).await;

    let mut batch_entries = BTreeSet::new();
    for (index, expected) in payloads.iter().enumerate() {
        let message = next_message(&mut consumer).await;
        assert!(
            message.payload.data == *expected,
            "{name}: message {index} differs: got {:?}",
            String::from_utf8_lossy(&message.payload.data[..message.payload.data.len().min(32)])
        );
        // The producer's configuration reached the consumer unchanged.
        let metadata = message.metadata();
        assert_eq!(
            metadata.compression(),
            compression,
            "{name}: message {index}"
        );
        let id = message.message_id();
        if batched {
            assert!(
                id.batch_index.is_some(),
                "{name}: message {index} not in a batch"
            );
            batch_entries.insert((id.ledger_id, id.entry_id));
        } else {
            assert_eq!(id.batch_index, None, "{name}: message {index}");
        }
        consumer.ack(&message).await.unwrap();
    }
    if batched {
        let expected = MESSAGE_COUNT.div_ceil(BATCH_MESSAGES as usize);
        assert_eq!(
            batch_entries.len(),
            expected,
            "{name}: batches stored as entries"
        );
    }
    consumer.close().await.unwrap();
    assert_nothing_left_but_sentinel(&client, &mut producer, &topic, "sub", SubType::Exclusive)
        .await;
    producer.close().await.unwrap();
}

#[tokio::test]
async fn produce_consume_in_order_unbatched() {
    produce_consume_in_order("unbatched", ProducerOptions::default()).await;
}

#[tokio::test]
async fn produce_consume_in_order_batched() {
    let options = ProducerOptions {
        batch_size: Some(BATCH_MESSAGES),
        ..Default::default()
    };
    produce_consume_in_order("batched", options).await;
}

#[tokio::test]
async fn produce_consume_in_order_zstd() {
    let options = ProducerOptions {
        compression: Some(Compression::Zstd(CompressionZstd::default())),
        ..Default::default()
    };
    produce_consume_in_order("zstd", options).await;
}

#[tokio::test]
async fn produce_consume_in_order_batched_snappy() {
    let options = ProducerOptions {
        batch_size: Some(BATCH_MESSAGES),
        compression: Some(Compression::Snappy(CompressionSnappy::default())),
        ..Default::default()
    };
    produce_consume_in_order("batched-snappy", options).await;
}

/// A cumulative ack covers everything up to the acked message: a new
/// consumer on the subscription starts right after it.
#[tokio::test]
async fn cumulative_ack_then_new_consumer_gets_only_what_follows() {
    const ACKED_COUNT: usize = 60;
    let broker = Standalone::start(&[]);
    let client = broker.client().await;
    let topic = topic("cumulative");
    let mut consumer = subscribe(&client, &topic, "sub", SubType::Failover).await;
    let mut producer = producer(&client, &topic, ProducerOptions::default()).await;
    let payloads: Vec<Vec<u8>> = (0..MESSAGE_COUNT)
        .map(|i| payload("cumulative", i))
        .collect();
    send_all(&mut producer, &payloads).await;

    for expected in &payloads[..ACKED_COUNT - 1] {
        assert_eq!(next_message(&mut consumer).await.payload.data, *expected);
    }
    let last_acked = next_message(&mut consumer).await;
    assert_eq!(last_acked.payload.data, payloads[ACKED_COUNT - 1]);
    consumer.cumulative_ack(&last_acked).await.unwrap();
    consumer.close().await.unwrap();

    let mut consumer = subscribe(&client, &topic, "sub", SubType::Failover).await;
    for (index, expected) in payloads.iter().enumerate().skip(ACKED_COUNT) {
        let message = next_message(&mut consumer).await;
        assert!(
            message.payload.data == *expected,
            "after the cumulative ack of message {}: got {:?} where message {index} belongs",
            ACKED_COUNT - 1,
            String::from_utf8_lossy(&message.payload.data[..message.payload.data.len().min(32)])
        );
        if index == MESSAGE_COUNT - 1 {
            consumer.cumulative_ack(&message).await.unwrap();
        }
    }
    consumer.close().await.unwrap();
    assert_nothing_left_but_sentinel(&client, &mut producer, &topic, "sub", SubType::Failover)
        .await;
}

/// Two consumers on one Shared subscription: every message reaches exactly
/// one of them, and both get work.
#[tokio::test]
async fn shared_subscription_delivers_each_message_once() {
    let broker = Standalone::start(&[]);
    let client = broker.client().await;
    let topic = topic("shared");
    let mut first = subscribe(&client, &topic, "sub", SubType::Shared).await;
    let mut second = subscribe(&client, &topic, "sub", SubType::Shared).await;
    let mut producer = producer(&client, &topic, ProducerOptions::default()).await;
    let payloads: Vec<Vec<u8>> = (0..MESSAGE_COUNT).map(|i| payload("shared", i)).collect();
    send_all(&mut producer, &payloads).await;

    let mut received: HashMap<Vec<u8>, usize> = HashMap::new();
    let mut per_consumer = [0usize; 2];
    for _ in 0..MESSAGE_COUNT {
        let (which, message) = tokio::time::timeout(RECEIVE_TIMEOUT, async {
            tokio::select! {
                Some(m) = first.next() => (0, m),
                Some(m) = second.next() => (1, m),
                else => panic!("both consumer streams ended"),
            }
        })
        .await
        .unwrap_or_else(|_| panic!("only {} of {MESSAGE_COUNT} arrived", received.len()));
        let message = message.expect("the consumer failed");
        per_consumer[which] += 1;
        *received.entry(message.payload.data.clone()).or_default() += 1;
        let consumer = if which == 0 { &mut first } else { &mut second };
        consumer.ack(&message).await.unwrap();
    }
    let duplicated: Vec<_> = received.values().filter(|count| **count > 1).collect();
    assert!(
        duplicated.is_empty(),
        "{} messages came twice",
        duplicated.len()
    );
    let expected: BTreeSet<&Vec<u8>> = payloads.iter().collect();
    let got: BTreeSet<&Vec<u8>> = received.keys().collect();
    assert!(
        expected == got,
        "the consumers got other messages than were sent"
    );
    assert!(
        per_consumer.iter().all(|count| *count > 0),
        "one consumer got everything: {per_consumer:?}"
    );
    first.close().await.unwrap();
    second.close().await.unwrap();
    assert_nothing_left_but_sentinel(&client, &mut producer, &topic, "sub", SubType::Shared).await;
}

/// A negatively acknowledged message comes back, counted: the client's dead
/// letter policy (which reads the redelivery count the broker sends) moves
/// it to the dead letter topic once the count reaches its maximum.
#[tokio::test]
async fn negative_ack_redelivers_with_a_redelivery_count() {
    const MAX_REDELIVER_COUNT: usize = 2;
    let broker = Standalone::start(&[]);
    let client = broker.client().await;
    let topic = topic("nack");
    let dead_letter_topic = format!("{topic}-DLQ");
    let mut dead_letters = subscribe(&client, &dead_letter_topic, "dlq", SubType::Exclusive).await;
    let mut consumer: Consumer<Vec<u8>, TokioExecutor> = client
        .consumer()
        .with_topic(&topic)
        .with_subscription("sub")
        .with_subscription_type(SubType::Shared)
        .with_options(ConsumerOptions::default().with_initial_position(InitialPosition::Earliest))
        .with_dead_letter_policy(DeadLetterPolicy {
            max_redeliver_count: MAX_REDELIVER_COUNT,
            dead_letter_topic: dead_letter_topic.clone(),
        })
        .build()
        .await
        .unwrap();
    let mut producer = producer(&client, &topic, ProducerOptions::default()).await;
    let payloads: Vec<Vec<u8>> = (0..3).map(|i| payload("nack", i)).collect();
    send_all(&mut producer, &payloads).await;

    // Message 1 is refused each time it comes; the others are acked. It
    // comes back while its redelivery count is below the maximum.
    let mut nacked_id = None;
    let mut deliveries_of_refused = 0;
    let mut acked = BTreeSet::new();
    while acked.len() < 2 || deliveries_of_refused < MAX_REDELIVER_COUNT {
        let message = next_message(&mut consumer).await;
        if message.payload.data == payloads[1] {
            deliveries_of_refused += 1;
            assert!(
                deliveries_of_refused <= MAX_REDELIVER_COUNT,
                "a message was redelivered {deliveries_of_refused} times past \
                 max_redeliver_count {MAX_REDELIVER_COUNT}: the redelivery count did not grow"
            );
            let id = message.message_id().clone();
            assert_eq!(
                *nacked_id.get_or_insert(id.clone()),
                id,
                "the redelivery has a new id"
            );
            consumer.nack(&message).await.unwrap();
        } else {
            assert!(
                acked.insert(message.payload.data.clone()),
                "an acked message came again"
            );
            consumer.ack(&message).await.unwrap();
        }
    }

    let dead = next_message(&mut dead_letters).await;
    assert_eq!(dead.payload.data, payloads[1]);
    assert_eq!(properties(&dead).get("REAL_TOPIC"), Some(&topic));
    dead_letters.ack(&dead).await.unwrap();
    consumer.close().await.unwrap();
    // The client acked the message on the original topic once it moved it.
    assert_nothing_left_but_sentinel(&client, &mut producer, &topic, "sub", SubType::Shared).await;
}

/// A message received and never acknowledged comes back after the client's
/// unacked-message resend delay (ack timeout).
#[tokio::test]
async fn unacknowledged_message_comes_back_after_ack_timeout() {
    let broker = Standalone::start(&[]);
    let client = broker.client().await;
    let topic = topic("ack-timeout");
    let mut consumer: Consumer<Vec<u8>, TokioExecutor> = client
        .consumer()
        .with_topic(&topic)
        .with_subscription("sub")
        .with_subscription_type(SubType::Shared)
        .with_options(ConsumerOptions::default().with_initial_position(InitialPosition::Earliest))
        .with_unacked_message_resend_delay(Some(Duration::from_millis(500)))
        .build()
        .await
        .unwrap();
    let mut producer = producer(&client, &topic, ProducerOptions::default()).await;
    let payloads: Vec<Vec<u8>> = (0..2).map(|i| payload("ack-timeout", i)).collect();
    send_all(&mut producer, &payloads).await;

    let unacked = next_message(&mut consumer).await;
    assert_eq!(unacked.payload.data, payloads[0]);
    let second = next_message(&mut consumer).await;
    assert_eq!(second.payload.data, payloads[1]);
    consumer.ack(&second).await.unwrap();
    let again = next_message(&mut consumer).await;
    assert_eq!(again.payload.data, payloads[0]);
    assert_eq!(again.message_id(), unacked.message_id());
    consumer.ack(&again).await.unwrap();
    consumer.close().await.unwrap();
    assert_nothing_left_but_sentinel(&client, &mut producer, &topic, "sub", SubType::Shared).await;
}

/// Key, properties and event time set by the producer arrive unchanged, with
/// and without batching.
#[tokio::test]
async fn key_and_properties_survive_the_round_trip() {
    const COUNT: usize = 40;
    let broker = Standalone::start(&[]);
    let client = broker.client().await;
    for (name, batch_size) in [
        ("keys-unbatched", None),
        ("keys-batched", Some(BATCH_MESSAGES)),
    ] {
        let topic = topic(name);
        let mut consumer = subscribe(&client, &topic, "sub", SubType::Exclusive).await;
        let options = ProducerOptions {
            batch_size,
            ..Default::default()
        };
        let mut producer = producer(&client, &topic, options).await;
        let mut receipts = Vec::new();
        for index in 0..COUNT {
            let mut builder = producer
                .create_message()
                .with_content(payload(name, index))
                .with_key(format!("key-{}", index % 7))
                .with_property("index", index.to_string())
                .with_property("origin", "pulsar-rs")
                .event_time(1_700_000_000_000 + index as u64);
            if index % 2 == 0 {
                builder = builder.with_property("even", "yes");
            }
            receipts.push(builder.send_non_blocking().await.unwrap());
        }
        if batch_size.is_some() {
            producer.send_batch().await.unwrap();
        }
        for receipt in receipts {
            tokio::time::timeout(RECEIVE_TIMEOUT, receipt)
                .await
                .unwrap()
                .unwrap();
        }

        for index in 0..COUNT {
            let message = next_message(&mut consumer).await;
            assert_eq!(
                message.payload.data,
                payload(name, index),
                "{name}: message {index}"
            );
            assert_eq!(
                message.key(),
                Some(format!("key-{}", index % 7)),
                "{name}: {index}"
            );
            let mut expected = BTreeMap::from([
                ("index".to_owned(), index.to_string()),
                ("origin".to_owned(), "pulsar-rs".to_owned()),
            ]);
            if index % 2 == 0 {
                expected.insert("even".to_owned(), "yes".to_owned());
            }
            assert_eq!(properties(&message), expected, "{name}: message {index}");
            assert_eq!(
                message.metadata().event_time,
                Some(1_700_000_000_000 + index as u64),
                "{name}: message {index}"
            );
            consumer.ack(&message).await.unwrap();
        }
        consumer.close().await.unwrap();
        producer.close().await.unwrap();
    }
}

/// A topic created with 4 partitions over the admin API: the client sees the
/// partitions, routes each key to one partition, and a consumer of the
/// partitioned topic gets every message once, in order per key.
#[tokio::test]
async fn partitioned_topic_routes_keys_and_delivers_everything() {
    const PARTITIONS: usize = 4;
    const KEYS: usize = 12;
    let broker = Standalone::start(&[]);
    let (status, _) = broker.http_put_json(
        "/admin/v2/persistent/public/default/partitioned/partitions",
        &PARTITIONS.to_string(),
    );
    assert_eq!(status, 204, "creating the partitioned topic");
    let client = broker.client().await;
    let topic = topic("partitioned");
    let mut consumer = subscribe(&client, &topic, "sub", SubType::Exclusive).await;
    let options = ProducerOptions {
        // RoundRobin sends a keyed message to the partition of its key's
        // hash (keyless ones round-robin); with no policy set, this client
        // round-robins every message, keys or not.
        routing_policy: Some(RoutingPolicy::RoundRobin),
        ..Default::default()
    };
    let mut producer = producer(&client, &topic, options).await;
    let partitions = producer
        .partitions()
        .expect("the producer sees a partitioned topic");
    assert_eq!(partitions.len(), PARTITIONS);

    let mut receipts = Vec::new();
    let mut sent: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    for index in 0..MESSAGE_COUNT {
        let key = format!("key-{}", index % KEYS);
        let payload = payload("partitioned", index);
        sent.entry(key.clone()).or_default().push(payload.clone());
        let receipt = producer
            .create_message()
            .with_content(payload)
            .with_key(key)
            .send_non_blocking()
            .await
            .unwrap();
        receipts.push(receipt);
    }
    for receipt in receipts {
        tokio::time::timeout(RECEIVE_TIMEOUT, receipt)
            .await
            .unwrap()
            .unwrap();
    }

    let mut received: BTreeMap<String, Vec<Vec<u8>>> = BTreeMap::new();
    let mut partitions_used = BTreeSet::new();
    for _ in 0..MESSAGE_COUNT {
        let message = next_message(&mut consumer).await;
        let key = message.key().expect("a key");
        let expected_partition = RoutingPolicy::compute_partition_index_for_key(&key, PARTITIONS);
        assert_eq!(
            message.topic,
            format!("{topic}-partition-{expected_partition}"),
            "key {key} is stored in the partition its producer chose"
        );
        partitions_used.insert(expected_partition);
        received
            .entry(key)
            .or_default()
            .push(message.payload.data.clone());
        consumer.ack(&message).await.unwrap();
    }
    assert!(
        received == sent,
        "per key, the messages differ from those sent, or their order"
    );
    assert!(partitions_used.len() > 1, "all keys went to one partition");
    consumer.close().await.unwrap();
    producer.close().await.unwrap();
}
