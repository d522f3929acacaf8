//! Messages and message ids as the application sees them.

use std::collections::BTreeMap;

use bytes::Bytes;
use vela_wire::proto::MessageIdData;

/// Where a message sits: (ledger, entry), its index in a batch, and the
/// partition of a partitioned topic. Orders as Pulsar's ids do.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct MessageId {
    /// Ledger of the entry.
    pub ledger_id: u64,
    /// Entry in the ledger.
    pub entry_id: u64,
    /// Index in the batch (`-1`: not batched).
    pub batch_index: i32,
    /// Partition (`-1`: not a partition).
    pub partition: i32,
}

impl MessageId {
    /// The wire form.
    pub fn to_proto(&self) -> MessageIdData {
        MessageIdData {
            ledger_id: self.ledger_id,
            entry_id: self.entry_id,
            partition: (self.partition >= 0).then_some(self.partition),
            batch_index: (self.batch_index >= 0).then_some(self.batch_index),
            ..Default::default()
        }
    }
}

impl std::fmt::Display for MessageId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}:{}:{}:{}",
            self.ledger_id, self.entry_id, self.partition, self.batch_index
        )
    }
}

/// A message to send.
#[derive(Debug, Clone, Default)]
pub struct OutgoingMessage {
    /// The payload.
    pub payload: Bytes,
    /// Routing and compaction key (also picks the partition).
    pub key: Option<String>,
    /// Application properties.
    pub properties: BTreeMap<String, String>,
    /// Application event time, ms since the epoch (0: none).
    pub event_time_ms: u64,
}

impl OutgoingMessage {
    /// A message with just a payload.
    pub fn new(payload: impl Into<Bytes>) -> OutgoingMessage {
        OutgoingMessage {
            payload: payload.into(),
            ..OutgoingMessage::default()
        }
    }

    /// Sets the key.
    pub fn with_key(mut self, key: impl Into<String>) -> OutgoingMessage {
        self.key = Some(key.into());
        self
    }
}

/// A received message.
#[derive(Debug, Clone)]
pub struct Message {
    /// Its id (ack with it).
    pub id: MessageId,
    /// The payload (decompressed).
    pub payload: Bytes,
    /// The key, if any.
    pub key: Option<String>,
    /// Application properties.
    pub properties: BTreeMap<String, String>,
    /// Producer's publish time, ms since the epoch.
    pub publish_time_ms: u64,
    /// Application event time, ms (0: none).
    pub event_time_ms: u64,
    /// Times the broker delivered it before.
    pub redelivery_count: u32,
    /// Producer name.
    pub producer_name: String,
    /// Sequence id given by the producer.
    pub sequence_id: u64,
}
