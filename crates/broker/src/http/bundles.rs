//! Namespace bundles: their boundaries, unload and split (Pulsar's
//! `NamespacesBase` bundle routes).
//!
//! In cluster mode a request for a bundle this broker does not own is
//! redirected (307) to the owner's HTTP address (its HTTPS one for a request
//! that came over HTTPS), as Pulsar does; a standalone
//! broker serves every bundle itself and reports the default layout.

use std::sync::Arc;

use axum::Extension;
use axum::Router;
use axum::extract::{OriginalUri, Path, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use serde_json::json;

use super::api::{ApiError, ApiResult, ListenerScheme, Shared, namespace_of};
use crate::ownership::{BUNDLES_DEFAULT, BundleRange, default_layout};
use crate::service::{Service, ownership_error};
use crate::topic_name::NamespaceName;

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/bundles",
            get(bundles),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/unload",
            put(unload),
        )
        .route(
            "/admin/v2/namespaces/{tenant}/{namespace}/{bundle}/split",
            put(split),
        )
}

async fn existing_namespace(
    service: &Service,
    tenant: &str,
    namespace: &str,
) -> ApiResult<NamespaceName> {
    let ns = namespace_of(tenant, namespace)?;
    if service.admin.namespace_policies(&ns).await?.is_none() {
        return Err(ApiError::not_found("Namespace does not exist"));
    }
    Ok(ns)
}

fn range_of(bundle: &str) -> ApiResult<BundleRange> {
    BundleRange::parse(bundle).ok_or_else(|| {
        ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            format!("Invalid bundle range {bundle:?}: expected 0xLOWER_0xUPPER"),
        )
    })
}

async fn bundles(
    State(service): Shared,
    Path((tenant, namespace)): Path<(String, String)>,
) -> ApiResult<axum::Json<serde_json::Value>> {
    let ns = existing_namespace(&service, &tenant, &namespace).await?;
    let ranges = match service.ownership.get() {
        Some(ownership) => ownership.bundles(&ns).await.map_err(ownership_error)?,
        None => default_layout(BUNDLES_DEFAULT),
    };
    let mut boundaries: Vec<String> = ranges
        .iter()
        .map(|r| format!("0x{:08x}", r.lower))
        .collect();
    if let Some(last) = ranges.last() {
        boundaries.push(format!("0x{:08x}", last.upper.min(0xffff_ffff)));
    }
    Ok(axum::Json(json!({
        "boundaries": boundaries,
        "numBundles": ranges.len(),
    })))
}

/// `Some(response)`: the bundle is another broker's; send the client there.
async fn redirect_to_owner(
    service: &Service,
    ns: &NamespaceName,
    range: &BundleRange,
    uri: &axum::http::Uri,
    scheme: ListenerScheme,
) -> ApiResult<Option<Response>> {
    let Some(ownership) = service.ownership.get() else {
        return Ok(None);
    };
    let owner = ownership.owner(ns, range).await.map_err(ownership_error)?;
    let Some(owner) = owner.filter(|owner| owner.id != ownership.me().id) else {
        return Ok(None);
    };
    // A request that came over HTTPS goes on over HTTPS when the owner has it.
    let base = match (scheme, &owner.http_url_tls) {
        (ListenerScheme::Https, Some(https_url)) => https_url,
        _ => &owner.http_url,
    };
    match base.as_str() {
        "" => Ok(None),
        base => {
            let location = format!(
                "{}{}",
                base.trim_end_matches('/'),
                uri.path_and_query().map_or(uri.path(), |p| p.as_str())
            );
            Ok(Some(
                (
                    StatusCode::TEMPORARY_REDIRECT,
                    [(header::LOCATION, location)],
                )
                    .into_response(),
            ))
        }
    }
}

async fn unload(
    State(service): Shared,
    OriginalUri(uri): OriginalUri,
    Extension(scheme): Extension<ListenerScheme>,
    Path((tenant, namespace, bundle)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let ns = existing_namespace(&service, &tenant, &namespace).await?;
    let range = range_of(&bundle)?;
    if let Some(redirect) = redirect_to_owner(&service, &ns, &range, &uri, scheme).await? {
        return Ok(redirect);
    }
    if service.ownership.get().is_some() {
        service.unload_bundle(&ns, &range).await?;
    } else {
        // Standalone: unloading a bundle unloads its topics (they reopen on
        // the next client request, here again).
        service.unload_topics_of(&ns, &range).await?;
    }
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn split(
    State(service): Shared,
    OriginalUri(uri): OriginalUri,
    Extension(scheme): Extension<ListenerScheme>,
    Path((tenant, namespace, bundle)): Path<(String, String, String)>,
) -> ApiResult<Response> {
    let ns = existing_namespace(&service, &tenant, &namespace).await?;
    let range = range_of(&bundle)?;
    if let Some(redirect) = redirect_to_owner(&service, &ns, &range, &uri, scheme).await? {
        return Ok(redirect);
    }
    let Some(ownership) = service.ownership.get() else {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "bundles are not split in standalone mode",
        ));
    };
    ownership
        .split(&ns, &range)
        .await
        .map_err(ownership_error)?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
