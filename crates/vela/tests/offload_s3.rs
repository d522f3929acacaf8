//! Tiered storage on a real S3-compatible server: a `vela standalone` with
//! `--offload-driver aws-s3` writing to SeaweedFS (`weed server -s3`, built
//! from its Go module by `tests/support/seaweedfs.sh`), signing with
//! credentials from the environment, deletion lag 0.
//!
//! - 1 GiB produced over 128 ledgers, offloaded, its bookie copies gone,
//!   consumed from the earliest message byte for byte, exactly once; an
//!   admin seek into the middle of an offloaded ledger; after a restart a
//!   new subscription reads it again from the bucket (a quarter of it; all
//!   with `VELA_TEST_FULL=1`);
//! - kill -9 during an offload, restart: everything read once; the next
//!   offload completes and leaves exactly two objects a ledger;
//! - the store stopped during an offload: the status says ERROR with the
//!   store's message, no ledger is in neither place, and once the store is
//!   back the offload completes and everything reads back.
//!
//! Timeouts only bound a failure; nothing here measures speed (the test
//! prints its phases' durations for the CI budget).
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::Standalone;
use common::offload::{
    self as off, OFFLOAD_TIMEOUT, assert_drained, drain_sized, offload_status, produce,
    retain_forever, subscribe, wait_offload,
};
use common::seaweedfs::{ACCESS_KEY, SECRET_KEY, SeaweedFs};
use futures::TryStreamExt;
use object_store::ObjectStore;
use vela_client::{Client, ClientConfig};
use vela_offload::{S3Credentials, S3Settings};

/// Nothing more arrives after the last message within this.
const QUIET: Duration = Duration::from_secs(2);

fn full() -> bool {
    std::env::var("VELA_TEST_FULL").is_ok_and(|v| v == "1")
}

fn start(data_dir: &Path, store: &SeaweedFs, ledger_entries_max: u64) -> Standalone {
    let mut args: Vec<String> = [
        "--ledger-max-entries",
        &ledger_entries_max.to_string(),
        "--ledger-min-rollover-minutes",
        "0",
        "--managed-ledger-cache-size-mb",
        "8",
        "--read-ahead-mb",
        "8",
        "--offload-deletion-lag-ms",
        "0",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(store.vela_args());
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    Standalone::start_in_env(data_dir, &args, &store.vela_env())
}

/// The bucket, as the broker sees it.
fn bucket(store: &SeaweedFs) -> Arc<dyn ObjectStore> {
    vela_offload::s3::store(&S3Settings {
        bucket: store.bucket.clone(),
        region: None,
        endpoint: Some(store.endpoint.clone()),
        credentials: S3Credentials {
            access_key_id: ACCESS_KEY.to_string(),
            secret_access_key: SECRET_KEY.to_string(),
            session_token: None,
            source: "test".to_string(),
        },
    })
    .unwrap()
}

async fn object_names(bucket: &Arc<dyn ObjectStore>) -> Vec<String> {
    bucket
        .list(None)
        .map_ok(|meta| meta.location.to_string())
        .try_collect()
        .await
        .unwrap()
}

/// Every ledger is offloaded (complete) or still on the bookies: never
/// in neither place.
fn assert_every_ledger_somewhere(standalone: &Standalone, topic: &str) {
    for ledger in off::ledgers(standalone, topic) {
        assert!(
            ledger["offloaded"] == true || !ledger["metadata"].is_null(),
            "a ledger in neither place: {ledger}"
        );
    }
}

fn phase(what: &str, since: Instant) -> Instant {
    eprintln!(
        "offload_s3: {what} in {:.1} s",
        since.elapsed().as_secs_f64()
    );
    Instant::now()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_ledgers_offloaded_to_s3_are_consumed_sought_and_reread() {
    const TOPIC: &str = "persistent://public/default/s3-bulk";
    // 64 KiB messages, 128 a ledger (8 MiB ledgers).
    const PAYLOAD_BYTES: usize = 64 << 10;
    const LEDGER_ENTRIES_MAX: u64 = 128;
    // 1 GiB over 128 ledgers (the default run: about 100 s alone, beside
    // the other tests' ~100 s of outage and crash).
    let messages: usize = 16 * 1024;
    let started = Instant::now();
    let store = SeaweedFs::start();
    let bucket = bucket(&store);
    let data_dir = tempfile::tempdir().unwrap();
    let standalone = start(data_dir.path(), &store, LEDGER_ENTRIES_MAX);
    retain_forever(&standalone);
    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();
    subscribe(&client, TOPIC, "keep")
        .await
        .close()
        .await
        .unwrap();
    let mut t = phase("SeaweedFS and vela started", started);

    produce(&client, TOPIC, 0, messages, PAYLOAD_BYTES).await;
    t = phase(
        &format!("{} MiB produced", (messages * PAYLOAD_BYTES) >> 20),
        t,
    );

    let status = off::offload_and_wait(&standalone, TOPIC);
    assert_eq!(status["status"], "SUCCESS", "{status}");
    assert_eq!(status["lastError"], "");
    t = phase("offloaded", t);
    let ledgers = off::ledgers(&standalone, TOPIC);
    let offloaded: Vec<_> = ledgers.iter().filter(|l| l["offloaded"] == true).collect();
    let expected = messages as u64 / LEDGER_ENTRIES_MAX - 1;
    assert!(
        offloaded.len() as u64 >= expected,
        "offloaded {} of {} ledgers (expected {expected}+)",
        offloaded.len(),
        ledgers.len()
    );
    for ledger in &offloaded {
        // Deletion lag 0: only the objects hold it (no bookie metadata).
        assert!(
            ledger["metadata"].is_null(),
            "bookie copy still there: {ledger}"
        );
    }
    let names = object_names(&bucket).await;
    assert_eq!(
        names.len(),
        2 * offloaded.len(),
        "a data and an index object per ledger: {names:?}"
    );

    // Consumed from the earliest message, byte for byte, exactly once.
    let keep = subscribe(&client, TOPIC, "keep").await;
    let ids = drain_sized(&keep, 0..messages, PAYLOAD_BYTES, "keep").await;
    assert_drained(&keep, QUIET, "keep").await;
    keep.close().await.unwrap();
    t = phase("consumed from the earliest message", t);
    let metrics = standalone.metrics();
    let read_bytes: f64 = metrics
        .lines()
        .find(|l| l.starts_with("vela_offload_read_bytes_total"))
        .and_then(|l| l.split_whitespace().last())
        .and_then(|v| v.parse().ok())
        .expect("vela_offload_read_bytes_total on /metrics");
    assert!(
        read_bytes >= (expected as usize * LEDGER_ENTRIES_MAX as usize * PAYLOAD_BYTES) as f64,
        "read {read_bytes} bytes from the bucket"
    );

    // The admin seek into the middle of an offloaded ledger.
    let middle = offloaded[offloaded.len() / 2]["ledgerId"].as_u64().unwrap();
    let target = ids
        .iter()
        .position(|id| id.ledger_id == middle && id.entry_id == 37)
        .expect("entry 37 of an offloaded ledger was consumed");
    let body = format!(
        r#"{{"ledgerId":{},"entryId":{},"partitionIndex":-1,"isExcluded":false}}"#,
        ids[target].ledger_id, ids[target].entry_id
    );
    let admin = off::admin_path(TOPIC);
    let (status, reply) =
        standalone.http_post_json(&format!("{admin}/subscription/keep/resetcursor"), &body);
    assert_eq!(status, 204, "reset cursor: {reply}");
    let keep = subscribe(&client, TOPIC, "keep").await;
    // A few ledgers' worth after the seek point is enough to show it.
    let until = (target + 3 * LEDGER_ENTRIES_MAX as usize).min(messages);
    drain_sized(&keep, target..until, PAYLOAD_BYTES, "keep after the seek").await;
    keep.close().await.unwrap();
    client.close().await;
    t = phase("sought", t);

    // After a restart the record still says where each ledger lives.
    drop(standalone);
    let standalone = start(data_dir.path(), &store, LEDGER_ENTRIES_MAX);
    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();
    let fresh = subscribe(&client, TOPIC, "after-restart").await;
    // A quarter of it by default (it is the same read path), all of it
    // with VELA_TEST_FULL=1.
    let reread = if full() { messages } else { messages / 4 };
    drain_sized(&fresh, 0..reread, PAYLOAD_BYTES, "after the restart").await;
    fresh.close().await.unwrap();
    client.close().await;
    phase("reread after a restart", t);
    phase("whole test", started);
}

/// 48 MiB in 16 KiB messages over 60 ledgers: an offload long enough to be
/// interrupted in the middle.
const SMALL_MESSAGES: usize = 3000;
const SMALL_PAYLOAD_BYTES: usize = 16 << 10;
const SMALL_LEDGER_ENTRIES_MAX: u64 = 50;

/// Starts an offload of `TOPIC` and waits until the bucket holds a
/// ledger's index (one ledger copied, others to go).
async fn offload_until_first_index(
    standalone: &Standalone,
    topic: &str,
    bucket: &Arc<dyn ObjectStore>,
) {
    off::start_offload(standalone, topic);
    let started = Instant::now();
    while !object_names(bucket)
        .await
        .iter()
        .any(|name| name.ends_with("-index"))
    {
        assert!(started.elapsed() < OFFLOAD_TIMEOUT, "no ledger offloaded");
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kill_during_an_s3_offload_loses_nothing_and_the_next_offload_cleans_up() {
    const TOPIC: &str = "persistent://public/default/s3-killed";
    let store = SeaweedFs::start();
    let bucket = bucket(&store);
    let data_dir = tempfile::tempdir().unwrap();
    let standalone = start(data_dir.path(), &store, SMALL_LEDGER_ENTRIES_MAX);
    retain_forever(&standalone);
    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();
    subscribe(&client, TOPIC, "keep")
        .await
        .close()
        .await
        .unwrap();
    produce(&client, TOPIC, 0, SMALL_MESSAGES, SMALL_PAYLOAD_BYTES).await;
    client.close().await;

    offload_until_first_index(&standalone, TOPIC, &bucket).await;
    standalone.kill_9();
    let objects_at_kill = object_names(&bucket).await.len();

    let standalone = start(data_dir.path(), &store, SMALL_LEDGER_ENTRIES_MAX);
    let status = offload_status(&standalone, TOPIC);
    assert_eq!(status["status"], "NOT_RUN", "a new process: {status}");
    assert_every_ledger_somewhere(&standalone, TOPIC);
    let offloaded_at_restart = off::offloaded_ledgers(&standalone, TOPIC);
    eprintln!(
        "killed with {objects_at_kill} objects written, {offloaded_at_restart} ledgers recorded offloaded"
    );
    // Everything is still readable, once, in order, byte for byte.
    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();
    let keep = subscribe(&client, TOPIC, "keep").await;
    drain_sized(
        &keep,
        0..SMALL_MESSAGES,
        SMALL_PAYLOAD_BYTES,
        "after the kill",
    )
    .await;
    assert_drained(&keep, QUIET, "after the kill").await;
    keep.close().await.unwrap();

    // The next offload completes and leaves exactly two objects a ledger:
    // nothing of the attempt that was killed.
    let status = off::offload_and_wait(&standalone, TOPIC);
    assert_eq!(status["status"], "SUCCESS", "{status}");
    let offloaded = off::offloaded_ledgers(&standalone, TOPIC);
    assert!(
        offloaded >= offloaded_at_restart && offloaded >= 55,
        "{offloaded} offloaded"
    );
    let names = object_names(&bucket).await;
    assert_eq!(names.len(), 2 * offloaded, "objects: {names:?}");
    let again = subscribe(&client, TOPIC, "again").await;
    drain_sized(
        &again,
        0..SMALL_MESSAGES,
        SMALL_PAYLOAD_BYTES,
        "after the offload",
    )
    .await;
    assert_drained(&again, QUIET, "after the offload").await;
    again.close().await.unwrap();
    client.close().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_store_stopped_during_an_offload_is_an_error_then_the_offload_completes() {
    const TOPIC: &str = "persistent://public/default/s3-outage";
    let mut store = SeaweedFs::start();
    let bucket = bucket(&store);
    let data_dir = tempfile::tempdir().unwrap();
    let standalone = start(data_dir.path(), &store, SMALL_LEDGER_ENTRIES_MAX);
    retain_forever(&standalone);
    let client = Client::new(&standalone.pulsar_url, ClientConfig::default()).unwrap();
    subscribe(&client, TOPIC, "keep")
        .await
        .close()
        .await
        .unwrap();
    produce(&client, TOPIC, 0, SMALL_MESSAGES, SMALL_PAYLOAD_BYTES).await;

    offload_until_first_index(&standalone, TOPIC, &bucket).await;
    store.stop();
    let stopped = Instant::now();
    // The status says what is wrong while the store is away.
    let error = loop {
        let status = offload_status(&standalone, TOPIC);
        if status["status"] == "ERROR" {
            break status;
        }
        assert!(
            stopped.elapsed() < OFFLOAD_TIMEOUT,
            "no error in the status with the store stopped: {status}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let last_error = error["lastError"].as_str().unwrap();
    assert!(
        last_error.contains("object store") && last_error.contains("s3"),
        "{error}"
    );
    eprintln!("status with the store stopped: {error}");
    assert_every_ledger_somewhere(&standalone, TOPIC);
    // Some seconds of outage, then the store comes back.
    tokio::time::sleep(Duration::from_secs(3)).await;
    store.resume();
    let resumed = Instant::now();
    let status = loop {
        let status = wait_offload(&standalone, TOPIC);
        if status["status"] == "SUCCESS" {
            break status;
        }
        assert!(
            resumed.elapsed() < OFFLOAD_TIMEOUT,
            "the offload did not complete with the store back: {status}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    eprintln!(
        "offload completed {:.1} s after the store came back: {status}",
        resumed.elapsed().as_secs_f64()
    );
    assert_eq!(status["lastError"], "");
    let offloaded = off::offloaded_ledgers(&standalone, TOPIC);
    assert!(offloaded >= 55, "{offloaded} offloaded");
    assert_every_ledger_somewhere(&standalone, TOPIC);
    let names = object_names(&bucket).await;
    assert_eq!(names.len(), 2 * offloaded, "objects: {names:?}");
    // Nothing lost.
    let keep = subscribe(&client, TOPIC, "keep").await;
    drain_sized(
        &keep,
        0..SMALL_MESSAGES,
        SMALL_PAYLOAD_BYTES,
        "after the outage",
    )
    .await;
    assert_drained(&keep, QUIET, "after the outage").await;
    keep.close().await.unwrap();
    client.close().await;
}
