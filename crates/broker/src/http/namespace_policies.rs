//! Namespace policies kept as Pulsar's JSON values (one route per entry of
//! `admin::policy_specs::POLICY_SPECS` with a namespace route: max
//! producers/consumers/subscriptions/topics, rates, delayed delivery, auto
//! topic and subscription creation, offload settings, bookie affinity, ...),
//! namespace `properties` and subscription permission grants (Pulsar's
//! `NamespacesBase`). The policies `NamespacePolicies` keeps typed
//! (persistence, retention, TTL, ...) are `namespaces`'.
//!
//! GET answers the value, or 204 without a body when unset (0 for
//! `maxTopicsPerNamespace`, as Pulsar); POST or PUT checks, stores and
//! applies it to the namespace's served topics; DELETE removes it.
//! Never: keeps state.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::Response;
use axum::routing::{get, post};
use serde_json::Value;

use super::api::{ApiError, ApiResult, Params, Shared, namespace_of, no_content};
use super::topic_policies::{policy_answer, request_value};
use crate::admin::json::parse_body;
use crate::admin::policy_specs::{POLICY_SPECS, PolicySpec};
use crate::admin::{NamespacePolicies, PROPERTY_BYTES_MAX, ROLE_BYTES_MAX};
use crate::service::Service;

type NsPath = Path<(String, String)>;

const N: &str = "/admin/v2/namespaces/{tenant}/{namespace}";

pub(super) fn routes() -> Router<Arc<Service>> {
    let mut router = Router::new()
        .route(
            &format!("{N}/properties"),
            get(get_properties)
                .put(update_properties)
                .post(update_properties)
                .delete(clear_properties),
        )
        .route(
            &format!("{N}/property/{{key}}"),
            get(get_property).delete(remove_property),
        )
        .route(
            &format!("{N}/permissions/subscription"),
            get(subscription_permissions),
        )
        .route(
            &format!("{N}/permissions/subscription/{{subscription}}"),
            post(grant_subscription).delete(revoke_named_subscription),
        )
        .route(
            &format!("{N}/permissions/{{subscription}}/{{role}}"),
            axum::routing::delete(revoke_subscription_role),
        )
        .route(
            &format!("{N}/removeOffloadPolicies"),
            axum::routing::delete(remove_offload_policies),
        );
    for spec in POLICY_SPECS {
        let Some(route) = spec.namespace_route else {
            continue;
        };
        router = router.route(
            &format!("{N}/{route}"),
            get(move |state, path| get_policy(spec, state, path))
                .post(move |state, path, query, body| set_policy(spec, state, path, query, body))
                .put(move |state, path, query, body| set_policy(spec, state, path, query, body))
                .delete(move |state, path| remove_policy(spec, state, path)),
        );
    }
    router
}

/// The namespace's policies; 404 "Tenant does not exist" or "Namespace does
/// not exist", as Pulsar checks them in that order.
async fn policies_of(
    service: &Service,
    tenant: &str,
    namespace: &str,
) -> ApiResult<NamespacePolicies> {
    let ns = namespace_of(tenant, namespace)?;
    if !service.admin.tenant_exists(tenant).await? {
        return Err(ApiError::not_found("Tenant does not exist"));
    }
    service
        .admin
        .namespace_policies(&ns)
        .await?
        .ok_or_else(|| ApiError::not_found("Namespace does not exist"))
}

/// Reads, changes, stores and applies a namespace's policies.
async fn update(
    service: &Service,
    tenant: &str,
    namespace: &str,
    change: impl FnOnce(&mut NamespacePolicies) -> ApiResult<()>,
) -> ApiResult<StatusCode> {
    let ns = namespace_of(tenant, namespace)?;
    let mut policies = policies_of(service, tenant, namespace).await?;
    change(&mut policies)?;
    service.admin.set_namespace_policies(&ns, &policies).await?;
    service.apply_policies(&ns, &policies);
    no_content()
}

async fn get_policy(
    spec: &'static PolicySpec,
    State(service): Shared,
    Path((tenant, namespace)): NsPath,
) -> ApiResult<Response> {
    let policies = policies_of(&service, &tenant, &namespace).await?;
    let value = policies
        .policies
        .get(spec.key)
        .cloned()
        .or_else(|| spec.namespace_unset.map(Value::from));
    Ok(policy_answer(value))
}

async fn set_policy(
    spec: &'static PolicySpec,
    State(service): Shared,
    Path((tenant, namespace)): NsPath,
    Query(params): Params,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let value = spec.check(request_value(spec, spec.namespace_route, &params, &body)?)?;
    update(&service, &tenant, &namespace, |p| {
        p.policies.insert(spec.key.to_string(), value);
        Ok(())
    })
    .await
}

async fn remove_policy(
    spec: &'static PolicySpec,
    State(service): Shared,
    Path((tenant, namespace)): NsPath,
) -> ApiResult<StatusCode> {
    update(&service, &tenant, &namespace, |p| {
        p.policies.remove(spec.key);
        Ok(())
    })
    .await
}

async fn get_properties(
    State(service): Shared,
    Path((tenant, namespace)): NsPath,
) -> ApiResult<axum::Json<BTreeMap<String, String>>> {
    Ok(axum::Json(
        policies_of(&service, &tenant, &namespace).await?.properties,
    ))
}

fn check_property(key: &str, value: &str) -> ApiResult<()> {
    if key.is_empty() || key.len() > PROPERTY_BYTES_MAX || value.len() > PROPERTY_BYTES_MAX {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            format!("property keys must be 1..={PROPERTY_BYTES_MAX} bytes, values at most that"),
        ));
    }
    Ok(())
}

/// Adds or replaces the given keys.
async fn update_properties(
    State(service): Shared,
    Path((tenant, namespace)): NsPath,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let properties: Option<BTreeMap<String, String>> = parse_body(&body, "properties")?;
    let properties = properties.unwrap_or_default();
    for (key, value) in &properties {
        check_property(key, value)?;
    }
    update(&service, &tenant, &namespace, |p| {
        p.properties.extend(properties);
        Ok(())
    })
    .await
}

async fn clear_properties(
    State(service): Shared,
    Path((tenant, namespace)): NsPath,
) -> ApiResult<StatusCode> {
    update(&service, &tenant, &namespace, |p| {
        p.properties.clear();
        Ok(())
    })
    .await
}

async fn get_property(
    State(service): Shared,
    Path((tenant, namespace, key)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let policies = policies_of(&service, &tenant, &namespace).await?;
    Ok(policy_answer(
        policies.properties.get(&key).cloned().map(Value::String),
    ))
}

async fn remove_property(
    State(service): Shared,
    Path((tenant, namespace, key)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    update(&service, &tenant, &namespace, |p| {
        p.properties.remove(&key);
        Ok(())
    })
    .await
}

async fn subscription_permissions(
    State(service): Shared,
    Path((tenant, namespace)): NsPath,
) -> ApiResult<axum::Json<BTreeMap<String, BTreeSet<String>>>> {
    Ok(axum::Json(
        policies_of(&service, &tenant, &namespace)
            .await?
            .subscription_roles,
    ))
}

/// Grants the roles of the body (a JSON list) the use of a subscription
/// name, adding to earlier grants.
async fn grant_subscription(
    State(service): Shared,
    Path((tenant, namespace, subscription)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let roles: Option<BTreeSet<String>> = parse_body(&body, "roles")?;
    let roles = roles.unwrap_or_default();
    if roles
        .iter()
        .any(|r| r.is_empty() || r.len() > ROLE_BYTES_MAX)
    {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            format!("roles must be 1..={ROLE_BYTES_MAX} bytes"),
        ));
    }
    update(&service, &tenant, &namespace, |p| {
        p.subscription_roles
            .entry(subscription)
            .or_default()
            .extend(roles);
        Ok(())
    })
    .await
}

/// Pulsar's `DELETE .../removeOffloadPolicies`.
async fn remove_offload_policies(
    State(service): Shared,
    Path((tenant, namespace)): NsPath,
) -> ApiResult<StatusCode> {
    // As Pulsar: the object and the older thresholds and lag go.
    update(&service, &tenant, &namespace, |p| {
        for key in [
            "offloadPolicies",
            "offloadThreshold",
            "offloadThresholdInSeconds",
            "offloadDeletionLagMs",
        ] {
            p.policies.remove(key);
        }
        p.offload_threshold_bytes = None;
        p.offload_threshold_seconds = None;
        p.offload_deletion_lag_ms = None;
        Ok(())
    })
    .await
}

/// `DELETE .../permissions/subscription/{x}` is Pulsar's
/// `permissions/{subscription}/{role}` for the subscription named
/// "subscription" (the only DELETE route of that shape), unless `?role=`
/// names the role, then `{x}` is the subscription.
async fn revoke_named_subscription(
    State(service): Shared,
    Path((tenant, namespace, last)): Path<(String, String, String)>,
    Query(params): Params,
) -> ApiResult<StatusCode> {
    match params.get("role").cloned() {
        Some(role) => revoke(&service, &tenant, &namespace, last, role).await,
        None => revoke(&service, &tenant, &namespace, "subscription".into(), last).await,
    }
}

/// Pulsar's `DELETE .../permissions/{subscription}/{role}`.
async fn revoke_subscription_role(
    State(service): Shared,
    Path((tenant, namespace, subscription, role)): Path<(String, String, String, String)>,
) -> ApiResult<StatusCode> {
    revoke(&service, &tenant, &namespace, subscription, role).await
}

async fn revoke(
    service: &Service,
    tenant: &str,
    namespace: &str,
    subscription: String,
    role: String,
) -> ApiResult<StatusCode> {
    update(service, tenant, namespace, |p| {
        if let Some(roles) = p.subscription_roles.get_mut(&subscription) {
            roles.remove(&role);
            if roles.is_empty() {
                p.subscription_roles.remove(&subscription);
            }
        }
        Ok(())
    })
    .await
}
