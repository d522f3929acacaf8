//! Tiered storage's admin routes, Pulsar's `triggerOffload` and
//! `offloadStatus` (the namespace's offload numbers, `offloadThreshold`,
//! `offloadThresholdInSeconds`, `offloadDeletionLagMs`, are policies of
//! `admin::policy_specs`, served by `http::namespace_policies`):
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
use axum::routing::put;
use serde_json::{Value, json};
use vela_log::{LogError, OffloadState, Position};

use super::api::{ApiError, ApiResult, Shared, no_content, topic_of};
use super::topics::open;
use crate::admin::json::{MessageIdJson, message_id_json, parse_body};
use crate::service::Service;

type TopicPath = Path<(String, String, String, String)>;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new().route(
        "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/offload",
        put(trigger_offload).get(offload_status),
    )
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
