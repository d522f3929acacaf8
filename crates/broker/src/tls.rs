//! TLS for the Pulsar port (`pulsar+ssl://`) and the HTTPS admin port:
//! rustls with the ring provider, certificate chain and key from PEM files,
//! reloaded when the files change.
//!
//! Owns: [`TlsConfig`] (the file names and how often they are checked),
//! [`TlsCertificates`] (the current rustls `ServerConfig`, swapped whole on
//! reload) and its reload task, and the HTTPS listener that hands axum
//! finished TLS streams.
//! Guarantees: a connection uses the certificate current when its handshake
//! started; a new certificate is used by every connection accepted after the
//! reload check that saw it. A file pair that fails to load at startup stops
//! the broker naming the file; one that fails on reload (a half-written
//! pair, say) is logged and the previous certificate stays until the files
//! load again.
//! Never: blocks a tokio worker on file I/O (files are read on the blocking
//! pool), or handshakes inside the accept loop (each handshake runs in its
//! connection's task, under the handshake timeout).

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::ServerConfig;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc, watch};
use tokio_rustls::TlsAcceptor;
use tokio_rustls::server::TlsStream;

/// Largest certificate or key file read, bytes. A chain of a few
/// certificates is a few KiB; 1 MiB bounds what a wrong path (a log file,
/// say) can make the broker read.
pub const PEM_FILE_BYTES_MAX: u64 = 1024 * 1024;

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

/// Where the certificate and key are, and how often to look for new ones.
#[derive(Debug, Clone)]
pub struct TlsConfig {
    /// PEM certificate chain, leaf first (Pulsar's `tlsCertificateFilePath`).
    pub cert_file: PathBuf,
    /// PEM private key: PKCS#8, PKCS#1 or SEC1 (Pulsar's `tlsKeyFilePath`).
    pub key_file: PathBuf,
    /// How often the files' modification times are checked (Pulsar's
    /// `tlsCertRefreshCheckDurationSec`, 300 s).
    pub reload_check_interval: Duration,
}

impl TlsConfig {
    /// The files, checked for changes every 60 s.
    pub fn new(cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> TlsConfig {
        TlsConfig {
            cert_file: cert_file.into(),
            key_file: key_file.into(),
            reload_check_interval: Duration::from_secs(60),
        }
    }
}

/// Why the certificate or key could not be used.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    /// A file could not be read.
    #[error("cannot read {field} {path}: {source}")]
    Read {
        /// The config field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// A file does not hold what it should.
    #[error("{field} {path}: {reason}")]
    Invalid {
        /// The config field naming the file.
        field: &'static str,
        /// The file.
        path: PathBuf,
        /// What is wrong.
        reason: String,
    },
    /// rustls refused the pair (e.g. the key does not match the certificate).
    #[error("certificate {cert} with key {key}: {reason}")]
    Rejected {
        /// The certificate file.
        cert: PathBuf,
        /// The key file.
        key: PathBuf,
        /// rustls' reason.
        reason: String,
    },
}

/// Modification time and length of both files: a change of either means
/// "reload". Length too because some copies keep the mtime.
type Stamp = [(SystemTime, u64); 2];

/// The current server configuration, replaced whole on reload.
#[derive(Debug)]
pub(crate) struct TlsCertificates {
    config: TlsConfig,
    current: RwLock<(Stamp, Arc<ServerConfig>)>,
}

impl TlsCertificates {
    /// Loads the files (on the blocking pool). Fails naming the file.
    pub(crate) async fn load(config: TlsConfig) -> Result<Arc<TlsCertificates>, TlsError> {
        let files = config.clone();
        let loaded = tokio::task::spawn_blocking(move || load_files(&files))
            .await
            .map_err(|e| TlsError::Invalid {
                field: "tls cert file",
                path: config.cert_file.clone(),
                reason: format!("loader task failed: {e}"),
            })??;
        Ok(Arc::new(TlsCertificates {
            config,
            current: RwLock::new(loaded),
        }))
    }

    /// An acceptor with the current certificate.
    pub(crate) fn acceptor(&self) -> TlsAcceptor {
        TlsAcceptor::from(Arc::clone(&self.current.read().1))
    }

    /// Reloads when either file changed since the last load. Returns true
    /// when a new certificate is in use.
    async fn reload_if_changed(&self) -> bool {
        let files = self.config.clone();
        let known = self.current.read().0;
        let loaded = tokio::task::spawn_blocking(move || {
            let stamp = stamp(&files).ok()?;
            if stamp == known {
                return None;
            }
            Some(load_files(&files))
        })
        .await;
        match loaded {
            Ok(Some(Ok(fresh))) => {
                *self.current.write() = fresh;
                tracing::info!(
                    cert = %self.config.cert_file.display(),
                    "TLS certificate reloaded: new connections use it"
                );
                true
            }
            Ok(Some(Err(error))) => {
                // Kept: the old certificate, and the old stamp, so the next
                // check tries again (the pair may be half-written now).
                tracing::warn!(%error, "TLS certificate change not loaded; the previous one stays");
                false
            }
            Ok(None) => false,
            Err(error) => {
                tracing::warn!(%error, "TLS reload task failed");
                false
            }
        }
    }
}

/// Checks the files every `reload_check_interval` until the broker stops
/// (`shutdown`) or drops the certificates.
pub(crate) async fn reload_loop(certs: Weak<TlsCertificates>, mut shutdown: watch::Receiver<bool>) {
    let Some(interval) = certs.upgrade().map(|c| c.config.reload_check_interval) else {
        return;
    };
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        tokio::select! {
            _ = shutdown.changed() => return,
            _ = ticker.tick() => {}
        }
        let Some(certs) = certs.upgrade() else { return };
        certs.reload_if_changed().await;
    }
}

fn stamp(config: &TlsConfig) -> std::io::Result<Stamp> {
    let one = |path: &Path| -> std::io::Result<(SystemTime, u64)> {
        let meta = std::fs::metadata(path)?;
        Ok((meta.modified()?, meta.len()))
    };
    Ok([one(&config.cert_file)?, one(&config.key_file)?])
}

fn read_bounded(field: &'static str, path: &Path) -> Result<Vec<u8>, TlsError> {
    use std::io::Read;
    let read_error = |source| TlsError::Read {
        field,
        path: path.to_path_buf(),
        source,
    };
    let file = std::fs::File::open(path).map_err(read_error)?;
    let mut bytes = Vec::new();
    file.take(PEM_FILE_BYTES_MAX + 1)
        .read_to_end(&mut bytes)
        .map_err(read_error)?;
    if bytes.len() as u64 > PEM_FILE_BYTES_MAX {
        return Err(TlsError::Invalid {
            field,
            path: path.to_path_buf(),
            reason: format!("larger than {PEM_FILE_BYTES_MAX} bytes"),
        });
    }
    Ok(bytes)
}

/// Reads both files and builds the server configuration (blocking).
fn load_files(config: &TlsConfig) -> Result<(Stamp, Arc<ServerConfig>), TlsError> {
    // Stamp first: a change while reading shows up at the next check.
    let stamp = stamp(config).map_err(|source| TlsError::Read {
        field: "tls cert/key file",
        path: config.cert_file.clone(),
        source,
    })?;
    let cert_pem = read_bounded("tls cert file", &config.cert_file)?;
    let key_pem = read_bounded("tls key file", &config.key_file)?;
    let chain = CertificateDer::pem_slice_iter(&cert_pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| TlsError::Invalid {
            field: "tls cert file",
            path: config.cert_file.clone(),
            reason: format!("bad PEM: {e}"),
        })?;
    if chain.is_empty() {
        return Err(TlsError::Invalid {
            field: "tls cert file",
            path: config.cert_file.clone(),
            reason: "no CERTIFICATE section".into(),
        });
    }
    let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|e| TlsError::Invalid {
        field: "tls key file",
        path: config.key_file.clone(),
        reason: format!("no usable private key: {e}"),
    })?;
    let rejected = |e: rustls::Error| TlsError::Rejected {
        cert: config.cert_file.clone(),
        key: config.key_file.clone(),
        reason: e.to_string(),
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut server = ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(rejected)?
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map_err(rejected)?;
    // HTTP/1.1 only on the HTTPS port: axum serves both, and the admin
    // clients speak 1.1; the Pulsar port ignores ALPN.
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((stamp, Arc::new(server)))
}

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
            match tokio::time::timeout(HTTPS_HANDSHAKE_TIMEOUT, acceptor.accept(stream)).await {
                Ok(Ok(tls)) => {
                    let _ = ready.send((tls, peer)).await;
                }
                Ok(Err(error)) => tracing::debug!(%peer, %error, "HTTPS handshake failed"),
                Err(_) => tracing::debug!(%peer, "HTTPS handshake timed out"),
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_files_name_the_field() {
        let dir = std::env::temp_dir().join(format!("vela-tls-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = dir.join("cert.pem");
        let key = dir.join("key.pem");
        let missing = TlsCertificates::load(TlsConfig::new(&cert, &key))
            .await
            .unwrap_err();
        assert!(missing.to_string().contains("cert"), "{missing}");
        std::fs::write(&cert, "not pem").unwrap();
        std::fs::write(&key, "not pem").unwrap();
        let bad = TlsCertificates::load(TlsConfig::new(&cert, &key))
            .await
            .unwrap_err();
        assert!(bad.to_string().contains("tls cert file"), "{bad}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
