//! Tiered storage through a real `vela standalone` with the filesystem
//! offload driver and a deletion lag of 0: a topic produced over many
//! ledgers, offloaded with Pulsar's admin route (`PUT .../offload`, status
//! polled with `GET .../offload`), its bookie copies deleted; then a
//! subscription drains it byte for byte and in order, a cursor reset (the
//! admin seek) lands in the middle of an offloaded ledger, and after a
//! restart a new subscription reads everything again from the objects.
//!
//! Timeouts only bound a failure; nothing here measures speed.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::time::{Duration, Instant};

use common::Standalone;
use common::offload::{self as off, OFFLOAD_TIMEOUT, json, retain_forever};
use serde_json::Value;
use vela_client::{Client, ClientConfig, Consumer, MessageId};

const TOPIC: &str = "persistent://public/default/offloaded";
const ADMIN: &str = "/admin/v2/persistent/public/default/offloaded";
/// ~6 MiB in 4 KiB messages, one entry each, 50 entries a ledger: 30
/// ledgers, past the 1 MiB entry cache and read-ahead budget.
const MESSAGES: usize = 1500;
const PAYLOAD_BYTES: usize = 4096;
const LEDGER_ENTRIES_MAX: u64 = 50;

fn start(data_dir: &Path, offload_dir: &Path) -> Standalone {
    Standalone::start_in(
        data_dir,
        &[
            "--ledger-max-entries",
            &LEDGER_ENTRIES_MAX.to_string(),
            "--ledger-min-rollover-minutes",
            "0",
            "--managed-ledger-cache-size-mb",
            "1",
            "--read-ahead-mb",
            "1",
            "--offload-driver",
            "filesystem",
            "--offload-directory",
            offload_dir.to_str().unwrap(),
            "--offload-deletion-lag-ms",
            "0",
        ],
    )
}

async fn subscribe(client: &Client, subscription: &str) -> Consumer {
    off::subscribe(client, TOPIC, subscription).await
}

/// Receives messages `from..MESSAGES` in order, each byte for byte,
/// acknowledging them; the ids received.
async fn drain(consumer: &Consumer, from: usize, what: &str) -> Vec<MessageId> {
    drain_sized(consumer, from..MESSAGES, PAYLOAD_BYTES, what).await
}

async fn drain_sized(
    consumer: &Consumer,
    indexes: std::ops::Range<usize>,
    len: usize,
    what: &str,
) -> Vec<MessageId> {
    off::drain_sized(consumer, indexes, len, what).await
}

/// `count` unbatched messages of `len` bytes (one entry each).
async fn produce(client: &Client, count: usize, len: usize) {
    off::produce(client, TOPIC, 0, count, len).await
}

/// Offloads everything before the ledger of the last entry and waits for
/// the status to settle: the status document.
fn offload_and_wait(standalone: &Standalone) -> Value {
    off::offload_and_wait(standalone, TOPIC)
}

/// Names of the objects in the offload directory (staging files of
/// uploads in progress included: `NAME#1`).
fn object_names(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .filter(|name| name.contains("-ledger-"))
        .collect()
}

fn objects(dir: &Path) -> usize {
    object_names(dir).len()
}

fn offloaded_ledgers(standalone: &Standalone) -> usize {
    off::offloaded_ledgers(standalone, TOPIC)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offloaded_ledgers_are_consumed_sought_and_reread_after_a_restart() {
    let data_dir = tempfile::tempdir().unwrap();
    let offload_dir = tempfile::tempdir().unwrap();
    let standalone = start(data_dir.path(), offload_dir.path());
    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();

    retain_forever(&standalone);
    // The namespace's offload numbers (Pulsar's routes): stored, read back.
    let ns = "/admin/v2/namespaces/public/default";
    let threshold = format!("{ns}/offloadThreshold");
    assert_eq!(standalone.http_get(&threshold), (200, "-1".to_string()));
    assert_eq!(standalone.http_put_json(&threshold, "1048576").0, 204);
    assert_eq!(standalone.http_get(&threshold).1, "1048576");
    assert_eq!(standalone.http_put_json(&threshold, "-1").0, 204);
    let lag = format!("{ns}/offloadDeletionLagMs");
    // Unset: 204 without a body, as Pulsar answers a null Long.
    assert_eq!(standalone.http_get(&lag).0, 204);
    assert_eq!(standalone.http_put_json(&lag, "0").0, 204);
    assert_eq!(standalone.http_get(&lag).1, "0");
    // Nothing offloaded yet.
    subscribe(&client, "keep").await.close().await.unwrap();
    let status = json(&standalone, &format!("{ADMIN}/offload"));
    assert_eq!(status["status"], "NOT_RUN", "{status}");

    produce(&client, MESSAGES, PAYLOAD_BYTES).await;

    let status = offload_and_wait(&standalone);
    assert_eq!(status["status"], "SUCCESS", "{status}");
    assert_eq!(status["lastError"], "");
    let first_kept = status["firstUnoffloadedMessage"]["ledgerId"]
        .as_u64()
        .unwrap();
    let stats = json(&standalone, &format!("{ADMIN}/internalStats?metadata=true"));
    let ledgers = stats["ledgers"].as_array().unwrap();
    let offloaded: Vec<&Value> = ledgers.iter().filter(|l| l["offloaded"] == true).collect();
    assert!(
        offloaded.len() as u64 >= (MESSAGES as u64 / LEDGER_ENTRIES_MAX) - 2,
        "offloaded {} of {} ledgers: {stats}",
        offloaded.len(),
        ledgers.len()
    );
    for ledger in &offloaded {
        assert!(
            ledger["ledgerId"].as_u64().unwrap() < first_kept,
            "{ledger}"
        );
        // Deletion lag 0: only the objects hold it (no bookie metadata).
        assert!(
            ledger["metadata"].is_null(),
            "bookie copy still there: {ledger}"
        );
    }
    assert_eq!(
        objects(offload_dir.path()),
        2 * offloaded.len(),
        "data and index each"
    );

    // Consumed from the earliest message, byte for byte.
    let keep = subscribe(&client, "keep").await;
    let ids = drain(&keep, 0, "keep").await;
    keep.close().await.unwrap();

    // The admin seek into the middle of an offloaded ledger.
    let target = ids
        .iter()
        .position(|id| {
            id.ledger_id == offloaded[offloaded.len() / 2]["ledgerId"].as_u64().unwrap()
                && id.entry_id == 7
        })
        .expect("entry 7 of an offloaded ledger was consumed");
    let body = format!(
        r#"{{"ledgerId":{},"entryId":{},"partitionIndex":-1,"isExcluded":false}}"#,
        ids[target].ledger_id, ids[target].entry_id
    );
    let (status, reply) =
        standalone.http_post_json(&format!("{ADMIN}/subscription/keep/resetcursor"), &body);
    assert_eq!(status, 204, "reset cursor: {reply}");
    let keep = subscribe(&client, "keep").await;
    drain(&keep, target, "keep after the seek").await;
    keep.close().await.unwrap();
    client.close().await;

    // After a restart the record still says where each ledger lives.
    drop(standalone);
    let standalone = start(data_dir.path(), offload_dir.path());
    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();
    let fresh = subscribe(&client, "after-restart").await;
    drain(&fresh, 0, "after the restart").await;
    fresh.close().await.unwrap();
    client.close().await;
}

/// 48 MiB in 16 KiB messages over 60 ledgers: an offload long enough to be
/// killed in the middle.
const CRASH_MESSAGES: usize = 3000;
const CRASH_PAYLOAD_BYTES: usize = 16 << 10;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_an_offload_loses_nothing_and_the_next_offload_cleans_up() {
    let data_dir = tempfile::tempdir().unwrap();
    let offload_dir = tempfile::tempdir().unwrap();
    let standalone = start(data_dir.path(), offload_dir.path());
    retain_forever(&standalone);
    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();
    subscribe(&client, "keep").await.close().await.unwrap();
    produce(&client, CRASH_MESSAGES, CRASH_PAYLOAD_BYTES).await;
    client.close().await;

    let stats = json(&standalone, &format!("{ADMIN}/internalStats"));
    let last = stats["lastConfirmedEntry"].as_str().unwrap().to_string();
    let (ledger_id, entry_id) = last.split_once(':').unwrap();
    let body = format!(r#"{{"ledgerId":{ledger_id},"entryId":{entry_id}}}"#);
    let (status, reply) = standalone.http_put_json(&format!("{ADMIN}/offload"), &body);
    assert_eq!(status, 204, "PUT offload: {reply}");
    // kill -9 once the first ledger's objects are complete.
    let started = Instant::now();
    while !object_names(offload_dir.path())
        .iter()
        .any(|name| name.ends_with("-index"))
    {
        assert!(started.elapsed() < OFFLOAD_TIMEOUT, "no ledger offloaded");
        std::thread::sleep(Duration::from_millis(2));
    }
    drop(standalone);
    let objects_at_kill = objects(offload_dir.path());

    let standalone = start(data_dir.path(), offload_dir.path());
    let status = json(&standalone, &format!("{ADMIN}/offload"));
    assert_eq!(status["status"], "NOT_RUN", "a new process: {status}");
    let offloaded_at_restart = offloaded_ledgers(&standalone);
    eprintln!(
        "killed with {objects_at_kill} objects written, {offloaded_at_restart} ledgers recorded offloaded"
    );
    // Everything is still readable once, in order, byte for byte.
    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();
    let keep = subscribe(&client, "keep").await;
    drain_sized(
        &keep,
        0..CRASH_MESSAGES,
        CRASH_PAYLOAD_BYTES,
        "after the kill",
    )
    .await;
    keep.close().await.unwrap();

    // The next offload completes and leaves exactly two objects a ledger:
    // nothing of the attempt that was killed.
    let status = offload_and_wait(&standalone);
    assert_eq!(status["status"], "SUCCESS", "{status}");
    let offloaded = offloaded_ledgers(&standalone);
    assert!(
        offloaded >= offloaded_at_restart && offloaded >= 55,
        "{offloaded} offloaded"
    );
    let names = object_names(offload_dir.path());
    assert_eq!(names.len(), 2 * offloaded, "objects: {names:?}");
    assert!(
        !names.iter().any(|name| name.contains('#')),
        "staging files left: {names:?}"
    );
    let again = subscribe(&client, "again").await;
    drain_sized(
        &again,
        0..CRASH_MESSAGES,
        CRASH_PAYLOAD_BYTES,
        "after the offload",
    )
    .await;
    again.close().await.unwrap();
    client.close().await;
}

/// Pulsar's `offloadPolicies` object drives automatic offloads: a namespace
/// object with a size threshold of 0 and a deletion lag of 0 (the broker's
/// flags keep their defaults: no automatic offload, 4 h of lag) gets every
/// closed ledger offloaded and its bookie copy deleted as the topic rolls
/// over; the object is checked as Pulsar checks it, served back with
/// Pulsar's defaults, set and removed on a topic, and
/// `removeOffloadPolicies` removes it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn offload_policies_objects_drive_automatic_offloads() {
    const TOPIC: &str = "persistent://public/default/by-policy";
    const MESSAGES: usize = 500;
    let data_dir = tempfile::tempdir().unwrap();
    let offload_dir = tempfile::tempdir().unwrap();
    let standalone = Standalone::start_in(
        data_dir.path(),
        &[
            "--ledger-max-entries",
            &LEDGER_ENTRIES_MAX.to_string(),
            "--ledger-min-rollover-minutes",
            "0",
            "--policy-check-interval-s",
            "2",
            "--offload-driver",
            "filesystem",
            "--offload-directory",
            offload_dir.path().to_str().unwrap(),
        ],
    );
    retain_forever(&standalone);
    let route = "/admin/v2/namespaces/public/default/offloadPolicies";
    assert_eq!(standalone.http_get(route).0, 204, "unset");
    let (status, reply) =
        standalone.http_post_json(route, r#"{"managedLedgerOffloadDriver":"hdfs"}"#);
    assert_eq!(status, 412, "{reply}");
    assert!(reply.contains("The driver is not supported"), "{reply}");
    let (status, reply) =
        standalone.http_post_json(route, r#"{"managedLedgerOffloadDriver":"aws-s3"}"#);
    assert_eq!(status, 412, "{reply}");
    assert!(reply.contains("The bucket must be specified"), "{reply}");
    let (status, reply) = standalone.http_post_json(
        route,
        r#"{"managedLedgerOffloadDriver":"filesystem",
            "managedLedgerOffloadThresholdInBytes":0,
            "managedLedgerOffloadDeletionLagInMillis":0}"#,
    );
    assert_eq!(status, 204, "{reply}");
    let stored = json(&standalone, route);
    assert_eq!(stored["managedLedgerOffloadThresholdInBytes"], 0);
    assert_eq!(stored["managedLedgerOffloadMaxThreads"], 2, "{stored}");
    assert_eq!(stored["fileSystemDriver"], true, "{stored}");

    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();
    off::subscribe(&client, TOPIC, "keep")
        .await
        .close()
        .await
        .unwrap();
    off::produce(&client, TOPIC, 0, MESSAGES, PAYLOAD_BYTES).await;
    // Rollovers trigger the threshold offload; the lag of 0 deletes the
    // bookie copies right after.
    let started = Instant::now();
    let closed = MESSAGES / LEDGER_ENTRIES_MAX as usize - 1;
    loop {
        let ledgers = off::ledgers(&standalone, TOPIC);
        let gone = ledgers
            .iter()
            .filter(|l| l["offloaded"] == true && l["metadata"].is_null())
            .count();
        if gone >= closed {
            break;
        }
        assert!(
            started.elapsed() < OFFLOAD_TIMEOUT,
            "{gone} of {closed} closed ledgers offloaded by policy: {ledgers:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let keep = off::subscribe(&client, TOPIC, "keep").await;
    off::drain_sized(&keep, 0..MESSAGES, PAYLOAD_BYTES, "offloaded by policy").await;
    keep.close().await.unwrap();
    client.close().await;

    // The topic level: set, read back, removed.
    let topic_route = format!("{}/offloadPolicies", off::admin_path(TOPIC));
    let (status, reply) = standalone.http_post_json(
        &topic_route,
        r#"{"managedLedgerOffloadDriver":"S3","s3ManagedLedgerOffloadBucket":"b",
            "managedLedgerOffloadThresholdInBytes":-1}"#,
    );
    assert_eq!(status, 204, "{reply}");
    let stored = json(&standalone, &topic_route);
    assert_eq!(stored["s3ManagedLedgerOffloadBucket"], "b", "{stored}");
    assert_eq!(stored["s3Driver"], true, "{stored}");
    assert_eq!(standalone.http_delete(&topic_route).0, 204);
    assert_eq!(standalone.http_get(&topic_route).0, 204);

    // removeOffloadPolicies: the object and the older numbers go.
    let threshold = "/admin/v2/namespaces/public/default/offloadThreshold";
    assert_eq!(standalone.http_put_json(threshold, "1048576").0, 204);
    let (status, reply) =
        standalone.http_delete("/admin/v2/namespaces/public/default/removeOffloadPolicies");
    assert_eq!(status, 204, "{reply}");
    assert_eq!(standalone.http_get(route).0, 204);
    assert_eq!(standalone.http_get(threshold), (200, "-1".to_string()));
}
