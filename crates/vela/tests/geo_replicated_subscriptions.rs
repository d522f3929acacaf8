//! Replicated subscriptions (`replicateSubscriptionState`) between two
//! real `vela standalone` processes, clusters `a` and `b` replicating
//! `geo/ns` both ways, with the native client (`vela-client`), whose
//! SUBSCRIBE carries the flag.
//!
//! A consumer on `a` consumes and acknowledges half of a topic, round by
//! round; after each round, `b`'s subscription of the same name comes to
//! stand past everything that round brought to `b` (its mark-delete
//! position follows `a`'s through the last completed snapshot). Then `a`
//! is killed (-9) and the consumer fails over to `b`: it receives exactly
//! the messages it had not acknowledged, in order, none lost, none again.
//! Markers are never delivered: every consumer here checks each message is
//! one that was produced.
//!
//! The bound a failover resumes within: `b`'s position is the last
//! snapshot `a`'s mark-delete position passed, and snapshots are taken every
//! `--replicated-subscriptions-snapshot-frequency-ms` (here 200 ms) when
//! data came in; so a consumer failing over sees again at most what was
//! produced in about one interval plus the replication lag before its
//! last acknowledgement. Here each round waits for `b` to follow before
//! the next (a condition, bounded by a failure timeout), so that bound is
//! zero messages and the test checks it exactly.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Standalone;
use common::geo;
use vela_client::{
    Client, ClientConfig, Consumer, ConsumerOptions, InitialPosition, Message, MessageId,
    OutgoingMessage, ProducerOptions, SubType,
};

/// Failure bound for one expected message or for `b` to follow.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Messages per round.
const ROUND: usize = 100;
/// Rounds produced; the first half is consumed on `a`.
const ROUNDS: usize = 10;
/// The snapshot interval both clusters run with.
const SNAPSHOT_MS: &str = "200";
const TOPIC: &str = "persistent://geo/ns/failover";

fn client(broker: &Standalone) -> Client {
    Client::new(&broker.pulsar_url, ClientConfig::default()).unwrap()
}

/// Message `index`: its index, then a body of varying length.
fn payload(index: usize) -> Vec<u8> {
    let mut bytes = (index as u64).to_be_bytes().to_vec();
    bytes.extend((0..(index * 37) % 1024).map(|i| (i * 13 + index) as u8));
    bytes
}

/// The index of a produced message, checked byte for byte (a marker, or
/// anything else, fails here).
fn index_of(message: &Message) -> usize {
    assert!(
        message.payload.len() >= 8,
        "not a produced message: {message:?}"
    );
    let head: [u8; 8] = message.payload[..8].try_into().unwrap();
    let index = u64::from_be_bytes(head) as usize;
    assert!(index < ROUND * ROUNDS, "index {index} out of range");
    assert_eq!(&message.payload[..], &payload(index)[..], "message {index}");
    index
}

async fn subscribe(client: &Client, subscription: &str, replicated: bool) -> Consumer {
    let options = ConsumerOptions {
        sub_type: SubType::Exclusive,
        initial_position: InitialPosition::Earliest,
        replicate_subscription_state: replicated,
        ..ConsumerOptions::new(subscription)
    };
    client.subscribe(TOPIC, options).await.unwrap()
}

/// Receives the messages `from..to`, in order, acknowledging each; the
/// last one's id.
async fn receive_in_order(consumer: &Consumer, from: usize, to: usize, what: &str) -> MessageId {
    let mut last = None;
    for expected in from..to {
        let message = consumer
            .receive_timeout(RECEIVE_TIMEOUT)
            .await
            .unwrap()
            .unwrap_or_else(|| panic!("{what}: message {expected} not received"));
        assert_eq!(
            index_of(&message),
            expected,
            "{what}: out of order, lost or repeated"
        );
        consumer.ack(&message.id).await.unwrap();
        last = Some(message.id);
    }
    last.expect("at least one message")
}

/// The mark-delete position of `subscription` on `broker` (internal
/// stats), if it has one.
fn mark_delete(broker: &Standalone, subscription: &str) -> Option<(u64, u64)> {
    let (status, body) = broker.http_get("/admin/v2/persistent/geo/ns/failover/internalStats");
    assert_eq!(status, 200, "{body}");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    let text = doc["cursors"][subscription]["markDeletePosition"].as_str()?;
    let (ledger, entry) = text.split_once(':')?;
    Some((ledger.parse().ok()?, entry.parse().ok()?))
}

/// Waits until `b`'s subscription `s` stands at or past `position`.
async fn follows(b: &Standalone, position: &MessageId, round: usize) {
    let target = (position.ledger_id, position.entry_id);
    let deadline = tokio::time::Instant::now() + RECEIVE_TIMEOUT;
    loop {
        if mark_delete(b, "s").is_some_and(|at| at >= target) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "round {round}: b's subscription never passed {target:?} (at {:?})",
            mark_delete(b, "s")
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

#[tokio::test]
async fn a_consumer_failing_over_resumes_where_it_acknowledged() {
    let args = [
        "--replicated-subscriptions-snapshot-frequency-ms",
        SNAPSHOT_MS,
    ];
    let (a, b) = geo::two_clusters(None, &args);
    let (client_a, client_b) = (client(&a), client(&b));
    let on_a = subscribe(&client_a, "s", true).await;
    // A plain subscription on b: where each message landed there.
    let check_b = subscribe(&client_b, "check", false).await;
    let producer = client_a
        .create_producer(TOPIC, ProducerOptions::default())
        .await
        .unwrap();
    let send_round = |round: usize| {
        let producer = &producer;
        async move {
            let mut receipts = Vec::with_capacity(ROUND);
            for index in round * ROUND..(round + 1) * ROUND {
                let message = OutgoingMessage::new(payload(index));
                receipts.push(producer.send(message).await.unwrap());
            }
            producer.flush().await;
            for receipt in receipts {
                receipt.await.unwrap();
            }
        }
    };
    let half = ROUNDS / 2;
    for round in 0..half {
        send_round(round).await;
        let (from, to) = (round * ROUND, (round + 1) * ROUND);
        receive_in_order(&on_a, from, to, "on a").await;
        let landed = receive_in_order(&check_b, from, to, "check on b").await;
        follows(&b, &landed, round).await;
    }
    for round in half..ROUNDS {
        send_round(round).await;
    }
    receive_in_order(&check_b, half * ROUND, ROUNDS * ROUND, "check on b").await;
    producer.close().await.unwrap();
    on_a.close().await.unwrap();
    // Fail over: a is gone; the consumer comes back on b.
    a.kill_9();
    let on_b = subscribe(&client_b, "s", true).await;
    receive_in_order(&on_b, half * ROUND, ROUNDS * ROUND, "failed over to b").await;
    let extra = on_b
        .receive_timeout(Duration::from_millis(500))
        .await
        .unwrap();
    assert!(extra.is_none(), "a message after the last: {extra:?}");
}
