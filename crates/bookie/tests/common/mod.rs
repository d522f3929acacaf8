//! Helpers shared by the integration tests: the storage tests' entry-log
//! layout here, the journal tests' helpers in [`journal`]. Each test crate uses
//! part of them.
#![allow(clippy::unwrap_used, clippy::expect_used, dead_code, unreachable_pub)]

pub(crate) mod journal;

/// Bytes of an entry record's header in an entry log.
pub(crate) const RECORD_HEADER_BYTES: usize = 24;

/// Offset of the first record in an entry log's `bytes`, found by its payload:
/// records start after the 512-byte header, or after a whole 4 KiB block when
/// the log was written with O_DIRECT (where the filesystem takes it).
pub(crate) fn records_start(log_bytes: &[u8], first_payload: &[u8]) -> usize {
    let start = log_bytes
        .windows(first_payload.len())
        .position(|w| w == first_payload)
        .expect("the first payload is in the log")
        - RECORD_HEADER_BYTES;
    assert!(start == 512 || start == 4096, "records start at {start}");
    start
}
