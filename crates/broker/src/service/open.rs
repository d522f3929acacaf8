//! Opening a persistent topic: whether it may be served (namespace,
//! bundle ownership, partition range, `BrokerConfig::topics_max`, the namespace's topic
//! quota, auto-creation) and building its `Topic` (log, compaction,
//! transaction buffer, policies, dedup state, replication cursors), once
//! even when many connections ask at the same time. Also PARTITIONED_METADATA's
//! answer, which may auto-create a partitioned topic.
//!
//! Owns: `AutoCreation` (the namespace's `autoTopicCreation` or the
//! broker's flag). Never: closes or deletes a served topic (`served` does),
//! or opens a non-persistent one (`non_persistent`).

use std::sync::Arc;

use vela_log::{LogConfig, ManagedLog, Persistence};
use vela_wire::proto::ServerError;

use super::{Service, ownership_error, topics_max_reached};
use crate::admin::NamespacePolicies;
use crate::compaction::TopicCompaction;
use crate::error::ServiceError;
use crate::policies::TopicPolicies;
use crate::topic::Topic;
use crate::topic_name::{TopicDomain, TopicName};

impl Service {
    /// Partitions to answer in PARTITIONED_METADATA: N for a partitioned
    /// topic, 0 otherwise. Fails when the namespace does not exist.
    /// With the namespace's `autoTopicCreation` asking for partitioned
    /// topics, a topic that does not exist yet is created partitioned here
    /// (as Pulsar answers PARTITIONED_METADATA).
    pub(crate) async fn partitions_of(&self, topic: &TopicName) -> Result<u32, ServiceError> {
        let policies = self.namespace_policies_of(topic).await?;
        // A partition is itself a plain topic (as Pulsar answers): a client
        // opening `t-partition-0` must not look for its partitions.
        if topic.partition.is_some() {
            return Ok(0);
        }
        if let Some(n) = self.admin.partitions(topic).await? {
            return Ok(n);
        }
        let auto = AutoCreation::of(&policies, self.config.auto_create_topics);
        if let AutoCreation::Partitioned(n) = auto
            && !self.admin.topic_exists(topic).await?
        {
            self.check_topic_quota(topic, &policies, n as usize).await?;
            match self.admin.create_partitioned_topic(topic, n).await {
                Ok(()) | Err(crate::admin::AdminError::Exists(_)) => {}
                Err(e) => return Err(e.into()),
            }
            return Ok(self.admin.partitions(topic).await?.unwrap_or(0));
        }
        Ok(0)
    }

    /// What opening a topic of either kind checks first: its bundle is owned
    /// here (cluster mode), and of a partitioned topic only a partition in
    /// range is served. Answers the topic's partition count, if partitioned.
    pub(super) async fn check_servable(
        &self,
        topic: &TopicName,
    ) -> Result<Option<u32>, ServiceError> {
        if let Some(ownership) = self.ownership.get() {
            ownership
                .check_owned(topic)
                .await
                .map_err(ownership_error)?;
        }
        let partitions = self.admin.partitions(topic).await?;
        match (topic.partition, partitions) {
            (Some(index), Some(n)) if index >= n => {
                return Err(ServiceError::new(
                    ServerError::TopicNotFound,
                    format!("partition {index} of a topic with {n} partitions"),
                ));
            }
            (None, Some(_)) => {
                return Err(ServiceError::new(
                    ServerError::NotAllowedError,
                    format!("{topic} is a partitioned topic: use its partitions"),
                ));
            }
            _ => {}
        }
        Ok(partitions)
    }

    /// The served topic for `topic`, opening (and with `create`, creating) it.
    pub(crate) async fn topic(
        &self,
        topic: &TopicName,
        create: bool,
    ) -> Result<Arc<Topic>, ServiceError> {
        let full_name = topic.to_string();
        if let Some(cell) = self.topics.lock().get(full_name.as_str())
            && let Some(served) = cell.get()
            && !served.log.is_closed()
        {
            return Ok(Arc::clone(served));
        }
        if topic.domain == TopicDomain::NonPersistent {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                format!("{topic} is a non-persistent topic"),
            ));
        }
        let policies = self.namespace_policies_of(topic).await?;
        let partitions = self.check_servable(topic).await?;
        // A partition's record is written at its first open, below.
        let registered = partitions.is_none() && self.admin.topic_exists(topic).await?;
        let exists = partitions.is_some() || registered;
        let may_create = create
            && AutoCreation::of(&policies, self.config.auto_create_topics) != AutoCreation::Off;
        if !exists && !may_create {
            return Err(ServiceError::new(
                ServerError::TopicNotFound,
                format!("Topic {topic} does not exist"),
            ));
        }
        let (cell, key) = {
            let mut topics = self.topics.lock();
            let stale = topics
                .get(full_name.as_str())
                .and_then(|c| c.get())
                .is_some_and(|t| t.log.is_closed());
            if stale {
                topics.remove(full_name.as_str());
            }
            let key = match topics.get_key_value(full_name.as_str()) {
                Some((key, _)) => Arc::clone(key),
                None if topics.len() + self.np_topics.lock().len() >= self.config.topics_max => {
                    return Err(topics_max_reached(self.config.topics_max));
                }
                None => Arc::from(full_name.as_str()),
            };
            let cell = Arc::clone(topics.entry(Arc::clone(&key)).or_default());
            (cell, key)
        };
        let served = cell
            .get_or_try_init(|| async {
                if !exists {
                    self.check_topic_quota(topic, &policies, 1).await?;
                }
                let record = self.admin.topic_record(topic).await?;
                let lifecycle =
                    TopicPolicies::resolve(&policies, &record, &self.dynamic_policies());
                let persistence =
                    lifecycle
                        .persistence
                        .map_or(self.config.default_persistence, |(e, w, a)| {
                            crate::config::PersistenceConfig {
                                ensemble: e,
                                write_quorum: w,
                                ack_quorum: a,
                            }
                        });
                let dedup = lifecycle.deduplication.unwrap_or(false);
                if !registered {
                    self.admin.register_topic(topic).await?;
                }
                let config = LogConfig {
                    persistence: Persistence {
                        ensemble: persistence.ensemble,
                        write_quorum: persistence.write_quorum,
                        ack_quorum: persistence.ack_quorum,
                    },
                    ledger_entries_max: self.config.ledger_entries_max,
                    ledger_bytes_max: self.config.ledger_bytes_max,
                    ledger_age_min: self.config.ledger_rollover_min,
                    ledger_age_max: self.config.ledger_rollover_max,
                    retention: lifecycle.retention,
                    offload: lifecycle.offload_policy(self.config.offload_policy),
                    ..LogConfig::default()
                };
                let log = ManagedLog::open(&self.log_env, &topic.log_name(), config).await?;
                tracing::info!(topic = %full_name, "topic opened");
                let compaction = TopicCompaction::new(Arc::clone(&self.compaction_env));
                let txn = match &self.txn_budget {
                    Some(budget) => Some(crate::topic::TopicTxn {
                        buffer: crate::txn_buffer::TxnBuffer::open(
                            Arc::clone(&log),
                            Arc::clone(&self.meta),
                            Arc::clone(budget),
                        )
                        .await
                        .map_err(|e| {
                            ServiceError::new(ServerError::ServiceNotReady, e.to_string())
                        })?,
                        acks: crate::topic::PendingAcks::new(
                            full_name.clone(),
                            Arc::clone(&log),
                            Arc::clone(&self.meta),
                            Arc::clone(budget),
                        ),
                    }),
                    None => None,
                };
                let served = Topic::new(
                    (topic.clone(), key),
                    log,
                    dedup,
                    compaction,
                    self.config.topic_limits,
                    self.reads.clone(),
                    Arc::clone(&self.held_entries),
                    txn,
                );
                if lifecycle.compaction_threshold_bytes.is_some() {
                    crate::compaction::compaction_cursor(&served.log).await?;
                }
                let remotes = self.replication_remotes_of(&record, &policies);
                let lifecycle = self
                    .shared_policies
                    .share(&topic.namespace, &record, lifecycle);
                served.set_policy_record(record);
                served.set_lifecycle_policies(lifecycle);
                served.rebuild_dedup().await?;
                // Replication cursors from the moment the topic opens, so
                // nothing produced before its replicators start is missed.
                for remote in remotes {
                    served
                        .log
                        .open_cursor(
                            &crate::topic::replication_cursor_name(&remote),
                            vela_log::CursorStart::Latest,
                        )
                        .await?;
                }
                self.replication_wakeup.notify_one();
                Ok::<_, ServiceError>(served)
            })
            .await?;
        Ok(Arc::clone(served))
    }

    /// Refuses `adding` new topics named `topic` past their namespace's
    /// `maxTopicsPerNamespace` (partitions count one each, as in Pulsar).
    pub(crate) async fn check_topic_quota(
        &self,
        topic: &TopicName,
        policies: &NamespacePolicies,
        adding: usize,
    ) -> Result<(), ServiceError> {
        let dynamic = self.dynamic_policies();
        let max = policies
            .policies
            .get("maxTopicsPerNamespace")
            .or_else(|| dynamic.get("maxTopicsPerNamespace"))
            .and_then(crate::admin::policy_specs::int_of)
            .and_then(|n| usize::try_from(n).ok())
            .filter(|n| *n > 0);
        let Some(max) = max else {
            return Ok(());
        };
        let existing = self.admin.topics_of_namespace(&topic.namespace).await?;
        if existing.iter().any(|t| *t == topic.to_string()) {
            return Ok(());
        }
        if existing.len().saturating_add(adding) > max {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                "Exceed maximum number of topics in namespace",
            ));
        }
        Ok(())
    }
}

/// How a topic that does not exist may be created when a client asks for
/// it: the namespace's `autoTopicCreation` policy, else the broker's flag.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum AutoCreation {
    Off,
    NonPartitioned,
    Partitioned(u32),
}

impl AutoCreation {
    fn of(policies: &NamespacePolicies, broker_allows: bool) -> AutoCreation {
        let Some(policy) = policies.policies.get("autoTopicCreation").and_then(|v| {
            serde_json::from_value::<crate::admin::policy_specs::AutoTopicCreationJson>(v.clone())
                .ok()
        }) else {
            return if broker_allows {
                AutoCreation::NonPartitioned
            } else {
                AutoCreation::Off
            };
        };
        if !policy.allow_auto_topic_creation {
            return AutoCreation::Off;
        }
        match (policy.topic_type.as_deref(), policy.default_num_partitions) {
            (Some("partitioned"), Some(n)) => u32::try_from(n)
                .ok()
                .filter(|n| (1..=crate::admin::PARTITIONS_MAX).contains(n))
                .map_or(AutoCreation::NonPartitioned, AutoCreation::Partitioned),
            _ => AutoCreation::NonPartitioned,
        }
    }
}
