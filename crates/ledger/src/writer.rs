//! The writer of one open ledger.
//!
//! Owns: entry ids, packaging (with the LAC piggybacked), striped parallel sends
//! to each entry's write set, ordered completion, the LAC, ensemble changes and
//! the close. One task (the writer task) owns all of this state; `LedgerWriter`
//! only queues commands to it. The task runs only while there is work: with
//! no add pending, nothing in flight and no command for
//! `IDLE_BEFORE_PARKING`, its state parks in a `vela_mailbox::Parking` (no
//! task for an idle open ledger), and the next command starts a run (queued
//! first, then woken: the hand-off rule of `Parking`; the run looks for a
//! queued command under the slot's lock before it parks).
//!
//! Guarantees: ids are sequential in `submit` order; an add completes `Ok` only
//! when Qa distinct bookies of its write set (as recorded in the metadata) acked
//! it and every earlier add completed `Ok`; the LAC only moves forward; a pending
//! add ends with a typed error, never silently; after a `Fenced` answer nothing
//! more is acknowledged.
//! Never: sends entry N+1 only after N completes (adds are pipelined), holds more
//! than `pending_adds_max` adds or `pending_bytes_max` payload bytes (`submit`
//! waits), or changes the metadata of a ledger that is not OPEN.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};

use bytes::Bytes;
use futures::StreamExt;
use futures::stream::FuturesUnordered;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, oneshot};
use vela_mailbox::Parking;

use crate::client_core::{ClientCore, PENDING_BYTES_MAX};
use crate::entry::{ENTRY_PAYLOAD_BYTES_MAX, package};
use crate::error::LedgerError;
use crate::metadata::{ENSEMBLES_MAX, LedgerMetadata, LedgerState};
use crate::placement;
use crate::store::{self, CasError};
use crate::transport::{AddMode, BookieError};
use crate::types::{BookieId, EntryId, LedgerId, Quorum, entry_after};

// A pending add's acks are a bitmask of ensemble indices.
const _: () = assert!(crate::types::ENSEMBLE_SIZE_MAX <= u64::BITS as usize);

/// CAS attempts for one ensemble change or close before giving up
/// (`MetadataContention`). Only the writer changes an OPEN ledger, so a conflict
/// means a recoverer or an unknown-outcome write; a few re-reads settle it.
const METADATA_CAS_ATTEMPTS_MAX: u32 = 16;

/// Ensemble changes in a row without the LAC moving before the writer fails
/// (`TooManyEnsembleChanges`). Each change replaced a bookie that failed; this
/// many failures without one acknowledged add means the cluster cannot hold
/// the ledger now, and a new ledger (after recovery) is the better move. With
/// the backoff below, about 30 s of trying.
const ENSEMBLE_CHANGES_WITHOUT_PROGRESS_MAX: u32 = 32;

/// Pause before the second change in a row without progress; doubles each time
/// up to `ENSEMBLE_CHANGE_BACKOFF_MAX`. Keeps a writer whose replacements keep
/// failing from hammering the metadata store.
const ENSEMBLE_CHANGE_BACKOFF_MIN: std::time::Duration = std::time::Duration::from_millis(10);
const ENSEMBLE_CHANGE_BACKOFF_MAX: std::time::Duration = std::time::Duration::from_secs(1);

/// How long a bookie that failed an add is avoided as a replacement (while
/// other bookies are available): long enough to skip a crashed bookie until its
/// registration expires (metadata sessions time out in ~30 s).
const BOOKIE_QUARANTINE: std::time::Duration = std::time::Duration::from_secs(30);

/// Pause before asking an overloaded bookie (TOO_MANY_REQUESTS) again; grows
/// with the add's age up to the max, so a bookie that stays full is asked
/// about 20 times a second until the add timeout makes it a failure.
const OVERLOAD_RETRY_DELAY_MIN: std::time::Duration = std::time::Duration::from_millis(1);
const OVERLOAD_RETRY_DELAY_MAX: std::time::Duration = std::time::Duration::from_millis(50);

/// How long the writer task waits with nothing pending before it parks. A
/// busy ledger keeps its task between adds that come closer than this.
const IDLE_BEFORE_PARKING: std::time::Duration = std::time::Duration::from_secs(1);

/// Published by the writer task for `LedgerWriter::last_add_confirmed`.
const LAC_NONE: u64 = u64::MAX;

/// Called once with an add's outcome, on the writer task, in entry order.
pub type AddCallback = Box<dyn FnOnce(Result<EntryId, LedgerError>) + Send>;

/// Where an add's outcome goes: the `PendingAdd` of `submit`, or the callback
/// of `submit_reserved` (one hop less on the write path).
enum AddReply {
    Channel(oneshot::Sender<Result<EntryId, LedgerError>>),
    Callback(AddCallback),
}

impl AddReply {
    fn send(self, result: Result<EntryId, LedgerError>) {
        match self {
            AddReply::Channel(sender) => {
                let _ = sender.send(result);
            }
            AddReply::Callback(callback) => callback(result),
        }
    }
}

/// The writer's budget for one add (a slot of `pending_adds_max` and the
/// payload's bytes of `pending_bytes_max`), taken by `reserve`/`try_reserve`
/// and spent by `submit_reserved`. Dropping it gives the budget back.
#[derive(Debug)]
pub struct AddPermit {
    permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    payload_bytes: usize,
}

impl AddPermit {
    /// Payload bytes of the add this budget was taken for.
    pub fn payload_bytes(&self) -> usize {
        self.payload_bytes
    }
}

enum Command {
    Add {
        payload: Bytes,
        reply: AddReply,
        permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
        submitted_at: tokio::time::Instant,
    },
    Close {
        reply: oneshot::Sender<Result<LedgerMetadata, LedgerError>>,
    },
}

/// The writer of an open ledger. Dropping it without `close` abandons the
/// ledger (as a crash would): pending adds end with `WriterGone`, and a later
/// `open_with_recovery` decides where the ledger ends.
#[derive(Debug)]
pub struct LedgerWriter {
    ledger_id: LedgerId,
    quorum: Quorum,
    /// A mailbox (~150 bytes idle; a tokio channel's padded state and first
    /// block of 32 slots were ~800 per open ledger, idle or not), of boxed
    /// commands (256 bytes each; the queue moves pointers).
    commands: vela_mailbox::Sender<Box<Command>>,
    count_budget: Arc<Semaphore>,
    bytes_budget: Arc<Semaphore>,
    lac: Arc<AtomicU64>,
    /// The writer task's state between runs (`run`).
    task: Arc<Parking<Parked>>,
}

impl std::fmt::Debug for Command {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Command::Add { payload, .. } => write!(f, "Add({} bytes)", payload.len()),
            Command::Close { .. } => f.write_str("Close"),
        }
    }
}

/// An add that was queued; resolves to its entry id once acknowledged.
#[derive(Debug)]
pub struct PendingAdd {
    ledger_id: LedgerId,
    reply: oneshot::Receiver<Result<EntryId, LedgerError>>,
}

impl Future for PendingAdd {
    type Output = Result<EntryId, LedgerError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let ledger_id = self.ledger_id;
        Pin::new(&mut self.reply)
            .poll(cx)
            .map(|r| r.unwrap_or(Err(LedgerError::WriterGone(ledger_id))))
    }
}

impl LedgerWriter {
    pub(crate) fn start(
        core: Arc<ClientCore>,
        ledger_id: LedgerId,
        versioned: store::Versioned,
    ) -> LedgerWriter {
        let metadata = versioned.metadata;
        assert_eq!(metadata.state, LedgerState::Open);
        assert!(metadata.last_entry.is_none());
        let quorum = metadata.quorum;
        let pending_adds_max = core.config.pending_adds_max.max(1);
        let pending_bytes_max = core
            .config
            .pending_bytes_max
            .clamp(ENTRY_PAYLOAD_BYTES_MAX, PENDING_BYTES_MAX);
        let (commands, receiver) = vela_mailbox::mailbox(pending_adds_max + 1);
        let lac = Arc::new(AtomicU64::new(LAC_NONE));
        // A fresh ledger starts empty; a writer is only ever given a new ledger.
        let ensemble = metadata.last_ensemble().1.to_vec();
        let task_state = WriterTask {
            core,
            ledger_id,
            quorum,
            version: versioned.version,
            ensemble,
            next_entry: EntryId(0),
            lac: None,
            length_bytes: 0,
            pending: VecDeque::new(),
            inflight: None,
            failed_indices: BTreeSet::new(),
            broken: None,
            changes_without_progress: 0,
            quarantine: BTreeMap::new(),
            published_lac: lac.clone(),
        };
        // Parked until the first command.
        let task = Parking::new(Parked {
            writer: task_state,
            commands: receiver,
        });
        LedgerWriter {
            ledger_id,
            quorum,
            commands,
            count_budget: Arc::new(Semaphore::new(pending_adds_max)),
            bytes_budget: Arc::new(Semaphore::new(pending_bytes_max)),
            lac,
            task,
        }
    }

    /// The ledger written.
    pub fn ledger_id(&self) -> LedgerId {
        self.ledger_id
    }

    /// E, Qw, Qa of the ledger.
    pub fn quorum(&self) -> Quorum {
        self.quorum
    }

    /// The last entry acknowledged (all entries up to it are acknowledged).
    pub fn last_add_confirmed(&self) -> Option<EntryId> {
        match self.lac.load(Ordering::Acquire) {
            LAC_NONE => None,
            lac => Some(EntryId(lac)),
        }
    }

    /// Queues an add: waits while the writer is at its pending bound, then
    /// returns the handle that resolves once the entry is acknowledged. Entry ids
    /// follow the order in which `submit` calls return.
    pub async fn submit(&self, payload: Bytes) -> Result<PendingAdd, LedgerError> {
        let permit = self.reserve(payload.len()).await?;
        let (reply, receiver) = oneshot::channel();
        self.queue_add(permit, payload, AddReply::Channel(reply))?;
        Ok(PendingAdd {
            ledger_id: self.ledger_id,
            reply: receiver,
        })
    }

    /// Takes the budget for an add of `payload_bytes`, waiting while the writer
    /// is at its pending bound.
    pub async fn reserve(&self, payload_bytes: usize) -> Result<AddPermit, LedgerError> {
        self.check_payload(payload_bytes)?;
        let gone = |_| LedgerError::WriterGone(self.ledger_id);
        let count = self
            .count_budget
            .clone()
            .acquire_owned()
            .await
            .map_err(gone)?;
        // Fits u32: checked against ENTRY_PAYLOAD_BYTES_MAX above.
        let bytes = self
            .bytes_budget
            .clone()
            .acquire_many_owned(payload_bytes as u32)
            .await
            .map_err(gone)?;
        Ok(AddPermit {
            permits: (count, bytes),
            payload_bytes,
        })
    }

    /// Takes the budget for an add of `payload_bytes` if the writer is below
    /// its pending bound now; `Ok(None)` when it is at the bound.
    pub fn try_reserve(&self, payload_bytes: usize) -> Result<Option<AddPermit>, LedgerError> {
        use tokio::sync::TryAcquireError;
        self.check_payload(payload_bytes)?;
        let gone = LedgerError::WriterGone(self.ledger_id);
        let count = match self.count_budget.clone().try_acquire_owned() {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits) => return Ok(None),
            Err(TryAcquireError::Closed) => return Err(gone),
        };
        // Fits u32: checked against ENTRY_PAYLOAD_BYTES_MAX above.
        let bytes = match self
            .bytes_budget
            .clone()
            .try_acquire_many_owned(payload_bytes as u32)
        {
            Ok(permit) => permit,
            Err(TryAcquireError::NoPermits) => return Ok(None),
            Err(TryAcquireError::Closed) => return Err(gone),
        };
        Ok(Some(AddPermit {
            permits: (count, bytes),
            payload_bytes,
        }))
    }

    /// Queues an add with a budget taken before; never waits. `done` is called
    /// exactly once: on the writer task in entry order once the add is
    /// acknowledged or failed, or at once if the writer is gone. Entry ids follow
    /// the order of `submit_reserved` (and `submit`) calls.
    pub fn submit_reserved(&self, permit: AddPermit, payload: Bytes, done: AddCallback) {
        assert_eq!(
            permit.payload_bytes,
            payload.len(),
            "an add permit is spent on the payload it was reserved for"
        );
        if let Err(error) = self.queue_add(permit, payload, AddReply::Callback(done)) {
            debug_assert!(matches!(error, LedgerError::WriterGone(_)));
        }
    }

    fn check_payload(&self, payload_bytes: usize) -> Result<(), LedgerError> {
        if payload_bytes > ENTRY_PAYLOAD_BYTES_MAX {
            return Err(LedgerError::PayloadTooLarge {
                len_bytes: payload_bytes,
                max_bytes: ENTRY_PAYLOAD_BYTES_MAX,
            });
        }
        Ok(())
    }

    /// Hands an add to the writer task. On failure the reply has been told.
    fn queue_add(
        &self,
        permit: AddPermit,
        payload: Bytes,
        reply: AddReply,
    ) -> Result<(), LedgerError> {
        let command = Box::new(Command::Add {
            payload,
            reply,
            permits: permit.permits,
            submitted_at: tokio::time::Instant::now(),
        });
        // The channel holds more commands than the count budget has permits (plus
        // the one close), and every queued add holds a permit: it is never full.
        match self.commands.try_send(command) {
            Ok(()) => {
                self.task.wake(run);
                Ok(())
            }
            Err(vela_mailbox::TrySendError::Full(command))
            | Err(vela_mailbox::TrySendError::Closed(command)) => {
                debug_assert!(self.commands.is_closed(), "writer command queue full");
                let gone = LedgerError::WriterGone(self.ledger_id);
                if let Command::Add { reply, .. } = *command {
                    reply.send(Err(gone.clone()));
                }
                Err(gone)
            }
        }
    }

    /// Adds one entry and waits until it is acknowledged.
    pub async fn add(&self, payload: Bytes) -> Result<EntryId, LedgerError> {
        self.submit(payload).await?.await
    }

    /// Waits for every pending add, then closes the ledger (CAS to CLOSED with the
    /// last entry and length). Returns the closed metadata. Adds after it fail.
    pub async fn close(&self) -> Result<LedgerMetadata, LedgerError> {
        let (reply, receiver) = oneshot::channel();
        self.commands
            .send(Box::new(Command::Close { reply }))
            .await
            .map_err(|_| LedgerError::WriterGone(self.ledger_id))?;
        self.task.wake(run);
        receiver
            .await
            .unwrap_or(Err(LedgerError::WriterGone(self.ledger_id)))
    }
}

impl Drop for LedgerWriter {
    fn drop(&mut self) {
        // Abandon: the writer task stops at once, as if the process had
        // crashed (a parked state is dropped: nothing was pending).
        drop(self.task.stop());
    }
}

/// One add not yet acknowledged.
struct PendingEntry {
    entry_id: EntryId,
    packaged: Bytes,
    /// Ensemble indices (bit i = index i) that acked.
    acked: u64,
    reply: AddReply,
    submitted_at: tokio::time::Instant,
    _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
}

/// One add request to one bookie, answered with its `Response`.
type RequestFuture = Pin<Box<dyn Future<Output = Response> + Send>>;

/// A bookie's answer to one add.
struct Response {
    entry_id: EntryId,
    index: usize,
    bookie: BookieId,
    result: Result<(), BookieError>,
}

struct WriterTask {
    core: Arc<ClientCore>,
    ledger_id: LedgerId,
    quorum: Quorum,
    /// The version of the ledger's metadata as this writer last stored or
    /// read it. The metadata itself is read back from the store for an
    /// ensemble change or the close (`store::read`), the only times it
    /// is needed: kept here it was ~230 bytes encoded per open ledger
    /// (issue 19's idle topic), for a read at each rollover.
    version: vela_meta::Version,
    /// The last segment's bookies (what new and resent adds go to).
    ensemble: Vec<BookieId>,
    next_entry: EntryId,
    lac: Option<EntryId>,
    /// Ledger length including the last submitted entry.
    length_bytes: u64,
    /// Adds after the LAC, in entry order.
    pending: VecDeque<PendingEntry>,
    /// Requests in flight, polled by the writer task itself (a bookie's
    /// answer wakes the writer, with no task of its own per request);
    /// bounded by pending adds x Qw, plus stale requests to replaced
    /// bookies, each ended by the add timeout. `None` while none was sent
    /// since the writer last parked (an idle writer keeps no set).
    inflight: Option<FuturesUnordered<RequestFuture>>,
    /// Ensemble indices that failed and await replacement.
    failed_indices: BTreeSet<usize>,
    /// The first fatal failure; once set no add is sent or acknowledged.
    broken: Option<LedgerError>,
    /// Ensemble changes since the LAC last moved.
    changes_without_progress: u32,
    /// Bookies that failed lately, with when; not picked as replacements while
    /// others are available. At most one key per registered bookie; expired
    /// keys are dropped on each ensemble change.
    quarantine: BTreeMap<BookieId, tokio::time::Instant>,
    published_lac: Arc<AtomicU64>,
}

/// The writer task's state: parked between runs, moved into a run while
/// there is work.
struct Parked {
    writer: WriterTask,
    commands: vela_mailbox::Receiver<Box<Command>>,
}

/// What a run waited for.
enum Event {
    Response(Response),
    Command(Option<Command>),
    /// `IDLE_BEFORE_PARKING` without anything pending.
    Idle,
    /// Closing with adds pending and nothing in flight.
    Stalled,
}

/// One run of the writer task: until it has been idle (nothing pending, in
/// flight or being replaced, no close asked) for `IDLE_BEFORE_PARKING`,
/// then it parks unless a command was queued meanwhile (looked for under
/// the parking slot's lock: a command queued before that is seen here, one
/// queued after it starts a new run).
async fn run(parking: Arc<Parking<Parked>>, mut task: Parked) {
    let mut close: Option<oneshot::Sender<Result<LedgerMetadata, LedgerError>>> = None;
    // One idle timer for the whole run, pushed later each time the loop
    // finds the writer idle (tokio keeps a timer whose deadline moves later
    // in its wheel: one atomic store), not a timer registered and cancelled
    // per add.
    let idle_timer = tokio::time::sleep(IDLE_BEFORE_PARKING);
    tokio::pin!(idle_timer);
    loop {
        let this = &mut task.writer;
        let commands = &mut task.commands;
        if close.is_some() && this.pending.is_empty() {
            // Boxed (here and for ensemble changes): a run's future then
            // holds only the loop's own state, not the largest of these
            // rare futures.
            let result = Box::pin(this.close()).await;
            if let Some(reply) = close.take() {
                let _ = reply.send(result);
            }
            // Adds queued behind the close (a caller that raced it) are
            // answered, never dropped.
            commands.close();
            while let Ok(command) = commands.try_recv() {
                if let Command::Add { reply, .. } = *command {
                    reply.send(Err(LedgerError::LedgerClosed(this.ledger_id)));
                }
            }
            parking.finished();
            return;
        }
        let in_flight = this.inflight.as_ref().is_some_and(|set| !set.is_empty());
        let idle = close.is_none()
            && this.pending.is_empty()
            && !in_flight
            && this.failed_indices.is_empty();
        if idle {
            idle_timer
                .as_mut()
                .reset(tokio::time::Instant::now() + IDLE_BEFORE_PARKING);
        }
        let event = tokio::select! {
            biased;
            Some(response) = next_response(&mut this.inflight), if in_flight => {
                Event::Response(response)
            }
            command = commands.recv(), if close.is_none() => Event::Command(command.map(|c| *c)),
            _ = &mut idle_timer, if idle => Event::Idle,
            else => Event::Stalled,
        };
        match event {
            Event::Response(response) => this.on_response(response),
            // The writer was dropped: abandon.
            Event::Command(None) => {
                parking.finished();
                return;
            }
            Event::Command(Some(Command::Add {
                payload,
                reply,
                permits,
                submitted_at,
            })) => this.on_add(payload, reply, permits, submitted_at),
            Event::Command(Some(Command::Close { reply })) => close = Some(reply),
            Event::Idle => {
                debug_assert!(this.pending.is_empty() && !in_flight);
                // Empty: a parked writer keeps no request set, and no
                // slots for pending adds (four, ~0.4 KiB, after its first).
                this.inflight = None;
                this.pending = VecDeque::new();
                match parking.park(task, |task| task.commands.is_ready()) {
                    Ok(()) => return,
                    Err(back) => task = back,
                }
                continue;
            }
            Event::Stalled => {
                // Closing with adds pending and nothing in flight: every
                // pending add has a request in flight or a failed index, so
                // this is a bug; fail rather than hang.
                debug_assert!(
                    false,
                    "writer stalled with {} pending adds",
                    this.pending.len()
                );
                this.fail(LedgerError::Internal("writer stalled while closing".into()));
            }
        }
        if this.broken.is_none()
            && !this.failed_indices.is_empty()
            && let Err(e) = Box::pin(this.change_ensemble()).await
        {
            this.fail(e);
        }
        this.deliver();
    }
}

/// The next answer of the requests in flight (`None` when there are none).
async fn next_response(inflight: &mut Option<FuturesUnordered<RequestFuture>>) -> Option<Response> {
    match inflight {
        Some(set) => set.next().await,
        None => None,
    }
}

impl WriterTask {
    /// Puts a request among those in flight, polled by this task.
    fn request(&mut self, request: impl Future<Output = Response> + Send + 'static) {
        self.inflight
            .get_or_insert_with(FuturesUnordered::new)
            .push(Box::pin(request));
    }

    fn on_add(
        &mut self,
        payload: Bytes,
        reply: AddReply,
        permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
        submitted_at: tokio::time::Instant,
    ) {
        if let Some(reason) = &self.broken {
            reply.send(Err(LedgerError::WriterFailed {
                ledger_id: self.ledger_id,
                reason: Arc::new(reason.clone()),
            }));
            return;
        }
        self.core.stats.record_add_wait(submitted_at.elapsed());
        let entry_id = self.next_entry;
        // Pending adds are consecutive entries right after the LAC.
        debug_assert_eq!(
            entry_id,
            self.pending
                .back()
                .map_or(entry_after(self.lac), |last| last.entry_id.next()),
            "pending adds are consecutive after the LAC"
        );
        self.next_entry = entry_id.next();
        self.length_bytes += payload.len() as u64;
        let packaged = package(
            self.ledger_id,
            entry_id,
            self.lac,
            self.length_bytes,
            &payload,
        );
        for index in self.quorum.write_set(entry_id) {
            self.send(entry_id, index, packaged.clone());
        }
        self.pending.push_back(PendingEntry {
            entry_id,
            packaged,
            acked: 0,
            reply,
            submitted_at,
            _permits: permits,
        });
    }

    fn send(&mut self, entry_id: EntryId, index: usize, packaged: Bytes) {
        let bookie = self.ensemble[index].clone();
        let request =
            self.core
                .transport
                .add(&bookie, self.ledger_id, entry_id, packaged, AddMode::Normal);
        let timeout = self.core.config.add_timeout;
        self.request(async move {
            let result = match tokio::time::timeout(timeout, request).await {
                Ok(result) => result,
                Err(_) => Err(BookieError::Timeout),
            };
            Response {
                entry_id,
                index,
                bookie,
                result,
            }
        });
    }

    fn on_response(&mut self, response: Response) {
        if self.broken.is_some() {
            return;
        }
        if self.ensemble[response.index] != response.bookie {
            // Answer from a bookie replaced since: the metadata no longer lists
            // it for this entry, so its ack cannot count.
            return;
        }
        match response.result {
            Ok(()) => {
                let Some(front) = self.pending.front() else {
                    return;
                };
                let Some(offset) = response.entry_id.0.checked_sub(front.entry_id.0) else {
                    // Already acknowledged.
                    return;
                };
                if let Some(pending) = self.pending.get_mut(offset as usize) {
                    // An ack counted for another entry would complete that
                    // entry without its quorum.
                    assert_eq!(pending.entry_id, response.entry_id);
                    debug_assert!(self.quorum.stores(response.entry_id, response.index));
                    pending.acked |= 1 << response.index;
                }
            }
            Err(BookieError::Fenced) => self.fail(LedgerError::Fenced(self.ledger_id)),
            Err(BookieError::TooManyRequests) if self.retry_when_overloaded(&response) => {}
            Err(error) => {
                tracing::warn!(
                    ledger = %self.ledger_id, entry = %response.entry_id, bookie = %response.bookie,
                    %error, "add failed; replacing bookie"
                );
                self.failed_indices.insert(response.index);
            }
        }
    }

    /// A bookie refused an add for lack of room (journal queue or write cache
    /// full): back-pressure, not a failure. Asks the same bookie again after a
    /// pause that grows with the add's age, until the add timeout; then (or if
    /// the add is settled already) returns `false` to treat it as a failure.
    fn retry_when_overloaded(&mut self, response: &Response) -> bool {
        self.core
            .stats
            .adds_overloaded
            .fetch_add(1, Ordering::Relaxed);
        let timeout = self.core.config.add_timeout;
        let Some(pending) = self.pending_entry(response.entry_id) else {
            // Acknowledged already (by others of its write set): nothing to do.
            return true;
        };
        let waited = pending.submitted_at.elapsed();
        if waited >= timeout {
            return false;
        }
        let packaged = pending.packaged.clone();
        let delay = (waited / 8).clamp(OVERLOAD_RETRY_DELAY_MIN, OVERLOAD_RETRY_DELAY_MAX);
        let (core, ledger_id, entry_id, index) = (
            self.core.clone(),
            self.ledger_id,
            response.entry_id,
            response.index,
        );
        let bookie = response.bookie.clone();
        self.request(async move {
            tokio::time::sleep(delay).await;
            let request =
                core.transport
                    .add(&bookie, ledger_id, entry_id, packaged, AddMode::Normal);
            let result = match tokio::time::timeout(timeout, request).await {
                Ok(result) => result,
                Err(_) => Err(BookieError::Timeout),
            };
            Response {
                entry_id,
                index,
                bookie,
                result,
            }
        });
        true
    }

    /// The pending add of `entry_id`, if not acknowledged yet.
    fn pending_entry(&self, entry_id: EntryId) -> Option<&PendingEntry> {
        let front = self.pending.front()?;
        let offset = entry_id.0.checked_sub(front.entry_id.0)?;
        let pending = self.pending.get(usize::try_from(offset).ok()?)?;
        debug_assert_eq!(pending.entry_id, entry_id);
        Some(pending)
    }

    /// Acknowledges adds in order while the head has Qa acks.
    fn deliver(&mut self) {
        while let Some(front) = self.pending.front() {
            if (front.acked.count_ones() as usize) < self.quorum.ack_quorum() {
                break;
            }
            let Some(done) = self.pending.pop_front() else {
                break;
            };
            // Acks complete in entry order and the LAC only moves forward,
            // one entry at a time: anything else would acknowledge an entry
            // whose predecessors are not durable.
            assert_eq!(
                done.entry_id,
                entry_after(self.lac),
                "adds complete in entry order"
            );
            debug_assert!(Some(done.entry_id) > self.lac);
            self.lac = Some(done.entry_id);
            self.changes_without_progress = 0;
            self.core.stats.record_add(done.submitted_at.elapsed());
            self.published_lac.store(done.entry_id.0, Ordering::Release);
            done.reply.send(Ok(done.entry_id));
        }
    }

    /// Fails every pending add and every later one with `error`.
    fn fail(&mut self, error: LedgerError) {
        if self.broken.is_some() {
            return;
        }
        tracing::warn!(ledger = %self.ledger_id, %error, pending = self.pending.len(), "writer failed");
        if error.is_fenced() {
            self.core
                .stats
                .writers_fenced
                .fetch_add(1, Ordering::Relaxed);
        }
        for pending in self.pending.drain(..) {
            pending.reply.send(Err(error.clone()));
        }
        self.failed_indices.clear();
        // Dropped: the requests in flight are abandoned (their answers
        // could not count any more).
        self.inflight = None;
        self.broken = Some(error);
    }

    /// Replaces the failed bookies, records the new segment (CAS), and resends
    /// the pending adds they held.
    async fn change_ensemble(&mut self) -> Result<(), LedgerError> {
        // Bound the churn when replacements keep failing (e.g. a registered
        // bookie that is down): back off, then give up.
        if self.changes_without_progress >= ENSEMBLE_CHANGES_WITHOUT_PROGRESS_MAX {
            return Err(LedgerError::TooManyEnsembleChanges(self.ledger_id));
        }
        if self.changes_without_progress > 0 {
            let backoff = ENSEMBLE_CHANGE_BACKOFF_MIN
                .saturating_mul(1 << self.changes_without_progress.min(16))
                .min(ENSEMBLE_CHANGE_BACKOFF_MAX);
            tokio::time::sleep(backoff).await;
        }
        self.changes_without_progress += 1;
        let failed: Vec<usize> = std::mem::take(&mut self.failed_indices)
            .into_iter()
            .collect();
        let failed_bookies: Vec<BookieId> =
            failed.iter().map(|&i| self.ensemble[i].clone()).collect();
        let now = tokio::time::Instant::now();
        self.quarantine
            .retain(|_, failed_at| now.duration_since(*failed_at) < BOOKIE_QUARANTINE);
        for bookie in &failed_bookies {
            self.quarantine.insert(bookie.clone(), now);
        }
        let keep: Vec<BookieId> = (0..self.ensemble.len())
            .filter(|i| !failed.contains(i))
            .map(|i| self.ensemble[i].clone())
            .collect();
        let candidates = self.core.available_bookies().await?;
        let quarantined: Vec<BookieId> = self.quarantine.keys().cloned().collect();
        let picks = {
            let mut rng = self.core.rng.lock();
            // Prefer bookies that have not failed lately; fall back to any
            // bookie outside the ensemble rather than fail the writer.
            placement::choose(&candidates, &keep, &quarantined, failed.len(), &mut *rng).or_else(
                |_| placement::choose(&candidates, &keep, &failed_bookies, failed.len(), &mut *rng),
            )?
        };
        let mut ensemble = self.ensemble.clone();
        for (&index, pick) in failed.iter().zip(picks) {
            ensemble[index] = pick;
        }
        let first_entry = entry_after(self.lac);
        self.record_segment(first_entry, &ensemble).await?;
        tracing::info!(
            ledger = %self.ledger_id, first_entry = %first_entry,
            replaced = ?failed_bookies, ensemble = ?ensemble, "ensemble changed"
        );
        self.ensemble = ensemble;
        self.core
            .stats
            .ensemble_changes
            .fetch_add(1, Ordering::Relaxed);
        let mut resend = Vec::new();
        for pending in &mut self.pending {
            for &index in &failed {
                if self.quorum.stores(pending.entry_id, index) {
                    pending.acked &= !(1u64 << index);
                    resend.push((pending.entry_id, index, pending.packaged.clone()));
                }
            }
        }
        for (entry_id, index, packaged) in resend {
            self.send(entry_id, index, packaged);
        }
        Ok(())
    }

    async fn record_segment(
        &mut self,
        first_entry: EntryId,
        ensemble: &[BookieId],
    ) -> Result<(), LedgerError> {
        for _ in 0..METADATA_CAS_ATTEMPTS_MAX {
            let fresh = store::read(&self.core.store, self.ledger_id).await?;
            if fresh.version != self.version {
                // Changed by someone else since this writer's last write
                // (a CAS against `self.version` would fail): go on from it
                // while it is still OPEN.
                match fresh.metadata.state {
                    LedgerState::Open => self.version = fresh.version,
                    LedgerState::InRecovery => return Err(LedgerError::Fenced(self.ledger_id)),
                    LedgerState::Closed => {
                        return Err(LedgerError::LedgerClosed(self.ledger_id));
                    }
                }
            }
            let mut metadata = fresh.metadata;
            let (last_first, _) = metadata.last_ensemble();
            if last_first != first_entry && metadata.ensembles.len() >= ENSEMBLES_MAX {
                return Err(LedgerError::TooManyEnsembleChanges(self.ledger_id));
            }
            metadata.set_last_ensemble(first_entry, ensemble.to_vec());
            match store::cas(&self.core.store, self.ledger_id, &metadata, self.version).await {
                Ok(version) => {
                    self.version = version;
                    return Ok(());
                }
                Err(CasError::Failed(e)) => return Err(e),
                // Read again at the loop's top.
                Err(CasError::BadVersion) => {}
            }
        }
        Err(LedgerError::MetadataContention(self.ledger_id))
    }

    async fn close(&mut self) -> Result<LedgerMetadata, LedgerError> {
        if let Some(reason) = &self.broken {
            return Err(LedgerError::WriterFailed {
                ledger_id: self.ledger_id,
                reason: Arc::new(reason.clone()),
            });
        }
        debug_assert!(self.pending.is_empty());
        for _ in 0..METADATA_CAS_ATTEMPTS_MAX {
            let fresh = store::read(&self.core.store, self.ledger_id).await?;
            if fresh.version != self.version {
                // Changed by someone else since this writer's last write.
                match fresh.metadata.state {
                    LedgerState::Open => self.version = fresh.version,
                    // Closed by a recoverer exactly where we stand (or by an
                    // earlier attempt of ours whose answer was lost): done.
                    LedgerState::Closed
                        if fresh.metadata.last_entry == self.lac
                            && fresh.metadata.length_bytes == self.length_bytes =>
                    {
                        return Ok(fresh.metadata);
                    }
                    _ => return Err(LedgerError::Fenced(self.ledger_id)),
                }
            }
            let mut metadata = fresh.metadata;
            metadata.state = LedgerState::Closed;
            metadata.last_entry = self.lac;
            metadata.length_bytes = self.length_bytes;
            match store::cas(&self.core.store, self.ledger_id, &metadata, self.version).await {
                Ok(_) => return Ok(metadata),
                Err(CasError::Failed(e)) => return Err(e),
                // Read again at the loop's top.
                Err(CasError::BadVersion) => {}
            }
        }
        Err(LedgerError::MetadataContention(self.ledger_id))
    }
}
