//! The log's ledger list over time: rolling over to a new ledger when the
//! append queue detaches a full one, and trimming consumed ledgers past
//! retention.
//!
//! Owns: the updates of the log's metadata record after open (each under
//! `Shared::meta_lock`, a CAS on the record's version: a conflict means
//! another owner took the log, `Fenced`), and the order check of new ledger
//! ids.
//! Guarantees: a rollover closes the full ledger (every add on it completed)
//! before it attaches the next one to the append queue, so appends complete
//! in queue order across ledgers; the ledger being written is never trimmed.
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
//! Never: holds the state lock across an `.await`, or deletes a ledger before
//! the metadata record without it is stored.

use std::sync::Arc;

use crate::backend::OpenLedger;
use crate::error::LogError;
use crate::format::{self, LedgerInfo, LogInfo};

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
    pub(super) fn spawn_roll_over(shared: &Arc<Shared>, full: Arc<dyn OpenLedger>) {
        let future: crate::backend::BoxFuture<'static, ()> =
            Box::pin(Arc::clone(shared).roll_over(full));
        tokio::spawn(future);
    }

    /// Closes the full ledger, creates the next one, records it in the log's
    /// metadata and attaches it to the append queue (which then drains what
    /// waited meanwhile). Any failure stops the log.
    async fn roll_over(self: Arc<Self>, old: Arc<dyn OpenLedger>) {
        let meta_guard = self.meta_lock.lock().await;
        if self.terminated.load(std::sync::atomic::Ordering::Acquire) {
            let _ = old.close().await; // no next ledger for a terminated log
            return;
        }
        if let Err(error) = old.close().await {
            self.fail(error.into());
            return;
        }
        let persistence = *self.persistence.lock();
        let created = match self
            .env
            .parts
            .ledgers
            .create_ledger(persistence, &self.name)
            .await
        {
            Ok(created) => created,
            Err(error) => {
                self.fail(error.into());
                return;
            }
        };
        let known = self.state.lock().ledgers.clone();
        if let Err(error) =
            check_ledger_order(&self.env, &self.name, &known, created.ledger_id()).await
        {
            self.fail(error);
            return;
        }
        let (info, version) = {
            let state = self.state.lock();
            let mut ledgers = state.ledgers.clone();
            let closed_at = unix_ms();
            if let Some(previous) = ledgers.iter_mut().find(|l| l.ledger_id == old.ledger_id()) {
                previous.closed_unix_ms = Some(closed_at);
            }
            ledgers.push(LedgerInfo {
                ledger_id: created.ledger_id(),
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
        let new_version = match self.env.parts.store.update_json(&key, &info, version).await {
            Ok(new_version) => new_version,
            Err(error) => {
                let error = match error {
                    LogError::Fenced(_) => LogError::Fenced(self.name.to_string()),
                    other => other,
                };
                self.fail(error);
                let _ = self.env.parts.ledgers.delete(created.ledger_id()).await;
                return;
            }
        };
        if self.queue.is_stopped() {
            // Closed or failed meanwhile: the new ledger stays empty (the
            // next open drops it).
            return;
        }
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
        tracing::debug!(
            log = %self.name,
            old = old.ledger_id(),
            new = created.ledger_id(),
            "rolled over"
        );
        self.queue.set_writer(created);
        drop(meta_guard);
        self.trim().await;
        // A ledger closed: the offload thresholds may select it.
        Shared::offload_by_policy(&self);
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
        let _meta = self.meta_lock.lock().await;
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
        match self.env.parts.store.update_json(&key, &info, version).await {
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
        for ledger in &trimmed {
            self.delete_ledger_everywhere(ledger).await;
        }
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
