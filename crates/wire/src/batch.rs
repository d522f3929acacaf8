//! The batch payload format: a message whose metadata has
//! `num_messages_in_batch` carries, after decompression, that many records
//!
//! ```text
//! [singleMetadataSize u32 BE][SingleMessageMetadata][payload_size bytes]  x count
//! ```
//!
//! Owns: parsing and building that layout. Guarantees: parsing hands out
//! `Bytes` slices (no payload copy), checks every size against the buffer and
//! preallocates at most what the buffer can hold. Never decompresses (see
//! `compression`) and never looks at the outer MessageMetadata.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message;

use crate::proto::SingleMessageMetadata;

/// Bytes of the size field in front of each record.
const RECORD_SIZE_BYTES: usize = 4;

/// The smallest record: a size field plus SingleMessageMetadata holding only
/// its required payload_size (tag + one-byte varint). Used to cap
/// preallocation by what the buffer can really hold.
const RECORD_BYTES_MIN: usize = RECORD_SIZE_BYTES + 2;

/// What a record adds to its payload in a typical batch, for sizing buffers
/// ahead of `build_batch`: the size field plus a `SingleMessageMetadata` with
/// payload size and sequence id, no keys or properties.
pub const RECORD_OVERHEAD_BYTES_HINT: usize = RECORD_SIZE_BYTES + 12;

/// One message of a batch.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchMessage {
    /// The per-message metadata (payload_size included).
    pub metadata: SingleMessageMetadata,
    /// The message's payload, a slice of the batch buffer.
    pub payload: Bytes,
}

impl BatchMessage {
    /// A message whose metadata's payload_size matches `payload`.
    pub fn new(mut metadata: SingleMessageMetadata, payload: Bytes) -> Self {
        metadata.payload_size = i32::try_from(payload.len()).unwrap_or(i32::MAX);
        BatchMessage { metadata, payload }
    }
}

/// Why a batch payload could not be parsed. `index` is the record (from 0).
#[derive(Debug, thiserror::Error)]
pub enum BatchError {
    /// num_messages_in_batch is zero or negative.
    #[error("batch count {count} is not positive")]
    CountInvalid { count: i64 },
    /// The buffer ends inside record `index`'s size field.
    #[error("batch record {index}: size field cut off ({available_bytes} bytes left)")]
    RecordTruncated {
        index: usize,
        available_bytes: usize,
    },
    /// Record `index`'s metadata size points past the end.
    #[error(
        "batch record {index}: metadata size {metadata_size} exceeds the {available_bytes} bytes left"
    )]
    MetadataSizeOutOfBounds {
        index: usize,
        metadata_size: u32,
        available_bytes: usize,
    },
    /// Record `index`'s SingleMessageMetadata does not decode.
    #[error("batch record {index}: undecodable SingleMessageMetadata: {source}")]
    Protobuf {
        index: usize,
        #[source]
        source: prost::DecodeError,
    },
    /// Record `index` has a negative payload_size.
    #[error("batch record {index}: negative payload_size {payload_size}")]
    PayloadSizeInvalid { index: usize, payload_size: i32 },
    /// Record `index`'s payload runs past the end.
    #[error(
        "batch record {index}: payload_size {payload_size} exceeds the {available_bytes} bytes left"
    )]
    PayloadOutOfBounds {
        index: usize,
        payload_size: i32,
        available_bytes: usize,
    },
    /// Bytes are left after `count` records: the count lies.
    #[error("{trailing_bytes} bytes left after the {count} records the batch count announced")]
    TrailingBytes { count: usize, trailing_bytes: usize },
}

/// Iterates over the records of a batch payload without collecting them.
/// Yields at most `count` items; after an error it yields nothing more.
#[derive(Debug)]
pub struct BatchIter {
    buffer: Bytes,
    offset: usize,
    index: usize,
    count: usize,
    failed: bool,
}

impl BatchIter {
    /// Iterates over `count` records of `buffer` (count from
    /// `num_messages_in_batch`, an i32 on the wire).
    pub fn new(buffer: Bytes, count: i32) -> Result<BatchIter, BatchError> {
        let Ok(count) = usize::try_from(count) else {
            return Err(BatchError::CountInvalid {
                count: i64::from(count),
            });
        };
        if count == 0 {
            return Err(BatchError::CountInvalid { count: 0 });
        }
        Ok(BatchIter {
            buffer,
            offset: 0,
            index: 0,
            count,
            failed: false,
        })
    }

    fn next_record(&mut self) -> Result<BatchMessage, BatchError> {
        let index = self.index;
        let available_bytes = self.buffer.len() - self.offset;
        let Some(size_field) = self
            .buffer
            .get(self.offset..self.offset + RECORD_SIZE_BYTES)
        else {
            return Err(BatchError::RecordTruncated {
                index,
                available_bytes,
            });
        };
        let metadata_size =
            u32::from_be_bytes([size_field[0], size_field[1], size_field[2], size_field[3]]);
        let metadata_start = self.offset + RECORD_SIZE_BYTES;
        let available_bytes = self.buffer.len() - metadata_start;
        if metadata_size as usize > available_bytes {
            return Err(BatchError::MetadataSizeOutOfBounds {
                index,
                metadata_size,
                available_bytes,
            });
        }
        let metadata_end = metadata_start + metadata_size as usize;
        let metadata =
            SingleMessageMetadata::decode(self.buffer.slice(metadata_start..metadata_end))
                .map_err(|source| BatchError::Protobuf { index, source })?;
        let payload_size = metadata.payload_size;
        let Ok(payload_bytes) = usize::try_from(payload_size) else {
            return Err(BatchError::PayloadSizeInvalid {
                index,
                payload_size,
            });
        };
        let available_bytes = self.buffer.len() - metadata_end;
        if payload_bytes > available_bytes {
            return Err(BatchError::PayloadOutOfBounds {
                index,
                payload_size,
                available_bytes,
            });
        }
        let payload_end = metadata_end + payload_bytes;
        let payload = self.buffer.slice(metadata_end..payload_end);
        self.offset = payload_end;
        self.index += 1;
        Ok(BatchMessage { metadata, payload })
    }
}

impl Iterator for BatchIter {
    type Item = Result<BatchMessage, BatchError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.failed || self.index >= self.count {
            return None;
        }
        let record = self.next_record();
        self.failed = record.is_err();
        Some(record)
    }
}

/// Parses a whole batch: exactly `count` records that fill `buffer`.
pub fn parse_batch(buffer: &Bytes, count: i32) -> Result<Vec<BatchMessage>, BatchError> {
    let iter = BatchIter::new(buffer.clone(), count)?;
    // Never trust the count for the allocation: cap it by the records the
    // buffer could hold at their smallest.
    let mut messages = Vec::with_capacity(iter.count.min(buffer.len() / RECORD_BYTES_MIN));
    let mut iter = iter;
    for record in iter.by_ref() {
        messages.push(record?);
    }
    let trailing_bytes = buffer.len() - iter.offset;
    if trailing_bytes != 0 {
        return Err(BatchError::TrailingBytes {
            count: iter.count,
            trailing_bytes,
        });
    }
    Ok(messages)
}

/// Appends the records of `messages` to `buf` (uncompressed). Each record's
/// payload_size is written as the payload's length, whatever the metadata says.
pub fn build_batch(messages: &[BatchMessage], buf: &mut BytesMut) {
    for message in messages {
        let payload_size = i32::try_from(message.payload.len());
        assert!(payload_size.is_ok(), "batch message payload exceeds i32");
        let payload_size = payload_size.unwrap_or(i32::MAX);
        let mut fixed;
        let metadata = if message.metadata.payload_size == payload_size {
            &message.metadata
        } else {
            fixed = message.metadata.clone();
            fixed.payload_size = payload_size;
            &fixed
        };
        let metadata_size = metadata.encoded_len();
        buf.reserve(RECORD_SIZE_BYTES + metadata_size + message.payload.len());
        buf.put_u32(metadata_size as u32); // a few bytes plus keys, far below u32
        metadata.encode_raw(buf);
        buf.extend_from_slice(&message.payload);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn message(index: usize) -> BatchMessage {
        BatchMessage::new(
            SingleMessageMetadata {
                partition_key: Some(format!("key-{index}")),
                sequence_id: Some(index as u64),
                ..Default::default()
            },
            Bytes::from(vec![index as u8; index * 3]),
        )
    }

    fn built(count: usize) -> Bytes {
        let messages: Vec<_> = (0..count).map(message).collect();
        let mut buf = BytesMut::new();
        build_batch(&messages, &mut buf);
        buf.freeze()
    }

    #[test]
    fn build_then_parse_is_identity() {
        let messages: Vec<_> = (0..5).map(message).collect();
        let mut buf = BytesMut::new();
        build_batch(&messages, &mut buf);
        let parsed = parse_batch(&buf.freeze(), 5).unwrap();
        assert_eq!(parsed, messages);
    }

    #[test]
    fn build_fixes_payload_size() {
        let mut lying = message(2);
        lying.metadata.payload_size = 99;
        let mut buf = BytesMut::new();
        build_batch(&[lying], &mut buf);
        let parsed = parse_batch(&buf.freeze(), 1).unwrap();
        assert_eq!(parsed[0].metadata.payload_size, 6);
    }

    #[test]
    fn lying_counts_and_sizes_are_typed_errors() {
        let buffer = built(3);
        assert!(matches!(
            parse_batch(&buffer, 0),
            Err(BatchError::CountInvalid { count: 0 })
        ));
        assert!(matches!(
            parse_batch(&buffer, -1),
            Err(BatchError::CountInvalid { count: -1 })
        ));
        assert!(matches!(
            parse_batch(&buffer, 4),
            Err(BatchError::RecordTruncated { index: 3, .. })
        ));
        assert!(matches!(
            parse_batch(&buffer, 2),
            Err(BatchError::TrailingBytes { count: 2, .. })
        ));
        // A huge count never preallocates beyond what the buffer can hold.
        assert!(matches!(
            parse_batch(&buffer, i32::MAX),
            Err(BatchError::RecordTruncated { index: 3, .. })
        ));

        let mut bad = buffer.to_vec();
        bad[..4].copy_from_slice(&1000u32.to_be_bytes());
        assert!(matches!(
            parse_batch(&Bytes::from(bad), 3),
            Err(BatchError::MetadataSizeOutOfBounds {
                index: 0,
                metadata_size: 1000,
                ..
            })
        ));

        let lying_payload = |payload_size: i32| {
            let metadata = SingleMessageMetadata {
                payload_size,
                ..Default::default()
            };
            let mut buf = BytesMut::new();
            buf.put_u32(metadata.encoded_len() as u32);
            metadata.encode_raw(&mut buf);
            buf.put_slice(b"abc");
            buf.freeze()
        };
        assert!(matches!(
            parse_batch(&lying_payload(4), 1),
            Err(BatchError::PayloadOutOfBounds {
                index: 0,
                payload_size: 4,
                available_bytes: 3
            })
        ));
        assert!(matches!(
            parse_batch(&lying_payload(-3), 1),
            Err(BatchError::PayloadSizeInvalid {
                index: 0,
                payload_size: -3
            })
        ));
        let garbage = Bytes::from_static(&[0, 0, 0, 2, 0x08, 0xff]);
        assert!(matches!(
            parse_batch(&garbage, 1),
            Err(BatchError::Protobuf { index: 0, .. })
        ));
    }

    #[test]
    fn truncation_at_every_offset_is_an_error() {
        let buffer = built(4);
        for cut in 0..buffer.len() {
            assert!(
                parse_batch(&buffer.slice(..cut), 4).is_err(),
                "cut at {cut}"
            );
        }
    }

    #[test]
    fn iterator_stops_after_an_error() {
        let buffer = built(2);
        let mut iter = BatchIter::new(buffer.slice(..buffer.len() - 1), 2).unwrap();
        assert!(iter.next().unwrap().is_ok());
        assert!(iter.next().unwrap().is_err());
        assert!(iter.next().is_none());
    }
}
