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

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use serde_json::Value;
use vela_broker::{NamespaceName, TopicName};

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
enum TokensCmd {
    /// Make a new HS256 secret key (32 random bytes).
    CreateSecretKey {
        /// Write it to this file (raw bytes, mode 0600) instead of printing
        /// it base64-encoded.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// Make a new RS256 key pair, in the files Pulsar's `tokens
    /// create-key-pair` writes (DER: PKCS#8 private key, SubjectPublicKeyInfo
    /// public key). The private key signs tokens (`create --private-key`);
    /// brokers verify them with the public one (`--auth-token-public-key`).
    CreateKeyPair {
        /// The private key's file (new; mode 0600).
        #[arg(long, value_name = "FILE")]
        output_private_key: PathBuf,
        /// The public key's file (new).
        #[arg(long, value_name = "FILE")]
        output_public_key: PathBuf,
        /// Signature algorithm (Pulsar's flag; RS256 only).
        #[arg(short = 'a', long, default_value = "RS256", value_parser = ["RS256"])]
        signature_algorithm: String,
    },
    /// Mint a token for a role.
    Create {
        /// HS256 secret key file.
        #[arg(
            long,
            conflicts_with = "private_key",
            required_unless_present = "private_key"
        )]
        secret_key: Option<PathBuf>,
        /// RS256 private key file (PEM or DER, PKCS#8 or PKCS#1).
        #[arg(long)]
        private_key: Option<PathBuf>,
        /// The role (the token's `sub`).
        #[arg(short = 's', long)]
        subject: String,
        /// Lifetime (e.g. 30s, 10m, 1h, 2d, 1y); none: never expires.
        #[arg(short = 'e', long, alias = "expiry-time")]
        expiry: Option<String>,
    },
    /// Check a token with a key and print its role and expiry.
    Validate {
        /// The token.
        token: String,
        /// HS256 secret key file.
        #[arg(
            long,
            conflicts_with = "public_key",
            required_unless_present = "public_key"
        )]
        secret_key: Option<PathBuf>,
        /// RS256 public key file (PEM or DER).
        #[arg(long)]
        public_key: Option<PathBuf>,
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

#[derive(Debug, Subcommand)]
enum TenantsCmd {
    /// List tenants.
    List,
    /// Show a tenant's configuration.
    Get { tenant: String },
    /// Create a tenant.
    Create {
        tenant: String,
        /// Comma-separated admin roles.
        #[arg(short = 'r', long = "admin-roles", default_value = "")]
        admin_roles: String,
        /// Comma-separated allowed clusters.
        #[arg(short = 'c', long = "allowed-clusters", default_value = "standalone")]
        allowed_clusters: String,
    },
    /// Delete an empty tenant.
    Delete { tenant: String },
}

#[derive(Debug, Subcommand)]
enum NamespacesCmd {
    /// List a tenant's namespaces.
    List { tenant: String },
    /// Topics of a namespace.
    Topics { namespace: String },
    /// Show a namespace's policies.
    Policies { namespace: String },
    /// Show the roles granted actions on a namespace.
    Permissions { namespace: String },
    /// Grant a role actions (produce, consume) on a namespace.
    GrantPermission {
        namespace: String,
        #[arg(long)]
        role: String,
        /// Comma-separated: produce, consume (functions, sources, sinks,
        /// packages are kept but mean nothing here).
        #[arg(long)]
        actions: String,
    },
    /// Revoke a role's grant on a namespace.
    RevokePermission {
        namespace: String,
        #[arg(long)]
        role: String,
    },
    /// Create a namespace.
    Create { namespace: String },
    /// Delete an empty namespace.
    Delete { namespace: String },
    /// List the namespace's bundles (hash ranges of topic names).
    Bundles { namespace: String },
    /// Unload a bundle (its topics move; the next lookup picks an owner).
    Unload {
        namespace: String,
        /// The bundle, e.g. 0x00000000_0x40000000.
        #[arg(short = 'b', long)]
        bundle: String,
    },
    /// Split a bundle in two halves (both stay on its owner).
    SplitBundle {
        namespace: String,
        /// The bundle, e.g. 0x00000000_0x40000000.
        #[arg(short = 'b', long)]
        bundle: String,
    },
    /// Show the persistence policy.
    GetPersistence { namespace: String },
    /// Set the persistence policy (applies from each topic's next ledger).
    SetPersistence {
        namespace: String,
        /// Bookies a ledger is striped over.
        #[arg(short = 'e', long = "bookkeeper-ensemble")]
        ensemble: u32,
        /// Copies of each entry.
        #[arg(short = 'w', long = "bookkeeper-write-quorum")]
        write_quorum: u32,
        /// Copies acknowledged before a publish succeeds.
        #[arg(short = 'a', long = "bookkeeper-ack-quorum")]
        ack_quorum: u32,
        /// Mark-delete rate (accepted, not applied).
        #[arg(short = 'r', long = "ml-mark-delete-max-rate", default_value_t = 0.0)]
        mark_delete_rate: f64,
    },
    /// Remove the persistence policy (back to the broker default).
    RemovePersistence { namespace: String },
    /// Show the retention policy.
    GetRetention { namespace: String },
    /// Set the retention policy.
    SetRetention {
        namespace: String,
        /// Time (e.g. 100m, 3h, 2d, -1 for no limit).
        #[arg(short = 't', long = "time", allow_hyphen_values = true)]
        time: String,
        /// Size (e.g. 10M, 16G, -1 for no limit).
        #[arg(short = 's', long = "size", allow_hyphen_values = true)]
        size: String,
    },
    /// Remove the retention policy.
    RemoveRetention { namespace: String },
    /// Show the message TTL (seconds).
    GetMessageTtl { namespace: String },
    /// Set the message TTL.
    SetMessageTtl {
        namespace: String,
        /// TTL in seconds (pulsar-admin's `-ttl`).
        #[arg(long = "messageTTL", alias = "ttl")]
        ttl: i64,
    },
    /// Remove the message TTL.
    RemoveMessageTtl { namespace: String },
    /// Show whether deduplication is on.
    GetDeduplication { namespace: String },
    /// Turn deduplication on or off.
    SetDeduplication {
        namespace: String,
        /// Enable.
        #[arg(short = 'e', long = "enable", conflicts_with = "disable")]
        enable: bool,
        /// Disable.
        #[arg(short = 'd', long = "disable")]
        disable: bool,
    },
    /// Show the backlog quotas.
    GetBacklogQuotas { namespace: String },
    /// Set a backlog quota.
    SetBacklogQuota {
        namespace: String,
        /// Size limit (e.g. 10M, 16G).
        #[arg(short = 'l', long = "limit", allow_hyphen_values = true)]
        limit: Option<String>,
        /// Time limit (e.g. 3h; pulsar-admin's `-lt`).
        #[arg(long = "limitTime", alias = "lt", allow_hyphen_values = true)]
        limit_time: Option<String>,
        /// producer_request_hold, producer_exception or consumer_backlog_eviction.
        #[arg(short = 'p', long = "policy")]
        policy: String,
        /// destination_storage or message_age.
        #[arg(short = 't', long = "type", default_value = "destination_storage")]
        quota_type: String,
    },
    /// Remove a backlog quota.
    RemoveBacklogQuota {
        namespace: String,
        /// destination_storage or message_age.
        #[arg(short = 't', long = "type", default_value = "destination_storage")]
        quota_type: String,
    },
}

#[derive(Debug, Subcommand)]
enum TopicsCmd {
    /// Topics of a namespace (partitions included).
    List { namespace: String },
    /// Partitioned topics of a namespace.
    ListPartitionedTopics { namespace: String },
    /// Create a non-partitioned topic.
    Create { topic: String },
    /// Create a partitioned topic.
    CreatePartitionedTopic {
        topic: String,
        #[arg(short = 'p', long = "partitions")]
        partitions: u32,
    },
    /// Raise the partition count of a partitioned topic.
    UpdatePartitionedTopic {
        topic: String,
        #[arg(short = 'p', long = "partitions")]
        partitions: u32,
    },
    /// Partition count (0 for a non-partitioned topic).
    GetPartitionedTopicMetadata { topic: String },
    /// Delete a topic.
    Delete {
        topic: String,
        /// Close attached clients first.
        #[arg(short = 'f', long = "force")]
        force: bool,
    },
    /// Delete a partitioned topic and its partitions.
    DeletePartitionedTopic {
        topic: String,
        #[arg(short = 'f', long = "force")]
        force: bool,
    },
    /// Topic statistics.
    Stats { topic: String },
    /// Partitioned topic statistics.
    PartitionedStats {
        topic: String,
        /// Include each partition's stats.
        #[arg(long = "per-partition")]
        per_partition: bool,
    },
    /// Internal stats (ledgers, cursors).
    StatsInternal {
        topic: String,
        /// Include each ledger's metadata (replication, bookies).
        #[arg(short = 'm', long = "metadata")]
        metadata: bool,
    },
    /// Subscriptions of a topic.
    Subscriptions { topic: String },
    /// Create a subscription.
    CreateSubscription {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// earliest, latest or LEDGER:ENTRY.
        #[arg(short = 'm', long = "messageId", default_value = "latest")]
        message_id: String,
    },
    /// Delete a subscription.
    Unsubscribe {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// Even with consumers attached.
        #[arg(short = 'f', long = "force")]
        force: bool,
    },
    /// Move a subscription to a time (relative, e.g. 10m ago) or a message id.
    ResetCursor {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// How long ago (e.g. 100s, 10m, 1h).
        #[arg(short = 't', long = "time", conflicts_with = "message_id")]
        time: Option<String>,
        /// earliest, latest or LEDGER:ENTRY.
        #[arg(short = 'm', long = "messageId")]
        message_id: Option<String>,
    },
    /// Skip messages of a subscription.
    Skip {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        #[arg(short = 'n', long = "count")]
        count: u64,
    },
    /// Skip a subscription's whole backlog.
    ClearBacklog {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
    },
    /// Acknowledge a subscription's messages older than a time.
    ExpireMessages {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// Age (e.g. 100 seconds, or 10m).
        #[arg(short = 't', long = "expireTime")]
        expire_time: String,
    },
    /// Expire messages older than a time on every subscription.
    ExpireMessagesAllSubscriptions {
        topic: String,
        #[arg(short = 't', long = "expireTime")]
        expire_time: String,
    },
    /// Unload a topic (clients reconnect).
    Unload { topic: String },
    /// Terminate a topic: it takes no more messages (prints its last id).
    Terminate { topic: String },
    /// Terminate every partition of a partitioned topic.
    PartitionedTerminate { topic: String },
    /// Which broker serves a topic.
    Lookup { topic: String },
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

/// A message id as Java's `MessageIdImpl.toString()`: `ledger:entry:partition`.
fn message_id_text(id: &Value) -> String {
    let field = |name: &str| id.get(name).and_then(Value::as_i64).unwrap_or(-1);
    let (ledger, entry) = (field("ledgerId"), field("entryId"));
    format!("{ledger}:{entry}:{}", field("partitionIndex"))
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

fn tokens(cmd: TokensCmd) -> anyhow::Result<()> {
    use base64::Engine;
    use vela_broker::auth::jwt::{self, SigningKey, VerifyKey};

    use crate::security_args::read_key;
    use crate::token_keys::{KeyPairDer, PUBLIC_FILE_MODE, SECRET_FILE_MODE, write_new_file};
    match cmd {
        TokensCmd::CreateSecretKey { output } => {
            let secret = jwt::new_secret()?;
            match output {
                Some(path) => write_new_file(&path, &secret, SECRET_FILE_MODE)
                    .with_context(|| format!("cannot write --output {}", path.display())),
                None => out(&base64::engine::general_purpose::STANDARD.encode(secret)),
            }
        }
        TokensCmd::CreateKeyPair {
            output_private_key,
            output_public_key,
            signature_algorithm: _,
        } => {
            for (flag, path) in [
                ("--output-private-key", &output_private_key),
                ("--output-public-key", &output_public_key),
            ] {
                if path.exists() {
                    bail!(
                        "{flag} {}: the file exists (never overwritten)",
                        path.display()
                    );
                }
            }
            let pair = KeyPairDer::generate()?;
            // The public file first: if the private one cannot be written,
            // no private key is left without its public half.
            write_new_file(&output_public_key, pair.public_der(), PUBLIC_FILE_MODE).with_context(
                || {
                    format!(
                        "cannot write --output-public-key {}",
                        output_public_key.display()
                    )
                },
            )?;
            write_new_file(&output_private_key, pair.private_der(), SECRET_FILE_MODE).with_context(
                || {
                    format!(
                        "cannot write --output-private-key {}",
                        output_private_key.display()
                    )
                },
            )
        }
        TokensCmd::Create {
            secret_key,
            private_key,
            subject,
            expiry,
        } => {
            let key = match (secret_key, private_key) {
                (Some(file), _) => SigningKey::secret(&read_key(&file, "--secret-key")?)
                    .with_context(|| format!("--secret-key {}", file.display()))?,
                (None, Some(file)) => {
                    SigningKey::rsa_private(&read_key(&file, "--private-key")?)
                        .with_context(|| format!("--private-key {}", file.display()))?
                }
                (None, None) => bail!("--secret-key or --private-key is required"),
            };
            let expires_at = match expiry {
                Some(text) => {
                    let secs = seconds(&text).context("--expiry")?;
                    let secs = u64::try_from(secs)
                        .ok()
                        .filter(|s| *s > 0)
                        .with_context(|| format!("--expiry {text}: must be positive"))?;
                    Some(SystemTime::now() + Duration::from_secs(secs))
                }
                None => None,
            };
            out(&key.sign(&subject, expires_at)?)
        }
        TokensCmd::Validate {
            token,
            secret_key,
            public_key,
        } => {
            let key = match (secret_key, public_key) {
                (Some(file), _) => VerifyKey::secret(&read_key(&file, "--secret-key")?)?,
                (None, Some(file)) => VerifyKey::rsa_public(&read_key(&file, "--public-key")?)?,
                (None, None) => bail!("--secret-key or --public-key is required"),
            };
            let verified = key.verify(&token, SystemTime::now())?;
            let expiry = match verified.expires_at {
                Some(at) => format!(
                    "expires in {} s",
                    at.duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .as_secs()
                ),
                None => "never expires".to_string(),
            };
            out(&format!("role {} ({expiry})", verified.subject))
        }
    }
}

fn split_list(text: &str) -> Vec<String> {
    text.split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(String::from)
        .collect()
}

fn tenants(api: &Api, cmd: TenantsCmd) -> anyhow::Result<()> {
    match cmd {
        TenantsCmd::List => print_json(&api.get_json("/admin/v2/tenants")?),
        TenantsCmd::Get { tenant } => {
            print_json(&api.get_json(&format!("/admin/v2/tenants/{}", encode(&tenant)))?)
        }
        TenantsCmd::Create {
            tenant,
            admin_roles,
            allowed_clusters,
        } => {
            let body = serde_json::json!({
                "adminRoles": split_list(&admin_roles),
                "allowedClusters": split_list(&allowed_clusters),
            });
            let path = format!("/admin/v2/tenants/{}", encode(&tenant));
            api.call("PUT", &path, Some(&body.to_string()))?;
            Ok(())
        }
        TenantsCmd::Delete { tenant } => {
            api.call(
                "DELETE",
                &format!("/admin/v2/tenants/{}", encode(&tenant)),
                None,
            )?;
            Ok(())
        }
    }
}

fn namespaces(api: &Api, cmd: NamespacesCmd) -> anyhow::Result<()> {
    use NamespacesCmd as N;
    match cmd {
        N::List { tenant } => {
            print_json(&api.get_json(&format!("/admin/v2/namespaces/{}", encode(&tenant)))?)
        }
        N::Topics { namespace } => {
            print_json(&api.get_json(&format!("{}/topics", namespace_path(&namespace)?))?)
        }
        N::Policies { namespace } => print_json(&api.get_json(&namespace_path(&namespace)?)?),
        N::Permissions { namespace } => {
            print_json(&api.get_json(&format!("{}/permissions", namespace_path(&namespace)?))?)
        }
        N::GrantPermission {
            namespace,
            role,
            actions,
        } => {
            let path = format!(
                "{}/permissions/{}",
                namespace_path(&namespace)?,
                encode(&role)
            );
            let actions = serde_json::to_string(&split_list(&actions))?;
            api.call("POST", &path, Some(&actions))?;
            Ok(())
        }
        N::RevokePermission { namespace, role } => {
            let path = format!(
                "{}/permissions/{}",
                namespace_path(&namespace)?,
                encode(&role)
            );
            api.call("DELETE", &path, None)?;
            Ok(())
        }
        N::Bundles { namespace } => {
            print_json(&api.get_json(&format!("{}/bundles", namespace_path(&namespace)?))?)
        }
        N::Unload { namespace, bundle } => {
            let path = format!("{}/{}/unload", namespace_path(&namespace)?, encode(&bundle));
            api.call("PUT", &path, None)?;
            Ok(())
        }
        N::SplitBundle { namespace, bundle } => {
            let path = format!("{}/{}/split", namespace_path(&namespace)?, encode(&bundle));
            api.call("PUT", &path, None)?;
            Ok(())
        }
        N::Create { namespace } => {
            api.call("PUT", &namespace_path(&namespace)?, Some("{}"))?;
            Ok(())
        }
        N::Delete { namespace } => {
            api.call("DELETE", &namespace_path(&namespace)?, None)?;
            Ok(())
        }
        N::GetPersistence { namespace } => policy_get(api, &namespace, "persistence"),
        N::SetPersistence {
            namespace,
            ensemble,
            write_quorum,
            ack_quorum,
            mark_delete_rate,
        } => {
            let body = serde_json::json!({
                "bookkeeperEnsemble": ensemble,
                "bookkeeperWriteQuorum": write_quorum,
                "bookkeeperAckQuorum": ack_quorum,
                "managedLedgerMaxMarkDeleteRate": mark_delete_rate,
            });
            policy_post(api, &namespace, "persistence", &body.to_string())
        }
        N::RemovePersistence { namespace } => policy_delete(api, &namespace, "persistence"),
        N::GetRetention { namespace } => policy_get(api, &namespace, "retention"),
        N::SetRetention {
            namespace,
            time,
            size,
        } => {
            let minutes = match seconds(&time)? {
                -1 => -1,
                s => s / 60,
            };
            let mb = match bytes(&size)? {
                -1 => -1,
                b => b >> 20,
            };
            let body = serde_json::json!({
                "retentionTimeInMinutes": minutes,
                "retentionSizeInMB": mb,
            });
            policy_post(api, &namespace, "retention", &body.to_string())
        }
        N::RemoveRetention { namespace } => policy_delete(api, &namespace, "retention"),
        N::GetMessageTtl { namespace } => policy_get(api, &namespace, "messageTTL"),
        N::SetMessageTtl { namespace, ttl } => {
            policy_post(api, &namespace, "messageTTL", &ttl.to_string())
        }
        N::RemoveMessageTtl { namespace } => policy_delete(api, &namespace, "messageTTL"),
        N::GetDeduplication { namespace } => policy_get(api, &namespace, "deduplication"),
        N::SetDeduplication {
            namespace,
            enable,
            disable,
        } => {
            if enable == disable {
                bail!("give exactly one of --enable and --disable");
            }
            policy_post(api, &namespace, "deduplication", &enable.to_string())
        }
        N::GetBacklogQuotas { namespace } => policy_get(api, &namespace, "backlogQuotaMap"),
        N::SetBacklogQuota {
            namespace,
            limit,
            limit_time,
            policy,
            quota_type,
        } => {
            let limit_size = limit.as_deref().map(bytes).transpose()?.unwrap_or(-1);
            let limit_time = limit_time
                .as_deref()
                .map(seconds)
                .transpose()?
                .unwrap_or(-1);
            let body = serde_json::json!({
                "limitSize": limit_size,
                "limitTime": limit_time,
                "policy": policy,
            });
            let path = format!(
                "{}/backlogQuota?backlogQuotaType={}",
                namespace_path(&namespace)?,
                encode(&quota_type)
            );
            api.call("POST", &path, Some(&body.to_string()))?;
            Ok(())
        }
        N::RemoveBacklogQuota {
            namespace,
            quota_type,
        } => {
            let path = format!(
                "{}/backlogQuota?backlogQuotaType={}",
                namespace_path(&namespace)?,
                encode(&quota_type)
            );
            api.call("DELETE", &path, None)?;
            Ok(())
        }
    }
}

fn policy_get(api: &Api, namespace: &str, policy: &str) -> anyhow::Result<()> {
    let value = api.get_json(&format!("{}/{policy}", namespace_path(namespace)?))?;
    match value {
        Value::Null => out("null")?,
        other => print_json(&other)?,
    }
    Ok(())
}

fn policy_post(api: &Api, namespace: &str, policy: &str, body: &str) -> anyhow::Result<()> {
    api.call(
        "POST",
        &format!("{}/{policy}", namespace_path(namespace)?),
        Some(body),
    )?;
    Ok(())
}

fn policy_delete(api: &Api, namespace: &str, policy: &str) -> anyhow::Result<()> {
    api.call(
        "DELETE",
        &format!("{}/{policy}", namespace_path(namespace)?),
        None,
    )?;
    Ok(())
}

fn namespace_topics_path(namespace: &str) -> anyhow::Result<String> {
    let ns = NamespaceName::parse(namespace)
        .with_context(|| format!("bad namespace {namespace:?} (expected tenant/namespace)"))?;
    Ok(format!(
        "/admin/v2/persistent/{}/{}",
        encode(&ns.tenant),
        encode(&ns.namespace)
    ))
}

fn subscription_path(topic: &str, subscription: &str) -> anyhow::Result<String> {
    Ok(format!(
        "{}/subscription/{}",
        topic_path(topic)?,
        encode(subscription)
    ))
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

fn topics(api: &Api, cmd: TopicsCmd) -> anyhow::Result<()> {
    use TopicsCmd as T;
    let done = |r: anyhow::Result<String>| r.map(|_| ());
    match cmd {
        T::List { namespace } => print_json(&api.get_json(&namespace_topics_path(&namespace)?)?),
        T::ListPartitionedTopics { namespace } => print_json(&api.get_json(&format!(
            "{}/partitioned",
            namespace_topics_path(&namespace)?
        ))?),
        T::Create { topic } => done(api.call("PUT", &topic_path(&topic)?, Some("{}"))),
        T::CreatePartitionedTopic { topic, partitions } => done(api.call(
            "PUT",
            &format!("{}/partitions", topic_path(&topic)?),
            Some(&partitions.to_string()),
        )),
        T::UpdatePartitionedTopic { topic, partitions } => done(api.call(
            "POST",
            &format!("{}/partitions", topic_path(&topic)?),
            Some(&partitions.to_string()),
        )),
        T::GetPartitionedTopicMetadata { topic } => {
            print_json(&api.get_json(&format!("{}/partitions", topic_path(&topic)?))?)
        }
        T::Delete { topic, force } => done(api.call(
            "DELETE",
            &format!("{}?force={force}", topic_path(&topic)?),
            None,
        )),
        T::DeletePartitionedTopic { topic, force } => done(api.call(
            "DELETE",
            &format!("{}/partitions?force={force}", topic_path(&topic)?),
            None,
        )),
        T::Stats { topic } => print_json(&api.get_json(&format!("{}/stats", topic_path(&topic)?))?),
        T::PartitionedStats {
            topic,
            per_partition,
        } => print_json(&api.get_json(&format!(
            "{}/partitioned-stats?perPartition={per_partition}",
            topic_path(&topic)?
        ))?),
        T::StatsInternal { topic, metadata } => print_json(&api.get_json(&format!(
            "{}/internalStats?metadata={metadata}",
            topic_path(&topic)?
        ))?),
        T::Subscriptions { topic } => {
            print_json(&api.get_json(&format!("{}/subscriptions", topic_path(&topic)?))?)
        }
        T::CreateSubscription {
            topic,
            subscription,
            message_id,
        } => done(api.call(
            "PUT",
            &subscription_path(&topic, &subscription)?,
            Some(&message_id_json(&message_id)?),
        )),
        T::Unsubscribe {
            topic,
            subscription,
            force,
        } => done(api.call(
            "DELETE",
            &format!(
                "{}?force={force}",
                subscription_path(&topic, &subscription)?
            ),
            None,
        )),
        T::ResetCursor {
            topic,
            subscription,
            time,
            message_id,
        } => {
            let path = subscription_path(&topic, &subscription)?;
            match (time, message_id) {
                (Some(time), None) => {
                    let timestamp = now_ms() - seconds(&time)? * 1000;
                    done(api.call("POST", &format!("{path}/resetcursor/{timestamp}"), None))
                }
                (None, Some(id)) => done(api.call(
                    "POST",
                    &format!("{path}/resetcursor"),
                    Some(&message_id_json(&id)?),
                )),
                _ => bail!("give exactly one of --time and --messageId"),
            }
        }
        T::Skip {
            topic,
            subscription,
            count,
        } => done(api.call(
            "POST",
            &format!("{}/skip/{count}", subscription_path(&topic, &subscription)?),
            None,
        )),
        T::ClearBacklog {
            topic,
            subscription,
        } => done(api.call(
            "POST",
            &format!("{}/skip_all", subscription_path(&topic, &subscription)?),
            None,
        )),
        T::ExpireMessages {
            topic,
            subscription,
            expire_time,
        } => done(api.call(
            "POST",
            &format!(
                "{}/expireMessages/{}",
                subscription_path(&topic, &subscription)?,
                seconds(&expire_time)?
            ),
            None,
        )),
        T::ExpireMessagesAllSubscriptions { topic, expire_time } => done(api.call(
            "POST",
            &format!(
                "{}/all_subscription/expireMessages/{}",
                topic_path(&topic)?,
                seconds(&expire_time)?
            ),
            None,
        )),
        T::Unload { topic } => {
            done(api.call("PUT", &format!("{}/unload", topic_path(&topic)?), None))
        }
        T::Terminate { topic } => {
            let text = api.call("POST", &format!("{}/terminate", topic_path(&topic)?), None)?;
            let id = message_id_text(&serde_json::from_str(&text)?);
            out(&format!("Topic successfully terminated at {id}"))
        }
        T::PartitionedTerminate { topic } => {
            let path = format!("{}/terminate/partitions", topic_path(&topic)?);
            let ids: std::collections::BTreeMap<u32, Value> =
                serde_json::from_str(&api.call("POST", &path, None)?)?;
            let ids: Vec<String> = ids
                .iter()
                .map(|(i, id)| format!("{i}={}", message_id_text(id)))
                .collect();
            out(&format!(
                "Topic successfully terminated at {{{}}}",
                ids.join(", ")
            ))
        }
        T::Lookup { topic } => {
            let name = TopicName::parse(&topic).with_context(|| format!("bad topic {topic:?}"))?;
            let path = format!(
                "/lookup/v2/topic/{}/{}/{}/{}",
                name.domain.as_str(),
                encode(&name.namespace.tenant),
                encode(&name.namespace.namespace),
                encode(&name.local)
            );
            print_json(&api.get_json(&path)?)
        }
    }
}

/// µs as a short human figure.
fn micros(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

fn write_path(api: &Api, topic: Option<&str>) -> anyhow::Result<()> {
    let path = match topic {
        Some(topic) => format!("/admin/v2/vela/write-path?topic={}", encode(topic)),
        None => "/admin/v2/vela/write-path".to_string(),
    };
    let document = api.get_json(&path)?;
    let rows = document
        .get("stages")
        .and_then(Value::as_array)
        .context("write-path answer without stages")?;
    out(&format!(
        "{:<20} {:<22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "STAGE", "SCOPE", "COUNT", "MEAN", "P50", "P99", "P99.9", "MAX<="
    ))?;
    for row in rows {
        let text = |key: &str| {
            row.get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let figure = |key: &str| row.get(key).and_then(Value::as_f64).unwrap_or(0.0);
        out(&format!(
            "{:<20} {:<22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            text("stage"),
            text("scope"),
            row.get("count").and_then(Value::as_u64).unwrap_or(0),
            micros(figure("mean_us")),
            micros(figure("p50_us")),
            micros(figure("p99_us")),
            micros(figure("p999_us")),
            micros(figure("max_us")),
        ))?;
    }
    out(
        "(stages nest: broker publish ⊃ ledger add ⊃ bookie add ⊃ journal queue wait + write + \
         fdatasync; journal stages count per group / per fdatasync; MAX<=: the upper bound of \
         the slowest sample's histogram bucket)",
    )
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
