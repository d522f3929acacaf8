//! The bookie's one ADD entry point, `Bookie::add`, with the protocol's
//! meaning whoever calls it (the TCP server for a remote ledger client, or
//! `LocalBookies` for one in the same process): an add that finds the write
//! cache full waits up to `ADD_ROOM_WAIT_MAX` for the flush that frees room,
//! and only then is answered TOO_MANY_REQUESTS.
//!
//! Owns: the FIFO of adds waiting for write-cache room (`RoomQueue`, bounded
//! by `ADD_ROOM_WAITERS_MAX`), and the step that takes an add (fence check,
//! write-cache put, journal append: `Core::add_now`).
//! Guarantees: adds are taken in call order: an add that finds others
//! waiting for room queues behind them even if its own entry would fit, so
//! entries a caller issues in order reach the journal in order (as over one
//! TCP connection); `done` runs exactly once (a dropped `AddAdmission` answers
//! TOO_MANY_REQUESTS); an add that finds room and no waiter is taken at once,
//! on the calling thread, with no task hop.
//! Never: blocks a thread (waiting is an `.await` on `AddAdmission`), or
//! waits longer than `ADD_ROOM_WAIT_MAX` for room past the add's turn.

use std::collections::VecDeque;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::Notify;
use vela_bookie_protocol::entry::parse_header;
use vela_bookie_protocol::{AddMode, Status};

use super::{Core, WriteKind};
use crate::journal::{AppendRefused, JournalRecord};
use crate::storage::{Put, StorageError};

/// Longest an ADD waits, once its turn came, for room in a full write cache
/// before it is answered TOO_MANY_REQUESTS. A flush frees the cache in tens of
/// ms; 500 ms is far below a ledger writer's add timeout (5 s), so a bookie
/// that stays full meets the writer's retry, not its timeout.
pub const ADD_ROOM_WAIT_MAX: Duration = Duration::from_millis(500);

/// Adds waiting for write-cache room at once, across every caller. Callers
/// bound themselves well below it (a TCP connection waits with one add, its
/// read loop stopped; a ledger writer has at most 4096 adds out); this bound
/// is for a caller that does not: past it an add is answered
/// TOO_MANY_REQUESTS at once.
pub const ADD_ROOM_WAITERS_MAX: usize = 16_384;

/// An add that takes longer than this from `Bookie::add` to durable is logged
/// at debug on target `vela::bookie::slow_add` with the part before the
/// journal (room wait, stripe lock, write-cache put); the journal logs its own
/// slow groups (`vela::journal::slow`).
const SLOW_ADD: Duration = Duration::from_millis(10);

/// What an add's `done` is called with: its (ledger, entry) ids once durable,
/// or why not.
pub type AddResult = Result<(u64, u64), Status>;

/// The admission of one add: ready at once when the add was taken (or
/// refused) on the call; otherwise it holds the add until the add's turn
/// comes and the write cache has room, and takes it then (or answers
/// TOO_MANY_REQUESTS after `ADD_ROOM_WAIT_MAX`). Await it before issuing
/// anything that must come after this add.
#[must_use = "an add waiting for write-cache room is taken only while its admission is awaited"]
pub struct AddAdmission {
    waiting: Option<Pin<Box<dyn Future<Output = ()> + Send>>>,
}

impl std::fmt::Debug for AddAdmission {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AddAdmission")
            .field("waiting", &self.waiting.is_some())
            .finish()
    }
}

impl AddAdmission {
    fn taken() -> AddAdmission {
        AddAdmission { waiting: None }
    }

    /// Whether the add was taken (or refused) when `Bookie::add` was called,
    /// without waiting for room.
    pub fn is_taken(&self) -> bool {
        self.waiting.is_none()
    }
}

impl Future for AddAdmission {
    type Output = ();

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        match self.waiting.as_mut() {
            None => Poll::Ready(()),
            Some(waiting) => {
                let poll = waiting.as_mut().poll(cx);
                if poll.is_ready() {
                    self.waiting = None;
                }
                poll
            }
        }
    }
}

/// Adds waiting for write-cache room, oldest first.
#[derive(Debug, Default)]
pub(super) struct RoomQueue {
    /// Places taken and not yet left: lets `add` see "nobody waits" without
    /// the lock.
    waiting: AtomicUsize,
    places: parking_lot::Mutex<Places>,
}

#[derive(Debug, Default)]
struct Places {
    next_ticket: u64,
    /// Tickets in arrival order, each with what wakes it when it is first.
    queue: VecDeque<(u64, Arc<Notify>)>,
}

impl RoomQueue {
    fn is_empty(&self) -> bool {
        self.waiting.load(Ordering::Acquire) == 0
    }

    /// A place at the back, or `None` when `ADD_ROOM_WAITERS_MAX` wait.
    fn join(self: &Arc<RoomQueue>) -> Option<Place> {
        let mut places = self.places.lock();
        if places.queue.len() >= ADD_ROOM_WAITERS_MAX {
            return None;
        }
        let ticket = places.next_ticket;
        places.next_ticket += 1;
        let turn = Arc::new(Notify::new());
        places.queue.push_back((ticket, Arc::clone(&turn)));
        self.waiting.fetch_add(1, Ordering::AcqRel);
        debug_assert_eq!(self.waiting.load(Ordering::Acquire), places.queue.len());
        Some(Place {
            queue: Arc::clone(self),
            ticket,
            turn,
        })
    }
}

/// One add's place in the `RoomQueue`; leaving it (drop) wakes the next.
struct Place {
    queue: Arc<RoomQueue>,
    ticket: u64,
    turn: Arc<Notify>,
}

impl Place {
    /// Resolves once every add queued before this one has left.
    async fn my_turn(&self) {
        loop {
            let first = self
                .queue
                .places
                .lock()
                .queue
                .front()
                .map(|(ticket, _)| *ticket);
            if first == Some(self.ticket) {
                return;
            }
            // A permit stored by the leaving predecessor ends this at once.
            self.turn.notified().await;
        }
    }
}

impl Drop for Place {
    fn drop(&mut self) {
        let mut places = self.queue.places.lock();
        let Some(index) = places.queue.iter().position(|(t, _)| *t == self.ticket) else {
            debug_assert!(false, "a room queue place left twice");
            return;
        };
        places.queue.remove(index);
        self.queue.waiting.fetch_sub(1, Ordering::AcqRel);
        if index == 0
            && let Some((_, next)) = places.queue.front()
        {
            next.notify_one();
        }
    }
}

/// An add's `done`, called exactly once: by the add, or with
/// TOO_MANY_REQUESTS when the admission holding it is dropped first.
struct Once<F: FnOnce(AddResult)>(Option<F>);

impl<F: FnOnce(AddResult)> Once<F> {
    fn take(&mut self) -> Option<F> {
        self.0.take()
    }
}

impl<F: FnOnce(AddResult)> Drop for Once<F> {
    fn drop(&mut self) {
        if let Some(done) = self.0.take() {
            done(Err(Status::TooManyRequests));
        }
    }
}

/// Why `Core::add_now` did not take an add: the write cache had no room.
/// The entry and `done` come back (`done` uncalled).
pub(super) struct NoRoom<F> {
    entry: Bytes,
    done: F,
}

impl super::Bookie {
    /// The one ADD: stores a packaged entry and calls `done` once it is
    /// durable, with its (ledger, entry) ids, or with why not: `BadRequest`
    /// (bad header), `Fenced` (a normal add to a fenced ledger),
    /// `TooManyRequests` (journal queue full, or write cache still full after
    /// waiting `ADD_ROOM_WAIT_MAX` for room), `NoSuchLedger` (deleted),
    /// `ReadOnly` (disk almost full, or a failed journal or storage write: see
    /// `state`).
    ///
    /// An add that finds room (and no add waiting before it) is taken on this
    /// call; the returned admission is then ready. Otherwise the add queues
    /// for room in call order and is taken when its admission is awaited: the
    /// TCP server awaits it in the connection's read loop (holding back the
    /// connection), `LocalBookies` in the request's future. `done` runs
    /// exactly once: on this call or the admission's poll for a refusal, else
    /// on the journal's force-write thread (keep it short).
    pub fn add(
        &self,
        entry: Bytes,
        mode: AddMode,
        done: impl FnOnce(AddResult) + Send + 'static,
    ) -> AddAdmission {
        let started = Instant::now();
        let core = &self.core;
        let (entry, done) = if core.room.is_empty() {
            match core.add_now(entry, mode, done, started) {
                Ok(()) => return AddAdmission::taken(),
                Err(NoRoom { entry, done }) => (entry, done),
            }
        } else {
            (entry, done)
        };
        let Some(place) = core.room.join() else {
            done(Err(Status::TooManyRequests));
            return AddAdmission::taken();
        };
        let core = Arc::clone(core);
        let mut done = Once(Some(done));
        AddAdmission {
            waiting: Some(Box::pin(async move {
                place.my_turn().await;
                let deadline = tokio::time::Instant::now() + ADD_ROOM_WAIT_MAX;
                if let Some(engine) = core.engine_now() {
                    // False on timeout or broken storage: the put decides.
                    let _ = engine
                        .storage
                        .wait_for_write_room(entry.len(), deadline)
                        .await;
                }
                tracing::debug!(
                    target: "vela::bookie::slow_add",
                    waited_us = started.elapsed().as_micros() as u64,
                    "add waited for write-cache room"
                );
                let Some(done) = done.take() else {
                    return;
                };
                if let Err(NoRoom { done, .. }) = core.add_now(entry, mode, done, started) {
                    done(Err(Status::TooManyRequests));
                }
                drop(place);
            })),
        }
    }
}

impl Core {
    /// Takes an add now: header check, mode check, and under the ledger's
    /// stripe lock the fence check, the write-cache put and the journal
    /// append. A full write cache hands the add back (`NoRoom`); every other
    /// outcome goes to `done`.
    pub(super) fn add_now<F>(
        &self,
        entry: Bytes,
        mode: AddMode,
        done: F,
        started: Instant,
    ) -> Result<(), NoRoom<F>>
    where
        F: FnOnce(AddResult) + Send + 'static,
    {
        let header = match parse_header(&entry) {
            Ok(header) => header,
            Err(error) => {
                tracing::debug!(%error, "ADD with a bad entry header");
                done(Err(Status::BadRequest));
                return Ok(());
            }
        };
        let kind = match mode {
            AddMode::Normal => WriteKind::NormalAdd,
            AddMode::Recovery => WriteKind::Maintenance,
        };
        let engine = match self.engine_for(kind) {
            Ok(engine) => engine,
            Err(status) => {
                done(Err(status));
                return Ok(());
            }
        };
        let (ledger_id, entry_id) = (header.ledger_id, header.entry_id);
        /// How the add went under the stripe lock.
        enum Taken<F, J> {
            Yes,
            Refused(F, Status),
            JournalRefused(AppendRefused<J>),
        }
        let taken = {
            let locking = Instant::now();
            let mut stripe = self.stripe(ledger_id);
            let stripe_wait = locking.elapsed();
            // A normal add to a fenced ledger is refused (a recovery add is
            // taken), checked under the put's own lock.
            let refuse_fenced = mode == AddMode::Normal;
            match engine.storage.put_entry_unless_fenced(
                ledger_id,
                entry_id,
                entry.clone(),
                refuse_fenced,
            ) {
                Err(StorageError::WriteCacheFull { .. }) => {
                    return Err(NoRoom { entry, done });
                }
                Err(error) => Taken::Refused(done, self.storage_status(&engine, &error)),
                Ok(Put::Fenced) => Taken::Refused(done, Status::Fenced),
                Ok(Put::Stored) => {
                    stripe.note_lac(ledger_id, header.last_add_confirmed);
                    let record = JournalRecord::Entry {
                        ledger_id,
                        entry_id,
                        payload: entry,
                    };
                    let add_latency = Arc::clone(&self.add_latency);
                    // One clock read: the put's end is the append call's start.
                    let stored_at = Instant::now();
                    let stored = stored_at.saturating_duration_since(started);
                    let durable = move |result: Result<(), Status>| {
                        if result.is_ok() {
                            let total = started.elapsed();
                            add_latency.record(total);
                            if total >= SLOW_ADD {
                                tracing::debug!(
                                    target: "vela::bookie::slow_add",
                                    total_us = total.as_micros() as u64,
                                    stored_us = stored.as_micros() as u64,
                                    stripe_wait_us = stripe_wait.as_micros() as u64,
                                    ledger_id,
                                    entry_id,
                                    "slow bookie add"
                                );
                            }
                        }
                        done(result.map(|()| (ledger_id, entry_id)));
                    };
                    let appended = self.append(&engine, record, durable);
                    let append_time = stored_at.elapsed();
                    if append_time >= SLOW_ADD / 10 {
                        tracing::debug!(
                            target: "vela::bookie::slow_add",
                            append_us = append_time.as_micros() as u64,
                            ledger_id,
                            entry_id,
                            "slow journal append call"
                        );
                    }
                    match appended {
                        Ok(()) => Taken::Yes,
                        Err(refused) => Taken::JournalRefused(refused),
                    }
                }
            }
        };
        // Refusals are answered after the stripe lock is released: `done` may
        // be anything, even a call back into this bookie.
        match taken {
            Taken::Yes => {}
            Taken::Refused(done, status) => done(Err(status)),
            Taken::JournalRefused(refused) => (refused.done)(Err(refused.error)),
        }
        Ok(())
    }
}
