//! The disk monitor: a thread that measures the bookie's directories at open
//! and every `DiskThresholds::check_interval`, moves the bookie between its
//! modes (`health`), and replaces a failed engine once the disks are healthy.
//!
//! Owns: the monitor thread's loop and the engine replacement (`recover`).
//! Guarantees: the fullest directory decides; one that cannot be measured
//! neither turns the bookie read-only nor lets it back; a failed engine is
//! closed (its journal sealed at the last synced mark) before a new one opens
//! on the same directories, replaying the journal as a restart would.
//! Never: runs on the write path, or replaces an engine still in use after
//! `ENGINE_RELEASE_WAIT_MAX` (it retries later).

use std::path::PathBuf;
use std::sync::{Arc, Condvar, Mutex};
use std::time::{Duration, Instant};

use super::engine::Engine;
use super::health::BookieMode;
use super::{Core, lock};
use crate::disk::DiskUsage;

/// How long recovery waits for readers and adds to let go of the old engine
/// (they hold it for one storage read at most, milliseconds).
const ENGINE_RELEASE_WAIT_MAX: Duration = Duration::from_secs(30);

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
