//! Lookup commands: where a topic is served and what it is. LOOKUP (this
//! broker, or a redirect to the bundle's owner) and PARTITIONED_METADATA,
//! each after the role's `lookup` check.
//! Never: opens a topic (a lookup only names the broker that will).

use vela_wire::proto::ServerError;
use vela_wire::proto::{
    self, command_lookup_topic_response::LookupType,
    command_partitioned_topic_metadata_response::LookupType as MetadataResult,
};

use super::session::{Close, Session};
use crate::authorization::TopicAction;
use crate::error::ServiceError;
use crate::ownership::LookupAnswer;
use crate::topic_name::TopicName;

pub(super) async fn on_partitioned_metadata(
    session: &Session,
    body: proto::CommandPartitionedTopicMetadata,
) -> Result<(), Close> {
    let request_id = body.request_id;
    let result = async {
        let topic = TopicName::parse(&body.topic)?;
        session
            .authorize(&topic.namespace, TopicAction::Lookup)
            .await?;
        let partitions = session.service.partitions_of(&topic).await?;
        let auto_create = body.metadata_auto_creation_enabled.unwrap_or(true);
        let served_now = session
            .service
            .served_non_persistent(&topic.to_string())
            .is_some();
        if partitions == 0
            && !auto_create
            && !served_now
            && !session.service.admin.topic_exists(&topic).await?
        {
            return Err(ServiceError::new(
                ServerError::TopicNotFound,
                format!("Topic {topic} does not exist"),
            ));
        }
        Ok::<u32, ServiceError>(partitions)
    }
    .await;
    let response = match result {
        Ok(partitions) => proto::CommandPartitionedTopicMetadataResponse {
            partitions: Some(partitions),
            request_id,
            response: Some(MetadataResult::Success as i32),
            error: None,
            message: None,
        },
        Err(e) => proto::CommandPartitionedTopicMetadataResponse {
            partitions: Some(0),
            request_id,
            response: Some(MetadataResult::Failed as i32),
            error: Some(e.code as i32),
            message: Some(e.message),
        },
    };
    session.send(response).await
}

pub(super) async fn on_lookup(
    session: &Session,
    body: proto::CommandLookupTopic,
) -> Result<(), Close> {
    let request_id = body.request_id;
    let authoritative = body.authoritative.unwrap_or(false);
    // Go and C++ always send the field, often empty: that is no listener.
    let listener = body
        .advertised_listener_name
        .as_deref()
        .filter(|n| !n.trim().is_empty());
    let result = async {
        let topic = TopicName::parse(&body.topic)?;
        session
            .authorize(&topic.namespace, TopicAction::Lookup)
            .await?;
        let (owner, response) = match session.service.lookup(&topic, authoritative).await? {
            LookupAnswer::Connect(owner) => (owner, LookupType::Connect),
            LookupAnswer::Redirect(chosen) => (chosen, LookupType::Redirect),
        };
        // As Pulsar: a listener the owner does not have is ServiceNotReady.
        let urls = owner
            .urls_for(listener)
            .map_err(|message| ServiceError::new(ServerError::ServiceNotReady, message))?;
        Ok::<_, ServiceError>((urls, response))
    }
    .await;
    let response = match result {
        Ok((urls, response)) => {
            proto::CommandLookupTopicResponse {
                // A `pulsar+ssl://` client follows the TLS URL: each broker's
                // registration carries its own. A TLS-only broker has no
                // plain URL (absent, as Pulsar's).
                broker_service_url_tls: urls.service_url_tls,
                broker_service_url: urls.service_url,
                response: Some(response as i32),
                request_id,
                authoritative: Some(true),
                error: None,
                message: None,
                proxy_through_service_url: Some(false),
            }
        }
        Err(e) => proto::CommandLookupTopicResponse {
            broker_service_url: None,
            broker_service_url_tls: None,
            response: Some(LookupType::Failed as i32),
            request_id,
            authoritative: Some(false),
            error: Some(e.code as i32),
            message: Some(e.message),
            proxy_through_service_url: Some(false),
        },
    };
    session.send(response).await
}
