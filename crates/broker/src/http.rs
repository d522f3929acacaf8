//! The broker's HTTP listener (admin API and metrics port).
//!
//! Owns: binding the HTTP port, the router, and a graceful stop.
//! Routes today: `GET /admin/v2/brokers/health` (`ok` while the broker serves).
//! Never: blocks a worker, or serves anything that needs topic data on the
//! request's own task beyond what the service API gives.

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use axum::routing::get;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use crate::error::BrokerError;
use crate::service::Service;

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
        .with_state(service)
}

async fn health() -> &'static str {
    "ok"
}
