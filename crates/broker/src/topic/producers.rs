//! The producers of a topic: name uniqueness, access modes (Shared,
//! Exclusive, the WaitForExclusive queue, ExclusiveWithFencing) and
//! epoch-based replacement of a reconnecting producer.
//!
//! Owns: [`ProducerTable`] (registered producers and the waiting queue under
//! one lock, a leaf except for the dedup table's, taken when a waiting
//! producer gets the topic). Guarantees: a producer name is registered once;
//! an exclusive producer is the only one registered (checked in debug
//! builds); at most `WAITING_PRODUCERS_MAX` wait.
//! Never: appends or admits against quotas (the topic checks those first),
//! or blocks: frames to a producer's connection are `try_send`s.
//! Topic epochs (issue 20) belong here.

use std::collections::{HashMap, VecDeque};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use vela_wire::proto::{CommandCloseProducer, ProducerAccessMode, ServerError};

use crate::codec::{self, Outbound};
use crate::error::ServiceError;
use crate::stats::PublisherStats;
use crate::subscription::ConnEvent;

/// Producers waiting for exclusive access (WaitForExclusive), per topic.
/// When reached: PRODUCER gets ProducerBusy.
pub(crate) const WAITING_PRODUCERS_MAX: usize = 1000;

/// A producer registered on the topic.
#[derive(Debug, Clone)]
pub(crate) struct ProducerReg {
    /// Connection holding it.
    pub(crate) conn_id: u64,
    /// Its id on that connection.
    pub(crate) producer_id: u64,
    /// Reconnect epoch (a higher epoch replaces a lower one).
    pub(crate) epoch: u64,
    /// Exclusive access mode.
    pub(crate) exclusive: bool,
    /// The connection's outbound queue (for CLOSE_PRODUCER on replacement).
    pub(crate) out: mpsc::Sender<Outbound>,
    /// The connection's event queue.
    pub(crate) events: mpsc::Sender<ConnEvent>,
    /// Client address (stats).
    pub(crate) address: String,
    /// Client version (stats).
    pub(crate) client_version: String,
    /// PRODUCER's `metadata` (bounded by the connection), for stats.
    pub(crate) metadata: std::collections::BTreeMap<String, String>,
}

/// Outcome of registering a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// It may send now.
    Ready,
    /// WaitForExclusive: queued; answered later.
    Waiting,
}

#[derive(Debug)]
struct Waiter {
    name: String,
    reg: ProducerReg,
    request_id: u64,
}

/// Tells a producer's connection the broker closed it.
fn close_producer(reg: &ProducerReg) {
    let _ = reg
        .events
        .try_send(ConnEvent::ProducerClosed(reg.producer_id));
    let _ = reg
        .out
        .try_send(codec::encode_command(CommandCloseProducer {
            producer_id: reg.producer_id,
            request_id: u64::MAX,
            assigned_broker_service_url: None,
            assigned_broker_service_url_tls: None,
        }));
}

#[derive(Debug, Default)]
struct ProducerState {
    /// Producer name → its registration.
    registered: HashMap<String, ProducerReg>,
    /// WaitForExclusive producers, first come first served.
    waiting: VecDeque<Waiter>,
}

impl ProducerState {
    /// The access-mode invariants, checked after every change.
    fn check(&self) {
        debug_assert!(
            self.registered.len() <= 1 || self.registered.values().all(|r| !r.exclusive),
            "an exclusive producer shares its topic"
        );
        debug_assert!(self.waiting.len() <= WAITING_PRODUCERS_MAX);
    }
}

/// The producers of one topic.
#[derive(Debug)]
pub(crate) struct ProducerTable {
    /// Full topic name (for logs).
    topic: String,
    /// `TopicLimits::producers_max`.
    producers_max: usize,
    state: Mutex<ProducerState>,
}

impl ProducerTable {
    pub(crate) fn new(topic: String, producers_max: usize) -> ProducerTable {
        ProducerTable {
            topic,
            producers_max,
            state: Mutex::new(ProducerState::default()),
        }
    }

    /// True while a producer is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.state.lock().registered.is_empty()
    }

    /// Registers a producer under `name`. WaitForExclusive on a busy topic
    /// queues it (answered `Waiting`; a second PRODUCER_SUCCESS with
    /// `request_id` goes out when it gets the topic); ExclusiveWithFencing
    /// closes every other producer.
    pub(crate) fn add(
        &self,
        name: &str,
        reg: ProducerReg,
        access_mode: ProducerAccessMode,
        request_id: u64,
        not_ready_reply: Outbound,
    ) -> Result<Admission, ServiceError> {
        let mut state = self.state.lock();
        let admission = self.add_locked(
            &mut state,
            name,
            reg,
            access_mode,
            request_id,
            not_ready_reply,
        );
        state.check();
        admission
    }

    fn add_locked(
        &self,
        state: &mut ProducerState,
        name: &str,
        reg: ProducerReg,
        access_mode: ProducerAccessMode,
        request_id: u64,
        not_ready_reply: Outbound,
    ) -> Result<Admission, ServiceError> {
        let producers = &mut state.registered;
        if let Some(existing) = producers.get(name) {
            if existing.conn_id == reg.conn_id && existing.producer_id == reg.producer_id {
                return Ok(Admission::Ready);
            }
            if reg.epoch > existing.epoch {
                // A reconnect of the same producer: the old one is replaced.
                let exclusive = existing.exclusive;
                close_producer(existing);
                tracing::info!(topic = %self.topic, producer = name, "producer replaced by a newer epoch");
                producers.insert(name.to_string(), ProducerReg { exclusive, ..reg });
                return Ok(Admission::Ready);
            }
            return Err(ServiceError::new(
                ServerError::ProducerBusy,
                format!("Producer with name '{name}' is already connected to topic"),
            ));
        }
        let wants_exclusive = access_mode != ProducerAccessMode::Shared;
        if access_mode == ProducerAccessMode::ExclusiveWithFencing {
            for (_, other) in producers.drain() {
                close_producer(&other);
            }
            tracing::info!(topic = %self.topic, producer = name, "exclusive producer fenced the others");
        }
        let exclusive_holder = producers
            .iter()
            .find(|(_, r)| r.exclusive)
            .map(|(n, _)| n.clone());
        let busy = match &exclusive_holder {
            Some(_) => true,
            None => wants_exclusive && !producers.is_empty(),
        };
        if busy && access_mode == ProducerAccessMode::WaitForExclusive {
            let waiters = &mut state.waiting;
            if waiters.len() >= WAITING_PRODUCERS_MAX {
                return Err(ServiceError::new(
                    ServerError::ProducerBusy,
                    "WAITING_PRODUCERS_MAX producers wait for this topic",
                ));
            }
            if reg.out.try_send(not_ready_reply).is_err() {
                return Err(ServiceError::new(
                    ServerError::ServiceNotReady,
                    "connection outbound queue full, retry",
                ));
            }
            waiters.push_back(Waiter {
                name: name.to_string(),
                reg: ProducerReg {
                    exclusive: true,
                    ..reg
                },
                request_id,
            });
            return Ok(Admission::Waiting);
        }
        if let Some(holder) = exclusive_holder {
            return Err(ServiceError::new(
                ServerError::ProducerBusy,
                format!("exclusive producer '{holder}' is already connected"),
            ));
        }
        if busy {
            return Err(ServiceError::new(
                ServerError::ProducerBusy,
                "topic has existing shared producers",
            ));
        }
        if producers.len() >= self.producers_max {
            return Err(ServiceError::new(
                ServerError::ProducerBusy,
                format!("Topic reached max producers limit ({})", self.producers_max),
            ));
        }
        producers.insert(
            name.to_string(),
            ProducerReg {
                exclusive: wants_exclusive,
                ..reg
            },
        );
        Ok(Admission::Ready)
    }

    /// Removes a producer (registered or waiting) if it is still the same
    /// one; a freed topic goes to the first live waiting producer (told its
    /// `last_sequence_id`).
    pub(crate) fn remove(
        &self,
        name: &str,
        conn_id: u64,
        producer_id: u64,
        last_sequence_id: impl Fn(&str) -> i64,
    ) {
        let mut state = self.state.lock();
        let ProducerState {
            registered: producers,
            waiting: waiters,
        } = &mut *state;
        if producers
            .get(name)
            .is_some_and(|r| r.conn_id == conn_id && r.producer_id == producer_id)
        {
            producers.remove(name);
        }
        waiters.retain(|w| !(w.reg.conn_id == conn_id && w.reg.producer_id == producer_id));
        if producers.is_empty() {
            while let Some(waiter) = waiters.pop_front() {
                if waiter.reg.out.is_closed() {
                    continue;
                }
                let success = codec::encode_command(vela_wire::proto::CommandProducerSuccess {
                    request_id: waiter.request_id,
                    producer_name: waiter.name.clone(),
                    last_sequence_id: Some(last_sequence_id(&waiter.name)),
                    schema_version: Some(Bytes::new()),
                    topic_epoch: Some(0),
                    producer_ready: Some(true),
                });
                if waiter.reg.out.try_send(success).is_ok() {
                    tracing::info!(topic = %self.topic, producer = %waiter.name, "waiting exclusive producer got the topic");
                    producers.insert(waiter.name, waiter.reg);
                    break;
                }
            }
        }
        state.check();
    }

    /// Closes every registered producer (they reconnect and are admitted
    /// again or not); the waiting ones stay queued.
    pub(crate) fn disconnect_all(&self) {
        let producers: Vec<ProducerReg> = self
            .state
            .lock()
            .registered
            .drain()
            .map(|(_, r)| r)
            .collect();
        for reg in &producers {
            close_producer(reg);
        }
    }

    /// Closes every registered producer and forgets the waiting ones (the
    /// topic is closing).
    pub(crate) fn close_all(&self) {
        let producers: Vec<ProducerReg> = {
            let mut state = self.state.lock();
            state.waiting.clear();
            state.registered.drain().map(|(_, r)| r).collect()
        };
        for reg in &producers {
            close_producer(reg);
        }
    }

    /// The registered producers, by name.
    pub(crate) fn publishers(&self) -> Vec<PublisherStats> {
        let mut publishers: Vec<PublisherStats> = self
            .state
            .lock()
            .registered
            .iter()
            .map(|(name, reg)| PublisherStats {
                producer_name: name.clone(),
                producer_id: reg.producer_id,
                access_mode: if reg.exclusive { "Exclusive" } else { "Shared" }.to_string(),
                address: reg.address.clone(),
                client_version: reg.client_version.clone(),
                metadata: reg.metadata.clone(),
                msg_drop_rate: None,
            })
            .collect();
        publishers.sort_by(|a, b| a.producer_name.cmp(&b.producer_name));
        publishers
    }
}
