//! What a subscription has acknowledged, as the dispatcher sees it: the
//! durable cursor of the log (`Cursor`: mark-delete position, individual
//! and batch-index acks, persisted by the log) or, for a reader, the same
//! state in memory.
//!
//! Owns: [`Acks`] and the in-memory state of readers (bounded by
//! `MEMORY_ACKED_ENTRIES_MAX`). Guarantees: the mark-delete position only
//! moves forward except on `reset` (seek), and nothing individually acked
//! sits at or below it.
//! Never: tracks what is out to consumers (`redelivery` does) or talks to
//! a connection.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use vela_log::{Cursor, ManagedLog, Position};

/// Longest ack_set accepted in an ACK (64 messages per word: batches of up to
/// 65536 messages, far above the clients' 1000-message default). Longer ones
/// are refused, so a client cannot make the cursor keep megabytes per entry.
pub(crate) const ACK_SET_WORDS_MAX: usize = 1024;

/// In-memory acknowledgement state of a non-durable subscription (reader).
#[derive(Debug, Default)]
pub(super) struct MemoryAcks {
    mark_delete: Option<Position>,
    acked: BTreeSet<Position>,
    batch: BTreeMap<Position, Vec<u64>>,
}

/// Acks bounded like the durable cursor's: beyond this, individual acks above
/// the mark-delete position of a reader are ignored (readers ack cumulatively).
const MEMORY_ACKED_ENTRIES_MAX: usize = 100_000;

pub(super) enum Acks {
    Durable(Arc<Cursor>),
    /// Boxed: ~70 bytes inline in every parked subscription, where most
    /// are durable.
    Memory(Box<MemoryAcks>),
}

impl std::fmt::Debug for Acks {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Acks::Durable(c) => write!(f, "Durable({})", c.name()),
            Acks::Memory(m) => write!(f, "Memory({:?})", m.mark_delete),
        }
    }
}

impl Acks {
    /// A reader's acks: everything up to `mark_delete` counts as acked.
    pub(super) fn in_memory(mark_delete: Option<Position>) -> Acks {
        Acks::Memory(Box::new(MemoryAcks {
            mark_delete,
            ..MemoryAcks::default()
        }))
    }

    /// True for a durable subscription's cursor.
    pub(super) fn is_durable(&self) -> bool {
        matches!(self, Acks::Durable(_))
    }

    pub(super) fn mark_delete(&self) -> Option<Position> {
        match self {
            Acks::Durable(c) => c.mark_delete_position(),
            Acks::Memory(m) => m.mark_delete,
        }
    }

    pub(super) fn is_acked(&self, p: Position) -> bool {
        match self {
            Acks::Durable(c) => c.is_acked(p),
            Acks::Memory(m) => Some(p) <= m.mark_delete || m.acked.contains(&p),
        }
    }

    pub(super) fn batch_state(&self, p: Position) -> Option<Vec<u64>> {
        match self {
            Acks::Durable(c) => c.batch_ack_state(p),
            Acks::Memory(m) => m.batch.get(&p).cloned(),
        }
    }

    pub(super) fn ack(
        &mut self,
        log: &ManagedLog,
        ps: &[Position],
    ) -> Result<(), vela_log::LogError> {
        match self {
            Acks::Durable(c) => c.ack(ps),
            Acks::Memory(m) => {
                for p in ps {
                    if Some(*p) > m.mark_delete && m.acked.len() < MEMORY_ACKED_ENTRIES_MAX {
                        m.acked.insert(*p);
                        m.batch.remove(p);
                    }
                }
                m.advance(log);
                Ok(())
            }
        }
    }

    pub(super) fn ack_cumulative(
        &mut self,
        log: &ManagedLog,
        p: Position,
    ) -> Result<(), vela_log::LogError> {
        match self {
            Acks::Durable(c) => c.ack_cumulative(p),
            Acks::Memory(m) => {
                if Some(p) > m.mark_delete {
                    m.mark_delete = Some(p);
                    let above = Position::new(p.ledger_id, p.entry_id.saturating_add(1));
                    m.acked = m.acked.split_off(&above);
                    m.batch = m.batch.split_off(&above);
                    m.advance(log);
                }
                Ok(())
            }
        }
    }

    pub(super) fn ack_batch(
        &mut self,
        log: &ManagedLog,
        p: Position,
        set: &[u64],
    ) -> Result<(), vela_log::LogError> {
        match self {
            Acks::Durable(c) => c.ack_batch_indexes(p, set),
            Acks::Memory(m) => {
                if Some(p) <= m.mark_delete || m.acked.contains(&p) {
                    return Ok(());
                }
                let merged: Vec<u64> = match m.batch.get(&p) {
                    Some(old) => old
                        .iter()
                        .zip(set.iter().chain(std::iter::repeat(&0)))
                        .map(|(a, b)| a & b)
                        .collect(),
                    None => set.to_vec(),
                };
                if merged.iter().all(|w| *w == 0) {
                    m.batch.remove(&p);
                    return self.ack(log, &[p]);
                }
                if m.batch.len() < MEMORY_ACKED_ENTRIES_MAX {
                    m.batch.insert(p, merged);
                }
                Ok(())
            }
        }
    }

    pub(super) async fn reset(
        &mut self,
        log: &ManagedLog,
        next: Position,
    ) -> Result<(), vela_log::LogError> {
        match self {
            Acks::Durable(c) => c.reset(next).await,
            Acks::Memory(m) => {
                m.mark_delete = log.previous_position(next);
                m.acked.clear();
                m.batch.clear();
                Ok(())
            }
        }
    }

    /// Gives back emptied sets' nodes (the subscription parks; a durable
    /// cursor does so after each persist).
    pub(super) fn shrink_idle(&mut self) {
        if let Acks::Memory(m) = self {
            if m.acked.is_empty() {
                m.acked = BTreeSet::new();
            }
            if m.batch.is_empty() {
                m.batch = BTreeMap::new();
            }
        }
    }

    pub(super) fn backlog(&self, log: &ManagedLog) -> u64 {
        match self {
            Acks::Durable(c) => c.backlog_entries(),
            Acks::Memory(m) => match log.last_confirmed() {
                Some(last) => log
                    .entries_between(m.mark_delete, last)
                    .saturating_sub(m.acked.len() as u64),
                None => 0,
            },
        }
    }
}

impl MemoryAcks {
    /// Moves the mark-delete position over the individually acked entries
    /// that follow it.
    fn advance(&mut self, log: &ManagedLog) {
        self.advance_over_acked(log);
        // Nothing individually acked sits at or below the mark-delete
        // position (a reset clears both).
        debug_assert!(
            self.acked
                .first()
                .is_none_or(|first| Some(*first) > self.mark_delete),
            "reader acks below the mark-delete position"
        );
    }

    fn advance_over_acked(&mut self, log: &ManagedLog) {
        while let Some(first) = self.acked.first().copied() {
            let next = match self.mark_delete {
                Some(md) => log.next_position(md),
                None => match log.first_position() {
                    Some(p) => p,
                    None => return,
                },
            };
            if first != next {
                return;
            }
            self.acked.remove(&first);
            self.mark_delete = Some(first);
        }
    }
}
