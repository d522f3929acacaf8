//! The write side of a topic: the single-writer order of appends, the
//! publish rate, and the in-counters.
//!
//! Owns: [`Publisher`]. `append_lock` (a short mutex, a leaf) is held only
//! while `ManagedLog::append` issues the add, so entries reach the log in
//! the order their SENDs were handled; the append itself completes later,
//! outside any lock. The publish rate's buckets (`throttle`) have their own
//! short lock. A transaction buffer belongs beside this module.
//! Never: waits for an append while holding a lock, or parses payloads.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use parking_lot::Mutex;
use vela_log::{AppendFuture, AppendPermit, ManagedLog};

use super::throttle::PublishThrottle;
use crate::config::PublishRate;

/// The write side of one topic.
#[derive(Debug)]
pub(crate) struct Publisher {
    append_lock: Mutex<()>,
    /// Messages published since the topic opened (a batch counts its
    /// messages).
    msg_in: AtomicU64,
    /// Entry bytes published since the topic opened.
    bytes_in: AtomicU64,
    /// The publish rate's buckets (`None`: unlimited).
    throttle: Option<PublishThrottle>,
}

impl Publisher {
    pub(crate) fn new(rate: PublishRate) -> Publisher {
        Publisher {
            append_lock: Mutex::new(()),
            msg_in: AtomicU64::new(0),
            bytes_in: AtomicU64::new(0),
            throttle: PublishThrottle::new(rate, Instant::now()),
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
    /// returns, in call order; the future resolves once the entry is durable.
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
        let _writer = self.append_lock.lock();
        log.append_reserved(entry, permit)
    }
}
