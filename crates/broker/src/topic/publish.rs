//! The write side of a topic: appends, the publish rate, and the
//! in-counters.
//!
//! SEND order, the one statement of it in the broker. The log keeps order
//! (`ManagedLog::append`: no lock is needed around it, the order of calls
//! is the log order, successful appends complete in that order), so the
//! broker adds no lock of its own:
//! - a producer lives on one connection, whose reader task issues the
//!   appends of its SENDs one at a time in the order it read them, so a
//!   producer's entries are in SEND order; its receipts are answered in
//!   that order as the appends complete, asserting (debug) that their
//!   positions increase;
//! - producers are not ordered among themselves (Pulsar promises nothing
//!   across producers either);
//! - deduplication is the one thing that needs atomicity: checking a
//!   sequence id, recording it and issuing its append happen under the
//!   dedup table's lock (`DedupTable::check_and_append`), so the recorded
//!   ids follow the log's order even when two connections send for one
//!   producer name (a reconnecting producer whose old connection still
//!   sends, an epoch replacing it); an append the log refuses at once is
//!   un-recorded under the same lock. Without dedup no lock is taken.
//!
//! Owns: [`Publisher`]. The publish rate's buckets (`throttle`) have their
//! own short lock. A transaction buffer belongs beside this module.
//! Never: waits for an append while holding a lock, adds a lock, an
//! allocation or a copy of its own per SEND, or parses payloads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use vela_log::{AppendFuture, AppendPermit, ManagedLog};

use super::throttle::PublishThrottle;
use crate::config::PublishRate;

/// The write side of one topic.
#[derive(Debug)]
pub(crate) struct Publisher {
    /// Messages published since the topic opened (a batch counts its
    /// messages).
    msg_in: AtomicU64,
    /// Entry bytes published since the topic opened.
    bytes_in: AtomicU64,
    /// The publish rate's buckets (`None`: unlimited; boxed, ~100 bytes
    /// inline on every topic otherwise).
    throttle: Option<Box<PublishThrottle>>,
}

impl Publisher {
    pub(crate) fn new(rate: PublishRate) -> Publisher {
        Publisher {
            msg_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            throttle: PublishThrottle::new(rate, Instant::now()).map(Box::new),
        }
    }

    /// Messages published since the topic opened.
    pub(crate) fn msg_in(&self) -> u64 {
        self.msg_in.load(Ordering::Relaxed)
    }

    /// Entry bytes published since the topic opened.
    pub(crate) fn bytes_in(&self) -> u64 {
        self.bytes_in.load(Ordering::Relaxed)
    }

    /// Charges a SEND against the publish rate: how long the sending
    /// connection should stop reading (`None`: within the rate).
    pub(crate) fn pause(&self, messages: u32, bytes: usize) -> Option<Duration> {
        self.throttle
            .as_ref()?
            .charge(u64::from(messages), bytes as u64, Instant::now())
    }

    /// Appends a stored entry to `log`. The append is issued before this
    /// returns, in call order (the module doc says why no lock is needed),
    /// holding `permit` (its bytes of the broker's append budget) until it
    /// completes; the future resolves once the entry is durable.
    pub(crate) fn publish(
        &self,
        log: &ManagedLog,
        entry: Bytes,
        messages: u32,
        permit: AppendPermit,
    ) -> AppendFuture {
        self.msg_in
            .fetch_add(u64::from(messages), Ordering::Relaxed);
        self.bytes_in
            .fetch_add(entry.len() as u64, Ordering::Relaxed);
        log.append_reserved(entry, permit)
    }
}
