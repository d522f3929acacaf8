//! Reading messages over REST (Pulsar's `PersistentTopicsBase`): an entry
//! by ledger and entry id, the n-th unacknowledged entry of a subscription
//! (peek), the message id of the first message published at or after a
//! time, and the last message id.
//!
//! An entry is answered as Pulsar's `generateResponseWithEntry`: the body is
//! its payload, uncompressed (for a batch, the batch's payload: each message
//! with its single metadata), headers `X-Pulsar-Message-ID`
//! (`ledger:entry`), `X-Pulsar-publish-time`, `X-Pulsar-Property` (the
//! properties as JSON: header names lose case), and for a batch
//! `X-Pulsar-num-batch-message`.
//! A peek on a subscription that does not exist creates it at the earliest
//! entry (as Pulsar's `getSubscriptionReference`).
//! Bounds: a peek scans at most `PEEK_SCAN_ENTRIES_MAX` entries; a payload
//! is uncompressed to at most the broker's largest message.
//! Never: changes a cursor.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::{HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use bytes::Bytes;
use serde_json::json;
use vela_log::{ManagedLog, Position};
use vela_wire::proto;

use super::api::{ApiError, ApiResult, Shared, topic_of};
use crate::service::Service;
use crate::topic::Topic;
use crate::topic_name::TopicName;

/// Entries a peek reads past acknowledged ones before giving up (a
/// subscription whose first thousands of entries are acknowledged one by
/// one is rare; each costs a read).
const PEEK_SCAN_ENTRIES_MAX: u64 = 100_000;

const T: &str = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}";

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route(
            &format!("{T}/ledger/{{ledger}}/entry/{{entry}}"),
            get(entry_by_id),
        )
        .route(
            &format!("{T}/subscription/{{subscription}}/position/{{n}}"),
            get(peek),
        )
        .route(&format!("{T}/messageid/{{timestamp}}"), get(id_by_time))
        .route(&format!("{T}/lastMessageId"), get(last_message_id))
}

/// A served, existing (non-partitioned or partition) topic.
async fn served(
    service: &Service,
    path: &(String, String, String, String),
) -> ApiResult<(TopicName, Arc<Topic>)> {
    let topic = topic_of(&path.0, &path.1, &path.2, &path.3)?;
    if topic.partition.is_none() && service.admin.partitions(&topic).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            format!("{topic} is a partitioned topic: ask one of its partitions"),
        ));
    }
    match service.topic(&topic, false).await {
        Ok(served) => Ok((topic, served)),
        Err(e) if e.code == proto::ServerError::TopicNotFound => {
            Err(ApiError::not_found(format!("Topic {topic} not found")))
        }
        Err(e) => Err(e.into()),
    }
}

async fn read_at(log: &ManagedLog, position: Position) -> ApiResult<Option<Bytes>> {
    let entries = log.read(position, 1, 1).await?;
    Ok(entries
        .into_iter()
        .next()
        .filter(|e| e.position == position)
        .map(|e| e.data))
}

/// `2026-11-26T15:04:05.123Z` for a Unix time in ms.
fn iso_time(ms: u64) -> String {
    let seconds = ms / 1000;
    let days = (seconds / 86_400) as i64;
    let (hour, minute, second) = (seconds / 3600 % 24, seconds / 60 % 60, seconds % 60);
    // Civil date from days since 1970-01-01 (proleptic Gregorian).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let day_of_era = z.rem_euclid(146_097);
    let year_of_era =
        (day_of_era - day_of_era / 1460 + day_of_era / 36_524 - day_of_era / 146_096) / 365;
    let day_of_year = day_of_era - (365 * year_of_era + year_of_era / 4 - year_of_era / 100);
    let mp = (5 * day_of_year + 2) / 153;
    let day = day_of_year - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = year_of_era + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02}T{hour:02}:{minute:02}:{second:02}.{:03}Z",
        ms % 1000
    )
}

/// An entry as Pulsar answers it.
fn entry_response(service: &Service, position: Position, entry: &Bytes) -> ApiResult<Response> {
    let corrupt = || {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!(
                "entry {}:{} is unreadable",
                position.ledger_id, position.entry_id
            ),
        )
    };
    let metadata = crate::codec::entry_metadata(entry).ok_or_else(corrupt)?;
    let size_bytes: [u8; 4] = entry
        .get(6..10)
        .and_then(|b| b.try_into().ok())
        .ok_or_else(corrupt)?;
    let payload_at = 10 + u32::from_be_bytes(size_bytes) as usize;
    let payload = entry.get(payload_at..).ok_or_else(corrupt)?;
    let codec = proto::CompressionType::try_from(metadata.compression.unwrap_or(0))
        .unwrap_or(proto::CompressionType::None);
    let payload = vela_wire::compression::decompress(
        codec,
        payload,
        metadata.uncompressed_size.unwrap_or(0) as usize,
        service.config.max_message_size_bytes.max(payload.len()) * 2,
    )
    .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let mut headers = HeaderMap::new();
    let mut put = |name: &'static str, value: String| {
        if let Ok(value) = HeaderValue::from_str(&value) {
            headers.insert(name, value);
        }
    };
    put(
        "X-Pulsar-Message-ID",
        format!("{}:{}", position.ledger_id, position.entry_id),
    );
    put("X-Pulsar-publish-time", iso_time(metadata.publish_time));
    if let Some(count) = metadata.num_messages_in_batch {
        put("X-Pulsar-num-batch-message", count.to_string());
        put("X-Pulsar-batch-size", payload.len().to_string());
    }
    if !metadata.properties.is_empty() {
        let properties: serde_json::Map<String, serde_json::Value> = metadata
            .properties
            .iter()
            .map(|kv| (kv.key.clone(), kv.value.clone().into()))
            .collect();
        put(
            "X-Pulsar-Property",
            serde_json::Value::Object(properties).to_string(),
        );
    }
    if let Some(key) = &metadata.partition_key {
        put("X-Pulsar-partition-key", key.clone());
    }
    put("X-Pulsar-sequence-id", metadata.sequence_id.to_string());
    put("X-Pulsar-producer-name", metadata.producer_name.clone());
    headers.insert(
        axum::http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/octet-stream"),
    );
    Ok((headers, payload).into_response())
}

async fn entry_by_id(
    State(service): Shared,
    Path((domain, tenant, namespace, topic, ledger, entry)): Path<(
        String,
        String,
        String,
        String,
        u64,
        u64,
    )>,
) -> ApiResult<Response> {
    let (_, served) = served(&service, &(domain, tenant, namespace, topic)).await?;
    let position = Position::new(ledger, entry);
    match read_at(&served.log, position).await? {
        Some(data) => entry_response(&service, position, &data),
        None => Err(ApiError::not_found("Message not found")),
    }
}

async fn peek(
    State(service): Shared,
    Path((domain, tenant, namespace, topic, subscription, n)): Path<(
        String,
        String,
        String,
        String,
        String,
        u64,
    )>,
) -> ApiResult<Response> {
    let (_, served) = served(&service, &(domain, tenant, namespace, topic)).await?;
    if served.log.cursor(&subscription).is_none() {
        // As Pulsar's getSubscriptionReference: a peek on a subscription
        // that does not exist creates it at the earliest entry.
        match served
            .create_subscription(
                &subscription,
                crate::topic::cursor_admin::SubscriptionStart::Earliest,
            )
            .await
        {
            Ok(()) | Err(crate::admin::AdminError::Exists(_)) => {}
            Err(e) => return Err(e.into()),
        }
    }
    let Some(cursor) = served.log.cursor(&subscription) else {
        return Err(ApiError::not_found("Subscription not found"));
    };
    if n == 0 {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "Message position should be greater than 0",
        ));
    }
    let mut after = cursor.mark_delete_position();
    let mut unacked = 0u64;
    for _ in 0..PEEK_SCAN_ENTRIES_MAX {
        let Some(position) = served.log.position_after(after, 1) else {
            break;
        };
        after = Some(position);
        if cursor.is_acked(position) {
            continue;
        }
        unacked += 1;
        if unacked == n {
            return match read_at(&served.log, position).await? {
                Some(data) => entry_response(&service, position, &data),
                None => Err(ApiError::not_found("Message not found")),
            };
        }
    }
    Err(ApiError::not_found("Message not found"))
}

async fn id_by_time(
    State(service): Shared,
    Path((domain, tenant, namespace, topic, timestamp)): Path<(
        String,
        String,
        String,
        String,
        u64,
    )>,
) -> ApiResult<Response> {
    let (name, served) = served(&service, &(domain, tenant, namespace, topic)).await?;
    let position = crate::subscription::first_published_at_or_after(&served.log, timestamp).await?;
    if read_at(&served.log, position).await?.is_none() {
        return Err(ApiError::not_found(format!(
            "Message ID not found for timestamp {timestamp}"
        )));
    }
    Ok(axum::Json(json!({
        "ledgerId": position.ledger_id,
        "entryId": position.entry_id,
        "partitionIndex": name.partition_index(),
    }))
    .into_response())
}

async fn last_message_id(
    State(service): Shared,
    Path(path): Path<(String, String, String, String)>,
) -> ApiResult<Response> {
    let (name, served) = served(&service, &path).await?;
    let (ledger_id, entry_id) = match served.log.last_confirmed() {
        Some(last) => (last.ledger_id as i64, last.entry_id as i64),
        None => (-1, -1),
    };
    Ok(axum::Json(json!({
        "ledgerId": ledger_id,
        "entryId": entry_id,
        "partitionIndex": name.partition_index(),
    }))
    .into_response())
}

#[cfg(test)]
mod tests {
    use super::iso_time;

    #[test]
    fn times_are_iso_8601_utc() {
        assert_eq!(iso_time(0), "1970-01-01T00:00:00.000Z");
        assert_eq!(iso_time(951_782_400_123), "2000-02-29T00:00:00.123Z");
        assert_eq!(iso_time(1_795_702_161_971), "2026-11-26T14:09:21.971Z");
    }
}
