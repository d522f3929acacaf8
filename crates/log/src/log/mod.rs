//! `ManagedLog`: one topic's log over a list of ledgers.
//!
//! Owns: the log's ledger list and last confirmed position (`State`, behind
//! `state`: a short lock, never held across an `.await` or a call into a
//! ledger), its share of the broker's entry cache (`cache::LogCache`, its own
//! lock, never taken together with `state`), its one append queue
//! (`queue::AppendQueue`, which keeps the append order), its cursors, and
//! updates of its metadata record (`meta_lock`, async: rollover, trimming,
//! close).
//! Modules: `config` (what a log is given), `positions` (position arithmetic
//! over the ledger list), `ledger_order` (ids increase, wall-clock stamps),
//! `lifecycle` (rollover and trimming), `next_ledger` (the next ledger,
//! created ahead of its rollover), `offload` (tiered storage: offloads,
//! their status, deletion of bookie copies, reads of offloaded ledgers),
//! `sizes` (backlog bytes), `append_future`.
//!
//! Append order: `ManagedLog::append` pushes onto the append queue under its
//! lock, so the order of `append` calls (across threads: the order in which
//! they take that lock) is the log order; see `queue` for how it is kept down
//! to the ledgers.
//! Never: reorders appends, confirms an entry the ledger has not
//! acknowledged at Qa, or waits for anything in `append`.

mod append_future;
mod config;
mod entry_hooks;
mod ledger_order;
mod lifecycle;
mod next_ledger;
mod offload;
mod positions;
mod sizes;

use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};

use bytes::Bytes;
use parking_lot::Mutex;
use tokio::sync::Notify;

pub(crate) use append_future::AppendScope;
pub use append_future::{AppendFuture, AppendResult};
pub use config::{APPEND_BUDGET_BYTES_DEFAULT, ENTRY_CACHE_BYTES_DEFAULT};
pub use config::{LogConfig, LogEnv, Retention};
pub use entry_hooks::{EntryHook, EntryWaiter};

use crate::backend::{LedgerBackendError, LedgerDescription, Persistence};
use crate::budget::AppendPermit;
use crate::cache::{LogCache, ReadMark};
use crate::cursor::{Cursor, CursorLog, CursorSettings, CursorStart};
use crate::error::LogError;
use crate::format::{self, LedgerInfo, LogInfo};
use crate::offload::{OffloadPolicy, OffloadStatus, OffloadTarget};
use crate::position::Position;
use crate::queue::{AppendQueue, LedgerLimits, QueueHooks};
use crate::store::Version;
use ledger_order::{check_ledger_order, unix_ms};

/// Whether a read caches what it reads from the bookies.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMisses {
    /// Entries read from the bookies are handed out only.
    Skip,
    /// They are cached too (read-ahead for a reader behind them).
    Insert,
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
    /// Its offload to object storage is complete (reads go there).
    pub offloaded: bool,
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

struct State {
    /// Ledgers in id order; while the log takes appends the last one is the
    /// ledger being written (or, during a rollover, the one being closed).
    ledgers: Vec<LedgerInfo>,
    last_confirmed: Option<Position>,
    info_version: Version,
}

pub(crate) struct Shared {
    /// The log's name, one copy shared with its queue and cursors.
    pub(crate) name: Arc<str>,
    pub(crate) env: LogEnv,
    pub(crate) config: LogConfig,
    /// Replication of the next ledger created (starts as `config.persistence`;
    /// `ManagedLog::set_persistence` changes it, the open ledger keeps its own).
    persistence: Mutex<Persistence>,
    /// Consumed data kept (starts as `config.retention`).
    retention: Mutex<Retention>,
    state: Mutex<State>,
    /// This log's entries in the broker's entry cache.
    cache: LogCache,
    /// The one ordered queue of appends not yet handed to a ledger writer;
    /// it holds the writer and decides when a ledger is full.
    queue: Arc<AppendQueue>,
    meta_lock: tokio::sync::Mutex<()>,
    /// The next ledger, created before the current one is full.
    next_ledger: next_ledger::NextLedger,
    /// Told when the last confirmed position moves or the log stops
    /// (tail readers waiting in `wait_confirmed`). A `Notify`, not a
    /// `watch` channel: ~30 bytes a log where a watch is ~350.
    confirmed: Notify,
    /// Wake-on-append hooks of tasks that are not running (`EntryWaiter`).
    entry_hooks: entry_hooks::EntryHooks,
    cursors: Mutex<HashMap<String, Arc<Cursor>>>,
    /// Terminated: its queue stopped for good, its record says so.
    terminated: AtomicBool,
    /// When ledgers are offloaded and their bookie copies deleted (starts
    /// as `config.offload`).
    offload_policy: Mutex<OffloadPolicy>,
    /// The last offload's status; `running` keeps offloads one at a time.
    offload_status: Mutex<OffloadStatus>,
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
        // `None`: a new log, whose record is first written below, with its
        // first ledger already in it (one write, not a create and an update).
        let (mut info, stored_version) = match env.store.get_json::<LogInfo>(&key).await? {
            Some((info, version)) => (info, Some(version)),
            None => (
                LogInfo {
                    version: format::FORMAT_VERSION,
                    ledgers: Vec::new(),
                    terminated: false,
                },
                None,
            ),
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
            true => None, // no appends ever again: no ledger for them
            false => Some(env.ledgers.create_ledger(config.persistence, name).await?),
        };
        if let Some(appender) = &appender {
            check_ledger_order(env, name, &info.ledgers, appender.ledger_id()).await?;
            // Held as long as the log is open: no spare slots (a new log's
            // first push would keep four, ~300 bytes).
            info.ledgers.reserve_exact(1);
            info.ledgers.push(LedgerInfo {
                ledger_id: appender.ledger_id(),
                entries: 0,
                size_bytes: 0,
                created_unix_ms: unix_ms(),
                closed_unix_ms: None,
                offload: None,
            });
        }
        let written = match stored_version {
            Some(version) => env.store.update_json(&key, &info, version).await,
            // Another broker created the log meanwhile: Fenced, as a lost update.
            None => env.store.create_json(&key, &info).await,
        };
        let version = match written {
            Ok(version) => version,
            Err(error) => {
                if let (LogError::Fenced(_), Some(appender)) = (&error, &appender) {
                    // The write surely failed (a CAS lost, not an unknown
                    // outcome): no record names the ledger made above.
                    let ledger_id = appender.ledger_id();
                    if let Err(error) = env.ledgers.delete(ledger_id).await {
                        tracing::warn!(log = name, ledger_id, %error, "could not delete an unused ledger");
                    }
                }
                return Err(match error {
                    LogError::Fenced(_) => LogError::Fenced(name.to_string()),
                    other => other,
                });
            }
        };
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
        let limits = LedgerLimits {
            entries_max: config.ledger_entries_max,
            bytes_max: config.ledger_bytes_max,
            age_max: config.ledger_age_max,
            age_min: config.ledger_age_min,
        };
        let budget = env.append_budget.clone();
        let cache = env.cache.register_log();
        let shared_name: Arc<str> = Arc::from(name);
        let shared = Arc::new_cyclic(|weak: &Weak<Shared>| {
            let (on_full, on_wanted, on_stop) = (weak.clone(), weak.clone(), weak.clone());
            let hooks = QueueHooks {
                ledger_full: Box::new(move |full| {
                    if let Some(shared) = on_full.upgrade() {
                        Shared::spawn_roll_over(&shared, full, std::time::Instant::now());
                    }
                }),
                next_ledger_wanted: Box::new(move || {
                    if let Some(shared) = on_wanted.upgrade() {
                        Shared::spawn_prepare_next_ledger(&shared);
                    }
                }),
                stopped: Box::new(move |error| {
                    if let Some(shared) = on_stop.upgrade() {
                        shared.stopped(error);
                        Shared::spawn_discard_next_ledger(&shared);
                    }
                }),
            };
            Shared {
                name: Arc::clone(&shared_name),
                env: env.clone(),
                persistence: Mutex::new(config.persistence),
                retention: Mutex::new(config.retention),
                offload_policy: Mutex::new(config.offload),
                config,
                state: Mutex::new(State {
                    ledgers: info.ledgers,
                    last_confirmed,
                    info_version: version,
                }),
                cache,
                queue: Arc::new(AppendQueue::new(
                    Arc::clone(&shared_name),
                    budget,
                    limits,
                    hooks,
                )),
                meta_lock: tokio::sync::Mutex::new(()),
                next_ledger: next_ledger::NextLedger::default(),
                confirmed: Notify::new(),
                entry_hooks: entry_hooks::EntryHooks::default(),
                cursors: Mutex::new(HashMap::new()),
                terminated: AtomicBool::new(info.terminated),
                offload_status: Mutex::new(OffloadStatus::NOT_RUN),
            }
        });
        match appender {
            Some(appender) => {
                let attached = shared.queue.set_writer(appender);
                debug_assert!(attached, "a new log's queue starts open");
            }
            None => drop(shared.queue.stop(LogError::Terminated(name.to_string()))),
        }

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

    /// Appends an entry; never waits. The append is queued before this
    /// returns, whether or not the future is polled.
    ///
    /// Order: the order of `append` calls is the log order. Calls from one
    /// task (or under one lock) are in their call order; concurrent calls
    /// from several threads are ordered by which one queues first. Every
    /// successful append gets a position after those of the successful
    /// appends issued before it, and their futures complete in that order,
    /// each once the entry is durable (Qa bookies). A future that fails:
    /// - `EntryTooLarge` or `Overloaded` (the broker's `AppendBudget` has
    ///   no room for it): at once; only that append is refused, later ones
    ///   may succeed;
    /// - a ledger failure, `Fenced` or `Closed`: the log has stopped; every
    ///   append issued after it fails too (`is_closed` turns true: reload the
    ///   log; recovery finds what was durable).
    ///
    /// Whether the log refused the append at once is known when this
    /// returns (`AppendFuture::is_refused`), so a caller that recorded
    /// something for the append under its own lock can undo it there.
    pub fn append(&self, data: Bytes) -> AppendFuture {
        self.append_holding(data, None)
    }

    /// Waits for room for an append of `payload_bytes` in the broker's
    /// `AppendBudget` (first come, first served); the permit goes to
    /// `append_reserved`. Callers that can wait (the broker, before it reads
    /// a connection's next frame) never see `Overloaded`.
    pub async fn reserve_append(&self, payload_bytes: usize) -> AppendPermit {
        self.shared.env.append_budget.take(payload_bytes).await
    }

    /// As [`ManagedLog::append`], with room taken before (`reserve_append`):
    /// never `Overloaded`. The permit is held until the append completes.
    pub fn append_reserved(&self, data: Bytes, permit: AppendPermit) -> AppendFuture {
        self.append_holding(data, Some(permit))
    }

    fn append_holding(&self, data: Bytes, permit: Option<AppendPermit>) -> AppendFuture {
        let (done, mut future) = append_future::append_slot();
        let max_bytes = self.shared.env.ledgers.entry_bytes_max();
        if data.len() > max_bytes {
            done.complete(Err(LogError::EntryTooLarge {
                len_bytes: data.len(),
                max_bytes,
            }));
            future.set_refused(true);
            return future;
        }
        let shared: Weak<Shared> = Arc::downgrade(&self.shared);
        let cached = data.clone();
        let queued = self.shared.queue.push(
            data,
            permit,
            Box::new(move |result| {
                let result = match (result, shared.upgrade()) {
                    (Ok(position), Some(shared)) => {
                        shared.confirm(position, cached);
                        Ok(position)
                    }
                    (Ok(_), None) => Err(LogError::Closed("log dropped".to_string())),
                    (Err(error), _) => Err(error),
                };
                done.complete(result);
            }),
        );
        future.set_refused(!queued);
        future
    }

    /// Entries at positions `>= from`, up to the last confirmed one, at most
    /// `entries_max` of them and about `bytes_max` bytes (at least one entry is
    /// returned when one is available). Empty when nothing is there yet.
    /// Cached entries come from memory, the rest from the bookies (not
    /// cached: see [`ManagedLog::read_caching`]).
    pub async fn read(
        &self,
        from: Position,
        entries_max: usize,
        bytes_max: usize,
    ) -> Result<Vec<LogEntry>, LogError> {
        self.read_caching(from, entries_max, bytes_max, CacheMisses::Skip)
            .await
    }

    /// As [`ManagedLog::read`]; with `CacheMisses::Insert` the entries read
    /// from the bookies are cached too (within the broker's budget, evicted
    /// like the rest once every reader passed them): read-ahead for a reader
    /// that holds a [`ReadMark`] behind them.
    pub async fn read_caching(
        &self,
        from: Position,
        entries_max: usize,
        bytes_max: usize,
        misses: CacheMisses,
    ) -> Result<Vec<LogEntry>, LogError> {
        let mut out: Vec<LogEntry> = Vec::new();
        let mut bytes = 0usize;
        let mut position = from;
        while out.len() < entries_max && (out.is_empty() || bytes < bytes_max) {
            // Decide under the lock what to read, then read without it.
            let (ledger_id, last_wanted, offloaded) = {
                let state = self.shared.state.lock();
                let Some(normalized) =
                    positions::normalize(&state.ledgers, state.last_confirmed, position)
                else {
                    break;
                };
                position = normalized;
                let Some(ledger) = state
                    .ledgers
                    .iter()
                    .find(|l| l.ledger_id == position.ledger_id)
                else {
                    break;
                };
                let Some(last_in_ledger) = ledger.entries.checked_sub(1) else {
                    break;
                };
                // One ledger read stays about within the bytes left: as many
                // entries as the ledger's mean entry size says fit (at least
                // one), so a read of large entries is not `entries_max` of
                // them at once.
                let mean_entry_bytes = (ledger.size_bytes / ledger.entries).max(1);
                let bytes_left = bytes_max.saturating_sub(bytes) as u64;
                let fit = (bytes_left / mean_entry_bytes).max(1);
                let wanted = ((entries_max - out.len()) as u64).min(fit);
                // A complete offload: the objects are read (the bookies'
                // copy may be gone).
                let offloaded = ledger.offload.filter(|o| o.complete).map(|o| {
                    let target = OffloadTarget {
                        ledger_id: ledger.ledger_id,
                        uid: o.uid(),
                    };
                    (target, o.bookie_deleted)
                });
                (
                    position.ledger_id,
                    last_in_ledger.min(position.entry_id + wanted - 1),
                    offloaded,
                )
            };
            let run = self.shared.cache.run_from(
                position,
                last_wanted,
                entries_max - out.len(),
                bytes_max.saturating_sub(bytes),
            );
            if let Some(&(last_hit, _)) = run.entries.last() {
                for (hit, data) in run.entries {
                    bytes += data.len();
                    out.push(LogEntry {
                        position: hit,
                        data,
                    });
                }
                position = Position::new(ledger_id, last_hit.entry_id + 1);
                continue;
            }
            // Stop before the next cached entry: it is served from memory.
            let first = position.entry_id;
            let last = run
                .next_cached
                .map_or(last_wanted, |cached| cached.entry_id - 1);
            debug_assert!(first <= last, "a bookie read of {first}..={last}");
            let bytes_left = bytes_max.saturating_sub(bytes);
            let entries = match offloaded {
                Some((target, bookie_deleted)) => {
                    self.shared
                        .read_offloaded(target, bookie_deleted, first, last, bytes_left)
                        .await?
                }
                None => self.shared.env.ledgers.read(ledger_id, first, last).await?,
            };
            if entries.is_empty() {
                break;
            }
            debug_assert!(entries.len() as u64 <= last - first + 1);
            let last = first + entries.len() as u64 - 1;
            self.shared.cache.count_misses(entries.len());
            for (offset, data) in entries.into_iter().enumerate() {
                let read = Position::new(ledger_id, first + offset as u64);
                if misses == CacheMisses::Insert {
                    self.shared.cache.insert(read, &data);
                }
                bytes += data.len();
                out.push(LogEntry {
                    position: read,
                    data,
                });
            }
            position = Position::new(ledger_id, last + 1);
        }
        Ok(out)
    }

    /// Entries at positions `>= from` that the entry cache holds, in order
    /// and contiguous from the first entry at or after `from`, stopping at
    /// the first one it does not hold; at most `entries_max` of them and
    /// about `bytes_max` bytes. Never reads a ledger (empty when the first
    /// entry is not cached or nothing is there yet). The entries share the
    /// cache's buffers.
    pub fn read_cached(
        &self,
        from: Position,
        entries_max: usize,
        bytes_max: usize,
    ) -> Vec<LogEntry> {
        let (position, last_in_ledger) = {
            let state = self.shared.state.lock();
            let Some(position) = positions::normalize(&state.ledgers, state.last_confirmed, from)
            else {
                return Vec::new();
            };
            let Some(last) = state
                .ledgers
                .iter()
                .find(|l| l.ledger_id == position.ledger_id)
                .and_then(|l| l.entries.checked_sub(1))
            else {
                return Vec::new();
            };
            (position, last)
        };
        self.shared
            .cache
            .run_from(position, last_in_ledger, entries_max, bytes_max)
            .entries
            .into_iter()
            .map(|(position, data)| LogEntry { position, data })
            .collect()
    }

    /// Registers an active reader that reads next at `next`: while it is
    /// held, confirmed entries are cached for it; move it with
    /// [`ReadMark::set`] as the reader reads (entries every mark passed are
    /// dropped), drop it when the reader stops.
    pub fn register_reader(&self, next: Position) -> ReadMark {
        self.shared.cache.register_reader(next)
    }

    /// Bytes this log holds in the entry cache now.
    pub fn cached_bytes(&self) -> u64 {
        self.shared.cache.bytes()
    }

    /// Position of the newest confirmed entry.
    pub fn last_confirmed(&self) -> Option<Position> {
        self.shared.state.lock().last_confirmed
    }

    /// Position of the oldest entry still held.
    pub fn first_position(&self) -> Option<Position> {
        let state = self.shared.state.lock();
        positions::normalize(&state.ledgers, state.last_confirmed, Position::new(0, 0))
    }

    /// The position right after `position` (possibly in a later ledger, or the
    /// not yet written next entry of the current ledger).
    pub fn next_position(&self, position: Position) -> Position {
        let state = self.shared.state.lock();
        positions::next_position(&state.ledgers, position)
    }

    /// The position right before `position`, `None` when nothing precedes it.
    pub fn previous_position(&self, position: Position) -> Option<Position> {
        let state = self.shared.state.lock();
        positions::previous_position(&state.ledgers, position)
    }

    /// Entries in `(after, up_to]` (`after = None`: from the start).
    pub fn entries_between(&self, after: Option<Position>, up_to: Position) -> u64 {
        let state = self.shared.state.lock();
        positions::entries_between(&state.ledgers, after, up_to)
    }

    /// Resolves once an entry newer than `after` is confirmed, or the log closes.
    pub async fn wait_for_new_entries(&self, after: Option<Position>) {
        self.wait_confirmed(|last| last > after).await;
    }

    /// Resolves once an entry at or after `from` is confirmed, or the log
    /// closes. Unlike waiting for entries after `previous_position(from)`,
    /// this holds when everything before `from` has been trimmed.
    pub async fn wait_for_entry_at(&self, from: Position) {
        self.wait_confirmed(|last| last.is_some_and(|last| last >= from))
            .await;
    }

    /// Resolves once `done` holds for the last confirmed position, or the
    /// log closes. The wake-up is registered before the position is read,
    /// so a confirmation between the two is not missed.
    async fn wait_confirmed(&self, done: impl Fn(Option<Position>) -> bool) {
        loop {
            let notified = self.shared.confirmed.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if done(self.last_confirmed()) || self.is_closed() {
                return;
            }
            notified.await;
        }
    }

    /// A handle for a wake-on-append hook: a task that is not running
    /// (a parked subscription) is woken once an entry at or after a
    /// position is confirmed, or the log stops ([`EntryWaiter::wake_at`]).
    pub fn entry_waiter(&self) -> EntryWaiter {
        EntryWaiter::new(Arc::downgrade(&self.shared))
    }

    /// True once the log is closed or failed (the broker should reload it).
    pub fn is_closed(&self) -> bool {
        self.shared.queue.is_stopped() && !self.is_terminated()
    }

    /// True once the log is terminated (persisted: also after a reopen).
    pub fn is_terminated(&self) -> bool {
        self.shared.terminated.load(Ordering::Acquire)
    }

    /// Terminates the log (Pulsar's topic termination): appends handed to
    /// the ledger complete, every other one fails with `Terminated`, now and
    /// after a reopen (the record says so). Returns the last confirmed
    /// position. Idempotent; `Closed` on a closed or failed log.
    pub async fn terminate(&self) -> Result<Option<Position>, LogError> {
        let name = &self.shared.name;
        // Held: no rollover runs (one that waits sees `terminated` first).
        let _meta = self.shared.meta_lock.lock().await;
        if self.is_terminated() {
            return Ok(self.last_confirmed());
        }
        if self.shared.queue.is_stopped() {
            return Err(LogError::Closed(name.to_string()));
        }
        self.shared.terminated.store(true, Ordering::Release);
        if let Some(writer) = self
            .shared
            .queue
            .stop(LogError::Terminated(name.to_string()))
        {
            writer.close().await?;
        }
        self.shared.discard_next_ledger().await;
        let (info, version) = {
            let state = self.shared.state.lock();
            let ledgers = state.ledgers.clone();
            let info = LogInfo {
                version: format::FORMAT_VERSION,
                ledgers,
                terminated: true,
            };
            (info, state.info_version)
        };
        let key = format::log_key(name);
        let new_version = self
            .shared
            .env
            .store
            .update_json(&key, &info, version)
            .await?;
        self.shared.state.lock().info_version = new_version;
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
                offloaded: l.offload.is_some_and(|o| o.complete),
            })
            .collect()
    }

    /// Replication and placement of one ledger, as its backend stores them.
    pub async fn describe_ledger(
        &self,
        ledger_id: u64,
    ) -> Result<Option<LedgerDescription>, LogError> {
        let only_offloaded = self
            .shared
            .state
            .lock()
            .ledgers
            .iter()
            .any(|l| l.ledger_id == ledger_id && l.offload.is_some_and(|o| o.bookie_deleted));
        if only_offloaded {
            return Ok(None); // only in object storage: no bookie metadata
        }
        Ok(self.shared.env.ledgers.describe(ledger_id).await?)
    }

    /// The `count`-th confirmed entry after `after` (`after = None`: from the
    /// start; `count = 1` is the next entry). `None` when the log holds fewer.
    pub fn position_after(&self, after: Option<Position>, count: u64) -> Option<Position> {
        let state = self.shared.state.lock();
        positions::position_after(&state.ledgers, after, count)
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
        let log: Arc<dyn CursorLog> = self.shared.clone();
        let cursor = Cursor::open(&log, &self.shared.cursor_settings(), name, start).await?;
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

    /// Closes the log: fails the appends still queued (`Closed`), waits for
    /// the ones handed to the ledger, closes the ledger, persists the cursors.
    /// Idempotent.
    pub async fn close(&self) -> Result<(), LogError> {
        let writer = self
            .shared
            .queue
            .stop(LogError::Closed(self.shared.name.to_string()));
        let mut result = Ok(());
        if let Some(writer) = writer {
            let _meta = self.shared.meta_lock.lock().await;
            if let Err(error) = writer.close().await {
                result = Err(LogError::from(error));
            }
        }
        self.shared.discard_next_ledger().await;
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
        let ledgers = self.shared.state.lock().ledgers.clone();
        self.shared
            .env
            .store
            .delete(&format::log_key(&self.shared.name))
            .await?;
        for ledger in &ledgers {
            if ledger.offload.is_some() {
                self.shared.delete_ledger_everywhere(ledger).await;
                continue;
            }
            match self.shared.env.ledgers.delete(ledger.ledger_id).await {
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

impl Shared {
    /// An append is durable at `position`: the entry cache (while the log
    /// has readers), the ledger list and the last confirmed position take
    /// it. Confirmations come in append order (the queue's invariant).
    fn confirm(&self, position: Position, data: Bytes) {
        // Cached before it is confirmed: a tail reader woken by the
        // confirmation finds it in memory.
        if self.cache.has_readers() {
            self.cache.insert(position, &data);
        }
        {
            let mut state = self.state.lock();
            if let Some(ledger) = state
                .ledgers
                .iter_mut()
                .rev()
                .find(|ledger| ledger.ledger_id == position.ledger_id)
            {
                debug_assert_eq!(
                    position.entry_id, ledger.entries,
                    "entries confirm in order, each once"
                );
                ledger.entries = ledger.entries.max(position.entry_id + 1);
                ledger.size_bytes += data.len() as u64;
            }
            // The last confirmed position never moves back.
            debug_assert!(
                state.last_confirmed < Some(position),
                "confirmed {position} after {:?}",
                state.last_confirmed
            );
            if state.last_confirmed < Some(position) {
                state.last_confirmed = Some(position);
            }
        }
        self.confirmed.notify_waiters();
        // After the last confirmed position moved: a waiter that looks at
        // it after registering either sees this entry or is called here.
        self.entry_hooks.confirmed(position);
    }

    /// A rollover failed: the log stops taking appends and the broker
    /// reloads it (recovery finds what was durable).
    fn fail(&self, error: LogError) {
        let _ = self.queue.stop(error);
    }

    /// The append queue stopped (closed, or a ledger add or rollover
    /// failed): wake tail readers so they see `is_closed`.
    fn stopped(&self, error: &LogError) {
        if !matches!(error, LogError::Closed(_) | LogError::Terminated(_)) {
            tracing::error!(log = %self.name, %error, "append failed; the log stops taking appends");
        }
        self.confirmed.notify_waiters();
        self.entry_hooks.stopped();
    }

    fn cursor_settings(&self) -> CursorSettings {
        CursorSettings {
            log_name: self.name.clone(),
            store: self.env.store.clone(),
            acked_entries_max: self.config.cursor_acked_entries_max,
            persisted_ranges_max: self.config.cursor_persisted_ranges_max,
            persist_interval: self.config.cursor_persist_interval,
        }
    }
}

impl CursorLog for Shared {
    fn next_position(&self, position: Position) -> Position {
        positions::next_position(&self.state.lock().ledgers, position)
    }

    fn first_position_or_next(&self) -> Position {
        let state = self.state.lock();
        positions::normalize(&state.ledgers, state.last_confirmed, Position::new(0, 0))
            .unwrap_or_else(|| {
                state.ledgers.last().map_or(Position::new(0, 0), |ledger| {
                    Position::new(ledger.ledger_id, ledger.entries)
                })
            })
    }

    fn last_confirmed(&self) -> Option<Position> {
        self.state.lock().last_confirmed
    }

    fn entries_between(&self, after: Option<Position>, up_to: Position) -> u64 {
        positions::entries_between(&self.state.lock().ledgers, after, up_to)
    }

    fn previous_position(&self, position: Position) -> Option<Position> {
        positions::previous_position(&self.state.lock().ledgers, position)
    }
}
