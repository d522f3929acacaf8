//! Non-persistent topics in the admin API (Pulsar's `NonPersistentTopics`
//! under `/admin/v2/non-persistent`): listing, creation and deletion,
//! stats with drop rates, subscriptions, unload.
//!
//! Answers as Pulsar 4.0 does: the list names the topics served now; stats
//! of a topic not served now is 404 "Topic ... not found"; creating a
//! subscription is 400 (only clients do that). Partitioned metadata
//! (`/partitions`) is the same for both domains and stays in `topics`;
//! routes not named here fall through to `topics`, which refuses what only
//! persistent topics have (405).
//! Never: stores anything (a non-persistent topic lives in memory only).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use serde_json::Value;
use vela_wire::proto::ServerError;

use super::api::{
    ApiError, ApiResult, Params, Shared, flag, flag_unless_false, namespace_of, no_content,
};
use super::topics::owner_broker;
use crate::admin::json;
use crate::nonpersistent::NonPersistentTopic;
use crate::service::Service;
use crate::topic_name::{NamespaceName, TopicName};

type TopicPath = Path<(String, String, String)>;

pub(super) fn routes() -> Router<Arc<Service>> {
    const T: &str = "/admin/v2/non-persistent/{tenant}/{namespace}/{topic}";
    Router::new()
        .route("/admin/v2/non-persistent/{tenant}/{namespace}", get(list))
        // Named here too: `{topic}` below would take the path and answer
        // 405 for GET.
        .route(
            "/admin/v2/non-persistent/{tenant}/{namespace}/partitioned",
            get(list_partitioned),
        )
        .route(T, put(create).delete(delete))
        .route(&format!("{T}/stats"), get(stats))
        .route(&format!("{T}/partitioned-stats"), get(partitioned_stats))
        .route(&format!("{T}/internalStats"), get(internal_stats))
        .route(&format!("{T}/subscriptions"), get(subscriptions))
        .route(
            &format!("{T}/subscription/{{subscription}}"),
            put(create_subscription).delete(delete_subscription),
        )
        .route(&format!("{T}/unload"), put(unload))
}

fn topic_of(tenant: &str, namespace: &str, topic: &str) -> ApiResult<TopicName> {
    super::api::topic_of("non-persistent", tenant, namespace, topic)
}

async fn namespace_checked(service: &Service, tenant: &str, ns: &str) -> ApiResult<NamespaceName> {
    let ns = namespace_of(tenant, ns)?;
    if service.admin.namespace_policies(&ns).await?.is_none() {
        return Err(ApiError::not_found("Namespace does not exist"));
    }
    Ok(ns)
}

/// The topic served now, 404 otherwise (nothing to open).
fn served(service: &Service, topic: &TopicName) -> ApiResult<Arc<NonPersistentTopic>> {
    service
        .served_non_persistent(&topic.to_string())
        .ok_or_else(|| ApiError::not_found(format!("Topic {topic} not found")))
}

async fn list(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<axum::Json<Vec<String>>> {
    let ns = namespace_checked(&service, &tenant, &namespace).await?;
    Ok(axum::Json(service.non_persistent_topics_of(&ns, false)))
}

async fn list_partitioned(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<axum::Json<Vec<String>>> {
    let ns = namespace_checked(&service, &tenant, &namespace).await?;
    let domain = crate::topic_name::TopicDomain::NonPersistent;
    Ok(axum::Json(
        service
            .admin
            .partitioned_topics_of_namespace(&ns, domain)
            .await?,
    ))
}

async fn create(State(service): Shared, Path(path): TopicPath) -> ApiResult<StatusCode> {
    let topic = topic_of(&path.0, &path.1, &path.2)?;
    if topic.partition.is_none() && service.admin.partitions(&topic).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            format!("Partitioned topic {topic} already exists"),
        ));
    }
    service.non_persistent_topic(&topic, true).await?;
    no_content()
}

async fn delete(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    let topic = topic_of(&path.0, &path.1, &path.2)?;
    let served = served(&service, &topic)?;
    if !flag(&params, "force") && served.has_clients() {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "Topic has active producers/subscriptions",
        ));
    }
    service.delete_topic(&topic).await?;
    no_content()
}

async fn stats(State(service): Shared, Path(path): TopicPath) -> ApiResult<axum::Json<Value>> {
    let topic = topic_of(&path.0, &path.1, &path.2)?;
    let stats = served(&service, &topic)?.stats();
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
    let topic = topic_of(&path.0, &path.1, &path.2)?;
    let Some(n) = service.admin.partitions(&topic).await? else {
        return Err(ApiError::not_found(format!(
            "Partitioned Topic {topic} not found"
        )));
    };
    let mut partitions = Vec::with_capacity(n as usize);
    for index in 0..n {
        // Pulsar loads every partition to answer this.
        let partition = service
            .non_persistent_topic(&topic.partition(index), false)
            .await?;
        partitions.push(partition.stats());
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

/// A non-persistent topic's internal stats: no ledgers, one cursor per
/// subscription (as Pulsar answers).
async fn internal_stats(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_of(&path.0, &path.1, &path.2)?;
    let served = served(&service, &topic)?;
    let cursors: serde_json::Map<String, Value> = served
        .subscription_names()
        .into_iter()
        .map(|name| (name, serde_json::json!({ "active": false })))
        .collect();
    Ok(axum::Json(serde_json::json!({
        "entriesAddedCounter": served.stats().msg_in_counter,
        "numberOfEntries": 0,
        "totalSize": 0,
        "currentLedgerEntries": 0,
        "currentLedgerSize": 0,
        "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0,
        "cursors": cursors,
    })))
}

async fn subscriptions(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<axum::Json<Vec<String>>> {
    let topic = topic_of(&path.0, &path.1, &path.2)?;
    let mut names = Vec::new();
    match service.admin.partitions(&topic).await? {
        Some(n) if topic.partition.is_none() => {
            for index in 0..n {
                if let Some(partition) =
                    service.served_non_persistent(&topic.partition(index).to_string())
                {
                    names.extend(partition.subscription_names());
                }
            }
        }
        _ => names = served(&service, &topic)?.subscription_names(),
    }
    names.sort();
    names.dedup();
    Ok(axum::Json(names))
}

async fn create_subscription() -> ApiResult<StatusCode> {
    Err(ApiError::bad_request(
        "Create subscription on non-persistent topic can only be done through client",
    ))
}

async fn delete_subscription(
    State(service): Shared,
    Path((tenant, namespace, topic, subscription)): Path<(String, String, String, String)>,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    let topic = topic_of(&tenant, &namespace, &topic)?;
    let force = flag(&params, "force");
    let served = served(&service, &topic)?;
    match served.unsubscribe(&subscription, None, force).await {
        Ok(true) => no_content(),
        Ok(false) => Err(ApiError::not_found(format!(
            "Subscription {subscription} not found for topic {topic}"
        ))),
        Err(e) if e.code == ServerError::UnknownError => Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "Subscription has active connected consumers",
        )),
        Err(e) => Err(e.into()),
    }
}

async fn unload(State(service): Shared, Path(path): TopicPath) -> ApiResult<StatusCode> {
    let topic = topic_of(&path.0, &path.1, &path.2)?;
    let targets: Vec<TopicName> = match service.admin.partitions(&topic).await? {
        Some(n) if topic.partition.is_none() => (0..n).map(|i| topic.partition(i)).collect(),
        _ => vec![topic],
    };
    for target in targets {
        service.unload(&target.to_string()).await?;
    }
    no_content()
}
