//! `/admin/v3/transactions/...`: the transaction coordinator's views.
//!
//! `transactionMetadata/{mostBits}/{leastBits}` answers Pulsar's
//! `TransactionMetadata` JSON (`txnId`, `status`, `openTimestamp`,
//! `timeoutAt`, `producedPartitions` {topic → buffer stats},
//! `ackedPartitions` {topic → {subscription → pending-ack stats}}); 404 when
//! the transaction is not open (ended transactions are forgotten, as in
//! Pulsar) or its coordinator is not open on this broker; 503 when
//! transactions are off, with Pulsar's message.
//! Never: changes a transaction.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;
use serde_json::{Map, Value, json};

use super::api::{ApiError, ApiResult, Shared};
use crate::service::Service;
use crate::transaction::{TxnError, TxnId};

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new().route(
        "/admin/v3/transactions/transactionMetadata/{most}/{least}",
        get(transaction_metadata),
    )
}

async fn transaction_metadata(
    State(service): Shared,
    Path((most, least)): Path<(u64, u64)>,
) -> ApiResult<axum::Json<Value>> {
    let Some(transactions) = &service.transactions else {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "This Broker is not configured with transactionCoordinatorEnabled=true.",
        ));
    };
    let id = TxnId { most, least };
    let view = match transactions.view(id) {
        Ok(Some(view)) => view,
        Ok(None) | Err(TxnError::NotFound(_)) => {
            return Err(ApiError::not_found(TxnError::NotFound(id).to_string()));
        }
        Err(error) => return Err(ApiError::not_found(error.to_string())),
    };
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
    Ok(axum::Json(json!({
        "txnId": view.id.to_string(),
        "status": view.status.name(),
        "openTimestamp": view.open_unix_ms,
        "timeoutAt": view.timeout_ms,
        "owner": view.owner,
        "producedPartitions": produced,
        "ackedPartitions": acked,
    })))
}
