//! The subscription task: one per subscription with consumers (or reader),
//! handling its commands in order and sending entries while consumers have
//! permits. It runs only while there is work: after `IDLE_BEFORE_PARKING`
//! with nothing to do but wait for a command or the next entry, its state
//! parks in a `vela_mailbox::Parking` (no task, no timers, no wakers; the
//! log's wake-on-append hook and the command sender start the next run;
//! `run` states the hand-off rule).
//!
//! Owns: [`Dispatcher`], whose state is grouped by job: `acks` (what is
//! acknowledged), `consumers` (who may take what), `outstanding` (what is
//! out or to be sent again), `delayed` (what waits for its time), `reader`
//! (where new entries come from), `ahead` (entries read ahead and the log
//! read in flight: new entries are taken from it, and it is topped up
//! whenever it has room, so a read runs while entries go out) and the
//! counters behind the stats.
//! Guarantees: per consumer, entries go out in log order except
//! redeliveries, which go first; on Key_Shared, entries of one hash slot go
//! out in log order (an entry waits in replay while an earlier one of its
//! slot waits); nothing is sent to a consumer whose permits are ≤ 0; the
//! entries held (out, to replay, delayed) stay within their bounds plus
//! one read batch (asserted in debug builds).
//! Dispatch rates (`policy::Rates`) are asked before each entry and
//! charged after it: past one, the task sends nothing until its timer.
//! Never: reads more than `READ_BATCH_ENTRIES_MAX` entries at once, has
//! more than one log read in flight or more than `READ_AHEAD_READS_MAX`
//! reads' worth read ahead, holds more than `UNACKED_ENTRIES_MAX` unacked
//! entries (dispatch pauses instead), or touches a connection other than
//! through its outbound queue.
//!
//! Jobs by module: this file the task's state and its wait loop (what wakes
//! it, the read in flight finishing); `commands` each command's handling;
//! `delivery` sending entries to consumers and topping the read-ahead up;
//! `txn` committed and aborted transactions; `stats` the statistics
//! snapshot. This file never names its children (they extend `Dispatcher`).

use std::sync::Arc;

use vela_log::{EntryWaiter, LogEntry, ManagedLog, Position};
use vela_mailbox::Parking;

use super::acks::Acks;
use super::command::{
    CommandReceiver, CommandSender, SubCommand, SubscriptionHandle, SubscriptionSpec, WakeTask,
    command_mailbox,
};
use super::consumers::Consumers;
use super::delayed::{self, DELAYED_ENTRIES_MAX, Delayed};
use super::held::HeldShare;
use super::policy::{DispatchPolicy, Rates};
use super::read_ahead::{Fetched, ReadAhead};
use super::reader::{READ_BATCH_ENTRIES_MAX, Reader};
use super::redelivery::{Outstanding, REPLAY_ENTRIES_MAX, UNACKED_ENTRIES_MAX};
use super::txn_view::{self, TxnView};

mod commands;
mod delivery;
mod stats;
mod txn;
use crate::stats::RateMeter;

/// Entries a subscription holds at most (out to consumers, to replay,
/// delayed): new entries are read only while each set is under its bound,
/// one read adds at most a batch, and entries only move between the sets
/// afterwards.
const HELD_ENTRIES_MAX: usize =
    UNACKED_ENTRIES_MAX + REPLAY_ENTRIES_MAX + DELAYED_ENTRIES_MAX + READ_BATCH_ENTRIES_MAX;

/// How long a subscription task with nothing to do waits before it parks
/// (its state stays, the task ends; a command or an entry it waits for
/// starts it again). A busy subscription keeps its task between entries
/// that come closer than this; an idle one costs no task.
const IDLE_BEFORE_PARKING: std::time::Duration = std::time::Duration::from_secs(1);

/// Starts a subscription task. `on_end` runs when it stops by itself
/// (reader without consumers, unsubscribe).
pub(crate) fn spawn(
    spec: SubscriptionSpec,
    on_end: Box<dyn FnOnce(&str) + Send>,
) -> SubscriptionHandle {
    let (tx, rx) = command_mailbox();
    let durable = spec.cursor.is_some();
    let read_position = match (&spec.cursor, spec.reader_start) {
        (Some(cursor), _) => match cursor.mark_delete_position() {
            // Compacted reads may sit in trimmed ledgers: the read finds
            // the next compacted entry.
            Some(md) if spec.compaction.is_some() => Position::new(md.ledger_id, md.entry_id + 1),
            Some(md) => spec.log.next_position(md),
            None => Position::new(0, 0),
        },
        (None, Some(start)) => start,
        (None, None) => match spec.log.last_confirmed() {
            Some(last) => spec.log.next_position(last),
            None => Position::new(0, 0),
        },
    };
    let acks = match spec.cursor {
        Some(cursor) => Acks::Durable(cursor),
        None => Acks::in_memory(spec.log.previous_position(read_position)),
    };
    let consumers_max = spec
        .consumers_max
        .min(crate::config::CONSUMERS_PER_SUBSCRIPTION_MAX);
    let dispatcher = Dispatcher {
        waiter: spec.log.entry_waiter(),
        quiet_since: tokio::time::Instant::now(),
        held: HeldShare::new(spec.held),
        held_blocked: false,
        terminated: spec.log.is_terminated(),
        txn: Some(TxnView::new(spec.txn, spec.replicated, &spec.name)),
        name: spec.name,
        topic: spec.topic,
        partition: spec.partition,
        durable,
        acks,
        consumers: Consumers::new(spec.sub_type, spec.sticky, consumers_max),
        outstanding: Outstanding::default(),
        delayed: Delayed::default(),
        policy: spec.policy,
        rates: Rates::default(),
        reader: Reader::new(Arc::clone(&spec.log), read_position, spec.compaction),
        ahead: ReadAhead::new(spec.reads),
        log: spec.log,
        counters: Counters {
            msg_out: 0,
            bytes_out: 0,
            redelivered: 0,
            expired: 0,
            rates: RateMeter::new([0; 3]),
        },
    };
    let name = dispatcher.name.clone();
    tracing::debug!(topic = %dispatcher.topic, subscription = %name, "subscription started");
    let parking = Parking::new(Task {
        dispatcher,
        rx,
        on_end,
    });
    let handle = SubscriptionHandle {
        name,
        durable,
        tx: CommandSender::new(tx, Arc::clone(&parking) as Arc<dyn WakeTask>),
    };
    // The first run: it parks once it has nothing to do.
    parking.wake(run);
    handle
}

/// A subscription task's state: parked between runs, moved into a run
/// while there is work (`vela_mailbox::Parking`).
struct Task {
    dispatcher: Dispatcher,
    rx: CommandReceiver,
    on_end: Box<dyn FnOnce(&str) + Send>,
}

impl WakeTask for Parking<Task> {
    fn wake_task(self: Arc<Self>) {
        self.wake(run);
    }

    fn parked_stats(&self) -> Option<crate::stats::SubscriptionStats> {
        self.with_parked(|task| task.dispatcher.stats())
    }
}

/// One run of a subscription task: handles commands and dispatches until
/// it has been idle `IDLE_BEFORE_PARKING`, then parks (or stops for good).
///
/// Parking (the hand-off rule of `vela_mailbox::Parking`): the entry hook
/// is registered first (when consumers wait for the next entry), then
/// `park` looks under the slot's lock for a queued command, a sender gone,
/// the entry waited for, or a closed log. A waker makes its work visible
/// before it wakes (a command is queued, the entry's position is the log's
/// last confirmed one): either the run sees it and goes on, or the wake
/// finds the state parked and starts a new run. So nothing waits behind a
/// parked state.
async fn run(parking: Arc<Parking<Task>>, mut task: Task) {
    loop {
        match task.dispatcher.step(&mut task.rx).await {
            Step::Go => {}
            Step::Stop => break,
            Step::Idle {
                waiting,
                read_position,
            } => {
                task.dispatcher.shrink_idle();
                if waiting {
                    let parked = Arc::downgrade(&parking);
                    task.dispatcher.waiter.wake_at(
                        read_position,
                        // Through `wake_task`: `run` naming itself here
                        // would make its future's type depend on itself.
                        Box::new(move || {
                            if let Some(parking) = parked.upgrade() {
                                parking.wake_task();
                            }
                        }),
                    );
                } else {
                    task.dispatcher.waiter.cancel();
                }
                let parked = parking.park(task, |task| {
                    task.rx.is_ready()
                        || task.dispatcher.log.is_closed()
                        || (waiting
                            && task
                                .dispatcher
                                .log
                                .last_confirmed()
                                .is_some_and(|last| last >= read_position))
                });
                match parked {
                    Ok(()) => return,
                    Err(back) => task = back,
                }
            }
        }
    }
    parking.finished();
    let Task {
        dispatcher,
        rx,
        on_end,
    } = task;
    tracing::debug!(topic = %dispatcher.topic, subscription = %dispatcher.name, "subscription stopped");
    // The mailbox closes first: senders see the task gone.
    drop(rx);
    on_end(&dispatcher.name);
}

/// Totals since the subscription task started.
struct Counters {
    msg_out: u64,
    bytes_out: u64,
    /// Entries sent again at a consumer's request.
    redelivered: u64,
    /// Entries acknowledged by message expiry.
    expired: u64,
    /// msg_out, bytes_out, redelivered → rates.
    rates: RateMeter<3>,
}

struct Dispatcher {
    /// The log's wake-on-append hook of this subscription (set while it is
    /// parked with consumers waiting for the next entry).
    waiter: EntryWaiter,
    /// Since when nothing but reads of its state (statistics) happened:
    /// the task parks `IDLE_BEFORE_PARKING` after it. A `/metrics` scrape
    /// asking a running subscription for its statistics does not keep it
    /// running.
    quiet_since: tokio::time::Instant,
    /// The topic's dispatch policies.
    policy: Arc<DispatchPolicy>,
    /// The dispatch rates it keeps to.
    rates: Rates,
    name: String,
    /// Full topic name (for logs).
    topic: Arc<str>,
    /// Partition index for message ids (−1 if not a partition).
    partition: i32,
    durable: bool,
    log: Arc<ManagedLog>,
    acks: Acks,
    consumers: Consumers,
    outstanding: Outstanding,
    delayed: Delayed,
    reader: Reader,
    ahead: ReadAhead,
    counters: Counters,
    /// This subscription's share of the broker-wide count of held entries.
    held: HeldShare,
    /// New entries wait: the broker-wide count is at its bound.
    held_blocked: bool,
    /// The topic was terminated (its log takes no more entries).
    terminated: bool,
    /// The topic's transaction buffer (transactions on).
    txn: Option<TxnView>,
}

/// Why the subscription task woke up.
enum Wake {
    Command(Box<SubCommand>),
    /// Every command sender is gone.
    Closed,
    /// The read retry time came.
    Retry,
    /// New entries, a delayed entry due, or room for held entries.
    Again,
    /// The read-ahead's read in flight finished.
    Read(Result<Vec<LogEntry>, String>),
    /// Nothing happened for `IDLE_BEFORE_PARKING`, with nothing to wait for
    /// but commands and new entries.
    Idle,
}

enum Flow {
    Continue,
    Stop,
}

/// What one step of a run ended with.
enum Step {
    Go,
    Stop,
    /// Idle: the run may park; `waiting`: consumers wait for the entry at
    /// `read_position` (the log's hook is to wake the task for it).
    Idle {
        waiting: bool,
        read_position: Position,
    },
}

impl Dispatcher {
    /// Gives back what its emptied collections keep (it is about to park:
    /// a parked subscription holds its state only, ~1 KiB).
    fn shrink_idle(&mut self) {
        self.outstanding.shrink_idle();
        self.acks.shrink_idle();
        self.delayed.shrink_idle();
        self.ahead.shrink_idle();
    }

    /// Waits for something to do and does it: one command, a read
    /// finished, new entries, a timer; then dispatches.
    async fn step(&mut self, rx: &mut CommandReceiver) -> Step {
        let txn_blocked = self.txn.as_ref().is_some_and(|t| t.blocked);
        self.consumers.set_unacked_max(
            self.policy
                .unacked_per_consumer_max
                .load(std::sync::atomic::Ordering::Relaxed),
        );
        let waiting = self.reader.caught_up
            && self.consumers.total_permits() > 0
            && !self.subscription_unacked_full()
            && !txn_blocked;
        let read_position = self.next_read_position();
        let log = Arc::clone(&self.log);
        let next_due = self.delayed.next_due_ms();
        let delay = next_due.map_or(std::time::Duration::ZERO, |due_ms| {
            std::time::Duration::from_millis(due_ms.saturating_sub(delayed::now_ms()))
        });
        let retry_at = self
            .reader
            .retry_at()
            .unwrap_or_else(tokio::time::Instant::now);
        let retrying = self.reader.retry_at().is_some();
        let rate_resume_at = self.rates.resume_at;
        let rates_seen = self.rates.version();
        let policy = Arc::clone(&self.policy);
        let held = Arc::clone(self.held.budget());
        let held_blocked = self.held_blocked;
        let reading = self.ahead.in_flight();
        let park_at = self.quiet_since + IDLE_BEFORE_PARKING;
        // Only commands and new entries can give work: after a quiet
        // while, the task parks (a timer, a read or a wait on the held
        // entries' room keeps it running).
        let may_park = !reading
            && next_due.is_none()
            && !retrying
            && rate_resume_at.is_none()
            && !held_blocked
            && !txn_blocked;
        let ahead = &mut self.ahead;
        let txn = self.txn.as_mut();
        // Boxed: the futures of this wait (timers, the log's watch, the
        // channel) live only while it waits.
        let wake = Box::pin(async {
            // Room in the broker-wide count of held entries: enabled
            // before the check, so a release between the two still
            // wakes us.
            let freed = held.freed();
            tokio::pin!(freed);
            freed.as_mut().enable();
            let held_waiting = held_blocked && held.is_full();
            let held_ready = held_blocked && !held_waiting;
            // New dispatch rates: the same, for a replacement.
            let rates_changed = policy.rates_changed();
            tokio::pin!(rates_changed);
            rates_changed.as_mut().enable();
            let rates_stale = policy.rates_version() != rates_seen;
            tokio::select! {
                command = rx.recv() => match command {
                    Some(command) => Wake::Command(command),
                    None => Wake::Closed,
                },
                result = ahead.finished(), if reading => Wake::Read(result),
                _ = log.wait_for_entry_at(read_position), if waiting => Wake::Again,
                _ = txn_view::limit_moved(txn), if txn_blocked => Wake::Again,
                _ = tokio::time::sleep(delay), if next_due.is_some() => Wake::Again,
                _ = tokio::time::sleep_until(retry_at), if retrying => Wake::Retry,
                _ = tokio::time::sleep_until(rate_resume_at.unwrap_or(retry_at)),
                    if rate_resume_at.is_some() => Wake::Again,
                _ = &mut freed, if held_waiting => Wake::Again,
                _ = std::future::ready(()), if held_ready => Wake::Again,
                _ = &mut rates_changed => Wake::Again,
                _ = std::future::ready(()), if rates_stale => Wake::Again,
                _ = tokio::time::sleep_until(park_at), if may_park => Wake::Idle,
            }
        })
        .await;
        let reads_only = matches!(
            &wake,
            Wake::Command(c) if matches!(
                **c,
                SubCommand::SubStats { .. } | SubCommand::Stats { .. } | SubCommand::MarkDelete { .. }
            )
        );
        if !reads_only && !matches!(wake, Wake::Idle) {
            self.quiet_since = tokio::time::Instant::now();
        }
        let mut command = None;
        match wake {
            Wake::Command(received) => command = Some(*received),
            Wake::Closed => return Step::Stop,
            Wake::Retry => {
                self.reader.clear_retry();
                self.reader.caught_up = false;
            }
            Wake::Again => self.reader.caught_up = false,
            Wake::Read(result) => self.read_finished(result),
            Wake::Idle => {
                return Step::Idle {
                    waiting,
                    read_position,
                };
            }
        }
        if self.log.is_closed() {
            // The topic's log closed or failed: consumers reconnect (to a
            // reopened topic) after CLOSE_CONSUMER.
            tracing::info!(topic = %self.topic, subscription = %self.name, "log closed: closing consumers");
            if let Some(SubCommand::Shutdown { reply }) = command {
                let _ = reply.send(());
            }
            Box::pin(self.close_all_consumers(None)).await;
            return Step::Stop;
        }
        // Handling and dispatching are boxed: a run's future then holds
        // only this step's state, at one allocation per wake-up.
        if let Some(command) = command
            && let Flow::Stop = Box::pin(self.handle(command)).await
        {
            return Step::Stop;
        }
        self.reader.set_active(!self.consumers.is_empty());
        self.held_blocked = false;
        Box::pin(self.dispatch()).await;
        self.report_held();
        if self.terminated {
            // Boxed (a terminated topic only): its send would otherwise
            // sit in every run's future.
            Box::pin(self.tell_end_of_topic()).await;
        }
        Step::Go
    }

    /// Where the next log read starts: after the entries read ahead, or at
    /// the read position.
    fn next_read_position(&self) -> Position {
        match self.ahead.next_read_after() {
            Some(last) => self.reader.next_after(last),
            None => self.reader.position(),
        }
    }

    /// The read in flight finished: its entries join the read-ahead.
    fn read_finished(&mut self, result: Result<Vec<LogEntry>, String>) {
        match self.ahead.complete(result, self.reader.position()) {
            Fetched::Entries => {}
            Fetched::Nothing => {
                self.reader.caught_up = true;
                self.ahead.note_caught_up();
            }
            Fetched::Failed(error) => {
                tracing::warn!(topic = %self.topic, subscription = %self.name, %error, "read failed");
                self.reader.caught_up = false;
                self.reader.schedule_retry();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A parked subscription holds its `Dispatcher` (in its `Parking`,
    /// with the mailbox's receiver and `on_end`): the largest part of an
    /// idle topic's fixed cost (ARCHITECTURE.md, "Memory model"). A field that grows it past the
    /// bound belongs behind a `Box` or an `Option<Box<_>>`.
    #[test]
    fn a_parked_subscription_task_holds_little() {
        let sizes = [
            ("Dispatcher", std::mem::size_of::<Dispatcher>()),
            ("Consumers", std::mem::size_of::<Consumers>()),
            ("Outstanding", std::mem::size_of::<Outstanding>()),
            ("Reader", std::mem::size_of::<Reader>()),
            ("ReadAhead", std::mem::size_of::<ReadAhead>()),
            ("Rates", std::mem::size_of::<Rates>()),
            ("Acks", std::mem::size_of::<Acks>()),
            ("Counters", std::mem::size_of::<Counters>()),
            ("Option<TxnView>", std::mem::size_of::<Option<TxnView>>()),
            ("Delayed", std::mem::size_of::<Delayed>()),
        ];
        eprintln!("{sizes:?}");
        assert!(sizes[0].1 <= 768, "{sizes:?}");
    }
}
