//! Ledger metadata in the metadata store: the only module that calls
//! `vela_meta::MetadataStore`.
//!
//! Owns: reading, creating, CAS-updating and deleting `/ledgers/<id>` nodes.
//! Never: retries on its own: callers own their CAS loops (they know how to
//! merge).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use vela_meta::{ExpectedVersion, MetaError, MetadataStore, Version};

use crate::error::LedgerError;
use crate::metadata::{self, LedgerMetadata, ledger_path};
use crate::placement::BookieCandidate;
use crate::types::{BookieId, LedgerId};

/// Reads tried while the store answers `Unavailable` (with a growing pause:
/// about 1.5 s in all) before the error is returned. Rides out an etcd leader
/// election without holding a writer up indefinitely.
const TRANSIENT_ATTEMPTS_MAX: u32 = 6;
/// Base pause between those tries.
const TRANSIENT_RETRY_DELAY: std::time::Duration = std::time::Duration::from_millis(100);

/// Metadata as read, with the store version a CAS must expect.
#[derive(Debug, Clone)]
pub(crate) struct Versioned {
    pub(crate) metadata: LedgerMetadata,
    pub(crate) version: Version,
}

/// Outcome of a CAS.
#[derive(Debug)]
pub(crate) enum CasError {
    /// Someone else wrote first, or the store was unavailable and the write's
    /// outcome is unknown: re-read and decide.
    BadVersion,
    /// Anything else.
    Failed(LedgerError),
}

/// Reads the ledger's metadata, riding out a briefly unavailable store.
pub(crate) async fn read(
    store: &Arc<dyn MetadataStore>,
    ledger_id: LedgerId,
) -> Result<Versioned, LedgerError> {
    let path = ledger_path(ledger_id);
    let mut attempt = 0;
    let found = loop {
        match store.get(&path).await {
            Ok(found) => break found,
            Err(e) if e.is_transient() && attempt + 1 < TRANSIENT_ATTEMPTS_MAX => {
                attempt += 1;
                tokio::time::sleep(TRANSIENT_RETRY_DELAY * attempt).await;
            }
            Err(e) => return Err(e.into()),
        }
    };
    let Some((bytes, version)) = found else {
        return Err(LedgerError::NoSuchLedger(ledger_id));
    };
    let metadata = metadata::decode(&bytes)
        .map_err(|error| LedgerError::MetadataFormat { ledger_id, error })?;
    Ok(Versioned { metadata, version })
}

/// Creates the node; `Ok(None)` if it already exists.
pub(crate) async fn create(
    store: &Arc<dyn MetadataStore>,
    ledger_id: LedgerId,
    metadata: &LedgerMetadata,
) -> Result<Option<Version>, LedgerError> {
    let value = Bytes::from(metadata::encode(metadata));
    let path = ledger_path(ledger_id);
    let mut attempt = 0;
    loop {
        match store
            .put(&path, value.clone(), ExpectedVersion::Absent)
            .await
        {
            Ok(version) => return Ok(Some(version)),
            Err(MetaError::Exists { .. } | MetaError::BadVersion { .. }) => return Ok(None),
            Err(e) if e.is_transient() && attempt + 1 < TRANSIENT_ATTEMPTS_MAX => {
                // Unknown outcome: the node holding exactly our bytes means the
                // create went through (ids are never handed out twice).
                attempt += 1;
                tokio::time::sleep(TRANSIENT_RETRY_DELAY * attempt).await;
                match store.get(&path).await {
                    Ok(Some((stored, version))) if stored == value => return Ok(Some(version)),
                    Ok(Some(_)) => return Ok(None),
                    Ok(None) | Err(_) => {}
                }
            }
            Err(e) => return Err(e.into()),
        }
    }
}

pub(crate) async fn cas(
    store: &Arc<dyn MetadataStore>,
    ledger_id: LedgerId,
    metadata: &LedgerMetadata,
    expected: Version,
) -> Result<Version, CasError> {
    let value = Bytes::from(metadata::encode(metadata));
    match store
        .put(
            &ledger_path(ledger_id),
            value,
            ExpectedVersion::Is(expected),
        )
        .await
    {
        Ok(version) => Ok(version),
        Err(MetaError::BadVersion { .. } | MetaError::NotFound { .. }) => Err(CasError::BadVersion),
        Err(e) if e.is_transient() => {
            tracing::warn!(ledger = %ledger_id, error = %e, "metadata store unavailable during CAS; re-reading");
            tokio::time::sleep(TRANSIENT_RETRY_DELAY).await;
            Err(CasError::BadVersion)
        }
        Err(e) => Err(CasError::Failed(e.into())),
    }
}

pub(crate) async fn delete(
    store: &Arc<dyn MetadataStore>,
    ledger_id: LedgerId,
) -> Result<(), LedgerError> {
    match store
        .delete(&ledger_path(ledger_id), ExpectedVersion::Any)
        .await
    {
        Ok(()) | Err(MetaError::NotFound { .. }) => Ok(()),
        Err(e) => Err(e.into()),
    }
}

/// The bookies the registry lists as available, with their racks and whether
/// they are marked read-only.
pub(crate) async fn available_bookies(
    store: &Arc<dyn MetadataStore>,
) -> Result<Vec<BookieCandidate>, LedgerError> {
    let listed = vela_meta::registry::list_bookies(store.as_ref()).await?;
    let read_only = vela_meta::registry::list_read_only(store.as_ref()).await?;
    Ok(listed
        .into_iter()
        .map(|(id, info)| BookieCandidate {
            read_only: read_only.contains(&id),
            id: BookieId::new(id.as_str()),
            rack: info.rack,
        })
        .collect())
}

/// The registry's bookie listing, shared by callers that wait for it at the
/// same time: a caller gets a listing whose read began after its own call
/// did (as fresh as reading the registry itself), and while one read is in
/// flight, every caller that arrives meanwhile shares the next one. Many
/// ledgers created at once (a broker loading thousands of topics) cost a
/// few listings, not one each.
#[derive(Debug, Default)]
pub(crate) struct BookieListing {
    /// Callers so far: caller number `n` may take a listing whose read
    /// began once `n` callers had started.
    callers: AtomicU64,
    /// The last listing, with the callers that had started when its read
    /// began.
    last: tokio::sync::Mutex<Option<(u64, Arc<Vec<BookieCandidate>>)>>,
}

impl BookieListing {
    pub(crate) async fn read(
        &self,
        store: &Arc<dyn MetadataStore>,
    ) -> Result<Arc<Vec<BookieCandidate>>, LedgerError> {
        let me = self.callers.fetch_add(1, Ordering::SeqCst) + 1;
        let mut last = self.last.lock().await;
        if let Some((covered, listing)) = last.as_ref()
            && *covered >= me
        {
            return Ok(Arc::clone(listing));
        }
        let covered = self.callers.load(Ordering::SeqCst);
        debug_assert!(covered >= me);
        let listing = Arc::new(available_bookies(store).await?);
        *last = Some((covered, Arc::clone(&listing)));
        Ok(listing)
    }
}

/// Where bookie `id` listens, from its registration (`None`: not registered).
pub(crate) async fn bookie_address(
    store: &Arc<dyn MetadataStore>,
    bookie: &BookieId,
) -> Result<Option<String>, LedgerError> {
    let id = vela_meta::registry::BookieId::new(bookie.0.as_str())?;
    let key = vela_meta::registry::bookie_key(&id);
    let Some((value, _)) = store.get(&key).await? else {
        return Ok(None);
    };
    Ok(Some(
        vela_meta::registry::decode_bookie_info(&key, &value)?.address,
    ))
}
