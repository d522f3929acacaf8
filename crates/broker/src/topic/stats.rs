//! A topic's statistics snapshot (admin stats, `/metrics`, load reports)
//! and whether clients are attached.
//!
//! Owns: these `Topic` methods and the topic's rate meter. Never: blocks a
//! connection: a snapshot asks each subscription task once.

use vela_log::Position;

use super::Topic;
use crate::stats::{SubscriptionStats, TopicStats};

impl Topic {
    /// Messages published to this topic since it opened (for load reports).
    pub(crate) fn msg_in_total(&self) -> u64 {
        self.publisher.msg_in()
    }

    /// True while producers or consumers are attached.
    pub(crate) async fn has_clients(&self) -> bool {
        if !self.producers.is_empty() {
            return true;
        }
        let stats = self.stats().await;
        stats.subscriptions.iter().any(|s| !s.consumers.is_empty())
    }

    /// A statistics snapshot (asks every subscription task once).
    pub(crate) async fn stats(&self) -> TopicStats {
        let publishers = self.producers.publishers();
        let mut subscriptions = self.subscriptions.stats().await;
        // Durable subscriptions without consumers have no task: their
        // cursor still holds a backlog.
        for name in self.log.cursor_names() {
            // Replicators' cursors are replication, not subscriptions.
            if subscriptions.iter().any(|s| s.name == name)
                || name.starts_with(super::dedup::REPLICATOR_PREFIX)
            {
                continue;
            }
            if let Some(cursor) = self.log.cursor(&name) {
                let mark_delete = cursor.mark_delete_position();
                subscriptions.push(SubscriptionStats {
                    name,
                    sub_type: "Exclusive".to_string(),
                    durable: true,
                    msg_backlog: cursor.backlog_entries(),
                    mark_delete,
                    read_position: Some(match mark_delete {
                        Some(md) => self.log.next_position(md),
                        None => self.log.first_position().unwrap_or(Position::new(0, 0)),
                    }),
                    ..Default::default()
                });
            }
        }
        subscriptions.sort_by(|a, b| a.name.cmp(&b.name));
        for subscription in &mut subscriptions {
            subscription.replicated = self.replicated.is_replicated(&subscription.name);
            if let Some(cursor) = self.log.cursor(&subscription.name) {
                subscription.cursor_properties = cursor.properties();
            }
        }
        let log = self.log.stats();
        let msg_in_counter = self.publisher.msg_in();
        let bytes_in_counter = self.publisher.bytes_in();
        let msg_out_counter = subscriptions.iter().map(|s| s.msg_out_counter).sum();
        let bytes_out_counter = subscriptions.iter().map(|s| s.bytes_out_counter).sum();
        let [
            msg_rate_in,
            msg_throughput_in,
            msg_rate_out,
            msg_throughput_out,
        ] = self.rates.lock().rates(
            std::time::Instant::now(),
            [
                msg_in_counter,
                bytes_in_counter,
                msg_out_counter,
                bytes_out_counter,
            ],
        );
        let (ongoing_txn_count, committed_txn_count, aborted_txn_count) = self
            .txn
            .as_deref()
            .map_or((0, 0, 0), |(buffer, _)| buffer.txn_counts());
        TopicStats {
            topic: self.full_name.to_string(),
            msg_in_counter,
            bytes_in_counter,
            msg_out_counter,
            bytes_out_counter,
            entries: log.entries,
            storage_size_bytes: log.size_bytes,
            ledgers: log.ledgers,
            msg_rate_in,
            msg_throughput_in,
            msg_rate_out,
            msg_throughput_out,
            deduplication_enabled: self.dedup.is_enabled(),
            publish_latency: self.metrics.publish_latency.snapshot(),
            storage_write_latency: self.metrics.storage_write_latency.snapshot(),
            publishers,
            subscriptions,
            msg_drop_rate: None,
            msg_drop_counter: 0,
            // The service adds its replicators (`Service::topic_stats`).
            replication: Vec::new(),
            ongoing_txn_count,
            committed_txn_count,
            aborted_txn_count,
        }
    }
}
