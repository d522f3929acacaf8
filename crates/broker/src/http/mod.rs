//! The broker's HTTP listener (admin API and metrics port).
//!
//! Owns: binding the HTTP port, the router, and a graceful stop.
//! Routes today: `GET /admin/v2/brokers/health` (`ok` while the broker
//! serves); `PUT /admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions`
//! (create a partitioned topic; body: the partition count).
//! Errors are Pulsar's: a JSON body `{"reason": "..."}` with Pulsar's status
//! codes (400 bad request, 404 absent, 409 exists, 412 precondition, 500).
//! Never: blocks a worker, or serves anything that needs topic data on the
//! request's own task beyond what the service API gives.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, put};
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::admin::AdminError;
use crate::error::BrokerError;
use crate::service::Service;
use crate::topic_name::TopicName;

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
    ) -> Result<HttpServer, BrokerError> {
        let listener = TcpListener::bind(addr).await?;
        let local_addr = listener.local_addr()?;
        let router = router(service);
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            axum::serve(listener, router)
                .with_graceful_shutdown(async move {
                    let _ = stopped.await;
                })
                .await
        });
        tracing::info!(addr = %local_addr, "HTTP listening");
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

fn router(service: Arc<Service>) -> Router {
    Router::new()
        .route("/admin/v2/brokers/health", get(health))
        .route(
            "/admin/v2/persistent/{tenant}/{namespace}/{topic}/partitions",
            put(create_partitioned_topic),
        )
        .with_state(service)
}

/// An admin error as Pulsar answers it.
#[derive(Debug)]
struct ApiError {
    status: StatusCode,
    reason: String,
}

impl ApiError {
    fn bad_request(reason: impl Into<String>) -> ApiError {
        ApiError {
            status: StatusCode::BAD_REQUEST,
            reason: reason.into(),
        }
    }
}

impl From<AdminError> for ApiError {
    fn from(error: AdminError) -> ApiError {
        let status = match &error {
            AdminError::NotFound(_) => StatusCode::NOT_FOUND,
            AdminError::Exists(_) => StatusCode::CONFLICT,
            AdminError::Invalid(_) => StatusCode::PRECONDITION_FAILED,
            AdminError::Meta(_) | AdminError::Corrupt { .. } => StatusCode::INTERNAL_SERVER_ERROR,
        };
        ApiError {
            status,
            reason: error.to_string(),
        }
    }
}

impl IntoResponse for ApiError {
    fn into_response(self) -> Response {
        let body = serde_json::json!({ "reason": self.reason });
        (self.status, axum::Json(body)).into_response()
    }
}

async fn health() -> &'static str {
    "ok"
}

fn persistent_topic(tenant: &str, namespace: &str, topic: &str) -> Result<TopicName, ApiError> {
    TopicName::parse(&format!("persistent://{tenant}/{namespace}/{topic}"))
        .map_err(|e| ApiError::bad_request(e.to_string()))
}

async fn create_partitioned_topic(
    State(service): State<Arc<Service>>,
    Path((tenant, namespace, topic)): Path<(String, String, String)>,
    body: String,
) -> Result<StatusCode, ApiError> {
    let topic = persistent_topic(&tenant, &namespace, &topic)?;
    let partitions: u32 = body.trim().parse().map_err(|_| {
        ApiError::bad_request(format!(
            "the body must be the number of partitions, got {:?}",
            body.chars().take(32).collect::<String>()
        ))
    })?;
    service
        .admin
        .create_partitioned_topic(&topic, partitions)
        .await?;
    Ok(StatusCode::NO_CONTENT)
}
