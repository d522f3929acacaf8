//! The policies a served topic enforces, as the broker reads them from the
//! namespace's stored policies: message TTL, backlog quotas (Pulsar's three
//! policies), retention, the compaction threshold and the offload policy
//! (thresholds, deletion lag: `offloadPolicies` objects' fields, topic over
//! namespace, then the namespace's older numbers) over the broker's
//! default.
//!
//! Owns: parsing [`NamespacePolicies`] once into [`TopicPolicies`] (Pulsar's
//! numbers and names: −1 is "no limit", quota policies by name) and the
//! refusal a producer gets while a quota holds the topic. This is where the
//! resolution topic > namespace > broker default belongs once topics carry
//! their own policies.
//! Never: applies them: `lifecycle` runs the periodic pass, `topic` checks
//! producer admission.

use std::collections::BTreeMap;
use std::time::Duration;

use vela_log::{OffloadPolicy, Retention};
use vela_wire::proto::ServerError;

use serde_json::Value;

use crate::admin::json::{PersistenceJson, RetentionJson};
use crate::admin::offload_policies::OffloadFields;
use crate::admin::policy_specs::{DispatchRateJson, PublishRateJson, int_of};
use crate::admin::{BacklogQuota, NamespacePolicies, RetentionPolicy, TopicRecord};
use crate::config::{DispatchRate, PublishRate};
use crate::error::ServiceError;

pub(crate) mod shared;

/// What happens when a backlog quota is exceeded (Pulsar's
/// `BacklogQuota.RetentionPolicy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuotaPolicy {
    /// Producers are disconnected; new ones are refused with a retriable
    /// error, so clients hold their sends until the backlog shrinks.
    ProducerRequestHold,
    /// Producers are disconnected; new ones are refused with an exception
    /// (their pending sends fail).
    ProducerException,
    /// The oldest backlog of the subscriptions over the quota is dropped.
    ConsumerBacklogEviction,
}

impl QuotaPolicy {
    fn parse(name: &str) -> Option<QuotaPolicy> {
        match name {
            "producer_request_hold" => Some(QuotaPolicy::ProducerRequestHold),
            "producer_exception" => Some(QuotaPolicy::ProducerException),
            "consumer_backlog_eviction" => Some(QuotaPolicy::ConsumerBacklogEviction),
            _ => None,
        }
    }

    /// The refusal a new producer gets while this policy holds the topic.
    pub(crate) fn refusal(self, limit: QuotaLimit) -> ServiceError {
        let what = match limit {
            QuotaLimit::SizeBytes(bytes) => format!("backlog size quota of {bytes} bytes"),
            QuotaLimit::AgeSeconds(seconds) => format!("backlog age quota of {seconds} s"),
        };
        match self {
            QuotaPolicy::ProducerRequestHold => ServiceError::new(
                ServerError::ProducerBlockedQuotaExceededError,
                format!("Cannot create producer on topic with backlog quota exceeded ({what})"),
            ),
            QuotaPolicy::ProducerException | QuotaPolicy::ConsumerBacklogEviction => {
                ServiceError::new(
                    ServerError::ProducerBlockedQuotaExceededException,
                    format!("Cannot create producer on topic with backlog quota exceeded ({what})"),
                )
            }
        }
    }
}

/// The limit a backlog quota sets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum QuotaLimit {
    /// `destination_storage`: backlog bytes of the slowest subscription.
    SizeBytes(u64),
    /// `message_age`: age of the oldest unacknowledged message.
    AgeSeconds(u64),
}

/// The policies a served topic enforces, parsed from its namespace's.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct TopicPolicies {
    /// Messages older than this are acknowledged for every subscription.
    pub(crate) message_ttl: Option<Duration>,
    /// Backlog quotas (at most one per limit type).
    pub(crate) quotas: Vec<(QuotaLimit, QuotaPolicy)>,
    /// Consumed data kept.
    pub(crate) retention: Retention,
    /// Bytes not yet compacted that start a compaction.
    pub(crate) compaction_threshold_bytes: Option<u64>,
    /// Limits set by policy (topic, else namespace); `None`: the broker's.
    pub(crate) limits: PolicyLimits,
    /// Replication (E, Qw, Qa) set by policy.
    pub(crate) persistence: Option<(u8, u8, u8)>,
    /// Deduplication set by policy.
    pub(crate) deduplication: Option<bool>,
    /// The `offloadPolicies` objects' numbers, topic > namespace > broker
    /// (see `TopicPolicies::offload_policy`).
    pub(crate) offload_fields: OffloadFields,
    /// The namespace's older offload numbers as Pulsar stores them (see
    /// `TopicPolicies::offload_policy`).
    pub(crate) offload_threshold_bytes: Option<i64>,
    pub(crate) offload_threshold_seconds: Option<i64>,
    pub(crate) offload_deletion_lag_ms: Option<i64>,
}

/// Limits a topic or its namespace sets over the broker's (Pulsar: 0 is no
/// limit for the counts; a rate side of 0 or less is no limit).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PolicyLimits {
    /// Producers on the topic.
    pub(crate) producers_max: Option<usize>,
    /// Consumers on the topic.
    pub(crate) consumers_max: Option<usize>,
    /// Consumers on one subscription.
    pub(crate) consumers_per_subscription_max: Option<usize>,
    /// Subscriptions on the topic.
    pub(crate) subscriptions_max: Option<usize>,
    /// Publish rate of the topic.
    pub(crate) publish_rate: Option<PublishRate>,
    /// Dispatch rate of the topic, over its subscriptions together.
    pub(crate) dispatch_rate: Option<DispatchRate>,
    /// Dispatch rate of each subscription.
    pub(crate) subscription_dispatch_rate: Option<DispatchRate>,
    /// Dispatch rate of each replicator (`replicatorDispatchRate`: per
    /// topic and remote cluster).
    pub(crate) replicator_dispatch_rate: Option<DispatchRate>,
    /// Largest message a producer may send, bytes.
    pub(crate) message_size_max: Option<usize>,
    /// Whether delayed delivery is on (`delayedDelivery.active`).
    pub(crate) delayed_delivery: Option<bool>,
    /// Whether a SUBSCRIBE may create its subscription (`None`: yes).
    pub(crate) auto_subscription_creation: Option<bool>,
    /// Producers without a schema are refused on a topic that has one.
    pub(crate) schema_validation_enforced: bool,
    /// Entries out and unacknowledged per consumer before it gets no more.
    pub(crate) unacked_per_consumer_max: Option<u64>,
    /// The same per subscription.
    pub(crate) unacked_per_subscription_max: Option<u64>,
}

impl Default for TopicPolicies {
    fn default() -> TopicPolicies {
        TopicPolicies {
            message_ttl: None,
            quotas: Vec::new(),
            retention: Retention::NONE,
            compaction_threshold_bytes: None,
            limits: PolicyLimits::default(),
            persistence: None,
            deduplication: None,
            offload_fields: OffloadFields::default(),
            offload_threshold_bytes: None,
            offload_threshold_seconds: None,
            offload_deletion_lag_ms: None,
        }
    }
}

impl TopicPolicies {
    /// Parses a namespace's stored policies (validated by the admin API when
    /// set: unknown quota types or policies are skipped with a warning).
    #[cfg(test)]
    pub(crate) fn from_namespace(policies: &NamespacePolicies) -> TopicPolicies {
        TopicPolicies::resolve(policies, &TopicRecord::default(), &BTreeMap::new())
    }

    /// The policies of a topic: each one the topic's own when set, else its
    /// namespace's, else the broker's dynamic configuration's (`broker`, by
    /// policy key), else the broker's flags (applied by the caller).
    pub(crate) fn resolve(
        policies: &NamespacePolicies,
        topic: &TopicRecord,
        broker: &BTreeMap<String, Value>,
    ) -> TopicPolicies {
        let pick = |key: &str| -> Option<&Value> {
            topic
                .policies
                .get(key)
                .or_else(|| policies.policies.get(key))
                .or_else(|| broker.get(key))
        };
        let own = |key: &str| topic.policies.get(key);
        let ttl_seconds = match own("messageTTL") {
            Some(value) => int_of(value).and_then(|s| u64::try_from(s).ok()),
            None => policies.message_ttl_seconds.map(u64::from),
        };
        let message_ttl = ttl_seconds.filter(|s| *s > 0).map(Duration::from_secs);
        let backlog_quotas = if topic.backlog_quotas.is_empty() {
            &policies.backlog_quotas
        } else {
            &topic.backlog_quotas
        };
        let retention = match own("retention")
            .and_then(|v| serde_json::from_value::<RetentionJson>(v.clone()).ok())
        {
            Some(json) => Some(RetentionPolicy::from(json)),
            None => policies.retention,
        };
        let compaction_threshold_bytes = match own("compactionThreshold") {
            Some(value) => int_of(value).and_then(|b| u64::try_from(b).ok()),
            None => policies.compaction_threshold_bytes,
        };
        let persistence = match own("persistence")
            .and_then(|v| serde_json::from_value::<PersistenceJson>(v.clone()).ok())
        {
            Some(json) => json.to_policy().ok(),
            None => policies.persistence,
        };
        let deduplication = match own("deduplicationEnabled") {
            Some(value) => value.as_bool(),
            None => policies.deduplication_enabled,
        };
        let count = |key: &str| {
            pick(key)
                .and_then(int_of)
                .and_then(|n| usize::try_from(n).ok())
                .filter(|n| *n > 0)
        };
        let publish_rate = pick("publishRate")
            .and_then(|v| serde_json::from_value::<PublishRateJson>(v.clone()).ok())
            .map(|rate| PublishRate {
                messages_per_s: u64::try_from(rate.publish_throttling_rate_in_msg)
                    .ok()
                    .filter(|r| *r > 0),
                bytes_per_s: u64::try_from(rate.publish_throttling_rate_in_byte)
                    .ok()
                    .filter(|r| *r > 0),
            });
        let delayed_delivery = pick("delayedDelivery")
            .and_then(|v| v.get("active"))
            .and_then(Value::as_bool);
        let limits = PolicyLimits {
            producers_max: count("maxProducers"),
            consumers_max: count("maxConsumers"),
            consumers_per_subscription_max: count("maxConsumersPerSubscription"),
            subscriptions_max: count("maxSubscriptionsPerTopic"),
            publish_rate,
            dispatch_rate: pick("dispatchRate").and_then(dispatch_rate_of),
            subscription_dispatch_rate: pick("subscriptionDispatchRate").and_then(dispatch_rate_of),
            replicator_dispatch_rate: pick("replicatorDispatchRate").and_then(dispatch_rate_of),
            message_size_max: count("maxMessageSize"),
            delayed_delivery,
            unacked_per_consumer_max: count("maxUnackedMessagesOnConsumer").map(|n| n as u64),
            unacked_per_subscription_max: count("maxUnackedMessagesOnSubscription")
                .map(|n| n as u64),
            schema_validation_enforced: pick("schemaValidationEnforced")
                .and_then(Value::as_bool)
                .unwrap_or(false),
            auto_subscription_creation: pick("autoSubscriptionCreation")
                .and_then(|v| v.get("allowAutoSubscriptionCreation"))
                .and_then(Value::as_bool),
        };
        let mut quotas = Vec::new();
        for (kind, quota) in backlog_quotas {
            match parse_quota(kind, quota) {
                ParsedQuota::Limit(limit, policy) => quotas.push((limit, policy)),
                ParsedQuota::NoLimit => {}
                ParsedQuota::Unknown => {
                    tracing::warn!(kind, ?quota, "backlog quota not understood; ignored");
                }
            }
        }
        TopicPolicies {
            message_ttl,
            quotas,
            retention: retention.map_or(Retention::NONE, retention_of),
            compaction_threshold_bytes: compaction_threshold_bytes.filter(|b| *b > 0),
            limits,
            persistence,
            deduplication,
            offload_fields: OffloadFields::merge([
                topic.policies.get("offloadPolicies"),
                policies.policies.get("offloadPolicies"),
                broker.get("offloadPolicies"),
            ]),
            offload_threshold_bytes: pick("offloadThreshold")
                .and_then(int_of)
                .or(policies.offload_threshold_bytes),
            offload_threshold_seconds: pick("offloadThresholdInSeconds")
                .and_then(int_of)
                .or(policies.offload_threshold_seconds),
            offload_deletion_lag_ms: pick("offloadDeletionLagMs")
                .and_then(int_of)
                .or(policies.offload_deletion_lag_ms),
        }
    }

    /// The offload policy a topic follows: an `offloadPolicies` object's
    /// numbers (a negative one is off), else the namespace's older numbers,
    /// else the broker's `default`. Older thresholds: unset or −1 is the
    /// default (Pulsar's "-1 falls back"), another negative turns it off, 0
    /// or more is the threshold. Older deletion lag: unset is the default,
    /// negative keeps the bookie copy.
    pub(crate) fn offload_policy(&self, default: OffloadPolicy) -> OffloadPolicy {
        let threshold = |object: Option<i64>, value: Option<i64>, default: Option<u64>| {
            if let Some(object) = object {
                return u64::try_from(object).ok();
            }
            match value {
                None | Some(-1) => default,
                Some(value) => u64::try_from(value).ok(),
            }
        };
        let age_default = default.threshold_age.map(|age| age.as_secs());
        let fields = &self.offload_fields;
        OffloadPolicy {
            threshold_bytes: threshold(
                fields.threshold_bytes,
                self.offload_threshold_bytes,
                default.threshold_bytes,
            ),
            threshold_age: threshold(
                fields.threshold_seconds,
                self.offload_threshold_seconds,
                age_default,
            )
            .map(Duration::from_secs),
            deletion_lag: match fields.deletion_lag_ms.or(self.offload_deletion_lag_ms) {
                None => default.deletion_lag,
                Some(ms) => u64::try_from(ms).ok().map(Duration::from_millis),
            },
        }
    }
}

/// A stored dispatch rate (Pulsar's numbers: a side of 0 or less is no
/// limit, the period at least a second). `relativeToPublishRate` rates are
/// not applied (Vela does not follow the publish rate).
fn dispatch_rate_of(value: &Value) -> Option<DispatchRate> {
    let json: DispatchRateJson = serde_json::from_value(value.clone()).ok()?;
    if json.relative_to_publish_rate {
        return None;
    }
    let positive = |n: i64| u64::try_from(n).ok().filter(|n| *n > 0);
    let rate = DispatchRate {
        messages_per_period: positive(json.dispatch_throttling_rate_in_msg),
        bytes_per_period: positive(json.dispatch_throttling_rate_in_byte),
        period: Duration::from_secs(positive(json.rate_period_in_second).unwrap_or(1)),
    };
    rate.is_limited().then_some(rate)
}

/// A stored backlog quota, read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ParsedQuota {
    /// A limit and what happens past it.
    Limit(QuotaLimit, QuotaPolicy),
    /// A negative limit: Pulsar's "no limit" (the OpenMessaging Benchmark's
    /// driver sets −1/−1), so no quota, and nothing to warn about.
    NoLimit,
    /// An unknown quota type or policy name.
    Unknown,
}

fn parse_quota(kind: &str, quota: &BacklogQuota) -> ParsedQuota {
    let limit = match kind {
        "destination_storage" => u64::try_from(quota.limit_bytes).map(QuotaLimit::SizeBytes),
        "message_age" => u64::try_from(quota.limit_seconds).map(QuotaLimit::AgeSeconds),
        _ => return ParsedQuota::Unknown,
    };
    let Ok(limit) = limit else {
        return ParsedQuota::NoLimit;
    };
    match QuotaPolicy::parse(&quota.policy) {
        Some(policy) => ParsedQuota::Limit(limit, policy),
        None => ParsedQuota::Unknown,
    }
}

/// Pulsar's retention numbers (−1: no limit) as the log's `Retention`.
pub(crate) fn retention_of(policy: RetentionPolicy) -> Retention {
    const MIB: u64 = 1 << 20;
    Retention {
        time: u64::try_from(policy.time_minutes)
            .ok()
            .map(|minutes| Duration::from_secs(minutes * 60)),
        size_bytes: u64::try_from(policy.size_mb)
            .ok()
            .map(|mb| mb.saturating_mul(MIB)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn retention_numbers_follow_pulsar() {
        let none = retention_of(RetentionPolicy {
            time_minutes: 0,
            size_mb: 0,
        });
        assert_eq!(none, Retention::NONE);
        let forever = retention_of(RetentionPolicy {
            time_minutes: -1,
            size_mb: -1,
        });
        assert_eq!(forever.time, None);
        assert_eq!(forever.size_bytes, None);
        let some = retention_of(RetentionPolicy {
            time_minutes: 10,
            size_mb: 2,
        });
        assert_eq!(some.time, Some(Duration::from_secs(600)));
        assert_eq!(some.size_bytes, Some(2 << 20));
    }

    #[test]
    fn quotas_parse_and_unknown_ones_are_skipped() {
        let mut ns = NamespacePolicies::default();
        ns.backlog_quotas.insert(
            "destination_storage".into(),
            BacklogQuota {
                limit_bytes: 1000,
                limit_seconds: -1,
                policy: "producer_exception".into(),
            },
        );
        ns.backlog_quotas.insert(
            "message_age".into(),
            BacklogQuota {
                limit_bytes: -1,
                limit_seconds: 30,
                policy: "consumer_backlog_eviction".into(),
            },
        );
        ns.backlog_quotas.insert(
            "bogus".into(),
            BacklogQuota {
                limit_bytes: 1,
                limit_seconds: 1,
                policy: "producer_exception".into(),
            },
        );
        ns.message_ttl_seconds = Some(0);
        let parsed = TopicPolicies::from_namespace(&ns);
        // Negative limits (the OpenMessaging Benchmark's −1/−1) are no quota.
        let no_limit = BacklogQuota {
            limit_bytes: -1,
            limit_seconds: -1,
            policy: "producer_exception".into(),
        };
        assert_eq!(
            parse_quota("destination_storage", &no_limit),
            ParsedQuota::NoLimit
        );
        assert_eq!(parse_quota("message_age", &no_limit), ParsedQuota::NoLimit);
        assert_eq!(parse_quota("bogus", &no_limit), ParsedQuota::Unknown);
        assert_eq!(parsed.message_ttl, None);
        assert_eq!(
            parsed.quotas,
            vec![
                (QuotaLimit::SizeBytes(1000), QuotaPolicy::ProducerException),
                (
                    QuotaLimit::AgeSeconds(30),
                    QuotaPolicy::ConsumerBacklogEviction
                ),
            ]
        );
    }

    #[test]
    fn namespace_offload_numbers_override_the_broker_default() {
        let default = OffloadPolicy {
            threshold_bytes: Some(1000),
            threshold_age: None,
            deletion_lag: Some(Duration::from_secs(60)),
        };
        let unset = TopicPolicies::default();
        assert_eq!(unset.offload_policy(default), default);
        let set = TopicPolicies {
            offload_threshold_bytes: Some(0),
            offload_threshold_seconds: Some(30),
            offload_deletion_lag_ms: Some(0),
            ..TopicPolicies::default()
        };
        assert_eq!(
            set.offload_policy(default),
            OffloadPolicy {
                threshold_bytes: Some(0),
                threshold_age: Some(Duration::from_secs(30)),
                deletion_lag: Some(Duration::ZERO),
            }
        );
        let off = TopicPolicies {
            offload_threshold_bytes: Some(-2),
            offload_threshold_seconds: Some(-1),
            offload_deletion_lag_ms: Some(-1),
            ..TopicPolicies::default()
        };
        assert_eq!(
            off.offload_policy(default),
            OffloadPolicy {
                threshold_bytes: None,
                threshold_age: None,
                deletion_lag: None,
            }
        );
    }

    #[test]
    fn offload_policies_objects_win_field_by_field() {
        let default = OffloadPolicy {
            threshold_bytes: Some(1000),
            threshold_age: Some(Duration::from_secs(120)),
            deletion_lag: Some(Duration::from_secs(60)),
        };
        let mut namespace = NamespacePolicies::default();
        namespace
            .policies
            .insert("offloadThreshold".into(), serde_json::json!(5));
        namespace.policies.insert(
            "offloadPolicies".into(),
            serde_json::json!({"managedLedgerOffloadDeletionLagInMillis": 0,
                               "managedLedgerOffloadThresholdInSeconds": -1}),
        );
        let mut topic = TopicRecord::default();
        topic.policies.insert(
            "offloadPolicies".into(),
            serde_json::json!({"managedLedgerOffloadThresholdInSeconds": 30}),
        );
        let resolved = TopicPolicies::resolve(&namespace, &topic, &BTreeMap::new());
        assert_eq!(
            resolved.offload_policy(default),
            OffloadPolicy {
                // The older namespace number: no object sets it.
                threshold_bytes: Some(5),
                // The topic's object over the namespace's.
                threshold_age: Some(Duration::from_secs(30)),
                deletion_lag: Some(Duration::ZERO),
            }
        );
        let resolved =
            TopicPolicies::resolve(&namespace, &TopicRecord::default(), &BTreeMap::new());
        // A negative number in an object is off, not the broker's default.
        assert_eq!(resolved.offload_policy(default).threshold_age, None);
    }
}
