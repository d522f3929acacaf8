//! Offloading a log's closed ledgers to object storage (Pulsar's
//! `ManagedLedgerImpl.asyncOffloadPrefix` / `offloadLoop` /
//! `maybeOffload`), and deleting their bookie copies after the lag.
//!
//! Owns: the per-log offload status (one offload at a time), the order of an
//! offload's steps, and which ledgers a prefix or a threshold selects.
//! Steps for one ledger, each metadata change a CAS under `meta_lock`:
//! 1. record a fresh uid in the ledger's `OffloadInfo` (`complete: false`),
//!    then delete a previous attempt's objects, if any;
//! 2. copy the ledger through the offloader (no lock held);
//! 3. record `complete: true` with the time: from then on reads go to the
//!    objects;
//! 4. later (`release_offloaded`, from `trim`): once the deletion lag has
//!    passed, record `bookie_deleted: true`, then delete the bookie ledger.
//!
//! So a ledger is always readable: before step 3 from the bookies, after it
//! from the objects (step 4 runs only after 3); a crash anywhere leaves
//! either an incomplete uid (objects never read, deleted by the next
//! attempt) or a complete one. A store failure (`OffloadError::Store`) is
//! retried with back-off (`RETRY_DELAY_MIN` doubling to `RETRY_DELAY_MAX`,
//! `ATTEMPTS_MAX` attempts per ledger), the status saying `Error` meanwhile.
//! Never: offloads the ledger being written, holds `state` across an
//! `.await`, or deletes a bookie ledger whose offload is not complete.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use crate::backend::LedgerBackendError;
use crate::error::LogError;
use crate::format::{self, LedgerInfo, LogInfo, OffloadInfo};
use crate::offload::{OffloadError, OffloadPolicy, OffloadState, OffloadStatus, OffloadTarget};
use crate::position::Position;

use super::ledger_order::unix_ms;
use super::{ManagedLog, Shared};

/// First wait before an offload retries a ledger after a store failure.
const RETRY_DELAY_MIN: Duration = Duration::from_secs(1);
/// Longest wait between two attempts (doubling from `RETRY_DELAY_MIN`).
const RETRY_DELAY_MAX: Duration = Duration::from_secs(60);
/// Attempts per ledger before the offload fails: 12 attempts span about
/// 8 minutes of an unreachable store.
const ATTEMPTS_MAX: u32 = 12;

/// What one ledger's offload came to.
enum LedgerOutcome {
    /// Offloaded (or found offloaded already).
    Done,
    /// The ledger left the log meanwhile (trimmed): nothing to do.
    Gone,
}

impl ManagedLog {
    /// Offloads every closed ledger before the one holding `up_to` (Pulsar's
    /// `offloadPrefix`), waiting until done; returns the first position not
    /// offloaded. The ledger being written is never offloaded.
    pub async fn offload_prefix(&self, up_to: Position) -> Result<Position, LogError> {
        let (ledger_ids, first_kept) = self.shared.begin_prefix(up_to)?;
        self.shared.run_offload(ledger_ids, first_kept).await
    }

    /// Starts offloading the prefix before `up_to` in the background (the
    /// admin trigger); `offload_status` says how it goes. `OffloadInProgress`
    /// when one runs already.
    ///
    /// As in Pulsar, only `OffloadInProgress` is answered at once; any other
    /// refusal (no offloader, an invalid position) becomes the status's
    /// error.
    pub fn start_offload(&self, up_to: Position) -> Result<(), LogError> {
        let (ledger_ids, first_kept) = match self.shared.begin_prefix(up_to) {
            Ok(selected) => selected,
            Err(error @ LogError::OffloadInProgress(_)) => return Err(error),
            Err(error) => {
                *self.shared.offload_status.lock() = OffloadStatus {
                    state: OffloadState::Error,
                    last_error: error.to_string(),
                    first_unoffloaded: None,
                    running: false,
                };
                return Ok(());
            }
        };
        let shared = Arc::clone(&self.shared);
        tokio::spawn(async move {
            let _ = shared.run_offload(ledger_ids, first_kept).await;
        });
        Ok(())
    }

    /// Offloads what the policy's thresholds select, in the background,
    /// unless an offload runs already or nothing is selected. Returns
    /// whether one started.
    pub fn offload_by_policy(&self) -> bool {
        Shared::offload_by_policy(&self.shared)
    }

    /// Status of the last offload.
    pub fn offload_status(&self) -> OffloadStatus {
        self.shared.offload_status.get()
    }

    /// Sets when ledgers are offloaded and their bookie copies deleted;
    /// applies at the next rollover, trim or `offload_by_policy`.
    pub fn set_offload_policy(&self, policy: OffloadPolicy) {
        *self.shared.offload_policy.lock() = policy;
    }

    /// The offload policy in force.
    pub fn offload_policy(&self) -> OffloadPolicy {
        *self.shared.offload_policy.lock()
    }

    /// Ids of the ledgers whose offload is complete, and whether each still
    /// has its bookie copy (tests, internal stats).
    pub fn offloaded_ledgers(&self) -> Vec<(u64, bool)> {
        self.shared
            .state
            .lock()
            .ledgers
            .iter()
            .filter_map(|l| {
                let offload = l.offload.filter(|o| o.complete)?;
                Some((l.ledger_id, !offload.bookie_deleted))
            })
            .collect()
    }
}

impl Shared {
    /// Checks an offload of the prefix before `up_to` may start, selects
    /// its ledgers and marks the log's offload running.
    fn begin_prefix(&self, up_to: Position) -> Result<(Vec<u64>, Position), LogError> {
        if self.env.parts.offloader.is_none() {
            return Err(LogError::Offload(
                "no offloader is configured (start the broker with --offload-driver)".to_string(),
            ));
        }
        let (ledger_ids, first_kept) = {
            let state = self.state.lock();
            let Some(current) = state.ledgers.last() else {
                return Err(LogError::Offload(format!(
                    "Can't offload managed ledger ({}) with no ledgers",
                    self.name
                )));
            };
            // Pulsar accepts a confirmed position, or entry 0 of the
            // ledger being written.
            let confirmed = state.last_confirmed.is_some_and(|last| up_to <= last)
                && state
                    .ledgers
                    .iter()
                    .any(|l| l.ledger_id == up_to.ledger_id && up_to.entry_id < l.entries);
            let next_of_current = up_to == Position::new(current.ledger_id, 0);
            if !confirmed && !next_of_current {
                return Err(LogError::InvalidPosition(format!(
                    "Invalid position for offload: {up_to}"
                )));
            }
            select_prefix(&state.ledgers, up_to)
        };
        self.mark_running()?;
        Ok((ledger_ids, first_kept))
    }

    fn mark_running(&self) -> Result<(), LogError> {
        let mut status = self.offload_status.lock();
        if status.running {
            return Err(LogError::OffloadInProgress(self.name.to_string()));
        }
        *status = OffloadStatus {
            state: OffloadState::Running,
            last_error: String::new(),
            first_unoffloaded: None,
            running: true,
        };
        Ok(())
    }

    /// Starts a threshold offload in the background (see
    /// `ManagedLog::offload_by_policy`).
    pub(super) fn offload_by_policy(shared: &Arc<Shared>) -> bool {
        if shared.env.parts.offloader.is_none() {
            return false;
        }
        let policy = *shared.offload_policy.lock();
        if policy.threshold_bytes.is_none() && policy.threshold_age.is_none() {
            return false;
        }
        let selected = {
            let state = shared.state.lock();
            let writing = !shared.queue.is_stopped();
            select_by_threshold(&state.ledgers, writing, policy, unix_ms())
        };
        if selected.is_empty() || shared.mark_running().is_err() {
            return false;
        }
        // Pulsar's `PositionImpl.LATEST`: a threshold names no position.
        let first_kept = Position::new(i64::MAX as u64, i64::MAX as u64);
        let shared = Arc::clone(shared);
        tokio::spawn(async move {
            let _ = shared.run_offload(selected, first_kept).await;
        });
        true
    }

    /// Offloads `ledger_ids` in order, then trims (bookie copies past their
    /// deletion lag go); settles the status. Every ledger is tried even
    /// after one fails; the first error is reported (Pulsar's
    /// `offloadLoop`).
    async fn run_offload(
        &self,
        ledger_ids: Vec<u64>,
        first_kept: Position,
    ) -> Result<Position, LogError> {
        let mut first_unoffloaded = first_kept;
        let mut first_error: Option<LogError> = None;
        for ledger_id in ledger_ids {
            if self.queue.is_stopped() && !self.is_terminated() {
                // Closed (unloaded) or failed: the next owner goes on.
                first_error.get_or_insert(LogError::Closed(self.name.to_string()));
                break;
            }
            match self.offload_ledger_retrying(ledger_id).await {
                Ok(LedgerOutcome::Done | LedgerOutcome::Gone) => {}
                Err(error) => {
                    tracing::warn!(log = %self.name, ledger_id, %error, "offload failed");
                    first_unoffloaded = first_unoffloaded.min(Position::new(ledger_id, 0));
                    first_error.get_or_insert(error);
                }
            }
        }
        self.trim().await;
        let mut status = self.offload_status.lock();
        match first_error {
            None => {
                *status = OffloadStatus {
                    state: OffloadState::Success,
                    last_error: String::new(),
                    first_unoffloaded: Some(first_unoffloaded),
                    running: false,
                };
                Ok(first_unoffloaded)
            }
            Some(error) => {
                *status = OffloadStatus {
                    state: OffloadState::Error,
                    last_error: error.to_string(),
                    first_unoffloaded: None,
                    running: false,
                };
                Err(error)
            }
        }
    }

    async fn offload_ledger_retrying(&self, ledger_id: u64) -> Result<LedgerOutcome, LogError> {
        let mut delay = RETRY_DELAY_MIN;
        let mut attempt = 1;
        loop {
            match self.offload_ledger(ledger_id).await {
                Err(LogError::OffloadStore(message)) if attempt < ATTEMPTS_MAX => {
                    tracing::warn!(
                        log = %self.name,
                        ledger_id,
                        attempt,
                        error = %message,
                        "offload failed; retrying"
                    );
                    {
                        let mut status = self.offload_status.lock();
                        status.state = OffloadState::Error;
                        status.last_error = format!(
                            "offloading ledger {ledger_id}: object store: {message} \
                             (attempt {attempt} of {ATTEMPTS_MAX}, retrying in {} s)",
                            delay.as_secs()
                        );
                    }
                    if self.queue.is_stopped() && !self.is_terminated() {
                        return Err(LogError::Closed(self.name.to_string()));
                    }
                    tokio::time::sleep(delay).await;
                    delay = (delay * 2).min(RETRY_DELAY_MAX);
                    attempt += 1;
                    let mut status = self.offload_status.lock();
                    status.state = OffloadState::Running;
                    status.last_error.clear();
                }
                other => return other,
            }
        }
    }

    fn is_terminated(&self) -> bool {
        self.terminated.load(std::sync::atomic::Ordering::Acquire)
    }

    /// One attempt at one ledger (the module doc's steps 1 to 3).
    async fn offload_ledger(&self, ledger_id: u64) -> Result<LedgerOutcome, LogError> {
        let offloader = self
            .env
            .parts
            .offloader
            .clone()
            .ok_or_else(|| LogError::Offload("no offloader is configured".to_string()))?;
        let uid: u128 = rand::random();
        let target = OffloadTarget { ledger_id, uid };
        // Step 1: record the attempt's uid before any object exists.
        let mut previous = None;
        let mut entries = 0;
        let mut size_bytes = 0;
        let recorded = self
            .update_ledger(ledger_id, |ledger| {
                if ledger.offload.is_some_and(|o| o.complete) {
                    return false;
                }
                previous = ledger.offload.map(|o| OffloadTarget {
                    ledger_id,
                    uid: o.uid(),
                });
                entries = ledger.entries;
                size_bytes = ledger.size_bytes;
                ledger.offload = Some(OffloadInfo::started(uid));
                true
            })
            .await?;
        match recorded {
            Recorded::Missing => return Ok(LedgerOutcome::Gone),
            Recorded::Unchanged => return Ok(LedgerOutcome::Done),
            Recorded::Stored => {}
        }
        if let Some(previous) = previous
            && let Err(error) = offloader.delete(previous).await
        {
            tracing::warn!(log = %self.name, ledger_id, %error, "could not delete a previous offload attempt's objects");
        }
        // Step 2: the copy.
        let written = match offloader
            .offload(target, entries, size_bytes, &*self.env.parts.ledgers)
            .await
        {
            Ok(written) => written,
            Err(error) => {
                let _ = offloader.delete(target).await;
                let still_held = self
                    .state
                    .lock()
                    .ledgers
                    .iter()
                    .any(|l| l.ledger_id == ledger_id);
                return match error {
                    _ if !still_held => Ok(LedgerOutcome::Gone),
                    OffloadError::Store(message) => Err(LogError::OffloadStore(message)),
                    other => Err(LogError::Offload(format!(
                        "offloading ledger {ledger_id}: {other}"
                    ))),
                };
            }
        };
        // Step 3: from now on reads go to the objects.
        let now = unix_ms();
        let completed = self
            .update_ledger(ledger_id, |ledger| match &mut ledger.offload {
                Some(offload) if offload.uid() == uid => {
                    offload.complete = true;
                    offload.offloaded_unix_ms = now;
                    true
                }
                _ => false,
            })
            .await?;
        match completed {
            Recorded::Stored => {
                tracing::info!(
                    log = %self.name,
                    ledger_id,
                    written,
                    driver = offloader.driver_name(),
                    "ledger offloaded"
                );
                Ok(LedgerOutcome::Done)
            }
            Recorded::Missing | Recorded::Unchanged => {
                // Trimmed, or another attempt took over: ours is garbage.
                let _ = offloader.delete(target).await;
                Ok(LedgerOutcome::Gone)
            }
        }
    }

    /// Applies `change` to one ledger's info and stores the log's record
    /// (a CAS under `meta_lock`), if `change` says it changed something.
    async fn update_ledger(
        &self,
        ledger_id: u64,
        change: impl FnOnce(&mut LedgerInfo) -> bool,
    ) -> Result<Recorded, LogError> {
        let _meta = self.meta_lock.lock().await;
        let (info, version, updated) = {
            let state = self.state.lock();
            let mut ledgers = state.ledgers.clone();
            let Some(ledger) = ledgers.iter_mut().find(|l| l.ledger_id == ledger_id) else {
                return Ok(Recorded::Missing);
            };
            if !change(ledger) {
                return Ok(Recorded::Unchanged);
            }
            let updated = *ledger;
            let info = LogInfo {
                version: format::FORMAT_VERSION,
                ledgers,
                terminated: self.is_terminated(),
            };
            (info, state.info_version, updated)
        };
        let key = format::log_key(&self.name);
        let new_version = self
            .env
            .parts
            .store
            .update_json(&key, &info, version)
            .await
            .map_err(|error| match error {
                LogError::Fenced(_) => LogError::Fenced(self.name.to_string()),
                other => other,
            })?;
        let mut state = self.state.lock();
        state.info_version = new_version;
        if let Some(ledger) = state.ledgers.iter_mut().find(|l| l.ledger_id == ledger_id) {
            ledger.offload = updated.offload;
        }
        Ok(Recorded::Stored)
    }

    /// Reads entries of a ledger whose offload is complete: from its objects
    /// (at least one entry, then what fits in `bytes_max`); from the bookies
    /// when this broker has no offloader but the bookies' copy is still
    /// there.
    pub(super) async fn read_offloaded(
        &self,
        target: OffloadTarget,
        bookie_deleted: bool,
        first_entry_id: u64,
        last_entry_id: u64,
        bytes_max: usize,
    ) -> Result<Vec<Bytes>, LogError> {
        match &self.env.parts.offloader {
            Some(offloader) => Ok(offloader
                .read(target, first_entry_id, last_entry_id, bytes_max)
                .await?),
            None if !bookie_deleted => Ok(self
                .env
                .parts
                .ledgers
                .read(target.ledger_id, first_entry_id, last_entry_id)
                .await?),
            None => Err(LogError::Offload(format!(
                "ledger {} of {} is only in object storage, and this broker has no offloader \
                 (--offload-driver)",
                target.ledger_id, self.name
            ))),
        }
    }

    /// Deletes the bookie copies of offloaded ledgers whose deletion lag has
    /// passed (step 4): the record first, then the bookie ledger.
    pub(super) async fn release_offloaded(&self) {
        let Some(lag) = self.offload_policy.lock().deletion_lag else {
            return;
        };
        let lag_ms = u64::try_from(lag.as_millis()).unwrap_or(u64::MAX);
        let now = unix_ms();
        let due: Vec<u64> = self
            .state
            .lock()
            .ledgers
            .iter()
            .filter(|l| {
                l.offload.is_some_and(|o| {
                    o.complete
                        && !o.bookie_deleted
                        && now.saturating_sub(o.offloaded_unix_ms) >= lag_ms
                })
            })
            .map(|l| l.ledger_id)
            .collect();
        for ledger_id in due {
            let marked = self
                .update_ledger(ledger_id, |ledger| match &mut ledger.offload {
                    Some(offload) if offload.complete && !offload.bookie_deleted => {
                        offload.bookie_deleted = true;
                        true
                    }
                    _ => false,
                })
                .await;
            match marked {
                Ok(Recorded::Stored) => match self.env.parts.ledgers.delete(ledger_id).await {
                    Ok(()) | Err(LedgerBackendError::NoSuchLedger(_)) => {
                        tracing::info!(
                            log = %self.name,
                            ledger_id,
                            "bookie copy of an offloaded ledger deleted"
                        );
                    }
                    Err(error) => {
                        // The record says deleted: the bookie ledger is
                        // garbage now, never read again.
                        tracing::warn!(log = %self.name, ledger_id, %error, "could not delete the bookie copy of an offloaded ledger");
                    }
                },
                Ok(Recorded::Missing | Recorded::Unchanged) => {}
                Err(error) => {
                    tracing::warn!(log = %self.name, ledger_id, %error, "could not record an offloaded ledger's bookie copy as deleted");
                    return;
                }
            }
        }
    }

    /// Deletes what a ledger that left the log kept: its offload objects
    /// (any attempt) and its bookie copy unless already deleted.
    pub(super) async fn delete_ledger_everywhere(&self, ledger: &LedgerInfo) {
        if let (Some(offload), Some(offloader)) = (ledger.offload, &self.env.parts.offloader) {
            let target = OffloadTarget {
                ledger_id: ledger.ledger_id,
                uid: offload.uid(),
            };
            if let Err(error) = offloader.delete(target).await {
                tracing::warn!(log = %self.name, ledger_id = ledger.ledger_id, %error, "could not delete an offloaded ledger's objects");
            }
        }
        if ledger.offload.is_some_and(|o| o.bookie_deleted) {
            return;
        }
        match self.env.parts.ledgers.delete(ledger.ledger_id).await {
            Ok(()) | Err(LedgerBackendError::NoSuchLedger(_)) => {
                tracing::debug!(
                    log = %self.name,
                    ledger_id = ledger.ledger_id,
                    "deleted ledger"
                );
            }
            Err(error) => {
                tracing::warn!(log = %self.name, ledger_id = ledger.ledger_id, %error, "could not delete a ledger");
            }
        }
    }
}

/// What `update_ledger` did.
enum Recorded {
    /// The ledger is not in the log.
    Missing,
    /// `change` changed nothing: nothing stored.
    Unchanged,
    /// The record is stored with the change.
    Stored,
}

/// The closed, non-empty, not yet offloaded ledgers before the one holding
/// `up_to`, and the first position kept (entry 0 of that ledger, or of the
/// ledger being written): Pulsar's selection, the last ledger never taken.
fn select_prefix(ledgers: &[LedgerInfo], up_to: Position) -> (Vec<u64>, Position) {
    let Some((current, closed)) = ledgers.split_last() else {
        return (Vec::new(), up_to);
    };
    let mut first_kept = current.ledger_id;
    let mut selected = Vec::new();
    for ledger in closed {
        if ledger.ledger_id >= up_to.ledger_id {
            first_kept = ledger.ledger_id;
            break;
        }
        if !ledger.offload.is_some_and(|o| o.complete) && ledger.size_bytes > 0 {
            selected.push(ledger.ledger_id);
        }
    }
    (selected, Position::new(first_kept, 0))
}

/// The closed ledgers a threshold policy offloads: newest first, once the
/// bytes of newer ledgers pass `threshold_bytes`, or once closed longer
/// than `threshold_age` (Pulsar's `maybeOffload`); returned oldest first.
fn select_by_threshold(
    ledgers: &[LedgerInfo],
    writing: bool,
    policy: OffloadPolicy,
    now_ms: u64,
) -> Vec<u64> {
    let closed = &ledgers[..ledgers.len().saturating_sub(usize::from(writing))];
    let mut newer_bytes = 0u64;
    let mut selected = Vec::new();
    for ledger in closed.iter().rev() {
        newer_bytes += ledger.size_bytes;
        if ledger.offload.is_some_and(|o| o.complete) || ledger.entries == 0 {
            continue;
        }
        let over_size = policy.threshold_bytes.is_some_and(|t| newer_bytes > t);
        let closed_ms = ledger.closed_unix_ms.unwrap_or(ledger.created_unix_ms);
        let over_age = policy.threshold_age.is_some_and(|age| {
            now_ms.saturating_sub(closed_ms) > u64::try_from(age.as_millis()).unwrap_or(u64::MAX)
        });
        if over_size || over_age {
            selected.push(ledger.ledger_id);
        }
    }
    selected.reverse();
    selected
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ledger(ledger_id: u64, size_bytes: u64, closed_ms: u64, offloaded: bool) -> LedgerInfo {
        LedgerInfo {
            ledger_id,
            entries: size_bytes.div_ceil(10),
            size_bytes,
            created_unix_ms: closed_ms.saturating_sub(10),
            closed_unix_ms: Some(closed_ms),
            offload: offloaded.then(|| OffloadInfo {
                complete: true,
                ..OffloadInfo::started(7)
            }),
        }
    }

    #[test]
    fn a_prefix_stops_before_the_ledger_holding_the_position() {
        let ledgers = [
            ledger(1, 100, 0, false),
            ledger(2, 100, 0, true),
            ledger(3, 0, 0, false),
            ledger(4, 100, 0, false),
            ledger(5, 100, 0, false),
            ledger(6, 0, 0, false),
        ];
        assert_eq!(
            select_prefix(&ledgers, Position::new(5, 3)),
            (vec![1, 4], Position::new(5, 0))
        );
        // Up to the ledger being written: every closed ledger, never it.
        assert_eq!(
            select_prefix(&ledgers, Position::new(6, 0)),
            (vec![1, 4, 5], Position::new(6, 0))
        );
        assert_eq!(
            select_prefix(&ledgers, Position::new(1, 0)),
            (vec![], Position::new(1, 0))
        );
    }

    #[test]
    fn thresholds_keep_the_newest_bytes_and_take_old_ledgers() {
        let now = 1_000_000;
        let ledgers = [
            ledger(1, 100, now - 50_000, false),
            ledger(2, 100, now - 40_000, true),
            ledger(3, 100, now - 30_000, false),
            ledger(4, 100, now - 20_000, false),
            ledger(5, 0, now, false),
        ];
        let by_size = OffloadPolicy {
            threshold_bytes: Some(150),
            threshold_age: None,
            deletion_lag: None,
        };
        // Newest first: 4 (100 ≤ 150 kept), 3 (200 > 150 offloaded), 1.
        assert_eq!(
            select_by_threshold(&ledgers, true, by_size, now),
            vec![1, 3]
        );
        let by_age = OffloadPolicy {
            threshold_bytes: None,
            threshold_age: Some(Duration::from_secs(35)),
            deletion_lag: None,
        };
        assert_eq!(select_by_threshold(&ledgers, true, by_age, now), vec![1]);
        // Zero bytes: everything closed; the ledger being written never.
        let all = OffloadPolicy {
            threshold_bytes: Some(0),
            ..by_size
        };
        assert_eq!(select_by_threshold(&ledgers, true, all, now), vec![1, 3, 4]);
    }
}
