//! PRODUCER and SUBSCRIBE whose topic is not open yet, and SUBSCRIBE that
//! creates its durable subscription: the topic is opened (and the new
//! subscription's cursor written) off the reader, by a task of its own
//! (after the role's authorization check: nothing is opened for a role that
//! may not use it), and the command comes back to its handler once that is
//! done or failed; the handler then writes nothing.
//!
//! Why: opening a topic may take seconds to a minute (its ledger's recovery
//! fences a quorum of bookies and waits on unreachable ones), a cursor's
//! creation is a metadata write (an fsync, an etcd round trip, or longer
//! when the store is slow), and official clients put every producer and
//! consumer on one connection per broker: waiting for either inside the
//! read loop stalls all the client's other topics (their LOOKUP and
//! PARTITIONED_METADATA too, which then time out).
//! Owns: [`DeferredLoads`] (the loads running, the commands waiting for a
//! load slot, their bounds, and the ids they are for, so that a
//! CLOSE_PRODUCER / CLOSE_CONSUMER meanwhile is answered at once and the
//! command then gets an error instead of creating what the client closed).
//! Bounds: `DEFERRED_LOADS_MAX` loads run per connection; past it commands
//! wait in arrival order, at most `DEFERRED_WAITING_MAX` of them and
//! `DEFERRED_WAITING_BYTES_MAX` bytes of commands; past those a command is
//! answered ServiceNotReady at once (the C++ and Java clients retry it; the
//! C++ client also reconnects). The reader never waits for a load. (Pulsar
//! queues topic loads past `maxConcurrentTopicLoadRequest` broker-wide and
//! answers lookups past `maxConcurrentLookupRequest` with TooManyRequests,
//! which the C++ client treats as fatal for a producer or consumer.)
//! Never: creates a producer or consumer (the handlers do, on the reader);
//! defers a non-persistent topic's (made in place, nothing to open).

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use prost::Message;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use vela_wire::proto::{self, ServerError};

use super::session::{self, Session};
use crate::authorization::TopicAction;
use crate::error::ServiceError;
use crate::topic::SubscribeRequest;
use crate::topic_name::{TopicDomain, TopicName};

/// Topic loads of one connection's PRODUCER and SUBSCRIBE commands running
/// off its read loop at once.
pub(super) const DEFERRED_LOADS_MAX: usize = 64;

/// Commands waiting for one of those loads, per connection (a client
/// creating hundreds of producers at once on one connection: the Python
/// client's asyncio API, partitioned topics of many partitions). Past it a
/// command is answered ServiceNotReady.
pub(super) const DEFERRED_WAITING_MAX: usize = 1024;

/// Encoded bytes of the commands waiting, per connection (a SUBSCRIBE's
/// metadata or a PRODUCER's schema may be large).
pub(super) const DEFERRED_WAITING_BYTES_MAX: usize = 8 << 20;

/// A PRODUCER or SUBSCRIBE whose topic is being opened off the read loop.
pub(super) enum Deferred {
    Producer(proto::CommandProducer),
    Subscribe(proto::CommandSubscribe),
}

impl Deferred {
    fn encoded_len(&self) -> usize {
        match self {
            Deferred::Producer(body) => body.encoded_len(),
            Deferred::Subscribe(body) => body.encoded_len(),
        }
    }
}

/// The command back on the connection once its topic is open (or failed).
pub(super) struct Loaded {
    command: Deferred,
    result: Result<(), ServiceError>,
}

/// Where a PRODUCER or SUBSCRIBE stands with its topic, for its handler.
pub(super) enum TopicOpening<'a> {
    /// The command just arrived: when its topic is not open, the handler
    /// hands it to these loads and answers nothing yet.
    Arrived(&'a mut DeferredLoads),
    /// The command came back from a load: its result (an error is the
    /// answer; Ok: the topic is open, handle the command).
    Opened(Result<(), ServiceError>),
}

/// A producer or consumer id with deferred commands in flight.
#[derive(Default)]
struct InFlight {
    commands: u32,
    /// CLOSE_PRODUCER / CLOSE_CONSUMER came meanwhile (answered at once, as
    /// for an unknown id): the deferred command must not open it after all.
    closed: bool,
}

/// Opening a topic (the authorization check first).
type Load = Pin<Box<dyn Future<Output = Result<(), ServiceError>> + Send>>;

/// A command waiting for a load slot, with its load not started yet.
struct Waiting {
    command: Deferred,
    bytes: usize,
    load: Load,
}

/// The topic loads in flight for one connection.
pub(super) struct DeferredLoads {
    /// Permits for loads off the read loop (`DEFERRED_LOADS_MAX`).
    permits: Arc<Semaphore>,
    /// Commands waiting for a permit, in arrival order.
    waiting: VecDeque<Waiting>,
    /// Their encoded bytes.
    waiting_bytes: usize,
    loaded_tx: mpsc::Sender<Loaded>,
    loaded_rx: mpsc::Receiver<Loaded>,
    /// Producer / consumer ids whose PRODUCER / SUBSCRIBE waits for its
    /// topic.
    producers: HashMap<u64, InFlight>,
    consumers: HashMap<u64, InFlight>,
}

impl DeferredLoads {
    pub(super) fn new() -> DeferredLoads {
        let (loaded_tx, loaded_rx) = mpsc::channel(DEFERRED_LOADS_MAX);
        DeferredLoads {
            permits: Arc::new(Semaphore::new(DEFERRED_LOADS_MAX)),
            waiting: VecDeque::new(),
            waiting_bytes: 0,
            loaded_tx,
            loaded_rx,
            producers: HashMap::new(),
            consumers: HashMap::new(),
        }
    }

    /// Opens `topic` off the read loop when it is not served yet, and for
    /// a SUBSCRIBE (`subscription`) writes what its attach would write (a
    /// new durable subscription's cursor, `Topic::prepare_subscription`),
    /// also on a topic already open; the command (`command()`) comes back
    /// through [`DeferredLoads::recv`]. `Ok(false)`: handle the command now
    /// (the topic is open and there is nothing to write, its name is bad,
    /// or it is non-persistent). `Err`: too many commands wait for their
    /// topic on this connection; the error is the answer. Never waits.
    pub(super) fn defer(
        &mut self,
        session: &Session,
        topic: &str,
        create: bool,
        action: TopicAction,
        subscription: Option<SubscribeRequest>,
        command: impl FnOnce() -> Deferred,
    ) -> Result<bool, ServiceError> {
        let Ok(name) = TopicName::parse(topic) else {
            return Ok(false);
        };
        if name.domain == TopicDomain::NonPersistent {
            // Nothing to open: a non-persistent topic is made in place.
            return Ok(false);
        }
        if let Some(open) = session.service.served_topic(&name.to_string())
            && !open.log.is_closed()
            && subscription
                .as_ref()
                .is_none_or(|request| !open.subscribe_writes(request))
        {
            return Ok(false);
        }
        let service = Arc::clone(&session.service);
        let role = session.role().map(str::to_owned);
        let load: Load = Box::pin(async move {
            // Nothing is opened for a role that may not use the topic.
            session::authorize_role(&service, role.as_deref(), &name.namespace, action).await?;
            let topic = service.topic(&name, create).await?;
            match subscription {
                Some(request) => topic.prepare_subscription(&request).await,
                None => Ok(()),
            }
        });
        self.admit(command(), load)?;
        Ok(true)
    }

    /// Starts `load` for `command` if a slot is free, else queues them
    /// (or refuses when the queue is full).
    fn admit(&mut self, command: Deferred, load: Load) -> Result<(), ServiceError> {
        if self.waiting.is_empty()
            && let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned()
        {
            self.track(&command);
            self.start(command, load, permit);
            return Ok(());
        }
        let bytes = command.encoded_len();
        if self.waiting.len() >= DEFERRED_WAITING_MAX
            || self.waiting_bytes + bytes > DEFERRED_WAITING_BYTES_MAX
        {
            return Err(ServiceError::new(
                ServerError::ServiceNotReady,
                format!(
                    "{} topic loads run and {} commands wait for theirs on this connection: \
                     retry later",
                    DEFERRED_LOADS_MAX,
                    self.waiting.len()
                ),
            ));
        }
        self.track(&command);
        self.waiting_bytes += bytes;
        self.waiting.push_back(Waiting {
            command,
            bytes,
            load,
        });
        Ok(())
    }

    /// Starts the waiting commands' loads while slots are free (a load
    /// that finished freed its slot before its command came back).
    pub(super) fn start_waiting(&mut self) {
        while !self.waiting.is_empty() {
            let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
                break;
            };
            let Some(next) = self.waiting.pop_front() else {
                break;
            };
            self.waiting_bytes -= next.bytes;
            self.start(next.command, next.load, permit);
        }
        debug_assert!(
            self.waiting.is_empty() || self.permits.available_permits() == 0,
            "commands wait while a load slot is free"
        );
        debug_assert_eq!(
            self.waiting_bytes,
            self.waiting.iter().map(|w| w.bytes).sum::<usize>()
        );
    }

    fn start(&mut self, command: Deferred, load: Load, permit: OwnedSemaphorePermit) {
        let loaded = self.loaded_tx.clone();
        tokio::spawn(async move {
            let result = load.await;
            drop(permit);
            // A closed connection dropped its receiver: nothing to answer.
            let _ = loaded.send(Loaded { command, result }).await;
        });
    }

    /// Counts `command` in flight for its producer or consumer id.
    fn track(&mut self, command: &Deferred) {
        let in_flight = match command {
            Deferred::Producer(body) => self.producers.entry(body.producer_id),
            Deferred::Subscribe(body) => self.consumers.entry(body.consumer_id),
        };
        in_flight.or_default().commands += 1;
    }

    /// The next load that finished (never None: this holds a sender).
    pub(super) async fn recv(&mut self) -> Option<Loaded> {
        self.loaded_rx.recv().await
    }

    /// Accounts for a finished load: its command, and the result its
    /// handler goes on with (an error when the client closed the producer
    /// or consumer meanwhile).
    pub(super) fn finish(&mut self, loaded: Loaded) -> (Deferred, Result<(), ServiceError>) {
        let Loaded { command, result } = loaded;
        let (in_flight, id) = match &command {
            Deferred::Producer(body) => (&mut self.producers, body.producer_id),
            Deferred::Subscribe(body) => (&mut self.consumers, body.consumer_id),
        };
        let mut closed = false;
        if let Some(entry) = in_flight.get_mut(&id) {
            debug_assert!(entry.commands > 0, "an id in flight without commands");
            entry.commands -= 1;
            closed = entry.closed;
            if entry.commands == 0 {
                in_flight.remove(&id);
            }
        }
        if closed {
            let error = ServiceError::new(
                ServerError::ServiceNotReady,
                "closed by the client while its topic was opening",
            );
            return (command, Err(error));
        }
        (command, result)
    }

    /// CLOSE_PRODUCER came: a PRODUCER for this id still waiting for its
    /// topic must not create it.
    pub(super) fn close_producer(&mut self, producer_id: u64) {
        if let Some(in_flight) = self.producers.get_mut(&producer_id) {
            in_flight.closed = true;
        }
    }

    /// CLOSE_CONSUMER came: as [`DeferredLoads::close_producer`].
    pub(super) fn close_consumer(&mut self, consumer_id: u64) {
        if let Some(in_flight) = self.consumers.get_mut(&consumer_id) {
            in_flight.closed = true;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn producer(producer_id: u64, request_id: u64) -> Deferred {
        Deferred::Producer(proto::CommandProducer {
            producer_id,
            request_id,
            ..proto::CommandProducer::default()
        })
    }

    fn subscribe(consumer_id: u64, request_id: u64) -> Deferred {
        Deferred::Subscribe(proto::CommandSubscribe {
            consumer_id,
            request_id,
            ..proto::CommandSubscribe::default()
        })
    }

    fn finish(loads: &mut DeferredLoads, command: Deferred) -> Result<(), ServiceError> {
        let loaded = Loaded {
            command,
            result: Ok(()),
        };
        loads.finish(loaded).1
    }

    #[test]
    fn a_command_comes_back_with_its_load_result() {
        let mut loads = DeferredLoads::new();
        loads.track(&producer(1, 10));
        let error = ServiceError::new(ServerError::TopicNotFound, "no such topic");
        let loaded = Loaded {
            command: producer(1, 10),
            result: Err(error),
        };
        let (command, result) = loads.finish(loaded);
        assert!(matches!(command, Deferred::Producer(b) if b.request_id == 10));
        assert_eq!(result.map_err(|e| e.code), Err(ServerError::TopicNotFound));
        assert!(loads.producers.is_empty(), "nothing left in flight");
    }

    #[test]
    fn closing_an_id_in_flight_fails_its_commands_and_only_its() {
        let mut loads = DeferredLoads::new();
        loads.track(&producer(1, 10));
        loads.track(&producer(1, 11));
        loads.track(&producer(2, 12));
        loads.track(&subscribe(1, 13));
        loads.close_producer(1);
        loads.close_consumer(7); // not in flight: nothing to mark
        let closed = |r: Result<(), ServiceError>| r.map_err(|e| e.code);
        assert_eq!(
            closed(finish(&mut loads, producer(1, 10))),
            Err(ServerError::ServiceNotReady)
        );
        assert!(finish(&mut loads, producer(2, 12)).is_ok());
        assert!(
            finish(&mut loads, subscribe(1, 13)).is_ok(),
            "a consumer id is apart"
        );
        assert_eq!(
            closed(finish(&mut loads, producer(1, 11))),
            Err(ServerError::ServiceNotReady)
        );
        assert!(loads.producers.is_empty() && loads.consumers.is_empty());
        // The id is free again: a later PRODUCER for it is not closed.
        loads.track(&producer(1, 14));
        assert!(finish(&mut loads, producer(1, 14)).is_ok());
    }

    /// A load that finishes once `gate` gives it a permit.
    fn gated(gate: &Arc<Semaphore>) -> Load {
        let gate = Arc::clone(gate);
        Box::pin(async move {
            gate.acquire()
                .await
                .map(|p| p.forget())
                .map_err(|_| ServiceError::new(ServerError::UnknownError, "gate closed"))
        })
    }

    fn producer_id(command: &Deferred) -> u64 {
        match command {
            Deferred::Producer(body) => body.producer_id,
            Deferred::Subscribe(body) => body.consumer_id,
        }
    }

    #[tokio::test]
    async fn past_the_running_loads_commands_wait_in_order_and_past_the_queue_are_refused() {
        let mut loads = DeferredLoads::new();
        let gate = Arc::new(Semaphore::new(0));
        let admitted = (DEFERRED_LOADS_MAX + DEFERRED_WAITING_MAX) as u64;
        for id in 0..admitted {
            // Never waits: the reader goes on with the next frame.
            loads.admit(producer(id, id), gated(&gate)).unwrap();
        }
        assert_eq!(loads.waiting.len(), DEFERRED_WAITING_MAX);
        let refused = loads.admit(producer(admitted, admitted), gated(&gate));
        assert_eq!(
            refused.map_err(|e| e.code),
            Err(ServerError::ServiceNotReady)
        );
        assert!(
            !loads.producers.contains_key(&admitted),
            "a refused command is not in flight"
        );

        // One load finishes: its command comes back, and the first command
        // waiting starts its load.
        gate.add_permits(1);
        let loaded = loads.recv().await.unwrap();
        let (command, result) = loads.finish(loaded);
        assert!(result.is_ok());
        assert!(producer_id(&command) < DEFERRED_LOADS_MAX as u64);
        loads.start_waiting();
        assert_eq!(loads.waiting.len(), DEFERRED_WAITING_MAX - 1);
        assert_eq!(
            loads.waiting.front().map(|w| producer_id(&w.command)),
            Some(DEFERRED_LOADS_MAX as u64 + 1),
            "waiting commands start in arrival order"
        );

        // Every other command comes back once.
        gate.add_permits(admitted as usize);
        let mut back = vec![producer_id(&command)];
        while back.len() < admitted as usize {
            let loaded = loads.recv().await.unwrap();
            let (command, result) = loads.finish(loaded);
            assert!(result.is_ok());
            back.push(producer_id(&command));
            loads.start_waiting();
        }
        back.sort_unstable();
        assert_eq!(back, (0..admitted).collect::<Vec<_>>());
        assert!(loads.waiting.is_empty() && loads.producers.is_empty());
        assert_eq!(loads.waiting_bytes, 0);
    }

    #[tokio::test]
    async fn the_waiting_commands_bytes_are_bounded() {
        let mut loads = DeferredLoads::new();
        let gate = Arc::new(Semaphore::new(0));
        for id in 0..DEFERRED_LOADS_MAX as u64 {
            loads.admit(producer(id, id), gated(&gate)).unwrap();
        }
        let large = |producer_id: u64| {
            Deferred::Producer(proto::CommandProducer {
                producer_id,
                request_id: producer_id,
                schema: Some(proto::Schema {
                    schema_data: vec![0; DEFERRED_WAITING_BYTES_MAX / 2].into(),
                    ..proto::Schema::default()
                }),
                ..proto::CommandProducer::default()
            })
        };
        loads.admit(large(100), gated(&gate)).unwrap();
        let refused = loads.admit(large(101), gated(&gate));
        assert_eq!(
            refused.map_err(|e| e.code),
            Err(ServerError::ServiceNotReady)
        );
        // A small one still fits.
        loads.admit(producer(102, 102), gated(&gate)).unwrap();
        assert_eq!(loads.waiting.len(), 2);
        gate.close();
    }
}
