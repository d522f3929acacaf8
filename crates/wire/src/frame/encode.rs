//! The frame encoders: simple and payload frames, MESSAGE headers in front
//! of a stored entry (never copied), stored entries built from metadata and
//! payload. Sizes come from data we hold (a decoded frame, a command we
//! built), so an oversized field is a bug, not input.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use super::{
    COMMAND_SIZE_BYTES, MAGIC_AND_U32_BYTES, MAGIC_BROKER_ENTRY_METADATA, MAGIC_BYTES,
    MAGIC_CRC32C, METADATA_SIZE_BYTES, TOTAL_SIZE_BYTES, peek_u16,
};
use crate::proto::{BaseCommand, BrokerEntryMetadata, MessageMetadata};

/// Converts a size we computed into a u32 length field. Our encoders are only
/// given bounded data (a decoded frame, a command we built); a size beyond
/// u32 would corrupt the stream, so it is a bug worth stopping for.
fn size_u32(size: usize) -> u32 {
    assert!(
        size <= u32::MAX as usize,
        "frame field of {size} bytes exceeds u32"
    );
    size as u32
}

/// Appends a simple frame `[totalSize][commandSize][command]` to `buf`.
pub fn encode_command(command: &BaseCommand, buf: &mut BytesMut) {
    let command_size = command.encoded_len();
    buf.reserve(TOTAL_SIZE_BYTES + COMMAND_SIZE_BYTES + command_size);
    buf.put_u32(size_u32(COMMAND_SIZE_BYTES + command_size));
    buf.put_u32(size_u32(command_size));
    command.encode_raw(buf);
}

/// Appends a payload frame (SEND, or MESSAGE in tests and clients) with
/// 0x0e01 + CRC32C: `[totalSize][commandSize][command][0x0e01][crc][metadataSize][metadata][payload]`.
pub fn encode_payload_frame(
    command: &BaseCommand,
    metadata: &MessageMetadata,
    payload: &[u8],
    buf: &mut BytesMut,
) {
    encode_payload_frame_with(command, metadata, payload.len(), buf, |buf| {
        buf.extend_from_slice(payload)
    });
}

/// `encode_payload_frame` whose payload `write_payload` appends to `buf` in
/// place (a batch built straight into its frame: no copy of the payload).
/// `payload_bytes_hint` only sizes the reservation.
pub fn encode_payload_frame_with(
    command: &BaseCommand,
    metadata: &MessageMetadata,
    payload_bytes_hint: usize,
    buf: &mut BytesMut,
    write_payload: impl FnOnce(&mut BytesMut),
) {
    let metadata_size = metadata.encoded_len();
    let command_size = command.encoded_len();
    buf.reserve(
        TOTAL_SIZE_BYTES
            + COMMAND_SIZE_BYTES
            + command_size
            + MAGIC_AND_U32_BYTES
            + METADATA_SIZE_BYTES
            + metadata_size
            + payload_bytes_hint,
    );
    let frame_start = buf.len();
    buf.put_u32(0); // total size, filled in below
    buf.put_u32(size_u32(command_size));
    command.encode_raw(buf);
    buf.put_u16(MAGIC_CRC32C);
    let checksum_offset = buf.len();
    buf.put_u32(0); // filled in below
    let covered_start = buf.len();
    buf.put_u32(size_u32(metadata_size));
    metadata.encode_raw(buf);
    write_payload(buf);
    let total_size = size_u32(buf.len() - frame_start - TOTAL_SIZE_BYTES);
    buf[frame_start..frame_start + TOTAL_SIZE_BYTES].copy_from_slice(&total_size.to_be_bytes());
    let checksum = crc32c::crc32c(&buf[covered_start..]);
    buf[checksum_offset..covered_start].copy_from_slice(&checksum.to_be_bytes());
}

/// Builds a stored entry `[0x0e01][crc][metadataSize][metadata][payload]`
/// from raw metadata bytes and a payload (one copy).
pub fn build_stored_entry(metadata_bytes: &[u8], payload: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(
        MAGIC_AND_U32_BYTES + METADATA_SIZE_BYTES + metadata_bytes.len() + payload.len(),
    );
    buf.put_u16(MAGIC_CRC32C);
    buf.put_u32(0);
    buf.put_u32(size_u32(metadata_bytes.len()));
    buf.extend_from_slice(metadata_bytes);
    buf.extend_from_slice(payload);
    let checksum = crc32c::crc32c(&buf[MAGIC_AND_U32_BYTES..]);
    buf[MAGIC_BYTES..MAGIC_AND_U32_BYTES].copy_from_slice(&checksum.to_be_bytes());
    buf.freeze()
}

/// Appends the header of a MESSAGE frame whose stored entry (`entry_len`
/// bytes, starting with 0x0e01) the caller sends right after, without copying
/// it: `[totalSize][commandSize][command]` plus, when given, the 0x0e02 block
/// (only for clients that set FeatureFlags.supports_broker_entry_metadata).
pub fn encode_message_header(
    command: &BaseCommand,
    broker_entry_metadata: Option<&BrokerEntryMetadata>,
    entry_len: usize,
    buf: &mut BytesMut,
) {
    let command_size = command.encoded_len();
    let broker_entry_metadata_size = broker_entry_metadata.map_or(0, Message::encoded_len);
    let prefix_bytes =
        broker_entry_metadata.map_or(0, |_| MAGIC_AND_U32_BYTES + broker_entry_metadata_size);
    buf.reserve(TOTAL_SIZE_BYTES + COMMAND_SIZE_BYTES + command_size + prefix_bytes);
    buf.put_u32(size_u32(
        COMMAND_SIZE_BYTES + command_size + prefix_bytes + entry_len,
    ));
    buf.put_u32(size_u32(command_size));
    command.encode_raw(buf);
    if let Some(metadata) = broker_entry_metadata {
        buf.put_u16(MAGIC_BROKER_ENTRY_METADATA);
        buf.put_u32(size_u32(broker_entry_metadata_size));
        metadata.encode_raw(buf);
    }
}

/// Appends a whole MESSAGE frame, copying `entry` into `buf` (for callers
/// that want one buffer; the dispatch path uses [`encode_message_header`]
/// and chains the entry instead).
pub fn encode_message_frame(
    command: &BaseCommand,
    broker_entry_metadata: Option<&BrokerEntryMetadata>,
    entry: &[u8],
    buf: &mut BytesMut,
) {
    debug_assert_eq!(
        peek_u16(entry, 0),
        Some(MAGIC_CRC32C),
        "stored entries start with 0x0e01"
    );
    encode_message_header(command, broker_entry_metadata, entry.len(), buf);
    buf.extend_from_slice(entry);
}

/// The header of a MESSAGE frame as its own `Bytes`, chained with the stored
/// entry: write `header` then `entry` (e.g. `header.chain(entry)` or two
/// iovecs) and the payload is never copied.
#[derive(Debug, Clone)]
pub struct MessageFrameParts {
    /// `[totalSize][commandSize][command]` and the optional 0x0e02 block.
    pub header: Bytes,
    /// The stored entry, as given.
    pub entry: Bytes,
}

impl MessageFrameParts {
    /// Builds the header for `entry` (which starts with 0x0e01).
    pub fn new(
        command: &BaseCommand,
        broker_entry_metadata: Option<&BrokerEntryMetadata>,
        entry: Bytes,
    ) -> Self {
        debug_assert_eq!(
            peek_u16(&entry, 0),
            Some(MAGIC_CRC32C),
            "stored entries start with 0x0e01"
        );
        let mut header = BytesMut::new();
        encode_message_header(command, broker_entry_metadata, entry.len(), &mut header);
        MessageFrameParts {
            header: header.freeze(),
            entry,
        }
    }

    /// Total frame length in bytes.
    pub fn len(&self) -> usize {
        self.header.len() + self.entry.len()
    }

    /// Always false: a frame has at least a header.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The frame as one `Buf` (no copy).
    pub fn into_buf(self) -> bytes::buf::Chain<Bytes, Bytes> {
        self.header.chain(self.entry)
    }
}
