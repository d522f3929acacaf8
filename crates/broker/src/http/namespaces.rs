//! Clusters, tenants, namespaces and namespace policies (Pulsar's
//! `ClustersBase`, `TenantsBase`, `NamespacesBase` routes).
//!
//! Policy changes are stored, then applied to the namespace's served topics
//! (`Service::apply_policies`: a new persistence reaches each topic's next
//! ledger). Retention, message TTL and backlog quotas are stored and served
//! back; the broker does not enforce them yet.

use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::get;
use serde_json::{Value, json};

use super::api::{ApiError, ApiResult, Params, Shared, flag, namespace_of, no_content};
use crate::admin::NamespacePolicies;
use crate::admin::json::{
    self, BacklogQuotaJson, PersistenceJson, PoliciesBody, RetentionJson, TenantInfoJson,
    parse_body,
};
use crate::config::CLUSTER_NAME;
use crate::service::Service;
use crate::topic_name::NamespaceName;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/admin/v2/clusters", get(clusters))
        .route("/admin/v2/tenants", get(tenants))
        .route(
            "/admin/v2/tenants/{tenant}",
            get(get_tenant)
                .put(create_tenant)
                .post(update_tenant)
                .delete(delete_tenant),
        )
        .route("/admin/v2/namespaces/{tenant}", get(namespaces))
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}",
            get(get_namespace)
                .put(create_namespace)
                .delete(delete_namespace),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/topics",
            get(namespace_topics),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/persistence",
            get(get_persistence)
                .post(set_persistence)
                .delete(remove_persistence),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/retention",
            get(get_retention)
                .post(set_retention)
                .delete(remove_retention),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/messageTTL",
            get(get_ttl).post(set_ttl).delete(remove_ttl),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/compactionThreshold",
            get(get_compaction_threshold)
                .put(set_compaction_threshold)
                .post(set_compaction_threshold)
                .delete(remove_compaction_threshold),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/deduplication",
            get(get_dedup).post(set_dedup).delete(remove_dedup),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/backlogQuotaMap",
            get(get_backlog_quotas),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/backlogQuota",
            axum::routing::post(set_backlog_quota).delete(remove_backlog_quota),
        )
}

async fn clusters() -> axum::Json<Value> {
    axum::Json(json!([CLUSTER_NAME]))
}

async fn tenants(State(service): Shared) -> ApiResult<axum::Json<Vec<String>>> {
    Ok(axum::Json(service.admin.tenants().await?))
}

fn check_tenant_name(tenant: &str) -> ApiResult<()> {
    // The same rule as namespace names (Pulsar's NamedEntity.checkName).
    NamespaceName::parse(&format!("{tenant}/x"))
        .map(|_| ())
        .map_err(|_| ApiError::new(StatusCode::PRECONDITION_FAILED, "Tenant name is not valid"))
}

async fn get_tenant(
    State(service): Shared,
    Path(tenant): Path<String>,
) -> ApiResult<axum::Json<TenantInfoJson>> {
    match service.admin.tenant_info(&tenant).await? {
        Some(info) => Ok(axum::Json(info.into())),
        None => Err(ApiError::not_found("Tenant does not exist")),
    }
}

async fn create_tenant(
    State(service): Shared,
    Path(tenant): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    check_tenant_name(&tenant)?;
    let info: Option<TenantInfoJson> = parse_body(&body, "TenantInfo")?;
    let info = info.unwrap_or_default().to_info()?;
    match service.admin.create_tenant_with(&tenant, &info).await {
        Err(crate::admin::AdminError::Exists(_)) => {
            Err(ApiError::new(StatusCode::CONFLICT, "Tenant already exist"))
        }
        other => {
            other?;
            no_content()
        }
    }
}

async fn update_tenant(
    State(service): Shared,
    Path(tenant): Path<String>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let info: Option<TenantInfoJson> = parse_body(&body, "TenantInfo")?;
    let info = info.unwrap_or_default().to_info()?;
    service.admin.update_tenant(&tenant, &info).await?;
    no_content()
}

async fn delete_tenant(
    State(service): Shared,
    Path(tenant): Path<String>,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    if flag(&params, "force") {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "Broker doesn't allow forced deletion of tenants",
        ));
    }
    if !service.admin.tenant_exists(&tenant).await? {
        return Err(ApiError::not_found("Tenant doesn't exist"));
    }
    if !service.admin.namespaces(&tenant).await?.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "The tenant still has active namespaces",
        ));
    }
    service.admin.delete_tenant(&tenant).await?;
    no_content()
}

async fn namespaces(
    State(service): Shared,
    Path(tenant): Path<String>,
) -> ApiResult<axum::Json<Vec<String>>> {
    if !service.admin.tenant_exists(&tenant).await? {
        return Err(ApiError::not_found("Tenant does not exist"));
    }
    Ok(axum::Json(service.admin.namespaces(&tenant).await?))
}

/// The namespace's policies, or 404 as Pulsar answers it.
async fn policies_of(service: &Service, ns: &NamespaceName) -> ApiResult<NamespacePolicies> {
    service
        .admin
        .namespace_policies(ns)
        .await?
        .ok_or_else(|| ApiError::not_found("Namespace does not exist"))
}

/// Reads, changes and stores a namespace's policies, then applies them.
async fn update_policies(
    service: &Service,
    tenant: &str,
    namespace: &str,
    change: impl FnOnce(&mut NamespacePolicies),
) -> ApiResult<StatusCode> {
    let ns = namespace_of(tenant, namespace)?;
    let mut policies = policies_of(service, &ns).await?;
    change(&mut policies);
    service.admin.set_namespace_policies(&ns, &policies).await?;
    service.apply_policies(&ns, &policies);
    no_content()
}

async fn get_namespace(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<axum::Json<Value>> {
    let ns = namespace_of(&tenant, &namespace)?;
    let policies = policies_of(&service, &ns).await?;
    Ok(axum::Json(json::policies_json(&policies)))
}

async fn create_namespace(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let ns = namespace_of(&tenant, &namespace)?;
    let body: Option<PoliciesBody> = parse_body(&body, "Policies")?;
    let policies = match body {
        Some(body) => body.to_policies()?,
        None => NamespacePolicies::default(),
    };
    if !service.admin.tenant_exists(&tenant).await? {
        return Err(ApiError::not_found("Tenant does not exist"));
    }
    match service.admin.create_namespace(&ns, policies).await {
        Err(crate::admin::AdminError::Exists(_)) => Err(ApiError::new(
            StatusCode::CONFLICT,
            "Namespace already exists",
        )),
        other => {
            other?;
            no_content()
        }
    }
}

async fn delete_namespace(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    let ns = namespace_of(&tenant, &namespace)?;
    policies_of(&service, &ns).await?;
    if flag(&params, "force") {
        return Err(ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "Broker doesn't allow forced deletion of namespaces",
        ));
    }
    if !service.admin.topics_of_namespace(&ns).await?.is_empty() {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "Cannot delete non empty namespace",
        ));
    }
    service.admin.delete_namespace(&ns).await?;
    no_content()
}

async fn namespace_topics(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    Query(params): Params,
) -> ApiResult<axum::Json<Vec<String>>> {
    let ns = namespace_of(&tenant, &namespace)?;
    policies_of(&service, &ns).await?;
    let mode = params.get("mode").map(|m| m.to_ascii_uppercase());
    let mode = mode.as_deref().unwrap_or("PERSISTENT");
    let mut topics = Vec::new();
    if mode != "NON_PERSISTENT" {
        topics.extend(service.admin.topics_of_namespace(&ns).await?);
    }
    if mode == "NON_PERSISTENT" || mode == "ALL" {
        // As Pulsar: the non-persistent topics served here, and every
        // partition of the non-persistent partitioned topics.
        let mut np = service.non_persistent_topics_of(&ns, false);
        let domain = crate::topic_name::TopicDomain::NonPersistent;
        for base in service
            .admin
            .partitioned_topics_of_namespace(&ns, domain)
            .await?
        {
            let base = crate::topic_name::TopicName::parse(&base)?;
            let n = service.admin.partitions(&base).await?.unwrap_or(0);
            np.extend((0..n).map(|i| base.partition(i).to_string()));
        }
        np.sort();
        np.dedup();
        topics.extend(np);
    }
    Ok(axum::Json(topics))
}

/// A policy's value, or 204 without a body when unset (Pulsar's answer for
/// a null value; the Go and Java clients read it as no value).
fn optional<T: serde::Serialize>(value: Option<T>) -> ApiResult<Response> {
    let value = value
        .map(serde_json::to_value)
        .transpose()
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    Ok(super::topic_policies::policy_answer(value))
}

async fn get_persistence(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<Response> {
    let ns = namespace_of(&tenant, &namespace)?;
    let policies = policies_of(&service, &ns).await?;
    // The whole body as set (the mark-delete rate Vela keeps but does not
    // apply), else the replication alone.
    if policies.persistence.is_some()
        && let Some(stored) = policies.policies.get("persistence")
    {
        return optional(Some(stored.clone()));
    }
    optional(policies.persistence.map(PersistenceJson::from_policy))
}

async fn set_persistence(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let persistence: Option<PersistenceJson> = parse_body(&body, "PersistencePolicies")?;
    let Some(persistence) = persistence else {
        return Err(ApiError::bad_request(
            "persistence policies should not be null",
        ));
    };
    let stored = serde_json::to_value(&persistence)
        .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
    let persistence = persistence.to_policy()?;
    update_policies(&service, &tenant, &namespace, |p| {
        p.persistence = Some(persistence);
        p.policies.insert("persistence".to_string(), stored);
    })
    .await
}

async fn remove_persistence(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    update_policies(&service, &tenant, &namespace, |p| {
        p.persistence = None;
        p.policies.remove("persistence");
    })
    .await
}

async fn get_retention(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<Response> {
    let ns = namespace_of(&tenant, &namespace)?;
    let policies = policies_of(&service, &ns).await?;
    optional(policies.retention.map(RetentionJson::from))
}

async fn set_retention(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let retention: Option<RetentionJson> = parse_body(&body, "RetentionPolicies")?;
    let Some(retention) = retention else {
        return Err(ApiError::bad_request(
            "retention policies should not be null",
        ));
    };
    update_policies(&service, &tenant, &namespace, |p| {
        p.retention = Some(retention.into())
    })
    .await
}

async fn remove_retention(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    update_policies(&service, &tenant, &namespace, |p| p.retention = None).await
}

async fn get_ttl(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<Response> {
    let ns = namespace_of(&tenant, &namespace)?;
    optional(policies_of(&service, &ns).await?.message_ttl_seconds)
}

async fn set_ttl(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let ttl: Option<i64> = parse_body(&body, "message TTL")?;
    let Some(ttl) = ttl else {
        return Err(ApiError::bad_request("message TTL should not be null"));
    };
    let ttl = json::ttl_seconds(ttl)?;
    update_policies(&service, &tenant, &namespace, |p| {
        p.message_ttl_seconds = Some(ttl)
    })
    .await
}

async fn remove_ttl(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    update_policies(&service, &tenant, &namespace, |p| {
        p.message_ttl_seconds = None
    })
    .await
}

async fn get_compaction_threshold(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<Response> {
    let ns = namespace_of(&tenant, &namespace)?;
    optional(policies_of(&service, &ns).await?.compaction_threshold_bytes)
}

/// Backlog bytes (not yet compacted) that start a compaction; 0 turns it off.
async fn set_compaction_threshold(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let threshold: Option<i64> = parse_body(&body, "compaction threshold")?;
    let threshold = match threshold {
        Some(bytes) if bytes >= 0 => bytes as u64,
        Some(bytes) => {
            return Err(ApiError::new(
                StatusCode::PRECONDITION_FAILED,
                format!("compactionThreshold must be 0 or more, got {bytes}"),
            ));
        }
        None => {
            return Err(ApiError::bad_request(
                "compaction threshold should not be null",
            ));
        }
    };
    update_policies(&service, &tenant, &namespace, |p| {
        p.compaction_threshold_bytes = Some(threshold)
    })
    .await
}

async fn remove_compaction_threshold(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    update_policies(&service, &tenant, &namespace, |p| {
        p.compaction_threshold_bytes = None
    })
    .await
}

async fn get_dedup(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<Response> {
    let ns = namespace_of(&tenant, &namespace)?;
    optional(policies_of(&service, &ns).await?.deduplication_enabled)
}

async fn set_dedup(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let enabled: Option<bool> = parse_body(&body, "deduplication flag")?;
    let Some(enabled) = enabled else {
        return Err(ApiError::bad_request(
            "deduplication flag should not be null",
        ));
    };
    update_policies(&service, &tenant, &namespace, |p| {
        p.deduplication_enabled = Some(enabled)
    })
    .await
}

async fn remove_dedup(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    update_policies(&service, &tenant, &namespace, |p| {
        p.deduplication_enabled = None
    })
    .await
}

async fn get_backlog_quotas(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<axum::Json<Value>> {
    let ns = namespace_of(&tenant, &namespace)?;
    let policies = policies_of(&service, &ns).await?;
    let map: serde_json::Map<String, Value> = policies
        .backlog_quotas
        .iter()
        .map(|(kind, quota)| {
            let value =
                serde_json::to_value(BacklogQuotaJson::from_quota(quota)).unwrap_or(Value::Null);
            (kind.clone(), value)
        })
        .collect();
    Ok(axum::Json(Value::Object(map)))
}

fn quota_type(params: &std::collections::HashMap<String, String>) -> String {
    params
        .get("backlogQuotaType")
        .cloned()
        .unwrap_or_else(|| "destination_storage".to_string())
}

async fn set_backlog_quota(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    Query(params): Params,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let quota: Option<BacklogQuotaJson> = parse_body(&body, "BacklogQuota")?;
    let Some(quota) = quota else {
        return Err(ApiError::bad_request("backlog quota should not be null"));
    };
    let kind = quota_type(&params);
    let quota = quota.to_quota();
    update_policies(&service, &tenant, &namespace, |p| {
        p.backlog_quotas.insert(kind, quota);
    })
    .await
}

async fn remove_backlog_quota(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    let kind = quota_type(&params);
    update_policies(&service, &tenant, &namespace, |p| {
        p.backlog_quotas.remove(&kind);
    })
    .await
}
