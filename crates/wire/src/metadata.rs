//! A fast, allocation-free scan of `MessageMetadata` bytes.
//!
//! The broker needs a handful of metadata fields per message (batch size,
//! sequence ids, keys for Key_Shared, delivery time) on hot paths; a full prost
//! decode allocates strings and vectors it never reads. [`MetadataSummary::scan`]
//! walks the protobuf once, checks its structure (tags, varints, lengths within
//! bounds) and keeps only those fields; keys are [`ByteSpan`]s into the input.
//! The frame decoder runs the same walk, keeping nothing, as its check of each
//! payload section's metadata, so a summary scanned later cannot fail.
//!
//! Owns: the hand-written protobuf reader (`ProtoReader`). Never allocates
//! and never panics on malformed input.

use crate::error::WireError;

/// Protobuf wire types (the low 3 bits of a tag).
const WIRE_VARINT: u32 = 0;
const WIRE_FIXED64: u32 = 1;
const WIRE_LEN: u32 = 2;
const WIRE_FIXED32: u32 = 5;

/// A varint is at most 10 bytes (64 bits in 7-bit groups).
const VARINT_BYTES_MAX: usize = 10;

/// Why bytes are malformed. The reader's errors are this small value, not a
/// `WireError`, so that the hot loop keeps everything in registers; callers
/// turn it into [`WireError::MalformedProtobuf`] at the edge.
pub(crate) type Malformed = &'static str;

#[cold]
fn malformed(reason: Malformed) -> WireError {
    WireError::MalformedProtobuf {
        what: "MessageMetadata",
        reason,
    }
}

/// A varint of two or more bytes: (value, bytes read).
#[inline(always)]
fn varint_multi(input: &[u8]) -> Result<(u64, usize), Malformed> {
    let mut value: u64 = 0;
    for index in 0..VARINT_BYTES_MAX {
        let Some(&byte) = input.get(index) else {
            return Err("varint runs past the end");
        };
        if index == VARINT_BYTES_MAX - 1 && byte > 1 {
            return Err("varint overflows 64 bits");
        }
        value |= u64::from(byte & 0x7f) << (7 * index);
        if byte < 0x80 {
            return Ok((value, index + 1));
        }
    }
    Err("varint longer than 10 bytes")
}

/// A cursor over protobuf bytes that checks every read.
///
/// Every method is inlined and nothing takes the reader's address out of
/// line: a reader in memory would make each byte read wait on a store and a
/// reload.
#[derive(Debug)]
pub(crate) struct ProtoReader<'a> {
    bytes: &'a [u8],
    offset: usize,
}

impl<'a> ProtoReader<'a> {
    pub(crate) fn new(bytes: &'a [u8]) -> Self {
        ProtoReader { bytes, offset: 0 }
    }

    #[inline(always)]
    pub(crate) fn is_empty(&self) -> bool {
        self.offset >= self.bytes.len()
    }

    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    #[inline(always)]
    pub(crate) fn varint(&mut self) -> Result<u64, Malformed> {
        // Fast path: one-byte varint.
        if let Some(&byte) = self.bytes.get(self.offset)
            && byte < 0x80
        {
            self.offset += 1;
            return Ok(u64::from(byte));
        }
        let (value, len) = varint_multi(self.bytes.get(self.offset..).unwrap_or_default())?;
        self.offset += len;
        Ok(value)
    }

    /// Reads a tag; returns (field number, wire type).
    #[inline(always)]
    pub(crate) fn tag(&mut self) -> Result<(u32, u32), Malformed> {
        let key = self.varint()?;
        let Ok(key) = u32::try_from(key) else {
            return Err("tag exceeds 32 bits");
        };
        let field = key >> 3;
        if field == 0 {
            return Err("field number 0");
        }
        Ok((field, key & 7))
    }

    /// Reads a length-delimited field's bounds (start, end) within the input.
    #[inline(always)]
    pub(crate) fn len_delimited(&mut self) -> Result<(usize, usize), Malformed> {
        let len = self.varint()?;
        let remaining = self.bytes.len() - self.offset;
        if len > remaining as u64 {
            return Err("length runs past the end");
        }
        let start = self.offset;
        self.offset += len as usize; // len <= remaining, fits in usize
        Ok((start, self.offset))
    }

    #[inline(always)]
    fn fixed(&mut self, size: usize) -> Result<(), Malformed> {
        if self.bytes.len() - self.offset < size {
            return Err("fixed-width value runs past the end");
        }
        self.offset += size;
        Ok(())
    }

    /// Skips a field of `wire_type` whose tag has been read.
    #[inline(always)]
    pub(crate) fn skip(&mut self, wire_type: u32) -> Result<(), Malformed> {
        match wire_type {
            WIRE_VARINT => self.varint().map(drop),
            WIRE_FIXED64 => self.fixed(8),
            WIRE_LEN => self.len_delimited().map(drop),
            WIRE_FIXED32 => self.fixed(4),
            _ => Err("unsupported wire type (groups are not used by Pulsar)"),
        }
    }

    /// Reads a varint field, checking the wire type.
    #[inline(always)]
    pub(crate) fn varint_field(&mut self, wire_type: u32) -> Result<u64, Malformed> {
        if wire_type != WIRE_VARINT {
            return Err("expected a varint field");
        }
        self.varint()
    }

    /// Reads a length-delimited field, checking the wire type.
    #[inline(always)]
    pub(crate) fn len_field(&mut self, wire_type: u32) -> Result<(usize, usize), Malformed> {
        if wire_type != WIRE_LEN {
            return Err("expected a length-delimited field");
        }
        self.len_delimited()
    }
}

/// Where a length-delimited field's bytes sit inside the metadata bytes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ByteSpan {
    /// Offset of the first byte.
    pub start: u32,
    /// Offset one past the last byte.
    pub end: u32,
}

impl ByteSpan {
    /// The span's bytes within `metadata` (the bytes that were scanned);
    /// empty if `metadata` is a different, shorter buffer.
    pub fn get<'a>(&self, metadata: &'a [u8]) -> &'a [u8] {
        metadata
            .get(self.start as usize..self.end as usize)
            .unwrap_or(&[])
    }

    fn new((start, end): (usize, usize)) -> ByteSpan {
        // Metadata lives inside a frame, bounded far below u32::MAX.
        ByteSpan {
            start: start as u32,
            end: end as u32,
        }
    }
}

/// The MessageMetadata fields the broker reads per message, scanned without
/// allocating. Absent fields are `None`; proto defaults are not applied so
/// that presence stays visible (a batch of one has
/// `num_messages_in_batch == Some(1)`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MetadataSummary {
    /// Field 1 (required), raw UTF-8 bytes, not validated.
    pub producer_name: Option<ByteSpan>,
    /// Field 2 (required): for a batch, the lowest sequence id.
    pub sequence_id: Option<u64>,
    /// Field 3 (required): client clock, ms.
    pub publish_time_ms: Option<u64>,
    /// Field 6: the message key.
    pub partition_key: Option<ByteSpan>,
    /// Field 8: a `CompressionType` value (unknown values kept as is).
    pub compression: Option<i32>,
    /// Field 9.
    pub uncompressed_size: Option<u32>,
    /// Field 11: present iff the payload is in batch format.
    pub num_messages_in_batch: Option<i32>,
    /// Field 12.
    pub event_time_ms: Option<u64>,
    /// Field 18: Key_Shared key, wins over partition_key.
    pub ordering_key: Option<ByteSpan>,
    /// Field 19: absolute delivery time, ms.
    pub deliver_at_time_ms: Option<i64>,
    /// Field 20: internal marker messages.
    pub marker_type: Option<i32>,
    /// Field 22: the transaction's least significant bits.
    pub txnid_least_bits: Option<u64>,
    /// Field 23: the transaction's most significant bits (its coordinator).
    pub txnid_most_bits: Option<u64>,
    /// Field 24: for a batch, the highest sequence id.
    pub highest_sequence_id: Option<u64>,
    /// Field 27.
    pub num_chunks_from_msg: Option<i32>,
    /// Field 29.
    pub chunk_id: Option<i32>,
}

/// Checks MessageMetadata bytes exactly as [`MetadataSummary::scan`] does
/// (the same walk: a payload section's summary, scanned later, cannot fail),
/// keeping nothing: the frame decoder's per-SEND check.
#[inline(always)]
pub(crate) fn check(metadata: &[u8]) -> Result<(), WireError> {
    walk(metadata, |_, _| {}, |_, _| {}).map_err(malformed)
}

/// [`check`] as a bool, for the SEND fast path (which leaves errors to the
/// general path).
#[inline(always)]
pub(crate) fn is_well_formed(metadata: &[u8]) -> bool {
    walk(metadata, |_, _| {}, |_, _| {}).is_ok()
}

/// Walks MessageMetadata bytes once, checking their structure (tags, varints,
/// lengths within bounds, the wire type of each field the summary keeps) and
/// handing each kept field to `on_varint` or `on_bytes`. Inlined into each
/// caller, so that `check` compiles to the bare walk.
#[inline(always)]
fn walk(
    metadata: &[u8],
    mut on_varint: impl FnMut(u32, u64),
    mut on_bytes: impl FnMut(u32, ByteSpan),
) -> Result<(), Malformed> {
    debug_assert!(metadata.len() <= crate::FRAME_SIZE_LIMIT_BYTES);
    let mut reader = ProtoReader::new(metadata);
    while !reader.is_empty() {
        let (field, wire_type) = reader.tag()?;
        match field {
            1 | 6 | 18 => on_bytes(field, ByteSpan::new(reader.len_field(wire_type)?)),
            2 | 3 | 8 | 9 | 11 | 12 | 19 | 20 | 22 | 23 | 24 | 27 | 29 => {
                on_varint(field, reader.varint_field(wire_type)?);
            }
            _ => reader.skip(wire_type)?,
        }
    }
    debug_assert_eq!(reader.offset(), metadata.len());
    Ok(())
}

impl MetadataSummary {
    /// Scans MessageMetadata bytes (at most [`crate::FRAME_SIZE_LIMIT_BYTES`] long).
    pub fn scan(metadata: &[u8]) -> Result<MetadataSummary, WireError> {
        let mut summary = MetadataSummary::default();
        let mut spans = [None; 3];
        walk(
            metadata,
            |field, value| match field {
                2 => summary.sequence_id = Some(value),
                3 => summary.publish_time_ms = Some(value),
                // int32/enum: protobuf truncates the varint to 32 bits.
                8 => summary.compression = Some(value as i32),
                9 => summary.uncompressed_size = Some(value as u32),
                11 => summary.num_messages_in_batch = Some(value as i32),
                12 => summary.event_time_ms = Some(value),
                19 => summary.deliver_at_time_ms = Some(value as i64),
                20 => summary.marker_type = Some(value as i32),
                22 => summary.txnid_least_bits = Some(value),
                23 => summary.txnid_most_bits = Some(value),
                24 => summary.highest_sequence_id = Some(value),
                27 => summary.num_chunks_from_msg = Some(value as i32),
                29 => summary.chunk_id = Some(value as i32),
                _ => debug_assert!(false, "walk passed varint field {field}"),
            },
            |field, span| match field {
                1 => spans[0] = Some(span),
                6 => spans[1] = Some(span),
                _ => spans[2] = Some(span),
            },
        )
        .map_err(malformed)?;
        [
            summary.producer_name,
            summary.partition_key,
            summary.ordering_key,
        ] = spans;
        Ok(summary)
    }

    /// True when the three required fields (producer_name, sequence_id,
    /// publish_time) are present; clients reject metadata without them.
    pub fn has_required_fields(&self) -> bool {
        self.producer_name.is_some() && self.sequence_id.is_some() && self.publish_time_ms.is_some()
    }

    /// Messages in the entry: `num_messages_in_batch`, or 1 when absent.
    pub fn message_count(&self) -> i32 {
        self.num_messages_in_batch.unwrap_or(1)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use bytes::Bytes;
    use prost::Message;

    use super::*;
    use crate::proto::{CompressionType, MessageMetadata};

    #[test]
    fn scan_matches_prost() {
        let metadata = MessageMetadata {
            producer_name: "p".into(),
            sequence_id: 7,
            publish_time: 1_700_000_000_000,
            partition_key: Some("key".into()),
            compression: Some(CompressionType::Lz4 as i32),
            uncompressed_size: Some(1234),
            num_messages_in_batch: Some(1),
            ordering_key: Some(Bytes::from_static(b"ok")),
            deliver_at_time: Some(-5),
            highest_sequence_id: Some(9),
            chunk_id: Some(2),
            num_chunks_from_msg: Some(3),
            marker_type: Some(4),
            txnid_least_bits: Some(300),
            txnid_most_bits: Some(2),
            event_time: Some(11),
            properties: vec![crate::proto::KeyValue {
                key: "a".into(),
                value: "b".into(),
            }],
            ..Default::default()
        };
        let bytes = Bytes::from(metadata.encode_to_vec());
        let summary = MetadataSummary::scan(&bytes).unwrap();
        assert_eq!(summary.producer_name.unwrap().get(&bytes), b"p");
        assert_eq!(summary.sequence_id, Some(7));
        assert_eq!(summary.publish_time_ms, Some(1_700_000_000_000));
        assert_eq!(summary.partition_key.unwrap().get(&bytes), b"key");
        assert_eq!(summary.compression, Some(1));
        assert_eq!(summary.uncompressed_size, Some(1234));
        assert_eq!(summary.num_messages_in_batch, Some(1));
        assert_eq!(summary.ordering_key.unwrap().get(&bytes), b"ok");
        assert_eq!(summary.deliver_at_time_ms, Some(-5));
        assert_eq!(summary.highest_sequence_id, Some(9));
        assert_eq!(summary.chunk_id, Some(2));
        assert_eq!(summary.num_chunks_from_msg, Some(3));
        assert_eq!(summary.marker_type, Some(4));
        assert_eq!(summary.txnid_least_bits, Some(300));
        assert_eq!(summary.txnid_most_bits, Some(2));
        assert_eq!(summary.event_time_ms, Some(11));
        assert!(summary.has_required_fields());
        assert_eq!(summary.message_count(), 1);
    }

    #[test]
    fn scan_rejects_malformed() {
        let cases: &[&[u8]] = &[
            &[0x08],             // varint cut off
            &[0x0a, 0x05, b'a'], // length past the end
            &[0x00, 0x01],       // field number 0
            &[0x0b],             // group wire type
            &[
                0x10, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f,
            ], // 64-bit overflow
            &[0x0d, 0x01, 0x02], // fixed32 cut off
            &[0x12, 0x01],       // field 2 with the wrong wire type
        ];
        for case in cases {
            let bytes = Bytes::copy_from_slice(case);
            assert!(
                matches!(
                    MetadataSummary::scan(&bytes),
                    Err(WireError::MalformedProtobuf { .. })
                ),
                "{case:?}"
            );
        }
    }
}
