//! The table of policies kept as Pulsar's JSON values: each policy's stored
//! key, its topic-level and namespace-level REST route names, and how a
//! request's value is checked. A policy set on a topic and on its namespace
//! shares one key, so resolving topic > namespace > broker default is a
//! lookup in two maps (`policies::TopicPolicies::resolve`).
//!
//! Owns: [`POLICY_SPECS`], the value shapes ([`PublishRateJson`],
//! [`DispatchRateJson`], ...) in Pulsar's field names, and the checks with
//! Pulsar's messages. A value is stored as checked and re-serialized by its
//! shape, so every stored value parses back into it.
//! Never: touches the store (`admin::topic_policies`), routes requests
//! (`http::topic_policies`, `http::namespace_policies`) or applies a policy.

use serde::{Deserialize, Serialize};
use serde_json::Value;

pub use super::json::int_of;
use super::json::{PersistenceJson, RetentionJson};
use super::records::NamespacePolicies;

/// A value refused, with Pulsar's status (412 when `precondition`, else 400)
/// and message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Rejected {
    /// 412 (a rule broken) rather than 400 (malformed).
    pub precondition: bool,
    /// Pulsar's reason.
    pub reason: String,
}

impl Rejected {
    fn precondition(reason: impl Into<String>) -> Rejected {
        Rejected {
            precondition: true,
            reason: reason.into(),
        }
    }

    fn malformed(reason: impl Into<String>) -> Rejected {
        Rejected {
            precondition: false,
            reason: reason.into(),
        }
    }
}

/// How a policy's value is checked.
#[derive(Debug, Clone, Copy)]
pub enum PolicyKind {
    /// An integer, at least `min`; `invalid` is Pulsar's message below it.
    Int {
        /// Smallest value accepted.
        min: i64,
        /// The refusal's reason.
        invalid: &'static str,
    },
    /// `true` or `false`.
    Bool,
    /// A JSON object of a known shape, checked by the function.
    Object(fn(Value) -> Result<Value, Rejected>),
    /// A list of cluster names (only this cluster exists).
    Clusters,
}

/// One policy.
#[derive(Debug, Clone, Copy)]
pub struct PolicySpec {
    /// Key in the stored maps (Pulsar's topic-level route name when there is
    /// one).
    pub key: &'static str,
    /// Route name under `/admin/v2/persistent/{t}/{ns}/{topic}/`.
    pub topic_route: Option<&'static str>,
    /// Route name under `/admin/v2/namespaces/{t}/{ns}/`.
    pub namespace_route: Option<&'static str>,
    /// The value's check.
    pub kind: PolicyKind,
    /// What a namespace GET answers when unset (`None`: 204, no body).
    pub namespace_unset: Option<i64>,
}

const fn int(min: i64, invalid: &'static str) -> PolicyKind {
    PolicyKind::Int { min, invalid }
}

const fn spec(
    key: &'static str,
    topic_route: Option<&'static str>,
    namespace_route: Option<&'static str>,
    kind: PolicyKind,
) -> PolicySpec {
    PolicySpec {
        key,
        topic_route,
        namespace_route,
        kind,
        namespace_unset: None,
    }
}

/// Every policy kept as a JSON value. Policies Vela applies are read in
/// `policies::TopicPolicies::resolve` (of `offloadPolicies`, its thresholds
/// and deletion lag); the others (replication,
/// replicator and subscribe rates, dedup snapshots, inactive topics,
/// subscription expiry, bookie affinity) are stored and served back so
/// tools round-trip them; Vela has no such mechanism to apply them to.
pub const POLICY_SPECS: &[PolicySpec] = &[
    // Topic-level forms of the namespace policies `NamespacePolicies` keeps
    // typed (their namespace routes are `http::namespaces`').
    spec(
        "messageTTL",
        Some("messageTTL"),
        None,
        int(0, "Invalid value for message TTL"),
    ),
    spec(
        "retention",
        Some("retention"),
        None,
        PolicyKind::Object(retention),
    ),
    spec(
        "persistence",
        Some("persistence"),
        None,
        PolicyKind::Object(persistence),
    ),
    spec(
        "compactionThreshold",
        Some("compactionThreshold"),
        None,
        int(0, "compactionThreshold must be 0 or more"),
    ),
    spec(
        "deduplicationEnabled",
        Some("deduplicationEnabled"),
        None,
        PolicyKind::Bool,
    ),
    spec(
        "maxProducers",
        Some("maxProducers"),
        Some("maxProducersPerTopic"),
        int(0, "maxProducers must be 0 or more"),
    ),
    spec(
        "maxConsumers",
        Some("maxConsumers"),
        Some("maxConsumersPerTopic"),
        int(0, "maxConsumers must be 0 or more"),
    ),
    spec(
        "maxConsumersPerSubscription",
        Some("maxConsumersPerSubscription"),
        Some("maxConsumersPerSubscription"),
        int(0, "maxConsumersPerSubscription must be 0 or more"),
    ),
    spec(
        "maxUnackedMessagesOnConsumer",
        Some("maxUnackedMessagesOnConsumer"),
        Some("maxUnackedMessagesPerConsumer"),
        int(0, "maxUnackedNum must be 0 or more"),
    ),
    spec(
        "maxUnackedMessagesOnSubscription",
        Some("maxUnackedMessagesOnSubscription"),
        Some("maxUnackedMessagesPerSubscription"),
        int(0, "maxUnackedNum must be 0 or more"),
    ),
    spec(
        "maxSubscriptionsPerTopic",
        Some("maxSubscriptionsPerTopic"),
        Some("maxSubscriptionsPerTopic"),
        int(0, "maxSubscriptionsPerTopic must be 0 or more"),
    ),
    spec(
        "maxMessageSize",
        Some("maxMessageSize"),
        None,
        int(0, "maxMessageSize must be 0 or more"),
    ),
    spec(
        "deduplicationSnapshotInterval",
        Some("deduplicationSnapshotInterval"),
        Some("deduplicationSnapshotInterval"),
        int(0, "interval must be 0 or more"),
    ),
    spec(
        "schemaValidationEnforced",
        Some("schemaValidationEnforced"),
        Some("schemaValidationEnforced"),
        PolicyKind::Bool,
    ),
    spec(
        "publishRate",
        Some("publishRate"),
        Some("publishRate"),
        PolicyKind::Object(publish_rate),
    ),
    spec(
        "dispatchRate",
        Some("dispatchRate"),
        Some("dispatchRate"),
        PolicyKind::Object(dispatch_rate),
    ),
    spec(
        "subscriptionDispatchRate",
        Some("subscriptionDispatchRate"),
        Some("subscriptionDispatchRate"),
        PolicyKind::Object(dispatch_rate),
    ),
    spec(
        "replicatorDispatchRate",
        Some("replicatorDispatchRate"),
        Some("replicatorDispatchRate"),
        PolicyKind::Object(dispatch_rate),
    ),
    spec(
        "subscribeRate",
        Some("subscribeRate"),
        Some("subscribeRate"),
        PolicyKind::Object(subscribe_rate),
    ),
    spec(
        "delayedDelivery",
        Some("delayedDelivery"),
        Some("delayedDelivery"),
        PolicyKind::Object(delayed_delivery),
    ),
    spec(
        "inactiveTopicPolicies",
        Some("inactiveTopicPolicies"),
        Some("inactiveTopicPolicies"),
        PolicyKind::Object(inactive_topic),
    ),
    spec(
        "autoSubscriptionCreation",
        Some("autoSubscriptionCreation"),
        Some("autoSubscriptionCreation"),
        PolicyKind::Object(auto_subscription_creation),
    ),
    spec(
        "offloadPolicies",
        Some("offloadPolicies"),
        Some("offloadPolicies"),
        PolicyKind::Object(offload_policies),
    ),
    spec(
        "replication",
        Some("replication"),
        None,
        PolicyKind::Clusters,
    ),
    PolicySpec {
        namespace_unset: Some(0),
        ..spec(
            "maxTopicsPerNamespace",
            None,
            Some("maxTopicsPerNamespace"),
            int(0, "maxTopicsPerNamespace must be 0 or more"),
        )
    },
    spec(
        "subscriptionExpirationTime",
        None,
        Some("subscriptionExpirationTime"),
        int(0, "Invalid value for subscription expiration time"),
    ),
    // Pulsar's Policies default both thresholds to -1 (the broker's).
    PolicySpec {
        namespace_unset: Some(-1),
        ..spec(
            "offloadThresholdInSeconds",
            None,
            Some("offloadThresholdInSeconds"),
            int(0, "Invalid value for offloadThresholdInSecond"),
        )
    },
    PolicySpec {
        namespace_unset: Some(-1),
        ..spec(
            "offloadThreshold",
            None,
            Some("offloadThreshold"),
            int(-1, "Invalid value for offloadThreshold"),
        )
    },
    spec(
        "offloadDeletionLagMs",
        None,
        Some("offloadDeletionLagMs"),
        int(0, "Invalid value for offloadDeletionLagMs"),
    ),
    spec(
        "autoTopicCreation",
        None,
        Some("autoTopicCreation"),
        PolicyKind::Object(auto_topic_creation),
    ),
    spec(
        "bookieAffinity",
        None,
        Some("persistence/bookieAffinity"),
        PolicyKind::Object(bookie_affinity),
    ),
];

/// Largest JSON value a policy may hold, bytes (offload policies are the
/// largest Pulsar shape, well under this).
pub const POLICY_VALUE_BYTES_MAX: usize = 16 * 1024;

/// The spec of a stored key.
pub fn spec_of(key: &str) -> Option<&'static PolicySpec> {
    POLICY_SPECS.iter().find(|s| s.key == key)
}

impl PolicySpec {
    /// Checks a request's value; the value to store.
    pub fn check(&self, value: Value) -> Result<Value, Rejected> {
        if value.is_null() {
            return Err(Rejected::malformed(format!(
                "{} should not be null",
                self.key
            )));
        }
        let checked = match self.kind {
            PolicyKind::Int { min, invalid } => {
                let n = int_of(&value)
                    .ok_or_else(|| Rejected::malformed(format!("{} must be a number", self.key)))?;
                if n < min {
                    return Err(Rejected::precondition(invalid));
                }
                Value::from(n)
            }
            PolicyKind::Bool => match &value {
                Value::Bool(_) => value,
                Value::String(s) if s == "true" || s == "false" => Value::Bool(s == "true"),
                _ => {
                    return Err(Rejected::malformed(format!(
                        "{} must be true or false",
                        self.key
                    )));
                }
            },
            PolicyKind::Object(check) => check(value)?,
            // The names' shape only: that the clusters exist and the tenant
            // may use them is `Admin::check_replication_clusters` (a store
            // read), called by the REST layer.
            PolicyKind::Clusters => {
                let clusters: Vec<String> = serde_json::from_value(value)
                    .map_err(|e| Rejected::malformed(format!("cannot parse clusters: {e}")))?;
                Value::from(clusters)
            }
        };
        if checked.to_string().len() > POLICY_VALUE_BYTES_MAX {
            return Err(Rejected::precondition(format!(
                "{} is larger than POLICY_VALUE_BYTES_MAX ({POLICY_VALUE_BYTES_MAX} bytes)",
                self.key
            )));
        }
        Ok(checked)
    }
}

fn shape<T: for<'de> Deserialize<'de> + Serialize>(
    value: Value,
    what: &str,
) -> Result<T, Rejected> {
    serde_json::from_value(value)
        .map_err(|e| Rejected::malformed(format!("cannot parse {what}: {e}")))
}

fn reserialize<T: Serialize>(value: &T) -> Result<Value, Rejected> {
    serde_json::to_value(value).map_err(|e| Rejected::malformed(e.to_string()))
}

/// Pulsar's PublishRate: −1 (or 0) on a side is no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct PublishRateJson {
    /// Messages per second.
    #[serde(default)]
    pub publish_throttling_rate_in_msg: i64,
    /// Bytes per second.
    #[serde(default)]
    pub publish_throttling_rate_in_byte: i64,
}

fn publish_rate(value: Value) -> Result<Value, Rejected> {
    let rate: PublishRateJson = shape(value, "PublishRate")?;
    reserialize(&rate)
}

/// Pulsar's DispatchRate (stored; Vela has no dispatch throttling).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DispatchRateJson {
    /// Messages per period.
    #[serde(default = "minus_one")]
    pub dispatch_throttling_rate_in_msg: i64,
    /// Bytes per period.
    #[serde(default = "minus_one")]
    pub dispatch_throttling_rate_in_byte: i64,
    /// Relative to the publish rate.
    #[serde(default)]
    pub relative_to_publish_rate: bool,
    /// Period, seconds.
    #[serde(default = "one")]
    pub rate_period_in_second: i64,
}

fn minus_one() -> i64 {
    -1
}

fn one() -> i64 {
    1
}

fn dispatch_rate(value: Value) -> Result<Value, Rejected> {
    let rate: DispatchRateJson = shape(value, "DispatchRate")?;
    reserialize(&rate)
}

/// Pulsar's SubscribeRate (stored).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SubscribeRateJson {
    /// Subscribes per consumer per period.
    #[serde(default = "minus_one")]
    pub subscribe_throttling_rate_per_consumer: i64,
    /// Period, seconds.
    #[serde(default = "thirty")]
    pub rate_period_in_second: i64,
}

fn thirty() -> i64 {
    30
}

fn subscribe_rate(value: Value) -> Result<Value, Rejected> {
    let rate: SubscribeRateJson = shape(value, "SubscribeRate")?;
    reserialize(&rate)
}

/// Pulsar's DelayedDeliveryPolicies: `active: false` delivers delayed
/// messages at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DelayedDeliveryJson {
    /// Delayed delivery on.
    #[serde(default)]
    pub active: bool,
    /// Tick, ms (Vela's delay timer is exact; kept).
    #[serde(default = "thousand")]
    pub tick_time: i64,
    /// Longest delay a producer may ask for, ms (0: no limit; kept).
    #[serde(default)]
    pub max_delivery_delay_in_millis: i64,
}

fn thousand() -> i64 {
    1000
}

fn delayed_delivery(value: Value) -> Result<Value, Rejected> {
    let policy: DelayedDeliveryJson = shape(value, "DelayedDeliveryPolicies")?;
    if policy.tick_time < 0 || policy.max_delivery_delay_in_millis < 0 {
        return Err(Rejected::precondition(
            "delayed delivery times must be 0 or more",
        ));
    }
    reserialize(&policy)
}

/// Pulsar's InactiveTopicPolicies (stored).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct InactiveTopicJson {
    /// `delete_when_no_subscriptions` or `delete_when_subscriptions_caught_up`.
    #[serde(default)]
    pub inactive_topic_delete_mode: Option<String>,
    /// Seconds.
    #[serde(default)]
    pub max_inactive_duration_seconds: i64,
    /// Whether inactive topics are deleted.
    #[serde(default)]
    pub delete_while_inactive: bool,
}

fn inactive_topic(value: Value) -> Result<Value, Rejected> {
    let policy: InactiveTopicJson = shape(value, "InactiveTopicPolicies")?;
    if let Some(mode) = &policy.inactive_topic_delete_mode
        && mode != "delete_when_no_subscriptions"
        && mode != "delete_when_subscriptions_caught_up"
    {
        return Err(Rejected::malformed(format!(
            "unknown inactiveTopicDeleteMode {mode}"
        )));
    }
    reserialize(&policy)
}

/// Pulsar's AutoSubscriptionCreationOverride.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoSubscriptionCreationJson {
    /// Whether a SUBSCRIBE may create its subscription.
    #[serde(default)]
    pub allow_auto_subscription_creation: bool,
}

fn auto_subscription_creation(value: Value) -> Result<Value, Rejected> {
    let policy: AutoSubscriptionCreationJson = shape(value, "AutoSubscriptionCreationOverride")?;
    reserialize(&policy)
}

/// Pulsar's AutoTopicCreationOverride.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AutoTopicCreationJson {
    /// Whether a lookup or PRODUCER may create the topic.
    #[serde(default)]
    pub allow_auto_topic_creation: bool,
    /// `partitioned` or `non-partitioned`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub topic_type: Option<String>,
    /// Partitions of an auto-created partitioned topic.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_num_partitions: Option<i64>,
}

fn auto_topic_creation(value: Value) -> Result<Value, Rejected> {
    let policy: AutoTopicCreationJson = shape(value, "AutoTopicCreationOverride")?;
    let invalid = |detail: &str| {
        Rejected::precondition(format!(
            "Invalid configuration for autoTopicCreationOverride. the detail is {detail}"
        ))
    };
    if policy.allow_auto_topic_creation {
        match policy.topic_type.as_deref() {
            Some("partitioned") => match policy.default_num_partitions {
                None => {
                    return Err(invalid(
                        "[defaultNumPartitions] cannot be null when the type is partitioned.",
                    ));
                }
                Some(n) if n < 1 => {
                    return Err(invalid(
                        "[defaultNumPartitions] cannot be less than 1 for partition type.",
                    ));
                }
                Some(_) => {}
            },
            Some("non-partitioned") => {
                if policy.default_num_partitions.is_some() {
                    return Err(invalid(
                        "[defaultNumPartitions] is not allowed to be set when the type is \
                         non-partition.",
                    ));
                }
            }
            _ => return Err(invalid("[topicType] is invalid.")),
        }
    }
    reserialize(&policy)
}

/// Pulsar's BookieAffinityGroupData (stored; Vela places ledgers without
/// groups).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BookieAffinityJson {
    /// Primary group.
    #[serde(default)]
    pub bookkeeper_affinity_group_primary: String,
    /// Secondary group.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bookkeeper_affinity_group_secondary: Option<String>,
}

fn bookie_affinity(value: Value) -> Result<Value, Rejected> {
    let policy: BookieAffinityJson = shape(value, "BookieAffinityGroupData")?;
    reserialize(&policy)
}

fn retention(value: Value) -> Result<Value, Rejected> {
    let json: RetentionJson = shape(value, "RetentionPolicies")?;
    let policies = NamespacePolicies {
        retention: Some(json.into()),
        ..Default::default()
    };
    policies
        .validate()
        .map_err(|e| Rejected::malformed(e.to_string()))?;
    reserialize(&json)
}

fn persistence(value: Value) -> Result<Value, Rejected> {
    let json: PersistenceJson = shape(value, "PersistencePolicies")?;
    let triple = json
        .to_policy()
        .map_err(|e| Rejected::malformed(e.to_string()))?;
    let policies = NamespacePolicies {
        persistence: Some(triple),
        ..Default::default()
    };
    policies
        .validate()
        .map_err(|e| Rejected::malformed(e.to_string()))?;
    reserialize(&json)
}

/// Pulsar's OffloadPolicies (`admin::offload_policies`).
fn offload_policies(value: Value) -> Result<Value, Rejected> {
    super::offload_policies::check(value).map_err(|refused| Rejected {
        precondition: refused.precondition,
        reason: refused.reason,
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn keys_and_routes_are_unique() {
        for (i, a) in POLICY_SPECS.iter().enumerate() {
            for b in &POLICY_SPECS[i + 1..] {
                assert_ne!(a.key, b.key);
                assert!(a.topic_route.is_none() || a.topic_route != b.topic_route);
                assert!(a.namespace_route.is_none() || a.namespace_route != b.namespace_route);
            }
        }
    }

    #[test]
    fn values_are_checked_with_pulsars_messages() {
        let max = spec_of("maxTopicsPerNamespace").unwrap();
        assert_eq!(max.check(json!(100)).unwrap(), json!(100));
        assert_eq!(max.check(json!("7")).unwrap(), json!(7));
        let refused = max.check(json!(-1)).unwrap_err();
        assert!(refused.precondition);
        assert_eq!(refused.reason, "maxTopicsPerNamespace must be 0 or more");
        assert!(!max.check(json!("x")).unwrap_err().precondition);
        let auto = spec_of("autoTopicCreation").unwrap();
        let refused = auto
            .check(json!({"allowAutoTopicCreation": true, "topicType": "partitioned"}))
            .unwrap_err();
        assert!(
            refused
                .reason
                .ends_with("cannot be null when the type is partitioned.")
        );
        assert!(auto.check(json!({"allowAutoTopicCreation": false})).is_ok());
        let rate = spec_of("publishRate").unwrap();
        assert_eq!(
            rate.check(json!({"publishThrottlingRateInMsg": 5}))
                .unwrap(),
            json!({"publishThrottlingRateInMsg": 5, "publishThrottlingRateInByte": 0})
        );
        let clusters = spec_of("replication").unwrap();
        assert!(clusters.check(json!(["standalone"])).is_ok());
        assert!(clusters.check(json!("standalone")).is_err());
    }
}
