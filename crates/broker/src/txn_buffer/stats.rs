//! What the admin API shows of a topic's transaction buffer: Pulsar's
//! `TransactionBufferStats` (the buffer) and `TransactionInBufferStats`
//! (one transaction in it).
//! Never: changes the buffer.

use std::sync::atomic::Ordering;

use vela_log::Position;

use super::{First, TxnBuffer, TxnKey};

/// The buffer as the admin API shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct BufferStats {
    /// A snapshot record exists (the topic may hold transactional
    /// entries): Pulsar's state `Ready`, else `NoSnapshot`.
    pub(crate) tracked: bool,
    /// The last entry subscriptions may read (Pulsar's `maxReadPosition`;
    /// `None`: the log is empty).
    pub(crate) max_read_position: Option<Position>,
    pub(crate) last_snapshot_unix_ms: u64,
    /// Transactions open here.
    pub(crate) open: u64,
    pub(crate) recover_start_unix_ms: u64,
    pub(crate) recover_end_unix_ms: u64,
    /// Coordinator id → the low water mark last heard from it.
    pub(crate) low_water_marks: Vec<(u64, u64)>,
}

impl TxnBuffer {
    /// The buffer's figures now.
    pub(crate) fn stats(&self) -> BufferStats {
        let (limit, open, mut low_water_marks) = {
            let state = self.state.lock();
            let marks: Vec<(u64, u64)> = state.low_water.iter().map(|(m, l)| (*m, *l)).collect();
            (state.limit(), state.open.len() as u64, marks)
        };
        low_water_marks.sort_unstable();
        let max_read_position = match limit {
            None => self.log.last_confirmed(),
            Some(bound) => self.log.previous_position(bound),
        };
        BufferStats {
            tracked: self.tracked.initialized(),
            max_read_position,
            last_snapshot_unix_ms: self.last_snapshot_unix_ms.load(Ordering::Relaxed),
            open,
            recover_start_unix_ms: self.recover_start_unix_ms.load(Ordering::Relaxed),
            recover_end_unix_ms: self.recover_end_unix_ms.load(Ordering::Relaxed),
            low_water_marks,
        }
    }

    /// Transaction `txn` here: the position of its first entry while it is
    /// open (and that entry is durable), and whether it was aborted here.
    pub(crate) fn txn_stats(&self, txn: TxnKey) -> (Option<Position>, bool) {
        let state = self.state.lock();
        let first = state.open.get(&txn).and_then(|open| match open.first {
            First::Known(position) => Some(position),
            First::Pending(_) => None,
        });
        (first, state.aborted.contains_key(&txn))
    }
}
