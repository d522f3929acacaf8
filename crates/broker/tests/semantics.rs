//! Subscription and producer semantics over the protocol: Key_Shared order
//! when consumers join, failover notifications, permits counting batch
//! messages, producer epochs, deduplication, seek, readers.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::{Client, expect_nothing_but_pong, message_of, metadata, receipt_seq, start_broker};
use vela_broker::{NamespaceName, NamespacePolicies};
use vela_wire::proto::{self, MessageIdData, command_ack::AckType, command_subscribe::SubType};

async fn subscribe_named(
    client: &mut Client,
    topic: &str,
    sub: &str,
    sub_type: SubType,
    consumer_id: u64,
    name: &str,
) {
    client
        .send(proto::CommandSubscribe {
            topic: topic.into(),
            subscription: sub.into(),
            sub_type: sub_type as i32,
            consumer_id,
            request_id: 3000 + consumer_id,
            consumer_name: Some(name.into()),
            initial_position: Some(proto::command_subscribe::InitialPosition::Earliest as i32),
            ..Default::default()
        })
        .await;
}

#[tokio::test]
async fn key_shared_joining_consumer_waits_for_earlier_messages_of_its_keys() {
    let broker = start_broker().await;
    let addr = broker.pulsar_addr();
    // A key in the lower half of the hash space: the second consumer takes it over.
    let key = (0..1000)
        .map(|i| format!("key-{i}"))
        .find(|k| vela_broker::key_shared::slot_of(k.as_bytes()) <= 32_768)
        .unwrap();
    let mut producer = Client::connect(addr).await;
    producer.create_producer("ks", 1).await;
    let mut a = Client::connect(addr).await;
    a.subscribe("ks", "s", SubType::KeyShared, 1).await;
    a.flow(1, 100).await;
    let with_key = |seq| proto::MessageMetadata {
        ordering_key: Some(key.clone().into_bytes().into()),
        ..metadata(seq)
    };
    producer.produce_with(1, 0, with_key(0), b"first").await;
    receipt_seq(&producer.recv().await);
    let first = a.recv().await;
    let first_id = message_of(&first).0.message_id.clone();

    let mut b = Client::connect(addr).await;
    b.subscribe("ks", "s", SubType::KeyShared, 2).await;
    b.flow(2, 100).await;
    producer.produce_with(1, 1, with_key(1), b"second").await;
    receipt_seq(&producer.recv().await);
    // The key now belongs to B, but B must not get "second" before "first" is acked.
    expect_nothing_but_pong(&mut b).await;
    expect_nothing_but_pong(&mut a).await;
    a.send(proto::CommandAck {
        consumer_id: 1,
        ack_type: AckType::Individual as i32,
        message_id: vec![first_id],
        ..Default::default()
    })
    .await;
    let second = b.recv().await;
    assert_eq!(message_of(&second).1.as_ref(), b"second");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn failover_tells_consumers_who_is_active() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    subscribe_named(&mut client, "fo", "s", SubType::Failover, 1, "b-consumer").await;
    // SUCCESS and ACTIVE_CONSUMER_CHANGE(active) in some order.
    let mut active = std::collections::HashMap::new();
    let mut successes = 0;
    while successes < 1 || active.is_empty() {
        let frame = client.recv().await;
        if frame.command.success.is_some() {
            successes += 1;
        } else if let Some(change) = frame.command.active_consumer_change {
            active.insert(change.consumer_id, change.is_active);
        }
    }
    assert_eq!(active.get(&1), Some(&Some(true)));
    // "a-consumer" sorts first: it becomes active, the other is told it is not.
    subscribe_named(&mut client, "fo", "s", SubType::Failover, 2, "a-consumer").await;
    active.clear();
    successes = 0;
    while successes < 1 || active.len() < 2 {
        let frame = client.recv().await;
        if frame.command.success.is_some() {
            successes += 1;
        } else if let Some(change) = frame.command.active_consumer_change {
            active.insert(change.consumer_id, change.is_active);
        }
    }
    assert_eq!(active.get(&2), Some(&Some(true)));
    assert_eq!(active.get(&1), Some(&Some(false)));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn permits_count_messages_of_a_batch() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("batch", 1).await;
    for seq in 0..2 {
        let batch = proto::MessageMetadata {
            num_messages_in_batch: Some(5),
            ..metadata(seq * 5)
        };
        client
            .produce_with(1, seq * 5, batch, b"opaque batch payload")
            .await;
        receipt_seq(&client.recv().await);
    }
    client.subscribe("batch", "s", SubType::Exclusive, 1).await;
    client.flow(1, 3).await;
    // The first batch goes out (permits 3 > 0) and takes them to -2.
    assert_eq!(message_of(&client.recv().await).0.message_id.entry_id, 0);
    expect_nothing_but_pong(&mut client).await;
    client.flow(1, 2).await; // back to 0: still nothing
    expect_nothing_but_pong(&mut client).await;
    client.flow(1, 1).await;
    assert_eq!(message_of(&client.recv().await).0.message_id.entry_id, 1);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn producer_epochs_and_name_clashes() {
    let broker = start_broker().await;
    let addr = broker.pulsar_addr();
    let mut old = Client::connect(addr).await;
    let producer = |epoch, producer_id, request_id| proto::CommandProducer {
        topic: "epochs".into(),
        producer_id,
        request_id,
        producer_name: Some("named".into()),
        epoch: Some(epoch),
        ..Default::default()
    };
    old.send(producer(0, 1, 1)).await;
    assert!(old.recv().await.command.producer_success.is_some());
    // Same name, same epoch, other connection: busy.
    let mut other = Client::connect(addr).await;
    other.send(producer(0, 1, 2)).await;
    let error = other.recv().await.command.error.unwrap();
    assert_eq!(error.error, proto::ServerError::ProducerBusy as i32);
    // A reconnect with a higher epoch replaces the old producer, which is closed.
    other.send(producer(1, 1, 3)).await;
    assert!(other.recv().await.command.producer_success.is_some());
    let close = old.recv().await.command.close_producer.unwrap();
    assert_eq!(close.producer_id, 1);
    other.produce(1, 0, b"x").await;
    assert_eq!(receipt_seq(&other.recv().await), 0);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn deduplication_drops_repeated_sequence_ids() {
    let broker = start_broker().await;
    let ns = NamespaceName::parse("public/dedup").unwrap();
    broker
        .admin()
        .create_namespace(
            &ns,
            NamespacePolicies {
                deduplication_enabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut client = Client::connect(broker.pulsar_addr()).await;
    let topic = "persistent://public/dedup/t";
    client.create_producer(topic, 1).await;
    // Each SEND waits for its answer: a re-send of a durable one is a
    // duplicate, answered (-1, -1) without a second entry. (A re-send while
    // the first copy is still in flight gets a retriable error instead:
    // `topic::dedup`'s unit tests.)
    let mut entries = Vec::new();
    for seq in [0, 1, 1, 2, 0] {
        client.produce(1, seq, b"x").await;
        let frame = client.recv().await;
        let receipt = frame.command.send_receipt.unwrap();
        assert_eq!(receipt.sequence_id, seq);
        entries.push(receipt.message_id.unwrap().entry_id);
    }
    assert_eq!(entries, vec![0, 1, u64::MAX, 2, u64::MAX]);
    // A reconnecting producer learns the last sequence id.
    let mut again = Client::connect(broker.pulsar_addr()).await;
    again
        .send(proto::CommandProducer {
            topic: topic.into(),
            producer_id: 1,
            request_id: 9,
            producer_name: Some("standalone-0-0".into()),
            epoch: Some(1),
            ..Default::default()
        })
        .await;
    let success = again.recv().await.command.producer_success.unwrap();
    assert_eq!(success.last_sequence_id, Some(2));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn seek_closes_consumers_and_rewinds() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("seek", 1).await;
    for seq in 0..5 {
        client.produce(1, seq, format!("m{seq}").as_bytes()).await;
        receipt_seq(&client.recv().await);
    }
    client.subscribe("seek", "s", SubType::Exclusive, 1).await;
    client.flow(1, 100).await;
    let mut ledger_id = 0;
    for _ in 0..5 {
        let frame = client.recv().await;
        ledger_id = message_of(&frame).0.message_id.ledger_id;
    }
    client
        .send(proto::CommandSeek {
            consumer_id: 1,
            request_id: 70,
            message_id: Some(MessageIdData {
                ledger_id,
                entry_id: 2,
                ..Default::default()
            }),
            message_publish_time: None,
        })
        .await;
    let close = client.recv().await.command.close_consumer.unwrap();
    assert_eq!(close.consumer_id, 1);
    assert_eq!(client.recv().await.command.success.unwrap().request_id, 70);
    client.subscribe("seek", "s", SubType::Exclusive, 1).await;
    client.flow(1, 100).await;
    let entries: Vec<u64> = [
        client.recv().await,
        client.recv().await,
        client.recv().await,
    ]
    .iter()
    .map(|f| message_of(f).0.message_id.entry_id)
    .collect();
    assert_eq!(entries, vec![2, 3, 4]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn reader_start_positions() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("reader", 1).await;
    let mut ledger_id = 0;
    for seq in 0..4 {
        client.produce(1, seq, b"x").await;
        ledger_id = client
            .recv()
            .await
            .command
            .send_receipt
            .unwrap()
            .message_id
            .unwrap()
            .ledger_id;
    }
    let cases = [
        (Some((u64::MAX, u64::MAX)), vec![0, 1, 2, 3]), // earliest
        (Some((ledger_id, 2)), vec![2, 3]),             // from the start entry
        (Some((i64::MAX as u64, i64::MAX as u64)), vec![]), // latest
        (None, vec![]),                                 // absent = latest
    ];
    for (index, (start, expected)) in cases.into_iter().enumerate() {
        let consumer_id = 10 + index as u64;
        client
            .send(proto::CommandSubscribe {
                topic: "reader".into(),
                subscription: format!("reader-{index}"),
                sub_type: SubType::Exclusive as i32,
                consumer_id,
                request_id: 100 + consumer_id,
                durable: Some(false),
                start_message_id: start.map(|(ledger_id, entry_id)| MessageIdData {
                    ledger_id,
                    entry_id,
                    ..Default::default()
                }),
                ..Default::default()
            })
            .await;
        assert!(client.recv().await.command.success.is_some());
        client.flow(consumer_id, 100).await;
        let mut got = Vec::new();
        for _ in 0..expected.len() {
            got.push(message_of(&client.recv().await).0.message_id.entry_id);
        }
        assert_eq!(got, expected, "case {index}");
        expect_nothing_but_pong(&mut client).await;
    }
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn without_auto_creation_only_existing_topics_are_served() {
    let broker = common::start_broker_with(|c| c.auto_create_topics = false).await;
    broker.create_partitioned_topic("parted", 2).await.unwrap();
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client
        .send(proto::CommandProducer {
            topic: "absent".into(),
            producer_id: 1,
            request_id: 1,
            ..Default::default()
        })
        .await;
    let error = client.recv().await.command.error.unwrap();
    assert_eq!(error.error, proto::ServerError::TopicNotFound as i32);
    // Partitions of a partitioned topic exist; an index beyond them does not.
    client.create_producer("parted-partition-1", 2).await;
    client
        .send(proto::CommandProducer {
            topic: "parted-partition-2".into(),
            producer_id: 3,
            request_id: 3,
            ..Default::default()
        })
        .await;
    let error = client.recv().await.command.error.unwrap();
    assert_eq!(error.error, proto::ServerError::TopicNotFound as i32);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn topic_stats_count_traffic_and_backlog() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("stats", 1).await;
    client.subscribe("stats", "s", SubType::Shared, 1).await;
    for seq in 0..3 {
        client.produce(1, seq, b"0123456789").await;
        receipt_seq(&client.recv().await);
    }
    client.flow(1, 2).await;
    let first = message_of(&client.recv().await).0.message_id.clone();
    message_of(&client.recv().await);
    client
        .send(proto::CommandAck {
            consumer_id: 1,
            ack_type: AckType::Individual as i32,
            message_id: vec![first],
            ..Default::default()
        })
        .await;
    common::expect_nothing_but_pong(&mut client).await;
    let stats = broker.topic_stats("stats").await.unwrap().unwrap();
    assert_eq!(stats.topic, "persistent://public/default/stats");
    assert_eq!(stats.msg_in_counter, 3);
    assert_eq!(stats.entries, 3);
    assert_eq!(stats.msg_out_counter, 2);
    assert_eq!(stats.publishers.len(), 1);
    assert_eq!(stats.publishers[0].producer_name, "standalone-0-0");
    let sub = &stats.subscriptions[0];
    assert_eq!((sub.name.as_str(), sub.sub_type.as_str()), ("s", "Shared"));
    assert_eq!(sub.msg_backlog, 2);
    assert_eq!(sub.unacked_messages, 1);
    assert_eq!(sub.consumers[0].available_permits, 0);
    assert_eq!(
        broker.served_topics(),
        vec!["persistent://public/default/stats"]
    );
    assert!(broker.topic_stats("other").await.unwrap().is_none());
    let metrics = broker.metrics();
    assert_eq!(metrics.publish_latency.count, 3);
    assert_eq!(metrics.active_connections, 1);
    assert_eq!(metrics.send_errors, 0);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn shared_prefers_the_best_priority_level() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("prio", 1).await;
    for (consumer_id, priority) in [(1u64, 1), (2, 0)] {
        client
            .send(proto::CommandSubscribe {
                topic: "prio".into(),
                subscription: "s".into(),
                sub_type: SubType::Shared as i32,
                consumer_id,
                request_id: 10 + consumer_id,
                priority_level: Some(priority),
                ..Default::default()
            })
            .await;
        assert!(client.recv().await.command.success.is_some());
    }
    client.flow(1, 10).await;
    client.flow(2, 3).await;
    // CONSUMER_STATS goes through the subscription task after the FLOWs: its
    // answer proves both were applied before anything is published.
    client
        .send(proto::CommandConsumerStats {
            request_id: 20,
            consumer_id: 2,
        })
        .await;
    let stats = client.recv().await.command.consumer_stats_response.unwrap();
    assert_eq!(stats.available_permits, Some(3));
    for seq in 0..5 {
        client.produce(1, seq, b"x").await;
    }
    let mut receipts = 0;
    let mut by_consumer = std::collections::HashMap::<u64, u32>::new();
    while receipts < 5 || by_consumer.values().sum::<u32>() < 5 {
        let frame = client.recv().await;
        if frame.command.send_receipt.is_some() {
            receipts += 1;
        } else if let Some(message) = &frame.command.message {
            *by_consumer.entry(message.consumer_id).or_default() += 1;
        }
    }
    // Priority 0 takes its 3 permits' worth first; the rest overflow to priority 1.
    assert_eq!(by_consumer.get(&2), Some(&3));
    assert_eq!(by_consumer.get(&1), Some(&2));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn deduplication_survives_a_broker_restart() {
    let meta: std::sync::Arc<dyn vela_meta::MetadataStore> =
        std::sync::Arc::new(vela_meta::MemoryStore::new());
    let log_env = vela_log::LogEnv::new(
        std::sync::Arc::clone(&meta),
        std::sync::Arc::new(vela_log::memory::MemoryBackend(
            vela_log::memory::MemoryLedgers::new(),
        )),
    );
    let topic = "persistent://public/dd/t";
    let producer = |epoch| proto::CommandProducer {
        topic: topic.into(),
        producer_id: 1,
        request_id: 1,
        producer_name: Some("p".into()),
        epoch: Some(epoch),
        ..Default::default()
    };
    let broker = common::start_broker_on(std::sync::Arc::clone(&meta), log_env.clone()).await;
    broker
        .admin()
        .create_namespace(
            &NamespaceName::parse("public/dd").unwrap(),
            NamespacePolicies {
                deduplication_enabled: Some(true),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.send(producer(0)).await;
    assert!(client.recv().await.command.producer_success.is_some());
    for seq in 0..4 {
        client.produce(1, seq, b"x").await;
        receipt_seq(&client.recv().await);
    }
    drop(client);
    broker.shutdown().await.unwrap();

    let broker = common::start_broker_on(meta, log_env).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.send(producer(1)).await;
    let success = client.recv().await.command.producer_success.unwrap();
    assert_eq!(success.last_sequence_id, Some(3));
    client.produce(1, 2, b"x").await; // a re-send after the restart
    client.produce(1, 4, b"x").await;
    let duplicate = client.recv().await.command.send_receipt.unwrap();
    assert_eq!(duplicate.message_id.unwrap().entry_id, u64::MAX);
    let fresh = client.recv().await.command.send_receipt.unwrap();
    assert_eq!(fresh.sequence_id, 4);
    assert_ne!(fresh.message_id.unwrap().entry_id, u64::MAX);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn acknowledgements_survive_a_broker_restart() {
    let meta: std::sync::Arc<dyn vela_meta::MetadataStore> =
        std::sync::Arc::new(vela_meta::MemoryStore::new());
    let log_env = vela_log::LogEnv::new(
        std::sync::Arc::clone(&meta),
        std::sync::Arc::new(vela_log::memory::MemoryBackend(
            vela_log::memory::MemoryLedgers::new(),
        )),
    );
    let broker = common::start_broker_on(std::sync::Arc::clone(&meta), log_env.clone()).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("durable", 1).await;
    for seq in 0..5 {
        client.produce(1, seq, b"x").await;
        receipt_seq(&client.recv().await);
    }
    client.subscribe("durable", "s", SubType::Shared, 1).await;
    client.flow(1, 100).await;
    let mut ids: Vec<MessageIdData> = Vec::new();
    for _ in 0..5 {
        ids.push(message_of(&client.recv().await).0.message_id.clone());
    }
    // Ack 0, 1 and 3: 2 and 4 stay.
    client
        .send(proto::CommandAck {
            consumer_id: 1,
            ack_type: AckType::Individual as i32,
            message_id: vec![ids[0].clone(), ids[1].clone(), ids[3].clone()],
            request_id: Some(1),
            ..Default::default()
        })
        .await;
    assert!(client.recv().await.command.ack_response.is_some());
    drop(client);
    broker.shutdown().await.unwrap();

    let broker = common::start_broker_on(meta, log_env).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.subscribe("durable", "s", SubType::Shared, 1).await;
    client.flow(1, 100).await;
    let mut entries = vec![
        message_of(&client.recv().await).0.message_id.entry_id,
        message_of(&client.recv().await).0.message_id.entry_id,
    ];
    entries.sort_unstable();
    assert_eq!(entries, vec![ids[2].entry_id, ids[4].entry_id]);
    expect_nothing_but_pong(&mut client).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn unload_delete_and_unsubscribe_from_the_api() {
    let broker = common::start_broker_with(|c| c.auto_create_topics = false).await;
    broker
        .admin()
        .register_topic(&vela_broker::TopicName::parse("admin-t").unwrap())
        .await
        .unwrap();
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("admin-t", 1).await;
    client
        .subscribe("admin-t", "s", SubType::Exclusive, 1)
        .await;
    client.produce(1, 0, b"x").await;
    receipt_seq(&client.recv().await);
    assert_eq!(broker.subscriptions("admin-t").await.unwrap(), vec!["s"]);

    // Unload: both get CLOSE_*; the topic is served again on re-attach.
    assert!(broker.unload_topic("admin-t").await.unwrap());
    let mut closed = (false, false);
    while closed != (true, true) {
        let command = client.recv().await.command;
        closed.0 |= command.close_producer.is_some();
        closed.1 |= command.close_consumer.is_some();
    }
    assert!(broker.served_topics().is_empty());
    client.create_producer("admin-t", 2).await;
    client
        .subscribe("admin-t", "s", SubType::Exclusive, 3)
        .await;
    client.flow(3, 10).await;
    assert_eq!(message_of(&client.recv().await).1.as_ref(), b"x");

    // Unsubscribe: the consumer is closed and the subscription is gone.
    assert!(broker.unsubscribe("admin-t", "s").await.unwrap());
    assert!(client.recv().await.command.close_consumer.is_some());
    assert!(broker.subscriptions("admin-t").await.unwrap().is_empty());
    assert!(!broker.unsubscribe("admin-t", "s").await.unwrap());

    // Delete: the producer is closed and the topic no longer exists.
    broker.delete_topic("admin-t").await.unwrap();
    assert!(client.recv().await.command.close_producer.is_some());
    client
        .send(proto::CommandProducer {
            topic: "admin-t".into(),
            producer_id: 4,
            request_id: 4,
            ..Default::default()
        })
        .await;
    let error = client.recv().await.command.error.unwrap();
    assert_eq!(error.error, proto::ServerError::TopicNotFound as i32);

    // A partitioned topic is deleted with its partitions.
    broker.create_partitioned_topic("admin-p", 2).await.unwrap();
    client.create_producer("admin-p-partition-0", 5).await;
    broker.delete_topic("admin-p").await.unwrap();
    assert!(
        broker
            .admin()
            .partitions(&vela_broker::TopicName::parse("admin-p").unwrap())
            .await
            .unwrap()
            .is_none()
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn seek_beyond_the_end_lands_at_the_end() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("seek-end", 1).await;
    client.produce(1, 0, b"old").await;
    receipt_seq(&client.recv().await);
    client
        .subscribe("seek-end", "s", SubType::Exclusive, 1)
        .await;
    client
        .send(proto::CommandSeek {
            consumer_id: 1,
            request_id: 9,
            message_id: Some(MessageIdData {
                ledger_id: 1 << 40,
                entry_id: 7,
                ..Default::default()
            }),
            message_publish_time: None,
        })
        .await;
    assert!(client.recv().await.command.close_consumer.is_some());
    assert!(client.recv().await.command.success.is_some());
    client
        .subscribe("seek-end", "s", SubType::Exclusive, 1)
        .await;
    client.flow(1, 10).await;
    client.produce(1, 1, b"new").await;
    let mut got_new = false;
    while !got_new {
        let frame = client.recv().await;
        if let Some(message) = &frame.command.message {
            assert_eq!(message.consumer_id, 1);
            assert_eq!(message_of(&frame).1.as_ref(), b"new");
            got_new = true;
        }
    }
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn consumer_epochs_are_stamped_and_raised_by_redeliver_all() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("epoch", 1).await;
    client.produce(1, 0, b"x").await;
    receipt_seq(&client.recv().await);
    client
        .send(proto::CommandSubscribe {
            topic: "epoch".into(),
            subscription: "s".into(),
            sub_type: SubType::Exclusive as i32,
            consumer_id: 1,
            request_id: 2,
            initial_position: Some(proto::command_subscribe::InitialPosition::Earliest as i32),
            consumer_epoch: Some(0),
            ..Default::default()
        })
        .await;
    assert!(client.recv().await.command.success.is_some());
    client.flow(1, 10).await;
    assert_eq!(message_of(&client.recv().await).0.consumer_epoch, Some(0));
    client
        .send(proto::CommandRedeliverUnacknowledgedMessages {
            consumer_id: 1,
            message_ids: vec![],
            consumer_epoch: Some(1),
        })
        .await;
    let frame = client.recv().await;
    let (message, _) = message_of(&frame);
    assert_eq!(message.consumer_epoch, Some(1));
    assert_eq!(message.redelivery_count, Some(1));
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn key_shared_out_of_order_consumers_get_moved_keys_at_once() {
    let broker = start_broker().await;
    let addr = broker.pulsar_addr();
    let key = (0..1000)
        .map(|i| format!("key-{i}"))
        .find(|k| vela_broker::key_shared::slot_of(k.as_bytes()) <= 32_768)
        .unwrap();
    let mut producer = Client::connect(addr).await;
    producer.create_producer("ks-ooo", 1).await;
    let mut a = Client::connect(addr).await;
    a.subscribe("ks-ooo", "s", SubType::KeyShared, 1).await;
    a.flow(1, 100).await;
    let with_key = |seq| proto::MessageMetadata {
        ordering_key: Some(key.clone().into_bytes().into()),
        ..metadata(seq)
    };
    producer.produce_with(1, 0, with_key(0), b"first").await;
    receipt_seq(&producer.recv().await);
    message_of(&a.recv().await);
    let mut b = Client::connect(addr).await;
    b.send(proto::CommandSubscribe {
        topic: "ks-ooo".into(),
        subscription: "s".into(),
        sub_type: SubType::KeyShared as i32,
        consumer_id: 2,
        request_id: 2,
        key_shared_meta: Some(proto::KeySharedMeta {
            key_shared_mode: proto::KeySharedMode::AutoSplit as i32,
            hash_ranges: vec![],
            allow_out_of_order_delivery: Some(true),
        }),
        ..Default::default()
    })
    .await;
    assert!(b.recv().await.command.success.is_some());
    b.flow(2, 100).await;
    producer.produce_with(1, 1, with_key(1), b"second").await;
    receipt_seq(&producer.recv().await);
    // No fence: "second" arrives while "first" is still unacked.
    assert_eq!(message_of(&b.recv().await).1.as_ref(), b"second");
    broker.shutdown().await.unwrap();
}

/// Entries to redeliver beyond one replay pass (`READ_BATCH_ENTRIES_MAX`) all
/// go out while the consumer has permits, with nothing else happening on the
/// topic. (Found with the pulsar-rs client: a consumer closed with 140
/// unacked entries; its successor got 100, then nothing until it acked.)
#[tokio::test]
async fn a_long_replay_goes_out_without_further_commands() {
    const ENTRIES: u64 = 250;
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("long-replay", 1).await;
    for seq in 0..ENTRIES {
        client.produce(1, seq, format!("m{seq}").as_bytes()).await;
    }
    for seq in 0..ENTRIES {
        assert_eq!(receipt_seq(&client.recv().await), seq);
    }
    client
        .subscribe("long-replay", "s", SubType::Exclusive, 1)
        .await;
    client.flow(1, 1000).await;
    for _ in 0..ENTRIES {
        message_of(&client.recv().await);
    }
    // Closed with every entry unacked: all of them go to the next consumer.
    client
        .send(proto::CommandCloseConsumer {
            consumer_id: 1,
            request_id: 7,
            ..Default::default()
        })
        .await;
    assert!(client.recv().await.command.success.is_some());
    client
        .subscribe("long-replay", "s", SubType::Exclusive, 2)
        .await;
    client.flow(2, 1000).await;
    for seq in 0..ENTRIES {
        let frame = client.recv().await;
        let (message, payload) = message_of(&frame);
        assert_eq!(message.consumer_id, 2);
        assert_eq!(
            payload.as_ref(),
            format!("m{seq}").as_bytes(),
            "entry {seq}"
        );
    }
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn topics_past_the_broker_bound_are_refused_and_served_ones_go_on() {
    let broker = common::start_broker_with(|config| config.topics_max = 2).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("bound-a", 1).await;
    client.create_producer("bound-b", 2).await;
    client
        .send(proto::CommandProducer {
            topic: "bound-c".into(),
            producer_id: 3,
            request_id: 3,
            ..Default::default()
        })
        .await;
    let error = client
        .recv()
        .await
        .command
        .error
        .expect("PRODUCER past the bound answers an ERROR");
    assert_eq!(error.error, proto::ServerError::ServiceNotReady as i32);
    assert!(
        error.message.contains("--max-topics-per-broker"),
        "{}",
        error.message
    );
    // The served topics are untouched: a second producer on one of them and
    // a publish still work.
    client.create_producer("bound-a", 4).await;
    client.produce(4, 0, b"x").await;
    assert_eq!(receipt_seq(&client.recv().await), 0);
    broker.shutdown().await.unwrap();
}

/// PRODUCER with `producer_id` on `topic`: true if it was registered,
/// false if refused with ProducerBusy (a limit reached).
async fn producer_admitted(client: &mut Client, topic: &str, producer_id: u64) -> bool {
    client
        .send(proto::CommandProducer {
            topic: topic.into(),
            producer_id,
            request_id: producer_id,
            ..Default::default()
        })
        .await;
    let command = client.recv().await.command;
    if command.producer_success.is_some() {
        return true;
    }
    let error = command.error.expect("PRODUCER answers SUCCESS or ERROR");
    assert_eq!(
        error.error,
        proto::ServerError::ProducerBusy as i32,
        "{error:?}"
    );
    false
}

/// Adds producers to `topic` (ids from `*next_id` on) until one is
/// refused (`refused`) or admitted (`!refused`): stored policies reach
/// served topics through the store's watch, a moment later.
async fn until_producer(client: &mut Client, topic: &str, next_id: &mut u64, refused: bool) {
    for _ in 0..500 {
        *next_id += 1;
        if producer_admitted(client, topic, *next_id).await != refused {
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    panic!("{topic}: the policy change never applied (refused: {refused})");
}

/// The topics of a namespace without policies of their own share one copy
/// of its resolved policies (`policies::shared`): a namespace change still
/// reaches every served topic, a topic's own policy only that topic, and
/// the namespace's later changes the others.
#[tokio::test]
async fn namespace_policy_changes_reach_each_served_topic_and_a_topic_policy_only_its_own() {
    let broker = start_broker().await;
    let ns = NamespaceName::parse("public/shared").unwrap();
    broker
        .admin()
        .create_namespace(&ns, NamespacePolicies::default())
        .await
        .unwrap();
    let (a, b) = (
        "persistent://public/shared/a",
        "persistent://public/shared/b",
    );
    let mut client = Client::connect(broker.pulsar_addr()).await;
    let mut next_id = 0;
    for topic in [a, b] {
        next_id += 1;
        assert!(producer_admitted(&mut client, topic, next_id).await);
    }
    let set_namespace_producers_max = |max: u64| {
        let mut policies = NamespacePolicies::default();
        policies
            .policies
            .insert("maxProducers".into(), serde_json::json!(max));
        policies
    };
    broker
        .admin()
        .set_namespace_policies(&ns, &set_namespace_producers_max(1))
        .await
        .unwrap();
    until_producer(&mut client, a, &mut next_id, true).await;
    until_producer(&mut client, b, &mut next_id, true).await;
    // A's own limit: a takes producers again, b still has the namespace's.
    broker
        .admin()
        .update_topic_record(&vela_broker::TopicName::parse(a).unwrap(), |record| {
            record
                .policies
                .insert("maxProducers".into(), serde_json::json!(1000));
            Ok(())
        })
        .await
        .unwrap();
    until_producer(&mut client, a, &mut next_id, false).await;
    next_id += 1;
    assert!(!producer_admitted(&mut client, b, next_id).await);
    // The namespace's next change reaches b; a keeps its own.
    broker
        .admin()
        .set_namespace_policies(&ns, &set_namespace_producers_max(100))
        .await
        .unwrap();
    until_producer(&mut client, b, &mut next_id, false).await;
    next_id += 1;
    assert!(producer_admitted(&mut client, a, next_id).await);
    broker.shutdown().await.unwrap();
}
