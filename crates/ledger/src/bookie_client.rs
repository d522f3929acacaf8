//! `BookieClientTransport`: the `BookieTransport` over real bookies
//! (`vela_bookie_protocol::client::BookieClient`), one pooled connection per
//! bookie.
//!
//! Owns: the connection pool (bookie id -> client) and resolving a bookie id to
//! its address through the registry. Answers are the bookie client's own
//! (`vela_bookie_protocol::BookieError`), passed through.
//! Never: retries or fails over (the ledger protocol decides that); holds its
//! lock across an `.await`; starts a connection's tasks on a runtime other
//! than the one it was made on (a read polled on the broker's catch-up
//! threads must not leave the connection every add shares on them).
//! Bounds: one connection per registered bookie (the registry is the bound);
//! in-flight requests per connection are bounded by `BookieClient` itself.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use vela_bookie_protocol::LAST_ENTRY;
use vela_bookie_protocol::client::{BookieClient, ClientConfig};
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
    /// The runtime the transport was made on: connections (and their read
    /// and write tasks) are started there, whoever asks first.
    runtime: Option<tokio::runtime::Handle>,
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
                runtime: tokio::runtime::Handle::try_current().ok(),
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
        let connecting = BookieClient::connect_with(addr, self.config.clone());
        let client = match &self.runtime {
            Some(runtime) => runtime.spawn(connecting).await.map_err(|e| {
                BookieError::ConnectionLost(format!("connecting to {bookie} failed: {e}"))
            })??,
            None => connecting.await?,
        };
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
            return Box::pin(client.add(packaged, mode));
        }
        Box::pin(async move {
            let client = inner.client(&bookie).await?;
            client.add(packaged, mode).await
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
            let read = client.read(ledger_id.0, entry_id.0, mode).await?;
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
                ReadMode::Normal => Ok(client.read_lac(ledger_id.0).await?.map(EntryId)),
                ReadMode::Fence => {
                    // A fencing read of the last entry: the bookie fences
                    // durably (creating the ledger if it never saw it) and then
                    // answers with its last entry and known LAC.
                    match client.read(ledger_id.0, LAST_ENTRY, ReadMode::Fence).await {
                        Ok(read) => Ok(read.lac.max(read.header.last_add_confirmed).map(EntryId)),
                        Err(error) if error.is_no_entry() => Ok(None),
                        Err(error) => Err(error),
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
            client.delete_ledger(ledger_id.0).await
        })
    }
}
