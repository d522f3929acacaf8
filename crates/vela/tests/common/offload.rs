//! What the tiered-storage tests share: payloads that name their index,
//! producing and draining a topic byte for byte, Pulsar's offload routes
//! (trigger, status polled until settled) and the ledgers internalStats
//! says are offloaded.

use std::time::{Duration, Instant};

use serde_json::Value;
use vela_client::{
    Client, Consumer, ConsumerOptions, InitialPosition, MessageId, OutgoingMessage,
    ProducerOptions, SubType,
};

use super::Standalone;

pub(crate) const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);
pub(crate) const OFFLOAD_TIMEOUT: Duration = Duration::from_secs(300);

/// Longest payload `sized_payload` makes.
pub(crate) const PAYLOAD_BYTES_MAX: usize = 1 << 20;

/// `len` bytes: the index (8 bytes, big-endian), then byte `i` is
/// `(31 i + 7 index) mod 251`. Cut from one table (`31 j mod 251`, since
/// `31 i + 7 index = 31 (i + c)` mod 251 with `c = 81 * 7 index`: 81 is 31's
/// inverse), so a GiB of payloads costs copies, not arithmetic, in a debug
/// build.
pub(crate) fn sized_payload(index: usize, len: usize) -> Vec<u8> {
    static TABLE: std::sync::OnceLock<Vec<u8>> = std::sync::OnceLock::new();
    assert!(
        (8..=PAYLOAD_BYTES_MAX).contains(&len),
        "payload of {len} bytes"
    );
    let table = TABLE.get_or_init(|| {
        (0..PAYLOAD_BYTES_MAX + 251)
            .map(|j| ((j * 31) % 251) as u8)
            .collect()
    });
    let shift = (81 * ((7 * index) % 251)) % 251;
    let mut bytes = Vec::with_capacity(len);
    bytes.extend_from_slice(&(index as u64).to_be_bytes());
    bytes.extend_from_slice(&table[shift..shift + len - 8]);
    debug_assert!(
        len < 10 || bytes[9] == ((31 + index * 7) % 251) as u8,
        "the table's shift"
    );
    bytes
}

/// `/admin/v2/persistent/t/ns/topic` of `persistent://t/ns/topic`.
pub(crate) fn admin_path(topic: &str) -> String {
    let rest = topic
        .strip_prefix("persistent://")
        .expect("a persistent topic");
    format!("/admin/v2/persistent/{rest}")
}

pub(crate) async fn subscribe(client: &Client, topic: &str, subscription: &str) -> Consumer {
    let options = ConsumerOptions {
        subscription: subscription.to_string(),
        sub_type: SubType::Exclusive,
        initial_position: InitialPosition::Earliest,
        receiver_queue_size: 100,
        name: None,
        replicate_subscription_state: false,
    };
    client.subscribe(topic, options).await.unwrap()
}

/// Receives messages `indexes` in order, each byte for byte, acknowledging
/// them; the ids received.
pub(crate) async fn drain_sized(
    consumer: &Consumer,
    indexes: std::ops::Range<usize>,
    len: usize,
    what: &str,
) -> Vec<MessageId> {
    let mut ids = Vec::new();
    for expected in indexes {
        let message = match consumer.receive_timeout(RECEIVE_TIMEOUT).await.unwrap() {
            Some(message) => message,
            None => panic!("{what}: message {expected} not received within {RECEIVE_TIMEOUT:?}"),
        };
        assert!(
            message.payload[..] == sized_payload(expected, len)[..],
            "{what}: message {expected} came back with other bytes (or out of order)"
        );
        consumer.ack(&message.id).await.unwrap();
        ids.push(message.id);
    }
    ids
}

/// After the last expected message: nothing more within `wait`.
pub(crate) async fn assert_drained(consumer: &Consumer, wait: Duration, what: &str) {
    if let Some(message) = consumer.receive_timeout(wait).await.unwrap() {
        panic!(
            "{what}: one message too many ({} bytes, id {:?})",
            message.payload.len(),
            message.id
        );
    }
}

/// `count` unbatched messages of `len` bytes (one entry each), indexes
/// `first..first + count`; at most `in_flight` unanswered at once.
pub(crate) async fn produce(client: &Client, topic: &str, first: usize, count: usize, len: usize) {
    const IN_FLIGHT_MAX: usize = 256;
    let producer = client
        .create_producer(
            topic,
            ProducerOptions {
                batching: None,
                ..ProducerOptions::default()
            },
        )
        .await
        .unwrap();
    let mut receipts = std::collections::VecDeque::new();
    for index in first..first + count {
        let message = OutgoingMessage::new(sized_payload(index, len));
        receipts.push_back(producer.send(message).await.unwrap());
        if receipts.len() >= IN_FLIGHT_MAX {
            receipts.pop_front().unwrap().await.unwrap();
        }
    }
    producer.flush().await;
    for receipt in receipts {
        receipt.await.unwrap();
    }
    producer.close().await.unwrap();
}

/// Keeps consumed data (the seeks and rereads need it).
pub(crate) fn retain_forever(standalone: &Standalone) {
    let (status, reply) = standalone.http_post_json(
        "/admin/v2/namespaces/public/default/retention",
        r#"{"retentionTimeInMinutes":-1,"retentionSizeInMB":-1}"#,
    );
    assert_eq!(status, 204, "retention: {reply}");
}

pub(crate) fn json(standalone: &Standalone, path: &str) -> Value {
    let (status, body) = standalone.http_get(path);
    assert_eq!(status, 200, "GET {path}: {body}");
    serde_json::from_str(&body).unwrap()
}

/// `PUT .../offload` of everything before the ledger of the last entry.
pub(crate) fn start_offload(standalone: &Standalone, topic: &str) {
    let admin = admin_path(topic);
    let stats = json(standalone, &format!("{admin}/internalStats"));
    let last = stats["lastConfirmedEntry"].as_str().unwrap().to_string();
    let (ledger_id, entry_id) = last.split_once(':').unwrap();
    let body = format!(r#"{{"ledgerId":{ledger_id},"entryId":{entry_id},"partitionIndex":-1}}"#);
    let (status, reply) = standalone.http_put_json(&format!("{admin}/offload"), &body);
    assert_eq!(status, 204, "PUT offload: {reply}");
}

/// `GET .../offload`.
pub(crate) fn offload_status(standalone: &Standalone, topic: &str) -> Value {
    json(standalone, &format!("{}/offload", admin_path(topic)))
}

/// Polls the status until it is no longer RUNNING: the status document.
pub(crate) fn wait_offload(standalone: &Standalone, topic: &str) -> Value {
    let started = Instant::now();
    loop {
        let status = offload_status(standalone, topic);
        if status["status"] != "RUNNING" {
            return status;
        }
        assert!(
            started.elapsed() < OFFLOAD_TIMEOUT,
            "offload still running: {status}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Offloads everything before the ledger of the last entry and waits for
/// the status to settle: the status document.
pub(crate) fn offload_and_wait(standalone: &Standalone, topic: &str) -> Value {
    start_offload(standalone, topic);
    wait_offload(standalone, topic)
}

/// The ledgers of internalStats (with their bookie metadata).
pub(crate) fn ledgers(standalone: &Standalone, topic: &str) -> Vec<Value> {
    let stats = json(
        standalone,
        &format!("{}/internalStats?metadata=true", admin_path(topic)),
    );
    stats["ledgers"].as_array().unwrap().clone()
}

pub(crate) fn offloaded_ledgers(standalone: &Standalone, topic: &str) -> usize {
    ledgers(standalone, topic)
        .iter()
        .filter(|l| l["offloaded"] == true)
        .count()
}
