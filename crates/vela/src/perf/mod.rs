//! `vela perf`: load generators with pulsar-perf's flags and HDR latency
//! percentiles: `produce`, `consume`, and `disk` (the raw fdatasync floor).
//!
//! Owns: the command line, the run's life cycle (duration, warm-up, Ctrl-C,
//! waiting for in-flight work), the payload stamp that carries the send time
//! to consumers, and the output (progress lines on stderr; the summary as
//! text or `--json` on stdout; `--plot FILE.svg`).
//! Never: asserts anything about the figures (benchmarks print, people judge).

mod consume;
pub(crate) mod disk;
mod plot;
mod produce;
pub(crate) mod stats;

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::Context;
use bytes::{BufMut, Bytes, BytesMut};
use clap::{Args, Subcommand, ValueEnum};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::watch;
use vela_client::{CompressionType, Message};

use stats::{Recorder, Summary};

/// Flags of `vela perf`.
#[derive(Debug, Args)]
pub(crate) struct PerfArgs {
    #[command(subcommand)]
    command: PerfCommand,
}

#[derive(Debug, Subcommand)]
enum PerfCommand {
    /// Produce messages and report publish latency and throughput.
    Produce(produce::ProduceArgs),
    /// Consume messages and report end-to-end latency and throughput.
    Consume(consume::ConsumeArgs),
    /// Measure the disk's own write + fdatasync latency in a directory.
    Disk(disk::DiskArgs),
}

pub(crate) fn run(args: PerfArgs) -> anyhow::Result<()> {
    if let PerfCommand::Disk(disk) = args.command {
        return disk::run(disk);
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .thread_name("vela-perf")
        .build()
        .context("cannot start the tokio runtime")?;
    runtime.block_on(async move {
        match args.command {
            PerfCommand::Produce(produce) => produce::run(produce).await,
            PerfCommand::Consume(consume) => consume::run(consume).await,
            PerfCommand::Disk(_) => unreachable!("handled above"),
        }
    })
}

/// `--compression` values.
#[derive(Debug, Clone, Copy, ValueEnum)]
enum CompressionArg {
    None,
    Lz4,
    Zlib,
    Zstd,
    Snappy,
}

impl From<CompressionArg> for CompressionType {
    fn from(arg: CompressionArg) -> CompressionType {
        match arg {
            CompressionArg::None => CompressionType::None,
            CompressionArg::Lz4 => CompressionType::Lz4,
            CompressionArg::Zlib => CompressionType::Zlib,
            CompressionArg::Zstd => CompressionType::Zstd,
            CompressionArg::Snappy => CompressionType::Snappy,
        }
    }
}

/// Output flags shared by the commands.
#[derive(Debug, Args)]
struct Output {
    /// Print the final summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
    /// Draw the latency percentile curve into this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
}

impl Output {
    fn emit(&self, summary: &Summary, title: &str) -> anyhow::Result<()> {
        if self.json {
            println!("{}", serde_json::to_string(summary)?);
        } else {
            println!("{}", summary.text());
        }
        if let Some(path) = &self.plot {
            let series = vec![(title.to_string(), summary.latency_curve_ms.clone())];
            plot::write_svg(
                path,
                &format!("vela perf {}: {title}", summary.kind),
                &series,
            )
            .with_context(|| format!("cannot write --plot {}", path.display()))?;
        }
        Ok(())
    }
}

/// `64M`, `1G`, `512K`, `1000` → bytes.
fn parse_bytes(text: &str) -> Result<u64, String> {
    let text = text.trim();
    let (number, unit) = match text.char_indices().find(|(_, c)| c.is_ascii_alphabetic()) {
        Some((at, _)) => text.split_at(at),
        None => (text, ""),
    };
    let number: u64 = number
        .trim()
        .parse()
        .map_err(|_| format!("expected a size like 64M, got {text:?}"))?;
    let factor: u64 = match unit.to_ascii_uppercase().as_str() {
        "" | "B" => 1,
        "K" | "KB" | "KIB" => 1 << 10,
        "M" | "MB" | "MIB" => 1 << 20,
        "G" | "GB" | "GIB" => 1 << 30,
        _ => return Err(format!("unknown unit in {text:?} (use K, M or G)")),
    };
    number
        .checked_mul(factor)
        .ok_or_else(|| format!("{text:?} is too large"))
}

/// The topics of a run: the names given, or with `count > 1`, `NAME-I` for
/// each (as pulsar-perf's `--num-topic`).
fn topic_names(given: &[String], count: usize) -> Vec<String> {
    if count <= 1 {
        return given.to_vec();
    }
    given
        .iter()
        .flat_map(|topic| (0..count).map(move |i| format!("{topic}-{i}")))
        .collect()
}

/// Producers or consumers being created at once (lookups and PRODUCER or
/// SUBSCRIBE round trips in flight): enough to create 100,000 in tens of
/// seconds, few enough not to flood the broker's connection with commands
/// (as pulsar-perf, which creates them all asynchronously).
const CREATE_IN_FLIGHT_MAX: usize = 256;

/// Runs `make(i)` for every `i` in `0..count`, at most
/// `CREATE_IN_FLIGHT_MAX` at once; the results in index order, or the first
/// error.
async fn create_all<T, F, Fut>(count: usize, make: F) -> anyhow::Result<Vec<T>>
where
    T: Send + 'static,
    F: Fn(usize) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<T>> + Send + 'static,
{
    let mut created: Vec<Option<T>> = (0..count).map(|_| None).collect();
    let mut running = tokio::task::JoinSet::new();
    let mut next = 0;
    while next < count || !running.is_empty() {
        while next < count && running.len() < CREATE_IN_FLIGHT_MAX {
            let future = make(next);
            let index = next;
            running.spawn(async move { (index, future.await) });
            next += 1;
        }
        if let Some(joined) = running.join_next().await {
            let (index, result) = joined.context("a create task failed")?;
            created[index] = Some(result?);
        }
    }
    Ok(created.into_iter().flatten().collect())
}

/// Marks a payload as stamped by `vela perf produce`.
const STAMP_MAGIC: &[u8; 8] = b"VELAPERF";
/// Magic plus the send time (µs since the epoch, big-endian).
const STAMP_BYTES: usize = 16;

fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// A payload of `size` bytes starting with the stamp (when it fits).
fn stamp_payload(size: usize) -> Bytes {
    let mut payload = BytesMut::with_capacity(size);
    if size >= STAMP_BYTES {
        payload.put_slice(STAMP_MAGIC);
        payload.put_u64(now_us());
    }
    payload.resize(size, b'v');
    payload.freeze()
}

/// From the producer's send (stamp) or publish time to now.
fn end_to_end_latency(message: &Message) -> Duration {
    let now = now_us();
    let sent_us = match message.payload.get(..STAMP_BYTES) {
        Some(head) if head.starts_with(STAMP_MAGIC) => {
            let mut time = [0u8; 8];
            time.copy_from_slice(&head[8..STAMP_BYTES]);
            u64::from_be_bytes(time)
        }
        _ => message.publish_time_ms.saturating_mul(1000),
    };
    Duration::from_micros(now.saturating_sub(sent_us))
}

/// Runs until `test_duration_s` (0: until the workers finish) or Ctrl-C,
/// resetting the totals after `warmup_s`; then stops the workers and waits
/// for them. Returns when the summarized period began.
async fn run_for(
    test_duration_s: u64,
    warmup_s: u64,
    recorder: &Arc<Recorder>,
    stop: watch::Sender<bool>,
    workers: &mut tokio::task::JoinSet<()>,
) -> Instant {
    let started = Instant::now();
    let mut summary_from = started;
    let warmup = tokio::time::sleep(Duration::from_secs(warmup_s));
    tokio::pin!(warmup);
    let mut warming = warmup_s > 0;
    let deadline = tokio::time::sleep(if test_duration_s == 0 {
        Duration::from_secs(u64::from(u32::MAX))
    } else {
        Duration::from_secs(test_duration_s)
    });
    tokio::pin!(deadline);
    loop {
        tokio::select! {
            _ = &mut warmup, if warming => {
                warming = false;
                recorder.reset_totals();
                summary_from = Instant::now();
            }
            _ = &mut deadline => break,
            joined = workers.join_next() => if joined.is_none() { break },
            _ = tokio::signal::ctrl_c() => break,
        }
    }
    stop.send_replace(true);
    while workers.join_next().await.is_some() {}
    summary_from
}

/// Creates `topic` with `partitions` partitions through the admin API (a
/// topic that exists already is fine).
async fn create_partitioned_topic(
    admin_url: &str,
    topic: &str,
    partitions: u32,
) -> anyhow::Result<()> {
    let host_port = admin_url
        .strip_prefix("http://")
        .context("--admin-url must be http://host:port")?
        .trim_end_matches('/');
    let path = topic
        .strip_prefix("persistent://")
        .context("--partitions needs persistent://tenant/namespace/topic names")?;
    let body = partitions.to_string();
    let request = format!(
        "PUT /admin/v2/persistent/{path}/partitions HTTP/1.1\r\nHost: {host_port}\r\n\
         Content-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(host_port)
        .await
        .with_context(|| format!("cannot reach the admin API at {admin_url}"))?;
    stream.write_all(request.as_bytes()).await?;
    let mut response = Vec::new();
    stream
        .take(64 * 1024)
        .read_to_end(&mut response)
        .await
        .context("no answer from the admin API")?;
    let response = String::from_utf8_lossy(&response);
    let status = response
        .split_whitespace()
        .nth(1)
        .and_then(|code| code.parse::<u16>().ok())
        .unwrap_or(0);
    match status {
        200..=299 | 409 => Ok(()),
        _ => anyhow::bail!(
            "creating {topic} with {partitions} partitions failed: {}",
            response.lines().next().unwrap_or("no answer")
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_parse() {
        assert_eq!(parse_bytes("64M"), Ok(64 << 20));
        assert_eq!(parse_bytes("1g"), Ok(1 << 30));
        assert_eq!(parse_bytes("512K"), Ok(512 << 10));
        assert_eq!(parse_bytes("100"), Ok(100));
        assert!(parse_bytes("12X").is_err());
        assert!(parse_bytes("M").is_err());
    }

    #[test]
    fn topic_names_follow_num_topic() {
        let given = vec!["t".to_string()];
        assert_eq!(topic_names(&given, 1), vec!["t"]);
        assert_eq!(topic_names(&given, 3), vec!["t-0", "t-1", "t-2"]);
    }

    #[test]
    fn stamped_payloads_carry_the_send_time() {
        let payload = stamp_payload(64);
        assert_eq!(payload.len(), 64);
        assert!(payload.starts_with(STAMP_MAGIC));
        assert_eq!(stamp_payload(8).len(), 8);
    }
}
