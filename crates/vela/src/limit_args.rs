//! Broker limits shared by `vela standalone` and `vela broker`: connections in
//! all and per client IP, topics per broker, producers and consumers per topic, consumers per
//! subscription, the largest message, each topic's publish rate, and the
//! subscriptions' read-ahead budget and the priority of their reads, and the
//! bytes of non-persistent messages in flight.
//!
//! Owns: the flag names (Pulsar's setting names where there is one), their
//! ranges (clap rejects a bad value naming the flag), and copying them into
//! `BrokerConfig`.

use clap::Args;
use vela_broker::config::{
    CATCH_UP_READ_NICE_DEFAULT, CONNECTIONS_MAX_DEFAULT, CONSUMERS_PER_SUBSCRIPTION_MAX,
    CONSUMERS_PER_TOPIC_MAX, HELD_ENTRIES_PER_BROKER_DEFAULT, MAX_MESSAGE_SIZE_BYTES,
    PRODUCERS_PER_TOPIC_MAX, READ_AHEAD_BYTES_MAX_DEFAULT, TOPICS_MAX_DEFAULT,
};
use vela_broker::{BrokerConfig, ConnectionCaps, NonPersistentLimits, PublishRate, TopicLimits};

/// Hard ceiling of `--max-connections`: each connection is two tasks and a
/// 64 KiB buffer, so 1M is ~64 GiB of buffers at worst.
const CONNECTIONS_CEILING: u64 = 1_000_000;

/// Ceiling of `--max-unacked-entries-per-broker`: 1G entries is ~64 GiB of
/// index.
const HELD_ENTRIES_CEILING: u64 = 1 << 30;

/// Ceiling of `--max-topics-per-broker`: 10M topics is ~200 GiB of fixed
/// per-topic cost.
const TOPICS_CEILING: u64 = 10_000_000;

/// Smallest `--max-message-size`: below it even a message's metadata and a
/// small batch do not fit.
const MESSAGE_SIZE_FLOOR_BYTES: u64 = 1024;

/// Connection, topic and message limits.
#[derive(Debug, Args)]
pub(crate) struct LimitArgs {
    /// Connections served at once (Pulsar's brokerMaxConnections). Past it a
    /// new connection gets ERROR(NotAllowedError) and is closed.
    #[arg(long, default_value_t = CONNECTIONS_MAX_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=CONNECTIONS_CEILING))]
    max_connections: u64,
    /// Connections from one client IP address (Pulsar's
    /// brokerMaxConnectionsPerIp). Default: --max-connections.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=CONNECTIONS_CEILING))]
    max_connections_per_ip: Option<u64>,
    /// Topics this broker serves at once, persistent and non-persistent
    /// (each ~20 KiB idle). Past it a new topic gets ServiceNotReady; the
    /// client retries.
    #[arg(long, default_value_t = TOPICS_MAX_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=TOPICS_CEILING))]
    max_topics_per_broker: u64,
    /// Producers on one topic (Pulsar's maxProducersPerTopic). Past it
    /// PRODUCER gets ProducerBusy.
    #[arg(long, default_value_t = PRODUCERS_PER_TOPIC_MAX as u64,
          value_parser = clap::value_parser!(u64).range(1..=PRODUCERS_PER_TOPIC_MAX as u64))]
    max_producers_per_topic: u64,
    /// Consumers on one topic, over all its subscriptions (Pulsar's
    /// maxConsumersPerTopic). Past it SUBSCRIBE gets ConsumerBusy.
    #[arg(long, default_value_t = CONSUMERS_PER_TOPIC_MAX as u64,
          value_parser = clap::value_parser!(u64).range(1..=CONSUMERS_PER_TOPIC_MAX as u64))]
    max_consumers_per_topic: u64,
    /// Consumers on one subscription (Pulsar's maxConsumersPerSubscription).
    /// Past it SUBSCRIBE gets ConsumerBusy.
    #[arg(long, default_value_t = CONSUMERS_PER_SUBSCRIPTION_MAX as u64,
          value_parser = clap::value_parser!(u64).range(1..=CONSUMERS_PER_SUBSCRIPTION_MAX as u64))]
    max_consumers_per_subscription: u64,
    /// Largest message in bytes (Pulsar's maxMessageSize), told to clients
    /// at CONNECT: they refuse bigger messages themselves (or chunk them); a
    /// frame over it plus 10 KiB closes the connection, as in Pulsar.
    #[arg(long, default_value_t = MAX_MESSAGE_SIZE_BYTES as u64,
          value_parser = clap::value_parser!(u64).range(MESSAGE_SIZE_FLOOR_BYTES..=MAX_MESSAGE_SIZE_BYTES as u64))]
    max_message_size: u64,
    /// Messages per second one topic takes from its producers (Pulsar's
    /// publish-rate policy). Past it the broker stops reading from the
    /// sending producers' connections for a while: producers slow down,
    /// nothing is refused. Default: no limit.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    publish_max_msg_rate_per_topic: Option<u64>,
    /// Bytes per second one topic takes from its producers (as
    /// --publish-max-msg-rate-per-topic). Default: no limit.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..))]
    publish_max_byte_rate_per_topic: Option<u64>,
    /// MiB all subscriptions together may hold read ahead of their
    /// consumers (catch-up reads from the bookies). When used up, a
    /// subscription reads only what its consumers wait for. 0: no
    /// read-ahead.
    #[arg(long, default_value_t = READ_AHEAD_BYTES_MAX_DEFAULT >> 20,
          value_parser = clap::value_parser!(u64).range(0..=READ_AHEAD_MIB_CEILING))]
    read_ahead_mb: u64,
    /// CPU priority (nice value, 0 to 19) of the threads that read
    /// catch-up subscriptions' entries from the bookies: on a busy machine
    /// the kernel then runs producers' writes first and a backlog drains
    /// more slowly instead (behind any busy process); alone, a drain takes
    /// whatever CPU is free. 0 (the default): the reads run on the broker's
    /// own threads.
    #[arg(long, default_value_t = CATCH_UP_READ_NICE_DEFAULT,
          value_parser = clap::value_parser!(u8).range(0..=19))]
    catch_up_read_nice: u8,
    /// Entries all subscriptions together hold: delivered and not yet
    /// acknowledged, waiting to be sent again, or delayed (Pulsar's
    /// maxUnackedMessagesPerBroker, counted in entries; ~64 bytes of index
    /// each). At it, subscriptions deliver no new entries until
    /// acknowledgements free room; redeliveries go on.
    #[arg(long, default_value_t = HELD_ENTRIES_PER_BROKER_DEFAULT as u64,
          value_parser = clap::value_parser!(u64).range(1..=HELD_ENTRIES_CEILING))]
    max_unacked_entries_per_broker: u64,
    /// Bytes of non-persistent messages in flight (handed to consumers'
    /// connections, not yet written), over all non-persistent topics. Full:
    /// arriving messages are dropped and counted (their producers get the
    /// receipt -1:-1), as Pulsar drops what it cannot deliver.
    #[arg(long, default_value_t = NonPersistentLimits::default().inflight_bytes_max,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_non_persistent_inflight_bytes: u64,
    /// Bytes of one non-persistent topic's messages in flight. Full: its
    /// arriving messages are dropped; one that does not fit for one
    /// subscription is dropped for it (its msgDropRate).
    #[arg(long, default_value_t = NonPersistentLimits::default().topic_inflight_bytes_max,
          value_parser = clap::value_parser!(u64).range(1..))]
    max_non_persistent_inflight_bytes_per_topic: u64,
}

/// Largest `--read-ahead-mb`: 1 TiB.
const READ_AHEAD_MIB_CEILING: u64 = 1 << 20;

impl LimitArgs {
    /// Copies the flags into the broker's configuration.
    pub(crate) fn apply(&self, config: &mut BrokerConfig) {
        // Every value is range-checked by clap against a usize bound: the
        // conversions cannot truncate.
        let to_usize = |v: u64| usize::try_from(v).unwrap_or(usize::MAX);
        let total_max = to_usize(self.max_connections);
        config.connection_caps = ConnectionCaps {
            total_max,
            per_ip_max: self.max_connections_per_ip.map_or(total_max, to_usize),
        };
        config.topic_limits = TopicLimits {
            producers_max: to_usize(self.max_producers_per_topic),
            consumers_max: to_usize(self.max_consumers_per_topic),
            consumers_per_subscription_max: to_usize(self.max_consumers_per_subscription),
            publish_rate: PublishRate {
                messages_per_s: self.publish_max_msg_rate_per_topic,
                bytes_per_s: self.publish_max_byte_rate_per_topic,
            },
        };
        config.topics_max = to_usize(self.max_topics_per_broker);
        config.max_message_size_bytes = to_usize(self.max_message_size);
        config.read_ahead_bytes_max = self.read_ahead_mb << 20;
        config.catch_up_read_nice = self.catch_up_read_nice;
        config.held_entries_max = to_usize(self.max_unacked_entries_per_broker);
        config.non_persistent_limits = NonPersistentLimits {
            topic_inflight_bytes_max: self.max_non_persistent_inflight_bytes_per_topic,
            inflight_bytes_max: self.max_non_persistent_inflight_bytes,
        };
    }
}
