//! Property tests: what we encode decodes to the same values, for every
//! command type, payload frames and batches; and no input makes the decoders
//! panic (arbitrary bytes, arbitrary chunking, bit flips).
#![allow(clippy::unwrap_used)]

use bytes::{Bytes, BytesMut};
use proptest::prelude::*;
use prost::Message;
use vela_wire::batch::{BatchMessage, build_batch, parse_batch};
use vela_wire::command::with_default_body;
use vela_wire::compression::{compress, decompress};
use vela_wire::proto::{
    self, BaseCommand, BrokerEntryMetadata, CompressionType, KeyValue, MessageIdData,
    MessageMetadata, SingleMessageMetadata, base_command::Type,
};
use vela_wire::{
    Checksum, FRAME_SIZE_MAX_DEFAULT_BYTES, Frame, FrameDecoder, MessageFrameParts,
    MetadataSummary, PayloadSection, WireError, encode_command, encode_payload_frame,
};

/// Every known command type.
fn all_types() -> Vec<Type> {
    (0..128)
        .filter_map(|value| Type::try_from(value).ok())
        .collect()
}

/// Feeds `stream` to a decoder in chunks cut at `cuts` (fractions of the
/// length) and collects the frames.
fn decode_chunked(stream: &[u8], cuts: &[f64]) -> Result<Vec<Frame>, WireError> {
    let mut points: Vec<usize> = cuts
        .iter()
        .map(|cut| (cut * stream.len() as f64) as usize)
        .collect();
    points.push(stream.len());
    points.sort_unstable();
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT_BYTES);
    let mut buf = BytesMut::new();
    let mut frames = Vec::new();
    let mut fed = 0;
    for point in points {
        buf.extend_from_slice(&stream[fed..point]);
        fed = point;
        while let Some(frame) = decoder.decode(&mut buf)? {
            frames.push(frame);
        }
    }
    assert!(buf.is_empty(), "{} bytes left over", buf.len());
    Ok(frames)
}

fn text() -> impl Strategy<Value = String> {
    "[a-z0-9:/._-]{0,24}"
}

fn key_values() -> impl Strategy<Value = Vec<KeyValue>> {
    prop::collection::vec(
        (text(), text()).prop_map(|(key, value)| KeyValue { key, value }),
        0..3,
    )
}

fn message_id() -> impl Strategy<Value = MessageIdData> {
    (
        any::<u64>(),
        any::<u64>(),
        prop::option::of(any::<i32>()),
        prop::option::of(any::<i32>()),
        prop::collection::vec(any::<i64>(), 0..3),
        prop::option::of(any::<i32>()),
    )
        .prop_map(
            |(ledger_id, entry_id, partition, batch_index, ack_set, batch_size)| MessageIdData {
                ledger_id,
                entry_id,
                partition,
                batch_index,
                ack_set,
                batch_size,
                first_chunk_message_id: None,
            },
        )
}

/// Commands with varied content for the common types, and every other type
/// with a default body.
fn command() -> impl Strategy<Value = BaseCommand> {
    let send = (
        any::<u64>(),
        any::<u64>(),
        prop::option::of(any::<i32>()),
        prop::option::of(any::<u64>()),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(producer_id, sequence_id, num_messages, highest_sequence_id, is_chunk)| {
                BaseCommand::from(proto::CommandSend {
                    producer_id,
                    sequence_id,
                    num_messages,
                    highest_sequence_id,
                    is_chunk,
                    ..Default::default()
                })
            },
        );
    let message = (
        any::<u64>(),
        message_id(),
        prop::option::of(any::<u32>()),
        prop::collection::vec(any::<i64>(), 0..3),
    )
        .prop_map(|(consumer_id, message_id, redelivery_count, ack_set)| {
            BaseCommand::from(proto::CommandMessage {
                consumer_id,
                message_id,
                redelivery_count,
                ack_set,
                consumer_epoch: None,
            })
        });
    let ack = (
        any::<u64>(),
        0..2i32,
        prop::collection::vec(message_id(), 0..4),
        prop::option::of(any::<u64>()),
    )
        .prop_map(|(consumer_id, ack_type, message_id, request_id)| {
            BaseCommand::from(proto::CommandAck {
                consumer_id,
                ack_type,
                message_id,
                request_id,
                ..Default::default()
            })
        });
    let flow = (any::<u64>(), any::<u32>()).prop_map(|(consumer_id, message_permits)| {
        BaseCommand::from(proto::CommandFlow {
            consumer_id,
            message_permits,
        })
    });
    let producer = (
        text(),
        any::<u64>(),
        any::<u64>(),
        prop::option::of(text()),
        key_values(),
        prop::option::of(any::<u64>()),
    )
        .prop_map(
            |(topic, producer_id, request_id, producer_name, metadata, epoch)| {
                BaseCommand::from(proto::CommandProducer {
                    topic,
                    producer_id,
                    request_id,
                    producer_name,
                    metadata,
                    epoch,
                    user_provided_producer_name: Some(false),
                    ..Default::default()
                })
            },
        );
    let subscribe = (
        text(),
        text(),
        0..4i32,
        any::<u64>(),
        any::<u64>(),
        prop::option::of(message_id()),
        prop::option::of(prop::collection::vec((any::<i32>(), any::<i32>()), 0..3)),
    )
        .prop_map(
            |(topic, subscription, sub_type, consumer_id, request_id, start_message_id, ranges)| {
                BaseCommand::from(proto::CommandSubscribe {
                    topic,
                    subscription,
                    sub_type,
                    consumer_id,
                    request_id,
                    start_message_id,
                    key_shared_meta: ranges.map(|ranges| proto::KeySharedMeta {
                        key_shared_mode: 1,
                        hash_ranges: ranges
                            .into_iter()
                            .map(|(start, end)| proto::IntRange { start, end })
                            .collect(),
                        allow_out_of_order_delivery: Some(true),
                    }),
                    ..Default::default()
                })
            },
        );
    let connect = (
        text(),
        prop::option::of(text()),
        prop::option::of(any::<i32>()),
        prop::option::of(any::<bool>()),
    )
        .prop_map(
            |(client_version, auth_method_name, protocol_version, flag)| {
                BaseCommand::from(proto::CommandConnect {
                    client_version,
                    auth_method_name,
                    protocol_version,
                    auth_data: Some(Bytes::from_static(b"token")),
                    feature_flags: flag.map(|flag| proto::FeatureFlags {
                        supports_broker_entry_metadata: Some(flag),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
            },
        );
    let error = (any::<u64>(), 0..26i32, text()).prop_map(|(request_id, error, message)| {
        BaseCommand::from(proto::CommandError {
            request_id,
            error,
            message,
        })
    });
    let any_type = prop::sample::select(all_types()).prop_map(with_default_body);
    prop_oneof![
        send, message, ack, flow, producer, subscribe, connect, error, any_type
    ]
}

fn metadata() -> impl Strategy<Value = MessageMetadata> {
    (
        (
            text(),
            any::<u64>(),
            any::<u64>(),
            key_values(),
            prop::option::of(text()),
        ),
        (
            prop::option::of(0..5i32),
            prop::option::of(any::<u32>()),
            prop::option::of(1..1000i32),
            prop::option::of(any::<u64>()),
        ),
        (
            prop::option::of(prop::collection::vec(any::<u8>(), 0..8)),
            prop::option::of(any::<i64>()),
            prop::option::of(any::<u64>()),
            prop::option::of(any::<i32>()),
        ),
    )
        .prop_map(
            |(
                (producer_name, sequence_id, publish_time, properties, partition_key),
                (compression, uncompressed_size, num_messages_in_batch, event_time),
                (ordering_key, deliver_at_time, highest_sequence_id, chunk_id),
            )| MessageMetadata {
                producer_name,
                sequence_id,
                publish_time,
                properties,
                partition_key,
                compression,
                uncompressed_size,
                num_messages_in_batch,
                event_time,
                ordering_key: ordering_key.map(Bytes::from),
                deliver_at_time,
                highest_sequence_id,
                chunk_id,
                ..Default::default()
            },
        )
}

fn payload_command() -> impl Strategy<Value = BaseCommand> {
    command().prop_map(|command| {
        if matches!(
            Type::try_from(command.r#type),
            Ok(Type::Send | Type::Message)
        ) {
            command
        } else {
            with_default_body(Type::Send)
        }
    })
}

fn batch_message() -> impl Strategy<Value = BatchMessage> {
    (
        prop::option::of(text()),
        key_values(),
        prop::option::of(any::<u64>()),
        prop::collection::vec(any::<u8>(), 0..64),
    )
        .prop_map(|(partition_key, properties, sequence_id, payload)| {
            BatchMessage::new(
                SingleMessageMetadata {
                    partition_key,
                    properties,
                    sequence_id,
                    ..Default::default()
                },
                Bytes::from(payload),
            )
        })
}

proptest! {
    #[test]
    fn simple_frames_round_trip(commands in prop::collection::vec(command(), 1..6), cuts in prop::collection::vec(0.0..1.0f64, 0..6)) {
        let simple: Vec<BaseCommand> = commands
            .into_iter()
            .filter(|command| !matches!(Type::try_from(command.r#type), Ok(Type::Send | Type::Message)))
            .collect();
        let mut stream = BytesMut::new();
        for command in &simple {
            encode_command(command, &mut stream);
        }
        let frames = decode_chunked(&stream, &cuts).unwrap();
        prop_assert_eq!(frames.len(), simple.len());
        for (frame, command) in frames.iter().zip(&simple) {
            prop_assert_eq!(&frame.command, command);
            prop_assert!(frame.payload.is_none());
        }
    }

    #[test]
    fn every_command_type_round_trips(command_type in prop::sample::select(all_types())) {
        let command = with_default_body(command_type);
        let mut stream = BytesMut::new();
        if matches!(command_type, Type::Send | Type::Message) {
            encode_payload_frame(&command, &MessageMetadata::default(), b"x", &mut stream);
        } else {
            encode_command(&command, &mut stream);
        }
        let frames = decode_chunked(&stream, &[]).unwrap();
        prop_assert_eq!(frames[0].command_type(), Some(command_type));
        prop_assert_eq!(&frames[0].command, &command);
    }

    #[test]
    fn payload_frames_round_trip(
        command in payload_command(),
        metadata in metadata(),
        payload in prop::collection::vec(any::<u8>(), 0..2048),
        cuts in prop::collection::vec(0.0..1.0f64, 0..4),
    ) {
        let mut stream = BytesMut::new();
        encode_payload_frame(&command, &metadata, &payload, &mut stream);
        let frames = decode_chunked(&stream, &cuts).unwrap();
        let frame = &frames[0];
        prop_assert_eq!(&frame.command, &command);
        let section = frame.payload.as_ref().unwrap();
        prop_assert!(matches!(section.checksum(), Checksum::Verified(_)));
        prop_assert_eq!(section.metadata().unwrap(), &metadata);
        prop_assert_eq!(section.metadata_slice(), &metadata.encode_to_vec()[..]);
        prop_assert_eq!(section.payload_slice(), &payload[..]);
        let summary = section.summary();
        prop_assert_eq!(summary.sequence_id, Some(metadata.sequence_id));
        prop_assert_eq!(summary.num_messages_in_batch, metadata.num_messages_in_batch);
        prop_assert_eq!(section.partition_key(), metadata.partition_key.as_deref().map(str::as_bytes));
        prop_assert_eq!(section.ordering_key(), metadata.ordering_key.as_deref());
        // The stored entry is the frame from 0x0e01 on, and re-sending it
        // behind a MESSAGE command gives back the same section.
        let entry = section.stored_entry();
        prop_assert_eq!(&entry[..], &stream[stream.len() - entry.len()..]);
        let message = BaseCommand::from(proto::CommandMessage { consumer_id: 1, ..Default::default() });
        let broker_entry_metadata = BrokerEntryMetadata { broker_timestamp: Some(1), index: Some(2) };
        let parts = MessageFrameParts::new(&message, Some(&broker_entry_metadata), entry.clone());
        let mut joined = BytesMut::from(&parts.header[..]);
        joined.extend_from_slice(&parts.entry);
        let delivered = decode_chunked(&joined, &[]).unwrap();
        let delivered_section = delivered[0].payload.as_ref().unwrap();
        prop_assert_eq!(delivered_section.broker_entry_metadata(), Some(&broker_entry_metadata));
        prop_assert_eq!(delivered_section.entry_verbatim(), entry);
    }

    #[test]
    fn a_flipped_bit_in_the_checksummed_bytes_is_always_caught(
        payload in prop::collection::vec(any::<u8>(), 1..512),
        position in any::<prop::sample::Index>(),
        bit in 0..8u8,
    ) {
        let command = with_default_body(Type::Send);
        let metadata = MessageMetadata { producer_name: "p".into(), ..Default::default() };
        let mut frame = BytesMut::new();
        encode_payload_frame(&command, &metadata, &payload, &mut frame);
        let covered_start = frame.len() - (4 + metadata.encoded_len() + payload.len());
        let index = covered_start + position.index(frame.len() - covered_start);
        frame[index] ^= 1 << bit;
        let result = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT_BYTES).decode(&mut frame);
        prop_assert!(
            matches!(result, Err(WireError::ChecksumMismatch { command: Some(_), .. })),
            "{:?}", result
        );
    }

    #[test]
    fn batches_round_trip(messages in prop::collection::vec(batch_message(), 1..20)) {
        let mut buf = BytesMut::new();
        build_batch(&messages, &mut buf);
        let parsed = parse_batch(&buf.freeze(), messages.len() as i32).unwrap();
        prop_assert_eq!(parsed, messages);
    }

    #[test]
    fn compressed_batches_round_trip(messages in prop::collection::vec(batch_message(), 1..10), codec in 0..5i32) {
        let codec = CompressionType::try_from(codec).unwrap();
        let mut buf = BytesMut::new();
        build_batch(&messages, &mut buf);
        let compressed = compress(codec, &buf).unwrap();
        let restored = decompress(codec, &compressed, buf.len(), buf.len()).unwrap();
        prop_assert_eq!(&restored[..], &buf[..]);
        prop_assert_eq!(parse_batch(&restored, messages.len() as i32).unwrap(), messages);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..512), cuts in prop::collection::vec(0.0..1.0f64, 0..4), count in any::<i32>()) {
        let mut decoder = FrameDecoder::new(4096);
        let mut buf = BytesMut::new();
        let mut fed = 0;
        let mut points: Vec<usize> = cuts.iter().map(|cut| (cut * bytes.len() as f64) as usize).collect();
        points.push(bytes.len());
        points.sort_unstable();
        'feed: for point in points {
            buf.extend_from_slice(&bytes[fed..point]);
            fed = point;
            loop {
                match decoder.decode(&mut buf) {
                    Ok(Some(frame)) => {
                        if let Some(section) = &frame.payload {
                            let _ = section.metadata();
                        }
                    }
                    Ok(None) => break,
                    Err(error) if error.is_stream_fatal() => break 'feed,
                    Err(_) => {}
                }
            }
        }
        let bytes = Bytes::from(bytes);
        let _ = PayloadSection::parse(bytes.clone());
        let _ = MetadataSummary::scan(&bytes);
        let _ = parse_batch(&bytes, count);
        for codec in 0..5 {
            let codec = CompressionType::try_from(codec).unwrap();
            let _ = decompress(codec, &bytes, (count as u32 as usize) % 100_000, 65_536);
        }
    }

    #[test]
    fn a_valid_frame_with_any_byte_changed_never_panics(
        command in command(),
        metadata in metadata(),
        payload in prop::collection::vec(any::<u8>(), 0..64),
        position in any::<prop::sample::Index>(),
        value in any::<u8>(),
    ) {
        let mut frame = BytesMut::new();
        if matches!(Type::try_from(command.r#type), Ok(Type::Send | Type::Message)) {
            encode_payload_frame(&command, &metadata, &payload, &mut frame);
        } else {
            encode_command(&command, &mut frame);
        }
        let index = position.index(frame.len());
        frame[index] = value;
        let _ = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT_BYTES).decode(&mut frame);
    }
}
