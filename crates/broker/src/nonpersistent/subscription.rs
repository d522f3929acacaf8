//! A non-persistent subscription: its consumers and the hand-off of each
//! message to one of them, or its drop.
//!
//! Owns: [`NpSubscription`] (consumers under a short lock, a leaf; the
//! drop and delivery counters). Who may take a message is the persistent
//! subscriptions' `subscription::Consumers` (Exclusive and Failover: the
//! active consumer; Shared: round robin among those with permits at the
//! best priority level; Key_Shared: the key's consumer). As in Pulsar's
//! non-persistent dispatchers, a message goes out only if that consumer has
//! permits, its connection's queue has room and the in-flight budgets take
//! its bytes; otherwise it is dropped and counted (`msgDropRate`).
//! Never: keeps a message, tracks acknowledgements or redelivers (acks are
//! answered and forgotten, as Pulsar's), or waits: frames go out with
//! `try_send`.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use vela_log::Position;
use vela_wire::proto::{CommandMessage, MessageIdData, command_subscribe::SubType};

use crate::codec::{self, Outbound};
use crate::error::ServiceError;
use crate::inflight::{ByteBudget, Charge};
use crate::key_shared;
use crate::stats::{ConsumerStats, RateMeter, SubscriptionStats};
use crate::subscription::{ConsumerInfo, ConsumerKey, Consumers, Route, key_of};

/// Frames to send once the lock is released (ACTIVE_CONSUMER_CHANGE).
pub(crate) type Notices = Vec<(mpsc::Sender<Outbound>, Outbound)>;

struct State {
    consumers: Consumers,
    /// Messages sent (a batch counts its messages).
    msg_out: u64,
    /// Entry bytes sent.
    bytes_out: u64,
    /// Messages dropped: no consumer could take them.
    dropped: u64,
    /// msg_out, bytes_out, dropped → rates.
    rates: RateMeter<3>,
}

/// One subscription of a non-persistent topic.
pub(crate) struct NpSubscription {
    /// Name.
    pub(crate) name: String,
    /// False for readers: the subscription goes with its last consumer.
    pub(crate) durable: bool,
    /// Partition index put in message ids (−1 if not a partition).
    partition: i32,
    state: Mutex<State>,
}

impl std::fmt::Debug for NpSubscription {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NpSubscription")
            .field("name", &self.name)
            .field("durable", &self.durable)
            .finish_non_exhaustive()
    }
}

/// Whether a message was handed to a consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// Queued on a consumer's connection.
    Sent,
    /// Dropped (counted).
    Dropped,
}

impl NpSubscription {
    pub(crate) fn new(
        name: String,
        durable: bool,
        sub_type: SubType,
        consumers_max: usize,
        partition: i32,
    ) -> NpSubscription {
        NpSubscription {
            name,
            durable,
            partition,
            state: Mutex::new(State {
                consumers: Consumers::new(sub_type, false, consumers_max),
                msg_out: 0,
                bytes_out: 0,
                dropped: 0,
                rates: RateMeter::new([0; 3]),
            }),
        }
    }

    /// Attaches a consumer (the first one fixes the type, as in Pulsar).
    pub(crate) fn add(
        &self,
        info: ConsumerInfo,
        sub_type: SubType,
    ) -> Result<Notices, ServiceError> {
        let mut state = self.state.lock();
        state.consumers.attach(info, sub_type, &self.name, None)?;
        Ok(self.pick_active(&mut state))
    }

    /// Detaches a consumer; whether it was attached, and who to tell about
    /// a new active consumer.
    pub(crate) fn remove(&self, key: ConsumerKey) -> (bool, Notices) {
        let mut state = self.state.lock();
        if !state.consumers.detach(key) {
            return (false, Vec::new());
        }
        (true, self.pick_active(&mut state))
    }

    fn pick_active(&self, state: &mut State) -> Notices {
        if !state.consumers.has_active_consumer() {
            return Vec::new();
        }
        state.consumers.choose_active(self.partition);
        state.consumers.active_change_frames()
    }

    /// FLOW: more permits for one consumer.
    pub(crate) fn flow(&self, key: ConsumerKey, permits: u32) {
        if let Some(slot) = self.state.lock().consumers.get_mut(key) {
            slot.permits = slot.permits.saturating_add(i64::from(permits));
            slot.flowed = true;
        }
    }

    /// True while no consumer is attached.
    pub(crate) fn is_empty(&self) -> bool {
        self.state.lock().consumers.is_empty()
    }

    /// True if consumers other than `key` are attached.
    pub(crate) fn has_others_than(&self, key: ConsumerKey) -> bool {
        self.state.lock().consumers.has_others_than(key)
    }

    /// Detaches every consumer (topic closed, subscription deleted): the
    /// caller tells each it was closed.
    pub(crate) fn detach_all(&self) -> Vec<ConsumerInfo> {
        let slots = self.state.lock().consumers.detach_all();
        slots.into_iter().map(|slot| slot.info).collect()
    }

    /// Hands a message (`messages` of them when a batch) to the consumer
    /// that may take it now, or drops it. Its bytes are charged to the
    /// topic's and the broker's in-flight budgets until written.
    pub(crate) fn deliver(
        &self,
        entry: &Bytes,
        messages: u32,
        topic_budget: &Arc<ByteBudget>,
        broker_budget: &Arc<ByteBudget>,
    ) -> Delivery {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let slot = if state.consumers.is_key_shared() {
            key_shared::entry_slot(entry)
        } else {
            0
        };
        let sent = match state
            .consumers
            .route(slot, Position::new(0, 0), &HashSet::new())
        {
            Route::Deliver(index) => {
                let consumer = state.consumers.at_mut(index);
                debug_assert!(consumer.permits > 0, "a delivery without permits");
                let header = codec::message_header(
                    CommandMessage {
                        consumer_id: consumer.info.consumer_id,
                        // Pulsar's non-persistent messages carry (0, 0).
                        message_id: MessageIdData {
                            ledger_id: 0,
                            entry_id: 0,
                            partition: Some(self.partition),
                            ..MessageIdData::default()
                        },
                        redelivery_count: None,
                        ack_set: Vec::new(),
                        consumer_epoch: consumer.epoch,
                    },
                    entry.len(),
                );
                let bytes = (header.len() + entry.len()) as u64;
                match Charge::take(topic_budget, broker_budget, bytes) {
                    Some(charge) => {
                        let frame = Outbound::Charged {
                            header,
                            entry: entry.clone(),
                            charge,
                        };
                        let queued = consumer.info.out.try_send(frame).is_ok();
                        if queued {
                            consumer.permits -= i64::from(messages);
                            consumer.msg_out += u64::from(messages);
                        }
                        queued
                    }
                    None => false,
                }
            }
            Route::Hold | Route::Stop => false,
        };
        if sent {
            state.msg_out += u64::from(messages);
            state.bytes_out += entry.len() as u64;
            Delivery::Sent
        } else {
            state.dropped += u64::from(messages);
            Delivery::Dropped
        }
    }

    /// Statistics of the subscription and its consumers (Pulsar reports
    /// non-persistent subscriptions as not durable).
    pub(crate) fn stats(&self) -> SubscriptionStats {
        let mut guard = self.state.lock();
        let state = &mut *guard;
        let [msg_rate_out, msg_throughput_out, msg_drop_rate] = state.rates.rates(
            Instant::now(),
            [state.msg_out, state.bytes_out, state.dropped],
        );
        // Pulsar's names are the protocol's enum names.
        let sub_type = state.consumers.sub_type().as_str_name();
        SubscriptionStats {
            name: self.name.clone(),
            sub_type: sub_type.to_string(),
            durable: false,
            msg_out_counter: state.msg_out,
            bytes_out_counter: state.bytes_out,
            msg_rate_out,
            msg_throughput_out,
            consumers: state
                .consumers
                .iter()
                .map(|slot| ConsumerStats {
                    consumer_name: slot.info.name.clone(),
                    available_permits: slot.permits,
                    unacked_messages: 0,
                    msg_out_counter: slot.msg_out,
                    address: slot.info.address.to_string(),
                    client_version: slot.info.client_version.to_string(),
                    last_flow_ms: slot.last_flow_ms,
                    metadata: slot.info.metadata.clone(),
                    joined_fence: None,
                })
                .collect(),
            msg_drop_rate: Some(msg_drop_rate),
            msg_drop_counter: state.dropped,
            ..SubscriptionStats::default()
        }
    }

    /// One consumer's statistics (CONSUMER_STATS); `None` if not attached.
    pub(crate) fn consumer_stats(&self, key: ConsumerKey) -> Option<ConsumerStats> {
        let state = self.state.lock();
        let slot = state.consumers.get(key)?;
        debug_assert_eq!(key_of(&slot.info), key);
        Some(ConsumerStats {
            consumer_name: slot.info.name.clone(),
            available_permits: slot.permits,
            unacked_messages: 0,
            msg_out_counter: slot.msg_out,
            address: slot.info.address.to_string(),
            client_version: slot.info.client_version.to_string(),
            last_flow_ms: slot.last_flow_ms,
            metadata: slot.info.metadata.clone(),
            joined_fence: None,
        })
    }
}
