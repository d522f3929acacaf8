//! Pulsar's admin REST JSON shapes, at the edge: request bodies parsed into
//! the broker's own types, and the broker's stats turned into Pulsar's
//! response documents (TopicStats, PartitionedTopicStats,
//! PersistentTopicInternalStats, Policies, TenantInfo, LookupData).
//!
//! Owns: field names and defaults as Pulsar's Java classes serialize them (the
//! Java admin client ignores unknown keys, so documents carry the keys it
//! reads; lists and maps are never null). Never: touches the metadata store
//! or topics; parsing failures are `AdminError::BadRequest`, never panics.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use super::{
    AdminError, BacklogQuota, ClusterData, NamespacePolicies, RetentionPolicy, TenantInfo,
};
use crate::ownership::LookupUrls;

mod stats;
#[cfg(test)]
use stats::subscription_json;
pub use stats::{
    InternalStatsInput, aggregate, internal_stats_json, ledger_metadata_text,
    partitioned_stats_json, topic_stats_json,
};

/// Parses a JSON body (an empty body parses as JSON `null`).
pub fn parse_body<T: for<'de> Deserialize<'de>>(body: &[u8], what: &str) -> Result<T, AdminError> {
    let text = if body.iter().all(u8::is_ascii_whitespace) {
        &b"null"[..]
    } else {
        body
    };
    serde_json::from_slice(text)
        .map_err(|e| AdminError::BadRequest(format!("cannot parse {what}: {e}")))
}

/// Pulsar's PersistencePolicies.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PersistenceJson {
    /// E.
    #[serde(default)]
    pub bookkeeper_ensemble: i64,
    /// Qw.
    #[serde(default)]
    pub bookkeeper_write_quorum: i64,
    /// Qa.
    #[serde(default)]
    pub bookkeeper_ack_quorum: i64,
    /// Not applied by Vela (cursors persist at `cursor_persist_interval`).
    #[serde(default)]
    pub managed_ledger_max_mark_delete_rate: f64,
    /// Not applied by Vela.
    #[serde(default)]
    pub managed_ledger_storage_class_name: Option<String>,
}

impl PersistenceJson {
    /// From the stored (E, Qw, Qa).
    pub fn from_policy((ensemble, write_quorum, ack_quorum): (u8, u8, u8)) -> PersistenceJson {
        PersistenceJson {
            bookkeeper_ensemble: i64::from(ensemble),
            bookkeeper_write_quorum: i64::from(write_quorum),
            bookkeeper_ack_quorum: i64::from(ack_quorum),
            managed_ledger_max_mark_delete_rate: 0.0,
            managed_ledger_storage_class_name: None,
        }
    }

    /// To the stored (E, Qw, Qa); values out of range are a bad request.
    pub fn to_policy(&self) -> Result<(u8, u8, u8), AdminError> {
        let narrow = |value: i64, name: &str| {
            u8::try_from(value).map_err(|_| {
                AdminError::BadRequest(format!("Bookkeeper-{name} must be <= 255 and > 0."))
            })
        };
        Ok((
            narrow(self.bookkeeper_ensemble, "Ensemble")?,
            narrow(self.bookkeeper_write_quorum, "WriteQuorum")?,
            narrow(self.bookkeeper_ack_quorum, "AckQuorum")?,
        ))
    }
}

/// Pulsar's RetentionPolicies.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RetentionJson {
    /// Minutes (−1: no limit).
    #[serde(default)]
    pub retention_time_in_minutes: i32,
    /// MiB (−1: no limit).
    #[serde(default, rename = "retentionSizeInMB")]
    pub retention_size_in_mb: i64,
}

impl From<RetentionPolicy> for RetentionJson {
    fn from(policy: RetentionPolicy) -> Self {
        RetentionJson {
            retention_time_in_minutes: policy.time_minutes,
            retention_size_in_mb: policy.size_mb,
        }
    }
}

impl From<RetentionJson> for RetentionPolicy {
    fn from(json: RetentionJson) -> Self {
        RetentionPolicy {
            time_minutes: json.retention_time_in_minutes,
            size_mb: json.retention_size_in_mb,
        }
    }
}

/// Pulsar's BacklogQuota (`limit` is the deprecated twin of `limitSize`).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BacklogQuotaJson {
    /// Deprecated name of `limitSize`.
    #[serde(default, deserialize_with = "lenient_number")]
    pub limit: Option<i64>,
    /// Backlog bytes allowed.
    #[serde(default, deserialize_with = "lenient_number")]
    pub limit_size: Option<i64>,
    /// Age of the oldest unacknowledged message allowed, seconds.
    #[serde(default, deserialize_with = "lenient_number")]
    pub limit_time: Option<i32>,
    /// What happens when exceeded.
    #[serde(default)]
    pub policy: Option<String>,
}

/// A number given as a JSON number or a numeric string (`"limit": "1024"`,
/// as the Go client's tests send it), as Jackson coerces it.
fn lenient_number<'de, D, T>(deserializer: D) -> Result<Option<T>, D::Error>
where
    D: serde::Deserializer<'de>,
    T: TryFrom<i64>,
{
    use serde::de::Error as _;
    let value = Option::<Value>::deserialize(deserializer)?;
    let number = match value {
        None | Some(Value::Null) => return Ok(None),
        Some(v) => int_of(&v),
    };
    let number = number.ok_or_else(|| D::Error::custom("expected an integer"))?;
    T::try_from(number)
        .map(Some)
        .map_err(|_| D::Error::custom("integer out of range"))
}

impl BacklogQuotaJson {
    /// From the stored quota.
    pub fn from_quota(quota: &BacklogQuota) -> BacklogQuotaJson {
        BacklogQuotaJson {
            limit: Some(quota.limit_bytes),
            limit_size: Some(quota.limit_bytes),
            limit_time: Some(quota.limit_seconds),
            policy: Some(quota.policy.clone()),
        }
    }

    /// To the stored quota (Pulsar's defaults: no limit, producer_request_hold).
    pub fn to_quota(&self) -> BacklogQuota {
        BacklogQuota {
            limit_bytes: self.limit_size.or(self.limit).unwrap_or(-1),
            limit_seconds: self.limit_time.unwrap_or(-1),
            policy: self
                .policy
                .clone()
                .unwrap_or_else(|| "producer_request_hold".to_string()),
        }
    }
}

/// An integer from a JSON number or a string holding one (Jackson's
/// coercion, which Pulsar's clients rely on).
pub fn int_of(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64(),
        Value::String(s) => s.trim().parse().ok(),
        _ => None,
    }
}

/// Pulsar's TenantInfo.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct TenantInfoJson {
    /// Admin roles.
    #[serde(default)]
    pub admin_roles: Vec<String>,
    /// Allowed clusters.
    #[serde(default)]
    pub allowed_clusters: Vec<String>,
}

impl From<TenantInfo> for TenantInfoJson {
    fn from(info: TenantInfo) -> Self {
        TenantInfoJson {
            admin_roles: info.admin_roles,
            allowed_clusters: info.allowed_clusters,
        }
    }
}

impl TenantInfoJson {
    /// Checks the clusters are named as Pulsar does (412) and converts;
    /// that they exist is `Admin::check_tenant_clusters`.
    pub fn to_info(&self) -> Result<TenantInfo, AdminError> {
        if self.allowed_clusters.is_empty()
            || self.allowed_clusters.iter().any(|c| c.trim().is_empty())
        {
            return Err(AdminError::Invalid("Clusters can not be empty".into()));
        }
        Ok(TenantInfo {
            admin_roles: self.admin_roles.clone(),
            allowed_clusters: self.allowed_clusters.clone(),
        })
    }
}

/// The parts of a Policies body (namespace creation) Vela applies.
#[derive(Debug, Default, Deserialize)]
pub struct PoliciesBody {
    #[serde(default)]
    persistence: Option<PersistenceJson>,
    #[serde(default)]
    retention_policies: Option<RetentionJson>,
    #[serde(default)]
    message_ttl_in_seconds: Option<i64>,
    #[serde(default, rename = "deduplicationEnabled")]
    deduplication_enabled: Option<bool>,
    #[serde(default)]
    backlog_quota_map: BTreeMap<String, BacklogQuotaJson>,
    #[serde(default)]
    replication_clusters: Vec<String>,
    #[serde(default)]
    compaction_threshold: Option<i64>,
    #[serde(default)]
    offload_threshold: Option<i64>,
    #[serde(default)]
    offload_threshold_in_seconds: Option<i64>,
    #[serde(default)]
    offload_deletion_lag_ms: Option<i64>,
    #[serde(default)]
    auth_policies: Option<AuthPoliciesJson>,
    #[serde(default)]
    schema_compatibility_strategy: Option<String>,
}

/// Pulsar's `auth_policies` in a Policies body: the namespace grants.
#[derive(Debug, Default, Deserialize)]
struct AuthPoliciesJson {
    #[serde(default)]
    namespace_auth: BTreeMap<String, std::collections::BTreeSet<crate::admin::AuthAction>>,
}

impl PoliciesBody {
    /// The namespace policies it asks for (its replication clusters are
    /// checked against the stored clusters by the caller:
    /// `Admin::check_replication_clusters`).
    pub fn to_policies(&self) -> Result<NamespacePolicies, AdminError> {
        let message_ttl_seconds = match self.message_ttl_in_seconds {
            Some(ttl) => Some(ttl_seconds(ttl)?),
            None => None,
        };
        Ok(NamespacePolicies {
            persistence: self
                .persistence
                .as_ref()
                .map(|p| p.to_policy())
                .transpose()?,
            deduplication_enabled: self.deduplication_enabled,
            retention: self.retention_policies.map(RetentionPolicy::from),
            message_ttl_seconds,
            backlog_quotas: self
                .backlog_quota_map
                .iter()
                .map(|(kind, quota)| (kind.clone(), quota.to_quota()))
                .collect(),
            compaction_threshold_bytes: self
                .compaction_threshold
                .and_then(|b| u64::try_from(b).ok()),
            offload_threshold_bytes: self.offload_threshold,
            offload_threshold_seconds: self.offload_threshold_in_seconds,
            offload_deletion_lag_ms: self.offload_deletion_lag_ms,
            // The grants a creating body carries (as Pulsar's
            // createNamespace stores them); later changes go through the
            // permissions routes.
            permissions: self.grants()?,
            schema_compatibility_strategy: self
                .schema_compatibility_strategy
                .as_deref()
                .map(crate::schema::CompatibilityStrategy::parse)
                .transpose()
                .map_err(AdminError::Invalid)?
                .flatten()
                .map(|s| s.name().to_string()),
            replication_clusters: (!self.replication_clusters.is_empty())
                .then(|| self.replication_clusters.clone()),
            // The policies kept as JSON, properties and subscription grants
            // are set through their own routes.
            ..Default::default()
        })
    }
}

impl PoliciesBody {
    fn grants(
        &self,
    ) -> Result<BTreeMap<String, std::collections::BTreeSet<crate::admin::AuthAction>>, AdminError>
    {
        let grants = self
            .auth_policies
            .as_ref()
            .map(|a| a.namespace_auth.clone())
            .unwrap_or_default();
        if grants.len() > crate::admin::GRANTED_ROLES_MAX {
            return Err(AdminError::Invalid(format!(
                "more than {} roles granted",
                crate::admin::GRANTED_ROLES_MAX
            )));
        }
        if let Some(role) = grants
            .keys()
            .find(|r| r.is_empty() || r.len() > crate::admin::ROLE_BYTES_MAX)
        {
            return Err(AdminError::Invalid(format!("invalid role {role:?}")));
        }
        Ok(grants)
    }
}

/// A message TTL from a request (Pulsar: 412 when negative).
pub fn ttl_seconds(value: i64) -> Result<u32, AdminError> {
    u32::try_from(value).map_err(|_| AdminError::Invalid("Invalid value for message TTL".into()))
}

/// A namespace's offload number: set through its policy route (kept by
/// `policy_specs` key), else from the body that created the namespace.
fn offload_number(
    policies: &NamespacePolicies,
    key: &str,
    created: fn(&NamespacePolicies) -> Option<i64>,
) -> Option<i64> {
    policies
        .policies
        .get(key)
        .and_then(int_of)
        .or_else(|| created(policies))
}

/// Pulsar's Policies document for GET on a namespace of a broker of
/// cluster `local`.
pub fn policies_json(policies: &NamespacePolicies, local: &str) -> Value {
    let replication = policies
        .replication_clusters
        .clone()
        .unwrap_or_else(|| vec![local.to_string()]);
    let backlog: BTreeMap<&String, BacklogQuotaJson> = policies
        .backlog_quotas
        .iter()
        .map(|(kind, quota)| (kind, BacklogQuotaJson::from_quota(quota)))
        .collect();
    json!({
        "auth_policies": {
            "namespace_auth": policies.permissions,
            "destination_auth": {},
            "subscription_auth_roles": {}
        },
        "replication_clusters": replication,
        "bundles": {"boundaries": ["0x00000000", "0xffffffff"], "numBundles": 1},
        "backlog_quota_map": backlog,
        "clusterDispatchRate": {},
        "topicDispatchRate": {},
        "subscriptionDispatchRate": {},
        "replicatorDispatchRate": {},
        "clusterSubscribeRate": {},
        "persistence": policies.persistence.map(PersistenceJson::from_policy),
        "deduplicationEnabled": policies.deduplication_enabled,
        "latency_stats_sample_rate": {},
        "message_ttl_in_seconds": policies.message_ttl_seconds,
        "retention_policies": policies.retention.map(RetentionJson::from),
        "compaction_threshold": policies.compaction_threshold_bytes,
        "offload_threshold": offload_number(policies, "offloadThreshold", |p| p.offload_threshold_bytes).unwrap_or(-1),
        "offload_threshold_in_seconds": offload_number(policies, "offloadThresholdInSeconds", |p| p.offload_threshold_seconds).unwrap_or(-1),
        "offload_deletion_lag_ms": offload_number(policies, "offloadDeletionLagMs", |p| p.offload_deletion_lag_ms),
        "schema_compatibility_strategy": policies
            .schema_compatibility_strategy
            .as_deref()
            .unwrap_or("UNDEFINED"),
        "deleted": false,
        "encryption_required": false,
        "subscription_auth_mode": "None",
        "properties": {}
    })
}

/// Pulsar's MessageId/ResetCursorData body: `ledgerId`, `entryId` (−1, −1 is
/// earliest; i64::MAX, i64::MAX is latest), `isExcluded`.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct MessageIdJson {
    /// Ledger.
    pub ledger_id: i64,
    /// Entry.
    pub entry_id: i64,
    /// Start after the entry instead of at it.
    #[serde(default)]
    pub is_excluded: bool,
}

impl MessageIdJson {
    /// Earliest (−1:−1)?
    pub fn is_earliest(&self) -> bool {
        self.ledger_id < 0 || self.entry_id < 0
    }

    /// Latest (i64::MAX:i64::MAX)?
    pub fn is_latest(&self) -> bool {
        self.ledger_id == i64::MAX && self.entry_id == i64::MAX
    }
}

/// A message id as Pulsar's admin API writes a `MessageIdImpl` (e.g. the
/// answer of `terminate`): no partition, no batch.
pub fn message_id_json(ledger_id: i64, entry_id: i64) -> Value {
    json!({
        "ledgerId": ledger_id,
        "entryId": entry_id,
        "partitionIndex": -1,
        "batchSize": 0,
        "batchIndex": -1,
    })
}

/// Pulsar's LookupData of `owner` (`brokerUrlSsl` is the old name of
/// `brokerUrlTls`). A URL the broker lacks is `""`, never left out: the C++
/// client refuses an answer without `brokerUrl`, also a TLS client of a
/// TLS-only broker.
pub fn lookup_json(owner: &LookupUrls) -> Value {
    let broker_url = owner.service_url.as_deref().unwrap_or("");
    let broker_url_tls = owner.service_url_tls.as_deref().unwrap_or("");
    json!({
        "brokerUrl": broker_url,
        "brokerUrlTls": broker_url_tls,
        "brokerUrlSsl": broker_url_tls,
        "httpUrl": owner.http_url,
        "httpUrlTls": owner.http_url_tls.as_deref().unwrap_or(""),
        "nativeUrl": broker_url
    })
}

/// Pulsar's ClusterData (the URLs and the replicators' client settings
/// Vela keeps; others are ignored).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ClusterDataJson {
    /// `http://host:port` of the admin API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_url: Option<String>,
    /// `https://host:port` of the admin API.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_url_tls: Option<String>,
    /// `pulsar://host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_service_url: Option<String>,
    /// `pulsar+ssl://host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub broker_service_url_tls: Option<String>,
    /// `brokerClientTlsEnabled`, `authenticationPlugin`, ...
    #[serde(default, flatten)]
    pub client: super::ClusterClient,
}

impl From<ClusterData> for ClusterDataJson {
    fn from(data: ClusterData) -> Self {
        ClusterDataJson {
            service_url: data.service_url,
            service_url_tls: data.service_url_tls,
            broker_service_url: data.broker_service_url,
            broker_service_url_tls: data.broker_service_url_tls,
            client: data.client,
        }
    }
}

impl From<ClusterDataJson> for ClusterData {
    fn from(json: ClusterDataJson) -> Self {
        ClusterData {
            service_url: json.service_url,
            service_url_tls: json.service_url_tls,
            broker_service_url: json.broker_service_url,
            broker_service_url_tls: json.broker_service_url_tls,
            client: json.client,
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::stats::{ConsumerStats, SubscriptionStats, TopicStats};
    use vela_log::Position;

    #[test]
    fn bodies_parse_with_pulsars_names() {
        let p: PersistenceJson = parse_body(
            br#"{"bookkeeperEnsemble":2,"bookkeeperWriteQuorum":2,"bookkeeperAckQuorum":1,
                "managedLedgerMaxMarkDeleteRate":0.0,"managedLedgerStorageClassName":null}"#,
            "persistence",
        )
        .unwrap();
        assert_eq!(p.to_policy().unwrap(), (2, 2, 1));
        let r: RetentionJson = parse_body(
            br#"{"retentionTimeInMinutes":60,"retentionSizeInMB":-1}"#,
            "r",
        )
        .unwrap();
        assert_eq!(RetentionPolicy::from(r).size_mb, -1);
        let q: BacklogQuotaJson = parse_body(
            br#"{"limitSize":10,"limitTime":-1,"policy":"producer_exception"}"#,
            "q",
        )
        .unwrap();
        assert_eq!(q.to_quota().limit_bytes, 10);
        // Numbers in strings, as Jackson coerces them (the Go client's
        // TestSendTimeout sends `"limit": "10240"`).
        let q: BacklogQuotaJson = parse_body(
            br#"{"limit":" 10240","limitTime":"-1","policy":"producer_request_hold"}"#,
            "q",
        )
        .unwrap();
        assert_eq!((q.limit, q.limit_time), (Some(10240), Some(-1)));
        assert_eq!(q.to_quota().limit_bytes, 10240);
        let q: BacklogQuotaJson = parse_body(br#"{"limitSize":null}"#, "q").unwrap();
        assert_eq!(q.limit_size, None);
        for bad in [
            &br#"{"limit":"ten"}"#[..],
            br#"{"limit":1.5}"#,
            br#"{"limitTime":4294967296}"#,
            br#"{"limit":[1]}"#,
        ] {
            assert!(parse_body::<BacklogQuotaJson>(bad, "q").is_err());
        }
        assert!(parse_body::<PersistenceJson>(b"{nope", "persistence").is_err());
        let empty: Option<PoliciesBody> = parse_body(b"", "policies").unwrap();
        assert!(empty.is_none());
        let bad = PersistenceJson {
            bookkeeper_ensemble: 300,
            ..PersistenceJson::from_policy((1, 1, 1))
        };
        assert!(bad.to_policy().is_err());
    }

    #[test]
    fn stats_documents_keep_lists_and_maps() {
        let stats = TopicStats {
            topic: "persistent://public/default/t".into(),
            msg_in_counter: 3,
            ..TopicStats::default()
        };
        let doc = topic_stats_json(&stats, "127.0.0.1:8080");
        assert_eq!(doc["msgInCounter"], 3);
        assert!(doc["publishers"].is_array());
        assert!(doc["subscriptions"].is_object());
        let doc = partitioned_stats_json("t", &[stats.clone(), stats], 2, true, "b");
        assert_eq!(doc["msgInCounter"], 6);
        assert_eq!(doc["metadata"]["partitions"], 2);
    }

    /// What a stalled dispatcher is doing shows under Pulsar's names: the
    /// entries in replay, the fenced Key_Shared consumers, the read in flight.
    #[test]
    fn subscription_stats_show_replay_fences_and_reads() {
        let fence = Position::new(7, 3);
        let subscription = SubscriptionStats {
            name: "s".into(),
            sub_type: "Key_Shared".into(),
            durable: true,
            msg_in_replay: 12,
            read_in_flight: true,
            waiting_for_entries: false,
            consumers: vec![
                ConsumerStats {
                    consumer_name: "joined".into(),
                    joined_fence: Some(fence),
                    ..ConsumerStats::default()
                },
                ConsumerStats {
                    consumer_name: "first".into(),
                    ..ConsumerStats::default()
                },
            ],
            ..SubscriptionStats::default()
        };
        let doc = subscription_json(&subscription);
        assert_eq!(doc["msgInReplay"], 12);
        assert_eq!(
            doc["consumersAfterMarkDeletePosition"],
            json!({"joined": "7:3"})
        );
        assert_eq!(doc["consumers"][0]["readPositionWhenJoining"], "7:3");
        assert!(doc["consumers"][1]["readPositionWhenJoining"].is_null());
        let stats = [subscription];
        let input = InternalStatsInput {
            ledgers: &[],
            metadata: &Default::default(),
            last_confirmed: None,
            entries_added: 0,
            subscriptions: &stats,
        };
        let internal = internal_stats_json(&input);
        let cursor = &internal["cursors"]["s"];
        assert_eq!(cursor["subscriptionHavePendingRead"], true);
        assert_eq!(cursor["pendingReadOps"], 1);
        assert_eq!(cursor["waitingReadOp"], false);
    }
}
