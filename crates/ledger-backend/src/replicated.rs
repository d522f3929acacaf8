//! The log's ledgers on bookies: `LedgerBackend` over `vela_ledger::LedgerClient`.
//!
//! Owns: the mapping of the log's seam onto the ledger client (an open
//! ledger's window of adds in flight is the ledger writer's budget,
//! `PENDING_ADDS_MAX` / `PENDING_BYTES_MAX`), and a small cache of ledger
//! readers.
//! Guarantees: adds reach the writer in call order, so entry ids and `done`
//! callbacks follow it; `done` runs only once Qa bookies made the entry
//! durable.
//! Never: queues an add (the log's append queue is the one queue above the
//! writer: `reserve` only takes or awaits room), reorders adds, or waits on a
//! tokio worker.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use vela_ledger::{
    AddCallback, AddPermit, EntryId, LedgerClient, LedgerError, LedgerId, LedgerReader,
    LedgerState, LedgerWriter, Quorum, READ_RANGE_ENTRIES_MAX,
};
use vela_log::backend::{
    AddCallback as LogAddCallback, BoxFuture, LedgerBackend, LedgerBackendError, LedgerDescription,
    OpenLedger, Persistence, RecoveredLedger, Reserve,
};

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
    fn create_ledger(
        &self,
        persistence: Persistence,
        log_name: &str,
    ) -> BoxFuture<'_, Result<Arc<dyn OpenLedger>, LedgerBackendError>> {
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
            Ok(Arc::new(ReplicatedAppender::new(writer)) as Arc<dyn OpenLedger>)
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

/// The writer of one ledger, as the log's `OpenLedger`: its window is the
/// writer's budget; room reserved for the next add waits in `reserved`.
#[derive(Debug)]
struct ReplicatedAppender {
    writer: Arc<LedgerWriter>,
    /// Room taken by `reserve` for the next `add` (one add at a time: the
    /// log's append queue issues from one place).
    reserved: Arc<Mutex<Option<AddPermit>>>,
}

impl ReplicatedAppender {
    fn new(writer: LedgerWriter) -> ReplicatedAppender {
        ReplicatedAppender {
            writer: Arc::new(writer),
            reserved: Arc::new(Mutex::new(None)),
        }
    }
}

/// The ledger's callback type, from the log's.
fn ledger_callback(done: LogAddCallback) -> AddCallback {
    Box::new(move |result: Result<EntryId, LedgerError>| {
        done(result.map(|entry| entry.0).map_err(backend_error));
    })
}

impl OpenLedger for ReplicatedAppender {
    fn ledger_id(&self) -> u64 {
        self.writer.ledger_id().0
    }

    fn reserve(&self, payload_bytes: usize) -> Reserve {
        let mut reserved = self.reserved.lock();
        if reserved
            .as_ref()
            .is_some_and(|permit| permit.payload_bytes() == payload_bytes)
        {
            return Reserve::Ready;
        }
        // Room for another size (not expected: the log retries the same
        // add) goes back before the right one is taken.
        *reserved = None;
        match self.writer.try_reserve(payload_bytes) {
            Ok(Some(permit)) => {
                *reserved = Some(permit);
                Reserve::Ready
            }
            Ok(None) => {
                drop(reserved);
                let (writer, reserved) = (Arc::clone(&self.writer), Arc::clone(&self.reserved));
                Reserve::Wait(Box::pin(async move {
                    let permit = writer.reserve(payload_bytes).await.map_err(backend_error)?;
                    *reserved.lock() = Some(permit);
                    Ok(())
                }))
            }
            Err(error) => Reserve::Failed(backend_error(error)),
        }
    }

    fn add(&self, data: Bytes, done: LogAddCallback) {
        let permit = self.reserved.lock().take();
        match permit {
            Some(permit) if permit.payload_bytes() == data.len() => {
                self.writer
                    .submit_reserved(permit, data, ledger_callback(done));
            }
            _ => {
                debug_assert!(false, "an add without room reserved for it");
                done(Err(LedgerBackendError::Other(format!(
                    "ledger {}: add without room reserved for it",
                    self.writer.ledger_id()
                ))));
            }
        }
    }

    fn close(&self) -> BoxFuture<'static, Result<(), LedgerBackendError>> {
        let writer = Arc::clone(&self.writer);
        Box::pin(async move { writer.close().await.map(|_| ()).map_err(backend_error) })
    }
}
