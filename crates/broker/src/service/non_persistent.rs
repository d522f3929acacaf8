//! Non-persistent topics as the service serves them: created in place
//! (nothing to open) under the same rules as persistent ones, listed, and
//! dropped by the lifecycle pass once nobody uses them.
//!
//! Owns nothing of its own: the map is `Service::np_topics`. Never: touches
//! a log or the metadata store's topic records (nothing is stored).

use std::sync::Arc;

use vela_wire::proto::ServerError;

use super::Service;
use crate::error::ServiceError;
use crate::nonpersistent::NonPersistentTopic;
use crate::topic_name::{TopicDomain, TopicName};

impl Service {
    /// The served non-persistent topic for `topic`, created in place (there
    /// is nothing to open) when `create`, auto-creation or its partitioned
    /// metadata allows. Served under the same rules as persistent topics:
    /// namespace, bundle ownership, partition range, `BrokerConfig::topics_max`.
    pub(crate) async fn non_persistent_topic(
        &self,
        topic: &TopicName,
        create: bool,
    ) -> Result<Arc<NonPersistentTopic>, ServiceError> {
        debug_assert_eq!(topic.domain, TopicDomain::NonPersistent);
        let full_name = topic.to_string();
        if let Some(served) = self.np_topics.lock().get(&full_name)
            && !served.is_closed()
        {
            return Ok(Arc::clone(served));
        }
        self.namespace_policies_of(topic).await?;
        let partitions = self.check_servable(topic).await?;
        let partition_of_metadata = topic.partition.is_some() && partitions.is_some();
        let may_create = create && self.config.auto_create_topics;
        if !(partition_of_metadata || may_create) {
            return Err(ServiceError::new(
                ServerError::TopicNotFound,
                format!("Topic {topic} not found"),
            ));
        }
        let persistent = self.topics.lock().len();
        let mut served = self.np_topics.lock();
        if let Some(existing) = served.get(&full_name)
            && !existing.is_closed()
        {
            return Ok(Arc::clone(existing));
        }
        if persistent + served.len() >= self.config.topics_max {
            return Err(super::topics_max_reached(self.config.topics_max));
        }
        let created = NonPersistentTopic::new(
            topic.clone(),
            self.config.topic_limits,
            self.config.non_persistent_limits.topic_inflight_bytes_max,
            Arc::clone(&self.np_budget),
        );
        served.insert(full_name.clone(), Arc::clone(&created));
        tracing::info!(topic = %full_name, "non-persistent topic created");
        Ok(created)
    }

    /// The non-persistent topic if it is served now.
    pub(crate) fn served_non_persistent(&self, full_name: &str) -> Option<Arc<NonPersistentTopic>> {
        self.np_topics
            .lock()
            .get(full_name)
            .filter(|t| !t.is_closed())
            .cloned()
    }

    /// Full names of the non-persistent topics of `ns` served now, sorted;
    /// with `active_only` only those with producers or subscriptions
    /// (what Pulsar's GET_TOPICS_OF_NAMESPACE lists).
    pub(crate) fn non_persistent_topics_of(
        &self,
        ns: &crate::topic_name::NamespaceName,
        active_only: bool,
    ) -> Vec<String> {
        let mut names: Vec<String> = self
            .np_topics
            .lock()
            .values()
            .filter(|t| &t.name.namespace == ns && !t.is_closed())
            .filter(|t| !active_only || t.is_active())
            .map(|t| t.full_name.clone())
            .collect();
        names.sort();
        names
    }

    /// Closes and forgets the non-persistent topics nobody uses (no
    /// producer, no consumer): the lifecycle pass's garbage collection, as
    /// Pulsar deletes inactive topics. Their subscriptions go with them.
    pub(crate) async fn drop_idle_non_persistent_topics(&self) {
        let idle: Vec<Arc<NonPersistentTopic>> = {
            let mut served = self.np_topics.lock();
            let names: Vec<String> = served
                .iter()
                .filter(|(_, t)| t.is_closed() || !t.has_clients())
                .map(|(name, _)| name.clone())
                .collect();
            names.iter().filter_map(|n| served.remove(n)).collect()
        };
        for topic in idle {
            topic.close().await;
            tracing::debug!(topic = %topic.full_name, "idle non-persistent topic dropped");
        }
    }
}
