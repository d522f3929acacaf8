//! Point-in-time statistics of served topics, for the admin API and metrics.
//!
//! Owns: the public, plain-data shapes ([`TopicStats`], [`PublisherStats`],
//! [`SubscriptionStats`], [`ConsumerStats`]). Counters are totals since the
//! topic was opened on this broker; rates are left to the caller (difference
//! of two snapshots). Never: serializes (the HTTP layer maps these to
//! Pulsar's JSON) or blocks a connection (a snapshot asks each subscription
//! task once).

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
    /// Producers attached.
    pub publishers: Vec<PublisherStats>,
    /// Subscriptions, by name.
    pub subscriptions: Vec<SubscriptionStats>,
}

/// One producer.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublisherStats {
    /// Producer name.
    pub producer_name: String,
    /// Id on its connection.
    pub producer_id: u64,
    /// `Shared`, `Exclusive`, ...
    pub access_mode: String,
    /// Client address.
    pub address: String,
    /// Client version string from CONNECT.
    pub client_version: String,
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
    /// Consumers attached.
    pub consumers: Vec<ConsumerStats>,
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
}
