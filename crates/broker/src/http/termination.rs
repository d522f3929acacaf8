//! Topic termination (Pulsar's `terminate` and `terminate/partitions`
//! routes): a terminated topic takes no more messages, for good.
//!
//! Answers as Pulsar 4.0 does: 200 with the last message id
//! (`{"ledgerId":L,"entryId":E,"partitionIndex":-1,"batchSize":0,
//! "batchIndex":-1}`, entryId −1 for an empty topic), a map from partition
//! index to that id for `terminate/partitions`; 405 for a partitioned topic
//! on the plain route and for a non-partitioned one on the partitioned
//! route, 406 for a non-persistent topic, 404 for an absent one.
//! Never: terminates anything itself (`Topic::terminate` does).

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::post;
use serde_json::{Map, Value};
use vela_wire::proto::ServerError;

use super::api::{ApiError, ApiResult, Shared, topic_of};
use crate::service::Service;
use crate::topic_name::TopicName;

type TopicPath = Path<(String, String, String, String)>;

pub(super) fn routes() -> Router<Arc<Service>> {
    const T: &str = "/admin/v2/{domain}/{tenant}/{namespace}/{topic}";
    Router::new()
        .route(&format!("{T}/terminate"), post(terminate))
        .route(
            &format!("{T}/terminate/partitions"),
            post(terminate_partitions),
        )
}

/// The persistent topic of a path; 406 for a non-persistent one (Pulsar's
/// `validatePersistentTopicName`).
fn persistent_topic(path: &(String, String, String, String)) -> ApiResult<TopicName> {
    if path.0 == "non-persistent" {
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "Need to provide a persistent topic name",
        ));
    }
    topic_of(&path.0, &path.1, &path.2, &path.3)
}

async fn terminate(State(service): Shared, Path(path): TopicPath) -> ApiResult<axum::Json<Value>> {
    let topic = persistent_topic(&path)?;
    if topic.partition.is_none() && service.admin.partitions(&topic).await?.is_some() {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "Termination of a partitioned topic is not allowed",
        ));
    }
    Ok(axum::Json(terminate_one(&service, &topic).await?))
}

async fn terminate_partitions(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<axum::Json<Value>> {
    let topic = persistent_topic(&path)?;
    let partitions = match service.admin.partitions(&topic).await? {
        Some(n) if topic.partition.is_none() => n,
        _ => {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "Termination of a non-partitioned topic is not allowed using \
                 partitioned-terminate, please use terminate commands",
            ));
        }
    };
    let mut ids = Map::new();
    for index in 0..partitions {
        let id = terminate_one(&service, &topic.partition(index)).await?;
        ids.insert(index.to_string(), id);
    }
    Ok(axum::Json(Value::Object(ids)))
}

/// Terminates one (non-partitioned or partition) topic: its last message id.
async fn terminate_one(service: &Service, topic: &TopicName) -> ApiResult<Value> {
    let served = match service.topic(topic, false).await {
        Ok(served) => served,
        Err(e) if e.code == ServerError::TopicNotFound => {
            return Err(ApiError::not_found(format!("Topic {topic} not found")));
        }
        Err(e) => return Err(e.into()),
    };
    let last = served.terminate().await?;
    // An empty topic answers its current ledger with entry −1, as Pulsar.
    let (ledger_id, entry_id) = match last {
        Some(position) => (position.ledger_id as i64, position.entry_id as i64),
        None => (
            served
                .log
                .ledgers()
                .last()
                .map_or(-1, |l| l.ledger_id as i64),
            -1,
        ),
    };
    Ok(crate::admin::json::message_id_json(ledger_id, entry_id))
}
