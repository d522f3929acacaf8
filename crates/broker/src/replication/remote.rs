//! How a replicator reaches a remote cluster: the URL and the client
//! settings from the cluster's record (Pulsar's ClusterData:
//! `brokerServiceUrl`, or `brokerServiceUrlTls` with
//! `brokerClientTlsEnabled`; `brokerClientTrustCertsFilePath`;
//! `authenticationPlugin` and `authenticationParameters`), each unset one
//! from the broker's `brokerClient*` settings (`BrokerClientConfig`).
//!
//! Owns: merging the record with the defaults; reading the trust file and
//! the token is `broker_client`'s (the same code for every broker client).
//! Never: logs a credential, or accepts an authentication plugin it cannot
//! speak (the remote is then not replicated to, and says why).

use std::path::PathBuf;
use std::sync::Arc;

use vela_client::ClientConfig;

use super::remote_admin::RemoteAdmin;
use crate::admin::ClusterData;
use crate::broker_client::{self, BrokerClientError};
use crate::config::BrokerClientConfig;

/// Why a remote cannot be connected to.
#[derive(Debug, thiserror::Error)]
pub(super) enum RemoteError {
    #[error("no {0} in the cluster's record")]
    NoUrl(&'static str),
    #[error("TLS is enabled but no brokerClientTrustCertsFilePath is set")]
    NoTrustCerts,
    #[error(transparent)]
    Client(#[from] BrokerClientError),
    #[error("admin API: {0}")]
    Admin(String),
}

/// How to reach a remote cluster.
#[derive(Debug)]
pub(super) struct RemoteSetup {
    /// Its broker URL (`pulsar://` or `pulsar+ssl://`).
    pub(super) url: String,
    pub(super) config: ClientConfig,
    /// Its admin API (`None`: its record names no service URL).
    pub(super) admin: Option<Arc<RemoteAdmin>>,
}

/// The URL and client settings to reach `data`'s cluster.
pub(super) async fn setup(
    defaults: &BrokerClientConfig,
    data: &ClusterData,
) -> Result<RemoteSetup, RemoteError> {
    let client = &data.client;
    let tls = client
        .broker_client_tls_enabled
        .unwrap_or(defaults.tls_enabled);
    let url = if tls {
        data.broker_service_url_tls
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or(RemoteError::NoUrl("brokerServiceUrlTls"))?
    } else {
        data.broker_service_url
            .clone()
            .filter(|u| !u.is_empty())
            .ok_or(RemoteError::NoUrl("brokerServiceUrl"))?
    };
    let mut config = ClientConfig::default();
    let mut roots = None;
    if tls {
        let trust = client
            .broker_client_trust_certs_file_path
            .clone()
            .map(PathBuf::from)
            .or_else(|| defaults.trust_certs_file.clone())
            .ok_or(RemoteError::NoTrustCerts)?;
        let (tls_config, pem) = broker_client::trust(trust).await?;
        config.tls = Some(tls_config);
        roots = Some(pem);
    }
    let plugin = client
        .authentication_plugin
        .as_deref()
        .or(defaults.authentication_plugin.as_deref());
    let params = client
        .authentication_parameters
        .as_deref()
        .or(defaults.authentication_parameters.as_deref());
    config.auth_token = broker_client::plugin_token(plugin, params).await?;
    let service_url = if tls {
        data.service_url_tls.as_deref()
    } else {
        data.service_url.as_deref()
    };
    let admin = match service_url.filter(|u| !u.is_empty()) {
        Some(base) => Some(Arc::new(
            RemoteAdmin::new(base, roots.as_deref(), config.auth_token.as_deref())
                .map_err(RemoteError::Admin)?,
        )),
        None => None,
    };
    Ok(RemoteSetup { url, config, admin })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::admin::ClusterClient;

    fn data() -> ClusterData {
        ClusterData {
            broker_service_url: Some("pulsar://127.0.0.1:1".into()),
            broker_service_url_tls: Some("pulsar+ssl://127.0.0.1:2".into()),
            ..ClusterData::default()
        }
    }

    #[tokio::test]
    async fn the_record_wins_over_the_broker_s_defaults() {
        let defaults = BrokerClientConfig::default();
        let plain = setup(&defaults, &data()).await.unwrap();
        assert_eq!(plain.url, "pulsar://127.0.0.1:1");
        assert!(plain.config.tls.is_none() && plain.config.auth_token.is_none());
        assert!(plain.admin.is_none(), "no service URL in the record");

        let mut token = data();
        token.client = ClusterClient {
            authentication_plugin: Some(
                "org.apache.pulsar.client.impl.auth.AuthenticationToken".into(),
            ),
            authentication_parameters: Some("token:abc".into()),
            ..ClusterClient::default()
        };
        token.service_url = Some("http://127.0.0.1:3".into());
        let with_token = setup(&defaults, &token).await.unwrap();
        assert_eq!(with_token.config.auth_token.as_deref(), Some("abc"));
        assert!(with_token.admin.is_some());

        let mut tls = data();
        tls.client.broker_client_tls_enabled = Some(true);
        assert!(matches!(
            setup(&defaults, &tls).await,
            Err(RemoteError::NoTrustCerts)
        ));
        let mut other = data();
        other.client.authentication_plugin = Some("org.example.AuthenticationKerberos".into());
        assert!(matches!(
            setup(&defaults, &other).await,
            Err(RemoteError::Client(BrokerClientError::UnsupportedAuth(_)))
        ));
    }

    #[tokio::test]
    async fn tokens_are_given_or_read_from_a_file() {
        use broker_client::token_of;
        assert_eq!(token_of("token:xyz").await.unwrap(), "xyz");
        assert_eq!(token_of("xyz").await.unwrap(), "xyz");
        let dir = std::env::temp_dir().join(format!("vela-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("t");
        std::fs::write(&file, "from-file\n").unwrap();
        let params = format!("file://{}", file.display());
        assert_eq!(token_of(&params).await.unwrap(), "from-file");
        std::fs::remove_dir_all(&dir).unwrap();
        assert!(token_of("file:///nonexistent/vela/token").await.is_err());
    }
}
