//! What every producer of a connection shares, persistent topic or not:
//! the admission request of a PRODUCER (name, access mode, registration,
//! the PRODUCER_SUCCESS to answer) and the SEND_RECEIPT frame.
//! Owns: [`Admitting`] and [`receipt`]. Never: registers anything (the
//! topics do) or sends a frame.

use vela_wire::proto::{self, MessageIdData, ServerError};

use super::session::{NAME_BYTES_MAX, Session, client_metadata};
use crate::codec::{self, Outbound};
use crate::error::ServiceError;
use crate::schema;
use crate::topic::ProducerReg;
use crate::topic_name::TopicName;

/// What registering a producer on a topic takes, persistent or not: its
/// name (the client's, else a generated one), access mode, registration and
/// the PRODUCER_SUCCESS it gets (the "not ready" one for WaitForExclusive).
pub(super) struct Admitting {
    pub(super) name: String,
    pub(super) access_mode: proto::ProducerAccessMode,
    pub(super) reg: ProducerReg,
    pub(super) success: proto::CommandProducerSuccess,
    pub(super) not_ready: Outbound,
}

impl Admitting {
    pub(super) async fn new(
        session: &Session,
        body: &proto::CommandProducer,
        topic_name: &TopicName,
        last_sequence_id: impl Fn(&str) -> i64,
    ) -> Result<Admitting, ServiceError> {
        let schema_version = match &body.schema {
            Some(s) if !schema::is_empty_schema(s) => Some(
                session
                    .service
                    .schemas
                    .get_or_create(
                        topic_name,
                        s,
                        session.service.schema_strategy(topic_name).await?,
                    )
                    .await?,
            ),
            _ => None,
        };
        let name = match body.producer_name.as_deref() {
            Some(name) if name.len() > NAME_BYTES_MAX => {
                return Err(ServiceError::new(
                    ServerError::NotAllowedError,
                    "producer name longer than NAME_BYTES_MAX",
                ));
            }
            Some(name) if !name.is_empty() => name.to_string(),
            _ => session.service.next_producer_name(),
        };
        let access_mode = body
            .producer_access_mode
            .and_then(|m| proto::ProducerAccessMode::try_from(m).ok())
            .unwrap_or(proto::ProducerAccessMode::Shared);
        let reg = ProducerReg {
            conn_id: session.id,
            producer_id: body.producer_id,
            epoch: body.epoch.unwrap_or(0),
            topic_epoch: body.topic_epoch,
            exclusive: false,
            out: session.out.clone(),
            events: session.events_tx.clone(),
            address: std::sync::Arc::clone(&session.address),
            client_version: std::sync::Arc::clone(&session.client_version),
            metadata: client_metadata(&body.metadata)?,
            counters: Default::default(),
        };
        let success = proto::CommandProducerSuccess {
            request_id: body.request_id,
            producer_name: name.clone(),
            last_sequence_id: Some(last_sequence_id(&name)),
            // The Java client reads schema_version unconditionally; the Java
            // broker sends an empty one for a topic without schema.
            schema_version: Some(
                schema_version
                    .map(schema::encode_version)
                    .unwrap_or_default(),
            ),
            // The topic's producer table gives the epoch on admission.
            topic_epoch: None,
            producer_ready: Some(true),
        };
        // A waiting producer's "not ready" answer is queued by the topic
        // under its lock, so it always precedes the later "ready" one.
        let not_ready = codec::encode_command(proto::CommandProducerSuccess {
            producer_ready: Some(false),
            ..success.clone()
        });
        Ok(Admitting {
            name,
            access_mode,
            reg,
            success,
            not_ready,
        })
    }
}

pub(super) fn receipt(
    producer_id: u64,
    sequence_id: u64,
    highest_sequence_id: u64,
    ledger_id: u64,
    entry_id: u64,
) -> Outbound {
    codec::encode_command(proto::CommandSendReceipt {
        producer_id,
        sequence_id,
        message_id: Some(MessageIdData {
            ledger_id,
            entry_id,
            ..MessageIdData::default()
        }),
        highest_sequence_id: Some(highest_sequence_id),
    })
}
