//! The state the journal's handle and its three threads share, and the
//! access rules that keep it consistent.
//!
//! Owns: the append queue (`QueueState`), the space made ready in the
//! current file and the next file (`SpaceState`), the synced mark and the
//! broken flag (`Shared`), and what the writer hands the force-write thread
//! (`ForceItem`).
//!
//! Access rules: only the writer (`writer`) writes records and advances the
//! write offset; groups are synced and completed (fdatasync, `synced_mark`,
//! callbacks) by the force-write thread (`force`), or by the writer while
//! `force_pending` is 0 (so one thread at a time, and callbacks run in append
//! order); only the preallocator (`prealloc`) zero-fills space and creates the
//! next file, publishing `SpaceState` under its mutex. Any I/O failure marks
//! the journal broken; from then on every queued or new append fails, and
//! nothing is retried.

use std::collections::VecDeque;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::AppendCallback;
use super::config::JournalConfig;
use super::error::JournalError;
use super::file::{Backend, JournalFile};
use super::format::JournalRecord;
use super::stats::StatsCell;
use crate::mark::JournalMark;

/// Groups written but not yet synced that the writer may hand over before it
/// blocks. Bounds the memory of waiters in flight (the append queue bounds the
/// rest); 64 groups is far more than one fdatasync ever covers in practice.
pub(crate) const FORCE_WRITE_GROUPS_MAX: usize = 64;

/// One queued append.
pub(crate) struct Pending {
    pub(crate) record: JournalRecord,
    pub(crate) done: AppendCallback,
    pub(crate) enqueued: Instant,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
pub(crate) struct QueueState {
    pub(crate) items: VecDeque<Pending>,
    /// Encoded bytes of `items`.
    pub(crate) bytes: usize,
    pub(crate) closed: bool,
    /// What the writer sleeps for, so `append` wakes it (a futex call) only when
    /// that happens, not once per record.
    pub(crate) writer_waits_for: WriterWait,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriterWait {
    /// Not sleeping.
    #[default]
    Nothing,
    /// Sleeping on an empty queue: wake on the first record.
    Records,
    /// Holding a group back: wake once this many bytes are queued.
    Bytes(usize),
}

impl QueueState {
    /// Called by `append` after a push: whether to wake the writer.
    pub(crate) fn should_wake_writer(&self) -> bool {
        match self.writer_waits_for {
            WriterWait::Nothing => false,
            WriterWait::Records => true,
            WriterWait::Bytes(bytes) => self.bytes >= bytes,
        }
    }
}

/// Space the preallocator has made ready for the writer.
///
/// Zero-fill is only a performance matter (replay reads any bytes past the end
/// safely); the one rule is that the preallocator never writes zeros where the
/// writer writes. So the preallocator claims each step (`filling`) under the
/// mutex and only above `writer_reserved`; the writer reserves its range under
/// the mutex before writing, waits only when a claimed step overlaps it, and
/// otherwise writes into unfilled space (counted: that fdatasync then commits
/// allocation metadata) rather than wait for zeros.
#[derive(Debug)]
pub(crate) struct SpaceState {
    /// The writer's current file.
    pub(crate) file_id: u64,
    pub(crate) file: Arc<dyn JournalFile>,
    /// Below this the file is zero-filled, reused, or reserved by the writer.
    pub(crate) allocated_end: u64,
    /// Highest end the writer has reserved in the current file.
    pub(crate) writer_reserved: u64,
    /// The zero-fill step in progress: (file id, from).
    pub(crate) filling: Option<(u64, u64)>,
    /// Where the writer has written up to (published once per group).
    pub(crate) writer_offset: u64,
    /// Bytes the writer has written since open, across files (for its rate).
    pub(crate) written_bytes_total: u64,
    /// The next file, header synced, first chunk zero-filled, still named
    /// `NEXT_FILE_NAME`.
    pub(crate) next: Option<(Arc<dyn JournalFile>, u64)>,
    pub(crate) stop: bool,
}

/// State shared by the handle and the threads.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: JournalConfig,
    pub(crate) backend: Backend,
    pub(crate) queue: Mutex<QueueState>,
    pub(crate) queue_cv: Condvar,
    pub(crate) space: Mutex<SpaceState>,
    pub(crate) space_cv: Condvar,
    /// Written only by the force-write thread.
    pub(crate) synced_mark: Mutex<JournalMark>,
    pub(crate) broken: AtomicBool,
    pub(crate) broken_reason: Mutex<Option<String>>,
    /// Set once `shutdown` sealed the file of a broken journal.
    pub(crate) sealed: AtomicBool,
    /// Groups handed to the force-write thread and not yet completed.
    pub(crate) force_pending: AtomicUsize,
    /// Id of the file the writer appends to (files below may be deleted).
    pub(crate) writer_file_id: AtomicU64,
    pub(crate) stats: StatsCell,
}

impl Shared {
    /// Marks the journal broken (first reason wins) and wakes every waiter.
    pub(crate) fn fail(&self, error: &JournalError) {
        if let Ok(mut reason) = self.broken_reason.lock()
            && reason.is_none()
        {
            tracing::error!(%error, "journal: fatal I/O failure, the journal accepts no more appends");
            *reason = Some(error.to_string());
        }
        self.broken.store(true, Ordering::SeqCst);
        self.queue_cv.notify_all();
        self.space_cv.notify_all();
    }

    pub(crate) fn broken_error(&self) -> JournalError {
        let reason = self
            .broken_reason
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .unwrap_or_else(|| "unknown".to_string());
        JournalError::Broken { reason }
    }

    pub(super) fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    pub(super) fn lock_space(&self) -> MutexGuard<'_, SpaceState> {
        self.space.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub(super) fn lock_queue(&self) -> MutexGuard<'_, QueueState> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the writer hands the force-write thread.
pub(crate) enum ForceItem {
    /// A group written to `file`, ending at `end_mark`.
    Written {
        file: Arc<dyn JournalFile>,
        end_mark: JournalMark,
        waiters: Vec<(AppendCallback, JournalMark)>,
        oldest_enqueued: Option<Instant>,
        /// When the writer's steps for this group ended (`None` for a
        /// file's end record): what a slow group's log line breaks down.
        times: Option<GroupTimes>,
    },
    /// Appends that failed (the journal is broken): fail them in order.
    Failed {
        waiters: Vec<AppendCallback>,
        error: JournalError,
    },
    /// No more items: exit after this.
    Stop,
}

/// Where a group's time went on the writer thread, kept with the group so the
/// thread that completes it can say where a slow one waited
/// (`force::SLOW_GROUP`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GroupTimes {
    /// The writer took the group from the queue.
    pub(crate) taken: Instant,
    /// Spent rolling to the next file before the write (its syncs).
    pub(crate) roll: Duration,
    /// Spent waiting for a zero-fill step to leave the group's range.
    pub(crate) reserve_wait: Duration,
    /// The pwrite began.
    pub(crate) write_started: Instant,
    /// The pwrite returned.
    pub(crate) written: Instant,
}
