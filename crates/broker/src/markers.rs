//! Replicated-subscription markers: entries a broker writes into a topic's
//! own log (MessageMetadata `marker_type`, never delivered to consumers)
//! to tie positions of one cluster's log to the others', as Pulsar's
//! `Markers` and `PulsarMarkers.proto` (types 10 to 13, the same field
//! numbers, so a Pulsar cluster and a Vela cluster read each other's).
//!
//! Owns: the payload messages ([`SnapshotRequest`], [`SnapshotResponse`],
//! [`Snapshot`], [`SubscriptionUpdate`]), building a marker entry
//! ([`marker_entry`]: producer `pulsar.marker`, sequence id 0, the
//! restriction to one cluster in `replicate_to`) and reading one back
//! ([`read_marker`]).
//! Never: decides when to write one (`replication::snapshots` does) or
//! parses more than a marker's own metadata and payload.

use bytes::Bytes;
use prost::Message as _;
use vela_log::Position;
use vela_wire::proto::MessageMetadata;

use crate::codec;

/// A cluster asks every other for its position (replicated to all).
pub(crate) const SNAPSHOT_REQUEST: i32 = 10;
/// A cluster answers one request (replicated to the asking cluster only).
pub(crate) const SNAPSHOT_RESPONSE: i32 = 11;
/// A completed snapshot, kept in the asking cluster's log only.
pub(crate) const SNAPSHOT: i32 = 12;
/// A replicated subscription's new position in each other cluster
/// (replicated to all).
pub(crate) const SUBSCRIPTION_UPDATE: i32 = 13;

/// The producer name every marker carries (Pulsar's).
pub(crate) const MARKER_PRODUCER: &str = "pulsar.marker";

/// Longest marker payload read (a snapshot names at most
/// `REPLICATION_CLUSTERS_MAX` clusters; anything longer is not ours).
const MARKER_PAYLOAD_BYTES_MAX: usize = 64 << 10;

/// A position in one cluster's log (`MarkersMessageIdData`).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct MarkerPosition {
    #[prost(uint64, required, tag = "1")]
    pub(crate) ledger_id: u64,
    #[prost(uint64, required, tag = "2")]
    pub(crate) entry_id: u64,
}

impl MarkerPosition {
    pub(crate) fn of(position: Position) -> MarkerPosition {
        MarkerPosition {
            ledger_id: position.ledger_id,
            entry_id: position.entry_id,
        }
    }

    pub(crate) fn position(&self) -> Position {
        Position::new(self.ledger_id, self.entry_id)
    }
}

/// One cluster and a position in its log (`ClusterMessageId`).
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct ClusterPosition {
    #[prost(string, required, tag = "1")]
    pub(crate) cluster: String,
    #[prost(message, required, tag = "2")]
    pub(crate) message_id: MarkerPosition,
}

/// `ReplicatedSubscriptionsSnapshotRequest`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SnapshotRequest {
    #[prost(string, required, tag = "1")]
    pub(crate) snapshot_id: String,
    #[prost(string, optional, tag = "2")]
    pub(crate) source_cluster: Option<String>,
}

/// `ReplicatedSubscriptionsSnapshotResponse`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SnapshotResponse {
    #[prost(string, required, tag = "1")]
    pub(crate) snapshot_id: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) cluster: Option<ClusterPosition>,
}

/// `ReplicatedSubscriptionsSnapshot`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct Snapshot {
    #[prost(string, required, tag = "1")]
    pub(crate) snapshot_id: String,
    #[prost(message, optional, tag = "2")]
    pub(crate) local_message_id: Option<MarkerPosition>,
    #[prost(message, repeated, tag = "3")]
    pub(crate) clusters: Vec<ClusterPosition>,
}

/// `ReplicatedSubscriptionsUpdate`.
#[derive(Clone, PartialEq, prost::Message)]
pub(crate) struct SubscriptionUpdate {
    #[prost(string, required, tag = "1")]
    pub(crate) subscription_name: String,
    #[prost(message, repeated, tag = "2")]
    pub(crate) clusters: Vec<ClusterPosition>,
}

/// A stored entry holding marker `marker_type` with `payload`, restricted
/// to `only_to` (`replicate_to`) when given.
pub(crate) fn marker_entry(
    marker_type: i32,
    only_to: Option<&str>,
    payload: &impl prost::Message,
) -> Bytes {
    let metadata = MessageMetadata {
        producer_name: MARKER_PRODUCER.to_string(),
        sequence_id: 0,
        publish_time: now_ms(),
        marker_type: Some(marker_type),
        replicate_to: only_to.map(|c| vec![c.to_string()]).unwrap_or_default(),
        ..MessageMetadata::default()
    };
    vela_wire::build_stored_entry(&metadata.encode_to_vec(), &payload.encode_to_vec())
}

/// A marker read from an entry: its type and its payload.
#[derive(Debug, Clone)]
pub(crate) struct ReadMarker {
    pub(crate) marker_type: i32,
    pub(crate) payload: Bytes,
}

/// The replicated-subscription marker an entry holds, if it holds one
/// (`None` for any other entry, and for one whose metadata or payload
/// size does not parse).
pub(crate) fn read_marker(entry: &Bytes) -> Option<ReadMarker> {
    let marker_type = codec::entry_marker_type(entry)?;
    if !(SNAPSHOT_REQUEST..=SUBSCRIPTION_UPDATE).contains(&marker_type) {
        return None;
    }
    let (_, payload) = codec::split_entry(entry)?;
    if payload.len() > MARKER_PAYLOAD_BYTES_MAX {
        return None;
    }
    Some(ReadMarker {
        marker_type,
        payload,
    })
}

/// The snapshot a `SNAPSHOT` marker's payload holds: its local position
/// and each remote cluster's; `None` when it does not parse.
pub(crate) fn read_snapshot(payload: &[u8]) -> Option<(Position, Vec<(String, Position)>)> {
    let snapshot = Snapshot::decode(payload).ok()?;
    let local = snapshot.local_message_id?.position();
    let clusters = snapshot
        .clusters
        .into_iter()
        .map(|c| (c.cluster, c.message_id.position()))
        .collect();
    Some((local, clusters))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_response_marker_reads_back_restricted_to_the_asker() {
        let response = SnapshotResponse {
            snapshot_id: "s-1".into(),
            cluster: Some(ClusterPosition {
                cluster: "b".into(),
                message_id: MarkerPosition::of(Position::new(7, 3)),
            }),
        };
        let entry = marker_entry(SNAPSHOT_RESPONSE, Some("a"), &response);
        let (metadata, _) = codec::split_entry(&entry).unwrap();
        assert_eq!(metadata.replicate_to, ["a"]);
        assert_eq!(metadata.producer_name, MARKER_PRODUCER);
        let marker = read_marker(&entry).unwrap();
        assert_eq!(marker.marker_type, SNAPSHOT_RESPONSE);
        assert_eq!(SnapshotResponse::decode(marker.payload).unwrap(), response);
    }

    #[test]
    fn only_replicated_subscription_markers_are_read() {
        let plain = vela_wire::build_stored_entry(
            &MessageMetadata {
                producer_name: "p".into(),
                ..MessageMetadata::default()
            }
            .encode_to_vec(),
            b"x",
        );
        assert!(read_marker(&plain).is_none());
        assert_eq!(codec::entry_marker_type(&plain), None);
        let txn = vela_wire::build_stored_entry(
            &MessageMetadata {
                producer_name: "p".into(),
                marker_type: Some(21),
                ..MessageMetadata::default()
            }
            .encode_to_vec(),
            b"",
        );
        assert!(read_marker(&txn).is_none());
        assert_eq!(codec::entry_marker_type(&txn), Some(21));
        assert!(read_marker(&Bytes::from_static(b"junk")).is_none());
    }

    #[test]
    fn a_snapshot_gives_its_local_and_remote_positions() {
        let snapshot = Snapshot {
            snapshot_id: "s".into(),
            local_message_id: Some(MarkerPosition::of(Position::new(1, 2))),
            clusters: vec![ClusterPosition {
                cluster: "b".into(),
                message_id: MarkerPosition::of(Position::new(3, 4)),
            }],
        };
        let (local, remotes) = read_snapshot(&snapshot.encode_to_vec()).unwrap();
        assert_eq!(local, Position::new(1, 2));
        assert_eq!(remotes, [("b".to_string(), Position::new(3, 4))]);
        assert!(read_snapshot(b"\xff\xff").is_none());
    }
}
