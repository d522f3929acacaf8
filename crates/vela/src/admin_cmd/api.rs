//! What the command modules of `vela admin` share: the HTTP client of the
//! admin REST API ([`Api`], with the flags that say where and how to reach
//! it, [`ApiArgs`]), REST paths of topics and namespaces, pulsar-admin's
//! units (`10m`, `1g`, `3:4`) and the output (stdout, JSON).
//! Never: knows a command family.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::Value;
use vela_broker::{NamespaceName, TopicName};

/// Where `vela admin` finds the broker's admin API, and how it
/// authenticates.
#[derive(Debug, Args)]
pub(super) struct ApiArgs {
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
}

/// Time a request may take (a partitioned-stats call on a large topic reads
/// every partition's stats).
pub(super) const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);

/// The admin API over HTTP.
pub(super) struct Api {
    agent: ureq::Agent,
    base: String,
    /// `Bearer <token>`, when given.
    authorization: Option<String>,
}

impl Api {
    pub(super) fn new(args: &ApiArgs) -> anyhow::Result<Api> {
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
    pub(super) fn call(
        &self,
        method: &str,
        path: &str,
        body: Option<&str>,
    ) -> anyhow::Result<String> {
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

    pub(super) fn get_json(&self, path: &str) -> anyhow::Result<Value> {
        let text = self.call("GET", path, None)?;
        if text.trim().is_empty() {
            return Ok(Value::Null);
        }
        serde_json::from_str(&text).with_context(|| format!("GET {path}: not JSON"))
    }
}

/// Percent-encodes one path segment.
pub(super) fn encode(segment: &str) -> String {
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

pub(super) fn topic_path(topic: &str) -> anyhow::Result<String> {
    let name = TopicName::parse(topic).with_context(|| format!("bad topic name {topic:?}"))?;
    Ok(format!(
        "/admin/v2/{}/{}/{}/{}",
        name.domain.as_str(),
        encode(&name.namespace.tenant),
        encode(&name.namespace.namespace),
        encode(&name.local)
    ))
}

pub(super) fn namespace_path(namespace: &str) -> anyhow::Result<String> {
    namespace_path_in("namespaces", namespace)
}

/// `/admin/v2/{family}/{tenant}/{namespace}`: `namespaces` for the
/// namespace itself, `persistent` for its topics.
pub(super) fn namespace_path_in(family: &str, namespace: &str) -> anyhow::Result<String> {
    let ns = NamespaceName::parse(namespace)
        .with_context(|| format!("bad namespace {namespace:?} (expected tenant/namespace)"))?;
    Ok(format!(
        "/admin/v2/{family}/{}/{}",
        encode(&ns.tenant),
        encode(&ns.namespace)
    ))
}

/// pulsar-admin's relative times: a number with s, m, h, d, w or y (no unit:
/// seconds); `-1` stays −1.
pub(super) fn seconds(text: &str) -> anyhow::Result<i64> {
    quantity(text, "time", "30s, 10m, 2h, 1d", |unit| match unit {
        "" | "s" => Some(1),
        "m" => Some(60),
        "h" => Some(3600),
        "d" => Some(86_400),
        "w" => Some(7 * 86_400),
        "y" => Some(365 * 86_400),
        _ => None,
    })
}

/// pulsar-admin's sizes: a number with k, m, g or t (no unit: bytes); `-1`
/// stays −1.
pub(super) fn bytes(text: &str) -> anyhow::Result<i64> {
    quantity(text, "size", "100M, 16G", |unit| match unit {
        "" => Some(1),
        "k" => Some(1 << 10),
        "m" => Some(1 << 20),
        "g" => Some(1 << 30),
        "t" => Some(1 << 40),
        _ => None,
    })
}

/// A number followed by a unit (`factor` of the lowercased unit; `None`:
/// not a unit of this `kind`), or `-1`, which stays −1.
fn quantity(
    text: &str,
    kind: &str,
    examples: &str,
    factor: impl Fn(&str) -> Option<i64>,
) -> anyhow::Result<i64> {
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
        .with_context(|| format!("bad {kind} {text:?} (e.g. {examples})"))?;
    let unit = unit.to_ascii_lowercase();
    match factor(&unit) {
        Some(factor) => Ok(value * factor),
        None => bail!("bad {kind} unit {unit:?} in {text:?}"),
    }
}

/// `earliest`, `latest` or `LEDGER:ENTRY` as Pulsar's MessageId JSON.
pub(super) fn message_id_json(text: &str) -> anyhow::Result<String> {
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
pub(super) fn out(text: &str) -> anyhow::Result<()> {
    use std::io::Write as _;
    match writeln!(std::io::stdout().lock(), "{text}") {
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        other => Ok(other?),
    }
}

pub(super) fn print_json(value: &Value) -> anyhow::Result<()> {
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

pub(super) fn split_list(text: &str) -> Vec<String> {
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
