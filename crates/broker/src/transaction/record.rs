//! The transaction log's records: what a coordinator appends before it
//! answers, and replays when it opens.
//!
//! Owns: [`Record`] (one state change of one transaction), its encoding
//! (JSON with a format version, one record per log entry) and
//! [`TxnStatus`] with Pulsar's status names.
//! Never: decides whether a change is allowed (`coordinator` does, under
//! its lock, before appending).

use serde::{Deserialize, Serialize};

/// Format of the records this broker writes; a newer one is refused.
pub(super) const RECORD_VERSION: u32 = 1;

/// A transaction's status, named as Pulsar's `TxnStatus` (admin JSON).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub(crate) enum TxnStatus {
    #[serde(rename = "OPEN")]
    Open,
    #[serde(rename = "COMMITTING")]
    Committing,
    #[serde(rename = "COMMITTED")]
    Committed,
    #[serde(rename = "ABORTING")]
    Aborting,
    #[serde(rename = "ABORTED")]
    Aborted,
}

impl TxnStatus {
    /// Pulsar's name of the status.
    pub(crate) fn name(self) -> &'static str {
        match self {
            TxnStatus::Open => "OPEN",
            TxnStatus::Committing => "COMMITTING",
            TxnStatus::Committed => "COMMITTED",
            TxnStatus::Aborting => "ABORTING",
            TxnStatus::Aborted => "ABORTED",
        }
    }

    /// The status that ends what `self` (COMMITTING or ABORTING) started.
    pub(super) fn ended(self) -> Option<TxnStatus> {
        match self {
            TxnStatus::Committing => Some(TxnStatus::Committed),
            TxnStatus::Aborting => Some(TxnStatus::Aborted),
            _ => None,
        }
    }
}

impl std::fmt::Display for TxnStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One change to one transaction of a coordinator (the coordinator's id is
/// the transaction id's most significant bits; `seq` the least).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "op", rename_all = "snake_case")]
pub(super) enum Record {
    /// A transaction opened.
    New {
        seq: u64,
        open_unix_ms: u64,
        timeout_ms: u64,
        owner: Option<String>,
    },
    /// Partitions the transaction produced to.
    AddPartitions { seq: u64, partitions: Vec<String> },
    /// Subscriptions (topic, subscription) the transaction acknowledged on.
    AddSubscriptions {
        seq: u64,
        subscriptions: Vec<(String, String)>,
    },
    /// The status moved from `from` to `to`.
    Status {
        seq: u64,
        from: TxnStatus,
        to: TxnStatus,
    },
}

#[derive(Serialize, Deserialize)]
struct Envelope {
    v: u32,
    #[serde(flatten)]
    record: Record,
}

/// A log entry that is not a record this broker can replay.
#[derive(Debug, thiserror::Error)]
pub(crate) enum RecordError {
    #[error("transaction log record does not parse: {0}")]
    Parse(#[from] serde_json::Error),
    #[error(
        "transaction log record version {found} is newer than this broker's ({RECORD_VERSION})"
    )]
    Version { found: u32 },
}

impl Record {
    /// The transaction the record is about.
    pub(super) fn seq(&self) -> u64 {
        match self {
            Record::New { seq, .. }
            | Record::AddPartitions { seq, .. }
            | Record::AddSubscriptions { seq, .. }
            | Record::Status { seq, .. } => *seq,
        }
    }

    pub(super) fn encode(&self) -> bytes::Bytes {
        let envelope = Envelope {
            v: RECORD_VERSION,
            record: self.clone(),
        };
        // Serializing plain data to JSON cannot fail.
        let json = serde_json::to_vec(&envelope).unwrap_or_default();
        debug_assert!(!json.is_empty());
        bytes::Bytes::from(json)
    }

    pub(super) fn decode(data: &[u8]) -> Result<Record, RecordError> {
        let envelope: Envelope = serde_json::from_slice(data)?;
        if envelope.v > RECORD_VERSION {
            return Err(RecordError::Version { found: envelope.v });
        }
        Ok(envelope.record)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn records_round_trip_and_newer_versions_are_refused() {
        let records = [
            Record::New {
                seq: 7,
                open_unix_ms: 1,
                timeout_ms: 60_000,
                owner: Some("alice".into()),
            },
            Record::AddPartitions {
                seq: 7,
                partitions: vec!["persistent://public/default/t".into()],
            },
            Record::AddSubscriptions {
                seq: 7,
                subscriptions: vec![("persistent://public/default/t".into(), "s".into())],
            },
            Record::Status {
                seq: 7,
                from: TxnStatus::Open,
                to: TxnStatus::Committing,
            },
        ];
        for record in records {
            assert_eq!(Record::decode(&record.encode()).unwrap(), record);
        }
        let newer = br#"{"v":2,"op":"status","seq":1,"from":"OPEN","to":"ABORTING"}"#;
        assert!(matches!(
            Record::decode(newer),
            Err(RecordError::Version { found: 2 })
        ));
        assert!(Record::decode(b"garbage").is_err());
    }
}
