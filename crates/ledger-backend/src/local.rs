//! `LocalBookies`: the `BookieTransport` over bookies in this process
//! (`vela standalone`), calling `vela_bookie::bookie::Bookie` directly.
//!
//! Owns: the map of local bookies and the bound on their blocking reads.
//! Guarantees: each request means exactly what it means over the bookie
//! protocol, because it goes through the same entry points the bookie's TCP
//! server uses: an add goes through `Bookie::add` (resolves once the journal
//! made it durable; a full write cache holds it up to `ADD_ROOM_WAIT_MAX`
//! before TOO_MANY_REQUESTS), a fencing read answers only after the fence is
//! durable, and a refusal is the same `BookieError` (`from_status`). So the
//! ledger protocol cannot tell the two transports apart; only the loopback
//! TCP hop (a write, a wake-up and a read each way) is gone from the write
//! path.
//! Never: blocks a tokio worker (storage reads run on the blocking pool), or
//! knows bookies other than the ones it was given (`UnknownBookie`).

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use tokio::sync::{Semaphore, oneshot};
use vela_bookie::bookie::Bookie;
use vela_bookie::storage::RecordCheck;
use vela_bookie_protocol::{LAST_ENTRY, Status};

use vela_ledger::transport::{AddMode, BookieError, BookieFuture, BookieTransport, ReadMode};
use vela_ledger::{BookieId, EntryId, LedgerId};

/// Storage reads (and LAC reads) running at once across the local bookies:
/// as many as a bookie server allows per connection, so a burst of catch-up
/// reads cannot take the whole blocking pool.
pub const LOCAL_READS_IN_FLIGHT_MAX: usize = 64;

/// Bookies living in this process.
#[derive(Debug, Clone)]
pub struct LocalBookies {
    bookies: Arc<BTreeMap<BookieId, Arc<Bookie>>>,
    reads: Arc<Semaphore>,
}

impl LocalBookies {
    /// A transport to these bookies.
    pub fn new(bookies: impl IntoIterator<Item = (BookieId, Arc<Bookie>)>) -> LocalBookies {
        LocalBookies {
            bookies: Arc::new(bookies.into_iter().collect()),
            reads: Arc::new(Semaphore::new(LOCAL_READS_IN_FLIGHT_MAX)),
        }
    }

    fn bookie(&self, bookie: &BookieId) -> Result<Arc<Bookie>, BookieError> {
        self.bookies
            .get(bookie)
            .cloned()
            .ok_or_else(|| BookieError::UnknownBookie(bookie.0.clone()))
    }
}

/// Waits for a callback-style bookie operation.
async fn answered<T>(receiver: oneshot::Receiver<Result<T, Status>>) -> Result<T, BookieError> {
    match receiver.await {
        Ok(result) => result.map_err(BookieError::from_status),
        Err(_) => Err(BookieError::ConnectionLost(
            "the in-process bookie dropped the request".into(),
        )),
    }
}

async fn fence(bookie: &Bookie, ledger_id: LedgerId) -> Result<(), BookieError> {
    let (done, receiver) = oneshot::channel();
    bookie.fence(ledger_id.0, move |result| {
        let _ = done.send(result);
    });
    answered(receiver).await
}

/// Runs a storage read on the blocking pool, within the read bound.
async fn blocking_read<T: Send + 'static>(
    reads: &Arc<Semaphore>,
    read: impl FnOnce() -> Result<T, Status> + Send + 'static,
) -> Result<T, BookieError> {
    let Ok(_slot) = reads.clone().acquire_owned().await else {
        return Err(BookieError::ConnectionLost(
            "the in-process bookies are shutting down".into(),
        ));
    };
    match tokio::task::spawn_blocking(read).await {
        Ok(result) => result.map_err(BookieError::from_status),
        Err(error) => Err(BookieError::ConnectionLost(format!(
            "in-process read task failed: {error}"
        ))),
    }
}

impl BookieTransport for LocalBookies {
    fn add(
        &self,
        bookie: &BookieId,
        _ledger_id: LedgerId,
        _entry_id: EntryId,
        packaged: Bytes,
        mode: AddMode,
    ) -> BookieFuture<()> {
        let bookie = match self.bookie(bookie) {
            Ok(bookie) => bookie,
            Err(error) => return Box::pin(async move { Err(error) }),
        };
        // `Bookie::add` is the bookie's one ADD, the TCP server's too: taken
        // now when the write cache has room (so adds issued in order reach
        // the journal in order, as over one TCP connection), else queued for
        // room in call order and taken while this future awaits its
        // admission, answered TOO_MANY_REQUESTS only after the bounded wait.
        let (done, receiver) = oneshot::channel();
        let admission = bookie.add(packaged, mode, move |result| {
            let _ = done.send(result.map(|_| ()));
        });
        Box::pin(async move {
            admission.await;
            answered(receiver).await
        })
    }

    fn read(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        mode: ReadMode,
    ) -> BookieFuture<Bytes> {
        let found = self.bookie(bookie);
        let reads = self.reads.clone();
        Box::pin(async move {
            let bookie = found?;
            // A normal read is answered to the ledger client's reader, which
            // checks the packaged entry's CRC32C (over the same payload bytes,
            // in this same buffer) before anything of it reaches a consumer
            // (`BookieTransport::read`): storage skips the record's own CRC
            // for it, so a catch-up byte is checksummed once, not twice. A
            // corrupt record is then reported by the reader (`corrupt entry`,
            // its `corrupt_reads`, the next replica tried). A fencing read
            // (recovery) keeps storage's full check.
            let check = match mode {
                ReadMode::Normal => RecordCheck::ReaderVerifies,
                ReadMode::Fence => {
                    fence(&bookie, ledger_id).await?;
                    RecordCheck::Full
                }
            };
            let read = blocking_read(&reads, move || {
                bookie.read_entry_checked(ledger_id.0, entry_id.0, check)
            })
            .await?;
            Ok(read.entry)
        })
    }

    fn read_lac(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        mode: ReadMode,
    ) -> BookieFuture<Option<EntryId>> {
        let found = self.bookie(bookie);
        let reads = self.reads.clone();
        Box::pin(async move {
            let bookie = found?;
            match mode {
                ReadMode::Normal => {
                    let lac = blocking_read(&reads, move || bookie.read_lac(ledger_id.0)).await?;
                    Ok(lac.map(EntryId))
                }
                ReadMode::Fence => {
                    // As the TCP transport: fence durably, then the last stored
                    // entry's carried LAC and the bookie's known LAC.
                    fence(&bookie, ledger_id).await?;
                    let read =
                        blocking_read(&reads, move || bookie.read_entry(ledger_id.0, LAST_ENTRY))
                            .await;
                    match read {
                        Ok(read) => {
                            let carried = vela_bookie_protocol::entry::parse_header(&read.entry)?
                                .last_add_confirmed;
                            Ok(read.lac.max(carried).map(EntryId))
                        }
                        Err(error) if error.is_no_entry() => Ok(None),
                        Err(error) => Err(error),
                    }
                }
            }
        })
    }

    fn delete_ledger(&self, bookie: &BookieId, ledger_id: LedgerId) -> BookieFuture<()> {
        let bookie = match self.bookie(bookie) {
            Ok(bookie) => bookie,
            Err(error) => return Box::pin(async move { Err(error) }),
        };
        let (done, receiver) = oneshot::channel();
        bookie.delete_ledger(ledger_id.0, move |result| {
            let _ = done.send(result);
        });
        Box::pin(answered(receiver))
    }
}
