//! TLS configuration shared by Vela's servers and clients: rustls with the
//! ring provider, certificate chain and key from PEM files, reloaded when
//! the files change, optional client certificates checked against a trust
//! file (`client_auth`, v1 certificates included, as Java's TLS takes them),
//! the subject CN of a certificate (`x509`), and client configurations
//! trusting a CA file.
//!
//! Owns: [`TlsConfig`] (the file names and how often they are checked),
//! [`TlsCertificates`] (the current rustls `ServerConfig`, swapped whole on
//! reload) and [`reload_loop`], [`accept_within`] (a server handshake with a
//! deadline), and [`client_config`].
//! Used by: the broker (Pulsar port, HTTPS admin port) and the bookie
//! server; the bookie client (brokers, `vela ledgers`, auto-recovery) with
//! [`client_config`].
//! Guarantees: a connection uses the certificate current when its handshake
//! started; a new certificate is used by every connection accepted after the
//! reload check that saw it. A file pair that fails to load at startup is an
//! error naming the file; one that fails on reload (a half-written pair, say)
//! is logged and the previous certificate stays until the files load again.
//! Never: blocks a tokio worker on file I/O (files are read on the blocking
//! pool); listens (the servers do, and run each handshake in its
//! connection's task).

mod client_auth;
pub mod x509;

use std::future::Future;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime};

use parking_lot::RwLock;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio_rustls::TlsAcceptor;

pub use rustls::ClientConfig as TlsClientConfig;
pub use rustls_pki_types::ServerName;
pub use tokio_rustls::{TlsConnector, client, server};

/// Largest certificate or key file read, bytes. A chain of a few
/// certificates is a few KiB; 1 MiB bounds what a wrong path (a log file,
/// say) can make us read.
pub const PEM_FILE_BYTES_MAX: u64 = 1024 * 1024;

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
    /// PEM CA certificates that client certificates must chain to (Pulsar's
    /// `tlsTrustCertsFilePath`). When set, the server asks every client for
    /// a certificate; one that sends none is still served (Pulsar's
    /// `tlsRequireTrustedClientCertOnConnect=false`), one whose certificate
    /// does not verify fails the handshake. Read again with each reload of
    /// the certificate pair.
    pub client_trust_file: Option<PathBuf>,
}

impl TlsConfig {
    /// The files, checked for changes every 60 s.
    pub fn new(cert_file: impl Into<PathBuf>, key_file: impl Into<PathBuf>) -> TlsConfig {
        TlsConfig {
            cert_file: cert_file.into(),
            key_file: key_file.into(),
            reload_check_interval: Duration::from_secs(60),
            client_trust_file: None,
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

/// Why a server-side handshake did not complete.
#[derive(Debug, thiserror::Error)]
pub enum HandshakeError {
    /// The peer sent something that is not a TLS handshake we accept.
    #[error("{0}")]
    Failed(std::io::Error),
    /// The peer did not finish in time.
    #[error("timed out after {0:?}")]
    TimedOut(Duration),
}

/// Server side of a handshake on `stream` with `acceptor`, given at most
/// `timeout` (a peer that opens a connection and stalls holds nothing longer).
/// Run it in the connection's own task.
pub async fn accept_within<IO>(
    acceptor: &TlsAcceptor,
    stream: IO,
    timeout: Duration,
) -> Result<server::TlsStream<IO>, HandshakeError>
where
    IO: tokio::io::AsyncRead + tokio::io::AsyncWrite + Unpin,
{
    match tokio::time::timeout(timeout, acceptor.accept(stream)).await {
        Ok(Ok(stream)) => Ok(stream),
        Ok(Err(error)) => Err(HandshakeError::Failed(error)),
        Err(_) => Err(HandshakeError::TimedOut(timeout)),
    }
}

/// Modification time and length of both files: a change of either means
/// "reload". Length too because some copies keep the mtime.
type Stamp = [(SystemTime, u64); 2];

/// The current server configuration, replaced whole on reload.
#[derive(Debug)]
pub struct TlsCertificates {
    config: TlsConfig,
    current: RwLock<(Stamp, Arc<ServerConfig>)>,
}

impl TlsCertificates {
    /// Loads the files (on the blocking pool). Fails naming the file.
    pub async fn load(config: TlsConfig) -> Result<Arc<TlsCertificates>, TlsError> {
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
    pub fn acceptor(&self) -> TlsAcceptor {
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

/// Checks the files every `reload_check_interval` until `stop` resolves or
/// the owner drops the certificates.
pub async fn reload_loop(certs: Weak<TlsCertificates>, stop: impl Future<Output = ()>) {
    let Some(interval) = certs.upgrade().map(|c| c.config.reload_check_interval) else {
        return;
    };
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(100)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    tokio::pin!(stop);
    loop {
        tokio::select! {
            () = &mut stop => return,
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
    let builder = ServerConfig::builder_with_provider(Arc::clone(&provider))
        .with_safe_default_protocol_versions()
        .map_err(rejected)?;
    let builder =
        match &config.client_trust_file {
            None => builder.with_no_client_auth(),
            Some(trust) => {
                let field = "tls trust certs file";
                let (store, roots) = root_store(field, trust, &read_bounded(field, trust)?)?;
                let verifier = client_auth::ClientCertificates::new(store, roots, provider)
                    .map_err(|reason| TlsError::Invalid {
                        field,
                        path: trust.clone(),
                        reason,
                    })?;
                builder.with_client_cert_verifier(Arc::new(verifier))
            }
        };
    let mut server = builder.with_single_cert(chain, key).map_err(rejected)?;
    // HTTP/1.1 only on the HTTPS port: axum serves both, and the admin
    // clients speak 1.1; the Pulsar port ignores ALPN.
    server.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok((stamp, Arc::new(server)))
}

/// A client configuration trusting the CA certificates of a PEM file (the
/// servers' certificates must chain to one of them and name the address
/// dialled: an IP SAN for a bookie dialled by IP). Blocking: call it at
/// startup or on the blocking pool.
pub fn client_config(
    field: &'static str,
    trust_certs_file: &Path,
) -> Result<Arc<ClientConfig>, TlsError> {
    let pem = read_bounded(field, trust_certs_file)?;
    let (roots, _) = root_store(field, trust_certs_file, &pem)?;
    let invalid = |reason: String| TlsError::Invalid {
        field,
        path: trust_certs_file.to_path_buf(),
        reason,
    };
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let config = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(|e| invalid(e.to_string()))?
        .with_root_certificates(roots)
        .with_no_client_auth();
    Ok(Arc::new(config))
}

/// The CA certificates of a PEM file (at least one), as a store and as DER.
fn root_store(
    field: &'static str,
    path: &Path,
    pem: &[u8],
) -> Result<(RootCertStore, Vec<CertificateDer<'static>>), TlsError> {
    let invalid = |reason: String| TlsError::Invalid {
        field,
        path: path.to_path_buf(),
        reason,
    };
    let mut roots = RootCertStore::empty();
    let mut ders = Vec::new();
    for cert in CertificateDer::pem_slice_iter(pem) {
        let cert = cert.map_err(|e| invalid(format!("bad PEM: {e}")))?;
        ders.push(cert.clone());
        roots
            .add(cert)
            .map_err(|e| invalid(format!("not a usable CA certificate: {e}")))?;
    }
    if roots.is_empty() {
        return Err(invalid("no CERTIFICATE section".into()));
    }
    Ok((roots, ders))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bad_files_name_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let cert = dir.path().join("cert.pem");
        let key = dir.path().join("key.pem");
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
    }

    #[test]
    fn a_trust_file_without_certificates_names_the_field() {
        let dir = tempfile::tempdir().unwrap();
        let ca = dir.path().join("ca.pem");
        let missing = client_config("bookie tls trust certs file", &ca).unwrap_err();
        assert!(
            missing.to_string().contains("bookie tls trust certs file"),
            "{missing}"
        );
        std::fs::write(&ca, "no pem here").unwrap();
        let empty = client_config("bookie tls trust certs file", &ca).unwrap_err();
        assert!(empty.to_string().contains("no CERTIFICATE"), "{empty}");
    }
}
