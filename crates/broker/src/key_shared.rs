//! Key_Shared routing: which consumer of a subscription gets a message key.
//!
//! Owns: the sticky-key hash (`vela_wire::hash::murmur3_32_masked`, as the Java
//! broker's `Murmur3_32Hash.makeHash`), the 65536-slot hash space, and the two
//! selectors: AUTO_SPLIT (a new consumer takes the upper half of the largest
//! range; a removed consumer's range goes to its neighbour) and STICKY (ranges
//! given by the consumers, overlaps refused).
//! It also owns the key of an entry (`entry_slot`: ordering key, else
//! partition key, else `NONE_KEY`, read from the entry's metadata) and the
//! selector key of a consumer (`consumer_hash`).
//! Never: reads payloads or tracks permits; the dispatcher asks it for a
//! consumer and decides what to do when that consumer cannot take more.

use std::collections::BTreeMap;

use base64::Engine;
use base64::alphabet;
use base64::engine::{DecodePaddingMode, GeneralPurpose, GeneralPurposeConfig};
use bytes::Bytes;

/// Number of hash slots; a key's slot is `hash % HASH_RANGE_SIZE` (Java's
/// `DEFAULT_RANGE_SIZE`, 2 << 15).
pub const HASH_RANGE_SIZE: u32 = 65_536;
const _: () = assert!(HASH_RANGE_SIZE.is_power_of_two());

/// Key used for messages without ordering key and partition key.
pub const NONE_KEY: &[u8] = b"NONE_KEY";

/// The sticky-key hash of a key (Java's `Murmur3_32Hash.makeHash`).
pub fn sticky_key_hash(key: &[u8]) -> u32 {
    vela_wire::hash::murmur3_32_masked(key)
}

/// The slot of a key in `0..HASH_RANGE_SIZE`.
pub fn slot_of(key: &[u8]) -> u32 {
    sticky_key_hash(key) % HASH_RANGE_SIZE
}

/// Why a consumer could not join a Key_Shared subscription.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AssignError {
    /// AUTO_SPLIT: every range is one slot wide.
    #[error("no more hash ranges can be assigned ({0} consumers)")]
    NoRangeLeft(usize),
    /// STICKY: a range overlaps another consumer's or is malformed.
    #[error("hash range {start}..={end} is invalid or overlaps a range of another consumer")]
    BadRange {
        /// First slot.
        start: i32,
        /// Last slot (inclusive).
        end: i32,
    },
    /// The subscription's mode differs from the consumer's.
    #[error("the subscription uses a different key_shared mode")]
    ModeMismatch,
}

/// Assignment of hash slots to consumers (consumers named by a `u64` key that
/// the dispatcher chooses).
#[derive(Debug, Clone)]
pub enum KeySharedSelector {
    /// Ranges split automatically; keys: inclusive range end → consumer.
    AutoSplit {
        /// Inclusive upper slot (the first consumer's is `HASH_RANGE_SIZE`) → consumer.
        ranges: BTreeMap<u32, u64>,
    },
    /// Ranges chosen by consumers; keys: range start → (inclusive end, consumer).
    Sticky {
        /// start → (end inclusive, consumer).
        ranges: BTreeMap<u32, (u32, u64)>,
    },
}

impl KeySharedSelector {
    /// An empty AUTO_SPLIT selector.
    pub fn auto_split() -> KeySharedSelector {
        KeySharedSelector::AutoSplit {
            ranges: BTreeMap::new(),
        }
    }

    /// An empty STICKY selector.
    pub fn sticky() -> KeySharedSelector {
        KeySharedSelector::Sticky {
            ranges: BTreeMap::new(),
        }
    }

    /// True for STICKY.
    pub fn is_sticky(&self) -> bool {
        matches!(self, KeySharedSelector::Sticky { .. })
    }

    /// Adds `consumer`. For STICKY, `sticky_ranges` are its inclusive ranges.
    pub fn add(&mut self, consumer: u64, sticky_ranges: &[(i32, i32)]) -> Result<(), AssignError> {
        match self {
            KeySharedSelector::AutoSplit { ranges } => {
                if ranges.is_empty() {
                    ranges.insert(HASH_RANGE_SIZE, consumer);
                    return Ok(());
                }
                // Largest range: (lower, upper]; ties go to the first found.
                let mut best_upper = HASH_RANGE_SIZE;
                let mut best_width = 0;
                let mut lower = 0;
                for upper in ranges.keys() {
                    if upper - lower > best_width {
                        best_width = upper - lower;
                        best_upper = *upper;
                    }
                    lower = *upper;
                }
                let best_lower = ranges
                    .range(..best_upper)
                    .next_back()
                    .map_or(0, |(k, _)| *k);
                if best_upper - best_lower <= 1 {
                    return Err(AssignError::NoRangeLeft(ranges.len()));
                }
                let split = best_upper - ((best_upper - best_lower) >> 1);
                ranges.insert(split, consumer);
                Ok(())
            }
            KeySharedSelector::Sticky { ranges } => {
                let mut wanted: Vec<(u32, u32)> = Vec::with_capacity(sticky_ranges.len());
                for &(start, end) in sticky_ranges {
                    let valid = start >= 0 && end >= start && (end as u32) < HASH_RANGE_SIZE;
                    if !valid {
                        return Err(AssignError::BadRange { start, end });
                    }
                    wanted.push((start as u32, end as u32));
                }
                if wanted.is_empty() {
                    return Err(AssignError::BadRange { start: 0, end: -1 });
                }
                for (i, &(start, end)) in wanted.iter().enumerate() {
                    let clash_existing = ranges.iter().any(|(s, (e, _))| start <= *e && *s <= end);
                    let clash_own = wanted[..i].iter().any(|(s, e)| start <= *e && *s <= end);
                    if clash_existing || clash_own {
                        return Err(AssignError::BadRange {
                            start: start as i32,
                            end: end as i32,
                        });
                    }
                }
                for (start, end) in wanted {
                    ranges.insert(start, (end, consumer));
                }
                Ok(())
            }
        }
    }

    /// Removes `consumer`; its slots go to a neighbour (AUTO_SPLIT) or to
    /// nobody (STICKY).
    pub fn remove(&mut self, consumer: u64) {
        match self {
            KeySharedSelector::AutoSplit { ranges } => {
                let Some(upper) = ranges
                    .iter()
                    .find(|(_, c)| **c == consumer)
                    .map(|(k, _)| *k)
                else {
                    return;
                };
                if upper == HASH_RANGE_SIZE && ranges.len() > 1 {
                    // The top range is taken over by the range just below it.
                    let lower = ranges.range(..upper).next_back().map(|(k, c)| (*k, *c));
                    if let Some((lower_key, lower_consumer)) = lower {
                        ranges.remove(&lower_key);
                        ranges.insert(upper, lower_consumer);
                    }
                } else {
                    ranges.remove(&upper);
                }
            }
            KeySharedSelector::Sticky { ranges } => ranges.retain(|_, (_, c)| *c != consumer),
        }
    }

    /// The consumer owning `slot`, if any.
    pub fn select(&self, slot: u32) -> Option<u64> {
        debug_assert!(slot < HASH_RANGE_SIZE);
        match self {
            KeySharedSelector::AutoSplit { ranges } => ranges.range(slot..).next().map(|(_, c)| *c),
            KeySharedSelector::Sticky { ranges } => ranges
                .range(..=slot)
                .next_back()
                .filter(|(_, (end, _))| slot <= *end)
                .map(|(_, (_, c))| *c),
        }
    }
}

/// Selector key of a consumer: a stable 64-bit mix of (connection, consumer).
pub(crate) fn consumer_hash(key: (u64, u64)) -> u64 {
    key.0.wrapping_mul(0x9E37_79B9_7F4A_7C15) ^ key.1
}

/// Key_Shared slot of an entry: ordering_key, else partition_key (base64
/// decoded when flagged), else "NONE_KEY" (Java's `peekStickyKey`).
pub(crate) fn entry_slot(entry: &Bytes) -> u32 {
    let Some(metadata) = crate::codec::entry_metadata(entry) else {
        return slot_of(NONE_KEY);
    };
    if let Some(key) = metadata.ordering_key.as_ref() {
        return slot_of(key);
    }
    if let Some(key) = metadata.partition_key.as_ref() {
        if metadata.partition_key_b64_encoded == Some(true)
            && let Some(decoded) = base64_decode(key)
        {
            return slot_of(&decoded);
        }
        return slot_of(key.as_bytes());
    }
    slot_of(NONE_KEY)
}

/// Standard base64 as Java's `Base64.getDecoder()` writes partition keys;
/// padding may be missing (some clients strip it) and unused trailing bits
/// are ignored, so any key a client sends decodes as it always did.
const PARTITION_KEY_BASE64: GeneralPurpose = GeneralPurpose::new(
    &alphabet::STANDARD,
    GeneralPurposeConfig::new()
        .with_decode_padding_mode(DecodePaddingMode::Indifferent)
        .with_decode_allow_trailing_bits(true),
);

/// Decodes a base64 partition key; `None` on bad input.
fn base64_decode(text: &str) -> Option<Vec<u8>> {
    PARTITION_KEY_BASE64.decode(text).ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn none_key_has_a_slot() {
        assert!(slot_of(NONE_KEY) < HASH_RANGE_SIZE);
    }

    #[test]
    fn auto_split_halves_the_largest_range_and_covers_everything() {
        let mut selector = KeySharedSelector::auto_split();
        assert_eq!(selector.select(5), None);
        selector.add(1, &[]).unwrap();
        assert_eq!(selector.select(0), Some(1));
        assert_eq!(selector.select(HASH_RANGE_SIZE - 1), Some(1));
        selector.add(2, &[]).unwrap();
        assert_eq!(selector.select(0), Some(2));
        assert_eq!(selector.select(32_768), Some(2));
        assert_eq!(selector.select(32_769), Some(1));
        selector.add(3, &[]).unwrap();
        for slot in [0, 100, 40_000, HASH_RANGE_SIZE - 1] {
            assert!(selector.select(slot).is_some());
        }
        selector.remove(1);
        for slot in [0, 100, 40_000, HASH_RANGE_SIZE - 1] {
            let owner = selector.select(slot).unwrap();
            assert!(owner == 2 || owner == 3);
        }
        selector.remove(2);
        selector.remove(3);
        assert_eq!(selector.select(0), None);
    }

    #[test]
    fn sticky_refuses_overlaps() {
        let mut selector = KeySharedSelector::sticky();
        selector.add(1, &[(0, 99)]).unwrap();
        assert!(selector.add(2, &[(99, 200)]).is_err());
        selector.add(2, &[(100, 200)]).unwrap();
        assert_eq!(selector.select(99), Some(1));
        assert_eq!(selector.select(150), Some(2));
        assert_eq!(selector.select(201), None);
        assert!(selector.add(3, &[(10, 5)]).is_err());
        selector.remove(1);
        assert_eq!(selector.select(5), None);
    }

    #[test]
    fn base64_decodes() {
        assert_eq!(base64_decode("aGVsbG8=").unwrap(), b"hello");
        assert_eq!(base64_decode("aGk=").unwrap(), b"hi");
        assert_eq!(base64_decode("YWJj").unwrap(), b"abc");
        // Missing padding is tolerated.
        assert_eq!(base64_decode("aGVsbG8").unwrap(), b"hello");
        assert_eq!(base64_decode("aGk").unwrap(), b"hi");
        assert!(base64_decode("a").is_none());
        assert!(base64_decode("!!!!").is_none());
    }
}
