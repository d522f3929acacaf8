//! The namespace policies a topic enforces and the backlog quota that holds
//! its producers off: the state the lifecycle pass updates and producer
//! admission reads.
//!
//! Owns: [`PolicyState`] (one short mutex, a leaf) and the admission check
//! while a quota is exceeded: size quotas are checked at each PRODUCER, age
//! quotas as of the last lifecycle pass (finding the oldest message takes
//! reads). Never: acknowledges or trims anything (`lifecycle` does).

use std::sync::Arc;

use parking_lot::Mutex;
use vela_log::{Cursor, ManagedLog};

use crate::admin::TopicRecord;
use crate::compaction::COMPACTION_SUBSCRIPTION;
use crate::error::ServiceError;
use crate::policies::{QuotaLimit, QuotaPolicy, TopicPolicies};

#[derive(Debug, Default)]
struct Policies {
    /// TTL, backlog quotas and retention of the namespace (`lifecycle`);
    /// one copy shared by the topics they are the same for
    /// (`Service::shared_policies`).
    policies: Arc<TopicPolicies>,
    /// The exceeded quota holding producers off, as of the last lifecycle pass.
    quota_block: Option<(QuotaLimit, QuotaPolicy)>,
    /// The topic's own policies as stored (resolved into `policies` with its
    /// namespace's); `None` when it has none (most topics: no bytes spent).
    record: Option<Box<TopicRecord>>,
}

/// The policies of one topic and its quota verdict.
#[derive(Debug, Default)]
pub(crate) struct PolicyState(Mutex<Policies>);

impl PolicyState {
    /// The namespace policies this topic enforces over time.
    pub(crate) fn policies(&self) -> Arc<TopicPolicies> {
        Arc::clone(&self.0.lock().policies)
    }

    /// Replaces them (topic open, namespace policy change).
    pub(crate) fn set_policies(&self, policies: Arc<TopicPolicies>) {
        self.0.lock().policies = policies;
    }

    /// The topic's own policy record, as last applied.
    pub(crate) fn record(&self) -> TopicRecord {
        self.0.lock().record.as_deref().cloned().unwrap_or_default()
    }

    /// Keeps the topic's own policy record (applied with `set_policies`).
    pub(crate) fn set_record(&self, record: TopicRecord) {
        self.0.lock().record = (!record.is_empty()).then(|| Box::new(record));
    }

    /// The exceeded quota holding producers off, if any.
    pub(crate) fn quota_block(&self) -> Option<(QuotaLimit, QuotaPolicy)> {
        self.0.lock().quota_block
    }

    /// Records the lifecycle pass's verdict; true if a quota held producers
    /// off before.
    pub(crate) fn set_quota_block(&self, block: Option<(QuotaLimit, QuotaPolicy)>) -> bool {
        std::mem::replace(&mut self.0.lock().quota_block, block).is_some()
    }

    /// Checks a new producer of the topic of `log` against the quotas.
    pub(crate) fn admit_producer(&self, log: &ManagedLog) -> Result<(), ServiceError> {
        if let Some((limit @ QuotaLimit::AgeSeconds(_), policy)) = self.quota_block() {
            return Err(policy.refusal(limit));
        }
        for &(limit, policy) in &self.policies().quotas {
            if policy == QuotaPolicy::ConsumerBacklogEviction {
                continue;
            }
            if let QuotaLimit::SizeBytes(bytes) = limit
                && slowest_backlog_bytes(log) > bytes
            {
                return Err(policy.refusal(limit));
            }
        }
        Ok(())
    }
}

/// The durable subscriptions (name, cursor) the policies apply to. Not the
/// `__compaction` cursor (as in Pulsar): it is no consumer, and moving it by
/// TTL or eviction would let the log trim what the next compaction needs.
/// The replicators' `pulsar.repl.*` cursors are in (as Pulsar applies TTL
/// and backlog quotas to replicators): a remote cluster down for long holds
/// a backlog the quota bounds.
pub(crate) fn policy_subscriptions(log: &ManagedLog) -> Vec<(String, Arc<Cursor>)> {
    log.cursor_names()
        .into_iter()
        .filter(|name| name != COMPACTION_SUBSCRIPTION)
        .filter_map(|name| log.cursor(&name).map(|cursor| (name, cursor)))
        .collect()
}

/// Backlog bytes of the slowest durable subscription.
pub(crate) fn slowest_backlog_bytes(log: &ManagedLog) -> u64 {
    policy_subscriptions(log)
        .iter()
        .map(|(_, cursor)| log.bytes_after(cursor.mark_delete_position()))
        .max()
        .unwrap_or(0)
}
