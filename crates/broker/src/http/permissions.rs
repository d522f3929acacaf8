//! Namespace permissions (Pulsar's `NamespacesBase` permission routes):
//! `GET .../permissions` answers `{role: [actions]}`; `POST
//! .../permissions/{role}` with a JSON array of actions (`["produce",
//! "consume"]`) grants them, replacing the role's earlier grant; `DELETE
//! .../permissions/{role}` revokes. Stored in the namespace's policies.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};

use super::api::{ApiError, ApiResult, Shared, namespace_of, no_content};
use crate::admin::AuthAction;
use crate::admin::json::parse_body;
use crate::service::Service;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/permissions",
            get(permissions),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/permissions/{role}",
            post(grant).delete(revoke),
        )
}

async fn permissions(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<axum::Json<BTreeMap<String, BTreeSet<AuthAction>>>> {
    let ns = namespace_of(&tenant, &namespace)?;
    match service.admin.namespace_policies(&ns).await? {
        Some(policies) => Ok(axum::Json(policies.permissions)),
        None => Err(ApiError::not_found("Namespace does not exist")),
    }
}

async fn grant(
    State(service): Shared,
    Path((tenant, namespace, role)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult<StatusCode> {
    let ns = namespace_of(&tenant, &namespace)?;
    let actions: Option<BTreeSet<AuthAction>> = parse_body(&body, "the set of actions")?;
    let Some(actions) = actions else {
        return Err(ApiError::bad_request("a JSON array of actions is required"));
    };
    service.admin.grant_permission(&ns, &role, actions).await?;
    no_content()
}

async fn revoke(
    State(service): Shared,
    Path((tenant, namespace, role)): Path<(String, String, String)>,
) -> ApiResult<StatusCode> {
    let ns = namespace_of(&tenant, &namespace)?;
    service.admin.revoke_permission(&ns, &role).await?;
    no_content()
}
