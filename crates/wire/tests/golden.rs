//! Golden frames from the official Python client (`pulsar-client` from PyPI, a
//! wrapper around the C++ client). `tests/golden/capture.py` runs a fake broker
//! that answers just enough for the client to create a producer and send, and
//! records every frame the client sent, raw and whole, into `tests/golden/*.bin`;
//! `tests/golden/MANIFEST.txt` says what the client was asked to send and lists the
//! values that change per run (publish_time, client version). These tests decode
//! each file with vela-wire, compare EVERY field of the command, the
//! MessageMetadata and each batched SingleMessageMetadata with what the script
//! asked for (whole-struct equality, so an unexpected extra field fails too),
//! verify the CRC32C, decompress and split batches, and re-encode the command,
//! metadata and batch to the identical bytes (protobuf encoders emit fields in
//! field-number order, so a byte difference means a field our proto lacks or
//! encodes differently). Regenerate with `python3 crates/wire/tests/golden/capture.py`;
//! the expected values below mirror the scenario constants at the top of
//! capture.py and the client's observed choices (e.g. which optional fields the
//! C++ client writes), so a new client version may need this file updated.

#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::path::Path;

use bytes::{Bytes, BytesMut};
use prost::Message;
use vela_wire::batch::{BatchMessage, build_batch, parse_batch};
use vela_wire::compression::{compress, decompress};
use vela_wire::proto::{
    self, BaseCommand, CompressionType, FeatureFlags, KeyValue, MessageMetadata, base_command::Type,
};
use vela_wire::{
    Checksum, FRAME_SIZE_MAX_DEFAULT_BYTES, Frame, FrameDecoder, PayloadSection, WireError,
    decode_frame, encode_command, encode_payload_frame,
};

const GOLDEN_DIR: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden");

// ----------------------------------------------------------------------------
// What capture.py asked the client to send (keep in step with capture.py).
// ----------------------------------------------------------------------------

const TOPIC_PREFIX: &str = "persistent://public/default/golden-";
const PRODUCER_PROPERTIES: &[(&str, &str)] = &[("app", "vela-golden"), ("owner", "wire-tests")];
const EVENT_TIMESTAMP_MS: u64 = 1_700_000_000_123;
/// Every scenario runs its own client, so the producer is always the first
/// one on its connection.
const PRODUCER_ID: u64 = 0;

fn large_payload() -> Vec<u8> {
    b"The quick brown fox jumps over the lazy dog. ".repeat(46)
}

/// One message as the script asked the client to send it.
struct Sent {
    payload: Vec<u8>,
    partition_key: Option<&'static str>,
    ordering_key: Option<&'static [u8]>,
    properties: &'static [(&'static str, &'static str)],
    event_time_ms: Option<u64>,
}

/// Unbatched scenarios send these two, as `send_nobatch_<c>.bin` and
/// `send_nobatch_<c>_large.bin`, with sequence ids 0 and 1.
fn nobatch_messages() -> [(&'static str, Sent); 2] {
    [
        (
            "",
            Sent {
                payload: b"hello vela golden 0".to_vec(),
                partition_key: Some("key-nobatch"),
                ordering_key: None,
                properties: &[("color", "blue"), ("idx", "0")],
                event_time_ms: Some(EVENT_TIMESTAMP_MS),
            },
        ),
        (
            "_large",
            Sent {
                payload: large_payload(),
                partition_key: None,
                ordering_key: None,
                properties: &[],
                event_time_ms: None,
            },
        ),
    ]
}

/// Batched scenarios send these three in one SEND (`send_batch_<c>.bin`),
/// sequence ids 0, 1, 2.
fn batch_messages() -> [Sent; 3] {
    [
        Sent {
            payload: b"batch message 0 ".repeat(8),
            partition_key: Some("key-a"),
            ordering_key: None,
            properties: &[("idx", "0")],
            event_time_ms: Some(EVENT_TIMESTAMP_MS),
        },
        Sent {
            payload: b"batch message 1 ".repeat(8),
            partition_key: Some("key-b"),
            ordering_key: Some(b"order-b"),
            properties: &[("idx", "1"), ("kind", "second")],
            event_time_ms: Some(EVENT_TIMESTAMP_MS + 1),
        },
        Sent {
            payload: b"batch message 2".to_vec(),
            partition_key: None,
            ordering_key: None,
            properties: &[],
            event_time_ms: None,
        },
    ]
}

const COMPRESSIONS: &[(&str, CompressionType)] = &[
    ("none", CompressionType::None),
    ("lz4", CompressionType::Lz4),
    ("zlib", CompressionType::Zlib),
    ("zstd", CompressionType::Zstd),
    ("snappy", CompressionType::Snappy),
];

fn key_values(pairs: &[(&str, &str)]) -> Vec<KeyValue> {
    pairs
        .iter()
        .map(|(key, value)| KeyValue {
            key: (*key).to_owned(),
            value: (*value).to_owned(),
        })
        .collect()
}

// ----------------------------------------------------------------------------
// The manifest: `[file.bin]` sections of `key = value` lines.
// ----------------------------------------------------------------------------

struct Manifest {
    global: BTreeMap<String, String>,
    sections: BTreeMap<String, BTreeMap<String, String>>,
}

impl Manifest {
    fn load() -> Manifest {
        let text = std::fs::read_to_string(Path::new(GOLDEN_DIR).join("MANIFEST.txt")).unwrap();
        let mut manifest = Manifest {
            global: BTreeMap::new(),
            sections: BTreeMap::new(),
        };
        let mut section: Option<String> = None;
        for line in text.lines() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
                manifest.sections.insert(name.to_owned(), BTreeMap::new());
                section = Some(name.to_owned());
                continue;
            }
            let (key, value) = line.split_once(" = ").unwrap();
            // Values never contain "  #"; it starts the `# observed` remark.
            let value = value.split("  #").next().unwrap().trim().to_owned();
            match &section {
                Some(name) => manifest.sections.get_mut(name).unwrap(),
                None => &mut manifest.global,
            }
            .insert(key.trim().to_owned(), value);
        }
        manifest
    }

    fn get(&self, file: &str, key: &str) -> &str {
        self.sections
            .get(file)
            .and_then(|section| section.get(key))
            .unwrap_or_else(|| panic!("MANIFEST.txt has no `{key}` in [{file}]"))
    }
}

// ----------------------------------------------------------------------------
// The one boundary helper: read a golden file and decode it.
// ----------------------------------------------------------------------------

struct Golden {
    name: String,
    raw: Bytes,
    frame: Frame,
}

/// Decodes `name` with a fresh `FrameDecoder`: the whole file must be exactly
/// one frame, and fed in two pieces cut at every offset it must decode only
/// once complete, to the same command.
fn decode_golden(name: &str) -> Golden {
    let raw = Bytes::from(std::fs::read(Path::new(GOLDEN_DIR).join(name)).unwrap());
    let mut buf = BytesMut::from(&raw[..]);
    let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT_BYTES);
    let frame = decoder
        .decode(&mut buf)
        .unwrap_or_else(|e| panic!("{name}: {e}"))
        .unwrap_or_else(|| panic!("{name}: incomplete frame"));
    assert!(buf.is_empty(), "{name}: {} trailing bytes", buf.len());
    let whole = decode_frame(raw.clone(), FRAME_SIZE_MAX_DEFAULT_BYTES).unwrap();
    assert_eq!(whole.command, frame.command, "{name}: decode_frame");

    for cut in 0..raw.len() {
        let mut decoder = FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT_BYTES);
        let mut buf = BytesMut::from(&raw[..cut]);
        assert!(
            decoder.decode(&mut buf).unwrap().is_none(),
            "{name}: decoded from {cut} bytes"
        );
        buf.extend_from_slice(&raw[cut..]);
        let again = decoder.decode(&mut buf).unwrap().unwrap();
        assert_eq!(again.command, frame.command, "{name}: cut at {cut}");
        assert!(buf.is_empty());
    }
    Golden {
        name: name.to_owned(),
        raw,
        frame,
    }
}

/// Byte equality with a readable failure: the first differing offset and both
/// sides in hex.
fn assert_bytes_eq(what: &str, got: &[u8], want: &[u8]) {
    if got == want {
        return;
    }
    let first_diff = got
        .iter()
        .zip(want)
        .position(|(a, b)| a != b)
        .unwrap_or(got.len().min(want.len()));
    panic!(
        "{what}: re-encoded bytes differ at offset {first_diff} (got {} bytes, captured {})\n got: {}\nwant: {}",
        got.len(),
        want.len(),
        hex(got),
        hex(want)
    );
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// The BaseCommand bytes of a captured frame: `[totalSize][commandSize][command]...`.
fn command_bytes(raw: &[u8]) -> &[u8] {
    let command_size = u32::from_be_bytes(raw[4..8].try_into().unwrap()) as usize;
    &raw[8..8 + command_size]
}

/// For a simple (payload-less) command: the decoded command must equal
/// `expected` exactly, and both it and `expected` re-encode to the file's bytes.
fn check_simple(golden: &Golden, command_type: Type, expected: BaseCommand) {
    let name = &golden.name;
    assert_eq!(golden.frame.command_type(), Some(command_type), "{name}");
    assert!(golden.frame.payload.is_none(), "{name}");
    assert_eq!(golden.frame.command, expected, "{name}");
    assert_bytes_eq(
        &format!("{name} (BaseCommand)"),
        &golden.frame.command.to_base_command().encode_to_vec(),
        command_bytes(&golden.raw),
    );
    for command in [&golden.frame.command.to_base_command(), &expected] {
        let mut buf = BytesMut::new();
        encode_command(command, &mut buf);
        assert_bytes_eq(name, &buf, &golden.raw);
    }
}

// ----------------------------------------------------------------------------
// Tests.
// ----------------------------------------------------------------------------

/// Every file named by a test, in the order capture.py writes them.
fn all_golden_files() -> Vec<String> {
    let mut files: Vec<String> = [
        "connect.bin",
        "partitioned_metadata.bin",
        "lookup.bin",
        "producer.bin",
        "close_producer.bin",
    ]
    .iter()
    .map(|s| (*s).to_owned())
    .collect();
    for (tag, _) in COMPRESSIONS {
        for (suffix, _) in nobatch_messages() {
            files.push(format!("send_nobatch_{tag}{suffix}.bin"));
        }
        files.push(format!("send_batch_{tag}.bin"));
    }
    files
}

#[test]
fn manifest_and_directory_list_exactly_the_checked_files() {
    let manifest = Manifest::load();
    let mut on_disk: Vec<String> = std::fs::read_dir(GOLDEN_DIR)
        .unwrap()
        .map(|entry| entry.unwrap().file_name().into_string().unwrap())
        .filter(|name| name.ends_with(".bin"))
        .collect();
    on_disk.sort();
    let mut checked = all_golden_files();
    checked.sort();
    let listed: Vec<String> = manifest.sections.keys().cloned().collect();
    assert_eq!(
        on_disk, checked,
        "a .bin file no test checks, or a missing one"
    );
    assert_eq!(listed, checked, "MANIFEST.txt sections");
    assert!(manifest.global.contains_key("pulsar_client_pypi_version"));
}

#[test]
fn connect() {
    let manifest = Manifest::load();
    let golden = decode_golden("connect.bin");
    let client_version = manifest.get("connect.bin", "client_version");
    assert!(
        client_version.starts_with("Pulsar-CPP-v"),
        "{client_version}"
    );
    // The C++ client 4.2 advertises protocol v20 and FeatureFlags {1, 2}
    // (auth refresh, broker entry metadata), with auth_method_name "none".
    let expected = proto::CommandConnect {
        client_version: client_version.to_owned(),
        protocol_version: Some(20),
        auth_method_name: Some("none".to_owned()),
        feature_flags: Some(FeatureFlags {
            supports_auth_refresh: Some(true),
            supports_broker_entry_metadata: Some(true),
            ..FeatureFlags::default()
        }),
        ..proto::CommandConnect::default()
    };
    assert_eq!(
        manifest.get("connect.bin", "protocol_version"),
        "20",
        "manifest"
    );
    check_simple(&golden, Type::Connect, BaseCommand::from(expected));
}

#[test]
fn partitioned_metadata() {
    let golden = decode_golden("partitioned_metadata.bin");
    let expected = proto::CommandPartitionedTopicMetadata {
        topic: format!("{TOPIC_PREFIX}nobatch-none"),
        request_id: 1,
        ..Default::default()
    };
    check_simple(
        &golden,
        Type::PartitionedMetadata,
        BaseCommand::from(expected),
    );
}

#[test]
fn lookup() {
    let golden = decode_golden("lookup.bin");
    // The C++ client always sends authoritative=false and an empty
    // advertised_listener_name.
    let expected = proto::CommandLookupTopic {
        topic: format!("{TOPIC_PREFIX}nobatch-none"),
        request_id: 2,
        authoritative: Some(false),
        advertised_listener_name: Some(String::new()),
        ..Default::default()
    };
    check_simple(&golden, Type::Lookup, BaseCommand::from(expected));
}

#[test]
fn producer() {
    let golden = decode_golden("producer.bin");
    // No schema field: the C++ client sends none for the default bytes schema.
    let expected = proto::CommandProducer {
        topic: format!("{TOPIC_PREFIX}nobatch-none"),
        producer_id: PRODUCER_ID,
        request_id: 0,
        producer_name: Some("golden-nobatch-none".to_owned()),
        encrypted: Some(false),
        metadata: key_values(PRODUCER_PROPERTIES),
        epoch: Some(0),
        user_provided_producer_name: Some(true),
        producer_access_mode: Some(proto::ProducerAccessMode::Shared as i32),
        ..Default::default()
    };
    check_simple(&golden, Type::Producer, BaseCommand::from(expected));
}

#[test]
fn close_producer() {
    let golden = decode_golden("close_producer.bin");
    let expected = proto::CommandCloseProducer {
        producer_id: PRODUCER_ID,
        request_id: 1,
        ..Default::default()
    };
    check_simple(&golden, Type::CloseProducer, BaseCommand::from(expected));
}

/// What one captured SEND must hold.
struct ExpectedSend {
    file: String,
    producer_name: String,
    compression: CompressionType,
    sequence_id: u64,
    /// The uncompressed payload: the message, or the whole batch.
    messages: Vec<Sent>,
    batched: bool,
}

fn expected_sends() -> Vec<ExpectedSend> {
    let mut out = Vec::new();
    for &(tag, compression) in COMPRESSIONS {
        for (sequence_id, (suffix, sent)) in (0u64..).zip(nobatch_messages()) {
            out.push(ExpectedSend {
                file: format!("send_nobatch_{tag}{suffix}.bin"),
                producer_name: format!("golden-nobatch-{tag}"),
                compression,
                sequence_id,
                messages: vec![sent],
                batched: false,
            });
        }
        out.push(ExpectedSend {
            file: format!("send_batch_{tag}.bin"),
            producer_name: format!("golden-batch-{tag}"),
            compression,
            sequence_id: 0,
            messages: batch_messages().into(),
            batched: true,
        });
    }
    out
}

/// The metadata the C++ client writes for `send`. It takes partition_key,
/// ordering_key, properties and event_time from the message when unbatched, and
/// only partition_key from the first message for a batch (the rest is per
/// message, in SingleMessageMetadata). It sets compression and
/// uncompressed_size only when compressing, and num_messages_in_batch only for
/// batches. Payloads are compressed whatever the gain (a 19-byte message grows).
fn expected_metadata(
    send: &ExpectedSend,
    publish_time_ms: u64,
    uncompressed_bytes: usize,
) -> MessageMetadata {
    let first = &send.messages[0];
    let compressed = send.compression != CompressionType::None;
    let mut metadata = MessageMetadata {
        producer_name: send.producer_name.clone(),
        sequence_id: send.sequence_id,
        publish_time: publish_time_ms,
        partition_key: first.partition_key.map(str::to_owned),
        compression: compressed.then_some(send.compression as i32),
        uncompressed_size: compressed.then_some(uncompressed_bytes as u32),
        ..Default::default()
    };
    if send.batched {
        metadata.num_messages_in_batch = Some(send.messages.len() as i32);
    } else {
        metadata.properties = key_values(first.properties);
        metadata.ordering_key = first.ordering_key.map(Bytes::from_static);
        metadata.event_time = first.event_time_ms;
    }
    metadata
}

#[test]
fn sends_decode_to_what_the_client_was_asked_to_send() {
    let manifest = Manifest::load();
    for send in expected_sends() {
        let golden = decode_golden(&send.file);
        let name = &send.file;
        assert_eq!(golden.frame.command_type(), Some(Type::Send), "{name}");

        // The command: C++ sets num_messages only for batches and never
        // highest_sequence_id, txn ids, is_chunk or marker.
        let expected_command = BaseCommand::from(proto::CommandSend {
            producer_id: PRODUCER_ID,
            sequence_id: send.sequence_id,
            num_messages: send.batched.then_some(send.messages.len() as i32),
            ..Default::default()
        });
        assert_eq!(golden.frame.command, expected_command, "{name}");

        // Checksum: present, verified by the decoder, and equal to an
        // independent CRC32C over everything after the checksum field.
        let section = golden.frame.payload.as_ref().unwrap();
        let command_end = 8 + command_bytes(&golden.raw).len();
        assert_eq!(
            &golden.raw[command_end..command_end + 2],
            &[0x0e, 0x01],
            "{name}"
        );
        let crc_on_wire = u32::from_be_bytes(
            golden.raw[command_end + 2..command_end + 6]
                .try_into()
                .unwrap(),
        );
        assert_eq!(
            crc_on_wire,
            crc32c::crc32c(&golden.raw[command_end + 6..]),
            "{name}"
        );
        assert_eq!(
            section.checksum(),
            Checksum::Verified(crc_on_wire),
            "{name}"
        );
        assert_bytes_eq(name, &section.entry_verbatim(), &golden.raw[command_end..]);
        assert_bytes_eq(name, &section.stored_entry(), &golden.raw[command_end..]);

        // Metadata, every field.
        let publish_time_ms: u64 = manifest.get(name, "publish_time").parse().unwrap();
        let uncompressed = expected_uncompressed_payload(&send);
        let metadata = section.metadata().unwrap();
        let expected = expected_metadata(&send, publish_time_ms, uncompressed.len());
        assert_eq!(metadata, &expected, "{name}");
        check_summary(name, section, metadata);
        let payload: Bytes = section.payload();
        assert_bytes_eq(name, &payload, section.payload_slice());
        assert_eq!(
            manifest.get(name, "payload_bytes_on_wire"),
            payload.len().to_string(),
            "{name}"
        );
        if send.compression == CompressionType::None {
            assert_bytes_eq(name, &payload, &uncompressed);
        }

        // Decompress with our codec: the exact bytes the client compressed.
        let decompressed = decompress(
            send.compression,
            &payload,
            metadata.uncompressed_size.unwrap_or(0) as usize,
            FRAME_SIZE_MAX_DEFAULT_BYTES,
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        assert_bytes_eq(
            &format!("{name} (decompressed)"),
            &decompressed,
            &uncompressed,
        );
        check_our_compression(name, send.compression, &uncompressed, &payload);

        if send.batched {
            check_batch(&send, &decompressed);
        }

        // Re-encode: metadata alone, then the whole frame from the decoded
        // parts, then from the expected values (payload bytes as captured:
        // compressors need not agree byte for byte).
        assert_bytes_eq(
            &format!("{name} (MessageMetadata)"),
            &metadata.encode_to_vec(),
            &section.metadata_bytes(),
        );
        for (what, command, metadata) in [
            ("decoded", &golden.frame.command.to_base_command(), metadata),
            ("expected", &expected_command, &expected),
        ] {
            let mut buf = BytesMut::new();
            encode_payload_frame(command, metadata, &payload, &mut buf);
            assert_bytes_eq(&format!("{name} (from {what})"), &buf, &golden.raw);
        }

        // A flipped payload bit is a checksum error that still names the command.
        let mut corrupt = BytesMut::from(&golden.raw[..]);
        let last = corrupt.len() - 1;
        corrupt[last] ^= 0x01;
        match FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT_BYTES).decode(&mut corrupt) {
            Err(WireError::ChecksumMismatch {
                command: Some(command),
                expected,
                ..
            }) => {
                assert_eq!(command, expected_command, "{name}");
                assert_eq!(expected, crc_on_wire, "{name}");
            }
            other => panic!("{name}: corrupted frame gave {other:?}"),
        }
    }
}

/// The summary scanned without decoding (and the key accessors built on it)
/// agrees with the full decode.
fn check_summary(name: &str, section: &PayloadSection, metadata: &MessageMetadata) {
    assert_eq!(
        section.producer_name(),
        Some(metadata.producer_name.as_bytes()),
        "{name}"
    );
    assert_eq!(
        section.partition_key(),
        metadata.partition_key.as_deref().map(str::as_bytes),
        "{name}"
    );
    assert_eq!(
        section.ordering_key(),
        metadata.ordering_key.as_deref(),
        "{name}"
    );
    let summary = section.summary();
    assert_eq!(summary.sequence_id, Some(metadata.sequence_id), "{name}");
    assert_eq!(
        summary.publish_time_ms,
        Some(metadata.publish_time),
        "{name}"
    );
    assert_eq!(summary.compression, metadata.compression, "{name}");
    assert_eq!(
        summary.uncompressed_size, metadata.uncompressed_size,
        "{name}"
    );
    assert_eq!(
        summary.num_messages_in_batch, metadata.num_messages_in_batch,
        "{name}"
    );
    assert_eq!(summary.event_time_ms, metadata.event_time, "{name}");
    assert_eq!(
        summary.highest_sequence_id, metadata.highest_sequence_id,
        "{name}"
    );
    assert_eq!(summary.deliver_at_time_ms, None, "{name}");
    assert_eq!(summary.marker_type, None, "{name}");
    assert_eq!(summary.num_chunks_from_msg, None, "{name}");
    assert_eq!(summary.chunk_id, None, "{name}");
    assert!(summary.has_required_fields(), "{name}");
    assert_eq!(
        summary.message_count(),
        metadata.num_messages_in_batch.unwrap_or(1),
        "{name}"
    );
}

/// The payload before compression: the message itself, or for a batch the
/// records `[u32 BE size][SingleMessageMetadata][payload]` as the C++ client
/// builds them (hand-built here, independently of vela_wire::batch).
fn expected_uncompressed_payload(send: &ExpectedSend) -> Vec<u8> {
    if !send.batched {
        return send.messages[0].payload.clone();
    }
    let mut out = Vec::new();
    for (sequence_id, sent) in (0u64..).zip(&send.messages) {
        let single = expected_single_metadata(sent, sequence_id);
        let bytes = single.encode_to_vec();
        out.extend_from_slice(&(bytes.len() as u32).to_be_bytes());
        out.extend_from_slice(&bytes);
        out.extend_from_slice(&sent.payload);
    }
    out
}

/// The per-message metadata the C++ client writes into a batch: properties,
/// partition_key, payload_size, event_time, ordering_key and its sequence_id
/// (always present, from 0).
fn expected_single_metadata(sent: &Sent, sequence_id: u64) -> proto::SingleMessageMetadata {
    proto::SingleMessageMetadata {
        properties: key_values(sent.properties),
        partition_key: sent.partition_key.map(str::to_owned),
        payload_size: sent.payload.len() as i32,
        event_time: sent.event_time_ms,
        ordering_key: sent.ordering_key.map(Bytes::from_static),
        sequence_id: Some(sequence_id),
        ..Default::default()
    }
}

/// Splits the decompressed batch with vela_wire::batch: every record's
/// SingleMessageMetadata (whole struct) and payload as sent, and build_batch
/// of both the parsed and the expected records gives the same bytes back.
fn check_batch(send: &ExpectedSend, decompressed: &Bytes) {
    let name = &send.file;
    let count = send.messages.len() as i32;
    let parsed = parse_batch(decompressed, count).unwrap_or_else(|e| panic!("{name}: {e}"));
    let expected: Vec<BatchMessage> = (0u64..)
        .zip(&send.messages)
        .map(|(sequence_id, sent)| {
            BatchMessage::new(
                expected_single_metadata(sent, sequence_id),
                Bytes::from(sent.payload.clone()),
            )
        })
        .collect();
    assert_eq!(parsed.len(), expected.len(), "{name}");
    for (index, (got, want)) in parsed.iter().zip(&expected).enumerate() {
        assert_eq!(got.metadata, want.metadata, "{name} message {index}");
        assert_bytes_eq(
            &format!("{name} message {index}"),
            &got.payload,
            &want.payload,
        );
    }
    for (what, messages) in [("parsed", &parsed), ("expected", &expected)] {
        let mut buf = BytesMut::new();
        build_batch(messages, &mut buf);
        assert_bytes_eq(&format!("{name} (batch from {what})"), &buf, decompressed);
    }
    // One record fewer than announced leaves trailing bytes; one more runs out.
    assert!(parse_batch(decompressed, count - 1).is_err(), "{name}");
    assert!(parse_batch(decompressed, count + 1).is_err(), "{name}");
}

/// Our compress() of what the client compressed must come back through our
/// decompress() and through the reference decoder of the format the clients
/// use (raw LZ4 block without size prefix, zlib stream, zstd frame, raw
/// snappy). Byte-identical output to the C++ client is not required: LZ4,
/// zlib and zstd encoders may choose different matches or levels.
fn check_our_compression(name: &str, codec: CompressionType, input: &[u8], captured: &[u8]) {
    let ours = compress(codec, input).unwrap();
    let back = decompress(codec, &ours, input.len(), FRAME_SIZE_MAX_DEFAULT_BYTES).unwrap();
    assert_bytes_eq(&format!("{name} (our compress round trip)"), &back, input);
    let reference: Vec<u8> = match codec {
        CompressionType::None => {
            assert_bytes_eq(name, &ours, captured);
            ours.to_vec()
        }
        CompressionType::Lz4 => lz4_flex::block::decompress(&ours, input.len()).unwrap(),
        CompressionType::Zlib => {
            let mut out = Vec::new();
            std::io::Read::read_to_end(&mut flate2::read::ZlibDecoder::new(&ours[..]), &mut out)
                .unwrap();
            out
        }
        CompressionType::Zstd => zstd::stream::decode_all(&ours[..]).unwrap(),
        CompressionType::Snappy => snap::raw::Decoder::new().decompress_vec(&ours).unwrap(),
    };
    assert_bytes_eq(
        &format!("{name} (our compress, reference decoder)"),
        &reference,
        input,
    );
}
