//! Where a subscription reads entries from: the topic's log or, with
//! `read_compacted`, the compacted view up to its horizon and the log
//! after it; the position new entries are read from; and the pause after a
//! failed read.
//!
//! Owns: [`Reader`] and its mark on the log's entry cache (`ReadMark`, held
//! while the subscription has consumers: the log caches what it confirms
//! for them and drops what every such reader has read).
//! Guarantees (checked in debug builds): a read returns
//! entries in log order, none before the position asked for, and the read
//! position only moves forward except on a seek.
//! Bounds: `READ_BATCH_ENTRIES_MAX` entries and about
//! `READ_BATCH_BYTES_MAX` bytes per read.
//! Never: decides what is delivered, or acknowledges.

use std::sync::Arc;

use vela_log::{LogEntry, ManagedLog, Position, ReadMark};

use crate::compaction::Compaction;

/// Entries read from the log per read call. 100 entries of 1 KiB batches
/// keeps a read under ~100 KiB while amortizing the read's locking.
pub(crate) const READ_BATCH_ENTRIES_MAX: usize = 100;
/// Bytes per read call (about; at least one entry is returned).
pub(crate) const READ_BATCH_BYTES_MAX: usize = 5 * 1024 * 1024;
/// Pause before dispatching again after a failed log read (a bookie
/// hiccup); the entries stay pending in the replay set or the log.
pub(crate) const READ_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// The subscription's view of the topic and its read position.
#[derive(Debug)]
pub(super) struct Reader {
    log: Arc<ManagedLog>,
    /// Next position to read new entries from.
    position: Position,
    /// The last read found nothing new (wait for the log to grow).
    pub(super) caught_up: bool,
    /// When to dispatch again after a failed log read.
    retry_at: Option<tokio::time::Instant>,
    /// `read_compacted`: the topic's compaction (its view is read up to its
    /// horizon instead of the log).
    compaction: Option<Arc<Compaction>>,
    /// Horizon of the compacted view last read (positions at or before it
    /// follow the compacted ledger, whose ledgers may be trimmed).
    compacted_horizon: Option<Position>,
    /// This reader's mark on the log's entry cache, while it is active.
    mark: Option<ReadMark>,
}

impl Reader {
    pub(super) fn new(
        log: Arc<ManagedLog>,
        position: Position,
        compaction: Option<Arc<Compaction>>,
    ) -> Reader {
        Reader {
            log,
            position,
            caught_up: false,
            retry_at: None,
            compaction,
            compacted_horizon: None,
            mark: None,
        }
    }

    /// Whether the subscription reads for consumers now: while it does, the
    /// log caches new entries for it (see the module doc).
    pub(super) fn set_active(&mut self, active: bool) {
        match (&self.mark, active) {
            (None, true) => self.mark = Some(self.log.register_reader(self.position)),
            (Some(_), false) => self.mark = None,
            _ => {}
        }
    }

    fn set_position(&mut self, next: Position) {
        self.position = next;
        if let Some(mark) = &self.mark {
            mark.set(next);
        }
    }

    /// Whether reads follow a compacted view (`read_compacted`).
    pub(super) fn has_compaction(&self) -> bool {
        self.compaction.is_some()
    }

    /// Next position to read new entries from.
    pub(super) fn position(&self) -> Position {
        self.position
    }

    /// New entries were taken up to `pos` (delivered, held or skipped):
    /// the next read starts after it.
    pub(super) fn move_past(&mut self, pos: Position) {
        let next = self.next_after(pos);
        debug_assert!(next > self.position, "read position moved back");
        self.set_position(next);
    }

    /// An admin ack up to `pos`: reading starts after it if it was behind.
    pub(super) fn skip_through(&mut self, pos: Position) {
        if self.position <= pos {
            self.set_position(self.next_after(pos));
        }
    }

    /// A seek: reading starts at `next`.
    pub(super) fn seek(&mut self, next: Position) {
        self.set_position(next);
        self.caught_up = false;
    }

    /// When to dispatch again after a failed read, if one failed.
    pub(super) fn retry_at(&self) -> Option<tokio::time::Instant> {
        self.retry_at
    }

    /// The retry time came.
    pub(super) fn clear_retry(&mut self) {
        self.retry_at = None;
    }

    /// After a failed read: dispatch again after `READ_RETRY_DELAY` (a
    /// subscription must not stall until the next client command).
    pub(super) fn schedule_retry(&mut self) {
        self.retry_at = Some(tokio::time::Instant::now() + READ_RETRY_DELAY);
    }

    /// Entries at or after `from`, as this subscription sees the topic: with
    /// `read_compacted`, the compacted view up to its horizon, then the log.
    pub(super) async fn read(
        &mut self,
        from: Position,
        entries_max: usize,
    ) -> Result<Vec<LogEntry>, String> {
        let entries = self.read_unchecked(from, entries_max).await?;
        debug_assert!(
            entries.first().is_none_or(|e| e.position >= from)
                && entries.windows(2).all(|w| w[0].position < w[1].position),
            "a read returned entries out of order or before {from}"
        );
        Ok(entries)
    }

    async fn read_unchecked(
        &mut self,
        from: Position,
        entries_max: usize,
    ) -> Result<Vec<LogEntry>, String> {
        let mut from = from;
        if let Some(compaction) = &self.compaction {
            let view = compaction.view().await.map_err(|e| e.to_string())?;
            self.compacted_horizon = view.as_ref().map(|v| v.horizon());
            if let Some(view) = view
                && from <= view.horizon()
            {
                let entries = view
                    .read(compaction.ledgers().as_ref(), from, entries_max)
                    .await
                    .map_err(|e| e.to_string())?;
                if !entries.is_empty() {
                    return Ok(entries);
                }
                from = self.log.next_position(view.horizon());
            }
        }
        self.log
            .read(from, entries_max, READ_BATCH_BYTES_MAX)
            .await
            .map_err(|e| e.to_string())
    }

    /// The entry at `pos`: `Ok(None)` when it no longer exists (trimmed),
    /// `Err` on a read failure.
    pub(super) async fn read_one(&mut self, pos: Position) -> Result<Option<LogEntry>, String> {
        match self.read(pos, 1).await {
            Ok(mut entries) if !entries.is_empty() && entries[0].position == pos => {
                Ok(Some(entries.swap_remove(0)))
            }
            Ok(_) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// The position after `pos` in this subscription's view of the topic.
    pub(super) fn next_after(&self, pos: Position) -> Position {
        match self.compacted_horizon {
            // Inside the compacted range the next compacted entry is found
            // by the read; the log's ledgers there may be gone.
            Some(horizon) if pos < horizon => Position::new(pos.ledger_id, pos.entry_id + 1),
            _ => self.log.next_position(pos),
        }
    }
}
