//! Producers of one connection: PRODUCER (admission on the topic), SEND
//! and its receipt, CLOSE_PRODUCER.
//!
//! A SEND is charged against the connection's pending bounds (semaphores:
//! when exhausted the reader waits, not reading, which pushes back on the
//! client through TCP) and issued to `Topic::publish` (checked against the
//! dedup table and appended before the next frame is read, so entries keep
//! SEND order: `topic::publish` states the invariant); a receipt job then
//! goes to the producer's `receipts::Receipts`: each append's completion
//! answers SEND_RECEIPT or SEND_ERROR itself (no task per SEND), strictly
//! in SEND order, asserting that positions increase.
//! CLOSE_PRODUCER is answered the same way, after every receipt in flight.
//! Owns: [`Producers`] (this connection's producers and the pending-send
//! bounds).
//! Never: waits for an append on the reader task, or answers a SEND out of
//! order.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::Instant;

use bytes::Bytes;
use tokio::sync::Semaphore;
use vela_wire::proto::{self, ServerError};
use vela_wire::{Command, SendCommand};

use super::admission::Admitting;
use super::deferred::{Deferred, TopicOpening};
use super::non_persistent::{self, NpProducer};
use super::receipts::{Awaited, ReceiptJob, Receipts};
use super::session::{Close, Session};
use crate::authorization::TopicAction;
use crate::error::ServiceError;
use crate::schema;
use crate::topic::{Admission, DedupCheck, Topic};
use crate::topic_name::{TopicDomain, TopicName};

/// Producer ids closed recently on one connection whose SENDs are ignored
/// (Pulsar's `recentlyClosedProducers`): SENDs the client had in flight
/// when the broker closed its producer (unload, termination) are expected
/// and must not close the connection. The oldest is forgotten first.
const RECENTLY_CLOSED_PRODUCERS_MAX: usize = 1000;

struct ConnProducer {
    topic: Arc<Topic>,
    name: String,
    /// What it published, for stats (shared with its registration).
    counters: Arc<crate::stats::PublisherCounters>,
    /// Its receipts, answered in SEND order.
    receipts: Arc<Receipts>,
}

/// The producers open on one connection and its pending-send bounds.
pub(super) struct Producers {
    map: HashMap<u64, ConnProducer>,
    /// Producers of non-persistent topics (no receipts: their SENDs
    /// are answered at once).
    np: HashMap<u64, NpProducer>,
    /// Ids closed recently, oldest first (`RECENTLY_CLOSED_PRODUCERS_MAX`).
    recently_closed: VecDeque<u64>,
    /// SENDs not yet answered (`ConnectionLimits::pending_sends_max`).
    pending_sends: Arc<Semaphore>,
    /// Bytes of SEND frames not yet answered
    /// (`ConnectionLimits::pending_send_bytes_max`).
    pending_bytes: Arc<Semaphore>,
}

impl Producers {
    pub(super) fn new(pending_sends_max: usize, pending_send_bytes_max: usize) -> Producers {
        Producers {
            map: HashMap::new(),
            np: HashMap::new(),
            recently_closed: VecDeque::new(),
            pending_sends: Arc::new(Semaphore::new(pending_sends_max)),
            pending_bytes: Arc::new(Semaphore::new(pending_send_bytes_max)),
        }
    }

    /// The broker closed this producer (a newer epoch replaced it): its
    /// appends in flight still answer their receipts as they complete.
    pub(super) fn closed(&mut self, producer_id: u64) {
        self.map.remove(&producer_id);
        self.np.remove(&producer_id);
        self.remember_closed(producer_id);
    }

    fn remember_closed(&mut self, producer_id: u64) {
        if self.recently_closed.len() >= RECENTLY_CLOSED_PRODUCERS_MAX {
            self.recently_closed.pop_front();
        }
        self.recently_closed.push_back(producer_id);
        debug_assert!(self.recently_closed.len() <= RECENTLY_CLOSED_PRODUCERS_MAX);
    }

    /// A SEND for a producer this connection does not have: ignored when
    /// it was closed recently (in flight then), else the connection closes.
    fn unknown_producer(&self, session: &Session, producer_id: u64) -> Result<(), Close> {
        if self.recently_closed.contains(&producer_id) {
            tracing::debug!(
                conn = session.id,
                producer_id,
                "SEND for a recently closed producer ignored"
            );
            return Ok(());
        }
        Err(Close(format!("SEND for unknown producer id {producer_id}")))
    }

    /// Producers open on this connection.
    fn len(&self) -> usize {
        self.map.len() + self.np.len()
    }

    /// Detaches every producer (the connection is closing).
    pub(super) fn cleanup(&mut self, conn_id: u64) {
        for (producer_id, producer) in self.map.drain() {
            producer
                .topic
                .remove_producer(&producer.name, conn_id, producer_id);
        }
        for (producer_id, producer) in self.np.drain() {
            producer.detach(conn_id, producer_id);
        }
    }

    /// `opening`: a PRODUCER that just arrived opens a topic not open yet
    /// off the reader (see `deferred`) and is handled again when it is.
    pub(super) async fn on_producer(
        &mut self,
        session: &Session,
        body: proto::CommandProducer,
        opening: TopicOpening<'_>,
    ) -> Result<(), Close> {
        let request_id = body.request_id;
        let producer_id = body.producer_id;
        let loads = match opening {
            TopicOpening::Arrived(loads) => Some(loads),
            TopicOpening::Opened(Ok(())) => None,
            TopicOpening::Opened(Err(e)) => return refuse(session, &body, e).await,
        };
        if let Some(existing) = self.np.get(&producer_id) {
            return non_persistent::producer_retry(session, existing, &body).await;
        }
        if let Some(existing) = self.map.get(&producer_id) {
            // A retry of a PRODUCER that already succeeded on this connection.
            if *existing.topic.full_name
                == TopicName::parse(&body.topic)
                    .map(|t| t.to_string())
                    .unwrap_or_default()
            {
                let name = existing.name.clone();
                let last_sequence_id = existing.topic.last_sequence_id(&name);
                return session
                    .send(proto::CommandProducerSuccess {
                        request_id,
                        producer_name: name,
                        last_sequence_id: Some(last_sequence_id),
                        schema_version: Some(Bytes::new()),
                        topic_epoch: existing.topic.topic_epoch(),
                        producer_ready: Some(true),
                    })
                    .await;
            }
            return session
                .send_error(
                    request_id,
                    ServiceError::new(
                        ServerError::ProducerBusy,
                        "producer id already in use on this connection",
                    ),
                )
                .await;
        }
        if self.len() >= session.service.config.limits.producers_max {
            return session
                .send_error(
                    request_id,
                    ServiceError::new(
                        ServerError::NotAllowedError,
                        "producers_max reached on this connection",
                    ),
                )
                .await;
        }
        if let Some(loads) = loads {
            let deferred = loads.defer(
                session,
                &body.topic,
                true,
                TopicAction::Produce,
                None,
                || Deferred::Producer(body.clone()),
            );
            match deferred {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return refuse(session, &body, e).await,
            }
        }
        match self.create_producer(session, &body).await {
            Ok(Some(success)) => session.send(success).await,
            Ok(None) => Ok(()),
            Err(e) => refuse(session, &body, e).await,
        }
    }

    async fn create_producer(
        &mut self,
        session: &Session,
        body: &proto::CommandProducer,
    ) -> Result<Option<proto::CommandProducerSuccess>, ServiceError> {
        let topic_name = TopicName::parse(&body.topic)?;
        session
            .authorize(&topic_name.namespace, TopicAction::Produce)
            .await?;
        if topic_name.domain == TopicDomain::NonPersistent {
            let (producer, success) =
                non_persistent::create_producer(session, body, &topic_name).await?;
            self.np.insert(body.producer_id, producer);
            debug_assert!(self.len() <= session.service.config.limits.producers_max);
            return Ok(success);
        }
        let topic = session.service.topic(&topic_name, true).await?;
        if body
            .producer_name
            .as_deref()
            .is_some_and(crate::topic::is_replicator)
        {
            // Its last sequence id must reflect what earlier replicators
            // sent before it is told one.
            topic
                .prepare_replicator(&session.service.config.cluster_name)
                .await?;
        }
        if let Some(subscription) = body
            .initial_subscription_name
            .as_deref()
            .filter(|s| !s.is_empty())
        {
            // Pulsar's ServerCnx.handleProducer: the producer creates the
            // subscription (at the earliest entry) so nothing it sends is
            // lost to a consumer that subscribes later (the dead-letter
            // topic's initial subscription); it needs consume permission.
            session
                .authorize(&topic_name.namespace, TopicAction::Consume)
                .await?;
            topic.create_initial_subscription(subscription).await?;
        }
        let without_schema = body.schema.as_ref().is_none_or(schema::is_empty_schema);
        if without_schema
            && topic.lifecycle_policies().limits.schema_validation_enforced
            && session.service.schemas.has_schema(&topic_name).await?
        {
            // The topic's or namespace's schemaValidationEnforced policy.
            return Err(ServiceError::new(
                ServerError::IncompatibleSchema,
                "Producers cannot connect or send message without a schema to topics with a \
                 schema if SchemaValidationEnforced is enabled",
            ));
        }
        let admission = Admitting::new(session, body, &topic_name, |name| {
            topic.last_sequence_id(name)
        })
        .await?;
        let name = admission.name.clone();
        let success = admission.success.clone();
        let counters = Arc::clone(&admission.reg.counters);
        let admission = topic.add_producer(
            &name,
            admission.reg,
            admission.access_mode,
            body.request_id,
            admission.not_ready,
        )?;
        let receipts = Receipts::new(
            body.producer_id,
            (Arc::clone(&topic), name.clone()),
            session.out.clone(),
            Arc::clone(&session.service),
            session.service.config.limits.pending_sends_max.max(1) + 1,
        );
        tracing::debug!(conn = session.id, topic = %topic.full_name, producer = %name, "producer created");
        let previous = self.map.insert(
            body.producer_id,
            ConnProducer {
                topic,
                name: name.clone(),
                counters,
                receipts,
            },
        );
        debug_assert!(previous.is_none(), "a producer id registered twice");
        debug_assert!(self.len() <= session.service.config.limits.producers_max);
        Ok(match admission {
            Admission::Ready { topic_epoch } => Some(proto::CommandProducerSuccess {
                topic_epoch,
                ..success
            }),
            Admission::Waiting => None,
        })
    }

    pub(super) async fn on_send(
        &mut self,
        session: &Session,
        received: Instant,
        body: SendCommand,
        entry: Bytes,
        frame_bytes: usize,
    ) -> Result<(), Close> {
        if let Some(producer) = self.np.get(&body.producer_id) {
            return producer.on_send(session, body, entry).await;
        }
        let Some(producer) = self.map.get(&body.producer_id) else {
            return self.unknown_producer(session, body.producer_id);
        };
        // A transactional SEND: the topic's buffer is readied first (one
        // metadata write per topic, ever), or the SEND is refused.
        let txn = match (body.txnid_most_bits(), body.txnid_least_bits()) {
            (None, None) => None,
            (most, least) => Some((most.unwrap_or(0), least.unwrap_or(0))),
        };
        if txn.is_some()
            && let Err(error) = producer.topic.prepare_txn_publish().await
        {
            let job = ReceiptJob::Error {
                sequence_id: body.sequence_id,
                code: error.code,
                message: error.message,
            };
            producer.receipts.push(job).await;
            return Ok(());
        }
        // The stored entry carries its transaction id (Go clients set it
        // only on the command); one copy, before its budget is reserved.
        let entry = match txn.map(|txn| crate::txn_buffer::with_txn_id(&entry, txn)) {
            None => entry,
            Some(Ok(tagged)) => tagged,
            Some(Err(error)) => {
                let job = ReceiptJob::Error {
                    sequence_id: body.sequence_id,
                    code: ServerError::NotAllowedError,
                    message: error.to_string(),
                };
                producer.receipts.push(job).await;
                return Ok(());
            }
        };
        let Some(producer) = self.map.get(&body.producer_id) else {
            return Ok(());
        };
        let receipts = Arc::clone(&producer.receipts);
        let topic = Arc::clone(&producer.topic);
        let sequence_id = body.sequence_id;
        let highest_sequence_id = body.highest_sequence_id().unwrap_or(0);
        // Size: the frame decoder already refused frames above
        // max_message_size + FRAME_PADDING_BYTES (closing the connection), as
        // the Java broker's frame decoder does; chunks of exactly
        // max_message_size plus their metadata must pass, so nothing more is
        // checked here.
        // Back-pressure: wait (not reading) until earlier sends drain.
        let bytes_limit = session.service.config.limits.pending_send_bytes_max;
        let bytes = u32::try_from(frame_bytes.min(bytes_limit)).unwrap_or(u32::MAX);
        let (Ok(send_permit), Ok(bytes_permit)) = (
            Arc::clone(&self.pending_sends).acquire_owned().await,
            Arc::clone(&self.pending_bytes)
                .acquire_many_owned(bytes)
                .await,
        ) else {
            return Err(Close("pending-send semaphores closed".into()));
        };
        // The broker-wide budget of appends in flight (all topics): wait
        // here too, not reading, while it is full.
        let append_permit = topic.log.reserve_append(entry.len()).await;
        let Some(producer) = self.map.get(&body.producer_id) else {
            return Ok(());
        };
        let messages = body.num_messages().unwrap_or(1).max(1) as u32;
        if let Some(max) = producer.topic.message_size_max()
            && entry.len() > max
        {
            // The topic's maxMessageSize policy (Pulsar answers the SEND
            // with NotAllowedError; the entry is not stored).
            let job = ReceiptJob::Error {
                sequence_id,
                code: ServerError::NotAllowedError,
                message: "Exceed maximum message size".into(),
            };
            receipts.push(job).await;
            return Ok(());
        }
        // Publish rate: past it, this connection stops reading for the pause
        // (Pulsar's throttling: TCP back-pressure, nothing refused).
        let pause = producer.topic.publish_pause(messages, entry.len());
        let entry_len = entry.len();
        let issued = Instant::now();
        session
            .service
            .metrics
            .issue_latency
            .record(issued.saturating_duration_since(received));
        let published = match txn {
            None => Ok(producer.topic.publish(
                &producer.name,
                sequence_id as i64,
                highest_sequence_id as i64,
                entry,
                messages,
                append_permit,
            )),
            Some(txn) => producer.topic.publish_txn(
                txn,
                &producer.name,
                sequence_id as i64,
                highest_sequence_id as i64,
                entry,
                messages,
                append_permit,
            ),
        };
        let published = match published {
            Ok(check) => {
                if matches!(check, DedupCheck::Appended(_)) {
                    producer.counters.record(messages, entry_len);
                }
                check
            }
            Err(error) => {
                let job = ReceiptJob::Error {
                    sequence_id,
                    code: error.code,
                    message: error.message,
                };
                receipts.push(job).await;
                return Ok(());
            }
        };
        let job = match published {
            DedupCheck::Duplicate => ReceiptJob::Duplicate {
                sequence_id,
                highest_sequence_id,
                _permits: (send_permit, bytes_permit),
            },
            // Its first copy is still in flight: the client re-sends later.
            DedupCheck::Unknown => ReceiptJob::Error {
                sequence_id,
                code: ServerError::PersistenceError,
                message: crate::topic::DEDUP_UNKNOWN_MESSAGE.into(),
            },
            DedupCheck::Appended(append) => ReceiptJob::Send {
                append,
                awaited: Awaited {
                    sequence_id,
                    highest_sequence_id,
                    received,
                    issued,
                    topic_metrics: Arc::clone(&producer.topic.metrics),
                    txn,
                    permits: (send_permit, bytes_permit),
                },
            },
        };
        receipts.push(job).await;
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        Ok(())
    }

    pub(super) async fn on_checksum_mismatch(
        &mut self,
        session: &Session,
        command: Command,
    ) -> Result<(), Close> {
        let Some(send) = command.as_send() else {
            return Err(Close("checksum mismatch on a non-SEND frame".into()));
        };
        tracing::warn!(
            conn = session.id,
            producer_id = send.producer_id,
            sequence_id = send.sequence_id,
            "SEND checksum mismatch"
        );
        if self.np.contains_key(&send.producer_id) {
            return session
                .send(proto::CommandSendError {
                    producer_id: send.producer_id,
                    sequence_id: send.sequence_id,
                    error: ServerError::ChecksumError as i32,
                    message: "Checksum failed on the broker".into(),
                })
                .await;
        }
        let Some(producer) = self.map.get(&send.producer_id) else {
            return self.unknown_producer(session, send.producer_id);
        };
        let job = ReceiptJob::Error {
            sequence_id: send.sequence_id,
            code: ServerError::ChecksumError,
            message: "Checksum failed on the broker".into(),
        };
        producer.receipts.push(job).await;
        Ok(())
    }

    pub(super) async fn on_close_producer(
        &mut self,
        session: &Session,
        body: proto::CommandCloseProducer,
    ) -> Result<(), Close> {
        self.remember_closed(body.producer_id);
        if let Some(producer) = self.np.remove(&body.producer_id) {
            producer.detach(session.id, body.producer_id);
            return session.send_success(body.request_id).await;
        }
        match self.map.remove(&body.producer_id) {
            Some(producer) => {
                producer
                    .topic
                    .remove_producer(&producer.name, session.id, body.producer_id);
                // SUCCESS goes out after every receipt in flight.
                producer
                    .receipts
                    .push(ReceiptJob::Close {
                        request_id: body.request_id,
                    })
                    .await;
                Ok(())
            }
            None => session.send_success(body.request_id).await,
        }
    }
}

async fn refuse(
    session: &Session,
    body: &proto::CommandProducer,
    error: ServiceError,
) -> Result<(), Close> {
    tracing::info!(conn = session.id, topic = %body.topic, error = %error, "PRODUCER refused");
    session.send_error(body.request_id, error).await
}
