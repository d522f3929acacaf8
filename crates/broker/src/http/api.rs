//! The vocabulary every route handler shares: the error type and its
//! mapping to Pulsar's status codes with a JSON body `{"reason": "..."}`
//! (400 bad request, 404 absent, 405 not allowed here, 409 exists, 412
//! precondition: bad policy, clients attached, invalid name; 500), the
//! success answers, and the parsing of path segments and query flags
//! (refused with 400/412, never `unwrap`ed).
//! Never: names a route or touches the service.

use std::collections::HashMap;
use std::sync::Arc;

use axum::extract::{Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use serde_json::json;
use vela_wire::proto::ServerError;

use crate::admin::AdminError;
use crate::error::ServiceError;
use crate::service::Service;
use crate::topic_name::{InvalidName, NamespaceName, TopicName};

/// Whether a request came over the plain or the HTTPS listener (handlers
/// that send the client to another broker keep the scheme).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListenerScheme {
    Http,
    Https,
}

impl ListenerScheme {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            ListenerScheme::Http => "http",
            ListenerScheme::Https => "https",
        }
    }
}

pub(super) type Shared = State<Arc<Service>>;
pub(super) type Params = Query<HashMap<String, String>>;

/// An admin error as Pulsar answers it.
#[derive(Debug)]
pub(crate) struct ApiError {
    status: StatusCode,
    reason: String,
}

impl ApiError {
    pub(crate) fn new(status: StatusCode, reason: impl Into<String>) -> ApiError {
        ApiError {
            status,
            reason: reason.into(),
        }
    }

    pub(crate) fn bad_request(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::BAD_REQUEST, reason)
    }

    pub(crate) fn not_found(reason: impl Into<String>) -> ApiError {
        ApiError::new(StatusCode::NOT_FOUND, reason)
    }
}

fn service_status(error: &ServiceError) -> StatusCode {
    match error.code {
        ServerError::TopicNotFound | ServerError::SubscriptionNotFound => StatusCode::NOT_FOUND,
        ServerError::ConsumerBusy | ServerError::ProducerBusy | ServerError::InvalidTopicName => {
            StatusCode::PRECONDITION_FAILED
        }
        ServerError::NotAllowedError => StatusCode::METHOD_NOT_ALLOWED,
        ServerError::ServiceNotReady => StatusCode::SERVICE_UNAVAILABLE,
        ServerError::TooManyRequests => StatusCode::TOO_MANY_REQUESTS,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    }
}

impl From<AdminError> for ApiError {
    fn from(error: AdminError) -> ApiError {
        let status = match &error {
            AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::Exists(_) => StatusCode::CONFLICT,
            AdminError::Invalid(_) | AdminError::Busy(_) => StatusCode::PRECONDITION_FAILED,
            AdminError::BadRequest(_) => StatusCode::BAD_REQUEST,
            AdminError::NotAllowed(_) => StatusCode::METHOD_NOT_ALLOWED,
            AdminError::Service(service) => service_status(service),
            AdminError::Meta(_) | AdminError::Corrupt { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        let reason = match error {
            AdminError::Service(service) => service.message,
            other => other.to_string(),
        };
        ApiError { status, reason }
    }
}

impl From<ServiceError> for ApiError {
    fn from(error: ServiceError) -> ApiError {
        ApiError {
            status: service_status(&error),
            reason: error.message,
        }
    }
}

impl From<InvalidName> for ApiError {
    fn from(error: InvalidName) -> ApiError {
        // Pulsar: 412 "Topic name is not valid" / "Namespace name is not valid".
        ApiError::new(StatusCode::PRECONDITION_FAILED, error.to_string())
    }
}

impl From<vela_log::LogError> for ApiError {
    fn from(error: vela_log::LogError) -> ApiError {
        ApiError::from(ServiceError::from(error))
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = json!({ "reason": self.reason });
        (self.status, axum::Json(body)).into_response()
    }
}

pub(crate) type ApiResult<T> = Result<T, ApiError>;

/// 204, Pulsar's answer to a successful PUT/POST/DELETE.
pub(crate) fn no_content() -> ApiResult<StatusCode> {
    Ok(StatusCode::NO_CONTENT)
}

/// A query flag (`?force=true`); absent or unparsable is `false`.
pub(crate) fn flag(params: &HashMap<String, String>, name: &str) -> bool {
    params
        .get(name)
        .is_some_and(|v| v.eq_ignore_ascii_case("true"))
}

/// A query flag that is on unless given as `false` (Pulsar's
/// `perPartition`, default true).
pub(crate) fn flag_unless_false(params: &HashMap<String, String>, name: &str) -> bool {
    params
        .get(name)
        .is_none_or(|v| !v.eq_ignore_ascii_case("false"))
}

/// The topic named by REST path segments (`persistent` or
/// `non-persistent`; a route that only persistent topics have refuses the
/// other when it opens the topic: 405).
pub(crate) fn topic_of(
    domain: &str,
    tenant: &str,
    namespace: &str,
    topic: &str,
) -> ApiResult<TopicName> {
    if !matches!(domain, "persistent" | "non-persistent") {
        return Err(ApiError::not_found(format!(
            "unknown topic domain {domain}"
        )));
    }
    Ok(TopicName::parse(&format!(
        "{domain}://{tenant}/{namespace}/{topic}"
    ))?)
}

pub(super) fn namespace_of(tenant: &str, namespace: &str) -> ApiResult<NamespaceName> {
    NamespaceName::parse(&format!("{tenant}/{namespace}")).map_err(|_| {
        ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "Namespace name is not valid",
        )
    })
}
