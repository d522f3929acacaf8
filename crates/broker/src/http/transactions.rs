//! `/admin/v3/transactions/...`: the transaction coordinators' and the
//! topics' transaction views, as Pulsar's `Transactions` resource shapes
//! them (routes, query parameters and JSON field names):
//!
//! - `coordinatorStats[?coordinatorId=N]`: `TransactionCoordinatorStats`
//!   (`state`, `leastSigBits`, `lowWaterMark`, `ongoingTxnSize`,
//!   `recoverStartTime`, `recoverEndTime`); with an id served by another
//!   broker, a 307 to it. Without an id, as Pulsar: a map id → stats of
//!   every coordinator of the cluster (those served elsewhere asked at
//!   their broker with `?coordinatorId=`, with the broker-client
//!   credentials, `STATS_REQUESTS_IN_FLIGHT_MAX` at a time); one that
//!   cannot be asked fails the request (500, naming it).
//! - `transactionMetadata/{most}/{least}`: `TransactionMetadata` (`txnId`,
//!   `status`, `openTimestamp`, `timeoutAt`, `owner`, `producedPartitions`,
//!   `ackedPartitions`); 404 when the transaction is not open (ended ones
//!   are forgotten, as in Pulsar).
//! - `slowTransactions/{timeoutMs}[?coordinatorId=N]`: txnId →
//!   `TransactionMetadata` of transactions open longer than that.
//! - `transactionBufferStats/{t}/{ns}/{topic}[?lowWaterMarks=true]`:
//!   `TransactionBufferStats` (`state`, `maxReadPosition`,
//!   `lastSnapshotTimestamps`, `lowWaterMarks`, `ongoingTxnSize`,
//!   `recoverStartTime`, `recoverEndTime`).
//! - `transactionInBufferStats/{t}/{ns}/{topic}/{most}/{least}`:
//!   `startPosition`, `aborted`.
//! - `pendingAckStats/{t}/{ns}/{topic}/{sub}[?lowWaterMarks=true]`: `state`,
//!   `lowWaterMarks`, `ongoingTxnSize`.
//! - `transactionInPendingAckStats/{t}/{ns}/{topic}/{sub}/{most}/{least}`:
//!   `cumulativeAckPosition`.
//!
//! Each answers 503 with Pulsar's message when transactions are off.
//! Never: changes a transaction or a topic.

use std::sync::Arc;

use axum::Router;
use axum::extract::{OriginalUri, Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Map, Value, json};

use super::api::{ApiError, ApiResult, Params, Shared, flag, topic_of};
use crate::ownership::{BrokerInfo, LookupAnswer};
use crate::service::Service;
use crate::topic::Topic;
use crate::topic_name::TopicName;
use crate::transaction::{COORDINATOR_ASSIGN_TOPIC, CoordinatorStats, Coordinators, TxnError};
use crate::transaction::{TxnId, TxnView};

const BASE: &str = "/admin/v3/transactions";
/// Coordinators asked at other brokers at once by `coordinatorStats`.
const STATS_REQUESTS_IN_FLIGHT_MAX: usize = 16;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route(&format!("{BASE}/coordinatorStats"), get(coordinator_stats))
        .route(
            &format!("{BASE}/transactionMetadata/{{most}}/{{least}}"),
            get(transaction_metadata),
        )
        .route(
            &format!("{BASE}/slowTransactions/{{timeout}}"),
            get(slow_transactions),
        )
        .route(
            &format!("{BASE}/transactionBufferStats/{{tenant}}/{{namespace}}/{{topic}}"),
            get(buffer_stats),
        )
        .route(
            &format!(
                "{BASE}/transactionInBufferStats/{{tenant}}/{{namespace}}/{{topic}}/{{most}}/{{least}}"
            ),
            get(txn_in_buffer),
        )
        .route(
            &format!("{BASE}/pendingAckStats/{{tenant}}/{{namespace}}/{{topic}}/{{sub}}"),
            get(pending_ack_stats),
        )
        .route(
            &format!(
                "{BASE}/transactionInPendingAckStats/{{tenant}}/{{namespace}}/{{topic}}/{{sub}}/{{most}}/{{least}}"
            ),
            get(txn_in_pending_ack),
        )
}

/// The coordinators, or Pulsar's 503 when transactions are off.
fn enabled(service: &Service) -> ApiResult<&Arc<Coordinators>> {
    service.transactions.as_ref().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "This Broker is not configured with transactionCoordinatorEnabled=true.",
        )
    })
}

/// Which broker serves coordinator `id`: `Ok(None)` this one (opened if
/// it is not open yet, as Pulsar loads a coordinator with its partition),
/// `Ok(Some(owner))` another.
async fn coordinator_owner(
    service: &Service,
    coordinators: &Coordinators,
    id: u64,
) -> ApiResult<Option<BrokerInfo>> {
    if id >= u64::from(coordinators.count()) {
        return Err(coordinator_not_found(id));
    }
    let partition = u32::try_from(id).map_err(|_| coordinator_not_found(id))?;
    let assign = TopicName::parse(COORDINATOR_ASSIGN_TOPIC)?.partition(partition);
    if service.ownership.get().is_some() {
        let owner = match service.lookup(&assign, false).await? {
            LookupAnswer::Connect(owner) | LookupAnswer::Redirect(owner) => owner,
        };
        if owner.id != service.me().id {
            if owner.http_url.is_empty() {
                return Err(coordinator_not_found(id));
            }
            return Ok(Some(owner));
        }
    }
    coordinators
        .connect(id)
        .await
        .map_err(|e| ApiError::from(crate::error::ServiceError::from(e)))?;
    Ok(None)
}

/// Where coordinator `id` is served: `Ok(None)` here, `Ok(Some(redirect))`
/// a 307 to the broker that serves it.
async fn coordinator_here(
    service: &Service,
    coordinators: &Coordinators,
    id: u64,
    uri: &axum::http::Uri,
) -> ApiResult<Option<Response>> {
    let Some(owner) = coordinator_owner(service, coordinators, id).await? else {
        return Ok(None);
    };
    let location = format!(
        "{}{}",
        owner.http_url.trim_end_matches('/'),
        uri.path_and_query().map_or(uri.path(), |p| p.as_str())
    );
    Ok(Some(
        (
            StatusCode::TEMPORARY_REDIRECT,
            [(header::LOCATION, location)],
        )
            .into_response(),
    ))
}

fn coordinator_not_found(id: u64) -> ApiError {
    ApiError::not_found(format!(
        "Transaction coordinator not found! coordinator id : {id}"
    ))
}

fn coordinator_json(stats: &CoordinatorStats) -> Value {
    json!({
        "state": if stats.ready { "Ready" } else { "Close" },
        "leastSigBits": stats.last_seq,
        "lowWaterMark": stats.low_water_mark,
        "ongoingTxnSize": stats.active,
        "recoverStartTime": stats.recover_start_unix_ms,
        "recoverEndTime": stats.recover_end_unix_ms,
    })
}

fn coordinator_id(params: &std::collections::HashMap<String, String>) -> ApiResult<Option<u64>> {
    match params.get("coordinatorId") {
        None => Ok(None),
        Some(text) => text
            .parse::<u64>()
            .map(Some)
            .map_err(|_| ApiError::bad_request(format!("coordinatorId {text} is not a number"))),
    }
}

async fn coordinator_stats(
    State(service): Shared,
    OriginalUri(uri): OriginalUri,
    Query(params): Params,
) -> ApiResult<Response> {
    let coordinators = enabled(&service)?;
    if let Some(id) = coordinator_id(&params)? {
        if let Some(redirect) = coordinator_here(&service, coordinators, id, &uri).await? {
            return Ok(redirect);
        }
        let stats = coordinators
            .stats_of(id)
            .map_err(|_| coordinator_not_found(id))?;
        return Ok(axum::Json(coordinator_json(&stats)).into_response());
    }
    let count = u64::from(coordinators.count());
    if count == 0 {
        return Err(ApiError::not_found("Transaction coordinator not found"));
    }
    let mut all = Map::new();
    let mut elsewhere = tokio::task::JoinSet::new();
    let peers = service.peers();
    let slots = Arc::new(tokio::sync::Semaphore::new(STATS_REQUESTS_IN_FLIGHT_MAX));
    for id in 0..count {
        match coordinator_owner(&service, coordinators, id).await? {
            None => {
                let stats = coordinators
                    .stats_of(id)
                    .map_err(|_| coordinator_not_found(id))?;
                all.insert(id.to_string(), coordinator_json(&stats));
            }
            Some(owner) => {
                let url = format!(
                    "{}{BASE}/coordinatorStats?coordinatorId={id}",
                    peers.http_base(&owner).trim_end_matches('/')
                );
                let (peers, slots) = (Arc::clone(&peers), Arc::clone(&slots));
                elsewhere.spawn(async move {
                    let _slot = slots.acquire_owned().await;
                    let answer = tokio::task::spawn_blocking(move || {
                        crate::broker_client::get_json(&peers, &url)
                            .map_err(|e| format!("coordinator {id} at {url}: {e}"))
                    })
                    .await
                    .map_err(|e| e.to_string())
                    .and_then(|r| r);
                    (id, answer)
                });
            }
        }
    }
    while let Some(joined) = elsewhere.join_next().await {
        let (id, answer) =
            joined.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        let stats = answer.map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e))?;
        all.insert(id.to_string(), stats);
    }
    Ok(axum::Json(Value::Object(all)).into_response())
}

fn metadata_json(view: &TxnView) -> Value {
    let produced: Map<String, Value> = view
        .produced
        .iter()
        .map(|topic| {
            (
                topic.clone(),
                json!({"startPosition": null, "aborted": false}),
            )
        })
        .collect();
    let acked: Map<String, Value> = view
        .acked
        .iter()
        .map(|(topic, subscriptions)| {
            let subs: Map<String, Value> = subscriptions
                .iter()
                .map(|sub| (sub.clone(), json!({"cumulativeAckPosition": null})))
                .collect();
            (topic.clone(), Value::Object(subs))
        })
        .collect();
    json!({
        "txnId": view.id.to_string(),
        "status": view.status.name(),
        "openTimestamp": view.open_unix_ms,
        "timeoutAt": view.timeout_ms,
        "owner": view.owner,
        "producedPartitions": produced,
        "ackedPartitions": acked,
    })
}

async fn transaction_metadata(
    State(service): Shared,
    OriginalUri(uri): OriginalUri,
    Path((most, least)): Path<(u64, u64)>,
) -> ApiResult<Response> {
    let coordinators = enabled(&service)?;
    let id = TxnId { most, least };
    if let Some(redirect) = coordinator_here(&service, coordinators, most, &uri).await? {
        return Ok(redirect);
    }
    let view = match coordinators.view(id) {
        Ok(Some(view)) => view,
        Ok(None) | Err(TxnError::NotFound(_)) => {
            return Err(ApiError::not_found(TxnError::NotFound(id).to_string()));
        }
        Err(error) => return Err(ApiError::not_found(error.to_string())),
    };
    Ok(axum::Json(metadata_json(&view)).into_response())
}

async fn slow_transactions(
    State(service): Shared,
    OriginalUri(uri): OriginalUri,
    Path(timeout): Path<String>,
    Query(params): Params,
) -> ApiResult<Response> {
    let coordinators = enabled(&service)?;
    let age_ms: u64 = timeout
        .parse()
        .map_err(|_| ApiError::bad_request(format!("timeout {timeout} is not a number")))?;
    let ids: Vec<u64> = match coordinator_id(&params)? {
        Some(id) => {
            if let Some(redirect) = coordinator_here(&service, coordinators, id, &uri).await? {
                return Ok(redirect);
            }
            vec![id]
        }
        None => (0..u64::from(coordinators.count())).collect(),
    };
    let mut slow = Map::new();
    for id in ids {
        if coordinator_here(&service, coordinators, id, &uri)
            .await?
            .is_some()
        {
            continue;
        }
        for view in coordinators
            .slow(id, age_ms)
            .map_err(|_| coordinator_not_found(id))?
        {
            slow.insert(view.id.to_string(), metadata_json(&view));
        }
    }
    Ok(axum::Json(Value::Object(slow)).into_response())
}

/// The served persistent topic of a route's path.
async fn topic_at(service: &Service, tenant: &str, ns: &str, topic: &str) -> ApiResult<Arc<Topic>> {
    enabled(service)?;
    let name = topic_of("persistent", tenant, ns, topic)
        .map_err(|_| ApiError::new(StatusCode::PRECONDITION_FAILED, "Topic name is not valid"))?;
    super::topics::open(service, &name).await
}

fn position_text(position: Option<vela_log::Position>) -> Value {
    position.map_or(Value::Null, |p| Value::String(p.to_string()))
}

fn marks_json(marks: &[(u64, u64)]) -> Value {
    Value::Object(
        marks
            .iter()
            .map(|(most, low)| (most.to_string(), json!(low)))
            .collect(),
    )
}

async fn buffer_stats(
    State(service): Shared,
    Path((tenant, ns, topic)): Path<(String, String, String)>,
    Query(params): Params,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_at(&service, &tenant, &ns, &topic).await?;
    let Some(buffer) = topic.txn_buffer() else {
        return Err(ApiError::not_found("Topic has no transaction buffer"));
    };
    let stats = buffer.stats();
    let low_water_marks = if flag(&params, "lowWaterMarks") {
        marks_json(&stats.low_water_marks)
    } else {
        Value::Null
    };
    Ok(axum::Json(json!({
        "state": if stats.tracked { "Ready" } else { "NoSnapshot" },
        "maxReadPosition": position_text(stats.max_read_position),
        "lastSnapshotTimestamps": stats.last_snapshot_unix_ms,
        "lowWaterMarks": low_water_marks,
        "ongoingTxnSize": stats.open,
        "recoverStartTime": stats.recover_start_unix_ms,
        "recoverEndTime": stats.recover_end_unix_ms,
        "snapshotStats": null,
    })))
}

async fn txn_in_buffer(
    State(service): Shared,
    Path((tenant, ns, topic, most, least)): Path<(String, String, String, u64, u64)>,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_at(&service, &tenant, &ns, &topic).await?;
    let Some(buffer) = topic.txn_buffer() else {
        return Err(ApiError::not_found("Topic has no transaction buffer"));
    };
    let (first, aborted) = buffer.txn_stats((most, least));
    Ok(axum::Json(json!({
        "startPosition": position_text(first),
        "aborted": aborted,
    })))
}

/// The topic's pending acks, 404 when the subscription does not exist.
fn pending_acks_of<'t>(
    topic: &'t Topic,
    subscription: &str,
) -> ApiResult<&'t crate::topic::PendingAcks> {
    if !topic.subscription_names().iter().any(|n| n == subscription) {
        return Err(ApiError::not_found("Subscription not found"));
    }
    topic
        .pending_acks()
        .ok_or_else(|| ApiError::not_found("Topic has no pending acks"))
}

async fn pending_ack_stats(
    State(service): Shared,
    Path((tenant, ns, topic, sub)): Path<(String, String, String, String)>,
    Query(params): Params,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_at(&service, &tenant, &ns, &topic).await?;
    let (ongoing, marks) = pending_acks_of(&topic, &sub)?.stats(&sub).await?;
    let low_water_marks = if flag(&params, "lowWaterMarks") {
        marks_json(&marks)
    } else {
        Value::Null
    };
    Ok(axum::Json(json!({
        "state": "Ready",
        "lowWaterMarks": low_water_marks,
        "ongoingTxnSize": ongoing,
    })))
}

async fn txn_in_pending_ack(
    State(service): Shared,
    Path((tenant, ns, topic, sub, most, least)): Path<(String, String, String, String, u64, u64)>,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic_at(&service, &tenant, &ns, &topic).await?;
    let cumulative = pending_acks_of(&topic, &sub)?
        .cumulative_of(&sub, (most, least))
        .await?;
    Ok(axum::Json(json!({
        "cumulativeAckPosition": position_text(cumulative),
    })))
}
