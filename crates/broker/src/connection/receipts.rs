//! A producer's receipts: the jobs its SENDs leave (an append to await, a
//! duplicate, an error, CLOSE_PRODUCER), answered strictly in SEND order
//! by a task that runs only while jobs wait: the first job queued while
//! none runs spawns it, and it ends once the queue is empty. An idle
//! producer costs this struct (~200 bytes), not a parked task and a
//! channel (~1.4 KiB).
//!
//! Owns: [`Receipts`] (the queue, bounded by the connection's pending
//! sends plus one, and the drain task). Guarantees: one drain task at a
//! time (the queue's `draining` flag, set by the push that spawns it,
//! cleared under the same lock when the queue is found empty), so receipts
//! keep SEND order; appends in flight are awaited even after the
//! connection closed (deduplication learns from each whether it is
//! durable); CLOSE_PRODUCER is answered after every receipt before it.
//! Never: answers a SEND out of order, or awaits an append on the
//! connection's reader task.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use vela_log::{AppendFuture, Position};
use vela_wire::proto::{self, ServerError};

use super::admission::receipt;
use crate::codec::{self, Outbound};
use crate::error::ServiceError;
use crate::service::Service;
use crate::topic::Topic;

pub(super) enum ReceiptJob {
    Send {
        sequence_id: u64,
        highest_sequence_id: u64,
        received: Instant,
        /// When the append was issued (storage write latency starts).
        issued: Instant,
        append: AppendFuture,
        topic_metrics: Arc<crate::metrics::TopicMetrics>,
        /// The SEND's transaction: its buffer learns where the entry landed.
        txn: Option<crate::txn_buffer::TxnKey>,
        _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
    },
    Duplicate {
        sequence_id: u64,
        highest_sequence_id: u64,
        _permits: (OwnedSemaphorePermit, OwnedSemaphorePermit),
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

/// The jobs waiting and who answers them.
#[derive(Default)]
struct Queue {
    jobs: VecDeque<ReceiptJob>,
    /// A drain task runs and answers every job queued until it finds the
    /// queue empty.
    draining: bool,
    /// CLOSE_PRODUCER was answered: later jobs are dropped.
    closed: bool,
}

/// One producer's receipts (shared by the connection and the drain task).
pub(super) struct Receipts {
    producer_id: u64,
    topic: Arc<Topic>,
    producer_name: String,
    out: mpsc::Sender<Outbound>,
    service: Arc<Service>,
    queue: Mutex<Queue>,
    /// Free slots of the queue: a full queue makes `push` wait (the
    /// connection's reader with it). Closed after CLOSE_PRODUCER.
    room: Semaphore,
    /// The connection's writer is gone: receipts are no longer sent (the
    /// appends are still awaited).
    connection_gone: AtomicBool,
    /// The last receipt's position: they increase (appends are issued in
    /// SEND order and the log gives increasing positions).
    last_appended: Mutex<Option<Position>>,
}

/// What answering a job did.
enum Answered {
    Sent,
    /// CLOSE_PRODUCER: nothing more is answered.
    Closed,
}

impl Receipts {
    /// The receipts of producer `producer_id` of `topic`, at most
    /// `capacity` jobs queued.
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
            queue: Mutex::new(Queue::default()),
            room: Semaphore::new(capacity.clamp(1, Semaphore::MAX_PERMITS)),
            connection_gone: AtomicBool::new(false),
            last_appended: Mutex::new(None),
        })
    }

    /// Queues a job (waiting while the queue is full), starting the drain
    /// task if none runs. After CLOSE_PRODUCER the job is dropped.
    pub(super) async fn push(self: &Arc<Self>, job: ReceiptJob) {
        let Ok(slot) = self.room.acquire().await else {
            return; // closed
        };
        slot.forget();
        let start = {
            let mut queue = self.queue.lock();
            if queue.closed {
                drop(queue);
                self.room.add_permits(1);
                return;
            }
            queue.jobs.push_back(job);
            !std::mem::replace(&mut queue.draining, true)
        };
        if start {
            tokio::spawn(Arc::clone(self).drain());
        }
    }

    /// Answers jobs in order until the queue is empty or closed.
    async fn drain(self: Arc<Self>) {
        loop {
            let job = {
                let mut queue = self.queue.lock();
                debug_assert!(queue.draining, "a drain task without the flag");
                match queue.jobs.pop_front() {
                    Some(job) => job,
                    None => {
                        queue.draining = false;
                        // An idle producer keeps no slots (4 jobs, ~0.5
                        // KiB, after its first SEND): the next drain task
                        // allocates them again, beside its own spawn.
                        queue.jobs = VecDeque::new();
                        return;
                    }
                }
            };
            self.room.add_permits(1);
            if let Answered::Closed = self.answer(job).await {
                let dropped = {
                    let mut queue = self.queue.lock();
                    queue.closed = true;
                    queue.draining = false;
                    std::mem::take(&mut queue.jobs)
                };
                self.room.close();
                drop(dropped);
                return;
            }
        }
    }

    async fn answer(&self, job: ReceiptJob) -> Answered {
        let metrics = &self.service.metrics;
        let frame = match job {
            ReceiptJob::Send {
                sequence_id,
                highest_sequence_id,
                received,
                issued,
                append,
                topic_metrics,
                txn,
                _permits,
            } => match append.await {
                Ok(position) => {
                    if let Some(txn) = txn {
                        self.topic.txn_appended(txn, position);
                    }
                    // Durable: re-sends of it are duplicates from now on.
                    self.topic.dedup_persisted(
                        &self.producer_name,
                        (sequence_id as i64).max(highest_sequence_id as i64),
                    );
                    let mut last_appended = self.last_appended.lock();
                    debug_assert!(
                        last_appended.is_none_or(|last| position > last),
                        "a receipt out of SEND order: {position} after {last_appended:?}"
                    );
                    *last_appended = Some(position);
                    let durable = Instant::now();
                    topic_metrics
                        .storage_write_latency
                        .record(durable.saturating_duration_since(issued));
                    let frame = receipt(
                        self.producer_id,
                        sequence_id,
                        highest_sequence_id,
                        position.ledger_id,
                        position.entry_id,
                    );
                    match frame {
                        // Recorded by the writer once the receipt is out.
                        Outbound::Simple(frame) => Outbound::Receipt {
                            frame,
                            timing: crate::metrics::PublishTiming {
                                received,
                                topic: topic_metrics,
                            },
                        },
                        other => other,
                    }
                }
                Err(e) => {
                    // Not in the log: the client's re-send must be appended.
                    self.topic.dedup_append_failed();
                    metrics
                        .send_errors
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    tracing::warn!(producer_id = self.producer_id, sequence_id, error = %e, "append failed");
                    // The reason goes to the client (e.g. "not enough writable
                    // bookies ... read-only (disk full or failing)").
                    let error = ServiceError::from(e);
                    codec::encode_command(proto::CommandSendError {
                        producer_id: self.producer_id,
                        sequence_id,
                        error: error.code as i32,
                        message: match error.code {
                            ServerError::TopicTerminatedError => error.message,
                            _ => format!("persistence failure: {}", error.message),
                        },
                    })
                }
            },
            ReceiptJob::Duplicate {
                sequence_id,
                highest_sequence_id,
                _permits,
            } => receipt(
                self.producer_id,
                sequence_id,
                highest_sequence_id,
                u64::MAX,
                u64::MAX,
            ),
            ReceiptJob::Error {
                sequence_id,
                code,
                message,
            } => {
                metrics
                    .send_errors
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                codec::encode_command(proto::CommandSendError {
                    producer_id: self.producer_id,
                    sequence_id,
                    error: code as i32,
                    message,
                })
            }
            ReceiptJob::Close { request_id } => {
                let _ = self
                    .out
                    .send(codec::encode_command(proto::CommandSuccess {
                        request_id,
                        schema: None,
                    }))
                    .await;
                return Answered::Closed;
            }
        };
        // A closed connection still lets the appends in flight resolve:
        // deduplication learns from each whether it is durable (else a
        // re-send on the next connection would be "unknown" for ever).
        if !self.connection_gone.load(Ordering::Relaxed) && self.out.send(frame).await.is_err() {
            self.connection_gone.store(true, Ordering::Relaxed);
        }
        Answered::Sent
    }
}
