//! TLS and authentication flags shared by `vela standalone` and `vela
//! broker` (Pulsar's `authenticationProviders`, `anonymousUserRole`, the
//! Basic provider's htpasswd file, `tlsTrustCertsFilePath`, the token keys),
//! and their checks (each error names the flag).
//!
//! Owns: reading the token key files and the htpasswd file (the broker
//! crate never reads the environment or key files itself) and filling
//! `BrokerConfig`'s `tls`, `pulsar_tls_addr` and `auth`.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use vela_broker::auth::basic::{BASIC_FILE_BYTES_MAX, BasicUsers};
use vela_broker::auth::jwt::{KEY_FILE_BYTES_MAX, VerifyKey};
use vela_broker::{AuthConfig, Authorization, BrokerConfig, TlsConfig};

/// `--tls-port`, `--https-port`, `--tls-cert-file`, `--auth-token-*`, ...
#[derive(Debug, Clone, Args)]
pub(crate) struct SecurityArgs {
    /// TLS Pulsar port (`pulsar+ssl://`; 0: pick a free one). Needs
    /// --tls-cert-file and --tls-key-file.
    #[arg(long, value_name = "PORT")]
    tls_port: Option<u16>,
    /// HTTPS admin port (0: pick a free one). Needs --tls-cert-file and
    /// --tls-key-file.
    #[arg(long, value_name = "PORT")]
    https_port: Option<u16>,
    /// No plain-text listeners (--port, --http-port): TLS only.
    #[arg(long)]
    disable_plain_ports: bool,
    /// PEM certificate chain of the TLS ports (leaf first). Reloaded when
    /// the file changes.
    #[arg(long, value_name = "FILE")]
    tls_cert_file: Option<PathBuf>,
    /// PEM private key of the TLS ports. Reloaded when the file changes.
    #[arg(long, value_name = "FILE")]
    tls_key_file: Option<PathBuf>,
    /// How often the certificate and key files are checked for changes, s.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    tls_cert_refresh_check_s: u64,
    /// Token authentication with HS256: the secret key file (raw bytes, as
    /// `vela admin tokens create-secret-key` and Pulsar write it).
    #[arg(long, value_name = "FILE", conflicts_with = "auth_token_public_key")]
    auth_token_secret_key: Option<PathBuf>,
    /// Token authentication with RS256: the public key file (PEM, or DER
    /// as Pulsar's `tokens create-key-pair` writes it).
    #[arg(long, value_name = "FILE")]
    auth_token_public_key: Option<PathBuf>,
    /// Comma-separated roles allowed everything (token subjects).
    #[arg(long, value_name = "ROLES", default_value = "")]
    superuser_roles: String,
    /// Authentication only: any role with a valid token may do anything
    /// (no superuser, tenant admin or namespace grant checks).
    #[arg(long)]
    no_authorization: bool,
    /// How often a connection checks whether its token expired, s (an
    /// expired one is challenged for a fresh token, then closed).
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    auth_refresh_check_s: u64,
    /// Comma-separated authentication providers (Pulsar's
    /// `authenticationProviders`): `token`, `basic`, `tls` (Pulsar's class
    /// names, e.g. `...AuthenticationProviderTls`, are taken too). Default:
    /// `token` when a token key is given, `basic` when --basic-auth-conf is.
    #[arg(long, value_name = "LIST")]
    authentication_providers: Option<String>,
    /// The role of clients whose credentials no provider takes (Pulsar's
    /// `anonymousUserRole`): no credentials, or an auth method no provider
    /// has. Authorization then applies to it. Unset: they are refused.
    #[arg(long, value_name = "ROLE")]
    anonymous_user_role: Option<String>,
    /// The Basic provider's htpasswd file (Pulsar's `basicAuthConf`):
    /// `user:hash` lines, $apr1$ (`htpasswd -m`) or bcrypt (`htpasswd -B`).
    #[arg(long, value_name = "FILE")]
    basic_auth_conf: Option<PathBuf>,
    /// PEM CA certificates client certificates must chain to (Pulsar's
    /// `tlsTrustCertsFilePath`): the TLS ports then ask clients for a
    /// certificate (optional; the `tls` provider takes its CN as the role).
    #[arg(long, value_name = "FILE")]
    tls_trust_certs_file: Option<PathBuf>,
}

/// An authentication provider named on the command line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Provider {
    Token,
    Basic,
    Tls,
}

impl Provider {
    /// `token`, `basic`, `tls`, or Pulsar's provider class names.
    fn parse(name: &str) -> anyhow::Result<Provider> {
        let short = name.rsplit('.').next().unwrap_or(name);
        match short {
            "token" | "AuthenticationProviderToken" => Ok(Provider::Token),
            "basic" | "AuthenticationProviderBasic" => Ok(Provider::Basic),
            "tls" | "AuthenticationProviderTls" => Ok(Provider::Tls),
            _ => bail!(
                "--authentication-providers: unknown provider {name:?} (known: token, basic, tls)"
            ),
        }
    }
}

impl SecurityArgs {
    /// True when the plain Pulsar and HTTP listeners are off.
    pub(crate) fn plain_ports_disabled(&self) -> bool {
        self.disable_plain_ports
    }

    /// The HTTPS address on `bind`, when asked for.
    pub(crate) fn https_addr(&self, bind: IpAddr) -> Option<SocketAddr> {
        self.https_port.map(|port| SocketAddr::new(bind, port))
    }

    /// Checks the flags and fills `config` (reads the token key file).
    pub(crate) fn apply(&self, bind: IpAddr, config: &mut BrokerConfig) -> anyhow::Result<()> {
        let wants_tls = self.tls_port.is_some() || self.https_port.is_some();
        match (&self.tls_cert_file, &self.tls_key_file) {
            (Some(cert), Some(key)) => {
                if !wants_tls {
                    bail!("--tls-cert-file is set but neither --tls-port nor --https-port");
                }
                let mut tls = TlsConfig::new(cert, key);
                tls.reload_check_interval = Duration::from_secs(self.tls_cert_refresh_check_s);
                tls.client_trust_file = self.tls_trust_certs_file.clone();
                config.tls = Some(tls);
            }
            (None, None) if wants_tls => {
                bail!("--tls-port and --https-port need --tls-cert-file and --tls-key-file")
            }
            (None, None) if self.tls_trust_certs_file.is_some() => {
                bail!("--tls-trust-certs-file needs --tls-cert-file, --tls-key-file and a TLS port")
            }
            (None, None) => {}
            (Some(_), None) => bail!("--tls-cert-file needs --tls-key-file"),
            (None, Some(_)) => bail!("--tls-key-file needs --tls-cert-file"),
        }
        config.pulsar_tls_addr = self.tls_port.map(|port| SocketAddr::new(bind, port));
        if self.disable_plain_ports {
            if self.tls_port.is_none() {
                bail!("--disable-plain-ports needs --tls-port (no Pulsar listener otherwise)");
            }
            config.pulsar_addr = None;
        }
        let key = match (&self.auth_token_secret_key, &self.auth_token_public_key) {
            (Some(file), _) => Some(
                VerifyKey::secret(&read_key(file, "--auth-token-secret-key")?)
                    .with_context(|| format!("--auth-token-secret-key {}", file.display()))?,
            ),
            (None, Some(file)) => Some(
                VerifyKey::rsa_public(&read_key(file, "--auth-token-public-key")?)
                    .with_context(|| format!("--auth-token-public-key {}", file.display()))?,
            ),
            (None, None) => None,
        };
        let superusers: Vec<String> = self
            .superuser_roles
            .split(',')
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(String::from)
            .collect();
        let providers = self.providers(key.is_some())?;
        if providers.is_empty() {
            if !superusers.is_empty() || self.no_authorization || self.anonymous_user_role.is_some()
            {
                bail!(
                    "--superuser-roles, --no-authorization and --anonymous-user-role need an \
                     authentication provider (--auth-token-secret-key, --auth-token-public-key, \
                     --basic-auth-conf or --authentication-providers)"
                );
            }
            return Ok(());
        }
        let mut auth = AuthConfig::without_providers();
        for provider in providers {
            match provider {
                Provider::Token => {
                    let Some(key) = key.clone() else {
                        bail!(
                            "--authentication-providers token needs --auth-token-secret-key or \
                             --auth-token-public-key"
                        );
                    };
                    auth.token_key = Some(key);
                }
                Provider::Basic => {
                    let Some(file) = &self.basic_auth_conf else {
                        bail!("--authentication-providers basic needs --basic-auth-conf");
                    };
                    auth.basic_users = Some(read_basic_users(file)?);
                }
                Provider::Tls => {
                    if self.tls_trust_certs_file.is_none() || !wants_tls {
                        bail!(
                            "--authentication-providers tls needs --tls-trust-certs-file and a \
                             TLS port (--tls-port or --https-port)"
                        );
                    }
                    auth.tls_client_certificates = true;
                }
            }
        }
        auth.anonymous_role = self
            .anonymous_user_role
            .as_deref()
            .map(str::trim)
            .filter(|r| !r.is_empty())
            .map(String::from);
        auth.superuser_roles = superusers;
        auth.authorization = if self.no_authorization {
            Authorization::Off
        } else {
            Authorization::Enforced
        };
        auth.refresh_check_interval = Duration::from_secs(self.auth_refresh_check_s);
        config.auth = Some(auth);
        Ok(())
    }
}

impl SecurityArgs {
    /// The providers asked for, explicitly or by the key and file flags; a
    /// flag whose provider is not in an explicit list is an error.
    fn providers(&self, have_token_key: bool) -> anyhow::Result<Vec<Provider>> {
        let Some(list) = &self.authentication_providers else {
            let mut providers = Vec::new();
            if have_token_key {
                providers.push(Provider::Token);
            }
            if self.basic_auth_conf.is_some() {
                providers.push(Provider::Basic);
            }
            return Ok(providers);
        };
        let mut providers = Vec::new();
        for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            let provider = Provider::parse(name)?;
            if !providers.contains(&provider) {
                providers.push(provider);
            }
        }
        if have_token_key && !providers.contains(&Provider::Token) {
            bail!("a token key is given but --authentication-providers has no token");
        }
        if self.basic_auth_conf.is_some() && !providers.contains(&Provider::Basic) {
            bail!("--basic-auth-conf is given but --authentication-providers has no basic");
        }
        Ok(providers)
    }
}

/// Reads and parses the Basic provider's htpasswd file (bounded).
fn read_basic_users(path: &Path) -> anyhow::Result<BasicUsers> {
    let flag = "--basic-auth-conf";
    let len = std::fs::metadata(path)
        .with_context(|| format!("cannot read {flag} {}", path.display()))?
        .len();
    if len > BASIC_FILE_BYTES_MAX as u64 {
        bail!(
            "{flag} {}: {len} bytes, larger than {BASIC_FILE_BYTES_MAX}",
            path.display()
        );
    }
    let content =
        std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))?;
    let users =
        BasicUsers::parse(&content).with_context(|| format!("{flag} {}", path.display()))?;
    if users.is_empty() {
        bail!("{flag} {}: no user", path.display());
    }
    Ok(users)
}

/// Reads a key file (bounded: a wrong path must not read a huge file).
pub(crate) fn read_key(path: &Path, flag: &str) -> anyhow::Result<Vec<u8>> {
    let len = std::fs::metadata(path)
        .with_context(|| format!("cannot read {flag} {}", path.display()))?
        .len();
    if len > KEY_FILE_BYTES_MAX as u64 {
        bail!(
            "{flag} {}: {len} bytes, larger than a key file can be ({KEY_FILE_BYTES_MAX})",
            path.display()
        );
    }
    std::fs::read(path).with_context(|| format!("cannot read {flag} {}", path.display()))
}

/// The HTTP listeners a process runs: plain (unless disabled) and HTTPS
/// (when asked for), and the URLs for its ready line.
pub(crate) struct HttpListeners {
    servers: Vec<vela_broker::HttpServer>,
    /// `http://H:P` and/or `https://H:P`, space-separated.
    pub(crate) urls: String,
}

impl HttpListeners {
    /// Starts them; errors name the flag of the port that failed.
    pub(crate) async fn start(
        broker: &vela_broker::BrokerHandle,
        security: &SecurityArgs,
        bind: IpAddr,
        http_port: u16,
        advertised_host: &str,
    ) -> anyhow::Result<HttpListeners> {
        let mut servers = Vec::new();
        let mut urls = Vec::new();
        if !security.plain_ports_disabled() {
            let addr = SocketAddr::new(bind, http_port);
            let http = broker
                .start_http(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--bind, --http-port)"))?;
            urls.push(format!(
                "http://{advertised_host}:{}",
                http.local_addr().port()
            ));
            servers.push(http);
        }
        if let Some(addr) = security.https_addr(bind) {
            let https = broker
                .start_https(addr)
                .await
                .with_context(|| format!("cannot listen on {addr} (--bind, --https-port)"))?;
            urls.push(format!(
                "https://{advertised_host}:{}",
                https.local_addr().port()
            ));
            servers.push(https);
        }
        Ok(HttpListeners {
            servers,
            urls: urls.join(" "),
        })
    }

    /// Stops every listener, waiting for requests in progress.
    pub(crate) async fn stop(self) {
        for server in self.servers {
            server.stop().await;
        }
    }
}

/// The Pulsar URLs for a ready line: `pulsar://H:P` and/or `pulsar+ssl://H:P`.
pub(crate) fn pulsar_urls(broker: &vela_broker::BrokerHandle, security: &SecurityArgs) -> String {
    let mut urls = Vec::new();
    if !security.plain_ports_disabled() {
        urls.push(broker.service_url().to_string());
    }
    if let Some(tls) = broker.service_url_tls() {
        urls.push(tls);
    }
    urls.join(" ")
}
