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
//!
//! The replicated flag is kept on the subscription's cursor (Pulsar's
//! cursor property `pulsar.replicated.subscription`): `a` killed and
//! restarted with no consumer attached still reports the subscription
//! replicated (`.../replicatedSubscriptionStatus`), keeps taking snapshots,
//! and a move of its cursor by the admin API alone (`skip_all`) reaches
//! `b`; an update from `b` moves `a`'s subscription but never re-enables
//! a status its admin disabled. A client's own unsubscribe on `a` deletes
//! `a`'s subscription only:
//! `b` keeps its own, as Pulsar does.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::time::Duration;

use common::Standalone;
use common::geo;
use vela_client::{
    Client, ClientConfig, Consumer, ConsumerOptions, InitialPosition, Message, MessageId,
    OutgoingMessage, Producer, ProducerOptions, SubType,
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

/// True once `b`'s subscription `s` stands at or past `position`.
fn passed(b: &Standalone, position: &MessageId) -> bool {
    mark_delete(b, "s").is_some_and(|at| at >= (position.ledger_id, position.entry_id))
}

/// Sends round `round`'s messages and waits for every receipt: the last
/// one's id on the producing broker.
async fn send_round(producer: &Producer, round: usize) -> MessageId {
    let mut receipts = Vec::with_capacity(ROUND);
    for index in round * ROUND..(round + 1) * ROUND {
        let message = OutgoingMessage::new(payload(index));
        receipts.push(producer.send(message).await.unwrap());
    }
    producer.flush().await;
    let mut last = None;
    for receipt in receipts {
        last = Some(receipt.await.unwrap());
    }
    last.expect("at least one message")
}

/// Waits until `b`'s subscription `s` stands at or past `position`.
async fn follows(b: &Standalone, position: &MessageId, round: usize) {
    let target = (position.ledger_id, position.entry_id);
    let deadline = tokio::time::Instant::now() + RECEIVE_TIMEOUT;
    loop {
        if passed(b, position) {
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
    let half = ROUNDS / 2;
    for round in 0..half {
        send_round(&producer, round).await;
        let (from, to) = (round * ROUND, (round + 1) * ROUND);
        receive_in_order(&on_a, from, to, "on a").await;
        let landed = receive_in_order(&check_b, from, to, "check on b").await;
        follows(&b, &landed, round).await;
    }
    for round in half..ROUNDS {
        send_round(&producer, round).await;
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

const STATUS_PATH: &str =
    "/admin/v2/persistent/geo/ns/failover/subscription/s/replicatedSubscriptionStatus";

/// `GET .../replicatedSubscriptionStatus` of `s`: the status code and, on
/// 200, the topic's entry.
fn replicated_status(broker: &Standalone) -> (u16, Option<bool>) {
    let (status, body) = broker.http_get(STATUS_PATH);
    if status != 200 {
        return (status, None);
    }
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    (status, doc[TOPIC].as_bool())
}

/// Produces round `round` on `broker`; `check_b` receives it on `b`: where
/// its last message was stored on `broker`, and where it landed on `b`.
async fn produce_round(
    broker: &Standalone,
    check_b: &Consumer,
    round: usize,
) -> (MessageId, MessageId) {
    let client = client(broker);
    let producer = client
        .create_producer(TOPIC, ProducerOptions::default())
        .await
        .unwrap();
    let sent = send_round(&producer, round).await;
    producer.close().await.unwrap();
    let (from, to) = (round * ROUND, (round + 1) * ROUND);
    (
        sent,
        receive_in_order(check_b, from, to, "check on b").await,
    )
}

#[tokio::test]
async fn a_replicated_subscription_stays_replicated_across_a_restart_without_consumers() {
    let args = [
        "--replicated-subscriptions-snapshot-frequency-ms",
        SNAPSHOT_MS,
    ];
    let a_dir = tempfile::tempdir().unwrap();
    let (a, b) = geo::two_clusters(Some(a_dir.path()), &args);
    let client_b = client(&b);
    let check_b = subscribe(&client_b, "check", false).await;
    {
        let client_a = client(&a);
        let on_a = subscribe(&client_a, "s", true).await;
        let (_, landed) = produce_round(&a, &check_b, 0).await;
        receive_in_order(&on_a, 0, ROUND, "on a").await;
        follows(&b, &landed, 0).await;
        on_a.close().await.unwrap();
    }
    assert_eq!(replicated_status(&a), (200, Some(true)));
    assert_eq!(
        replicated_status(&b),
        (200, Some(true)),
        "made by a's update: replicated too"
    );

    // a dies and comes back on new ports: b's record of a follows. No
    // consumer attaches on a from here on.
    a.kill_9();
    let mut restart_args = vec!["--cluster-name", "a"];
    restart_args.extend_from_slice(&args);
    let a = Standalone::start_in(a_dir.path(), &restart_args);
    geo::update_cluster(&b, "a", &a);
    assert_eq!(
        replicated_status(&a),
        (200, Some(true)),
        "the status outlives the restart"
    );
    let (_, body) = a.http_get("/admin/v2/persistent/geo/ns/failover/internalStats");
    let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
    assert_eq!(
        doc["cursors"]["s"]["properties"]["pulsar.replicated.subscription"], 1,
        "Pulsar's cursor property: {doc}"
    );
    let (_, landed) = produce_round(&a, &check_b, 1).await;
    // Only the admin API moves a's subscription now: past everything, once
    // a snapshot taken after the restart covers round 1 (skip again until
    // one does; each try is a condition, the deadline a failure bound).
    let deadline = tokio::time::Instant::now() + RECEIVE_TIMEOUT;
    loop {
        let (status, body) = a.http_post_json(
            "/admin/v2/persistent/geo/ns/failover/subscription/s/skip_all",
            "",
        );
        assert_eq!(status, 204, "skip_all on a: {body}");
        let tried = tokio::time::Instant::now() + Duration::from_secs(2);
        while !passed(&b, &landed) && tokio::time::Instant::now() < tried {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if passed(&b, &landed) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b's subscription never followed a's after the restart (at {:?}, round 1 ends at {:?})",
            mark_delete(&b, "s"),
            landed
        );
    }

    // The status as an admin sets it (REST, and pulsar-admin's command).
    for enabled in ["false", "true"] {
        let (status, body) = a.http_post_json(STATUS_PATH, enabled);
        assert_eq!(status, 204, "{body}");
        assert_eq!(replicated_status(&a), (200, Some(enabled == "true")));
    }
    let cli = |args: &[&str]| {
        let mut all = vec!["topics"];
        all.extend_from_slice(args);
        all.extend_from_slice(&[TOPIC, "-s", "s"]);
        geo::vela_admin(&a, &all)
    };
    cli(&["set-replicated-subscription-status", "--disable"]);
    let shown: serde_json::Value =
        serde_json::from_str(&cli(&["get-replicated-subscription-status"])).unwrap();
    assert_eq!(shown, serde_json::json!({ TOPIC: false }));
    // b's updates still move a's subscription (b's is replicated), but
    // leave a's status as its admin set it: as Pulsar, an update marks
    // only a subscription it creates.
    let (sent_on_a, _) = produce_round(&a, &check_b, 2).await;
    let deadline = tokio::time::Instant::now() + RECEIVE_TIMEOUT;
    loop {
        let (status, body) = b.http_post_json(
            "/admin/v2/persistent/geo/ns/failover/subscription/s/skip_all",
            "",
        );
        assert_eq!(status, 204, "skip_all on b: {body}");
        let target = (sent_on_a.ledger_id, sent_on_a.entry_id);
        let tried = tokio::time::Instant::now() + Duration::from_secs(2);
        while mark_delete(&a, "s").is_none_or(|at| at < target)
            && tokio::time::Instant::now() < tried
        {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if mark_delete(&a, "s").is_some_and(|at| at >= target) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "a's subscription never followed b's (at {:?}, round 2 ends at {target:?})",
            mark_delete(&a, "s")
        );
    }
    assert_eq!(
        replicated_status(&a),
        (200, Some(false)),
        "an update from b turned a's replication back on"
    );
    cli(&["set-replicated-subscription-status", "-e"]);
    assert_eq!(replicated_status(&a), (200, Some(true)));
    let (status, _) = a.http_get(
        "/admin/v2/persistent/geo/ns/failover/subscription/nope/replicatedSubscriptionStatus",
    );
    assert_eq!(status, 404);

    // A client's own unsubscribe on a: a's subscription goes, b's stays
    // (as Pulsar: nothing tells the other clusters).
    let client_a = client(&a);
    let on_a = subscribe(&client_a, "s", false).await;
    on_a.unsubscribe().await.unwrap();
    assert_eq!(replicated_status(&a).0, 404, "gone on a");
    assert_eq!(replicated_status(&b), (200, Some(true)), "kept on b");
}
