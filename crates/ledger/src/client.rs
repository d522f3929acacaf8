//! `LedgerClient`: creates, opens, recovers and deletes ledgers.
//!
//! Owns: the ledger lifecycle entry points (create, open, recover, delete),
//! over the context every writer and reader shares (`client_core::ClientCore`).
//! Never: holds ledger state itself (writers and readers do), or a lock across
//! an `.await`.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use rand::SeedableRng;
use rand::rngs::StdRng;
use tokio::task::JoinSet;
use vela_meta::{IdAllocator, MetadataStore};

use crate::client_core::{ClientCore, LedgerConfig};
use crate::error::LedgerError;
use crate::metadata::{LedgerMetadata, PROPERTIES_MAX};
use crate::placement;
use crate::reader::LedgerReader;
use crate::recovery;
use crate::stats::{LedgerStats, Stats};
use crate::store;
use crate::transport::{BookieError, BookieTransport};
use crate::types::{BookieId, EntryId, LedgerId, Quorum};
use crate::writer::LedgerWriter;

/// Entry point of the ledger client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct LedgerClient {
    core: Arc<ClientCore>,
}

impl LedgerClient {
    /// A client over `store` (ledger metadata, bookie registry, id allocation)
    /// reaching bookies through `transport`.
    pub fn new(
        store: Arc<dyn MetadataStore>,
        transport: Arc<dyn BookieTransport>,
        config: LedgerConfig,
    ) -> LedgerClient {
        let rng = match config.placement_seed {
            Some(seed) => StdRng::seed_from_u64(seed),
            None => StdRng::from_os_rng(),
        };
        LedgerClient {
            core: Arc::new(ClientCore {
                transport,
                config,
                rng: Mutex::new(rng),
                ids: IdAllocator::for_ledgers(store.clone()),
                bookies: store::BookieListing::default(),
                stats: Stats::new(),
                store,
            }),
        }
    }

    /// Creates an OPEN ledger on E available bookies (random, spread across
    /// racks when bookies carry rack labels) and returns its writer.
    pub async fn create(
        &self,
        quorum: Quorum,
        properties: BTreeMap<String, String>,
    ) -> Result<LedgerWriter, LedgerError> {
        if properties.len() > PROPERTIES_MAX {
            return Err(LedgerError::TooManyProperties {
                count: properties.len(),
            });
        }
        let candidates = self.core.available_bookies().await?;
        let ensemble = {
            let mut rng = self.core.rng.lock();
            placement::choose(&candidates, &[], &[], quorum.ensemble_size(), &mut *rng)?
        };
        let ctime_ms = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        let metadata = LedgerMetadata::new_open(quorum, ensemble, ctime_ms, properties);
        // An id is never handed out twice, so the create cannot collide unless
        // the store lost the allocator's state; a few tries ride that out.
        for _ in 0..CREATE_ATTEMPTS_MAX {
            let ledger_id = LedgerId(self.core.ids.next_id().await?);
            if let Some(version) = store::create(&self.core.store, ledger_id, &metadata).await? {
                tracing::debug!(ledger = %ledger_id, ensemble = ?metadata.ensembles, "ledger created");
                let versioned = store::Versioned { metadata, version };
                return Ok(LedgerWriter::start(self.core.clone(), ledger_id, versioned));
            }
            tracing::warn!(ledger = %ledger_id, "allocated ledger id already has metadata");
        }
        Err(LedgerError::Internal(
            "ledger ids keep colliding with existing ledgers".into(),
        ))
    }

    pub(crate) fn core(&self) -> &Arc<ClientCore> {
        &self.core
    }

    /// Figures of this client's writers and recoveries (for metrics).
    pub fn stats(&self) -> LedgerStats {
        self.core.stats.snapshot()
    }

    /// The whole "ledger add" latency distribution (µs, submit to
    /// acknowledgement) since the client started, for metrics exporters.
    pub fn add_latency(&self) -> vela_metrics::Snapshot {
        self.core.stats.add_latency()
    }

    /// Adds' wait from submit to their writer task taking them (the
    /// first part of the add latency).
    pub fn add_wait_latency(&self) -> vela_metrics::Snapshot {
        self.core.stats.add_wait_latency()
    }

    /// The whole "ledger read" latency distribution (µs, one entry read:
    /// request to verified answer) since the client started.
    pub fn read_latency(&self) -> vela_metrics::Snapshot {
        self.core.stats.read_latency()
    }

    /// Payload bytes of every entry read since the client started.
    pub fn read_bytes(&self) -> u64 {
        self.core
            .stats
            .read_bytes
            .load(std::sync::atomic::Ordering::Relaxed)
    }

    /// The ledger's current metadata.
    pub async fn metadata(&self, ledger_id: LedgerId) -> Result<LedgerMetadata, LedgerError> {
        Ok(store::read(&self.core.store, ledger_id).await?.metadata)
    }

    /// Opens a ledger for reading without disturbing its writer: a closed
    /// ledger up to its last entry, an open one up to the LAC its bookies know.
    pub async fn open_for_read(&self, ledger_id: LedgerId) -> Result<LedgerReader, LedgerError> {
        let metadata = store::read(&self.core.store, ledger_id).await?.metadata;
        let mut reader = LedgerReader::new(self.core.clone(), ledger_id, metadata);
        if !reader.is_closed() {
            reader.read_lac().await?;
        }
        Ok(reader)
    }

    /// Opens a ledger for reading up to `confirmed`, an entry the caller knows
    /// was acknowledged (it wrote the ledger, or saw the add complete), without
    /// asking bookies for the LAC. Reading past `confirmed` of an open ledger is
    /// refused as usual.
    pub async fn open_for_read_confirmed(
        &self,
        ledger_id: LedgerId,
        confirmed: EntryId,
    ) -> Result<LedgerReader, LedgerError> {
        let metadata = store::read(&self.core.store, ledger_id).await?.metadata;
        let mut reader = LedgerReader::new(self.core.clone(), ledger_id, metadata);
        if !reader.is_closed() {
            reader.assume_confirmed(confirmed);
        }
        Ok(reader)
    }

    /// Opens a ledger that another writer may still hold: fences it, decides
    /// where it ends (every entry that writer got acknowledged is kept), closes
    /// it, and returns a reader of the closed ledger. A CLOSED ledger is opened
    /// as is.
    pub async fn open_with_recovery(
        &self,
        ledger_id: LedgerId,
    ) -> Result<LedgerReader, LedgerError> {
        let metadata = recovery::recover(&self.core, ledger_id).await?;
        self.core
            .stats
            .recoveries
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        Ok(LedgerReader::new(self.core.clone(), ledger_id, metadata))
    }

    /// Deletes the ledger on every bookie that ever held a segment of it, then
    /// its metadata. Deleting a ledger that does not exist succeeds.
    pub async fn delete(&self, ledger_id: LedgerId) -> Result<(), LedgerError> {
        let metadata = match store::read(&self.core.store, ledger_id).await {
            Ok(versioned) => versioned.metadata,
            Err(LedgerError::NoSuchLedger(_)) => return Ok(()),
            Err(e) => return Err(e),
        };
        let timeout = self.core.config.read_timeout;
        let mut requests = JoinSet::new();
        for bookie in metadata.all_bookies() {
            let request = self.core.transport.delete_ledger(&bookie, ledger_id);
            requests.spawn(async move {
                let result = tokio::time::timeout(timeout, request)
                    .await
                    .unwrap_or(Err(BookieError::Timeout));
                (bookie, result)
            });
        }
        let mut failed: Vec<(BookieId, BookieError)> = Vec::new();
        while let Some(joined) = requests.join_next().await {
            let (bookie, result) = joined.map_err(|e| LedgerError::Internal(e.to_string()))?;
            match result {
                Ok(()) | Err(BookieError::NoSuchLedger) => {}
                Err(error) => failed.push((bookie, error)),
            }
        }
        if !failed.is_empty() {
            failed.sort_by(|a, b| a.0.cmp(&b.0));
            return Err(LedgerError::DeleteIncomplete { ledger_id, failed });
        }
        store::delete(&self.core.store, ledger_id).await
    }
}

/// Ids tried by one `create` before giving up (see there).
const CREATE_ATTEMPTS_MAX: u32 = 4;
