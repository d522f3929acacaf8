//! Ledger metadata in the metadata store: the only module that calls
//! `vela_meta::MetadataStore`.
//!
//! Owns: reading, creating, CAS-updating and deleting `/ledgers/<id>` nodes.
//! Never: retries on its own: callers own their CAS loops (they know how to
//! merge).

use std::sync::Arc;

use bytes::Bytes;
use vela_meta::{ExpectedVersion, MetaError, MetadataStore, Version};

use crate::error::LedgerError;
use crate::metadata::{self, LedgerMetadata, ledger_path};
use crate::types::LedgerId;

/// Metadata as read, with the store version a CAS must expect.
#[derive(Debug, Clone)]
pub(crate) struct Versioned {
    pub(crate) metadata: LedgerMetadata,
    pub(crate) version: Version,
}

/// Outcome of a CAS.
#[derive(Debug)]
pub(crate) enum CasError {
    /// Someone else wrote first: re-read and decide.
    BadVersion,
    /// Anything else.
    Failed(LedgerError),
}

pub(crate) async fn read(
    store: &Arc<dyn MetadataStore>,
    ledger_id: LedgerId,
) -> Result<Versioned, LedgerError> {
    let Some((bytes, version)) = store.get(&ledger_path(ledger_id)).await? else {
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
    match store
        .put(&ledger_path(ledger_id), value, ExpectedVersion::Absent)
        .await
    {
        Ok(version) => Ok(Some(version)),
        Err(MetaError::Exists { .. } | MetaError::BadVersion { .. }) => Ok(None),
        Err(e) => Err(e.into()),
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

/// The bookies the registry lists as available.
// Placeholder until vela_meta's registry lands: ids are the children of
// `/bookies/available`, without racks.
pub(crate) async fn available_bookies(
    store: &Arc<dyn MetadataStore>,
) -> Result<Vec<crate::placement::BookieCandidate>, LedgerError> {
    let ids = store.children("/bookies/available").await?;
    Ok(ids
        .into_iter()
        .map(|id| crate::placement::BookieCandidate {
            id: crate::types::BookieId(id),
            rack: None,
        })
        .collect())
}

/// A fresh ledger id.
// Placeholder until vela_meta's IdAllocator lands: a CAS'ed counter.
pub(crate) async fn allocate_ledger_id(
    store: &Arc<dyn MetadataStore>,
) -> Result<LedgerId, LedgerError> {
    const KEY: &str = "/ledgers-idgen";
    for _ in 0..64 {
        let (next, expected) = match store.get(KEY).await? {
            None => (0u64, ExpectedVersion::Absent),
            Some((bytes, version)) => {
                let text = std::str::from_utf8(&bytes).unwrap_or("");
                (
                    text.parse::<u64>().unwrap_or(0),
                    ExpectedVersion::Is(version),
                )
            }
        };
        let value = Bytes::from((next + 1).to_string());
        match store.put(KEY, value, expected).await {
            Ok(_) => return Ok(LedgerId(next)),
            Err(
                MetaError::BadVersion { .. }
                | MetaError::Exists { .. }
                | MetaError::NotFound { .. },
            ) => {}
            Err(e) => return Err(e.into()),
        }
    }
    Err(LedgerError::Internal(
        "ledger id allocation contended".into(),
    ))
}
