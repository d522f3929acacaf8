//! [`Parking`]: a task that exists only while it has work. Between runs
//! its state waits parked here (no task, no future, no registered wakers);
//! the first wake-up spawns a run with it, and the run parks it again once
//! it finds nothing to do.
//!
//! The hand-off rule (no lost wake-up): a waker first makes its work
//! visible (queues a command, confirms an entry, ...), then calls
//! [`Parking::wake`], which takes the slot's lock. A run parks only in
//! [`Parking::park`], which looks for work under the same lock. So a wake
//! either takes the lock after the park (finds the state parked and starts
//! a run with it) or before it (the run then sees the work and keeps
//! going). A wake that finds a run going does nothing.
//!
//! Guarantees: at most one run at a time (the state is in the slot or in
//! the one run; asserted: only a run parks, and a run is started only from
//! a parked state); after [`Parking::stop`] no run starts and a run going
//! is aborted. Never: holds its lock across anything but a spawn.

use std::future::Future;
use std::sync::Arc;

use parking_lot::Mutex;
use tokio::runtime::Handle;
use tokio::task::AbortHandle;

/// Where a parking task's state is.
enum Slot<S> {
    /// No run: the state waits for a wake-up.
    Parked(S),
    /// A run has the state.
    Running(AbortHandle),
    /// Stopped: wake-ups do nothing.
    Stopped,
}

/// The parked state of one task, and how to start its runs.
pub struct Parking<S> {
    slot: Mutex<Slot<S>>,
    /// Runs are spawned here (a wake-up may come from any thread).
    runtime: Handle,
}

impl<S> std::fmt::Debug for Parking<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let slot = match &*self.slot.lock() {
            Slot::Parked(_) => "parked",
            Slot::Running(_) => "running",
            Slot::Stopped => "stopped",
        };
        f.debug_struct("Parking").field("slot", &slot).finish()
    }
}

impl<S: Send + 'static> Parking<S> {
    /// A parked task with `state`, started by the first [`Parking::wake`].
    /// Runs are spawned on the runtime this is called on.
    ///
    /// # Panics
    /// Outside a tokio runtime.
    pub fn new(state: S) -> Arc<Parking<S>> {
        Arc::new(Parking {
            slot: Mutex::new(Slot::Parked(state)),
            runtime: Handle::current(),
        })
    }

    /// Starts a run, `run(parking, state)`, if the task is parked; does
    /// nothing while a run goes (it sees the waker's work before it parks:
    /// see the module's hand-off rule) or once stopped. The waker's work
    /// must be visible before this is called.
    pub fn wake<F, Fut>(self: &Arc<Self>, run: F)
    where
        F: FnOnce(Arc<Parking<S>>, S) -> Fut,
        Fut: Future<Output = ()> + Send + 'static,
    {
        let mut slot = self.slot.lock();
        let state = match std::mem::replace(&mut *slot, Slot::Stopped) {
            Slot::Parked(state) => state,
            // Running (the run sees the work before it parks) or stopped.
            other => {
                *slot = other;
                return;
            }
        };
        // Spawned under the lock: the run cannot park before it is
        // recorded as running (its `park` waits for this lock).
        let task = self.runtime.spawn(run(Arc::clone(self), state));
        *slot = Slot::Running(task.abort_handle());
    }

    /// Called by the run: parks `state` unless `has_work(&state)` (asked
    /// under the slot's lock, after which no wake-up is missed); then the
    /// state comes back and the run goes on. `Ok(())`: parked, the run
    /// must end without touching the state again.
    pub fn park(&self, state: S, has_work: impl FnOnce(&S) -> bool) -> Result<(), S> {
        let mut slot = self.slot.lock();
        match *slot {
            Slot::Running(_) => {}
            // Stopped while running (the abort comes at the run's next
            // await): the state is dropped with the run.
            Slot::Stopped => return Err(state),
            Slot::Parked(_) => {
                debug_assert!(false, "a parked task's state was parked again");
                return Err(state);
            }
        }
        if has_work(&state) {
            return Err(state);
        }
        *slot = Slot::Parked(state);
        Ok(())
    }

    /// Called by a run that ends for good: later wake-ups do nothing.
    pub fn finished(&self) {
        let mut slot = self.slot.lock();
        debug_assert!(
            !matches!(*slot, Slot::Parked(_)),
            "a run finished while its state was parked"
        );
        *slot = Slot::Stopped;
    }

    /// Stops the task: a run going is aborted (at its next await), a
    /// parked state is returned (drop it outside any lock of its owner);
    /// later wake-ups do nothing.
    pub fn stop(&self) -> Option<S> {
        let previous = std::mem::replace(&mut *self.slot.lock(), Slot::Stopped);
        match previous {
            Slot::Parked(state) => Some(state),
            Slot::Running(task) => {
                task.abort();
                None
            }
            Slot::Stopped => None,
        }
    }

    /// Runs `f` on the parked state, under the slot's lock (keep it short:
    /// wake-ups wait for it), without starting a run: a read of a parked
    /// task's state (its statistics). `None` while a run goes (ask the run)
    /// or once stopped.
    pub fn with_parked<R>(&self, f: impl FnOnce(&mut S) -> R) -> Option<R> {
        match &mut *self.slot.lock() {
            Slot::Parked(state) => Some(f(state)),
            Slot::Running(_) | Slot::Stopped => None,
        }
    }

    /// True while a run goes (for tests and stats).
    pub fn is_running(&self) -> bool {
        matches!(*self.slot.lock(), Slot::Running(_))
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use crate::{Receiver, mailbox};
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
    use std::time::Duration;

    /// A task that sums what its mailbox brings and parks when it is empty.
    struct Summer {
        rx: Receiver<u64>,
        sum: Arc<AtomicU64>,
        runs: Arc<AtomicUsize>,
    }

    async fn run(parking: Arc<Parking<Summer>>, mut state: Summer) {
        state.runs.fetch_add(1, Ordering::Relaxed);
        loop {
            while let Ok(value) = state.rx.try_recv() {
                state.sum.fetch_add(value, Ordering::Relaxed);
            }
            // Yield now and then, so wakers race with the park.
            tokio::task::yield_now().await;
            match parking.park(state, |s| s.rx.is_ready()) {
                Ok(()) => return,
                Err(back) => state = back,
            }
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn no_value_is_stranded_while_many_wakers_race_the_park() {
        let (tx, rx) = mailbox(1 << 20);
        let sum = Arc::new(AtomicU64::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let parking = Parking::new(Summer {
            rx,
            sum: Arc::clone(&sum),
            runs: Arc::clone(&runs),
        });
        let mut wakers = Vec::new();
        for _ in 0..4 {
            let (tx, parking) = (tx.clone(), Arc::clone(&parking));
            wakers.push(tokio::spawn(async move {
                for i in 1..=5_000u64 {
                    tx.send(i).await.unwrap();
                    parking.wake(run);
                    if i % 64 == 0 {
                        tokio::task::yield_now().await;
                    }
                }
            }));
        }
        for waker in wakers {
            waker.await.unwrap();
        }
        let expected = 4 * (5_000 * 5_001 / 2);
        // Every value is summed without another wake-up: none was left
        // behind a parked state.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while sum.load(Ordering::Relaxed) != expected {
            assert!(
                tokio::time::Instant::now() < deadline,
                "{} of {expected} summed: a wake-up was lost",
                sum.load(Ordering::Relaxed)
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        assert!(runs.load(Ordering::Relaxed) >= 1);
        // It parks once the mailbox is empty.
        while parking.is_running() {
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }

    #[tokio::test]
    async fn a_stopped_task_is_never_started_and_gives_its_state_back() {
        let (tx, rx) = mailbox(4);
        let sum = Arc::new(AtomicU64::new(0));
        let runs = Arc::new(AtomicUsize::new(0));
        let parking = Parking::new(Summer {
            rx,
            sum: Arc::clone(&sum),
            runs: Arc::clone(&runs),
        });
        let state = parking.stop();
        assert!(state.is_some(), "the parked state comes back");
        drop(state);
        tx.send(1).await.unwrap_err();
        parking.wake(run);
        tokio::task::yield_now().await;
        assert_eq!(runs.load(Ordering::Relaxed), 0);
    }

    #[tokio::test]
    async fn a_parked_state_is_read_without_a_run() {
        let (_tx, rx) = mailbox::<u64>(4);
        let runs = Arc::new(AtomicUsize::new(0));
        let parking = Parking::new(Summer {
            rx,
            sum: Arc::new(AtomicU64::new(7)),
            runs: Arc::clone(&runs),
        });
        let sum = parking.with_parked(|state| state.sum.load(Ordering::Relaxed));
        assert_eq!(sum, Some(7));
        assert_eq!(runs.load(Ordering::Relaxed), 0, "no run was started");
        assert!(!parking.is_running());
    }

    #[tokio::test]
    async fn stop_aborts_a_run_going() {
        struct Forever;
        let parking = Parking::new(Forever);
        let (started_tx, started) = tokio::sync::oneshot::channel();
        parking.wake(move |_parking, _state| async move {
            let _ = started_tx.send(());
            std::future::pending::<()>().await;
        });
        started.await.unwrap();
        assert!(parking.is_running());
        assert!(parking.stop().is_none());
        assert!(!parking.is_running());
    }
}
