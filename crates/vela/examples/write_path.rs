//! Where a synchronous publish's time goes, against a running `vela standalone`.
//!
//! One producer sends N messages one at a time (each waits for its
//! SEND_RECEIPT: a sync publish), timing each on the client. Before and after,
//! it reads the broker's write-path breakdown (`/admin/v2/vela/write-path`)
//! and subtracts the two snapshots, so only this load's samples count. It
//! prints each stage's mean and p50, each layer's own share (a stage minus the
//! stage nested in it), the stage sum, and the ratio of the stage sum to the
//! client-measured publish latency (target: within 10 %). It prints; it never
//! asserts (benchmarks print figures, never timing assertions).
//!
//! Usage (bench/write_path.sh starts a standalone and runs this):
//! `cargo run --release -p vela --example write_path -- PULSAR_URL HTTP_URL [MESSAGES] [PAYLOAD_BYTES]`

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use bytes::BytesMut;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vela_metrics::{BUCKETS, Histogram, Snapshot};
use vela_wire::proto::{self, BaseCommand, MessageMetadata, base_command::Type};
use vela_wire::{Frame, FrameDecoder};

const TOPIC: &str = "persistent://public/default/write-path";

struct Conn {
    stream: TcpStream,
    buf: BytesMut,
    decoder: FrameDecoder,
}

impl Conn {
    async fn send(&mut self, command: impl Into<BaseCommand>) {
        let mut buf = BytesMut::new();
        vela_wire::encode_command(&command.into(), &mut buf);
        self.stream.write_all(&buf).await.unwrap();
    }

    async fn recv(&mut self) -> Frame {
        loop {
            if let Some(frame) = self.decoder.decode(&mut self.buf).unwrap() {
                if frame.command_type() == Some(Type::Ping) {
                    self.send(proto::CommandPong {}).await;
                    continue;
                }
                return frame;
            }
            let read = self.stream.read_buf(&mut self.buf).await.unwrap();
            assert!(read > 0, "broker closed the connection");
        }
    }

    /// One sync publish: SEND, then wait for its receipt.
    async fn publish(&mut self, sequence_id: u64, payload: &[u8]) {
        let command = BaseCommand::from(proto::CommandSend {
            producer_id: 1,
            sequence_id,
            ..Default::default()
        });
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_millis() as u64;
        let metadata = MessageMetadata {
            producer_name: "write-path".into(),
            sequence_id,
            publish_time: now_ms,
            ..Default::default()
        };
        let mut buf = BytesMut::new();
        vela_wire::encode_payload_frame(&command, &metadata, payload, &mut buf);
        self.stream.write_all(&buf).await.unwrap();
        let frame = self.recv().await;
        let receipt = frame
            .command
            .into_base_command()
            .send_receipt
            .expect("SEND_RECEIPT");
        assert_eq!(receipt.sequence_id, sequence_id);
    }
}

/// (stage, scope) → snapshot, from the broker's write-path document.
fn write_path(http_url: &str) -> BTreeMap<(String, String), Snapshot> {
    let url = format!("{http_url}/admin/v2/vela/write-path");
    let text = ureq::get(&url)
        .call()
        .unwrap()
        .body_mut()
        .read_to_string()
        .unwrap();
    let doc: Value = serde_json::from_str(&text).unwrap();
    let mut out = BTreeMap::new();
    for row in doc["stages"].as_array().unwrap() {
        let counts: Vec<u64> = row["buckets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_u64().unwrap())
            .collect();
        assert_eq!(counts.len(), BUCKETS, "bucket layout differs");
        let mut snapshot = Snapshot::default();
        snapshot.buckets.copy_from_slice(&counts);
        snapshot.count = row["count"].as_u64().unwrap();
        snapshot.sum = row["sum_us"].as_u64().unwrap();
        let key = (
            row["stage"].as_str().unwrap().to_string(),
            row["scope"].as_str().unwrap().to_string(),
        );
        out.insert(key, snapshot);
    }
    out
}

/// The stage over every instance ("all" when several bookies, else the one).
fn stage(snapshots: &BTreeMap<(String, String), Snapshot>, name: &str) -> Snapshot {
    let rows: Vec<_> = snapshots.iter().filter(|((s, _), _)| s == name).collect();
    if let Some((_, all)) = rows.iter().find(|((_, scope), _)| scope == "all") {
        return **all;
    }
    rows.first().map(|(_, s)| **s).unwrap_or_default()
}

fn main() {
    let args: Vec<String> = std::env::args().collect();
    if args.len() < 3 {
        eprintln!("usage: write_path PULSAR_URL HTTP_URL [MESSAGES] [PAYLOAD_BYTES]");
        std::process::exit(2);
    }
    let pulsar_addr = args[1].trim_start_matches("pulsar://").to_string();
    let http_url = args[2].trim_end_matches('/').to_string();
    let messages: u64 = args.get(3).map_or(2000, |a| a.parse().unwrap());
    let payload = vec![b'x'; args.get(4).map_or(100, |a| a.parse().unwrap())];
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async move {
        let stream = TcpStream::connect(&pulsar_addr).await.unwrap();
        stream.set_nodelay(true).unwrap();
        let mut conn = Conn {
            stream,
            buf: BytesMut::new(),
            decoder: FrameDecoder::new(64 << 20),
        };
        conn.send(proto::CommandConnect {
            client_version: "vela-write-path".into(),
            protocol_version: Some(21),
            ..Default::default()
        })
        .await;
        conn.recv()
            .await
            .command
            .into_base_command()
            .connected
            .expect("CONNECTED");
        conn.send(proto::CommandProducer {
            topic: TOPIC.into(),
            producer_id: 1,
            request_id: 1,
            ..Default::default()
        })
        .await;
        conn.recv()
            .await
            .command
            .into_base_command()
            .producer_success
            .expect("PRODUCER_SUCCESS");

        let warm_up = (messages / 10).max(50);
        for sequence_id in 0..warm_up {
            conn.publish(sequence_id, &payload).await;
        }
        let before = write_path(&http_url);
        let client = Histogram::default();
        let started = Instant::now();
        for sequence_id in warm_up..warm_up + messages {
            let sent = Instant::now();
            conn.publish(sequence_id, &payload).await;
            client.record(sent.elapsed());
        }
        let elapsed = started.elapsed();
        // The bookies' figures are recorded by their threads right after the
        // callbacks: give the last ones a moment.
        tokio::time::sleep(Duration::from_millis(100)).await;
        let after = write_path(&http_url);
        report(&before, &after, &client.snapshot(), messages, elapsed);
    });
}

fn report(
    before: &BTreeMap<(String, String), Snapshot>,
    after: &BTreeMap<(String, String), Snapshot>,
    client: &Snapshot,
    messages: u64,
    elapsed: Duration,
) {
    let delta: BTreeMap<(String, String), Snapshot> = after
        .iter()
        .map(|(key, snapshot)| {
            let earlier = before.get(key).copied().unwrap_or_default();
            (key.clone(), snapshot.since(&earlier))
        })
        .collect();
    println!(
        "sync publish: {messages} messages in {:.2} s ({:.0} msg/s)\n",
        elapsed.as_secs_f64(),
        messages as f64 / elapsed.as_secs_f64()
    );
    println!(
        "{:<20} {:<22} {:>8} {:>12} {:>12}",
        "STAGE", "SCOPE", "COUNT", "MEAN µs", "P50 µs"
    );
    for ((name, scope), s) in &delta {
        if name == "storage_write" {
            continue;
        }
        println!(
            "{name:<20} {scope:<22} {:>8} {:>12.1} {:>12.1}",
            s.count,
            s.mean(),
            s.quantile(0.5)
        );
    }
    println!(
        "{:<20} {:<22} {:>8} {:>12.1} {:>12.1}",
        "client_publish",
        "this program",
        client.count,
        client.mean(),
        client.quantile(0.5)
    );

    let mean = |name: &str| stage(&delta, name).mean();
    let broker = mean("broker_publish");
    let ledger = mean("ledger_add");
    let bookie = mean("bookie_add");
    let queue = mean("journal_queue_wait");
    let write = mean("journal_write");
    let sync = mean("journal_fdatasync");
    let journal = queue + write + sync;
    let layers = [
        ("broker (publish - ledger add)", broker - ledger),
        (
            "ledger client + transport (ledger add - bookie add)",
            ledger - bookie,
        ),
        (
            "bookie outside the journal (bookie add - journal)",
            bookie - journal,
        ),
        ("journal queue wait", queue),
        ("journal write", write),
        ("journal fdatasync", sync),
    ];
    println!("\neach layer's own share of a publish (means, µs):");
    let mut stage_sum = 0.0;
    for (label, value) in layers {
        stage_sum += value;
        println!("  {label:<55} {value:>9.1}");
    }
    let measured = client.mean();
    println!("  {:<55} {stage_sum:>9.1}", "stage sum");
    println!(
        "  {:<55} {measured:>9.1}",
        "measured publish latency (client, mean)"
    );
    println!(
        "  {:<55} {:>9.1}",
        "not in any stage (client library + loopback)",
        measured - stage_sum
    );
    println!(
        "\nstage sum / measured publish latency = {:.3} (target: within 10 %, i.e. 0.90..1.10)",
        stage_sum / measured
    );
    println!(
        "journal stages / bookie add = {:.3}; journal stages / publish = {:.3}",
        journal / bookie,
        journal / measured
    );
    println!(
        "(journal figures are per group / per fdatasync: one group per entry under a sync \
         load; with several bookies the bookie and journal means are over all of them, while \
         a ledger add waits for the slowest of its write quorum)"
    );
}
