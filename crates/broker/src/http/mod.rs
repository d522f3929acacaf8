//! The broker's HTTP listener: Pulsar's admin v2 REST API, the HTTP lookup,
//! `/metrics` (Prometheus text) and Vela's write-path breakdown.
//!
//! Owns: binding the HTTP port and the router: each route family's module
//! declares its routes (`routes()`: one `.route(path, method(handler))` per
//! route) beside its handlers, and `router` merges them under the `auth`
//! middleware. Success is 204 for PUT/POST/DELETE and 200 + JSON for GET, as
//! Pulsar; errors and request parsing are `api`'s.
//! With an `AuthConfig`, every request passes `auth` first (401/403); a new
//! route's requirement is a line in `auth::classify`.
//! Served over plain HTTP or, with the broker's TLS certificate, HTTPS
//! (`tls::HttpsListener`).
//! Routes: `brokers` (health, metrics, write path), `lookup`, `namespaces`
//! (tenants, namespaces and their policies), `clusters` (clusters, and
//! the replication clusters of namespaces and topics), `bundles`,
//! `permissions` (namespace grants), `schema_policy` (the
//! `schemaCompatibilityStrategy` routes, namespace and topic), `topics`
//! (topics, partitioned topics, stats, subscriptions),
//! `replicated_subscriptions` (a subscription's replicated status),
//! `termination`
//! (terminate), `offload` (tiered storage trigger and status),
//! `non_persistent` (non-persistent topics), `topic_policies`
//! (topic-level policies and properties), `messages` (entries by id, peek,
//! id by time), `schemas` (the schema registry), `namespace_policies`
//! (namespace policies kept as Pulsar's JSON, properties, subscription
//! grants); `prometheus` writes the metrics text.
//! Layering: the top of the broker: nothing else in the crate uses this
//! module except `lib.rs` (starting the listener). It reaches the broker
//! through the service, the admin store and the topics, never a connection.
//! Never: blocks a worker, or keeps state of its own.

mod api;
mod auth;
mod broker_config;
mod brokers;
mod bundles;
mod clusters;
mod lookup;
mod messages;
mod namespace_policies;
mod namespaces;
mod non_persistent;
mod offload;
mod permissions;
mod prometheus;
mod replicated_subscriptions;
mod schema_policy;
mod schemas;
mod termination;
mod topic_policies;
mod topics;
mod transactions;

use std::net::SocketAddr;
use std::sync::Arc;

use axum::Router;
use tokio::net::TcpListener;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

use axum::extract::connect_info::Connected;
use axum::serve::IncomingStream;

use crate::auth::TransportIdentity;
use crate::error::BrokerError;
use crate::service::Service;
use api::ListenerScheme;
pub(crate) use broker_config::load as load_dynamic_config;

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
        let url = format!(
            "{}://{}:{}",
            scheme.as_str(),
            service.config.advertised_host,
            local_addr.port()
        );
        let _ = url_cell.set(url.clone());
        // The local cluster's record gains its admin URL (when it has none).
        let data = match scheme {
            ListenerScheme::Https => crate::admin::ClusterData {
                service_url_tls: Some(url),
                ..Default::default()
            },
            ListenerScheme::Http => crate::admin::ClusterData {
                service_url: Some(url),
                ..Default::default()
            },
        };
        service
            .admin
            .ensure_cluster(&service.config.cluster_name, &data)
            .await?;
        let router = router(service)
            .layer(axum::Extension(scheme))
            .into_make_service_with_connect_info::<TransportIdentity>();
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

/// A plain HTTP connection proves nothing.
impl Connected<IncomingStream<'_, TcpListener>> for TransportIdentity {
    fn connect_info(_stream: IncomingStream<'_, TcpListener>) -> TransportIdentity {
        TransportIdentity::default()
    }
}

/// An HTTPS connection may carry a client certificate the listener verified
/// (the TLS provider's role).
impl Connected<IncomingStream<'_, crate::tls::HttpsListener>> for TransportIdentity {
    fn connect_info(stream: IncomingStream<'_, crate::tls::HttpsListener>) -> TransportIdentity {
        TransportIdentity {
            certificate_cn: stream
                .io()
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|chain| chain.first())
                .and_then(|leaf| vela_tls::x509::common_name(leaf)),
        }
    }
}

fn router(service: Arc<Service>) -> Router {
    Router::new()
        .merge(brokers::routes())
        .merge(lookup::routes())
        .merge(namespaces::routes())
        .merge(clusters::routes())
        .merge(bundles::routes())
        .merge(topics::routes())
        .merge(replicated_subscriptions::routes())
        .merge(termination::routes())
        .merge(offload::routes())
        .merge(non_persistent::routes())
        .merge(permissions::routes())
        .merge(topic_policies::routes())
        .merge(messages::routes())
        .merge(schemas::routes())
        .merge(namespace_policies::routes())
        .merge(schema_policy::routes())
        .merge(transactions::routes())
        .layer(axum::middleware::from_fn_with_state(
            Arc::clone(&service),
            auth::require,
        ))
        .with_state(service)
}
