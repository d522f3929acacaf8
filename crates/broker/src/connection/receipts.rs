//! A producer's receipts: the jobs its SENDs leave (an append to await, a
//! duplicate, an error, CLOSE_PRODUCER), answered strictly in SEND order,
//! with no task per SEND: each append's completion (`AppendFuture::then`,
//! on the ledger writer's task once the entry is durable) turns its job
//! into a ready frame and sends every ready frame at the front of the
//! queue to the connection's writer. A task exists only while the writer's
//! queue is full (`Queue::sending`); it sends the waiting frames in order
//! and ends. An idle producer costs this struct (~250 bytes), not a parked
//! task and a channel (~1.4 KiB).
//!
//! Owns: [`Receipts`] (the queue, bounded by the connection's pending
//! sends plus one). Guarantees: frames leave in SEND order: only the front
//! of the queue is sent, by whoever holds the queue's lock (a `try_send`)
//! or by the one sending task (`sending`, set and cleared under the same
//! lock); no SEND_RECEIPT before its append resolved (durable: the log
//! confirms only what Qa bookies made durable); deduplication is told of
//! every append as it resolves, even after the connection closed or the
//! producer closed; CLOSE_PRODUCER is answered after every receipt before
//! it. Never: answers a SEND out of order, awaits an append on the
//! connection's reader task, or blocks the thread completing an append.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::{Mutex, MutexGuard};
use tokio::sync::mpsc::error::TrySendError;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use vela_log::{AppendFuture, AppendResult, Position};
use vela_wire::proto::{self, ServerError};

use super::admission::receipt;
use crate::codec::{self, Outbound};
use crate::error::ServiceError;
use crate::service::Service;
use crate::topic::Topic;

pub(super) enum ReceiptJob {
    Send {
        append: AppendFuture,
        awaited: Awaited,
    },
    Duplicate {
        sequence_id: u64,
        highest_sequence_id: u64,
        _permits: Permits,
    },
    Error {
        sequence_id: u64,
        code: ServerError,
        message: String,
    },
    Close {
        request_id: u64,
    },
}

pub(super) type Permits = (OwnedSemaphorePermit, OwnedSemaphorePermit);

/// A SEND whose append is awaited: what its receipt needs.
pub(super) struct Awaited {
    pub(super) sequence_id: u64,
    pub(super) highest_sequence_id: u64,
    pub(super) received: Instant,
    /// When the append was issued (storage write latency starts).
    pub(super) issued: Instant,
    pub(super) topic_metrics: Arc<crate::metrics::TopicMetrics>,
    /// The SEND's transaction: its buffer learns where the entry landed.
    pub(super) txn: Option<crate::txn_buffer::TxnKey>,
    /// Held until the receipt is answered (the connection's pending bounds).
    pub(super) permits: Permits,
}

/// A job's answer, once known.
enum Ready {
    /// A frame to send.
    Frame {
        frame: Outbound,
        /// The position of the receipt it carries.
        position: Option<Position>,
        /// The SEND's transaction, told where its entry landed when the
        /// receipt leaves the queue (in SEND order).
        txn: Option<crate::txn_buffer::TxnKey>,
        /// The SEND's share of the connection's pending bounds, given back
        /// once it is answered.
        _permits: Option<Permits>,
    },
    /// CLOSE_PRODUCER's SUCCESS: nothing after it is answered.
    Close(Outbound),
}

/// The jobs waiting, oldest first, each answered (`Some`) or not yet.
#[derive(Default)]
struct Queue {
    slots: VecDeque<Option<Ready>>,
    /// Ticket of `slots[0]`; a job's ticket is its place in SEND order.
    first_ticket: u64,
    /// A task sends the front frames (the writer's queue was full): nobody
    /// else sends until it cleared this.
    sending: bool,
    /// CLOSE_PRODUCER was answered: later jobs are dropped.
    closed: bool,
    /// The last receipt's position: they increase (appends are issued in
    /// SEND order and the log gives increasing positions).
    last_appended: Option<Position>,
}

/// One producer's receipts (shared by the connection and the appends'
/// completions).
pub(super) struct Receipts {
    producer_id: u64,
    topic: Arc<Topic>,
    producer_name: String,
    out: mpsc::Sender<Outbound>,
    service: Arc<Service>,
    /// Where a sending task starts when the writer's queue is full (an
    /// append may complete on a thread outside the runtime).
    runtime: tokio::runtime::Handle,
    queue: Mutex<Queue>,
    /// Free slots of the queue: a full queue makes `push` wait (the
    /// connection's reader with it). Closed after CLOSE_PRODUCER.
    room: Semaphore,
    /// The connection's writer is gone: frames are no longer sent (the
    /// appends are still followed).
    connection_gone: AtomicBool,
}

impl Receipts {
    /// The receipts of producer `producer_id` of `topic`, at most
    /// `capacity` jobs queued. Called on the connection's runtime.
    pub(super) fn new(
        producer_id: u64,
        (topic, producer_name): (Arc<Topic>, String),
        out: mpsc::Sender<Outbound>,
        service: Arc<Service>,
        capacity: usize,
    ) -> Arc<Receipts> {
        Arc::new(Receipts {
            producer_id,
            topic,
            producer_name,
            out,
            service,
            runtime: tokio::runtime::Handle::current(),
            queue: Mutex::new(Queue::default()),
            room: Semaphore::new(capacity.clamp(1, Semaphore::MAX_PERMITS)),
            connection_gone: AtomicBool::new(false),
        })
    }

    /// Queues a job (waiting while the queue is full). A SEND's receipt is
    /// sent once its append resolves and every job before it was answered;
    /// other jobs as soon as every job before them was. After
    /// CLOSE_PRODUCER the job is dropped (an append's outcome still reaches
    /// deduplication).
    pub(super) async fn push(self: &Arc<Self>, job: ReceiptJob) {
        let (ready, awaited) = match job {
            ReceiptJob::Send { append, awaited } => (None, Some((append, awaited))),
            other => (Some(self.answer_now(other)), None),
        };
        let ticket = match self.room.acquire().await {
            Ok(slot) => {
                slot.forget();
                let mut queue = self.queue.lock();
                if queue.closed {
                    drop(queue);
                    self.room.add_permits(1);
                    None
                } else {
                    let ticket = queue.first_ticket + queue.slots.len() as u64;
                    queue.slots.push_back(ready);
                    if awaited.is_none() {
                        self.send_ready(queue);
                    }
                    Some(ticket)
                }
            }
            Err(_) => None, // closed
        };
        if let Some((append, awaited)) = awaited {
            let receipts = Arc::clone(self);
            append.then(move |result| receipts.resolved(ticket, awaited, result));
        }
    }

    /// An append resolved: deduplication and the transaction buffer learn
    /// it, and its job (if still queued: `ticket`) gets its frame.
    fn resolved(self: &Arc<Self>, ticket: Option<u64>, awaited: Awaited, result: AppendResult) {
        let (frame, position) = self.answer_append(&awaited, result);
        let permits = awaited.permits;
        let Some(ticket) = ticket else {
            return;
        };
        let mut queue = self.queue.lock();
        if queue.closed {
            return;
        }
        let Some(slot) = ticket
            .checked_sub(queue.first_ticket)
            .and_then(|index| queue.slots.get_mut(index as usize))
        else {
            debug_assert!(
                false,
                "a receipt's job left the queue before its append resolved"
            );
            return;
        };
        debug_assert!(slot.is_none(), "an append resolved twice");
        *slot = Some(Ready::Frame {
            frame,
            position,
            txn: awaited.txn,
            _permits: Some(permits),
        });
        self.send_ready(queue);
    }

    /// Sends the answered jobs at the front, in order, unless a sending
    /// task does (it sends them). A full writer queue starts that task.
    fn send_ready(self: &Arc<Self>, mut queue: MutexGuard<'_, Queue>) {
        if queue.sending {
            return;
        }
        while let Some(ready) = self.pop_ready(&mut queue) {
            let (frame, closes) = match ready {
                Ready::Frame { frame, .. } => (frame, false),
                Ready::Close(frame) => (frame, true),
            };
            if closes || !self.connection_gone.load(Ordering::Relaxed) {
                match self.out.try_send(frame) {
                    Ok(()) => {}
                    Err(TrySendError::Full(frame)) => {
                        queue.sending = true;
                        drop(queue);
                        let receipts = Arc::clone(self);
                        self.runtime
                            .spawn(async move { receipts.send_waiting(frame, closes).await });
                        return;
                    }
                    Err(TrySendError::Closed(_)) => {
                        self.connection_gone.store(true, Ordering::Relaxed);
                    }
                }
            }
            if closes {
                let dropped = self.close_queue(&mut queue);
                drop(queue);
                drop(dropped);
                return;
            }
        }
    }

    /// The sending task: sends `frame` (waiting for room in the writer's
    /// queue), then every answered job at the front, until none is left.
    async fn send_waiting(self: Arc<Self>, mut frame: Outbound, mut closes: bool) {
        loop {
            if (closes || !self.connection_gone.load(Ordering::Relaxed))
                && self.out.send(frame).await.is_err()
            {
                self.connection_gone.store(true, Ordering::Relaxed);
            }
            let mut queue = self.queue.lock();
            debug_assert!(queue.sending, "a sending task without the flag");
            if closes {
                queue.sending = false;
                let dropped = self.close_queue(&mut queue);
                drop(queue);
                drop(dropped);
                return;
            }
            match self.pop_ready(&mut queue) {
                Some(Ready::Frame { frame: next, .. }) => (frame, closes) = (next, false),
                Some(Ready::Close(next)) => (frame, closes) = (next, true),
                None => {
                    queue.sending = false;
                    return;
                }
            }
        }
    }

    /// Takes the front job if it was answered, giving its slot back; a
    /// SEND's transaction learns where its entry landed here, in SEND
    /// order.
    fn pop_ready(&self, queue: &mut Queue) -> Option<Ready> {
        if !matches!(queue.slots.front(), Some(Some(_))) {
            // An empty queue keeps no slots (~0.5 KiB per idle producer
            // otherwise): the next SEND allocates them again, one allocation
            // per burst.
            if queue.slots.is_empty() && queue.slots.capacity() > 0 {
                queue.slots = VecDeque::new();
            }
            return None;
        }
        let ready = queue.slots.pop_front().flatten()?;
        queue.first_ticket += 1;
        self.room.add_permits(1);
        if let Ready::Frame {
            position: Some(position),
            txn,
            ..
        } = &ready
        {
            debug_assert!(
                queue.last_appended.is_none_or(|last| *position > last),
                "a receipt out of SEND order: {position} after {:?}",
                queue.last_appended
            );
            queue.last_appended = Some(*position);
            if let Some(txn) = txn {
                self.topic.txn_appended(*txn, *position);
            }
        }
        Some(ready)
    }

    /// CLOSE_PRODUCER was answered: later jobs are dropped (returned, to
    /// be dropped outside the lock) and `push` refuses new ones.
    fn close_queue(&self, queue: &mut Queue) -> VecDeque<Option<Ready>> {
        queue.closed = true;
        self.room.close();
        std::mem::take(&mut queue.slots)
    }

    /// The answer of a SEND whose append resolved; deduplication and the
    /// transaction buffer learn the outcome here, as it resolves.
    fn answer_append(
        &self,
        awaited: &Awaited,
        result: AppendResult,
    ) -> (Outbound, Option<Position>) {
        let sequence_id = awaited.sequence_id;
        match result {
            Ok(position) => {
                // Durable: re-sends of it are duplicates from now on.
                self.topic.dedup_persisted(
                    &self.producer_name,
                    (sequence_id as i64).max(awaited.highest_sequence_id as i64),
                );
                let durable = Instant::now();
                let appended = durable.saturating_duration_since(awaited.issued);
                awaited.topic_metrics.storage_write_latency.record(appended);
                self.service.metrics.append_latency.record(appended);
                let frame = receipt(
                    self.producer_id,
                    sequence_id,
                    awaited.highest_sequence_id,
                    position.ledger_id,
                    position.entry_id,
                );
                let frame = match frame {
                    // Recorded by the writer once the receipt is out.
                    Outbound::Simple(frame) => Outbound::Receipt {
                        frame,
                        timing: crate::metrics::PublishTiming {
                            received: awaited.received,
                            durable,
                            topic: Arc::clone(&awaited.topic_metrics),
                        },
                    },
                    other => other,
                };
                (frame, Some(position))
            }
            Err(e) => {
                // Not in the log: the client's re-send must be appended.
                self.topic.dedup_append_failed();
                self.service
                    .metrics
                    .send_errors
                    .fetch_add(1, Ordering::Relaxed);
                tracing::warn!(producer_id = self.producer_id, sequence_id, error = %e, "append failed");
                // The reason goes to the client (e.g. "not enough writable
                // bookies ... read-only (disk full or failing)").
                let error = ServiceError::from(e);
                let frame = codec::encode_command(proto::CommandSendError {
                    producer_id: self.producer_id,
                    sequence_id,
                    error: error.code as i32,
                    message: match error.code {
                        ServerError::TopicTerminatedError => error.message,
                        _ => format!("persistence failure: {}", error.message),
                    },
                });
                (frame, None)
            }
        }
    }

    /// The answer of a job that awaits nothing.
    fn answer_now(&self, job: ReceiptJob) -> Ready {
        let frame = match job {
            ReceiptJob::Send { .. } => unreachable!("a SEND awaits its append"),
            ReceiptJob::Duplicate {
                sequence_id,
                highest_sequence_id,
                _permits,
            } => {
                let frame = receipt(
                    self.producer_id,
                    sequence_id,
                    highest_sequence_id,
                    u64::MAX,
                    u64::MAX,
                );
                return Ready::Frame {
                    frame,
                    position: None,
                    txn: None,
                    _permits: Some(_permits),
                };
            }
            ReceiptJob::Error {
                sequence_id,
                code,
                message,
            } => {
                self.service
                    .metrics
                    .send_errors
                    .fetch_add(1, Ordering::Relaxed);
                codec::encode_command(proto::CommandSendError {
                    producer_id: self.producer_id,
                    sequence_id,
                    error: code as i32,
                    message,
                })
            }
            ReceiptJob::Close { request_id } => {
                return Ready::Close(codec::encode_command(proto::CommandSuccess {
                    request_id,
                    schema: None,
                }));
            }
        };
        Ready::Frame {
            frame,
            position: None,
            txn: None,
            _permits: None,
        }
    }
}
