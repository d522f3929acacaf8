//! `vela admin`: pulsar-admin's commands over the broker's admin REST API,
//! plus `write-path`, the table of write-path stage latencies.
//!
//! Owns: the command line (pulsar-admin's command and flag names where clap
//! allows them: multi-letter short flags such as `-ttl` become long ones),
//! turning commands into REST calls (`ureq`, blocking: one request at a
//! time is all a CLI needs) and printing answers (JSON pretty-printed, lists
//! one per line, errors as Pulsar's `reason`). Never: talks to the metadata
//! store or the broker's protocol port; everything goes through HTTP
//! (`tokens` excepted: it makes keys and mints tokens locally, see
//! `token_keys`).
//! Authentication: `--auth-token`/`--auth-token-file` send
//! `Authorization: Bearer`; `https://` URLs are checked against the system
//! roots or `--tls-trust-certs-file`.
//!
//! Map: here the flags, the HTTP client (`Api`), REST paths, pulsar-admin's
//! units and the output; one module per command family: `tenants`,
//! `namespaces` (and their policies), `topics` (and subscriptions),
//! `tokens` (local), `write_path`.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::Value;
use vela_broker::{NamespaceName, TopicName};

mod namespaces;
mod tenants;
mod tokens;
mod topics;
mod write_path;

use namespaces::{NamespacesCmd, namespaces};
use tenants::{TenantsCmd, tenants};
use tokens::{TokensCmd, tokens};
use topics::{TopicsCmd, topics};
use write_path::write_path;

/// Time a request may take (a partitioned-stats call on a large topic reads
/// every partition's stats).
const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// Flags of `vela admin`.
#[derive(Debug, Args)]
pub(crate) struct AdminArgs {
    /// The broker's admin HTTP URL.
    #[arg(long, global = true, default_value = "http://127.0.0.1:8080")]
    admin_url: String,
    /// Token sent as `Authorization: Bearer` (pulsar-admin's
    /// `--auth-params token:...`).
    #[arg(
        long,
        global = true,
        value_name = "TOKEN",
        conflicts_with = "auth_token_file"
    )]
    auth_token: Option<String>,
    /// File holding the token (trailing whitespace ignored).
    #[arg(long, global = true, value_name = "FILE")]
    auth_token_file: Option<PathBuf>,
    /// PEM certificates trusted for an https admin URL (instead of the
    /// built-in web roots), e.g. a self-signed broker certificate.
    #[arg(long, global = true, value_name = "FILE")]
    tls_trust_certs_file: Option<PathBuf>,
    #[command(subcommand)]
    command: AdminCommand,
}

#[derive(Debug, Subcommand)]
enum AdminCommand {
    /// Clusters (Vela has one: standalone).
    #[command(subcommand)]
    Clusters(ClustersCmd),
    /// Tenants.
    #[command(subcommand)]
    Tenants(TenantsCmd),
    /// Namespaces and their policies.
    #[command(subcommand)]
    Namespaces(NamespacesCmd),
    /// Topics, their stats and subscriptions.
    #[command(subcommand)]
    Topics(TopicsCmd),
    /// Broker checks.
    #[command(subcommand)]
    Brokers(BrokersCmd),
    /// Token authentication: make keys and tokens (local, no HTTP).
    #[command(subcommand)]
    Tokens(TokensCmd),
    /// p50 / p99 / p99.9 of each write-path stage (broker publish, ledger add,
    /// bookie add, journal queue wait, write, fdatasync).
    WritePath {
        /// Add this topic's own publish and storage-write latencies.
        #[arg(long)]
        topic: Option<String>,
    },
}

#[derive(Debug, Subcommand)]
enum ClustersCmd {
    /// List clusters.
    List,
}

#[derive(Debug, Subcommand)]
enum BrokersCmd {
    /// Check the broker answers.
    Healthcheck,
}

/// The admin API over HTTP.
struct Api {
    agent: ureq::Agent,
    base: String,
    /// `Bearer <token>`, when given.
    authorization: Option<String>,
}

impl Api {
    fn new(args: &AdminArgs) -> anyhow::Result<Api> {
        let mut builder = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(REQUEST_TIMEOUT));
        if let Some(file) = &args.tls_trust_certs_file {
            let pem = crate::security_args::read_key(file, "--tls-trust-certs-file")?;
            let certs = ureq::tls::parse_pem(&pem)
                .filter_map(|item| match item {
                    Ok(ureq::tls::PemItem::Certificate(cert)) => Some(Ok(cert)),
                    Ok(_) => None,
                    Err(e) => Some(Err(e)),
                })
                .collect::<Result<Vec<_>, _>>()
                .with_context(|| format!("--tls-trust-certs-file {}", file.display()))?;
            if certs.is_empty() {
                bail!(
                    "--tls-trust-certs-file {}: no CERTIFICATE in it",
                    file.display()
                );
            }
            let tls = ureq::tls::TlsConfig::builder()
                .root_certs(ureq::tls::RootCerts::Specific(Arc::new(certs)))
                .build();
            builder = builder.tls_config(tls);
        }
        let token = match (&args.auth_token, &args.auth_token_file) {
            (Some(token), _) => Some(token.trim().to_string()),
            (None, Some(file)) => {
                let bytes = crate::security_args::read_key(file, "--auth-token-file")?;
                let text = String::from_utf8(bytes)
                    .with_context(|| format!("--auth-token-file {}: not UTF-8", file.display()))?;
                Some(text.trim().to_string())
            }
            (None, None) => None,
        };
        Ok(Api {
            agent: builder.build().into(),
            base: args.admin_url.trim_end_matches('/').to_string(),
            authorization: token.map(|t| format!("Bearer {t}")),
        })
    }

    /// One request; the body on 2xx, an error naming Pulsar's reason otherwise.
    fn call(&self, method: &str, path: &str, body: Option<&str>) -> anyhow::Result<String> {
        let url = format!("{}{path}", self.base);
        let auth = self.authorization.as_deref();
        // ureq's builders differ with and without a body: add the header
        // on each.
        macro_rules! authed {
            ($request:expr) => {{
                let request = $request;
                match auth {
                    Some(value) => request.header("Authorization", value),
                    None => request,
                }
            }};
        }
        let result = match (method, body) {
            ("GET", _) => authed!(self.agent.get(&url)).call(),
            ("DELETE", _) => authed!(self.agent.delete(&url)).call(),
            ("PUT", Some(body)) => authed!(self.agent.put(&url))
                .header("Content-Type", "application/json")
                .send(body),
            ("PUT", None) => authed!(self.agent.put(&url)).send_empty(),
            ("POST", Some(body)) => authed!(self.agent.post(&url))
                .header("Content-Type", "application/json")
                .send(body),
            ("POST", None) => authed!(self.agent.post(&url)).send_empty(),
            _ => bail!("unsupported method {method}"),
        };
        let mut response = result.with_context(|| format!("{method} {url}"))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .with_context(|| format!("reading the answer of {method} {url}"))?;
        if (200..300).contains(&status) {
            return Ok(text);
        }
        let reason = serde_json::from_str::<Value>(&text)
            .ok()
            .and_then(|v| v.get("reason").and_then(Value::as_str).map(String::from))
            .unwrap_or(text);
        bail!("{reason} (HTTP {status})")
    }

    fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let text = self.call("GET", path, None)?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| format!("GET {path}: not JSON"))
    }
}

/// Percent-encodes one path segment.
fn encode(segment: &str) -> String {
    let mut out = String::new();
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'.' | b'~') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

fn topic_path(topic: &str) -> anyhow::Result<String> {
    let name = TopicName::parse(topic).with_context(|| format!("bad topic name {topic:?}"))?;
    Ok(format!(
        "/admin/v2/{}/{}/{}/{}",
        name.domain.as_str(),
        encode(&name.namespace.tenant),
        encode(&name.namespace.namespace),
        encode(&name.local)
    ))
}

fn namespace_path(namespace: &str) -> anyhow::Result<String> {
    let ns = NamespaceName::parse(namespace)
        .with_context(|| format!("bad namespace {namespace:?} (expected tenant/namespace)"))?;
    Ok(format!(
        "/admin/v2/namespaces/{}/{}",
        encode(&ns.tenant),
        encode(&ns.namespace)
    ))
}

/// pulsar-admin's relative times: a number with s, m, h, d, w or y (no unit:
/// seconds); `-1` stays −1.
fn seconds(text: &str) -> anyhow::Result<i64> {
    let text = text.trim();
    if text == "-1" {
        return Ok(-1);
    }
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: i64 = digits
        .parse()
        .with_context(|| format!("bad time {text:?} (e.g. 30s, 10m, 2h, 1d)"))?;
    let factor = match unit.to_ascii_lowercase().as_str() {
        "" | "s" => 1,
        "m" => 60,
        "h" => 3600,
        "d" => 86_400,
        "w" => 7 * 86_400,
        "y" => 365 * 86_400,
        other => bail!("bad time unit {other:?} in {text:?}"),
    };
    Ok(value * factor)
}

/// pulsar-admin's sizes: a number with k, m, g or t (no unit: bytes); `-1`
/// stays −1.
fn bytes(text: &str) -> anyhow::Result<i64> {
    let text = text.trim();
    if text == "-1" {
        return Ok(-1);
    }
    let (digits, unit) = text.split_at(
        text.find(|c: char| !c.is_ascii_digit())
            .unwrap_or(text.len()),
    );
    let value: i64 = digits
        .parse()
        .with_context(|| format!("bad size {text:?} (e.g. 100M, 16G)"))?;
    let factor: i64 = match unit.to_ascii_lowercase().as_str() {
        "" => 1,
        "k" => 1 << 10,
        "m" => 1 << 20,
        "g" => 1 << 30,
        "t" => 1 << 40,
        other => bail!("bad size unit {other:?} in {text:?}"),
    };
    Ok(value * factor)
}

/// `earliest`, `latest` or `LEDGER:ENTRY` as Pulsar's MessageId JSON.
fn message_id_json(text: &str) -> anyhow::Result<String> {
    let (ledger, entry) = match text {
        "earliest" => (-1, -1),
        "latest" => (i64::MAX, i64::MAX),
        other => {
            let (ledger, entry) = other
                .split_once(':')
                .with_context(|| format!("bad message id {other:?} (LEDGER:ENTRY)"))?;
            (
                ledger.parse().context("bad ledger id")?,
                entry.parse().context("bad entry id")?,
            )
        }
    };
    Ok(serde_json::json!({"ledgerId": ledger, "entryId": entry, "partitionIndex": -1}).to_string())
}

/// Writes to stdout; a closed pipe (`| head`) ends the output quietly.
fn out(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match writeln!(std::io::stdout().lock(), "{text}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

fn print_json(value: &Value) -> anyhow::Result<()> {
    match value {
        Value::Array(items) if items.iter().all(Value::is_string) => {
            for item in items {
                out(item.as_str().unwrap_or_default())?;
            }
        }
        Value::Null => {}
        other => out(&serde_json::to_string_pretty(other)?)?,
    }
    Ok(())
}

pub(crate) fn run(args: AdminArgs) -> anyhow::Result<()> {
    if let AdminCommand::Tokens(cmd) = args.command {
        return tokens(cmd);
    }
    let api = Api::new(&args)?;
    match args.command {
        AdminCommand::Tokens(_) => Ok(()),
        AdminCommand::Clusters(ClustersCmd::List) => {
            print_json(&api.get_json("/admin/v2/clusters")?)
        }
        AdminCommand::Brokers(BrokersCmd::Healthcheck) => {
            out(&api.call("GET", "/admin/v2/brokers/health", None)?)
        }
        AdminCommand::Tenants(cmd) => tenants(&api, cmd),
        AdminCommand::Namespaces(cmd) => namespaces(&api, cmd),
        AdminCommand::Topics(cmd) => topics(&api, cmd),
        AdminCommand::WritePath { topic } => write_path(&api, topic.as_deref()),
    }
}

fn split_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn units_parse_like_pulsar_admin() {
        assert_eq!(seconds("90").unwrap(), 90);
        assert_eq!(seconds("10m").unwrap(), 600);
        assert_eq!(seconds("2h").unwrap(), 7200);
        assert_eq!(seconds("-1").unwrap(), -1);
        assert!(seconds("5x").is_err());
        assert_eq!(bytes("10M").unwrap(), 10 << 20);
        assert_eq!(bytes("1g").unwrap(), 1 << 30);
        assert!(bytes("").is_err());
    }

    #[test]
    fn paths_encode_names() {
        assert_eq!(
            topic_path("my topic").unwrap(),
            "/admin/v2/persistent/public/default/my%20topic"
        );
        assert_eq!(
            topic_path("persistent://t/ns/x-partition-0").unwrap(),
            "/admin/v2/persistent/t/ns/x-partition-0"
        );
        assert!(namespace_path("nons").is_err());
        assert!(message_id_json("3:4").unwrap().contains("\"ledgerId\":3"));
    }
}
