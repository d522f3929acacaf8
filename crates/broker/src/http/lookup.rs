//! The HTTP lookup (Pulsar's `TopicLookup`): which broker serves a topic,
//! as Pulsar's `LookupData` (`admin::json::lookup_json`).
//! Never: redirects; the answer names the owner and the client goes there.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::routing::get;

use super::api::{ApiResult, Shared, topic_of};
use crate::ownership::LookupAnswer;
use crate::service::Service;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new().route(
        "/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}",
        get(lookup),
    )
}

async fn lookup(
    State(service): Shared,
    Path((domain, tenant, namespace, topic)): Path<(String, String, String, String)>,
) -> ApiResult<axum::Json<serde_json::Value>> {
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    let owner = match service.lookup(&topic, false).await? {
        LookupAnswer::Connect(owner) | LookupAnswer::Redirect(owner) => owner,
    };
    Ok(axum::Json(crate::admin::json::lookup_json(&owner)))
}
