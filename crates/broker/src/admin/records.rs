//! The records the admin store keeps, as stored: a tenant's info and a
//! namespace's policies (persistence, retention, TTL, backlog quotas,
//! deduplication, compaction and offload thresholds, permission grants),
//! with the validation Pulsar applies to them.
//!
//! Owns: these types and their JSON as stored (serde field names are a
//! storage format: renaming one loses stored values). Never: the REST
//! shapes (`json`) or the store's keys (`admin`).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::config::PersistenceConfig;
use crate::error::AdminError;

/// A namespace's policies (subset of Pulsar's `Policies`), as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct NamespacePolicies {
    /// Replication of the namespace's topics: (E, Qw, Qa); `None` = broker default.
    #[serde(default)]
    pub persistence: Option<(u8, u8, u8)>,
    /// Producer deduplication by (producer name, sequence id).
    #[serde(default)]
    pub deduplication_enabled: Option<bool>,
    /// How long and how much consumed data is kept.
    #[serde(default)]
    pub retention: Option<RetentionPolicy>,
    /// Messages older than this are acknowledged for every subscription.
    #[serde(default)]
    pub message_ttl_seconds: Option<u32>,
    /// Backlog quotas by type (`destination_storage`, `message_age`).
    #[serde(default)]
    pub backlog_quotas: BTreeMap<String, BacklogQuota>,
    /// Bytes not yet compacted that start a compaction (0 or `None`: never
    /// automatically).
    #[serde(default)]
    pub compaction_threshold_bytes: Option<u64>,
    /// Offload a topic's older closed ledgers once newer ones hold more
    /// bytes than this (Pulsar's `offload_threshold`: −1 or `None`: the
    /// broker's default, other negatives: off).
    #[serde(default)]
    pub offload_threshold_bytes: Option<i64>,
    /// Offload closed ledgers older than this many seconds (Pulsar's
    /// `offload_threshold_in_seconds`, same conventions).
    #[serde(default)]
    pub offload_threshold_seconds: Option<i64>,
    /// Delete an offloaded ledger's bookie copy this long after its offload
    /// (Pulsar's `offload_deletion_lag_ms`: `None`: the broker's default,
    /// negative: keep it).
    #[serde(default)]
    pub offload_deletion_lag_ms: Option<i64>,
    /// Actions granted to roles on the namespace's topics (Pulsar's
    /// `auth_policies.namespace_auth`); enforced when authorization is on.
    #[serde(default)]
    pub permissions: BTreeMap<String, BTreeSet<AuthAction>>,
    /// Policies kept as Pulsar's JSON values, by `policy_specs` key (checked
    /// by their spec when set).
    #[serde(default)]
    pub policies: BTreeMap<String, serde_json::Value>,
    /// Free key-values (Pulsar's namespace `properties`), at most
    /// `PROPERTIES_MAX`.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
    /// Roles allowed to use each subscription name (Pulsar's
    /// `auth_policies.subscription_auth_roles`), at most
    /// `SUBSCRIPTION_GRANTS_MAX` subscriptions.
    #[serde(default)]
    pub subscription_roles: BTreeMap<String, BTreeSet<String>>,
    /// The schema compatibility strategy of the namespace's topics (Pulsar's
    /// `schema_compatibility_strategy`, by name; `None`: the broker's
    /// default, FULL).
    #[serde(default)]
    pub schema_compatibility_strategy: Option<String>,
    /// Clusters the namespace's topics are replicated to and from
    /// (Pulsar's `replication_clusters`); `None`: only the local cluster.
    /// Checked against the stored clusters when set (`admin::clusters`).
    #[serde(default)]
    pub replication_clusters: Option<Vec<String>>,
}

/// Properties one namespace or topic may carry; each key and value at most
/// `PROPERTY_BYTES_MAX`. They live in one metadata record read at every
/// topic load. When reached: a new key is refused (412).
pub const PROPERTIES_MAX: usize = 256;
/// Longest property key or value, bytes.
pub const PROPERTY_BYTES_MAX: usize = 1024;
/// Subscriptions with role grants on one namespace (each a map entry in the
/// namespace's record). When reached: a grant on a new subscription is
/// refused (412).
pub const SUBSCRIPTION_GRANTS_MAX: usize = 1000;

/// An action a role may be granted on a namespace (Pulsar's `AuthAction`,
/// same JSON names). Only `produce` and `consume` mean anything here; the
/// others are kept so Pulsar's admin clients can round-trip them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum AuthAction {
    /// Create producers.
    Produce,
    /// Subscribe (consumers, readers).
    Consume,
    /// Pulsar Functions (kept, not used).
    Functions,
    /// Pulsar IO sources (kept, not used).
    Sources,
    /// Pulsar IO sinks (kept, not used).
    Sinks,
    /// Packages (kept, not used).
    Packages,
}

/// Roles with grants on one namespace. Each grant is a map entry in the
/// namespace's policy record, read on every PRODUCER/SUBSCRIBE/LOOKUP of an
/// unprivileged role; 1000 roles keeps that record small (~50 KiB).
/// When reached: a grant to a new role is refused (412).
pub const GRANTED_ROLES_MAX: usize = 1000;

/// Longest role name accepted in a grant, bytes (roles are token subjects;
/// real ones are short).
pub const ROLE_BYTES_MAX: usize = 256;

/// Retention of consumed data (Pulsar's RetentionPolicies): −1 = no limit,
/// both 0 = no retention.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetentionPolicy {
    /// Minutes consumed data is kept.
    pub time_minutes: i32,
    /// MiB of consumed data kept.
    pub size_mb: i64,
}

/// A backlog quota (Pulsar's BacklogQuota).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BacklogQuota {
    /// Backlog bytes allowed (−1: no limit).
    pub limit_bytes: i64,
    /// Age of the oldest unacknowledged message allowed, seconds (−1: none).
    pub limit_seconds: i32,
    /// `producer_request_hold`, `producer_exception` or `consumer_backlog_eviction`.
    pub policy: String,
}

/// Backlog quota types Pulsar knows.
pub const BACKLOG_QUOTA_TYPES: [&str; 2] = ["destination_storage", "message_age"];
/// Backlog quota policies Pulsar knows.
pub const BACKLOG_QUOTA_POLICIES: [&str; 3] = [
    "producer_request_hold",
    "producer_exception",
    "consumer_backlog_eviction",
];

/// Largest ensemble a namespace may ask for (Pulsar's
/// `managedLedgerMaxEnsembleSize` default is 5; Vela's ensembles are bounded
/// by the standalone bookie count, 16).
pub const ENSEMBLE_MAX: u8 = 16;

impl NamespacePolicies {
    /// Checks every policy as Pulsar does (400 on a bad value).
    pub fn validate(&self) -> Result<(), AdminError> {
        if let Some((ensemble, write_quorum, ack_quorum)) = self.persistence {
            if ensemble == 0 || ensemble > ENSEMBLE_MAX {
                return Err(AdminError::BadRequest(format!(
                    "Bookkeeper-Ensemble must be <= {ENSEMBLE_MAX} and > 0."
                )));
            }
            if !(ack_quorum >= 1 && ack_quorum <= write_quorum && write_quorum <= ensemble) {
                return Err(AdminError::BadRequest(format!(
                    "Bookkeeper Ensemble ({ensemble}) >= WriteQuorum ({write_quorum}) >= \
                     AckQuorum ({ack_quorum})"
                )));
            }
        }
        if let Some(retention) = self.retention {
            if retention.size_mb < -1 {
                return Err(AdminError::BadRequest(
                    "Invalid retention policy: size limit must be >= -1".into(),
                ));
            }
            if retention.time_minutes < -1 {
                return Err(AdminError::BadRequest(
                    "Invalid retention policy: time limit must be >= -1".into(),
                ));
            }
            if (retention.time_minutes == 0) != (retention.size_mb == 0) {
                return Err(AdminError::BadRequest(
                    "Invalid retention policy: Setting a single time or size limit to 0 is \
                     invalid when one of the limits has a non-zero value. Use the value of -1 \
                     instead of 0 to ignore a specific limit. To disable retention both limits \
                     must be set to 0."
                        .into(),
                ));
            }
        }
        if self.properties.len() > PROPERTIES_MAX {
            return Err(AdminError::Invalid(format!(
                "a namespace carries at most PROPERTIES_MAX ({PROPERTIES_MAX}) properties"
            )));
        }
        if self.subscription_roles.len() > SUBSCRIPTION_GRANTS_MAX {
            return Err(AdminError::Invalid(format!(
                "grants on at most SUBSCRIPTION_GRANTS_MAX ({SUBSCRIPTION_GRANTS_MAX}) \
                 subscriptions"
            )));
        }
        for (kind, quota) in &self.backlog_quotas {
            if !BACKLOG_QUOTA_TYPES.contains(&kind.as_str()) {
                return Err(AdminError::BadRequest(format!(
                    "unknown backlog quota type {kind}"
                )));
            }
            if !BACKLOG_QUOTA_POLICIES.contains(&quota.policy.as_str()) {
                return Err(AdminError::BadRequest(format!(
                    "unknown backlog quota policy {}",
                    quota.policy
                )));
            }
        }
        Ok(())
    }

    /// The persistence to use, falling back to `default`.
    pub fn persistence_or(&self, default: PersistenceConfig) -> PersistenceConfig {
        match self.persistence {
            Some((ensemble, write_quorum, ack_quorum)) => PersistenceConfig {
                ensemble,
                write_quorum,
                ack_quorum,
            },
            None => default,
        }
    }
}

/// What one topic carries beside its data (`admin::topic_policies` keeps
/// it), as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopicRecord {
    /// Policies by `policy_specs` key, as checked JSON values (only the
    /// REST layer writes them, each checked by its spec).
    #[serde(default)]
    pub policies: BTreeMap<String, serde_json::Value>,
    /// Backlog quotas by type (`destination_storage`, `message_age`).
    #[serde(default)]
    pub backlog_quotas: BTreeMap<String, BacklogQuota>,
    /// Free key-values (Pulsar's topic properties), at most `PROPERTIES_MAX`.
    #[serde(default)]
    pub properties: BTreeMap<String, String>,
}

impl TopicRecord {
    /// True when nothing is set (the record is deleted rather than kept).
    pub fn is_empty(&self) -> bool {
        self.policies.is_empty() && self.backlog_quotas.is_empty() && self.properties.is_empty()
    }

    /// Checks the bounds and the backlog quotas as a namespace's.
    pub fn validate(&self) -> Result<(), AdminError> {
        if self.properties.len() > PROPERTIES_MAX {
            return Err(AdminError::Invalid(format!(
                "a topic carries at most PROPERTIES_MAX ({PROPERTIES_MAX}) properties"
            )));
        }
        let quotas = NamespacePolicies {
            backlog_quotas: self.backlog_quotas.clone(),
            ..Default::default()
        };
        quotas.validate()
    }
}

/// A tenant's configuration (Pulsar's TenantInfo), as stored.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TenantInfo {
    /// Roles allowed to administer the tenant (enforced when authorization is on).
    #[serde(default)]
    pub admin_roles: Vec<String>,
    /// Clusters the tenant may use.
    #[serde(default)]
    pub allowed_clusters: Vec<String>,
}

/// A cluster's URLs (Pulsar's ClusterData), as stored under
/// `/admin/clusters/{cluster}`: how brokers of other clusters reach it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterData {
    /// `http://host:port` of its admin API.
    #[serde(default)]
    pub service_url: Option<String>,
    /// `https://host:port` of its admin API.
    #[serde(default)]
    pub service_url_tls: Option<String>,
    /// `pulsar://host:port`: what replicators connect to.
    #[serde(default)]
    pub broker_service_url: Option<String>,
    /// `pulsar+ssl://host:port`.
    #[serde(default)]
    pub broker_service_url_tls: Option<String>,
    /// How other clusters' brokers authenticate and protect their
    /// connections to it (Pulsar's names).
    #[serde(default, flatten)]
    pub client: ClusterClient,
}

/// How brokers of other clusters (replicators) connect to a cluster, as
/// Pulsar's ClusterData names it; unset fields fall back to the broker's
/// `brokerClient*` settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterClient {
    /// Connect to `brokerServiceUrlTls` over TLS.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_client_tls_enabled: Option<bool>,
    /// PEM roots its TLS certificate must chain to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_client_trust_certs_file_path: Option<String>,
    /// Authentication plugin (`...AuthenticationToken` or `token`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication_plugin: Option<String>,
    /// Its parameters (`token:...`, `file:///path`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub authentication_parameters: Option<String>,
}

/// Clusters one metadata store records. Each is a small record read when
/// replication policies are checked and when replicators start; a bound
/// keeps a stray script from filling the store. When reached: creating
/// another cluster is refused (412).
pub const CLUSTERS_MAX: usize = 1000;

/// Clusters one namespace or topic may replicate to (a replicator, with its
/// cursor and producer, runs per topic and remote cluster). When exceeded:
/// the policy is refused (412).
pub const REPLICATION_CLUSTERS_MAX: usize = 32;

impl ClusterData {
    /// Checks each URL present has its scheme, as Pulsar's
    /// `ClusterDataImpl.checkPropertiesIfPresent` (400 with its message).
    pub fn validate(&self) -> Result<(), AdminError> {
        let checks: [(&Option<String>, &[&str], &str); 4] = [
            (
                &self.service_url,
                &["http"],
                "Illegal service url, example: http://pulsar.example.com:8080",
            ),
            (
                &self.service_url_tls,
                &["https"],
                "Illegal service tls url, example: https://pulsar.example.com:8443",
            ),
            (
                &self.broker_service_url,
                &["pulsar"],
                "Illegal broker service url, example: pulsar://pulsar.example.com:6650",
            ),
            (
                &self.broker_service_url_tls,
                &["pulsar+ssl"],
                "Illegal broker service tls url, example: pulsar+ssl://pulsar.example.com:6651",
            ),
        ];
        for (url, schemes, message) in checks {
            let Some(url) = url.as_deref().filter(|u| !u.is_empty()) else {
                continue;
            };
            if !url_has_scheme_and_host(url, schemes) {
                return Err(AdminError::BadRequest(message.to_string()));
            }
        }
        Ok(())
    }
}

/// `scheme://host[:port][/...]` with one of `schemes`, a non-empty host and
/// a numeric port when one is given (a comma-separated host list passes
/// when each host does).
fn url_has_scheme_and_host(url: &str, schemes: &[&str]) -> bool {
    let Some((scheme, rest)) = url.split_once("://") else {
        return false;
    };
    if !schemes.contains(&scheme) {
        return false;
    }
    let authority = rest.split('/').next().unwrap_or_default();
    !authority.is_empty()
        && authority.split(',').all(|host_port| {
            let (host, port) = match host_port.rsplit_once(':') {
                Some((host, port)) => (host, Some(port)),
                None => (host_port, None),
            };
            !host.is_empty() && port.is_none_or(|p| p.parse::<u16>().is_ok())
        })
}

#[cfg(test)]
mod cluster_tests {
    use super::*;

    fn data(broker: &str) -> ClusterData {
        ClusterData {
            broker_service_url: Some(broker.to_string()),
            ..ClusterData::default()
        }
    }

    #[test]
    fn cluster_urls_are_checked_by_scheme_as_pulsar_checks_them() {
        assert!(data("pulsar://127.0.0.1:6650").validate().is_ok());
        assert!(data("pulsar://a:6650,b:6650").validate().is_ok());
        for bad in [
            "http://127.0.0.1:6650",
            "pulsar+ssl://h:6651",
            "pulsar://",
            "pulsar://h:port",
            "fdsafasfasdf",
        ] {
            let Err(AdminError::BadRequest(message)) = data(bad).validate() else {
                panic!("{bad} passed");
            };
            assert!(
                message.starts_with("Illegal broker service url"),
                "{message}"
            );
        }
        let tls = ClusterData {
            service_url_tls: Some("http://h:8443".into()),
            ..ClusterData::default()
        };
        assert!(tls.validate().is_err());
        assert!(ClusterData::default().validate().is_ok());
    }
}
