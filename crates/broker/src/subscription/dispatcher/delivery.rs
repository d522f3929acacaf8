//! The subscription task's delivery: entries taken from the read-ahead (or
//! the replay set) and sent to consumers with permits, in log order per
//! consumer and per Key_Shared slot, within the dispatch rates, the
//! unacknowledged limits and the broker-wide count of held entries; and
//! topping the read-ahead up so a read runs while entries go out.
//!
//! Owns no state of its own: it moves entries between the task's `ahead`,
//! `outstanding` and `delayed`. Never: handles a command (`commands` does),
//! sends to a consumer without permits, reads more than
//! `READ_BATCH_ENTRIES_MAX` entries at once or starts a second log read.

use std::collections::HashSet;

use vela_log::LogEntry;
use vela_wire::proto::{CommandMessage, MessageIdData};

use super::{Dispatcher, HELD_ENTRIES_MAX};
use crate::codec;
use crate::subscription::command::key_of;
use crate::subscription::consumers::Route;
use crate::subscription::delayed::{self, DELAYED_ENTRIES_MAX};
use crate::subscription::reader::{READ_BATCH_BYTES_MAX, READ_BATCH_ENTRIES_MAX};
use crate::subscription::redelivery::{REPLAY_ENTRIES_MAX, SLOT_UNKNOWN, UNACKED_ENTRIES_MAX};
use crate::subscription::txn_view::Verdict;

impl Dispatcher {
    /// Starts a read of the next batch when the read-ahead has room (and
    /// the log may have more): in the background from the ledgers, or at
    /// once from the tail cache when consumers wait and it holds the next
    /// entries. A compacted view is read inline, on demand only.
    pub(super) async fn top_up(&mut self) {
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

    /// `maxUnackedMessagesOnSubscription` reached: nothing more goes out
    /// until acknowledgements come.
    pub(super) fn subscription_unacked_full(&self) -> bool {
        let max = self
            .policy
            .unacked_per_subscription_max
            .load(std::sync::atomic::Ordering::Relaxed);
        max > 0 && self.outstanding.pending_len() as u64 >= max
    }

    /// Sends entries while some consumer has permits.
    pub(super) async fn dispatch(&mut self) {
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
                        if self.consumers.total_permits() <= 0 {
                            // Nobody can take more: the rest stays read
                            // ahead (in memory), not held for a re-read.
                            self.reader.move_past(pos);
                            progressed = true;
                            break;
                        }
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
    pub(super) fn report_held(&mut self) {
        let held =
            self.outstanding.pending_len() + self.outstanding.replay_len() + self.delayed.len();
        self.held.report(held);
    }

    /// Moves delayed entries that are due into the replay set.
    pub(super) fn release_due(&mut self) {
        for pos in self.delayed.take_due(delayed::now_ms()) {
            self.outstanding.queue_replay(pos, SLOT_UNKNOWN);
            self.reader.caught_up = false;
        }
    }

    /// Sends replay entries (in position order) to consumers that can take
    /// them; true if anything was sent or dropped.
    pub(super) async fn dispatch_replay(&mut self) -> bool {
        let mut progressed = false;
        let mut stuck_slots: HashSet<u32> = HashSet::new();
        let mut stuck_consumers: HashSet<usize> = HashSet::new();
        for (pos, known_slot) in self.outstanding.replay_first(READ_BATCH_ENTRIES_MAX) {
            if self.consumers.total_permits() <= 0 || self.rates.limited() {
                break;
            }
            if self.acks.is_acked(pos) {
                self.outstanding.unreplay(pos);
                progressed = true;
                continue;
            }
            if self.consumers.is_key_shared() && known_slot != SLOT_UNKNOWN {
                // Whether it can go is known before it is read: an entry
                // held back is not read again (its slot's consumer has no
                // permits, is fenced, or an earlier entry of the slot waits).
                if stuck_slots.contains(&known_slot) {
                    continue;
                }
                let route = self.consumers.route(known_slot, pos, &stuck_consumers);
                if matches!(route, Route::Hold) {
                    stuck_slots.insert(known_slot);
                    if let Some(index) = self.consumers.selected_index(known_slot) {
                        stuck_consumers.insert(index);
                    }
                    continue;
                }
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

    pub(super) async fn deliver(&mut self, index: usize, entry: LogEntry, hash_slot: u32) {
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
