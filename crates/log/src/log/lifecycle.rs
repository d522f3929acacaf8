//! The log's ledger list over time: rolling over to a new ledger when the
//! append queue detaches a full one, and trimming consumed ledgers past
//! retention.
//!
//! Owns: the updates of the log's metadata record after open (each under
//! `Shared::meta_lock`, a CAS on the record's version: a conflict means
//! another owner took the log, `Fenced`), and the order check of new ledger
//! ids.
//! Guarantees: no append on the next ledger is told a success before every
//! add on the full one was answered (so appends complete in queue order
//! across ledgers) and the log's record names it with the full one's final
//! size (so a reopen recovers the right ledger); the ledger being written
//! is never trimmed.
//!
//! What appends wait for at a rollover: nothing but `meta_lock` and the
//! next ledger, created ahead (`next_ledger`): they are issued to it at
//! once, and their outcomes are held (`queue::Recording`) until every add
//! of the full ledger was answered and the log's record names the next
//! one with the full one's final size (one CAS). So they complete in queue
//! order, none succeeds after an earlier one failed (the next ledger is
//! then recorded nowhere and deleted), and no receipt names an entry a
//! reopen would not find. The full ledger's close (its metadata CAS) runs
//! beside: the record, not the ledger's metadata, is what a reopen trusts
//! for every ledger but the last, which it recovers. Each rollover logs `kind = "rollover"` on target
//! `vela::periodic`: `elapsed_us` from the detach to the record; on the
//! way, `locked_us` (`meta_lock` taken), `answered_us` (the full ledger's
//! adds answered), `next_us` (the next ledger in hand) and `attached_us`
//! (appends go to it).
//!
//! When a ledger is full is the append queue's `LedgerLimits` (Pulsar's
//! rule: an entry or size cap, or the maximum age, and never before the
//! minimum rollover age). Trimming follows Pulsar's `internalTrimLedgers`:
//! closed ledgers below the slowest cursor's mark-delete position (every
//! closed ledger when the log has no cursor), oldest first, each only once
//! retention (time since it closed, then the log's size without it) lets it
//! go. One rule more than Pulsar: on a log without cursors (a topic without
//! subscriptions, read by readers) a closed ledger is also kept until it has
//! been closed for the minimum rollover age, so a reader from the earliest
//! position always finds what was written in that last span, also right
//! after a rollover or a restart (which closes the recovered ledger). Pulsar
//! drops such a ledger at once.
//! Never: holds the state lock across an `.await`, deletes a ledger before
//! the metadata record without it is stored, or holds `meta_lock` while it
//! deletes trimmed ledgers.

use std::sync::Arc;
use std::time::Instant;

use crate::backend::LedgerBackendError;
use crate::error::LogError;
use crate::format::{self, LedgerInfo, LogInfo};
use crate::queue::Detached;

use super::ledger_order::{check_ledger_order, unix_ms};
use super::{Retention, Shared};

/// Whether a log without cursors keeps a closed ledger for its readers:
/// closed less than `age_min` ago.
fn recent_for_readers(ledger: &LedgerInfo, now_ms: u64, age_min: std::time::Duration) -> bool {
    let closed = ledger.closed_unix_ms.unwrap_or(ledger.created_unix_ms);
    now_ms.saturating_sub(closed) < u64::try_from(age_min.as_millis()).unwrap_or(u64::MAX)
}

/// Whether retention lets a consumed, closed ledger go while the log holds
/// `log_bytes`: older than the time limit, or the log over the size limit.
fn retention_lets_go(
    retention: Retention,
    ledger: &LedgerInfo,
    now_ms: u64,
    log_bytes: u64,
) -> bool {
    let expired = retention.time.is_some_and(|time| {
        let closed = ledger.closed_unix_ms.unwrap_or(ledger.created_unix_ms);
        now_ms.saturating_sub(closed) >= u64::try_from(time.as_millis()).unwrap_or(u64::MAX)
    });
    let over_size = retention.size_bytes.is_some_and(|size| log_bytes > size);
    expired || over_size
}

impl Shared {
    /// Starts a rollover in the background (boxed: a rollover may start the
    /// next one, through the queue's `ledger_full` hook).
    pub(super) fn spawn_roll_over(shared: &Arc<Shared>, full: Detached, detached_at: Instant) {
        let future: crate::backend::BoxFuture<'static, ()> =
            Box::pin(Arc::clone(shared).roll_over(full, detached_at));
        tokio::spawn(future);
    }

    /// Takes the next ledger (created ahead) and attaches it to the append
    /// queue at once (which then drains what waited meanwhile) with its
    /// outcomes held; once every add of the full ledger was answered,
    /// records the next one in the log's metadata and lets them through.
    /// The full ledger's close runs beside. Any failure stops the log.
    async fn roll_over(self: Arc<Self>, old: Detached, detached_at: Instant) {
        // Held throughout: a terminate, close or trim waits for the
        // rollover, so the record it writes has the full ledger's final
        // size and names the next ledger.
        let meta_guard = self.meta_lock.lock().await;
        let locked_us = detached_at.elapsed().as_micros() as u64;
        let old_ledger_id = old.writer().ledger_id();
        // Waits for the ledger's adds in flight (also those at bookies past
        // Qa), then records it closed in its metadata.
        let closing = tokio::spawn(old.writer().close());
        if self.terminated.load(std::sync::atomic::Ordering::Acquire) {
            // No next ledger for a terminated log.
            let _ = closing.await;
            return;
        }
        let created = match self.take_next_ledger().await {
            Ok(created) => created,
            Err(error) => {
                self.fail(error.into());
                let _ = closing.await;
                return;
            }
        };
        let next_us = detached_at.elapsed().as_micros() as u64;
        let known = self.state.lock().ledgers.clone();
        if let Err(error) =
            check_ledger_order(&self.env, &self.name, &known, created.ledger_id()).await
        {
            self.fail(error);
            let _ = closing.await;
            return;
        }
        let new_ledger_id = created.ledger_id();
        // Appends go to the next ledger from here; their outcomes wait for
        // the full ledger's last adds and the record below: no success is
        // told before every append of the full ledger succeeded, nor for a
        // ledger a reopen would not find.
        let Some(recording) = self.queue.set_writer_unrecorded(created) else {
            // Closed or failed meanwhile: the next ledger is not recorded
            // (the full one stays last: a reopen recovers it).
            self.delete_unrecorded_ledger(new_ledger_id).await;
            let _ = closing.await;
            return;
        };
        let attached_us = detached_at.elapsed().as_micros() as u64;
        let answered = old.answered().await;
        let answered_us = detached_at.elapsed().as_micros() as u64;
        if !answered {
            // An add of the full ledger failed: the queue stopped (the log
            // fails and is reloaded). The next ledger is recorded nowhere:
            // what it holds is unreachable, and none of it was told.
            let error = self
                .queue
                .stop_error()
                .unwrap_or_else(|| LogError::Closed(self.name.to_string()));
            recording.failed(error);
            self.delete_unrecorded_ledger(new_ledger_id).await;
            let _ = closing.await;
            return;
        }
        let (info, version) = {
            let state = self.state.lock();
            let mut ledgers = state.ledgers.clone();
            let closed_at = unix_ms();
            if let Some(previous) = ledgers.iter_mut().find(|l| l.ledger_id == old_ledger_id) {
                previous.closed_unix_ms = Some(closed_at);
            }
            ledgers.push(LedgerInfo {
                ledger_id: new_ledger_id,
                entries: 0,
                size_bytes: 0,
                created_unix_ms: closed_at,
                closed_unix_ms: None,
                offload: None,
            });
            (
                LogInfo {
                    version: format::FORMAT_VERSION,
                    ledgers,
                    terminated: false,
                },
                state.info_version,
            )
        };
        let key = format::log_key(&self.name);
        let new_version = match self.env.store.update_json(&key, &info, version).await {
            Ok(new_version) => new_version,
            Err(error) => {
                let error = match error {
                    LogError::Fenced(_) => LogError::Fenced(self.name.to_string()),
                    other => other,
                };
                recording.failed(error.clone());
                // A lost CAS surely wrote nothing: no record names the
                // ledger. Another error may have written it: kept.
                let lost = matches!(error, LogError::Fenced(_));
                self.fail(error);
                if lost {
                    self.delete_unrecorded_ledger(new_ledger_id).await;
                }
                let _ = closing.await;
                return;
            }
        };
        {
            let mut state = self.state.lock();
            debug_assert!(
                info.ledgers
                    .windows(2)
                    .all(|pair| pair[0].ledger_id < pair[1].ledger_id),
                "ledger ids increase along the log"
            );
            state.info_version = new_version;
            state.ledgers = info.ledgers;
        }
        // After the state names the ledger: confirmations find it there.
        recording.recorded();
        // Appends issued since the detach are told from here on
        // (ARCHITECTURE.md "Periodic work"); they went to the next ledger
        // from `attached_us`.
        tracing::debug!(
            target: "vela::periodic",
            kind = "rollover",
            elapsed_us = detached_at.elapsed().as_micros() as u64,
            locked_us,
            answered_us,
            next_us,
            attached_us,
            log = %self.name,
            old = old_ledger_id,
            new = new_ledger_id,
            "rolled over"
        );
        let closed = match closing.await {
            Ok(closed) => closed,
            Err(error) => Err(LedgerBackendError::Other(format!(
                "closing ledger {old_ledger_id}: {error}"
            ))),
        };
        if let Err(error) = closed {
            // The record already names the next ledger: the log stops and
            // is reloaded (recovery finds what was durable), as before.
            self.fail(error.into());
            return;
        }
        drop(meta_guard);
        self.trim().await;
        // A ledger closed: the offload thresholds may select it.
        Shared::offload_by_policy(&self);
    }

    /// Deletes a ledger a rollover made and no record names.
    async fn delete_unrecorded_ledger(&self, ledger_id: u64) {
        if let Err(error) = self.env.ledgers.delete(ledger_id).await {
            tracing::warn!(log = %self.name, ledger_id, %error, "could not delete an unrecorded ledger");
        }
    }

    /// Oldest mark-delete position over all cursors, and whether there is
    /// any cursor; with no cursor every confirmed entry counts as consumed
    /// (Pulsar's behaviour without retention).
    fn slowest_mark_delete(&self) -> (Option<Option<crate::position::Position>>, bool) {
        let cursors: Vec<Arc<crate::cursor::Cursor>> =
            self.cursors.lock().values().cloned().collect();
        if cursors.is_empty() {
            return (Some(self.state.lock().last_confirmed), false);
        }
        let slowest = cursors
            .iter()
            .map(|cursor| cursor.mark_delete_position())
            .min();
        (slowest, true)
    }

    /// Deletes the consumed ledgers that retention lets go, then the bookie
    /// copies of offloaded ledgers past their deletion lag.
    pub(crate) async fn trim(&self) {
        self.trim_consumed().await;
        self.release_offloaded().await;
    }

    /// Deletes the consumed ledgers that retention lets go, oldest first,
    /// never the ledger being written (the module doc has the rules).
    async fn trim_consumed(&self) {
        let (Some(Some(slowest)), has_cursors) = self.slowest_mark_delete() else {
            return;
        };
        let age_min = self.config.ledger_age_min;
        let started = Instant::now();
        let meta = self.meta_lock.lock().await;
        let writing = !self.queue.is_stopped();
        let (info, version, trimmed) = {
            let state = self.state.lock();
            let keep_from = state.ledgers.len().saturating_sub(usize::from(writing));
            let consumed = state.ledgers[..keep_from].iter().take_while(|ledger| {
                ledger.ledger_id < slowest.ledger_id
                    || (ledger.ledger_id == slowest.ledger_id
                        && ledger.entries <= slowest.entry_id + 1)
            });
            let retention = *self.retention.lock();
            let total_bytes: u64 = state.ledgers.iter().map(|l| l.size_bytes).sum();
            let now = unix_ms();
            let mut freed_bytes = 0u64;
            let mut trimmed: Vec<LedgerInfo> = Vec::new();
            for ledger in consumed {
                if !has_cursors && recent_for_readers(ledger, now, age_min) {
                    break;
                }
                if !retention_lets_go(retention, ledger, now, total_bytes - freed_bytes) {
                    break;
                }
                freed_bytes += ledger.size_bytes;
                trimmed.push(*ledger);
            }
            if trimmed.is_empty() {
                return;
            }
            let ledgers = state.ledgers[trimmed.len()..].to_vec();
            (
                LogInfo {
                    version: format::FORMAT_VERSION,
                    ledgers,
                    terminated: self.terminated.load(std::sync::atomic::Ordering::Acquire),
                },
                state.info_version,
                trimmed,
            )
        };
        let key = format::log_key(&self.name);
        match self.env.store.update_json(&key, &info, version).await {
            Ok(new_version) => {
                let first = {
                    let mut state = self.state.lock();
                    state.info_version = new_version;
                    state.ledgers.drain(..trimmed.len());
                    state.ledgers.first().map(|l| l.ledger_id)
                };
                if let Some(first) = first {
                    self.cache.remove_ledgers_below(first);
                }
            }
            Err(error) => {
                tracing::warn!(log = %self.name, %error, "could not trim consumed ledgers");
                return;
            }
        }
        // No record names them any more: deleted without the lock, so a
        // rollover (which appends wait for) never waits for the deletes.
        drop(meta);
        for ledger in &trimmed {
            self.delete_ledger_everywhere(ledger).await;
        }
        tracing::debug!(
            target: "vela::periodic",
            kind = "trim",
            elapsed_us = started.elapsed().as_micros() as u64,
            log = %self.name,
            ledgers = trimmed.len(),
            "trimmed consumed ledgers"
        );
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn closed_at(ms: u64) -> LedgerInfo {
        LedgerInfo {
            ledger_id: 1,
            entries: 10,
            size_bytes: 100,
            created_unix_ms: ms.saturating_sub(1000),
            closed_unix_ms: Some(ms),
            offload: None,
        }
    }

    #[test]
    fn readers_keep_ledgers_closed_within_the_minimum_rollover_age() {
        let ten_minutes = Duration::from_secs(600);
        let now = 10_000_000;
        assert!(recent_for_readers(
            &closed_at(now - 599_999),
            now,
            ten_minutes
        ));
        assert!(!recent_for_readers(
            &closed_at(now - 600_000),
            now,
            ten_minutes
        ));
        assert!(!recent_for_readers(&closed_at(now), now, Duration::ZERO));
    }

    #[test]
    fn retention_applies_time_then_size() {
        let now = 10_000_000;
        let ledger = closed_at(now - 60_000);
        let keep_hour = Retention {
            time: Some(Duration::from_secs(3600)),
            size_bytes: None,
        };
        assert!(!retention_lets_go(keep_hour, &ledger, now, 1 << 30));
        let keep_kib = Retention {
            time: None,
            size_bytes: Some(1024),
        };
        assert!(!retention_lets_go(keep_kib, &ledger, now, 1000));
        assert!(retention_lets_go(keep_kib, &ledger, now, 2000));
        assert!(retention_lets_go(Retention::NONE, &ledger, now, 0));
    }
}
