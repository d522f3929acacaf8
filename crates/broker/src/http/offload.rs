//! Tiered storage's admin routes: the namespace's offload numbers
//! (`offloadThreshold`, `offloadThresholdInSeconds`, `offloadDeletionLagMs`,
//! stored with its policies, applied to its served topics at once), and
//! Pulsar's `triggerOffload` and `offloadStatus`:
//! `PUT .../{topic}/offload` with a MessageId body starts
//! offloading the closed ledgers before the one holding that message (204;
//! 409 `Offload already in progress` while one runs); `GET .../offload`
//! answers Pulsar's `OffloadProcessStatus`:
//! `{"status":"NOT_RUN"|"RUNNING"|"SUCCESS"|"ERROR","lastError":"...",
//! "firstUnoffloadedMessage":{MessageIdImpl}}` (earliest, −1:−1, unless
//! SUCCESS). While an offload waits to retry an unreachable store the status
//! is ERROR with the store's error (Pulsar would say RUNNING): the operator
//! sees why nothing moves.
//! Never: offloads anything itself (`ManagedLog::start_offload` does).

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, put};
use serde_json::{Value, json};
use vela_log::{LogError, OffloadState, Position};

use super::api::{ApiError, ApiResult, Shared, namespace_of, no_content, topic_of};
use super::namespaces::{optional, policies_of, update_policies};
use super::topics::open;
use crate::admin::NamespacePolicies;
use crate::admin::json::{MessageIdJson, message_id_json, parse_body};
use crate::service::Service;

type TopicPath = Path<(String, String, String, String)>;

pub(super) fn routes() -> Router<Arc<Service>> {
    const NS: &str = "/admin/v2/namespaces/{tenant}/{namespace}";
    Router::new()
        .route(
            "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/offload",
            put(trigger_offload).get(offload_status),
        )
        .route(
            &format!("{NS}/offloadThreshold"),
            get(get_threshold_bytes).put(set_threshold_bytes),
        )
        .route(
            &format!("{NS}/offloadThresholdInSeconds"),
            get(get_threshold_seconds).put(set_threshold_seconds),
        )
        .route(
            &format!("{NS}/offloadDeletionLagMs"),
            get(get_deletion_lag)
                .put(set_deletion_lag)
                .delete(remove_deletion_lag),
        )
}

type NamespacePath = Path<(String, String)>;

/// A namespace's offload number, as Pulsar answers it (−1 when unset).
async fn get_number(
    service: &Service,
    tenant: &str,
    namespace: &str,
    field: fn(&NamespacePolicies) -> Option<i64>,
    unset: Option<i64>,
) -> ApiResult<axum::Json<Value>> {
    let ns = namespace_of(tenant, namespace)?;
    let policies = policies_of(service, &ns).await?;
    optional(field(&policies).or(unset))
}

fn number_body(body: &[u8], what: &str) -> ApiResult<i64> {
    let value: Option<i64> = parse_body(body, what)?;
    value.ok_or_else(|| ApiError::bad_request(format!("{what} should not be null")))
}

async fn get_threshold_bytes(
    State(service): Shared,
    Path((tenant, namespace)): NamespacePath,
) -> ApiResult<axum::Json<Value>> {
    get_number(
        &service,
        &tenant,
        &namespace,
        |p| p.offload_threshold_bytes,
        Some(-1),
    )
    .await
}

/// pulsar-admin `namespaces set-offload-threshold` (−1: the broker's
/// default, other negatives: off, 0: offload as soon as possible).
async fn set_threshold_bytes(
    State(service): Shared,
    Path((tenant, namespace)): NamespacePath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let bytes = number_body(&body, "offload threshold")?;
    update_policies(&service, &tenant, &namespace, |p| {
        p.offload_threshold_bytes = Some(bytes)
    })
    .await
}

async fn get_threshold_seconds(
    State(service): Shared,
    Path((tenant, namespace)): NamespacePath,
) -> ApiResult<axum::Json<Value>> {
    get_number(
        &service,
        &tenant,
        &namespace,
        |p| p.offload_threshold_seconds,
        Some(-1),
    )
    .await
}

async fn set_threshold_seconds(
    State(service): Shared,
    Path((tenant, namespace)): NamespacePath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let seconds = number_body(&body, "offload threshold in seconds")?;
    update_policies(&service, &tenant, &namespace, |p| {
        p.offload_threshold_seconds = Some(seconds)
    })
    .await
}

async fn get_deletion_lag(
    State(service): Shared,
    Path((tenant, namespace)): NamespacePath,
) -> ApiResult<axum::Json<Value>> {
    get_number(
        &service,
        &tenant,
        &namespace,
        |p| p.offload_deletion_lag_ms,
        None,
    )
    .await
}

/// pulsar-admin `namespaces set-offload-deletion-lag` (ms; negative: keep
/// the bookie copy).
async fn set_deletion_lag(
    State(service): Shared,
    Path((tenant, namespace)): NamespacePath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let lag_ms = number_body(&body, "offload deletion lag")?;
    update_policies(&service, &tenant, &namespace, |p| {
        p.offload_deletion_lag_ms = Some(lag_ms)
    })
    .await
}

async fn remove_deletion_lag(
    State(service): Shared,
    Path((tenant, namespace)): NamespacePath,
) -> ApiResult<StatusCode> {
    update_policies(&service, &tenant, &namespace, |p| {
        p.offload_deletion_lag_ms = None
    })
    .await
}

fn persistent(path: &(String, String, String, String)) -> ApiResult<crate::topic_name::TopicName> {
    if path.0 == "non-persistent" {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "Operation not allowed on non-persistent topic",
        ));
    }
    topic_of(&path.0, &path.1, &path.2, &path.3)
}

/// pulsar-admin `topics offload`: offload everything before the ledger
/// holding the message id in the body.
async fn trigger_offload(
    State(service): Shared,
    Path(path): TopicPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = persistent(&path)?;
    let id: Option<MessageIdJson> = parse_body(&body, "MessageIdImpl")?;
    let Some(id) = id else {
        return Err(ApiError::bad_request("a message id is required"));
    };
    let (Ok(ledger_id), Ok(entry_id)) = (u64::try_from(id.ledger_id), u64::try_from(id.entry_id))
    else {
        return Err(ApiError::bad_request(format!(
            "Invalid position for offload: {}:{}",
            id.ledger_id, id.entry_id
        )));
    };
    let served = open(&service, &topic).await?;
    match served.log.start_offload(Position::new(ledger_id, entry_id)) {
        Ok(()) => no_content(),
        Err(error @ LogError::OffloadInProgress(_)) => {
            Err(ApiError::new(StatusCode::CONFLICT, error.to_string()))
        }
        Err(error) => Err(error.into()),
    }
}

/// pulsar-admin `topics offload-status`.
async fn offload_status(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<axum::Json<Value>> {
    let topic = persistent(&path)?;
    let served = open(&service, &topic).await?;
    Ok(axum::Json(status_json(&served.log.offload_status())))
}

fn status_json(status: &vela_log::OffloadStatus) -> Value {
    let state = match status.state {
        OffloadState::NotRun => "NOT_RUN",
        OffloadState::Running => "RUNNING",
        OffloadState::Success => "SUCCESS",
        OffloadState::Error => "ERROR",
    };
    let first = match (status.state, status.first_unoffloaded) {
        (OffloadState::Success, Some(first)) => {
            // Positions past i64 cannot come from a ledger id allocator.
            message_id_json(
                i64::try_from(first.ledger_id).unwrap_or(i64::MAX),
                i64::try_from(first.entry_id).unwrap_or(i64::MAX),
            )
        }
        _ => message_id_json(-1, -1),
    };
    json!({
        "status": state,
        "lastError": status.last_error,
        "firstUnoffloadedMessage": first,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn status_has_pulsars_shape() {
        let success = vela_log::OffloadStatus {
            state: OffloadState::Success,
            last_error: String::new(),
            first_unoffloaded: Some(Position::new(12, 0)),
            running: false,
        };
        let value = status_json(&success);
        assert_eq!(value["status"], "SUCCESS");
        assert_eq!(value["lastError"], "");
        assert_eq!(value["firstUnoffloadedMessage"]["ledgerId"], 12);
        assert_eq!(value["firstUnoffloadedMessage"]["entryId"], 0);
        let error = vela_log::OffloadStatus {
            state: OffloadState::Error,
            last_error: "object store: down".to_string(),
            first_unoffloaded: None,
            running: true,
        };
        let value = status_json(&error);
        assert_eq!(value["status"], "ERROR");
        assert_eq!(value["lastError"], "object store: down");
        assert_eq!(value["firstUnoffloadedMessage"]["ledgerId"], -1);
    }
}
