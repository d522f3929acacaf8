//! Codec benchmark: `cargo bench -p vela-wire --bench codec`.
//!
//! Prints ns per frame and GB/s for decode+verify and encode of SEND frames
//! (1 KiB payload; a 100-message batch payload), beside a bare CRC32C pass
//! over the same bytes measured in the same run, then a summary: the
//! decode/CRC ratios and `size_of::<Frame>()`. Target: decode+verify of a
//! 1 KiB SEND within 2x the bare CRC pass. Runs in a few seconds.
//!
//! "decode + verify" is what a broker does with each SEND a client sends:
//! `FrameDecoder::decode` over a buffer of back-to-back frames as read from
//! the socket, which splits each frame off, reads the command, verifies the
//! CRC32C of the payload section and checks the MessageMetadata's structure;
//! the frame is then dropped (the buffer refill is untimed).

use std::hint::black_box;
use std::time::{Duration, Instant};

use bytes::{Bytes, BytesMut};
use vela_wire::batch::{BatchMessage, build_batch, parse_batch};
use vela_wire::proto::{
    BaseCommand, CommandMessage, CommandSend, MessageIdData, MessageMetadata, SingleMessageMetadata,
};
use vela_wire::{
    Command, Frame, FrameDecoder, MessageFrameParts, PayloadSection, SendCommand,
    encode_payload_frame,
};

/// The target: decode + verify of a 1 KiB SEND within this many bare CRC passes.
const DECODE_TO_CRC_RATIO_MAX: f64 = 2.0;

/// Bytes of back-to-back frames per timed round: about what a connection's
/// read buffer holds, so the data is cache-resident as it is right after a
/// socket read (the broker decodes what it just read).
const ROUND_BYTES: usize = 256 * 1024;
/// Timed rounds per row; the fastest counts.
const TRIALS: usize = 300;

fn send_command(sequence_id: u64, num_messages: Option<i32>) -> BaseCommand {
    BaseCommand::from(CommandSend {
        producer_id: 1,
        sequence_id,
        num_messages,
        ..Default::default()
    })
}

fn metadata(sequence_id: u64, num_messages_in_batch: Option<i32>) -> MessageMetadata {
    MessageMetadata {
        producer_name: "standalone-0-17".into(),
        sequence_id,
        publish_time: 1_700_000_000_000 + sequence_id,
        num_messages_in_batch,
        uncompressed_size: None,
        ..Default::default()
    }
}

fn batch_payload(messages: usize, message_bytes: usize) -> Bytes {
    let records: Vec<BatchMessage> = (0..messages)
        .map(|index| {
            BatchMessage::new(
                SingleMessageMetadata {
                    sequence_id: Some(index as u64),
                    ..Default::default()
                },
                Bytes::from(vec![b'x'; message_bytes]),
            )
        })
        .collect();
    let mut buf = BytesMut::new();
    build_batch(&records, &mut buf);
    buf.freeze()
}

/// Runs `round` TRIALS times and returns the fastest, in ns per item: the
/// machine is shared, so the minimum is the figure least disturbed by others.
fn measure(items_per_round: usize, mut round: impl FnMut()) -> f64 {
    measure_with_setup(items_per_round, || (), |()| round())
}

/// Like `measure`, with an untimed `setup` before each timed `round`.
/// Whatever `round` returns is dropped after the clock stops (e.g. the
/// buffer, so that freeing it is not timed).
fn measure_with_setup<S, T>(
    items_per_round: usize,
    mut setup: impl FnMut() -> S,
    mut round: impl FnMut(S) -> T,
) -> f64 {
    drop(round(setup())); // warm up
    let mut best = Duration::MAX;
    for _ in 0..TRIALS {
        let state = setup();
        let start = Instant::now();
        let leftover = round(state);
        best = best.min(start.elapsed());
        drop(leftover);
    }
    best.as_nanos() as f64 / items_per_round as f64
}

struct Row {
    name: String,
    frame_bytes: usize,
    ns_per_frame: f64,
}

fn print_rows(rows: &[Row], crc_ns: f64) {
    println!(
        "{:<44} {:>9} {:>12} {:>8} {:>10}",
        "operation", "bytes", "ns/frame", "GB/s", "vs CRC"
    );
    for row in rows {
        println!(
            "{:<44} {:>9} {:>12.1} {:>8.2} {:>9.2}x",
            row.name,
            row.frame_bytes,
            row.ns_per_frame,
            row.frame_bytes as f64 / row.ns_per_frame,
            row.ns_per_frame / crc_ns
        );
    }
    println!();
}

/// Runs the rows for one SEND frame shape; returns (CRC ns, decode ns).
fn bench_send(name: &str, payload: &[u8], num_messages: Option<i32>) -> (f64, f64) {
    let command = send_command(7, num_messages);
    let meta = metadata(7, num_messages);
    let mut one = BytesMut::new();
    encode_payload_frame(&command, &meta, payload, &mut one);
    let frame_bytes = one.len();
    let frames_per_round = (ROUND_BYTES / frame_bytes).max(8);
    let mut stream = BytesMut::with_capacity(frame_bytes * frames_per_round);
    for _ in 0..frames_per_round {
        stream.extend_from_slice(&one);
    }
    let stream = stream.freeze();

    // Baseline: a bare CRC32C over each whole frame.
    let crc_ns = measure(frames_per_round, || {
        for frame in stream.chunks_exact(frame_bytes) {
            black_box(crc32c::crc32c(black_box(frame)));
        }
    });

    // Decode + verify: the stream decoder over a buffer of back-to-back frames.
    // Refilling the buffer (a memcpy) is untimed setup; `keep` holds the
    // allocation so that freeing it happens after the clock stops.
    let refill = || {
        let mut buf = BytesMut::with_capacity(stream.len() + 1);
        buf.extend_from_slice(&stream);
        buf.extend_from_slice(&[0]);
        let keep = buf.split_off(stream.len());
        (buf, keep)
    };
    let mut decoder = FrameDecoder::default();
    let decode_ns = measure_with_setup(frames_per_round, refill, |(mut buf, keep)| {
        while let Ok(Some(frame)) = decoder.decode(&mut buf) {
            black_box(&frame);
        }
        keep
    });

    // The broker's use of it: the SEND command and the stored entry.
    let broker_ns = measure_with_setup(frames_per_round, refill, |(mut buf, keep)| {
        while let Ok(Some(frame)) = decoder.decode(&mut buf) {
            black_box(frame.command.as_send());
            black_box(frame.payload.map(PayloadSection::into_stored_entry));
        }
        keep
    });

    // Decode + verify + full prost decode of MessageMetadata (the lazy path).
    let full_ns = measure_with_setup(frames_per_round, refill, |(mut buf, keep)| {
        while let Ok(Some(frame)) = decoder.decode(&mut buf) {
            if let Some(section) = &frame.payload {
                black_box(section.metadata().is_ok());
            }
        }
        keep
    });

    // Encode into a reused buffer.
    let mut out = BytesMut::with_capacity(frame_bytes * 2);
    let encode_ns = measure(frames_per_round, || {
        for sequence_id in 0..frames_per_round as u64 {
            out.clear();
            encode_payload_frame(
                black_box(&command),
                black_box(&meta),
                black_box(payload),
                &mut out,
            );
            black_box(&out);
            black_box(sequence_id);
        }
    });

    // Dispatch path: MESSAGE header for a stored entry (payload not copied).
    let entry =
        Bytes::copy_from_slice(&one[one.len() - (frame_bytes - 8 - command_len(&command))..]);
    let message = BaseCommand::from(CommandMessage {
        consumer_id: 3,
        message_id: MessageIdData {
            ledger_id: 12,
            entry_id: 345,
            ..Default::default()
        },
        ..Default::default()
    });
    let header_ns = measure(frames_per_round, || {
        for _ in 0..frames_per_round {
            black_box(MessageFrameParts::new(
                black_box(&message),
                None,
                entry.clone(),
            ));
        }
    });

    println!("== SEND, {name}");
    print_rows(
        &[
            Row {
                name: "crc32c over the frame (baseline)".into(),
                frame_bytes,
                ns_per_frame: crc_ns,
            },
            Row {
                name: "decode + verify CRC".into(),
                frame_bytes,
                ns_per_frame: decode_ns,
            },
            Row {
                name: "decode + verify + take SEND and stored entry".into(),
                frame_bytes,
                ns_per_frame: broker_ns,
            },
            Row {
                name: "decode + verify + full MessageMetadata".into(),
                frame_bytes,
                ns_per_frame: full_ns,
            },
            Row {
                name: "encode (command + metadata + CRC)".into(),
                frame_bytes,
                ns_per_frame: encode_ns,
            },
            Row {
                name: "MESSAGE header for a stored entry".into(),
                frame_bytes,
                ns_per_frame: header_ns,
            },
        ],
        crc_ns,
    );
    (crc_ns, decode_ns)
}

fn command_len(command: &BaseCommand) -> usize {
    prost::Message::encoded_len(command)
}

fn main() {
    let one_kib = vec![b'p'; 1024];
    let (one_kib_crc_ns, one_kib_decode_ns) = bench_send("1 KiB payload", &one_kib, None);

    let batch = batch_payload(100, 100);
    let (batch_crc_ns, batch_decode_ns) = bench_send(
        &format!("100-message batch ({} B payload)", batch.len()),
        &batch,
        Some(100),
    );

    let parse_ns = measure(1000, || {
        for _ in 0..1000 {
            black_box(
                parse_batch(black_box(&batch), 100)
                    .map(|messages| messages.len())
                    .unwrap_or(0),
            );
        }
    });
    println!(
        "parse_batch of 100 messages: {:.0} ns per batch, {:.1} ns per message",
        parse_ns,
        parse_ns / 100.0
    );

    println!();

    println!(
        "== Summary: decode + verify vs a bare CRC32C pass (target <= {DECODE_TO_CRC_RATIO_MAX:.2}x for 1 KiB)"
    );
    for (name, crc_ns, decode_ns, judged) in [
        ("1 KiB SEND", one_kib_crc_ns, one_kib_decode_ns, true),
        (
            "100-message batch SEND",
            batch_crc_ns,
            batch_decode_ns,
            false,
        ),
    ] {
        let ratio = decode_ns / crc_ns;
        let verdict = match (judged, ratio <= DECODE_TO_CRC_RATIO_MAX) {
            (false, _) => "",
            (true, true) => "  PASS",
            (true, false) => "  FAIL",
        };
        println!(
            "{name:<24} crc32c {crc_ns:>7.1} ns   decode + verify {decode_ns:>7.1} ns   ratio {ratio:.2}x{verdict}"
        );
    }
    println!(
        "size_of::<Frame>() = {} bytes (Command {}, SendCommand {}, Option<PayloadSection> {})",
        std::mem::size_of::<Frame>(),
        std::mem::size_of::<Command>(),
        std::mem::size_of::<SendCommand>(),
        std::mem::size_of::<Option<PayloadSection>>(),
    );
}
