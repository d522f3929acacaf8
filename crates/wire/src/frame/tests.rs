//! Tests of the frame decoder and encoders.
#![allow(clippy::unwrap_used)]

use super::*;
use crate::proto::{
    BaseCommand, CommandMessage, CommandPing, CommandPong, CommandSend, MessageIdData,
};

fn hex(text: &str) -> Vec<u8> {
    let digits: Vec<u8> = text.bytes().filter(u8::is_ascii_hexdigit).collect();
    digits
        .chunks(2)
        .map(|pair| u8::from_str_radix(std::str::from_utf8(pair).unwrap(), 16).unwrap())
        .collect()
}

/// pulsar-protocol.md section 1.
const PING_HEX: &str = "00 00 00 09 00 00 00 05 08 12 92 01 00";
const PONG_HEX: &str = "00 00 00 09 00 00 00 05 08 13 9a 01 00";
const SEND_HEX: &str = "00 00 00 24 00 00 00 08 08 06 32 04 08 01 10 00 0e 01 5b 4c 69 ac \
                        00 00 00 0c 0a 01 70 10 00 18 80 d0 95 ff bc 31 68 69";

fn send_command() -> BaseCommand {
    BaseCommand::from(CommandSend {
        producer_id: 1,
        sequence_id: 0,
        ..Default::default()
    })
}

fn send_metadata() -> MessageMetadata {
    MessageMetadata {
        producer_name: "p".into(),
        sequence_id: 0,
        publish_time: 1_700_000_000_000,
        ..Default::default()
    }
}

fn decode_all(bytes: &[u8]) -> Result<Option<Frame>, WireError> {
    FrameDecoder::default().decode(&mut BytesMut::from(bytes))
}

#[test]
fn ping_and_pong_decode_and_encode_exactly() {
    for (text, command) in [
        (PING_HEX, BaseCommand::from(CommandPing {})),
        (PONG_HEX, BaseCommand::from(CommandPong {})),
    ] {
        let bytes = hex(text);
        let frame = decode_all(&bytes).unwrap().unwrap();
        assert_eq!(frame.command, command);
        assert!(frame.payload.is_none());
        let mut encoded = BytesMut::new();
        encode_command(&command, &mut encoded);
        assert_eq!(&encoded[..], &bytes[..]);
    }
}

#[test]
fn worked_send_decodes_and_encodes_exactly() {
    let bytes = hex(SEND_HEX);
    let frame = decode_all(&bytes).unwrap().unwrap();
    assert_eq!(frame.command_type(), Some(Type::Send));
    assert_eq!(frame.command, send_command());
    let section = frame.payload.unwrap();
    assert_eq!(section.checksum(), Checksum::Verified(0x5b4c_69ac));
    assert_eq!(section.metadata().unwrap(), &send_metadata());
    assert_eq!(section.payload_slice(), b"hi");
    assert_eq!(section.summary().sequence_id, Some(0));
    assert_eq!(section.summary().publish_time_ms, Some(1_700_000_000_000));
    assert!(section.broker_entry_metadata().is_none());
    // The stored entry starts at the magic and runs to the end.
    assert_eq!(&section.entry_verbatim()[..], &bytes[16..]);
    assert_eq!(section.stored_entry(), section.entry_verbatim());
    assert_eq!(section.producer_name(), Some(&b"p"[..]));
    assert_eq!(section.metadata_bytes(), section.metadata_slice());

    let mut encoded = BytesMut::new();
    encode_payload_frame(&send_command(), &send_metadata(), b"hi", &mut encoded);
    assert_eq!(&encoded[..], &bytes[..]);
}

#[test]
fn payload_written_in_place_gives_the_same_frame_whatever_the_hint() {
    let expected = hex(SEND_HEX);
    for hint in [0, 2, 1 << 20] {
        // After a frame already in the buffer: sizes are the new frame's own.
        let mut encoded = BytesMut::from(&hex(PING_HEX)[..]);
        encode_payload_frame_with(&send_command(), &send_metadata(), hint, &mut encoded, |b| {
            b.extend_from_slice(b"h");
            b.extend_from_slice(b"i");
        });
        assert_eq!(
            &encoded[..],
            &[hex(PING_HEX), expected.clone()].concat()[..]
        );
    }
}

#[test]
fn two_frames_in_one_buffer_and_byte_by_byte() {
    let mut stream = hex(PING_HEX);
    stream.extend(hex(SEND_HEX));
    stream.extend(hex(PONG_HEX));
    let mut decoder = FrameDecoder::default();
    let mut buf = BytesMut::new();
    let mut types = Vec::new();
    for byte in stream {
        buf.put_u8(byte);
        while let Some(frame) = decoder.decode(&mut buf).unwrap() {
            types.push(frame.command_type().unwrap());
        }
    }
    assert_eq!(types, [Type::Ping, Type::Send, Type::Pong]);
    assert!(buf.is_empty());
}

#[test]
fn truncation_at_every_offset_waits_or_errors() {
    let bytes = hex(SEND_HEX);
    for cut in 0..bytes.len() {
        // A stream cut short waits for more bytes.
        assert!(decode_all(&bytes[..cut]).unwrap().is_none(), "cut at {cut}");
    }
    // A frame whose totalSize is shortened at every point: an error, never a panic.
    for total_size in 4..(bytes.len() as u32 - 4) {
        let mut frame = bytes[..4 + total_size as usize].to_vec();
        frame[..4].copy_from_slice(&total_size.to_be_bytes());
        assert!(decode_all(&frame).is_err(), "totalSize {total_size}");
    }
}

#[test]
fn frame_too_large_is_detected_from_the_size_field() {
    let mut decoder = FrameDecoder::new(1024);
    let mut buf = BytesMut::from(&1025u32.to_be_bytes()[..]);
    let error = decoder.decode(&mut buf).unwrap_err();
    assert!(matches!(
        error,
        WireError::FrameTooLarge {
            frame_bytes: 1029,
            max_frame_bytes: 1024
        }
    ));
    assert!(error.is_stream_fatal());
    assert!(matches!(decoder.decode(&mut buf), Err(WireError::Poisoned)));
    // u32::MAX never allocates.
    let mut decoder = FrameDecoder::default();
    let mut buf = BytesMut::from(&u32::MAX.to_be_bytes()[..]);
    assert!(matches!(
        decoder.decode(&mut buf),
        Err(WireError::FrameTooLarge { .. })
    ));
}

#[test]
fn malformed_frames_get_typed_errors() {
    let send = hex(SEND_HEX);
    let set = |bytes: &[u8], offset: usize, value: &[u8]| {
        let mut copy = bytes.to_vec();
        copy[offset..offset + value.len()].copy_from_slice(value);
        copy
    };
    // totalSize < 4
    assert!(matches!(
        decode_all(&[0, 0, 0, 2, 0, 0]),
        Err(WireError::FrameTooSmall { total_size: 2 })
    ));
    // commandSize > what the frame holds
    assert!(matches!(
        decode_all(&set(&send, 4, &100u32.to_be_bytes())),
        Err(WireError::CommandSizeOutOfBounds {
            command_size: 100,
            ..
        })
    ));
    // metadataSize beyond the frame
    assert!(matches!(
        decode_all(&set(&send, 22, &100u32.to_be_bytes())),
        Err(WireError::ChecksumMismatch { .. })
    ));
    // bad magic
    assert!(matches!(
        decode_all(&set(&send, 16, &[0x0e, 0x07])),
        Err(WireError::BadMagic { value: 0x0e07 })
    ));
    // undecodable command
    assert!(matches!(
        decode_all(&set(&send, 8, &[0x08, 0xff])),
        Err(WireError::Protobuf {
            what: "BaseCommand",
            ..
        })
    ));
    // unknown type
    let mut command = BytesMut::new();
    encode_command(
        &BaseCommand {
            r#type: 99,
            ..Default::default()
        },
        &mut command,
    );
    assert!(matches!(
        decode_all(&command),
        Err(WireError::UnknownCommandType { value: 99 })
    ));
    // type without its sub-message
    let mut command = BytesMut::new();
    encode_command(
        &BaseCommand {
            r#type: Type::Ping as i32,
            ..Default::default()
        },
        &mut command,
    );
    assert!(matches!(
        decode_all(&command),
        Err(WireError::MissingCommandBody {
            command_type: Type::Ping
        })
    ));
    // SEND without payload
    let mut command = BytesMut::new();
    encode_command(&send_command(), &mut command);
    assert!(matches!(
        decode_all(&command),
        Err(WireError::MissingPayload {
            command_type: Type::Send
        })
    ));
    // PING with a payload
    let mut frame = BytesMut::new();
    encode_payload_frame(
        &BaseCommand::from(CommandPing {}),
        &send_metadata(),
        b"x",
        &mut frame,
    );
    assert!(matches!(
        decode_all(&frame),
        Err(WireError::UnexpectedPayload {
            command_type: Type::Ping
        })
    ));
}

#[test]
fn payload_section_errors_are_typed() {
    let parse = |bytes: &[u8]| PayloadSection::parse(Bytes::copy_from_slice(bytes));
    // 0x0e02 with its size cut off, a size beyond the end, bad protobuf.
    assert!(matches!(
        parse(&[0x0e, 0x02, 0, 0]),
        Err(WireError::Truncated {
            field: "broker entry metadata size",
            ..
        })
    ));
    assert!(matches!(
        parse(&[0x0e, 0x02, 0, 0, 0, 9, 1]),
        Err(WireError::BrokerEntryMetadataSizeOutOfBounds {
            size: 9,
            available_bytes: 1
        })
    ));
    assert!(matches!(
        parse(&[0x0e, 0x02, 0, 0, 0, 1, 0x08]),
        Err(WireError::Protobuf {
            what: "BrokerEntryMetadata",
            ..
        })
    ));
    // 0x0e01 with the checksum cut off.
    assert!(matches!(
        parse(&[0x0e, 0x01, 0, 0]),
        Err(WireError::Truncated {
            field: "checksum",
            ..
        })
    ));
    // A lone 0x0e byte, then no metadata size.
    assert!(matches!(
        parse(&[0x0e]),
        Err(WireError::Truncated {
            field: "metadata size",
            ..
        })
    ));
    assert!(matches!(
        parse(&[]),
        Err(WireError::Truncated {
            field: "metadata size",
            ..
        })
    ));
    // Malformed metadata protobuf.
    assert!(matches!(
        parse(&[0, 0, 0, 1, 0x08]),
        Err(WireError::MalformedProtobuf {
            what: "MessageMetadata",
            ..
        })
    ));
    // Empty metadata and payload are accepted (validation is the caller's).
    let section = parse(&[0, 0, 0, 0]).unwrap();
    assert!(!section.summary().has_required_fields());
    assert!(section.payload_slice().is_empty());
}

#[test]
fn peek_entry_reads_without_verifying() {
    let mut entry = hex(SEND_HEX)[16..].to_vec();
    let peek = peek_entry(&entry).unwrap();
    assert_eq!(peek.checksum, Some(0x5b4c_69ac));
    assert_eq!(peek.payload, b"hi");
    assert_eq!(peek.summary.producer_name.unwrap().get(peek.metadata), b"p");
    // A corrupt payload still peeks (the CRC is not checked)...
    let last = entry.len() - 1;
    entry[last] ^= 1;
    assert!(peek_entry(&entry).is_ok());
    // ...but a broken layout does not.
    entry[6..10].copy_from_slice(&1000u32.to_be_bytes());
    assert!(matches!(
        peek_entry(&entry),
        Err(WireError::MetadataSizeOutOfBounds { .. })
    ));
}

#[test]
fn metadata_size_out_of_bounds_without_checksum() {
    // An old producer's frame (no 0x0e01) with a lying metadataSize.
    let mut frame = BytesMut::new();
    let command = send_command();
    let command_size = command.encoded_len();
    frame.put_u32((4 + command_size + 4 + 2) as u32);
    frame.put_u32(command_size as u32);
    command.encode_raw(&mut frame);
    frame.put_u32(50);
    frame.put_slice(b"ab");
    assert!(matches!(
        decode_all(&frame),
        Err(WireError::MetadataSizeOutOfBounds {
            metadata_size: 50,
            available_bytes: 2
        })
    ));
}

#[test]
fn checksum_mismatch_names_the_command_and_keeps_the_stream() {
    let mut stream = hex(SEND_HEX);
    let last = stream.len() - 1;
    stream[last] ^= 0x01; // flip a payload bit
    stream.extend(hex(PING_HEX));
    let mut decoder = FrameDecoder::default();
    let mut buf = BytesMut::from(&stream[..]);
    match decoder.decode(&mut buf) {
        Err(error @ WireError::ChecksumMismatch { .. }) => {
            assert!(!error.is_stream_fatal());
            let WireError::ChecksumMismatch {
                command: Some(command),
                expected,
                ..
            } = error
            else {
                panic!("no command in the error");
            };
            assert_eq!(expected, 0x5b4c_69ac);
            let send = command.as_send().unwrap();
            assert_eq!((send.producer_id, send.sequence_id), (1, 0));
        }
        other => panic!("unexpected {other:?}"),
    }
    let next = decoder.decode(&mut buf).unwrap().unwrap();
    assert_eq!(next.command_type(), Some(Type::Ping));
}

#[test]
fn old_producer_frame_gets_a_canonical_stored_entry() {
    let metadata = send_metadata().encode_to_vec();
    let command = send_command();
    let command_size = command.encoded_len();
    let mut frame = BytesMut::new();
    frame.put_u32((4 + command_size + 4 + metadata.len() + 2) as u32);
    frame.put_u32(command_size as u32);
    command.encode_raw(&mut frame);
    frame.put_u32(metadata.len() as u32);
    frame.put_slice(&metadata);
    frame.put_slice(b"hi");
    let section = decode_all(&frame).unwrap().unwrap().payload.unwrap();
    assert_eq!(section.checksum(), Checksum::Absent);
    let canonical = hex(SEND_HEX)[16..].to_vec();
    assert_eq!(&section.stored_entry()[..], &canonical[..]);
    assert_eq!(build_stored_entry(&metadata, b"hi"), canonical);
}

#[test]
fn message_frame_from_stored_entry_with_broker_entry_metadata() {
    let entry = Bytes::from(hex(SEND_HEX)[16..].to_vec());
    let command = BaseCommand::from(CommandMessage {
        consumer_id: 3,
        message_id: MessageIdData {
            ledger_id: 10,
            entry_id: 20,
            ..Default::default()
        },
        ..Default::default()
    });
    for broker_entry_metadata in [
        None,
        Some(BrokerEntryMetadata {
            broker_timestamp: Some(5),
            index: Some(6),
        }),
    ] {
        let parts = MessageFrameParts::new(&command, broker_entry_metadata.as_ref(), entry.clone());
        let mut joined = BytesMut::new();
        encode_message_frame(
            &command,
            broker_entry_metadata.as_ref(),
            &entry,
            &mut joined,
        );
        assert_eq!(parts.len(), joined.len());
        let mut chained = BytesMut::new();
        chained.put(parts.into_buf());
        assert_eq!(chained, joined);

        let frame = decode_all(&joined).unwrap().unwrap();
        assert_eq!(frame.command, command);
        let section = frame.payload.unwrap();
        assert_eq!(
            section.broker_entry_metadata(),
            broker_entry_metadata.as_ref()
        );
        assert_eq!(section.entry_verbatim(), entry);
        assert_eq!(section.payload_slice(), b"hi");
    }
}

#[test]
fn decode_frame_wants_exactly_one_frame() {
    let bytes = Bytes::from(hex(SEND_HEX));
    let frame = decode_frame(bytes.clone(), FRAME_SIZE_MAX_DEFAULT_BYTES).unwrap();
    assert_eq!(frame.command, send_command());
    assert!(matches!(
        decode_frame(bytes.slice(..bytes.len() - 1), FRAME_SIZE_MAX_DEFAULT_BYTES),
        Err(WireError::FrameLengthMismatch {
            total_size: 0x24,
            buffer_bytes: 39
        })
    ));
    let mut longer = bytes.to_vec();
    longer.push(0);
    assert!(matches!(
        decode_frame(Bytes::from(longer), FRAME_SIZE_MAX_DEFAULT_BYTES),
        Err(WireError::FrameLengthMismatch { .. })
    ));
    assert!(matches!(
        decode_frame(bytes.slice(..2), 100),
        Err(WireError::Truncated { .. })
    ));
    assert!(matches!(
        decode_frame(bytes, 10),
        Err(WireError::FrameTooLarge { .. })
    ));
}

#[test]
fn frame_stays_small() {
    // The decoder returns one Frame per SEND and callers move it; the
    // bench prints the figure. 744 bytes when Frame held a BaseCommand.
    let frame_bytes = std::mem::size_of::<Frame>();
    assert!(frame_bytes <= 128, "{frame_bytes}");
    assert_eq!(std::mem::size_of::<SendCommand>(), 48);
    assert_eq!(std::mem::size_of::<Command>(), 48);
    assert!(std::mem::size_of::<WireError>() <= 128);
}

#[test]
fn command_size_of_a_boxed_base_command_stays_small() {
    // Boxing keeps BaseCommand cheap to create and move (see build.rs).
    assert!(
        std::mem::size_of::<BaseCommand>() <= 512,
        "{}",
        std::mem::size_of::<BaseCommand>()
    );
}
