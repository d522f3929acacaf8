//! Catch-up reads through the whole stack: a `vela standalone` whose caches
//! (the broker's entry cache, the bookie's write and read caches, the
//! subscriptions' read-ahead budget) are all much smaller than the backlog,
//! so every subscription reads its backlog from entry logs on the bookie,
//! across several ledgers.
//!
//! Checked: each subscription type drains the backlog byte for byte and in
//! order within each connection, with consumers reconnecting in the middle
//! (unacknowledged messages come again; nothing is lost); a slow and a fast
//! consumer on the same topic each get every message.
//!
//! Timeouts only bound a failure; nothing here measures speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::Standalone;
use vela_client::{
    Client, ClientConfig, Consumer, ConsumerOptions, InitialPosition, Message, OutgoingMessage,
    ProducerOptions, SubType,
};

/// Failure bound for one expected message.
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);
/// Messages in the backlog: ~26 MiB of 1 KiB payloads (batched into ~128
/// KiB entries), past the 1 MiB entry cache, the 11 MiB write cache, the
/// 1 MiB read cache and the 1 MiB read-ahead budget.
const BACKLOG_MESSAGES: usize = 25_000;
/// Entries per ledger: the backlog spans several ledgers.
const LEDGER_ENTRIES_MAX: u64 = 40;
/// A small receiver queue: permits arrive in many small FLOWs.
const RECEIVER_QUEUE: u32 = 100;
/// Received-but-unacknowledged messages at each reconnect (they must come
/// again).
const UNACKED_AT_RECONNECT: usize = 50;

/// A standalone whose caches (entry cache, write and read caches, read-ahead
/// budget) are all much smaller than the backlog, with short ledgers.
fn start_with_small_caches() -> Standalone {
    Standalone::start(&[
        "--write-cache-mb",
        "11",
        "--read-cache-mb",
        "1",
        "--read-ahead-mb",
        "1",
        "--flush-interval-ms",
        "200",
        "--managed-ledger-cache-size-mb",
        "1",
        "--ledger-max-entries",
        &LEDGER_ENTRIES_MAX.to_string(),
        // A full ledger rolls over at once, not after the default 10 min.
        "--ledger-min-rollover-minutes",
        "0",
    ])
}

impl Standalone {
    fn client(&self) -> Client {
        Client::new(&self.pulsar_url, ClientConfig::default()).unwrap()
    }

    /// The broker's view of `topic`'s subscriptions and cursors (stats and
    /// internal stats), for a stall's failure message.
    fn subscription_state(&self, topic: &str) -> String {
        let path = topic.replacen("persistent://", "/admin/v2/persistent/", 1);
        let stats = self.try_http_get(&format!("{path}/stats"));
        let internal = self.try_http_get(&format!("{path}/internalStats"));
        format!("stats: {stats}\ninternal stats: {internal}")
    }

    /// Ledgers `topic`'s log has now (its internal stats).
    fn ledgers_of(&self, topic: &str) -> usize {
        let path = topic.replacen("persistent://", "/admin/v2/persistent/", 1);
        let (status, body) = self.http_get(&format!("{path}/internalStats"));
        assert_eq!(status, 200, "internalStats: {body}");
        body.matches("\"ledgerId\"").count()
    }

    /// Entries the bookie served from entry logs (its `bookie_read_log`
    /// read-path stage in `/metrics`): the backlog was read from disk, not
    /// from a cache.
    fn entries_read_from_entry_logs(&self) -> u64 {
        self.metrics()
            .lines()
            .filter(|line| {
                line.starts_with("vela_read_path_latency_seconds_count{")
                    && line.contains("stage=\"bookie_read_log\"")
            })
            .filter_map(|line| line.rsplit(' ').next()?.parse::<f64>().ok())
            .map(|count| count as u64)
            .sum()
    }
}

/// Message `index`: its index, then 1 KiB of bytes that depend on it.
fn payload(index: usize) -> Vec<u8> {
    let mut bytes = (index as u64).to_be_bytes().to_vec();
    bytes.extend((0..1016).map(|i| ((i * 31 + index * 7) % 251) as u8));
    bytes
}

/// The index a payload claims, after checking every byte of it.
fn check_payload(message: &Message) -> usize {
    let head: [u8; 8] = message.payload[..8].try_into().unwrap();
    let index = u64::from_be_bytes(head) as usize;
    assert!(index < BACKLOG_MESSAGES, "index {index} out of range");
    assert_eq!(
        &message.payload[..],
        &payload(index)[..],
        "message {index} came back with other bytes"
    );
    index
}

async fn subscribe(
    client: &Client,
    topic: &str,
    subscription: &str,
    sub_type: SubType,
) -> Consumer {
    let options = ConsumerOptions {
        subscription: subscription.to_string(),
        sub_type,
        initial_position: InitialPosition::Earliest,
        receiver_queue_size: RECEIVER_QUEUE,
        name: None,
        replicate_subscription_state: false,
    };
    client.subscribe(topic, options).await.unwrap()
}

async fn produce_backlog(client: &Client, topic: &str) {
    let producer = client
        .create_producer(topic, ProducerOptions::default())
        .await
        .unwrap();
    let mut receipts = Vec::with_capacity(BACKLOG_MESSAGES);
    for index in 0..BACKLOG_MESSAGES {
        // A key per message spreads Key_Shared over its hash slots.
        let message = OutgoingMessage::new(payload(index)).with_key(format!("k{}", index % 97));
        receipts.push(producer.send(message).await.unwrap());
    }
    producer.flush().await;
    for receipt in receipts {
        receipt.await.unwrap();
    }
    producer.close().await.unwrap();
}

/// The next message; on a stall, fails with what the broker says of the
/// topic's subscriptions (permits, entries out and in replay, fenced
/// Key_Shared consumers, read in flight) and `progress`.
async fn receive(
    standalone: &Standalone,
    topic: &str,
    consumer: &Consumer,
    what: &str,
    progress: &str,
) -> Message {
    match consumer.receive_timeout(RECEIVE_TIMEOUT).await.unwrap() {
        Some(message) => message,
        None => panic!(
            "{what}: no message within {RECEIVE_TIMEOUT:?} ({progress})\n{}",
            standalone.subscription_state(topic)
        ),
    }
}

/// Drains the backlog on `subscription`, reconnecting twice in the middle
/// with `UNACKED_AT_RECONNECT` messages received but not acknowledged.
async fn drain_with_reconnects(
    standalone: &Standalone,
    client: &Client,
    topic: &str,
    subscription: &str,
    sub_type: SubType,
) {
    let what = format!("{sub_type:?} subscription {subscription}");
    let mut acked: BTreeSet<usize> = BTreeSet::new();
    let mut never_acked: BTreeSet<usize> = BTreeSet::new();
    let mut received_total = 0usize;
    let reconnect_at = [BACKLOG_MESSAGES / 3, 2 * BACKLOG_MESSAGES / 3];
    let mut session = 0;
    while acked.len() < BACKLOG_MESSAGES {
        let consumer = subscribe(client, topic, subscription, sub_type).await;
        let mut last_id = None;
        let mut unacked: Vec<usize> = Vec::new();
        loop {
            let progress = format!(
                "session {session}, {received_total} received, {} acked, {} held unacked",
                acked.len(),
                unacked.len()
            );
            let message = receive(standalone, topic, &consumer, &what, &progress).await;
            // One consumer per connection: ids only grow within it
            // (redeliveries, which come first, included).
            assert!(
                last_id.is_none_or(|last| message.id > last),
                "{what}: {} after {:?} in one session",
                message.id,
                last_id
            );
            last_id = Some(message.id);
            let index = check_payload(&message);
            received_total += 1;
            let reconnect = session < reconnect_at.len() && received_total >= reconnect_at[session];
            if reconnect && unacked.len() < UNACKED_AT_RECONNECT {
                unacked.push(index);
                continue;
            }
            if reconnect {
                break;
            }
            consumer.ack(&message.id).await.unwrap();
            acked.insert(index);
            never_acked.remove(&index);
            if acked.len() == BACKLOG_MESSAGES {
                break;
            }
        }
        never_acked.extend(unacked.iter().copied().filter(|i| !acked.contains(i)));
        consumer.close().await.unwrap();
        session += 1;
    }
    assert!(
        never_acked.is_empty(),
        "{what}: messages received before a reconnect never came again: {never_acked:?}"
    );
    assert_eq!(
        session,
        reconnect_at.len() + 1,
        "{what}: reconnected {session} times"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_subscription_type_drains_a_backlog_larger_than_every_cache() {
    let standalone = start_with_small_caches();
    let client = standalone.client();
    let topic = "persistent://public/default/catch-up-types";
    let kinds = [
        ("exclusive", SubType::Exclusive),
        ("shared", SubType::Shared),
        ("failover", SubType::Failover),
        ("key-shared", SubType::KeyShared),
    ];
    // The subscriptions exist before the backlog is written.
    for (name, sub_type) in kinds {
        subscribe(&client, topic, name, sub_type)
            .await
            .close()
            .await
            .unwrap();
    }
    produce_backlog(&client, topic).await;
    assert!(
        standalone.ledgers_of(topic) > 2,
        "the backlog does not span several ledgers"
    );
    for (name, sub_type) in kinds {
        drain_with_reconnects(&standalone, &client, topic, name, sub_type).await;
    }
    assert!(
        standalone.entries_read_from_entry_logs() > 0,
        "the backlog never came from an entry log: the caches were not outgrown"
    );
    client.close().await;
}

/// Receives the whole backlog in order, pausing after every `pause_every`
/// messages when asked to (a slow consumer).
async fn drain_in_order(
    standalone: &Standalone,
    topic: &str,
    consumer: Consumer,
    pause_every: Option<usize>,
    what: &str,
) {
    for expected in 0..BACKLOG_MESSAGES {
        let progress = format!("{expected} received");
        let message = receive(standalone, topic, &consumer, what, &progress).await;
        let index = check_payload(&message);
        assert_eq!(index, expected, "{what}: out of order");
        consumer.ack(&message.id).await.unwrap();
        if let Some(every) = pause_every
            && expected % every == 0
        {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    }
    consumer.close().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_and_a_fast_consumer_each_get_every_message() {
    let standalone = start_with_small_caches();
    let client = standalone.client();
    let topic = "persistent://public/default/catch-up-slow-fast";
    let slow = subscribe(&client, topic, "slow", SubType::Exclusive).await;
    let fast = subscribe(&client, topic, "fast", SubType::Exclusive).await;
    produce_backlog(&client, topic).await;
    tokio::join!(
        drain_in_order(&standalone, topic, slow, Some(50), "slow consumer"),
        drain_in_order(&standalone, topic, fast, None, "fast consumer"),
    );
    assert!(standalone.entries_read_from_entry_logs() > 0);
    client.close().await;
}
