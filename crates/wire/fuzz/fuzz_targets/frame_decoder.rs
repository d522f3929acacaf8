//! Feeds arbitrary bytes, cut into arbitrary chunks, to the stream decoder.
//! Oracles: no panic; every frame decodes to what a reference built from
//! prost and `PayloadSection::parse` gives (the same command and section,
//! or the same error), so the SEND fast path (hand-written scanner, section
//! read into scalars) is checked against prost on every input; every decoded
//! frame's parts are readable; a decoded command re-encodes to a frame that
//! decodes to the same command; a decoded payload section's stored entry
//! parses back to the same metadata and payload.
//!
//! Input: a seed byte (chunk size, and whether to fix checksums up), then
//! the stream. With fixing on, every 0x0e01 checksum in the stream is
//! rewritten to the CRC32C of the bytes it covers, so that mutated SEND
//! frames get past the checksum and into the metadata and payload checks.
#![no_main]

#[path = "../../tests/support/reference.rs"]
mod reference;

use std::mem::discriminant;

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use reference::{reference_decode, section_view};
use vela_wire::proto::CompressionType;
use vela_wire::{Frame, FrameDecoder, PayloadSection, WireError, encode_command};

/// Small frame limit so that the fuzzer reaches "too large" quickly.
const MAX_FRAME_BYTES: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let chunk_bytes = usize::from(seed % 64) + 1;
    let mut stream = stream.to_vec();
    if seed & 0x80 != 0 {
        fix_checksums(&mut stream);
    }
    let mut decoder = FrameDecoder::new(MAX_FRAME_BYTES);
    let mut buf = BytesMut::new();
    for chunk in stream.chunks(chunk_bytes) {
        buf.extend_from_slice(chunk);
        loop {
            let whole_frame = complete_frame(&buf).map(<[u8]>::to_vec);
            let result = decoder.decode(&mut buf);
            if let Some(frame_bytes) = &whole_frame {
                check_against_reference(&result, frame_bytes);
            }
            match result {
                Ok(Some(frame)) => check_frame(frame),
                Ok(None) => break,
                Err(error) if error.is_stream_fatal() => return,
                Err(_) => {}
            }
        }
    }
});

/// The frame at the front of `buf` when it is complete and within the
/// limit (so the decoder will decode it, not wait or refuse it).
fn complete_frame(buf: &[u8]) -> Option<&[u8]> {
    let total_size = u32::from_be_bytes(buf.get(..4)?.try_into().ok()?) as usize;
    let frame_bytes = 4 + total_size;
    if total_size < 4 || frame_bytes > MAX_FRAME_BYTES {
        return None;
    }
    buf.get(..frame_bytes)
}

/// Rewrites the checksum of every frame that has one (after an optional
/// 0x0e02 block) to the CRC32C of what it covers.
fn fix_checksums(stream: &mut [u8]) {
    let read_u32 = |bytes: &[u8], at: usize| -> Option<usize> {
        Some(u32::from_be_bytes(bytes.get(at..at + 4)?.try_into().ok()?) as usize)
    };
    let mut start = 0;
    while let Some(total_size) = read_u32(stream, start) {
        let Some(end) = start
            .checked_add(4 + total_size)
            .filter(|&end| end <= stream.len())
        else {
            return;
        };
        if let Some(command_size) = read_u32(stream, start + 4) {
            let mut at = (start + 8).saturating_add(command_size);
            if stream.get(at..at + 2) == Some(&[0x0e, 0x02])
                && let Some(size) = read_u32(stream, at + 2)
            {
                at = at.saturating_add(6 + size);
            }
            if at + 6 <= end && stream[at..at + 2] == [0x0e, 0x01] {
                let crc = crc32c::crc32c(&stream[at + 6..end]);
                stream[at + 2..at + 6].copy_from_slice(&crc.to_be_bytes());
            }
        }
        start = end;
    }
}

/// The decoder's answer for a whole frame must be the reference's.
fn check_against_reference(decoded: &Result<Option<Frame>, WireError>, frame: &[u8]) {
    let reference = reference_decode(frame);
    match (decoded, &reference) {
        (Ok(Some(decoded)), Ok(reference)) => {
            assert_eq!(decoded.command, reference.command);
            assert_eq!(
                decoded.payload.as_ref().map(section_view),
                reference.payload.as_ref().map(section_view)
            );
        }
        (Err(decoded), Err(reference)) => {
            assert_eq!(
                discriminant(decoded),
                discriminant(reference),
                "{decoded:?} vs {reference:?}"
            );
            if let (
                WireError::ChecksumMismatch {
                    command: a,
                    expected: x,
                    ..
                },
                WireError::ChecksumMismatch {
                    command: b,
                    expected: y,
                    ..
                },
            ) = (decoded, &reference)
            {
                assert_eq!((a, x), (b, y));
            }
        }
        (decoded, reference) => panic!("decoded {decoded:?}, reference {reference:?}"),
    }
}

fn check_frame(frame: Frame) {
    assert!(frame.command_type().is_some());
    match &frame.payload {
        None => {
            let mut encoded = BytesMut::new();
            encode_command(&frame.command.to_base_command(), &mut encoded);
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
            let stored = frame.payload.clone().map(PayloadSection::into_stored_entry);
            assert_eq!(stored, Some(section.stored_entry()));
        }
    }
}
