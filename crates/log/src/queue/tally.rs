//! What the append queue knows of each ledger it hands appends to: how many
//! were issued and answered (`Tally`), a full ledger detached from the queue
//! (`Detached`, whose rollover waits until every add on it was answered),
//! and the completions of a ledger attached before the log's record names
//! it, held in order until the record is durable (`Recording`).
//!
//! Guarantees: an append is told its outcome once, in entry order within
//! its ledger; a ledger attached unrecorded tells no success before
//! `Recording::recorded` (so no receipt names an entry of a ledger a reopen
//! would not find) and only failures after `Recording::failed`.
//! Never: holds a lock while telling an outcome (outcomes that arrive while
//! held ones are told queue behind them).

use std::collections::VecDeque;
use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::Mutex;
use tokio::sync::Notify;

use super::AppendDone;
use crate::backend::OpenLedger;
use crate::error::LogError;
use crate::position::Position;

/// One append's outcome, and who is told it.
type Outcome = (Result<Position, LogError>, AppendDone);

/// Whether a ledger's outcomes are told as they come.
#[derive(Default)]
enum Gate {
    #[default]
    Open,
    /// Held, in order, until the log's record names the ledger.
    Holding(VecDeque<Outcome>),
    /// The record was not written: every outcome is this failure.
    Failed(LogError),
}

/// Entries of one ledger handed to its writer and completed, for the order
/// assertion and for `Detached::answered`.
#[derive(Default)]
pub(super) struct Tally {
    pub(super) issued: AtomicU64,
    pub(super) completed: AtomicU64,
    /// Appends whose `done` returned (a success's confirmation is recorded
    /// by the log).
    told: AtomicU64,
    /// An add failed (the queue stopped).
    failed: AtomicBool,
    /// The ledger was detached: completions wake `answered`.
    detached: AtomicBool,
    answered: Notify,
    /// `gate` may hold outcomes (checked before taking its lock).
    gated: AtomicBool,
    gate: Mutex<Gate>,
}

impl fmt::Debug for Tally {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tally")
            .field("issued", &self.issued.load(Ordering::Relaxed))
            .field("told", &self.told.load(Ordering::Relaxed))
            .finish_non_exhaustive()
    }
}

impl Tally {
    /// A tally whose outcomes are held until `Recording::recorded`.
    pub(super) fn unrecorded() -> Tally {
        Tally {
            gated: AtomicBool::new(true),
            gate: Mutex::new(Gate::Holding(VecDeque::new())),
            ..Tally::default()
        }
    }

    /// Marks the ledger detached (under the queue's lock that detaches it).
    pub(super) fn detach(&self) {
        self.detached.store(true, Ordering::Release);
    }

    /// Tells `done` its outcome now, or queues it behind held ones.
    pub(super) fn tell(&self, result: Result<Position, LogError>, done: AppendDone) {
        if self.gated.load(Ordering::Acquire) {
            let mut gate = self.gate.lock();
            match &mut *gate {
                Gate::Holding(held) => {
                    held.push_back((result, done));
                    return;
                }
                Gate::Failed(error) => {
                    let error = error.clone();
                    drop(gate);
                    self.tell_now(Err(error), done);
                    return;
                }
                Gate::Open => {}
            }
        }
        self.tell_now(result, done);
    }

    fn tell_now(&self, result: Result<Position, LogError>, done: AppendDone) {
        let ok = result.is_ok();
        done(result);
        if ok {
            self.told.fetch_add(1, Ordering::AcqRel);
            if self.detached.load(Ordering::Acquire) {
                self.answered.notify_waiters();
            }
        } else {
            self.failed.store(true, Ordering::Release);
            self.answered.notify_waiters();
        }
    }
}

/// A full ledger the queue detached: no append goes to it any more.
pub(crate) struct Detached {
    pub(super) writer: Arc<dyn OpenLedger>,
    pub(super) tally: Arc<Tally>,
}

impl fmt::Debug for Detached {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Detached")
            .field("ledger_id", &self.writer.ledger_id())
            .finish_non_exhaustive()
    }
}

impl Detached {
    /// The detached ledger's writer (to close it).
    pub(crate) fn writer(&self) -> &Arc<dyn OpenLedger> {
        &self.writer
    }

    /// Resolves once every add handed to the ledger was answered and told
    /// to its append (their confirmations are in order, done): true, or
    /// once one failed: false. The ledger need not be closed for it.
    pub(crate) async fn answered(&self) -> bool {
        let tally = &self.tally;
        loop {
            let answered = tally.answered.notified();
            tokio::pin!(answered);
            answered.as_mut().enable();
            if tally.failed.load(Ordering::Acquire) {
                return false;
            }
            if tally.told.load(Ordering::Acquire) == tally.issued.load(Ordering::Acquire) {
                return true;
            }
            answered.await;
        }
    }
}

/// A ledger attached before the log's record names it
/// (`AppendQueue::set_writer_unrecorded`): appends go to it at once, their
/// outcomes are held until `recorded` (told in order) or `failed` (told as
/// that failure). Dropped without either: held outcomes fail (`Closed`).
pub(crate) struct Recording {
    pub(super) tally: Arc<Tally>,
}

impl fmt::Debug for Recording {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recording").finish_non_exhaustive()
    }
}

impl Recording {
    /// The record names the ledger (durably): held outcomes are told, in
    /// order, and later ones as they come.
    pub(crate) fn recorded(&self) {
        let tally = &self.tally;
        loop {
            let batch = {
                let mut gate = tally.gate.lock();
                match &mut *gate {
                    Gate::Holding(held) if held.is_empty() => {
                        *gate = Gate::Open;
                        tally.gated.store(false, Ordering::Release);
                        return;
                    }
                    // Outcomes arriving while this batch is told queue
                    // behind it (the gate still holds).
                    Gate::Holding(held) => std::mem::take(held),
                    Gate::Open | Gate::Failed(_) => return,
                }
            };
            for (result, done) in batch {
                tally.tell_now(result, done);
            }
        }
    }

    /// The record was not written: every outcome, held or to come, is
    /// `error` (the entries are in no ledger the log names).
    pub(crate) fn failed(&self, error: LogError) {
        let held = {
            let mut gate = self.tally.gate.lock();
            match std::mem::replace(&mut *gate, Gate::Failed(error.clone())) {
                Gate::Holding(held) => held,
                previous => {
                    *gate = previous;
                    return;
                }
            }
        };
        for (_, done) in held {
            self.tally.tell_now(Err(error.clone()), done);
        }
    }
}

impl Drop for Recording {
    fn drop(&mut self) {
        self.failed(LogError::Closed(
            "a ledger dropped before its record".to_string(),
        ));
    }
}
