//! How this broker is a client of other brokers: Pulsar's `brokerClient*`
//! settings (`BrokerConfig::broker_client`: `brokerClientTlsEnabled`,
//! `brokerClientTrustCertsFilePath`, `brokerClientAuthenticationPlugin`,
//! `brokerClientAuthenticationParameters`), one concept for every use:
//! replicators take them as the defaults of a remote cluster's record
//! (`replication::remote`), and the brokers of this cluster reach each
//! other with them ([`PeerCredentials`]: transaction outcomes carried to a
//! topic's owner by `txn_client`, coordinator stats gathered by
//! `http::transactions`).
//!
//! Owns: reading the token (given, or from a file, as Pulsar's
//! `AuthenticationToken` takes `token:...`, `file:///path` or the token
//! itself) and the trust file, and which URL of another broker is used.
//! Never: logs a credential, or accepts an authentication plugin it cannot
//! speak.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use crate::config::BrokerClientConfig;
use crate::ownership::BrokerInfo;

/// Largest token file read.
const TOKEN_FILE_BYTES_MAX: u64 = 64 << 10;
/// Time one admin request to another broker may take.
const ADMIN_REQUEST_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);
/// Largest admin answer read from another broker.
const ADMIN_ANSWER_BYTES_MAX: u64 = 1 << 20;

/// Why the broker-client settings cannot be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BrokerClientError {
    #[error("brokerClientTlsEnabled is set but no brokerClientTrustCertsFilePath")]
    NoTrustCerts,
    #[error("trust certificates: {0}")]
    Tls(#[from] vela_tls::TlsError),
    #[error("authentication plugin {0} is not supported (token only)")]
    UnsupportedAuth(String),
    #[error("token file {path}: {reason}")]
    TokenFile { path: String, reason: String },
    #[error("a blocking task failed: {0}")]
    Task(String),
}

/// The token `params` names (Pulsar's `AuthenticationToken` parameters).
pub(crate) async fn token_of(params: &str) -> Result<String, BrokerClientError> {
    if let Some(token) = params.strip_prefix("token:") {
        return Ok(token.trim().to_string());
    }
    let Some(path) = params.strip_prefix("file:") else {
        return Ok(params.trim().to_string());
    };
    // file:///abs/path, file:/abs/path
    let path = path.strip_prefix("//").unwrap_or(path).to_string();
    let failed = |reason: String| BrokerClientError::TokenFile {
        path: path.clone(),
        reason,
    };
    let file = tokio::fs::File::open(&path)
        .await
        .map_err(|e| failed(e.to_string()))?;
    let mut text = String::new();
    use tokio::io::AsyncReadExt as _;
    file.take(TOKEN_FILE_BYTES_MAX)
        .read_to_string(&mut text)
        .await
        .map_err(|e| failed(e.to_string()))?;
    Ok(text.trim().to_string())
}

/// The token of an authentication plugin and its parameters: `None`
/// without a plugin; an error for a plugin other than token.
pub(crate) async fn plugin_token(
    plugin: Option<&str>,
    params: Option<&str>,
) -> Result<Option<String>, BrokerClientError> {
    let Some(plugin) = plugin.filter(|p| !p.is_empty()) else {
        return Ok(None);
    };
    let short = plugin.rsplit('.').next().unwrap_or(plugin);
    if !matches!(short, "token" | "AuthenticationToken") {
        return Err(BrokerClientError::UnsupportedAuth(plugin.to_string()));
    }
    Ok(Some(token_of(params.unwrap_or_default()).await?))
}

/// The trust file's client TLS settings and its PEM bytes.
pub(crate) async fn trust(
    file: PathBuf,
) -> Result<(Arc<rustls::ClientConfig>, Vec<u8>), BrokerClientError> {
    tokio::task::spawn_blocking(move || {
        let config = vela_tls::client_config("brokerClientTrustCertsFilePath", &file)?;
        let pem = std::fs::read(&file).map_err(|e| vela_tls::TlsError::Read {
            field: "brokerClientTrustCertsFilePath",
            path: file.clone(),
            source: e,
        })?;
        Ok::<_, vela_tls::TlsError>((config, pem))
    })
    .await
    .map_err(|e| BrokerClientError::Task(e.to_string()))?
    .map_err(BrokerClientError::from)
}

/// How this broker reaches the other brokers of its cluster, resolved once
/// from `BrokerConfig::broker_client` at start (Debug leaves the token out).
#[derive(Clone, Default)]
pub(crate) struct PeerCredentials {
    /// TLS toward brokers that offer it (`brokerClientTlsEnabled`).
    pub(crate) tls: Option<Arc<rustls::ClientConfig>>,
    /// The trust file's PEM bytes (for HTTPS clients).
    pub(crate) roots_pem: Option<Vec<u8>>,
    /// The token CONNECT and admin requests carry.
    pub(crate) token: Option<String>,
}

impl std::fmt::Debug for PeerCredentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerCredentials")
            .field("tls", &self.tls.is_some())
            .field("token", &self.token.is_some())
            .finish_non_exhaustive()
    }
}

impl PeerCredentials {
    /// Reads the settings' files: the trust file when TLS is on (required
    /// then, as Pulsar's), the token of a token plugin.
    pub(crate) async fn resolve(
        config: &BrokerClientConfig,
    ) -> Result<PeerCredentials, BrokerClientError> {
        let (tls, roots_pem) = if config.tls_enabled {
            let file = config
                .trust_certs_file
                .clone()
                .ok_or(BrokerClientError::NoTrustCerts)?;
            let (tls, pem) = trust(file).await?;
            (Some(tls), Some(pem))
        } else {
            (None, None)
        };
        let token = plugin_token(
            config.authentication_plugin.as_deref(),
            config.authentication_parameters.as_deref(),
        )
        .await?;
        Ok(PeerCredentials {
            tls,
            roots_pem,
            token,
        })
    }

    /// The Pulsar URL of `owner` to use: its `pulsar+ssl://` one with TLS
    /// when TLS is on and it has one, else its `pulsar://` one.
    pub(crate) fn pulsar_route(&self, owner: &BrokerInfo) -> PulsarRoute {
        match (&self.tls, &owner.service_url_tls) {
            (Some(tls), Some(url)) => PulsarRoute::Tls(url.clone(), Arc::clone(tls)),
            _ => PulsarRoute::Plain(owner.service_url.clone()),
        }
    }

    /// The admin base URL of `owner` to use: its `https://` one when TLS
    /// is on and it has one, else its `http://` one.
    pub(crate) fn http_base<'o>(&self, owner: &'o BrokerInfo) -> &'o str {
        match (&self.tls, &owner.http_url_tls) {
            (Some(_), Some(url)) => url,
            _ => &owner.http_url,
        }
    }
}

/// An HTTP agent for another broker's or cluster's admin API: answers of
/// any status are returned (not errors), each request ends within
/// `timeout`, and with `roots_pem` (PEM file contents) a server's
/// certificate must chain to those roots.
pub(crate) fn admin_agent(
    roots_pem: Option<&[u8]>,
    timeout: Duration,
) -> Result<ureq::Agent, String> {
    let mut builder = ureq::Agent::config_builder()
        .http_status_as_error(false)
        .timeout_global(Some(timeout));
    if let Some(pem) = roots_pem {
        let certs = ureq::tls::parse_pem(pem)
            .filter_map(|item| match item {
                Ok(ureq::tls::PemItem::Certificate(cert)) => Some(Ok(cert)),
                Ok(_) => None,
                Err(e) => Some(Err(e)),
            })
            .collect::<Result<Vec<_>, _>>()
            .map_err(|e| format!("trust certificates: {e}"))?;
        let tls = ureq::tls::TlsConfig::builder()
            .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
            .build();
        builder = builder.tls_config(tls);
    }
    Ok(builder.build().into())
}

/// GET `url` (another broker's admin API) with `peers`' roots and token;
/// the JSON of a 200 answer. Blocking: run it in a blocking task.
pub(crate) fn get_json(peers: &PeerCredentials, url: &str) -> Result<serde_json::Value, String> {
    let agent = admin_agent(peers.roots_pem.as_deref(), ADMIN_REQUEST_TIMEOUT)?;
    let request = agent.get(url);
    let result = match &peers.token {
        Some(token) => request
            .header("Authorization", &format!("Bearer {token}"))
            .call(),
        None => request.call(),
    };
    let mut response = result.map_err(|e| e.to_string())?;
    let status = response.status().as_u16();
    let text = response
        .body_mut()
        .with_config()
        .limit(ADMIN_ANSWER_BYTES_MAX)
        .read_to_string()
        .map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!("HTTP {status} {text}"));
    }
    serde_json::from_str(&text).map_err(|e| format!("answer is not JSON: {e}"))
}

/// Where a connection to another broker goes.
pub(crate) enum PulsarRoute {
    Plain(String),
    Tls(String, Arc<rustls::ClientConfig>),
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn owner(tls: bool) -> BrokerInfo {
        serde_json::from_value(serde_json::json!({
            "id": "h:1",
            "service_url": "pulsar://10.0.0.1:6650",
            "service_url_tls": tls.then_some("pulsar+ssl://10.0.0.1:6651"),
            "http_url": "http://10.0.0.1:8080",
            "http_url_tls": tls.then_some("https://10.0.0.1:8443"),
        }))
        .unwrap()
    }

    /// A CA certificate made for this run with `openssl` (only parsed
    /// here, never used to connect), so no key material is kept in git.
    fn ca_file(dir: &std::path::Path) -> PathBuf {
        let path = dir.join("ca.pem");
        let status = std::process::Command::new("openssl")
            .args([
                "req",
                "-x509",
                "-newkey",
                "ec",
                "-pkeyopt",
                "ec_paramgen_curve:P-256",
            ])
            .args([
                "-nodes",
                "-days",
                "1",
                "-subj",
                "/CN=vela-test-ca",
                "-keyout",
            ])
            .arg(dir.join("ca.key"))
            .arg("-out")
            .arg(&path)
            .stderr(std::process::Stdio::null())
            .status()
            .expect("openssl runs");
        assert!(status.success(), "openssl req -x509 failed");
        path
    }

    #[tokio::test]
    async fn one_configuration_gives_the_route_and_the_credentials() {
        // Nothing set: plain URLs, no token.
        let none = PeerCredentials::resolve(&BrokerClientConfig::default())
            .await
            .unwrap();
        assert!(none.tls.is_none() && none.token.is_none());
        assert!(
            matches!(none.pulsar_route(&owner(true)), PulsarRoute::Plain(u) if u.ends_with(":6650"))
        );
        assert_eq!(none.http_base(&owner(true)), "http://10.0.0.1:8080");

        // TLS and a token plugin with a token file.
        let dir = std::env::temp_dir().join(format!("vela-peer-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let token_file = dir.join("token");
        std::fs::write(&token_file, "secret-token\n").unwrap();
        let config = BrokerClientConfig {
            tls_enabled: true,
            trust_certs_file: Some(ca_file(&dir)),
            authentication_plugin: Some(
                "org.apache.pulsar.client.impl.auth.AuthenticationToken".into(),
            ),
            authentication_parameters: Some(format!("file://{}", token_file.display())),
        };
        let both = PeerCredentials::resolve(&config).await.unwrap();
        assert_eq!(both.token.as_deref(), Some("secret-token"));
        assert!(!format!("{both:?}").contains("secret"));
        assert!(
            matches!(both.pulsar_route(&owner(true)), PulsarRoute::Tls(u, _) if u.ends_with(":6651"))
        );
        assert!(matches!(
            both.pulsar_route(&owner(false)),
            PulsarRoute::Plain(_)
        ));
        assert_eq!(both.http_base(&owner(true)), "https://10.0.0.1:8443");
        assert_eq!(both.http_base(&owner(false)), "http://10.0.0.1:8080");

        // A token given inline; parameters without a plugin are not used.
        let inline = BrokerClientConfig {
            authentication_plugin: Some("token".into()),
            authentication_parameters: Some("token:abc".into()),
            ..BrokerClientConfig::default()
        };
        let inline = PeerCredentials::resolve(&inline).await.unwrap();
        assert_eq!(inline.token.as_deref(), Some("abc"));
        let no_plugin = BrokerClientConfig {
            authentication_parameters: Some("token:abc".into()),
            ..BrokerClientConfig::default()
        };
        assert!(
            PeerCredentials::resolve(&no_plugin)
                .await
                .unwrap()
                .token
                .is_none()
        );

        // Settings that cannot work are refused, naming why.
        let no_trust = BrokerClientConfig {
            tls_enabled: true,
            ..BrokerClientConfig::default()
        };
        assert!(matches!(
            PeerCredentials::resolve(&no_trust).await,
            Err(BrokerClientError::NoTrustCerts)
        ));
        let tls_plugin = BrokerClientConfig {
            authentication_plugin: Some(
                "org.apache.pulsar.client.impl.auth.AuthenticationTls".into(),
            ),
            ..BrokerClientConfig::default()
        };
        assert!(matches!(
            PeerCredentials::resolve(&tls_plugin).await,
            Err(BrokerClientError::UnsupportedAuth(_))
        ));
        let missing = BrokerClientConfig {
            authentication_plugin: Some("token".into()),
            authentication_parameters: Some("file:///nonexistent/vela-token".into()),
            ..BrokerClientConfig::default()
        };
        assert!(matches!(
            PeerCredentials::resolve(&missing).await,
            Err(BrokerClientError::TokenFile { .. })
        ));
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
