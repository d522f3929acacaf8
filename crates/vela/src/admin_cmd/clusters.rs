//! `vela admin clusters` (list, get, create, update, delete: Pulsar's
//! ClusterData URLs, TLS and authentication toward the cluster, with
//! pulsar-admin's flag names) and the replication-cluster lists shared by
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
        details: ClusterDetails,
    },
    /// Replace a cluster's record (fields not given are cleared, as
    /// pulsar-admin's update).
    Update {
        cluster: String,
        #[command(flatten)]
        details: ClusterDetails,
    },
    /// Delete a cluster no tenant allows.
    Delete { cluster: String },
}

/// pulsar-admin's `clusters create|update` flags (its `ClusterDetails`)
/// for the ClusterData fields Vela keeps.
#[derive(Debug, Args)]
pub(super) struct ClusterDetails {
    /// Admin URL, http://host:port.
    #[arg(long = "url")]
    url: Option<String>,
    /// Admin URL over TLS, https://host:port.
    #[arg(long = "url-secure")]
    url_secure: Option<String>,
    /// Broker URL, pulsar://host:port (what replicators connect to).
    #[arg(long = "broker-url")]
    broker_url: Option<String>,
    /// Broker URL over TLS, pulsar+ssl://host:port (used with --tls-enable).
    #[arg(long = "broker-url-secure")]
    broker_url_secure: Option<String>,
    /// Replicators connect to --broker-url-secure over TLS
    /// (brokerClientTlsEnabled).
    #[arg(long = "tls-enable")]
    tls_enable: bool,
    /// PEM file of the roots the cluster's certificate must chain to
    /// (brokerClientTrustCertsFilePath).
    #[arg(long = "tls-trust-certs-filepath")]
    tls_trust_certs_filepath: Option<String>,
    /// Authentication plugin toward the cluster, e.g.
    /// org.apache.pulsar.client.impl.auth.AuthenticationToken
    /// (authenticationPlugin).
    #[arg(long = "auth-plugin")]
    auth_plugin: Option<String>,
    /// Its parameters, e.g. token:... or file:///path (authenticationParameters).
    #[arg(long = "auth-parameters")]
    auth_parameters: Option<String>,
}

impl ClusterDetails {
    /// The ClusterData JSON body, with Pulsar's field names; flags not
    /// given are left out.
    fn body(&self) -> String {
        let mut body = Map::new();
        for (key, value) in [
            ("serviceUrl", &self.url),
            ("serviceUrlTls", &self.url_secure),
            ("brokerServiceUrl", &self.broker_url),
            ("brokerServiceUrlTls", &self.broker_url_secure),
            (
                "brokerClientTrustCertsFilePath",
                &self.tls_trust_certs_filepath,
            ),
            ("authenticationPlugin", &self.auth_plugin),
            ("authenticationParameters", &self.auth_parameters),
        ] {
            if let Some(value) = value {
                body.insert(key.to_string(), Value::String(value.clone()));
            }
        }
        if self.tls_enable {
            body.insert("brokerClientTlsEnabled".to_string(), Value::Bool(true));
        }
        Value::Object(body).to_string()
    }
}

pub(super) fn clusters(api: &Api, cmd: ClustersCmd) -> anyhow::Result<()> {
    let path = |cluster: &str| format!("/admin/v2/clusters/{}", encode(cluster));
    match cmd {
        ClustersCmd::List => print_json(&api.get_json("/admin/v2/clusters")?),
        ClustersCmd::Get { cluster } => print_json(&api.get_json(&path(&cluster))?),
        ClustersCmd::Create { cluster, details } => {
            api.call("PUT", &path(&cluster), Some(&details.body()))?;
            Ok(())
        }
        ClustersCmd::Update { cluster, details } => {
            api.call("POST", &path(&cluster), Some(&details.body()))?;
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Cli {
        #[command(subcommand)]
        cmd: ClustersCmd,
    }

    fn body_of(args: &[&str]) -> Value {
        let cli =
            Cli::try_parse_from(std::iter::once("clusters").chain(args.iter().copied())).unwrap();
        let (ClustersCmd::Create { details, .. } | ClustersCmd::Update { details, .. }) = cli.cmd
        else {
            panic!("not create or update: {args:?}");
        };
        serde_json::from_str(&details.body()).unwrap()
    }

    #[test]
    fn pulsar_admin_flags_make_pulsars_cluster_data() {
        let body = body_of(&[
            "create",
            "east",
            "--url-secure",
            "https://east:8443",
            "--broker-url-secure",
            "pulsar+ssl://east:6651",
            "--tls-enable",
            "--tls-trust-certs-filepath",
            "/certs/ca.pem",
            "--auth-plugin",
            "org.apache.pulsar.client.impl.auth.AuthenticationToken",
            "--auth-parameters",
            "token:abc",
        ]);
        assert_eq!(
            body,
            serde_json::json!({
                "serviceUrlTls": "https://east:8443",
                "brokerServiceUrlTls": "pulsar+ssl://east:6651",
                "brokerClientTlsEnabled": true,
                "brokerClientTrustCertsFilePath": "/certs/ca.pem",
                "authenticationPlugin": "org.apache.pulsar.client.impl.auth.AuthenticationToken",
                "authenticationParameters": "token:abc",
            })
        );
        let plain = body_of(&["update", "east", "--broker-url", "pulsar://east:6650"]);
        assert_eq!(
            plain,
            serde_json::json!({"brokerServiceUrl": "pulsar://east:6650"})
        );
    }
}
