//! PRODUCER and SUBSCRIBE whose topic is not open yet: the topic is opened
//! off the reader, by a task of its own (after the role's authorization
//! check: nothing is opened for a role that may not use it), and the
//! command comes back to its handler once the topic is open or failed.
//!
//! Why: opening a topic may take seconds to a minute (its ledger's recovery
//! fences a quorum of bookies and waits on unreachable ones), and official
//! clients put every producer and consumer on one connection per broker:
//! opening it inside the read loop stalls all the client's other topics.
//! Owns: [`DeferredLoads`] (the loads in flight, their bound, and the ids
//! they are for, so that a CLOSE_PRODUCER / CLOSE_CONSUMER meanwhile is
//! answered at once and the command then gets an error instead of creating
//! what the client closed).
//! Bounds: `DEFERRED_LOADS_MAX` loads per connection; past it a command
//! opens its topic inline, as before, which stops reading the connection
//! (back-pressure).
//! Never: creates a producer or consumer (the handlers do, on the reader);
//! defers a non-persistent topic's (made in place, nothing to open).

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::{Semaphore, mpsc};
use vela_wire::proto::{self, ServerError};

use super::session::{self, Session};
use crate::authorization::TopicAction;
use crate::error::ServiceError;
use crate::topic_name::{TopicDomain, TopicName};

/// Topic loads of one connection's PRODUCER and SUBSCRIBE commands running
/// off its read loop at once. Past it a command loads inline again, which
/// stops reading the connection (back-pressure).
pub(super) const DEFERRED_LOADS_MAX: usize = 64;

/// A PRODUCER or SUBSCRIBE whose topic is being opened off the read loop.
pub(super) enum Deferred {
    Producer(proto::CommandProducer),
    Subscribe(proto::CommandSubscribe),
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

/// The topic loads in flight for one connection.
pub(super) struct DeferredLoads {
    /// Permits for loads off the read loop (`DEFERRED_LOADS_MAX`).
    permits: Arc<Semaphore>,
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
            loaded_tx,
            loaded_rx,
            producers: HashMap::new(),
            consumers: HashMap::new(),
        }
    }

    /// Opens `topic` off the read loop when it is not served yet; the
    /// command (`command()`) comes back through [`DeferredLoads::recv`].
    /// False: handle the command now (the topic is open, its name is bad,
    /// or `DEFERRED_LOADS_MAX` loads run).
    pub(super) fn defer(
        &mut self,
        session: &Session,
        topic: &str,
        create: bool,
        action: TopicAction,
        command: impl FnOnce() -> Deferred,
    ) -> bool {
        let Ok(name) = TopicName::parse(topic) else {
            return false;
        };
        if name.domain == TopicDomain::NonPersistent {
            // Nothing to open: a non-persistent topic is made in place.
            return false;
        }
        if session
            .service
            .served_topic(&name.to_string())
            .is_some_and(|t| !t.log.is_closed())
        {
            return false;
        }
        let Ok(permit) = Arc::clone(&self.permits).try_acquire_owned() else {
            return false;
        };
        let command = command();
        self.track(&command);
        let service = Arc::clone(&session.service);
        let role = session.role().map(str::to_owned);
        let loaded = self.loaded_tx.clone();
        tokio::spawn(async move {
            let result = async {
                // Nothing is opened for a role that may not use the topic.
                session::authorize_role(&service, role.as_deref(), &name.namespace, action).await?;
                service.topic(&name, create).await.map(|_| ())
            }
            .await;
            drop(permit);
            // A closed connection dropped its receiver: nothing to answer.
            let _ = loaded.send(Loaded { command, result }).await;
        });
        true
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
}
