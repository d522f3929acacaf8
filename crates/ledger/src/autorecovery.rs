//! Auto-recovery: brings every entry back to Qw copies after bookies are lost.
//!
//! Owns: deciding which bookies are lost (not registered as available for
//! `lost_grace`), finding the ledger segments that list one, copying the
//! entries such a bookie held in a segment to a replacement bookie (read from
//! a surviving replica, checked, written with the recovery flag so a fenced
//! ledger takes it), and recording the replacement in the ledger's metadata
//! with a CAS. One process at a time does this: the holder of an ephemeral
//! leader key (`AUTORECOVERY_LEADER_KEY`).
//!
//! Reading every ledger's metadata on every pass costs one metadata read per
//! ledger per `scan_interval` (100,000 ledgers every 30 s: ~3,300 reads/s on
//! an idle cluster). A pass reads instead: ledgers it has not seen yet, ledgers
//! whose last-read bookies include one that is not available now, and every
//! ledger once per `full_audit_interval` (a segment added to a known ledger
//! after its last read lists bookies available then; if one of those is lost
//! before the full audit, it is found then). The last-read bookie sets are
//! kept interned (one copy per distinct set, an index per ledger).
//!
//! Guarantees: the metadata names a replacement only after it durably holds
//! every entry of the segment that the lost bookie held; a CAS conflict (the
//! writer added a segment, a recovery closed the ledger) re-reads and redoes
//! the pass for that ledger, and copying twice is harmless.
//! Never: touches the last segment of an OPEN ledger (its writer owns it and
//! replaces failed bookies itself), a ledger IN_RECOVERY (the recoverer owns
//! it), or deletes anything; copies more than `COPIES_IN_FLIGHT_MAX` entries at
//! once.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;
use vela_meta::{ExpectedVersion, MetaError, MetadataStore};

use crate::client::LedgerClient;
use crate::client_core::ClientCore;
use crate::error::LedgerError;
use crate::metadata::{LEDGERS_PATH, LedgerMetadata, LedgerState};
use crate::placement;
use crate::reader::read_verified;
use crate::store::{self, CasError};
use crate::transport::{AddMode, BookieError};
use crate::types::{BookieId, EntryId, LedgerId};

/// Key held (ephemerally) by the process running auto-recovery.
pub const AUTORECOVERY_LEADER_KEY: &str = "/autorecovery/leader";

/// Entries copied at once per segment: enough to hide a round trip, few
/// enough not to crowd out the write path on the same bookies.
pub const COPIES_IN_FLIGHT_MAX: usize = 64;

/// CAS attempts on one ledger's metadata per pass before leaving it to the
/// next pass.
const CAS_ATTEMPTS_MAX: u32 = 8;

/// Session TTL of the leader key: a crashed leader is replaced after this.
const LEADER_TTL: Duration = Duration::from_secs(10);

/// Tunables of auto-recovery.
#[derive(Debug, Clone)]
pub struct AutoRecoveryConfig {
    /// A bookie unregistered for this long is lost and its data copied
    /// elsewhere (a restart shorter than this costs no copying).
    pub lost_grace: Duration,
    /// Time between audit passes.
    pub scan_interval: Duration,
    /// Time between passes that read every ledger's metadata (the others read
    /// only new ledgers and those listing an unavailable bookie).
    pub full_audit_interval: Duration,
}

impl Default for AutoRecoveryConfig {
    fn default() -> AutoRecoveryConfig {
        AutoRecoveryConfig {
            lost_grace: Duration::from_secs(30),
            scan_interval: Duration::from_secs(30),
            full_audit_interval: Duration::from_secs(3600),
        }
    }
}

/// What one audit pass did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PassReport {
    /// Ledgers whose metadata was read.
    pub ledgers_checked: u64,
    /// Bookies counted as lost in this pass.
    pub lost_bookies: Vec<BookieId>,
    /// Segments whose lost bookie was replaced.
    pub segments_fixed: u64,
    /// Entries copied.
    pub entries_copied: u64,
    /// Ledgers left under-replicated, with why (retried next pass).
    pub failures: Vec<(LedgerId, String)>,
}

/// The auditor and re-replicator. Keeps, across passes, when each bookie was
/// first seen missing.
#[derive(Debug)]
pub struct AutoRecovery {
    client: LedgerClient,
    config: AutoRecoveryConfig,
    missing_since: BTreeMap<BookieId, Instant>,
    known: KnownBookieSets,
    /// When the last pass that read every ledger began; `None` before one.
    last_full_audit: Option<Instant>,
}

/// The bookies each ledger listed when its metadata was last read, with each
/// distinct set stored once: a cluster has few distinct sets and many ledgers.
#[derive(Debug, Default)]
struct KnownBookieSets {
    sets: Vec<Vec<BookieId>>,
    set_index: HashMap<Vec<BookieId>, u32>,
    by_ledger: HashMap<LedgerId, u32>,
}

impl KnownBookieSets {
    fn record(&mut self, ledger_id: LedgerId, bookies: Vec<BookieId>) {
        let index = match self.set_index.get(&bookies) {
            Some(index) => *index,
            None => {
                let index = u32::try_from(self.sets.len()).unwrap_or(u32::MAX);
                self.sets.push(bookies.clone());
                self.set_index.insert(bookies, index);
                index
            }
        };
        self.by_ledger.insert(ledger_id, index);
    }

    fn bookies(&self, ledger_id: LedgerId) -> Option<&[BookieId]> {
        let index = *self.by_ledger.get(&ledger_id)?;
        self.sets.get(index as usize).map(Vec::as_slice)
    }

    /// Forgets ledgers that no longer exist, and then sets no ledger uses.
    fn retain(&mut self, ledger_ids: &[LedgerId]) {
        let present: std::collections::HashSet<LedgerId> = ledger_ids.iter().copied().collect();
        self.by_ledger.retain(|id, _| present.contains(id));
        let used: std::collections::HashSet<u32> = self.by_ledger.values().copied().collect();
        if used.len() == self.sets.len() {
            return;
        }
        let old_sets = std::mem::take(&mut self.sets);
        self.set_index.clear();
        let mut remap = HashMap::new();
        for (old, set) in old_sets.into_iter().enumerate() {
            let old = u32::try_from(old).unwrap_or(u32::MAX);
            if used.contains(&old) {
                let new = u32::try_from(self.sets.len()).unwrap_or(u32::MAX);
                remap.insert(old, new);
                self.set_index.insert(set.clone(), new);
                self.sets.push(set);
            }
        }
        for index in self.by_ledger.values_mut() {
            *index = remap[index];
        }
    }
}

impl AutoRecovery {
    /// Auto-recovery through `client` (its store and bookie transport).
    pub fn new(client: LedgerClient, config: AutoRecoveryConfig) -> AutoRecovery {
        AutoRecovery {
            client,
            config,
            missing_since: BTreeMap::new(),
            known: KnownBookieSets::default(),
            last_full_audit: None,
        }
    }

    /// Whether this pass must read `ledger_id`'s metadata (see the module doc).
    fn needs_read(&self, ledger_id: LedgerId, full: bool, available: &BTreeSet<BookieId>) -> bool {
        if full {
            return true;
        }
        match self.known.bookies(ledger_id) {
            None => true,
            Some(bookies) => bookies.iter().any(|bookie| !available.contains(bookie)),
        }
    }

    /// One pass: the ledgers that need it are read (see the module doc); a
    /// segment listing a lost bookie gets that bookie replaced (its entries
    /// copied first).
    pub async fn pass(&mut self) -> Result<PassReport, LedgerError> {
        let core = self.client.core();
        let available: BTreeSet<BookieId> = store::available_bookies(&core.store)
            .await?
            .into_iter()
            .map(|candidate| candidate.id)
            .collect();
        let now = Instant::now();
        self.missing_since
            .retain(|bookie, _| !available.contains(bookie));
        let mut report = PassReport::default();
        let full = self
            .last_full_audit
            .is_none_or(|at| now.duration_since(at) >= self.config.full_audit_interval);
        if full {
            self.last_full_audit = Some(now);
        }
        let ledger_ids = self.client.ledger_ids().await?;
        self.known.retain(&ledger_ids);
        for ledger_id in ledger_ids {
            if !self.needs_read(ledger_id, full, &available) {
                continue;
            }
            let metadata = match store::read(&core.store, ledger_id).await {
                Ok(versioned) => versioned.metadata,
                // Deleted since the listing.
                Err(LedgerError::NoSuchLedger(_)) => continue,
                Err(error) => {
                    report.failures.push((ledger_id, error.to_string()));
                    continue;
                }
            };
            report.ledgers_checked += 1;
            // Recorded before any fix: a fixed ledger lists a lost bookie no
            // more, and one left unfixed still does, so the next pass reads it
            // again either way.
            self.known.record(ledger_id, metadata.all_bookies());
            let mut lost = BTreeSet::new();
            for bookie in metadata.all_bookies() {
                if available.contains(&bookie) {
                    continue;
                }
                let since = *self.missing_since.entry(bookie.clone()).or_insert(now);
                if now.duration_since(since) >= self.config.lost_grace {
                    lost.insert(bookie);
                }
            }
            if lost.is_empty() {
                continue;
            }
            match self.client.rereplicate(ledger_id, &lost).await {
                Ok((segments, entries)) => {
                    report.segments_fixed += segments;
                    report.entries_copied += entries;
                }
                Err(error) => {
                    tracing::warn!(ledger = %ledger_id, %error, "re-replication failed; retrying next pass");
                    report.failures.push((ledger_id, error.to_string()));
                }
            }
        }
        report.lost_bookies = self
            .missing_since
            .iter()
            .filter(|(_, since)| now.duration_since(**since) >= self.config.lost_grace)
            .map(|(bookie, _)| bookie.clone())
            .collect();
        Ok(report)
    }

    /// Runs passes every `scan_interval` while this process holds the leader
    /// key; waits for it otherwise. Returns when `stop` turns true or its
    /// sender is dropped.
    pub async fn run(mut self, mut stop: watch::Receiver<bool>) {
        let store = self.client.core().store.clone();
        loop {
            let session = tokio::select! {
                _ = until_stopped(&mut stop) => return,
                leader = become_leader(&store) => leader,
            };
            let session = match session {
                Ok(Some(session)) => session,
                Ok(None) => {
                    // Someone else leads; look again in a while.
                    tokio::select! {
                        _ = until_stopped(&mut stop) => return,
                        _ = tokio::time::sleep(self.config.scan_interval.min(LEADER_TTL)) => continue,
                    }
                }
                Err(error) => {
                    tracing::warn!(%error, "auto-recovery cannot reach the metadata store");
                    tokio::select! {
                        _ = until_stopped(&mut stop) => return,
                        _ = tokio::time::sleep(LEADER_TTL) => continue,
                    }
                }
            };
            tracing::info!("auto-recovery: leading");
            loop {
                match self.pass().await {
                    Ok(report) if report.segments_fixed > 0 || !report.failures.is_empty() => {
                        tracing::info!(?report, "auto-recovery pass");
                    }
                    Ok(report) => tracing::debug!(?report, "auto-recovery pass"),
                    Err(error) => tracing::warn!(%error, "auto-recovery pass failed"),
                }
                tokio::select! {
                    _ = until_stopped(&mut stop) => {
                        let _ = session.close().await;
                        return;
                    }
                    _ = session.ended() => {
                        tracing::warn!("auto-recovery: leadership lost");
                        break;
                    }
                    _ = tokio::time::sleep(self.config.scan_interval) => {}
                }
            }
        }
    }
}

/// Resolves once `stop` is true or its sender is gone. Returns nothing, so no
/// borrow of the watch value lives across an `.await` (keeps `run` `Send`).
async fn until_stopped(stop: &mut watch::Receiver<bool>) {
    let _ = stop.wait_for(|stopped| *stopped).await.map(|_| ());
}

/// Takes the leader key with a fresh session; `None` when another holds it.
async fn become_leader(
    store: &Arc<dyn MetadataStore>,
) -> Result<Option<vela_meta::Session>, MetaError> {
    let session = store.session(LEADER_TTL).await?;
    let value = bytes::Bytes::from(format!("pid {}", std::process::id()));
    match store
        .put_ephemeral(
            &session,
            AUTORECOVERY_LEADER_KEY,
            value,
            ExpectedVersion::Absent,
        )
        .await
    {
        Ok(_) => Ok(Some(session)),
        Err(MetaError::Exists { .. }) | Err(MetaError::BadVersion { .. }) => {
            let _ = session.close().await;
            Ok(None)
        }
        Err(error) => {
            let _ = session.close().await;
            Err(error)
        }
    }
}

impl LedgerClient {
    /// Ids of every ledger with metadata.
    pub async fn ledger_ids(&self) -> Result<Vec<LedgerId>, LedgerError> {
        let names = self.core().store.children(LEDGERS_PATH).await?;
        let mut ids: Vec<LedgerId> = names
            .iter()
            .filter_map(|name| name.parse::<u64>().ok().map(LedgerId))
            .collect();
        ids.sort();
        Ok(ids)
    }

    /// Replaces every `lost` bookie in the segments of `ledger_id` that auto-
    /// recovery may touch, copying the entries it held first. Returns the
    /// segments fixed and entries copied.
    pub async fn rereplicate(
        &self,
        ledger_id: LedgerId,
        lost: &BTreeSet<BookieId>,
    ) -> Result<(u64, u64), LedgerError> {
        let core = self.core();
        for _ in 0..CAS_ATTEMPTS_MAX {
            let versioned = store::read(&core.store, ledger_id).await?;
            let metadata = versioned.metadata;
            if metadata.state == LedgerState::InRecovery {
                return Ok((0, 0));
            }
            let mut updated = metadata.clone();
            let (segments, entries) =
                fix_segments(core, ledger_id, &metadata, &mut updated, lost).await?;
            if segments == 0 {
                return Ok((0, 0));
            }
            match store::cas(&core.store, ledger_id, &updated, versioned.version).await {
                Ok(_) => {
                    core.stats
                        .segments_rereplicated
                        .fetch_add(segments, Ordering::Relaxed);
                    core.stats
                        .entries_rereplicated
                        .fetch_add(entries, Ordering::Relaxed);
                    tracing::info!(
                        ledger = %ledger_id, segments, entries, lost = ?lost,
                        "re-replicated"
                    );
                    return Ok((segments, entries));
                }
                Err(CasError::BadVersion) => continue,
                Err(CasError::Failed(error)) => return Err(error),
            }
        }
        Err(LedgerError::MetadataContention(ledger_id))
    }
}

/// The entry range of each segment auto-recovery may touch: every segment of
/// a CLOSED ledger, every segment but the last of an OPEN one. `None` as the
/// last entry: the segment holds no entry.
fn touchable_segments(metadata: &LedgerMetadata) -> Vec<(EntryId, Option<EntryId>)> {
    let firsts: Vec<EntryId> = metadata.ensembles.keys().copied().collect();
    let mut out = Vec::new();
    for (index, first) in firsts.iter().enumerate() {
        let last = match firsts.get(index + 1) {
            Some(next) => next.0.checked_sub(1).map(EntryId),
            None if metadata.state == LedgerState::Closed => metadata.last_entry,
            None => continue,
        };
        let last = last.filter(|last| *last >= *first);
        out.push((*first, last));
    }
    out
}

/// Copies and replaces, in `updated`, the lost bookies of each touchable
/// segment. Returns the segments fixed and entries copied.
async fn fix_segments(
    core: &Arc<ClientCore>,
    ledger_id: LedgerId,
    metadata: &LedgerMetadata,
    updated: &mut LedgerMetadata,
    lost: &BTreeSet<BookieId>,
) -> Result<(u64, u64), LedgerError> {
    let lost_list: Vec<BookieId> = lost.iter().cloned().collect();
    let mut segments = 0u64;
    let mut copied = 0u64;
    for (first, last) in touchable_segments(metadata) {
        let ensemble = metadata.ensembles.get(&first).cloned().unwrap_or_default();
        let lost_indices: Vec<usize> = (0..ensemble.len())
            .filter(|index| lost.contains(&ensemble[*index]))
            .collect();
        if lost_indices.is_empty() {
            continue;
        }
        let keep: Vec<BookieId> = ensemble
            .iter()
            .filter(|bookie| !lost.contains(bookie))
            .cloned()
            .collect();
        let candidates = store::available_bookies(&core.store).await?;
        let replacements = {
            let mut rng = core.rng.lock();
            placement::choose(
                &candidates,
                &keep,
                &lost_list,
                lost_indices.len(),
                &mut *rng,
            )?
        };
        for (&index, replacement) in lost_indices.iter().zip(replacements) {
            if let Some(last) = last {
                copied += copy_entries(
                    core,
                    ledger_id,
                    metadata,
                    (first, last),
                    index,
                    &replacement,
                    &lost_list,
                )
                .await?;
            }
            if let Some(bookies) = updated.ensembles.get_mut(&first) {
                bookies[index] = replacement;
            }
        }
        segments += 1;
    }
    Ok((segments, copied))
}

/// Copies the entries of `range` that the bookie at ensemble `index` held to
/// `target`. Returns how many.
async fn copy_entries(
    core: &Arc<ClientCore>,
    ledger_id: LedgerId,
    metadata: &LedgerMetadata,
    range: (EntryId, EntryId),
    index: usize,
    target: &BookieId,
    lost: &[BookieId],
) -> Result<u64, LedgerError> {
    let metadata = Arc::new(metadata.clone());
    let lost: Arc<[BookieId]> = lost.into();
    let wanted: Vec<EntryId> = (range.0.0..=range.1.0)
        .map(EntryId)
        .filter(|entry| metadata.quorum.stores(*entry, index))
        .collect();
    let mut copies = JoinSet::new();
    let mut next = wanted.into_iter();
    let mut copied = 0u64;
    loop {
        while copies.len() < COPIES_IN_FLIGHT_MAX {
            let Some(entry) = next.next() else { break };
            let (core, metadata, lost, target) = (
                Arc::clone(core),
                Arc::clone(&metadata),
                Arc::clone(&lost),
                target.clone(),
            );
            copies.spawn(async move {
                let read = read_verified(&core, ledger_id, &metadata, entry, &lost).await?;
                let write =
                    core.transport
                        .add(&target, ledger_id, entry, read.packaged, AddMode::Recovery);
                match tokio::time::timeout(core.config.add_timeout, write).await {
                    Ok(Ok(())) => Ok(()),
                    Ok(Err(error)) => Err(LedgerError::Rereplication {
                        ledger_id,
                        entry_id: entry,
                        reason: error.to_string(),
                    }),
                    Err(_) => Err(LedgerError::Rereplication {
                        ledger_id,
                        entry_id: entry,
                        reason: BookieError::Timeout.to_string(),
                    }),
                }
            });
        }
        let Some(joined) = copies.join_next().await else {
            break;
        };
        joined.map_err(|e| LedgerError::Internal(format!("copy task failed: {e}")))??;
        copied += 1;
    }
    Ok(copied)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::Quorum;

    fn metadata(state: LedgerState, firsts: &[u64], last: Option<u64>) -> LedgerMetadata {
        let quorum = Quorum::new(2, 2, 2).expect("valid quorum");
        let mut metadata = LedgerMetadata::new_open(
            quorum,
            vec![BookieId::new("a"), BookieId::new("b")],
            0,
            BTreeMap::new(),
        );
        for first in firsts.iter().skip(1) {
            metadata.set_last_ensemble(
                EntryId(*first),
                vec![BookieId::new("a"), BookieId::new("c")],
            );
        }
        metadata.state = state;
        metadata.last_entry = last.map(EntryId);
        metadata
    }

    #[test]
    fn open_ledgers_keep_their_last_segment_to_the_writer() {
        let open = metadata(LedgerState::Open, &[0, 10, 20], None);
        assert_eq!(
            touchable_segments(&open),
            vec![
                (EntryId(0), Some(EntryId(9))),
                (EntryId(10), Some(EntryId(19)))
            ]
        );
        let closed = metadata(LedgerState::Closed, &[0, 10], Some(14));
        assert_eq!(
            touchable_segments(&closed),
            vec![
                (EntryId(0), Some(EntryId(9))),
                (EntryId(10), Some(EntryId(14)))
            ]
        );
        // A segment that starts past the last entry holds nothing.
        let empty_tail = metadata(LedgerState::Closed, &[0, 10], Some(9));
        assert_eq!(touchable_segments(&empty_tail)[1], (EntryId(10), None));
        let empty = metadata(LedgerState::Closed, &[0], None);
        assert_eq!(touchable_segments(&empty), vec![(EntryId(0), None)]);
    }
}
