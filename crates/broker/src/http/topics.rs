//! Topics, partitioned topics, their stats and subscriptions (Pulsar's
//! `PersistentTopicsBase` routes under `/admin/v2/{persistent|non-persistent}`).
//!
//! A subscription operation on a partitioned topic's base name applies to
//! every partition, as in Pulsar (except skip, which Pulsar refuses with 405).
//! Non-persistent topics have their own routes (`non_persistent`); their
//! partitioned metadata is served here, like persistent topics'; a route
//! that opens a persistent topic answers 405 for a non-persistent one.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, post, put};
use serde_json::Value;

use super::api::{
    ApiError, ApiResult, Params, Shared, flag, flag_unless_false, no_content, topic_of,
};
use crate::admin::json::{self, MessageIdJson, parse_body};
use crate::service::Service;
use crate::subscription::SeekTarget;
use crate::topic::Topic;
use crate::topic::cursor_admin::SubscriptionStart;
use crate::topic_name::{NamespaceName, TopicDomain, TopicName};

/// Ledgers whose metadata internal stats describes (`?metadata=true`), newest
/// first: each is one metadata-store read.
const INTERNAL_STATS_METADATA_LEDGERS_MAX: usize = 100;

type TopicPath = Path<(String, String, String, String)>;
type SubscriptionPath = Path<(String, String, String, String, String)>;

pub(super) fn routes() -> Router<Arc<Service>> {
    const T: &str = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}";
    Router::new()
        .route("/admin/v2/{domain}/{tenant}/{namespace}", get(list_topics))
        .route(
            "/admin/v2/{domain}/{tenant}/{namespace}/partitioned",
            get(list_partitioned),
        )
        .route(T, put(create_topic).delete(delete_topic))
        .route(
            &format!("{T}/partitions"),
            get(get_partitions)
                .put(create_partitioned)
                .post(update_partitions)
                .delete(delete_partitioned),
        )
        .route(&format!("{T}/stats"), get(stats))
        .route(&format!("{T}/partitioned-stats"), get(partitioned_stats))
        .route(&format!("{T}/internalStats"), get(internal_stats))
        .route(&format!("{T}/unload"), put(unload))
        .route(
            &format!("{T}/compaction"),
            put(trigger_compaction).get(compaction_status),
        )
        .route(&format!("{T}/subscriptions"), get(subscriptions))
        .route(
            &format!("{T}/subscription/{{subscription}}"),
            put(create_subscription).delete(delete_subscription),
        )
        .route(
            &format!("{T}/subscription/{{subscription}}/resetcursor/{{timestamp}}"),
            post(reset_cursor_time),
        )
        .route(
            &format!("{T}/subscription/{{subscription}}/resetcursor"),
            post(reset_cursor_id),
        )
        .route(
            &format!("{T}/subscription/{{subscription}}/skip/{{count}}"),
            post(skip),
        )
        .route(
            &format!("{T}/subscription/{{subscription}}/skip_all"),
            post(skip_all),
        )
        .route(
            &format!("{T}/subscription/{{subscription}}/expireMessages/{{seconds}}"),
            post(expire),
        )
        .route(
            &format!("{T}/all_subscription/expireMessages/{{seconds}}"),
            post(expire_all),
        )
}

fn topic_from(path: &(String, String, String, String)) -> ApiResult<TopicName> {
    topic_of(&path.0, &path.1, &path.2, &path.3)
}

async fn namespace_checked(
    service: &Service,
    tenant: &str,
    namespace: &str,
) -> ApiResult<NamespaceName> {
    let ns = NamespaceName::parse(&format!("{tenant}/{namespace}")).map_err(|_| {
        ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "Namespace name is not valid",
        )
    })?;
    if service.admin.namespace_policies(&ns).await?.is_none() {
        return Err(ApiError::not_found("Namespace does not exist"));
    }
    Ok(ns)
}

fn topic_not_found(topic: &TopicName) -> ApiError {
    ApiError::not_found(format!("Topic {topic} not found"))
}

/// The partitions of a partitioned topic's base name, else the topic itself.
pub(super) async fn targets(service: &Service, topic: &TopicName) -> ApiResult<Vec<TopicName>> {
    if topic.partition.is_none()
        && let Some(n) = service.admin.partitions(topic).await?
    {
        return Ok((0..n).map(|i| topic.partition(i)).collect());
    }
    Ok(vec![topic.clone()])
}

/// A served (opened if needed) existing topic, 404 when absent.
pub(super) async fn open(service: &Service, topic: &TopicName) -> ApiResult<Arc<Topic>> {
    if topic.partition.is_none() && service.admin.partitions(topic).await?.is_some() {
        return Err(ApiError::not_found(format!(
            "Topic {topic} is a partitioned topic: use its partitions or partitioned-stats"
        )));
    }
    match service.topic(topic, false).await {
        Ok(served) => Ok(served),
        Err(e) if e.code == vela_wire::proto::ServerError::TopicNotFound => {
            Err(topic_not_found(topic))
        }
        Err(e) => Err(e.into()),
    }
}

/// This broker as topic stats name their owner (`host:port` of its HTTP
/// listener).
pub(super) fn owner_broker(service: &Service) -> String {
    let http_url = service.me().http_url;
    http_url
        .trim_start_matches("http://")
        .trim_start_matches("https://")
        .to_string()
}

async fn list_topics(
    State(service): Shared,
    Path((domain, tenant, namespace)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<Vec<String>>> {
    let ns = namespace_checked(&service, &tenant, &namespace).await?;
    if domain != "persistent" {
        return Ok(axum::Json(Vec::new()));
    }
    Ok(axum::Json(service.admin.topics_of_namespace(&ns).await?))
}

async fn list_partitioned(
    State(service): Shared,
    Path((domain, tenant, namespace)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<Vec<String>>> {
    let ns = namespace_checked(&service, &tenant, &namespace).await?;
    let domain = match domain.as_str() {
        "persistent" => TopicDomain::Persistent,
        "non-persistent" => TopicDomain::NonPersistent,
        _ => return Ok(axum::Json(Vec::new())),
    };
    Ok(axum::Json(
        service
            .admin
            .partitioned_topics_of_namespace(&ns, domain)
            .await?,
    ))
}

async fn create_topic(
    State(service): Shared,
    Path(path): TopicPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = topic_from(&path)?;
    let properties: Option<BTreeMap<String, String>> = parse_body(&body, "topic properties")?;
    super::topic_policies::check_topic_quota(&service, &topic, 1).await?;
    service.admin.create_topic(&topic).await?;
    super::topic_policies::store_properties(&service, &topic, properties).await?;
    // Pulsar creates the managed ledger at once: open the topic here.
    service.topic(&topic, false).await?;
    no_content()
}

async fn delete_topic(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    let topic = topic_from(&path)?;
    if topic.partition.is_none() && service.admin.partitions(&topic).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{topic} is a partitioned topic: use delete-partitioned-topic"),
        ));
    }
    let served = open(&service, &topic).await?;
    if !flag(&params, "force") && served.has_clients().await {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "Topic has active producers/subscriptions",
        ));
    }
    service.delete_topic(&topic).await?;
    if topic.partition.is_none() {
        service.admin.delete_topic_record(&topic).await?;
    }
    no_content()
}

/// The partition count from a body: a bare JSON number, or
/// `{"partitions": N, "properties": {...}}`.
fn partitions_from_body(body: &[u8]) -> ApiResult<u32> {
    let value: Option<Value> = parse_body(body, "the number of partitions")?;
    let number = match &value {
        Some(Value::Number(n)) => n.as_u64(),
        Some(Value::Object(map)) => map.get("partitions").and_then(Value::as_u64),
        Some(Value::String(s)) => s.trim().parse().ok(),
        _ => None,
    };
    number.and_then(|n| u32::try_from(n).ok()).ok_or_else(|| {
        ApiError::bad_request(format!(
            "the body must be the number of partitions, got {:?}",
            String::from_utf8_lossy(&body[..body.len().min(32)])
        ))
    })
}

async fn get_partitions(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_from(&path)?;
    let n = service.admin.partitions(&topic).await?.unwrap_or(0);
    Ok(axum::Json(serde_json::json!({ "partitions": n })))
}

async fn create_partitioned(
    State(service): Shared,
    Path(path): TopicPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = topic_from(&path)?;
    let partitions = partitions_from_body(&body)?;
    super::topic_policies::check_topic_quota(&service, &topic, partitions as usize).await?;
    service
        .admin
        .create_partitioned_topic(&topic, partitions)
        .await?;
    let value: Option<Value> = parse_body(&body, "the number of partitions")?;
    let properties = match value.as_ref().and_then(|v| v.get("properties")) {
        Some(Value::Null) | None => None,
        Some(map) => Some(
            serde_json::from_value::<BTreeMap<String, String>>(map.clone())
                .map_err(|e| ApiError::bad_request(format!("cannot parse properties: {e}")))?,
        ),
    };
    super::topic_policies::store_properties(&service, &topic, properties).await?;
    no_content()
}

async fn update_partitions(
    State(service): Shared,
    Path(path): TopicPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = topic_from(&path)?;
    let partitions = partitions_from_body(&body)?;
    service
        .admin
        .update_partitioned_topic(&topic, partitions)
        .await?;
    no_content()
}

async fn delete_partitioned(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    let topic = topic_from(&path)?;
    let Some(n) = service.admin.partitions(&topic).await? else {
        return Err(ApiError::not_found(format!(
            "Partitioned Topic {topic} not found"
        )));
    };
    if !flag(&params, "force") {
        for index in 0..n {
            if let Some(served) = service.served_topic(&topic.partition(index).to_string())
                && served.has_clients().await
            {
                return Err(ApiError::new(
                    StatusCode::PRECONDITION_FAILED,
                    "Topic has active producers/subscriptions",
                ));
            }
        }
    }
    for index in 0..n {
        let partition = topic.partition(index);
        match service.delete_topic(&partition).await {
            Ok(()) => {}
            Err(e) if e.code == vela_wire::proto::ServerError::TopicNotFound => {}
            Err(e) => return Err(e.into()),
        }
    }
    service.admin.delete_partitioned_metadata(&topic).await?;
    service.admin.delete_topic_record(&topic).await?;
    no_content()
}

/// `excludePublishers` / `excludeConsumers`: stats without those lists.
fn exclude(
    stats: &mut crate::stats::TopicStats,
    params: &std::collections::HashMap<String, String>,
) {
    if flag(params, "excludePublishers") {
        stats.publishers.clear();
    }
    if flag(params, "excludeConsumers") {
        for subscription in &mut stats.subscriptions {
            subscription.consumers.clear();
        }
    }
}

async fn stats(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_from(&path)?;
    let served = open(&service, &topic).await?;
    let mut stats = service.topic_stats(&served).await;
    exclude(&mut stats, &params);
    Ok(axum::Json(json::topic_stats_json(
        &stats,
        &owner_broker(&service),
    )))
}

async fn partitioned_stats(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_from(&path)?;
    let Some(n) = service.admin.partitions(&topic).await? else {
        return Err(ApiError::not_found(format!(
            "Partitioned Topic {topic} not found"
        )));
    };
    let mut partitions = Vec::with_capacity(n as usize);
    for index in 0..n {
        let served = open(&service, &topic.partition(index)).await?;
        let mut stats = service.topic_stats(&served).await;
        exclude(&mut stats, &params);
        partitions.push(stats);
    }
    let per_partition = flag_unless_false(&params, "perPartition");
    Ok(axum::Json(json::partitioned_stats_json(
        &topic.to_string(),
        &partitions,
        n,
        per_partition,
        &owner_broker(&service),
    )))
}

async fn internal_stats(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_from(&path)?;
    let served = open(&service, &topic).await?;
    let ledgers = served.log.ledgers();
    let mut metadata = BTreeMap::new();
    if flag(&params, "metadata") {
        for ledger in ledgers
            .iter()
            .rev()
            .take(INTERNAL_STATS_METADATA_LEDGERS_MAX)
        {
            if let Some(description) = served.log.describe_ledger(ledger.ledger_id).await? {
                metadata.insert(ledger.ledger_id, json::ledger_metadata_text(&description));
            }
        }
    }
    let stats = served.stats().await;
    Ok(axum::Json(json::internal_stats_json(
        &json::InternalStatsInput {
            ledgers: &ledgers,
            metadata: &metadata,
            last_confirmed: served.log.last_confirmed(),
            entries_added: stats.entries,
            subscriptions: &stats.subscriptions,
        },
    )))
}

async fn unload(State(service): Shared, Path(path): TopicPath) -> ApiResult<StatusCode> {
    let topic = topic_from(&path)?;
    for target in targets(&service, &topic).await? {
        service.unload(&target.to_string()).await?;
    }
    no_content()
}

/// pulsar-admin `topics compact`: starts a compaction (409 while one runs).
async fn trigger_compaction(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<StatusCode> {
    let topic = topic_from(&path)?;
    for target in targets(&service, &topic).await? {
        let served = open(&service, &target).await?;
        if let Err(error) = served.start_compaction() {
            return Err(ApiError::new(StatusCode::CONFLICT, error.to_string()));
        }
    }
    no_content()
}

/// pulsar-admin `topics compaction-status` (Pulsar's LongRunningProcessStatus).
async fn compaction_status(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<axum::Json<serde_json::Value>> {
    use crate::compaction::CompactionStatus;
    let topic = topic_from(&path)?;
    let served = open(&service, &topic).await?;
    let (status, last_error) = match served.compaction.status() {
        CompactionStatus::NotRun => ("NOT_RUN", String::new()),
        CompactionStatus::Running => ("RUNNING", String::new()),
        CompactionStatus::Success => ("SUCCESS", String::new()),
        CompactionStatus::Error(error) => ("ERROR", error),
    };
    Ok(axum::Json(serde_json::json!({
        "status": status,
        "lastError": last_error,
    })))
}

async fn subscriptions(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<axum::Json<Vec<String>>> {
    let topic = topic_from(&path)?;
    let mut names = Vec::new();
    for target in targets(&service, &topic).await? {
        names.extend(open(&service, &target).await?.subscription_names());
    }
    names.sort();
    names.dedup();
    Ok(axum::Json(names))
}

async fn create_subscription(
    State(service): Shared,
    Path(path): SubscriptionPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let (domain, tenant, namespace, topic, subscription) = path;
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    let start: Option<MessageIdJson> = parse_body(&body, "MessageId")?;
    // Pulsar's default start is latest.
    let start = match start {
        None => SubscriptionStart::Latest,
        Some(id) if id.is_latest() => SubscriptionStart::Latest,
        Some(id) if id.is_earliest() => SubscriptionStart::Earliest,
        Some(id) => SubscriptionStart::At(vela_log::Position::new(
            id.ledger_id as u64,
            id.entry_id as u64,
        )),
    };
    for target in targets(&service, &topic).await? {
        open(&service, &target)
            .await?
            .create_subscription(&subscription, start)
            .await?;
    }
    no_content()
}

async fn delete_subscription(
    State(service): Shared,
    Path(path): SubscriptionPath,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    let (domain, tenant, namespace, topic, subscription) = path;
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    let force = flag(&params, "force");
    let mut found = false;
    for target in targets(&service, &topic).await? {
        let served = open(&service, &target).await?;
        if !force {
            let stats = served.stats().await;
            if stats
                .subscriptions
                .iter()
                .any(|s| s.name == subscription && !s.consumers.is_empty())
            {
                return Err(ApiError::new(
                    StatusCode::PRECONDITION_FAILED,
                    "Subscription has active connected consumers",
                ));
            }
        }
        found |= served.unsubscribe(&subscription).await?;
    }
    if !found {
        return Err(ApiError::not_found(format!(
            "Subscription {subscription} not found for topic {topic}"
        )));
    }
    no_content()
}

async fn reset_cursor(
    service: &Service,
    path: (String, String, String, String, String),
    target: SeekTarget,
) -> ApiResult<StatusCode> {
    let (domain, tenant, namespace, topic, subscription) = path;
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    for partition in targets(service, &topic).await? {
        open(service, &partition)
            .await?
            .reset_cursor(&subscription, target)
            .await?;
    }
    no_content()
}

async fn reset_cursor_time(
    State(service): Shared,
    Path((domain, tenant, namespace, topic, subscription, timestamp)): Path<(
        String,
        String,
        String,
        String,
        String,
        String,
    )>,
) -> ApiResult<StatusCode> {
    let time_ms: u64 = timestamp
        .parse()
        .map_err(|_| ApiError::bad_request(format!("bad timestamp {timestamp:?}")))?;
    reset_cursor(
        &service,
        (domain, tenant, namespace, topic, subscription),
        SeekTarget::PublishTime(time_ms),
    )
    .await
}

async fn reset_cursor_id(
    State(service): Shared,
    Path(path): SubscriptionPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let id: Option<MessageIdJson> = parse_body(&body, "ResetCursorData")?;
    let Some(id) = id else {
        return Err(ApiError::bad_request("a message id is required"));
    };
    let target = if id.is_earliest() {
        SeekTarget::MessageId {
            ledger_id: u64::MAX,
            entry_id: u64::MAX,
        }
    } else if id.is_excluded {
        SeekTarget::MessageId {
            ledger_id: id.ledger_id as u64,
            entry_id: (id.entry_id as u64).saturating_add(1),
        }
    } else {
        SeekTarget::MessageId {
            ledger_id: id.ledger_id as u64,
            entry_id: id.entry_id as u64,
        }
    };
    reset_cursor(&service, path, target).await
}

async fn skip(
    State(service): Shared,
    Path((domain, tenant, namespace, topic, subscription, count)): Path<(
        String,
        String,
        String,
        String,
        String,
        String,
    )>,
) -> ApiResult<StatusCode> {
    let count: u64 = count
        .parse()
        .map_err(|_| ApiError::bad_request(format!("bad message count {count:?}")))?;
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    if topic.partition.is_none() && service.admin.partitions(&topic).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "Skip messages on a partitioned topic is not allowed",
        ));
    }
    open(&service, &topic)
        .await?
        .skip(&subscription, Some(count))
        .await?;
    no_content()
}

async fn skip_all(State(service): Shared, Path(path): SubscriptionPath) -> ApiResult<StatusCode> {
    let (domain, tenant, namespace, topic, subscription) = path;
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    for target in targets(&service, &topic).await? {
        open(&service, &target)
            .await?
            .skip(&subscription, None)
            .await?;
    }
    no_content()
}

fn seconds_from(text: &str) -> ApiResult<Duration> {
    let seconds: u64 = text
        .parse()
        .map_err(|_| ApiError::bad_request(format!("bad expire time {text:?}")))?;
    Ok(Duration::from_secs(seconds))
}

async fn expire(
    State(service): Shared,
    Path((domain, tenant, namespace, topic, subscription, seconds)): Path<(
        String,
        String,
        String,
        String,
        String,
        String,
    )>,
) -> ApiResult<StatusCode> {
    let age = seconds_from(&seconds)?;
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    for target in targets(&service, &topic).await? {
        open(&service, &target)
            .await?
            .expire(&subscription, age)
            .await?;
    }
    no_content()
}

async fn expire_all(
    State(service): Shared,
    Path((domain, tenant, namespace, topic, seconds)): SubscriptionPath,
) -> ApiResult<StatusCode> {
    let age = seconds_from(&seconds)?;
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    for target in targets(&service, &topic).await? {
        let served = open(&service, &target).await?;
        for subscription in served.subscription_names() {
            served.expire(&subscription, age).await?;
        }
    }
    no_content()
}
