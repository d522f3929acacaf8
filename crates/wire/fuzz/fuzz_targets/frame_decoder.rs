//! Feeds arbitrary bytes, cut into arbitrary chunks, to the stream decoder.
//! Oracles: no panic; every decoded frame's parts are readable; a decoded
//! command re-encodes to a frame that decodes to the same command; a decoded
//! payload section's stored entry parses back to the same metadata and payload.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use vela_wire::proto::CompressionType;
use vela_wire::{FrameDecoder, PayloadSection, encode_command};

/// Small frame limit so that the fuzzer reaches "too large" quickly.
const MAX_FRAME_BYTES: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    // First byte: chunk-size seed; the rest: the stream.
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let chunk_bytes = usize::from(seed % 64) + 1;
    let mut decoder = FrameDecoder::new(MAX_FRAME_BYTES);
    let mut buf = BytesMut::new();
    for chunk in stream.chunks(chunk_bytes) {
        buf.extend_from_slice(chunk);
        loop {
            match decoder.decode(&mut buf) {
                Ok(Some(frame)) => check_frame(frame),
                Ok(None) => break,
                Err(error) if error.is_stream_fatal() => return,
                Err(_) => {}
            }
        }
    }
});

fn check_frame(frame: vela_wire::Frame) {
    assert!(frame.command_type().is_some());
    match &frame.payload {
        None => {
            let mut encoded = BytesMut::new();
            encode_command(&frame.command, &mut encoded);
            let again = FrameDecoder::new(MAX_FRAME_BYTES * 4)
                .decode(&mut encoded)
                .expect("a re-encoded command decodes")
                .expect("a re-encoded command is complete");
            assert_eq!(again.command, frame.command);
        }
        Some(section) => {
            let entry = section.stored_entry();
            let reparsed = PayloadSection::parse(entry).expect("a stored entry parses");
            assert_eq!(reparsed.metadata_slice(), section.metadata_slice());
            assert_eq!(reparsed.payload_slice(), section.payload_slice());
            assert_eq!(reparsed.summary(), section.summary());
            let _ = section.producer_name();
            let _ = section.partition_key();
            if let Ok(metadata) = section.metadata() {
                let codec = CompressionType::try_from(metadata.compression.unwrap_or(0))
                    .unwrap_or(CompressionType::None);
                let size = metadata.uncompressed_size.unwrap_or(0) as usize;
                if let Ok(raw) = vela_wire::compression::decompress(
                    codec,
                    section.payload_slice(),
                    size,
                    MAX_FRAME_BYTES,
                ) {
                    if let Some(count) = metadata.num_messages_in_batch {
                        let _ = vela_wire::batch::parse_batch(&raw, count);
                    }
                }
            }
        }
    }
}
