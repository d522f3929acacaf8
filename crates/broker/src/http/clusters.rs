//! Clusters and replication clusters (Pulsar's `ClustersBase` CRUD and the
//! namespace `/replication` routes of `NamespacesBase`; a topic's own
//! `/replication` is one of `topic_policies`' routes, checked by the same
//! `Admin::check_replication_clusters`).
//!
//! Checks and codes are `admin::clusters`'s; a change of replication
//! clusters wakes the broker's replicators (`Service::replication_changed`).
//! Never: contacts another cluster.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::get;

use super::api::{ApiError, ApiResult, Shared, namespace_of, no_content};
use crate::admin::ClusterData;
use crate::admin::json::{ClusterDataJson, parse_body};
use crate::service::Service;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/admin/v2/clusters", get(list))
        .route(
            "/admin/v2/clusters/{cluster}",
            get(get_cluster)
                .put(create_cluster)
                .post(update_cluster)
                .delete(delete_cluster),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/replication",
            get(get_namespace_replication).post(set_namespace_replication),
        )
}

async fn list(State(service): Shared) -> ApiResult<axum::Json<Vec<String>>> {
    Ok(axum::Json(service.admin.clusters().await?))
}

async fn get_cluster(
    State(service): Shared,
    Path(cluster): Path<String>,
) -> ApiResult<axum::Json<ClusterDataJson>> {
    match service.admin.cluster(&cluster).await? {
        Some(data) => Ok(axum::Json(data.into())),
        None => Err(ApiError::not_found("Cluster does not exist")),
    }
}

/// A ClusterData body; Pulsar answers 400 "cluster data is required"
/// without one.
fn cluster_body(body: &[u8]) -> ApiResult<ClusterData> {
    let data: Option<ClusterDataJson> = parse_body(body, "ClusterData")?;
    data.map(ClusterData::from)
        .ok_or_else(|| ApiError::new(StatusCode::BAD_REQUEST, "cluster data is required"))
}

async fn create_cluster(
    State(service): Shared,
    Path(cluster): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let data = cluster_body(&body)?;
    service.admin.create_cluster(&cluster, &data).await?;
    service.replication_changed();
    no_content()
}

async fn update_cluster(
    State(service): Shared,
    Path(cluster): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let data = cluster_body(&body)?;
    service.admin.update_cluster(&cluster, &data).await?;
    service.replication_changed();
    no_content()
}

async fn delete_cluster(
    State(service): Shared,
    Path(cluster): Path<String>,
) -> ApiResult<StatusCode> {
    if cluster == service.config.cluster_name {
        // The broker's own cluster is in use by definition.
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "Cluster not empty",
        ));
    }
    service.admin.delete_cluster(&cluster).await?;
    service.replication_changed();
    no_content()
}

async fn get_namespace_replication(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<axum::Json<Vec<String>>> {
    let ns = namespace_of(&tenant, &namespace)?;
    let policies = service
        .admin
        .namespace_policies(&ns)
        .await?
        .ok_or_else(|| ApiError::not_found("Namespace does not exist"))?;
    Ok(axum::Json(policies.replication_clusters.unwrap_or_else(
        || vec![service.config.cluster_name.clone()],
    )))
}

async fn set_namespace_replication(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let ns = namespace_of(&tenant, &namespace)?;
    let clusters: Option<Vec<String>> = parse_body(&body, "cluster ids")?;
    if service.admin.namespace_policies(&ns).await?.is_none() {
        return Err(ApiError::not_found("Namespace does not exist"));
    }
    service
        .admin
        .set_namespace_replication(&ns, &clusters.unwrap_or_default())
        .await?;
    service.replication_changed();
    no_content()
}
