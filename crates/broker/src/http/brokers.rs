//! Vela's broker-level routes: the health probe, `/metrics` (Prometheus
//! text, written by `prometheus`), the write-path and read-path breakdowns
//! (`/admin/v2/vela/write-path`, `/admin/v2/vela/read-path`) and Pulsar's
//! `BrokersBase` routes: the active brokers, the leader, the dynamic
//! configuration (`broker_config`).
//! Never: keeps state; every figure comes from the service's metrics.

use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::{Value, json};
use vela_metrics::Snapshot;

use super::api::{ApiError, ApiResult, Params, Shared};
use super::prometheus;
use crate::config::CLUSTER_NAME;
use crate::metrics::Stage;
use crate::service::Service;
use crate::topic_name::TopicName;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/admin/v2/brokers/health", get(health))
        .route("/metrics", get(metrics))
        .route("/metrics/", get(metrics))
        .route("/admin/v2/vela/write-path", get(write_path))
        .route("/admin/v2/vela/read-path", get(read_path))
        .route("/admin/v2/brokers/leaderBroker", get(leader_broker))
        .route("/admin/v2/brokers", get(local_brokers))
        .route("/admin/v2/brokers/{cluster}", get(active_brokers))
        .merge(super::broker_config::routes())
}

/// The brokers serving now: this one alone in standalone mode, else every
/// registered broker, sorted by id.
async fn brokers_now(service: &Service) -> ApiResult<Vec<crate::ownership::BrokerInfo>> {
    let mut brokers = match service.ownership.get() {
        Some(ownership) => ownership
            .brokers()
            .await
            .map_err(|e| ApiError::from(crate::service::ownership_error(e)))?,
        None => vec![service.me()],
    };
    brokers.sort_by(|a, b| a.id.cmp(&b.id));
    Ok(brokers)
}

/// `GET /admin/v2/brokers/{cluster}`: the ids of the active brokers.
async fn active_brokers(
    State(service): Shared,
    Path(cluster): Path<String>,
) -> ApiResult<axum::Json<Vec<String>>> {
    if cluster != CLUSTER_NAME {
        return Err(ApiError::not_found(format!(
            "Cluster {cluster} does not exist"
        )));
    }
    let brokers = brokers_now(&service).await?;
    Ok(axum::Json(brokers.into_iter().map(|b| b.id).collect()))
}

/// `GET /admin/v2/brokers`: the ids of the local cluster's active brokers.
async fn local_brokers(State(service): Shared) -> ApiResult<axum::Json<Vec<String>>> {
    let brokers = brokers_now(&service).await?;
    Ok(axum::Json(brokers.into_iter().map(|b| b.id).collect()))
}

/// `GET /admin/v2/brokers/leaderBroker`. Vela elects no leader (placement
/// is decided in the metadata store by whichever broker a lookup reaches);
/// the answer is the active broker with the smallest id, the same on every
/// broker.
async fn leader_broker(State(service): Shared) -> ApiResult<axum::Json<Value>> {
    let brokers = brokers_now(&service).await?;
    let Some(leader) = brokers.first() else {
        return Err(ApiError::not_found("no active broker"));
    };
    Ok(axum::Json(json!({
        "serviceUrl": leader.http_url,
        "brokerId": leader.id,
    })))
}

/// One row of a stage breakdown: count, mean, percentiles and a bound on the
/// maximum (µs), with the bucket counts.
fn stage_row(stage: &str, scope: &str, latency: &Snapshot) -> serde_json::Value {
    let summary = latency.summary();
    json!({
        "stage": stage,
        "scope": scope,
        "count": summary.count,
        "sum_us": latency.sum,
        "mean_us": summary.mean,
        "p50_us": summary.p50,
        "p99_us": summary.p99,
        "p999_us": summary.p999,
        // The upper bound of the highest non-empty bucket: the slowest
        // sample was at most this.
        "max_us": summary.max,
        "buckets": latency.buckets.to_vec(),
    })
}

/// Rows of `stages` from every instance: one merged row when a stage runs
/// on several instances (bookies), then each.
fn stage_rows(service: &Service, stages: &[Stage], rows: &mut Vec<serde_json::Value>) {
    let all = service.write_path();
    for &stage in stages {
        let instances: Vec<_> = all.iter().filter(|s| s.stage == stage).collect();
        if instances.len() > 1 {
            let mut merged = Snapshot::default();
            for s in &instances {
                merged.merge(&s.latency);
            }
            rows.push(stage_row(stage.as_str(), "all", &merged));
        }
        for s in instances {
            rows.push(stage_row(stage.as_str(), &s.instance, &s.latency));
        }
    }
}

/// `GET /admin/v2/vela/read-path`: as `write-path`, for the read-path
/// stages (dispatcher read wait and read, ledger read, bookie read from
/// cache and from entry logs), plus the bytes each stage read.
async fn read_path(State(service): Shared) -> ApiResult<Response> {
    let mut rows = Vec::new();
    stage_rows(&service, &Stage::READ_PATH, &mut rows);
    let bytes: Vec<serde_json::Value> = service
        .storage_metrics()
        .into_iter()
        .filter(|m| m.family == crate::metrics::StorageFamily::ReadBytes)
        .map(|m| {
            json!({
                "stage": m.label.map(|(_, v)| v).unwrap_or_default(),
                "scope": m.instance,
                "bytes": m.value as u64,
            })
        })
        .collect();
    Ok(axum::Json(json!({
        "bucket_bounds_us": vela_metrics::BUCKET_BOUNDS.to_vec(),
        "stages": rows,
        "bytes": bytes,
    }))
    .into_response())
}

async fn health() -> &'static str {
    "ok"
}

async fn metrics(State(service): Shared) -> Response {
    let text = prometheus::render(&service).await;
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// `GET /admin/v2/vela/write-path[?topic=T]`: count, mean, percentiles and
/// a bound on the maximum of each write-path stage (µs), with the bucket counts (bounds in
/// `bucket_bounds_us`, the last bucket is the overflow) so a caller can
/// subtract two snapshots; with a topic, its own broker publish and storage
/// write latencies come first (stages below the log are shared by every
/// topic).
async fn write_path(State(service): Shared, Query(params): Params) -> ApiResult<Response> {
    let mut rows = Vec::new();
    let mut add = |stage: &str, scope: &str, latency: &Snapshot| {
        rows.push(stage_row(stage, scope, latency));
    };
    let topic = params.get("topic").filter(|t| !t.is_empty());
    if let Some(topic) = topic {
        let name = TopicName::parse(topic)?;
        let partitions = match name.partition {
            None => service.admin.partitions(&name).await?,
            Some(_) => None,
        };
        let names: Vec<TopicName> = match partitions {
            Some(n) => (0..n).map(|i| name.partition(i)).collect(),
            None => vec![name.clone()],
        };
        let mut publish = Snapshot::default();
        let mut storage = Snapshot::default();
        for name in &names {
            let served = service.topic(name, false).await?;
            publish.merge(&served.metrics.publish_latency.snapshot());
            storage.merge(&served.metrics.storage_write_latency.snapshot());
        }
        add("broker_publish", "topic", &publish);
        add("storage_write", "topic", &storage);
    }
    // Same stage on several instances (bookies): one merged row, then each.
    stage_rows(&service, &Stage::WRITE_PATH, &mut rows);
    Ok(axum::Json(json!({
        "topic": topic,
        "bucket_bounds_us": vela_metrics::BUCKET_BOUNDS.to_vec(),
        "stages": rows,
    }))
    .into_response())
}
