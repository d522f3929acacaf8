//! The broker over TCP, spoken to with `vela-wire` directly: handshake,
//! lookup, produce → receipts, consume with permits, acks, redelivery, and
//! the bad inputs that must close one connection and nothing else.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use bytes::BytesMut;
use common::{Client, TIMEOUT, message_of, receipt_seq, start_broker, start_broker_with};
use tokio::io::AsyncReadExt;
use vela_wire::proto::{
    self, MessageIdData, base_command::Type, command_ack::AckType, command_subscribe::SubType,
};

#[tokio::test]
async fn handshake_advertises_version_size_and_flags() {
    let broker = start_broker().await;
    let mut client = Client::raw(broker.pulsar_addr()).await;
    client
        .send(proto::CommandConnect {
            client_version: "old".into(),
            protocol_version: Some(12),
            ..Default::default()
        })
        .await;
    let connected = client.recv().await.command.connected.unwrap();
    assert_eq!(connected.protocol_version, Some(12));
    assert_eq!(connected.max_message_size, Some(5 * 1024 * 1024));
    let flags = connected.feature_flags.unwrap();
    assert_eq!(
        flags.supports_get_partitioned_metadata_without_auto_creation,
        Some(true)
    );
    // Topic list watchers are served (as Pulsar 4.0's default).
    assert_eq!(flags.supports_topic_watchers, Some(true));
    client.send(proto::CommandPing {}).await;
    assert!(client.recv().await.command.pong.is_some());
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn lookup_and_partitioned_metadata() {
    let broker = start_broker().await;
    broker
        .create_partitioned_topic("persistent://public/default/p", 3)
        .await
        .unwrap();
    let mut client = Client::connect(broker.pulsar_addr()).await;
    // A partition is a plain topic: 0 partitions of its own.
    for (topic, partitions) in [("p", 3), ("plain", 0), ("p-partition-1", 0)] {
        client
            .send(proto::CommandPartitionedTopicMetadata {
                topic: topic.into(),
                request_id: 1,
                ..Default::default()
            })
            .await;
        let response = client
            .recv()
            .await
            .command
            .partition_metadata_response
            .unwrap();
        assert_eq!(response.partitions, Some(partitions));
        assert_eq!(response.response, Some(0));
    }
    // Without auto-creation an absent topic is an error.
    client
        .send(proto::CommandPartitionedTopicMetadata {
            topic: "absent".into(),
            request_id: 2,
            metadata_auto_creation_enabled: Some(false),
            ..Default::default()
        })
        .await;
    let response = client
        .recv()
        .await
        .command
        .partition_metadata_response
        .unwrap();
    assert_eq!(response.response, Some(1));
    assert_eq!(
        response.error,
        Some(proto::ServerError::TopicNotFound as i32)
    );
    client
        .send(proto::CommandLookupTopic {
            topic: "persistent://public/default/p-partition-1".into(),
            request_id: 3,
            ..Default::default()
        })
        .await;
    let lookup = client.recv().await.command.lookup_topic_response.unwrap();
    assert_eq!(lookup.response, Some(1));
    assert_eq!(lookup.authoritative, Some(true));
    assert_eq!(
        lookup.broker_service_url.as_deref(),
        Some(format!("pulsar://127.0.0.1:{}", broker.pulsar_addr().port()).as_str())
    );
    client
        .send(proto::CommandGetTopicsOfNamespace {
            request_id: 4,
            namespace: "public/default".into(),
            ..Default::default()
        })
        .await;
    let topics = client
        .recv()
        .await
        .command
        .get_topics_of_namespace_response
        .unwrap();
    assert_eq!(
        topics.topics,
        vec![
            "persistent://public/default/p-partition-0",
            "persistent://public/default/p-partition-1",
            "persistent://public/default/p-partition-2",
        ]
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn pipelined_sends_get_receipts_in_order() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    let success = client.create_producer("t", 1).await;
    assert_eq!(success.producer_name, "standalone-0-0");
    assert_eq!(success.last_sequence_id, Some(-1));
    let mut frames = BytesMut::new();
    for seq in 0..200 {
        frames.extend_from_slice(&Client::send_frame(1, seq, format!("m{seq}").as_bytes()));
    }
    client.send_bytes(&frames).await;
    let mut last: Option<(u64, u64)> = None;
    for seq in 0..200 {
        let frame = client.recv().await;
        assert_eq!(receipt_seq(&frame), seq);
        let id = frame.command.send_receipt.unwrap().message_id.unwrap();
        let position = (id.ledger_id, id.entry_id);
        assert!(last.is_none_or(|l| l < position), "message ids must grow");
        last = Some(position);
    }
    // CLOSE_PRODUCER answers after every receipt in flight.
    for seq in 200..250 {
        client.produce(1, seq, b"x").await;
    }
    client
        .send(proto::CommandCloseProducer {
            producer_id: 1,
            request_id: 9,
            ..Default::default()
        })
        .await;
    for seq in 200..250 {
        assert_eq!(receipt_seq(&client.recv().await), seq);
    }
    assert_eq!(client.recv().await.command.success.unwrap().request_id, 9);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn consumer_gets_stored_entries_within_its_permits() {
    let broker = start_broker().await;
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer("c", 1).await;
    for seq in 0..10 {
        producer
            .produce(1, seq, format!("payload-{seq}").as_bytes())
            .await;
    }
    for seq in 0..10 {
        assert_eq!(receipt_seq(&producer.recv().await), seq);
    }
    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer.subscribe("c", "s", SubType::Exclusive, 7).await;
    consumer.flow(7, 3).await;
    for seq in 0..3 {
        let frame = consumer.recv().await;
        let (message, payload) = message_of(&frame);
        assert_eq!(message.consumer_id, 7);
        assert_eq!(message.message_id.entry_id, seq);
        assert_eq!(message.redelivery_count, None);
        assert_eq!(payload, format!("payload-{seq}").as_bytes());
        // The CRC was verified by the decoder: the stored entry went out verbatim.
        assert!(matches!(
            frame.payload.as_ref().unwrap().checksum(),
            vela_wire::Checksum::Verified(_)
        ));
    }
    // No permits left: nothing more arrives until FLOW.
    consumer.send(proto::CommandPing {}).await;
    assert!(consumer.recv().await.command.pong.is_some());
    consumer.flow(7, 100).await;
    for seq in 3..10 {
        let frame = consumer.recv().await;
        assert_eq!(message_of(&frame).0.message_id.entry_id, seq);
    }
    // GET_LAST_MESSAGE_ID.
    consumer
        .send(proto::CommandGetLastMessageId {
            consumer_id: 7,
            request_id: 5,
        })
        .await;
    let last = consumer
        .recv()
        .await
        .command
        .get_last_message_id_response
        .unwrap();
    assert_eq!(last.last_message_id.entry_id, 9);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn unacked_messages_are_redelivered_to_the_next_consumer() {
    let broker = start_broker().await;
    let addr = broker.pulsar_addr();
    let mut producer = Client::connect(addr).await;
    producer.create_producer("r", 1).await;
    for seq in 0..4 {
        producer.produce(1, seq, b"x").await;
        receipt_seq(&producer.recv().await);
    }
    let mut first = Client::connect(addr).await;
    first.subscribe("r", "s", SubType::Shared, 1).await;
    first.flow(1, 10).await;
    let mut ids = Vec::new();
    for _ in 0..4 {
        ids.push(message_of(&first.recv().await).0.message_id.clone());
    }
    // Ack two of them (one individual ack with a request id for ACK_RESPONSE).
    first
        .send(proto::CommandAck {
            consumer_id: 1,
            ack_type: AckType::Individual as i32,
            message_id: ids[..2].to_vec(),
            request_id: Some(77),
            ..Default::default()
        })
        .await;
    let response = first.recv().await.command.ack_response.unwrap();
    assert_eq!(response.request_id, Some(77));
    assert_eq!(response.error, None);
    // Ask for one back: it comes again with a redelivery count.
    first
        .send(proto::CommandRedeliverUnacknowledgedMessages {
            consumer_id: 1,
            message_ids: vec![ids[2].clone()],
            ..Default::default()
        })
        .await;
    let frame = first.recv().await;
    let (message, _) = message_of(&frame);
    assert_eq!(message.message_id.entry_id, ids[2].entry_id);
    assert_eq!(message.redelivery_count, Some(1));
    // The first consumer disconnects: the second gets what was not acked.
    drop(first);
    let mut second = Client::connect(addr).await;
    second.subscribe("r", "s", SubType::Shared, 2).await;
    second.flow(2, 10).await;
    let mut entries: Vec<u64> = Vec::new();
    for _ in 0..2 {
        entries.push(message_of(&second.recv().await).0.message_id.entry_id);
    }
    entries.sort_unstable();
    assert_eq!(entries, vec![ids[2].entry_id, ids[3].entry_id]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn cumulative_ack_and_exclusive_busy() {
    let broker = start_broker().await;
    let addr = broker.pulsar_addr();
    let mut client = Client::connect(addr).await;
    client.create_producer("x", 1).await;
    for seq in 0..5 {
        client.produce(1, seq, b"x").await;
        receipt_seq(&client.recv().await);
    }
    client.subscribe("x", "s", SubType::Exclusive, 1).await;
    client
        .send(proto::CommandSubscribe {
            topic: "x".into(),
            subscription: "s".into(),
            sub_type: SubType::Exclusive as i32,
            consumer_id: 2,
            request_id: 50,
            ..Default::default()
        })
        .await;
    let error = client.recv().await.command.error.unwrap();
    assert_eq!(error.error, proto::ServerError::ConsumerBusy as i32);
    client.flow(1, 10).await;
    let mut last = MessageIdData::default();
    for _ in 0..5 {
        last = message_of(&client.recv().await).0.message_id.clone();
    }
    let third = MessageIdData {
        ledger_id: last.ledger_id,
        entry_id: 2,
        ..Default::default()
    };
    client
        .send(proto::CommandAck {
            consumer_id: 1,
            ack_type: AckType::Cumulative as i32,
            message_id: vec![third],
            ..Default::default()
        })
        .await;
    client
        .send(proto::CommandCloseConsumer {
            consumer_id: 1,
            request_id: 51,
            ..Default::default()
        })
        .await;
    assert_eq!(client.recv().await.command.success.unwrap().request_id, 51);
    client.subscribe("x", "s", SubType::Exclusive, 3).await;
    client.flow(3, 10).await;
    let entries: Vec<u64> = [client.recv().await, client.recv().await]
        .iter()
        .map(|f| message_of(f).0.message_id.entry_id)
        .collect();
    assert_eq!(entries, vec![3, 4]);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn bad_input_closes_only_the_offending_connection() {
    let broker = start_broker().await;
    let addr = broker.pulsar_addr();
    let mut healthy = Client::connect(addr).await;
    healthy.create_producer("healthy", 1).await;
    let mut seq = 0;
    let mut still_works = async |healthy: &mut Client| {
        healthy.produce(1, seq, b"ok").await;
        assert_eq!(receipt_seq(&healthy.recv().await), seq);
        seq += 1;
    };

    // Garbage before CONNECT.
    let mut bad = Client::raw(addr).await;
    bad.send_bytes(b"\x00\x00\x00\x05\x00\x00\x00\x01\xff")
        .await;
    bad.expect_closed().await;
    still_works(&mut healthy).await;

    // A frame announcing 2 GiB.
    let mut bad = Client::connect(addr).await;
    bad.send_bytes(&0x8000_0000u32.to_be_bytes()).await;
    bad.expect_closed().await;
    still_works(&mut healthy).await;

    // SEND for a producer id that does not exist.
    let mut bad = Client::connect(addr).await;
    bad.produce(42, 0, b"x").await;
    bad.expect_closed().await;
    still_works(&mut healthy).await;

    // A command this broker does not serve (one only brokers send).
    let mut bad = Client::connect(addr).await;
    bad.send(proto::CommandSendReceipt {
        producer_id: 1,
        sequence_id: 0,
        ..Default::default()
    })
    .await;
    bad.expect_closed().await;
    still_works(&mut healthy).await;

    // A transaction command while transactions are off: Pulsar's ERROR
    // (NotAllowedError), and the connection stays.
    let mut txn = Client::connect(addr).await;
    txn.send(proto::CommandNewTxn {
        request_id: 7,
        ..Default::default()
    })
    .await;
    let answer = txn.recv().await;
    let error = answer.command.error.expect("an ERROR answer");
    assert_eq!(
        (error.request_id, error.error, error.message.as_str()),
        (
            7,
            proto::ServerError::NotAllowedError as i32,
            "Transactions are not enabled."
        )
    );
    txn.send(proto::CommandPing {}).await;
    assert!(
        txn.recv().await.command.pong.is_some(),
        "the connection stays"
    );
    still_works(&mut healthy).await;

    // Invalid topic name: an ERROR, the connection stays.
    let mut bad = Client::connect(addr).await;
    bad.send(proto::CommandProducer {
        topic: "persistent://a/b".into(),
        producer_id: 1,
        request_id: 3,
        ..Default::default()
    })
    .await;
    let error = bad.recv().await.command.error.unwrap();
    assert_eq!(error.error, proto::ServerError::InvalidTopicName as i32);
    bad.create_producer("fine", 2).await;
    still_works(&mut healthy).await;

    // A corrupted checksum: SEND_ERROR for that message only, in order.
    bad.produce(2, 0, b"a").await;
    let mut corrupt = Client::send_frame(2, 1, b"b");
    let last = corrupt.len() - 1;
    corrupt[last] ^= 0xff;
    bad.send_bytes(&corrupt).await;
    bad.produce(2, 2, b"c").await;
    assert_eq!(receipt_seq(&bad.recv().await), 0);
    let error = bad.recv().await.command.send_error.unwrap();
    assert_eq!(
        (error.sequence_id, error.error),
        (1, proto::ServerError::ChecksumError as i32)
    );
    assert_eq!(receipt_seq(&bad.recv().await), 2);
    still_works(&mut healthy).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn keepalive_closes_silent_connections() {
    let broker = start_broker_with(|c| c.keepalive = Duration::from_millis(100)).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    // Read raw frames (including PINGs) and never answer.
    let mut pings = 0;
    let closed = tokio::time::timeout(TIMEOUT, async {
        loop {
            if let Some(frame) = client.decoder.decode(&mut client.buf).unwrap() {
                pings += usize::from(frame.command_type() == Some(Type::Ping));
                continue;
            }
            match client.stream.read_buf(&mut client.buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
    assert!(closed.is_ok(), "silent connection not closed");
    assert!(pings >= 1);
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn shutdown_closes_connections() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("s", 1).await;
    broker.shutdown().await.unwrap();
    client.expect_closed().await;
}

#[tokio::test]
async fn tiny_pending_limits_pause_reads_without_deadlock() {
    let broker = start_broker_with(|c| {
        c.limits.pending_sends_max = 1;
        c.limits.pending_send_bytes_max = 100;
        c.limits.outbound_frames_max = 2;
        c.limits.frames_per_wakeup_max = 1;
    })
    .await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("tiny", 1).await;
    let mut frames = BytesMut::new();
    for seq in 0..100 {
        // Each frame is larger than the byte budget: it must still pass alone.
        frames.extend_from_slice(&Client::send_frame(1, seq, &[7u8; 1024]));
    }
    client.send_bytes(&frames).await;
    for seq in 0..100 {
        assert_eq!(receipt_seq(&client.recv().await), seq);
    }
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn acks_beyond_the_last_entry_are_refused() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    client.create_producer("beyond", 1).await;
    client.subscribe("beyond", "s", SubType::Exclusive, 1).await;
    client
        .send(proto::CommandAck {
            consumer_id: 1,
            ack_type: AckType::Cumulative as i32,
            message_id: vec![MessageIdData {
                ledger_id: u64::MAX - 1,
                entry_id: 5,
                ..Default::default()
            }],
            request_id: Some(3),
            ..Default::default()
        })
        .await;
    let response = client.recv().await.command.ack_response.unwrap();
    assert!(response.error.is_some());
    // Messages published later are still delivered.
    client.produce(1, 0, b"later").await;
    receipt_seq(&client.recv().await);
    client.flow(1, 10).await;
    assert_eq!(message_of(&client.recv().await).1.as_ref(), b"later");
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn v12_clients_get_no_newer_commands() {
    let broker = start_broker().await;
    let mut client = Client::raw(broker.pulsar_addr()).await;
    client
        .send(proto::CommandConnect {
            client_version: "pulsar-rs-like".into(),
            protocol_version: Some(12),
            ..Default::default()
        })
        .await;
    assert_eq!(
        client
            .recv()
            .await
            .command
            .connected
            .unwrap()
            .protocol_version,
        Some(12)
    );
    // Short topic names are expanded (pulsar-rs sends them as given).
    client.create_producer("short-name", 1).await;
    client.produce(1, 0, b"x").await;
    receipt_seq(&client.recv().await);
    client
        .subscribe("short-name", "s", SubType::Exclusive, 1)
        .await;
    client.flow(1, 10).await;
    let id = message_of(&client.recv().await).0.message_id.clone();
    client
        .send(proto::CommandAck {
            consumer_id: 1,
            ack_type: AckType::Individual as i32,
            message_id: vec![id],
            request_id: Some(5),
            ..Default::default()
        })
        .await;
    // No ACK_RESPONSE (a v17 command) for a v12 client: the next frame is PONG.
    common::expect_nothing_but_pong(&mut client).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn schema_registry_over_the_protocol() {
    let broker = start_broker().await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    let schema = |data: &[u8]| proto::Schema {
        name: "s".into(),
        schema_data: bytes::Bytes::copy_from_slice(data),
        r#type: proto::schema::Type::Json as i32,
        properties: vec![],
    };
    client
        .send(proto::CommandGetSchema {
            request_id: 1,
            topic: "sch".into(),
            schema_version: None,
        })
        .await;
    let missing = client.recv().await.command.get_schema_response.unwrap();
    assert_eq!(
        missing.error_code,
        Some(proto::ServerError::TopicNotFound as i32)
    );
    for (request_id, data, version) in [
        (2, b"{\"a\":1}", 0u64),
        (3, b"{\"b\":2}", 1),
        (4, b"{\"a\":1}", 0),
    ] {
        client
            .send(proto::CommandGetOrCreateSchema {
                request_id,
                topic: "sch".into(),
                schema: schema(data),
                producer_name: None,
            })
            .await;
        let response = client
            .recv()
            .await
            .command
            .get_or_create_schema_response
            .unwrap();
        assert_eq!(
            response.schema_version.unwrap().as_ref(),
            version.to_be_bytes()
        );
    }
    // A producer with a schema learns its version (8 bytes, big-endian).
    client
        .send(proto::CommandProducer {
            topic: "sch".into(),
            producer_id: 1,
            request_id: 5,
            schema: Some(schema(b"{\"b\":2}")),
            ..Default::default()
        })
        .await;
    let success = client.recv().await.command.producer_success.unwrap();
    assert_eq!(success.schema_version.unwrap().as_ref(), 1u64.to_be_bytes());
    client
        .send(proto::CommandGetSchema {
            request_id: 6,
            topic: "sch".into(),
            schema_version: Some(bytes::Bytes::copy_from_slice(&0u64.to_be_bytes())),
        })
        .await;
    let first = client.recv().await.command.get_schema_response.unwrap();
    assert_eq!(first.schema.unwrap().schema_data.as_ref(), b"{\"a\":1}");
    broker.shutdown().await.unwrap();
}
