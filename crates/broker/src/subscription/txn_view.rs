//! What a subscription skips or waits for in its log: the topic's
//! transaction buffer (the read limit: entries of open transactions and
//! everything after the first of them are not read yet; transaction
//! markers and entries of aborted transactions are skipped), as Pulsar's
//! dispatchers read up to `maxReadPosition` and filter with `isTxnAborted`
//! / `Markers.isTxnMarker`; and replicated-subscription markers (types 10
//! to 13, as Pulsar's `Markers.isServerOnlyMarker`), never delivered, a
//! snapshot among them noted for this subscription when it is replicated
//! (`snapshots`).
//!
//! Owns: [`TxnView`], one per subscription, and whether dispatch stopped
//! at the limit (then the task waits for the limit to move instead of for
//! new entries).
//! Never: changes the buffer.

use std::sync::Arc;

use tokio::sync::watch;
use vela_log::{LogEntry, Position};
use vela_wire::proto::MessageIdData;

use super::snapshots::ReplicatedSubscriptions;
use crate::markers;
use crate::txn_buffer::TxnBuffer;

#[derive(Debug)]
pub(super) struct TxnView {
    /// The topic's transaction buffer (transactions on) and its read
    /// limit's changes.
    buffer: Option<(Arc<TxnBuffer>, watch::Receiver<Option<Position>>)>,
    /// The topic's replicated subscriptions, and this subscription's name.
    replicated: Arc<ReplicatedSubscriptions>,
    name: String,
    /// Dispatch stopped at the read limit.
    pub(super) blocked: bool,
}

impl TxnView {
    pub(super) fn new(
        buffer: Option<Arc<TxnBuffer>>,
        replicated: Arc<ReplicatedSubscriptions>,
        name: &str,
    ) -> TxnView {
        TxnView {
            buffer: buffer.map(|buffer| {
                let changes = buffer.subscribe();
                (buffer, changes)
            }),
            replicated,
            name: name.to_string(),
            blocked: false,
        }
    }

    /// True if the entry at `position` may be read now.
    pub(super) fn readable(&self, position: Position) -> bool {
        self.buffer
            .as_ref()
            .is_none_or(|(buffer, _)| buffer.read_limit().is_none_or(|limit| position < limit))
    }

    /// True if the entry is skipped (and acknowledged): a marker or an
    /// entry of an aborted transaction. A snapshot marker is noted for
    /// this subscription first.
    pub(super) fn hides(&self, entry: &LogEntry) -> bool {
        // The metadata is scanned once for both questions.
        let summary = crate::txn_buffer::entry_summary(&entry.data);
        if self
            .buffer
            .as_ref()
            .is_some_and(|(buffer, _)| buffer.has_txns() && buffer.hides(summary.as_ref()))
        {
            return true;
        }
        let Some(marker_type) = summary.and_then(|s| s.marker_type) else {
            return false;
        };
        if marker_type == markers::SNAPSHOT
            && self.replicated.is_replicated(&self.name)
            && let Some(marker) = markers::read_marker(&entry.data)
            && let Some((local, remotes)) = markers::read_snapshot(&marker.payload)
        {
            self.replicated.snapshot_read(&self.name, local, remotes);
        }
        true
    }

    /// True (and `blocked` noted) when a read from `position` would pass
    /// the read limit.
    pub(super) fn stops_at(&mut self, position: Position) -> bool {
        self.blocked = !self.readable(position);
        self.blocked
    }

    /// What dispatch does with an entry read ahead (`Wait`: it stopped at
    /// the read limit, noted in `blocked`).
    pub(super) fn verdict(&mut self, entry: &LogEntry) -> Verdict {
        if !self.readable(entry.position) {
            self.blocked = true;
            Verdict::Wait
        } else if self.hides(entry) {
            Verdict::Skip
        } else {
            Verdict::Deliver
        }
    }
}

/// What dispatch does with an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Verdict {
    Deliver,
    /// An open transaction's entry, or one after it: not yet.
    Wait,
    /// A marker or an aborted transaction's entry: acknowledged, never sent.
    Skip,
}

/// The ids a committed transaction's acknowledgements apply as (individual
/// ones with their ack sets, the cumulative one).
pub(super) fn committed_ids(
    positions: Vec<(Position, Vec<u64>)>,
    cumulative: Option<Position>,
) -> (Vec<MessageIdData>, Option<MessageIdData>) {
    let id = |pos: Position, ack_set: Vec<u64>| MessageIdData {
        ledger_id: pos.ledger_id,
        entry_id: pos.entry_id,
        ack_set: ack_set.into_iter().map(|w| w as i64).collect(),
        ..MessageIdData::default()
    };
    let ids = positions.into_iter().map(|(p, s)| id(p, s)).collect();
    (ids, cumulative.map(|p| id(p, Vec::new())))
}

/// Resolves once the read limit changed since this view last waited
/// (pending forever without a transaction buffer).
pub(super) async fn limit_moved(view: Option<&mut TxnView>) {
    match view.and_then(|v| v.buffer.as_mut()) {
        Some((_, changes)) => {
            // The buffer (and so the sender) lives as long as the view.
            let _ = changes.changed().await;
        }
        None => std::future::pending().await,
    }
}
