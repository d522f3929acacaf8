//! The transaction buffer of one topic (Pulsar's `TopicTransactionBuffer`):
//! transactional entries are appended to the topic's log at once but stay
//! invisible to subscriptions until their transaction commits, and never
//! become visible when it aborts.
//!
//! Owns: [`TxnBuffer`]: the topic's open transactions (the first entry of
//! each), its aborted transactions (with the position of their abort
//! marker), the *read limit* derived from them (Pulsar's
//! `maxReadPosition`: subscriptions read only entries before the first
//! entry of the oldest open transaction), the commit/abort markers
//! (MessageMetadata `marker_type` TXN_COMMIT = 21 / TXN_ABORT = 22 with the
//! transaction id, producer `pulsar.txn.marker`, no payload, as Pulsar's
//! `Markers`), the buffer's snapshot in the metadata store and its recovery
//! from the log; and [`TxnBudget`], the broker-wide bound on the
//! transaction state topics and subscriptions hold in memory.
//!
//! Invariants:
//! - a transaction is in `open` from before its first append is issued
//!   until its marker is durable; while its first position is not known
//!   yet (`First::Pending`) nothing after the last entry confirmed before
//!   it is readable, so no entry of an open transaction is ever read;
//! - every transactional entry carries its transaction id in its
//!   MessageMetadata (fields 22/23, added by [`with_txn_id`] when the
//!   client did not set them), so subscriptions and recovery tell its
//!   transaction from the entry alone;
//! - before the first transactional entry of a topic is appended, a
//!   snapshot record exists (`/transactions/buffers/{log}`), so a topic
//!   without one never had transactional entries after its `after`
//!   position and opens without a scan; recovery scans the log after it;
//! - a transaction that ended here is never opened here again: a late
//!   SEND of it (or of any transaction at or below its coordinator's low
//!   water mark) gets Pulsar's NotAllowedError `Transaction [(m,l)] has
//!   been ended. Please use a new transaction to send message.`, so a
//!   committed transaction's entries are never hidden by a later abort; the
//!   ended transactions above the mark and the marks themselves are in the
//!   snapshot (and commit markers rebuild them on recovery).
//!
//! Bounds: open, aborted and ended transactions of every topic count
//! against [`TxnBudget`] (`TransactionConfig::state_entries_max`); when it
//! is full a SEND opening a transaction on a topic gets NotAllowedError.
//! Aborted transactions are forgotten once the log trimmed their marker,
//! ended ones once their coordinator's low water mark (sent with every
//! END_TXN_ON_PARTITION) passes them.
//! Never: decides a transaction's outcome (its coordinator does) or waits
//! for an append while holding its lock.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};

use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::{OnceCell, watch};
use vela_log::{AppendFuture, LogError, ManagedLog, Position};
use vela_meta::{ExpectedVersion, MetaError, MetadataStore};

/// A transaction id: (most significant bits = coordinator id, least).
pub(crate) type TxnKey = (u64, u64);

fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// Pulsar's `MarkerType.TXN_COMMIT`.
pub(crate) const MARKER_TXN_COMMIT: i32 = 21;
/// Pulsar's `MarkerType.TXN_ABORT`.
pub(crate) const MARKER_TXN_ABORT: i32 = 22;
/// The producer name of marker entries (Pulsar's).
const MARKER_PRODUCER: &str = "pulsar.txn.marker";
/// Transactions ended between two snapshots of a topic's buffer.
const SNAPSHOT_EVERY_ENDS: u64 = 100;
/// Entries read per step when recovering.
const RECOVERY_BATCH_ENTRIES: usize = 1000;
/// Bytes read per step when recovering.
const RECOVERY_BATCH_BYTES: usize = 8 << 20;

/// Failures of the buffer.
#[derive(Debug, thiserror::Error)]
pub(crate) enum BufferError {
    #[error(
        "the broker holds {max} transactions and pending acknowledgements already (transaction state budget)"
    )]
    Full { max: usize },
    /// Pulsar's message for a SEND of a transaction that ended: below its
    /// coordinator's low water mark, or ended on this topic already.
    #[error(
        "Transaction [({0},{1})] has been ended. Please use a new transaction to send message."
    )]
    Ended(u64, u64),
    #[error("the stored entry is malformed: cannot add the transaction id")]
    Malformed,
    #[error("transaction buffer log: {0}")]
    Log(#[from] LogError),
    #[error("transaction buffer snapshot: {0}")]
    Meta(#[from] MetaError),
    #[error("transaction buffer snapshot is corrupt: {0}")]
    Corrupt(String),
}

/// The broker-wide count of transaction state records held in memory: open
/// and aborted transactions of every topic's buffer, transactional
/// acknowledgements of every subscription.
#[derive(Debug)]
pub(crate) struct TxnBudget {
    used: AtomicUsize,
    max: usize,
}

impl TxnBudget {
    pub(crate) fn new(max: usize) -> Arc<TxnBudget> {
        Arc::new(TxnBudget {
            used: AtomicUsize::new(0),
            max,
        })
    }

    /// Takes `n` records if they fit.
    pub(crate) fn try_take(&self, n: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                let next = used.checked_add(n)?;
                (next <= self.max).then_some(next)
            })
            .is_ok()
    }

    /// Takes `n` records even past the bound (state recovered from disk
    /// must be held; new work is refused until it shrinks).
    pub(crate) fn take_forced(&self, n: usize) {
        self.used.fetch_add(n, Ordering::AcqRel);
    }

    pub(crate) fn release(&self, n: usize) {
        let before = self.used.fetch_sub(n, Ordering::AcqRel);
        debug_assert!(before >= n, "transaction budget released more than taken");
    }

    /// Records held now.
    pub(crate) fn used(&self) -> usize {
        self.used.load(Ordering::Acquire)
    }

    /// The bound.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    pub(crate) fn full_error(&self) -> BufferError {
        BufferError::Full { max: self.max }
    }
}

/// Where an open transaction's first entry is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum First {
    /// Its first append is issued, not yet durable: nothing after this
    /// position (the last one confirmed when it was issued) is readable.
    Pending(Option<Position>),
    Known(Position),
}

impl First {
    /// The first position that must not be read while the transaction is open.
    fn bound(self) -> Position {
        match self {
            First::Pending(Some(after)) => Position::new(after.ledger_id, after.entry_id + 1),
            First::Pending(None) => Position::new(0, 0),
            First::Known(first) => first,
        }
    }
}

#[derive(Debug)]
struct OpenTxn {
    first: First,
    /// Entries appended (issued) for it.
    entries: u64,
}

#[derive(Debug, Default)]
struct State {
    open: HashMap<TxnKey, OpenTxn>,
    /// Aborted transactions → the position of their abort marker.
    aborted: HashMap<TxnKey, Position>,
    /// Transactions ended here (committed, or aborted with no entry here)
    /// and not yet at or below their coordinator's low water mark as heard
    /// here: a late SEND of one is refused, never opens it again (which
    /// would hold the read limit, or hide its committed entries once
    /// aborted as stale).
    ended: HashSet<TxnKey>,
    /// Coordinator id → its low water mark as last heard (one entry per
    /// coordinator: `TransactionConfig::coordinators` at most).
    low_water: HashMap<u64, u64>,
}

impl State {
    fn limit(&self) -> Option<Position> {
        self.open.values().map(|txn| txn.first.bound()).min()
    }

    /// True when `txn` is at or below its coordinator's low water mark.
    fn below_low_water(&self, txn: TxnKey) -> bool {
        self.low_water.get(&txn.0).is_some_and(|low| txn.1 <= *low)
    }

    /// Records held against the budget.
    fn records(&self) -> usize {
        self.open.len() + self.aborted.len() + self.ended.len()
    }
}

/// The buffer's record in the metadata store.
#[derive(Debug, Serialize, Deserialize)]
struct Snapshot {
    /// Everything at or before this position is reflected here (`None`:
    /// scan from the start).
    after: Option<(u64, u64)>,
    /// Aborted transactions: (most, least, marker ledger, marker entry).
    aborted: Vec<(u64, u64, u64, u64)>,
    /// Transactions ended here above their coordinator's low water mark:
    /// (most, least). Absent in snapshots written before it existed.
    #[serde(default)]
    ended: Vec<(u64, u64)>,
    /// Low water marks heard: (coordinator id, mark).
    #[serde(default)]
    low_water: Vec<(u64, u64)>,
}

/// The metadata key of a topic's buffer snapshot.
pub(crate) fn snapshot_key(log_name: &str) -> String {
    format!("/transactions/buffers/{log_name}")
}

/// One topic's transaction buffer. Shared behind an `Arc`.
#[derive(Debug)]
pub(crate) struct TxnBuffer {
    log: Arc<ManagedLog>,
    meta: Arc<dyn MetadataStore>,
    key: String,
    budget: Arc<TxnBudget>,
    state: Mutex<State>,
    /// Set once a snapshot record exists: transactional entries may follow.
    tracked: OnceCell<()>,
    /// Cheap check for subscriptions: entries may need filtering.
    has_txns: AtomicBool,
    /// The read limit (exclusive; `None`: the log's last confirmed entry);
    /// sent on every change so blocked subscriptions wake up.
    limit: watch::Sender<Option<Position>>,
    ends_since_snapshot: AtomicU64,
    snapshotting: AtomicBool,
    /// Transactions committed and aborted here since the topic opened.
    committed: AtomicU64,
    aborted: AtomicU64,
    /// When the last snapshot was written, and when recovery began and
    /// ended (Unix ms; 0: never).
    last_snapshot_unix_ms: AtomicU64,
    recover_start_unix_ms: AtomicU64,
    recover_end_unix_ms: AtomicU64,
}

impl TxnBuffer {
    /// The buffer of the topic whose log is `log`: recovered from its
    /// snapshot and the log after it (no snapshot: the topic never had
    /// transactional entries, nothing to read).
    pub(crate) async fn open(
        log: Arc<ManagedLog>,
        meta: Arc<dyn MetadataStore>,
        budget: Arc<TxnBudget>,
    ) -> Result<Arc<TxnBuffer>, BufferError> {
        let key = snapshot_key(log.name());
        let snapshot = match meta.get(&key).await? {
            Some((bytes, _)) => Some(
                serde_json::from_slice::<Snapshot>(&bytes)
                    .map_err(|e| BufferError::Corrupt(e.to_string()))?,
            ),
            None => None,
        };
        let buffer = Arc::new(TxnBuffer {
            log,
            meta,
            key,
            budget,
            state: Mutex::new(State::default()),
            tracked: OnceCell::new(),
            has_txns: AtomicBool::new(false),
            limit: watch::Sender::new(None),
            ends_since_snapshot: AtomicU64::new(0),
            snapshotting: AtomicBool::new(false),
            committed: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            last_snapshot_unix_ms: AtomicU64::new(0),
            recover_start_unix_ms: AtomicU64::new(0),
            recover_end_unix_ms: AtomicU64::new(0),
        });
        if let Some(snapshot) = snapshot {
            buffer
                .recover_start_unix_ms
                .store(unix_ms(), Ordering::Relaxed);
            buffer.recover(snapshot).await?;
            buffer
                .recover_end_unix_ms
                .store(unix_ms(), Ordering::Relaxed);
            let _ = buffer.tracked.set(());
            buffer.has_txns.store(true, Ordering::Release);
        }
        Ok(buffer)
    }

    async fn recover(&self, snapshot: Snapshot) -> Result<(), BufferError> {
        let mut state = State::default();
        for (most, least, ledger, entry) in snapshot.aborted {
            state
                .aborted
                .insert((most, least), Position::new(ledger, entry));
        }
        state.low_water = snapshot.low_water.into_iter().collect();
        state.ended = snapshot.ended.into_iter().collect();
        let mut from = match snapshot.after {
            Some((ledger, entry)) => self.log.next_position(Position::new(ledger, entry)),
            None => Position::new(0, 0),
        };
        let mut scanned = 0u64;
        loop {
            let entries = self
                .log
                .read(from, RECOVERY_BATCH_ENTRIES, RECOVERY_BATCH_BYTES)
                .await?;
            let Some(last) = entries.last().map(|e| e.position) else {
                break;
            };
            for entry in &entries {
                scanned += 1;
                match classify(&entry.data) {
                    Kind::Plain => {}
                    Kind::Data(txn) => {
                        // An ended transaction's entries (before its
                        // marker) do not open it again.
                        if !state.aborted.contains_key(&txn) && !state.ended.contains(&txn) {
                            let open = state.open.entry(txn).or_insert(OpenTxn {
                                first: First::Known(entry.position),
                                entries: 0,
                            });
                            open.entries += 1;
                        }
                    }
                    Kind::Commit(txn) => {
                        state.open.remove(&txn);
                        if !state.below_low_water(txn) {
                            state.ended.insert(txn);
                        }
                    }
                    Kind::Abort(txn) => {
                        state.open.remove(&txn);
                        state.aborted.insert(txn, entry.position);
                    }
                }
            }
            from = self.log.next_position(last);
        }
        self.budget.take_forced(state.records());
        tracing::info!(
            log = %self.log.name(),
            scanned,
            open = state.open.len(),
            aborted = state.aborted.len(),
            ended = state.ended.len(),
            "transaction buffer recovered"
        );
        let limit = state.limit();
        *self.state.lock() = state;
        self.limit.send_replace(limit);
        Ok(())
    }

    /// Makes sure a snapshot record exists before the topic's first
    /// transactional entry is appended (one metadata write per topic).
    pub(crate) async fn ensure_tracked(&self) -> Result<(), BufferError> {
        self.tracked
            .get_or_try_init(|| async {
                let snapshot = Snapshot {
                    after: self.log.last_confirmed().map(|p| (p.ledger_id, p.entry_id)),
                    aborted: Vec::new(),
                    ended: Vec::new(),
                    low_water: Vec::new(),
                };
                self.write_snapshot(&snapshot).await?;
                self.has_txns.store(true, Ordering::Release);
                Ok::<(), BufferError>(())
            })
            .await?;
        Ok(())
    }

    async fn write_snapshot(&self, snapshot: &Snapshot) -> Result<(), BufferError> {
        let bytes =
            serde_json::to_vec(snapshot).map_err(|e| BufferError::Corrupt(e.to_string()))?;
        self.meta
            .put(&self.key, Bytes::from(bytes), ExpectedVersion::Any)
            .await?;
        self.last_snapshot_unix_ms
            .store(unix_ms(), Ordering::Relaxed);
        Ok(())
    }

    /// Registers an entry of `txn` about to be appended: opens the
    /// transaction (charging the budget) if this is its first entry here.
    /// Call [`TxnBuffer::issued`] right after issuing the append (or
    /// [`TxnBuffer::not_appended`] when it was not issued).
    pub(crate) fn admit(&self, txn: TxnKey) -> Result<(), BufferError> {
        debug_assert!(self.tracked.initialized(), "admit before ensure_tracked");
        let mut state = self.state.lock();
        if state.aborted.contains_key(&txn)
            || state.ended.contains(&txn)
            || state.below_low_water(txn)
        {
            return Err(BufferError::Ended(txn.0, txn.1));
        }
        if let Some(open) = state.open.get_mut(&txn) {
            open.entries += 1;
            return Ok(());
        }
        if !self.budget.try_take(1) {
            return Err(self.budget.full_error());
        }
        let first = First::Pending(self.log.last_confirmed());
        state.open.insert(txn, OpenTxn { first, entries: 1 });
        let limit = state.limit();
        drop(state);
        self.limit.send_replace(limit);
        Ok(())
    }

    /// An admitted entry was not appended (a duplicate, or refused at once).
    pub(crate) fn not_appended(&self, txn: TxnKey) {
        let mut state = self.state.lock();
        let Some(open) = state.open.get_mut(&txn) else {
            return;
        };
        open.entries = open.entries.saturating_sub(1);
        if open.entries == 0 && matches!(open.first, First::Pending(_)) {
            state.open.remove(&txn);
            self.budget.release(1);
            let limit = state.limit();
            drop(state);
            self.limit.send_replace(limit);
        }
    }

    /// An entry of `txn` is durable at `position`: the first one fixes the
    /// transaction's first position (the read limit moves up to it).
    pub(crate) fn appended(&self, txn: TxnKey, position: Position) {
        let mut state = self.state.lock();
        let Some(open) = state.open.get_mut(&txn) else {
            return;
        };
        if let First::Pending(after) = open.first {
            debug_assert!(after.is_none_or(|a| a < position));
            open.first = First::Known(position);
            let limit = state.limit();
            drop(state);
            self.limit.send_replace(limit);
        }
    }

    /// END_TXN_ON_PARTITION: writes the commit or abort marker of `txn`
    /// (when it has entries here) and, once durable, makes its entries
    /// visible (commit) or hidden for good (abort). Idempotent: a
    /// transaction not open here is answered at once.
    pub(crate) async fn end(
        self: &Arc<Self>,
        txn: TxnKey,
        commit: bool,
    ) -> Result<(), BufferError> {
        let append: AppendFuture = {
            let mut state = self.state.lock();
            if !state.open.contains_key(&txn) {
                // No entry here: nothing to mark, but a late SEND of it
                // must not open it.
                if !state.aborted.contains_key(&txn)
                    && !state.below_low_water(txn)
                    && state.ended.insert(txn)
                {
                    self.budget.take_forced(1);
                }
                return Ok(());
            }
            let marker = marker_entry(txn, commit);
            // Issued under the lock: the marker follows every entry of the
            // transaction admitted before.
            self.log.append(marker)
        };
        let position = append.await?;
        {
            let mut state = self.state.lock();
            if state.open.remove(&txn).is_some() {
                if commit {
                    // Its record moves from `open` to `ended` (the budget
                    // keeps it) until the low water mark passes it.
                    if !state.ended.insert(txn) {
                        self.budget.release(1);
                    }
                    self.committed.fetch_add(1, Ordering::Relaxed);
                } else {
                    state.aborted.insert(txn, position);
                    self.aborted.fetch_add(1, Ordering::Relaxed);
                }
            }
            let limit = state.limit();
            drop(state);
            self.limit.send_replace(limit);
        }
        tracing::debug!(log = %self.log.name(), ?txn, commit, %position, "transaction ended on the topic");
        if self.ends_since_snapshot.fetch_add(1, Ordering::AcqRel) + 1 >= SNAPSHOT_EVERY_ENDS {
            self.spawn_snapshot();
        }
        Ok(())
    }

    /// Writes a snapshot in the background (one at a time): the aborted
    /// transactions whose marker the log still holds, and the position
    /// before which nothing is open.
    fn spawn_snapshot(self: &Arc<Self>) {
        if self.snapshotting.swap(true, Ordering::AcqRel) {
            return;
        }
        self.ends_since_snapshot.store(0, Ordering::Release);
        let buffer = Arc::clone(self);
        tokio::spawn(async move {
            let snapshot = buffer.snapshot_now();
            if let Err(error) = buffer.write_snapshot(&snapshot).await {
                tracing::warn!(log = %buffer.log.name(), %error, "transaction buffer snapshot not written");
            }
            buffer.snapshotting.store(false, Ordering::Release);
        });
    }

    /// The snapshot of now; forgets aborted transactions the log trimmed.
    fn snapshot_now(&self) -> Snapshot {
        let first_held = self.log.first_position();
        let mut state = self.state.lock();
        let before = state.aborted.len();
        state
            .aborted
            .retain(|_, marker| first_held.is_some_and(|first| *marker >= first));
        self.budget.release(before - state.aborted.len());
        let mut ended: Vec<(u64, u64)> = state.ended.iter().copied().collect();
        ended.sort_unstable();
        let mut low_water: Vec<(u64, u64)> =
            state.low_water.iter().map(|(m, l)| (*m, *l)).collect();
        low_water.sort_unstable();
        let after = match state.limit() {
            None => self.log.last_confirmed(),
            Some(bound) => self.log.previous_position(bound),
        };
        Snapshot {
            after: after.map(|p| (p.ledger_id, p.entry_id)),
            aborted: state
                .aborted
                .iter()
                .map(|((most, least), p)| (*most, *least, p.ledger_id, p.entry_id))
                .collect(),
            ended,
            low_water,
        }
    }

    /// Notes coordinator `most`'s low water mark: SENDs of its transactions
    /// at or below it are refused from now on (ended ones need no record
    /// of their own any more). Returns the transactions of that coordinator
    /// still open here at or below it: they ended at their coordinator
    /// without this topic hearing it (sent to without being registered),
    /// and are aborted here as Pulsar's `handleLowWaterMark` does. None of
    /// them committed here: an ended transaction is never opened again.
    pub(crate) fn note_low_water(&self, most: u64, low_water: u64) -> Vec<TxnKey> {
        let mut state = self.state.lock();
        let mark = state.low_water.entry(most).or_insert(0);
        *mark = (*mark).max(low_water);
        let mark = *mark;
        let covered = |txn: &TxnKey| txn.0 == most && txn.1 <= mark;
        let before = state.ended.len();
        state.ended.retain(|txn| !covered(txn));
        self.budget.release(before - state.ended.len());
        let mut stale: Vec<TxnKey> = state.open.keys().copied().filter(covered).collect();
        stale.sort_unstable();
        stale
    }

    /// True once the topic may hold transactional entries or markers
    /// (subscriptions then look at each entry's metadata).
    pub(crate) fn has_txns(&self) -> bool {
        self.has_txns.load(Ordering::Acquire)
    }

    /// The read limit now: entries at or after it are not readable
    /// (`None`: every confirmed entry is).
    pub(crate) fn read_limit(&self) -> Option<Position> {
        *self.limit.borrow()
    }

    /// A receiver that sees every change of the read limit.
    pub(crate) fn subscribe(&self) -> watch::Receiver<Option<Position>> {
        self.limit.subscribe()
    }

    /// True when a subscription must skip (and acknowledge) this entry: a
    /// transaction marker, or an entry of an aborted transaction.
    pub(crate) fn is_hidden(&self, data: &[u8]) -> bool {
        self.hides(entry_summary(data).as_ref())
    }

    /// [`TxnBuffer::is_hidden`] for an entry whose metadata the caller
    /// scanned already (`None`: unreadable, a plain entry to the buffer).
    pub(crate) fn hides(&self, summary: Option<&vela_wire::MetadataSummary>) -> bool {
        match summary.map_or(Kind::Plain, kind_of) {
            Kind::Plain => false,
            Kind::Commit(_) | Kind::Abort(_) => true,
            Kind::Data(txn) => self.state.lock().aborted.contains_key(&txn),
        }
    }

    /// Transactions open now, committed and aborted since the topic opened
    /// (Pulsar's `ongoingTxnCount`, `committedTxnCount`, `abortedTxnCount`).
    pub(crate) fn txn_counts(&self) -> (u64, u64, u64) {
        let open = self.state.lock().open.len() as u64;
        (
            open,
            self.committed.load(Ordering::Relaxed),
            self.aborted.load(Ordering::Relaxed),
        )
    }

    /// Open and aborted transactions now.
    #[cfg(test)]
    pub(crate) fn counts(&self) -> (usize, usize) {
        let state = self.state.lock();
        (state.open.len(), state.aborted.len())
    }

    /// Transactions remembered as ended here (above the low water mark).
    #[cfg(test)]
    pub(crate) fn ended_count(&self) -> usize {
        self.state.lock().ended.len()
    }

    /// Drops the buffer's state and its snapshot (topic deleted).
    pub(crate) async fn delete(&self) {
        let released = {
            let mut state = self.state.lock();
            let n = state.records();
            *state = State::default();
            n
        };
        self.budget.release(released);
        if self.tracked.initialized()
            && let Err(error) = self.meta.delete(&self.key, ExpectedVersion::Any).await
            && !matches!(error, MetaError::NotFound { .. })
        {
            tracing::warn!(key = %self.key, %error, "transaction buffer snapshot not deleted");
        }
    }
}

impl Drop for TxnBuffer {
    fn drop(&mut self) {
        let state = self.state.get_mut();
        self.budget.release(state.records());
    }
}

/// What an entry is to the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Plain,
    Data(TxnKey),
    Commit(TxnKey),
    Abort(TxnKey),
}

fn metadata_slice(entry: &[u8]) -> Option<&[u8]> {
    let size_bytes: [u8; 4] = entry.get(6..10)?.try_into().ok()?;
    let size = u32::from_be_bytes(size_bytes) as usize;
    entry.get(10..10usize.checked_add(size)?)
}

/// The scanned metadata of a stored entry (`None`: unreadable).
pub(crate) fn entry_summary(entry: &[u8]) -> Option<vela_wire::MetadataSummary> {
    metadata_slice(entry).and_then(|m| vela_wire::MetadataSummary::scan(m).ok())
}

fn classify(entry: &[u8]) -> Kind {
    entry_summary(entry).as_ref().map_or(Kind::Plain, kind_of)
}

fn kind_of(summary: &vela_wire::MetadataSummary) -> Kind {
    let (Some(most), Some(least)) = (summary.txnid_most_bits, summary.txnid_least_bits) else {
        return Kind::Plain;
    };
    match summary.marker_type {
        Some(MARKER_TXN_COMMIT) => Kind::Commit((most, least)),
        Some(MARKER_TXN_ABORT) => Kind::Abort((most, least)),
        _ => Kind::Data((most, least)),
    }
}

fn put_varint(out: &mut Vec<u8>, mut value: u64) {
    while value >= 0x80 {
        out.push((value as u8) | 0x80);
        value >>= 7;
    }
    out.push(value as u8);
}

/// The stored entry `entry` with the transaction id in its metadata
/// (fields 22 and 23 appended; a later occurrence of a field wins, so a
/// client's own copy of the same id is harmless). One copy of the entry.
pub(crate) fn with_txn_id(entry: &[u8], txn: TxnKey) -> Result<Bytes, BufferError> {
    let metadata = metadata_slice(entry).ok_or(BufferError::Malformed)?;
    let payload = entry
        .get(10 + metadata.len()..)
        .ok_or(BufferError::Malformed)?;
    let mut extended = Vec::with_capacity(metadata.len() + 24);
    extended.extend_from_slice(metadata);
    put_varint(&mut extended, 22 << 3);
    put_varint(&mut extended, txn.1);
    put_varint(&mut extended, 23 << 3);
    put_varint(&mut extended, txn.0);
    Ok(vela_wire::build_stored_entry(&extended, payload))
}

/// A commit or abort marker entry of `txn` (Pulsar's `Markers.newTxn*Marker`).
fn marker_entry(txn: TxnKey, commit: bool) -> Bytes {
    let publish_time = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
    let metadata = vela_wire::proto::MessageMetadata {
        producer_name: MARKER_PRODUCER.to_string(),
        sequence_id: 0,
        publish_time,
        marker_type: Some(if commit {
            MARKER_TXN_COMMIT
        } else {
            MARKER_TXN_ABORT
        }),
        txnid_most_bits: Some(txn.0),
        txnid_least_bits: Some(txn.1),
        ..Default::default()
    };
    vela_wire::build_stored_entry(&prost::Message::encode_to_vec(&metadata), &[])
}

mod stats;

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
