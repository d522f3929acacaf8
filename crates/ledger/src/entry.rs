//! The packaged entry, as the ledger client builds and checks it.
//!
//! Owns: nothing of the format itself; the layout belongs to
//! `vela_bookie::entry` and this module adapts it to the ledger client's types.

use bytes::Bytes;

use crate::types::{EntryId, LedgerId};

pub(crate) use vela_bookie_protocol::entry::EntryHeader;
pub use vela_bookie_protocol::entry::{ENTRY_PAYLOAD_BYTES_MAX, EntryError};

/// Packages `payload` as entry `entry_id` of `ledger_id`, carrying the writer's
/// `lac` and the ledger length including this entry.
pub(crate) fn package(
    ledger_id: LedgerId,
    entry_id: EntryId,
    lac: Option<EntryId>,
    ledger_length_bytes: u64,
    payload: &[u8],
) -> Bytes {
    let header = EntryHeader {
        ledger_id: ledger_id.0,
        entry_id: entry_id.0,
        last_add_confirmed: lac.map(|e| e.0),
        ledger_length: ledger_length_bytes,
    };
    vela_bookie_protocol::entry::encode_entry(&header, payload)
}

/// Checks a bookie's answer: CRC, and that it is `ledger_id`:`entry_id`.
/// Returns the header and the payload (no copy).
pub(crate) fn unpackage(
    packaged: &Bytes,
    ledger_id: LedgerId,
    entry_id: EntryId,
) -> Result<(EntryHeader, Bytes), EntryError> {
    vela_bookie_protocol::entry::decode_expected_entry(packaged, ledger_id.0, entry_id.0)
}

/// The LAC an entry carries, without a CRC check (what a bookie does).
pub(crate) fn carried_lac(packaged: &[u8]) -> Result<Option<EntryId>, EntryError> {
    Ok(vela_bookie_protocol::entry::parse_header(packaged)?
        .last_add_confirmed
        .map(EntryId))
}
