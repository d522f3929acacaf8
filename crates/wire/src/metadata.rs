//! A fast, allocation-free scan of `MessageMetadata` bytes.
//!
//! The broker needs a handful of metadata fields per message (batch size,
//! sequence ids, keys for Key_Shared, delivery time) on hot paths; a full prost
//! decode allocates strings and vectors it never reads. [`MetadataSummary::scan`]
//! walks the protobuf once, checks its structure (tags, varints, lengths within
//! bounds) and keeps only those fields; keys are [`ByteSpan`]s into the input.
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

/// A cursor over protobuf bytes that checks every read.
#[derive(Debug)]
pub(crate) struct ProtoReader<'a> {
    bytes: &'a [u8],
    offset: usize,
    what: &'static str,
}

impl<'a> ProtoReader<'a> {
    pub(crate) fn new(bytes: &'a [u8], what: &'static str) -> Self {
        ProtoReader {
            bytes,
            offset: 0,
            what,
        }
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.offset >= self.bytes.len()
    }

    pub(crate) fn offset(&self) -> usize {
        self.offset
    }

    fn malformed(&self, reason: &'static str) -> WireError {
        WireError::MalformedProtobuf {
            what: self.what,
            reason,
        }
    }

    #[inline]
    pub(crate) fn varint(&mut self) -> Result<u64, WireError> {
        // Fast path: one-byte varint.
        if let Some(&byte) = self.bytes.get(self.offset)
            && byte < 0x80
        {
            self.offset += 1;
            return Ok(u64::from(byte));
        }
        let mut value: u64 = 0;
        let mut index = 0;
        while index < VARINT_BYTES_MAX {
            let Some(&byte) = self.bytes.get(self.offset + index) else {
                return Err(self.malformed("varint runs past the end"));
            };
            if index == VARINT_BYTES_MAX - 1 && byte > 1 {
                return Err(self.malformed("varint overflows 64 bits"));
            }
            value |= u64::from(byte & 0x7f) << (7 * index);
            index += 1;
            if byte < 0x80 {
                self.offset += index;
                return Ok(value);
            }
        }
        Err(self.malformed("varint longer than 10 bytes"))
    }

    /// Reads a tag; returns (field number, wire type).
    #[inline]
    pub(crate) fn tag(&mut self) -> Result<(u32, u32), WireError> {
        let key = self.varint()?;
        let Ok(key) = u32::try_from(key) else {
            return Err(self.malformed("tag exceeds 32 bits"));
        };
        let field = key >> 3;
        if field == 0 {
            return Err(self.malformed("field number 0"));
        }
        Ok((field, key & 7))
    }

    /// Reads a length-delimited field's bounds (start, end) within the input.
    #[inline]
    pub(crate) fn len_delimited(&mut self) -> Result<(usize, usize), WireError> {
        let len = self.varint()?;
        let remaining = self.bytes.len() - self.offset;
        if len > remaining as u64 {
            return Err(self.malformed("length runs past the end"));
        }
        let start = self.offset;
        self.offset += len as usize; // len <= remaining, fits in usize
        Ok((start, self.offset))
    }

    fn fixed(&mut self, size: usize) -> Result<&'a [u8], WireError> {
        let Some(slice) = self.bytes.get(self.offset..self.offset + size) else {
            return Err(self.malformed("fixed-width value runs past the end"));
        };
        self.offset += size;
        Ok(slice)
    }

    /// Skips a field of `wire_type` whose tag has been read.
    pub(crate) fn skip(&mut self, wire_type: u32) -> Result<(), WireError> {
        match wire_type {
            WIRE_VARINT => self.varint().map(drop),
            WIRE_FIXED64 => self.fixed(8).map(drop),
            WIRE_LEN => self.len_delimited().map(drop),
            WIRE_FIXED32 => self.fixed(4).map(drop),
            _ => Err(self.malformed("unsupported wire type (groups are not used by Pulsar)")),
        }
    }

    /// Reads a varint field, checking the wire type.
    #[inline]
    pub(crate) fn varint_field(&mut self, wire_type: u32) -> Result<u64, WireError> {
        if wire_type != WIRE_VARINT {
            return Err(self.malformed("expected a varint field"));
        }
        self.varint()
    }

    /// Reads a length-delimited field, checking the wire type.
    #[inline]
    pub(crate) fn len_field(&mut self, wire_type: u32) -> Result<(usize, usize), WireError> {
        if wire_type != WIRE_LEN {
            return Err(self.malformed("expected a length-delimited field"));
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
    /// Field 24: for a batch, the highest sequence id.
    pub highest_sequence_id: Option<u64>,
    /// Field 27.
    pub num_chunks_from_msg: Option<i32>,
    /// Field 29.
    pub chunk_id: Option<i32>,
}

impl MetadataSummary {
    /// Scans MessageMetadata bytes (at most [`crate::FRAME_SIZE_LIMIT_BYTES`] long).
    pub fn scan(metadata: &[u8]) -> Result<MetadataSummary, WireError> {
        debug_assert!(metadata.len() <= crate::FRAME_SIZE_LIMIT_BYTES);
        let mut summary = MetadataSummary::default();
        let mut reader = ProtoReader::new(metadata, "MessageMetadata");
        while !reader.is_empty() {
            let (field, wire_type) = reader.tag()?;
            match field {
                1 => summary.producer_name = Some(ByteSpan::new(reader.len_field(wire_type)?)),
                2 => summary.sequence_id = Some(reader.varint_field(wire_type)?),
                3 => summary.publish_time_ms = Some(reader.varint_field(wire_type)?),
                6 => summary.partition_key = Some(ByteSpan::new(reader.len_field(wire_type)?)),
                // int32/enum: protobuf truncates the varint to 32 bits.
                8 => summary.compression = Some(reader.varint_field(wire_type)? as i32),
                9 => summary.uncompressed_size = Some(reader.varint_field(wire_type)? as u32),
                11 => summary.num_messages_in_batch = Some(reader.varint_field(wire_type)? as i32),
                12 => summary.event_time_ms = Some(reader.varint_field(wire_type)?),
                18 => summary.ordering_key = Some(ByteSpan::new(reader.len_field(wire_type)?)),
                19 => summary.deliver_at_time_ms = Some(reader.varint_field(wire_type)? as i64),
                20 => summary.marker_type = Some(reader.varint_field(wire_type)? as i32),
                24 => summary.highest_sequence_id = Some(reader.varint_field(wire_type)?),
                27 => summary.num_chunks_from_msg = Some(reader.varint_field(wire_type)? as i32),
                29 => summary.chunk_id = Some(reader.varint_field(wire_type)? as i32),
                _ => reader.skip(wire_type)?,
            }
        }
        debug_assert_eq!(reader.offset(), metadata.len());
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
