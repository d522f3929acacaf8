//! Topic-level policies and topic properties (Pulsar's `PersistentTopics`
//! policy routes with `topicLevelPoliciesEnabled`): one route per entry of
//! `admin::policy_specs::POLICY_SPECS` that has a topic route, plus the
//! backlog quotas and `properties`.
//!
//! GET answers the topic's own value, or 204 without a body when it has none
//! (Pulsar's empty answer); with `?applied=true`, the value in force: the
//! topic's, else its namespace's, else the broker's where Vela has one.
//! POST (or PUT) checks and stores the value, then applies it to the served
//! topic (`Service::apply_topic_record`); DELETE removes it. `isGlobal` is
//! accepted and means nothing here (one cluster). A partitioned topic's
//! policies are its base name's, shared by its partitions.
//! Never: keeps state; every value is in the topic's record in the store.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde_json::{Value, json};

use super::api::{ApiError, ApiResult, Params, Shared, no_content, topic_of};
use crate::admin::json::{BacklogQuotaJson, PersistenceJson, RetentionJson, parse_body};
use crate::admin::policy_specs::{POLICY_SPECS, PolicySpec, Rejected};
use crate::admin::{BacklogQuota, PROPERTY_BYTES_MAX, TopicRecord};
use crate::service::Service;
use crate::topic_name::TopicName;

type TopicPath = Path<(String, String, String, String)>;

const T: &str = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}";

pub(super) fn routes() -> Router<Arc<Service>> {
    let mut router = Router::new()
        .route(&format!("{T}/backlogQuotaMap"), get(get_backlog_quotas))
        .route(
            &format!("{T}/backlogQuota"),
            post(set_backlog_quota).delete(remove_backlog_quota),
        )
        .route(
            &format!("{T}/properties"),
            get(get_properties)
                .put(update_properties)
                .post(update_properties)
                .delete(remove_property),
        );
    for spec in POLICY_SPECS {
        let Some(route) = spec.topic_route else {
            continue;
        };
        router = router.route(
            &format!("{T}/{route}"),
            get(move |state, path, query| get_policy(spec, state, path, query))
                .post(move |state, path, query, body| set_policy(spec, state, path, query, body))
                .put(move |state, path, query, body| set_policy(spec, state, path, query, body))
                .delete(move |state, path| remove_policy(spec, state, path)),
        );
    }
    router
}

impl From<Rejected> for ApiError {
    fn from(rejected: Rejected) -> ApiError {
        let status = if rejected.precondition {
            StatusCode::PRECONDITION_FAILED
        } else {
            StatusCode::BAD_REQUEST
        };
        ApiError::new(status, rejected.reason)
    }
}

/// A policy value as Pulsar answers it: the JSON, or 204 without a body.
pub(super) fn policy_answer(value: Option<Value>) -> Response {
    match value {
        Some(value) => axum::Json(value).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    }
}

/// The topic named by the path, which must exist (Pulsar: 404 "Topic not
/// found"); a partition names its partitioned topic.
async fn existing_topic(
    service: &Service,
    path: &(String, String, String, String),
) -> ApiResult<TopicName> {
    let topic = topic_of(&path.0, &path.1, &path.2, &path.3)?.base();
    if service
        .admin
        .namespace_policies(&topic.namespace)
        .await?
        .is_none()
    {
        return Err(ApiError::not_found("Namespace does not exist"));
    }
    let exists = service.admin.partitions(&topic).await?.is_some()
        || service.admin.topic_exists(&topic).await?;
    if !exists {
        return Err(ApiError::not_found("Topic not found"));
    }
    Ok(topic)
}

/// Refuses topics past the namespace's `maxTopicsPerNamespace` (412, as
/// Pulsar's REST answers it).
pub(super) async fn check_topic_quota(
    service: &Service,
    topic: &TopicName,
    adding: usize,
) -> ApiResult<()> {
    let Some(policies) = service.admin.namespace_policies(&topic.namespace).await? else {
        return Ok(());
    };
    service
        .check_topic_quota(topic, &policies, adding)
        .await
        .map_err(|e| ApiError::new(StatusCode::PRECONDITION_FAILED, e.message))
}

/// Stores the properties a topic was created with.
pub(super) async fn store_properties(
    service: &Service,
    topic: &TopicName,
    properties: Option<BTreeMap<String, String>>,
) -> ApiResult<()> {
    let Some(properties) = properties.filter(|p| !p.is_empty()) else {
        return Ok(());
    };
    check_properties(&properties)?;
    service
        .admin
        .update_topic_record(topic, |record| {
            record.properties.extend(properties.clone());
            Ok(())
        })
        .await?;
    Ok(())
}

fn check_properties(properties: &BTreeMap<String, String>) -> ApiResult<()> {
    if properties
        .iter()
        .any(|(k, v)| k.is_empty() || k.len() > PROPERTY_BYTES_MAX || v.len() > PROPERTY_BYTES_MAX)
    {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            format!("property keys must be 1..={PROPERTY_BYTES_MAX} bytes, values at most that"),
        ));
    }
    Ok(())
}

/// Changes the topic's record and applies it to the served topic.
async fn update(
    service: &Service,
    topic: &TopicName,
    change: impl Fn(&mut TopicRecord) -> Result<(), crate::admin::AdminError>,
) -> ApiResult<StatusCode> {
    let record = service.admin.update_topic_record(topic, change).await?;
    service.apply_topic_record(topic, &record).await?;
    no_content()
}

/// The namespace's (or broker's) value of a policy, for `?applied=true`.
fn inherited(
    service: &Service,
    spec: &PolicySpec,
    ns: &crate::admin::NamespacePolicies,
) -> Option<Value> {
    if let Some(value) = ns.policies.get(spec.key) {
        return Some(value.clone());
    }
    let config = &service.config;
    match spec.key {
        "messageTTL" => Some(json!(ns.message_ttl_seconds.unwrap_or(0))),
        "retention" => Some(
            serde_json::to_value(RetentionJson::from(ns.retention.unwrap_or_default()))
                .unwrap_or(Value::Null),
        ),
        "persistence" => {
            let p = ns.persistence_or(config.default_persistence);
            serde_json::to_value(PersistenceJson::from_policy((
                p.ensemble,
                p.write_quorum,
                p.ack_quorum,
            )))
            .ok()
        }
        "compactionThreshold" => Some(json!(ns.compaction_threshold_bytes.unwrap_or(0))),
        "deduplicationEnabled" => Some(json!(ns.deduplication_enabled.unwrap_or(false))),
        "maxProducers" => Some(json!(config.topic_limits.producers_max)),
        "maxConsumers" => Some(json!(config.topic_limits.consumers_max)),
        "maxConsumersPerSubscription" => {
            Some(json!(config.topic_limits.consumers_per_subscription_max))
        }
        "maxMessageSize" => Some(json!(config.max_message_size_bytes)),
        "replication" => Some(json!(
            ns.replication_clusters
                .clone()
                .unwrap_or_else(|| vec![config.cluster_name.clone()])
        )),
        _ => None,
    }
}

async fn get_policy(
    spec: &'static PolicySpec,
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<Response> {
    let topic = existing_topic(&service, &path).await?;
    let record = service.admin.topic_record(&topic).await?;
    if let Some(value) = record.policies.get(spec.key) {
        return Ok(policy_answer(Some(value.clone())));
    }
    if super::api::flag(&params, "applied") {
        let ns = service
            .admin
            .namespace_policies(&topic.namespace)
            .await?
            .unwrap_or_default();
        return Ok(policy_answer(inherited(&service, spec, &ns)));
    }
    Ok(policy_answer(None))
}

/// The value of a POST to a policy's `route` (its topic or namespace route):
/// its JSON body, or (an empty body) the query parameter named as the route,
/// as Pulsar's `messageTTL` takes it.
pub(super) fn request_value(
    spec: &PolicySpec,
    route: Option<&str>,
    params: &HashMap<String, String>,
    body: &[u8],
) -> ApiResult<Value> {
    let value: Option<Value> = parse_body(body, spec.key)?;
    if let Some(value) = value {
        return Ok(value);
    }
    let from_query = route
        .and_then(|route| params.get(route))
        .map(|text| serde_json::from_str(text).unwrap_or_else(|_| Value::String(text.clone())));
    Ok(from_query.unwrap_or(Value::Null))
}

async fn set_policy(
    spec: &'static PolicySpec,
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = existing_topic(&service, &path).await?;
    let mut value = spec.check(request_value(spec, spec.topic_route, &params, &body)?)?;
    let replication = matches!(spec.kind, crate::admin::policy_specs::PolicyKind::Clusters);
    if replication {
        // Recorded clusters the tenant may use (`admin::clusters`).
        let clusters: Vec<String> = serde_json::from_value(value).unwrap_or_default();
        let checked = service
            .admin
            .check_replication_clusters(&topic.namespace.tenant, &clusters)
            .await?;
        value = Value::from(checked);
    }
    let answer = update(&service, &topic, |record| {
        record.policies.insert(spec.key.to_string(), value.clone());
        Ok(())
    })
    .await;
    if replication {
        service.replication_changed();
    }
    answer
}

async fn remove_policy(
    spec: &'static PolicySpec,
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<StatusCode> {
    let topic = existing_topic(&service, &path).await?;
    let answer = update(&service, &topic, |record| {
        record.policies.remove(spec.key);
        Ok(())
    })
    .await;
    if matches!(spec.kind, crate::admin::policy_specs::PolicyKind::Clusters) {
        service.replication_changed();
    }
    answer
}

fn quotas_json(quotas: &BTreeMap<String, BacklogQuota>) -> Value {
    let map: serde_json::Map<String, Value> = quotas
        .iter()
        .map(|(kind, quota)| {
            let value =
                serde_json::to_value(BacklogQuotaJson::from_quota(quota)).unwrap_or(Value::Null);
            (kind.clone(), value)
        })
        .collect();
    Value::Object(map)
}

async fn get_backlog_quotas(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<Response> {
    let topic = existing_topic(&service, &path).await?;
    let record = service.admin.topic_record(&topic).await?;
    if !record.backlog_quotas.is_empty() {
        return Ok(policy_answer(Some(quotas_json(&record.backlog_quotas))));
    }
    if super::api::flag(&params, "applied") {
        let ns = service
            .admin
            .namespace_policies(&topic.namespace)
            .await?
            .unwrap_or_default();
        return Ok(policy_answer(Some(quotas_json(&ns.backlog_quotas))));
    }
    Ok(policy_answer(Some(json!({}))))
}

fn quota_type(params: &HashMap<String, String>) -> String {
    params
        .get("backlogQuotaType")
        .cloned()
        .unwrap_or_else(|| "destination_storage".to_string())
}

async fn set_backlog_quota(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = existing_topic(&service, &path).await?;
    let quota: Option<BacklogQuotaJson> = parse_body(&body, "BacklogQuota")?;
    let Some(quota) = quota else {
        return Err(ApiError::bad_request("backlog quota should not be null"));
    };
    let kind = quota_type(&params);
    let quota = quota.to_quota();
    update(&service, &topic, |record| {
        record.backlog_quotas.insert(kind.clone(), quota.clone());
        Ok(())
    })
    .await
}

async fn remove_backlog_quota(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    let topic = existing_topic(&service, &path).await?;
    let kind = quota_type(&params);
    update(&service, &topic, |record| {
        record.backlog_quotas.remove(&kind);
        Ok(())
    })
    .await
}

async fn get_properties(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<axum::Json<BTreeMap<String, String>>> {
    let topic = existing_topic(&service, &path).await?;
    Ok(axum::Json(
        service.admin.topic_record(&topic).await?.properties,
    ))
}

/// Adds or replaces the given keys (Pulsar's updateProperties merges).
async fn update_properties(
    State(service): Shared,
    Path(path): TopicPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = existing_topic(&service, &path).await?;
    let properties: Option<BTreeMap<String, String>> = parse_body(&body, "topic properties")?;
    let properties = properties.unwrap_or_default();
    check_properties(&properties)?;
    update(&service, &topic, |record| {
        record.properties.extend(properties.clone());
        Ok(())
    })
    .await
}

async fn remove_property(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    let topic = existing_topic(&service, &path).await?;
    let Some(key) = params.get("key").cloned() else {
        return Err(ApiError::bad_request(
            "the key to remove is missing (?key=)",
        ));
    };
    update(&service, &topic, |record| {
        record.properties.remove(&key);
        Ok(())
    })
    .await
}
