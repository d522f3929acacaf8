//! Namespace bundles as hash ranges: Pulsar's layout (`BUNDLES_DEFAULT`
//! equal ranges of the CRC32 of the full topic name, the last one closed at
//! 0xffffffff), range names, and which bundle a topic falls in.
//!
//! Owns: [`BundleRange`], `topic_hash` and the layout arithmetic. Pure: no
//! store, no I/O. Never: decides ownership (`ownership` does).

use crate::topic_name::TopicName;

/// Bundles of a new namespace (Pulsar's `defaultNumberOfNamespaceBundles`).
pub const BUNDLES_DEFAULT: u32 = 4;

/// Bundles one namespace may be split into at most.
pub const BUNDLES_PER_NAMESPACE_MAX: usize = 1024;

/// Upper end (exclusive) of the hash space.
pub(super) const HASH_END: u64 = 1 << 32;

/// A hash range `[lower, upper)` of one namespace's topics (the last bundle
/// of a namespace ends at `HASH_END`, i.e. includes 0xffffffff).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BundleRange {
    /// First hash in the bundle.
    pub lower: u64,
    /// One past the last hash.
    pub upper: u64,
}

impl BundleRange {
    /// Pulsar's name of the range: `0x00000000_0x40000000` (the last bundle's
    /// upper bound is written `0xffffffff`).
    pub fn name(&self) -> String {
        format!(
            "0x{:08x}_0x{:08x}",
            self.lower,
            self.upper.min(HASH_END - 1)
        )
    }

    /// Parses `0xLOWER_0xUPPER`.
    pub fn parse(name: &str) -> Option<BundleRange> {
        let (lower, upper) = name.split_once('_')?;
        let parse = |text: &str| u64::from_str_radix(text.strip_prefix("0x")?, 16).ok();
        let lower = parse(lower)?;
        let mut upper = parse(upper)?;
        if upper == HASH_END - 1 {
            upper = HASH_END;
        }
        (lower < upper && upper <= HASH_END).then_some(BundleRange { lower, upper })
    }

    /// Whether the topic hash `hash` falls in this range.
    pub fn contains(&self, hash: u64) -> bool {
        self.lower <= hash && hash < self.upper
    }
}

/// The bundle hash of a topic: CRC32 (IEEE) of its full name, as Pulsar's
/// `NamespaceBundleFactory` with its default hash.
pub fn topic_hash(topic: &TopicName) -> u64 {
    u64::from(crc32fast::hash(topic.to_string().as_bytes()))
}

/// Boundaries of `count` equal bundles.
pub(super) fn even_boundaries(count: u32) -> Vec<u64> {
    let count = u64::from(count.max(1));
    (0..=count).map(|i| i * HASH_END / count).collect()
}

/// The default bundles of a namespace: `count` equal ranges.
pub fn default_layout(count: u32) -> Vec<BundleRange> {
    even_boundaries(count)
        .windows(2)
        .map(|w| BundleRange {
            lower: w[0],
            upper: w[1],
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundle_names_round_trip() {
        let layout = even_boundaries(4);
        assert_eq!(layout, vec![0, 1 << 30, 2 << 30, 3 << 30, 1 << 32]);
        let last = BundleRange {
            lower: 3 << 30,
            upper: HASH_END,
        };
        assert_eq!(last.name(), "0xc0000000_0xffffffff");
        assert_eq!(BundleRange::parse(&last.name()), Some(last));
        let first = BundleRange {
            lower: 0,
            upper: 1 << 30,
        };
        assert_eq!(first.name(), "0x00000000_0x40000000");
        assert_eq!(BundleRange::parse(&first.name()), Some(first));
        assert!(last.contains(0xffff_ffff));
        assert!(!first.contains(1 << 30));
        assert_eq!(BundleRange::parse("0x10_0x05"), None);
        assert_eq!(BundleRange::parse("junk"), None);
    }
}
