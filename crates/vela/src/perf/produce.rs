//! `vela perf produce`: pulsar-perf's producer load with the native client.
//!
//! Each producer runs a send loop (paced to its share of `--rate`, at most
//! `--max-outstanding` messages unacknowledged) and a receipt loop that
//! awaits receipts in send order and records each latency: from the moment
//! the message is handed to the client (after the outstanding budget let it
//! through) to its receipt, i.e. the durable publish latency. With a rate,
//! the producers' schedules are staggered (`send_due`): together they send
//! evenly, one message every 1 / `--rate`, as pulsar-perf's one rate limiter
//! over all its producers does; not every producer at the same instant.
//! Never: counts a message as done before its receipt; lets the receipt
//! queue grow past the outstanding bound.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use tokio::sync::{Semaphore, mpsc, watch};
use vela_client::{
    BatchingOptions, Client, ClientConfig, OutgoingMessage, ProducerOptions, SendFuture,
};

use super::stats::{Recorder, report_progress};
use super::{CompressionArg, Output, parse_bytes, stamp_payload, topic_names};

/// `--max-outstanding 0` means this many (no practical limit).
const OUTSTANDING_UNLIMITED: usize = 1_000_000;

/// Flags of `vela perf produce` (names as pulsar-perf's).
#[derive(Debug, Args)]
pub(crate) struct ProduceArgs {
    /// Topic(s) to produce to.
    #[arg(required = true, value_name = "TOPIC")]
    topics: Vec<String>,
    /// Broker service URL.
    #[arg(
        short = 'u',
        long = "service-url",
        default_value = "pulsar://127.0.0.1:6650"
    )]
    service_url: String,
    /// Admin HTTP URL (used by --partitions).
    #[arg(long = "admin-url", default_value = "http://127.0.0.1:8080")]
    admin_url: String,
    /// Messages per second in total (0: as fast as possible).
    #[arg(short = 'r', long, default_value_t = 100)]
    rate: u64,
    /// Message size in bytes.
    #[arg(short = 's', long, default_value_t = 1024)]
    size: usize,
    /// Messages sent but not yet acknowledged, per producer (0: no limit).
    /// With 1 and --disable-batching each send waits for the previous one.
    #[arg(short = 'o', long = "max-outstanding", default_value_t = 1000)]
    max_outstanding: usize,
    /// Messages per batch at most.
    #[arg(long = "batch-max-messages", default_value_t = 1000)]
    batch_max_messages: usize,
    /// Bytes per batch at most.
    #[arg(long = "batch-max-bytes", default_value_t = 4 * 1024 * 1024)]
    batch_max_bytes: usize,
    /// Longest a message waits for its batch, in ms (fractions allowed).
    #[arg(
        long = "batch-max-publish-delay",
        visible_alias = "batch-time-window",
        default_value_t = 1.0
    )]
    batch_max_publish_delay_ms: f64,
    /// Send every message as its own entry.
    #[arg(long = "disable-batching")]
    disable_batching: bool,
    /// Compression of each entry.
    #[arg(
        short = 'z',
        long,
        value_enum,
        ignore_case = true,
        default_value = "none"
    )]
    compression: CompressionArg,
    /// Seconds to run (0: until --num-messages, or forever).
    #[arg(long = "test-duration", visible_alias = "time", default_value_t = 0)]
    test_duration: u64,
    /// Pace by spinning instead of sleeping (steadier at high rates, burns a core).
    #[arg(long = "busy-wait")]
    busy_wait: bool,
    /// Producers per topic.
    #[arg(short = 'n', long = "num-producers", default_value_t = 1)]
    num_producers: usize,
    /// Topics: with more than one, `-I` is appended to each name given.
    #[arg(
        short = 't',
        long = "num-topic",
        visible_alias = "num-topics",
        default_value_t = 1
    )]
    num_topics: usize,
    /// Create each topic as a partitioned topic with this many partitions
    /// (through the admin API) before producing; 0: do not create.
    #[arg(long, default_value_t = 0)]
    partitions: u32,
    /// Clients (each its own connection to a broker) the producers are
    /// spread over, round robin: a broker caps producers per connection
    /// (Vela: 10,000 by default).
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    connections: u32,
    /// Create the producers, send nothing, hold them for --test-duration
    /// seconds (0: until interrupted), then close them: the load of many
    /// idle producers (bench scenario topics-100k-idle).
    #[arg(long)]
    idle: bool,
    /// Distinct message keys, cycled over each producer's messages
    /// (`key-N`); on a partitioned topic the key picks the partition.
    /// 0: no key.
    #[arg(long, default_value_t = 0)]
    keys: u64,
    /// Client memory limit for pending messages (e.g. 64M, 1G; 0: none).
    #[arg(long = "memory-limit", value_parser = parse_bytes, default_value = "0")]
    memory_limit: u64,
    /// Messages to send in total (0: no limit).
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

struct InFlight {
    handed_at: Instant,
    receipt: SendFuture,
    bytes: usize,
    _slot: tokio::sync::OwnedSemaphorePermit,
}

pub(crate) async fn run(args: ProduceArgs) -> anyhow::Result<()> {
    let topics = topic_names(&args.topics, args.num_topics);
    if args.partitions > 0 {
        for topic in &topics {
            super::create_partitioned_topic(&args.admin_url, topic, args.partitions).await?;
        }
    }
    let config = ClientConfig {
        memory_limit_bytes: (args.memory_limit > 0).then_some(args.memory_limit as usize),
        ..ClientConfig::default()
    };
    let clients = (0..args.connections)
        .map(|_| Client::new(&args.service_url, config.clone()))
        .collect::<Result<Vec<_>, _>>()
        .context("bad --service-url")?;
    let outstanding = if args.max_outstanding == 0 {
        OUTSTANDING_UNLIMITED
    } else {
        args.max_outstanding
    };
    let options = ProducerOptions {
        batching: (!args.disable_batching).then(|| BatchingOptions {
            max_messages: args.batch_max_messages.max(1),
            max_bytes: args.batch_max_bytes.max(1),
            max_delay: Duration::from_secs_f64(args.batch_max_publish_delay_ms.max(0.0) / 1000.0),
        }),
        compression: args.compression.into(),
        // The outstanding budget below is the bound; the producer's own
        // queue never makes a send wait on top of it.
        max_pending_messages: outstanding,
        block_if_queue_full: true,
        send_timeout: Some(Duration::from_secs(30)),
        name: None,
    };
    let per_topic = args.num_producers.max(1);
    let creating = Instant::now();
    let producers = super::create_all(topics.len() * per_topic, |index| {
        let (client, topic, options) = (
            clients[index % clients.len()].clone(),
            topics[index / per_topic].clone(),
            options.clone(),
        );
        async move {
            let producer = client
                .create_producer(&topic, options)
                .await
                .with_context(|| format!("cannot create a producer on {topic}"))?;
            Ok(Arc::new(producer))
        }
    })
    .await?;
    eprintln!(
        "produce: created {} producer(s) in {:.1} s",
        producers.len(),
        creating.elapsed().as_secs_f64()
    );
    if args.idle {
        eprintln!("produce: holding them idle");
        let hold = Duration::from_secs(if args.test_duration == 0 {
            u64::from(u32::MAX)
        } else {
            args.test_duration
        });
        tokio::select! {
            _ = tokio::time::sleep(hold) => {}
            _ = tokio::signal::ctrl_c() => {}
        }
        for producer in &producers {
            let _ = producer.close().await;
        }
        for client in &clients {
            client.close().await;
        }
        return Ok(());
    }
    eprintln!(
        "produce: {} producer(s) on {} topic(s), {} B messages, rate {}, max outstanding {}, batching {}",
        producers.len(),
        topics.len(),
        args.size,
        if args.rate == 0 {
            "unlimited".to_string()
        } else {
            format!("{} msg/s", args.rate)
        },
        outstanding,
        if args.disable_batching { "off" } else { "on" }
    );

    let recorder = Recorder::new();
    let (stop_tx, stop) = watch::channel(false);
    let started = Instant::now();
    let progress = tokio::spawn(report_progress(
        recorder.clone(),
        "produce",
        Duration::from_secs(args.stats_interval_seconds.max(1)),
        started,
        stop.clone(),
    ));
    let per_producer_rate = args.rate as f64 / producers.len() as f64;
    let per_producer_messages = if args.num_messages == 0 {
        u64::MAX
    } else {
        args.num_messages.div_ceil(producers.len() as u64)
    };
    let mut workers = tokio::task::JoinSet::new();
    // One start for every schedule: each producer's phase within its
    // interval is its place among the producers (`send_due`).
    let schedule_start = tokio::time::Instant::now();
    for (index, producer) in producers.iter().enumerate() {
        let (queue, receipts) = mpsc::channel::<InFlight>(outstanding.min(65_536));
        let recorder_for_receipts = recorder.clone();
        workers.spawn(async move {
            record_receipts(receipts, recorder_for_receipts).await;
        });
        let send = SendLoop {
            producer: Arc::clone(producer),
            slots: Arc::new(Semaphore::new(outstanding)),
            queue,
            recorder: recorder.clone(),
            rate: per_producer_rate,
            schedule_start,
            phase: index as f64 / producers.len() as f64,
            busy_wait: args.busy_wait,
            size: args.size,
            messages_max: per_producer_messages,
            keys: args.keys,
            stop: stop.clone(),
        };
        workers.spawn(send.run());
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
    for producer in &producers {
        let _ = producer.close().await;
    }
    for client in &clients {
        client.close().await;
    }
    let summary = recorder.summary("produce", summary_from.elapsed());
    args.output
        .emit(&summary, &format!("produce {} B", args.size))?;
    Ok(())
}

struct SendLoop {
    producer: Arc<vela_client::Producer>,
    slots: Arc<Semaphore>,
    queue: mpsc::Sender<InFlight>,
    recorder: Arc<Recorder>,
    rate: f64,
    /// When every producer's schedule starts.
    schedule_start: tokio::time::Instant,
    /// This producer's offset within its interval, in intervals (0..1).
    phase: f64,
    busy_wait: bool,
    size: usize,
    messages_max: u64,
    keys: u64,
    stop: watch::Receiver<bool>,
}

impl SendLoop {
    async fn run(self) {
        let mut sent = 0u64;
        while sent < self.messages_max && !*self.stop.borrow() {
            if self.rate > 0.0 {
                let due = self.schedule_start + send_due(sent, self.phase, self.rate);
                if self.busy_wait {
                    while tokio::time::Instant::now() < due {
                        tokio::task::yield_now().await;
                    }
                } else {
                    tokio::time::sleep_until(due).await;
                }
            }
            let Ok(slot) = self.slots.clone().acquire_owned().await else {
                return;
            };
            let payload = stamp_payload(self.size);
            let handed_at = Instant::now();
            let mut message = OutgoingMessage::new(payload);
            if self.keys > 0 {
                message = message.with_key(format!("key-{}", sent % self.keys));
            }
            match self.producer.send(message).await {
                Ok(receipt) => {
                    let in_flight = InFlight {
                        handed_at,
                        receipt,
                        bytes: self.size,
                        _slot: slot,
                    };
                    if self.queue.send(in_flight).await.is_err() {
                        return;
                    }
                }
                Err(error) => {
                    tracing::debug!(%error, "send failed");
                    self.recorder.failure();
                }
            }
            sent += 1;
        }
    }
}

/// When a producer's `sent`-th message (from 0) is due, after the common
/// start: at `(sent + phase) / rate` s. With producer i of N at phase i / N
/// the N schedules interleave into one even schedule at N x rate (all at
/// phase 0, every producer would send at the same instant: at 10,000 topics
/// 10,000 messages at once every 1 / rate, a burst a broker answers in tens
/// of ms, timed as publish latency).
fn send_due(sent: u64, phase: f64, rate_per_s: f64) -> Duration {
    Duration::from_secs_f64((sent as f64 + phase) / rate_per_s)
}

/// Awaits receipts in send order (they complete in that order).
async fn record_receipts(mut receipts: mpsc::Receiver<InFlight>, recorder: Arc<Recorder>) {
    while let Some(in_flight) = receipts.recv().await {
        match in_flight.receipt.await {
            Ok(_) => recorder.record(in_flight.handed_at.elapsed(), in_flight.bytes),
            Err(error) => {
                tracing::debug!(%error, "send failed");
                recorder.failure();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::send_due;
    use std::time::Duration;

    #[test]
    fn staggered_producers_send_evenly_together() {
        // 4 producers at 2 msg/s each: together one message every 125 ms.
        let producers = 4;
        let mut dues: Vec<Duration> = (0..producers)
            .flat_map(|index| {
                let phase = index as f64 / producers as f64;
                (0..3).map(move |sent| send_due(sent, phase, 2.0))
            })
            .collect();
        dues.sort();
        for (k, due) in dues.iter().enumerate() {
            let expected = Duration::from_millis(125 * k as u64);
            let off = due.abs_diff(expected);
            assert!(off < Duration::from_micros(1), "send {k} due at {due:?}");
        }
    }

    #[test]
    fn one_producer_keeps_its_schedule() {
        assert_eq!(send_due(0, 0.0, 100.0), Duration::ZERO);
        assert_eq!(send_due(3, 0.0, 100.0), Duration::from_millis(30));
    }
}
