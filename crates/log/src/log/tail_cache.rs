//! `TailCache`: the log's most recently confirmed entries, in memory, so
//! readers at the tail never wait for a bookie.
//!
//! Owns: entries by position, bounded by payload bytes (`bytes_max` given per
//! insert: the log's `tail_cache_bytes_max`), oldest evicted first.
//! Never: holds an entry that was not confirmed, or one larger than the bound.

use std::collections::BTreeMap;

use bytes::Bytes;

use crate::position::Position;

/// Entries recently confirmed, bounded by bytes; oldest evicted first.
#[derive(Debug, Default)]
pub(super) struct TailCache {
    pub(super) entries: BTreeMap<Position, Bytes>,
    bytes: usize,
}

impl TailCache {
    pub(super) fn insert(&mut self, position: Position, data: Bytes, bytes_max: usize) {
        if data.len() > bytes_max {
            return;
        }
        self.bytes += data.len();
        if let Some(old) = self.entries.insert(position, data) {
            self.bytes -= old.len();
        }
        while self.bytes > bytes_max {
            match self.entries.pop_first() {
                Some((_, evicted)) => self.bytes -= evicted.len(),
                None => break,
            }
        }
        debug_assert!(self.bytes <= bytes_max);
    }

    pub(super) fn remove_ledgers_below(&mut self, ledger_id: u64) {
        while let Some((position, _)) = self.entries.first_key_value() {
            if position.ledger_id >= ledger_id {
                break;
            }
            if let Some((_, evicted)) = self.entries.pop_first() {
                self.bytes -= evicted.len();
            }
        }
    }
}
