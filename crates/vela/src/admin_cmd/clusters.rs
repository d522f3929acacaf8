//! `vela admin clusters` (list, get, create, update, delete: Pulsar's
//! ClusterData URLs) and the replication-cluster lists shared by
//! `namespaces set-clusters` and `topics set-replication-clusters`.

use clap::{Args, Subcommand};
use serde_json::{Map, Value};

use super::api::{Api, encode, print_json, split_list};

#[derive(Debug, Subcommand)]
pub(super) enum ClustersCmd {
    /// List clusters.
    List,
    /// Show a cluster's URLs.
    Get { cluster: String },
    /// Record a cluster (how this cluster's brokers reach it).
    Create {
        cluster: String,
        #[command(flatten)]
        urls: ClusterUrls,
    },
    /// Replace a cluster's URLs.
    Update {
        cluster: String,
        #[command(flatten)]
        urls: ClusterUrls,
    },
    /// Delete a cluster no tenant allows.
    Delete { cluster: String },
}

/// pulsar-admin's cluster URL flags.
#[derive(Debug, Args)]
pub(super) struct ClusterUrls {
    /// Admin URL, http://host:port.
    #[arg(long = "url")]
    url: Option<String>,
    /// Admin URL over TLS, https://host:port.
    #[arg(long = "url-secure")]
    url_secure: Option<String>,
    /// Broker URL, pulsar://host:port (what replicators connect to).
    #[arg(long = "broker-url")]
    broker_url: Option<String>,
    /// Broker URL over TLS, pulsar+ssl://host:port.
    #[arg(long = "broker-url-secure")]
    broker_url_secure: Option<String>,
}

impl ClusterUrls {
    fn body(&self) -> String {
        let mut body = Map::new();
        for (key, value) in [
            ("serviceUrl", &self.url),
            ("serviceUrlTls", &self.url_secure),
            ("brokerServiceUrl", &self.broker_url),
            ("brokerServiceUrlTls", &self.broker_url_secure),
        ] {
            if let Some(value) = value {
                body.insert(key.to_string(), Value::String(value.clone()));
            }
        }
        Value::Object(body).to_string()
    }
}

pub(super) fn clusters(api: &Api, cmd: ClustersCmd) -> anyhow::Result<()> {
    let path = |cluster: &str| format!("/admin/v2/clusters/{}", encode(cluster));
    match cmd {
        ClustersCmd::List => print_json(&api.get_json("/admin/v2/clusters")?),
        ClustersCmd::Get { cluster } => print_json(&api.get_json(&path(&cluster))?),
        ClustersCmd::Create { cluster, urls } => {
            api.call("PUT", &path(&cluster), Some(&urls.body()))?;
            Ok(())
        }
        ClustersCmd::Update { cluster, urls } => {
            api.call("POST", &path(&cluster), Some(&urls.body()))?;
            Ok(())
        }
        ClustersCmd::Delete { cluster } => {
            api.call("DELETE", &path(&cluster), None)?;
            Ok(())
        }
    }
}

/// POSTs a comma-separated cluster list to `{base}/replication`.
pub(super) fn set_replication(api: &Api, base: &str, clusters: &str) -> anyhow::Result<()> {
    let body = serde_json::to_string(&split_list(clusters))?;
    api.call("POST", &format!("{base}/replication"), Some(&body))?;
    Ok(())
}

/// Prints `{base}/replication` (`null` when a topic has no list of its own).
pub(super) fn get_replication(api: &Api, base: &str, query: &str) -> anyhow::Result<()> {
    match api.get_json(&format!("{base}/replication{query}"))? {
        Value::Null => super::api::out("null"),
        other => print_json(&other),
    }
}
