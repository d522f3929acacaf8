//! Clusters and replication clusters (Pulsar's `ClustersBase` CRUD, the
//! namespace `/replication` routes of `NamespacesBase` and the topic-level
//! `/replication` routes of `PersistentTopicsBase`).
//!
//! Checks and codes are `admin::clusters`'s; a change of replication
//! clusters wakes the broker's replicators (`Service::replication_changed`).
//! Never: contacts another cluster.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::routing::get;

use super::api::{ApiError, ApiResult, Params, Shared, flag, namespace_of, no_content, topic_of};
use crate::admin::ClusterData;
use crate::admin::json::{ClusterDataJson, parse_body};
use crate::service::Service;
use crate::topic_name::TopicDomain;

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
        .route(
            "/admin/v2/{domain}/{tenant}/{namespace}/{topic}/replication",
            get(get_topic_replication)
                .post(set_topic_replication)
                .delete(remove_topic_replication),
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

type TopicPath = Path<(String, String, String, String)>;

fn persistent_topic(
    (domain, tenant, namespace, topic): &(String, String, String, String),
) -> ApiResult<crate::topic_name::TopicName> {
    let topic = topic_of(domain, tenant, namespace, topic)?;
    if topic.domain != TopicDomain::Persistent {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "Replication is only for persistent topics",
        ));
    }
    Ok(topic)
}

/// A topic's own replication clusters; with `?applied=true` its namespace's
/// when it has none. No list to answer: 204, as Pulsar's null.
async fn get_topic_replication(
    State(service): Shared,
    Path(path): TopicPath,
    Query(params): Params,
) -> ApiResult<axum::response::Response> {
    use axum::response::IntoResponse;
    let topic = persistent_topic(&path)?;
    let own = service.admin.topic_replication(&topic).await?;
    let clusters = match own {
        Some(own) => Some(own),
        None if flag(&params, "applied") => Some(
            service
                .admin
                .effective_replication(&topic, &service.config.cluster_name)
                .await?,
        ),
        None => None,
    };
    Ok(match clusters {
        Some(clusters) => axum::Json(clusters).into_response(),
        None => StatusCode::NO_CONTENT.into_response(),
    })
}

async fn set_topic_replication(
    State(service): Shared,
    Path(path): TopicPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let topic = persistent_topic(&path)?;
    let clusters: Option<Vec<String>> = parse_body(&body, "cluster ids")?;
    service
        .admin
        .set_topic_replication(&topic, Some(&clusters.unwrap_or_default()))
        .await?;
    service.replication_changed();
    no_content()
}

async fn remove_topic_replication(
    State(service): Shared,
    Path(path): TopicPath,
) -> ApiResult<StatusCode> {
    let topic = persistent_topic(&path)?;
    service.admin.set_topic_replication(&topic, None).await?;
    service.replication_changed();
    no_content()
}
