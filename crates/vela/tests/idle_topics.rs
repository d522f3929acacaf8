//! Real-process test of the per-topic fixed cost (issue 19): a `vela
//! standalone` serves `Size::topics` topics (1,000; 10,000 under `./test.sh
//! --full`), each with one producer and one subscription with one consumer,
//! each having carried one message end to end (so every on-demand task ran
//! once). Once idle, the broker's runtime holds at most
//! `TASKS_PER_IDLE_TOPIC_MAX` tasks per topic (`vela_runtime_alive_tasks`:
//! the subscription and the open ledger's writer park their state after a
//! quiet second, the producer's receipts and the cursor's persist run only
//! while there is work; `/metrics` reads a parked subscription's statistics
//! without waking it), and its RSS grew by at most
//! `RSS_PER_IDLE_TOPIC_KIB_MAX` per topic (a generous bound: a debug
//! build's futures are larger; `bench/idle_topics.py` gives the release
//! figures). Then every topic carries a second message: parked
//! subscriptions and writers are started by the append and the consumer's
//! ack (a lost wake-up would leave a consumer waiting).
//! No timing assertions: a count and a memory bound, reached within a
//! generous deadline once the work is done.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::Standalone;
use tokio::task::JoinSet;
use vela_client::{
    Client, ClientConfig, Consumer, ConsumerOptions, OutgoingMessage, Producer, ProducerOptions,
};

/// Tasks an idle topic with a producer and a consumer keeps on the
/// broker's runtime: none (measured 0.00 at 3,000 topics; 2.00 before the
/// subscription and the ledger writer parked); the slack is for tasks of
/// the broker that are not a topic's.
const TASKS_PER_IDLE_TOPIC_MAX: f64 = 0.05;
/// Resident memory an idle topic may add (release: see ARCHITECTURE.md,
/// "Memory model"; a debug build is larger).
const RSS_PER_IDLE_TOPIC_KIB_MAX: f64 = 128.0;
/// Topics worked on at once.
const IN_FLIGHT_MAX: usize = 64;
/// How long the broker may take to go idle after the last message (cursor
/// persist intervals, receipts in flight): generous, not a measurement.
const SETTLE_DEADLINE: Duration = Duration::from_secs(60);
const RECEIVE_TIMEOUT: Duration = Duration::from_secs(60);

fn topics_of_this_run() -> usize {
    if std::env::var("VELA_TEST_FULL").is_ok_and(|v| v == "1") {
        10_000
    } else {
        1000
    }
}

fn topic(index: usize) -> String {
    format!("persistent://public/default/idle-{index}")
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

/// Samples until the count of alive tasks stops falling below `bound` or
/// the deadline passes; the last sample.
async fn alive_tasks_once_settled(broker: &Standalone, bound: f64) -> f64 {
    let deadline = tokio::time::Instant::now() + SETTLE_DEADLINE;
    loop {
        let alive = broker.metric("vela_runtime_alive_tasks");
        if alive <= bound || tokio::time::Instant::now() >= deadline {
            return alive;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_idle_topic_keeps_no_task_and_a_few_kib_and_wakes_for_the_next_message() {
    let topics = topics_of_this_run();
    let broker = Standalone::start(&[]);
    let client = Client::new(&broker.pulsar_url, ClientConfig::default()).unwrap();
    // The client's connection is the one the topics use: opened first, so
    // its tasks are in the baseline.
    let warm_up = client
        .create_producer(&topic(topics), ProducerOptions::default())
        .await
        .unwrap();
    warm_up.close().await.unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let tasks_before = broker.metric("vela_runtime_alive_tasks");
    let rss_before_mib = broker.rss_mib();

    let mut held: Vec<(Producer, Arc<Consumer>)> = Vec::with_capacity(topics);
    let mut working = JoinSet::new();
    for index in 0..topics {
        if working.len() >= IN_FLIGHT_MAX {
            held.push(working.join_next().await.unwrap().unwrap());
        }
        let client = client.clone();
        working.spawn(async move {
            let consumer = client
                .subscribe(&topic(index), ConsumerOptions::new("idle"))
                .await
                .unwrap();
            let options = ProducerOptions {
                batching: None,
                ..ProducerOptions::default()
            };
            let producer = client
                .create_producer(&topic(index), options)
                .await
                .unwrap();
            let payload = format!("topic {index}").into_bytes();
            let failure = format!("topic {index}: the message never came");
            round_trip(&producer, &consumer, payload, &failure).await;
            (producer, Arc::new(consumer))
        });
    }
    while let Some(joined) = working.join_next().await {
        held.push(joined.unwrap());
    }
    assert_eq!(held.len(), topics);

    let bound = tasks_before + TASKS_PER_IDLE_TOPIC_MAX * topics as f64;
    let tasks_after = alive_tasks_once_settled(&broker, bound).await;
    let rss_after_mib = broker.rss_mib();
    let tasks_per_topic = (tasks_after - tasks_before) / topics as f64;
    let rss_per_topic_kib =
        (rss_after_mib.saturating_sub(rss_before_mib) * 1024) as f64 / topics as f64;
    eprintln!(
        "{topics} idle topics: runtime tasks {tasks_before} -> {tasks_after} ({tasks_per_topic:.2} a topic), \
         RSS {rss_before_mib} -> {rss_after_mib} MiB ({rss_per_topic_kib:.1} KiB a topic)"
    );
    assert!(
        tasks_per_topic <= TASKS_PER_IDLE_TOPIC_MAX,
        "{tasks_per_topic:.2} tasks per idle topic, past {TASKS_PER_IDLE_TOPIC_MAX}: \
         a per-topic task that should run only while there is work stays parked"
    );
    assert!(
        rss_per_topic_kib <= RSS_PER_IDLE_TOPIC_KIB_MAX,
        "{rss_per_topic_kib:.1} KiB per idle topic, past {RSS_PER_IDLE_TOPIC_KIB_MAX} KiB"
    );

    // Parked subscriptions and ledger writers wake for the next message:
    // each topic carries a second one end to end (a lost wake-up would
    // leave its consumer waiting).
    let mut working = JoinSet::new();
    let mut again = Vec::with_capacity(topics);
    for (index, (producer, consumer)) in held.into_iter().enumerate() {
        if working.len() >= IN_FLIGHT_MAX {
            again.push(working.join_next().await.unwrap().unwrap());
        }
        working.spawn(async move {
            let payload = format!("topic {index}, after parking").into_bytes();
            let failure = format!("topic {index}: a parked subscription never woke");
            round_trip(&producer, &consumer, payload, &failure).await;
            (producer, consumer)
        });
    }
    while let Some(joined) = working.join_next().await {
        again.push(joined.unwrap());
    }
    assert_eq!(again.len(), topics);
    drop(again);
}

/// Sends `payload` (waiting for its receipt), receives it on `consumer`
/// within `RECEIVE_TIMEOUT` (else panics with `failure`), checks it byte
/// for byte and acknowledges it.
async fn round_trip(producer: &Producer, consumer: &Consumer, payload: Vec<u8>, failure: &str) {
    producer
        .send(OutgoingMessage::new(payload.clone()))
        .await
        .unwrap()
        .await
        .unwrap();
    let message = tokio::time::timeout(RECEIVE_TIMEOUT, consumer.receive())
        .await
        .unwrap_or_else(|_| panic!("{failure}"))
        .unwrap();
    assert_eq!(message.payload.as_ref(), payload.as_slice());
    consumer.ack(&message.id).await.unwrap();
}
