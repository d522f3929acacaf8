//! `AppendQueue`: the one ordered queue of appends above the ledger writers.
//!
//! Owns: the appends not yet handed to a ledger writer, in call order, each
//! holding its bytes of an `AppendBudget` until it completes; the open ledger
//! they go to (none while a rollover creates the next one) and how full that
//! ledger is.
//!
//! The ordering invariant, kept here and nowhere else on the write path:
//! 1. `push` appends under the queue's lock, so the order in which `push`
//!    calls take it is the order of the log;
//! 2. only the drain (one at a time: `State::draining`) takes appends off the
//!    front and hands them to the current writer, in that order;
//! 3. a writer gives entry ids in the order of its `add` calls and completes
//!    them in entry order (the `OpenLedger` contract);
//! 4. a full ledger is detached before any append goes past it, and its
//!    successor is attached only once every add handed to it was answered
//!    (`Detached::answered`: the log's rollover waits for it, not for the
//!    ledger's close), so completions follow the queue's order across
//!    ledgers too.
//!
//! Ahead of a rollover: once the current ledger is nearly full
//! (`LedgerLimits::is_nearly_full`) the owner is told once
//! (`QueueHooks::next_ledger_wanted`), so it can create the next ledger
//! while appends still go to this one.
//!
//! Asserted where corruption would follow: each completed entry id is the
//! number of entries of its ledger completed before it.
//!
//! Bound and failure behaviour (the only ones above the ledger writer):
//! - an append pushed without a permit whose bytes the budget (shared by
//!   every log of a broker) does not have is refused at once with
//!   `LogError::Overloaded` and the queue goes on: back-pressure, nothing
//!   queued is dropped (callers that would rather wait take a permit first,
//!   `AppendBudget::take`);
//! - a failed add (after the ledger client's own retries and ensemble
//!   changes) or `stop` ends the queue: every append still queued fails with
//!   that error and later ones are refused with it; appends already handed to
//!   a writer complete as the writer says.
//!
//! Never: blocks a thread (a writer whose window is full is waited for by one
//! spawned task), reorders, holds its lock while calling a writer or a
//! callback, or hands an append to a detached writer.

use std::collections::VecDeque;
use std::fmt;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

use crate::backend::{
    AddCallback, BoxFuture, LedgerBackend, LedgerBackendError, OpenLedger, Persistence, Reserve,
};
use crate::budget::{AppendBudget, AppendPermit};
use crate::error::LogError;
use crate::log::AppendScope;
use crate::position::Position;

mod tally;
use tally::Tally;
pub(crate) use tally::{Detached, Recording};

/// Payload bytes in flight of one `LedgerAppender` (compaction writes one
/// ledger per topic, one compaction at a time per topic, and waits for its
/// adds every `COMPACTION_ADDS_IN_FLIGHT_MAX`): its own budget, as much as a
/// ledger writer keeps in flight. Past it an add is refused (`Overloaded`).
pub const APPENDER_BYTES_MAX: u64 = 64 << 20;

/// Told once how an append ended: its position once durable, or why not.
pub(crate) type AppendDone = Box<dyn FnOnce(Result<Position, LogError>) + Send>;

/// When a ledger takes no more appends: after the one that reaches a limit,
/// as Pulsar's `ManagedLedgerImpl.currentLedgerIsFull` decides it: an entry
/// or size cap reached, or the maximum age, and in any case (when
/// `age_min` is not zero) only once the ledger is older than `age_min`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct LedgerLimits {
    pub(crate) entries_max: u64,
    pub(crate) bytes_max: u64,
    pub(crate) age_max: Duration,
    pub(crate) age_min: Duration,
}

impl LedgerLimits {
    /// A ledger that takes appends until it is closed.
    const NONE: LedgerLimits = LedgerLimits {
        entries_max: u64::MAX,
        bytes_max: u64::MAX,
        age_max: Duration::MAX,
        age_min: Duration::ZERO,
    };

    /// Whether a ledger of `entries` entries and `bytes` bytes, open for
    /// `age`, is full.
    fn is_full(&self, entries: u64, bytes: u64, age: Duration) -> bool {
        let capped = entries >= self.entries_max || bytes >= self.bytes_max;
        (capped || age >= self.age_max) && (self.age_min.is_zero() || age > self.age_min)
    }

    /// Whether the ledger is nearly full: full by the same rule with a
    /// third more entries, bytes and age (at three quarters of the way):
    /// time to create its successor.
    fn is_nearly_full(&self, entries: u64, bytes: u64, age: Duration) -> bool {
        self.is_full(
            entries.saturating_add(entries / 3),
            bytes.saturating_add(bytes / 3),
            age.saturating_add(age / 3),
        )
    }
}

/// What the owner of a queue is told, outside the queue's lock.
pub(crate) struct QueueHooks {
    /// The current ledger reached a limit and was detached: attach the next
    /// one (`set_writer`) once every add on this one was answered
    /// (`Detached::answered`), and close this one.
    pub(crate) ledger_full: Box<dyn Fn(Detached) + Send + Sync>,
    /// The current ledger is nearly full (told once per ledger, never
    /// together with `ledger_full` for the same append): a good time to
    /// create the next one.
    pub(crate) next_ledger_wanted: Box<dyn Fn() + Send + Sync>,
    /// The queue stopped with this error (an add failed, or `stop`).
    pub(crate) stopped: Box<dyn Fn(&LogError) + Send + Sync>,
}

struct Queued {
    data: Bytes,
    done: AppendDone,
    /// The append's bytes of the budget, given back when it completes.
    permit: AppendPermit,
}

/// The front append taken by the drain, and the writer (with its tally)
/// it goes to.
type Front = (Arc<dyn OpenLedger>, Arc<Tally>, Queued);

/// What handing one more append to the current ledger did to it.
enum Issued {
    Room,
    /// Nearly full, told for the first time: create the next ledger.
    NearlyFull,
    /// Full and detached (its tally, for `Detached::answered`).
    Full(Arc<Tally>),
}

/// The ledger appends go to, and how full it is.
struct Current {
    writer: Arc<dyn OpenLedger>,
    entries: u64,
    bytes: u64,
    opened_at: Instant,
    tally: Arc<Tally>,
    /// `next_ledger_wanted` was told for this ledger.
    next_wanted: bool,
}

enum Writer {
    Open(Current),
    /// Between two ledgers: a rollover is creating the next one.
    Between,
    /// Closed or failed: every append is refused with this.
    Stopped(LogError),
}

struct State {
    items: VecDeque<Queued>,
    /// Payload bytes of `items` plus the one the drain holds.
    bytes: u64,
    writer: Writer,
    /// Someone drains: issues appends, or waits for room for the front one.
    draining: bool,
}

/// The one ordered queue of a log's appends (see the module docs).
pub(crate) struct AppendQueue {
    /// The log's name, for errors.
    name: Arc<str>,
    budget: AppendBudget,
    limits: LedgerLimits,
    hooks: QueueHooks,
    state: Mutex<State>,
    /// Told when the queue is empty with nobody draining, or stopped, while
    /// `drain_watchers` wait for it (`until_drained`; not on the hot path).
    drained: Notify,
    drain_watchers: AtomicUsize,
}

impl fmt::Debug for AppendQueue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let state = self.state.lock();
        f.debug_struct("AppendQueue")
            .field("name", &self.name)
            .field("queued", &state.items.len())
            .field("bytes", &state.bytes)
            .finish_non_exhaustive()
    }
}

impl AppendQueue {
    /// An empty queue with no writer yet (`set_writer` attaches one).
    pub(crate) fn new(
        name: Arc<str>,
        budget: AppendBudget,
        limits: LedgerLimits,
        hooks: QueueHooks,
    ) -> AppendQueue {
        AppendQueue {
            name,
            budget,
            limits,
            hooks,
            state: Mutex::new(State {
                items: VecDeque::new(),
                bytes: 0,
                writer: Writer::Between,
                draining: false,
            }),
            drained: Notify::new(),
            drain_watchers: AtomicUsize::new(0),
        }
    }

    /// Appends `data` at the back, holding `permit` (taken from the budget
    /// here when `None`) until it completes; `done` is told how it ended.
    /// Refused at once (`done` called here, and false returned) when the
    /// queue is stopped or the budget has no room.
    pub(crate) fn push(
        self: &Arc<Self>,
        data: Bytes,
        permit: Option<AppendPermit>,
        done: AppendDone,
    ) -> bool {
        let _scope = AppendScope::enter();
        let payload_bytes = data.len() as u64;
        let permit = permit.or_else(|| self.budget.try_take(data.len()));
        let refused = {
            let mut state = self.state.lock();
            if let Writer::Stopped(error) = &state.writer {
                Some(error.clone())
            } else if let Some(permit) = permit {
                debug_assert_eq!(permit.payload_bytes(), data.len());
                state.bytes += payload_bytes;
                let item = Queued { data, done, permit };
                if !state.draining
                    && state.items.is_empty()
                    && let Writer::Open(current) = &state.writer
                {
                    // Nothing queued, nobody draining: this push drains,
                    // starting with its own append, which is never queued
                    // (an idle log keeps no queue buffer).
                    let front = (
                        Arc::clone(&current.writer),
                        Arc::clone(&current.tally),
                        item,
                    );
                    state.draining = true;
                    drop(state);
                    self.drain_from(None, Some(front));
                    return true;
                }
                state.items.push_back(item);
                let start = !state.draining && matches!(state.writer, Writer::Open(_));
                if start {
                    state.draining = true;
                }
                drop(state);
                if start {
                    self.drain(None);
                }
                return true;
            } else {
                Some(LogError::Overloaded(self.name.to_string()))
            }
        };
        if let Some(error) = refused {
            done(Err(error));
        }
        false
    }

    /// Attaches the writer of the next ledger and drains what waited for it.
    /// False (the writer is not used) when the queue stopped meanwhile.
    pub(crate) fn set_writer(self: &Arc<Self>, writer: Arc<dyn OpenLedger>) -> bool {
        self.attach(writer, Tally::default()).is_some()
    }

    /// As `set_writer`, for a ledger the log's record does not name yet:
    /// appends go to it at once, their outcomes wait for
    /// `Recording::recorded` (or turn into `Recording::failed`'s error).
    /// `None` (the writer is not used) when the queue stopped meanwhile.
    pub(crate) fn set_writer_unrecorded(
        self: &Arc<Self>,
        writer: Arc<dyn OpenLedger>,
    ) -> Option<Recording> {
        let tally = self.attach(writer, Tally::unrecorded())?;
        Some(Recording { tally })
    }

    fn attach(self: &Arc<Self>, writer: Arc<dyn OpenLedger>, tally: Tally) -> Option<Arc<Tally>> {
        let _scope = AppendScope::enter();
        let tally = Arc::new(tally);
        let start = {
            let mut state = self.state.lock();
            match state.writer {
                Writer::Between => {}
                Writer::Stopped(_) => return None,
                Writer::Open(_) => {
                    // Only a detached (full) ledger is followed by another.
                    debug_assert!(false, "a writer attached over an open one");
                    return None;
                }
            }
            state.writer = Writer::Open(Current {
                writer,
                entries: 0,
                bytes: 0,
                opened_at: Instant::now(),
                tally: Arc::clone(&tally),
                next_wanted: false,
            });
            let start = !state.draining && !state.items.is_empty();
            if start {
                state.draining = true;
            }
            start
        };
        if start {
            self.drain(None);
        }
        Some(tally)
    }

    /// Ends the queue with `error`: appends still queued fail with it, later
    /// ones are refused with it. Returns the writer that was attached (for
    /// the caller to close); `None` when there was none or the queue had
    /// stopped already.
    pub(crate) fn stop(&self, error: LogError) -> Option<Arc<dyn OpenLedger>> {
        let _scope = AppendScope::enter();
        let (items, previous) = {
            let mut state = self.state.lock();
            if matches!(state.writer, Writer::Stopped(_)) {
                return None;
            }
            let previous = std::mem::replace(&mut state.writer, Writer::Stopped(error.clone()));
            state.bytes = 0;
            let items: Vec<Queued> = state.items.drain(..).collect();
            (items, previous)
        };
        for item in items {
            (item.done)(Err(error.clone()));
        }
        self.drained.notify_waiters();
        (self.hooks.stopped)(&error);
        match previous {
            Writer::Open(current) => Some(current.writer),
            Writer::Between | Writer::Stopped(_) => None,
        }
    }

    /// True once the queue stopped (closed or failed).
    pub(crate) fn is_stopped(&self) -> bool {
        matches!(self.state.lock().writer, Writer::Stopped(_))
    }

    /// The error the queue stopped with, if it stopped.
    pub(crate) fn stop_error(&self) -> Option<LogError> {
        match &self.state.lock().writer {
            Writer::Stopped(error) => Some(error.clone()),
            Writer::Open(_) | Writer::Between => None,
        }
    }

    /// Resolves once every append pushed so far was handed to a writer (or
    /// the queue stopped).
    pub(crate) async fn until_drained(&self) {
        self.drain_watchers.fetch_add(1, Ordering::AcqRel);
        let _watching = Unwatch(&self.drain_watchers);
        loop {
            let drained = self.drained.notified();
            tokio::pin!(drained);
            drained.as_mut().enable();
            {
                let state = self.state.lock();
                let idle = state.items.is_empty() && !state.draining;
                if idle || matches!(state.writer, Writer::Stopped(_)) {
                    return;
                }
            }
            drained.await;
        }
    }

    /// Hands queued appends to the current writer, front first, while its
    /// window has room; run by whoever set `draining`. With `reserved`, room
    /// for the front append was already reserved on that writer.
    fn drain(self: &Arc<Self>, reserved: Option<Arc<dyn OpenLedger>>) {
        let next = {
            let mut state = self.state.lock();
            self.take_front(&mut state)
        };
        self.drain_from(reserved, next);
    }

    /// `drain`, with the front append already taken (`take_front`, or a
    /// push that found the queue empty): `None` when the drain was released.
    fn drain_from(
        self: &Arc<Self>,
        mut reserved: Option<Arc<dyn OpenLedger>>,
        mut next: Option<Front>,
    ) {
        while let Some((writer, tally, item)) = next {
            let payload_bytes = item.data.len();
            let has_room = match reserved.take() {
                Some(reserved_on) if Arc::ptr_eq(&reserved_on, &writer) => Reserve::Ready,
                _ => writer.reserve(payload_bytes),
            };
            match has_room {
                Reserve::Ready => {}
                Reserve::Wait(room) => {
                    // Back at the front (only the drain pops), and wait for
                    // room off this thread, still holding the drain.
                    self.put_back(item);
                    let queue = Arc::clone(self);
                    tokio::spawn(async move {
                        match room.await {
                            Ok(()) => queue.drain(Some(writer)),
                            Err(error) => {
                                queue.stop(error.into());
                                queue.release_drain();
                            }
                        }
                    });
                    return;
                }
                Reserve::Failed(error) => {
                    self.put_back(item);
                    self.stop(error.into());
                    self.release_drain();
                    return;
                }
            }
            tally.issued.fetch_add(1, Ordering::Relaxed);
            let ledger_id = writer.ledger_id();
            writer.add(
                item.data,
                self.completion(ledger_id, tally, item.done, item.permit),
            );
            // Account for it and take the next one, under one lock.
            let issued = {
                let mut state = self.state.lock();
                let issued = self.account_issued(&mut state, &writer, payload_bytes as u64);
                next = self.take_front(&mut state);
                issued
            };
            match issued {
                Issued::Full(tally) => (self.hooks.ledger_full)(Detached { writer, tally }),
                Issued::NearlyFull => (self.hooks.next_ledger_wanted)(),
                Issued::Room => {}
            }
        }
    }

    /// The front append and the writer it goes to; `None` (and the drain
    /// released) when the queue is empty or has no open writer.
    fn take_front(&self, state: &mut State) -> Option<Front> {
        debug_assert!(state.draining, "drain without holding the drain");
        if let Writer::Open(current) = &state.writer
            && let Some(item) = state.items.pop_front()
        {
            return Some((
                Arc::clone(&current.writer),
                Arc::clone(&current.tally),
                item,
            ));
        }
        state.draining = false;
        if state.items.is_empty() && self.drain_watchers.load(Ordering::Acquire) > 0 {
            self.drained.notify_waiters();
        }
        None
    }

    /// Counts an append handed to `writer`; detaches the writer when its
    /// ledger is full now.
    fn account_issued(
        &self,
        state: &mut State,
        writer: &Arc<dyn OpenLedger>,
        payload_bytes: u64,
    ) -> Issued {
        let State {
            writer: attached,
            bytes,
            ..
        } = state;
        match attached {
            Writer::Open(current) => {
                // Only the drain detaches or attaches writers.
                debug_assert!(Arc::ptr_eq(&current.writer, writer));
                *bytes -= payload_bytes;
                current.entries += 1;
                current.bytes += payload_bytes;
                let age = current.opened_at.elapsed();
                if self.limits.is_full(current.entries, current.bytes, age) {
                    let tally = Arc::clone(&current.tally);
                    // Set under the lock that detaches: every add on this
                    // writer was issued before, and its completions from
                    // now on wake `Detached::answered`.
                    tally.detach();
                    *attached = Writer::Between;
                    return Issued::Full(tally);
                }
                if !current.next_wanted
                    && self
                        .limits
                        .is_nearly_full(current.entries, current.bytes, age)
                {
                    current.next_wanted = true;
                    return Issued::NearlyFull;
                }
                Issued::Room
            }
            // Stopped while this append was handed over (`stop` zeroed the
            // bytes): the writer answers it.
            Writer::Stopped(_) => Issued::Room,
            Writer::Between => {
                debug_assert!(false, "writer detached under a running drain");
                Issued::Room
            }
        }
    }

    /// Returns an append the drain took but could not hand over to the front
    /// of the queue; fails it if the queue stopped meanwhile.
    fn put_back(&self, item: Queued) {
        let mut state = self.state.lock();
        if let Writer::Stopped(error) = &state.writer {
            let error = error.clone();
            drop(state);
            (item.done)(Err(error));
            return;
        }
        state.items.push_front(item);
    }

    fn release_drain(&self) {
        self.state.lock().draining = false;
        if self.drain_watchers.load(Ordering::Acquire) > 0 {
            self.drained.notify_waiters();
        }
    }

    /// The callback of one add on `ledger_id`: checks the order, then tells
    /// the append's `done`; a failure stops the queue first.
    fn completion(
        self: &Arc<Self>,
        ledger_id: u64,
        tally: Arc<Tally>,
        done: AppendDone,
        permit: AppendPermit,
    ) -> AddCallback {
        let queue: Weak<AppendQueue> = Arc::downgrade(self);
        Box::new(move |result| {
            // The append's bytes go back to the budget once it is told.
            let _permit = permit;
            Self::complete(&queue, ledger_id, &tally, done, result);
        })
    }

    fn complete(
        queue: &Weak<AppendQueue>,
        ledger_id: u64,
        tally: &Tally,
        done: AppendDone,
        result: Result<u64, LedgerBackendError>,
    ) {
        match result {
            Ok(entry_id) => {
                let completed = tally.completed.fetch_add(1, Ordering::Relaxed);
                // Corruption would follow: positions confirmed out of order.
                assert_eq!(
                    entry_id, completed,
                    "ledger {ledger_id} completed entry {entry_id} after {completed} others"
                );
                debug_assert!(completed < tally.issued.load(Ordering::Relaxed));
                tally.tell(Ok(Position::new(ledger_id, entry_id)), done);
            }
            Err(error) => {
                let error = LogError::from(error);
                tally.tell(Err(error.clone()), done);
                if let Some(queue) = queue.upgrade() {
                    queue.stop(error);
                }
            }
        }
    }
}

/// Counts a drain watcher out when its wait ends or is dropped.
struct Unwatch<'a>(&'a AtomicUsize);

impl Drop for Unwatch<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }
}

/// The writer of one open ledger behind its own ordered append queue
/// (`LedgerBackend::create`): for writers outside a log (compaction) that
/// issue many adds without waiting. Same bound and failure behaviour as a
/// log's queue; the ledger never rolls over.
pub struct LedgerAppender {
    writer: Arc<dyn OpenLedger>,
    queue: Arc<AppendQueue>,
}

impl fmt::Debug for LedgerAppender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LedgerAppender")
            .field("ledger_id", &self.writer.ledger_id())
            .finish_non_exhaustive()
    }
}

impl LedgerAppender {
    fn new(writer: Arc<dyn OpenLedger>) -> LedgerAppender {
        let hooks = QueueHooks {
            ledger_full: Box::new(|_| debug_assert!(false, "a ledger without limits got full")),
            next_ledger_wanted: Box::new(|| {}),
            stopped: Box::new(|_| {}),
        };
        let name = format!("ledger {}", writer.ledger_id());
        let queue = Arc::new(AppendQueue::new(
            Arc::from(name),
            AppendBudget::new(APPENDER_BYTES_MAX),
            LedgerLimits::NONE,
            hooks,
        ));
        let attached = queue.set_writer(Arc::clone(&writer));
        debug_assert!(attached);
        LedgerAppender { writer, queue }
    }

    /// Id of the ledger written.
    pub fn ledger_id(&self) -> u64 {
        self.writer.ledger_id()
    }

    /// Issues an add; never waits. Adds get entry ids in call order and
    /// `done` runs in entry order once the entry is durable. Past
    /// `APPENDER_BYTES_MAX` bytes in flight the add is refused at once; after
    /// a failed add every later one fails too.
    pub fn add(&self, data: Bytes, done: AddCallback) {
        let ledger_id = self.writer.ledger_id();
        // A refusal is told to `done` like any other outcome.
        let _queued = self.queue.push(
            data,
            None,
            Box::new(move |result: Result<Position, LogError>| {
                done(
                    result
                        .map(|position| {
                            debug_assert_eq!(position.ledger_id, ledger_id);
                            position.entry_id
                        })
                        .map_err(|error| match error {
                            LogError::Ledger(error) => error,
                            other => LedgerBackendError::Other(other.to_string()),
                        }),
                );
            }),
        );
    }

    /// Waits until every add was handed to the writer, then for the adds in
    /// flight, then closes the ledger at its last entry.
    pub fn close(&self) -> BoxFuture<'static, Result<(), LedgerBackendError>> {
        let (queue, writer) = (Arc::clone(&self.queue), Arc::clone(&self.writer));
        Box::pin(async move {
            queue.until_drained().await;
            writer.close().await
        })
    }
}

impl dyn LedgerBackend {
    /// Creates an open ledger (as `create_ledger`) behind its own ordered
    /// append queue (`LedgerAppender`). The log queues its appends itself.
    pub fn create(
        &self,
        persistence: Persistence,
        log_name: &str,
    ) -> BoxFuture<'_, Result<Arc<LedgerAppender>, LedgerBackendError>> {
        let created = self.create_ledger(persistence, log_name);
        Box::pin(async move { Ok(Arc::new(LedgerAppender::new(created.await?))) })
    }
}

#[cfg(test)]
mod tests;
