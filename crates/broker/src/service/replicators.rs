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

    /// `replication_remotes` from the topic's record and its namespace's
    /// policies as already read (a topic open has both: two reads fewer).
    pub(crate) fn replication_remotes_of(
        &self,
        record: &crate::admin::TopicRecord,
        namespace: &crate::admin::NamespacePolicies,
    ) -> Vec<String> {
        let local = &self.config.cluster_name;
        let mut clusters = crate::admin::clusters::replication_of(record, Some(namespace), local);
        clusters.retain(|c| c != local);
        clusters
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
        with_replication_rates(&mut stats);
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

/// As Pulsar's `PersistentTopic.asyncGetStats`: each replicator's entry
/// gets what the remote's replicator publishes here (its producer, among
/// the publishers, `pulsar.repl.{remote}-->{local}`: `msgRateIn`,
/// `msgThroughputIn`, `inboundConnection`), and the topic's out-rates
/// count what the replicators send.
fn with_replication_rates(stats: &mut TopicStats) {
    for replication in &mut stats.replication {
        let inbound = stats.publishers.iter().find(|p| {
            crate::topic::replicator_source(&p.producer_name)
                == Some(replication.remote_cluster.as_str())
        });
        if let Some(publisher) = inbound {
            replication.msg_rate_in = publisher.msg_rate_in;
            replication.msg_throughput_in = publisher.msg_throughput_in;
            replication.msg_in_counter = publisher.msg_in_counter;
            replication.bytes_in_counter = publisher.bytes_in_counter;
            replication.inbound_connection = Some(publisher.address.clone());
        }
        stats.msg_rate_out += replication.msg_rate_out;
        stats.msg_throughput_out += replication.msg_throughput_out;
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::stats::{PublisherStats, ReplicationStats};

    #[test]
    fn the_remotes_replicator_fills_the_in_rates_of_its_cluster() {
        let publisher = |name: &str, rate: f64| PublisherStats {
            producer_name: name.to_string(),
            msg_rate_in: rate,
            msg_throughput_in: rate * 1024.0,
            msg_in_counter: 7,
            bytes_in_counter: 7168,
            address: format!("{name}-address"),
            ..PublisherStats::default()
        };
        let replication = |remote: &str| ReplicationStats {
            remote_cluster: remote.to_string(),
            msg_rate_out: 3.0,
            msg_throughput_out: 300.0,
            ..ReplicationStats::default()
        };
        let mut stats = TopicStats {
            msg_rate_out: 1.0,
            msg_throughput_out: 100.0,
            publishers: vec![publisher("app", 5.0), publisher("pulsar.repl.a-->b", 9.0)],
            replication: vec![replication("a"), replication("c")],
            ..TopicStats::default()
        };
        with_replication_rates(&mut stats);
        let (a, c) = (&stats.replication[0], &stats.replication[1]);
        assert_eq!((a.msg_rate_in, a.msg_throughput_in), (9.0, 9.0 * 1024.0));
        assert_eq!((a.msg_in_counter, a.bytes_in_counter), (7, 7168));
        assert_eq!(
            a.inbound_connection.as_deref(),
            Some("pulsar.repl.a-->b-address")
        );
        assert_eq!(
            (c.msg_rate_in, c.inbound_connection.as_deref()),
            (0.0, None)
        );
        assert_eq!(stats.msg_rate_out, 7.0);
        assert_eq!(stats.msg_throughput_out, 700.0);
    }
}
