//! vela-mailbox: a bounded multi-producer, single-consumer queue for the
//! command queues of long-lived tasks that are idle most of the time (one
//! per subscription, per producer, per open ledger: 100,000 topics hold
//! hundreds of thousands of them).
//!
//! Owns: the queued values, the count of senders, the waiting receiver and
//! the senders waiting for room. An idle mailbox is one allocation of about
//! 150 bytes: a mutex-guarded `VecDeque` that allocates only when values are
//! queued, a `Notify` and a `Semaphore`. (A tokio `mpsc` channel allocates
//! cache-padded state and its first block of 32 slots up front: ~800 bytes
//! with boxed values, idle or not.)
//! Guarantees: values come out in the order their `send` (or `try_send`)
//! returned; at most `capacity` values are queued (`send` waits for room);
//! `recv` is cancel safe (a `select!` may drop it: no value is lost); once
//! the receiver is gone or closed, sends fail and hand the value back; the
//! values queued when the receiver drops are dropped (their reply channels
//! tell their senders).
//! Never: blocks a thread (the mutex is held for a push or a pop only), or
//! holds more than `capacity` values.
//!
//! [`Parking`] (module `park`) goes with it: a task that exists only while
//! it has work, its state parked between runs; its hand-off rule says how
//! a wake-up (a value sent, an entry confirmed) is never lost.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use parking_lot::Mutex;
use tokio::sync::{Notify, Semaphore, TryAcquireError};

mod park;
pub use park::Parking;

/// Slots an empty mailbox keeps allocated; more are given back when it
/// empties.
const IDLE_CAPACITY_MAX: usize = 8;

/// A mailbox of at most `capacity` values (at least 1).
pub fn mailbox<T>(capacity: usize) -> (Sender<T>, Receiver<T>) {
    let capacity = capacity.clamp(1, Semaphore::MAX_PERMITS);
    let shared = Arc::new(Shared {
        queue: Mutex::new(VecDeque::new()),
        closed: AtomicBool::new(false),
        senders: AtomicUsize::new(1),
        readable: Notify::new(),
        room: Semaphore::new(capacity),
    });
    (
        Sender {
            shared: Arc::clone(&shared),
        },
        Receiver { shared },
    )
}

struct Shared<T> {
    queue: Mutex<VecDeque<T>>,
    /// The receiver closed or is gone: nothing more is accepted.
    closed: AtomicBool,
    senders: AtomicUsize,
    /// A value was queued, or the last sender left.
    readable: Notify,
    /// One permit per free slot; closed with the mailbox.
    room: Semaphore,
}

/// The receiver is closed or gone; the value comes back.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SendError<T>(pub T);

/// Why `try_send` did not queue the value (it comes back).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrySendError<T> {
    /// `capacity` values are queued.
    Full(T),
    /// The receiver is closed or gone.
    Closed(T),
}

/// Why `try_recv` returned nothing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TryRecvError {
    /// Nothing queued now.
    Empty,
    /// Nothing queued, and no sender is left (or the mailbox was closed).
    Disconnected,
}

/// A sending side; clone it for more senders.
pub struct Sender<T> {
    shared: Arc<Shared<T>>,
}

/// The receiving side (one).
pub struct Receiver<T> {
    shared: Arc<Shared<T>>,
}

impl<T> std::fmt::Debug for Sender<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Sender")
            .field("closed", &self.is_closed())
            .finish()
    }
}

impl<T> std::fmt::Debug for Receiver<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Receiver")
            .field("queued", &self.shared.queue.lock().len())
            .finish()
    }
}

impl<T> Clone for Sender<T> {
    fn clone(&self) -> Sender<T> {
        self.shared.senders.fetch_add(1, Ordering::Relaxed);
        Sender {
            shared: Arc::clone(&self.shared),
        }
    }
}

impl<T> Drop for Sender<T> {
    fn drop(&mut self) {
        if self.shared.senders.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The receiver may wait: it sees no sender is left.
            self.shared.readable.notify_one();
        }
    }
}

impl<T> Sender<T> {
    /// Queues `value`, waiting while the mailbox is full.
    pub async fn send(&self, value: T) -> Result<(), SendError<T>> {
        match self.shared.room.acquire().await {
            Ok(permit) => permit.forget(),
            Err(_) => return Err(SendError(value)),
        }
        self.push(value).map_err(SendError)
    }

    /// Queues `value` if there is room now.
    pub fn try_send(&self, value: T) -> Result<(), TrySendError<T>> {
        match self.shared.room.try_acquire() {
            Ok(permit) => permit.forget(),
            Err(TryAcquireError::NoPermits) => return Err(TrySendError::Full(value)),
            Err(TryAcquireError::Closed) => return Err(TrySendError::Closed(value)),
        }
        self.push(value).map_err(TrySendError::Closed)
    }

    /// True once the receiver closed the mailbox or is gone.
    pub fn is_closed(&self) -> bool {
        self.shared.closed.load(Ordering::Acquire)
    }

    /// Queues a value whose slot was taken.
    fn push(&self, value: T) -> Result<(), T> {
        {
            let mut queue = self.shared.queue.lock();
            // Checked under the lock: a receiver closing drains under it, so
            // nothing is queued after its drain.
            if self.shared.closed.load(Ordering::Acquire) {
                return Err(value);
            }
            queue.push_back(value);
        }
        self.shared.readable.notify_one();
        Ok(())
    }
}

impl<T> Receiver<T> {
    /// The next value; `None` once no sender is left (or the mailbox was
    /// closed) and nothing is queued. Cancel safe.
    pub async fn recv(&mut self) -> Option<T> {
        loop {
            let readable = self.shared.readable.notified();
            tokio::pin!(readable);
            // Registered before the queue is looked at: a push after the
            // look wakes this wait.
            readable.as_mut().enable();
            match take(&self.shared) {
                Ok(value) => return Some(value),
                Err(TryRecvError::Disconnected) => return None,
                Err(TryRecvError::Empty) => readable.await,
            }
        }
    }

    /// The next value if one is queued now.
    pub fn try_recv(&mut self) -> Result<T, TryRecvError> {
        take(&self.shared)
    }

    /// True when a `recv` would return at once: a value is queued, or no
    /// sender is left (or the mailbox was closed). A parking task asks this
    /// before it parks (`park`).
    pub fn is_ready(&self) -> bool {
        let queued = !self.shared.queue.lock().is_empty();
        queued
            || self.shared.senders.load(Ordering::Acquire) == 0
            || self.shared.closed.load(Ordering::Acquire)
    }

    /// Stops accepting values; those queued can still be received.
    pub fn close(&mut self) {
        self.shared.closed.store(true, Ordering::Release);
        self.shared.room.close();
    }
}

impl<T> Drop for Receiver<T> {
    fn drop(&mut self) {
        let queued = {
            let mut queue = self.shared.queue.lock();
            self.shared.closed.store(true, Ordering::Release);
            std::mem::take(&mut *queue)
        };
        self.shared.room.close();
        // Dropped outside the lock: a value's drop may send elsewhere.
        drop(queued);
    }
}

/// Pops the next value (the receiver's; one receiver, so no race on the
/// pop itself).
fn take<T>(shared: &Shared<T>) -> Result<T, TryRecvError> {
    let popped = {
        let mut queue = shared.queue.lock();
        let popped = queue.pop_front();
        if queue.is_empty() && queue.capacity() > IDLE_CAPACITY_MAX {
            // A burst's slots are not kept by an idle mailbox.
            *queue = VecDeque::new();
        }
        popped
    };
    match popped {
        Some(value) => {
            shared.room.add_permits(1);
            Ok(value)
        }
        None if shared.senders.load(Ordering::Acquire) == 0
            || shared.closed.load(Ordering::Acquire) =>
        {
            Err(TryRecvError::Disconnected)
        }
        None => Err(TryRecvError::Empty),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;
    use std::time::Duration;

    #[tokio::test]
    async fn values_come_out_in_order() {
        let (tx, mut rx) = mailbox(4);
        for i in 0..4 {
            tx.send(i).await.unwrap();
        }
        for i in 0..4 {
            assert_eq!(rx.recv().await, Some(i));
        }
    }

    #[tokio::test]
    async fn a_full_mailbox_makes_send_wait_until_a_value_is_taken() {
        let (tx, mut rx) = mailbox(2);
        tx.send(1).await.unwrap();
        tx.send(2).await.unwrap();
        assert_eq!(tx.try_send(3), Err(TrySendError::Full(3)));
        let tx2 = tx.clone();
        let waiting = tokio::spawn(async move { tx2.send(3).await });
        tokio::time::sleep(Duration::from_millis(20)).await;
        assert!(
            !waiting.is_finished(),
            "send waits while the mailbox is full"
        );
        assert_eq!(rx.recv().await, Some(1));
        waiting.await.unwrap().unwrap();
        assert_eq!(rx.recv().await, Some(2));
        assert_eq!(rx.recv().await, Some(3));
    }

    #[tokio::test]
    async fn recv_ends_when_the_last_sender_is_dropped() {
        let (tx, mut rx) = mailbox::<u32>(2);
        let tx2 = tx.clone();
        tx.send(7).await.unwrap();
        drop(tx);
        let waiting = tokio::spawn(async move {
            let first = rx.recv().await;
            let second = rx.recv().await;
            (first, second)
        });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(tx2);
        assert_eq!(waiting.await.unwrap(), (Some(7), None));
    }

    #[tokio::test]
    async fn sends_fail_once_the_receiver_is_gone_and_queued_values_are_dropped() {
        let (tx, rx) = mailbox(1);
        let (reply, answer) = tokio::sync::oneshot::channel::<()>();
        tx.send(reply).await.unwrap();
        let tx2 = tx.clone();
        let (other, _) = tokio::sync::oneshot::channel::<()>();
        let blocked = tokio::spawn(async move { tx2.send(other).await.is_err() });
        tokio::time::sleep(Duration::from_millis(20)).await;
        drop(rx);
        assert!(blocked.await.unwrap(), "a send waiting for room fails");
        assert!(answer.await.is_err(), "the queued value was dropped");
        assert!(tx.is_closed());
        let (late, _) = tokio::sync::oneshot::channel::<()>();
        assert!(tx.send(late).await.is_err());
    }

    #[tokio::test]
    async fn close_keeps_queued_values_and_refuses_new_ones() {
        let (tx, mut rx) = mailbox(4);
        tx.send(1).await.unwrap();
        rx.close();
        assert_eq!(tx.try_send(2), Err(TrySendError::Closed(2)));
        assert_eq!(rx.try_recv(), Ok(1));
        assert_eq!(rx.try_recv(), Err(TryRecvError::Disconnected));
        assert_eq!(rx.recv().await, None);
    }

    #[tokio::test]
    async fn a_dropped_recv_loses_nothing() {
        let (tx, mut rx) = mailbox(4);
        // A recv cancelled while waiting, then a value: the next recv has it.
        let cancelled = tokio::time::timeout(Duration::from_millis(10), rx.recv()).await;
        assert!(cancelled.is_err());
        tx.send(5).await.unwrap();
        assert_eq!(rx.recv().await, Some(5));
        // Values sent while nobody waits are all there.
        for i in 0..3 {
            tx.send(i).await.unwrap();
        }
        for i in 0..3 {
            assert_eq!(rx.recv().await, Some(i));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn many_senders_every_value_once_in_each_senders_order() {
        let (tx, mut rx) = mailbox(8);
        let mut tasks = Vec::new();
        for sender in 0..4u64 {
            let tx = tx.clone();
            tasks.push(tokio::spawn(async move {
                for i in 0..1000u64 {
                    tx.send((sender, i)).await.unwrap();
                }
            }));
        }
        drop(tx);
        let mut next = [0u64; 4];
        while let Some((sender, i)) = rx.recv().await {
            assert_eq!(next[sender as usize], i, "a sender's values in order");
            next[sender as usize] += 1;
        }
        assert_eq!(next, [1000; 4]);
        for task in tasks {
            task.await.unwrap();
        }
    }

    #[test]
    fn an_idle_mailbox_is_small() {
        // The point of this crate: what a parked task's queue costs.
        let shared = std::mem::size_of::<Shared<Box<u64>>>();
        assert!(shared <= 192, "Shared is {shared} bytes");
    }
}
