//! The HTTP lookup (Pulsar's `TopicLookup`): which broker serves a topic,
//! as Pulsar's `LookupData` (`admin::json::lookup_json`), through the
//! advertised listener the client names (`?listenerName=`, else the
//! `X-Pulsar-ListenerName` header, as Pulsar takes them). A listener the
//! owner lacks is answered as Pulsar 4.0 answers it: 500 with its
//! "unexpected error" reason (the message, not Java's stack trace).
//! Never: redirects; the answer names the owner and the client goes there.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::routing::get;

use super::api::{ApiError, ApiResult, Params, Shared, topic_of};
use crate::ownership::LookupAnswer;
use crate::service::Service;

/// Pulsar's header naming the listener (`LISTENERNAME_HEADER`).
const LISTENER_NAME_HEADER: &str = "X-Pulsar-ListenerName";

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new().route(
        "/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}",
        get(lookup),
    )
}

async fn lookup(
    State(service): Shared,
    Path((domain, tenant, namespace, topic)): Path<(String, String, String, String)>,
    Query(params): Params,
    headers: HeaderMap,
) -> ApiResult<axum::Json<serde_json::Value>> {
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    let listener = params
        .get("listenerName")
        .map(String::as_str)
        .filter(|n| !n.is_empty())
        .or_else(|| {
            headers
                .get(LISTENER_NAME_HEADER)
                .and_then(|v| v.to_str().ok())
                .filter(|n| !n.is_empty())
        });
    let owner = match service.lookup(&topic, false).await? {
        LookupAnswer::Connect(owner) | LookupAnswer::Redirect(owner) => owner,
    };
    let urls = owner.urls_for(listener).map_err(|message| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "\n --- An unexpected error occurred in the server ---\n\nMessage: {message}\n"
            ),
        )
    })?;
    Ok(axum::Json(crate::admin::json::lookup_json(&urls)))
}
