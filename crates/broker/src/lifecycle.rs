//! The periodic pass applying namespace policies to served topics over
//! time: message TTL, backlog quotas (Pulsar's three policies), the
//! offload and compaction thresholds and retention trimming (which also
//! deletes bookie copies of offloaded ledgers past their deletion lag); and dropping the
//! non-persistent topics nobody uses (Pulsar's inactive-topic cleanup).
//!
//! Owns: the pass over every served topic (`run`, one task per broker) and
//! what it does to one topic (`enforce`). The policies themselves are
//! `policies`; the producer admission check while a quota is exceeded is the
//! topic's (`Topic::admit_producer`).
//! Never: blocks a publish, or acknowledges anything for a subscription
//! except what TTL or an eviction quota asks for (both are what the operator
//! configured).

use std::sync::Weak;
use std::time::Duration;

use vela_log::Position;

use crate::policies::{QuotaLimit, QuotaPolicy};
use crate::service::Service;
use crate::topic::Topic;

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
        service.drop_idle_non_persistent_topics().await;
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
        for (name, _) in topic.policy_subscriptions() {
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
    // Offload thresholds (a no-op without an offloader or thresholds);
    // bookie copies past their deletion lag go in the trim below.
    if topic.log.offload_by_policy() {
        tracing::info!(topic = %topic.full_name, "offload started by its threshold");
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

async fn quota_exceeded(topic: &Topic, limit: QuotaLimit) -> bool {
    match limit {
        QuotaLimit::SizeBytes(bytes) => topic.slowest_backlog_bytes() > bytes,
        QuotaLimit::AgeSeconds(seconds) => match oldest_kept_position(topic, seconds).await {
            // Entries before `first_young` are older than the limit: exceeded
            // when a subscription has not consumed them all.
            Some(first_young) => topic.policy_subscriptions().iter().any(|(_, cursor)| {
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
    for (name, cursor) in topic.policy_subscriptions() {
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
