//! What a subscription sees of its topic's transaction buffer: the read
//! limit (entries of open transactions and everything after the first of
//! them are not read yet) and the entries to skip (transaction markers,
//! entries of aborted transactions), as Pulsar's dispatchers read up to
//! `maxReadPosition` and filter with `isTxnAborted` / `Markers.isTxnMarker`.
//!
//! Owns: [`TxnView`], one per subscription of a topic with a buffer, and
//! whether dispatch stopped at the limit (then the task waits for the
//! limit to move instead of for new entries).
//! Never: changes the buffer.

use std::sync::Arc;

use tokio::sync::watch;
use vela_log::{LogEntry, Position};
use vela_wire::proto::MessageIdData;

use crate::txn_buffer::TxnBuffer;

#[derive(Debug)]
pub(super) struct TxnView {
    buffer: Arc<TxnBuffer>,
    changes: watch::Receiver<Option<Position>>,
    /// Dispatch stopped at the read limit.
    pub(super) blocked: bool,
}

impl TxnView {
    pub(super) fn new(buffer: Arc<TxnBuffer>) -> TxnView {
        TxnView {
            changes: buffer.subscribe(),
            buffer,
            blocked: false,
        }
    }

    /// True if the entry at `position` may be read now.
    pub(super) fn readable(&self, position: Position) -> bool {
        self.buffer
            .read_limit()
            .is_none_or(|limit| position < limit)
    }

    /// True if the entry is skipped (and acknowledged): a transaction
    /// marker or an entry of an aborted transaction.
    pub(super) fn hides(&self, data: &[u8]) -> bool {
        self.buffer.has_txns() && self.buffer.is_hidden(data)
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
        } else if self.hides(&entry.data) {
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
/// (pending forever without a view).
pub(super) async fn limit_moved(view: Option<&mut TxnView>) {
    match view {
        Some(view) => {
            // The buffer (and so the sender) lives as long as the view.
            let _ = view.changes.changed().await;
        }
        None => std::future::pending().await,
    }
}
