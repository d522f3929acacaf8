//! Broker configuration and the named limits that bound every connection.
//!
//! Owns: [`BrokerConfig`] (what `vela standalone` and tests set) and
//! [`ConnectionLimits`] (per-connection bounds with the reason for each
//! default). Never: reads files or the environment; the binary does that
//! (TLS certificate files named here are read by `tls`).

use std::net::SocketAddr;
use std::time::Duration;

/// Protocol version this broker speaks (ProtocolVersion v21). CONNECTED carries
/// `min(client, PROTOCOL_VERSION_MAX)`.
pub const PROTOCOL_VERSION_MAX: i32 = 21;

/// Largest message (metadata + payload) accepted, in bytes: the Java broker's
/// `maxMessageSize` default (5 MiB), sent in CONNECTED.max_message_size.
pub const MAX_MESSAGE_SIZE_BYTES: usize = 5 * 1024 * 1024;

/// Frames may exceed the message limit by this much (command + headers), as in
/// the Java broker's frame decoder (`maxMessageSize + 10 KiB`).
pub const FRAME_PADDING_BYTES: usize = 10 * 1024;

/// Server version string sent in CONNECTED.
pub const SERVER_VERSION: &str = concat!("Vela ", env!("CARGO_PKG_VERSION"));

/// Default of `BrokerConfig::cluster_name` (Pulsar standalone's name).
pub const CLUSTER_NAME_DEFAULT: &str = "standalone";

/// Default of `BrokerConfig::held_entries_max`: 4M entries held by all
/// subscriptions together; at ~64 bytes of index each, 256 MiB at worst.
pub const HELD_ENTRIES_PER_BROKER_DEFAULT: usize = 4_000_000;

/// Per-connection bounds. Every field is a limit with a stated behaviour when
/// reached.
#[derive(Debug, Clone)]
pub struct ConnectionLimits {
    /// Producers open on one connection. Java/C++ clients open one per topic
    /// partition; 10k covers a partitioned topic of thousands of partitions.
    /// When reached: PRODUCER gets ERROR(NotAllowedError).
    pub producers_max: usize,
    /// Consumers open on one connection (same reasoning as producers).
    /// When reached: SUBSCRIBE gets ERROR(NotAllowedError).
    pub consumers_max: usize,
    /// SENDs accepted but not yet answered by a receipt, per connection. Java's
    /// default producer queue is 1000 messages per producer; 10k lets ten busy
    /// producers pipeline fully. When reached: the connection stops reading
    /// until receipts drain (TCP back-pressure on the client).
    pub pending_sends_max: usize,
    /// Bytes of SEND frames accepted but not yet answered, per connection. 64 MiB
    /// is ~12 maximum-size messages or ~64k 1 KiB messages: enough to keep the
    /// log pipeline full. When reached: reads pause as for `pending_sends_max`.
    pub pending_send_bytes_max: usize,
    /// Frames queued for the socket writer. Each reply and MESSAGE is one
    /// frame; 4096 frames is ~4 full receiver queues of a consumer. When full:
    /// the producer of the frame (reader, dispatcher) waits.
    pub outbound_frames_max: usize,
    /// Frames written per writer wake-up before yielding (one vectored write
    /// per wake-up; the budget keeps one busy connection from starving others).
    pub frames_per_wakeup_max: usize,
    /// Frames decoded per read wake-up before yielding to the runtime.
    pub inbound_frames_per_wakeup_max: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits {
            producers_max: 10_000,
            consumers_max: 10_000,
            pending_sends_max: 10_000,
            pending_send_bytes_max: 64 * 1024 * 1024,
            outbound_frames_max: 4096,
            frames_per_wakeup_max: 256,
            inbound_frames_per_wakeup_max: 256,
        }
    }
}

/// Connections served at once by default. Each costs two tasks and a read
/// buffer of at most 64 KiB (an idle one measured ~18 KiB resident,
/// tests/python/test_resources.py), so 50k idle connections take ~1 GiB and
/// 3 GiB at worst. The process also needs a file descriptor each
/// (RLIMIT_NOFILE).
pub const CONNECTIONS_MAX_DEFAULT: usize = 50_000;

/// Default of `BrokerConfig::topics_max`: room for 100,000 topics of a
/// user's own (a topic per device) and their partitions' and system
/// topics beside them.
pub const TOPICS_MAX_DEFAULT: usize = 200_000;

/// Hard bound on producers per topic (the producer map); the configurable
/// limit (`TopicLimits::producers_max`) is at most this.
pub const PRODUCERS_PER_TOPIC_MAX: usize = 10_000;

/// Hard bound on consumers per topic, over all its subscriptions.
pub const CONSUMERS_PER_TOPIC_MAX: usize = 100_000;

/// Hard bound on consumers of one subscription (its dispatcher's list).
pub const CONSUMERS_PER_SUBSCRIPTION_MAX: usize = 10_000;

/// How many connections the broker serves, in all and from one client IP
/// (Pulsar's `brokerMaxConnections`, `brokerMaxConnectionsPerIp`). A
/// connection past either gets ERROR(NotAllowedError) naming the limit right
/// after the accept, as Pulsar answers, and is closed (logged).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectionCaps {
    /// Connections in all.
    pub total_max: usize,
    /// Connections from one IP address (a client host, or a NAT/proxy in
    /// front of many: set it with that in mind).
    pub per_ip_max: usize,
}

impl Default for ConnectionCaps {
    fn default() -> Self {
        ConnectionCaps {
            total_max: CONNECTIONS_MAX_DEFAULT,
            per_ip_max: CONNECTIONS_MAX_DEFAULT,
        }
    }
}

/// A topic's publish rate (Pulsar's publish-rate policy): messages and bytes
/// per second, `None` for no limit on that side. Past it the broker stops
/// reading from the connection of each producer that sends (Pulsar's
/// throttling: no message is refused or dropped; TCP back-pressure slows the
/// client down).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct PublishRate {
    /// Messages per second (a batch counts its messages).
    pub messages_per_s: Option<u64>,
    /// Payload bytes per second.
    pub bytes_per_s: Option<u64>,
}

impl PublishRate {
    /// Whether either side is limited.
    pub fn is_limited(&self) -> bool {
        self.messages_per_s.is_some() || self.bytes_per_s.is_some()
    }
}

/// A dispatch rate (Pulsar's `DispatchRate`): messages and bytes sent to
/// consumers per period, `None` for no limit on that side. Past it a
/// subscription sends nothing more until the rate allows: entries wait in
/// the log, nothing is dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DispatchRate {
    /// Messages per period (a batch counts its messages).
    pub messages_per_period: Option<u64>,
    /// Payload bytes per period.
    pub bytes_per_period: Option<u64>,
    /// The period (Pulsar's `ratePeriodInSecond`).
    pub period: Duration,
}

impl DispatchRate {
    /// Whether either side is limited.
    pub fn is_limited(&self) -> bool {
        self.messages_per_period.is_some() || self.bytes_per_period.is_some()
    }
}

/// Limits of every topic (Pulsar's `maxProducersPerTopic`,
/// `maxConsumersPerTopic`, `maxConsumersPerSubscription` and the publish
/// rate). Past a count limit PRODUCER gets ProducerBusy and SUBSCRIBE gets
/// ConsumerBusy, with Pulsar's messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TopicLimits {
    /// Producers on one topic (at most `PRODUCERS_PER_TOPIC_MAX`).
    pub producers_max: usize,
    /// Consumers on one topic, over its subscriptions (at most
    /// `CONSUMERS_PER_TOPIC_MAX`).
    pub consumers_max: usize,
    /// Consumers on one subscription (at most `CONSUMERS_PER_SUBSCRIPTION_MAX`).
    pub consumers_per_subscription_max: usize,
    /// Publish rate of one topic.
    pub publish_rate: PublishRate,
}

impl Default for TopicLimits {
    fn default() -> Self {
        TopicLimits {
            producers_max: PRODUCERS_PER_TOPIC_MAX,
            consumers_max: CONSUMERS_PER_TOPIC_MAX,
            consumers_per_subscription_max: CONSUMERS_PER_SUBSCRIPTION_MAX,
            publish_rate: PublishRate::default(),
        }
    }
}

/// Bytes of non-persistent messages in flight: handed to a consumer's
/// connection and not yet written to its socket (Pulsar bounds the same
/// thing with the connection's writability). Counted once per delivery, so
/// a message fanned out to N subscriptions counts N times (an upper bound
/// of the memory held: the bytes themselves are shared). When a bound is
/// reached messages are dropped and counted, never queued: a message
/// arriving at a full topic or broker is dropped for every subscription
/// (its producer gets the receipt (-1, -1), as Pulsar answers a message it
/// drops), one that does not fit for one subscription is dropped for it
/// (its `msgDropRate`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NonPersistentLimits {
    /// In flight per topic (`--max-non-persistent-inflight-bytes-per-topic`).
    /// 64 MiB is 64k 1 KiB messages: far more than ten consumers' receiver
    /// queues (1000 messages each by default) hold.
    pub topic_inflight_bytes_max: u64,
    /// In flight over every non-persistent topic of the broker
    /// (`--max-non-persistent-inflight-bytes`).
    pub inflight_bytes_max: u64,
}

impl Default for NonPersistentLimits {
    fn default() -> Self {
        NonPersistentLimits {
            topic_inflight_bytes_max: 64 * 1024 * 1024,
            inflight_bytes_max: 512 * 1024 * 1024,
        }
    }
}

/// Replication of new ledgers: (ensemble, write quorum, ack quorum).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PersistenceConfig {
    /// Bookies a ledger is striped over (E).
    pub ensemble: u8,
    /// Copies of each entry (Qw).
    pub write_quorum: u8,
    /// Copies acknowledged before an add completes (Qa).
    pub ack_quorum: u8,
}

impl Default for PersistenceConfig {
    fn default() -> Self {
        PersistenceConfig {
            ensemble: 1,
            write_quorum: 1,
            ack_quorum: 1,
        }
    }
}

/// Default of `BrokerConfig::read_ahead_bytes_max`: 256 MiB, so 10
/// subscriptions catch up at full speed at once (each keeps up to three
/// reads of about 8 MiB ahead); the others read what their consumers wait
/// for.
pub const READ_AHEAD_BYTES_MAX_DEFAULT: u64 = 256 * 1024 * 1024;

/// Default of `BrokerConfig::catch_up_read_nice`: 0, the reads run on the
/// broker's runtime. Lower priority is opt-in until it is shown to help
/// producers on a quiet machine: on a busy one (other processes' builds) a
/// drain at nice 10 ran 1.2x to 3.5x slower (bench/RESULTS-catch-up.md).
pub const CATCH_UP_READ_NICE_DEFAULT: u8 = 0;

/// Everything the broker needs to start.
#[derive(Debug, Clone)]
pub struct BrokerConfig {
    /// Address the plain-text Pulsar listener binds (port 0 picks a free
    /// port); `None`: no plain listener (TLS only, `pulsar_tls_addr` needed).
    pub pulsar_addr: Option<SocketAddr>,
    /// Address the TLS Pulsar listener (`pulsar+ssl://`) binds; needs `tls`
    /// (Pulsar's `brokerServicePortTls`).
    pub pulsar_tls_addr: Option<SocketAddr>,
    /// Certificate and key of the TLS listeners (Pulsar port and HTTPS).
    pub tls: Option<crate::tls::TlsConfig>,
    /// Token authentication and authorization; `None`: every client is
    /// accepted and may do anything (Pulsar's default).
    pub auth: Option<crate::auth::AuthConfig>,
    /// Host put into lookup answers (`pulsar://HOST:PORT`); never 0.0.0.0.
    pub advertised_host: String,
    /// This cluster's name (Pulsar's `clusterName`): registered in the
    /// metadata store at start, in generated producer names
    /// (`{cluster}-0-N`), the `cluster` label of metrics, and what
    /// replicated messages carry as `replicated_from`.
    pub cluster_name: String,
    /// Interval between keep-alive PINGs; a connection silent for two intervals
    /// (one unanswered PING) is closed. Pulsar's default is 30 s.
    pub keepalive: Duration,
    /// Time a client has to complete CONNECT after the TCP accept.
    pub handshake_timeout: Duration,
    /// Per-connection bounds.
    pub limits: ConnectionLimits,
    /// Create topics on first use (Pulsar's `allowAutoTopicCreation`, default on).
    pub auto_create_topics: bool,
    /// Replication used when a namespace sets none.
    pub default_persistence: PersistenceConfig,
    /// Largest message accepted (metadata + payload), sent in CONNECTED.
    pub max_message_size_bytes: usize,
    /// Cluster mode: a bundle serving more topics than this is split
    /// (Pulsar's `loadBalancerNamespaceBundleMaxTopics`).
    pub bundle_split_topics_max: usize,
    /// Cluster mode: a bundle taking more messages per second than this is
    /// split (Pulsar's `loadBalancerNamespaceBundleMaxMsgRate`).
    pub bundle_split_msg_rate_max: f64,
    /// A topic's ledger is full after this many entries (Pulsar's
    /// `managedLedgerMaxEntriesPerLedger`); consumed data is freed a whole
    /// ledger at a time.
    pub ledger_entries_max: u64,
    /// A topic's ledger is full after this many bytes (Pulsar's
    /// `managedLedgerMaxSizePerLedgerMbytes`, 2048 MiB).
    pub ledger_bytes_max: u64,
    /// A full ledger rolls over only once older than this, and a topic
    /// without subscriptions keeps a closed ledger at least this long
    /// (Pulsar's `managedLedgerMinLedgerRolloverTimeMinutes`, 10 min).
    pub ledger_rollover_min: Duration,
    /// A ledger this old is full (Pulsar's
    /// `managedLedgerMaxLedgerRolloverTimeMinutes`, 240 min).
    pub ledger_rollover_max: Duration,
    /// When a topic's closed ledgers are offloaded and their bookie copies
    /// deleted (Pulsar's `managedLedgerOffloadThresholdInBytes`,
    /// `managedLedgerOffloadThresholdInSeconds` (both off),
    /// `managedLedgerOffloadDeletionLagMs` (4 h)); applies only when the
    /// `LogEnv` has an offloader.
    pub offload_policy: vela_log::OffloadPolicy,
    /// Time between two passes applying message TTL, backlog quotas and
    /// retention to the served topics (Pulsar checks quotas every 60 s).
    pub policy_check_interval: Duration,
    /// Connections in all and per client IP.
    pub connection_caps: ConnectionCaps,
    /// Producers, consumers and publish rate of each topic.
    pub topic_limits: TopicLimits,
    /// Topics (persistent and non-persistent) one broker serves at once;
    /// past it a new topic gets ServiceNotReady. Each served topic costs
    /// ~20 KiB idle (its log, cursors and tasks; cached entries and
    /// publishes in flight draw on the broker-wide budgets), so the default
    /// bounds that fixed cost near 4 GiB.
    pub topics_max: usize,
    /// Bytes all subscriptions together may hold read ahead of their
    /// consumers (catch-up reads); when used up, a subscription reads only
    /// what its consumers wait for. The one read-ahead knob, to be drawn
    /// from the broker-wide memory budget.
    pub read_ahead_bytes_max: u64,
    /// CPU priority (Linux nice value, 0..=19) of the threads catch-up
    /// reads run on (`subscription::read_pool`): above 0, a subscription's
    /// reads from the bookies run on a small runtime of their own at that
    /// nice value, below the publish path; 0: on the broker's runtime.
    pub catch_up_read_nice: u8,
    /// Entries all subscriptions together hold (out to consumers and not
    /// acknowledged, to send again, delayed); at it, subscriptions read no
    /// new entries until acknowledgements free room (Pulsar's
    /// `maxUnackedMessagesPerBroker`, counted in entries).
    pub held_entries_max: usize,
    /// Bytes of non-persistent messages in flight, per topic and in all.
    pub non_persistent_limits: NonPersistentLimits,
    /// Advertised listeners (`--advertised-listeners`): lookups naming one
    /// are answered with its URLs; the internal one's URLs are this
    /// broker's own.
    pub advertised_listeners: crate::listeners::AdvertisedListeners,
    /// The transaction coordinator (`None`: off, Pulsar's default; every
    /// transaction command is answered NotAllowed).
    pub transactions: Option<TransactionConfig>,
    /// Bytes of entries all replicators together have sent to remote
    /// clusters and not yet seen stored (`--replication-inflight-mb`). When
    /// reached: replicators send nothing more until receipts free room (the
    /// entries stay in the log, their cursors behind).
    pub replication_inflight_bytes_max: usize,
    /// How often a topic with a replicated subscription takes a snapshot of
    /// its position in every remote cluster, in ms
    /// (`--replicated-subscriptions-snapshot-frequency-ms`, Pulsar's
    /// `replicatedSubscriptionsSnapshotFrequencyMillis`, 1000): a consumer
    /// failing over resumes at most about this much behind.
    pub replicated_subscriptions_snapshot_frequency_ms: u64,
    /// How this broker is a client of other brokers (Pulsar's
    /// `brokerClient*` settings): replicators' defaults unless a cluster's
    /// record says otherwise, and the brokers of this cluster toward each
    /// other (transaction outcomes, coordinator stats).
    pub broker_client: BrokerClientConfig,
}

/// How this broker connects to other brokers (Pulsar's
/// `brokerClientTlsEnabled`, `brokerClientTrustCertsFilePath`,
/// `brokerClientAuthenticationPlugin`,
/// `brokerClientAuthenticationParameters`): to the brokers of its own
/// cluster, and to remote clusters, whose record
/// (`admin::ClusterClient`) may set each for itself.
#[derive(Clone, Default)]
pub struct BrokerClientConfig {
    /// Connect to remotes' `brokerServiceUrlTls` over TLS.
    pub tls_enabled: bool,
    /// PEM roots remotes' certificates must chain to.
    pub trust_certs_file: Option<std::path::PathBuf>,
    /// Authentication plugin (`...AuthenticationToken` or `token`).
    pub authentication_plugin: Option<String>,
    /// Its parameters (`token:...`, `file:///path`): a credential, never
    /// printed.
    pub authentication_parameters: Option<String>,
}

impl std::fmt::Debug for BrokerClientConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BrokerClientConfig")
            .field("tls_enabled", &self.tls_enabled)
            .field("trust_certs_file", &self.trust_certs_file)
            .field("authentication_plugin", &self.authentication_plugin)
            .finish_non_exhaustive()
    }
}

/// Default of `BrokerConfig::replicated_subscriptions_snapshot_frequency_ms`
/// (Pulsar's).
pub const REPLICATED_SUBSCRIPTIONS_SNAPSHOT_FREQUENCY_MS_DEFAULT: u64 = 1000;

/// Default of `BrokerConfig::replication_inflight_bytes_max`: 64 MiB, a
/// full window (`REPLICATOR_PENDING_MAX`, 1000 entries) of 64 KiB entries,
/// or many replicators' windows of small ones.
pub const REPLICATION_INFLIGHT_BYTES_DEFAULT: usize = 64 << 20;

/// The transaction coordinator's settings and bounds
/// (`--transaction-coordinator-enabled` and its flags).
#[derive(Debug, Clone)]
pub struct TransactionConfig {
    /// Partitions of `persistent://pulsar/system/transaction_coordinator_assign`:
    /// one coordinator each, each with its own transaction log.
    pub coordinators: u32,
    /// Open transactions per coordinator. When reached: NEW_TXN gets no
    /// answer, as Pulsar's `maxActiveTransactionsPerCoordinator` (the
    /// client's operation times out rather than retrying at once).
    pub open_per_coordinator_max: usize,
    /// Partitions plus subscriptions one transaction may register. When
    /// reached: ADD_PARTITION_TO_TXN / ADD_SUBSCRIPTION_TO_TXN get
    /// NotAllowedError.
    pub ops_per_transaction_max: usize,
    /// Longest timeout a client may ask for (longer requests are cut to it).
    pub timeout_max: Duration,
    /// How often each coordinator looks for timed-out transactions.
    pub timeout_check_interval: Duration,
    /// Transaction state records this broker holds in memory at most, over
    /// every topic and subscription (`txn_buffer::TxnBudget`): open and
    /// aborted transactions of each topic's buffer plus positions held by
    /// transactional acks (~100 bytes each). When reached: a SEND opening a
    /// transaction on a topic, or a transactional ACK, gets NotAllowedError.
    pub state_entries_max: usize,
}

impl Default for TransactionConfig {
    fn default() -> TransactionConfig {
        TransactionConfig {
            coordinators: 1,
            open_per_coordinator_max: 100_000,
            ops_per_transaction_max: 10_000,
            timeout_max: Duration::from_secs(24 * 3600),
            timeout_check_interval: Duration::from_secs(1),
            state_entries_max: 1_000_000,
        }
    }
}

impl BrokerConfig {
    /// Defaults for a broker on `pulsar_addr` advertising `127.0.0.1`.
    pub fn new(pulsar_addr: SocketAddr) -> BrokerConfig {
        BrokerConfig {
            pulsar_addr: Some(pulsar_addr),
            pulsar_tls_addr: None,
            tls: None,
            auth: None,
            advertised_host: "127.0.0.1".to_string(),
            cluster_name: CLUSTER_NAME_DEFAULT.to_string(),
            keepalive: Duration::from_secs(30),
            handshake_timeout: Duration::from_secs(30),
            limits: ConnectionLimits::default(),
            auto_create_topics: true,
            default_persistence: PersistenceConfig::default(),
            max_message_size_bytes: MAX_MESSAGE_SIZE_BYTES,
            bundle_split_topics_max: 1000,
            bundle_split_msg_rate_max: 30_000.0,
            ledger_entries_max: 50_000,
            ledger_bytes_max: 2048 << 20,
            ledger_rollover_min: Duration::from_secs(10 * 60),
            ledger_rollover_max: Duration::from_secs(240 * 60),
            offload_policy: vela_log::OffloadPolicy::default(),
            policy_check_interval: Duration::from_secs(60),
            connection_caps: ConnectionCaps::default(),
            topic_limits: TopicLimits::default(),
            read_ahead_bytes_max: READ_AHEAD_BYTES_MAX_DEFAULT,
            catch_up_read_nice: CATCH_UP_READ_NICE_DEFAULT,
            held_entries_max: HELD_ENTRIES_PER_BROKER_DEFAULT,
            topics_max: TOPICS_MAX_DEFAULT,
            non_persistent_limits: NonPersistentLimits::default(),
            advertised_listeners: crate::listeners::AdvertisedListeners::default(),
            transactions: None,
            replication_inflight_bytes_max: REPLICATION_INFLIGHT_BYTES_DEFAULT,
            replicated_subscriptions_snapshot_frequency_ms:
                REPLICATED_SUBSCRIPTIONS_SNAPSHOT_FREQUENCY_MS_DEFAULT,
            broker_client: BrokerClientConfig::default(),
        }
    }

    /// The URL of a scheme this broker publishes as its own, as Pulsar's
    /// `getInternalListener`: the internal listener's, else the first
    /// listener having one, else `None` (the broker's own port then).
    pub(crate) fn listener_url(
        &self,
        url: impl Fn(&crate::listeners::AdvertisedListener) -> &Option<String>,
    ) -> Option<String> {
        let listeners = &self.advertised_listeners;
        let internal = listeners
            .internal
            .as_ref()
            .and_then(|name| listeners.listeners.get(name))
            .and_then(|l| url(l).clone());
        internal.or_else(|| listeners.listeners.values().find_map(|l| url(l).clone()))
    }

    /// `pulsar://host:port` this broker publishes: the internal advertised
    /// listener's, else its plain listener's (the bound port once the
    /// broker started); `None` without a plain port (TLS only).
    pub fn advertised_plain_url(&self) -> Option<String> {
        self.listener_url(|l| &l.service_url).or_else(|| {
            self.pulsar_addr
                .map(|addr| format!("pulsar://{}:{}", self.advertised_host, addr.port()))
        })
    }

    /// `pulsar+ssl://host:port` this broker publishes: the internal
    /// advertised listener's, else its TLS listener's, when there is one.
    pub fn advertised_tls_url(&self) -> Option<String> {
        self.listener_url(|l| &l.service_url_tls).or_else(|| {
            self.pulsar_tls_addr
                .map(|addr| format!("pulsar+ssl://{}:{}", self.advertised_host, addr.port()))
        })
    }

    /// This broker's id in a cluster: `host:port` of its Pulsar listener
    /// (the plain one, else the TLS one).
    pub(crate) fn broker_id(&self) -> String {
        let port = self
            .pulsar_addr
            .or(self.pulsar_tls_addr)
            .map_or(0, |addr| addr.port());
        format!("{}:{port}", self.advertised_host)
    }

    /// Largest frame accepted from a client.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_message_size_bytes + FRAME_PADDING_BYTES
    }
}
