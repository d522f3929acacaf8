//! Geo-replication flags, shared by `vela standalone` and `vela broker`
//! (Pulsar's names): how often replicated subscriptions take a snapshot,
//! and how this broker is a client of other brokers (`brokerClient*`):
//! replicators toward remote clusters whose record does not say, and the
//! brokers of this cluster toward each other (transaction outcomes carried
//! to a topic's owner, coordinator stats gathered).
//!
//! Owns: the flag names and their ranges.

use std::path::PathBuf;

use clap::Args;
use vela_broker::BrokerConfig;
use vela_broker::config::BrokerClientConfig;

/// Geo-replication flags (Debug is not derived: the authentication
/// parameters are a credential).
#[derive(Args)]
pub(crate) struct ReplicationArgs {
    /// How often a topic with a replicated subscription takes a snapshot of
    /// its position in every remote cluster, in ms (Pulsar's
    /// `replicatedSubscriptionsSnapshotFrequencyMillis`): a consumer failing
    /// over to another cluster resumes at most about this much (plus the
    /// replication lag) behind where it acknowledged.
    #[arg(long, value_name = "MS",
          default_value_t = vela_broker::config::REPLICATED_SUBSCRIPTIONS_SNAPSHOT_FREQUENCY_MS_DEFAULT,
          value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    replicated_subscriptions_snapshot_frequency_ms: u64,
    /// Connect to other brokers over TLS (Pulsar's `brokerClientTlsEnabled`):
    /// remote clusters' `brokerServiceUrlTls` (a cluster's record may say
    /// otherwise), and this cluster's brokers that offer TLS.
    #[arg(long)]
    broker_client_tls_enabled: bool,
    /// PEM roots other brokers' certificates must chain to (Pulsar's
    /// `brokerClientTrustCertsFilePath`).
    #[arg(long, value_name = "FILE")]
    broker_client_trust_certs_file_path: Option<PathBuf>,
    /// How this broker authenticates to other brokers (Pulsar's
    /// `brokerClientAuthenticationPlugin`): `token` or
    /// `org.apache.pulsar.client.impl.auth.AuthenticationToken`.
    #[arg(long, value_name = "PLUGIN")]
    broker_client_authentication_plugin: Option<String>,
    /// Its parameters (Pulsar's `brokerClientAuthenticationParameters`):
    /// `token:...` or `file:///path/to/token`.
    #[arg(long, value_name = "PARAMS")]
    broker_client_authentication_parameters: Option<String>,
}

impl ReplicationArgs {
    /// Puts the flags into `config`.
    pub(crate) fn apply(&self, config: &mut BrokerConfig) {
        config.replicated_subscriptions_snapshot_frequency_ms =
            self.replicated_subscriptions_snapshot_frequency_ms;
        config.broker_client = BrokerClientConfig {
            tls_enabled: self.broker_client_tls_enabled,
            trust_certs_file: self.broker_client_trust_certs_file_path.clone(),
            authentication_plugin: self.broker_client_authentication_plugin.clone(),
            authentication_parameters: self.broker_client_authentication_parameters.clone(),
        };
    }
}

impl std::fmt::Debug for ReplicationArgs {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplicationArgs")
            .field(
                "replicated_subscriptions_snapshot_frequency_ms",
                &self.replicated_subscriptions_snapshot_frequency_ms,
            )
            .field("broker_client_tls_enabled", &self.broker_client_tls_enabled)
            .field(
                "broker_client_trust_certs_file_path",
                &self.broker_client_trust_certs_file_path,
            )
            .field(
                "broker_client_authentication_plugin",
                &self.broker_client_authentication_plugin,
            )
            .finish_non_exhaustive()
    }
}
