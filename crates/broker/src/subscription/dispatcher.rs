//! The subscription task: one per subscription with consumers (or reader),
//! handling its commands in order and sending entries while consumers have
//! permits.
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

use std::collections::HashSet;
use std::sync::Arc;

use vela_log::{LogEntry, ManagedLog, Position};
use vela_wire::proto::{
    self, CommandCloseConsumer, CommandMessage, CommandReachedEndOfTopic, MessageIdData,
    ServerError, command_ack::AckType, command_subscribe::SubType,
};

use super::acks::{ACK_SET_WORDS_MAX, Acks};
use super::command::{
    CommandReceiver, CommandSender, ConnEvent, ConsumerInfo, ConsumerKey, ConsumerStatsSnapshot,
    SeekTarget, SubCommand, SubscriptionHandle, SubscriptionSpec, key_of,
};
use super::consumers::{Consumers, Route};
use super::delayed::{self, DELAYED_ENTRIES_MAX, Delayed};
use super::held::HeldShare;
use super::policy::{DispatchPolicy, Rates};
use super::read_ahead::{Fetched, ReadAhead};
use super::reader::{READ_BATCH_BYTES_MAX, READ_BATCH_ENTRIES_MAX, Reader};
use super::redelivery::{Outstanding, REPLAY_ENTRIES_MAX, SLOT_UNKNOWN, UNACKED_ENTRIES_MAX};
use super::seek::resolve_seek;
use super::txn_view::{self, TxnView, Verdict};

mod stats;
mod txn;
use crate::codec;
use crate::error::ServiceError;
use crate::stats::RateMeter;

/// Entries a subscription holds at most (out to consumers, to replay,
/// delayed): new entries are read only while each set is under its bound,
/// one read adds at most a batch, and entries only move between the sets
/// afterwards.
const HELD_ENTRIES_MAX: usize =
    UNACKED_ENTRIES_MAX + REPLAY_ENTRIES_MAX + DELAYED_ENTRIES_MAX + READ_BATCH_ENTRIES_MAX;

/// Starts a subscription task. `on_end` runs when it stops by itself
/// (reader without consumers, unsubscribe).
pub(crate) fn spawn(
    spec: SubscriptionSpec,
    on_end: Box<dyn FnOnce(&str) + Send>,
) -> SubscriptionHandle {
    let (tx, rx) = CommandSender::channel();
    let durable = spec.cursor.is_some();
    let handle = SubscriptionHandle {
        name: spec.name.clone(),
        durable,
        tx,
    };
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
    tokio::spawn(dispatcher.run(rx, on_end));
    handle
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
    /// The topic's dispatch policies.
    policy: Arc<DispatchPolicy>,
    /// The dispatch rates it keeps to.
    rates: Rates,
    name: String,
    /// Full topic name (for logs).
    topic: String,
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
}

enum Flow {
    Continue,
    Stop,
}

impl Dispatcher {
    async fn run(mut self, mut rx: CommandReceiver, on_end: Box<dyn FnOnce(&str) + Send>) {
        tracing::debug!(topic = %self.topic, subscription = %self.name, "subscription started");
        loop {
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
            let ahead = &mut self.ahead;
            let txn = self.txn.as_mut();
            // Boxed: the futures of this wait (timers, the log's watch, the
            // channel) live only while it waits, and a parked subscription
            // task holds only the dispatcher's state (~1.3 KiB less each).
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
                }
            })
            .await;
            let mut command = None;
            match wake {
                Wake::Command(received) => command = Some(*received),
                Wake::Closed => break,
                Wake::Retry => {
                    self.reader.clear_retry();
                    self.reader.caught_up = false;
                }
                Wake::Again => self.reader.caught_up = false,
                Wake::Read(result) => self.read_finished(result),
            }
            if self.log.is_closed() {
                // The topic's log closed or failed: consumers reconnect (to a
                // reopened topic) after CLOSE_CONSUMER.
                tracing::info!(topic = %self.topic, subscription = %self.name, "log closed: closing consumers");
                if let Some(SubCommand::Shutdown { reply }) = command {
                    let _ = reply.send(());
                }
                Box::pin(self.close_all_consumers(None)).await;
                break;
            }
            // Handling and dispatching are boxed: a parked subscription
            // task then holds only this loop's state (~2 KiB less per
            // subscription), at one allocation per wake-up.
            if let Some(command) = command
                && let Flow::Stop = Box::pin(self.handle(command)).await
            {
                break;
            }
            self.reader.set_active(!self.consumers.is_empty());
            self.held_blocked = false;
            Box::pin(self.dispatch()).await;
            self.report_held();
            self.tell_end_of_topic().await;
        }
        tracing::debug!(topic = %self.topic, subscription = %self.name, "subscription stopped");
        on_end(&self.name);
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

    /// Starts a read of the next batch when the read-ahead has room (and
    /// the log may have more): in the background from the ledgers, or at
    /// once from the tail cache when consumers wait and it holds the next
    /// entries. A compacted view is read inline, on demand only.
    async fn top_up(&mut self) {
        if self.reader.caught_up
            || self.reader.retry_at().is_some()
            || self.consumers.is_empty()
            || !self.ahead.has_room()
        {
            return;
        }
        let demand = self.ahead.is_empty() && self.consumers.total_permits() > 0;
        let from = self.next_read_position();
        if !self.reader.has_compaction() && self.log.last_confirmed().is_none_or(|last| from > last)
        {
            // At the tail: nothing to read until the log grows.
            self.reader.caught_up = true;
            return;
        }
        if !self.reader.has_compaction() && self.txn.as_mut().is_some_and(|t| t.stops_at(from)) {
            self.reader.caught_up = true; // at the transaction read limit
            return;
        }
        if self.reader.has_compaction() {
            if !demand {
                return;
            }
            match self.reader.read(from, READ_BATCH_ENTRIES_MAX).await {
                Ok(entries) if entries.is_empty() => self.reader.caught_up = true,
                Ok(entries) => self.ahead.push_unreserved(entries),
                Err(error) => {
                    tracing::warn!(topic = %self.topic, subscription = %self.name, %error, "read failed");
                    self.reader.schedule_retry();
                }
            }
            return;
        }
        if demand {
            // The tail: entries in memory already, no read to wait for.
            let cached = self
                .log
                .read_cached(from, READ_BATCH_ENTRIES_MAX, READ_BATCH_BYTES_MAX);
            if !cached.is_empty() {
                self.ahead.push_unreserved(cached);
                return;
            }
        }
        self.ahead.start(&self.log, from, demand);
    }

    async fn handle(&mut self, command: SubCommand) -> Flow {
        match command {
            SubCommand::Add {
                info,
                sub_type,
                reply,
            } => {
                let result = self.add_consumer(info, sub_type).await;
                let _ = reply.send(result);
            }
            SubCommand::Remove { key, reply } => {
                self.remove_consumer(key).await;
                let ended = !self.durable && self.consumers.is_empty();
                if let Some(reply) = reply {
                    let _ = reply.send(ended);
                }
                if ended {
                    return Flow::Stop;
                }
            }
            SubCommand::Flow { key, permits } => {
                if let Some(slot) = self.consumers.get_mut(key) {
                    slot.permits = slot.permits.saturating_add(i64::from(permits));
                    slot.last_flow_ms = delayed::now_ms();
                    slot.flowed = true;
                    self.reader.caught_up = false;
                }
            }
            SubCommand::Ack {
                key,
                ack_type,
                ids,
                request_id,
            } => self.ack(key, ack_type, ids, request_id).await,
            SubCommand::Redeliver { key, ids, epoch } => self.redeliver(key, &ids, epoch),
            SubCommand::TxnCommitted {
                positions,
                cumulative,
                reply,
            } => {
                self.txn_committed(positions, cumulative).await;
                let _ = reply.send(());
            }
            SubCommand::TxnAborted { positions } => self.txn_aborted(&positions),
            SubCommand::Seek { target, reply } => {
                let result = self.seek(target).await;
                let _ = reply.send(result);
            }
            SubCommand::Unsubscribe { key, force, reply } => {
                if self.consumers.has_others_than(key) && !force {
                    let _ = reply.send(Err(ServiceError::new(
                        ServerError::UnknownError,
                        "subscription has other active consumers",
                    )));
                    return Flow::Continue;
                }
                if self.acks.is_durable()
                    && let Err(e) = self.log.delete_cursor(&self.name).await
                {
                    let _ = reply.send(Err(e.into()));
                    return Flow::Continue;
                }
                self.close_all_consumers(Some(key)).await;
                let _ = reply.send(Ok(()));
                return Flow::Stop;
            }
            SubCommand::Stats { key, reply } => {
                let backlog = self.acks.backlog(&self.log);
                let snapshot = self.consumers.get(key).map(|s| ConsumerStatsSnapshot {
                    available_permits: s.permits,
                    unacked_messages: s.unacked,
                    backlog,
                    name: s.info.name.clone(),
                    address: s.info.address.clone(),
                });
                let _ = reply.send(snapshot);
            }
            SubCommand::SubStats { reply } => {
                let _ = reply.send(self.stats());
            }
            SubCommand::AckUpTo {
                position,
                expired,
                reply,
            } => {
                let result = self.ack_up_to(position, expired);
                let _ = reply.send(result);
            }
            SubCommand::MarkDelete { reply } => {
                let _ = reply.send(self.acks.mark_delete());
            }
            SubCommand::TopicTerminated => self.terminated = true,
            SubCommand::Shutdown { reply } => {
                self.close_all_consumers(None).await;
                let _ = reply.send(());
                return Flow::Stop;
            }
        }
        Flow::Continue
    }

    /// A terminated topic whose every entry this subscription acknowledged:
    /// its consumers are told they reached the end (once each), as Pulsar
    /// does on termination, after an ack and on reading past the end.
    /// Clients that close the connection on the command (C++/Python, Go)
    /// and those below protocol v9 are not told.
    async fn tell_end_of_topic(&mut self) {
        if !self.terminated || self.acks.backlog(&self.log) > 0 {
            return;
        }
        for index in 0..self.consumers.len() {
            let slot = self.consumers.at_mut(index);
            if slot.told_end_of_topic
                || !slot.flowed
                || !slot.info.handles_end_of_topic
                || slot.info.protocol_version < 9
            {
                continue;
            }
            slot.told_end_of_topic = true;
            let frame = codec::encode_command(CommandReachedEndOfTopic {
                consumer_id: slot.info.consumer_id,
            });
            let _ = slot.info.out.send(frame).await;
        }
    }

    /// Acknowledges everything up to `position` (admin skip/expire).
    fn ack_up_to(&mut self, position: Position, expired: bool) -> Result<(), ServiceError> {
        let backlog_before = self.acks.backlog(&self.log);
        let mark_delete_before = self.acks.mark_delete();
        self.acks
            .ack_cumulative(&self.log, position)
            .map_err(ServiceError::from)?;
        debug_assert!(
            self.acks.mark_delete() >= mark_delete_before,
            "mark-delete position moved back"
        );
        for owner in self.outstanding.drop_through(position) {
            self.unacked_one_less(owner);
        }
        self.delayed.drop_through(position);
        self.reader.skip_through(position);
        if expired {
            let backlog_after = self.acks.backlog(&self.log);
            self.counters.expired += backlog_before.saturating_sub(backlog_after);
        }
        self.reader.caught_up = false;
        Ok(())
    }

    /// An entry out to `owner` is no longer out (acked or sent again).
    /// Saturating: the count is a statistic, and a REDELIVER naming an
    /// entry twice takes it down twice.
    fn unacked_one_less(&mut self, owner: ConsumerKey) {
        if let Some(slot) = self.consumers.get_mut(owner) {
            slot.unacked = slot.unacked.saturating_sub(1);
        }
    }

    async fn add_consumer(
        &mut self,
        info: ConsumerInfo,
        sub_type: SubType,
    ) -> Result<(), ServiceError> {
        let fence_at = (!self.outstanding.is_empty()).then_some(self.reader.position());
        self.consumers
            .attach(info, sub_type, &self.name, fence_at)?;
        if self.consumers.has_active_consumer() {
            self.pick_active().await;
        }
        Ok(())
    }

    async fn remove_consumer(&mut self, key: ConsumerKey) {
        if !self.consumers.detach(key) {
            return;
        }
        // Every entry it had not acked goes back to the replay set; on
        // Shared and Key_Shared, counted as redelivered as Pulsar counts it.
        if matches!(
            self.consumers.sub_type(),
            SubType::Shared | SubType::KeyShared
        ) {
            let consumers_left = !self.consumers.is_empty();
            self.outstanding.requeue_left_by(key, consumers_left);
        } else {
            self.outstanding.requeue_owned_by(key);
        }
        if self.consumers.is_empty() {
            // Nobody to read ahead for: give the budget back.
            self.ahead.clear();
        }
        if self.consumers.has_active_consumer() {
            self.pick_active().await;
        }
    }

    /// Failover/Exclusive: picks the active consumer; entries the previous
    /// one had not acked go to the new one.
    async fn pick_active(&mut self) {
        if let Some(previous) = self.consumers.choose_active(self.partition) {
            self.outstanding.requeue_owned_by(previous);
        }
        self.consumers.announce_active().await;
    }

    async fn ack(
        &mut self,
        key: ConsumerKey,
        ack_type: AckType,
        ids: Vec<MessageIdData>,
        request_id: Option<u64>,
    ) {
        let mut error: Option<String> = None;
        let cumulative = ack_type == AckType::Cumulative;
        if cumulative
            && matches!(
                self.consumers.sub_type(),
                SubType::Shared | SubType::KeyShared
            )
        {
            error =
                Some("cumulative ack is not allowed on Shared and Key_Shared subscriptions".into());
        } else {
            let last = self.log.last_confirmed();
            for id in &ids {
                let pos = Position::new(id.ledger_id, id.entry_id);
                if last.is_none_or(|last| pos > last) {
                    // As the Java cursor: never mark beyond the last entry
                    // (it would silently ack messages not yet published).
                    error = Some(format!("ack of {pos}, beyond the last entry"));
                    continue;
                }
                if id.ack_set.len() > ACK_SET_WORDS_MAX {
                    error = Some(format!("ack_set of {} words is too long", id.ack_set.len()));
                    continue;
                }
                let ack_set: Vec<u64> = id.ack_set.iter().map(|w| *w as u64).collect();
                let mark_delete_before = self.acks.mark_delete();
                let result = if cumulative {
                    if ack_set.is_empty() {
                        self.acks.ack_cumulative(&self.log, pos)
                    } else {
                        let before = self.log.previous_position(pos);
                        let r = match before {
                            Some(b) => self.acks.ack_cumulative(&self.log, b),
                            None => Ok(()),
                        };
                        r.and_then(|()| self.acks.ack_batch(&self.log, pos, &ack_set))
                    }
                } else if ack_set.is_empty() {
                    self.acks.ack(&self.log, &[pos])
                } else {
                    self.acks.ack_batch(&self.log, pos, &ack_set)
                };
                debug_assert!(
                    self.acks.mark_delete() >= mark_delete_before,
                    "mark-delete position moved back"
                );
                if let Err(e) = result {
                    error = Some(e.to_string());
                }
                if cumulative {
                    let acks = &self.acks;
                    let owners = self.outstanding.acked_through(pos, |p| acks.is_acked(p));
                    for owner in owners {
                        self.unacked_one_less(owner);
                    }
                } else if self.acks.is_acked(pos) {
                    if let Some(owner) = self.outstanding.forget(pos) {
                        self.unacked_one_less(owner);
                    }
                    self.outstanding.unreplay(pos);
                }
            }
        }
        if let Some(message) = &error {
            tracing::info!(topic = %self.topic, subscription = %self.name, error = %message, "ack refused");
        }
        let Some(request_id) = request_id else { return };
        let Some(slot) = self.consumers.get(key) else {
            return;
        };
        // ACK_RESPONSE exists since v17; older clients never set request_id.
        if slot.info.protocol_version < 17 {
            return;
        }
        let response = proto::CommandAckResponse {
            consumer_id: key.1,
            txnid_least_bits: None,
            txnid_most_bits: None,
            error: error.as_ref().map(|_| ServerError::NotAllowedError as i32),
            message: error,
            request_id: Some(request_id),
        };
        let _ = slot.info.out.send(codec::encode_command(response)).await;
    }

    fn redeliver(&mut self, key: ConsumerKey, ids: &[MessageIdData], epoch: Option<u64>) {
        if ids.is_empty()
            && let Some(epoch) = epoch
            && let Some(slot) = self.consumers.get_mut(key)
        {
            // Entries stamped with an older epoch are dropped by the client;
            // they are all in `pending` and come again below.
            slot.epoch = Some(slot.epoch.map_or(epoch, |e| e.max(epoch)));
        }
        let positions: Vec<Position> = if ids.is_empty() {
            self.outstanding.owned_by(key)
        } else {
            ids.iter()
                .map(|id| Position::new(id.ledger_id, id.entry_id))
                .filter(|pos| self.outstanding.is_out_to(*pos, key))
                .collect()
        };
        for pos in positions {
            // A position named twice counts twice, as it always has.
            self.outstanding.redeliver(pos);
            self.unacked_one_less(key);
            self.counters.redelivered += 1;
        }
        self.reader.caught_up = false;
    }

    async fn seek(&mut self, target: SeekTarget) -> Result<(), ServiceError> {
        let next = resolve_seek(&self.log, target).await?;
        // As the Java broker: disconnect the consumers, then reset.
        self.close_all_consumers(None).await;
        self.acks
            .reset(&self.log, next)
            .await
            .map_err(ServiceError::from)?;
        self.outstanding.clear();
        self.delayed.clear();
        self.ahead.clear();
        self.reader.seek(next);
        tracing::info!(topic = %self.topic, subscription = %self.name, position = %next, "seek");
        Ok(())
    }

    async fn close_all_consumers(&mut self, except_reply_for: Option<ConsumerKey>) {
        let slots = self.consumers.detach_all();
        for slot in &slots {
            let key = key_of(&slot.info);
            let _ = slot
                .info
                .events
                .send(ConnEvent::ConsumerClosed(slot.info.consumer_id))
                .await;
            if Some(key) == except_reply_for {
                // The unsubscribing consumer gets SUCCESS, not CLOSE_CONSUMER.
                continue;
            }
            let frame = codec::encode_command(CommandCloseConsumer {
                consumer_id: slot.info.consumer_id,
                request_id: u64::MAX,
                assigned_broker_service_url: None,
                assigned_broker_service_url_tls: None,
            });
            let _ = slot.info.out.send(frame).await;
        }
        self.outstanding.requeue_all();
        self.ahead.clear();
    }

    /// Sends entries while some consumer has permits.
    /// `maxUnackedMessagesOnSubscription` reached: nothing more goes out
    /// until acknowledgements come.
    fn subscription_unacked_full(&self) -> bool {
        let max = self
            .policy
            .unacked_per_subscription_max
            .load(std::sync::atomic::Ordering::Relaxed);
        max > 0 && self.outstanding.pending_len() as u64 >= max
    }

    async fn dispatch(&mut self) {
        // The topic's rates as of now; `resume_at` is set again below if
        // one holds this pass back.
        self.rates.refresh(&self.policy);
        self.rates.resume_at = None;
        if let Some(txn) = &mut self.txn {
            txn.blocked = false;
        }
        self.release_due();
        if self.consumers.is_empty() || self.subscription_unacked_full() {
            return;
        }
        let outstanding = &self.outstanding;
        self.consumers
            .lift_fences(|fence| outstanding.has_before(fence));
        loop {
            if self.consumers.total_permits() <= 0
                || self.subscription_unacked_full()
                || self.rates.limited()
            {
                return;
            }
            let mut progressed = false;
            if self.outstanding.replay_len() > 0 {
                progressed |= self.dispatch_replay().await;
            }
            if self.consumers.total_permits() <= 0
                || self.outstanding.pending_len() >= UNACKED_ENTRIES_MAX
                || self.outstanding.replay_len() >= REPLAY_ENTRIES_MAX
                || self.delayed.len() >= DELAYED_ENTRIES_MAX
            {
                return;
            }
            self.report_held();
            if self.held.budget().is_full() {
                self.held_blocked = true;
                return;
            }
            if self.ahead.is_empty() {
                self.top_up().await;
            }
            if self.ahead.is_empty() {
                if self.ahead.in_flight() || self.reader.retry_at().is_some() {
                    // Consumers wait for the read in flight.
                    self.ahead.note_waiting();
                    return;
                }
                if progressed && self.outstanding.replay_len() > 0 {
                    // A replay pass takes at most READ_BATCH_ENTRIES_MAX
                    // entries: go on with the rest now, as nothing else may
                    // wake this subscription (the log is caught up).
                    continue;
                }
                return;
            }
            let mut stuck_slots: HashSet<u32> = self.outstanding.replay_slots();
            let mut taken = 0;
            while taken < READ_BATCH_ENTRIES_MAX && !self.rates.limited() {
                let Some(entry) = self.ahead.take(self.reader.position()) else {
                    break;
                };
                taken += 1;
                let pos = entry.position;
                match self
                    .txn
                    .as_mut()
                    .map_or(Verdict::Deliver, |t| t.verdict(&entry))
                {
                    Verdict::Deliver => {}
                    Verdict::Wait => {
                        self.ahead.put_back(entry);
                        self.reader.caught_up = true;
                        return;
                    }
                    Verdict::Skip => {
                        // Acknowledged, as Pulsar's dispatchers do.
                        let _ = self.acks.ack(&self.log, &[pos]);
                        self.reader.move_past(pos);
                        progressed = true;
                        continue;
                    }
                }
                if self.acks.is_acked(pos) || self.outstanding.contains(pos) {
                    self.reader.move_past(pos);
                    progressed = true;
                    continue;
                }
                if let Some(due_ms) = delayed::due_later(
                    self.consumers.sub_type(),
                    self.policy
                        .delayed_delivery
                        .load(std::sync::atomic::Ordering::Relaxed),
                    &entry.data,
                ) {
                    // Delayed delivery: held until due, then replayed.
                    self.delayed.hold(due_ms, pos);
                    self.reader.move_past(pos);
                    progressed = true;
                    continue;
                }
                let slot = self.consumers.hash_slot_of(&entry);
                if self.consumers.is_key_shared() && stuck_slots.contains(&slot) {
                    // An earlier entry of this key slot waits: keep order.
                    self.outstanding.queue_replay(pos, slot);
                    self.reader.move_past(pos);
                    progressed = true;
                    continue;
                }
                match self.consumers.route(slot, pos, &HashSet::new()) {
                    Route::Deliver(index) => {
                        self.ahead.note_fed();
                        self.deliver(index, entry, slot).await;
                    }
                    Route::Hold => {
                        stuck_slots.insert(slot);
                        self.outstanding.queue_replay(pos, slot);
                    }
                    Route::Stop => {
                        self.ahead.put_back(entry);
                        self.top_up().await;
                        return;
                    }
                }
                self.reader.move_past(pos);
                progressed = true;
            }
            debug_assert!(
                self.outstanding.pending_len() + self.outstanding.replay_len() + self.delayed.len()
                    <= HELD_ENTRIES_MAX,
                "a subscription holds more entries than its bounds allow"
            );
            self.top_up().await;
            if !progressed {
                return;
            }
        }
    }

    /// Tells the broker-wide count what this subscription holds now.
    fn report_held(&mut self) {
        let held =
            self.outstanding.pending_len() + self.outstanding.replay_len() + self.delayed.len();
        self.held.report(held);
    }

    /// Moves delayed entries that are due into the replay set.
    fn release_due(&mut self) {
        for pos in self.delayed.take_due(delayed::now_ms()) {
            self.outstanding.queue_replay(pos, SLOT_UNKNOWN);
            self.reader.caught_up = false;
        }
    }

    /// Sends replay entries (in position order) to consumers that can take
    /// them; true if anything was sent or dropped.
    async fn dispatch_replay(&mut self) -> bool {
        let mut progressed = false;
        let mut stuck_slots: HashSet<u32> = HashSet::new();
        let mut stuck_consumers: HashSet<usize> = HashSet::new();
        for pos in self.outstanding.replay_first(READ_BATCH_ENTRIES_MAX) {
            if self.consumers.total_permits() <= 0 || self.rates.limited() {
                break;
            }
            if self.acks.is_acked(pos) {
                self.outstanding.unreplay(pos);
                progressed = true;
                continue;
            }
            let entry = match self.reader.read_one(pos).await {
                Ok(Some(entry)) => entry,
                Ok(None) => {
                    self.outstanding.unreplay(pos);
                    progressed = true;
                    continue;
                }
                Err(e) => {
                    tracing::warn!(topic = %self.topic, subscription = %self.name, error = %e, "read failed");
                    self.reader.schedule_retry();
                    break;
                }
            };
            let slot = self.consumers.hash_slot_of(&entry);
            self.outstanding.queue_replay(pos, slot);
            if self.consumers.is_key_shared() && stuck_slots.contains(&slot) {
                continue;
            }
            match self.consumers.route(slot, pos, &stuck_consumers) {
                Route::Deliver(index) => {
                    self.outstanding.unreplay(pos);
                    self.deliver(index, entry, slot).await;
                    progressed = true;
                }
                Route::Hold => {
                    stuck_slots.insert(slot);
                    if let Some(index) = self.consumers.selected_index(slot) {
                        stuck_consumers.insert(index);
                    }
                }
                Route::Stop => break,
            }
        }
        progressed
    }

    async fn deliver(&mut self, index: usize, entry: LogEntry, hash_slot: u32) {
        let pos = entry.position;
        debug_assert!(
            !self.outstanding.contains(pos),
            "delivery of an entry already out or waiting"
        );
        let messages = codec::entry_message_count(&entry.data);
        let redelivery_count = self.outstanding.redelivery_count(pos);
        let ack_set: Vec<i64> = self
            .acks
            .batch_state(pos)
            .map(|words| words.iter().map(|w| *w as i64).collect())
            .unwrap_or_default();
        let slot = self.consumers.at_mut(index);
        debug_assert!(slot.permits > 0, "delivery to a consumer without permits");
        let message = CommandMessage {
            consumer_id: slot.info.consumer_id,
            message_id: MessageIdData {
                ledger_id: pos.ledger_id,
                entry_id: pos.entry_id,
                partition: Some(self.partition),
                ..MessageIdData::default()
            },
            redelivery_count: (redelivery_count > 0).then_some(redelivery_count),
            ack_set,
            consumer_epoch: slot.epoch,
        };
        slot.permits -= i64::from(messages);
        slot.unacked += 1;
        slot.msg_out += u64::from(messages);
        let key = key_of(&slot.info);
        let entry_bytes = entry.data.len();
        let frame = codec::encode_message(message, entry.data);
        if slot.info.out.send(frame).await.is_err() {
            // The connection is gone; its cleanup will remove the consumer.
            slot.permits = 0;
            self.outstanding.queue_replay(pos, hash_slot);
            return;
        }
        self.outstanding.sent(pos, key, hash_slot);
        self.rates.charge(u64::from(messages), entry_bytes as u64);
        self.counters.msg_out += u64::from(messages);
        self.counters.bytes_out += entry_bytes as u64;
    }
}
