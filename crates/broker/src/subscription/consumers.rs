//! The consumers attached to a subscription and who may take the next
//! entry: the subscription type (fixed by the first consumer), the active
//! consumer of Exclusive and Failover, the round robin of Shared, the
//! Key_Shared selector, and each consumer's permits and counters.
//!
//! Owns: [`Consumers`] and [`Slot`]. Guarantees: an Exclusive subscription
//! has at most one consumer; the count stays within `consumers_max`; the
//! active consumer, when set, is attached; [`Consumers::route`] only picks a
//! consumer with permits > 0 (asserted again at delivery).
//! Never: tracks entries (`redelivery` does) or reads the log.

use std::collections::HashSet;

use vela_log::{LogEntry, Position};
use vela_wire::proto::{CommandActiveConsumerChange, ServerError, command_subscribe::SubType};

use tokio::sync::mpsc;

use super::command::{ConsumerInfo, ConsumerKey, key_of};
use crate::codec::{self, Outbound};
use crate::error::ServiceError;
use crate::key_shared::{self, KeySharedSelector};

/// One attached consumer.
#[derive(Debug)]
pub(crate) struct Slot {
    pub(crate) info: ConsumerInfo,
    /// Current consumer epoch (raised by redeliver-all).
    pub(crate) epoch: Option<u64>,
    /// Key_Shared: a consumer that joined beside others while entries were
    /// out gets no entry at or after this position until no earlier entry
    /// is out or waiting (the Java broker's "recently joined consumers"), so
    /// a key moving to it cannot overtake its own earlier messages. Never
    /// set on a consumer joining alone, and cleared when one consumer is
    /// left: a lone consumer gets what waits in replay first anyway, and a
    /// fence would make it wait for its own acknowledgements.
    pub(crate) fence: Option<Position>,
    /// Messages it may still take (FLOW adds; a batch takes its message
    /// count, which may leave it negative).
    pub(crate) permits: i64,
    /// Entries out to it and not acknowledged.
    pub(crate) unacked: u64,
    /// Messages sent to it.
    pub(crate) msg_out: u64,
    /// Wall-clock time of its last FLOW, ms (0: none yet).
    pub(crate) last_flow_ms: u64,
    /// It sent a FLOW (it is ready for frames: nothing is sent before).
    pub(crate) flowed: bool,
    /// It was told the topic ended (REACHED_END_OF_TOPIC), at most once.
    pub(crate) told_end_of_topic: bool,
}

/// Who the next entry may go to.
pub(crate) enum Route {
    Deliver(usize),
    /// Key_Shared: the entry's consumer cannot take it now; keep it in replay.
    Hold,
    /// Nobody can take anything now: stop this pass.
    Stop,
}

/// The consumers of one subscription.
#[derive(Debug)]
pub(crate) struct Consumers {
    slots: Vec<Slot>,
    /// Consumers attached at most (see `SubscriptionSpec::consumers_max`).
    max: usize,
    sub_type: SubType,
    /// Key_Shared: slot → consumer.
    /// Boxed: ~30 bytes inline in every parked subscription otherwise.
    selector: Option<Box<KeySharedSelector>>,
    /// Exclusive and Failover: the consumer entries go to.
    active: Option<ConsumerKey>,
    /// Shared: where the next round robin search starts.
    round_robin: usize,
    /// Entries out and unacknowledged past which a consumer takes no more
    /// (0: no limit; `DispatchPolicy::unacked_per_consumer_max`).
    unacked_max: u64,
}

impl Consumers {
    pub(crate) fn new(sub_type: SubType, sticky: bool, max: usize) -> Consumers {
        let selector = match sub_type {
            SubType::KeyShared if sticky => Some(Box::new(KeySharedSelector::sticky())),
            SubType::KeyShared => Some(Box::new(KeySharedSelector::auto_split())),
            _ => None,
        };
        Consumers {
            slots: Vec::new(),
            max,
            sub_type,
            selector,
            active: None,
            round_robin: 0,
            unacked_max: 0,
        }
    }

    /// Sets the per-consumer unacknowledged limit (0: none).
    pub(super) fn set_unacked_max(&mut self, max: u64) {
        self.unacked_max = max;
    }

    /// Whether `slot` may take an entry now: permits left and under the
    /// unacknowledged limit.
    fn takes(&self, slot: &Slot) -> bool {
        slot.permits > 0 && (self.unacked_max == 0 || slot.unacked < self.unacked_max)
    }

    pub(crate) fn sub_type(&self) -> SubType {
        self.sub_type
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.slots.is_empty()
    }

    pub(crate) fn len(&self) -> usize {
        self.slots.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &Slot> {
        self.slots.iter()
    }

    pub(crate) fn get(&self, key: ConsumerKey) -> Option<&Slot> {
        self.slots.iter().find(|s| key_of(&s.info) == key)
    }

    pub(crate) fn get_mut(&mut self, key: ConsumerKey) -> Option<&mut Slot> {
        self.slots.iter_mut().find(|s| key_of(&s.info) == key)
    }

    pub(crate) fn at_mut(&mut self, index: usize) -> &mut Slot {
        &mut self.slots[index]
    }

    /// True if any consumer other than `key` is attached.
    pub(crate) fn has_others_than(&self, key: ConsumerKey) -> bool {
        self.slots.iter().any(|s| key_of(&s.info) != key)
    }

    /// Permits of all consumers that may take entries now (negative ones
    /// count as 0; a consumer at its unacknowledged limit counts 0).
    pub(crate) fn total_permits(&self) -> i64 {
        self.slots
            .iter()
            .filter(|s| self.unacked_max == 0 || s.unacked < self.unacked_max)
            .fold(0i64, |sum, s| sum.saturating_add(s.permits.max(0)))
    }

    /// The Key_Shared slot of an entry (0 when the subscription is not
    /// Key_Shared).
    pub(crate) fn hash_slot_of(&self, entry: &LogEntry) -> u32 {
        if self.selector.is_some() {
            key_shared::entry_slot(&entry.data)
        } else {
            0
        }
    }

    pub(crate) fn is_key_shared(&self) -> bool {
        self.selector.is_some()
    }

    /// Attaches a consumer. The first one decides the type (and the
    /// Key_Shared mode), as in the Java broker. `fence_at`: where a
    /// Key_Shared consumer joining now is fenced (`None`: nothing is out).
    pub(crate) fn attach(
        &mut self,
        info: ConsumerInfo,
        sub_type: SubType,
        name: &str,
        fence_at: Option<Position>,
    ) -> Result<(), ServiceError> {
        if self.slots.is_empty() {
            // No consumer attached: the new one decides the type (and the
            // Key_Shared mode), as in the Java broker.
            self.sub_type = sub_type;
            self.active = None;
            self.selector = match (sub_type, info.sticky_ranges.is_some()) {
                (SubType::KeyShared, true) => Some(Box::new(KeySharedSelector::sticky())),
                (SubType::KeyShared, false) => Some(Box::new(KeySharedSelector::auto_split())),
                _ => None,
            };
        }
        if sub_type != self.sub_type {
            return Err(ServiceError::new(
                ServerError::ConsumerBusy,
                format!(
                    "subscription {} is of type {:?}, not {:?}",
                    name, self.sub_type, sub_type
                ),
            ));
        }
        if self.sub_type == SubType::Exclusive && !self.slots.is_empty() {
            return Err(ServiceError::new(
                ServerError::ConsumerBusy,
                "Exclusive consumer is already connected",
            ));
        }
        if self.slots.len() >= self.max {
            return Err(ServiceError::new(
                ServerError::ConsumerBusy,
                format!("Subscription reached max consumers limit ({})", self.max),
            ));
        }
        let key = key_of(&info);
        if self.get(key).is_some() {
            return Err(ServiceError::new(
                ServerError::ConsumerBusy,
                "consumer id already attached",
            ));
        }
        if let Some(selector) = &mut self.selector {
            let hash = key_shared::consumer_hash(key);
            match (&info.sticky_ranges, selector.is_sticky()) {
                (Some(ranges), true) => selector.add(hash, ranges),
                (None, false) => selector.add(hash, &[]),
                _ => Err(key_shared::AssignError::ModeMismatch),
            }
            .map_err(|e| ServiceError::new(ServerError::ConsumerAssignError, e.to_string()))?;
        }
        let fence = if self.sub_type == SubType::KeyShared && !info.allow_out_of_order {
            fence_at
        } else {
            None
        };
        if self.slots.capacity() == 0 {
            // Most subscriptions have one consumer: room for one, not the
            // four a first push reserves (~200 bytes a slot).
            self.slots.reserve_exact(1);
        }
        self.slots.push(Slot {
            epoch: info.epoch,
            info,
            fence,
            permits: 0,
            last_flow_ms: 0,
            unacked: 0,
            msg_out: 0,
            flowed: false,
            told_end_of_topic: false,
        });
        assert!(
            self.slots.len() <= self.max,
            "consumers over the subscription's limit"
        );
        assert!(
            self.sub_type != SubType::Exclusive || self.slots.len() == 1,
            "two consumers on an Exclusive subscription"
        );
        Ok(())
    }

    /// Detaches a consumer; false if it was not attached.
    pub(crate) fn detach(&mut self, key: ConsumerKey) -> bool {
        let Some(index) = self.slots.iter().position(|s| key_of(&s.info) == key) else {
            return false;
        };
        self.slots.remove(index);
        if let Some(selector) = &mut self.selector {
            selector.remove(key_shared::consumer_hash(key));
        }
        true
    }

    /// Detaches every consumer and returns them.
    pub(crate) fn detach_all(&mut self) -> Vec<Slot> {
        let slots = std::mem::take(&mut self.slots);
        if let Some(selector) = &mut self.selector {
            for slot in &slots {
                selector.remove(key_shared::consumer_hash(key_of(&slot.info)));
            }
        }
        self.active = None;
        slots
    }

    /// Exclusive and Failover: the name of the consumer entries go to.
    pub(super) fn active_name(&self) -> Option<String> {
        let active = self.active?;
        self.slots
            .iter()
            .find(|s| key_of(&s.info) == active)
            .map(|s| s.info.name.clone())
    }

    /// True for Exclusive and Failover (one active consumer at a time).
    pub(crate) fn has_active_consumer(&self) -> bool {
        self.sub_type == SubType::Failover || self.sub_type == SubType::Exclusive
    }

    /// Failover/Exclusive: consumers sorted by (priority, name); the active
    /// one is the first, or for a partition `partition % count` among the
    /// highest-priority ones (as the Java broker spreads partitions).
    /// Returns the previous active consumer when it changed (its entries
    /// out go to the new one).
    pub(crate) fn choose_active(&mut self, partition: i32) -> Option<ConsumerKey> {
        let mut order: Vec<&Slot> = self.slots.iter().collect();
        order.sort_by(|a, b| {
            (a.info.priority_level, &a.info.name).cmp(&(b.info.priority_level, &b.info.name))
        });
        let top_priority = order.first().map(|s| s.info.priority_level);
        order.retain(|s| Some(s.info.priority_level) == top_priority);
        let best = if order.is_empty() {
            None
        } else {
            let index = usize::try_from(partition).map_or(0, |p| p % order.len());
            Some(key_of(&order[index].info))
        };
        let previous = (best != self.active).then_some(self.active).flatten();
        self.active = best;
        debug_assert!(self.active.is_none_or(|key| self.get(key).is_some()));
        previous
    }

    /// Failover: tells every consumer (clients ≥ v12) whether it is active.
    pub(crate) async fn announce_active(&self) {
        for (out, frame) in self.active_change_frames() {
            let _ = out.send(frame).await;
        }
    }

    /// Failover: the ACTIVE_CONSUMER_CHANGE frames telling every consumer
    /// (clients ≥ v12) whether it is active, with where each goes.
    pub(crate) fn active_change_frames(&self) -> Vec<(mpsc::Sender<Outbound>, Outbound)> {
        if self.sub_type != SubType::Failover {
            return Vec::new();
        }
        self.slots
            .iter()
            .filter(|slot| slot.info.protocol_version >= 12)
            .map(|slot| {
                let is_active = Some(key_of(&slot.info)) == self.active;
                let frame = codec::encode_command(CommandActiveConsumerChange {
                    consumer_id: slot.info.consumer_id,
                    is_active: Some(is_active),
                });
                (slot.info.out.clone(), frame)
            })
            .collect()
    }

    /// Key_Shared: lifts the fences that `still_fenced` no longer holds up.
    pub(crate) fn lift_fences(&mut self, still_fenced: impl Fn(Position) -> bool) {
        for slot in &mut self.slots {
            if slot.fence.is_some_and(|fence| !still_fenced(fence)) {
                slot.fence = None;
            }
        }
    }

    /// Key_Shared: the index of the consumer owning `slot`.
    pub(crate) fn selected_index(&self, slot: u32) -> Option<usize> {
        let selector = self.selector.as_ref()?;
        let owner = selector.select(slot % key_shared::HASH_RANGE_SIZE)?;
        self.slots
            .iter()
            .position(|s| key_shared::consumer_hash(key_of(&s.info)) == owner)
    }

    /// Who takes the entry at `pos` (Key_Shared slot `slot`) now; `stuck`:
    /// Key_Shared consumers already holding back an earlier entry.
    pub(crate) fn route(&mut self, slot: u32, pos: Position, stuck: &HashSet<usize>) -> Route {
        match self.sub_type {
            SubType::Exclusive | SubType::Failover => {
                let Some(active) = self.active else {
                    return Route::Stop;
                };
                match self.slots.iter().position(|s| key_of(&s.info) == active) {
                    Some(index) if self.takes(&self.slots[index]) => Route::Deliver(index),
                    _ => Route::Stop,
                }
            }
            SubType::Shared => {
                // Round robin among the consumers with permits of the best
                // (lowest) priority level, as the Java broker.
                let Some(level) = self
                    .slots
                    .iter()
                    .filter(|c| self.takes(c))
                    .map(|c| c.info.priority_level)
                    .min()
                else {
                    return Route::Stop;
                };
                let n = self.slots.len();
                for step in 0..n {
                    let index = (self.round_robin + step) % n;
                    let candidate = &self.slots[index];
                    if self.takes(candidate) && candidate.info.priority_level == level {
                        self.round_robin = (index + 1) % n;
                        return Route::Deliver(index);
                    }
                }
                Route::Stop
            }
            SubType::KeyShared => match self.selected_index(slot) {
                Some(index)
                    if self.takes(&self.slots[index])
                        && !stuck.contains(&index)
                        && self.slots[index].fence.is_none_or(|fence| pos < fence) =>
                {
                    Route::Deliver(index)
                }
                _ => Route::Hold,
            },
        }
    }
}
