//! The next ledger of a log, created ahead of the rollover that attaches it.
//!
//! Owns: the one ledger a log creates while its current one still takes
//! appends: once the append queue says the current ledger is nearly full
//! (`QueueHooks::next_ledger_wanted`, at three quarters of its limits), its
//! id, placement and metadata are made here, so the rollover finds it ready
//! and appends never wait for a ledger's creation. A rollover that comes
//! first (a burst) waits for a creation under way, or creates one itself.
//!
//! No log record names the ledger until its rollover records it. A log that
//! stops (closed, terminated, failed) deletes it; a crash leaves it empty and
//! unnamed, the same garbage a crash between a rollover's create and its
//! record always left. A ledger made for a replication the log no longer
//! uses (`ManagedLog::set_persistence` meanwhile) is deleted at the rollover,
//! which creates one with the new replication.
//! Never: creates more than one ledger ahead, or holds a lock across a
//! creation.

use std::sync::Arc;

use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::backend::{LedgerBackendError, OpenLedger, Persistence};

use super::Shared;

#[derive(Default)]
enum Slot {
    #[default]
    Empty,
    /// A task is creating it; `NextLedger::changed` tells when it is done.
    Creating,
    Ready {
        writer: Arc<dyn OpenLedger>,
        persistence: Persistence,
    },
}

/// The slot of the ledger created ahead (one per log, ~40 bytes).
#[derive(Default)]
pub(super) struct NextLedger {
    slot: Mutex<Slot>,
    /// Told when a creation ends (ready or not).
    changed: Notify,
}

impl std::fmt::Debug for NextLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &*self.slot.lock() {
            Slot::Empty => "empty".to_string(),
            Slot::Creating => "creating".to_string(),
            Slot::Ready { writer, .. } => format!("ready: ledger {}", writer.ledger_id()),
        };
        f.write_str(&state)
    }
}

impl Shared {
    /// Starts creating the next ledger unless one is made or being made.
    pub(super) fn spawn_prepare_next_ledger(shared: &Arc<Shared>) {
        {
            let mut slot = shared.next_ledger.slot.lock();
            if !matches!(*slot, Slot::Empty) || shared.queue.is_stopped() {
                return;
            }
            *slot = Slot::Creating;
        }
        let shared = Arc::clone(shared);
        tokio::spawn(async move {
            let persistence = *shared.persistence.lock();
            let created = shared
                .env
                .ledgers
                .create_ledger(persistence, &shared.name)
                .await;
            let unused = {
                let mut slot = shared.next_ledger.slot.lock();
                debug_assert!(matches!(*slot, Slot::Creating));
                match created {
                    // Checked under the slot's lock: a log that stops after
                    // this finds the ledger in the slot (`discard_next_ledger`).
                    Ok(writer) if shared.queue.is_stopped() => {
                        *slot = Slot::Empty;
                        Some(writer.ledger_id())
                    }
                    Ok(writer) => {
                        tracing::debug!(log = %shared.name, ledger_id = writer.ledger_id(), "next ledger created ahead");
                        *slot = Slot::Ready {
                            writer,
                            persistence,
                        };
                        None
                    }
                    Err(error) => {
                        // The rollover creates one itself (and stops the
                        // log if that fails too).
                        tracing::warn!(log = %shared.name, %error, "could not create the next ledger ahead");
                        *slot = Slot::Empty;
                        None
                    }
                }
            };
            shared.next_ledger.changed.notify_waiters();
            if let Some(ledger_id) = unused {
                shared.delete_unused_ledger(ledger_id).await;
            }
        });
    }

    /// The ledger a rollover attaches: the one created ahead (waiting for
    /// a creation under way), else one created now.
    pub(super) async fn take_next_ledger(&self) -> Result<Arc<dyn OpenLedger>, LedgerBackendError> {
        let persistence = *self.persistence.lock();
        loop {
            let changed = self.next_ledger.changed.notified();
            tokio::pin!(changed);
            changed.as_mut().enable();
            let taken = {
                let mut slot = self.next_ledger.slot.lock();
                match std::mem::take(&mut *slot) {
                    Slot::Creating => {
                        *slot = Slot::Creating;
                        None
                    }
                    Slot::Empty => break,
                    Slot::Ready {
                        writer,
                        persistence: made_with,
                    } => Some((writer, made_with)),
                }
            };
            match taken {
                None => changed.await,
                Some((writer, made_with)) if made_with == persistence => return Ok(writer),
                Some((writer, _)) => {
                    self.delete_unused_ledger(writer.ledger_id()).await;
                    break;
                }
            }
        }
        self.env
            .ledgers
            .create_ledger(persistence, &self.name)
            .await
    }

    /// Deletes the ledger created ahead, if it is there (the log stopped:
    /// no rollover will take it). One still being created is deleted by
    /// its creator, which sees the log stopped.
    pub(super) async fn discard_next_ledger(&self) {
        let ready = {
            let mut slot = self.next_ledger.slot.lock();
            match &*slot {
                Slot::Ready { writer, .. } => {
                    let ledger_id = writer.ledger_id();
                    *slot = Slot::Empty;
                    Some(ledger_id)
                }
                Slot::Creating | Slot::Empty => None,
            }
        };
        if let Some(ledger_id) = ready {
            self.delete_unused_ledger(ledger_id).await;
        }
    }

    /// The same from a stop (the queue's `stopped` hook, not async).
    pub(super) fn spawn_discard_next_ledger(shared: &Arc<Shared>) {
        if matches!(*shared.next_ledger.slot.lock(), Slot::Empty) {
            return;
        }
        if let Ok(runtime) = tokio::runtime::Handle::try_current() {
            let shared = Arc::clone(shared);
            runtime.spawn(async move { shared.discard_next_ledger().await });
        }
    }

    async fn delete_unused_ledger(&self, ledger_id: u64) {
        match self.env.ledgers.delete(ledger_id).await {
            Ok(()) | Err(LedgerBackendError::NoSuchLedger(_)) => {
                tracing::debug!(log = %self.name, ledger_id, "deleted an unused next ledger");
            }
            Err(error) => {
                tracing::warn!(log = %self.name, ledger_id, %error, "could not delete an unused next ledger");
            }
        }
    }
}
