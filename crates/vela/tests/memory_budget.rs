//! Real-process test of the broker's memory budget: a `vela standalone` with
//! small budgets serves `Size::topics` topics (1,000; 10,000 under
//! `./test.sh --full`), each filled with several times its
//! share of the entry cache while its one consumer lags (it took one message
//! and reads no more: an active reader, so every entry is cached for it).
//! The process's RSS stays under the configured budgets plus a margin for
//! everything per topic and per process; the cache never holds more than
//! its budget. Then every consumer reads its topic back byte for byte: what
//! was evicted comes from the bookie.
//!
//! Without one broker-wide budget a per-topic cache would hold all
//! `topics * entries_per_topic * PAYLOAD_BYTES` (64 MB; 320 MB in the full
//! run), past the bound.
//! No timing assertions: only memory and content.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Standalone;
use tokio::task::JoinSet;
use vela_client::{
    Client, ClientConfig, Consumer, ConsumerOptions, InitialPosition, OutgoingMessage,
    ProducerOptions,
};

const PAYLOAD_BYTES: usize = 1024;

/// How many topics and entries: CI's size, or the full run's.
#[derive(Debug, Clone, Copy)]
struct Size {
    topics: usize,
    entries_per_topic: usize,
}

impl Size {
    fn of_this_run() -> Size {
        if std::env::var("VELA_TEST_FULL").is_ok_and(|v| v == "1") {
            Size {
                topics: 10_000,
                entries_per_topic: 32,
            }
        } else {
            Size {
                topics: 1000,
                entries_per_topic: 64,
            }
        }
    }
}

/// The budgets given to the standalone, MiB.
const CACHE_MB: u64 = 8;
const PUBLISH_BUFFER_MB: u64 = 16;
const WRITE_CACHE_MB: u64 = 16;
const READ_CACHE_MB: u64 = 4;
/// What a process may cost beyond its budgets (issue 19's target: budgets +
/// 128 MiB at every topic count): code, runtime, metadata and index caches
/// as touched, and each topic's fixed state with its producer and
/// subscription.
const MARGIN_MB: u64 = 128;

/// Topics worked on at once (producers created, consumers read).
const IN_FLIGHT_MAX: usize = 64;
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);

/// A standalone with the small budgets above.
fn start_with_small_budgets() -> Standalone {
    Standalone::start(&[
        "--managed-ledger-cache-size-mb",
        &CACHE_MB.to_string(),
        "--max-message-publish-buffer-mb",
        &PUBLISH_BUFFER_MB.to_string(),
        "--write-cache-mb",
        &WRITE_CACHE_MB.to_string(),
        "--read-cache-mb",
        &READ_CACHE_MB.to_string(),
    ])
}

impl Standalone {
    /// One sample of `/metrics` (a family without labels but `cluster`).
    fn metric(&self, name: &str) -> f64 {
        self.metrics()
            .lines()
            .find(|l| l.starts_with(&format!("{name}{{")))
            .and_then(|l| l.rsplit(' ').next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} not in /metrics"))
    }
}

fn topic(index: usize) -> String {
    format!("persistent://public/default/memory-{index}")
}

/// The payload of entry `entry` of topic `topic`: recognizable bytes.
fn payload(topic: usize, entry: usize) -> Vec<u8> {
    let mut data = format!("topic {topic} entry {entry} ").into_bytes();
    let mut x = (topic as u64) << 32 | entry as u64;
    while data.len() < PAYLOAD_BYTES {
        x = x
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        data.push((x >> 56) as u8);
    }
    data
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn many_topics_stay_within_the_memory_budget_and_read_back_whole() {
    let Size {
        topics,
        entries_per_topic,
    } = Size::of_this_run();
    let broker = start_with_small_budgets();
    let client = Client::new(&broker.pulsar_url, ClientConfig::default()).unwrap();

    // Active readers that lag: each takes one message and reads no more.
    let mut consumers: Vec<Option<Arc<Consumer>>> = (0..topics).map(|_| None).collect();
    let mut subscribing = JoinSet::new();
    for index in 0..topics {
        if subscribing.len() >= IN_FLIGHT_MAX {
            let (i, c) = subscribing.join_next().await.unwrap().unwrap();
            consumers[i] = Some(c);
        }
        let client = client.clone();
        subscribing.spawn(async move {
            let options = ConsumerOptions {
                initial_position: InitialPosition::Earliest,
                receiver_queue_size: 1,
                ..ConsumerOptions::new("lagging")
            };
            let consumer = client.subscribe(&topic(index), options).await.unwrap();
            (index, Arc::new(consumer))
        });
    }
    while let Some(joined) = subscribing.join_next().await {
        let (i, c) = joined.unwrap();
        consumers[i] = Some(c);
    }
    let consumers: Vec<Arc<Consumer>> = consumers.into_iter().map(Option::unwrap).collect();

    // Every topic filled with entries_per_topic entries (no batching: one
    // message, one entry), RSS sampled throughout.
    let mut peak_rss_mib = broker.rss_mib();
    let mut producing = JoinSet::new();
    for index in 0..topics {
        if producing.len() >= IN_FLIGHT_MAX {
            producing.join_next().await.unwrap().unwrap();
            peak_rss_mib = peak_rss_mib.max(broker.rss_mib());
        }
        let client = client.clone();
        producing.spawn(async move {
            let options = ProducerOptions {
                batching: None,
                ..ProducerOptions::default()
            };
            let producer = client
                .create_producer(&topic(index), options)
                .await
                .unwrap();
            let mut receipts = Vec::with_capacity(entries_per_topic);
            for entry in 0..entries_per_topic {
                let message = OutgoingMessage::new(payload(index, entry));
                receipts.push(producer.send(message).await.unwrap());
            }
            for receipt in receipts {
                receipt.await.unwrap();
            }
            producer.close().await.unwrap();
        });
    }
    while let Some(joined) = producing.join_next().await {
        joined.unwrap();
        peak_rss_mib = peak_rss_mib.max(broker.rss_mib());
    }

    let budgets_mib = CACHE_MB + PUBLISH_BUFFER_MB + WRITE_CACHE_MB + READ_CACHE_MB;
    let cache_used = broker.metric("pulsar_ml_cache_used_size");
    let evicted_unread = broker.metric("vela_entry_cache_evicted_unread_total");
    let skipped = broker.metric("vela_entry_cache_insert_skipped_total");
    eprintln!(
        "{topics} topics x {entries_per_topic} entries: peak RSS {peak_rss_mib} MiB (budgets {budgets_mib} MiB + margin {MARGIN_MB} MiB); \
         cache {cache_used} bytes, {evicted_unread} evicted unread, {skipped} not cached"
    );
    assert!(
        cache_used <= (CACHE_MB << 20) as f64,
        "the cache holds {cache_used} bytes, past its {CACHE_MB} MiB"
    );
    assert!(
        evicted_unread + skipped > 0.0,
        "the topics held more than the cache: it must have evicted or skipped"
    );
    assert!(
        peak_rss_mib <= budgets_mib + MARGIN_MB,
        "peak RSS {peak_rss_mib} MiB is past the budgets ({budgets_mib} MiB) + {MARGIN_MB} MiB"
    );

    // Everything reads back in order, byte for byte.
    let mut reading = JoinSet::new();
    for (index, consumer) in consumers.into_iter().enumerate() {
        if reading.len() >= IN_FLIGHT_MAX {
            reading.join_next().await.unwrap().unwrap();
        }
        reading.spawn(async move {
            for entry in 0..entries_per_topic {
                let message = tokio::time::timeout(RECEIVE_TIMEOUT, consumer.receive())
                    .await
                    .unwrap_or_else(|_| panic!("topic {index}: entry {entry} never came"))
                    .unwrap();
                assert!(
                    message.payload.as_ref() == payload(index, entry).as_slice(),
                    "topic {index}: entry {entry} differs"
                );
                consumer.ack(&message.id).await.unwrap();
            }
            consumer.close().await.unwrap();
        });
    }
    while let Some(joined) = reading.join_next().await {
        joined.unwrap();
    }
    let misses = broker.metric("vela_entry_cache_misses_total");
    assert!(misses > 0.0, "evicted entries were read from the bookie");
    client.close().await;
}
