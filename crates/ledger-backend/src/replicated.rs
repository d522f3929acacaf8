//! The log's ledgers on bookies: `LedgerBackend` over `vela_ledger::LedgerClient`.
//!
//! Owns: the adaptation of the log's synchronous, ordered `add(data, done)` to
//! the ledger writer's bounded budget (an ordered overflow queue fed by one
//! task while the writer is at its bound), and a small cache of ledger readers.
//! Guarantees: adds reach the writer in call order, so entry ids and `done`
//! callbacks follow it; `done` runs only once Qa bookies made the entry durable.
//! Never: reorders adds, waits on a tokio worker, or lets the overflow queue
//! grow past `OVERFLOW_BYTES_MAX` (an add beyond it fails, which stops the log's
//! appends until it is reloaded: back-pressure above normally stops producers
//! long before).

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;
use vela_ledger::{
    AddCallback, EntryId, LedgerClient, LedgerError, LedgerId, LedgerReader, LedgerState,
    LedgerWriter, Quorum, READ_RANGE_ENTRIES_MAX,
};

use vela_log::backend::{
    AddCallback as LogAddCallback, BoxFuture, LedgerAppender, LedgerBackend, LedgerBackendError,
    LedgerDescription, Persistence, RecoveredLedger,
};

/// Payload bytes of adds waiting for the writer's budget, per ledger. The
/// writer itself holds up to `vela_ledger::PENDING_BYTES_MAX` (64 MiB) in
/// flight; this is as much again, queued in order. Beyond it an add fails.
pub const OVERFLOW_BYTES_MAX: u64 = 64 << 20;

/// Ledger readers kept open (closed ledgers mostly: a reader is only their
/// metadata). When full, the cache is cleared: readers are cheap to reopen.
const READERS_CACHED_MAX: usize = 1024;

/// Metadata property naming the log a ledger belongs to (for operators and
/// for finding orphans).
const LOG_PROPERTY: &str = "vela.log";

/// Ledgers replicated on bookies.
#[derive(Debug)]
pub struct ReplicatedLedgers {
    client: LedgerClient,
    readers: Mutex<HashMap<u64, Arc<LedgerReader>>>,
}

impl ReplicatedLedgers {
    /// Ledgers created, read and deleted through `client`.
    pub fn new(client: LedgerClient) -> ReplicatedLedgers {
        ReplicatedLedgers {
            client,
            readers: Mutex::new(HashMap::new()),
        }
    }

    /// A reader that may read up to `last_entry_id`: the cached one if it
    /// reaches that far, else a fresh one (the log only reads confirmed
    /// entries, so an open ledger is read up to `last_entry_id` without a LAC
    /// round trip).
    async fn reader(
        &self,
        ledger_id: u64,
        last_entry_id: u64,
    ) -> Result<Arc<LedgerReader>, LedgerError> {
        if let Some(reader) = self.readers.lock().get(&ledger_id)
            && reader.last_readable() >= Some(EntryId(last_entry_id))
        {
            return Ok(Arc::clone(reader));
        }
        let reader = Arc::new(
            self.client
                .open_for_read_confirmed(LedgerId(ledger_id), EntryId(last_entry_id))
                .await?,
        );
        let mut readers = self.readers.lock();
        if readers.len() >= READERS_CACHED_MAX {
            readers.clear();
        }
        readers.insert(ledger_id, Arc::clone(&reader));
        Ok(reader)
    }
}

fn backend_error(error: LedgerError) -> LedgerBackendError {
    match error {
        LedgerError::Fenced(id) => LedgerBackendError::Fenced(id.0),
        LedgerError::LedgerClosed(id) => LedgerBackendError::Closed(id.0),
        LedgerError::NoSuchLedger(id) => LedgerBackendError::NoSuchLedger(id.0),
        LedgerError::BeyondLastConfirmed {
            ledger_id,
            entry_id,
            ..
        } => LedgerBackendError::NoSuchEntry {
            ledger_id: ledger_id.0,
            entry_id: entry_id.0,
        },
        LedgerError::WriterFailed { ledger_id, reason } if reason.is_fenced() => {
            LedgerBackendError::Fenced(ledger_id.0)
        }
        other => LedgerBackendError::Other(other.to_string()),
    }
}

impl LedgerBackend for ReplicatedLedgers {
    fn create(
        &self,
        persistence: Persistence,
        log_name: &str,
    ) -> BoxFuture<'_, Result<Arc<dyn LedgerAppender>, LedgerBackendError>> {
        let properties = BTreeMap::from([(LOG_PROPERTY.to_string(), log_name.to_string())]);
        Box::pin(async move {
            let quorum = Quorum::new(
                usize::from(persistence.ensemble),
                usize::from(persistence.write_quorum),
                usize::from(persistence.ack_quorum),
            )
            .map_err(|e| LedgerBackendError::Other(e.to_string()))?;
            let writer = self
                .client
                .create(quorum, properties)
                .await
                .map_err(backend_error)?;
            Ok(Arc::new(ReplicatedAppender::new(writer)) as Arc<dyn LedgerAppender>)
        })
    }

    fn recover(
        &self,
        ledger_id: u64,
    ) -> BoxFuture<'_, Result<RecoveredLedger, LedgerBackendError>> {
        Box::pin(async move {
            let reader = self
                .client
                .open_with_recovery(LedgerId(ledger_id))
                .await
                .map_err(backend_error)?;
            let metadata = reader.metadata();
            let recovered = RecoveredLedger {
                last_entry_id: metadata.last_entry.map(|e| e.0),
                size_bytes: metadata.length_bytes,
            };
            self.readers.lock().insert(ledger_id, Arc::new(reader));
            Ok(recovered)
        })
    }

    fn read(
        &self,
        ledger_id: u64,
        first_entry_id: u64,
        last_entry_id: u64,
    ) -> BoxFuture<'_, Result<Vec<Bytes>, LedgerBackendError>> {
        Box::pin(async move {
            if last_entry_id < first_entry_id {
                return Ok(Vec::new());
            }
            let reader = self
                .reader(ledger_id, last_entry_id)
                .await
                .map_err(backend_error)?;
            let count = last_entry_id - first_entry_id + 1;
            let mut out = Vec::with_capacity(count.min(READ_RANGE_ENTRIES_MAX) as usize);
            let mut first = first_entry_id;
            while first <= last_entry_id {
                let last = last_entry_id.min(first + READ_RANGE_ENTRIES_MAX - 1);
                let entries = reader
                    .read_range(EntryId(first), EntryId(last))
                    .await
                    .map_err(backend_error)?;
                out.extend(entries);
                first = last + 1;
            }
            Ok(out)
        })
    }

    fn entry_bytes_max(&self) -> usize {
        vela_ledger::ENTRY_PAYLOAD_BYTES_MAX
    }

    fn describe(
        &self,
        ledger_id: u64,
    ) -> BoxFuture<'_, Result<Option<LedgerDescription>, LedgerBackendError>> {
        Box::pin(async move {
            let metadata = self
                .client
                .metadata(LedgerId(ledger_id))
                .await
                .map_err(backend_error)?;
            let narrow = |n: usize| u8::try_from(n).unwrap_or(u8::MAX);
            let state = match metadata.state {
                LedgerState::Open => "OPEN",
                LedgerState::InRecovery => "IN_RECOVERY",
                LedgerState::Closed => "CLOSED",
            };
            Ok(Some(LedgerDescription {
                persistence: Persistence {
                    ensemble: narrow(metadata.quorum.ensemble_size()),
                    write_quorum: narrow(metadata.quorum.write_quorum()),
                    ack_quorum: narrow(metadata.quorum.ack_quorum()),
                },
                state: state.to_string(),
                ensembles: metadata
                    .ensembles
                    .iter()
                    .map(|(first, bookies)| {
                        (first.0, bookies.iter().map(|b| b.0.clone()).collect())
                    })
                    .collect(),
                ctime_ms: metadata.ctime_ms,
            }))
        })
    }

    fn delete(&self, ledger_id: u64) -> BoxFuture<'_, Result<(), LedgerBackendError>> {
        self.readers.lock().remove(&ledger_id);
        Box::pin(async move {
            self.client
                .delete(LedgerId(ledger_id))
                .await
                .map_err(backend_error)
        })
    }
}

/// The writer of one ledger, behind the log's synchronous `add`.
#[derive(Debug)]
struct ReplicatedAppender {
    inner: Arc<AppenderInner>,
}

struct AppenderInner {
    writer: LedgerWriter,
    /// Adds waiting for the writer's budget, in call order. While it is not
    /// empty every new add queues behind it (order), and one feeder task moves
    /// adds to the writer as budget frees up.
    overflow: Mutex<Overflow>,
    /// Told when the feeder stops (the overflow queue drained).
    drained: Notify,
}

impl std::fmt::Debug for AppenderInner {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("AppenderInner")
            .field("ledger_id", &self.writer.ledger_id())
            .finish_non_exhaustive()
    }
}

#[derive(Default)]
struct Overflow {
    queue: VecDeque<(Bytes, LogAddCallback)>,
    bytes: u64,
    feeding: bool,
}

impl ReplicatedAppender {
    fn new(writer: LedgerWriter) -> ReplicatedAppender {
        ReplicatedAppender {
            inner: Arc::new(AppenderInner {
                writer,
                overflow: Mutex::new(Overflow::default()),
                drained: Notify::new(),
            }),
        }
    }
}

/// The ledger's callback type, from the log's.
fn ledger_callback(done: LogAddCallback) -> AddCallback {
    Box::new(move |result: Result<EntryId, LedgerError>| {
        done(result.map(|entry| entry.0).map_err(backend_error));
    })
}

impl AppenderInner {
    /// Moves queued adds to the writer as its budget frees up, in order.
    async fn feed(self: Arc<AppenderInner>) {
        loop {
            let payload_bytes = {
                let mut overflow = self.overflow.lock();
                match overflow.queue.front() {
                    Some((data, _)) => data.len(),
                    None => {
                        overflow.feeding = false;
                        drop(overflow);
                        self.drained.notify_waiters();
                        return;
                    }
                }
            };
            let permit = self.writer.reserve(payload_bytes).await;
            // Pop and submit under the lock: a concurrent `add` seeing an empty
            // queue submits directly, so it must come after this one.
            let mut overflow = self.overflow.lock();
            let Some((data, done)) = overflow.queue.pop_front() else {
                debug_assert!(false, "only the feeder pops the overflow queue");
                continue;
            };
            overflow.bytes -= data.len() as u64;
            match permit {
                Ok(permit) => {
                    self.writer
                        .submit_reserved(permit, data, ledger_callback(done));
                }
                Err(error) => {
                    // The writer is gone: fail this add and every queued one.
                    let mut failed = vec![done];
                    failed.extend(overflow.queue.drain(..).map(|(_, done)| done));
                    overflow.bytes = 0;
                    overflow.feeding = false;
                    drop(overflow);
                    self.drained.notify_waiters();
                    for done in failed {
                        done(Err(backend_error(error.clone())));
                    }
                    return;
                }
            }
        }
    }
}

impl LedgerAppender for ReplicatedAppender {
    fn ledger_id(&self) -> u64 {
        self.inner.writer.ledger_id().0
    }

    fn add(&self, data: Bytes, done: LogAddCallback) {
        let inner = &self.inner;
        let mut overflow = inner.overflow.lock();
        if overflow.queue.is_empty() {
            match inner.writer.try_reserve(data.len()) {
                Ok(Some(permit)) => {
                    inner
                        .writer
                        .submit_reserved(permit, data, ledger_callback(done));
                    return;
                }
                Ok(None) => {}
                Err(error) => {
                    drop(overflow);
                    done(Err(backend_error(error)));
                    return;
                }
            }
        }
        let size = data.len() as u64;
        if overflow.bytes + size > OVERFLOW_BYTES_MAX {
            drop(overflow);
            done(Err(LedgerBackendError::Other(format!(
                "ledger {}: {OVERFLOW_BYTES_MAX} bytes of adds already wait for the writer",
                inner.writer.ledger_id()
            ))));
            return;
        }
        overflow.bytes += size;
        overflow.queue.push_back((data, done));
        if !overflow.feeding {
            overflow.feeding = true;
            tokio::spawn(Arc::clone(inner).feed());
        }
    }

    fn close(&self) -> BoxFuture<'static, Result<(), LedgerBackendError>> {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            loop {
                let drained = inner.drained.notified();
                tokio::pin!(drained);
                drained.as_mut().enable();
                if !inner.overflow.lock().feeding {
                    break;
                }
                drained.await;
            }
            inner
                .writer
                .close()
                .await
                .map(|_| ())
                .map_err(backend_error)
        })
    }
}
