//! The service's side of geo-replication: waking the reconciler
//! (`replication`), the remote clusters a topic replicates to, and the
//! running replicators' statistics (topic stats, metrics).
//!
//! Owns nothing of its own: `Service::replicators` and the wakeup are the
//! service's fields. Never: starts or stops a replicator (the reconciler
//! does).

use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::Service;
use crate::stats::{ReplicatorStats, TopicStats};
use crate::topic::Topic;
use crate::topic_name::TopicName;

impl Service {
    /// Clusters or replication clusters changed: the replicators follow at
    /// once (else within the reconciler's interval).
    pub(crate) fn replication_changed(&self) {
        self.replication_full_pass.store(true, Ordering::Release);
        self.replication_wakeup.notify_one();
    }

    /// The remote clusters `topic` replicates to: its replication clusters
    /// (its own, else its namespace's) but this one.
    pub(crate) async fn replication_remotes(
        &self,
        topic: &TopicName,
    ) -> Result<Vec<String>, crate::admin::AdminError> {
        let local = &self.config.cluster_name;
        let mut clusters = self.admin.effective_replication(topic, local).await?;
        clusters.retain(|c| c != local);
        Ok(clusters)
    }

    /// Records a running replicator's statistics (topic stats, metrics).
    pub(crate) fn register_replicator(
        &self,
        topic: &str,
        remote: &str,
        stats: Arc<ReplicatorStats>,
    ) {
        self.replicators
            .lock()
            .insert((topic.to_string(), remote.to_string()), stats);
    }

    /// Keeps the statistics of the replicators `running` says still run.
    pub(crate) fn retain_replicators(&self, running: impl Fn(&str, &str) -> bool) {
        self.replicators
            .lock()
            .retain(|(topic, remote), _| running(topic, remote));
    }

    /// A served topic's statistics with its replicators'.
    pub(crate) async fn topic_stats(&self, topic: &Topic) -> TopicStats {
        let mut stats = topic.stats().await;
        stats.replication = self
            .replicators_of(&topic.full_name)
            .iter()
            .map(|(remote, replicator)| replicator.snapshot(remote))
            .collect();
        stats
    }

    /// The replicators of `topic`: (remote cluster, statistics), by remote.
    pub(crate) fn replicators_of(&self, topic: &str) -> Vec<(String, Arc<ReplicatorStats>)> {
        let mut found: Vec<(String, Arc<ReplicatorStats>)> = self
            .replicators
            .lock()
            .iter()
            .filter(|((t, _), _)| t == topic)
            .map(|((_, remote), stats)| (remote.clone(), Arc::clone(stats)))
            .collect();
        found.sort_by(|a, b| a.0.cmp(&b.0));
        found
    }
}
