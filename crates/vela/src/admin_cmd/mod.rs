//! `vela admin`: pulsar-admin's commands over the broker's admin REST API,
//! plus `write-path` and `read-path`, the tables of stage latencies.
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
//! Map: here the command line and its dispatch; `api`: the HTTP client,
//! REST paths, pulsar-admin's units and the output, shared by one module
//! per command family: `tenants`, `namespaces` (and their policies),
//! `topics` (and subscriptions), `policies` (topic and namespace policies
//! by name, schemas, brokers, message reads), `tokens` (local),
//! `write_path`.

use clap::{Args, Subcommand};

mod api;
mod namespaces;
mod policies;
mod tenants;
mod tokens;
mod topics;
mod write_path;

use api::{Api, ApiArgs, print_json};
use namespaces::{NamespacesCmd, namespaces};
use policies::{BrokersCmd, PolicyCmd, SchemasCmd};
use tenants::{TenantsCmd, tenants};
use tokens::{TokensCmd, tokens};
use topics::{TopicsCmd, topics};
use write_path::{read_path, write_path};

/// Flags of `vela admin`.
#[derive(Debug, Args)]
pub(crate) struct AdminArgs {
    #[command(flatten)]
    api: ApiArgs,
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
    /// Topic-level policies (one get/set/remove per policy; `list` names them).
    #[command(subcommand)]
    TopicPolicies(PolicyCmd),
    /// Namespace policies kept as Pulsar's JSON (and the typed ones).
    #[command(subcommand)]
    NamespacePolicies(PolicyCmd),
    /// Topic schemas.
    #[command(subcommand)]
    Schemas(SchemasCmd),
    /// Brokers: health, list, leader, dynamic configuration.
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
    /// p50 / p99 / p99.9 of each read-path stage (dispatcher read wait and
    /// read, ledger read, bookie read from cache and from entry logs) and
    /// the bytes each read.
    ReadPath,
}

#[derive(Debug, Subcommand)]
enum ClustersCmd {
    /// List clusters.
    List,
}

pub(crate) fn run(args: AdminArgs) -> anyhow::Result<()> {
    if let AdminCommand::Tokens(cmd) = args.command {
        return tokens(cmd);
    }
    let api = Api::new(&args.api)?;
    match args.command {
        AdminCommand::Tokens(_) => Ok(()),
        AdminCommand::Clusters(ClustersCmd::List) => {
            print_json(&api.get_json("/admin/v2/clusters")?)
        }
        AdminCommand::Brokers(cmd) => policies::brokers(&api, cmd),
        AdminCommand::TopicPolicies(cmd) => policies::topic_policies(&api, cmd),
        AdminCommand::NamespacePolicies(cmd) => policies::namespace_policies(&api, cmd),
        AdminCommand::Schemas(cmd) => policies::schemas(&api, cmd),
        AdminCommand::Tenants(cmd) => tenants(&api, cmd),
        AdminCommand::Namespaces(cmd) => namespaces(&api, cmd),
        AdminCommand::Topics(cmd) => topics(&api, cmd),
        AdminCommand::WritePath { topic } => write_path(&api, topic.as_deref()),
        AdminCommand::ReadPath => read_path(&api),
    }
}
