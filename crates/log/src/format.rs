//! The log's metadata records and keys. Owns the JSON layout of a log's ledger
//! list and of a cursor's state, and the metadata-store keys they live under.
//!
//! Keys: `/managed-ledgers/<log name>` holds `LogInfo`;
//! `/managed-ledgers/<log name>/cursors/<encoded cursor name>` holds `CursorInfo`.
//! Format changes bump `FORMAT_VERSION`; decoding a newer version is an error.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::position::Position;

/// Version written into every record.
pub(crate) const FORMAT_VERSION: u32 = 1;

/// Root of all logs in the metadata store.
pub(crate) const LOGS_ROOT: &str = "/managed-ledgers";

/// One ledger of a log.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LedgerInfo {
    pub(crate) ledger_id: u64,
    /// Entries confirmed in the ledger (exact once the ledger is closed).
    pub(crate) entries: u64,
    pub(crate) size_bytes: u64,
    pub(crate) created_unix_ms: u64,
    /// When the ledger was closed (rollover or recovery); retention by time
    /// counts from here. Absent in records written before it existed, and
    /// for the ledger being written.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) closed_unix_ms: Option<u64>,
    /// Where the ledger was (or is being) copied in object storage (Pulsar's
    /// `OffloadContext`); absent for a ledger never offloaded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub(crate) offload: Option<OffloadInfo>,
}

/// A ledger's offload state (Pulsar's `OffloadContext`). The uid names the
/// attempt's objects; it is recorded *before* any object is written, so an
/// attempt cut short (crash, store down) leaves a uid whose objects the next
/// attempt deletes. Readers use the objects only once `complete` is set,
/// which is stored only after both objects were fully written.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct OffloadInfo {
    /// High and low halves of the attempt's 128-bit uid (Pulsar's
    /// `uidMsb`/`uidLsb`): JSON numbers stay within 64 bits.
    pub(crate) uid_msb: u64,
    pub(crate) uid_lsb: u64,
    /// Both objects are written: reads come from object storage.
    #[serde(default)]
    pub(crate) complete: bool,
    /// The bookies' copy is deleted (after the deletion lag): the objects
    /// are the only copy.
    #[serde(default)]
    pub(crate) bookie_deleted: bool,
    /// When the offload completed (ms since the Unix epoch); the deletion
    /// lag counts from here. 0 until complete.
    #[serde(default)]
    pub(crate) offloaded_unix_ms: u64,
}

impl OffloadInfo {
    pub(crate) fn uid(&self) -> u128 {
        (u128::from(self.uid_msb) << 64) | u128::from(self.uid_lsb)
    }

    pub(crate) fn started(uid: u128) -> OffloadInfo {
        OffloadInfo {
            uid_msb: (uid >> 64) as u64,
            uid_lsb: uid as u64,
            complete: false,
            bookie_deleted: false,
            offloaded_unix_ms: 0,
        }
    }
}

/// A log's ledger list.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct LogInfo {
    pub(crate) version: u32,
    pub(crate) ledgers: Vec<LedgerInfo>,
    /// Terminated (Pulsar's topic termination): no append is ever accepted.
    #[serde(default)]
    pub(crate) terminated: bool,
}

/// Individually acknowledged entries of one ledger: `first..=last`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct AckedRange {
    pub(crate) ledger_id: u64,
    pub(crate) first_entry_id: u64,
    pub(crate) last_entry_id: u64,
}

/// Partial acknowledgement of a batch entry (bit set = message not yet acked).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct BatchAck {
    pub(crate) ledger_id: u64,
    pub(crate) entry_id: u64,
    pub(crate) ack_set: Vec<u64>,
}

/// A cursor's persisted state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) struct CursorInfo {
    pub(crate) version: u32,
    /// Everything at or before it is acknowledged; `None`: nothing is.
    pub(crate) mark_delete: Option<(u64, u64)>,
    pub(crate) acked_ranges: Vec<AckedRange>,
    pub(crate) batch_acks: Vec<BatchAck>,
    /// Named numbers the cursor's owner keeps with it (Pulsar's cursor
    /// properties, e.g. `pulsar.replicated.subscription`). Absent in
    /// records written before they existed.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) properties: BTreeMap<String, i64>,
}

pub(crate) fn log_key(log_name: &str) -> String {
    format!("{LOGS_ROOT}/{log_name}")
}

pub(crate) fn cursors_key(log_name: &str) -> String {
    format!("{LOGS_ROOT}/{log_name}/cursors")
}

pub(crate) fn cursor_key(log_name: &str, cursor_name: &str) -> String {
    format!("{}/{}", cursors_key(log_name), encode_name(cursor_name))
}

/// Percent-encodes what could break a key apart (`/`, `%`, control characters).
pub(crate) fn encode_name(name: &str) -> String {
    let mut out = String::with_capacity(name.len());
    for ch in name.chars() {
        if ch == '/' || ch == '%' || ch.is_ascii_control() {
            out.push_str(&format!("%{:02X}", ch as u32));
        } else {
            out.push(ch);
        }
    }
    out
}

/// Inverse of [`encode_name`]; `None` for a malformed escape.
pub(crate) fn decode_name(encoded: &str) -> Option<String> {
    let bytes = encoded.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'%' {
            let hex = encoded.get(index + 1..index + 3)?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            index += 3;
        } else {
            out.push(bytes[index]);
            index += 1;
        }
    }
    String::from_utf8(out).ok()
}

impl CursorInfo {
    pub(crate) fn mark_delete_position(&self) -> Option<Position> {
        self.mark_delete.map(|(l, e)| Position::new(l, e))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for name in ["sub", "a/b", "100%", "ünï/cødé", "x\ny", ""] {
            let encoded = encode_name(name);
            assert!(!encoded.contains('/'), "{encoded}");
            assert_eq!(decode_name(&encoded).as_deref(), Some(name));
        }
        assert_eq!(decode_name("%zz"), None);
        assert_eq!(decode_name("%4"), None);
    }

    #[test]
    fn records_round_trip() {
        let info = LogInfo {
            version: FORMAT_VERSION,
            ledgers: vec![LedgerInfo {
                ledger_id: 7,
                entries: 3,
                size_bytes: 99,
                created_unix_ms: 1,
                closed_unix_ms: None,
                offload: Some(OffloadInfo {
                    complete: true,
                    offloaded_unix_ms: 5,
                    ..OffloadInfo::started(u128::MAX - 3)
                }),
            }],
            terminated: true,
        };
        let bytes = serde_json::to_vec(&info).unwrap();
        assert_eq!(serde_json::from_slice::<LogInfo>(&bytes).unwrap(), info);
        assert_eq!(info.ledgers[0].offload.unwrap().uid(), u128::MAX - 3);
        // Records written before offloading existed still decode.
        let old = br#"{"version":1,"ledgers":[{"ledger_id":3,"entries":1,"size_bytes":2,"created_unix_ms":4}]}"#;
        let decoded: LogInfo = serde_json::from_slice(old).unwrap();
        assert_eq!(decoded.ledgers[0].offload, None);
        let cursor = CursorInfo {
            version: FORMAT_VERSION,
            mark_delete: Some((7, 1)),
            acked_ranges: vec![AckedRange {
                ledger_id: 7,
                first_entry_id: 3,
                last_entry_id: 5,
            }],
            batch_acks: vec![BatchAck {
                ledger_id: 7,
                entry_id: 2,
                ack_set: vec![0b101],
            }],
            properties: BTreeMap::from([("pulsar.replicated.subscription".to_string(), 1)]),
        };
        let bytes = serde_json::to_vec(&cursor).unwrap();
        assert_eq!(
            serde_json::from_slice::<CursorInfo>(&bytes).unwrap(),
            cursor
        );
        // Cursor records written before properties existed still decode.
        let old = br#"{"version":1,"mark_delete":[7,1],"acked_ranges":[],"batch_acks":[]}"#;
        let decoded: CursorInfo = serde_json::from_slice(old).unwrap();
        assert!(decoded.properties.is_empty());
    }
}
