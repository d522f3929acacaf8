//! The packaged entry: the bytes a ledger client builds for one ledger entry and
//! every bookie journals, stores and returns verbatim.
//!
//! Owns: the entry layout, its CRC32C, building one and checking one.
//! Guarantees: `encode_entry` and `decode_entry` are exact inverses; a decode of
//! bytes that were not produced by `encode_entry` (truncated, flipped, from another
//! ledger) is a typed `EntryError`, never a panic.
//! Never: does I/O, or trusts a length from the bytes (the payload is simply the
//! rest of the buffer).
//!
//! The bookie parses only the header (`parse_header`) to route and validate ADDs
//! and to derive the ledger's last-add-confirmed; readers (the ledger client)
//! verify the CRC end to end (`decode_entry`), so a bit flipped anywhere between
//! the writer's memory and the reader's is caught.

use bytes::{BufMut, Bytes, BytesMut};

/// Bytes of the header that the CRC covers together with the payload.
const HEADER_FIELDS_BYTES: usize = 32;
/// Bytes before the payload: the header fields plus the CRC32C.
pub const ENTRY_HEADER_BYTES: usize = HEADER_FIELDS_BYTES + 4;
/// Largest packaged entry, header included: a Pulsar message of the default
/// max size (5 MiB) plus its metadata (a broker frame may be 5 MiB + 10 KiB,
/// as Pulsar sets BookKeeper's `nettyMaxFrameSizeBytes`), with room to spare.
/// The protocol's frame limit is this plus room for its own header.
pub const ENTRY_BYTES_MAX: usize = 5 * 1024 * 1024 + 32 * 1024;
/// Largest payload a packaged entry can carry.
pub const ENTRY_PAYLOAD_BYTES_MAX: usize = ENTRY_BYTES_MAX - ENTRY_HEADER_BYTES;

/// On the wire, "no entry confirmed yet" (a fresh ledger) is this LAC value.
pub const LAC_NONE: u64 = u64::MAX;

/// The fields before the payload of a packaged entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHeader {
    /// Ledger the entry belongs to.
    pub ledger_id: u64,
    /// Position of the entry in its ledger, from 0.
    pub entry_id: u64,
    /// The writer's last-add-confirmed when it sent this entry (`None` before the
    /// first entry of the ledger was confirmed).
    pub last_add_confirmed: Option<u64>,
    /// Bytes of payload in the ledger up to and including this entry.
    pub ledger_length: u64,
}

/// Why bytes are not a valid packaged entry.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EntryError {
    /// Fewer bytes than the fixed header.
    #[error(
        "packaged entry is {len_bytes} bytes, shorter than its {ENTRY_HEADER_BYTES}-byte header"
    )]
    TooShort {
        /// Length of the rejected buffer.
        len_bytes: usize,
    },
    /// More bytes than `ENTRY_BYTES_MAX`.
    #[error("packaged entry is {len_bytes} bytes, over the {ENTRY_BYTES_MAX}-byte limit")]
    TooLong {
        /// Length of the rejected buffer.
        len_bytes: usize,
    },
    /// The CRC32C stored in the entry does not match its header and payload.
    #[error(
        "entry {ledger_id}:{entry_id} fails its CRC32C (stored {stored:#010x}, computed {computed:#010x})"
    )]
    BadCrc {
        /// Ledger id as read from the (possibly corrupt) header.
        ledger_id: u64,
        /// Entry id as read from the (possibly corrupt) header.
        entry_id: u64,
        /// CRC in the entry.
        stored: u32,
        /// CRC of the bytes received.
        computed: u32,
    },
    /// A valid entry, but not the one asked for.
    #[error("expected entry {expected_ledger_id}:{expected_entry_id}, got {ledger_id}:{entry_id}")]
    WrongEntry {
        /// Ledger asked for.
        expected_ledger_id: u64,
        /// Entry asked for.
        expected_entry_id: u64,
        /// Ledger in the entry.
        ledger_id: u64,
        /// Entry in the entry.
        entry_id: u64,
    },
}

// Packaged entry, all integers big-endian:
// { ledger_id u64 | entry_id u64 | last_add_confirmed u64 (u64::MAX = none)
//   | ledger_length u64 | crc32c u32 (over the 32 bytes before it, then payload)
//   | payload }

/// Builds a packaged entry: header, CRC32C, then a copy of `payload`.
///
/// Panics if the payload exceeds `ENTRY_PAYLOAD_BYTES_MAX` or `header` carries a
/// LAC equal to the reserved `LAC_NONE`: both are caller bugs (the ledger client
/// checks message sizes before it builds entries).
pub fn encode_entry(header: &EntryHeader, payload: &[u8]) -> Bytes {
    assert!(
        payload.len() <= ENTRY_PAYLOAD_BYTES_MAX,
        "payload over ENTRY_PAYLOAD_BYTES_MAX"
    );
    assert!(
        header.last_add_confirmed != Some(LAC_NONE),
        "LAC u64::MAX is reserved"
    );
    let mut buf = BytesMut::with_capacity(ENTRY_HEADER_BYTES + payload.len());
    buf.put_u64(header.ledger_id);
    buf.put_u64(header.entry_id);
    buf.put_u64(header.last_add_confirmed.unwrap_or(LAC_NONE));
    buf.put_u64(header.ledger_length);
    debug_assert_eq!(buf.len(), HEADER_FIELDS_BYTES);
    let crc = crc32c::crc32c_append(crc32c::crc32c(&buf), payload);
    buf.put_u32(crc);
    buf.put_slice(payload);
    buf.freeze()
}

/// Reads the header fields without checking the CRC (the bookie's view: cheap,
/// enough to route and validate an ADD; the CRC is the reader's job).
pub fn parse_header(entry: &[u8]) -> Result<EntryHeader, EntryError> {
    check_len(entry.len())?;
    Ok(EntryHeader {
        ledger_id: be_u64(entry, 0),
        entry_id: be_u64(entry, 8),
        last_add_confirmed: match be_u64(entry, 16) {
            LAC_NONE => None,
            lac => Some(lac),
        },
        ledger_length: be_u64(entry, 24),
    })
}

/// Checks the CRC32C and returns the header and the payload (a slice of `entry`,
/// no copy).
pub fn decode_entry(entry: &Bytes) -> Result<(EntryHeader, Bytes), EntryError> {
    let header = parse_header(entry)?;
    let stored = u32::from_be_bytes([entry[32], entry[33], entry[34], entry[35]]);
    let computed = crc32c::crc32c_append(
        crc32c::crc32c(&entry[..HEADER_FIELDS_BYTES]),
        &entry[ENTRY_HEADER_BYTES..],
    );
    if stored != computed {
        return Err(EntryError::BadCrc {
            ledger_id: header.ledger_id,
            entry_id: header.entry_id,
            stored,
            computed,
        });
    }
    Ok((header, entry.slice(ENTRY_HEADER_BYTES..)))
}

/// `decode_entry`, and the entry must be `ledger_id`:`entry_id` (what a reader
/// does with a bookie's answer).
pub fn decode_expected_entry(
    entry: &Bytes,
    ledger_id: u64,
    entry_id: u64,
) -> Result<(EntryHeader, Bytes), EntryError> {
    let (header, payload) = decode_entry(entry)?;
    if header.ledger_id != ledger_id || header.entry_id != entry_id {
        return Err(EntryError::WrongEntry {
            expected_ledger_id: ledger_id,
            expected_entry_id: entry_id,
            ledger_id: header.ledger_id,
            entry_id: header.entry_id,
        });
    }
    Ok((header, payload))
}

fn check_len(len_bytes: usize) -> Result<(), EntryError> {
    if len_bytes < ENTRY_HEADER_BYTES {
        return Err(EntryError::TooShort { len_bytes });
    }
    if len_bytes > ENTRY_BYTES_MAX {
        return Err(EntryError::TooLong { len_bytes });
    }
    Ok(())
}

/// Big-endian u64 at `at`; the caller has checked the length.
fn be_u64(bytes: &[u8], at: usize) -> u64 {
    let mut word = [0u8; 8];
    word.copy_from_slice(&bytes[at..at + 8]);
    u64::from_be_bytes(word)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn header(lac: Option<u64>) -> EntryHeader {
        EntryHeader {
            ledger_id: 7,
            entry_id: 42,
            last_add_confirmed: lac,
            ledger_length: 4096,
        }
    }

    #[test]
    fn round_trip_keeps_header_and_payload() {
        for lac in [None, Some(0), Some(41)] {
            let entry = encode_entry(&header(lac), b"hello");
            assert_eq!(entry.len(), ENTRY_HEADER_BYTES + 5);
            let (decoded, payload) = decode_expected_entry(&entry, 7, 42).unwrap();
            assert_eq!(decoded, header(lac));
            assert_eq!(&payload[..], b"hello");
            assert_eq!(parse_header(&entry).unwrap(), header(lac));
        }
    }

    #[test]
    fn layout_is_big_endian_with_lac_none_as_max() {
        let entry = encode_entry(&header(None), b"");
        assert_eq!(&entry[0..8], &7u64.to_be_bytes());
        assert_eq!(&entry[8..16], &42u64.to_be_bytes());
        assert_eq!(&entry[16..24], &[0xff; 8]);
        assert_eq!(&entry[24..32], &4096u64.to_be_bytes());
        assert_eq!(&entry[32..36], &crc32c::crc32c(&entry[..32]).to_be_bytes());
    }

    #[test]
    fn every_flipped_bit_is_caught() {
        let entry = encode_entry(&header(Some(3)), b"payload bytes");
        for byte_index in 0..entry.len() {
            for bit in 0..8 {
                let mut bad = entry.to_vec();
                bad[byte_index] ^= 1 << bit;
                let bad = Bytes::from(bad);
                assert!(
                    decode_expected_entry(&bad, 7, 42).is_err(),
                    "flip of bit {bit} in byte {byte_index} went unnoticed"
                );
            }
        }
    }

    #[test]
    fn truncated_or_wrong_entries_are_typed_errors() {
        let entry = encode_entry(&header(None), b"abc");
        for cut in 0..ENTRY_HEADER_BYTES {
            assert_eq!(
                decode_entry(&entry.slice(..cut)),
                Err(EntryError::TooShort { len_bytes: cut })
            );
        }
        assert!(matches!(
            decode_entry(&entry.slice(..entry.len() - 1)),
            Err(EntryError::BadCrc { .. })
        ));
        assert!(matches!(
            decode_expected_entry(&entry, 7, 43),
            Err(EntryError::WrongEntry { .. })
        ));
        let huge = Bytes::from(vec![0u8; ENTRY_BYTES_MAX + 1]);
        assert!(matches!(
            parse_header(&huge),
            Err(EntryError::TooLong { .. })
        ));
    }

    proptest! {
        #[test]
        fn round_trip_any(ledger_id: u64, entry_id: u64, lac in proptest::option::of(0..u64::MAX),
                          ledger_length: u64, payload in proptest::collection::vec(any::<u8>(), 0..512)) {
            let header = EntryHeader { ledger_id, entry_id, last_add_confirmed: lac, ledger_length };
            let entry = encode_entry(&header, &payload);
            let (decoded, decoded_payload) = decode_entry(&entry).unwrap();
            prop_assert_eq!(decoded, header);
            prop_assert_eq!(&decoded_payload[..], &payload[..]);
        }

        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..128)) {
            let bytes = Bytes::from(bytes);
            let _ = parse_header(&bytes);
            let _ = decode_entry(&bytes);
        }
    }
}
