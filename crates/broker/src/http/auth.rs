//! Authentication and authorization of HTTP requests (when the broker has
//! an `AuthConfig`): the credentials (`Authorization: Bearer <token>` or
//! `Basic <base64>`, the HTTPS client certificate) go through each provider
//! and fall back to the anonymous role (`AuthConfig::authenticate_http`),
//! then the route's requirement ([`classify`]) is checked against the role.
//!
//! 401 when no provider accepts the credentials and there is no anonymous
//! role, 403 when the role may not do this; both with Pulsar's
//! `{"reason": ...}` body. Open without credentials:
//! `/metrics` (Pulsar's `authenticateMetricsEndpoint=false`) and
//! `/admin/v2/brokers/health` (readiness probes).
//! Requirements follow Pulsar's authorization provider: tenant and cluster
//! writes and the tenant list need a superuser; namespace and topic
//! administration a tenant admin; reading a topic's stats, metadata or
//! lookup either grant on its namespace; subscription operations `consume`;
//! schemas as Pulsar's `SchemasResource` (reads: either grant; registering:
//! `produce`; the compatibility test and deletes: tenant admin);
//! reading `/admin/v3/transactions/...` any authenticated role (as Pulsar
//! 4.0.8, whose Transactions resource checks no role: the Go client's
//! tests read transaction metadata anonymously), changing it a superuser.

use std::sync::Arc;
use std::time::SystemTime;

use axum::extract::{ConnectInfo, Request, State};
use axum::http::{Method, StatusCode, header};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};

use super::api::ApiError;
use crate::auth::TransportIdentity;
use crate::authorization::{self, TopicAction};
use crate::service::Service;
use crate::topic_name::{NamespaceName, decode_segment};

/// What a route asks of the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Need {
    /// Nothing: no token needed.
    Open,
    /// Any valid token.
    Authenticated,
    /// A superuser.
    Superuser,
    /// A superuser or an admin of the tenant.
    TenantAdmin(String),
    /// A grant on the namespace (or tenant admin, or superuser).
    Namespace(NamespaceName, TopicAction),
}

/// The middleware: passes everything through when auth is off.
pub(super) async fn require(
    State(service): State<Arc<Service>>,
    request: Request,
    next: Next,
) -> Response {
    let Some(auth) = &service.config.auth else {
        return next.run(request).await;
    };
    let need = classify(request.method(), request.uri().path());
    if need == Need::Open {
        return next.run(request).await;
    }
    let header = request
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|value| value.to_str().ok());
    let transport = request
        .extensions()
        .get::<ConnectInfo<TransportIdentity>>()
        .map(|info| info.0.clone())
        .unwrap_or_default();
    let principal = match auth.authenticate_http(header, &transport, SystemTime::now()) {
        Ok(principal) => principal,
        Err(e) => return unauthorized(&e.message),
    };
    let role = principal.role.as_str();
    let allowed = match &need {
        Need::Open | Need::Authenticated => Ok(true),
        Need::Superuser => Ok(authorization::is_superuser(auth, role)),
        Need::TenantAdmin(tenant) => {
            authorization::may_administer(auth, &service.admin, role, tenant).await
        }
        Need::Namespace(ns, action) => {
            authorization::may_use_namespace(auth, &service.admin, role, ns, *action).await
        }
    };
    match allowed {
        Ok(true) => next.run(request).await,
        Ok(false) => {
            tracing::info!(%role, path = %request.uri().path(), "HTTP request not authorized");
            ApiError::new(
                StatusCode::FORBIDDEN,
                format!("Client with role {role} is not authorized for this operation"),
            )
            .into_response()
        }
        Err(e) => ApiError::from(e).into_response(),
    }
}

fn unauthorized(reason: &str) -> Response {
    let mut response = ApiError::new(StatusCode::UNAUTHORIZED, reason).into_response();
    response.headers_mut().insert(
        header::WWW_AUTHENTICATE,
        header::HeaderValue::from_static("Bearer"),
    );
    response
}

/// The requirement of a request, from its method and (percent-encoded) path.
/// Unknown admin paths need a superuser, other unknown paths a valid token
/// (they answer 404 after that).
pub(super) fn classify(method: &Method, path: &str) -> Need {
    let segments: Vec<String> = path
        .split('/')
        .filter(|s| !s.is_empty())
        .map(decode_segment)
        .collect();
    let s: Vec<&str> = segments.iter().map(String::as_str).collect();
    let read = method == Method::GET;
    let namespace =
        |tenant: &str, ns: &str, action| match NamespaceName::parse(&format!("{tenant}/{ns}")) {
            Ok(name) => Need::Namespace(name, action),
            // An invalid name answers 412 in the handler; only those allowed
            // anything get that far.
            Err(_) => Need::Superuser,
        };
    match s.as_slice() {
        ["metrics"] => Need::Open,
        ["lookup", "v2", "topic", _domain, tenant, ns, _topic] => {
            namespace(tenant, ns, TopicAction::Lookup)
        }
        ["admin", "v2", rest @ ..] => match rest {
            ["brokers", "health"] => Need::Open,
            ["clusters", ..] if read => Need::Authenticated,
            ["clusters", ..] | ["tenants"] | ["vela", ..] => Need::Superuser,
            ["tenants", tenant] if read => Need::TenantAdmin(tenant.to_string()),
            ["tenants", ..] => Need::Superuser,
            ["namespaces", tenant, ns, "topics"] if read => {
                namespace(tenant, ns, TopicAction::Lookup)
            }
            ["namespaces", tenant, ..] => Need::TenantAdmin(tenant.to_string()),
            // As Pulsar's SchemasResource: reads and the version of a schema
            // are topic metadata (either grant), registering one needs
            // `produce`, the compatibility test and deletes a tenant admin.
            ["schemas", tenant, ns, _topic, ..] if read => {
                namespace(tenant, ns, TopicAction::Lookup)
            }
            ["schemas", tenant, ns, _topic, "version"] if method == Method::POST => {
                namespace(tenant, ns, TopicAction::Lookup)
            }
            ["schemas", tenant, ns, _topic, "schema"] if method == Method::POST => {
                namespace(tenant, ns, TopicAction::Produce)
            }
            ["schemas", tenant, ..] => Need::TenantAdmin(tenant.to_string()),
            [domain, tenant, ns, rest @ ..] if is_domain(domain) => match rest {
                [] | ["partitioned"] if read => namespace(tenant, ns, TopicAction::Lookup),
                [
                    _topic,
                    "partitions" | "stats" | "partitioned-stats" | "internalStats",
                ] if read => namespace(tenant, ns, TopicAction::Lookup),
                [_topic, "subscriptions"] if read => namespace(tenant, ns, TopicAction::Consume),
                [_topic, "ledger" | "messageid" | "lastMessageId", ..] if read => {
                    namespace(tenant, ns, TopicAction::Consume)
                }
                [_topic, "subscription" | "all_subscription", ..] => {
                    namespace(tenant, ns, TopicAction::Consume)
                }
                _ => Need::TenantAdmin(tenant.to_string()),
            },
            // Admin routes not named above (and unknown ones): superusers,
            // so a 404 tells nobody else what exists.
            _ => Need::Superuser,
        },
        // Transaction state: any role may read it (as Pulsar); changes are
        // a superuser's.
        ["admin", "v3", "transactions", ..] if *method == Method::GET => Need::Authenticated,
        ["admin", "v3", "transactions", ..] => Need::Superuser,
        _ => Need::Authenticated,
    }
}

fn is_domain(segment: &str) -> bool {
    matches!(segment, "persistent" | "non-persistent")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn ns(action: TopicAction) -> Need {
        Need::Namespace(NamespaceName::parse("acme/app").unwrap(), action)
    }

    fn admin() -> Need {
        Need::TenantAdmin("acme".into())
    }

    #[test]
    fn routes_map_to_requirements() {
        let get = Method::GET;
        let put = Method::PUT;
        let post = Method::POST;
        let cases = [
            (&get, "/metrics", Need::Open),
            (
                &get,
                "/admin/v3/transactions/transactionMetadata/0/1",
                Need::Authenticated,
            ),
            (
                &post,
                "/admin/v3/transactions/transactionMetadata/0/1",
                Need::Superuser,
            ),
            (&get, "/admin/v2/brokers/health", Need::Open),
            (&get, "/admin/v2/clusters", Need::Authenticated),
            (&get, "/admin/v2/tenants", Need::Superuser),
            (&put, "/admin/v2/tenants/acme", Need::Superuser),
            (&get, "/admin/v2/tenants/acme", admin()),
            (&get, "/admin/v2/namespaces/acme", admin()),
            (&put, "/admin/v2/namespaces/acme/app", admin()),
            (
                &post,
                "/admin/v2/namespaces/acme/app/permissions/bob",
                admin(),
            ),
            (
                &get,
                "/admin/v2/namespaces/acme/app/topics",
                ns(TopicAction::Lookup),
            ),
            (
                &get,
                "/admin/v2/persistent/acme/app",
                ns(TopicAction::Lookup),
            ),
            (
                &get,
                "/admin/v2/persistent/acme/app/t/stats",
                ns(TopicAction::Lookup),
            ),
            (
                &get,
                "/admin/v2/persistent/acme/app/t/partitions",
                ns(TopicAction::Lookup),
            ),
            (&put, "/admin/v2/persistent/acme/app/t/partitions", admin()),
            (&put, "/admin/v2/persistent/acme/app/t", admin()),
            (&put, "/admin/v2/persistent/acme/app/t/unload", admin()),
            (
                &get,
                "/admin/v2/persistent/acme/app/t/subscriptions",
                ns(TopicAction::Consume),
            ),
            (
                &post,
                "/admin/v2/persistent/acme/app/t/subscription/s/skip_all",
                ns(TopicAction::Consume),
            ),
            (
                &get,
                "/lookup/v2/topic/persistent/acme/app/t",
                ns(TopicAction::Lookup),
            ),
            (&get, "/admin/v2/vela/write-path", Need::Superuser),
            (
                &get,
                "/admin/v2/schemas/acme/app/t/schemas",
                ns(TopicAction::Lookup),
            ),
            (
                &post,
                "/admin/v2/schemas/acme/app/t/version",
                ns(TopicAction::Lookup),
            ),
            (
                &post,
                "/admin/v2/schemas/acme/app/t/schema",
                ns(TopicAction::Produce),
            ),
            (&post, "/admin/v2/schemas/acme/app/t/compatibility", admin()),
            (
                &Method::DELETE,
                "/admin/v2/schemas/acme/app/t/schema",
                admin(),
            ),
            (&get, "/nowhere", Need::Authenticated),
            (&get, "/admin/v2/elsewhere/a/b", Need::Superuser),
            // Percent-encoded names are decoded before the check.
            (&get, "/admin/v2/tenants/ac%6De", admin()),
        ];
        for (method, path, need) in cases {
            assert_eq!(classify(method, path), need, "{method} {path}");
        }
    }
}
