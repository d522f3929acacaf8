//! `AppendFuture`: what `ManagedLog::append` returns, awaited as a future
//! or handed a callback (`AppendFuture::then`) that the append's
//! completion calls itself, with no task in between.
//!
//! Owns: one slot per append shared by the future and its completer
//! (`AppendCompleter`, held by the log until the append ends). Guarantees:
//! the outcome is delivered exactly once (a completer dropped unused
//! delivers `LogError::Closed`); a callback runs outside the slot's lock,
//! on the thread that completed the append, or on the caller of `then`
//! when the append had already ended. Never: runs a callback inside a call
//! into the log's append queue (`AppendScope`: an in-memory ledger
//! completes an add inside `push`, a failed add fails those queued behind
//! it, and the caller of `append` may hold locks the callback takes, such
//! as the dedup table's): such a completion runs the callback in a task.

use std::cell::Cell;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll, Waker};

use parking_lot::Mutex;

use crate::error::LogError;
use crate::position::Position;

/// How an append ended: its position once durable, or why not.
pub type AppendResult = Result<Position, LogError>;

/// Called once with how an append ended.
type AppendCallback = Box<dyn FnOnce(AppendResult) + Send>;

enum SlotState {
    /// Not ended; the task awaiting it, if polled.
    Waiting(Option<Waker>),
    /// Not ended; `then` registered what the completion calls.
    Callback(AppendCallback),
    /// Ended, not yet taken.
    Done(AppendResult),
    /// Delivered.
    Taken,
}

type Slot = Arc<Mutex<SlotState>>;

thread_local! {
    /// Calls into the append queue in progress on this thread.
    static APPEND_SCOPES: Cell<u32> = const { Cell::new(0) };
}

/// Marks a call into the append queue (`push`, `set_writer`, `stop`) on
/// this thread: completions inside it run their callbacks in a task, not
/// under whatever locks the caller holds.
pub(crate) struct AppendScope(());

impl AppendScope {
    pub(crate) fn enter() -> AppendScope {
        APPEND_SCOPES.with(|scopes| scopes.set(scopes.get() + 1));
        AppendScope(())
    }
}

impl Drop for AppendScope {
    fn drop(&mut self) {
        APPEND_SCOPES.with(|scopes| scopes.set(scopes.get().saturating_sub(1)));
    }
}

/// Runs `callback` here, or in a task when this thread is inside an
/// `AppendScope` (and a runtime is there to run it).
fn run_callback(callback: AppendCallback, result: AppendResult) {
    if APPEND_SCOPES.with(Cell::get) > 0
        && let Ok(runtime) = tokio::runtime::Handle::try_current()
    {
        runtime.spawn(async move { callback(result) });
        return;
    }
    callback(result);
}

/// Future of one append: the entry's position once durable.
pub struct AppendFuture {
    slot: Slot,
    refused: bool,
}

impl std::fmt::Debug for AppendFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppendFuture")
            .field("refused", &self.refused)
            .finish_non_exhaustive()
    }
}

/// The log's side of one append: tells the future (or its callback) how
/// the append ended.
pub(crate) struct AppendCompleter {
    slot: Option<Slot>,
}

/// A pending append and its completer.
pub(crate) fn append_slot() -> (AppendCompleter, AppendFuture) {
    let slot: Slot = Arc::new(Mutex::new(SlotState::Waiting(None)));
    (
        AppendCompleter {
            slot: Some(Arc::clone(&slot)),
        },
        AppendFuture {
            slot,
            refused: false,
        },
    )
}

impl AppendCompleter {
    /// Delivers the outcome: wakes the awaiting task, or calls the
    /// callback here (outside the slot's lock).
    pub(crate) fn complete(mut self, result: AppendResult) {
        if let Some(slot) = self.slot.take() {
            deliver(&slot, result);
        }
    }
}

impl Drop for AppendCompleter {
    fn drop(&mut self) {
        if let Some(slot) = self.slot.take() {
            deliver(
                &slot,
                Err(LogError::Closed("append dropped by the log".to_string())),
            );
        }
    }
}

fn deliver(slot: &Slot, result: AppendResult) {
    let mut state = slot.lock();
    match std::mem::replace(&mut *state, SlotState::Taken) {
        SlotState::Waiting(waker) => {
            *state = SlotState::Done(result);
            drop(state);
            if let Some(waker) = waker {
                waker.wake();
            }
        }
        SlotState::Callback(callback) => {
            drop(state);
            run_callback(callback, result);
        }
        SlotState::Done(_) | SlotState::Taken => {
            debug_assert!(false, "an append completed twice");
        }
    }
}

impl AppendFuture {
    /// True when the log refused the append at once (`EntryTooLarge`,
    /// `Overloaded`, or the log had stopped): the entry is not and never
    /// will be in the log, and the future resolves to why. False when the
    /// append was queued (it may still fail later, stopping the log).
    pub fn is_refused(&self) -> bool {
        self.refused
    }

    pub(crate) fn set_refused(&mut self, refused: bool) {
        self.refused = refused;
    }

    /// Calls `callback` once with how the append ended, instead of being
    /// awaited: at once (on this thread) when it has ended already, else
    /// on the thread that completes it (for a log, the ledger writer's
    /// task: keep it short and never block), or in a task when it completes
    /// inside a call into the log (see the module doc). Appends of one log
    /// complete in log order; their callbacks may still run concurrently
    /// (one in a task, or one run by `then` on its caller's thread).
    pub fn then(self, callback: impl FnOnce(AppendResult) + Send + 'static) {
        let mut state = self.slot.lock();
        match std::mem::replace(&mut *state, SlotState::Taken) {
            SlotState::Done(result) => {
                drop(state);
                callback(result);
            }
            SlotState::Waiting(_) => *state = SlotState::Callback(Box::new(callback)),
            SlotState::Callback(_) | SlotState::Taken => {
                debug_assert!(false, "an append's outcome taken twice");
            }
        }
    }
}

impl Future for AppendFuture {
    type Output = AppendResult;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut state = self.slot.lock();
        match &mut *state {
            SlotState::Waiting(waker) => {
                match waker {
                    Some(waker) if waker.will_wake(cx.waker()) => {}
                    _ => *waker = Some(cx.waker().clone()),
                }
                Poll::Pending
            }
            SlotState::Done(_) => match std::mem::replace(&mut *state, SlotState::Taken) {
                SlotState::Done(result) => Poll::Ready(result),
                _ => unreachable!("matched Done above"),
            },
            SlotState::Callback(_) | SlotState::Taken => Poll::Ready(Err(LogError::Closed(
                "an append's outcome polled after it was taken".to_string(),
            ))),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn awaited_or_called_back_each_sees_the_outcome_once() {
        let (completer, future) = append_slot();
        let waiter = tokio::spawn(future);
        tokio::task::yield_now().await;
        completer.complete(Ok(Position::new(1, 2)));
        assert_eq!(waiter.await.unwrap().unwrap(), Position::new(1, 2));

        // A callback registered before the end runs on the completer's call.
        let (completer, future) = append_slot();
        let seen = Arc::new(Mutex::new(Vec::new()));
        let into = Arc::clone(&seen);
        future.then(move |result| into.lock().push(result.map_err(|e| e.to_string())));
        assert!(seen.lock().is_empty());
        completer.complete(Ok(Position::new(3, 4)));
        assert_eq!(*seen.lock(), vec![Ok(Position::new(3, 4))]);

        // One registered after the end runs at once.
        let (completer, future) = append_slot();
        completer.complete(Ok(Position::new(5, 6)));
        let into = Arc::clone(&seen);
        future.then(move |result| into.lock().push(result.map_err(|e| e.to_string())));
        assert_eq!(seen.lock().len(), 2);

        // Completed inside a call into the append queue: the callback runs
        // in a task, not under the caller's locks.
        let (completer, future) = append_slot();
        let (sent, ran) = tokio::sync::oneshot::channel();
        future.then(move |result| {
            let _ = sent.send(result.is_ok());
        });
        let scope = AppendScope::enter();
        completer.complete(Ok(Position::new(7, 8)));
        drop(scope);
        let mut ran = ran;
        assert!(
            ran.try_recv().is_err(),
            "not run inside the scope (this runtime has one thread: the task waits)"
        );
        assert!(ran.await.unwrap());

        // A completer dropped unused delivers Closed.
        let (completer, future) = append_slot();
        drop(completer);
        assert!(matches!(future.await, Err(LogError::Closed(_))));
    }
}
