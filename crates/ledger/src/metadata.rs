//! Ledger metadata and its stored format.
//!
//! Owns: `LedgerMetadata` (quorum, ensembles keyed by first entry id, state, last
//! entry, length, ctime, custom properties), the store path of a ledger, and the
//! encoding (versioned JSON) with its validation.
//! Guarantees: `decode` accepts exactly what `encode` produces for a valid
//! `LedgerMetadata`; anything else is a typed `MetadataFormatError`, never a panic.
//! Never: talks to the store (callers do the CAS), or to bookies.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::types::{BookieId, EntryId, LedgerId, Quorum};

/// Directory of ledger metadata nodes in the metadata store.
pub const LEDGERS_PATH: &str = "/ledgers";

/// Most segments (ensembles) a ledger may have. Each ensemble change adds one; a
/// ledger whose bookies fail this often is better closed and replaced by a new
/// ledger (the managed log rolls over). Also bounds decoding.
pub const ENSEMBLES_MAX: usize = 1024;

/// Most custom properties on a ledger (Pulsar sets three or four).
pub const PROPERTIES_MAX: usize = 64;

/// Largest encoded metadata accepted by `decode` (ensembles at the limit fit).
pub const METADATA_BYTES_MAX: usize = 1024 * 1024;

/// Format version written by `encode`.
const FORMAT_VERSION: u32 = 1;

/// `/ledgers/<id, 20 digits>`: zero-padded so children sort by id.
pub fn ledger_path(ledger_id: LedgerId) -> String {
    format!("{LEDGERS_PATH}/{:020}", ledger_id.0)
}

/// Lifecycle of a ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum LedgerState {
    /// A writer may add entries.
    Open,
    /// A reader is fencing the bookies and deciding where the ledger ends; the old
    /// writer's ensemble changes and close fail.
    InRecovery,
    /// Immutable: `last_entry` and `length` are final.
    Closed,
}

/// Everything the store knows about one ledger.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LedgerMetadata {
    /// E, Qw, Qa.
    pub quorum: Quorum,
    /// Segments: first entry id -> the E bookies of that segment. Never empty; the
    /// first key is entry 0.
    pub ensembles: BTreeMap<EntryId, Vec<BookieId>>,
    /// Lifecycle state.
    pub state: LedgerState,
    /// Last entry of a closed ledger (`None`: closed empty, or not closed yet).
    pub last_entry: Option<EntryId>,
    /// Payload bytes of a closed ledger (0 until closed).
    pub length_bytes: u64,
    /// Creation time, milliseconds since the Unix epoch.
    pub ctime_ms: u64,
    /// Application properties (e.g. which managed log owns the ledger).
    pub properties: BTreeMap<String, String>,
}

impl LedgerMetadata {
    /// A fresh OPEN ledger on `ensemble`.
    pub fn new_open(
        quorum: Quorum,
        ensemble: Vec<BookieId>,
        ctime_ms: u64,
        properties: BTreeMap<String, String>,
    ) -> LedgerMetadata {
        assert_eq!(ensemble.len(), quorum.ensemble_size());
        let mut ensembles = BTreeMap::new();
        ensembles.insert(EntryId(0), ensemble);
        LedgerMetadata {
            quorum,
            ensembles,
            state: LedgerState::Open,
            last_entry: None,
            length_bytes: 0,
            ctime_ms,
            properties,
        }
    }

    /// The ensemble that stores `entry` (the segment with the greatest first entry
    /// at or below it).
    pub fn ensemble_for(&self, entry: EntryId) -> &[BookieId] {
        match self.ensembles.range(..=entry).next_back() {
            Some((_, ensemble)) => ensemble,
            // The first segment starts at entry 0 (checked by validate).
            None => unreachable_first_segment(),
        }
    }

    /// First entry and bookies of the last segment.
    pub fn last_ensemble(&self) -> (EntryId, &[BookieId]) {
        match self.ensembles.iter().next_back() {
            Some((first, ensemble)) => (*first, ensemble),
            None => unreachable_first_segment(),
        }
    }

    /// The bookies of `entry`'s write set, in write-set order.
    pub fn write_set(&self, entry: EntryId) -> Vec<BookieId> {
        let ensemble = self.ensemble_for(entry);
        self.quorum
            .write_set(entry)
            .map(|index| ensemble[index].clone())
            .collect()
    }

    /// Every bookie that ever held a segment, sorted, without duplicates.
    pub fn all_bookies(&self) -> Vec<BookieId> {
        let mut bookies: Vec<BookieId> = self.ensembles.values().flatten().cloned().collect();
        bookies.sort();
        bookies.dedup();
        bookies
    }

    /// Replaces the bookies of the segment starting at `first_entry` (a new
    /// segment, or the last one if it already starts there).
    pub fn set_last_ensemble(&mut self, first_entry: EntryId, ensemble: Vec<BookieId>) {
        let (last_first, _) = self.last_ensemble();
        assert!(first_entry >= last_first, "segments only grow forward");
        assert_eq!(ensemble.len(), self.quorum.ensemble_size());
        self.ensembles.insert(first_entry, ensemble);
    }

    fn validate(&self) -> Result<(), MetadataFormatError> {
        let first = self.ensembles.keys().next().copied();
        if first != Some(EntryId(0)) {
            return Err(MetadataFormatError::Invalid(
                "first segment must start at entry 0",
            ));
        }
        if self.ensembles.len() > ENSEMBLES_MAX {
            return Err(MetadataFormatError::Invalid("too many segments"));
        }
        if self.properties.len() > PROPERTIES_MAX {
            return Err(MetadataFormatError::Invalid("too many properties"));
        }
        for ensemble in self.ensembles.values() {
            if ensemble.len() != self.quorum.ensemble_size() {
                return Err(MetadataFormatError::Invalid("segment size differs from E"));
            }
            let mut sorted: Vec<&BookieId> = ensemble.iter().collect();
            sorted.sort();
            sorted.dedup();
            if sorted.len() != ensemble.len() {
                return Err(MetadataFormatError::Invalid("bookie twice in one segment"));
            }
        }
        if self.state != LedgerState::Closed
            && (self.last_entry.is_some() || self.length_bytes != 0)
        {
            return Err(MetadataFormatError::Invalid(
                "last entry set on an unclosed ledger",
            ));
        }
        Ok(())
    }
}

#[cold]
fn unreachable_first_segment() -> ! {
    // validate() and new_open() guarantee a segment at entry 0.
    panic!("ledger metadata without a first segment")
}

/// Why stored bytes are not valid ledger metadata.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetadataFormatError {
    /// Larger than `METADATA_BYTES_MAX`.
    #[error("ledger metadata is {len_bytes} bytes, over {METADATA_BYTES_MAX}")]
    TooLarge {
        /// Size of the stored value.
        len_bytes: usize,
    },
    /// Not the JSON shape of any known version.
    #[error("ledger metadata is not valid JSON of the expected shape: {0}")]
    Syntax(String),
    /// A format version this build does not read.
    #[error("ledger metadata format version {0} is unknown")]
    UnknownVersion(u32),
    /// Decoded, but breaks an invariant (quorum order, segment shape).
    #[error("ledger metadata is inconsistent: {0}")]
    Invalid(&'static str),
}

// Stored shape (JSON, format_version 1):
// { "format_version": 1, "ensemble_size": E, "write_quorum": Qw, "ack_quorum": Qa,
//   "state": "OPEN" | "IN_RECOVERY" | "CLOSED", "last_entry_id": u64 | null,
//   "length_bytes": u64, "ctime_ms": u64,
//   "segments": [ { "first_entry_id": u64, "bookies": [ "<bookie id>", .. ] }, .. ],
//   "properties": { "<key>": "<value>", .. } }
// Kept apart from `LedgerMetadata` so the stored format changes only on purpose.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredV1 {
    format_version: u32,
    ensemble_size: usize,
    write_quorum: usize,
    ack_quorum: usize,
    state: String,
    last_entry_id: Option<u64>,
    length_bytes: u64,
    ctime_ms: u64,
    segments: Vec<StoredSegment>,
    properties: BTreeMap<String, String>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct StoredSegment {
    first_entry_id: u64,
    bookies: Vec<String>,
}

#[derive(Deserialize)]
struct VersionOnly {
    format_version: u32,
}

/// Encodes metadata for the store.
pub fn encode(metadata: &LedgerMetadata) -> Vec<u8> {
    debug_assert!(metadata.validate().is_ok());
    let stored = StoredV1 {
        format_version: FORMAT_VERSION,
        ensemble_size: metadata.quorum.ensemble_size(),
        write_quorum: metadata.quorum.write_quorum(),
        ack_quorum: metadata.quorum.ack_quorum(),
        state: match metadata.state {
            LedgerState::Open => "OPEN",
            LedgerState::InRecovery => "IN_RECOVERY",
            LedgerState::Closed => "CLOSED",
        }
        .to_owned(),
        last_entry_id: metadata.last_entry.map(|e| e.0),
        length_bytes: metadata.length_bytes,
        ctime_ms: metadata.ctime_ms,
        segments: metadata
            .ensembles
            .iter()
            .map(|(first, bookies)| StoredSegment {
                first_entry_id: first.0,
                bookies: bookies.iter().map(|b| b.0.clone()).collect(),
            })
            .collect(),
        properties: metadata.properties.clone(),
    };
    // Serializing plain structs of strings and integers to a Vec cannot fail.
    serde_json::to_vec(&stored).unwrap_or_default()
}

/// Decodes and validates stored metadata.
pub fn decode(bytes: &[u8]) -> Result<LedgerMetadata, MetadataFormatError> {
    if bytes.len() > METADATA_BYTES_MAX {
        return Err(MetadataFormatError::TooLarge {
            len_bytes: bytes.len(),
        });
    }
    let syntax = |e: serde_json::Error| MetadataFormatError::Syntax(e.to_string());
    let version: VersionOnly = serde_json::from_slice(bytes).map_err(syntax)?;
    if version.format_version != FORMAT_VERSION {
        return Err(MetadataFormatError::UnknownVersion(version.format_version));
    }
    let stored: StoredV1 = serde_json::from_slice(bytes).map_err(syntax)?;
    let quorum = Quorum::new(stored.ensemble_size, stored.write_quorum, stored.ack_quorum)
        .map_err(|_| MetadataFormatError::Invalid("quorum order"))?;
    let state = match stored.state.as_str() {
        "OPEN" => LedgerState::Open,
        "IN_RECOVERY" => LedgerState::InRecovery,
        "CLOSED" => LedgerState::Closed,
        _ => return Err(MetadataFormatError::Invalid("unknown state")),
    };
    if stored.segments.len() > ENSEMBLES_MAX {
        return Err(MetadataFormatError::Invalid("too many segments"));
    }
    let mut ensembles = BTreeMap::new();
    let mut previous_first: Option<u64> = None;
    for segment in stored.segments {
        if previous_first.is_some_and(|p| p >= segment.first_entry_id) {
            return Err(MetadataFormatError::Invalid("segments out of order"));
        }
        previous_first = Some(segment.first_entry_id);
        let bookies = segment.bookies.into_iter().map(BookieId).collect();
        ensembles.insert(EntryId(segment.first_entry_id), bookies);
    }
    let metadata = LedgerMetadata {
        quorum,
        ensembles,
        state,
        last_entry: stored.last_entry_id.map(EntryId),
        length_bytes: stored.length_bytes,
        ctime_ms: stored.ctime_ms,
        properties: stored.properties,
    };
    metadata.validate()?;
    Ok(metadata)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn sample() -> LedgerMetadata {
        let bookies = |names: &[&str]| names.iter().map(|n| BookieId::new(*n)).collect();
        let mut properties = BTreeMap::new();
        properties.insert("application".to_owned(), "pulsar".to_owned());
        let mut m = LedgerMetadata::new_open(
            Quorum::new(3, 2, 2).unwrap(),
            bookies(&["b1", "b2", "b3"]),
            1_700_000_000_000,
            properties,
        );
        m.set_last_ensemble(EntryId(17), bookies(&["b1", "b4", "b3"]));
        m
    }

    #[test]
    fn round_trip_in_every_state() {
        let mut m = sample();
        assert_eq!(decode(&encode(&m)).unwrap(), m);
        m.state = LedgerState::InRecovery;
        assert_eq!(decode(&encode(&m)).unwrap(), m);
        m.state = LedgerState::Closed;
        m.last_entry = Some(EntryId(41));
        m.length_bytes = 4200;
        assert_eq!(decode(&encode(&m)).unwrap(), m);
    }

    #[test]
    fn segments_answer_which_bookies_store_an_entry() {
        let m = sample();
        assert_eq!(m.ensemble_for(EntryId(16))[1], BookieId::new("b2"));
        assert_eq!(m.ensemble_for(EntryId(17))[1], BookieId::new("b4"));
        // entry 17: 17 mod 3 = 2 -> indices 2, 0
        assert_eq!(
            m.write_set(EntryId(17)),
            vec![BookieId::new("b3"), BookieId::new("b1")]
        );
        assert_eq!(m.all_bookies().len(), 4);
        assert_eq!(ledger_path(LedgerId(42)), "/ledgers/00000000000000000042");
    }

    #[test]
    fn bad_bytes_are_typed_errors() {
        assert!(matches!(
            decode(b"not json"),
            Err(MetadataFormatError::Syntax(_))
        ));
        assert!(matches!(
            decode(br#"{"format_version": 9}"#),
            Err(MetadataFormatError::UnknownVersion(9))
        ));
        let good = String::from_utf8(encode(&sample())).unwrap();
        let bad_quorum = good.replace("\"ack_quorum\":2", "\"ack_quorum\":3");
        assert_eq!(
            decode(bad_quorum.as_bytes()),
            Err(MetadataFormatError::Invalid("quorum order"))
        );
        let dup = good.replace("\"b4\"", "\"b1\"");
        assert!(matches!(
            decode(dup.as_bytes()),
            Err(MetadataFormatError::Invalid(_))
        ));
        let no_first = good.replace("\"first_entry_id\":0", "\"first_entry_id\":1");
        assert!(matches!(
            decode(no_first.as_bytes()),
            Err(MetadataFormatError::Invalid(_))
        ));
        for cut in 0..good.len() {
            assert!(decode(&good.as_bytes()[..cut]).is_err());
        }
    }
}
