//! `LedgerReader`: reads entries of a ledger.
//!
//! Owns: the read path: the write set's bookies in order, failing over on an
//! error, a timeout or a corrupt answer; every entry returned passed its CRC32C
//! and id check. Also the LAC read of an open ledger.
//! Never: reads past the readable end (the LAC of an open ledger, the last entry
//! of a closed one), fences, or writes.

use std::sync::Arc;

use bytes::Bytes;
use tokio::task::JoinSet;

use crate::client_core::ClientCore;
use crate::entry::unpackage;
use crate::error::LedgerError;
use crate::metadata::{LedgerMetadata, LedgerState};
use crate::transport::{BookieError, ReadMode};
use crate::types::{BookieId, EntryId, LedgerId};

/// Most entries one `read_range` call reads: 10x Pulsar's dispatch batch
/// (100), and with 5 MiB entries still a bounded (if large) answer.
pub const READ_RANGE_ENTRIES_MAX: u64 = 1000;

/// Reads in flight at once within a `read_range`: enough to hide a bookie
/// round trip behind others, few enough not to crowd out adds on the same
/// connections.
pub const READ_RANGE_PARALLELISM: usize = 16;

/// A reader of one ledger.
#[derive(Debug)]
pub struct LedgerReader {
    core: Arc<ClientCore>,
    ledger_id: LedgerId,
    metadata: Arc<LedgerMetadata>,
    /// Last entry that may be read: the last entry of a closed ledger, else the
    /// highest LAC seen. Only moves forward.
    last_readable: Option<EntryId>,
}

impl LedgerReader {
    pub(crate) fn new(
        core: Arc<ClientCore>,
        ledger_id: LedgerId,
        metadata: LedgerMetadata,
    ) -> LedgerReader {
        let last_readable = match metadata.state {
            LedgerState::Closed => metadata.last_entry,
            LedgerState::Open | LedgerState::InRecovery => None,
        };
        LedgerReader {
            core,
            ledger_id,
            metadata: Arc::new(metadata),
            last_readable,
        }
    }

    /// The ledger read.
    pub fn ledger_id(&self) -> LedgerId {
        self.ledger_id
    }

    /// The metadata as of opening (or the last `read_lac` that found it closed).
    pub fn metadata(&self) -> &LedgerMetadata {
        &self.metadata
    }

    /// Whether the ledger is closed (its end is final).
    pub fn is_closed(&self) -> bool {
        self.metadata.state == LedgerState::Closed
    }

    /// Last entry that may be read now (`None`: none yet).
    pub fn last_readable(&self) -> Option<EntryId> {
        self.last_readable
    }

    /// Raises the readable end of an open ledger to `confirmed`, which the
    /// caller knows was acknowledged. Never lowers it.
    pub(crate) fn assume_confirmed(&mut self, confirmed: EntryId) {
        debug_assert!(!self.is_closed());
        self.last_readable = self.last_readable.max(Some(confirmed));
    }

    /// Reads entry `entry_id` and returns its payload.
    pub async fn read(&self, entry_id: EntryId) -> Result<Bytes, LedgerError> {
        if self.last_readable.is_none_or(|last| entry_id > last) {
            return Err(LedgerError::BeyondLastConfirmed {
                ledger_id: self.ledger_id,
                entry_id,
                last: self.last_readable,
            });
        }
        let (_, payload) = read_entry(&self.core, self.ledger_id, &self.metadata, entry_id).await?;
        Ok(payload)
    }

    /// Reads entries `first..=last` (at most `READ_RANGE_ENTRIES_MAX`), up to
    /// `READ_RANGE_PARALLELISM` at a time, and returns their payloads in order.
    /// The first entry that cannot be read fails the whole range.
    pub async fn read_range(
        &self,
        first: EntryId,
        last: EntryId,
    ) -> Result<Vec<Bytes>, LedgerError> {
        if self.last_readable.is_none_or(|readable| last > readable) {
            return Err(LedgerError::BeyondLastConfirmed {
                ledger_id: self.ledger_id,
                entry_id: last,
                last: self.last_readable,
            });
        }
        let count = last.0.checked_sub(first.0).map(|d| d + 1).unwrap_or(0);
        if count == 0 || count > READ_RANGE_ENTRIES_MAX {
            return Err(LedgerError::BadRange {
                first,
                last,
                max_entries: READ_RANGE_ENTRIES_MAX,
            });
        }
        let mut payloads: Vec<Option<Bytes>> = vec![None; count as usize];
        let mut requests = JoinSet::new();
        let mut next = first.0;
        loop {
            while next <= last.0 && requests.len() < READ_RANGE_PARALLELISM {
                let (core, metadata, ledger_id) =
                    (self.core.clone(), self.metadata.clone(), self.ledger_id);
                let entry_id = EntryId(next);
                requests.spawn(async move {
                    let read = read_entry(&core, ledger_id, &metadata, entry_id).await;
                    (entry_id, read)
                });
                next += 1;
            }
            let Some(joined) = requests.join_next().await else {
                break;
            };
            let (entry_id, read) = joined.map_err(|e| LedgerError::Internal(e.to_string()))?;
            let (_, payload) = read?;
            payloads[(entry_id.0 - first.0) as usize] = Some(payload);
        }
        payloads
            .into_iter()
            .map(|p| p.ok_or_else(|| LedgerError::Internal("range read left a hole".into())))
            .collect()
    }

    /// Refreshes the readable end: a closed ledger's last entry, or the highest
    /// LAC the last ensemble's bookies know. Returns it.
    pub async fn read_lac(&mut self) -> Result<Option<EntryId>, LedgerError> {
        if self.is_closed() {
            return Ok(self.last_readable);
        }
        let fresh = crate::store::read(&self.core.store, self.ledger_id)
            .await?
            .metadata;
        if fresh.state == LedgerState::Closed {
            self.last_readable = fresh.last_entry;
            self.metadata = Arc::new(fresh);
            return Ok(self.last_readable);
        }
        self.metadata = Arc::new(fresh);
        let (_, ensemble) = self.metadata.last_ensemble();
        let timeout = self.core.config.read_timeout;
        let mut requests = JoinSet::new();
        for bookie in ensemble {
            let request = self
                .core
                .transport
                .read_lac(bookie, self.ledger_id, ReadMode::Normal);
            let bookie = bookie.clone();
            requests.spawn(async move {
                let answer = tokio::time::timeout(timeout, request)
                    .await
                    .unwrap_or(Err(BookieError::Timeout));
                (bookie, answer)
            });
        }
        let mut answered = false;
        let mut errors = Vec::new();
        while let Some(joined) = requests.join_next().await {
            match joined.map_err(|e| LedgerError::Internal(e.to_string()))? {
                (_, Ok(lac)) => {
                    answered = true;
                    self.last_readable = self.last_readable.max(lac);
                }
                (_, Err(e)) if e.is_no_entry() => answered = true,
                (bookie, Err(e)) => errors.push((bookie, e)),
            }
        }
        if !answered {
            errors.sort_by(|a, b| a.0.cmp(&b.0));
            return Err(LedgerError::LacUnavailable {
                ledger_id: self.ledger_id,
                errors,
            });
        }
        Ok(self.last_readable)
    }
}

/// Reads one entry from its write set, in order, failing over; returns the
/// header and the payload.
pub(crate) async fn read_entry(
    core: &ClientCore,
    ledger_id: LedgerId,
    metadata: &LedgerMetadata,
    entry_id: EntryId,
) -> Result<(crate::entry::EntryHeader, Bytes), LedgerError> {
    read_verified(core, ledger_id, metadata, entry_id, &[])
        .await
        .map(|verified| (verified.header, verified.payload))
}

/// An entry read from a bookie whose CRC and ids checked out.
pub(crate) struct VerifiedEntry {
    pub(crate) header: crate::entry::EntryHeader,
    pub(crate) payload: Bytes,
    /// The entry exactly as stored (for copying it to another bookie).
    pub(crate) packaged: Bytes,
}

/// Reads one entry from its write set (skipping `skip`), in order, failing over
/// on errors, timeouts and corrupt answers.
pub(crate) async fn read_verified(
    core: &ClientCore,
    ledger_id: LedgerId,
    metadata: &LedgerMetadata,
    entry_id: EntryId,
    skip: &[BookieId],
) -> Result<VerifiedEntry, LedgerError> {
    let started = std::time::Instant::now();
    let mut errors: Vec<(BookieId, BookieError)> = Vec::new();
    let mut corrupt: Option<LedgerError> = None;
    for bookie in metadata.write_set(entry_id) {
        if skip.contains(&bookie) {
            continue;
        }
        let request = core
            .transport
            .read(&bookie, ledger_id, entry_id, ReadMode::Normal);
        let answer = tokio::time::timeout(core.config.read_timeout, request)
            .await
            .unwrap_or(Err(BookieError::Timeout));
        match answer {
            Ok(packaged) => match unpackage(&packaged, ledger_id, entry_id) {
                Ok((header, payload)) => {
                    core.stats.record_read(started.elapsed(), payload.len());
                    return Ok(VerifiedEntry {
                        header,
                        payload,
                        packaged,
                    });
                }
                Err(error) => {
                    tracing::warn!(ledger = %ledger_id, entry = %entry_id, %bookie, %error, "corrupt entry");
                    core.stats
                        .corrupt_reads
                        .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    corrupt = Some(LedgerError::Corrupt { bookie, error });
                }
            },
            Err(error) => errors.push((bookie, error)),
        }
    }
    Err(corrupt.unwrap_or(LedgerError::EntryUnavailable {
        ledger_id,
        entry_id,
        errors,
    }))
}
