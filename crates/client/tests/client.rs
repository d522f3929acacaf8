//! The native client against an in-process broker (in-memory metadata and
//! ledgers): ordered receipts, batching and compression round trips, key
//! routing over partitions, pending bounds, acks, and reconnect with resend
//! when the broker unloads the topic under load.
#![allow(clippy::unwrap_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use vela_broker::{Broker, BrokerConfig, BrokerHandle};
use vela_client::{
    BatchingOptions, Client, ClientConfig, ClientError, CompressionType, ConsumerOptions,
    InitialPosition, OutgoingMessage, ProducerOptions, SubType,
};

const RECEIVE_TIMEOUT: Duration = Duration::from_secs(10);

async fn broker() -> (BrokerHandle, Client) {
    let config = BrokerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
    let broker = Broker::start(config, meta, vela_log::LogEnv::in_memory())
        .await
        .unwrap();
    let client = Client::new(broker.service_url(), ClientConfig::default()).unwrap();
    (broker, client)
}

fn topic(name: &str) -> String {
    format!("persistent://public/default/{name}")
}

fn payload(i: u64) -> Bytes {
    Bytes::from(format!("message-{i}-{}", "p".repeat((i % 97) as usize)))
}

fn earliest(subscription: &str) -> ConsumerOptions {
    ConsumerOptions {
        initial_position: InitialPosition::Earliest,
        ..ConsumerOptions::new(subscription)
    }
}

async fn round_trip(client: &Client, name: &str, options: ProducerOptions, count: u64) {
    let topic = topic(name);
    let consumer = client.subscribe(&topic, earliest("s")).await.unwrap();
    let producer = client.create_producer(&topic, options).await.unwrap();
    let mut receipts = Vec::new();
    for i in 0..count {
        receipts.push(
            producer
                .send(OutgoingMessage::new(payload(i)))
                .await
                .unwrap(),
        );
    }
    let mut ids = Vec::new();
    for receipt in receipts {
        ids.push(receipt.await.unwrap());
    }
    assert!(
        ids.windows(2).all(|w| w[0] < w[1]),
        "receipts in send order"
    );
    for i in 0..count {
        let message = consumer
            .receive_timeout(RECEIVE_TIMEOUT)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(message.payload, payload(i), "message {i}");
        assert_eq!(message.id, ids[i as usize]);
        consumer.ack(&message.id).await.unwrap();
    }
    producer.close().await.unwrap();
    consumer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unbatched_batched_and_compressed_round_trips() {
    let (broker, client) = broker().await;
    let unbatched = ProducerOptions {
        batching: None,
        ..ProducerOptions::default()
    };
    round_trip(&client, "unbatched", unbatched, 300).await;
    round_trip(&client, "batched", ProducerOptions::default(), 3000).await;
    for (name, codec) in [
        ("lz4", CompressionType::Lz4),
        ("zlib", CompressionType::Zlib),
        ("zstd", CompressionType::Zstd),
        ("snappy", CompressionType::Snappy),
    ] {
        let options = ProducerOptions {
            compression: codec,
            batching: Some(BatchingOptions {
                max_messages: 50,
                ..BatchingOptions::default()
            }),
            ..ProducerOptions::default()
        };
        round_trip(&client, name, options, 500).await;
    }
    client.close().await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn keys_and_properties_survive_and_pick_one_partition_each() {
    let (broker, client) = broker().await;
    let name = topic("partitioned");
    broker.create_partitioned_topic(&name, 4).await.unwrap();
    let consumer = client.subscribe(&name, earliest("s")).await.unwrap();
    let producer = client
        .create_producer(&name, ProducerOptions::default())
        .await
        .unwrap();
    assert_eq!(producer.partition_count(), 4);
    let mut receipts = Vec::new();
    for i in 0..400u64 {
        let mut message = OutgoingMessage::new(payload(i)).with_key(format!("key-{}", i % 10));
        message.properties = BTreeMap::from([("i".to_string(), i.to_string())]);
        receipts.push(producer.send(message).await.unwrap());
    }
    for receipt in receipts {
        receipt.await.unwrap();
    }
    let mut partitions_of_key: BTreeMap<String, BTreeSet<i32>> = BTreeMap::new();
    let mut last_of_key: BTreeMap<String, u64> = BTreeMap::new();
    for _ in 0..400 {
        let message = consumer
            .receive_timeout(RECEIVE_TIMEOUT)
            .await
            .unwrap()
            .unwrap();
        let key = message.key.clone().unwrap();
        let i: u64 = message.properties["i"].parse().unwrap();
        assert_eq!(message.payload, payload(i));
        assert_eq!(key, format!("key-{}", i % 10));
        // Per key, order is kept (one partition, one producer).
        if let Some(last) = last_of_key.insert(key.clone(), i) {
            assert!(last < i, "key {key}: {i} after {last}");
        }
        partitions_of_key
            .entry(key)
            .or_default()
            .insert(message.id.partition);
        consumer.ack(&message.id).await.unwrap();
    }
    assert!(partitions_of_key.values().all(|set| set.len() == 1));
    let used: BTreeSet<i32> = partitions_of_key.values().flatten().copied().collect();
    assert!(used.len() > 1, "ten keys spread over partitions: {used:?}");
    client.close().await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_queue_fails_fast_when_told_not_to_block_and_oversize_is_refused() {
    let (broker, client) = broker().await;
    let producer = client
        .create_producer(
            &topic("bounded"),
            ProducerOptions {
                max_pending_messages: 5,
                block_if_queue_full: false,
                batching: Some(BatchingOptions {
                    max_messages: 1000,
                    max_delay: Duration::from_secs(3600),
                    ..BatchingOptions::default()
                }),
                ..ProducerOptions::default()
            },
        )
        .await
        .unwrap();
    // The batch never fills or times out, so five messages stay pending.
    let mut held = Vec::new();
    for i in 0..5 {
        held.push(
            producer
                .send(OutgoingMessage::new(payload(i)))
                .await
                .unwrap(),
        );
    }
    let refused = producer.send(OutgoingMessage::new(payload(5))).await;
    assert!(
        matches!(refused, Err(ClientError::QueueFull(_))),
        "{refused:?}"
    );
    producer.flush().await;
    for receipt in held {
        receipt.await.unwrap();
    }
    let huge = Bytes::from(vec![0u8; 6 * 1024 * 1024]);
    let refused = producer.send(OutgoingMessage::new(huge)).await;
    assert!(
        matches!(refused, Err(ClientError::MessageTooLarge { .. })),
        "{refused:?}"
    );
    client.close().await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cumulative_ack_and_shared_subscriptions() {
    let (broker, client) = broker().await;
    let name = topic("acks");
    let first = client.subscribe(&name, earliest("c")).await.unwrap();
    // Unbatched: a cumulative ack inside a batch leaves the batch unacked
    // (without batch-index acks the whole batch comes again).
    let producer = client
        .create_producer(
            &name,
            ProducerOptions {
                batching: None,
                ..ProducerOptions::default()
            },
        )
        .await
        .unwrap();
    for i in 0..100 {
        producer
            .send(OutgoingMessage::new(payload(i)))
            .await
            .unwrap();
    }
    producer.flush().await;
    let mut fiftieth = None;
    for i in 0..50 {
        let message = first
            .receive_timeout(RECEIVE_TIMEOUT)
            .await
            .unwrap()
            .unwrap();
        assert_eq!(message.payload, payload(i));
        fiftieth = Some(message.id);
    }
    first.ack_cumulative(&fiftieth.unwrap()).await.unwrap();
    first.close().await.unwrap();
    // The ack is processed in order on the connection before the close.
    let second = client.subscribe(&name, earliest("c")).await.unwrap();
    let next = second
        .receive_timeout(RECEIVE_TIMEOUT)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(next.payload, payload(50));
    second.close().await.unwrap();

    // Two shared consumers split the topic without duplicates.
    let shared = |name: &str| ConsumerOptions {
        sub_type: SubType::Shared,
        receiver_queue_size: 10,
        name: Some(name.to_string()),
        ..earliest("shared")
    };
    let a = client.subscribe(&name, shared("a")).await.unwrap();
    let b = client.subscribe(&name, shared("b")).await.unwrap();
    let mut seen = BTreeSet::new();
    while seen.len() < 100 {
        let message = tokio::select! {
            m = a.receive() => { let m = m.unwrap(); a.ack(&m.id).await.unwrap(); m }
            m = b.receive() => { let m = m.unwrap(); b.ack(&m.id).await.unwrap(); m }
            _ = tokio::time::sleep(RECEIVE_TIMEOUT) => panic!("only {} of 100", seen.len()),
        };
        assert!(seen.insert(message.payload.clone()), "duplicate");
    }
    client.close().await;
    broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn producer_and_consumer_reconnect_when_the_topic_is_unloaded() {
    let (broker, client) = broker().await;
    let name = topic("unload");
    let consumer = client.subscribe(&name, earliest("s")).await.unwrap();
    let producer = client
        .create_producer(
            &name,
            ProducerOptions {
                batching: None,
                ..ProducerOptions::default()
            },
        )
        .await
        .unwrap();
    let mut receipts = Vec::new();
    for i in 0..2000u64 {
        receipts.push(
            producer
                .send(OutgoingMessage::new(payload(i)))
                .await
                .unwrap(),
        );
        if i == 700 || i == 1400 {
            assert!(broker.unload_topic(&name).await.unwrap());
        }
    }
    for receipt in receipts {
        receipt.await.unwrap();
    }
    // Every message arrives; a message whose receipt was lost in the unload
    // may come twice (no dedup), but never out of order.
    let mut next = 0u64;
    while next < 2000 {
        let message = consumer
            .receive_timeout(RECEIVE_TIMEOUT)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("stalled at {next}"));
        let text = String::from_utf8(message.payload.to_vec()).unwrap();
        let i: u64 = text.split('-').nth(1).unwrap().parse().unwrap();
        assert!(i <= next, "gap: got {i}, expected {next}");
        if i == next {
            next += 1;
        }
        consumer.ack(&message.id).await.unwrap();
    }
    client.close().await;
    broker.shutdown().await.unwrap();
}
