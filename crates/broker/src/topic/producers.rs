//! The producers of a topic: name uniqueness, access modes (Shared,
//! Exclusive, the WaitForExclusive queue, ExclusiveWithFencing), the topic
//! epoch, and epoch-based replacement of a reconnecting producer.
//!
//! Access modes and the topic epoch follow Pulsar's
//! `AbstractTopic.incrementTopicEpochIfNeeded` / `handleProducerRemoved`:
//! - Shared: refused with ProducerBusy while an exclusive producer holds the
//!   topic or exclusive producers wait for it;
//! - Exclusive: refused with ProducerFenced (not retriable) while another
//!   exclusive producer holds the topic or waits, while shared producers are
//!   connected, or when the producer comes back with a topic epoch older
//!   than the topic's (someone else held the topic in between);
//! - WaitForExclusive: queued while the topic has any producer; promoted, in
//!   arrival order, when the holder goes;
//! - ExclusiveWithFencing: fails the waiting producers (ProducerFenced
//!   "Fenced out") and closes every connected one, then takes the topic;
//!   the fenced producers' reconnects meet an exclusive holder, or an epoch
//!   that moved on, and get ProducerFenced;
//! - every producer that takes the topic exclusively moves the topic epoch
//!   forward (or to the epoch it brings back from an earlier PRODUCER_SUCCESS)
//!   and is told it in PRODUCER_SUCCESS.topic_epoch, which clients send back
//!   when they reconnect.
//!
//! Owns: [`ProducerTable`] (registered producers, the waiting queue, the
//! exclusive holder and the topic epoch under one lock, a leaf except for
//! the dedup table's, taken when a waiting producer gets the topic).
//! Guarantees: a producer name is registered once; an exclusive producer is
//! the only one registered, and is the one `exclusive` names (checked in
//! debug builds); at most `WAITING_PRODUCERS_MAX` wait; the topic epoch never
//! goes back while the topic is served.
//! Never: appends or admits against quotas (the topic checks those first),
//! or blocks: frames to a producer's connection are `try_send`s.
//! The epoch lives as long as the topic is served (Pulsar also keeps it in
//! the managed ledger's properties, so it survives a reload there).

use std::collections::VecDeque;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::mpsc;
use vela_log::small_map::SmallMap;
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
    /// The topic epoch the client brings back from an earlier
    /// PRODUCER_SUCCESS (CommandProducer.topic_epoch), if any.
    pub(crate) topic_epoch: Option<u64>,
    /// Exclusive access mode.
    pub(crate) exclusive: bool,
    /// The connection's outbound queue (for CLOSE_PRODUCER on replacement).
    pub(crate) out: mpsc::Sender<Outbound>,
    /// The connection's event queue.
    pub(crate) events: mpsc::Sender<ConnEvent>,
    /// Client address (stats).
    pub(crate) address: Arc<str>,
    /// Client version (stats).
    pub(crate) client_version: Arc<str>,
    /// PRODUCER's `metadata` (bounded by the connection), for stats.
    pub(crate) metadata: std::collections::BTreeMap<String, String>,
    /// What it published (its connection counts; stats read).
    pub(crate) counters: Arc<crate::stats::PublisherCounters>,
}

/// Outcome of registering a producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Admission {
    /// It may send now; `topic_epoch` goes into PRODUCER_SUCCESS.
    Ready {
        /// The topic epoch (None: no producer ever held the topic
        /// exclusively while it was served).
        topic_epoch: Option<u64>,
    },
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

/// Fails a waiting producer's pending PRODUCER (ERROR with its request id)
/// and tells its connection the producer is gone.
fn fail_waiter(waiter: &Waiter, error: &ServiceError) {
    let _ = waiter
        .reg
        .events
        .try_send(ConnEvent::ProducerClosed(waiter.reg.producer_id));
    let _ = waiter
        .reg
        .out
        .try_send(codec::encode_command(vela_wire::proto::CommandError {
            request_id: waiter.request_id,
            error: error.code as i32,
            message: error.message.clone(),
        }));
}

fn fenced(message: impl Into<String>) -> ServiceError {
    ServiceError::new(ServerError::ProducerFenced, message)
}

#[derive(Debug, Default)]
struct ProducerState {
    /// Producer name → its registration, boxed (a hash map's first
    /// allocation, past a few producers, has room for 3). A `SmallMap`: a
    /// topic with one producer holds one 32-byte pair, not a hash map's
    /// ~150 bytes.
    registered: SmallMap<String, Box<ProducerReg>>,
    /// WaitForExclusive producers, first come first served.
    waiting: VecDeque<Waiter>,
    /// The producer holding the topic exclusively (Pulsar's
    /// `hasExclusiveProducer` + `exclusiveProducerName`).
    exclusive: Option<String>,
    /// The topic epoch: moves forward each time a producer takes the topic
    /// exclusively.
    topic_epoch: Option<u64>,
}

impl ProducerState {
    /// The access-mode invariants, checked after every change.
    fn check(&self) {
        debug_assert!(
            self.registered.len() <= 1 || self.registered.values().all(|r| !r.exclusive),
            "an exclusive producer shares its topic"
        );
        debug_assert!(
            self.exclusive
                .as_ref()
                .is_none_or(|name| self.registered.get(name).is_none_or(|r| r.exclusive)),
            "the exclusive holder is registered as shared"
        );
        debug_assert!(
            self.registered
                .iter()
                .all(|(name, r)| !r.exclusive || self.exclusive.as_deref() == Some(name.as_str())),
            "an exclusive producer is not the holder"
        );
        debug_assert!(self.waiting.len() <= WAITING_PRODUCERS_MAX);
    }

    /// The epoch a producer taking the topic gets: the one it brings back,
    /// else the next one.
    fn take_epoch(&mut self, brought: Option<u64>) -> u64 {
        let epoch = brought.unwrap_or_else(|| self.topic_epoch.map_or(0, |e| e + 1));
        debug_assert!(self.topic_epoch.is_none_or(|current| epoch >= current));
        self.topic_epoch = Some(epoch);
        epoch
    }

    /// ProducerFenced when `brought` is older than the topic epoch.
    fn check_epoch(&self, brought: Option<u64>) -> Result<(), ServiceError> {
        match (brought, self.topic_epoch) {
            (Some(brought), Some(current)) if brought < current => Err(fenced(format!(
                "Topic epoch has already moved. Current epoch: {current}, Producer epoch: {brought}"
            ))),
            _ => Ok(()),
        }
    }
}

/// The producers of one topic.
#[derive(Debug)]
pub(crate) struct ProducerTable {
    /// Full topic name (for logs), shared with the topic.
    topic: Arc<str>,
    /// `TopicLimits::producers_max`.
    producers_max: usize,
    state: Mutex<ProducerState>,
}

impl ProducerTable {
    pub(crate) fn new(topic: Arc<str>, producers_max: usize) -> ProducerTable {
        ProducerTable {
            topic,
            producers_max,
            state: Mutex::new(ProducerState::default()),
        }
    }

    /// The topic epoch, if a producer ever held the topic exclusively while
    /// it was served.
    pub(crate) fn topic_epoch(&self) -> Option<u64> {
        self.state.lock().topic_epoch
    }

    /// True while a producer is registered.
    pub(crate) fn is_empty(&self) -> bool {
        self.state.lock().registered.is_empty()
    }

    /// Registers a producer under `name` (the module doc has the rules).
    /// WaitForExclusive on a busy topic queues it (answered `Waiting`; a
    /// second PRODUCER_SUCCESS with `request_id` goes out when it gets the
    /// topic); ExclusiveWithFencing fences every other producer.
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
        if let Some(existing) = state.registered.get(name) {
            if existing.conn_id == reg.conn_id && existing.producer_id == reg.producer_id {
                return Ok(Admission::Ready {
                    topic_epoch: state.topic_epoch,
                });
            }
            if reg.epoch > existing.epoch {
                // A reconnect of the same producer: the old one is replaced
                // and keeps its hold on the topic.
                let exclusive = existing.exclusive;
                close_producer(existing);
                tracing::info!(topic = %self.topic, producer = name, "producer replaced by a newer epoch");
                state
                    .registered
                    .insert(name.to_string(), Box::new(ProducerReg { exclusive, ..reg }));
                return Ok(Admission::Ready {
                    topic_epoch: state.topic_epoch,
                });
            }
            // Pulsar checks the access mode first (below, for the other
            // modes), then the name.
            if access_mode == ProducerAccessMode::Shared {
                return Err(ServiceError::new(
                    ServerError::ProducerBusy,
                    format!("Producer with name '{name}' is already connected to topic"),
                ));
            }
        }
        let holder = state.exclusive.clone().unwrap_or_default();
        match access_mode {
            ProducerAccessMode::Shared => {
                if state.exclusive.is_some() || !state.waiting.is_empty() {
                    return Err(ServiceError::new(
                        ServerError::ProducerBusy,
                        format!("Topic has an existing exclusive producer: {holder}"),
                    ));
                }
                if state.registered.len() >= self.producers_max {
                    return Err(ServiceError::new(
                        ServerError::ProducerBusy,
                        format!("Topic reached max producers limit ({})", self.producers_max),
                    ));
                }
                state.registered.insert(
                    name.to_string(),
                    Box::new(ProducerReg {
                        exclusive: false,
                        ..reg
                    }),
                );
                Ok(Admission::Ready {
                    topic_epoch: state.topic_epoch,
                })
            }
            ProducerAccessMode::Exclusive => {
                if state.exclusive.is_some() || !state.waiting.is_empty() {
                    return Err(fenced(format!(
                        "Topic has an existing exclusive producer: {holder}"
                    )));
                }
                if !state.registered.is_empty() {
                    return Err(fenced("Topic has existing shared producers"));
                }
                state.check_epoch(reg.topic_epoch)?;
                Ok(self.take(state, name, reg))
            }
            ProducerAccessMode::ExclusiveWithFencing => {
                let fence = fenced("Fenced out");
                for waiter in state.waiting.drain(..) {
                    tracing::info!(topic = %self.topic, producer = %waiter.name, "waiting producer fenced out");
                    fail_waiter(&waiter, &fence);
                }
                for (other, reg) in state.registered.drain() {
                    tracing::info!(topic = %self.topic, producer = %other, by = name, "producer fenced out");
                    close_producer(&reg);
                }
                state.exclusive = None;
                state.check_epoch(reg.topic_epoch)?;
                Ok(self.take(state, name, reg))
            }
            ProducerAccessMode::WaitForExclusive => {
                if state.exclusive.is_some() || !state.registered.is_empty() {
                    if state.waiting.len() >= WAITING_PRODUCERS_MAX {
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
                    tracing::info!(topic = %self.topic, producer = name, "queuing producer: the topic has a producer");
                    state.waiting.push_back(Waiter {
                        name: name.to_string(),
                        reg,
                        request_id,
                    });
                    return Ok(Admission::Waiting);
                }
                state.check_epoch(reg.topic_epoch)?;
                Ok(self.take(state, name, reg))
            }
        }
    }

    /// `name` takes the topic exclusively, moving the topic epoch forward.
    fn take(&self, state: &mut ProducerState, name: &str, reg: ProducerReg) -> Admission {
        debug_assert!(state.registered.is_empty());
        let epoch = state.take_epoch(reg.topic_epoch);
        state.exclusive = Some(name.to_string());
        state.registered.insert(
            name.to_string(),
            Box::new(ProducerReg {
                exclusive: true,
                ..reg
            }),
        );
        tracing::debug!(topic = %self.topic, producer = name, epoch, "exclusive producer holds the topic");
        Admission::Ready {
            topic_epoch: Some(epoch),
        }
    }

    /// Removes a producer (registered or waiting) if it is still the same
    /// one; a freed topic goes to the first live waiting producer (told its
    /// `last_sequence_id` and the new topic epoch).
    pub(crate) fn remove(
        &self,
        name: &str,
        conn_id: u64,
        producer_id: u64,
        last_sequence_id: impl Fn(&str) -> i64,
    ) {
        let mut state = self.state.lock();
        if state
            .registered
            .get(name)
            .is_some_and(|r| r.conn_id == conn_id && r.producer_id == producer_id)
        {
            state.registered.remove(name);
            if state.exclusive.as_deref() == Some(name) {
                state.exclusive = None;
            }
        }
        state
            .waiting
            .retain(|w| !(w.reg.conn_id == conn_id && w.reg.producer_id == producer_id));
        if state.registered.is_empty() {
            self.promote_waiter(&mut state, last_sequence_id);
        }
        state.check();
    }

    /// Gives the free topic to the first waiting producer whose connection
    /// takes its PRODUCER_SUCCESS.
    fn promote_waiter(&self, state: &mut ProducerState, last_sequence_id: impl Fn(&str) -> i64) {
        debug_assert!(state.registered.is_empty() && state.exclusive.is_none());
        while let Some(waiter) = state.waiting.pop_front() {
            if waiter.reg.out.is_closed() {
                continue;
            }
            if let Err(error) = state.check_epoch(waiter.reg.topic_epoch) {
                fail_waiter(&waiter, &error);
                continue;
            }
            let epoch = state.topic_epoch.map_or(0, |e| e + 1);
            let epoch = waiter.reg.topic_epoch.unwrap_or(epoch);
            let success = codec::encode_command(vela_wire::proto::CommandProducerSuccess {
                request_id: waiter.request_id,
                producer_name: waiter.name.clone(),
                last_sequence_id: Some(last_sequence_id(&waiter.name)),
                schema_version: Some(Bytes::new()),
                topic_epoch: Some(epoch),
                producer_ready: Some(true),
            });
            if waiter.reg.out.try_send(success).is_ok() {
                tracing::info!(topic = %self.topic, producer = %waiter.name, epoch, "waiting exclusive producer got the topic");
                let name = waiter.name.clone();
                let taken = self.take(state, &name, waiter.reg);
                debug_assert_eq!(
                    taken,
                    Admission::Ready {
                        topic_epoch: Some(epoch)
                    }
                );
                break;
            }
        }
    }

    /// Closes every registered producer (they reconnect and are admitted
    /// again or not); the waiting ones stay queued.
    pub(crate) fn disconnect_all(&self) {
        let producers: Vec<ProducerReg> = {
            let mut state = self.state.lock();
            state.exclusive = None;
            state.registered.drain().map(|(_, r)| *r).collect()
        };
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
            state.exclusive = None;
            state.registered.drain().map(|(_, r)| *r).collect()
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
            .map(|(name, reg)| {
                let mut stats = PublisherStats {
                    producer_name: name.clone(),
                    producer_id: reg.producer_id,
                    access_mode: if reg.exclusive { "Exclusive" } else { "Shared" }.to_string(),
                    address: reg.address.to_string(),
                    client_version: reg.client_version.to_string(),
                    metadata: reg.metadata.clone(),
                    msg_drop_rate: None,
                    ..PublisherStats::default()
                };
                reg.counters.fill(&mut stats);
                stats
            })
            .collect();
        publishers.sort_by(|a, b| a.producer_name.cmp(&b.producer_name));
        publishers
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    struct Conn {
        out_rx: mpsc::Receiver<Outbound>,
        _events_rx: mpsc::Receiver<ConnEvent>,
        reg: ProducerReg,
    }

    fn conn(conn_id: u64, topic_epoch: Option<u64>) -> Conn {
        let (out, out_rx) = mpsc::channel(16);
        let (events, events_rx) = mpsc::channel(16);
        Conn {
            out_rx,
            _events_rx: events_rx,
            reg: ProducerReg {
                conn_id,
                producer_id: 1,
                epoch: 0,
                topic_epoch,
                exclusive: false,
                out,
                events,
                address: Arc::from(""),
                client_version: Arc::from(""),
                metadata: Default::default(),
                counters: Default::default(),
            },
        }
    }

    fn add(
        table: &ProducerTable,
        name: &str,
        c: &Conn,
        mode: ProducerAccessMode,
    ) -> Result<Admission, ServiceError> {
        let not_ready = codec::encode_command(vela_wire::proto::CommandSuccess {
            request_id: 0,
            schema: None,
        });
        table.add(name, c.reg.clone(), mode, 7, not_ready)
    }

    fn code(result: Result<Admission, ServiceError>) -> ServerError {
        result.unwrap_err().code
    }

    #[test]
    fn a_second_exclusive_producer_is_fenced_and_a_shared_one_busy() {
        let table = ProducerTable::new("t".into(), 10);
        let (a, b, c) = (conn(1, None), conn(2, None), conn(3, None));
        let first = add(&table, "a", &a, ProducerAccessMode::Exclusive).unwrap();
        assert_eq!(
            first,
            Admission::Ready {
                topic_epoch: Some(0)
            }
        );
        assert_eq!(
            code(add(&table, "b", &b, ProducerAccessMode::Exclusive)),
            ServerError::ProducerFenced
        );
        assert_eq!(
            code(add(&table, "c", &c, ProducerAccessMode::Shared)),
            ServerError::ProducerBusy
        );
        // The holder leaves: the next exclusive producer gets a newer epoch.
        table.remove("a", 1, 1, |_| -1);
        let next = add(&table, "b", &b, ProducerAccessMode::Exclusive).unwrap();
        assert_eq!(
            next,
            Admission::Ready {
                topic_epoch: Some(1)
            }
        );
    }

    #[test]
    fn exclusive_after_shared_producers_is_fenced() {
        let table = ProducerTable::new("t".into(), 10);
        let (a, b) = (conn(1, None), conn(2, None));
        add(&table, "a", &a, ProducerAccessMode::Shared).unwrap();
        assert_eq!(
            code(add(&table, "b", &b, ProducerAccessMode::Exclusive)),
            ServerError::ProducerFenced
        );
    }

    #[test]
    fn fencing_closes_the_holder_whose_reconnect_is_fenced() {
        let table = ProducerTable::new("t".into(), 10);
        let (mut a, b) = (conn(1, None), conn(2, None));
        add(&table, "a", &a, ProducerAccessMode::Exclusive).unwrap();
        let taken = add(&table, "b", &b, ProducerAccessMode::ExclusiveWithFencing).unwrap();
        assert_eq!(
            taken,
            Admission::Ready {
                topic_epoch: Some(1)
            }
        );
        assert!(
            a.out_rx.try_recv().is_ok(),
            "CLOSE_PRODUCER to the fenced one"
        );
        // Its reconnect brings epoch 0 back: fenced while b holds the topic,
        // and after b left too, since the epoch moved on.
        let again = conn(1, Some(0));
        assert_eq!(
            code(add(&table, "a", &again, ProducerAccessMode::Exclusive)),
            ServerError::ProducerFenced
        );
        table.remove("b", 2, 1, |_| -1);
        assert_eq!(
            code(add(&table, "a", &again, ProducerAccessMode::Exclusive)),
            ServerError::ProducerFenced
        );
        // A producer bringing the current epoch back gets the topic.
        let current = conn(4, Some(1));
        let back = add(&table, "b", &current, ProducerAccessMode::Exclusive).unwrap();
        assert_eq!(
            back,
            Admission::Ready {
                topic_epoch: Some(1)
            }
        );
    }

    #[test]
    fn waiting_producers_get_the_topic_in_order_and_fencing_fails_them() {
        let table = ProducerTable::new("t".into(), 10);
        let (a, mut b, mut c) = (conn(1, None), conn(2, None), conn(3, None));
        add(&table, "a", &a, ProducerAccessMode::Exclusive).unwrap();
        assert_eq!(
            add(&table, "b", &b, ProducerAccessMode::WaitForExclusive).unwrap(),
            Admission::Waiting
        );
        assert!(b.out_rx.try_recv().is_ok(), "not-ready answer");
        table.remove("a", 1, 1, |_| -1);
        assert!(
            b.out_rx.try_recv().is_ok(),
            "PRODUCER_SUCCESS when promoted"
        );
        assert_eq!(table.topic_epoch(), Some(1));
        assert_eq!(
            add(&table, "c", &c, ProducerAccessMode::WaitForExclusive).unwrap(),
            Admission::Waiting
        );
        assert!(c.out_rx.try_recv().is_ok(), "not-ready answer");
        let d = conn(4, None);
        add(&table, "d", &d, ProducerAccessMode::ExclusiveWithFencing).unwrap();
        assert!(
            c.out_rx.try_recv().is_ok(),
            "ERROR(ProducerFenced) to the waiter"
        );
        assert_eq!(table.topic_epoch(), Some(2));
    }
}
