//! The HTTPS admin listener: TCP accepts in one task, each TLS handshake in
//! its own task (bounded, under a timeout), finished streams handed to axum.
//! Certificates, reload and the Pulsar port's acceptor come from `vela_tls`.
//!
//! Never: handshakes inside the accept loop.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_rustls::server::TlsStream;
pub use vela_tls::{TlsCertificates, TlsConfig, TlsError, reload_loop};

/// HTTPS handshakes in progress at once. Each holds a task and rustls
/// state (~tens of KiB); past this, new TCP connections wait in the
/// kernel's accept queue.
const HTTPS_HANDSHAKES_MAX: usize = 1024;

/// Finished HTTPS handshakes waiting for axum to take them. axum takes one
/// per accept call and spawns at once, so the queue stays short; when full,
/// handshake tasks wait.
const HTTPS_READY_QUEUE: usize = 64;

/// Time an HTTPS client has to finish its handshake.
const HTTPS_HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);

/// The HTTPS listener for axum: TCP accepts in one task, each handshake in
/// its own task, finished streams handed over through a bounded queue.
#[derive(Debug)]
pub(crate) struct HttpsListener {
    ready: mpsc::Receiver<(TlsStream<TcpStream>, SocketAddr)>,
    local_addr: SocketAddr,
    accept_task: tokio::task::JoinHandle<()>,
}

impl HttpsListener {
    pub(crate) fn new(listener: TcpListener, certs: Arc<TlsCertificates>) -> std::io::Result<Self> {
        let local_addr = listener.local_addr()?;
        let (ready_tx, ready) = mpsc::channel(HTTPS_READY_QUEUE);
        let accept_task = tokio::spawn(https_accept_loop(listener, certs, ready_tx));
        Ok(HttpsListener {
            ready,
            local_addr,
            accept_task,
        })
    }
}

impl Drop for HttpsListener {
    fn drop(&mut self) {
        self.accept_task.abort();
    }
}

async fn https_accept_loop(
    listener: TcpListener,
    certs: Arc<TlsCertificates>,
    ready: mpsc::Sender<(TlsStream<TcpStream>, SocketAddr)>,
) {
    let handshakes = Arc::new(Semaphore::new(HTTPS_HANDSHAKES_MAX));
    loop {
        let Ok(permit) = Arc::clone(&handshakes).acquire_owned().await else {
            return;
        };
        let (stream, peer) = match listener.accept().await {
            Ok(accepted) => accepted,
            Err(error) => {
                tracing::warn!(%error, "HTTPS accept failed");
                tokio::time::sleep(Duration::from_millis(10)).await;
                continue;
            }
        };
        let acceptor = certs.acceptor();
        let ready = ready.clone();
        tokio::spawn(async move {
            let _permit = permit;
            match vela_tls::accept_within(&acceptor, stream, HTTPS_HANDSHAKE_TIMEOUT).await {
                Ok(tls) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Err(error) => tracing::debug!(%peer, %error, "HTTPS handshake failed"),
            }
        });
    }
}

impl axum::serve::Listener for HttpsListener {
    type Io = TlsStream<TcpStream>;
    type Addr = SocketAddr;

    async fn accept(&mut self) -> (Self::Io, Self::Addr) {
        match self.ready.recv().await {
            Some(accepted) => accepted,
            // The accept task ended (it only does when aborted): never
            // accept again; axum's graceful shutdown ends the server.
            None => std::future::pending().await,
        }
    }

    fn local_addr(&self) -> std::io::Result<Self::Addr> {
        Ok(self.local_addr)
    }
}
