//! `BookieClientTransport`: the `BookieTransport` over real bookies
//! (`vela_bookie::client::BookieClient`), one pooled connection per bookie.
//!
//! Owns: the connection pool (bookie id -> client), resolving a bookie id to its
//! address through the registry, and mapping the bookie client's errors onto
//! `BookieError`.
//! Never: retries or fails over (the ledger protocol decides that); holds its
//! lock across an `.await`.
//! Bounds: one connection per registered bookie (the registry is the bound);
//! in-flight requests per connection are bounded by `BookieClient` itself.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use vela_bookie::client::{BookieClient, BookieError as ClientError, ClientConfig};
use vela_bookie::protocol::{self, LAST_ENTRY};
use vela_meta::MetadataStore;

use crate::store;
use crate::transport::{AddMode, BookieError, BookieFuture, BookieTransport, ReadMode};
use crate::types::{BookieId, EntryId, LedgerId};

/// Real bookies, reached by TCP. Cheap to clone (shared pool).
#[derive(Debug, Clone)]
pub struct BookieClientTransport {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn MetadataStore>,
    config: ClientConfig,
    pool: Mutex<BTreeMap<BookieId, BookieClient>>,
}

impl BookieClientTransport {
    /// Resolves bookie ids through the registry in `store`; connects with
    /// `config`.
    pub fn new(store: Arc<dyn MetadataStore>, config: ClientConfig) -> BookieClientTransport {
        BookieClientTransport {
            inner: Arc::new(Inner {
                store,
                config,
                pool: Mutex::new(BTreeMap::new()),
            }),
        }
    }
}

impl Inner {
    /// The pooled connection to `bookie`, connecting if there is none or the
    /// last one broke.
    async fn client(&self, bookie: &BookieId) -> Result<BookieClient, BookieError> {
        if let Some(client) = self.pool.lock().get(bookie)
            && !client.is_closed()
        {
            return Ok(client.clone());
        }
        let address = store::bookie_address(&self.store, bookie)
            .await
            .map_err(|e| BookieError::UnknownBookie(format!("{bookie}: {e}")))?
            .ok_or_else(|| BookieError::UnknownBookie(bookie.0.clone()))?;
        let addr: SocketAddr = tokio::net::lookup_host(address.as_str())
            .await
            .map_err(|e| BookieError::UnknownBookie(format!("{bookie} at {address}: {e}")))?
            .next()
            .ok_or_else(|| BookieError::UnknownBookie(format!("{bookie} at {address}")))?;
        let client = BookieClient::connect_with(addr, self.config.clone())
            .await
            .map_err(map_error)?;
        let mut pool = self.pool.lock();
        // Another request may have connected meanwhile: keep one connection.
        match pool.get(bookie) {
            Some(existing) if !existing.is_closed() => Ok(existing.clone()),
            _ => {
                pool.insert(bookie.clone(), client.clone());
                Ok(client)
            }
        }
    }
}

fn map_error(error: ClientError) -> BookieError {
    match error {
        ClientError::NoSuchEntry => BookieError::NoSuchEntry,
        ClientError::NoSuchLedger => BookieError::NoSuchLedger,
        ClientError::Fenced => BookieError::Fenced,
        ClientError::TooManyRequests => BookieError::TooManyRequests,
        ClientError::Timeout => BookieError::Timeout,
        ClientError::ConnectionLost { .. } | ClientError::Connect { .. } => {
            BookieError::ConnectionLost(error.to_string())
        }
        ClientError::BadRequest | ClientError::BadVersion | ClientError::EntryTooLarge { .. } => {
            BookieError::BadRequest(error.to_string())
        }
        ClientError::ReadOnly => BookieError::ReadOnly,
        ClientError::IoError | ClientError::CorruptEntry(_) => BookieError::Io(error.to_string()),
    }
}

fn add_mode(mode: AddMode) -> protocol::AddMode {
    match mode {
        AddMode::Normal => protocol::AddMode::Normal,
        AddMode::Recovery => protocol::AddMode::Recovery,
    }
}

fn read_mode(mode: ReadMode) -> protocol::ReadMode {
    match mode {
        ReadMode::Normal => protocol::ReadMode::Normal,
        ReadMode::Fence => protocol::ReadMode::Fence,
    }
}

impl BookieTransport for BookieClientTransport {
    fn add(
        &self,
        bookie: &BookieId,
        _ledger_id: LedgerId,
        _entry_id: EntryId,
        packaged: Bytes,
        mode: AddMode,
    ) -> BookieFuture<()> {
        let inner = self.inner.clone();
        let bookie = bookie.clone();
        // Fast path: a pooled connection queues the add now, so adds issued in
        // order leave in order (pipelining without reordering).
        let pooled = inner
            .pool
            .lock()
            .get(&bookie)
            .filter(|c| !c.is_closed())
            .cloned();
        if let Some(client) = pooled {
            let request = client.add(packaged, add_mode(mode));
            return Box::pin(async move { request.await.map_err(map_error) });
        }
        Box::pin(async move {
            let client = inner.client(&bookie).await?;
            client
                .add(packaged, add_mode(mode))
                .await
                .map_err(map_error)
        })
    }

    fn read(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        mode: ReadMode,
    ) -> BookieFuture<Bytes> {
        let inner = self.inner.clone();
        let bookie = bookie.clone();
        Box::pin(async move {
            let client = inner.client(&bookie).await?;
            let read = client
                .read(ledger_id.0, entry_id.0, read_mode(mode))
                .await
                .map_err(map_error)?;
            Ok(read.entry)
        })
    }

    fn read_lac(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        mode: ReadMode,
    ) -> BookieFuture<Option<EntryId>> {
        let inner = self.inner.clone();
        let bookie = bookie.clone();
        Box::pin(async move {
            let client = inner.client(&bookie).await?;
            match mode {
                ReadMode::Normal => Ok(client
                    .read_lac(ledger_id.0)
                    .await
                    .map_err(map_error)?
                    .map(EntryId)),
                ReadMode::Fence => {
                    // A fencing read of the last entry: the bookie fences
                    // durably (creating the ledger if it never saw it) and then
                    // answers with its last entry and known LAC.
                    match client
                        .read(ledger_id.0, LAST_ENTRY, protocol::ReadMode::Fence)
                        .await
                    {
                        Ok(read) => Ok(read.lac.max(read.header.last_add_confirmed).map(EntryId)),
                        Err(ClientError::NoSuchEntry | ClientError::NoSuchLedger) => Ok(None),
                        Err(e) => Err(map_error(e)),
                    }
                }
            }
        })
    }

    fn delete_ledger(&self, bookie: &BookieId, ledger_id: LedgerId) -> BookieFuture<()> {
        let inner = self.inner.clone();
        let bookie = bookie.clone();
        Box::pin(async move {
            let client = inner.client(&bookie).await?;
            client.delete_ledger(ledger_id.0).await.map_err(map_error)
        })
    }
}
