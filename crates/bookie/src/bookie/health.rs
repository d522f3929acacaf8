//! The bookie's health: writable, read-only (disk usage past the threshold) or
//! failed (a journal or storage write failed), and the disk monitor thread
//! that moves between them and reopens a failed engine.
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
use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::engine::Engine;
use super::{Core, lock};
use crate::disk::DiskUsage;

/// First pause before reopening a failed engine; doubles per failed attempt.
const RECOVERY_DELAY_MIN: Duration = Duration::from_secs(1);
/// Longest pause between reopen attempts of a failed engine (a disk returning
/// EIO keeps failing; one attempt a minute costs little and logs little).
const RECOVERY_DELAY_MAX: Duration = Duration::from_secs(60);
/// How long recovery waits for readers and adds to let go of the old engine
/// (they hold it for one storage read at most, milliseconds).
const ENGINE_RELEASE_WAIT_MAX: Duration = Duration::from_secs(30);

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
    fn enter_read_only(&self, reason: String) {
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
    fn leave_read_only(&self) {
        let mut inner = lock(&self.inner);
        if self.mode() != BookieMode::ReadOnly {
            return;
        }
        tracing::info!("bookie is writable again: disk usage is below the low-water mark");
        inner.reason = None;
        self.mode.store(MODE_WRITABLE, Ordering::Release);
    }

    /// A new engine (generation `generation`) serves: Writable.
    fn recovered(&self, generation: u64) {
        let mut inner = lock(&self.inner);
        self.generation.store(generation, Ordering::Release);
        inner.reason = None;
        inner.recovery_attempts = 0;
        self.recovered.fetch_add(1, Ordering::Relaxed);
        self.mode.store(MODE_WRITABLE, Ordering::Release);
    }

    /// A reopen failed: stay Failed, try again after a longer pause.
    fn recovery_failed(&self, reason: String) {
        let mut inner = lock(&self.inner);
        inner.recovery_attempts = inner.recovery_attempts.saturating_add(1);
        let delay = RECOVERY_DELAY_MIN
            .saturating_mul(1 << inner.recovery_attempts.min(6))
            .min(RECOVERY_DELAY_MAX);
        tracing::error!(%reason, retry_in_ms = delay.as_millis() as u64, "bookie could not reopen its journal and storage");
        inner.reason = Some(reason);
        inner.next_recovery = Instant::now() + delay;
    }

    fn recovery_due(&self) -> bool {
        Instant::now() >= lock(&self.inner).next_recovery
    }

    fn set_usage(&self, usage: Vec<(PathBuf, Option<DiskUsage>)>) {
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

/// Tells the monitor thread to stop, waking it at once.
#[derive(Debug, Default)]
pub(super) struct StopSignal {
    stopped: Mutex<bool>,
    wake: Condvar,
}

impl StopSignal {
    pub(super) fn stop(&self) {
        *lock(&self.stopped) = true;
        self.wake.notify_all();
    }

    /// Waits up to `timeout`; returns whether the thread must stop.
    fn wait(&self, timeout: Duration) -> bool {
        let stopped = lock(&self.stopped);
        if *stopped {
            return true;
        }
        let (stopped, _) = self
            .wake
            .wait_timeout(stopped, timeout)
            .unwrap_or_else(|poisoned| poisoned.into_inner());
        *stopped
    }
}

/// The disk monitor: measures every directory at once and then each
/// `check_interval`, and moves the bookie between modes (see the module docs).
pub(super) fn run_monitor(core: Arc<Core>, stop: Arc<StopSignal>) {
    let thresholds = core.config.disk;
    let dirs = [
        core.config.journal.dir.clone(),
        core.config.storage.ledger_dir.clone(),
    ];
    let mut first = true;
    while first || !stop.wait(thresholds.check_interval) {
        first = false;
        let usage: Vec<(PathBuf, Option<DiskUsage>)> = dirs
            .iter()
            .map(|dir| {
                let measured = core.config.disk_probe.measure(dir);
                if let Err(error) = &measured {
                    tracing::debug!(dir = %dir.display(), %error, "cannot measure disk usage");
                }
                (dir.clone(), measured.ok())
            })
            .collect();
        // The fullest directory decides; one that cannot be measured neither
        // turns the bookie read-only nor lets it back.
        let fullest = usage
            .iter()
            .filter_map(|(dir, u)| u.map(|u| (dir, u.used_fraction())))
            .max_by(|a, b| a.1.total_cmp(&b.1));
        let measured_all = usage.iter().all(|(_, u)| u.is_some());
        core.health.set_usage(usage.clone());
        let Some((fullest_dir, used)) = fullest else {
            continue;
        };
        let below_lwm = measured_all && used < thresholds.usage_lwm;
        match core.health.mode() {
            BookieMode::Writable if used >= thresholds.usage_max => {
                core.health.enter_read_only(format!(
                    "disk usage {:.1}% of {} reached the threshold of {:.1}% (disk almost full)",
                    used * 100.0,
                    fullest_dir.display(),
                    thresholds.usage_max * 100.0
                ));
            }
            BookieMode::ReadOnly if below_lwm => core.health.leave_read_only(),
            BookieMode::Failed if below_lwm && core.health.recovery_due() => {
                if let Err(reason) = recover(&core) {
                    core.health.recovery_failed(reason);
                }
            }
            _ => {}
        }
    }
}

/// Replaces a failed engine: takes it out of service, waits for its users,
/// closes it (the journal seals its file), opens a new one on the same
/// directories. Reads answer IoError meanwhile (the ledger client reads
/// another replica).
fn recover(core: &Core) -> Result<(), String> {
    tracing::info!("bookie disks are healthy again: reopening journal and ledger storage");
    let old = core.engine.write().take();
    if let Some(old) = old {
        let deadline = Instant::now() + ENGINE_RELEASE_WAIT_MAX;
        let mut old = old;
        let engine = loop {
            match Arc::try_unwrap(old) {
                Ok(engine) => break engine,
                Err(shared) if Instant::now() < deadline => {
                    old = shared;
                    std::thread::sleep(Duration::from_millis(5));
                }
                Err(shared) => {
                    *core.engine.write() = Some(shared);
                    return Err("the failed engine is still in use; will retry".to_string());
                }
            }
        };
        core.retire(&engine);
        engine.close();
        drop(engine);
    }
    let generation = core.health.generation() + 1;
    match Engine::open(
        &core.config,
        generation,
        &core.health,
        &core.checkpoint_latency,
    ) {
        Ok(engine) => {
            let engine = Arc::new(engine);
            *core.engine.write() = Some(Arc::clone(&engine));
            core.health.recovered(generation);
            // A failure of the new engine before `recovered` was reported
            // under a generation not yet in service (ignored): look again.
            if let Some(reason) = engine.failure() {
                core.health.fail(generation, &reason);
                return Ok(());
            }
            tracing::info!(
                generation,
                "bookie reopened its journal and storage: writable again"
            );
            Ok(())
        }
        Err(error) => Err(format!("reopening journal and storage failed: {error}")),
    }
}
