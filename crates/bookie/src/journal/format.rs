//! The journal's on-disk format: file names, the file header, and the record
//! codec, each encoder beside its decoder.
//!
//! Owns: every byte layout of the journal. Never does I/O: callers hand in
//! slices. Decoding treats its input as untrusted: every length is checked
//! against the bounds before it is used, nothing panics on bad bytes.

use bytes::Bytes;

/// Name of the lock file in the journal directory (held with `flock`).
pub const LOCK_FILE_NAME: &str = "LOCK";
/// Suffix of journal files: `0000000000000042.jnl`.
pub const FILE_SUFFIX: &str = ".jnl";
/// Name of the next file while the preallocation thread prepares it. Renamed to
/// its numbered name at rotation; removed on open (it holds no records).
pub const NEXT_FILE_NAME: &str = "next.jnl.tmp";

/// Suffix of a retired file kept for reuse: `0000000000000042.jnl.free`. Never
/// replayed; its records fail the crc once it is reused under a new id.
pub const FREE_FILE_SUFFIX: &str = ".jnl.free";

/// Builds the file name for a journal file id: 16 zero-padded decimal digits.
pub fn file_name(file_id: u64) -> String {
    format!("{file_id:016}{FILE_SUFFIX}")
}

/// Name of a retired file kept for reuse.
pub fn free_file_name(file_id: u64) -> String {
    format!("{file_id:016}{FREE_FILE_SUFFIX}")
}

/// Parses a journal file name back into its id; `None` for any other name.
pub fn parse_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(FILE_SUFFIX)?;
    if digits.len() < 16 || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

// ---------------------------------------------------------------------------
// File header.
//
// The first HEADER_BYTES of every file (little endian), zero-filled after the
// fields, so records start 4 KiB-aligned:
// { magic [8] = "VELAJRNL" | version u32 | file_id u64 | data_offset u32 | crc32c u32 }
//   crc32c covers the 24 bytes before it.
// ---------------------------------------------------------------------------

/// Size of the header block.
pub const HEADER_BYTES: usize = 4096;
/// First bytes of every journal file.
pub const MAGIC: [u8; 8] = *b"VELAJRNL";
/// The format version this code writes and reads.
pub const VERSION: u32 = 1;
const HEADER_FIELDS_BYTES: usize = 28;

/// Fields of a decoded header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FileHeader {
    /// The id the file was created with (must match its name).
    pub file_id: u64,
    /// Offset of the first record.
    pub data_offset: u32,
}

/// Writes the header fields into the start of `out` (the rest of the block is the
/// caller's zeros).
pub fn encode_header(header: FileHeader, out: &mut [u8]) {
    assert!(out.len() >= HEADER_FIELDS_BYTES);
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..20].copy_from_slice(&header.file_id.to_le_bytes());
    out[20..24].copy_from_slice(&header.data_offset.to_le_bytes());
    let crc = crc32c::crc32c(&out[0..24]);
    out[24..28].copy_from_slice(&crc.to_le_bytes());
}

/// Decodes a header; the error says what is wrong (the caller names the file).
pub fn decode_header(bytes: &[u8]) -> Result<FileHeader, String> {
    if bytes.len() < HEADER_FIELDS_BYTES {
        return Err(format!(
            "file shorter than the header ({} bytes)",
            bytes.len()
        ));
    }
    if bytes[0..8] != MAGIC {
        return Err(format!("bad magic {:02x?}", &bytes[0..8]));
    }
    let crc_stored = read_u32(bytes, 24);
    if crc32c::crc32c(&bytes[0..24]) != crc_stored {
        return Err("header crc mismatch".to_string());
    }
    let version = read_u32(bytes, 8);
    if version != VERSION {
        return Err(format!(
            "unsupported version {version} (this build reads {VERSION})"
        ));
    }
    Ok(FileHeader {
        file_id: read_u64(bytes, 12),
        data_offset: read_u32(bytes, 20),
    })
}

// ---------------------------------------------------------------------------
// Records.
//
// Little endian, packed back to back from `data_offset`; each group of records
// is followed by a Padding record up to the next alignment boundary:
// { len u32 | crc32c u32 | kind u8 | body [len - 9] }
//   len    total record bytes (header included), >= 9. A zero len where a record
//          should start marks the end of written data (zero-filled space).
//   crc32c over (file_id u64 | len u32 | kind u8 | body): seeding with the file id
//          makes a record left over in a reused file invalid in the new one.
//   kind 1 Entry          { ledger_id u64 | entry_id u64 | payload }
//   kind 2 Fence          { ledger_id u64 }
//   kind 3 ExplicitLac    { ledger_id u64 | lac u64 }
//   kind 4 LedgerDeleted  { ledger_id u64 }
//   kind 5 Padding        { zeros }            skipped by replay
//   kind 6 FileEnd        { }                  the file is complete
// ---------------------------------------------------------------------------

/// Bytes before the body: len, crc, kind.
pub const RECORD_HEADER_BYTES: usize = 9;

const KIND_ENTRY: u8 = 1;
const KIND_FENCE: u8 = 2;
const KIND_EXPLICIT_LAC: u8 = 3;
const KIND_LEDGER_DELETED: u8 = 4;
const KIND_PADDING: u8 = 5;
const KIND_FILE_END: u8 = 6;

/// A record the bookie appends and replay hands back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum JournalRecord {
    /// An entry added to a ledger; `payload` is the entry as the client sent it.
    Entry {
        /// Ledger the entry belongs to.
        ledger_id: u64,
        /// Entry id within the ledger.
        entry_id: u64,
        /// The entry bytes.
        payload: Bytes,
    },
    /// The ledger was fenced: must be durable before a fencing read is answered.
    Fence {
        /// The fenced ledger.
        ledger_id: u64,
    },
    /// An explicit last-add-confirmed for a ledger.
    ExplicitLac {
        /// The ledger.
        ledger_id: u64,
        /// Its last add confirmed.
        lac: u64,
    },
    /// The ledger was deleted; replay must not resurrect its entries.
    LedgerDeleted {
        /// The deleted ledger.
        ledger_id: u64,
    },
}

impl JournalRecord {
    /// Encoded size of this record.
    pub fn encoded_len(&self) -> usize {
        RECORD_HEADER_BYTES
            + match self {
                JournalRecord::Entry { payload, .. } => 16 + payload.len(),
                JournalRecord::Fence { .. } | JournalRecord::LedgerDeleted { .. } => 8,
                JournalRecord::ExplicitLac { .. } => 16,
            }
    }

    /// Payload bytes carried (0 for metadata records).
    pub fn payload_len(&self) -> usize {
        match self {
            JournalRecord::Entry { payload, .. } => payload.len(),
            _ => 0,
        }
    }
}

/// A decoded record, including the kinds only the journal itself uses.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum DecodedRecord {
    /// A record for the bookie.
    User(JournalRecord),
    /// Alignment filler.
    Padding,
    /// The file is complete.
    FileEnd,
}

/// The outcome of decoding at one offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    /// A valid record of `len` bytes.
    Record {
        /// The record.
        record: DecodedRecord,
        /// Its encoded size.
        len: usize,
    },
    /// A zero length field: end of written data.
    End,
    /// The record claims `len` bytes but fewer are available.
    Short {
        /// The claimed length (already checked against the bounds).
        len: usize,
    },
    /// Not a valid record (bad length, crc mismatch, unknown kind, bad body size).
    Invalid {
        /// What is wrong.
        reason: String,
    },
}

/// Encodes `record` at the start of `out` (which must hold `encoded_len()`
/// bytes) and returns the length written.
pub fn encode_record(record: &JournalRecord, file_id: u64, out: &mut [u8]) -> usize {
    let len = record.encoded_len();
    debug_assert!(out.len() >= len);
    let body = &mut out[RECORD_HEADER_BYTES..len];
    let kind = match record {
        JournalRecord::Entry {
            ledger_id,
            entry_id,
            payload,
        } => {
            body[0..8].copy_from_slice(&ledger_id.to_le_bytes());
            body[8..16].copy_from_slice(&entry_id.to_le_bytes());
            body[16..].copy_from_slice(payload);
            KIND_ENTRY
        }
        JournalRecord::Fence { ledger_id } => {
            body.copy_from_slice(&ledger_id.to_le_bytes());
            KIND_FENCE
        }
        JournalRecord::ExplicitLac { ledger_id, lac } => {
            body[0..8].copy_from_slice(&ledger_id.to_le_bytes());
            body[8..16].copy_from_slice(&lac.to_le_bytes());
            KIND_EXPLICIT_LAC
        }
        JournalRecord::LedgerDeleted { ledger_id } => {
            body.copy_from_slice(&ledger_id.to_le_bytes());
            KIND_LEDGER_DELETED
        }
    };
    seal(kind, len, file_id, out);
    len
}

/// Encodes a padding record of exactly `len` bytes (`len >= RECORD_HEADER_BYTES`).
pub fn encode_padding(len: usize, file_id: u64, out: &mut [u8]) {
    assert!(len >= RECORD_HEADER_BYTES && out.len() >= len);
    out[RECORD_HEADER_BYTES..len].fill(0);
    seal(KIND_PADDING, len, file_id, out);
}

/// Encodes a file-end record (`RECORD_HEADER_BYTES` long).
pub fn encode_file_end(file_id: u64, out: &mut [u8]) {
    seal(KIND_FILE_END, RECORD_HEADER_BYTES, file_id, out);
}

/// Writes len, kind and the crc over the body already in `out[9..len]`.
fn seal(kind: u8, len: usize, file_id: u64, out: &mut [u8]) {
    let len_u32 = u32::try_from(len).unwrap_or(u32::MAX);
    debug_assert!(len_u32 as usize == len);
    out[0..4].copy_from_slice(&len_u32.to_le_bytes());
    out[8] = kind;
    let crc = record_crc(file_id, len_u32, &out[8..len]);
    out[4..8].copy_from_slice(&crc.to_le_bytes());
}

fn record_crc(file_id: u64, len: u32, kind_and_body: &[u8]) -> u32 {
    let crc = crc32c::crc32c(&file_id.to_le_bytes());
    let crc = crc32c::crc32c_append(crc, &len.to_le_bytes());
    crc32c::crc32c_append(crc, kind_and_body)
}

/// Decodes the record at the start of `bytes`. `record_bytes_max` bounds the
/// length field before anything is sized by it.
pub fn decode_record(bytes: &[u8], file_id: u64, record_bytes_max: usize) -> Decoded {
    if bytes.len() < 4 {
        // Fewer than 4 bytes left: only zeros can be "end of data".
        if bytes.iter().all(|b| *b == 0) {
            return Decoded::End;
        }
        return Decoded::Short {
            len: RECORD_HEADER_BYTES,
        };
    }
    let len = read_u32(bytes, 0) as usize;
    if len == 0 {
        return Decoded::End;
    }
    if len < RECORD_HEADER_BYTES {
        return Decoded::Invalid {
            reason: format!("record length {len} below the minimum {RECORD_HEADER_BYTES}"),
        };
    }
    if len > record_bytes_max {
        return Decoded::Invalid {
            reason: format!("record length {len} above the maximum {record_bytes_max}"),
        };
    }
    if bytes.len() < len {
        return Decoded::Short { len };
    }
    let crc_stored = read_u32(bytes, 4);
    let crc = record_crc(file_id, len as u32, &bytes[8..len]);
    if crc != crc_stored {
        return Decoded::Invalid {
            reason: format!("crc mismatch (stored {crc_stored:#010x}, computed {crc:#010x})"),
        };
    }
    let kind = bytes[8];
    let body = &bytes[RECORD_HEADER_BYTES..len];
    let record = match (kind, body.len()) {
        (KIND_ENTRY, n) if n >= 16 => DecodedRecord::User(JournalRecord::Entry {
            ledger_id: read_u64(body, 0),
            entry_id: read_u64(body, 8),
            payload: Bytes::copy_from_slice(&body[16..]),
        }),
        (KIND_FENCE, 8) => DecodedRecord::User(JournalRecord::Fence {
            ledger_id: read_u64(body, 0),
        }),
        (KIND_EXPLICIT_LAC, 16) => DecodedRecord::User(JournalRecord::ExplicitLac {
            ledger_id: read_u64(body, 0),
            lac: read_u64(body, 8),
        }),
        (KIND_LEDGER_DELETED, 8) => DecodedRecord::User(JournalRecord::LedgerDeleted {
            ledger_id: read_u64(body, 0),
        }),
        (KIND_PADDING, _) => DecodedRecord::Padding,
        (KIND_FILE_END, 0) => DecodedRecord::FileEnd,
        (kind, n) => {
            return Decoded::Invalid {
                reason: format!("unknown record kind {kind} or bad body size {n}"),
            };
        }
    };
    Decoded::Record { record, len }
}

/// Length of the padding record that takes `offset` to the next multiple of
/// `alignment` (0 if already aligned). A gap smaller than a record header is
/// padded through the following boundary.
pub fn padding_len(offset: u64, alignment: u64) -> usize {
    let gap = (alignment - offset % alignment) % alignment;
    if gap == 0 {
        0
    } else if gap < RECORD_HEADER_BYTES as u64 {
        (gap + alignment) as usize
    } else {
        gap as usize
    }
}

/// Little-endian u32 at `at` (the caller checked the length).
pub(crate) fn read_u32(bytes: &[u8], at: usize) -> u32 {
    let mut b = [0u8; 4];
    b.copy_from_slice(&bytes[at..at + 4]);
    u32::from_le_bytes(b)
}

/// Little-endian u64 at `at` (the caller checked the length).
pub(crate) fn read_u64(bytes: &[u8], at: usize) -> u64 {
    let mut b = [0u8; 8];
    b.copy_from_slice(&bytes[at..at + 8]);
    u64::from_le_bytes(b)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn samples() -> Vec<JournalRecord> {
        vec![
            JournalRecord::Entry {
                ledger_id: 7,
                entry_id: 0,
                payload: Bytes::from_static(b"hello"),
            },
            JournalRecord::Entry {
                ledger_id: u64::MAX,
                entry_id: 3,
                payload: Bytes::new(),
            },
            JournalRecord::Fence { ledger_id: 9 },
            JournalRecord::ExplicitLac {
                ledger_id: 9,
                lac: 41,
            },
            JournalRecord::LedgerDeleted { ledger_id: 12 },
        ]
    }

    #[test]
    fn file_names_round_trip() {
        assert_eq!(file_name(42), "0000000000000042.jnl");
        assert_eq!(free_file_name(42), "0000000000000042.jnl.free");
        assert_eq!(parse_file_name(&free_file_name(42)), None);
        for id in [0, 1, 42, 9_999_999_999_999_999, u64::MAX] {
            assert_eq!(parse_file_name(&file_name(id)), Some(id));
        }
        for bad in [
            "LOCK",
            "42.jnl",
            "000000000000004x.jnl",
            NEXT_FILE_NAME,
            "0000000000000042.txn",
        ] {
            assert_eq!(parse_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn header_round_trip_and_bad_magic() {
        let mut block = vec![0u8; HEADER_BYTES];
        let header = FileHeader {
            file_id: 42,
            data_offset: 4096,
        };
        encode_header(header, &mut block);
        assert_eq!(decode_header(&block), Ok(header));
        let mut bad = block.clone();
        bad[0] = b'X';
        assert!(decode_header(&bad).unwrap_err().contains("magic"));
        let mut bad = block.clone();
        bad[13] ^= 1;
        assert!(decode_header(&bad).unwrap_err().contains("crc"));
        assert!(decode_header(&block[..10]).is_err());
    }

    #[test]
    fn records_round_trip() {
        for record in samples() {
            let mut buf = vec![0u8; record.encoded_len() + 5];
            let len = encode_record(&record, 3, &mut buf);
            assert_eq!(len, record.encoded_len());
            assert_eq!(
                decode_record(&buf, 3, 1 << 20),
                Decoded::Record {
                    record: DecodedRecord::User(record.clone()),
                    len
                }
            );
            // The same bytes read as part of another file are invalid.
            assert!(matches!(
                decode_record(&buf, 4, 1 << 20),
                Decoded::Invalid { .. }
            ));
            // Every truncation is Short (or End for an empty prefix).
            for cut in 0..len {
                match decode_record(&buf[..cut], 3, 1 << 20) {
                    Decoded::Short { .. } => {}
                    Decoded::End => assert!(cut < 4),
                    other => panic!("cut {cut}: {other:?}"),
                }
            }
            // Every flipped bit is caught.
            for bit in 0..len * 8 {
                let mut flipped = buf.clone();
                flipped[bit / 8] ^= 1 << (bit % 8);
                assert!(
                    !matches!(decode_record(&flipped, 3, 1 << 20), Decoded::Record { .. }),
                    "bit {bit}"
                );
            }
        }
    }

    #[test]
    fn padding_and_end_records() {
        let mut buf = vec![0u8; 4096];
        encode_padding(100, 5, &mut buf);
        assert_eq!(
            decode_record(&buf, 5, 4096),
            Decoded::Record {
                record: DecodedRecord::Padding,
                len: 100
            }
        );
        encode_file_end(5, &mut buf);
        assert_eq!(
            decode_record(&buf, 5, 4096),
            Decoded::Record {
                record: DecodedRecord::FileEnd,
                len: RECORD_HEADER_BYTES
            }
        );
        assert_eq!(decode_record(&[0u8; 64], 5, 4096), Decoded::End);
        assert!(matches!(
            decode_record(&[0xff; 64], 5, 4096),
            Decoded::Invalid { .. }
        ));
    }

    proptest::proptest! {
        /// Arbitrary disk bytes never panic the decoder, and anything it accepts
        /// re-encodes to the same bytes.
        #[test]
        fn decode_never_panics_on_arbitrary_bytes(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..256),
            file_id in 0u64..4,
        ) {
            if let Decoded::Record { record: DecodedRecord::User(record), len } =
                decode_record(&bytes, file_id, 1 << 20)
            {
                let mut again = vec![0u8; len];
                encode_record(&record, file_id, &mut again);
                proptest::prop_assert_eq!(&again[..], &bytes[..len]);
            }
        }

        /// Valid records survive any following bytes.
        #[test]
        fn decode_reads_a_record_followed_by_garbage(
            payload in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..300),
            tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            ledger_id: u64,
            entry_id: u64,
        ) {
            let record = JournalRecord::Entry { ledger_id, entry_id, payload: Bytes::from(payload) };
            let mut buf = vec![0u8; record.encoded_len()];
            let len = encode_record(&record, 9, &mut buf);
            buf.extend_from_slice(&tail);
            proptest::prop_assert_eq!(
                decode_record(&buf, 9, 1 << 20),
                Decoded::Record { record: DecodedRecord::User(record), len }
            );
        }
    }

    #[test]
    fn padding_reaches_the_boundary() {
        for offset in 4096..4096 * 3 {
            let pad = padding_len(offset, 4096) as u64;
            assert_eq!((offset + pad) % 4096, 0);
            assert!(pad == 0 || pad >= RECORD_HEADER_BYTES as u64);
        }
    }
}
