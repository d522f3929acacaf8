//! Property tests for the SEND fast path: whatever a SEND frame holds (every
//! CommandSend field, message_id, no checksum, broker entry metadata, odd
//! metadata) and however its bytes are then changed, the decoder answers
//! what a reference built from prost and `PayloadSection::parse` answers:
//! the same error, or the same command and payload section. (Debug builds
//! also check each fast-path frame against the general path inside the
//! decoder.)
#![allow(clippy::unwrap_used)]

#[path = "support/reference.rs"]
mod reference;

use std::mem::discriminant;

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;
use prost::Message;
use reference::{reference_decode, section_view};
use vela_wire::proto::{
    BaseCommand, BrokerEntryMetadata, CommandSend, MessageIdData, MessageMetadata,
};
use vela_wire::{
    Command, FRAME_SIZE_MAX_DEFAULT_BYTES, Frame, FrameDecoder, SendCommand, WireError,
    decode_frame,
};

fn assert_same(
    decoded: &Result<Frame, WireError>,
    reference: &Result<Frame, WireError>,
) -> Result<(), TestCaseError> {
    match (decoded, reference) {
        (Ok(decoded), Ok(reference)) => {
            prop_assert_eq!(&decoded.command, &reference.command);
            prop_assert_eq!(
                decoded.payload.as_ref().map(section_view),
                reference.payload.as_ref().map(section_view)
            );
        }
        (Err(decoded), Err(reference)) => {
            prop_assert_eq!(discriminant(decoded), discriminant(reference));
            if let (
                WireError::ChecksumMismatch {
                    command: decoded_command,
                    expected: decoded_expected,
                    ..
                },
                WireError::ChecksumMismatch {
                    command: reference_command,
                    expected: reference_expected,
                    ..
                },
            ) = (decoded, reference)
            {
                prop_assert_eq!(decoded_command, reference_command);
                prop_assert_eq!(decoded_expected, reference_expected);
            }
        }
        _ => prop_assert!(false, "decoded {decoded:?}, reference {reference:?}"),
    }
    Ok(())
}

/// Decodes `frame` (one whole frame) both ways the crate offers, and checks
/// each against the reference.
fn check_frame(frame: &[u8]) -> Result<(), TestCaseError> {
    let reference = reference_decode(frame);
    let whole = decode_frame(Bytes::copy_from_slice(frame), FRAME_SIZE_MAX_DEFAULT_BYTES);
    assert_same(&whole, &reference)?;
    let mut buf = BytesMut::from(frame);
    let streamed = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT_BYTES)
        .decode(&mut buf)
        .map(|frame| frame.expect("a whole frame"));
    assert_same(&streamed, &reference)?;
    prop_assert!(buf.is_empty());
    Ok(())
}

fn command_send() -> impl Strategy<Value = CommandSend> {
    (
        (any::<u64>(), any::<u64>(), prop::option::of(any::<i32>())),
        (
            prop::option::of(any::<u64>()),
            prop::option::of(any::<u64>()),
            prop::option::of(any::<u64>()),
        ),
        (
            prop::option::of(any::<bool>()),
            prop::option::of(any::<bool>()),
            prop::option::weighted(0.1, (any::<u64>(), any::<u64>())),
        ),
    )
        .prop_map(
            |(
                (producer_id, sequence_id, num_messages),
                (txnid_least_bits, txnid_most_bits, highest_sequence_id),
                (is_chunk, marker, message_id),
            )| CommandSend {
                producer_id,
                sequence_id,
                num_messages,
                txnid_least_bits,
                txnid_most_bits,
                highest_sequence_id,
                is_chunk,
                marker,
                message_id: message_id.map(|(ledger_id, entry_id)| MessageIdData {
                    ledger_id,
                    entry_id,
                    ..Default::default()
                }),
            },
        )
}

/// MessageMetadata bytes: usually a real message's, sometimes arbitrary.
fn metadata_bytes() -> impl Strategy<Value = Vec<u8>> {
    let real = (
        "[a-z0-9-]{0,20}",
        any::<u64>(),
        any::<u64>(),
        prop::option::of("[a-z]{0,8}"),
        prop::option::of(1..200i32),
        prop::option::of(any::<u64>()),
    )
        .prop_map(
            |(
                producer_name,
                sequence_id,
                publish_time,
                partition_key,
                num_messages_in_batch,
                highest_sequence_id,
            )| {
                MessageMetadata {
                    producer_name,
                    sequence_id,
                    publish_time,
                    partition_key,
                    num_messages_in_batch,
                    highest_sequence_id,
                    ..Default::default()
                }
                .encode_to_vec()
            },
        );
    prop_oneof![9 => real, 1 => prop::collection::vec(any::<u8>(), 0..16)]
}

/// How the payload section starts.
#[derive(Debug, Clone, Copy)]
enum SectionLayout {
    /// `[0x0e01][crc]`: every producer of protocol v6 or later.
    Checksum,
    /// No checksum (producers before v6).
    NoChecksum,
    /// `[0x0e02][size][BrokerEntryMetadata][0x0e01][crc]`.
    BrokerEntryMetadata,
}

fn section_layout() -> impl Strategy<Value = SectionLayout> {
    prop_oneof![
        8 => Just(SectionLayout::Checksum),
        1 => Just(SectionLayout::NoChecksum),
        1 => Just(SectionLayout::BrokerEntryMetadata),
    ]
}

/// A SEND frame: `command` (prost-encoded, then `extra` appended to it as
/// more BaseCommand bytes), the section in `layout`, `metadata`, `payload`.
fn send_frame(
    command: &CommandSend,
    extra: &[u8],
    layout: SectionLayout,
    metadata: &[u8],
    payload: &[u8],
) -> Vec<u8> {
    let mut command = BaseCommand::from(command.clone()).encode_to_vec();
    command.extend_from_slice(extra);
    let mut covered = BytesMut::new();
    covered.put_u32(metadata.len() as u32);
    covered.put_slice(metadata);
    covered.put_slice(payload);
    let mut section = BytesMut::new();
    if let SectionLayout::BrokerEntryMetadata = layout {
        let broker_entry_metadata = BrokerEntryMetadata {
            broker_timestamp: Some(1),
            index: Some(2),
        }
        .encode_to_vec();
        section.put_u16(0x0e02);
        section.put_u32(broker_entry_metadata.len() as u32);
        section.put_slice(&broker_entry_metadata);
    }
    if !matches!(layout, SectionLayout::NoChecksum) {
        section.put_u16(0x0e01);
        section.put_u32(crc32c::crc32c(&covered));
    }
    section.put_slice(&covered);
    let mut frame = BytesMut::new();
    frame.put_u32((4 + command.len() + section.len()) as u32);
    frame.put_u32(command.len() as u32);
    frame.put_slice(&command);
    frame.put_slice(&section);
    frame.to_vec()
}

/// More BaseCommand bytes after prost's encoding: nothing (mostly), a
/// repeated `send` (prost merges it), an unknown field, or junk.
fn extra_command_bytes() -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        6 => Just(Vec::new()),
        1 => (any::<u64>(), any::<u64>()).prop_map(|(producer_id, sequence_id)| {
            let body = CommandSend { producer_id, sequence_id, ..Default::default() }.encode_to_vec();
            let mut bytes = vec![0x32, body.len() as u8];
            bytes.extend(body);
            bytes
        }),
        1 => Just(vec![0xa0, 0x06, 0x01]), // field 100, varint 1: unknown to BaseCommand
        1 => prop::collection::vec(any::<u8>(), 1..4),
    ]
}

proptest! {
    #[test]
    fn send_frames_decode_as_the_reference_does(
        command in command_send(),
        extra in extra_command_bytes(),
        layout in section_layout(),
        metadata in metadata_bytes(),
        payload in prop::collection::vec(any::<u8>(), 0..256),
    ) {
        let frame = send_frame(&command, &extra, layout, &metadata, &payload);
        check_frame(&frame)?;
        // A SEND that prost decodes is always a Command::Send.
        if extra.is_empty() && let Ok(decoded) = reference_decode(&frame) {
            prop_assert_eq!(decoded.command, Command::Send(SendCommand::from(&command)));
        }
    }

    #[test]
    fn changed_send_frames_decode_as_the_reference_does(
        command in command_send(),
        extra in extra_command_bytes(),
        layout in section_layout(),
        metadata in metadata_bytes(),
        payload in prop::collection::vec(any::<u8>(), 0..64),
        changes in prop::collection::vec((any::<prop::sample::Index>(), any::<u8>()), 1..4),
    ) {
        let mut frame = send_frame(&command, &extra, layout, &metadata, &payload);
        // Every byte but totalSize, which the decoder checks before the
        // fast path and which would only make the frame incomplete.
        for (index, value) in &changes {
            let index = 4 + index.index(frame.len() - 4);
            frame[index] = *value;
        }
        check_frame(&frame)?;
    }

    #[test]
    fn changed_header_bytes_decode_as_the_reference_does(
        command in command_send(),
        metadata in metadata_bytes(),
        changes in prop::collection::vec((0..40usize, any::<u8>()), 1..3),
    ) {
        // Changes in the command and the section's first bytes, where the
        // fast path makes its decisions.
        let mut frame = send_frame(&command, &[], SectionLayout::Checksum, &metadata, b"payload");
        for (index, value) in &changes {
            let index = 4 + index % (frame.len() - 4);
            frame[index] = *value;
        }
        check_frame(&frame)?;
    }
}
