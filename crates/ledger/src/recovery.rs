//! Open with recovery: fence a ledger another writer may still hold, find where
//! it ends, and close it there.
//!
//! Owns: the recovery protocol (storage notes §3.8-3.9):
//! 1. CLOSED: nothing to do. OPEN: CAS to IN_RECOVERY (the old writer's
//!    ensemble changes and close then fail).
//! 2. Fence the last ensemble and read its LAC, until every write set has at
//!    least Qw-Qa+1 fenced members (then no writer can reach Qa anywhere).
//! 3. From max(LAC, first entry of the last segment - 1), read forward with
//!    fencing reads. An entry is found if any bookie returns it (CRC checked);
//!    it is missing once Qw-Qa+1 of its write set say they do not have it;
//!    other answers leave it unknown (retried, never taken as missing).
//! 4. Re-write each found entry, byte for byte, with RECOVERY adds to its full
//!    write set (waiting for at least Qa; all Qw unless a bookie keeps
//!    failing). A bookie that fails a re-write is replaced when a spare exists:
//!    a new segment from that entry, recorded with the close.
//! 5. At the first missing entry: CAS to CLOSED with the last found entry and
//!    its ledger length. A racing recoverer that closed first wins; its result
//!    is returned.
//!
//! Why it is safe: an acknowledged entry reached Qa bookies of its write set, so
//! at most Qw-Qa of them can deny it, and the "missing" verdict needs one more
//! denial than that; denials come from fencing reads, so a denier can no longer
//! accept the old writer's adds.
//!
//! Never: concludes "missing" from errors or timeouts. If the last
//! ensemble's bookies stay silent (no fencing coverage, an entry neither found
//! nor denied), it returns `RecoveryIncomplete` and leaves the ledger
//! IN_RECOVERY for a retry.

use std::collections::BTreeMap;

use bytes::Bytes;
use tokio::task::JoinSet;

use crate::client_core::ClientCore;
use crate::entry::unpackage;
use crate::error::LedgerError;
use crate::metadata::{ENSEMBLES_MAX, LedgerMetadata, LedgerState};
use crate::placement;
use crate::reader::read_entry;
use crate::store::{self, CasError, Versioned};
use crate::transport::{AddMode, BookieError, ReadMode};
use crate::types::{BookieId, EntryId, LedgerId, Quorum, entry_after, entry_before};

/// CAS attempts for each metadata transition before `MetadataContention`.
const METADATA_CAS_ATTEMPTS_MAX: u32 = 16;

/// Recovers `ledger_id` and returns its closed metadata.
pub(crate) async fn recover(
    core: &ClientCore,
    ledger_id: LedgerId,
) -> Result<LedgerMetadata, LedgerError> {
    let versioned = match mark_in_recovery(core, ledger_id).await? {
        Marked::Closed(metadata) => return Ok(metadata),
        Marked::InRecovery(versioned) => versioned,
    };
    let metadata = &versioned.metadata;
    let (first_of_last, ensemble) = metadata.last_ensemble();
    let ensemble = ensemble.to_vec();
    let lac = fence(core, ledger_id, metadata.quorum, &ensemble).await?;
    let start = lac.max(entry_before(first_of_last));
    let mut last = start;
    // Ledger length at `last`: known from the last entry found; if none is
    // found past `start`, read entry `start` itself (below).
    let mut length_bytes: Option<u64> = None;
    // Where re-writes go: the last ensemble, with bookies that fail re-writes
    // replaced; each replacement starts a segment recorded at close.
    let mut target = ensemble.clone();
    let mut new_segments: BTreeMap<EntryId, Vec<BookieId>> = BTreeMap::new();
    tracing::info!(ledger = %ledger_id, ?lac, ?start, "recovery: fenced, reading forward");
    loop {
        let entry_id = entry_after(last);
        let write_set: Vec<BookieId> = metadata.write_set(entry_id);
        match probe(core, ledger_id, metadata.quorum, &write_set, entry_id).await? {
            Probe::Missing => break,
            Probe::Found(packaged, entry_length_bytes) => {
                let mut rewrite = Rewrite {
                    core,
                    ledger_id,
                    quorum: metadata.quorum,
                    target: &mut target,
                    new_segments: &mut new_segments,
                };
                rewrite.entry(entry_id, packaged).await?;
                last = Some(entry_id);
                length_bytes = Some(entry_length_bytes);
            }
        }
    }
    let length_bytes = match (length_bytes, start) {
        (Some(length_bytes), _) => length_bytes,
        (None, None) => 0,
        (None, Some(entry)) => {
            read_with_retry(core, ledger_id, metadata, entry)
                .await?
                .ledger_length
        }
    };
    close(
        core,
        ledger_id,
        versioned,
        &new_segments,
        last,
        length_bytes,
    )
    .await
}

enum Marked {
    Closed(LedgerMetadata),
    InRecovery(Versioned),
}

async fn mark_in_recovery(core: &ClientCore, ledger_id: LedgerId) -> Result<Marked, LedgerError> {
    for _ in 0..METADATA_CAS_ATTEMPTS_MAX {
        let versioned = store::read(&core.store, ledger_id).await?;
        match versioned.metadata.state {
            LedgerState::Closed => return Ok(Marked::Closed(versioned.metadata)),
            // Another recoverer started (or crashed): recover again; the
            // protocol is idempotent and the close is a CAS.
            LedgerState::InRecovery => return Ok(Marked::InRecovery(versioned)),
            LedgerState::Open => {
                let mut metadata = versioned.metadata.clone();
                metadata.state = LedgerState::InRecovery;
                match store::cas(&core.store, ledger_id, &metadata, versioned.version).await {
                    Ok(version) => return Ok(Marked::InRecovery(Versioned { metadata, version })),
                    Err(CasError::BadVersion) => continue,
                    Err(CasError::Failed(e)) => return Err(e),
                }
            }
        }
    }
    Err(LedgerError::MetadataContention(ledger_id))
}

/// Whether every write set of the ensemble has `coverage` members in `done`.
fn covered(quorum: Quorum, done: &[bool]) -> bool {
    (0..quorum.ensemble_size() as u64).all(|first| {
        quorum
            .write_set(EntryId(first))
            .filter(|&index| done[index])
            .count()
            >= quorum.coverage()
    })
}

/// Fences the ensemble until every write set is covered; returns the highest
/// LAC the fenced bookies reported.
async fn fence(
    core: &ClientCore,
    ledger_id: LedgerId,
    quorum: Quorum,
    ensemble: &[BookieId],
) -> Result<Option<EntryId>, LedgerError> {
    let mut fenced = vec![false; ensemble.len()];
    let mut lac: Option<EntryId> = None;
    let mut last_errors: Vec<(BookieId, BookieError)> = Vec::new();
    for attempt in 0..core.config.recovery_attempts_max.max(1) {
        if attempt > 0 {
            tokio::time::sleep(core.config.recovery_retry_delay).await;
        }
        let mut requests = JoinSet::new();
        for (index, bookie) in ensemble.iter().enumerate().filter(|(i, _)| !fenced[*i]) {
            let request = core.transport.read_lac(bookie, ledger_id, ReadMode::Fence);
            let timeout = core.config.read_timeout;
            requests.spawn(async move {
                let answer = tokio::time::timeout(timeout, request)
                    .await
                    .unwrap_or(Err(BookieError::Timeout));
                (index, answer)
            });
        }
        last_errors.clear();
        while let Some(joined) = requests.join_next().await {
            let (index, answer) = joined.map_err(|e| LedgerError::Internal(e.to_string()))?;
            match answer {
                Ok(bookie_lac) => {
                    fenced[index] = true;
                    lac = lac.max(bookie_lac);
                }
                Err(error) => last_errors.push((ensemble[index].clone(), error)),
            }
        }
        if covered(quorum, &fenced) {
            return Ok(lac);
        }
    }
    Err(LedgerError::RecoveryIncomplete {
        ledger_id,
        reason: format!("could not fence a quorum of every write set: {last_errors:?}"),
    })
}

async fn read_with_retry(
    core: &ClientCore,
    ledger_id: LedgerId,
    metadata: &LedgerMetadata,
    entry_id: EntryId,
) -> Result<crate::entry::EntryHeader, LedgerError> {
    let mut last_error = None;
    for attempt in 0..core.config.recovery_attempts_max.max(1) {
        if attempt > 0 {
            tokio::time::sleep(core.config.recovery_retry_delay).await;
        }
        match read_entry(core, ledger_id, metadata, entry_id).await {
            Ok((header, _)) => return Ok(header),
            Err(e) => last_error = Some(e),
        }
    }
    Err(LedgerError::RecoveryIncomplete {
        ledger_id,
        reason: format!("cannot read confirmed entry {entry_id}: {last_error:?}"),
    })
}

enum Probe {
    /// The packaged entry and its ledger length.
    Found(Bytes, u64),
    Missing,
}

/// Decides whether `entry_id` exists, with fencing reads of its write set.
async fn probe(
    core: &ClientCore,
    ledger_id: LedgerId,
    quorum: Quorum,
    write_set: &[BookieId],
    entry_id: EntryId,
) -> Result<Probe, LedgerError> {
    let mut denied = vec![false; write_set.len()];
    let mut last_errors: Vec<(BookieId, BookieError)> = Vec::new();
    for attempt in 0..core.config.recovery_attempts_max.max(1) {
        if attempt > 0 {
            tokio::time::sleep(core.config.recovery_retry_delay).await;
        }
        let mut requests = JoinSet::new();
        for (index, bookie) in write_set.iter().enumerate().filter(|(i, _)| !denied[*i]) {
            let request = core
                .transport
                .read(bookie, ledger_id, entry_id, ReadMode::Fence);
            let timeout = core.config.read_timeout;
            requests.spawn(async move {
                let answer = tokio::time::timeout(timeout, request)
                    .await
                    .unwrap_or(Err(BookieError::Timeout));
                (index, answer)
            });
        }
        last_errors.clear();
        while let Some(joined) = requests.join_next().await {
            let (index, answer) = joined.map_err(|e| LedgerError::Internal(e.to_string()))?;
            tracing::debug!(ledger = %ledger_id, entry = %entry_id, bookie = %write_set[index], ok = answer.is_ok(), error = ?answer.as_ref().err(), "recovery read");
            match answer {
                Ok(packaged) => match unpackage(&packaged, ledger_id, entry_id) {
                    Ok((header, _)) => return Ok(Probe::Found(packaged, header.ledger_length)),
                    Err(error) => {
                        tracing::warn!(ledger = %ledger_id, entry = %entry_id, bookie = %write_set[index], %error, "corrupt entry in recovery");
                        last_errors
                            .push((write_set[index].clone(), BookieError::CorruptEntry(error)));
                    }
                },
                Err(error) if error.is_no_entry() => denied[index] = true,
                Err(error) => last_errors.push((write_set[index].clone(), error)),
            }
        }
        if denied.iter().filter(|d| **d).count() >= quorum.coverage() {
            return Ok(Probe::Missing);
        }
    }
    Err(LedgerError::RecoveryIncomplete {
        ledger_id,
        reason: format!("entry {entry_id}: neither found nor denied by a quorum: {last_errors:?}"),
    })
}

/// Re-writes found entries with RECOVERY adds, replacing bookies that fail.
struct Rewrite<'a> {
    core: &'a ClientCore,
    ledger_id: LedgerId,
    quorum: Quorum,
    /// The ensemble re-writes go to (the last one, with replacements).
    target: &'a mut Vec<BookieId>,
    /// Segments started by replacements, recorded at close.
    new_segments: &'a mut BTreeMap<EntryId, Vec<BookieId>>,
}

impl Rewrite<'_> {
    /// Re-writes one entry to its whole write set in `target`. A bookie that
    /// fails is replaced (a new segment from this entry) when a spare exists,
    /// as the writer would; settles for Qa acks if some keep failing (the entry
    /// is then as durable as any acknowledged entry).
    async fn entry(&mut self, entry_id: EntryId, packaged: Bytes) -> Result<(), LedgerError> {
        let indices: Vec<usize> = self.quorum.write_set(entry_id).collect();
        let mut acked = vec![false; self.target.len()];
        let mut last_errors: Vec<(BookieId, BookieError)> = Vec::new();
        let attempts = self.core.config.recovery_attempts_max.max(1);
        for attempt in 0..attempts {
            if attempt > 0 {
                tokio::time::sleep(self.core.config.recovery_retry_delay).await;
            }
            let mut requests = JoinSet::new();
            for &index in indices.iter().filter(|&&i| !acked[i]) {
                let request = self.core.transport.add(
                    &self.target[index],
                    self.ledger_id,
                    entry_id,
                    packaged.clone(),
                    AddMode::Recovery,
                );
                let timeout = self.core.config.add_timeout;
                requests.spawn(async move {
                    let answer = tokio::time::timeout(timeout, request)
                        .await
                        .unwrap_or(Err(BookieError::Timeout));
                    (index, answer)
                });
            }
            last_errors.clear();
            let mut failed = Vec::new();
            while let Some(joined) = requests.join_next().await {
                let (index, answer) = joined.map_err(|e| LedgerError::Internal(e.to_string()))?;
                match answer {
                    Ok(()) => acked[index] = true,
                    Err(error) => {
                        last_errors.push((self.target[index].clone(), error));
                        failed.push(index);
                    }
                }
            }
            let acked_count = indices.iter().filter(|&&i| acked[i]).count();
            // Every bookie of the write set has it: done. Otherwise retry the
            // rest, but never more than half the attempts once Qa is reached.
            if acked_count == indices.len()
                || (acked_count >= self.quorum.ack_quorum() && attempt + 1 >= attempts.div_ceil(2))
            {
                return Ok(());
            }
            failed.sort_unstable();
            self.replace(entry_id, &failed).await?;
        }
        Err(LedgerError::RecoveryIncomplete {
            ledger_id: self.ledger_id,
            reason: format!(
                "re-write of entry {entry_id} reached fewer than Qa bookies: {last_errors:?}"
            ),
        })
    }

    /// Replaces the bookies at `failed` ensemble indices if spares exist; with
    /// none, leaves them (the next round retries them).
    async fn replace(&mut self, entry_id: EntryId, failed: &[usize]) -> Result<(), LedgerError> {
        if failed.is_empty() {
            return Ok(());
        }
        let failed_bookies: Vec<BookieId> =
            failed.iter().map(|&i| self.target[i].clone()).collect();
        let keep: Vec<BookieId> = (0..self.target.len())
            .filter(|i| !failed.contains(i))
            .map(|i| self.target[i].clone())
            .collect();
        let candidates = self.core.available_bookies().await?;
        let picks = {
            let mut rng = self.core.rng.lock();
            placement::choose(&candidates, &keep, &failed_bookies, failed.len(), &mut *rng)
        };
        let Ok(picks) = picks else {
            return Ok(());
        };
        for (&index, pick) in failed.iter().zip(picks) {
            self.target[index] = pick;
        }
        tracing::info!(
            ledger = %self.ledger_id, first_entry = %entry_id, replaced = ?failed_bookies,
            ensemble = ?self.target, "recovery: ensemble changed"
        );
        self.new_segments.insert(entry_id, self.target.clone());
        Ok(())
    }
}

async fn close(
    core: &ClientCore,
    ledger_id: LedgerId,
    mut versioned: Versioned,
    new_segments: &BTreeMap<EntryId, Vec<BookieId>>,
    last: Option<EntryId>,
    length_bytes: u64,
) -> Result<LedgerMetadata, LedgerError> {
    for _ in 0..METADATA_CAS_ATTEMPTS_MAX {
        if versioned.metadata.state == LedgerState::Closed {
            // A racing recoverer closed it first: its decision stands.
            return Ok(versioned.metadata);
        }
        let mut metadata = versioned.metadata.clone();
        for (first, ensemble) in new_segments {
            if metadata.ensembles.len() >= ENSEMBLES_MAX {
                return Err(LedgerError::TooManyEnsembleChanges(ledger_id));
            }
            metadata.set_last_ensemble(*first, ensemble.clone());
        }
        metadata.state = LedgerState::Closed;
        metadata.last_entry = last;
        metadata.length_bytes = length_bytes;
        match store::cas(&core.store, ledger_id, &metadata, versioned.version).await {
            Ok(_) => {
                tracing::info!(ledger = %ledger_id, ?last, length_bytes, "recovery: closed");
                return Ok(metadata);
            }
            Err(CasError::BadVersion) => versioned = store::read(&core.store, ledger_id).await?,
            Err(CasError::Failed(e)) => return Err(e),
        }
    }
    Err(LedgerError::MetadataContention(ledger_id))
}
