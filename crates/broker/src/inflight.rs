//! Byte budgets for messages in flight that nothing stores: a
//! non-persistent topic's MESSAGE frames between the topic handing them to
//! a consumer's connection and that connection's writer putting them on the
//! socket.
//!
//! Owns: [`ByteBudget`] (a byte count under a named maximum) and [`Charge`]
//! (bytes taken from one or more budgets, given back when dropped: the
//! writer drops it once the frame is written, and a frame dropped unwritten
//! gives its bytes back the same way). Guarantees: a budget's count never
//! exceeds its maximum; what a charge took is returned exactly once.
//! Never: waits for room: a charge that does not fit is refused, and the
//! caller drops the message (Pulsar's non-persistent semantics).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

/// Bytes in flight, bounded.
#[derive(Debug)]
pub(crate) struct ByteBudget {
    used_bytes: AtomicU64,
    max_bytes: u64,
}

impl ByteBudget {
    /// A budget of `max_bytes`.
    pub(crate) fn new(max_bytes: u64) -> Arc<ByteBudget> {
        Arc::new(ByteBudget {
            used_bytes: AtomicU64::new(0),
            max_bytes,
        })
    }

    /// Bytes taken now.
    pub(crate) fn used_bytes(&self) -> u64 {
        self.used_bytes.load(Ordering::Relaxed)
    }

    /// Whether nothing more fits.
    pub(crate) fn is_full(&self) -> bool {
        self.used_bytes() >= self.max_bytes
    }

    /// Takes `bytes` if they fit under the maximum.
    fn take(&self, bytes: u64) -> bool {
        self.used_bytes
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes)
                    .filter(|after| *after <= self.max_bytes)
            })
            .is_ok()
    }

    fn give_back(&self, bytes: u64) {
        let before = self.used_bytes.fetch_sub(bytes, Ordering::AcqRel);
        debug_assert!(before >= bytes, "a budget gave back more than it lent");
    }
}

/// Bytes taken from two budgets (a topic's and the broker's), returned to
/// both when dropped.
#[derive(Debug)]
pub(crate) struct Charge {
    bytes: u64,
    budgets: [Arc<ByteBudget>; 2],
}

impl Charge {
    /// Takes `bytes` from both budgets, or from neither when either is full.
    pub(crate) fn take(
        topic: &Arc<ByteBudget>,
        broker: &Arc<ByteBudget>,
        bytes: u64,
    ) -> Option<Charge> {
        if !topic.take(bytes) {
            return None;
        }
        if !broker.take(bytes) {
            topic.give_back(bytes);
            return None;
        }
        Some(Charge {
            bytes,
            budgets: [Arc::clone(topic), Arc::clone(broker)],
        })
    }
}

impl Drop for Charge {
    fn drop(&mut self) {
        for budget in &self.budgets {
            budget.give_back(self.bytes);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn charges_fit_under_both_budgets_and_come_back_on_drop() {
        let topic = ByteBudget::new(100);
        let broker = ByteBudget::new(150);
        let first = Charge::take(&topic, &broker, 60);
        assert!(first.is_some());
        // The topic's budget has 40 left.
        assert!(Charge::take(&topic, &broker, 50).is_none());
        assert_eq!((topic.used_bytes(), broker.used_bytes()), (60, 60));
        let other_topic = ByteBudget::new(100);
        let second = Charge::take(&other_topic, &broker, 90);
        assert!(second.is_some());
        // The broker's budget is full: the topic's bytes are given back.
        assert!(Charge::take(&topic, &broker, 1).is_none());
        assert_eq!(topic.used_bytes(), 60);
        assert!(broker.is_full());
        drop((first, second));
        assert_eq!((topic.used_bytes(), broker.used_bytes()), (0, 0));
    }
}
