//! Producers and consumers of non-persistent topics on one connection:
//! what their commands do where they differ from persistent topics.
//!
//! A SEND is handed to the topic at once (`NonPersistentTopic::publish`)
//! and answered there and then, in order: SEND_RECEIPT (0, 0), or (-1, -1)
//! when the topic dropped it as it arrived, as Pulsar answers. Consumers:
//! FLOW adds permits; ACK is answered (when asked) and forgotten;
//! REDELIVER and SEEK change nothing (nothing is kept to send again: SEEK
//! answers SUCCESS as Pulsar does); GET_LAST_MESSAGE_ID is refused with
//! UnknownError, as Pulsar 4.0 refuses it on a non-persistent topic.
//! Owns: [`NpProducer`] and [`NpConsumer`] (each holding its topic).
//! Never: waits on a consumer or stores anything.

use std::sync::Arc;

use bytes::Bytes;
use vela_wire::SendCommand;
use vela_wire::proto::{self, ServerError, command_subscribe::SubType};

use super::admission::{Admitting, receipt};
use super::session::{Close, Session};
use crate::error::ServiceError;
use crate::nonpersistent::{NonPersistentTopic, Notices, NpSubscription, Published};
use crate::stats::ConsumerStats;
use crate::subscription::ConsumerInfo;
use crate::topic::{Admission, ConsumerSlot};
use crate::topic_name::TopicName;

/// A producer of a non-persistent topic.
pub(super) struct NpProducer {
    topic: Arc<NonPersistentTopic>,
    name: String,
    /// What it published, for stats (shared with its registration).
    counters: Arc<crate::stats::PublisherCounters>,
}

/// Registers a producer on a non-persistent topic (created on first use).
pub(super) async fn create_producer(
    session: &Session,
    body: &proto::CommandProducer,
    topic_name: &TopicName,
) -> Result<(NpProducer, Option<proto::CommandProducerSuccess>), ServiceError> {
    let topic = session
        .service
        .non_persistent_topic(topic_name, true)
        .await?;
    let admitting = Admitting::new(session, body, topic_name, |_| -1).await?;
    let name = admitting.name.clone();
    let success = admitting.success.clone();
    let counters = Arc::clone(&admitting.reg.counters);
    let admission = topic.add_producer(
        &name,
        admitting.reg,
        admitting.access_mode,
        body.request_id,
        admitting.not_ready,
    )?;
    tracing::debug!(conn = session.id, topic = %topic.full_name, producer = %name, "non-persistent producer created");
    let ready = match admission {
        Admission::Ready { topic_epoch } => Some(proto::CommandProducerSuccess {
            topic_epoch,
            ..success
        }),
        Admission::Waiting => None,
    };
    Ok((
        NpProducer {
            topic,
            name,
            counters,
        },
        ready,
    ))
}

/// A PRODUCER again for an id already in use: the same topic is a retry
/// (answered again), another one ProducerBusy.
pub(super) async fn producer_retry(
    session: &Session,
    existing: &NpProducer,
    body: &proto::CommandProducer,
) -> Result<(), Close> {
    let same =
        TopicName::parse(&body.topic).is_ok_and(|t| t.to_string() == existing.topic.full_name);
    if !same {
        let error = ServiceError::new(
            ServerError::ProducerBusy,
            "producer id already in use on this connection",
        );
        return session.send_error(body.request_id, error).await;
    }
    session
        .send(proto::CommandProducerSuccess {
            request_id: body.request_id,
            producer_name: existing.name.clone(),
            last_sequence_id: Some(-1),
            schema_version: Some(Bytes::new()),
            topic_epoch: None,
            producer_ready: Some(true),
        })
        .await
}

impl NpProducer {
    /// Publishes and answers at once (in SEND order: nothing else answers
    /// this producer). Past the topic's publish rate the connection stops
    /// reading for the pause, as for persistent topics.
    pub(super) async fn on_send(
        &self,
        session: &Session,
        send: SendCommand,
        entry: Bytes,
    ) -> Result<(), Close> {
        let messages = send.num_messages().unwrap_or(1).max(1) as u32;
        let pause = self.topic.publish_pause(messages, entry.len());
        let (ledger_id, entry_id) = match self.topic.publish(&self.name, &entry, messages) {
            Published::Accepted => {
                self.counters.record(messages, entry.len());
                (0, 0)
            }
            Published::Dropped => (u64::MAX, u64::MAX),
        };
        let highest_sequence_id = send.highest_sequence_id().unwrap_or(0);
        let frame = receipt(
            send.producer_id,
            send.sequence_id,
            highest_sequence_id,
            ledger_id,
            entry_id,
        );
        session
            .out
            .send(frame)
            .await
            .map_err(|_| Close("writer gone".into()))?;
        if let Some(pause) = pause {
            tokio::time::sleep(pause).await;
        }
        Ok(())
    }

    /// Removes it from its topic (CLOSE_PRODUCER, connection closing).
    pub(super) fn detach(&self, conn_id: u64, producer_id: u64) {
        self.topic.remove_producer(&self.name, conn_id, producer_id);
    }
}

/// A consumer of a non-persistent topic.
pub(super) struct NpConsumer {
    topic: Arc<NonPersistentTopic>,
    sub: Arc<NpSubscription>,
    /// Counts it against the topic's consumer limit until dropped.
    _slot: ConsumerSlot,
}

/// Attaches a consumer to a non-persistent topic (created on first use
/// when the client allows it).
pub(super) async fn subscribe(
    session: &Session,
    body: &proto::CommandSubscribe,
    topic_name: &TopicName,
    sub_type: SubType,
    info: ConsumerInfo,
) -> Result<(NpConsumer, Notices), ServiceError> {
    let create = body.force_topic_creation.unwrap_or(true);
    let topic = session
        .service
        .non_persistent_topic(topic_name, create)
        .await?;
    if body.read_compacted.unwrap_or(false) {
        return Err(ServiceError::new(
            ServerError::NotAllowedError,
            "readCompacted only valid on persistent topics",
        ));
    }
    if let Some(schema) = &body.schema
        && !crate::schema::is_empty_schema(schema)
    {
        let strategy = session.service.schema_strategy(topic_name).await?;
        session
            .service
            .schemas
            .check_consumer(topic_name, schema, strategy, !topic.has_producers())
            .await?;
    }
    let durable = body.durable.unwrap_or(true);
    let (sub, slot, notices) = topic.subscribe(&body.subscription, sub_type, durable, info)?;
    tracing::debug!(conn = session.id, topic = %topic.full_name, subscription = %sub.name, "non-persistent consumer created");
    let consumer = NpConsumer {
        topic,
        sub,
        _slot: slot,
    };
    Ok((consumer, notices))
}

impl NpConsumer {
    /// Full name of its topic.
    pub(super) fn topic_name(&self) -> &str {
        &self.topic.full_name
    }

    /// Its subscription's name.
    pub(super) fn subscription(&self) -> &str {
        &self.sub.name
    }

    pub(super) fn flow(&self, key: (u64, u64), permits: u32) {
        self.sub.flow(key, permits);
    }

    /// ACK: nothing to acknowledge; answered when the client asks (v17+).
    pub(super) async fn ack(
        &self,
        session: &Session,
        consumer_id: u64,
        request_id: Option<u64>,
    ) -> Result<(), Close> {
        let Some(request_id) = request_id else {
            return Ok(());
        };
        if session.protocol_version < 17 {
            return Ok(());
        }
        session
            .send(proto::CommandAckResponse {
                consumer_id,
                txnid_least_bits: None,
                txnid_most_bits: None,
                error: None,
                message: None,
                request_id: Some(request_id),
            })
            .await
    }

    /// Detaches it (CLOSE_CONSUMER, connection closing).
    pub(super) async fn detach(&self, key: (u64, u64)) {
        self.topic.remove_consumer(&self.sub, key).await;
    }

    /// UNSUBSCRIBE: the subscription goes (refused while others are
    /// attached, unless forced).
    pub(super) async fn unsubscribe(
        &self,
        key: (u64, u64),
        force: bool,
    ) -> Result<(), ServiceError> {
        self.topic
            .unsubscribe(&self.sub.name, Some(key), force)
            .await
            .map(|_| ())
    }

    pub(super) fn stats(&self, key: (u64, u64)) -> Option<ConsumerStats> {
        self.sub.consumer_stats(key)
    }
}

/// GET_LAST_MESSAGE_ID on a non-persistent topic: there is no last message
/// (Pulsar 4.0 answers UnknownError too).
pub(super) fn no_last_message_id() -> ServiceError {
    ServiceError::new(
        ServerError::UnknownError,
        "GetLastMessageId is not supported on non-persistent topics",
    )
}
