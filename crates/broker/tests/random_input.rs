//! Random commands and bytes from many connections never panic the broker
//! and never disturb a healthy producer on another connection. Seeded: a
//! failure prints the seed (`VELA_SEED=<n>` replays it).

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::BytesMut;
use common::{Client, receipt_seq, start_broker};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vela_wire::proto::{self, BaseCommand, base_command::Type};

static PANICS: AtomicUsize = AtomicUsize::new(0);

/// Every command type a client could send, with a default body and random
/// ids filled in where the body has them.
fn random_command(rng: &mut StdRng) -> BaseCommand {
    const CONSUMER_TYPES: [i32; 12] = [4, 4, 4, 10, 11, 11, 12, 16, 20, 25, 28, 29];
    let value = if rng.random_bool(0.9) {
        CONSUMER_TYPES[rng.random_range(0..CONSUMER_TYPES.len())]
    } else {
        rng.random_range(2..70)
    };
    let Ok(kind) = Type::try_from(value) else {
        return BaseCommand {
            r#type: value,
            ..Default::default()
        };
    };
    let mut command = vela_wire::command::with_default_body(kind);
    let id = rng.random_range(0..4u64);
    if let Some(body) = command.producer.as_mut() {
        body.producer_id = id;
        body.topic = ["t", "", "bad topic//x", "persistent://public/default/r"]
            [rng.random_range(0..4)]
        .into();
    }
    if let Some(body) = command.subscribe.as_mut() {
        body.consumer_id = id;
        body.topic = ["t", "t", "", "a/b", "persistent://nope/ns/t"][rng.random_range(0..5)].into();
        body.subscription = ["s", "s", "", "other"][rng.random_range(0..4)].into();
        body.sub_type = rng.random_range(0..5);
        body.durable = Some(rng.random_bool(0.5));
        if rng.random_bool(0.3) {
            body.start_message_id = Some(proto::MessageIdData {
                ledger_id: rng.random(),
                entry_id: rng.random(),
                ..Default::default()
            });
        }
    }
    if let Some(body) = command.flow.as_mut() {
        body.consumer_id = id;
        body.message_permits = if rng.random_bool(0.3) {
            u32::MAX
        } else {
            rng.random()
        };
    }
    if let Some(body) = command.ack.as_mut() {
        body.consumer_id = id;
        body.ack_type = rng.random_range(0..3);
        body.message_id = vec![proto::MessageIdData {
            ledger_id: rng.random_range(0..3),
            entry_id: rng.random_range(0..5),
            ack_set: if rng.random_bool(0.5) {
                vec![rng.random()]
            } else {
                vec![]
            },
            ..Default::default()
        }];
    }
    if let Some(body) = command.seek.as_mut() {
        body.consumer_id = id;
        body.message_publish_time = Some(rng.random_range(0..2_000_000_000_000));
    }
    if let Some(body) = command.redeliver_unacknowledged_messages.as_mut() {
        body.consumer_id = id;
    }
    if let Some(body) = command.consumer_stats.as_mut() {
        body.consumer_id = id;
    }
    if let Some(body) = command.get_last_message_id.as_mut() {
        body.consumer_id = id;
    }
    if let Some(body) = command.close_consumer.as_mut() {
        body.consumer_id = id;
    }
    if let Some(body) = command.unsubscribe.as_mut() {
        body.consumer_id = id;
    }
    if let Some(body) = command.close_producer.as_mut() {
        body.producer_id = id;
    }
    if let Some(body) = command.get_topics_of_namespace.as_mut() {
        body.namespace = ["public/default", "x", ""][rng.random_range(0..3)].into();
    }
    if let Some(body) = command.partition_metadata.as_mut() {
        body.topic = ["t", "", "a/b/c/d/e"][rng.random_range(0..3)].into();
    }
    if let Some(body) = command.lookup_topic.as_mut() {
        body.topic = ["t", "", "::"][rng.random_range(0..3)].into();
    }
    command
}

#[tokio::test]
async fn random_commands_never_panic_or_disturb_others() {
    std::panic::set_hook(Box::new(|info| {
        PANICS.fetch_add(1, Ordering::SeqCst);
        eprintln!("panic: {info}");
    }));
    let seed: u64 = std::env::var("VELA_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(rand::random);
    eprintln!("VELA_SEED={seed}");
    let mut rng = StdRng::seed_from_u64(seed);
    let broker = start_broker().await;
    let addr = broker.pulsar_addr();
    let mut healthy = Client::connect(addr).await;
    healthy.create_producer("healthy", 1).await;
    let rounds = if std::env::var("VELA_TEST_FULL").is_ok_and(|v| v == "1") {
        400
    } else {
        60
    };
    for round in 0..rounds {
        let mut client = if rng.random_bool(0.9) {
            let mut client = Client::connect(addr).await;
            // Attach a few consumers first so that consumer commands hit
            // live subscriptions.
            for consumer_id in 0..4 {
                let sub_type = rng.random_range(0..4);
                client
                    .send(proto::CommandSubscribe {
                        topic: "t".into(),
                        subscription: ["s", "other"][rng.random_range(0..2)].into(),
                        sub_type,
                        consumer_id,
                        request_id: consumer_id,
                        durable: Some(rng.random_bool(0.8)),
                        ..Default::default()
                    })
                    .await;
            }
            client
        } else {
            Client::raw(addr).await
        };
        for _ in 0..rng.random_range(1..60) {
            if rng.random_bool(0.05) {
                let mut junk = vec![0u8; rng.random_range(0..64)];
                rng.fill(&mut junk[..]);
                client.send_bytes(&junk).await;
            } else if rng.random_bool(0.2) {
                let frame =
                    Client::send_frame(rng.random_range(0..3), rng.random_range(0..5), b"x");
                client.send_bytes(&frame).await;
            } else {
                let mut buf = BytesMut::new();
                vela_wire::encode_command(&random_command(&mut rng), &mut buf);
                client.send_bytes(&buf).await;
            }
        }
        drop(client);
        healthy.produce(1, round, b"ok").await;
        assert_eq!(receipt_seq(&healthy.recv().await), round, "seed {seed}");
    }
    assert_eq!(
        PANICS.load(Ordering::SeqCst),
        0,
        "broker panicked; seed {seed}"
    );
    broker.shutdown().await.unwrap();
}
