//! On-disk formats of ledger storage: file names, the entry-log header, the entry
//! record, the `lastMark` file. The only module that knows these bytes; every
//! integer is little-endian with an explicit width.
//!
//! Ledger dir layout:
//! ```text
//! LOCK                     flock'ed by the owning process
//! lastMark                 checkpointed journal mark (replaced atomically)
//! index.redb               entry index + per-ledger state + per-log ledger map
//! 0000000000000007.log     entry logs, 16 zero-padded decimal digits
//! ```
//!
//! Never: does I/O (callers read and write the bytes), trusts a length it has not
//! bounded.

use bytes::Bytes;

use super::config::ENTRY_PAYLOAD_BYTES_MAX;
use super::error::StorageError;
use crate::JournalMark;

/// Name of the lock file.
pub(crate) const LOCK_FILE_NAME: &str = "LOCK";
/// Name of the checkpoint file.
pub(crate) const LAST_MARK_FILE_NAME: &str = "lastMark";
/// Name of the index database file.
pub(crate) const INDEX_FILE_NAME: &str = "index.redb";
/// Suffix of entry logs.
const ENTRY_LOG_SUFFIX: &str = ".log";
/// Digits of an entry log's zero-padded id: u64::MAX has 20, but 16 sort right
/// for any id we will ever reach (10^16 logs of 1 GiB).
const ENTRY_LOG_ID_DIGITS: usize = 16;

/// `0000000000000007.log` for id 7.
pub(crate) fn entry_log_file_name(log_id: u64) -> String {
    format!(
        "{log_id:0width$}{ENTRY_LOG_SUFFIX}",
        width = ENTRY_LOG_ID_DIGITS
    )
}

/// The id in an entry log's file name; `None` for any other name.
pub(crate) fn parse_entry_log_file_name(name: &str) -> Option<u64> {
    let digits = name.strip_suffix(ENTRY_LOG_SUFFIX)?;
    if digits.len() != ENTRY_LOG_ID_DIGITS || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

// ---------------------------------------------------------------------------
// Entry log header
// { magic [8] "VELAELOG" | version u32 | header_bytes u32 | log_id u64 | crc32c u32 | zeros }
// The CRC covers the 24 bytes before it. Records start at ENTRY_LOG_HEADER_BYTES.

/// Entry-log magic.
const ENTRY_LOG_MAGIC: [u8; 8] = *b"VELAELOG";
/// The one version written and read so far.
pub(crate) const ENTRY_LOG_VERSION: u32 = 1;
/// Header size: 512 keeps the first record sector-aligned for a future O_DIRECT
/// writer.
pub(crate) const ENTRY_LOG_HEADER_BYTES: u64 = 512;
const ENTRY_LOG_HEADER_USED_BYTES: usize = 28;

/// The entry-log header for `log_id`.
pub(crate) fn encode_entry_log_header(log_id: u64) -> Vec<u8> {
    let mut buf = vec![0u8; ENTRY_LOG_HEADER_BYTES as usize];
    buf[0..8].copy_from_slice(&ENTRY_LOG_MAGIC);
    buf[8..12].copy_from_slice(&ENTRY_LOG_VERSION.to_le_bytes());
    buf[12..16].copy_from_slice(&(ENTRY_LOG_HEADER_BYTES as u32).to_le_bytes());
    buf[16..24].copy_from_slice(&log_id.to_le_bytes());
    let crc = crc32c::crc32c(&buf[0..24]);
    buf[24..28].copy_from_slice(&crc.to_le_bytes());
    buf
}

/// Checks an entry-log header read from `path`; returns the log id it names.
pub(crate) fn decode_entry_log_header(
    buf: &[u8],
    path: &std::path::Path,
) -> Result<u64, StorageError> {
    let bad = |reason: String| Err(StorageError::corruption(path, 0, reason));
    if buf.len() < ENTRY_LOG_HEADER_USED_BYTES {
        return bad(format!("header is {} bytes, short", buf.len()));
    }
    if buf[0..8] != ENTRY_LOG_MAGIC {
        return bad("bad entry-log magic".into());
    }
    let crc_stored = le_u32(&buf[24..28]);
    if crc32c::crc32c(&buf[0..24]) != crc_stored {
        return bad("entry-log header CRC mismatch".into());
    }
    let version = le_u32(&buf[8..12]);
    if version != ENTRY_LOG_VERSION {
        return bad(format!("unknown entry-log version {version}"));
    }
    let header_bytes = le_u32(&buf[12..16]);
    if u64::from(header_bytes) != ENTRY_LOG_HEADER_BYTES {
        return bad(format!("entry-log header size {header_bytes}"));
    }
    Ok(le_u64(&buf[16..24]))
}

// ---------------------------------------------------------------------------
// Entry record
// { payload_len u32 | crc32c u32 | ledger_id u64 | entry_id u64 | payload [payload_len] }
// The CRC (Castagnoli) covers payload_len, ledger_id, entry_id and the payload:
// every byte of the record except itself.

/// Bytes before the payload of a record.
pub(crate) const RECORD_HEADER_BYTES: u64 = 24;

/// Total bytes of a record carrying `payload_bytes`.
pub(crate) fn record_bytes(payload_bytes: usize) -> u64 {
    RECORD_HEADER_BYTES + payload_bytes as u64
}

/// The 24-byte record header for this entry (the payload follows it on disk).
pub(crate) fn encode_record_header(ledger_id: u64, entry_id: u64, payload: &[u8]) -> [u8; 24] {
    debug_assert!(payload.len() <= ENTRY_PAYLOAD_BYTES_MAX as usize);
    let mut h = [0u8; 24];
    h[0..4].copy_from_slice(&(payload.len() as u32).to_le_bytes());
    h[8..16].copy_from_slice(&ledger_id.to_le_bytes());
    h[16..24].copy_from_slice(&entry_id.to_le_bytes());
    let crc = crc32c::crc32c_append(crc32c::crc32c(&h[0..4]), &h[8..24]);
    let crc = crc32c::crc32c_append(crc, payload);
    h[4..8].copy_from_slice(&crc.to_le_bytes());
    h
}

/// How much of a stored record storage checks before it hands the entry out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RecordCheck {
    /// Length, ids and the record's CRC32C: the bytes are the ones stored.
    /// Every reader that does not verify the packaged entry itself (the TCP
    /// server, whose peer may be any client, the LAC derivation, fencing)
    /// uses this.
    Full,
    /// Length and ids only, not the record's CRC32C: for a caller that
    /// checks the packaged entry's own CRC32C (which covers the same payload
    /// bytes) before any of them reaches a consumer, in the same process and
    /// the same buffer: the ledger client reading through `LocalBookies`
    /// (`unpackage` in its reader). A flipped byte is then reported by the
    /// ledger client (a `corrupt entry` warning, its `corrupt_reads`, the
    /// next replica tried) instead of by storage. Checking both would
    /// checksum every catch-up byte twice.
    ReaderVerifies,
}

/// Decodes the record that `buf` holds exactly (header + payload), read from
/// `path` at `offset`, and checks that it is entry (`ledger_id`, `entry_id`)
/// and that its CRC32C matches. Returns the payload as a slice of `buf` (no
/// copy).
pub(crate) fn decode_record(
    buf: &Bytes,
    ledger_id: u64,
    entry_id: u64,
    path: &std::path::Path,
    offset: u64,
) -> Result<Bytes, StorageError> {
    decode_record_checked(buf, ledger_id, entry_id, path, offset, RecordCheck::Full)
}

/// `decode_record`, with the CRC32C checked only under `RecordCheck::Full`
/// (length and ids always).
pub(crate) fn decode_record_checked(
    buf: &Bytes,
    ledger_id: u64,
    entry_id: u64,
    path: &std::path::Path,
    offset: u64,
    check: RecordCheck,
) -> Result<Bytes, StorageError> {
    let bad = |reason: String| Err(StorageError::corruption(path, offset, reason));
    if (buf.len() as u64) < RECORD_HEADER_BYTES {
        return bad(format!(
            "record is {} bytes, shorter than its header",
            buf.len()
        ));
    }
    let payload_len = le_u32(&buf[0..4]);
    if payload_len > ENTRY_PAYLOAD_BYTES_MAX {
        return bad(format!("record length {payload_len} over the limit"));
    }
    if record_bytes(payload_len as usize) != buf.len() as u64 {
        return bad(format!(
            "record length {payload_len} disagrees with the index's {} bytes",
            buf.len()
        ));
    }
    if check == RecordCheck::Full {
        let crc_stored = le_u32(&buf[4..8]);
        let crc = crc32c::crc32c_append(crc32c::crc32c(&buf[0..4]), &buf[8..]);
        if crc != crc_stored {
            return bad(format!(
                "record CRC mismatch (stored {crc_stored:#010x}, computed {crc:#010x})"
            ));
        }
    }
    let (l, e) = (le_u64(&buf[8..16]), le_u64(&buf[16..24]));
    if (l, e) != (ledger_id, entry_id) {
        return bad(format!(
            "record holds {l}:{e}, index says {ledger_id}:{entry_id}"
        ));
    }
    Ok(buf.slice(RECORD_HEADER_BYTES as usize..))
}

// ---------------------------------------------------------------------------
// lastMark file
// { magic [8] "VELAMARK" | version u32 | file_id u64 | offset u64 | crc32c u32 }  (32 bytes)
// The CRC covers the 28 bytes before it.

const LAST_MARK_MAGIC: [u8; 8] = *b"VELAMARK";
const LAST_MARK_VERSION: u32 = 1;
/// Size of the lastMark file.
pub(crate) const LAST_MARK_BYTES: usize = 32;

/// The lastMark file's bytes for `mark`.
pub(crate) fn encode_last_mark(mark: JournalMark) -> [u8; LAST_MARK_BYTES] {
    let mut b = [0u8; LAST_MARK_BYTES];
    b[0..8].copy_from_slice(&LAST_MARK_MAGIC);
    b[8..12].copy_from_slice(&LAST_MARK_VERSION.to_le_bytes());
    b[12..20].copy_from_slice(&mark.file_id.to_le_bytes());
    b[20..28].copy_from_slice(&mark.offset.to_le_bytes());
    let crc = crc32c::crc32c(&b[0..28]);
    b[28..32].copy_from_slice(&crc.to_le_bytes());
    b
}

/// Decodes a lastMark file read from `path`.
pub(crate) fn decode_last_mark(
    buf: &[u8],
    path: &std::path::Path,
) -> Result<JournalMark, StorageError> {
    let bad = |reason: String| Err(StorageError::corruption(path, 0, reason));
    if buf.len() != LAST_MARK_BYTES {
        return bad(format!(
            "lastMark is {} bytes, expected {LAST_MARK_BYTES}",
            buf.len()
        ));
    }
    if buf[0..8] != LAST_MARK_MAGIC {
        return bad("bad lastMark magic".into());
    }
    if crc32c::crc32c(&buf[0..28]) != le_u32(&buf[28..32]) {
        return bad("lastMark CRC mismatch".into());
    }
    let version = le_u32(&buf[8..12]);
    if version != LAST_MARK_VERSION {
        return bad(format!("unknown lastMark version {version}"));
    }
    Ok(JournalMark {
        file_id: le_u64(&buf[12..20]),
        offset: le_u64(&buf[20..28]),
    })
}

pub(crate) fn le_u32(b: &[u8]) -> u32 {
    let mut a = [0u8; 4];
    a.copy_from_slice(&b[..4]);
    u32::from_le_bytes(a)
}

pub(crate) fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn entry_log_name_round_trip() {
        for id in [0u64, 1, 7, 42, 9_999_999_999_999_999] {
            let name = entry_log_file_name(id);
            assert_eq!(name.len(), 20);
            assert_eq!(parse_entry_log_file_name(&name), Some(id));
        }
        assert_eq!(entry_log_file_name(7), "0000000000000007.log");
        for bad in [
            "7.log",
            "000000000000007.log",
            "00000000000000x7.log",
            "0000000000000007.jnl",
            "LOCK",
        ] {
            assert_eq!(parse_entry_log_file_name(bad), None, "{bad}");
        }
    }

    #[test]
    fn entry_log_header_round_trip_and_corruption() {
        let p = Path::new("x.log");
        let h = encode_entry_log_header(42);
        assert_eq!(h.len() as u64, ENTRY_LOG_HEADER_BYTES);
        assert_eq!(decode_entry_log_header(&h, p).unwrap(), 42);
        for i in 0..ENTRY_LOG_HEADER_USED_BYTES {
            let mut bad = h.clone();
            bad[i] ^= 0x01;
            assert!(
                matches!(
                    decode_entry_log_header(&bad, p),
                    Err(StorageError::Corruption { .. })
                ),
                "byte {i}"
            );
        }
        assert!(decode_entry_log_header(&h[..10], p).is_err());
    }

    fn record(l: u64, e: u64, payload: &[u8]) -> Bytes {
        let mut v = encode_record_header(l, e, payload).to_vec();
        v.extend_from_slice(payload);
        Bytes::from(v)
    }

    #[test]
    fn record_round_trip_and_every_flipped_byte_is_corruption() {
        let p = Path::new("x.log");
        let rec = record(5, 9, b"hello world");
        assert_eq!(rec.len() as u64, record_bytes(11));
        assert_eq!(
            &decode_record(&rec, 5, 9, p, 512).unwrap()[..],
            b"hello world"
        );
        for i in 0..rec.len() {
            let mut bad = rec.to_vec();
            bad[i] ^= 0x40;
            let r = decode_record(&Bytes::from(bad), 5, 9, p, 512);
            assert!(
                matches!(r, Err(StorageError::Corruption { offset: 512, .. })),
                "byte {i}"
            );
        }
        // A reader that verifies end to end: the CRC is not checked here
        // (a payload flip passes), length and ids still are.
        let check = RecordCheck::ReaderVerifies;
        let mut flipped = rec.to_vec();
        flipped[30] ^= 0x40;
        assert_eq!(
            &decode_record_checked(&Bytes::from(flipped), 5, 9, p, 512, check).unwrap()[..],
            b"hello 7orld"
        );
        assert!(decode_record_checked(&rec, 5, 10, p, 0, check).is_err());
        assert!(decode_record_checked(&rec.slice(..rec.len() - 1), 5, 9, p, 0, check).is_err());
        let mut wrong_len = rec.to_vec();
        wrong_len[0] ^= 0x01;
        assert!(decode_record_checked(&Bytes::from(wrong_len), 5, 9, p, 0, check).is_err());
        // Right bytes, wrong ids asked for.
        assert!(decode_record(&rec, 5, 10, p, 0).is_err());
        // Truncated.
        assert!(decode_record(&rec.slice(..rec.len() - 1), 5, 9, p, 0).is_err());
        assert!(decode_record(&rec.slice(..10), 5, 9, p, 0).is_err());
    }

    #[test]
    fn last_mark_round_trip_and_corruption() {
        let p = Path::new("lastMark");
        let m = JournalMark {
            file_id: 3,
            offset: 4096,
        };
        let b = encode_last_mark(m);
        assert_eq!(decode_last_mark(&b, p).unwrap(), m);
        for i in 0..LAST_MARK_BYTES {
            let mut bad = b;
            bad[i] ^= 0x80;
            assert!(decode_last_mark(&bad, p).is_err(), "byte {i}");
        }
        assert!(decode_last_mark(&b[..31], p).is_err());
    }

    proptest::proptest! {
        /// Entry-log and lastMark bytes are disk input: arbitrary bytes give a
        /// typed error (or, by chance, a valid decode), never a panic.
        #[test]
        fn arbitrary_disk_bytes_never_panic(v in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..600)) {
            let p = Path::new("x");
            let _ = decode_record(&Bytes::from(v.clone()), 1, 2, p, 0);
            let _ = decode_entry_log_header(&v, p);
            let _ = decode_last_mark(&v, p);
        }
    }
}
