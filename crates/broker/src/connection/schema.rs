//! Schema commands: GET_SCHEMA (a `lookup` grant) and GET_OR_CREATE_SCHEMA
//! (a `produce` grant) against the broker's schema registry.
//! Never: interprets schema data (`schema` decides compatibility).

use vela_wire::proto::{self, ServerError};

use super::session::{Close, Session};
use crate::authorization::TopicAction;
use crate::schema;
use crate::topic_name::TopicName;

pub(super) async fn on_get_schema(
    session: &Session,
    body: proto::CommandGetSchema,
) -> Result<(), Close> {
    let request_id = body.request_id;
    let result = async {
        let topic = TopicName::parse(&body.topic)?;
        session
            .authorize(&topic.namespace, TopicAction::Lookup)
            .await?;
        let version = body
            .schema_version
            .as_deref()
            .and_then(schema::decode_version);
        session.service.schemas.get(&topic, version).await
    }
    .await;
    let response = match result {
        Ok(Some((version, schema))) => proto::CommandGetSchemaResponse {
            request_id,
            error_code: None,
            error_message: None,
            schema: Some(schema),
            schema_version: Some(schema::encode_version(version)),
        },
        Ok(None) => proto::CommandGetSchemaResponse {
            request_id,
            error_code: Some(ServerError::TopicNotFound as i32),
            error_message: Some("Topic not found or no-schema".into()),
            schema: None,
            schema_version: None,
        },
        Err(e) => proto::CommandGetSchemaResponse {
            request_id,
            error_code: Some(e.code as i32),
            error_message: Some(e.message),
            schema: None,
            schema_version: None,
        },
    };
    session.send(response).await
}

pub(super) async fn on_get_or_create_schema(
    session: &Session,
    body: proto::CommandGetOrCreateSchema,
) -> Result<(), Close> {
    let request_id = body.request_id;
    let result = async {
        let topic = TopicName::parse(&body.topic)?;
        session
            .authorize(&topic.namespace, TopicAction::Produce)
            .await?;
        session
            .service
            .schemas
            .get_or_create(
                &topic,
                &body.schema,
                session.service.schema_strategy(&topic).await?,
            )
            .await
    }
    .await;
    let response = match result {
        Ok(version) => proto::CommandGetOrCreateSchemaResponse {
            request_id,
            error_code: None,
            error_message: None,
            schema_version: Some(schema::encode_version(version)),
        },
        Err(e) => proto::CommandGetOrCreateSchemaResponse {
            request_id,
            error_code: Some(e.code as i32),
            error_message: Some(e.message),
            schema_version: None,
        },
    };
    session.send(response).await
}
