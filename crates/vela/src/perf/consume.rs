//! `vela perf consume`: pulsar-perf's consumer load with the native client,
//! reporting end-to-end latency: from when the producer handed the message
//! to its client (a timestamp `vela perf produce` writes into the payload,
//! in µs; the publish time, in ms, for other producers) to its receipt here.
//! Never: acknowledges a message before it was received and counted.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::{Args, ValueEnum};
use tokio::sync::watch;
use vela_client::{Client, ClientConfig, ConsumerOptions, InitialPosition, SubType};

use super::stats::{Recorder, report_progress};
use super::{Output, end_to_end_latency, topic_names};

#[derive(Debug, Clone, Copy, ValueEnum)]
enum SubscriptionTypeArg {
    Exclusive,
    Shared,
    Failover,
    #[value(name = "Key_Shared", alias = "key-shared", alias = "key_shared")]
    KeyShared,
}

#[derive(Debug, Clone, Copy, ValueEnum)]
enum PositionArg {
    Latest,
    Earliest,
}

/// Flags of `vela perf consume` (names as pulsar-perf's).
#[derive(Debug, Args)]
pub(crate) struct ConsumeArgs {
    /// Topic(s) to consume.
    #[arg(required = true, value_name = "TOPIC")]
    topics: Vec<String>,
    /// Broker service URL.
    #[arg(
        short = 'u',
        long = "service-url",
        default_value = "pulsar://127.0.0.1:6650"
    )]
    service_url: String,
    /// Subscription name.
    #[arg(short = 's', long = "subscriber-name", default_value = "sub")]
    subscription: String,
    /// Subscription type.
    #[arg(
        long = "subscription-type",
        value_enum,
        ignore_case = true,
        default_value = "exclusive"
    )]
    subscription_type: SubscriptionTypeArg,
    /// Where a new subscription starts.
    #[arg(
        long = "subscription-position",
        value_enum,
        ignore_case = true,
        default_value = "latest"
    )]
    subscription_position: PositionArg,
    /// Consumers per topic (each its own subscription unless the type is shared).
    #[arg(short = 'n', long = "num-consumers", default_value_t = 1)]
    num_consumers: usize,
    /// Topics: with more than one, `-I` is appended to each name given.
    #[arg(
        short = 't',
        long = "num-topic",
        visible_alias = "num-topics",
        default_value_t = 1
    )]
    num_topics: usize,
    /// Messages the broker may push ahead, per consumer and partition.
    #[arg(short = 'q', long = "receiver-queue-size", default_value_t = 1000)]
    receiver_queue_size: u32,
    /// Seconds to run (0: until --num-messages, or forever).
    #[arg(long = "test-duration", visible_alias = "time", default_value_t = 0)]
    test_duration: u64,
    /// Messages to receive in total (0: no limit).
    #[arg(short = 'm', long = "num-messages", default_value_t = 0)]
    num_messages: u64,
    /// Seconds between progress lines.
    #[arg(short = 'i', long = "stats-interval-seconds", default_value_t = 10)]
    stats_interval_seconds: u64,
    /// Seconds at the start left out of the summary.
    #[arg(long, default_value_t = 0)]
    warmup: u64,
    #[command(flatten)]
    output: Output,
}

pub(crate) async fn run(args: ConsumeArgs) -> anyhow::Result<()> {
    let topics = topic_names(&args.topics, args.num_topics);
    let client =
        Client::new(&args.service_url, ClientConfig::default()).context("bad --service-url")?;
    let sub_type = match args.subscription_type {
        SubscriptionTypeArg::Exclusive => SubType::Exclusive,
        SubscriptionTypeArg::Shared => SubType::Shared,
        SubscriptionTypeArg::Failover => SubType::Failover,
        SubscriptionTypeArg::KeyShared => SubType::KeyShared,
    };
    let shared = matches!(
        sub_type,
        SubType::Shared | SubType::KeyShared | SubType::Failover
    );
    let per_topic = args.num_consumers.max(1);
    let creating = Instant::now();
    let consumers = super::create_all(topics.len() * per_topic, |i| {
        let (client, topic, index) = (client.clone(), topics[i / per_topic].clone(), i % per_topic);
        // Exclusive consumers of one topic need subscriptions of their own.
        let subscription = if shared || index == 0 {
            args.subscription.clone()
        } else {
            format!("{}-{index}", args.subscription)
        };
        let options = ConsumerOptions {
            subscription,
            sub_type,
            initial_position: match args.subscription_position {
                PositionArg::Latest => InitialPosition::Latest,
                PositionArg::Earliest => InitialPosition::Earliest,
            },
            receiver_queue_size: args.receiver_queue_size.max(1),
            name: None,
            replicate_subscription_state: false,
        };
        async move {
            let consumer = client
                .subscribe(&topic, options)
                .await
                .with_context(|| format!("cannot subscribe to {topic}"))?;
            Ok(Arc::new(consumer))
        }
    })
    .await?;
    eprintln!(
        "consume: created {} consumer(s) in {:.1} s",
        consumers.len(),
        creating.elapsed().as_secs_f64()
    );
    eprintln!(
        "consume: {} consumer(s) on {} topic(s), {:?}",
        consumers.len(),
        topics.len(),
        sub_type
    );

    let recorder = Recorder::new();
    let (stop_tx, stop) = watch::channel(false);
    let started = Instant::now();
    let progress = tokio::spawn(report_progress(
        recorder.clone(),
        "consume",
        Duration::from_secs(args.stats_interval_seconds.max(1)),
        started,
        stop.clone(),
    ));
    let messages_max = if args.num_messages == 0 {
        u64::MAX
    } else {
        args.num_messages
    };
    let mut workers = tokio::task::JoinSet::new();
    for consumer in &consumers {
        let (consumer, recorder, stop) = (Arc::clone(consumer), recorder.clone(), stop.clone());
        let mut stop = stop;
        workers.spawn(async move {
            while !*stop.borrow() && recorder.total_messages() < messages_max {
                // Waits for a message or the end of the run (no polling: a
                // run with 100,000 idle consumers costs nothing).
                let message = tokio::select! {
                    received = consumer.receive() => match received {
                        Ok(message) => message,
                        Err(error) => {
                            tracing::warn!(%error, "receive failed");
                            return;
                        }
                    },
                    _ = stop.changed() => continue,
                };
                recorder.record(end_to_end_latency(&message), message.payload.len());
                if let Err(error) = consumer.ack(&message.id).await {
                    tracing::debug!(%error, "ack failed");
                }
            }
        });
    }
    let summary_from = super::run_for(
        args.test_duration,
        args.warmup,
        &recorder,
        stop_tx,
        &mut workers,
    )
    .await;
    let _ = progress.await;
    for consumer in &consumers {
        let _ = consumer.close().await;
    }
    client.close().await;
    let summary = recorder.summary("consume", summary_from.elapsed());
    args.output.emit(&summary, "end-to-end")?;
    Ok(())
}
