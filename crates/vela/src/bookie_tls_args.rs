//! TLS between brokers and bookies: the bookie's server flags and the trust
//! flag of every bookie client (`vela broker`, `vela ledgers`, and `vela
//! bookie` itself, whose auto-recovery reads from other bookies).
//!
//! Owns: turning those flags into a `vela_tls::TlsConfig` for the bookie
//! server and a `vela_bookie_protocol::client::ClientConfig` for its clients; each
//! error names its flag. TLS is all or nothing per cluster: registrations
//! carry plain `host:port` addresses, and every bookie client of a cluster
//! whose bookies serve TLS needs --bookie-tls-trust-certs-file.

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use clap::Args;

/// `--tls-cert-file`, `--tls-key-file` of `vela bookie`.
#[derive(Debug, Clone, Args)]
pub(crate) struct BookieTlsServerArgs {
    /// PEM certificate chain the bookie port serves (TLS only, then), leaf
    /// first; it must name the address clients dial (an IP SAN for an IP).
    /// Reloaded when the file changes.
    #[arg(long, value_name = "FILE", requires = "tls_key_file")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key of --tls-cert-file. Reloaded when the file changes.
    #[arg(long, value_name = "FILE", requires = "tls_cert_file")]
    tls_key_file: Option<PathBuf>,
    /// How often the certificate and key files are checked for changes, s.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    tls_cert_refresh_check_s: u64,
}

impl BookieTlsServerArgs {
    /// The server's TLS files, if it serves TLS.
    pub(crate) fn config(&self) -> anyhow::Result<Option<vela_tls::TlsConfig>> {
        match (&self.tls_cert_file, &self.tls_key_file) {
            (None, None) => Ok(None),
            (Some(cert), Some(key)) => {
                let mut config = vela_tls::TlsConfig::new(cert, key);
                config.reload_check_interval = Duration::from_secs(self.tls_cert_refresh_check_s);
                Ok(Some(config))
            }
            _ => bail!("--tls-cert-file and --tls-key-file go together"),
        }
    }
}

/// `--bookie-tls-trust-certs-file` of every bookie client.
#[derive(Debug, Clone, Args)]
pub(crate) struct BookieTlsClientArgs {
    /// Connect to bookies with TLS, trusting the CA certificates of this PEM
    /// file (the bookies serve TLS: `vela bookie --tls-cert-file`).
    #[arg(long, value_name = "FILE")]
    bookie_tls_trust_certs_file: Option<PathBuf>,
}

impl BookieTlsClientArgs {
    /// The bookie client configuration these flags ask for.
    pub(crate) fn client_config(
        &self,
    ) -> anyhow::Result<vela_bookie_protocol::client::ClientConfig> {
        let mut config = vela_bookie_protocol::client::ClientConfig::default();
        if let Some(file) = &self.bookie_tls_trust_certs_file {
            config.tls = Some(vela_tls::client_config(
                "--bookie-tls-trust-certs-file",
                file,
            )?);
        }
        Ok(config)
    }
}
