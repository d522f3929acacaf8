//! Shutdown with many loaded topics: topics are closed many at once, and
//! everything acknowledged before the shutdown is still acknowledged after a
//! restart on the same metadata and ledgers (cursors flushed, ledgers closed).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{Client, message_of, receipt_seq};
use vela_wire::proto::{self, command_ack::AckType, command_subscribe::SubType};

/// More topics than the broker closes at once (`TOPIC_CLOSES_IN_FLIGHT_MAX`,
/// 256), so closes overlap and queue.
const TOPICS: u64 = 300;
const MESSAGES: u64 = 3;

fn topic(i: u64) -> String {
    format!("persistent://public/default/shutdown-{i}")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shutdown_with_many_topics_keeps_every_acknowledgement() {
    let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
    let log_env = vela_log::LogEnv::new(
        Arc::clone(&meta),
        Arc::new(vela_log::memory::MemoryBackend(
            vela_log::memory::MemoryLedgers::new(),
        )),
    );
    let broker = common::start_broker_on(Arc::clone(&meta), log_env.clone()).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    let mut entries = Vec::new();
    for i in 0..TOPICS {
        client.create_producer(&topic(i), i).await;
        for seq in 0..MESSAGES {
            client.produce(i, seq, b"x").await;
            receipt_seq(&client.recv().await);
        }
        client
            .subscribe(&topic(i), "s", SubType::Exclusive, i)
            .await;
        client.flow(i, 100).await;
        let mut ids = Vec::new();
        for _ in 0..MESSAGES {
            ids.push(message_of(&client.recv().await).0.message_id.clone());
        }
        // Topic i acknowledges the first i % MESSAGES messages (cumulatively).
        let acked = i % MESSAGES;
        if acked > 0 {
            client
                .send(proto::CommandAck {
                    consumer_id: i,
                    ack_type: AckType::Cumulative as i32,
                    message_id: vec![ids[acked as usize - 1].clone()],
                    request_id: Some(10_000 + i),
                    ..Default::default()
                })
                .await;
            assert!(client.recv().await.command.ack_response.is_some());
        }
        entries.push(ids);
    }
    drop(client);
    broker.shutdown().await.unwrap();

    let broker = common::start_broker_on(meta, log_env).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    for i in 0..TOPICS {
        client
            .subscribe(&topic(i), "s", SubType::Exclusive, i)
            .await;
        client.flow(i, 100).await;
        let acked = i % MESSAGES;
        for expected in &entries[i as usize][acked as usize..] {
            let frame = client.recv().await;
            let (message, _) = message_of(&frame);
            assert_eq!(message.consumer_id, i);
            assert_eq!(
                (message.message_id.ledger_id, message.message_id.entry_id),
                (expected.ledger_id, expected.entry_id),
                "topic {i}: redelivery starts after what was acknowledged"
            );
        }
        // The log takes new entries after the restart (its ledgers were
        // closed, a new one opened).
        client.create_producer(&topic(i), TOPICS + i).await;
        client.produce(TOPICS + i, MESSAGES, b"y").await;
        // The receipt and the new entry at the consumer, in either order.
        let mut saw = (false, false);
        for _ in 0..2 {
            let frame = client.recv().await;
            if frame.command.send_receipt.is_some() {
                saw.0 = true;
            } else {
                assert_eq!(message_of(&frame).0.consumer_id, i);
                saw.1 = true;
            }
        }
        assert_eq!(saw, (true, true));
    }
    broker.shutdown().await.unwrap();
}
