//! Point-in-time statistics of served topics, for the admin API and metrics.
//!
//! Owns: the public, plain-data shapes ([`TopicStats`], [`PublisherStats`],
//! [`SubscriptionStats`], [`ConsumerStats`]) and the [`RateMeter`] that turns
//! counters into rates. Counters are totals since the topic was opened on
//! this broker; rates are per second over the time since the previous
//! snapshot (at least [`RATE_WINDOW_MIN`]; a snapshot taken sooner repeats
//! the last rates). Never: serializes (the HTTP layer maps these to Pulsar's
//! JSON) or blocks a connection (a snapshot asks each subscription task once).

use std::time::{Duration, Instant};

use vela_log::Position;

use vela_metrics::Snapshot;

/// Shortest interval rates are computed over (two scrapes closer than this
/// share the same rates instead of dividing by a tiny interval).
pub const RATE_WINDOW_MIN: Duration = Duration::from_secs(1);

/// Per-second rates of `N` counters over the time between two reads.
#[derive(Debug, Clone)]
pub struct RateMeter<const N: usize> {
    last_at: Instant,
    last: [u64; N],
    rates: [f64; N],
}

impl<const N: usize> RateMeter<N> {
    /// A meter starting from these counter values now.
    pub fn new(counters: [u64; N]) -> RateMeter<N> {
        RateMeter {
            last_at: Instant::now(),
            last: counters,
            rates: [0.0; N],
        }
    }

    /// Rates since the previous read (recomputed when at least
    /// `RATE_WINDOW_MIN` passed, else the previous rates).
    pub fn rates(&mut self, now: Instant, counters: [u64; N]) -> [f64; N] {
        let elapsed = now.saturating_duration_since(self.last_at);
        if elapsed >= RATE_WINDOW_MIN {
            let seconds = elapsed.as_secs_f64();
            for ((rate, now), before) in self.rates.iter_mut().zip(counters).zip(self.last) {
                *rate = now.saturating_sub(before) as f64 / seconds;
            }
            self.last = counters;
            self.last_at = now;
        }
        self.rates
    }
}

/// One topic.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TopicStats {
    /// Full name (`persistent://t/ns/x`).
    pub topic: String,
    /// Messages published (a batch counts its messages).
    pub msg_in_counter: u64,
    /// Bytes of stored entries published.
    pub bytes_in_counter: u64,
    /// Messages delivered to consumers, all subscriptions.
    pub msg_out_counter: u64,
    /// Bytes of entries delivered, all subscriptions.
    pub bytes_out_counter: u64,
    /// Entries held by the log.
    pub entries: u64,
    /// Bytes held by the log (Pulsar's storageSize).
    pub storage_size_bytes: u64,
    /// Ledgers of the log.
    pub ledgers: usize,
    /// Messages published per second.
    pub msg_rate_in: f64,
    /// Bytes published per second.
    pub msg_throughput_in: f64,
    /// Messages delivered per second, all subscriptions.
    pub msg_rate_out: f64,
    /// Bytes delivered per second, all subscriptions.
    pub msg_throughput_out: f64,
    /// Producer deduplication is on.
    pub deduplication_enabled: bool,
    /// SEND received → receipt queued, on this topic.
    pub publish_latency: Snapshot,
    /// Append issued → durable, on this topic.
    pub storage_write_latency: Snapshot,
    /// Producers attached.
    pub publishers: Vec<PublisherStats>,
    /// Subscriptions, by name.
    pub subscriptions: Vec<SubscriptionStats>,
    /// Non-persistent topics: messages dropped as they arrived (the topic's
    /// or the broker's in-flight bytes full) per second; `None` for
    /// persistent topics.
    pub msg_drop_rate: Option<f64>,
    /// Non-persistent topics: messages dropped as they arrived, in all.
    pub msg_drop_counter: u64,
    /// Transactions with entries here not ended yet.
    pub ongoing_txn_count: u64,
    /// Transactions committed here since the topic opened.
    pub committed_txn_count: u64,
    /// Transactions aborted here since the topic opened.
    pub aborted_txn_count: u64,
    /// Replicators to remote clusters, by remote cluster.
    pub replication: Vec<ReplicationStats>,
}

/// One replicator in a topic's snapshot (Pulsar's `ReplicatorStats`):
/// what this broker sends to the remote cluster, and what the remote's
/// replicator brings here (its producer on this topic).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplicationStats {
    /// The remote cluster.
    pub remote_cluster: String,
    /// Messages the remote's replicator published here per second.
    pub msg_rate_in: f64,
    /// Bytes the remote's replicator published here per second.
    pub msg_throughput_in: f64,
    /// Messages the remote's replicator published here since it was
    /// admitted.
    pub msg_in_counter: u64,
    /// Bytes the remote's replicator published here since it was admitted.
    pub bytes_in_counter: u64,
    /// The address of the remote's replicator connection, while one is
    /// attached (Pulsar's `inboundConnection`).
    pub inbound_connection: Option<String>,
    /// Messages stored on the remote per second.
    pub msg_rate_out: f64,
    /// Bytes stored on the remote per second.
    pub msg_throughput_out: f64,
    /// Messages stored on the remote since the replicator started.
    pub msg_out_counter: u64,
    /// Bytes stored on the remote since the replicator started.
    pub bytes_out_counter: u64,
    /// Entries not replicated yet.
    pub backlog: u64,
    /// A producer on the remote is open.
    pub connected: bool,
    /// Now minus the publish time of the last entry stored on the remote,
    /// seconds (0 with nothing left to replicate).
    pub delay_seconds: u64,
}

/// One producer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct PublisherStats {
    /// Producer name.
    pub producer_name: String,
    /// Messages it published per second.
    pub msg_rate_in: f64,
    /// Bytes it published per second.
    pub msg_throughput_in: f64,
    /// Messages it published since it was admitted.
    pub msg_in_counter: u64,
    /// Bytes it published since it was admitted.
    pub bytes_in_counter: u64,
    /// Id on its connection.
    pub producer_id: u64,
    /// `Shared`, `Exclusive`, ...
    pub access_mode: String,
    /// Client address.
    pub address: String,
    /// Client version string from CONNECT.
    pub client_version: String,
    /// PRODUCER's metadata.
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Non-persistent topics: its messages dropped as they arrived, per
    /// second; `None` for persistent topics.
    pub msg_drop_rate: Option<f64>,
}

/// One subscription.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct SubscriptionStats {
    /// Name.
    pub name: String,
    /// `Exclusive`, `Shared`, `Failover` or `Key_Shared`.
    pub sub_type: String,
    /// False for readers.
    pub durable: bool,
    /// Its position follows to the topic's other clusters (Pulsar's
    /// `isReplicated`).
    pub replicated: bool,
    /// Its cursor's properties (internal stats; durable subscriptions).
    pub cursor_properties: std::collections::BTreeMap<String, i64>,
    /// Entries not yet acknowledged (Pulsar's msgBacklog counts entries).
    pub msg_backlog: u64,
    /// Entries delivered and not acknowledged.
    pub unacked_messages: u64,
    /// Messages delivered.
    pub msg_out_counter: u64,
    /// Bytes delivered.
    pub bytes_out_counter: u64,
    /// Redelivered entries (nacks, closes, ack timeouts).
    pub msg_redeliver_counter: u64,
    /// Messages delivered per second.
    pub msg_rate_out: f64,
    /// Bytes delivered per second.
    pub msg_throughput_out: f64,
    /// Entries redelivered per second.
    pub msg_rate_redeliver: f64,
    /// Entries acknowledged by message expiry (admin expire, TTL).
    pub msg_expired_counter: u64,
    /// Everything at or before it is acknowledged.
    pub mark_delete: Option<Position>,
    /// Next position the dispatcher reads.
    pub read_position: Option<Position>,
    /// Entries waiting to be sent again (Pulsar's `msgInReplay`).
    pub msg_in_replay: u64,
    /// A log read of the dispatcher is in flight (Pulsar's
    /// `subscriptionHavePendingRead`).
    pub read_in_flight: bool,
    /// The dispatcher read everything and waits for new entries (Pulsar's
    /// `waitingReadOp`).
    pub waiting_for_entries: bool,
    /// Consumers attached.
    pub consumers: Vec<ConsumerStats>,
    /// Exclusive and Failover: the consumer the dispatcher delivers to.
    pub active_consumer: Option<String>,
    /// Non-persistent subscriptions: messages dropped because no consumer
    /// could take them, per second; `None` for persistent ones.
    pub msg_drop_rate: Option<f64>,
    /// Non-persistent subscriptions: messages dropped, in all.
    pub msg_drop_counter: u64,
}

/// One consumer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ConsumerStats {
    /// Consumer name.
    pub consumer_name: String,
    /// Permits left (may be negative after a batch).
    pub available_permits: i64,
    /// Entries delivered to it and not acknowledged.
    pub unacked_messages: u64,
    /// Messages delivered to it.
    pub msg_out_counter: u64,
    /// Client address.
    pub address: String,
    /// Client version string from CONNECT.
    pub client_version: String,
    /// Wall-clock time of its last FLOW, ms.
    pub last_flow_ms: u64,
    /// SUBSCRIBE's metadata.
    pub metadata: std::collections::BTreeMap<String, String>,
    /// Key_Shared: it joined while entries were out and takes none at or
    /// after this position until every earlier one is acknowledged (Pulsar's
    /// `readPositionWhenJoining` of a recently joined consumer).
    pub joined_fence: Option<Position>,
}

/// A producer's in-counters (Pulsar's per-publisher `msgRateIn` and
/// `msgThroughputIn`), shared by its connection, which counts each SEND it
/// issues (two relaxed atomic adds, no lock), and the readers of stats.
#[derive(Debug)]
pub struct PublisherCounters {
    msg_in: std::sync::atomic::AtomicU64,
    bytes_in: std::sync::atomic::AtomicU64,
    /// msg_in, bytes_in → rates (taken only by stats readers).
    rates: parking_lot::Mutex<RateMeter<2>>,
}

impl Default for PublisherCounters {
    fn default() -> Self {
        PublisherCounters {
            msg_in: Default::default(),
            bytes_in: Default::default(),
            rates: parking_lot::Mutex::new(RateMeter::new([0, 0])),
        }
    }
}

impl PublisherCounters {
    /// One SEND of `messages` messages in `bytes` bytes was issued.
    pub fn record(&self, messages: u32, bytes: usize) {
        use std::sync::atomic::Ordering::Relaxed;
        self.msg_in.fetch_add(u64::from(messages), Relaxed);
        self.bytes_in.fetch_add(bytes as u64, Relaxed);
    }

    /// Fills `stats`' in-counters and rates (rates since the previous
    /// read, as `RateMeter` computes them).
    pub fn fill(&self, stats: &mut PublisherStats) {
        use std::sync::atomic::Ordering::Relaxed;
        let counters = [self.msg_in.load(Relaxed), self.bytes_in.load(Relaxed)];
        let [msg_rate_in, msg_throughput_in] = self.rates.lock().rates(Instant::now(), counters);
        stats.msg_in_counter = counters[0];
        stats.bytes_in_counter = counters[1];
        stats.msg_rate_in = msg_rate_in;
        stats.msg_throughput_in = msg_throughput_in;
    }
}

/// A replicator's live counters (Pulsar's `ReplicatorStats` before rates),
/// shared by the replicator, which updates them, and the readers of stats
/// and metrics.
#[derive(Debug, Default)]
pub struct ReplicatorStats {
    /// Messages sent to the remote cluster and stored there (a batch counts
    /// its messages).
    pub msg_out: std::sync::atomic::AtomicU64,
    /// Bytes of entries sent and stored there.
    pub bytes_out: std::sync::atomic::AtomicU64,
    /// Entries not replicated yet (the cursor's backlog), as last seen.
    pub backlog_entries: std::sync::atomic::AtomicU64,
    /// A producer on the remote cluster is open.
    pub connected: std::sync::atomic::AtomicBool,
    /// Publish time (ms) of the last entry the remote stored, for the delay.
    pub last_stored_publish_time_ms: std::sync::atomic::AtomicU64,
    /// msg_out, bytes_out → rates.
    rates: parking_lot::Mutex<Option<RateMeter<2>>>,
}

impl ReplicatorStats {
    /// A snapshot for the replicator to `remote_cluster` (rates since the
    /// previous one, as `RateMeter` computes them).
    pub fn snapshot(&self, remote_cluster: &str) -> ReplicationStats {
        use std::sync::atomic::Ordering::Relaxed;
        let msg_out_counter = self.msg_out.load(Relaxed);
        let bytes_out_counter = self.bytes_out.load(Relaxed);
        let counters = [msg_out_counter, bytes_out_counter];
        let [msg_rate_out, msg_throughput_out] = self
            .rates
            .lock()
            .get_or_insert_with(|| RateMeter::new([0, 0]))
            .rates(Instant::now(), counters);
        let backlog = self.backlog_entries.load(Relaxed);
        let last = self.last_stored_publish_time_ms.load(Relaxed);
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let delay_seconds = if backlog == 0 || last == 0 {
            0
        } else {
            now_ms.saturating_sub(last) / 1000
        };
        ReplicationStats {
            remote_cluster: remote_cluster.to_string(),
            // The receiving side's: `Service::topic_stats` adds them.
            msg_rate_in: 0.0,
            msg_throughput_in: 0.0,
            msg_in_counter: 0,
            bytes_in_counter: 0,
            inbound_connection: None,
            msg_rate_out,
            msg_throughput_out,
            msg_out_counter,
            bytes_out_counter,
            backlog,
            connected: self.connected.load(Relaxed),
            delay_seconds,
        }
    }
}
