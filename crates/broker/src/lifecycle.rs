//! Namespace policies enforced on served topics over time: message TTL,
//! backlog quotas (Pulsar's three policies) and retention trimming.
//!
//! Owns: the policies a topic enforces (`TopicPolicies`, parsed once from the
//! namespace's stored policies), the periodic pass over every served topic
//! (`run`, one task per broker) and the producer admission check while a
//! quota is exceeded. Never: blocks a publish, or acknowledges anything for a
//! subscription except what TTL or an eviction quota asks for (both are what
//! the operator configured).

use std::sync::{Arc, Weak};
use std::time::Duration;

use vela_log::{Position, Retention};
use vela_wire::proto::ServerError;

use crate::admin::{BacklogQuota, NamespacePolicies, RetentionPolicy};
use crate::error::ServiceError;
use crate::service::Service;
use crate::topic::Topic;

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
    fn refusal(self, limit: QuotaLimit) -> ServiceError {
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
}

impl Default for TopicPolicies {
    fn default() -> TopicPolicies {
        TopicPolicies {
            message_ttl: None,
            quotas: Vec::new(),
            retention: Retention::NONE,
            compaction_threshold_bytes: None,
        }
    }
}

impl TopicPolicies {
    /// Parses a namespace's stored policies (validated by the admin API when
    /// set: unknown quota types or policies are skipped with a warning).
    pub(crate) fn from_namespace(policies: &NamespacePolicies) -> TopicPolicies {
        let message_ttl = policies
            .message_ttl_seconds
            .filter(|s| *s > 0)
            .map(|s| Duration::from_secs(u64::from(s)));
        let mut quotas = Vec::new();
        for (kind, quota) in &policies.backlog_quotas {
            match parse_quota(kind, quota) {
                Some(parsed) => quotas.push(parsed),
                None => tracing::warn!(kind, ?quota, "backlog quota not understood; ignored"),
            }
        }
        TopicPolicies {
            message_ttl,
            quotas,
            retention: policies.retention.map_or(Retention::NONE, retention_of),
            compaction_threshold_bytes: policies.compaction_threshold_bytes.filter(|b| *b > 0),
        }
    }
}

fn parse_quota(kind: &str, quota: &BacklogQuota) -> Option<(QuotaLimit, QuotaPolicy)> {
    let policy = QuotaPolicy::parse(&quota.policy)?;
    let limit = match kind {
        "destination_storage" => QuotaLimit::SizeBytes(u64::try_from(quota.limit_bytes).ok()?),
        "message_age" => QuotaLimit::AgeSeconds(u64::try_from(quota.limit_seconds).ok()?),
        _ => return None,
    };
    Some((limit, policy))
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

/// Shortest time between two passes.
const INTERVAL_MIN: Duration = Duration::from_millis(100);

/// Runs the periodic pass until the service is gone.
pub(crate) async fn run(service: Weak<Service>, interval: Duration) {
    // A zero interval would spin (and tokio refuses it).
    let mut ticker = tokio::time::interval(interval.max(INTERVAL_MIN));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    ticker.tick().await;
    loop {
        ticker.tick().await;
        let Some(service) = service.upgrade() else {
            return;
        };
        let topics = service.served_topic_handles();
        drop(service);
        for topic in topics {
            enforce(&topic).await;
        }
    }
}

/// One pass over one topic: TTL, quotas, then trimming what is consumed.
pub(crate) async fn enforce(topic: &Topic) {
    let policies = topic.lifecycle_policies();
    if let Some(ttl) = policies.message_ttl {
        for (name, _) in subscriptions(topic) {
            if let Err(error) = topic.expire(&name, ttl).await {
                tracing::debug!(topic = %topic.full_name, subscription = name, %error, "TTL not applied");
            }
        }
    }
    let mut blocked = None;
    for &(limit, policy) in &policies.quotas {
        if !quota_exceeded(topic, limit).await {
            continue;
        }
        match policy {
            QuotaPolicy::ConsumerBacklogEviction => evict(topic, limit).await,
            QuotaPolicy::ProducerRequestHold | QuotaPolicy::ProducerException => {
                if blocked.is_none() {
                    tracing::info!(topic = %topic.full_name, ?limit, ?policy, "backlog quota exceeded: producers disconnected");
                    blocked = Some((limit, policy));
                }
            }
        }
    }
    let was_blocked = topic.set_quota_block(blocked);
    if blocked.is_some() && !was_blocked {
        topic.disconnect_producers();
    }
    if let Some(threshold) = policies.compaction_threshold_bytes {
        let compacted_to = match crate::compaction::compaction_cursor(&topic.log).await {
            Ok(cursor) => cursor.mark_delete_position(),
            Err(error) => {
                tracing::warn!(topic = %topic.full_name, %error, "compaction cursor not opened");
                return;
            }
        };
        let pending_bytes = topic.log.bytes_after(compacted_to);
        if pending_bytes > threshold && topic.start_compaction().is_ok() {
            tracing::info!(topic = %topic.full_name, pending_bytes, threshold, "compaction started by its threshold");
        }
    }
    topic.log.trim().await;
}

/// Checks a new producer against the topic's quotas: size quotas now, age
/// quotas as of the last pass (finding the oldest message takes reads).
pub(crate) fn admit_producer(topic: &Topic) -> Result<(), ServiceError> {
    if let Some((limit @ QuotaLimit::AgeSeconds(_), policy)) = topic.quota_block() {
        return Err(policy.refusal(limit));
    }
    for (limit, policy) in topic.lifecycle_policies().quotas {
        if policy == QuotaPolicy::ConsumerBacklogEviction {
            continue;
        }
        if let QuotaLimit::SizeBytes(bytes) = limit
            && slowest_backlog_bytes(topic) > bytes
        {
            return Err(policy.refusal(limit));
        }
    }
    Ok(())
}

/// The durable subscriptions (name, cursor) the policies apply to. Not the
/// `__compaction` cursor (as in Pulsar): it is no consumer, and moving it by
/// TTL or eviction would let the log trim what the next compaction needs.
fn subscriptions(topic: &Topic) -> Vec<(String, Arc<vela_log::Cursor>)> {
    topic
        .log
        .cursor_names()
        .into_iter()
        .filter(|name| name != crate::compaction::COMPACTION_SUBSCRIPTION)
        .filter_map(|name| topic.log.cursor(&name).map(|cursor| (name, cursor)))
        .collect()
}

/// Backlog bytes of the slowest durable subscription.
fn slowest_backlog_bytes(topic: &Topic) -> u64 {
    subscriptions(topic)
        .iter()
        .map(|(_, cursor)| topic.log.bytes_after(cursor.mark_delete_position()))
        .max()
        .unwrap_or(0)
}

async fn quota_exceeded(topic: &Topic, limit: QuotaLimit) -> bool {
    match limit {
        QuotaLimit::SizeBytes(bytes) => slowest_backlog_bytes(topic) > bytes,
        QuotaLimit::AgeSeconds(seconds) => match oldest_kept_position(topic, seconds).await {
            // Entries before `first_young` are older than the limit: exceeded
            // when a subscription has not consumed them all.
            Some(first_young) => subscriptions(topic).iter().any(|(_, cursor)| {
                let next = cursor.mark_delete_position().map_or_else(
                    || topic.log.first_position(),
                    |md| Some(topic.log.next_position(md)),
                );
                next.is_some_and(|next| next < first_young)
            }),
            None => false,
        },
    }
}

/// The first entry published less than `seconds` ago (`None`: the log is
/// empty or could not be read).
async fn oldest_kept_position(topic: &Topic, seconds: u64) -> Option<Position> {
    topic.log.last_confirmed()?;
    let cutoff_ms = crate::subscription::now_ms().saturating_sub(seconds.saturating_mul(1000));
    match crate::subscription::first_published_at_or_after(&topic.log, cutoff_ms).await {
        Ok(position) => Some(position),
        Err(error) => {
            tracing::warn!(topic = %topic.full_name, %error, "backlog age not checked");
            None
        }
    }
}

/// Drops the oldest backlog of every subscription over the quota.
async fn evict(topic: &Topic, limit: QuotaLimit) {
    for (name, cursor) in subscriptions(topic) {
        let result = match limit {
            QuotaLimit::SizeBytes(bytes) => {
                if topic.log.bytes_after(cursor.mark_delete_position()) <= bytes {
                    continue;
                }
                match topic.log.position_keeping_bytes(bytes) {
                    Some(target) => topic.evict_up_to(&name, target).await,
                    None => continue,
                }
            }
            QuotaLimit::AgeSeconds(seconds) => {
                topic.expire(&name, Duration::from_secs(seconds)).await
            }
        };
        match result {
            Ok(()) => {
                tracing::info!(topic = %topic.full_name, subscription = name, ?limit, "backlog evicted to the quota")
            }
            Err(error) => {
                tracing::warn!(topic = %topic.full_name, subscription = name, %error, "backlog eviction failed")
            }
        }
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
}
