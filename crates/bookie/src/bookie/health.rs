//! The bookie's health: writable, read-only (disk usage past the threshold) or
//! failed (a journal or storage write failed). The disk monitor thread that
//! moves between them and reopens a failed engine is `monitor`'s.
//!
//! State machine (one mode at a time; `Health` holds it):
//! ```text
//!   Writable --usage >= usage_max--> ReadOnly --usage < usage_lwm--> Writable
//!   Writable | ReadOnly --journal/storage write or sync failed--> Failed
//!   Failed --usage < usage_lwm on every dir, backoff passed, reopen ok--> Writable
//! ```
//! - Writable: everything is taken.
//! - ReadOnly: new adds are refused with READ_ONLY (writers replace this bookie
//!   in their ensemble); recovery adds, fences, explicit LACs and deletes are
//!   still taken (they are small, let ledger recovery finish, and deletes free
//!   space); reads are served.
//! - Failed: nothing is written (the journal or storage refused a write, or a
//!   sync failed; what they hold is not retried); reads are served from what
//!   storage holds. Once every directory is below the low-water mark the
//!   monitor closes the engine (the broken journal is sealed at its last
//!   synced mark) and opens a new one on the same directories, replaying the
//!   journal into storage as a restart would; acknowledged entries are all in
//!   the journal or in flushed storage, so none is lost. A failed reopen is
//!   retried after a backoff (1 s doubling to 60 s): an EIO disk stays Failed
//!   and keeps serving what it can.
//!
//! Failures are tied to the engine generation that reported them, so a late
//! report from a closed engine never fails its replacement.
//!
//! Never: blocks the write path (mode reads are one atomic load); retries a
//! write in place (only a whole new engine); writes while Failed.

use std::path::PathBuf;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::lock;
use crate::disk::DiskUsage;

/// First pause before reopening a failed engine; doubles per failed attempt.
const RECOVERY_DELAY_MIN: Duration = Duration::from_secs(1);
/// Longest pause between reopen attempts of a failed engine (a disk returning
/// EIO keeps failing; one attempt a minute costs little and logs little).
const RECOVERY_DELAY_MAX: Duration = Duration::from_secs(60);
const MODE_WRITABLE: u8 = 0;
const MODE_READ_ONLY: u8 = 1;
const MODE_FAILED: u8 = 2;

/// What a bookie accepts now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BookieMode {
    /// Every request.
    Writable,
    /// A directory's disk usage reached the threshold: new adds are refused
    /// (READ_ONLY); recovery adds, fences, LACs, deletes and reads are served.
    ReadOnly,
    /// A journal or storage write failed (disk full, I/O error): only reads are
    /// served until the disk monitor reopens journal and storage.
    Failed,
}

impl BookieMode {
    /// Lower-case name for logs and metrics labels.
    pub fn as_str(self) -> &'static str {
        match self {
            BookieMode::Writable => "writable",
            BookieMode::ReadOnly => "read_only",
            BookieMode::Failed => "failed",
        }
    }
}

/// The mode, why, and the last disk measure.
#[derive(Debug, Clone, PartialEq)]
pub struct BookieState {
    /// What the bookie accepts.
    pub mode: BookieMode,
    /// Why it is not writable (`None` when writable).
    pub reason: Option<String>,
    /// Times the bookie left the writable mode since it opened.
    pub read_only_entered_count: u64,
    /// Engines reopened after a failure since the bookie opened.
    pub recovered_count: u64,
    /// The last measure of each directory (journal, ledgers); `None` when the
    /// probe failed.
    pub disk_usage: Vec<(PathBuf, Option<DiskUsage>)>,
}

#[derive(Debug)]
struct Inner {
    reason: Option<String>,
    /// Failed reopen attempts in a row (for the backoff).
    recovery_attempts: u32,
    /// Earliest time of the next reopen attempt.
    next_recovery: Instant,
    usage: Vec<(PathBuf, Option<DiskUsage>)>,
}

/// Mode and reason, shared by the bookie, its engine's threads and the monitor.
#[derive(Debug)]
pub(crate) struct Health {
    mode: AtomicU8,
    /// Generation of the engine in service; reports from others are stale.
    generation: AtomicU64,
    inner: Mutex<Inner>,
    read_only_entered: AtomicU64,
    recovered: AtomicU64,
}

impl Health {
    pub(super) fn new() -> Health {
        Health {
            mode: AtomicU8::new(MODE_WRITABLE),
            generation: AtomicU64::new(0),
            inner: Mutex::new(Inner {
                reason: None,
                recovery_attempts: 0,
                next_recovery: Instant::now(),
                usage: Vec::new(),
            }),
            read_only_entered: AtomicU64::new(0),
            recovered: AtomicU64::new(0),
        }
    }

    pub(super) fn mode(&self) -> BookieMode {
        match self.mode.load(Ordering::Acquire) {
            MODE_WRITABLE => BookieMode::Writable,
            MODE_READ_ONLY => BookieMode::ReadOnly,
            _ => BookieMode::Failed,
        }
    }

    pub(super) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A write or sync of engine `generation` failed: Failed (the first reason
    /// is kept). Ignored when that engine is no longer in service.
    pub(super) fn fail(&self, generation: u64, reason: &str) {
        let mut inner = lock(&self.inner);
        if generation != self.generation() {
            return;
        }
        if self.mode() == BookieMode::Failed {
            return;
        }
        tracing::error!(%reason, "bookie failed a write: read-only until its disks are healthy again");
        if self.mode() == BookieMode::Writable {
            self.read_only_entered.fetch_add(1, Ordering::Relaxed);
        }
        inner.reason = Some(reason.to_string());
        inner.recovery_attempts = 0;
        inner.next_recovery = Instant::now() + RECOVERY_DELAY_MIN;
        self.mode.store(MODE_FAILED, Ordering::Release);
    }

    /// Disk usage passed the threshold: ReadOnly (only from Writable).
    pub(super) fn enter_read_only(&self, reason: String) {
        let mut inner = lock(&self.inner);
        if self.mode() != BookieMode::Writable {
            return;
        }
        tracing::warn!(%reason, "bookie is read-only: new adds are refused");
        self.read_only_entered.fetch_add(1, Ordering::Relaxed);
        inner.reason = Some(reason);
        self.mode.store(MODE_READ_ONLY, Ordering::Release);
    }

    /// Usage back under the low-water mark: Writable (only from ReadOnly).
    pub(super) fn leave_read_only(&self) {
        let mut inner = lock(&self.inner);
        if self.mode() != BookieMode::ReadOnly {
            return;
        }
        tracing::info!("bookie is writable again: disk usage is below the low-water mark");
        inner.reason = None;
        self.mode.store(MODE_WRITABLE, Ordering::Release);
    }

    /// A new engine (generation `generation`) serves: Writable.
    pub(super) fn recovered(&self, generation: u64) {
        let mut inner = lock(&self.inner);
        self.generation.store(generation, Ordering::Release);
        inner.reason = None;
        inner.recovery_attempts = 0;
        self.recovered.fetch_add(1, Ordering::Relaxed);
        self.mode.store(MODE_WRITABLE, Ordering::Release);
    }

    /// A reopen failed: stay Failed, try again after a longer pause.
    pub(super) fn recovery_failed(&self, reason: String) {
        let mut inner = lock(&self.inner);
        inner.recovery_attempts = inner.recovery_attempts.saturating_add(1);
        let delay = RECOVERY_DELAY_MIN
            .saturating_mul(1 << inner.recovery_attempts.min(6))
            .min(RECOVERY_DELAY_MAX);
        tracing::error!(%reason, retry_in_ms = delay.as_millis() as u64, "bookie could not reopen its journal and storage");
        inner.reason = Some(reason);
        inner.next_recovery = Instant::now() + delay;
    }

    pub(super) fn recovery_due(&self) -> bool {
        Instant::now() >= lock(&self.inner).next_recovery
    }

    pub(super) fn set_usage(&self, usage: Vec<(PathBuf, Option<DiskUsage>)>) {
        lock(&self.inner).usage = usage;
    }

    pub(super) fn state(&self) -> BookieState {
        let inner = lock(&self.inner);
        BookieState {
            mode: self.mode(),
            reason: inner.reason.clone(),
            read_only_entered_count: self.read_only_entered.load(Ordering::Relaxed),
            recovered_count: self.recovered.load(Ordering::Relaxed),
            disk_usage: inner.usage.clone(),
        }
    }
}
