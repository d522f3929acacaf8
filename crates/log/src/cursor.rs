//! `Cursor`: a durable subscription's acknowledgement state on a log: the
//! mark-delete position (everything at or before it is acknowledged), the
//! individually acknowledged entries above it, and partial acks of batch entries.
//!
//! Persistence: changes are written to the metadata store by a task spawned
//! at the first change after a write, which waits `cursor_persist_interval`
//! (coalescing the changes meanwhile), writes and ends: an idle cursor has
//! no task. Also on `flush`/log close. After a
//! crash a subscription resumes from the last persisted state: acks of the last
//! interval may be redelivered (at-least-once), nothing acknowledged-and-
//! persisted is redelivered, nothing unacknowledged is skipped.
//!
//! Positions: the mark-delete position only moves forward (acks) except by
//! `reset` (a seek), and stays within the log (acks are of confirmed
//! entries: the broker checks a client's ack against the last confirmed
//! position first).
//!
//! Properties: a few named numbers the owner keeps with the cursor
//! (Pulsar's cursor properties; the broker marks replicated subscriptions
//! so), persisted with its state and written through at once when set;
//! at most `CURSOR_PROPERTIES_MAX`.
//!
//! Never: decides what to dispatch (that is the broker's), holds payloads,
//! or needs more of its log than `CursorLog`.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use std::sync::atomic::{AtomicBool, Ordering};

use crate::error::LogError;
use crate::format::{self, AckedRange, BatchAck, CursorInfo};
use crate::position::Position;
use crate::store::{Store, Version};

/// What a cursor asks of its log: positions over the log's ledgers. The log
/// implements it; a trait, so cursors need nothing else of the log.
pub(crate) trait CursorLog: Send + Sync {
    /// The position right after `position` (possibly in a later ledger).
    fn next_position(&self, position: Position) -> Position;
    /// The oldest confirmed entry, or the next one to be written.
    fn first_position_or_next(&self) -> Position;
    /// The position right before `position`, `None` when nothing precedes it.
    fn previous_position(&self, position: Position) -> Option<Position>;
    /// The newest confirmed entry.
    fn last_confirmed(&self) -> Option<Position>;
    /// Confirmed entries in `(after, up_to]`.
    fn entries_between(&self, after: Option<Position>, up_to: Position) -> u64;
}

/// Properties one cursor keeps (its owner sets a handful of known names).
/// When reached: setting another name fails with `LogError::Config`.
pub const CURSOR_PROPERTIES_MAX: usize = 16;

/// Where a cursor keeps its state and its bounds (from the log's config).
#[derive(Debug, Clone)]
pub(crate) struct CursorSettings {
    pub(crate) log_name: Arc<str>,
    pub(crate) store: Store,
    pub(crate) acked_entries_max: usize,
    pub(crate) persisted_ranges_max: usize,
    pub(crate) persist_interval: Duration,
}

/// Where a new cursor starts.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CursorStart {
    /// Before the oldest entry held: everything is backlog.
    Earliest,
    /// After the newest confirmed entry: only later entries are backlog.
    Latest,
}

#[derive(Debug, Default)]
struct CursorState {
    mark_delete: Option<Position>,
    acked: BTreeSet<Position>,
    batch_acks: BTreeMap<Position, Vec<u64>>,
    properties: BTreeMap<String, i64>,
    version: Option<Version>,
    changes: u64,
    persisted_changes: u64,
    deleted: bool,
}

/// A durable cursor. Shared behind an `Arc`; all methods are cheap except
/// `flush`, `reset` and `delete`, which write metadata.
pub struct Cursor {
    name: String,
    /// Its log's name (shared with the log): the cursor's key is made from
    /// it when written (`key`), not kept (~70 bytes a cursor).
    log_name: Arc<str>,
    log: Weak<dyn CursorLog>,
    store: Store,
    acked_entries_max: usize,
    persisted_ranges_max: usize,
    persist_interval: Duration,
    state: Mutex<CursorState>,
    /// This cursor, for the persist task it spawns.
    me: Weak<Cursor>,
    /// A persist task is waiting to write (set by the change that spawned
    /// it, cleared by the task just before it reads the state).
    persist_scheduled: AtomicBool,
    persist_lock: tokio::sync::Mutex<()>,
}

impl std::fmt::Debug for Cursor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cursor")
            .field("name", &self.name)
            .field("mark_delete", &self.state.lock().mark_delete)
            .finish_non_exhaustive()
    }
}

impl Cursor {
    pub(crate) async fn open(
        log: &Arc<dyn CursorLog>,
        settings: &CursorSettings,
        name: &str,
        start: CursorStart,
    ) -> Result<Arc<Cursor>, LogError> {
        let key = format::cursor_key(&settings.log_name, name);
        let store = &settings.store;
        let mut state = CursorState::default();
        match store.get_json::<CursorInfo>(&key).await? {
            Some((info, version)) => {
                state.mark_delete = info.mark_delete_position();
                for range in &info.acked_ranges {
                    // Bounded by what was persisted (cursor_persisted_ranges_max
                    // ranges); each range may span many entries, so cap the total.
                    for entry_id in range.first_entry_id..=range.last_entry_id {
                        if state.acked.len() >= settings.acked_entries_max {
                            break;
                        }
                        state.acked.insert(Position::new(range.ledger_id, entry_id));
                    }
                }
                for batch in info.batch_acks {
                    state.batch_acks.insert(
                        Position::new(batch.ledger_id, batch.entry_id),
                        batch.ack_set,
                    );
                }
                state.properties = info.properties;
                state.version = Some(version);
            }
            None => {
                state.mark_delete = match start {
                    CursorStart::Earliest => log.previous_position(log.first_position_or_next()),
                    CursorStart::Latest => log.last_confirmed(),
                };
                let info = snapshot(&state, settings.persisted_ranges_max);
                match store.create_json(&key, &info).await {
                    Ok(version) => state.version = Some(version),
                    Err(LogError::Fenced(_)) => {
                        // Created concurrently: load what won.
                        if let Some((info, version)) = store.get_json::<CursorInfo>(&key).await? {
                            state.mark_delete = info.mark_delete_position();
                            state.properties = info.properties;
                            state.version = Some(version);
                        }
                    }
                    Err(other) => return Err(other),
                }
            }
        }
        let cursor = Arc::new_cyclic(|me| Cursor {
            name: name.to_string(),
            log_name: Arc::clone(&settings.log_name),
            log: Arc::downgrade(log),
            store: store.clone(),
            acked_entries_max: settings.acked_entries_max,
            persisted_ranges_max: settings.persisted_ranges_max,
            persist_interval: settings.persist_interval,
            state: Mutex::new(state),
            me: me.clone(),
            persist_scheduled: AtomicBool::new(false),
            persist_lock: tokio::sync::Mutex::new(()),
        });
        Ok(cursor)
    }

    /// Where its state is stored.
    fn key(&self) -> String {
        format::cursor_key(&self.log_name, &self.name)
    }

    /// The cursor's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Everything at or before this position is acknowledged (`None`: nothing).
    pub fn mark_delete_position(&self) -> Option<Position> {
        self.state.lock().mark_delete
    }

    /// True if the whole entry at `position` is acknowledged.
    pub fn is_acked(&self, position: Position) -> bool {
        let state = self.state.lock();
        Some(position) <= state.mark_delete || state.acked.contains(&position)
    }

    /// Unacknowledged bits of a partially acknowledged batch entry (bit set =
    /// message not yet acknowledged), `None` when no partial ack is recorded.
    pub fn batch_ack_state(&self, position: Position) -> Option<Vec<u64>> {
        self.state.lock().batch_acks.get(&position).cloned()
    }

    /// Acknowledges whole entries individually.
    pub fn ack(&self, positions: &[Position]) -> Result<(), LogError> {
        let log = self.log.upgrade();
        {
            let mut state = self.state.lock();
            for &position in positions {
                if Some(position) <= state.mark_delete {
                    continue;
                }
                debug_assert!(
                    within_log(log.as_deref(), position),
                    "ack of {position}, beyond the last confirmed entry"
                );
                if state.acked.len() >= self.acked_entries_max && !state.acked.contains(&position) {
                    return Err(LogError::TooManyAckHoles(self.name.clone()));
                }
                state.acked.insert(position);
                state.batch_acks.remove(&position);
            }
            if let Some(log) = &log {
                advance_mark_delete(&mut state, log.as_ref());
            }
            state.changes += 1;
        }
        self.schedule_persist();
        Ok(())
    }

    /// Acknowledges everything up to and including `position`.
    pub fn ack_cumulative(&self, position: Position) -> Result<(), LogError> {
        let log = self.log.upgrade();
        {
            let mut state = self.state.lock();
            if Some(position) > state.mark_delete {
                debug_assert!(
                    within_log(log.as_deref(), position),
                    "cumulative ack of {position}, beyond the last confirmed entry"
                );
                state.mark_delete = Some(position);
                state.acked = state
                    .acked
                    .split_off(&Position::new(position.ledger_id, position.entry_id + 1));
                state.batch_acks = state
                    .batch_acks
                    .split_off(&Position::new(position.ledger_id, position.entry_id + 1));
                if let Some(log) = &log {
                    advance_mark_delete(&mut state, log.as_ref());
                }
                state.changes += 1;
            }
        }
        self.schedule_persist();
        Ok(())
    }

    /// Records a partial ack of a batch entry: `ack_set` has a bit set for each
    /// message still unacknowledged. When no bit remains set the entry is acked.
    pub fn ack_batch_indexes(&self, position: Position, ack_set: &[u64]) -> Result<(), LogError> {
        let merged = {
            let mut state = self.state.lock();
            if Some(position) <= state.mark_delete || state.acked.contains(&position) {
                return Ok(());
            }
            let merged: Vec<u64> = match state.batch_acks.get(&position) {
                Some(existing) => existing
                    .iter()
                    .zip(ack_set.iter().chain(std::iter::repeat(&0)))
                    .map(|(a, b)| a & b)
                    .collect(),
                None => ack_set.to_vec(),
            };
            if merged.iter().any(|word| *word != 0) {
                state.batch_acks.insert(position, merged.clone());
                state.changes += 1;
            }
            merged
        };
        if merged.iter().all(|word| *word == 0) {
            return self.ack(&[position]);
        }
        self.schedule_persist();
        Ok(())
    }

    /// Entries after the mark-delete position up to the last confirmed one that
    /// are not individually acknowledged.
    pub fn backlog_entries(&self) -> u64 {
        let Some(log) = self.log.upgrade() else {
            return 0;
        };
        let Some(last) = log.last_confirmed() else {
            return 0;
        };
        let state = self.state.lock();
        let total = log.entries_between(state.mark_delete, last);
        total.saturating_sub(state.acked.len() as u64)
    }

    /// Moves the cursor so that `position` is the next unacknowledged entry
    /// (seek): everything before it counts as acknowledged, everything from it
    /// on as not. Persisted before returning.
    pub async fn reset(&self, position: Position) -> Result<(), LogError> {
        let previous = self
            .log
            .upgrade()
            .and_then(|log| log.previous_position(position));
        {
            let mut state = self.state.lock();
            state.mark_delete = previous;
            state.acked.clear();
            state.batch_acks.clear();
            state.changes += 1;
        }
        self.flush().await
    }

    /// Every property set (Pulsar's cursor `properties`).
    pub fn properties(&self) -> BTreeMap<String, i64> {
        self.state.lock().properties.clone()
    }

    /// The value of property `name`, if set.
    pub fn property(&self, name: &str) -> Option<i64> {
        self.state.lock().properties.get(name).copied()
    }

    /// Sets property `name` to `value` (`None`: removes it) and persists
    /// the cursor before returning. Ok(false) when it already was so
    /// (nothing written); `LogError::Config` past `CURSOR_PROPERTIES_MAX`.
    pub async fn set_property(&self, name: &str, value: Option<i64>) -> Result<bool, LogError> {
        {
            let mut state = self.state.lock();
            if state.properties.get(name).copied() == value {
                return Ok(false);
            }
            match value {
                Some(value) => {
                    if !state.properties.contains_key(name)
                        && state.properties.len() >= CURSOR_PROPERTIES_MAX
                    {
                        return Err(LogError::Config(format!(
                            "cursor {}: {CURSOR_PROPERTIES_MAX} properties are set \
                             (CURSOR_PROPERTIES_MAX)",
                            self.name
                        )));
                    }
                    state.properties.insert(name.to_string(), value);
                }
                None => {
                    state.properties.remove(name);
                }
            }
            debug_assert!(state.properties.len() <= CURSOR_PROPERTIES_MAX);
            state.changes += 1;
        }
        self.flush().await?;
        Ok(true)
    }

    /// Writes the state now if it changed since the last write.
    pub async fn flush(&self) -> Result<(), LogError> {
        let _persisting = self.persist_lock.lock().await;
        let (info, version, changes) = {
            let state = self.state.lock();
            if state.deleted || state.changes == state.persisted_changes {
                return Ok(());
            }
            (
                snapshot(&state, self.persisted_ranges_max),
                state.version,
                state.changes,
            )
        };
        let started = std::time::Instant::now();
        let new_version = match version {
            Some(version) => self.store.update_json(&self.key(), &info, version).await?,
            None => self.store.create_json(&self.key(), &info).await?,
        };
        // ARCHITECTURE.md "Periodic work".
        tracing::debug!(
            target: "vela::periodic",
            kind = "cursor_persist",
            elapsed_us = started.elapsed().as_micros() as u64,
            cursor = self.name,
            "cursor persisted"
        );
        let mut state = self.state.lock();
        state.version = Some(new_version);
        state.persisted_changes = state.persisted_changes.max(changes);
        // An emptied set keeps its node (~200 bytes, after the first
        // individual ack): given back here, not at each ack.
        if state.acked.is_empty() {
            state.acked = BTreeSet::new();
        }
        if state.batch_acks.is_empty() {
            state.batch_acks = BTreeMap::new();
        }
        Ok(())
    }

    /// A change to persist: spawns the persist task unless one waits
    /// already (it will see this change). Outside a runtime (nothing can
    /// spawn) the change waits for the next one, a `flush` or the close.
    fn schedule_persist(&self) {
        if self.persist_scheduled.swap(true, Ordering::AcqRel) {
            return;
        }
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(persist_later(self.me.clone(), self.persist_interval));
            }
            Err(_) => self.persist_scheduled.store(false, Ordering::Release),
        }
    }

    pub(crate) async fn delete(&self) -> Result<(), LogError> {
        let _persisting = self.persist_lock.lock().await;
        self.state.lock().deleted = true;
        self.store.delete(&self.key()).await
    }
}

/// Whether `position` is a confirmed entry of `log` (true when the log is
/// gone: nothing to check against).
fn within_log(log: Option<&dyn CursorLog>, position: Position) -> bool {
    log.is_none_or(|log| log.last_confirmed().is_some_and(|last| position <= last))
}

/// Moves the mark-delete position over individually acknowledged entries that
/// now follow it directly.
fn advance_mark_delete(state: &mut CursorState, log: &dyn CursorLog) {
    loop {
        let next = match state.mark_delete {
            Some(mark) => log.next_position(mark),
            None => log.first_position_or_next(),
        };
        if state.acked.first() == Some(&next) {
            // Forward only: `next` follows the mark.
            debug_assert!(Some(next) > state.mark_delete, "mark-delete moved back");
            state.acked.pop_first();
            state.mark_delete = Some(next);
        } else if state.mark_delete.is_none()
            && state.acked.first().is_some_and(|first| *first < next)
        {
            // Acks of entries that precede the log's first entry (trimmed).
            state.acked.pop_first();
        } else {
            break;
        }
    }
}

fn snapshot(state: &CursorState, ranges_max: usize) -> CursorInfo {
    let mut acked_ranges: Vec<AckedRange> = Vec::new();
    for position in &state.acked {
        match acked_ranges.last_mut() {
            Some(range)
                if range.ledger_id == position.ledger_id
                    && range.last_entry_id + 1 == position.entry_id =>
            {
                range.last_entry_id = position.entry_id;
            }
            _ => {
                if acked_ranges.len() == ranges_max {
                    break;
                }
                acked_ranges.push(AckedRange {
                    ledger_id: position.ledger_id,
                    first_entry_id: position.entry_id,
                    last_entry_id: position.entry_id,
                });
            }
        }
    }
    CursorInfo {
        version: format::FORMAT_VERSION,
        mark_delete: state.mark_delete.map(|p| (p.ledger_id, p.entry_id)),
        acked_ranges,
        batch_acks: state
            .batch_acks
            .iter()
            .take(ranges_max)
            .map(|(position, ack_set)| BatchAck {
                ledger_id: position.ledger_id,
                entry_id: position.entry_id,
                ack_set: ack_set.clone(),
            })
            .collect(),
        properties: state.properties.clone(),
    }
}

/// The persist task: waits the interval (changes meanwhile join this
/// write), writes, ends. Holds only a `Weak`: a dropped cursor ends it.
async fn persist_later(cursor: Weak<Cursor>, interval: Duration) {
    tokio::time::sleep(interval).await;
    let Some(cursor) = cursor.upgrade() else {
        return;
    };
    // Cleared before the state is read: a change from now on spawns the
    // next task, so none is left unwritten.
    cursor.persist_scheduled.store(false, Ordering::Release);
    if cursor.state.lock().deleted {
        return;
    }
    if let Err(error) = cursor.flush().await {
        tracing::warn!(cursor = cursor.name, %error, "could not persist the cursor; will retry on the next change");
    }
}
