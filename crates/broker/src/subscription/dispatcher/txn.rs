//! The subscription task's side of transactions: the acknowledgements a
//! committed transaction applies, the entries an aborted one sends again.
//! Never: decides an outcome (the topic's pending acks tell the task).

use vela_log::Position;
use vela_wire::proto::command_ack::AckType;

use super::Dispatcher;
use crate::subscription::txn_view;

impl Dispatcher {
    /// A transaction that acknowledged entries of this subscription
    /// committed: its acknowledgements apply now.
    pub(super) async fn txn_committed(
        &mut self,
        positions: Vec<(Position, Vec<u64>)>,
        cumulative: Option<Position>,
    ) {
        let (ids, cumulative) = txn_view::committed_ids(positions, cumulative);
        if !ids.is_empty() {
            self.ack((0, 0), AckType::Individual, ids, None).await;
        }
        if let Some(id) = cumulative {
            self.ack((0, 0), AckType::Cumulative, vec![id], None).await;
        }
    }

    /// A transaction that acknowledged entries of this subscription
    /// aborted: those still out to a consumer are sent again.
    pub(super) fn txn_aborted(&mut self, positions: &[Position]) {
        for &pos in positions {
            if let Some(owner) = self.outstanding.owner(pos) {
                self.outstanding.redeliver(pos);
                self.unacked_one_less(owner);
                self.counters.redelivered += 1;
            }
        }
        self.reader.caught_up = false;
    }
}
