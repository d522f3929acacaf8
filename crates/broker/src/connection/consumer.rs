//! Consumers of one connection: SUBSCRIBE (and readers), FLOW, ACK,
//! REDELIVER_UNACKNOWLEDGED_MESSAGES, CLOSE_CONSUMER, UNSUBSCRIBE, SEEK,
//! GET_LAST_MESSAGE_ID and CONSUMER_STATS.
//!
//! Each consumer is attached to its subscription's task (`subscription`);
//! commands for it are forwarded there in arrival order, and MESSAGE frames
//! come back through the connection's outbound queue.
//! Owns: [`Consumers`] (this connection's consumers, each holding its place
//! in the topic's consumer count) and the translation of SUBSCRIBE into a
//! subscription request (reader start, Key_Shared ranges, names bounded).
//! Never: delivers or acknowledges anything itself (the subscription task
//! does), or waits on a subscription while holding a topic lock.

use std::collections::HashMap;
use std::sync::Arc;

use tokio::sync::oneshot;
use vela_log::Position;
use vela_wire::proto::{
    self, MessageIdData, ServerError,
    command_subscribe::{InitialPosition, SubType},
};

use super::deferred::{Deferred, TopicOpening};
use super::non_persistent::{self, NpConsumer};
use super::session::{Close, NAME_BYTES_MAX, Session, client_metadata};
use crate::authorization::TopicAction;
use crate::codec;
use crate::error::ServiceError;
use crate::nonpersistent::Notices;
use crate::schema;
use crate::subscription::{
    ConsumerInfo, ConsumerStatsSnapshot, SeekTarget, SubCommand, SubscriptionHandle,
};
use crate::topic::{ConsumerSlot, SubscribeRequest, Topic};
use crate::topic_name::{TopicDomain, TopicName};

struct ConnConsumer {
    topic: Arc<Topic>,
    sub: SubscriptionHandle,
    /// Counts it against the topic's consumer limit until dropped.
    _slot: ConsumerSlot,
}

/// The consumers open on one connection.
pub(super) struct Consumers {
    map: HashMap<u64, ConnConsumer>,
    /// Consumers of non-persistent topics.
    np: HashMap<u64, NpConsumer>,
}

impl Consumers {
    pub(super) fn new() -> Consumers {
        Consumers {
            map: HashMap::new(),
            np: HashMap::new(),
        }
    }

    /// The broker closed this consumer (seek, unsubscribe, topic close).
    pub(super) fn closed(&mut self, consumer_id: u64) {
        self.map.remove(&consumer_id);
        self.np.remove(&consumer_id);
    }

    /// Consumers open on this connection.
    fn len(&self) -> usize {
        self.map.len() + self.np.len()
    }

    /// Detaches every consumer (the connection is closing): each
    /// subscription replays what it had out to them.
    pub(super) async fn cleanup(&mut self, conn_id: u64) {
        let consumers: Vec<(u64, ConnConsumer)> = self.map.drain().collect();
        for (consumer_id, consumer) in consumers {
            let command = SubCommand::Remove {
                key: (conn_id, consumer_id),
                reply: None,
            };
            let _ = consumer.sub.tx.send(command).await;
        }
        let consumers: Vec<(u64, NpConsumer)> = self.np.drain().collect();
        for (consumer_id, consumer) in consumers {
            consumer.detach((conn_id, consumer_id)).await;
        }
    }

    /// `opening`: as for `Producers::on_producer`.
    pub(super) async fn on_subscribe(
        &mut self,
        session: &Session,
        body: proto::CommandSubscribe,
        opening: TopicOpening<'_>,
    ) -> Result<(), Close> {
        let request_id = body.request_id;
        let loads = match opening {
            TopicOpening::Arrived(loads) => Some(loads),
            TopicOpening::Opened(Ok(())) => None,
            TopicOpening::Opened(Err(e)) => return refuse(session, &body, e).await,
        };
        // A consumer id in use: the same SUBSCRIBE again succeeds, another
        // one is refused (either kind of topic).
        let existing = match (
            self.np.get(&body.consumer_id),
            self.map.get(&body.consumer_id),
        ) {
            (Some(np), _) => Some((np.subscription(), np.topic_name())),
            (None, Some(c)) => Some((c.sub.name.as_str(), &*c.topic.full_name)),
            (None, None) => None,
        };
        if let Some((subscription, topic_name)) = existing {
            if subscription == body.subscription
                && TopicName::parse(&body.topic).is_ok_and(|t| t.to_string() == topic_name)
            {
                return session.send_success(request_id).await;
            }
            return session
                .send_error(
                    request_id,
                    ServiceError::new(
                        ServerError::ConsumerBusy,
                        "consumer id already in use on this connection",
                    ),
                )
                .await;
        }
        if self.len() >= session.service.config.limits.consumers_max {
            return session
                .send_error(
                    request_id,
                    ServiceError::new(
                        ServerError::NotAllowedError,
                        "consumers_max reached on this connection",
                    ),
                )
                .await;
        }
        if let Some(loads) = loads {
            // A bad request opens nothing and creates nothing: its handling
            // below answers it.
            let subscription = subscribe_request(&body).ok();
            let deferred = loads.defer(
                session,
                &body.topic,
                body.force_topic_creation.unwrap_or(true),
                TopicAction::Consume,
                subscription,
                || Deferred::Subscribe(body.clone()),
            );
            match deferred {
                Ok(true) => return Ok(()),
                Ok(false) => {}
                Err(e) => return refuse(session, &body, e).await,
            }
        }
        match self.create_consumer(session, &body).await {
            Ok(notices) => {
                session.send_success(request_id).await?;
                // ACTIVE_CONSUMER_CHANGE after SUCCESS, as Pulsar sends them.
                for (out, frame) in notices {
                    let _ = out.send(frame).await;
                }
                Ok(())
            }
            Err(e) => refuse(session, &body, e).await,
        }
    }

    /// Attaches the consumer; what to send once SUBSCRIBE is answered.
    async fn create_consumer(
        &mut self,
        session: &Session,
        body: &proto::CommandSubscribe,
    ) -> Result<Notices, ServiceError> {
        let topic_name = TopicName::parse(&body.topic)?;
        session
            .authorize(&topic_name.namespace, TopicAction::Consume)
            .await?;
        check_subscription_name(body)?;
        if topic_name.domain == TopicDomain::NonPersistent {
            let sub_type = SubType::try_from(body.sub_type).map_err(|_| {
                ServiceError::new(ServerError::NotAllowedError, "unknown subscription type")
            })?;
            let info = consumer_info(session, body)?;
            let (consumer, notices) =
                non_persistent::subscribe(session, body, &topic_name, sub_type, info).await?;
            self.np.insert(body.consumer_id, consumer);
            debug_assert!(self.len() <= session.service.config.limits.consumers_max);
            return Ok(notices);
        }
        let topic = session
            .service
            .topic(&topic_name, body.force_topic_creation.unwrap_or(true))
            .await?;
        if let Some(s) = &body.schema
            && !schema::is_empty_schema(s)
        {
            let strategy = session.service.schema_strategy(&topic_name).await?;
            session
                .service
                .schemas
                .check_consumer(&topic_name, s, strategy, !topic.has_producers())
                .await?;
        }
        let request = subscribe_request(body)?;
        let info = consumer_info(session, body)?;
        debug_assert_eq!(request.sticky, info.sticky_ranges.is_some());
        let (sub, slot) = topic.subscribe(&request, info).await?;
        tracing::debug!(conn = session.id, topic = %topic.full_name, subscription = %sub.name, "consumer created");
        let previous = self.map.insert(
            body.consumer_id,
            ConnConsumer {
                topic,
                sub,
                _slot: slot,
            },
        );
        debug_assert!(previous.is_none(), "a consumer id registered twice");
        debug_assert!(self.map.len() <= session.service.config.limits.consumers_max);
        Ok(Vec::new())
    }

    pub(super) async fn on_flow(
        &mut self,
        session: &Session,
        body: proto::CommandFlow,
    ) -> Result<(), Close> {
        let permits = body.message_permits;
        if let Some(consumer) = self.np.get(&body.consumer_id) {
            consumer.flow((session.id, body.consumer_id), permits);
            return Ok(());
        }
        self.forward_to_subscription(session.id, body.consumer_id, |key| SubCommand::Flow {
            key,
            permits,
        })
        .await
    }

    pub(super) async fn on_ack(
        &mut self,
        session: &Session,
        body: proto::CommandAck,
    ) -> Result<(), Close> {
        if let Some(consumer) = self.np.get(&body.consumer_id) {
            return consumer
                .ack(session, body.consumer_id, body.request_id)
                .await;
        }
        // Transactional acks are held by the topic's pending acks until
        // their transaction ends; answered once durable.
        if body.txnid_most_bits.is_some() || body.txnid_least_bits.is_some() {
            let txn = (
                body.txnid_most_bits.unwrap_or(0),
                body.txnid_least_bits.unwrap_or(0),
            );
            let Some(consumer) = self.map.get(&body.consumer_id) else {
                return session
                    .send(proto::CommandAckResponse {
                        consumer_id: body.consumer_id,
                        txnid_least_bits: body.txnid_least_bits,
                        txnid_most_bits: body.txnid_most_bits,
                        error: Some(ServerError::ConsumerNotFound as i32),
                        message: Some(format!("Consumer {} not found", body.consumer_id)),
                        request_id: body.request_id,
                    })
                    .await;
            };
            let topic = Arc::clone(&consumer.topic);
            let subscription = consumer.sub.name.clone();
            let cumulative = body.ack_type == proto::command_ack::AckType::Cumulative as i32;
            // Awaited here: the reader waits for the durable record (the
            // client waits for the answer anyway), nothing queues unbounded.
            let result = topic
                .txn_ack(&subscription, txn, &body.message_id, cumulative)
                .await;
            if let Err(error) = &result {
                tracing::info!(topic = %topic.full_name, %subscription, ?txn, %error, "transactional ack refused");
            }
            let Some(request_id) = body.request_id else {
                return Ok(());
            };
            let (error, message) = match result {
                Ok(()) => (None, None),
                Err(e) => (Some(e.code as i32), Some(e.message)),
            };
            return session
                .send(proto::CommandAckResponse {
                    consumer_id: body.consumer_id,
                    txnid_least_bits: body.txnid_least_bits,
                    txnid_most_bits: body.txnid_most_bits,
                    error,
                    message,
                    request_id: Some(request_id),
                })
                .await;
        }
        let ack_type = proto::command_ack::AckType::try_from(body.ack_type)
            .unwrap_or(proto::command_ack::AckType::Individual);
        let ids = body.message_id;
        let request_id = body.request_id;
        self.forward_to_subscription(session.id, body.consumer_id, |key| SubCommand::Ack {
            key,
            ack_type,
            ids,
            request_id,
        })
        .await
    }

    pub(super) async fn on_redeliver(
        &mut self,
        session: &Session,
        body: proto::CommandRedeliverUnacknowledgedMessages,
    ) -> Result<(), Close> {
        if self.np.contains_key(&body.consumer_id) {
            return Ok(()); // nothing is kept to send again
        }
        let ids = body.message_ids;
        let epoch = body.consumer_epoch;
        self.forward_to_subscription(session.id, body.consumer_id, |key| SubCommand::Redeliver {
            key,
            ids,
            epoch,
        })
        .await
    }

    async fn forward_to_subscription(
        &mut self,
        conn_id: u64,
        consumer_id: u64,
        make: impl FnOnce((u64, u64)) -> SubCommand,
    ) -> Result<(), Close> {
        let Some(consumer) = self.map.get(&consumer_id) else {
            tracing::debug!(
                conn = conn_id,
                consumer_id,
                "command for an unknown consumer ignored"
            );
            return Ok(());
        };
        let _ = consumer.sub.tx.send(make((conn_id, consumer_id))).await;
        Ok(())
    }

    pub(super) async fn on_close_consumer(
        &mut self,
        session: &Session,
        body: proto::CommandCloseConsumer,
    ) -> Result<(), Close> {
        let (consumer_id, request_id) = (body.consumer_id, body.request_id);
        if let Some(consumer) = self.np.remove(&consumer_id) {
            consumer.detach((session.id, consumer_id)).await;
        }
        if let Some(consumer) = self.map.remove(&consumer_id) {
            let (reply, done) = oneshot::channel();
            let command = SubCommand::Remove {
                key: (session.id, consumer_id),
                reply: Some(reply),
            };
            if consumer.sub.tx.send(command).await.is_ok() {
                let _ = done.await;
            }
        }
        session.send_success(request_id).await
    }

    pub(super) async fn on_unsubscribe(
        &mut self,
        session: &Session,
        body: proto::CommandUnsubscribe,
    ) -> Result<(), Close> {
        if let Some(consumer) = self.np.get(&body.consumer_id) {
            let key = (session.id, body.consumer_id);
            return match consumer.unsubscribe(key, body.force.unwrap_or(false)).await {
                Ok(()) => {
                    self.np.remove(&body.consumer_id);
                    session.send_success(body.request_id).await
                }
                Err(e) => session.send_error(body.request_id, e).await,
            };
        }
        let Some(consumer) = self.map.get(&body.consumer_id) else {
            return session
                .send_error(
                    body.request_id,
                    ServiceError::new(ServerError::ConsumerNotFound, "unknown consumer"),
                )
                .await;
        };
        let (reply, answer) = oneshot::channel();
        let command = SubCommand::Unsubscribe {
            key: (session.id, body.consumer_id),
            force: body.force.unwrap_or(false),
            reply,
        };
        let result = match consumer.sub.tx.send(command).await {
            Ok(()) => answer.await.unwrap_or(Ok(())),
            Err(_) => Ok(()),
        };
        match result {
            Ok(()) => {
                if let Some(gone) = self.map.remove(&body.consumer_id)
                    && gone.sub.durable
                {
                    gone.topic.subscription_deleted(&gone.sub.name).await;
                }
                session.send_success(body.request_id).await
            }
            Err(e) => session.send_error(body.request_id, e).await,
        }
    }

    pub(super) async fn on_seek(
        &mut self,
        session: &Session,
        body: proto::CommandSeek,
    ) -> Result<(), Close> {
        if self.np.contains_key(&body.consumer_id) {
            // Nothing to go back to; Pulsar answers SUCCESS too.
            return session.send_success(body.request_id).await;
        }
        let Some(consumer) = self.map.get(&body.consumer_id) else {
            return session
                .send_error(
                    body.request_id,
                    ServiceError::new(ServerError::ConsumerNotFound, "unknown consumer"),
                )
                .await;
        };
        let target = match (&body.message_id, body.message_publish_time) {
            (Some(id), _) => SeekTarget::MessageId {
                ledger_id: id.ledger_id,
                entry_id: id.entry_id,
            },
            (None, Some(time_ms)) => SeekTarget::PublishTime(time_ms),
            (None, None) => {
                return session
                    .send_error(
                        body.request_id,
                        ServiceError::new(ServerError::NotAllowedError, "SEEK without a target"),
                    )
                    .await;
            }
        };
        let (reply, answer) = oneshot::channel();
        let result = match consumer
            .sub
            .tx
            .send(SubCommand::Seek { target, reply })
            .await
        {
            Ok(()) => answer.await.unwrap_or_else(|_| {
                Err(ServiceError::new(
                    ServerError::ServiceNotReady,
                    "subscription closed",
                ))
            }),
            Err(_) => Err(ServiceError::new(
                ServerError::ServiceNotReady,
                "subscription closed",
            )),
        };
        match result {
            Ok(()) => session.send_success(body.request_id).await,
            Err(e) => session.send_error(body.request_id, e).await,
        }
    }

    pub(super) async fn on_get_last_message_id(
        &mut self,
        session: &Session,
        body: proto::CommandGetLastMessageId,
    ) -> Result<(), Close> {
        let (consumer_id, request_id) = (body.consumer_id, body.request_id);
        if self.np.contains_key(&consumer_id) {
            let error = non_persistent::no_last_message_id();
            return session.send_error(request_id, error).await;
        }
        let Some(consumer) = self.map.get(&consumer_id) else {
            return session
                .send_error(
                    request_id,
                    ServiceError::new(ServerError::ConsumerNotFound, "unknown consumer"),
                )
                .await;
        };
        let topic = Arc::clone(&consumer.topic);
        let partition = topic.name.partition_index();
        let (reply, answer) = oneshot::channel();
        let mark_delete = match consumer.sub.tx.send(SubCommand::MarkDelete { reply }).await {
            Ok(()) => answer.await.ok().flatten(),
            Err(_) => None,
        };
        let last_message_id = match topic.log.last_confirmed() {
            Some(last) => {
                let batch_index = match topic.log.read(last, 1, usize::MAX).await {
                    Ok(entries) => entries
                        .first()
                        .filter(|e| e.position == last)
                        .and_then(|e| codec::entry_metadata(&e.data))
                        .and_then(|m| m.num_messages_in_batch)
                        .map(|n| n - 1),
                    Err(_) => None,
                };
                MessageIdData {
                    ledger_id: last.ledger_id,
                    entry_id: last.entry_id,
                    partition: Some(partition),
                    batch_index,
                    ..MessageIdData::default()
                }
            }
            None => MessageIdData {
                ledger_id: u64::MAX,
                entry_id: u64::MAX,
                partition: Some(partition),
                ..MessageIdData::default()
            },
        };
        session
            .send(proto::CommandGetLastMessageIdResponse {
                last_message_id,
                request_id,
                consumer_mark_delete_position: mark_delete.map(|p: Position| MessageIdData {
                    ledger_id: p.ledger_id,
                    entry_id: p.entry_id,
                    partition: Some(partition),
                    ..MessageIdData::default()
                }),
            })
            .await
    }

    pub(super) async fn on_consumer_stats(
        &mut self,
        session: &Session,
        body: proto::CommandConsumerStats,
    ) -> Result<(), Close> {
        let (consumer_id, request_id) = (body.consumer_id, body.request_id);
        if let Some(consumer) = self.np.get(&consumer_id) {
            let snapshot = consumer.stats((session.id, consumer_id));
            return session
                .send(consumer_stats_response(
                    request_id,
                    snapshot.map(|s| ConsumerStatsSnapshot {
                        available_permits: s.available_permits,
                        unacked_messages: 0,
                        backlog: 0,
                        name: s.consumer_name,
                        address: s.address,
                    }),
                ))
                .await;
        }
        let snapshot = match self.map.get(&consumer_id) {
            Some(consumer) => {
                let (reply, answer) = oneshot::channel();
                let key = (session.id, consumer_id);
                match consumer.sub.tx.send(SubCommand::Stats { key, reply }).await {
                    Ok(()) => answer.await.ok().flatten(),
                    Err(_) => None,
                }
            }
            None => None,
        };
        session
            .send(consumer_stats_response(request_id, snapshot))
            .await
    }
}

/// CONSUMER_STATS_RESPONSE for a snapshot (ConsumerNotFound without one).
fn consumer_stats_response(
    request_id: u64,
    snapshot: Option<ConsumerStatsSnapshot>,
) -> proto::CommandConsumerStatsResponse {
    match snapshot {
        Some(s) => proto::CommandConsumerStatsResponse {
            request_id,
            consumer_name: Some(s.name),
            available_permits: Some(u64::try_from(s.available_permits.max(0)).unwrap_or(0)),
            unacked_messages: Some(s.unacked_messages),
            blocked_consumer_on_unacked_msgs: Some(false),
            address: Some(s.address),
            msg_backlog: Some(s.backlog),
            msg_rate_out: Some(0.0),
            msg_throughput_out: Some(0.0),
            msg_rate_redeliver: Some(0.0),
            msg_rate_expired: Some(0.0),
            message_ack_rate: Some(0.0),
            ..proto::CommandConsumerStatsResponse::default()
        },
        None => proto::CommandConsumerStatsResponse {
            request_id,
            error_code: Some(ServerError::ConsumerNotFound as i32),
            error_message: Some("unknown consumer".into()),
            ..proto::CommandConsumerStatsResponse::default()
        },
    }
}

/// A subscription name a consumer may use: not empty, at most
/// `NAME_BYTES_MAX`, not a replicator's.
fn check_subscription_name(body: &proto::CommandSubscribe) -> Result<(), ServiceError> {
    if body.subscription.is_empty() || body.subscription.len() > NAME_BYTES_MAX {
        return Err(ServiceError::new(
            ServerError::NotAllowedError,
            "subscription name empty or longer than NAME_BYTES_MAX",
        ));
    }
    if body
        .subscription
        .starts_with(crate::topic::REPLICATOR_PREFIX)
    {
        // The replicators' cursors: a consumer acking one would drop what
        // is still to replicate (Pulsar refuses them too).
        return Err(ServiceError::new(
            ServerError::NotAllowedError,
            "Subscription with reserved subscription name attempted",
        ));
    }
    Ok(())
}

/// The subscription a SUBSCRIBE on a persistent topic asks for (its name
/// checked).
fn subscribe_request(body: &proto::CommandSubscribe) -> Result<SubscribeRequest, ServiceError> {
    check_subscription_name(body)?;
    let sub_type = SubType::try_from(body.sub_type).map_err(|_| {
        ServiceError::new(ServerError::NotAllowedError, "unknown subscription type")
    })?;
    let durable = body.durable.unwrap_or(true);
    let reader_start = if durable {
        None
    } else {
        reader_start(body.start_message_id.as_ref())
    };
    let sticky = body
        .key_shared_meta
        .as_ref()
        .is_some_and(|meta| meta.key_shared_mode == proto::KeySharedMode::Sticky as i32);
    Ok(SubscribeRequest {
        subscription: body.subscription.clone(),
        sub_type,
        durable,
        initial_earliest: body.initial_position == Some(InitialPosition::Earliest as i32),
        reader_start,
        sticky,
        read_compacted: body.read_compacted.unwrap_or(false),
        replicated: body.replicate_subscription_state.unwrap_or(false),
    })
}

/// A consumer as SUBSCRIBE describes it (names bounded, Key_Shared STICKY
/// ranges, whether its client understands REACHED_END_OF_TOPIC, its
/// metadata: refused past `CLIENT_METADATA_ENTRIES_MAX`).
fn consumer_info(
    session: &Session,
    body: &proto::CommandSubscribe,
) -> Result<ConsumerInfo, ServiceError> {
    let sticky_ranges = match &body.key_shared_meta {
        Some(meta) if meta.key_shared_mode == proto::KeySharedMode::Sticky as i32 => {
            Some(meta.hash_ranges.iter().map(|r| (r.start, r.end)).collect())
        }
        _ => None,
    };
    let allow_out_of_order = body
        .key_shared_meta
        .as_ref()
        .and_then(|m| m.allow_out_of_order_delivery)
        .unwrap_or(false);
    Ok(ConsumerInfo {
        conn_id: session.id,
        consumer_id: body.consumer_id,
        name: body
            .consumer_name
            .as_deref()
            .unwrap_or_default()
            .chars()
            .take(NAME_BYTES_MAX)
            .collect(),
        priority_level: body.priority_level.unwrap_or(0),
        out: session.out.clone(),
        events: session.events_tx.clone(),
        protocol_version: session.protocol_version,
        sticky_ranges,
        address: Arc::clone(&session.address),
        epoch: body.consumer_epoch,
        allow_out_of_order,
        handles_end_of_topic: session.handles_end_of_topic(),
        metadata: client_metadata(&body.metadata)?,
        client_version: Arc::clone(&session.client_version),
    })
}

async fn refuse(
    session: &Session,
    body: &proto::CommandSubscribe,
    error: ServiceError,
) -> Result<(), Close> {
    tracing::info!(conn = session.id, topic = %body.topic, subscription = %body.subscription, error = %error, "SUBSCRIBE refused");
    session.send_error(body.request_id, error).await
}

/// Reader start: the first position to deliver. Earliest (−1,−1) → the head;
/// latest or absent → `None` (after the last entry); any other id → that
/// entry itself. The Java broker turns every start id into a batch id and
/// steps back one entry, so the start entry is always delivered and the
/// client drops it unless its reader is inclusive (and drops the batch
/// indexes before the start index).
fn reader_start(start: Option<&MessageIdData>) -> Option<Position> {
    let id = start?;
    if id.ledger_id == u64::MAX && id.entry_id == u64::MAX {
        return Some(Position::new(0, 0));
    }
    if id.ledger_id == i64::MAX as u64 && id.entry_id == i64::MAX as u64 {
        return None;
    }
    if id.ledger_id > i64::MAX as u64 || id.entry_id > i64::MAX as u64 {
        // Other negative ids: treat as earliest.
        return Some(Position::new(0, 0));
    }
    Some(Position::new(id.ledger_id, id.entry_id))
}
