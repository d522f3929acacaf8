//! `ManagedLog`: one topic's log over a list of ledgers.
//!
//! Concurrency: `state` (a short, never-awaited lock) holds the ledger list,
//! the writer, the tail cache and counters. `issue_lock` serializes the issuing
//! of adds so entry ids follow append order even when a rollover drains its
//! queue. `meta_lock` (async) serializes updates of the log's metadata record
//! (rollover, trimming, close). Add completions (callbacks from the ledger) take
//! only `state`.

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::{oneshot, watch};

use crate::Position;
use crate::backend::{
    LedgerAppender, LedgerBackend, LedgerBackendError, LedgerDescription, Persistence,
};
use crate::cursor::{Cursor, CursorStart};
use crate::error::LogError;
use crate::format::{self, LedgerInfo, LogInfo};
use crate::store::{Store, Version};

/// How much consumed data a log keeps (Pulsar's retention policy). A fully
/// consumed, closed ledger is deleted once it is older than `time` (since its
/// close) or the log is over `size_bytes` without it; `None` means no limit
/// on that side; both `None`: consumed data is kept forever.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retention {
    /// Keep consumed ledgers at least this long after they closed.
    pub time: Option<Duration>,
    /// Keep consumed ledgers while the whole log is within this size.
    pub size_bytes: Option<u64>,
}

impl Retention {
    /// No retention: consumed ledgers go at once (Pulsar's default).
    pub const NONE: Retention = Retention {
        time: Some(Duration::ZERO),
        size_bytes: Some(0),
    };
}

/// Tunables of a log. `Default` gives Pulsar's defaults where they apply.
#[derive(Debug, Clone)]
pub struct LogConfig {
    /// Replication of the ledgers this log creates from now on.
    pub persistence: Persistence,
    /// Roll over to a new ledger after this many entries (Pulsar: 50 000).
    pub ledger_entries_max: u64,
    /// Roll over after this many payload bytes.
    pub ledger_bytes_max: u64,
    /// Roll over a ledger this old at the next append (Pulsar: 240 min).
    pub ledger_age_max: Duration,
    /// Bytes of recent entries kept in memory for tail readers.
    pub tail_cache_bytes_max: usize,
    /// Bytes of appends allowed to wait while a rollover creates the next
    /// ledger; beyond it appends fail with `Overloaded` (the broker's own
    /// per-connection bounds normally stop producers long before).
    pub queued_append_bytes_max: u64,
    /// Individually acknowledged entries a cursor keeps above its mark-delete
    /// position; beyond it further individual acks are refused.
    pub cursor_acked_entries_max: usize,
    /// Acked ranges persisted per cursor; holes beyond it are redelivered after
    /// a restart (at-least-once, never loss).
    pub cursor_persisted_ranges_max: usize,
    /// Minimum time between two writes of one cursor's state.
    pub cursor_persist_interval: Duration,
    /// Consumed data kept (see [`Retention`]).
    pub retention: Retention,
}

impl Default for LogConfig {
    fn default() -> LogConfig {
        LogConfig {
            persistence: Persistence::SINGLE,
            ledger_entries_max: 50_000,
            ledger_bytes_max: 1 << 30,
            ledger_age_max: Duration::from_secs(240 * 60),
            tail_cache_bytes_max: 8 << 20,
            queued_append_bytes_max: 64 << 20,
            cursor_acked_entries_max: 100_000,
            cursor_persisted_ranges_max: 10_000,
            cursor_persist_interval: Duration::from_millis(100),
            retention: Retention::NONE,
        }
    }
}

/// Where logs keep their metadata and their ledgers.
#[derive(Debug, Clone)]
pub struct LogEnv {
    pub(crate) store: Store,
    pub(crate) ledgers: Arc<dyn LedgerBackend>,
}

impl LogEnv {
    /// Logs over this metadata store and these ledgers.
    pub fn new(meta: Arc<dyn vela_meta::MetadataStore>, ledgers: Arc<dyn LedgerBackend>) -> LogEnv {
        LogEnv {
            store: Store::new(meta),
            ledgers,
        }
    }

    /// In-memory metadata and ledgers: real semantics, no durability (tests).
    pub fn in_memory() -> LogEnv {
        LogEnv::new(
            Arc::new(vela_meta::MemoryStore::new()),
            Arc::new(crate::memory::MemoryBackend(
                crate::memory::MemoryLedgers::new(),
            )),
        )
    }

    /// The ledger backend (for tests that inspect ledgers).
    pub fn ledgers(&self) -> &Arc<dyn LedgerBackend> {
        &self.ledgers
    }
}

/// An entry read from a log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogEntry {
    /// Where the entry sits.
    pub position: Position,
    /// The entry exactly as appended.
    pub data: Bytes,
}

/// One ledger of a log, for stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LedgerSummary {
    /// Ledger id.
    pub ledger_id: u64,
    /// Confirmed entries.
    pub entries: u64,
    /// Their payload bytes.
    pub size_bytes: u64,
    /// When the log created it (ms since the Unix epoch).
    pub created_unix_ms: u64,
}

/// Sizes of a log, for stats.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogStats {
    /// Confirmed entries in all ledgers still held.
    pub entries: u64,
    /// Their payload bytes.
    pub size_bytes: u64,
    /// Ledgers held (including the open one).
    pub ledgers: usize,
}

enum Writer {
    Ready(Arc<dyn LedgerAppender>),
    Rolling,
    Failed(LogError),
    Closed,
    Terminated,
}

struct QueuedAppend {
    data: Bytes,
    done: oneshot::Sender<Result<Position, LogError>>,
}

/// Entries recently confirmed, bounded by bytes; oldest evicted first.
#[derive(Default)]
struct TailCache {
    entries: BTreeMap<Position, Bytes>,
    bytes: usize,
}

impl TailCache {
    fn insert(&mut self, position: Position, data: Bytes, bytes_max: usize) {
        if data.len() > bytes_max {
            return;
        }
        self.bytes += data.len();
        if let Some(old) = self.entries.insert(position, data) {
            self.bytes -= old.len();
        }
        while self.bytes > bytes_max {
            match self.entries.pop_first() {
                Some((_, evicted)) => self.bytes -= evicted.len(),
                None => break,
            }
        }
    }

    fn remove_ledgers_below(&mut self, ledger_id: u64) {
        while let Some((position, _)) = self.entries.first_key_value() {
            if position.ledger_id >= ledger_id {
                break;
            }
            if let Some((_, evicted)) = self.entries.pop_first() {
                self.bytes -= evicted.len();
            }
        }
    }
}

struct State {
    /// Ledgers in id order; while the writer is `Ready` or `Rolling` the last
    /// one is the ledger being written.
    ledgers: Vec<LedgerInfo>,
    writer: Writer,
    current_issued_entries: u64,
    current_issued_bytes: u64,
    current_opened_at: Instant,
    queued: VecDeque<QueuedAppend>,
    queued_bytes: u64,
    last_confirmed: Option<Position>,
    cache: TailCache,
    info_version: Version,
}

pub(crate) struct Shared {
    pub(crate) name: String,
    pub(crate) env: LogEnv,
    pub(crate) config: LogConfig,
    /// Replication of the next ledger created (starts as `config.persistence`;
    /// `ManagedLog::set_persistence` changes it, the open ledger keeps its own).
    persistence: Mutex<Persistence>,
    /// Consumed data kept (starts as `config.retention`).
    retention: Mutex<Retention>,
    state: Mutex<State>,
    issue_lock: Mutex<()>,
    meta_lock: tokio::sync::Mutex<()>,
    confirmed: watch::Sender<Option<Position>>,
    cursors: Mutex<HashMap<String, Arc<Cursor>>>,
}

/// A topic's managed log. Cheap to share behind an `Arc`.
pub struct ManagedLog {
    shared: Arc<Shared>,
}

impl std::fmt::Debug for ManagedLog {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ManagedLog")
            .field("name", &self.shared.name)
            .finish_non_exhaustive()
    }
}

/// Whether retention lets a consumed, closed ledger go while the log holds
/// `log_bytes`: older than the time limit, or the log over the size limit.
fn retention_lets_go(
    retention: Retention,
    ledger: &LedgerInfo,
    now_ms: u64,
    log_bytes: u64,
) -> bool {
    let expired = retention.time.is_some_and(|time| {
        let closed = ledger.closed_unix_ms.unwrap_or(ledger.created_unix_ms);
        now_ms.saturating_sub(closed) >= u64::try_from(time.as_millis()).unwrap_or(u64::MAX)
    });
    let over_size = retention.size_bytes.is_some_and(|size| log_bytes > size);
    expired || over_size
}

/// Entries are ordered by (ledger id, entry id): a new ledger must have a
/// greater id than every ledger of the log. The ledger client's ids increase
/// across processes; a store that broke that (a reset counter) must not
/// scramble the log: the new ledger is deleted and the log refuses.
async fn check_ledger_order(
    env: &LogEnv,
    name: &str,
    ledgers: &[LedgerInfo],
    new_ledger_id: u64,
) -> Result<(), LogError> {
    let newest = ledgers.iter().map(|l| l.ledger_id).max();
    match newest {
        Some(newest) if new_ledger_id <= newest => {
            let _ = env.ledgers.delete(new_ledger_id).await;
            tracing::error!(
                log = name,
                new_ledger_id,
                newest,
                "ledger ids went backwards"
            );
            Err(LogError::Metadata(format!(
                "log {name}: new ledger {new_ledger_id} is not above its newest ledger {newest} \
                 (the ledger id counter went backwards)"
            )))
        }
        _ => Ok(()),
    }
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

impl ManagedLog {
    /// Loads the log `name` (creating it if absent): recovers its last ledger
    /// (fencing any previous owner), opens a new ledger for appends, loads its
    /// cursors.
    pub async fn open(
        env: &LogEnv,
        name: &str,
        config: LogConfig,
    ) -> Result<Arc<ManagedLog>, LogError> {
        config.persistence.validate().map_err(LogError::Config)?;
        let key = format::log_key(name);
        let (mut info, mut version) = match env.store.get_json::<LogInfo>(&key).await? {
            Some(found) => found,
            None => {
                let info = LogInfo {
                    version: format::FORMAT_VERSION,
                    ledgers: Vec::new(),
                    terminated: false,
                };
                let version =
                    env.store
                        .create_json(&key, &info)
                        .await
                        .map_err(|error| match error {
                            LogError::Fenced(_) => LogError::Fenced(name.to_string()),
                            other => other,
                        })?;
                (info, version)
            }
        };
        if info.version > format::FORMAT_VERSION {
            return Err(LogError::Metadata(format!(
                "log {name}: record version {} is newer than this broker understands ({})",
                info.version,
                format::FORMAT_VERSION
            )));
        }

        // The last ledger may still be open by a previous owner: recovery fences
        // it and fixes its size. Earlier ledgers were closed by their rollover.
        if let Some(last) = info.ledgers.last_mut() {
            let recovered = env.ledgers.recover(last.ledger_id).await?;
            last.entries = recovered.last_entry_id.map_or(0, |id| id + 1);
            last.size_bytes = recovered.size_bytes;
            last.closed_unix_ms.get_or_insert_with(unix_ms);
        }
        let empty: Vec<u64> = info
            .ledgers
            .iter()
            .filter(|ledger| ledger.entries == 0)
            .map(|ledger| ledger.ledger_id)
            .collect();
        info.ledgers.retain(|ledger| ledger.entries > 0);

        let appender = match info.terminated {
            true => None,
            false => Some(env.ledgers.create(config.persistence, name).await?),
        };
        if let Some(appender) = &appender {
            check_ledger_order(env, name, &info.ledgers, appender.ledger_id()).await?;
            info.ledgers.push(LedgerInfo {
                ledger_id: appender.ledger_id(),
                entries: 0,
                size_bytes: 0,
                created_unix_ms: unix_ms(),
                closed_unix_ms: None,
            });
        }
        version =
            env.store
                .update_json(&key, &info, version)
                .await
                .map_err(|error| match error {
                    LogError::Fenced(_) => LogError::Fenced(name.to_string()),
                    other => other,
                })?;
        for ledger_id in empty {
            if let Err(error) = env.ledgers.delete(ledger_id).await {
                tracing::warn!(log = name, ledger_id, %error, "could not delete an empty ledger");
            }
        }

        let last_confirmed = info
            .ledgers
            .iter()
            .rev()
            .find(|ledger| ledger.entries > 0)
            .map(|ledger| Position::new(ledger.ledger_id, ledger.entries - 1));
        let (confirmed, _) = watch::channel(last_confirmed);
        let shared = Arc::new(Shared {
            name: name.to_string(),
            env: env.clone(),
            persistence: Mutex::new(config.persistence),
            retention: Mutex::new(config.retention),
            config,
            state: Mutex::new(State {
                ledgers: info.ledgers,
                writer: appender.map_or(Writer::Terminated, Writer::Ready),
                current_issued_entries: 0,
                current_issued_bytes: 0,
                current_opened_at: Instant::now(),
                queued: VecDeque::new(),
                queued_bytes: 0,
                last_confirmed,
                cache: TailCache::default(),
                info_version: version,
            }),
            issue_lock: Mutex::new(()),
            meta_lock: tokio::sync::Mutex::new(()),
            confirmed,
            cursors: Mutex::new(HashMap::new()),
        });

        let log = Arc::new(ManagedLog { shared });
        for cursor_name in env.store.children(&format::cursors_key(name)).await? {
            let Some(decoded) = format::decode_name(&cursor_name) else {
                tracing::warn!(
                    log = name,
                    cursor = cursor_name,
                    "skipping a cursor key that does not decode"
                );
                continue;
            };
            log.open_cursor(&decoded, CursorStart::Earliest).await?;
        }
        tracing::debug!(log = name, ?last_confirmed, "log opened");
        Ok(log)
    }

    /// The log's name.
    pub fn name(&self) -> &str {
        &self.shared.name
    }

    /// Appends an entry. Call in order from one writer: the futures complete in
    /// append order, each once the entry is durable, with its position. The
    /// append happens whether or not the future is polled.
    pub fn append(&self, data: Bytes) -> AppendFuture {
        let (done, receiver) = oneshot::channel();
        let max_bytes = self.shared.env.ledgers.entry_bytes_max();
        if data.len() > max_bytes {
            let _ = done.send(Err(LogError::EntryTooLarge {
                len_bytes: data.len(),
                max_bytes,
            }));
            return AppendFuture(receiver);
        }
        let _issuing = self.shared.issue_lock.lock();
        let appender = {
            let mut state = self.shared.state.lock();
            match &state.writer {
                Writer::Ready(appender) => {
                    let appender = Arc::clone(appender);
                    state.current_issued_entries += 1;
                    state.current_issued_bytes += data.len() as u64;
                    if self.shared.ledger_full(&state) {
                        state.writer = Writer::Rolling;
                        Shared::spawn_roll_over(&self.shared, Arc::clone(&appender));
                    }
                    Some(appender)
                }
                Writer::Rolling => {
                    let size = data.len() as u64;
                    if state.queued_bytes + size > self.shared.config.queued_append_bytes_max {
                        let _ = done.send(Err(LogError::Overloaded(self.shared.name.clone())));
                    } else {
                        state.queued_bytes += size;
                        state.queued.push_back(QueuedAppend { data, done });
                    }
                    return AppendFuture(receiver);
                }
                Writer::Failed(error) => {
                    let _ = done.send(Err(error.clone()));
                    return AppendFuture(receiver);
                }
                Writer::Closed => {
                    let _ = done.send(Err(LogError::Closed(self.shared.name.clone())));
                    return AppendFuture(receiver);
                }
                Writer::Terminated => {
                    let _ = done.send(Err(LogError::Terminated(self.shared.name.clone())));
                    return AppendFuture(receiver);
                }
            }
        };
        if let Some(appender) = appender {
            Shared::issue(&self.shared, &appender, data, done);
        }
        AppendFuture(receiver)
    }

    /// Entries at positions `>= from`, up to the last confirmed one, at most
    /// `entries_max` of them and about `bytes_max` bytes (at least one entry is
    /// returned when one is available). Empty when nothing is there yet.
    pub async fn read(
        &self,
        from: Position,
        entries_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<LogEntry>, LogError> {
        let mut out: Vec<LogEntry> = Vec::new();
        let mut bytes = 0usize;
        let mut position = from;
        while out.len() < entries_max && (out.is_empty() || bytes < bytes_max) {
            // Decide under the lock what to read, then read without it.
            let (ledger_id, first, last) = {
                let state = self.shared.state.lock();
                let Some(normalized) = normalize(&state, position) else {
                    break;
                };
                position = normalized;
                if let Some(data) = state.cache.entries.get(&position) {
                    bytes += data.len();
                    out.push(LogEntry {
                        position,
                        data: data.clone(),
                    });
                    position = Position::new(position.ledger_id, position.entry_id + 1);
                    continue;
                }
                let Some(last_in_ledger) = last_entry_of(&state, position.ledger_id) else {
                    break;
                };
                let wanted = (entries_max - out.len()) as u64;
                // Stop before the first cached entry: it is served from memory.
                let mut last = last_in_ledger.min(position.entry_id + wanted - 1);
                if let Some((cached, _)) = state
                    .cache
                    .entries
                    .range(position..=Position::new(position.ledger_id, last))
                    .next()
                {
                    last = cached.entry_id.saturating_sub(1).max(position.entry_id);
                }
                (position.ledger_id, position.entry_id, last)
            };
            let entries = self.shared.env.ledgers.read(ledger_id, first, last).await?;
            for (offset, data) in entries.into_iter().enumerate() {
                bytes += data.len();
                out.push(LogEntry {
                    position: Position::new(ledger_id, first + offset as u64),
                    data,
                });
            }
            position = Position::new(ledger_id, last + 1);
        }
        Ok(out)
    }

    /// Position of the newest confirmed entry.
    pub fn last_confirmed(&self) -> Option<Position> {
        self.shared.state.lock().last_confirmed
    }

    /// Position of the oldest entry still held.
    pub fn first_position(&self) -> Option<Position> {
        let state = self.shared.state.lock();
        normalize(&state, Position::new(0, 0))
    }

    /// The position right after `position` (possibly in a later ledger, or the
    /// not yet written next entry of the current ledger).
    pub fn next_position(&self, position: Position) -> Position {
        let state = self.shared.state.lock();
        next_position(&state.ledgers, position)
    }

    /// The position right before `position`, `None` when nothing precedes it.
    pub fn previous_position(&self, position: Position) -> Option<Position> {
        let state = self.shared.state.lock();
        previous_position(&state.ledgers, position)
    }

    /// Entries in `(after, up_to]` (`after = None`: from the start).
    pub fn entries_between(&self, after: Option<Position>, up_to: Position) -> u64 {
        let state = self.shared.state.lock();
        entries_between(&state.ledgers, after, up_to)
    }

    /// Resolves once an entry newer than `after` is confirmed, or the log closes.
    pub async fn wait_for_new_entries(&self, after: Option<Position>) {
        let mut receiver = self.shared.confirmed.subscribe();
        loop {
            if *receiver.borrow_and_update() > after {
                return;
            }
            if self.is_closed() {
                return;
            }
            if receiver.changed().await.is_err() {
                return;
            }
        }
    }

    /// Resolves once an entry at or after `from` is confirmed, or the log
    /// closes. Unlike waiting for entries after `previous_position(from)`,
    /// this holds when everything before `from` has been trimmed.
    pub async fn wait_for_entry_at(&self, from: Position) {
        let mut receiver = self.shared.confirmed.subscribe();
        loop {
            if receiver
                .borrow_and_update()
                .is_some_and(|last| last >= from)
            {
                return;
            }
            if self.is_closed() {
                return;
            }
            if receiver.changed().await.is_err() {
                return;
            }
        }
    }

    /// True once the log is closed or failed (the broker should reload it).
    pub fn is_closed(&self) -> bool {
        matches!(
            self.shared.state.lock().writer,
            Writer::Closed | Writer::Failed(_)
        )
    }

    /// True once the log is terminated (persisted: also after a reopen).
    pub fn is_terminated(&self) -> bool {
        matches!(self.shared.state.lock().writer, Writer::Terminated)
    }

    /// Terminates the log (Pulsar's topic termination): appends issued before
    /// complete, every later one fails with `Terminated`, and the flag is
    /// persisted in the log's record. Returns the last confirmed position.
    pub async fn terminate(&self) -> Result<Option<Position>, LogError> {
        let name = &self.shared.name;
        let (meta, appender, queued) = loop {
            let meta = self.shared.meta_lock.lock().await;
            let taken = {
                let _issuing = self.shared.issue_lock.lock();
                let mut state = self.shared.state.lock();
                match std::mem::replace(&mut state.writer, Writer::Terminated) {
                    Writer::Ready(appender) => Some((appender, std::mem::take(&mut state.queued))),
                    Writer::Rolling => {
                        state.writer = Writer::Rolling; // the rollover finishes first
                        None
                    }
                    Writer::Terminated => return Ok(state.last_confirmed),
                    Writer::Closed => {
                        state.writer = Writer::Closed;
                        return Err(LogError::Closed(name.clone()));
                    }
                    Writer::Failed(error) => {
                        state.writer = Writer::Failed(error.clone());
                        return Err(error);
                    }
                }
            };
            if let Some((appender, queued)) = taken {
                break (meta, appender, queued);
            }
            drop(meta);
            tokio::time::sleep(std::time::Duration::from_millis(1)).await;
        };
        for append in queued {
            let _ = append.done.send(Err(LogError::Terminated(name.clone())));
        }
        appender.close().await?;
        let (info, version, empty) = {
            let mut state = self.shared.state.lock();
            // An empty last ledger goes (as on reopen), so trimming keeps the
            // ledger holding the last entry.
            let empty = state
                .ledgers
                .last()
                .filter(|l| l.entries == 0)
                .map(|l| l.ledger_id);
            let empty = empty.filter(|_| state.ledgers.len() > 1);
            if empty.is_some() {
                state.ledgers.pop();
            }
            let ledgers = state.ledgers.clone();
            let info = LogInfo {
                version: format::FORMAT_VERSION,
                ledgers,
                terminated: true,
            };
            (info, state.info_version, empty)
        };
        let key = format::log_key(name);
        let new_version = self
            .shared
            .env
            .store
            .update_json(&key, &info, version)
            .await?;
        self.shared.state.lock().info_version = new_version;
        drop(meta);
        if let Some(ledger_id) = empty {
            let _ = self.shared.env.ledgers.delete(ledger_id).await;
        }
        self.shared.confirmed.send_modify(|_| {});
        Ok(self.last_confirmed())
    }

    /// Sizes of the log.
    pub fn stats(&self) -> LogStats {
        let state = self.shared.state.lock();
        LogStats {
            entries: state.ledgers.iter().map(|l| l.entries).sum(),
            size_bytes: state.ledgers.iter().map(|l| l.size_bytes).sum(),
            ledgers: state.ledgers.len(),
        }
    }

    /// Replication the next ledger will get (the open ledger keeps its own).
    pub fn persistence(&self) -> Persistence {
        *self.shared.persistence.lock()
    }

    /// Sets the replication of the ledgers created from now on: the open
    /// ledger keeps its replication, the next rollover uses this one.
    pub fn set_persistence(&self, persistence: Persistence) -> Result<(), LogError> {
        persistence.validate().map_err(LogError::Config)?;
        *self.shared.persistence.lock() = persistence;
        Ok(())
    }

    /// Sets how much consumed data is kept; takes effect at the next trim.
    pub fn set_retention(&self, retention: Retention) {
        *self.shared.retention.lock() = retention;
    }

    /// Payload bytes of the confirmed entries after `after` (all of them for
    /// `None`): a subscription's backlog size. Exact per whole ledger,
    /// proportional by entry count within the ledger holding `after`.
    pub fn bytes_after(&self, after: Option<Position>) -> u64 {
        let state = self.shared.state.lock();
        let mut bytes = 0u64;
        for ledger in &state.ledgers {
            match after {
                Some(after) if ledger.ledger_id < after.ledger_id => {}
                Some(after) if ledger.ledger_id == after.ledger_id => {
                    let remaining = ledger.entries.saturating_sub(after.entry_id + 1);
                    bytes += (ledger.size_bytes * remaining)
                        .checked_div(ledger.entries)
                        .unwrap_or(0);
                }
                _ => bytes += ledger.size_bytes,
            }
        }
        bytes
    }

    /// The position up to which entries must be consumed so that at most
    /// `bytes` of the newest entries remain after it (`None`: nothing needs
    /// to go). Used to evict a backlog down to a quota.
    pub fn position_keeping_bytes(&self, bytes: u64) -> Option<Position> {
        let state = self.shared.state.lock();
        let mut kept = 0u64;
        for ledger in state.ledgers.iter().rev() {
            if ledger.entries == 0 {
                continue;
            }
            if kept + ledger.size_bytes <= bytes {
                kept += ledger.size_bytes;
                continue;
            }
            // Within this ledger: keep the newest entries that fit.
            let average = (ledger.size_bytes / ledger.entries).max(1);
            let keep_entries = (bytes - kept) / average;
            let drop_entries = ledger.entries - keep_entries.min(ledger.entries);
            return drop_entries
                .checked_sub(1)
                .map(|last| Position::new(ledger.ledger_id, last))
                .or_else(|| {
                    // Nothing of this ledger goes: the end of the one before.
                    let index = state
                        .ledgers
                        .iter()
                        .position(|l| l.ledger_id == ledger.ledger_id)?;
                    state.ledgers[..index]
                        .iter()
                        .rev()
                        .find(|l| l.entries > 0)
                        .map(|l| Position::new(l.ledger_id, l.entries - 1))
                });
        }
        None
    }

    /// The ledgers the log holds, oldest first (the last one is being written
    /// while the log is open).
    pub fn ledgers(&self) -> Vec<LedgerSummary> {
        self.shared
            .state
            .lock()
            .ledgers
            .iter()
            .map(|l| LedgerSummary {
                ledger_id: l.ledger_id,
                entries: l.entries,
                size_bytes: l.size_bytes,
                created_unix_ms: l.created_unix_ms,
            })
            .collect()
    }

    /// Replication and placement of one ledger, as its backend stores them.
    pub async fn describe_ledger(
        &self,
        ledger_id: u64,
    ) -> Result<Option<LedgerDescription>, LogError> {
        Ok(self.shared.env.ledgers.describe(ledger_id).await?)
    }

    /// The `count`-th confirmed entry after `after` (`after = None`: from the
    /// start; `count = 1` is the next entry). `None` when the log holds fewer.
    pub fn position_after(&self, after: Option<Position>, count: u64) -> Option<Position> {
        let state = self.shared.state.lock();
        position_after(&state.ledgers, after, count)
    }

    /// Ids of the ledgers the log holds, oldest first.
    pub fn ledger_ids(&self) -> Vec<u64> {
        self.shared
            .state
            .lock()
            .ledgers
            .iter()
            .map(|l| l.ledger_id)
            .collect()
    }

    /// Opens the durable cursor `name`, creating it at `start` if it does not
    /// exist (an existing cursor keeps its persisted state).
    pub async fn open_cursor(
        &self,
        name: &str,
        start: CursorStart,
    ) -> Result<Arc<Cursor>, LogError> {
        if let Some(cursor) = self.shared.cursors.lock().get(name) {
            return Ok(Arc::clone(cursor));
        }
        let cursor = Cursor::open(&self.shared, name, start).await?;
        let mut cursors = self.shared.cursors.lock();
        let cursor = cursors
            .entry(name.to_string())
            .or_insert_with(|| Arc::clone(&cursor));
        Ok(Arc::clone(cursor))
    }

    /// The cursor `name` if it is open.
    pub fn cursor(&self, name: &str) -> Option<Arc<Cursor>> {
        self.shared.cursors.lock().get(name).cloned()
    }

    /// Deletes a cursor and its persisted state.
    pub async fn delete_cursor(&self, name: &str) -> Result<(), LogError> {
        let cursor = self.shared.cursors.lock().remove(name);
        if let Some(cursor) = cursor {
            cursor.delete().await?;
        }
        self.shared.trim().await;
        Ok(())
    }

    /// Names of the durable cursors, sorted.
    pub fn cursor_names(&self) -> Vec<String> {
        let mut names: Vec<String> = self.shared.cursors.lock().keys().cloned().collect();
        names.sort();
        names
    }

    /// Deletes ledgers that every cursor has consumed (retention: none yet).
    pub async fn trim(&self) {
        self.shared.trim().await;
    }

    /// Closes the log: fails queued appends, waits for issued ones, closes the
    /// ledger, persists the cursors. Idempotent.
    pub async fn close(&self) -> Result<(), LogError> {
        let (appender, queued) = {
            let _issuing = self.shared.issue_lock.lock();
            let mut state = self.shared.state.lock();
            let previous = std::mem::replace(&mut state.writer, Writer::Closed);
            state.queued_bytes = 0;
            let queued: Vec<QueuedAppend> = state.queued.drain(..).collect();
            match previous {
                Writer::Ready(appender) => (Some(appender), queued),
                _ => (None, queued),
            }
        };
        for append in queued {
            let _ = append
                .done
                .send(Err(LogError::Closed(self.shared.name.clone())));
        }
        self.shared.confirmed.send_modify(|_| {});
        let mut result = Ok(());
        if let Some(appender) = appender {
            let _meta = self.shared.meta_lock.lock().await;
            if let Err(error) = appender.close().await {
                result = Err(LogError::from(error));
            }
        }
        let cursors: Vec<Arc<Cursor>> = self.shared.cursors.lock().values().cloned().collect();
        for cursor in cursors {
            cursor.flush().await?;
        }
        result
    }

    /// Closes the log and deletes its ledgers, cursors and metadata.
    pub async fn delete(&self) -> Result<(), LogError> {
        self.close().await?;
        let cursors: Vec<Arc<Cursor>> =
            self.shared.cursors.lock().drain().map(|(_, c)| c).collect();
        for cursor in cursors {
            cursor.delete().await?;
        }
        let _meta = self.shared.meta_lock.lock().await;
        let ledger_ids = self.ledger_ids();
        self.shared
            .env
            .store
            .delete(&format::log_key(&self.shared.name))
            .await?;
        for ledger_id in ledger_ids {
            match self.shared.env.ledgers.delete(ledger_id).await {
                Ok(()) | Err(LedgerBackendError::NoSuchLedger(_)) => {}
                Err(error) => return Err(error.into()),
            }
        }
        Ok(())
    }
}

impl Drop for ManagedLog {
    fn drop(&mut self) {
        // Cursors hold a weak reference to the log; nothing else to release.
        self.shared.cursors.lock().clear();
    }
}

/// Future of one append: the entry's position once durable.
#[derive(Debug)]
pub struct AppendFuture(oneshot::Receiver<Result<Position, LogError>>);

impl Future for AppendFuture {
    type Output = Result<Position, LogError>;

    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        Pin::new(&mut self.0).poll(cx).map(|result| {
            result
                .unwrap_or_else(|_| Err(LogError::Closed("append dropped by the log".to_string())))
        })
    }
}

impl Shared {
    fn ledger_full(&self, state: &State) -> bool {
        state.current_issued_entries >= self.config.ledger_entries_max
            || state.current_issued_bytes >= self.config.ledger_bytes_max
            || state.current_opened_at.elapsed() >= self.config.ledger_age_max
    }

    /// Hands one entry to the ledger; the callback confirms it in entry order.
    fn issue(
        shared: &Arc<Shared>,
        appender: &Arc<dyn LedgerAppender>,
        data: Bytes,
        done: oneshot::Sender<Result<Position, LogError>>,
    ) {
        let ledger_id = appender.ledger_id();
        let weak: Weak<Shared> = Arc::downgrade(shared);
        let cached = data.clone();
        appender.add(
            data,
            Box::new(move |result| {
                let Some(shared) = weak.upgrade() else {
                    let _ = done.send(Err(LogError::Closed("log dropped".to_string())));
                    return;
                };
                match result {
                    Ok(entry_id) => {
                        let position = Position::new(ledger_id, entry_id);
                        shared.confirm(position, cached);
                        let _ = done.send(Ok(position));
                    }
                    Err(error) => {
                        let error = LogError::from(error);
                        shared.fail(ledger_id, error.clone());
                        let _ = done.send(Err(error));
                    }
                }
            }),
        );
    }

    fn confirm(&self, position: Position, data: Bytes) {
        {
            let mut state = self.state.lock();
            if let Some(ledger) = state
                .ledgers
                .iter_mut()
                .rev()
                .find(|ledger| ledger.ledger_id == position.ledger_id)
            {
                debug_assert!(
                    position.entry_id >= ledger.entries,
                    "entries confirm in order"
                );
                ledger.entries = ledger.entries.max(position.entry_id + 1);
                ledger.size_bytes += data.len() as u64;
            }
            if state.last_confirmed < Some(position) {
                state.last_confirmed = Some(position);
            }
            let bytes_max = self.config.tail_cache_bytes_max;
            state.cache.insert(position, data, bytes_max);
        }
        self.confirmed.send_if_modified(|value| {
            if *value < Some(position) {
                *value = Some(position);
                true
            } else {
                false
            }
        });
    }

    /// A ledger add failed after the ledger client's own retries: the log stops
    /// taking appends and the broker reloads it (recovery finds what was durable).
    fn fail(&self, ledger_id: u64, error: LogError) {
        let queued: Vec<QueuedAppend> = {
            let mut state = self.state.lock();
            let current = matches!(&state.writer, Writer::Ready(a) if a.ledger_id() == ledger_id)
                || matches!(state.writer, Writer::Rolling);
            if !current {
                return;
            }
            tracing::error!(log = self.name, ledger_id, %error, "append failed; the log stops taking appends");
            state.writer = Writer::Failed(error.clone());
            state.queued_bytes = 0;
            state.queued.drain(..).collect()
        };
        for append in queued {
            let _ = append.done.send(Err(error.clone()));
        }
        self.confirmed.send_modify(|_| {});
    }

    /// Starts a rollover in the background (boxed: a rollover may start the next).
    fn spawn_roll_over(shared: &Arc<Shared>, old: Arc<dyn LedgerAppender>) {
        let future: crate::backend::BoxFuture<'static, ()> =
            Box::pin(Arc::clone(shared).roll_over(old));
        tokio::spawn(future);
    }

    async fn roll_over(self: Arc<Self>, old: Arc<dyn LedgerAppender>) {
        let meta_guard = self.meta_lock.lock().await;
        if matches!(self.state.lock().writer, Writer::Terminated) {
            let _ = old.close().await;
            return;
        }
        if let Err(error) = old.close().await {
            self.fail(old.ledger_id(), error.into());
            return;
        }
        let persistence = *self.persistence.lock();
        let created = match self.env.ledgers.create(persistence, &self.name).await {
            Ok(created) => created,
            Err(error) => {
                self.fail(old.ledger_id(), error.into());
                return;
            }
        };
        let known = self.state.lock().ledgers.clone();
        if let Err(error) =
            check_ledger_order(&self.env, &self.name, &known, created.ledger_id()).await
        {
            self.fail(old.ledger_id(), error);
            return;
        }
        let (info, version) = {
            let state = self.state.lock();
            let mut ledgers = state.ledgers.clone();
            let closed_at = unix_ms();
            if let Some(previous) = ledgers.iter_mut().find(|l| l.ledger_id == old.ledger_id()) {
                previous.closed_unix_ms = Some(closed_at);
            }
            ledgers.push(LedgerInfo {
                ledger_id: created.ledger_id(),
                entries: 0,
                size_bytes: 0,
                created_unix_ms: closed_at,
                closed_unix_ms: None,
            });
            (
                LogInfo {
                    version: format::FORMAT_VERSION,
                    ledgers,
                    terminated: false,
                },
                state.info_version,
            )
        };
        let key = format::log_key(&self.name);
        let new_version = match self.env.store.update_json(&key, &info, version).await {
            Ok(new_version) => new_version,
            Err(error) => {
                let error = match error {
                    LogError::Fenced(_) => LogError::Fenced(self.name.clone()),
                    other => other,
                };
                self.fail(old.ledger_id(), error);
                let _ = self.env.ledgers.delete(created.ledger_id()).await;
                return;
            }
        };
        {
            let _issuing = self.issue_lock.lock();
            let queued: Vec<QueuedAppend> = {
                let mut state = self.state.lock();
                if !matches!(state.writer, Writer::Rolling) {
                    // Closed or failed meanwhile: the new ledger stays empty.
                    return;
                }
                state.info_version = new_version;
                state.ledgers = info.ledgers;
                state.writer = Writer::Ready(Arc::clone(&created));
                state.current_issued_entries = 0;
                state.current_issued_bytes = 0;
                state.current_opened_at = Instant::now();
                state.queued_bytes = 0;
                state.queued.drain(..).collect()
            };
            tracing::debug!(
                log = self.name,
                old = old.ledger_id(),
                new = created.ledger_id(),
                queued = queued.len(),
                "rolled over"
            );
            let mut queued = VecDeque::from(queued);
            while let Some(append) = queued.pop_front() {
                let full = {
                    let mut state = self.state.lock();
                    state.current_issued_entries += 1;
                    state.current_issued_bytes += append.data.len() as u64;
                    let full = self.ledger_full(&state);
                    if full {
                        // The new ledger is full too: the rest waits for the next one.
                        state.writer = Writer::Rolling;
                        state.queued_bytes = queued.iter().map(|a| a.data.len() as u64).sum();
                        for rest in queued.drain(..).rev() {
                            state.queued.push_front(rest);
                        }
                    }
                    full
                };
                Shared::issue(&self, &created, append.data, append.done);
                if full {
                    Shared::spawn_roll_over(&self, Arc::clone(&created));
                    break;
                }
            }
        }
        drop(meta_guard);
        self.trim().await;
    }

    /// Oldest mark-delete position over all cursors; with no cursor every
    /// confirmed entry counts as consumed (Pulsar's behaviour without retention).
    fn slowest_mark_delete(&self) -> Option<Option<Position>> {
        let cursors: Vec<Arc<Cursor>> = self.cursors.lock().values().cloned().collect();
        if cursors.is_empty() {
            return Some(self.state.lock().last_confirmed);
        }
        cursors
            .iter()
            .map(|cursor| cursor.mark_delete_position())
            .min()
    }

    pub(crate) async fn trim(&self) {
        let Some(Some(slowest)) = self.slowest_mark_delete() else {
            return;
        };
        let _meta = self.meta_lock.lock().await;
        let (info, version, trimmed) = {
            let state = self.state.lock();
            let writing = !matches!(state.writer, Writer::Closed | Writer::Failed(_));
            let keep_from = state.ledgers.len().saturating_sub(usize::from(writing));
            let consumed = state.ledgers[..keep_from].iter().take_while(|ledger| {
                ledger.ledger_id < slowest.ledger_id
                    || (ledger.ledger_id == slowest.ledger_id
                        && ledger.entries <= slowest.entry_id + 1)
            });
            let retention = *self.retention.lock();
            let total_bytes: u64 = state.ledgers.iter().map(|l| l.size_bytes).sum();
            let now = unix_ms();
            let mut freed_bytes = 0u64;
            let mut trimmed: Vec<u64> = Vec::new();
            for ledger in consumed {
                if !retention_lets_go(retention, ledger, now, total_bytes - freed_bytes) {
                    break;
                }
                freed_bytes += ledger.size_bytes;
                trimmed.push(ledger.ledger_id);
            }
            if trimmed.is_empty() {
                return;
            }
            let ledgers = state.ledgers[trimmed.len()..].to_vec();
            (
                LogInfo {
                    version: format::FORMAT_VERSION,
                    ledgers,
                    terminated: matches!(state.writer, Writer::Terminated),
                },
                state.info_version,
                trimmed,
            )
        };
        let key = format::log_key(&self.name);
        match self.env.store.update_json(&key, &info, version).await {
            Ok(new_version) => {
                let mut state = self.state.lock();
                state.info_version = new_version;
                state.ledgers.drain(..trimmed.len());
                if let Some(first) = state.ledgers.first().map(|l| l.ledger_id) {
                    state.cache.remove_ledgers_below(first);
                }
            }
            Err(error) => {
                tracing::warn!(log = self.name, %error, "could not trim consumed ledgers");
                return;
            }
        }
        for ledger_id in trimmed {
            match self.env.ledgers.delete(ledger_id).await {
                Ok(()) | Err(LedgerBackendError::NoSuchLedger(_)) => {
                    tracing::debug!(log = self.name, ledger_id, "trimmed consumed ledger");
                }
                Err(error) => {
                    tracing::warn!(log = self.name, ledger_id, %error, "could not delete a trimmed ledger");
                }
            }
        }
    }

    pub(crate) fn next_position(&self, position: Position) -> Position {
        next_position(&self.state.lock().ledgers, position)
    }

    pub(crate) fn first_position_or_next(&self) -> Position {
        let state = self.state.lock();
        normalize(&state, Position::new(0, 0)).unwrap_or_else(|| {
            state.ledgers.last().map_or(Position::new(0, 0), |ledger| {
                Position::new(ledger.ledger_id, ledger.entries)
            })
        })
    }

    pub(crate) fn last_confirmed(&self) -> Option<Position> {
        self.state.lock().last_confirmed
    }

    pub(crate) fn entries_between(&self, after: Option<Position>, up_to: Position) -> u64 {
        entries_between(&self.state.lock().ledgers, after, up_to)
    }

    pub(crate) fn previous_position(&self, position: Position) -> Option<Position> {
        previous_position(&self.state.lock().ledgers, position)
    }
}

/// Last confirmed entry id of `ledger_id`, `None` if it holds none.
fn last_entry_of(state: &State, ledger_id: u64) -> Option<u64> {
    state
        .ledgers
        .iter()
        .find(|ledger| ledger.ledger_id == ledger_id)
        .and_then(|ledger| ledger.entries.checked_sub(1))
}

/// Moves `position` to the first confirmed entry at or after it; `None` when
/// there is none yet.
fn normalize(state: &State, position: Position) -> Option<Position> {
    let last = state.last_confirmed?;
    if position > last {
        return None;
    }
    for ledger in &state.ledgers {
        if ledger.ledger_id < position.ledger_id || ledger.entries == 0 {
            continue;
        }
        if ledger.ledger_id == position.ledger_id {
            if position.entry_id < ledger.entries {
                return Some(position);
            }
            continue;
        }
        return Some(Position::new(ledger.ledger_id, 0));
    }
    None
}

fn next_position(ledgers: &[LedgerInfo], position: Position) -> Position {
    let index = ledgers.partition_point(|ledger| ledger.ledger_id < position.ledger_id);
    match ledgers.get(index) {
        Some(ledger) if ledger.ledger_id == position.ledger_id => {
            let is_last = index + 1 == ledgers.len();
            if position.entry_id + 1 < ledger.entries || is_last {
                return Position::new(position.ledger_id, position.entry_id + 1);
            }
            // Skip empty ledgers; the last ledger (being written) is always a target.
            for (offset, later) in ledgers[index + 1..].iter().enumerate() {
                if later.entries > 0 || index + 1 + offset + 1 == ledgers.len() {
                    return Position::new(later.ledger_id, 0);
                }
            }
            Position::new(position.ledger_id, position.entry_id + 1)
        }
        Some(later) => Position::new(later.ledger_id, 0),
        None => Position::new(position.ledger_id, position.entry_id + 1),
    }
}

fn previous_position(ledgers: &[LedgerInfo], position: Position) -> Option<Position> {
    if position.entry_id > 0 && ledgers.iter().any(|l| l.ledger_id == position.ledger_id) {
        return Some(Position::new(position.ledger_id, position.entry_id - 1));
    }
    ledgers
        .iter()
        .rev()
        .find(|ledger| ledger.ledger_id < position.ledger_id && ledger.entries > 0)
        .map(|ledger| Position::new(ledger.ledger_id, ledger.entries - 1))
}

fn position_after(ledgers: &[LedgerInfo], after: Option<Position>, count: u64) -> Option<Position> {
    if count == 0 {
        return after;
    }
    let mut left = count;
    for ledger in ledgers {
        if ledger.entries == 0 {
            continue;
        }
        let first = match after {
            Some(after) if ledger.ledger_id < after.ledger_id => continue,
            Some(after) if ledger.ledger_id == after.ledger_id => after.entry_id + 1,
            _ => 0,
        };
        if first >= ledger.entries {
            continue;
        }
        let available = ledger.entries - first;
        if left <= available {
            return Some(Position::new(ledger.ledger_id, first + left - 1));
        }
        left -= available;
    }
    None
}

fn entries_between(ledgers: &[LedgerInfo], after: Option<Position>, up_to: Position) -> u64 {
    let mut count = 0u64;
    for ledger in ledgers {
        if ledger.entries == 0 || ledger.ledger_id > up_to.ledger_id {
            continue;
        }
        let mut first = 0u64;
        let mut last = ledger.entries - 1;
        if ledger.ledger_id == up_to.ledger_id {
            last = last.min(up_to.entry_id);
        }
        if let Some(after) = after {
            if ledger.ledger_id < after.ledger_id {
                continue;
            }
            if ledger.ledger_id == after.ledger_id {
                first = after.entry_id + 1;
            }
        }
        if first <= last {
            count += last - first + 1;
        }
    }
    count
}
