//! Geo-replication between two real `vela standalone` processes, clusters
//! `a` and `b` on loopback, each knowing the other as a cluster and sharing
//! a tenant whose namespace replicates among both; produced and consumed
//! with the official Rust client (`pulsar` crate).
//!
//! - One way: what is produced on `a` arrives on `b` in order, payload
//!   byte for byte, key, properties, event and publish time kept, marked
//!   `replicated_from = a`; batched and not.
//! - Both ways: each side sees both sides' messages exactly once, and
//!   nothing is sent back where it came from (checked with fences: a
//!   message produced on `b` after `b` held everything, reaching `a`, comes
//!   after anything `b` could have sent back).
//! - kill -9 of `a` while producing, restart: `b` holds every message `a`
//!   acknowledged, once, in order (the replicator resends from its cursor;
//!   `b` drops what it stored already).
//! - `b` down for a while, back on other ports (its record updated on `a`):
//!   `a` kept the backlog; `b`'s log ends with every message once, in order.
//! - The admin API's clusters and replication routes answer Pulsar's codes;
//!   topic stats and metrics show each replicator (Pulsar's shapes).
//!
//! Timeouts only bound a failure; no test waits for time to pass to be
//! correct.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeMap;
use std::time::Duration;

use common::Standalone;
use common::geo::{self, add_cluster, ok, replicated_namespace, vela_admin};
use futures::StreamExt;
use pulsar::consumer::{InitialPosition, Message};
use pulsar::routing_policy::RoutingPolicy;
use pulsar::{
    Consumer, ConsumerOptions, Producer, ProducerOptions, Pulsar, SubType, TokioExecutor,
};

/// Failure bound for one expected message or one receipt (replication adds
/// a hop and, after a restart, a reconnect back-off).
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Messages per side and topic.
const COUNT: usize = 300;
/// Messages per batch when batching (not a divisor of `COUNT`).
const BATCH_MESSAGES: u32 = 16;
/// The property a replicated message carries (Pulsar's name): its source
/// position, added by the replicator.
const SOURCE_POSITION: &str = "__MSG_PROP_REPL_SOURCE_POSITION";

async fn client(broker: &Standalone) -> Pulsar<TokioExecutor> {
    Pulsar::builder(broker.pulsar_url.clone(), TokioExecutor)
        .build()
        .await
        .expect("the client connects")
}

/// Two standalones, `a` and `b`, replicating `geo/ns` both ways.
fn two_clusters(a_dir: Option<&std::path::Path>) -> (Standalone, Standalone) {
    geo::two_clusters(a_dir, &[])
}

fn topic(name: &str) -> String {
    format!("persistent://geo/ns/{name}")
}

/// Message `index` of `tag`: a unique prefix, then a body of varying length
/// (0 to ~2 KiB) with every byte value.
fn payload(tag: &str, index: usize) -> Vec<u8> {
    let mut bytes = format!("{tag}-{index:05}:").into_bytes();
    bytes.extend((0..(index * 131) % 2048).map(|i| (i * 7 + index) as u8));
    bytes
}

async fn subscribe(
    client: &Pulsar<TokioExecutor>,
    topic: &str,
) -> Consumer<Vec<u8>, TokioExecutor> {
    client
        .consumer()
        .with_topic(topic)
        .with_subscription("check")
        .with_subscription_type(SubType::Exclusive)
        .with_options(ConsumerOptions::default().with_initial_position(InitialPosition::Earliest))
        .build()
        .await
        .expect("subscribe")
}

async fn producer(
    client: &Pulsar<TokioExecutor>,
    topic: &str,
    batch_size: Option<u32>,
) -> Producer<TokioExecutor> {
    client
        .producer()
        .with_topic(topic)
        .with_options(ProducerOptions {
            batch_size,
            block_queue_if_full: true,
            ..Default::default()
        })
        .build()
        .await
        .expect("create producer")
}

/// Sends `count` messages of `tag` with a key, properties and an event
/// time, and waits for every receipt.
async fn send_tagged(producer: &mut Producer<TokioExecutor>, tag: &str, count: usize) {
    let mut receipts = Vec::with_capacity(count);
    for index in 0..count {
        let receipt = producer
            .create_message()
            .with_content(payload(tag, index))
            .with_key(format!("key-{}", index % 7))
            .with_property("index", index.to_string())
            .with_property("tag", tag)
            .event_time(1_700_000_000_000 + index as u64)
            .send_non_blocking()
            .await
            .unwrap();
        receipts.push(receipt);
    }
    if producer.options().batch_size.is_some() {
        producer.send_batch().await.unwrap();
    }
    for (index, receipt) in receipts.into_iter().enumerate() {
        tokio::time::timeout(RECEIVE_TIMEOUT, receipt)
            .await
            .unwrap_or_else(|_| panic!("no receipt for {tag} {index}"))
            .unwrap_or_else(|e| panic!("send of {tag} {index} failed: {e}"));
    }
}

async fn next_message(consumer: &mut Consumer<Vec<u8>, TokioExecutor>) -> Message<Vec<u8>> {
    let message = tokio::time::timeout(RECEIVE_TIMEOUT, consumer.next())
        .await
        .unwrap_or_else(|_| panic!("no message within {RECEIVE_TIMEOUT:?}"))
        .expect("the consumer stream ended")
        .expect("the consumer failed");
    consumer.ack(&message).await.unwrap();
    message
}

/// The user's properties (without the replicator's source position).
fn properties(message: &Message<Vec<u8>>) -> BTreeMap<String, String> {
    message
        .metadata()
        .properties
        .iter()
        .filter(|kv| kv.key != SOURCE_POSITION)
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect()
}

/// Tag and index of a message of `payload`.
fn tag_and_index(message: &Message<Vec<u8>>) -> (String, usize) {
    let text = String::from_utf8_lossy(&message.payload.data);
    let (head, _) = text.split_once(':').expect("a tagged payload");
    let (tag, index) = head.rsplit_once('-').expect("tag-index");
    (tag.to_owned(), index.parse().expect("an index"))
}

/// Produced on `a`, consumed on `b`: everything, in order, as produced.
#[tokio::test]
async fn messages_produced_on_one_cluster_arrive_on_the_other_as_produced() {
    let (a, b) = two_clusters(None);
    let (client_a, client_b) = (client(&a).await, client(&b).await);
    for (name, batch_size) in [("one-way", None), ("one-way-batched", Some(BATCH_MESSAGES))] {
        let topic = topic(name);
        let mut local = subscribe(&client_a, &topic).await;
        let mut producer = producer(&client_a, &topic, batch_size).await;
        send_tagged(&mut producer, name, COUNT).await;
        let mut remote = subscribe(&client_b, &topic).await;
        for index in 0..COUNT {
            let here = next_message(&mut local).await;
            let there = next_message(&mut remote).await;
            let at = format!("{name} message {index}");
            assert_eq!(there.payload.data, payload(name, index), "{at}: payload");
            assert_eq!(there.key(), Some(format!("key-{}", index % 7)), "{at}: key");
            let expected = BTreeMap::from([
                ("index".to_owned(), index.to_string()),
                ("tag".to_owned(), name.to_owned()),
            ]);
            assert_eq!(properties(&there), expected, "{at}: properties");
            assert_eq!(
                there.metadata().event_time,
                Some(1_700_000_000_000 + index as u64),
                "{at}: event time"
            );
            assert_eq!(
                there.metadata().publish_time,
                here.metadata().publish_time,
                "{at}: publish time"
            );
            assert_eq!(
                there.metadata().producer_name,
                here.metadata().producer_name
            );
            assert_eq!(
                there.metadata().replicated_from.as_deref(),
                Some("a"),
                "{at}: marked as replicated from a"
            );
            assert_eq!(here.metadata().replicated_from, None, "{at}: local on a");
        }
        producer.close().await.unwrap();
        replication_settles(&a, name).await;
        inbound_settles(&b, name).await;
    }
}

/// `b`'s stats of topic `name` show what `a`'s replicator brought, as
/// Pulsar's do on the receiving side: its producer among the publishers,
/// every message in the topic's in-counter, and in `replication.a` the
/// in-counters, a non-zero `msgRateIn` in some window and the inbound
/// connection; the metrics have `pulsar_replication_rate_in` for `a`.
async fn inbound_settles(b: &Standalone, name: &str) {
    let path = format!("/admin/v2/persistent/geo/ns/{name}/stats");
    let deadline = tokio::time::Instant::now() + RECEIVE_TIMEOUT;
    let mut rate_seen = 0.0_f64;
    loop {
        let (status, body) = b.http_get(&path);
        assert_eq!(status, 200, "{body}");
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        let from_a = &doc["replication"]["a"];
        rate_seen = rate_seen.max(from_a["msgRateIn"].as_f64().unwrap_or(0.0));
        if from_a["msgInCount"] == COUNT && rate_seen > 0.0 {
            assert_eq!(doc["msgInCounter"], COUNT, "{doc}");
            assert!(from_a["bytesInCount"].as_u64().unwrap() > 0, "{from_a}");
            assert!(from_a["inboundConnection"].is_string(), "{from_a}");
            let publishers = doc["publishers"].as_array().unwrap();
            assert!(
                publishers
                    .iter()
                    .any(|p| p["producerName"] == "pulsar.repl.a-->b"),
                "the replicator's producer among the publishers: {doc}"
            );
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b's stats never showed {COUNT} messages in from a (rate seen {rate_seen}): {doc}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sample = format!(
        "pulsar_replication_rate_in{{cluster=\"b\",namespace=\"geo/ns\",\
         topic=\"persistent://geo/ns/{name}\",remote_cluster=\"a\"}} "
    );
    let metrics = b.metrics();
    assert!(metrics.contains(&sample), "no {sample:?} in b's metrics");
}

/// `a`'s stats of topic `name` come to show every message replicated to
/// `b`, no backlog, connected; its metrics the same backlog.
async fn replication_settles(a: &Standalone, name: &str) {
    let path = format!("/admin/v2/persistent/geo/ns/{name}/stats");
    let deadline = tokio::time::Instant::now() + RECEIVE_TIMEOUT;
    loop {
        let (status, body) = a.http_get(&path);
        assert_eq!(status, 200, "{body}");
        let doc: serde_json::Value = serde_json::from_str(&body).unwrap();
        let replication = &doc["replication"]["b"];
        if replication["msgOutCount"] == COUNT && replication["replicationBacklog"] == 0 {
            assert_eq!(replication["connected"], true, "{replication}");
            assert!(doc["subscriptions"].get("pulsar.repl.b").is_none(), "{doc}");
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "replication stats never showed {COUNT} messages out and no backlog: {replication}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let sample = format!(
        "pulsar_replication_backlog{{cluster=\"a\",namespace=\"geo/ns\",\
         topic=\"persistent://geo/ns/{name}\",remote_cluster=\"b\"}} 0\n"
    );
    let metrics = a.metrics();
    assert!(metrics.contains(&sample), "no {sample:?} in the metrics");
}

/// A partitioned topic created on `a` only gets its partitioned metadata on
/// `b` (through `b`'s admin API, as Pulsar creates it on every replication
/// cluster) and replicates partition by partition: every message arrives,
/// each key's in order.
#[tokio::test]
async fn partitioned_topics_replicate_per_partition() {
    let (a, b) = two_clusters(None);
    ok(
        a.http_put_json("/admin/v2/persistent/geo/ns/parts/partitions", "3"),
        "create partitioned topic",
    );
    let (client_a, client_b) = (client(&a).await, client(&b).await);
    let topic = topic("parts");
    // Keyed routing: each key's messages go to one partition. The producer
    // loads the partitions on `a`, whose replicators make the metadata on
    // `b`.
    let mut producer = client_a
        .producer()
        .with_topic(&topic)
        .with_options(ProducerOptions {
            routing_policy: Some(RoutingPolicy::RoundRobin),
            block_queue_if_full: true,
            ..Default::default()
        })
        .build()
        .await
        .expect("create producer");
    let deadline = tokio::time::Instant::now() + RECEIVE_TIMEOUT;
    loop {
        let (status, body) = b.http_get("/admin/v2/persistent/geo/ns/parts/partitions");
        if status == 200 && body.contains("\"partitions\":3") {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "b never got the partitioned metadata: {status} {body}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut on_b = subscribe(&client_b, &topic).await;
    send_tagged(&mut producer, "parts", COUNT).await;
    let mut next_per_key: BTreeMap<String, usize> = BTreeMap::new();
    let mut seen = 0;
    while seen < COUNT {
        let message = next_message(&mut on_b).await;
        let (tag, index) = tag_and_index(&message);
        assert_eq!(tag, "parts");
        let key = message.key().expect("a key");
        assert_eq!(key, format!("key-{}", index % 7));
        let expected = next_per_key.entry(key.clone()).or_insert(index % 7);
        assert_eq!(index, *expected, "key {key}: out of order or repeated");
        *expected += 7;
        assert!(message.topic.contains("-partition-"), "{}", message.topic);
        seen += 1;
    }
}

/// Reads `consumer` until it holds `COUNT` messages of each tag, checking
/// each tag's messages come once and in order.
async fn read_both(consumer: &mut Consumer<Vec<u8>, TokioExecutor>, tags: [&str; 2], side: &str) {
    let mut next: BTreeMap<String, usize> = tags.iter().map(|t| (t.to_string(), 0)).collect();
    while next.values().any(|n| *n < COUNT) {
        let message = next_message(consumer).await;
        let (tag, index) = tag_and_index(&message);
        let expected = next
            .get_mut(&tag)
            .unwrap_or_else(|| panic!("{side}: unexpected tag {tag}"));
        assert_eq!(index, *expected, "{side}: {tag} out of order or repeated");
        assert_eq!(
            message.payload.data,
            payload(&tag, index),
            "{side}: payload"
        );
        *expected += 1;
    }
}

/// Produced on both sides of one topic: each side sees both streams once,
/// and no message is sent back to where it came from.
#[tokio::test]
async fn both_sides_see_both_streams_exactly_once() {
    let (a, b) = two_clusters(None);
    let (client_a, client_b) = (client(&a).await, client(&b).await);
    let topic = topic("both-ways");
    let mut on_a = subscribe(&client_a, &topic).await;
    let mut on_b = subscribe(&client_b, &topic).await;
    let mut producer_a = producer(&client_a, &topic, Some(BATCH_MESSAGES)).await;
    let mut producer_b = producer(&client_b, &topic, None).await;
    tokio::join!(
        send_tagged(&mut producer_a, "from_a", COUNT),
        send_tagged(&mut producer_b, "from_b", COUNT)
    );
    tokio::join!(
        read_both(&mut on_a, ["from_a", "from_b"], "on a"),
        read_both(&mut on_b, ["from_a", "from_b"], "on b")
    );
    // Each log now holds both streams. A fence produced on each side after
    // that reaches the other side after anything its replicator could
    // have sent back: so the next message on each side must be a fence.
    send_tagged(&mut producer_a, "fence_a", 1).await;
    send_tagged(&mut producer_b, "fence_b", 1).await;
    for (consumer, side) in [(&mut on_a, "on a"), (&mut on_b, "on b")] {
        let mut fences = Vec::new();
        while fences.len() < 2 {
            let (tag, _) = tag_and_index(&next_message(consumer).await);
            assert!(
                tag.starts_with("fence_"),
                "{side}: {tag} arrived again (sent back by a replicator)"
            );
            fences.push(tag);
        }
        fences.sort();
        assert_eq!(fences, ["fence_a", "fence_b"], "{side}");
    }
}

/// kill -9 of `a` while it produces and replicates, then a restart on the
/// same data: `b` holds every message `a` acknowledged, once, in order.
#[tokio::test]
async fn a_killed_source_resumes_without_losing_or_repeating() {
    const SENT: usize = 2000;
    let dir = tempfile::tempdir().unwrap();
    let (a, b) = two_clusters(Some(dir.path()));
    let topic = topic("crash");
    let client_b = client(&b).await;
    let mut on_b = subscribe(&client_b, &topic).await;
    let acked = {
        let client_a = client(&a).await;
        let mut producer = producer(&client_a, &topic, None).await;
        // Acknowledged messages, then the kill while more are in flight and
        // replication is behind.
        let mut receipts = Vec::new();
        for index in 0..SENT {
            receipts.push(
                producer
                    .send_non_blocking(payload("crash", index))
                    .await
                    .unwrap(),
            );
        }
        let mut acked = 0;
        for receipt in receipts.drain(..SENT / 2) {
            tokio::time::timeout(RECEIVE_TIMEOUT, receipt)
                .await
                .expect("a receipt")
                .expect("stored");
            acked += 1;
        }
        a.kill_9();
        // The rest may or may not have been stored: not waited for.
        drop(receipts);
        acked
    };
    // The restarted `a` loads the topics that replicate by itself (no
    // client needs to come back first).
    let a = Standalone::start_in(dir.path(), &["--cluster-name", "a"]);
    // What `a` acknowledged reaches `b` once, in order (what it did not
    // acknowledge may come too, after, in order).
    for index in 0..acked {
        let message = next_message(&mut on_b).await;
        assert_eq!(tag_and_index(&message), ("crash".to_owned(), index));
        assert_eq!(message.payload.data, payload("crash", index));
    }
    // A fence from the restarted `a`: whatever came before it came once.
    let client_a = client(&a).await;
    let mut producer = producer(&client_a, &topic, None).await;
    send_tagged(&mut producer, "fence", 1).await;
    let mut next = acked;
    loop {
        let (tag, index) = tag_and_index(&next_message(&mut on_b).await);
        if tag == "fence" {
            break;
        }
        assert_eq!(
            (tag.as_str(), index),
            ("crash", next),
            "repeated or out of order"
        );
        next += 1;
    }
    drop(a);
}

/// Sends messages `range` of tag `outage` and waits for every receipt.
async fn send_range(producer: &mut Producer<TokioExecutor>, range: std::ops::Range<usize>) {
    let mut receipts = Vec::new();
    for index in range {
        receipts.push(
            producer
                .send_non_blocking(payload("outage", index))
                .await
                .unwrap(),
        );
    }
    for receipt in receipts {
        tokio::time::timeout(RECEIVE_TIMEOUT, receipt)
            .await
            .expect("a receipt")
            .expect("stored on a");
    }
}

/// The remote cluster down for a while (kill -9), then back on other ports
/// (its record updated on the source): the source kept the backlog, and
/// the remote's log ends up with every message once, in order.
#[tokio::test]
async fn a_remote_down_for_a_while_gets_everything_when_back() {
    const BEFORE: usize = 100;
    const DURING: usize = 200;
    let b_dir = tempfile::tempdir().unwrap();
    let a = Standalone::start(&["--cluster-name", "a"]);
    let b = Standalone::start_in(b_dir.path(), &["--cluster-name", "b"]);
    add_cluster(&a, "b", &b);
    add_cluster(&b, "a", &a);
    replicated_namespace(&a);
    replicated_namespace(&b);
    let topic = topic("outage");
    let client_a = client(&a).await;
    let mut producer = producer(&client_a, &topic, None).await;
    send_range(&mut producer, 0..BEFORE).await;
    b.kill_9();
    // `a` takes these while `b` is gone: they wait in its log.
    send_range(&mut producer, BEFORE..BEFORE + DURING).await;
    let b = Standalone::start_in(b_dir.path(), &["--cluster-name", "b"]);
    vela_admin(
        &a,
        &[
            "clusters",
            "update",
            "b",
            "--broker-url",
            b.pulsar_url.trim_end_matches('/'),
        ],
    );
    let client_b = client(&b).await;
    let mut on_b = subscribe(&client_b, &topic).await;
    for index in 0..BEFORE + DURING {
        let message = next_message(&mut on_b).await;
        assert_eq!(tag_and_index(&message), ("outage".to_owned(), index));
    }
    send_tagged(&mut producer, "fence", 1).await;
    let (tag, _) = tag_and_index(&next_message(&mut on_b).await);
    assert_eq!(tag, "fence", "a message arrived twice");
}

/// The clusters and replication routes answer as Pulsar's do.
#[tokio::test]
async fn clusters_and_replication_routes_answer_pulsars_codes() {
    let a = Standalone::start(&["--cluster-name", "a"]);
    let (status, body) = a.http_get("/admin/v2/clusters");
    assert_eq!((status, body.as_str()), (200, r#"["a"]"#));
    let (status, body) = a.http_get("/admin/v2/clusters/a");
    assert_eq!(status, 200);
    assert!(
        body.contains(&format!(
            "\"brokerServiceUrl\":\"pulsar://{}\"",
            a.pulsar_addr
        )),
        "{body}"
    );
    assert_eq!(a.http_get("/admin/v2/clusters/nope").0, 404);
    let remote = r#"{"brokerServiceUrl":"pulsar://127.0.0.1:1"}"#;
    assert_eq!(a.http_put_json("/admin/v2/clusters/b", remote).0, 204);
    assert_eq!(a.http_put_json("/admin/v2/clusters/b", remote).0, 409);
    let bad = r#"{"brokerServiceUrl":"http://127.0.0.1:1"}"#;
    assert_eq!(a.http_put_json("/admin/v2/clusters/c", bad).0, 400);
    assert_eq!(a.http_post_json("/admin/v2/clusters/nope", remote).0, 404);
    // Tenants name recorded clusters only.
    assert_eq!(
        a.http_put_json("/admin/v2/tenants/t", r#"{"allowedClusters":["a","x"]}"#)
            .0,
        412
    );
    ok(
        a.http_put_json("/admin/v2/tenants/t", r#"{"allowedClusters":["a"]}"#),
        "tenant",
    );
    ok(
        a.http_put_json("/admin/v2/namespaces/t/ns", ""),
        "namespace",
    );
    let replication = "/admin/v2/namespaces/t/ns/replication";
    assert_eq!(a.http_get(replication), (200, r#"["a"]"#.to_owned()));
    assert_eq!(a.http_post_json(replication, "[]").0, 412);
    assert_eq!(a.http_post_json(replication, r#"["a","global"]"#).0, 412);
    assert_eq!(a.http_post_json(replication, r#"["a","x"]"#).0, 403);
    // b exists but the tenant is not allowed on it.
    assert_eq!(a.http_post_json(replication, r#"["a","b"]"#).0, 403);
    // A cluster a tenant allows is in use.
    ok(
        a.http_post_json("/admin/v2/tenants/t", r#"{"allowedClusters":["a","b"]}"#),
        "update tenant",
    );
    assert_eq!(a.http_delete("/admin/v2/clusters/b").0, 412);
    assert_eq!(a.http_post_json(replication, r#"["a","b"]"#).0, 204);
    assert_eq!(a.http_get(replication), (200, r#"["a","b"]"#.to_owned()));
    // A topic's own list, over its namespace's (a topic policy: the topic
    // must exist).
    let topic_replication = "/admin/v2/persistent/t/ns/x/replication";
    assert_eq!(a.http_post_json(topic_replication, r#"["a"]"#).0, 404);
    ok(
        a.http_put_json("/admin/v2/persistent/t/ns/x", ""),
        "create topic",
    );
    assert_eq!(a.http_get(topic_replication).0, 204);
    assert_eq!(
        a.http_get(&format!("{topic_replication}?applied=true")),
        (200, r#"["a","b"]"#.to_owned())
    );
    assert_eq!(a.http_post_json(topic_replication, r#"["a","x"]"#).0, 403);
    assert_eq!(a.http_post_json(topic_replication, r#"["a"]"#).0, 204);
    assert_eq!(a.http_get(topic_replication), (200, r#"["a"]"#.to_owned()));
    assert_eq!(a.http_delete(topic_replication).0, 204);
    assert_eq!(a.http_get(topic_replication).0, 204);
    // The same through `vela admin`.
    vela_admin(
        &a,
        &[
            "topics",
            "set-replication-clusters",
            "persistent://t/ns/x",
            "-c",
            "a",
        ],
    );
    let own = vela_admin(
        &a,
        &["topics", "get-replication-clusters", "persistent://t/ns/x"],
    );
    assert_eq!(own.trim(), "a");
    vela_admin(
        &a,
        &[
            "topics",
            "remove-replication-clusters",
            "persistent://t/ns/x",
        ],
    );
    let own = vela_admin(
        &a,
        &["topics", "get-replication-clusters", "persistent://t/ns/x"],
    );
    assert_eq!(own.trim(), "null");
    let listed = vela_admin(&a, &["clusters", "list"]);
    assert_eq!(listed.lines().collect::<Vec<_>>(), ["a", "b"]);
    // The reserved subscription names stay the replicators'.
    let client = client(&a).await;
    let refused = client
        .consumer()
        .with_topic("persistent://t/ns/x")
        .with_subscription("pulsar.repl.b")
        .build::<Vec<u8>>()
        .await;
    assert!(refused.is_err(), "a consumer took a replicator's cursor");
}
