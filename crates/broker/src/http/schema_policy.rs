//! The `schemaCompatibilityStrategy` policy routes, as Pulsar serves them:
//! - namespace: `GET|PUT /admin/v2/namespaces/{tenant}/{ns}/schemaCompatibilityStrategy`
//!   (GET answers the namespace's own strategy, `UNDEFINED` when unset, as
//!   Pulsar 4.0 answers it (the broker default then applies); PUT takes a
//!   JSON string, `"FORWARD"`, and `"UNDEFINED"` unsets it);
//! - topic: `GET|PUT|DELETE /admin/v2/persistent/{tenant}/{ns}/{topic}/schemaCompatibilityStrategy`
//!   (GET answers the topic's own strategy, or nothing (`null`) when unset;
//!   with `?applied=true` the one that applies: the topic's, else the
//!   namespace's, else the broker default FULL).
//!
//! Stored: the namespace's in its policies, the topic's in the schema
//! registry. What the strategies mean is `schema::compat`.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::Value;

use super::api::{ApiError, ApiResult, Params, Shared, flag, namespace_of, no_content, topic_of};
use crate::schema::CompatibilityStrategy;
use crate::service::Service;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/schemaCompatibilityStrategy",
            get(get_namespace_strategy).put(set_namespace_strategy),
        )
        .route(
            "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/schemaCompatibilityStrategy",
            get(get_topic_strategy)
                .put(set_topic_strategy)
                .delete(remove_topic_strategy),
        )
}

/// A strategy from a request body: a JSON string (`"FULL"`) or its bare name.
fn parse_strategy(body: &[u8]) -> ApiResult<Option<CompatibilityStrategy>> {
    let text = std::str::from_utf8(body)
        .map_err(|_| ApiError::bad_request("the strategy is not UTF-8"))?
        .trim();
    let name = match serde_json::from_str::<Value>(text) {
        Ok(Value::String(name)) => name,
        _ => text.to_string(),
    };
    CompatibilityStrategy::parse(&name).map_err(ApiError::bad_request)
}

async fn tenant_must_exist(service: &Service, tenant: &str) -> ApiResult<()> {
    if service.admin.tenant_exists(tenant).await? {
        Ok(())
    } else {
        Err(ApiError::not_found("Tenant does not exist"))
    }
}

async fn get_namespace_strategy(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<axum::Json<Value>> {
    let ns = namespace_of(&tenant, &namespace)?;
    tenant_must_exist(&service, &tenant).await?;
    let policies = service
        .admin
        .namespace_policies(&ns)
        .await?
        .ok_or_else(|| ApiError::not_found("Namespace does not exist"))?;
    let strategy = policies
        .schema_compatibility_strategy
        .and_then(|name| CompatibilityStrategy::parse(&name).ok().flatten());
    let name = strategy.map_or(UNDEFINED, |s| s.name());
    Ok(axum::Json(Value::String(name.to_string())))
}

async fn set_namespace_strategy(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let ns = namespace_of(&tenant, &namespace)?;
    let strategy = parse_strategy(&body)?;
    tenant_must_exist(&service, &tenant).await?;
    let mut policies = service
        .admin
        .namespace_policies(&ns)
        .await?
        .ok_or_else(|| ApiError::not_found("Namespace does not exist"))?;
    policies.schema_compatibility_strategy = strategy.map(|s| s.name().to_string());
    service.admin.set_namespace_policies(&ns, &policies).await?;
    no_content()
}

/// The name Pulsar gives an unset strategy.
const UNDEFINED: &str = "UNDEFINED";

type TopicPath = Path<(String, String, String, String)>;

async fn get_topic_strategy(
    State(service): Shared,
    Path((domain, tenant, namespace, topic)): TopicPath,
    Query(params): Params,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    let strategy = if flag(&params, "applied") {
        Some(service.schema_strategy(&topic).await?)
    } else {
        service.schemas.topic_strategy(&topic).await?
    };
    Ok(axum::Json(strategy.map_or(Value::Null, |s| {
        Value::String(s.name().to_string())
    })))
}

async fn set_topic_strategy(
    State(service): Shared,
    Path((domain, tenant, namespace, topic)): TopicPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    let strategy = parse_strategy(&body)?;
    service.schemas.set_topic_strategy(&topic, strategy).await?;
    no_content()
}

async fn remove_topic_strategy(
    State(service): Shared,
    Path((domain, tenant, namespace, topic)): TopicPath,
) -> ApiResult<StatusCode> {
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    service.schemas.set_topic_strategy(&topic, None).await?;
    no_content()
}
