//! The consumer's receive queue: every partition's messages in arrival order,
//! with the bytes they hold, so the consumer can tell a broker's read
//! overshoot (which Pulsar's dispatchers do) from a broker that ignores the
//! permits.
//!
//! Owns: the queued messages and their byte count.
//! Never: decides what to do about an overflow (the consumer does).

use std::collections::VecDeque;

use crate::message::Message;

/// What one queued message is counted as beyond its payload, key and
/// properties: the struct itself, its id and producer name.
const MESSAGE_OVERHEAD_BYTES: usize = std::mem::size_of::<Message>() + 64;

/// Messages of every partition, tagged with the partition's index and the
/// bytes each is counted as (computed once, on arrival).
#[derive(Debug, Default)]
pub(crate) struct ReceiveQueue {
    messages: VecDeque<(usize, Message, usize)>,
    bytes: usize,
}

fn cost_bytes(message: &Message) -> usize {
    let properties: usize = message
        .properties
        .iter()
        .map(|(k, v)| k.len() + v.len())
        .sum();
    MESSAGE_OVERHEAD_BYTES
        + message.payload.len()
        + message.key.as_ref().map_or(0, String::len)
        + message.producer_name.len()
        + properties
}

impl ReceiveQueue {
    pub(crate) fn extend(&mut self, index: usize, messages: impl IntoIterator<Item = Message>) {
        for message in messages {
            let cost = cost_bytes(&message);
            self.bytes += cost;
            self.messages.push_back((index, message, cost));
        }
    }

    pub(crate) fn pop_front(&mut self) -> Option<(usize, Message)> {
        let (index, message, cost) = self.messages.pop_front()?;
        self.bytes -= cost;
        Some((index, message))
    }

    /// Drops every message of partition `index` (its connection was lost:
    /// the broker delivers them again).
    pub(crate) fn remove_partition(&mut self, index: usize) {
        let mut removed_bytes = 0;
        self.messages.retain(|(i, _, cost)| {
            let keep = *i != index;
            if !keep {
                removed_bytes += cost;
            }
            keep
        });
        self.bytes -= removed_bytes;
    }

    /// Whether the queue is past both bounds: a broker may send more
    /// messages than the permits (a batch goes whole, and Pulsar's
    /// dispatcher reads up to 100 entries for 1,000 permits) as long as
    /// they stay within the bytes of one read.
    pub(crate) fn is_past(&self, messages_max: usize, bytes_max: usize) -> bool {
        self.messages.len() > messages_max && self.bytes > bytes_max
    }

    #[cfg(test)]
    fn len(&self) -> usize {
        self.messages.len()
    }

    #[cfg(test)]
    fn bytes(&self) -> usize {
        self.bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use bytes::Bytes;

    fn message(payload_bytes: usize) -> Message {
        Message {
            id: crate::message::MessageId {
                ledger_id: 1,
                entry_id: 0,
                batch_index: -1,
                partition: -1,
            },
            payload: Bytes::from(vec![0u8; payload_bytes]),
            key: None,
            properties: Default::default(),
            publish_time_ms: 0,
            event_time_ms: 0,
            redelivery_count: 0,
            producer_name: String::new(),
            sequence_id: 0,
        }
    }

    #[test]
    fn bytes_follow_pushes_pops_and_partition_removal() {
        let mut queue = ReceiveQueue::default();
        queue.extend(0, [message(100), message(200)]);
        queue.extend(1, [message(1000)]);
        assert_eq!(queue.len(), 3);
        assert_eq!(queue.bytes(), 1300 + 3 * MESSAGE_OVERHEAD_BYTES);
        let (index, first) = queue.pop_front().expect("queued");
        assert_eq!((index, first.payload.len()), (0, 100));
        assert_eq!(queue.bytes(), 1200 + 2 * MESSAGE_OVERHEAD_BYTES);
        queue.remove_partition(1);
        assert_eq!(queue.len(), 1);
        assert_eq!(queue.bytes(), 200 + MESSAGE_OVERHEAD_BYTES);
        queue.pop_front().expect("queued");
        assert_eq!((queue.len(), queue.bytes()), (0, 0));
        assert!(queue.pop_front().is_none());
    }

    /// Pulsar's dispatcher answers 1,000 permits with up to 100 entries; with
    /// 1,000-message batches of 100 B that is 100,000 messages (~10 MB of
    /// payload): within one read's bytes, so not past. A broker that keeps
    /// sending past the permits goes past the bytes too.
    #[test]
    fn a_pulsar_read_of_100_batches_is_not_past_but_an_endless_stream_is() {
        let (permits, overshoot_messages, bytes_max) = (1000, 10_000, 64 * 1024 * 1024);
        let mut queue = ReceiveQueue::default();
        for _ in 0..100 {
            queue.extend(0, (0..1000).map(|_| message(100)));
        }
        assert_eq!(queue.len(), 100_000);
        assert!(!queue.is_past(permits + overshoot_messages, bytes_max));
        while !queue.is_past(permits + overshoot_messages, bytes_max) {
            queue.extend(0, (0..1000).map(|_| message(100)));
            assert!(queue.len() < 1_000_000, "never past: unbounded");
        }
        assert!(queue.bytes() > bytes_max);
    }
}
