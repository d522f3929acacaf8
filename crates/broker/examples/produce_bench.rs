//! Produce/consume throughput through the broker on in-memory ledgers, with
//! appending straight to a `ManagedLog` (no network, no protocol) measured in
//! the same run as the baseline. Prints figures and ratios; asserts nothing.
//!
//! Usage: `cargo run --release -p vela-broker --example produce_bench -- [MESSAGES] [PAYLOAD_BYTES]`
//! (defaults 40000 and 1024: below the 50000-entry ledger rollover). Runs a few seconds.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vela_broker::{Broker, BrokerConfig};
use vela_wire::proto::{self, BaseCommand, MessageMetadata, command_subscribe::SubType};
use vela_wire::{FrameDecoder, encode_command, encode_payload_frame};

/// SENDs written per batch of socket writes (the client's pipelining depth is
/// bounded by the broker's pending-send limits anyway).
const SEND_CHUNK: usize = 1000;

fn command(cmd: impl Into<BaseCommand>) -> BytesMut {
    let mut buf = BytesMut::new();
    encode_command(&cmd.into(), &mut buf);
    buf
}

async fn read_frames(
    stream: &mut TcpStream,
    buf: &mut BytesMut,
    decoder: &mut FrameDecoder,
    mut on_frame: impl FnMut(&vela_wire::Frame) -> bool,
) {
    loop {
        while let Some(frame) = decoder.decode(buf).unwrap() {
            if !on_frame(&frame) {
                return;
            }
        }
        if stream.read_buf(buf).await.unwrap() == 0 {
            panic!("broker closed the connection");
        }
    }
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut args = std::env::args().skip(1);
    let messages: u64 = args.next().map_or(40_000, |a| a.parse().expect("MESSAGES"));
    let payload_bytes: usize = args
        .next()
        .map_or(1024, |a| a.parse().expect("PAYLOAD_BYTES"));
    let payload = vec![7u8; payload_bytes];

    // Baseline: the log alone.
    let log = vela_log::ManagedLog::open(
        &vela_log::LogEnv::in_memory(),
        "public/default/persistent/baseline",
        vela_log::LogConfig::default(),
    )
    .await
    .unwrap();
    let entry = vela_wire::build_stored_entry(
        &prost::Message::encode_to_vec(&MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 0,
            publish_time: 1,
            ..Default::default()
        }),
        &payload,
    );
    let start = Instant::now();
    let mut pending = Vec::with_capacity(SEND_CHUNK);
    for _ in 0..messages {
        pending.push(log.append(entry.clone()));
        if pending.len() == SEND_CHUNK {
            for f in pending.drain(..) {
                f.await.unwrap();
            }
        }
    }
    for f in pending.drain(..) {
        f.await.unwrap();
    }
    let baseline = start.elapsed();

    // Through the broker over loopback TCP.
    let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
    let broker = Broker::start(
        BrokerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0))),
        meta,
        vela_log::LogEnv::in_memory(),
    )
    .await
    .unwrap();
    let mut stream = TcpStream::connect(broker.pulsar_addr()).await.unwrap();
    stream.set_nodelay(true).unwrap();
    let mut buf = BytesMut::new();
    let mut decoder = FrameDecoder::new(64 << 20);
    stream
        .write_all(&command(proto::CommandConnect {
            client_version: "bench".into(),
            protocol_version: Some(21),
            ..Default::default()
        }))
        .await
        .unwrap();
    read_frames(&mut stream, &mut buf, &mut decoder, |_| false).await;
    // Subscribe first: without a subscription (and with no retention) the
    // log trims consumed ledgers, as Pulsar does.
    stream
        .write_all(&command(proto::CommandSubscribe {
            topic: "bench".into(),
            subscription: "s".into(),
            sub_type: SubType::Exclusive as i32,
            consumer_id: 1,
            request_id: 2,
            initial_position: Some(proto::command_subscribe::InitialPosition::Earliest as i32),
            ..Default::default()
        }))
        .await
        .unwrap();
    read_frames(&mut stream, &mut buf, &mut decoder, |_| false).await;
    stream
        .write_all(&command(proto::CommandProducer {
            topic: "bench".into(),
            producer_id: 1,
            request_id: 1,
            ..Default::default()
        }))
        .await
        .unwrap();
    read_frames(&mut stream, &mut buf, &mut decoder, |_| false).await;

    let (mut reader, mut writer) = stream.into_split();
    let payload = Bytes::from(payload);
    let start = Instant::now();
    let write_task = tokio::spawn(async move {
        let mut out = BytesMut::new();
        for seq in 0..messages {
            let send = BaseCommand::from(proto::CommandSend {
                producer_id: 1,
                sequence_id: seq,
                ..Default::default()
            });
            let metadata = MessageMetadata {
                producer_name: "standalone-0-0".into(),
                sequence_id: seq,
                publish_time: 1,
                ..Default::default()
            };
            encode_payload_frame(&send, &metadata, &payload, &mut out);
            if (seq + 1) % SEND_CHUNK as u64 == 0 {
                writer.write_all(&out).await.unwrap();
                out.clear();
            }
        }
        writer.write_all(&out).await.unwrap();
        writer
    });
    let mut receipts = 0u64;
    loop {
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            if let Some(receipt) = frame
                .command
                .as_other()
                .and_then(|c| c.send_receipt.as_ref())
            {
                assert_eq!(receipt.sequence_id, receipts, "receipts out of order");
                receipts += 1;
            }
        }
        if receipts == messages {
            break;
        }
        reader.read_buf(&mut buf).await.unwrap();
    }
    let produce = start.elapsed();
    let writer = write_task.await.unwrap();

    // Consume everything back.
    let mut stream = reader.reunite(writer).unwrap();
    let start = Instant::now();
    stream
        .write_all(&command(proto::CommandFlow {
            consumer_id: 1,
            message_permits: u32::try_from(messages).unwrap_or(u32::MAX),
        }))
        .await
        .unwrap();
    // Ack cumulatively every ACK_EVERY messages, as clients do (the broker
    // pauses a subscription with UNACKED_ENTRIES_MAX entries outstanding).
    const ACK_EVERY: u64 = 1000;
    let mut received = 0u64;
    let mut acked = 0u64;
    while received < messages {
        let mut last_id = None;
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            if let Some(message) = frame.command.as_other().and_then(|c| c.message.as_ref()) {
                received += 1;
                last_id = Some(message.message_id.clone());
            }
        }
        if let Some(id) = last_id
            && (received - acked >= ACK_EVERY || received == messages)
        {
            acked = received;
            stream
                .write_all(&command(proto::CommandAck {
                    consumer_id: 1,
                    ack_type: proto::command_ack::AckType::Cumulative as i32,
                    message_id: vec![id],
                    ..Default::default()
                }))
                .await
                .unwrap();
        }
        if received < messages && stream.read_buf(&mut buf).await.unwrap() == 0 {
            panic!("broker closed the connection");
        }
    }
    let consume = start.elapsed();
    broker.shutdown().await.unwrap();

    let rate = |d: Duration| messages as f64 / d.as_secs_f64();
    println!("messages={messages} payload_bytes={payload_bytes} (in-memory ledgers)");
    println!("log.append alone:        {:>10.0} msg/s", rate(baseline));
    println!(
        "broker produce (TCP):    {:>10.0} msg/s  {:>7.1} MiB/s  ratio to log alone {:.2}",
        rate(produce),
        rate(produce) * payload_bytes as f64 / (1024.0 * 1024.0),
        rate(produce) / rate(baseline)
    );
    println!(
        "broker consume (TCP):    {:>10.0} msg/s  {:>7.1} MiB/s",
        rate(consume),
        rate(consume) * payload_bytes as f64 / (1024.0 * 1024.0)
    );
}
