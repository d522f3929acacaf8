//! A subscription's replicated status, as Pulsar's
//! `PersistentTopicsBase.internalSet/GetReplicatedSubscriptionStatus`:
//! `POST .../{topic}/subscription/{sub}/replicatedSubscriptionStatus`
//! (body `true` or `false`; 204) and `GET` of the same path (200,
//! `{"<topic>": true}`, one entry per partition of a partitioned topic).
//! The status is kept on the subscription's cursor (`topic::replicated`),
//! so it outlives a restart.
//!
//! Owns: these two routes. Never: touches another cluster (each keeps its
//! own status, as Pulsar's does).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;

use super::api::{ApiError, ApiResult, Shared, no_content, topic_of};
use super::topics::{open, targets};
use crate::admin::json::parse_body;
use crate::service::Service;
use crate::subscription::ReplicatedStatusError;
use crate::topic::Topic;
use crate::topic_name::{TopicDomain, TopicName};

type SubscriptionPath = Path<(String, String, String, String, String)>;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new().route(
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/subscription/{subscription}\
         /replicatedSubscriptionStatus",
        get(get_status).post(set_status),
    )
}

/// The topic of the path, 405 with Pulsar's message for a non-persistent
/// one.
fn persistent_topic(
    path: &(String, String, String, String, String),
    refused: &str,
) -> ApiResult<TopicName> {
    let (domain, tenant, namespace, topic, _) = path;
    let topic = topic_of(domain, tenant, namespace, topic)?;
    if topic.domain != TopicDomain::Persistent {
        return Err(ApiError::new(StatusCode::METHOD_NOT_ALLOWED, refused));
    }
    Ok(topic)
}

fn status_error(error: ReplicatedStatusError) -> ApiError {
    let status = match &error {
        ReplicatedStatusError::NotFound { .. } => StatusCode::NOT_FOUND,
        ReplicatedStatusError::NotDurable => StatusCode::METHOD_NOT_ALLOWED,
        ReplicatedStatusError::Limit(_) => StatusCode::PRECONDITION_FAILED,
        ReplicatedStatusError::Persist(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    ApiError::new(status, error.to_string())
}

async fn set_status(
    State(service): Shared,
    Path(path): SubscriptionPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = persistent_topic(
        &path,
        "Cannot enable/disable replicated subscriptions on non-persistent topics",
    )?;
    let enabled: Option<bool> = parse_body(&body, "enabled")?;
    let Some(enabled) = enabled else {
        return Err(ApiError::bad_request(
            "Whether to enable replicated subscription is required",
        ));
    };
    let subscription = &path.4;
    // Every partition is checked before any is changed.
    let mut served: Vec<Arc<Topic>> = Vec::new();
    for target in targets(&service, &topic).await? {
        let partition = open(&service, &target).await?;
        partition
            .replicated_status(subscription)
            .map_err(status_error)?;
        served.push(partition);
    }
    for partition in served {
        partition
            .set_replicated(subscription, enabled)
            .await
            .map_err(status_error)?;
        tracing::info!(topic = %partition.full_name, %subscription, enabled,
            "replicated subscription status changed");
    }
    no_content()
}

async fn get_status(
    State(service): Shared,
    Path(path): SubscriptionPath,
) -> ApiResult<axum::Json<BTreeMap<String, bool>>> {
    let topic = persistent_topic(
        &path,
        "Cannot get replicated subscriptions on non-persistent topics",
    )?;
    let mut status = BTreeMap::new();
    for target in targets(&service, &topic).await? {
        let partition = open(&service, &target).await?;
        let replicated = partition.replicated_status(&path.4).map_err(status_error)?;
        status.insert(target.to_string(), replicated);
    }
    Ok(axum::Json(status))
}
