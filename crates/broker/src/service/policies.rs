//! Policies reaching served topics: the broker's dynamic configuration,
//! a namespace's or a topic's new policies applied to the topics served
//! now (resolved topic > namespace > broker), and the schema compatibility
//! strategy that applies to a topic.
//!
//! Owns nothing of its own: `Service::dynamic` holds the dynamic policies,
//! `Service::shared_policies` the one copy of a namespace's resolved
//! policies its topics without their own share (`policies::shared`).
//! Never: stores a policy (`admin` and `http` do) or opens a topic to apply
//! one (a topic opening resolves its policies itself).

use std::sync::Arc;

use vela_log::Persistence;

use super::Service;
use crate::admin::NamespacePolicies;
use crate::error::ServiceError;
use crate::policies::TopicPolicies;
use crate::schema::CompatibilityStrategy;
use crate::topic::Topic;
use crate::topic_name::TopicName;

impl Service {
    /// The policies the broker's dynamic configuration sets, by policy key.
    pub(crate) fn dynamic_policies(&self) -> std::collections::BTreeMap<String, serde_json::Value> {
        self.dynamic.lock().clone()
    }

    /// Replaces them and applies them to every served topic.
    pub(crate) async fn set_dynamic_policies(
        &self,
        policies: std::collections::BTreeMap<String, serde_json::Value>,
    ) -> Result<(), ServiceError> {
        *self.dynamic.lock() = policies;
        let mut namespaces: Vec<crate::topic_name::NamespaceName> = self
            .served_topic_handles()
            .iter()
            .map(|t| t.name.namespace.clone())
            .collect();
        namespaces.sort_by_key(|ns| ns.to_string());
        namespaces.dedup();
        for ns in namespaces {
            if let Some(policies) = self.admin.namespace_policies(&ns).await? {
                self.apply_policies(&ns, &policies);
            }
        }
        Ok(())
    }

    /// The schema compatibility strategy that applies to `topic`: its own,
    /// else its namespace's, else the broker default (FULL), as Pulsar
    /// resolves it.
    pub(crate) async fn schema_strategy(
        &self,
        topic: &TopicName,
    ) -> Result<CompatibilityStrategy, ServiceError> {
        if let Some(strategy) = self.schemas.topic_strategy(topic).await? {
            return Ok(strategy);
        }
        let policies = self.admin.namespace_policies(&topic.namespace).await?;
        let stored = policies.and_then(|p| p.schema_compatibility_strategy);
        Ok(stored
            .and_then(|name| CompatibilityStrategy::parse(&name).ok().flatten())
            .unwrap_or(CompatibilityStrategy::DEFAULT))
    }

    /// Applies a namespace's (new) policies to its served topics, each
    /// resolved with the topic's own (topic > namespace > broker): the
    /// persistence reaches each topic's next ledger (the open one keeps its
    /// replication, as in Pulsar); the publish rate applies at once, count
    /// limits at the next PRODUCER or SUBSCRIBE, TTL, backlog quotas and
    /// retention from the next lifecycle pass. Deduplication changes apply
    /// when a topic next opens.
    pub(crate) fn apply_policies(
        &self,
        ns: &crate::topic_name::NamespaceName,
        policies: &NamespacePolicies,
    ) {
        let served: Vec<Arc<Topic>> = self
            .topics
            .lock()
            .values()
            .filter_map(|c| c.get().cloned())
            .filter(|t| t.name.namespace == *ns)
            .collect();
        for topic in served {
            let record = topic.policy_record();
            self.apply_to(&topic, policies, record);
        }
    }

    /// Applies a topic's (new) own policies to it, or to each served
    /// partition of a partitioned topic, as `apply_policies` does.
    pub(crate) async fn apply_topic_record(
        &self,
        topic: &TopicName,
        record: &crate::admin::TopicRecord,
    ) -> Result<(), ServiceError> {
        let base = topic.base();
        let served: Vec<Arc<Topic>> = self
            .topics
            .lock()
            .values()
            .filter_map(|c| c.get().cloned())
            .filter(|t| t.name.base() == base)
            .collect();
        if served.is_empty() {
            return Ok(());
        }
        let policies = self.namespace_policies_of(topic).await?;
        for served in served {
            self.apply_to(&served, &policies, record.clone());
        }
        Ok(())
    }

    fn apply_to(
        &self,
        topic: &Topic,
        policies: &NamespacePolicies,
        record: crate::admin::TopicRecord,
    ) {
        let resolved = TopicPolicies::resolve(policies, &record, &self.dynamic_policies());
        let persistence = resolved.persistence.map_or(
            self.config.default_persistence,
            |(ensemble, write_quorum, ack_quorum)| crate::config::PersistenceConfig {
                ensemble,
                write_quorum,
                ack_quorum,
            },
        );
        topic.log.set_retention(resolved.retention);
        topic
            .log
            .set_offload_policy(resolved.offload_policy(self.config.offload_policy));
        let resolved = self
            .shared_policies
            .share(&topic.name.namespace, &record, resolved);
        topic.set_policy_record(record);
        topic.set_lifecycle_policies(resolved);
        let result = topic.log.set_persistence(Persistence {
            ensemble: persistence.ensemble,
            write_quorum: persistence.write_quorum,
            ack_quorum: persistence.ack_quorum,
        });
        if let Err(error) = result {
            tracing::warn!(topic = %topic.full_name, %error, "persistence not applied");
        }
    }
}
