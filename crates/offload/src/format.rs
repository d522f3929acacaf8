//! The byte layout of an offloaded ledger's two objects, and their names.
//! Owns the encoders and decoders; every decoder treats its input as
//! untrusted (a store can hand back anything) and answers `FormatError`.
//!
//! Names: `{prefix}{uid:032x}-ledger-{ledger_id}` (data) and the same with
//! `-index` (Pulsar's `{uuid}-ledger-{id}` / `-index` pattern). The uid is
//! the attempt's: a retry writes other names, so no reader ever sees an
//! object being written under a name the ledger's metadata points to.
//!
//! Data object (all integers little-endian):
//! ```text
//! header  { magic "VELAOFFD" | version u32 | reserved u32 | ledger_id u64 | entry_count u64 }
//! entries { entry_id u64 | len u32 | crc32c(payload) u32 | payload[len] } x entry_count
//! ```
//! Index object:
//! ```text
//! { magic "VELAOFFI" | version u32 | reserved u32 | ledger_id u64 | entry_count u64
//!   | uid u128 | data_bytes u64 }
//! offsets u64 x (entry_count + 1)   offset of each entry's header in the data
//!                                   object; the last one is data_bytes
//! crc32c u32                        of every byte before it
//! ```
//! So entries `a..=b` are the one byte range `offsets[a]..offsets[b + 1]`:
//! one ranged GET.

use bytes::{Buf, BufMut, Bytes, BytesMut};
use object_store::path::Path;
use vela_log::OffloadTarget;

const DATA_MAGIC: &[u8; 8] = b"VELAOFFD";
const INDEX_MAGIC: &[u8; 8] = b"VELAOFFI";
/// Format version written; a newer one is refused.
const VERSION: u32 = 1;
pub(crate) const DATA_HEADER_BYTES: u64 = 32;
pub(crate) const ENTRY_HEADER_BYTES: u64 = 16;
const INDEX_HEADER_BYTES: usize = 56;
const INDEX_CRC_BYTES: usize = 4;
/// Largest index read: 8 million entries (a ledger holds at most
/// `--ledger-max-entries`, 50,000 by default). A bigger object is corrupt.
pub(crate) const INDEX_BYTES_MAX: u64 = 64 << 20;

/// Why stored bytes could not be read back.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum FormatError {
    #[error("{0}")]
    Corrupt(String),
}

fn corrupt(message: impl Into<String>) -> FormatError {
    FormatError::Corrupt(message.into())
}

/// Object names of an attempt.
pub(crate) fn data_path(prefix: &str, target: OffloadTarget) -> Path {
    Path::from(format!(
        "{prefix}{:032x}-ledger-{}",
        target.uid, target.ledger_id
    ))
}

pub(crate) fn index_path(prefix: &str, target: OffloadTarget) -> Path {
    Path::from(format!(
        "{prefix}{:032x}-ledger-{}-index",
        target.uid, target.ledger_id
    ))
}

/// The data object's header.
pub(crate) fn data_header(ledger_id: u64, entry_count: u64) -> [u8; DATA_HEADER_BYTES as usize] {
    let mut out = [0u8; DATA_HEADER_BYTES as usize];
    let mut buf = &mut out[..];
    buf.put_slice(DATA_MAGIC);
    buf.put_u32_le(VERSION);
    buf.put_u32_le(0);
    buf.put_u64_le(ledger_id);
    buf.put_u64_le(entry_count);
    out
}

/// The header in front of one entry's payload.
pub(crate) fn entry_header(entry_id: u64, payload: &[u8]) -> [u8; ENTRY_HEADER_BYTES as usize] {
    let mut out = [0u8; ENTRY_HEADER_BYTES as usize];
    let mut buf = &mut out[..];
    buf.put_u64_le(entry_id);
    // The offloader refuses payloads over u32::MAX before framing them.
    buf.put_u32_le(payload.len() as u32);
    buf.put_u32_le(crc32c::crc32c(payload));
    out
}

/// A ledger's index: where each entry starts in the data object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Index {
    pub(crate) ledger_id: u64,
    pub(crate) uid: u128,
    /// `entry_count + 1` offsets, increasing; the last is the data size.
    pub(crate) offsets: Vec<u64>,
}

impl Index {
    pub(crate) fn entry_count(&self) -> u64 {
        self.offsets.len() as u64 - 1
    }

    /// Bytes this index holds in memory (the index cache's unit).
    pub(crate) fn memory_bytes(&self) -> u64 {
        self.offsets.len() as u64 * 8 + 64
    }

    pub(crate) fn encode(&self) -> Bytes {
        debug_assert!(!self.offsets.is_empty());
        let mut out =
            BytesMut::with_capacity(INDEX_HEADER_BYTES + self.offsets.len() * 8 + INDEX_CRC_BYTES);
        out.put_slice(INDEX_MAGIC);
        out.put_u32_le(VERSION);
        out.put_u32_le(0);
        out.put_u64_le(self.ledger_id);
        out.put_u64_le(self.entry_count());
        out.put_u128_le(self.uid);
        out.put_u64_le(*self.offsets.last().unwrap_or(&0));
        for offset in &self.offsets {
            out.put_u64_le(*offset);
        }
        let crc = crc32c::crc32c(&out);
        out.put_u32_le(crc);
        out.freeze()
    }

    /// Decodes and checks an index read back for `target`.
    pub(crate) fn decode(bytes: &[u8], target: OffloadTarget) -> Result<Index, FormatError> {
        if bytes.len() < INDEX_HEADER_BYTES + 8 + INDEX_CRC_BYTES {
            return Err(corrupt(format!(
                "index of {} bytes is too short",
                bytes.len()
            )));
        }
        let (body, crc_bytes) = bytes.split_at(bytes.len() - INDEX_CRC_BYTES);
        let stored_crc =
            u32::from_le_bytes([crc_bytes[0], crc_bytes[1], crc_bytes[2], crc_bytes[3]]);
        if crc32c::crc32c(body) != stored_crc {
            return Err(corrupt("index checksum mismatch"));
        }
        let mut buf = body;
        if &buf[..8] != INDEX_MAGIC {
            return Err(corrupt("index magic mismatch"));
        }
        buf.advance(8);
        let version = buf.get_u32_le();
        if version != VERSION {
            return Err(corrupt(format!("index version {version} is not {VERSION}")));
        }
        buf.advance(4);
        let ledger_id = buf.get_u64_le();
        let entry_count = buf.get_u64_le();
        let uid = buf.get_u128_le();
        let data_bytes = buf.get_u64_le();
        if ledger_id != target.ledger_id || uid != target.uid {
            return Err(corrupt(format!(
                "index names ledger {ledger_id} uid {uid:032x}, not ledger {} uid {:032x}",
                target.ledger_id, target.uid
            )));
        }
        let expected = entry_count
            .checked_add(1)
            .and_then(|n| n.checked_mul(8))
            .filter(|&n| n == buf.len() as u64);
        if expected.is_none() {
            return Err(corrupt(format!(
                "index of {entry_count} entries has {} offset bytes",
                buf.len()
            )));
        }
        let mut offsets = Vec::with_capacity(buf.len() / 8);
        let mut previous = DATA_HEADER_BYTES;
        while buf.has_remaining() {
            let offset = buf.get_u64_le();
            let first = offsets.is_empty();
            if (first && offset != DATA_HEADER_BYTES)
                || (!first && offset < previous + ENTRY_HEADER_BYTES)
            {
                return Err(corrupt(format!("index offset {offset} out of order")));
            }
            previous = offset;
            offsets.push(offset);
        }
        if offsets.last() != Some(&data_bytes) {
            return Err(corrupt("index does not end at the data object's size"));
        }
        Ok(Index {
            ledger_id,
            uid,
            offsets,
        })
    }

    /// The last entry of `first..=last` whose bytes (from `first`'s
    /// header) fit in `bytes_max`; `first` itself always.
    pub(crate) fn last_fitting(&self, first: u64, last: u64, bytes_max: u64) -> u64 {
        let start = self.offsets[first as usize];
        // Ends of the candidates: offsets[first + 1 ..= last + 1].
        let ends = &self.offsets[first as usize + 1..=last as usize + 1];
        let fitting = ends.partition_point(|&end| end - start <= bytes_max);
        first + (fitting.max(1) as u64) - 1
    }
}

/// Splits the bytes of entries `first..` (one ranged read, starting at
/// `first`'s header) into payloads, checking each header and checksum.
pub(crate) fn split_entries(
    mut bytes: Bytes,
    first: u64,
    count: u64,
) -> Result<Vec<Bytes>, FormatError> {
    let mut out = Vec::with_capacity(count as usize);
    for entry_id in first..first + count {
        if bytes.len() < ENTRY_HEADER_BYTES as usize {
            return Err(corrupt(format!("entry {entry_id}: header cut short")));
        }
        let stored_id = bytes.get_u64_le();
        let len = bytes.get_u32_le() as usize;
        let crc = bytes.get_u32_le();
        if stored_id != entry_id {
            return Err(corrupt(format!(
                "entry {entry_id}: header names entry {stored_id}"
            )));
        }
        if bytes.len() < len {
            return Err(corrupt(format!("entry {entry_id}: payload cut short")));
        }
        let payload = bytes.split_to(len);
        if crc32c::crc32c(&payload) != crc {
            return Err(corrupt(format!("entry {entry_id}: checksum mismatch")));
        }
        out.push(payload);
    }
    if !bytes.is_empty() {
        return Err(corrupt(format!(
            "{} bytes after the last entry read",
            bytes.len()
        )));
    }
    Ok(out)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const TARGET: OffloadTarget = OffloadTarget {
        ledger_id: 42,
        uid: 0x0123_4567_89ab_cdef_0011_2233_4455_6677,
    };

    /// A data object of `payloads` and its index.
    fn build(payloads: &[&[u8]]) -> (Bytes, Index) {
        let mut data = BytesMut::new();
        data.put_slice(&data_header(TARGET.ledger_id, payloads.len() as u64));
        let mut offsets = Vec::new();
        for (id, payload) in payloads.iter().enumerate() {
            offsets.push(data.len() as u64);
            data.put_slice(&entry_header(id as u64, payload));
            data.put_slice(payload);
        }
        offsets.push(data.len() as u64);
        let index = Index {
            ledger_id: TARGET.ledger_id,
            uid: TARGET.uid,
            offsets,
        };
        (data.freeze(), index)
    }

    #[test]
    fn names_hold_the_uid_and_the_ledger() {
        assert_eq!(
            data_path("vela/", TARGET).as_ref(),
            "vela/0123456789abcdef0011223344556677-ledger-42"
        );
        assert_eq!(
            index_path("", TARGET).as_ref(),
            "0123456789abcdef0011223344556677-ledger-42-index"
        );
    }

    #[test]
    fn a_range_of_entries_is_one_byte_range() {
        let payloads: [&[u8]; 4] = [b"a", b"", b"ccc", b"dddd"];
        let (data, index) = build(&payloads);
        let decoded = Index::decode(&index.encode(), TARGET).unwrap();
        assert_eq!(decoded, index);
        for first in 0..4u64 {
            for last in first..4u64 {
                let range = index.offsets[first as usize] as usize
                    ..index.offsets[last as usize + 1] as usize;
                let entries = split_entries(data.slice(range), first, last - first + 1).unwrap();
                let expected: Vec<&[u8]> = payloads[first as usize..=last as usize].to_vec();
                assert_eq!(entries, expected);
            }
        }
    }

    #[test]
    fn reads_are_cut_to_the_bytes_asked_for() {
        let (_, index) = build(&[&[0; 100], &[0; 100], &[0; 100]]);
        // Each entry is 116 bytes with its header.
        assert_eq!(index.last_fitting(0, 2, 0), 0, "at least one entry");
        assert_eq!(index.last_fitting(0, 2, 231), 0);
        assert_eq!(index.last_fitting(0, 2, 232), 1);
        assert_eq!(index.last_fitting(1, 2, 10_000), 2);
        assert_eq!(index.last_fitting(0, 1, 10_000), 1, "never past last");
    }

    #[test]
    fn every_flipped_index_byte_is_caught() {
        let (_, index) = build(&[b"x", b"yy"]);
        let encoded = index.encode();
        for at in 0..encoded.len() {
            let mut bad = encoded.to_vec();
            bad[at] ^= 0x40;
            assert!(Index::decode(&bad, TARGET).is_err(), "byte {at}");
        }
        for cut in 0..encoded.len() {
            assert!(
                Index::decode(&encoded[..cut], TARGET).is_err(),
                "cut at {cut}"
            );
        }
        let other = OffloadTarget {
            uid: TARGET.uid + 1,
            ..TARGET
        };
        assert!(
            Index::decode(&encoded, other).is_err(),
            "another attempt's index"
        );
    }

    #[test]
    fn every_flipped_or_cut_data_byte_is_caught() {
        let (data, index) = build(&[b"first", b"second"]);
        let range = index.offsets[0] as usize..index.offsets[2] as usize;
        let entries = data.slice(range);
        for at in 0..entries.len() {
            let mut bad = entries.to_vec();
            bad[at] ^= 0x01;
            assert!(split_entries(Bytes::from(bad), 0, 2).is_err(), "byte {at}");
        }
        for cut in 0..entries.len() {
            assert!(
                split_entries(entries.slice(..cut), 0, 2).is_err(),
                "cut at {cut}"
            );
        }
        assert!(
            split_entries(entries.clone(), 1, 2).is_err(),
            "wrong entry ids"
        );
    }
}
