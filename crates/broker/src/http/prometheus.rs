//! `/metrics`: the Prometheus text format (version 0.0.4), written by hand.
//!
//! Why by hand rather than with `prometheus-client`: every value here is a
//! snapshot taken at scrape time (topics come and go, counters live in the
//! topics and subscriptions), and Pulsar's names do not follow that crate's
//! conventions (gauges per latency bucket such as
//! `pulsar_storage_write_latency_le_0_5`, latencies in ms, counters whose
//! `_total` the crate would add again). Writing the format directly is ~150
//! lines; the Python test parses it with the reference parser.
//!
//! Families: broker-wide (`pulsar_active_connections`,
//! `pulsar_broker_publish_latency` summary in ms, `pulsar_broker_topics_count`,
//! `vela_send_errors_total`, `vela_write_path_latency_seconds` histogram with
//! `stage` and `instance` labels), the transaction coordinators'
//! (`pulsar_txn_active_count`, `..._created_count`, `..._committed_count`,
//! `..._aborted_count`, `..._timeout_count`, `..._append_log_count` with a
//! `coordinator_id` label), the memory budgets
//! (`pulsar_ml_cache_used_size`, `vela_entry_cache_*`,
//! `vela_publish_buffer_available_bytes`, `vela_subscription_held_entries`,
//! `vela_runtime_alive_tasks`),
//! the storage families of the registered
//! sources (`vela_corrupt_reads_total`, `vela_bookie_mode`,
//! `vela_bookie_disk_usage_ratio`, ...: `metrics::StorageFamily`), then per
//! topic with Pulsar's names and `cluster`/`namespace`/`topic` labels (the
//! transaction buffer's `pulsar_txn_tb_{active,aborted,committed}_total`
//! among them), then per subscription.
//! Never: holds a lock while formatting, or panics on odd topic names
//! (label values are escaped).

use std::fmt::Write as _;

use vela_metrics::Snapshot;

use crate::metrics::{PULSAR_LATENCY_BUCKETS, StorageFamily, StorageMetric, pulsar_buckets};
use crate::service::Service;
use crate::stats::TopicStats;
use crate::topic_name::TopicName;

/// Bucket bounds (µs) of the write-path histograms in `/metrics`: a 1-2-5
/// series from 10 µs to 10 s (every bound is a histogram bound, so counts
/// are exact).
const STAGE_EXPORT_BOUNDS_US: [u64; 19] = [
    10, 20, 50, 100, 200, 500, 1_000, 2_000, 5_000, 10_000, 20_000, 50_000, 100_000, 200_000,
    500_000, 1_000_000, 2_000_000, 5_000_000, 10_000_000,
];

/// Quantiles of `pulsar_broker_publish_latency` (as Pulsar's summary).
const SUMMARY_QUANTILES: [f64; 7] = [0.0, 0.5, 0.95, 0.99, 0.999, 0.9999, 1.0];

fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str("\\\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str("\\n"),
            c => out.push(c),
        }
    }
    out
}

fn labels(pairs: &[(&str, &str)]) -> String {
    let inner: Vec<String> = pairs
        .iter()
        .map(|(k, v)| format!("{k}=\"{}\"", escape(v)))
        .collect();
    format!("{{{}}}", inner.join(","))
}

fn number(value: f64) -> String {
    if value.is_finite() {
        format!("{value}")
    } else {
        "NaN".to_string()
    }
}

struct Writer {
    out: String,
}

impl Writer {
    fn family(&mut self, name: &str, kind: &str, help: &str) {
        let _ = writeln!(self.out, "# HELP {name} {help}");
        let _ = writeln!(self.out, "# TYPE {name} {kind}");
    }

    fn sample(&mut self, name: &str, labels: &str, value: f64) {
        let _ = writeln!(self.out, "{name}{labels} {}", number(value));
    }
}

/// One topic's labels and stats.
struct TopicRow {
    labels: Vec<(String, String)>,
    stats: TopicStats,
}

impl TopicRow {
    fn labels(&self, extra: &[(&str, &str)]) -> String {
        let mut pairs: Vec<(&str, &str)> = self
            .labels
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        pairs.extend_from_slice(extra);
        labels(&pairs)
    }
}

/// The whole `/metrics` document.
pub(super) async fn render(service: &Service) -> String {
    let mut rows = Vec::new();
    for name in service.served_topics() {
        let stats = if let Some(topic) = service.served_topic(&name) {
            service.topic_stats(&topic).await
        } else if let Some(topic) = service.served_non_persistent(&name) {
            topic.stats()
        } else {
            continue;
        };
        let namespace = TopicName::parse(&name)
            .map(|t| t.namespace.to_string())
            .unwrap_or_default();
        rows.push(TopicRow {
            labels: vec![
                ("cluster".into(), service.config.cluster_name.clone()),
                ("namespace".into(), namespace),
                ("topic".into(), name),
            ],
            stats,
        });
    }
    let mut w = Writer { out: String::new() };
    broker_families(service, rows.len(), &mut w);
    transaction_families(service, &mut w);
    memory_families(service, &mut w);
    offload_families(service, &mut w);
    storage_families(
        &service.config.cluster_name,
        &service.storage_metrics(),
        &mut w,
    );
    topic_families(&rows, &mut w);
    drop_families(service, &rows, &mut w);
    w.out
}

/// Each open transaction coordinator's counts, with Pulsar's names (all
/// written as gauges, as Pulsar writes them) and a `coordinator_id` label.
fn transaction_families(service: &Service, w: &mut Writer) {
    let Some(transactions) = &service.transactions else {
        return;
    };
    if let Some(budget) = &service.txn_budget {
        let cluster = labels(&[("cluster", service.config.cluster_name.as_str())]);
        w.family(
            "vela_transaction_state_entries",
            "gauge",
            "Transaction state records held: open and aborted transactions of every topic, positions held by transactional acks.",
        );
        w.sample(
            "vela_transaction_state_entries",
            &cluster,
            budget.used() as f64,
        );
        w.family(
            "vela_transaction_state_entries_max",
            "gauge",
            "Their bound (--transaction-state-entries-max).",
        );
        w.sample(
            "vela_transaction_state_entries_max",
            &cluster,
            budget.max() as f64,
        );
    }
    let stats = transactions.stats();
    if stats.is_empty() {
        return;
    }
    type Field = fn(&crate::transaction::CoordinatorStats) -> u64;
    let families: [(&str, &str, Field); 6] = [
        (
            "pulsar_txn_active_count",
            "Transactions not yet ended.",
            |s| s.active,
        ),
        ("pulsar_txn_created_count", "Transactions opened.", |s| {
            s.created
        }),
        (
            "pulsar_txn_committed_count",
            "Transactions committed.",
            |s| s.committed,
        ),
        (
            "pulsar_txn_aborted_count",
            "Transactions aborted (timed-out ones included).",
            |s| s.aborted,
        ),
        (
            "pulsar_txn_timeout_count",
            "Transactions aborted by their timeout.",
            |s| s.timed_out,
        ),
        (
            "pulsar_txn_append_log_count",
            "Records written to the transaction log.",
            |s| s.appended,
        ),
    ];
    for (name, help, field) in families {
        w.family(name, "gauge", help);
        for coordinator in &stats {
            let id = coordinator.id.to_string();
            let l = labels(&[
                ("cluster", service.config.cluster_name.as_str()),
                ("coordinator_id", &id),
            ]);
            w.sample(name, &l, field(coordinator) as f64);
        }
    }
}

/// The broker-wide memory budgets: the entry cache (Pulsar's
/// `pulsar_ml_cache_*` names where they exist) and the publish buffer.
fn memory_families(service: &Service, w: &mut Writer) {
    let cluster = labels(&[("cluster", service.config.cluster_name.as_str())]);
    let cache = service.log_env.cache().stats();
    let budget = service.log_env.append_budget();
    let held = &service.held_entries;
    // Every task of the process's runtime (broker, ledger client, bookies in
    // a standalone): the tasks an idle topic keeps parked show here
    // (ARCHITECTURE.md, "Memory model"; crates/vela/tests/idle_topics.rs).
    let alive_tasks = tokio::runtime::Handle::try_current()
        .map_or(0, |runtime| runtime.metrics().num_alive_tasks());
    let gauges: [(&str, &str, &str, f64); 12] = [
        (
            "pulsar_ml_cache_used_size",
            "gauge",
            "Bytes held by the entry cache over all topics (payloads and per-entry overhead).",
            cache.used_bytes as f64,
        ),
        (
            "vela_entry_cache_budget_bytes",
            "gauge",
            "The entry cache's budget (--managed-ledger-cache-size-mb).",
            cache.budget_bytes as f64,
        ),
        (
            "vela_entry_cache_entries",
            "gauge",
            "Entries held by the entry cache.",
            cache.entries as f64,
        ),
        (
            "vela_entry_cache_hits_total",
            "counter",
            "Entries read from the entry cache.",
            cache.hits_total as f64,
        ),
        (
            "vela_entry_cache_misses_total",
            "counter",
            "Entries read from the bookies.",
            cache.misses_total as f64,
        ),
        (
            "vela_entry_cache_insert_skipped_total",
            "counter",
            "Entries not cached because the budget had no room.",
            cache.insert_skipped_total as f64,
        ),
        (
            "vela_entry_cache_evicted_passed_total",
            "counter",
            "Entries evicted after every active reader had read them.",
            cache.evicted_passed_total as f64,
        ),
        (
            "vela_entry_cache_evicted_unread_total",
            "counter",
            "Entries evicted (oldest first) before an active reader read them.",
            cache.evicted_unread_total as f64,
        ),
        (
            "vela_publish_buffer_available_bytes",
            "gauge",
            "Free bytes of the publish buffer (--max-message-publish-buffer-mb).",
            budget.available_bytes() as f64,
        ),
        (
            "vela_subscription_held_entries",
            "gauge",
            "Entries all subscriptions hold (delivered and unacknowledged, to redeliver, delayed).",
            held.held() as f64,
        ),
        (
            "vela_subscription_held_entries_max",
            "gauge",
            "The bound of vela_subscription_held_entries (--max-unacked-entries-per-broker).",
            held.max() as f64,
        ),
        (
            "vela_runtime_alive_tasks",
            "gauge",
            "Tasks alive on the process's async runtime.",
            alive_tasks as f64,
        ),
    ];
    for (name, kind, help, value) in gauges {
        w.family(name, kind, help);
        w.sample(name, &cluster, value);
    }
}

/// Tiered storage (only with an offloader): what was offloaded and read
/// back, failures, and the latency of reads from object storage.
fn offload_families(service: &Service, w: &mut Writer) {
    let Some(offloader) = service.log_env.offloader() else {
        return;
    };
    let cluster = labels(&[("cluster", service.config.cluster_name.as_str())]);
    let c = offloader.counters();
    let counters: [(&str, &str, u64); 6] = [
        (
            "vela_offload_offloaded_bytes_total",
            "Bytes of objects written by completed ledger offloads.",
            c.offloaded_bytes,
        ),
        (
            "vela_offload_offloaded_ledgers_total",
            "Ledgers offloaded to object storage.",
            c.offloaded_ledgers,
        ),
        (
            "vela_offload_errors_total",
            "Ledger offload attempts that failed (retried or not).",
            c.offload_errors,
        ),
        (
            "vela_offload_read_errors_total",
            "Reads from object storage that failed (store unreachable, object missing or corrupt).",
            c.read_errors,
        ),
        (
            "vela_offload_read_entries_total",
            "Entries read from object storage.",
            c.read_entries,
        ),
        (
            "vela_offload_read_bytes_total",
            "Payload bytes read from object storage.",
            c.read_bytes,
        ),
    ];
    for (name, help, value) in counters {
        w.family(name, "counter", help);
        w.sample(name, &cluster, value as f64);
    }
    let name = "vela_offload_read_latency_seconds";
    w.family(
        name,
        "summary",
        "Latency of reads from object storage (index fetch included).",
    );
    w.sample(
        &format!("{name}_sum"),
        &cluster,
        c.read_latency_us_total as f64 / 1e6,
    );
    w.sample(&format!("{name}_count"), &cluster, c.reads as f64);
}

/// The storage metrics, one family block each (header once, then samples).
fn storage_families(cluster: &str, metrics: &[StorageMetric], w: &mut Writer) {
    for family in StorageFamily::ALL {
        let mut samples = metrics.iter().filter(|m| m.family == family).peekable();
        if samples.peek().is_none() {
            continue;
        }
        w.family(family.name(), family.kind(), family.help());
        for metric in samples {
            let mut pairs = vec![("cluster", cluster), ("instance", metric.instance.as_str())];
            if let Some((key, value)) = &metric.label {
                pairs.push((key, value.as_str()));
            }
            w.sample(family.name(), &labels(&pairs), metric.value);
        }
    }
}

fn broker_families(service: &Service, topics: usize, w: &mut Writer) {
    let cluster = labels(&[("cluster", service.config.cluster_name.as_str())]);
    let snapshot = service.metrics.snapshot();
    w.family(
        "pulsar_active_connections",
        "gauge",
        "Open client connections.",
    );
    w.sample(
        "pulsar_active_connections",
        &cluster,
        snapshot.active_connections as f64,
    );
    w.family(
        "pulsar_broker_topics_count",
        "gauge",
        "Topics served by this broker.",
    );
    w.sample("pulsar_broker_topics_count", &cluster, topics as f64);
    w.family(
        "vela_send_errors_total",
        "counter",
        "SEND_ERRORs answered (checksum, persistence failures).",
    );
    w.sample(
        "vela_send_errors_total",
        &cluster,
        snapshot.send_errors as f64,
    );

    let publish = &snapshot.publish_latency;
    w.family(
        "pulsar_broker_publish_latency",
        "summary",
        "Broker publish latency in ms (SEND received to receipt queued).",
    );
    for q in SUMMARY_QUANTILES {
        let value = publish.quantile(q);
        let quantile = format!("{q}");
        let l = labels(&[
            ("cluster", service.config.cluster_name.as_str()),
            ("quantile", &quantile),
        ]);
        w.sample("pulsar_broker_publish_latency", &l, value / 1000.0);
    }
    w.sample(
        "pulsar_broker_publish_latency_count",
        &cluster,
        publish.count as f64,
    );
    w.sample(
        "pulsar_broker_publish_latency_sum",
        &cluster,
        publish.sum as f64 / 1000.0,
    );

    let stages = service.write_path();
    let (read, write): (Vec<_>, Vec<_>) = stages.into_iter().partition(|s| s.stage.is_read());
    stage_family(
        "vela_write_path_latency_seconds",
        "Latency of each write-path stage (journal stages: per group or per fdatasync).",
        &write,
        w,
    );
    stage_family(
        "vela_read_path_latency_seconds",
        "Latency of each read-path stage (dispatcher: per read or per wait; ledger and bookie: per entry).",
        &read,
        w,
    );
}

/// One histogram family of stage latencies.
fn stage_family(name: &str, help: &str, stages: &[crate::metrics::StageLatency], w: &mut Writer) {
    w.family(name, "histogram", help);
    for stage in stages {
        let stage_name = stage.stage.as_str();
        let instance = stage.instance.as_str();
        for bound in STAGE_EXPORT_BOUNDS_US {
            let le = number(bound as f64 / 1e6);
            let l = labels(&[("stage", stage_name), ("instance", instance), ("le", &le)]);
            w.sample(
                &format!("{name}_bucket"),
                &l,
                stage.latency.count_le(bound) as f64,
            );
        }
        let l = labels(&[
            ("stage", stage_name),
            ("instance", instance),
            ("le", "+Inf"),
        ]);
        w.sample(&format!("{name}_bucket"), &l, stage.latency.count as f64);
        let l = labels(&[("stage", stage_name), ("instance", instance)]);
        w.sample(&format!("{name}_sum"), &l, stage.latency.sum as f64 / 1e6);
        w.sample(&format!("{name}_count"), &l, stage.latency.count as f64);
    }
}

type Getter = fn(&TopicStats) -> f64;

fn topic_families(rows: &[TopicRow], w: &mut Writer) {
    let gauges: [(&str, &str, &str, Getter); 15] = [
        (
            "pulsar_rate_in",
            "gauge",
            "Messages published per second.",
            |s| s.msg_rate_in,
        ),
        (
            "pulsar_rate_out",
            "gauge",
            "Messages delivered per second.",
            |s| s.msg_rate_out,
        ),
        (
            "pulsar_throughput_in",
            "gauge",
            "Bytes published per second.",
            |s| s.msg_throughput_in,
        ),
        (
            "pulsar_throughput_out",
            "gauge",
            "Bytes delivered per second.",
            |s| s.msg_throughput_out,
        ),
        (
            "pulsar_in_messages_total",
            "counter",
            "Messages published.",
            |s| s.msg_in_counter as f64,
        ),
        (
            "pulsar_in_bytes_total",
            "counter",
            "Bytes published.",
            |s| s.bytes_in_counter as f64,
        ),
        (
            "pulsar_out_messages_total",
            "counter",
            "Messages delivered.",
            |s| s.msg_out_counter as f64,
        ),
        (
            "pulsar_out_bytes_total",
            "counter",
            "Bytes delivered.",
            |s| s.bytes_out_counter as f64,
        ),
        (
            "pulsar_storage_size",
            "gauge",
            "Bytes held by the topic's log.",
            |s| s.storage_size_bytes as f64,
        ),
        (
            "pulsar_msg_backlog",
            "gauge",
            "Entries not acknowledged, summed over subscriptions.",
            |s| s.subscriptions.iter().map(|x| x.msg_backlog).sum::<u64>() as f64,
        ),
        (
            "pulsar_producers_count",
            "gauge",
            "Producers attached.",
            |s| s.publishers.len() as f64,
        ),
        (
            "pulsar_subscriptions_count",
            "gauge",
            "Subscriptions.",
            |s| s.subscriptions.len() as f64,
        ),
        // The transaction buffer's counts, gauges as Pulsar types them.
        (
            "pulsar_txn_tb_active_total",
            "gauge",
            "Transactions open on the topic.",
            |s| s.ongoing_txn_count as f64,
        ),
        (
            "pulsar_txn_tb_aborted_total",
            "gauge",
            "Transactions aborted on the topic since it was loaded.",
            |s| s.aborted_txn_count as f64,
        ),
        (
            "pulsar_txn_tb_committed_total",
            "gauge",
            "Transactions committed on the topic since it was loaded.",
            |s| s.committed_txn_count as f64,
        ),
    ];
    for (name, kind, help, get) in gauges {
        w.family(name, kind, help);
        for row in rows {
            w.sample(name, &row.labels(&[]), get(&row.stats));
        }
    }
    w.family("pulsar_consumers_count", "gauge", "Consumers attached.");
    for row in rows {
        let consumers: usize = row
            .stats
            .subscriptions
            .iter()
            .map(|s| s.consumers.len())
            .sum();
        w.sample("pulsar_consumers_count", &row.labels(&[]), consumers as f64);
    }
    storage_write_latency(rows, w);
    subscription_families(rows, w);
    replication_families(rows, w);
}

/// Each replicator of each topic, with Pulsar's `pulsar_replication_*`
/// names and a `remote_cluster` label.
fn replication_families(rows: &[TopicRow], w: &mut Writer) {
    type Get = fn(&crate::stats::ReplicationStats) -> f64;
    let families: [(&str, &str, Get); 7] = [
        (
            "pulsar_replication_rate_out",
            "Messages replicated to the remote cluster per second.",
            |r| r.msg_rate_out,
        ),
        (
            "pulsar_replication_throughput_out",
            "Bytes replicated to the remote cluster per second.",
            |r| r.msg_throughput_out,
        ),
        (
            "pulsar_replication_backlog",
            "Entries not yet replicated to the remote cluster.",
            |r| r.backlog as f64,
        ),
        (
            "pulsar_replication_connected_count",
            "1 while the replicator's producer on the remote cluster is open.",
            |r| f64::from(u8::from(r.connected)),
        ),
        (
            "pulsar_replication_delay_in_seconds",
            "Age of the last entry the remote cluster stored, while a backlog remains.",
            |r| r.delay_seconds as f64,
        ),
        (
            "pulsar_replication_rate_in",
            "Messages replicated from the remote cluster per second.",
            |r| r.msg_rate_in,
        ),
        (
            "pulsar_replication_throughput_in",
            "Bytes replicated from the remote cluster per second.",
            |r| r.msg_throughput_in,
        ),
    ];
    for (name, help, get) in families {
        if rows.iter().all(|row| row.stats.replication.is_empty()) {
            return;
        }
        w.family(name, "gauge", help);
        for row in rows {
            for replication in &row.stats.replication {
                let labels = row.labels(&[("remote_cluster", &replication.remote_cluster)]);
                w.sample(name, &labels, get(replication));
            }
        }
    }
}

fn storage_write_latency(rows: &[TopicRow], w: &mut Writer) {
    let per_row: Vec<[u64; PULSAR_LATENCY_BUCKETS.len() + 1]> = rows
        .iter()
        .map(|r| pulsar_buckets(&r.stats.storage_write_latency))
        .collect();
    let suffixes = PULSAR_LATENCY_BUCKETS
        .iter()
        .map(|(_, suffix)| *suffix)
        .chain(std::iter::once("overflow"));
    for (index, suffix) in suffixes.enumerate() {
        let name = format!("pulsar_storage_write_latency_le_{suffix}");
        w.family(
            &name,
            "gauge",
            "Entries whose storage write took at most this many ms.",
        );
        for (row, buckets) in rows.iter().zip(&per_row) {
            w.sample(&name, &row.labels(&[]), buckets[index] as f64);
        }
    }
    let latency = |row: &TopicRow| -> Snapshot { row.stats.storage_write_latency };
    w.family(
        "pulsar_storage_write_latency_count",
        "gauge",
        "Storage writes.",
    );
    for row in rows {
        w.sample(
            "pulsar_storage_write_latency_count",
            &row.labels(&[]),
            latency(row).count as f64,
        );
    }
    w.family(
        "pulsar_storage_write_latency_sum",
        "gauge",
        "Total storage write time, ms.",
    );
    for row in rows {
        let sum_ms = latency(row).sum as f64 / 1000.0;
        w.sample("pulsar_storage_write_latency_sum", &row.labels(&[]), sum_ms);
    }
}

/// Non-persistent topics: messages dropped (Pulsar's
/// `pulsar_subscription_msg_drop_rate`, and Vela's counters) and the bytes
/// in flight broker-wide.
fn drop_families(service: &Service, rows: &[TopicRow], w: &mut Writer) {
    let cluster = labels(&[("cluster", service.config.cluster_name.as_str())]);
    let name = "vela_non_persistent_inflight_bytes";
    w.family(
        name,
        "gauge",
        "Bytes of non-persistent messages handed to connections, not yet written.",
    );
    w.sample(name, &cluster, service.np_budget.used_bytes() as f64);
    let name = "vela_non_persistent_dropped_messages_total";
    w.family(
        name,
        "counter",
        "Non-persistent messages dropped as they arrived (in-flight bytes full).",
    );
    for row in rows.iter().filter(|r| r.stats.msg_drop_rate.is_some()) {
        w.sample(name, &row.labels(&[]), row.stats.msg_drop_counter as f64);
    }
    let dropping = |row: &&TopicRow| row.stats.msg_drop_rate.is_some();
    let name = "pulsar_subscription_msg_drop_rate";
    w.family(
        name,
        "gauge",
        "Non-persistent messages no consumer could take, per second.",
    );
    for row in rows.iter().filter(dropping) {
        for sub in &row.stats.subscriptions {
            let l = row.labels(&[("subscription", sub.name.as_str())]);
            w.sample(name, &l, sub.msg_drop_rate.unwrap_or(0.0));
        }
    }
    let name = "vela_subscription_dropped_messages_total";
    w.family(
        name,
        "counter",
        "Non-persistent messages no consumer could take.",
    );
    for row in rows.iter().filter(dropping) {
        for sub in &row.stats.subscriptions {
            let l = row.labels(&[("subscription", sub.name.as_str())]);
            w.sample(name, &l, sub.msg_drop_counter as f64);
        }
    }
}

fn subscription_families(rows: &[TopicRow], w: &mut Writer) {
    type SubGetter = fn(&crate::stats::SubscriptionStats) -> f64;
    let families: [(&str, &str, SubGetter); 5] = [
        (
            "pulsar_subscription_back_log",
            "Entries not acknowledged.",
            |s| s.msg_backlog as f64,
        ),
        (
            "pulsar_subscription_unacked_messages",
            "Entries delivered, not acknowledged.",
            |s| s.unacked_messages as f64,
        ),
        (
            "pulsar_subscription_msg_rate_out",
            "Messages delivered per second.",
            |s| s.msg_rate_out,
        ),
        (
            "pulsar_subscription_msg_throughput_out",
            "Bytes delivered per second.",
            |s| s.msg_throughput_out,
        ),
        (
            "pulsar_subscription_msg_rate_redeliver",
            "Entries redelivered per second.",
            |s| s.msg_rate_redeliver,
        ),
    ];
    for (name, help, get) in families {
        w.family(name, "gauge", help);
        for row in rows {
            for sub in &row.stats.subscriptions {
                let l = row.labels(&[("subscription", sub.name.as_str())]);
                w.sample(name, &l, get(sub));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn label_values_are_escaped() {
        assert_eq!(
            labels(&[("topic", "a\"b\\c\nd")]),
            "{topic=\"a\\\"b\\\\c\\nd\"}"
        );
    }

    #[test]
    fn storage_families_have_one_header_and_every_sample() {
        let metric =
            |family, instance: &str, label: Option<(&'static str, &str)>, value| StorageMetric {
                family,
                instance: instance.to_string(),
                label: label.map(|(k, v)| (k, v.to_string())),
                value,
            };
        let metrics = [
            metric(StorageFamily::CorruptReads, "ledger-client", None, 2.0),
            metric(
                StorageFamily::BookieMode,
                "b0",
                Some(("mode", "read_only")),
                1.0,
            ),
            metric(StorageFamily::CorruptReads, "b0", None, 1.0),
        ];
        let mut w = Writer { out: String::new() };
        storage_families("standalone", &metrics, &mut w);
        assert_eq!(
            w.out
                .matches("# TYPE vela_corrupt_reads_total counter")
                .count(),
            1
        );
        assert!(
            w.out.contains(
                "vela_corrupt_reads_total{cluster=\"standalone\",instance=\"ledger-client\"} 2\n"
            ),
            "{}",
            w.out
        );
        assert!(
            w.out
                .contains("vela_corrupt_reads_total{cluster=\"standalone\",instance=\"b0\"} 1\n")
        );
        assert!(w.out.contains(
            "vela_bookie_mode{cluster=\"standalone\",instance=\"b0\",mode=\"read_only\"} 1\n"
        ));
        assert!(!w.out.contains("vela_bookie_disk_usage_ratio"));
    }

    #[test]
    fn export_bounds_are_histogram_bounds() {
        for bound in STAGE_EXPORT_BOUNDS_US {
            assert!(vela_metrics::BUCKET_BOUNDS.contains(&bound), "{bound}");
        }
    }
}
