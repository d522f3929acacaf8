//! Byte layout of the persistent-memory region: the superblock, the slot
//! table, and where each slot starts. Slots hold journal files in the file
//! journal's own format (`journal::format`): header block, records, FileEnd.
//!
//! Owns: every byte of the region that is not inside a slot. Never does I/O:
//! callers hand in slices. Decoding treats its input as untrusted.

use crate::journal::format::{read_u32, read_u64};

/// Bytes before the first slot: the superblock and the slot table.
pub(crate) const HEADER_AREA_BYTES: u64 = 4096;
/// Magic of a Vela persistent-memory journal region.
pub(crate) const MAGIC: [u8; 8] = *b"VELAPMEM";
/// Layout version this code writes and reads.
pub(crate) const VERSION: u32 = 1;
/// Superblock fields (the crc covers the bytes before it).
const SUPERBLOCK_FIELDS_BYTES: usize = 36;
/// Where the slot table starts in the header area.
const SLOT_TABLE_OFFSET: u64 = 64;
/// Most slots a region has: the table must fit the header area.
pub(crate) const SLOTS_MAX: u32 = 256;
const _: () = assert!(SLOT_TABLE_OFFSET + 8 * SLOTS_MAX as u64 <= HEADER_AREA_BYTES);
/// Fewest slots: the file being written, the next one the preallocator
/// prepares, the one kept free for the first file after a restart (see
/// `Slots::allocate`), and one more so a checkpoint lagging by one slot does
/// not stop the writer.
pub(crate) const SLOTS_MIN: u32 = 4;
/// Slots aim at this size: a checkpoint frees whole slots, so smaller slots
/// free space sooner; larger ones rotate (a FileEnd and a table update) less.
pub(crate) const SLOT_BYTES_TARGET: u64 = 64 << 20;
/// Slot sizes are multiples of this (it divides every journal alignment the
/// pmem backend takes, so a slot always ends on a group boundary).
pub(crate) const SLOT_ROUNDING_BYTES: u64 = 64 << 10;

// ---------------------------------------------------------------------------
// Superblock, at offset 0 (little endian), written once when the region is
// formatted:
// { magic [8] = "VELAPMEM" | version u32 | slot_count u32 | slot_bytes u64
//   | region_bytes u64 | crc32c u32 }   crc32c over the 32 bytes before it
// Slot table at offset 64: slot_count entries of u64, each updated in place
// by one aligned 8-byte store (persistent memory never tears those):
//   bits 63..62 = 00 free (bits 61..0 zero)
//                 01 next: being prepared, not replayed (bits 61..0 zero)
//                 10 live: journal file id in bits 61..0
//                 11 invalid
// Slot i spans [HEADER_AREA_BYTES + i * slot_bytes, + slot_bytes).
// ---------------------------------------------------------------------------

/// The region's fixed geometry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Geometry {
    /// Slots in the ring.
    pub(crate) slot_count: u32,
    /// Bytes per slot (a multiple of `SLOT_ROUNDING_BYTES`).
    pub(crate) slot_bytes: u64,
    /// Size of the region file.
    pub(crate) region_bytes: u64,
}

impl Geometry {
    /// The geometry a new region of `region_bytes` gets: slots of about
    /// `SLOT_BYTES_TARGET`, at least `SLOTS_MIN`, at most `SLOTS_MAX`. `None`
    /// when the region is too small for `SLOTS_MIN` slots of one rounding unit.
    pub(crate) fn for_region(region_bytes: u64) -> Option<Geometry> {
        let usable = region_bytes.checked_sub(HEADER_AREA_BYTES)?;
        let slot_count =
            (usable / SLOT_BYTES_TARGET).clamp(u64::from(SLOTS_MIN), u64::from(SLOTS_MAX));
        let slot_bytes = usable / slot_count / SLOT_ROUNDING_BYTES * SLOT_ROUNDING_BYTES;
        if slot_bytes == 0 {
            return None;
        }
        Some(Geometry {
            slot_count: u32::try_from(slot_count).ok()?,
            slot_bytes,
            region_bytes,
        })
    }

    /// Offset of slot `index` in the region.
    pub(crate) fn slot_offset(&self, index: usize) -> u64 {
        assert!(index < self.slot_count as usize);
        HEADER_AREA_BYTES + index as u64 * self.slot_bytes
    }

    /// Offset of slot `index`'s table entry.
    pub(crate) fn entry_offset(index: usize) -> u64 {
        assert!(index < SLOTS_MAX as usize);
        SLOT_TABLE_OFFSET + 8 * index as u64
    }
}

/// Writes the superblock into the start of `out` (the rest of the header area
/// is the caller's zeros: every slot free).
pub(crate) fn encode_superblock(geometry: Geometry, out: &mut [u8]) {
    assert!(out.len() >= SUPERBLOCK_FIELDS_BYTES);
    out[0..8].copy_from_slice(&MAGIC);
    out[8..12].copy_from_slice(&VERSION.to_le_bytes());
    out[12..16].copy_from_slice(&geometry.slot_count.to_le_bytes());
    out[16..24].copy_from_slice(&geometry.slot_bytes.to_le_bytes());
    out[24..32].copy_from_slice(&geometry.region_bytes.to_le_bytes());
    let crc = crc32c::crc32c(&out[0..32]);
    out[32..36].copy_from_slice(&crc.to_le_bytes());
}

/// What the first bytes of a region file hold.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Superblock {
    /// All zeros: never formatted, or formatting was interrupted (the
    /// superblock is the last thing formatting writes).
    Unformatted,
    /// A valid superblock.
    Formatted(Geometry),
}

/// Decodes the superblock; the error says what is wrong (the caller names the
/// file).
pub(crate) fn decode_superblock(bytes: &[u8]) -> Result<Superblock, String> {
    if bytes.len() < SUPERBLOCK_FIELDS_BYTES {
        return Err(format!(
            "shorter than the superblock ({} bytes)",
            bytes.len()
        ));
    }
    if bytes[..SUPERBLOCK_FIELDS_BYTES].iter().all(|b| *b == 0) {
        return Ok(Superblock::Unformatted);
    }
    if bytes[0..8] != MAGIC {
        return Err(format!(
            "bad magic {:02x?} (not a Vela pmem journal region)",
            &bytes[0..8]
        ));
    }
    let crc_stored = read_u32(bytes, 32);
    if crc32c::crc32c(&bytes[0..32]) != crc_stored {
        return Err("superblock crc mismatch".to_string());
    }
    let version = read_u32(bytes, 8);
    if version != VERSION {
        return Err(format!(
            "unsupported version {version} (this build reads {VERSION})"
        ));
    }
    let geometry = Geometry {
        slot_count: read_u32(bytes, 12),
        slot_bytes: read_u64(bytes, 16),
        region_bytes: read_u64(bytes, 24),
    };
    let slots_fit = u64::from(geometry.slot_count)
        .checked_mul(geometry.slot_bytes)
        .and_then(|b| b.checked_add(HEADER_AREA_BYTES))
        .is_some_and(|end| end <= geometry.region_bytes);
    if !(SLOTS_MIN..=SLOTS_MAX).contains(&geometry.slot_count)
        || geometry.slot_bytes == 0
        || !geometry.slot_bytes.is_multiple_of(SLOT_ROUNDING_BYTES)
        || !slots_fit
    {
        return Err(format!("inconsistent geometry {geometry:?}"));
    }
    Ok(Superblock::Formatted(geometry))
}

/// What a slot holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum SlotState {
    /// Holds nothing replay reads (maybe records of an earlier lap, which fail
    /// their crc under any later file id).
    Free,
    /// The next file, being prepared: not replayed.
    Next,
    /// Journal file `id`.
    Live(u64),
}

const STATE_SHIFT: u32 = 62;
const ID_MASK: u64 = (1 << STATE_SHIFT) - 1;
const STATE_NEXT: u64 = 1;
const STATE_LIVE: u64 = 2;

/// File ids must fit the table entry.
pub(crate) const FILE_ID_MAX: u64 = ID_MASK;

/// Encodes a table entry.
pub(crate) fn encode_slot(state: SlotState) -> u64 {
    match state {
        SlotState::Free => 0,
        SlotState::Next => STATE_NEXT << STATE_SHIFT,
        SlotState::Live(id) => {
            assert!(
                id <= FILE_ID_MAX,
                "journal file id {id} beyond the slot table's range"
            );
            (STATE_LIVE << STATE_SHIFT) | id
        }
    }
}

/// Decodes a table entry; the error says what is wrong.
pub(crate) fn decode_slot(entry: u64) -> Result<SlotState, String> {
    let id = entry & ID_MASK;
    match (entry >> STATE_SHIFT, id) {
        (0, 0) => Ok(SlotState::Free),
        (STATE_NEXT, 0) => Ok(SlotState::Next),
        (STATE_LIVE, id) => Ok(SlotState::Live(id)),
        _ => Err(format!("bad slot table entry {entry:#018x}")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn superblock_round_trips_and_refuses_damage() {
        let geometry = Geometry::for_region(1 << 30).unwrap();
        assert_eq!(geometry.slot_count, 15, "~64 MiB slots");
        let mut block = vec![0u8; HEADER_AREA_BYTES as usize];
        assert_eq!(decode_superblock(&block), Ok(Superblock::Unformatted));
        encode_superblock(geometry, &mut block);
        assert_eq!(
            decode_superblock(&block),
            Ok(Superblock::Formatted(geometry))
        );
        for at in 0..SUPERBLOCK_FIELDS_BYTES {
            let mut bad = block.clone();
            bad[at] ^= 0x10;
            assert!(
                decode_superblock(&bad).is_err(),
                "flipped byte {at} accepted"
            );
        }
        assert!(decode_superblock(&block[..10]).is_err());
    }

    #[test]
    fn geometry_bounds_slot_count_and_rounds_slot_size() {
        let small = Geometry::for_region(16 << 20).unwrap();
        assert_eq!(small.slot_count, SLOTS_MIN);
        assert!(small.slot_bytes.is_multiple_of(SLOT_ROUNDING_BYTES));
        assert!(small.slot_offset(3) + small.slot_bytes <= small.region_bytes);
        let huge = Geometry::for_region(1 << 40).unwrap();
        assert_eq!(huge.slot_count, SLOTS_MAX);
        assert!(Geometry::for_region(HEADER_AREA_BYTES + 1000).is_none());
        assert!(Geometry::for_region(10).is_none());
    }

    proptest::proptest! {
        /// Arbitrary region bytes never panic the decoders, and a superblock
        /// they accept re-encodes to the same bytes.
        #[test]
        fn decoding_never_panics_on_arbitrary_bytes(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..64),
            entry: u64,
        ) {
            if let Ok(Superblock::Formatted(geometry)) = decode_superblock(&bytes) {
                let mut again = vec![0u8; SUPERBLOCK_FIELDS_BYTES];
                encode_superblock(geometry, &mut again);
                proptest::prop_assert_eq!(&again[..], &bytes[..SUPERBLOCK_FIELDS_BYTES]);
            }
            if let Ok(state) = decode_slot(entry) {
                proptest::prop_assert_eq!(encode_slot(state), entry);
            }
        }
    }

    #[test]
    fn slot_entries_round_trip_and_refuse_invalid_bits() {
        for state in [
            SlotState::Free,
            SlotState::Next,
            SlotState::Live(0),
            SlotState::Live(42),
            SlotState::Live(FILE_ID_MAX),
        ] {
            assert_eq!(decode_slot(encode_slot(state)), Ok(state));
        }
        assert!(decode_slot(3 << 62).is_err());
        assert!(decode_slot(5).is_err(), "free with an id");
        assert!(decode_slot((1 << 62) | 9).is_err(), "next with an id");
    }
}
