//! The broker's HTTP listener: Pulsar's admin v2 REST API, the HTTP lookup,
//! `/metrics` (Prometheus text) and Vela's write-path breakdown.
//!
//! Owns: binding the HTTP port, the router, request parsing (paths, query
//! flags, JSON bodies, all refused with 400/412 rather than `unwrap`ed) and
//! the mapping of errors to Pulsar's status codes with a JSON body
//! `{"reason": "..."}`: 400 bad request, 404 absent, 405 not allowed here,
//! 409 exists, 412 precondition (bad policy, clients attached, invalid name),
//! 500. Success is 204 for PUT/POST/DELETE and 200 + JSON for GET, as Pulsar.
//! With an `AuthConfig`, every request passes `auth` first (401/403).
//! Served over plain HTTP or, with the broker's TLS certificate, HTTPS
//! (`tls::HttpsListener`).
//! Routes: `namespaces` (tenants, clusters, namespaces and their policies),
//! `permissions` (namespace grants),
//! `topics` (topics, partitioned topics, stats, subscriptions), this module
//! (health, lookup, metrics, write path), `prometheus` (the text format).
//! Never: blocks a worker, or keeps state of its own: everything goes through
//! the service, the admin store and the topics.

mod auth;
mod bundles;
mod namespaces;
mod permissions;
mod prometheus;
mod topics;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use serde_json::json;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use vela_wire::proto::ServerError;

use crate::admin::AdminError;
use crate::error::{BrokerError, ServiceError};
use crate::metrics::Stage;
use crate::ownership::LookupAnswer;
use crate::service::Service;
use crate::topic_name::{InvalidName, TopicName};

/// A running HTTP listener.
#[derive(Debug)]
pub struct HttpServer {
    local_addr: SocketAddr,
    stop: oneshot::Sender<()>,
    task: JoinHandle<std::io::Result<()>>,
}

impl HttpServer {
    pub(crate) async fn start(
        addr: SocketAddr,
        service: Arc<Service>,
        tls: Option<Arc<crate::tls::TlsCertificates>>,
    ) -> Result<HttpServer, BrokerError> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let (scheme, url_cell) = match tls {
            Some(_) => (ListenerScheme::Https, &service.https_url),
            None => (ListenerScheme::Http, &service.http_url),
        };
        // Lookups and the cluster registration name the first listener of
        // each scheme.
        let _ = url_cell.set(format!(
            "{}://{}:{}",
            scheme.as_str(),
            service.config.advertised_host,
            local_addr.port()
        ));
        let router = router(service).layer(axum::Extension(scheme));
        let (stop, stopped) = oneshot::channel::<()>();
        let shutdown = async move {
            let _ = stopped.await;
        };
        let task = match tls {
            None => tokio::spawn(async move {
                axum::serve(listener, router)
                    .with_graceful_shutdown(shutdown)
                    .await
            }),
            Some(certs) => {
                let listener = crate::tls::HttpsListener::new(listener, certs)?;
                tokio::spawn(async move {
                    axum::serve(listener, router)
                        .with_graceful_shutdown(shutdown)
                        .await
                })
            }
        };
        tracing::info!(addr = %local_addr, scheme = scheme.as_str(), "HTTP listening");
        Ok(HttpServer {
            local_addr,
            stop,
            task,
        })
    }

    /// The address bound (port 0 resolved).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// Stops accepting and waits for requests in progress.
    pub async fn stop(self) {
        let _ = self.stop.send(());
        match self.task.await {
            Ok(Ok(())) => {}
            Ok(Err(error)) => tracing::warn!(%error, "HTTP server failed"),
            Err(error) => tracing::warn!(%error, "HTTP server task failed"),
        }
    }
}

/// Whether a request came over the plain or the HTTPS listener (handlers
/// that send the client to another broker keep the scheme).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum ListenerScheme {
    Http,
    Https,
}

impl ListenerScheme {
    fn as_str(self) -> &'static str {
        match self {
            ListenerScheme::Http => "http",
            ListenerScheme::Https => "https",
        }
    }
}

type Shared = State<Arc<Service>>;
type Params = Query<HashMap<String, String>>;

fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/admin/v2/brokers/health", get(health))
        .route("/metrics", get(metrics))
        .route("/metrics/", get(metrics))
        .route("/admin/v2/vela/write-path", get(write_path))
        .route(
            "/lookup/v2/topic/{domain}/{tenant}/{namespace}/{topic}",
            get(lookup),
        )
        .merge(namespaces::routes())
        .merge(bundles::routes())
        .merge(topics::routes())
        .merge(permissions::routes())
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&service),
            auth::require,
        ))
        .with_state(service)
}

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

/// The persistent topic named by REST path segments; `non-persistent`
/// topics are not supported (405).
pub(crate) fn topic_of(
    domain: &str,
    tenant: &str,
    namespace: &str,
    topic: &str,
) -> ApiResult<TopicName> {
    match domain {
        "persistent" => {}
        "non-persistent" => {
            return Err(ApiError::new(
                StatusCode::METHOD_NOT_ALLOWED,
                "non-persistent topics are not supported",
            ));
        }
        other => return Err(ApiError::not_found(format!("unknown topic domain {other}"))),
    }
    Ok(TopicName::parse(&format!(
        "persistent://{tenant}/{namespace}/{topic}"
    ))?)
}

async fn health() -> &'static str {
    "ok"
}

async fn lookup(
    State(service): Shared,
    Path((domain, tenant, namespace, topic)): Path<(String, String, String, String)>,
) -> ApiResult<axum::Json<serde_json::Value>> {
    let topic = topic_of(&domain, &tenant, &namespace, &topic)?;
    let owner = match service.lookup(&topic, false).await? {
        LookupAnswer::Connect(owner) | LookupAnswer::Redirect(owner) => owner,
    };
    Ok(axum::Json(crate::admin::json::lookup_json(&owner)))
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
    let mut add = |stage: &str, scope: &str, latency: &crate::metrics::LatencySnapshot| {
        rows.push(json!({
            "stage": stage,
            "scope": scope,
            "count": latency.count,
            "sum_us": latency.sum_us,
            "mean_us": latency.mean_us(),
            "p50_us": latency.quantile_us(0.5),
            "p99_us": latency.quantile_us(0.99),
            "p999_us": latency.quantile_us(0.999),
            // The upper bound of the highest non-empty bucket: the slowest
            // sample was at most this.
            "max_us": latency.quantile_us(1.0),
            "buckets": latency.buckets.to_vec(),
        }));
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
        let mut publish = crate::metrics::LatencySnapshot::default();
        let mut storage = crate::metrics::LatencySnapshot::default();
        for name in &names {
            let served = service.topic(name, false).await?;
            publish.merge(&served.metrics.publish_latency.snapshot());
            storage.merge(&served.metrics.storage_write_latency.snapshot());
        }
        add("broker_publish", "topic", &publish);
        add("storage_write", "topic", &storage);
    }
    // Same stage on several instances (bookies): one merged row, then each.
    let all = service.write_path();
    for stage in Stage::ALL {
        let instances: Vec<_> = all.iter().filter(|s| s.stage == stage).collect();
        if instances.len() > 1 {
            let mut merged = crate::metrics::LatencySnapshot::default();
            for s in &instances {
                merged.merge(&s.latency);
            }
            add(stage.as_str(), "all", &merged);
        }
        for s in instances {
            add(stage.as_str(), &s.instance, &s.latency);
        }
    }
    Ok(axum::Json(json!({
        "topic": topic,
        "bucket_bounds_us": crate::metrics::LATENCY_BOUNDS_US.to_vec(),
        "stages": rows,
    }))
    .into_response())
}
