//! Topic compaction: the latest value per key, kept in a compacted ledger,
//! read by consumers that ask for `read_compacted`.
//!
//! A compaction runs over the topic as a compacted reader sees it (the
//! previous compacted ledger up to its horizon, then the log after it) up to
//! a new horizon (the last entry confirmed when it starts). Phase one finds
//! the newest message of every key (an empty payload or `null_value` deletes
//! the key); phase two writes, in log order, every entry still holding a
//! newest value or a keyless message into a new ledger. Each compacted entry
//! carries its original position, so entry ids do not change; a batch whose
//! messages are only partly current is rebuilt with just those (their batch
//! indexes count from 0 in the rebuilt batch). The record (ledger id,
//! horizon) is then stored, the `__compaction` cursor moves to the horizon
//! (it keeps the log from trimming what the next compaction needs) and the
//! previous compacted ledger is deleted.
//!
//! Owns: the per-topic compaction state and status, the compacted ledger's
//! format, the compacted view readers use. Never: changes the log itself, or
//! runs two compactions of one topic at once (`begin` under the status lock).

use std::collections::HashMap;
use std::sync::Arc;

use bytes::{BufMut, Bytes, BytesMut};
use parking_lot::Mutex;
use prost::Message as _;
use serde::{Deserialize, Serialize};
use vela_log::{CursorStart, LedgerBackend, LedgerBackendError, LogEntry, ManagedLog, Position};
use vela_meta::{ExpectedVersion, MetadataStore, Version};
use vela_wire::proto::{CompressionType, MessageMetadata};

/// The durable subscription that marks how far the topic is compacted
/// (Pulsar's name).
pub(crate) const COMPACTION_SUBSCRIPTION: &str = "__compaction";
/// Distinct keys one compaction tracks in memory (phase one). Beyond it the
/// compaction fails with an error and nothing changes.
pub(crate) const COMPACTION_KEYS_MAX: usize = 1_000_000;
/// Entries a compacted ledger may hold (the in-memory index of original
/// positions is 16 bytes per entry). Beyond it the compaction fails.
pub(crate) const COMPACTED_ENTRIES_MAX: usize = 2_000_000;
/// Entries and bytes read per step while compacting.
const READ_ENTRIES_MAX: usize = 256;
const READ_BYTES_MAX: usize = 4 << 20;
/// Original (ledger id, entry id) in front of each compacted entry.
const POSITION_HEADER_BYTES: usize = 16;
/// Messages of one batch considered (Pulsar batches hold at most 1000 by
/// default; a lying count is refused by the batch parser anyway).
const BATCH_MESSAGES_MAX: i32 = 100_000;

/// Why a compaction failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum CompactionError {
    /// Another compaction of the topic is running.
    #[error("a compaction of this topic is already running")]
    AlreadyRunning,
    /// More keys than [`COMPACTION_KEYS_MAX`].
    #[error("more than COMPACTION_KEYS_MAX ({COMPACTION_KEYS_MAX}) distinct keys")]
    TooManyKeys,
    /// More entries than [`COMPACTED_ENTRIES_MAX`] would be kept.
    #[error("more than COMPACTED_ENTRIES_MAX ({COMPACTED_ENTRIES_MAX}) entries would be kept")]
    TooManyEntries,
    /// Reading the log failed.
    #[error("reading the topic: {0}")]
    Log(#[from] vela_log::LogError),
    /// Writing or reading a compacted ledger failed.
    #[error("compacted ledger: {0}")]
    Ledger(#[from] LedgerBackendError),
    /// Storing the compaction record failed.
    #[error("compaction record: {0}")]
    Meta(#[from] vela_meta::MetaError),
    /// A compacted ledger or its record is not what this module wrote.
    #[error("compacted data unreadable: {0}")]
    Corrupt(String),
}

/// What pulsar-admin `topics compaction-status` shows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum CompactionStatus {
    /// No compaction since the topic opened.
    NotRun,
    /// One is running.
    Running,
    /// The last one finished.
    Success,
    /// The last one failed, with why.
    Error(String),
}

/// The stored record of the latest compaction.
#[derive(Debug, Clone, Copy, Serialize, Deserialize)]
struct CompactionRecord {
    ledger_id: u64,
    horizon_ledger_id: u64,
    horizon_entry_id: u64,
    entries: u64,
}

/// A finished compaction: the newest value per key up to `horizon`.
#[derive(Debug)]
pub(crate) struct CompactedView {
    ledger_id: u64,
    horizon: Position,
    /// Original position of each compacted entry, ascending.
    positions: Vec<Position>,
}

impl CompactedView {
    /// Last position the compacted ledger covers.
    pub(crate) fn horizon(&self) -> Position {
        self.horizon
    }

    /// The compacted ledger.
    pub(crate) fn ledger_id(&self) -> u64 {
        self.ledger_id
    }

    /// Entries it holds.
    pub(crate) fn entries(&self) -> u64 {
        self.positions.len() as u64
    }

    /// Compacted entries at original positions `>= from`, at most
    /// `entries_max`, as the log would return them (original positions).
    pub(crate) async fn read(
        &self,
        ledgers: &dyn LedgerBackend,
        from: Position,
        entries_max: usize,
    ) -> Result<Vec<LogEntry>, CompactionError> {
        let first = self.positions.partition_point(|p| *p < from);
        if first >= self.positions.len() || entries_max == 0 {
            return Ok(Vec::new());
        }
        let last = (first + entries_max).min(self.positions.len()) - 1;
        let raw = ledgers
            .read(self.ledger_id, first as u64, last as u64)
            .await?;
        let mut out = Vec::with_capacity(raw.len());
        for (offset, data) in raw.into_iter().enumerate() {
            let (position, entry) = split_compacted(data)?;
            if position != self.positions[first + offset] {
                return Err(CompactionError::Corrupt(format!(
                    "compacted entry {} holds {position}, index says {}",
                    first + offset,
                    self.positions[first + offset]
                )));
            }
            out.push(LogEntry {
                position,
                data: entry,
            });
        }
        Ok(out)
    }
}

fn split_compacted(mut data: Bytes) -> Result<(Position, Bytes), CompactionError> {
    if data.len() < POSITION_HEADER_BYTES {
        return Err(CompactionError::Corrupt(format!(
            "compacted entry of {} bytes has no position header",
            data.len()
        )));
    }
    let header = data.split_to(POSITION_HEADER_BYTES);
    let mut ledger_id = [0u8; 8];
    let mut entry_id = [0u8; 8];
    ledger_id.copy_from_slice(&header[..8]);
    entry_id.copy_from_slice(&header[8..]);
    Ok((
        Position::new(u64::from_be_bytes(ledger_id), u64::from_be_bytes(entry_id)),
        data,
    ))
}

fn join_compacted(position: Position, entry: &[u8]) -> Bytes {
    let mut buf = BytesMut::with_capacity(POSITION_HEADER_BYTES + entry.len());
    buf.put_u64(position.ledger_id);
    buf.put_u64(position.entry_id);
    buf.extend_from_slice(entry);
    buf.freeze()
}

/// The `__compaction` cursor, opened (at the earliest entry) if absent: from
/// then on the log keeps what is not compacted yet, even when no
/// subscription holds it.
pub(crate) async fn compaction_cursor(
    log: &ManagedLog,
) -> Result<Arc<vela_log::Cursor>, vela_log::LogError> {
    match log.cursor(COMPACTION_SUBSCRIPTION) {
        Some(cursor) => Ok(cursor),
        None => {
            log.open_cursor(COMPACTION_SUBSCRIPTION, CursorStart::Earliest)
                .await
        }
    }
}

/// What every topic's compaction reads and writes (the service's, one copy
/// shared by every topic).
#[derive(Debug)]
pub(crate) struct CompactionEnv {
    pub(crate) meta: Arc<dyn MetadataStore>,
    pub(crate) ledgers: Arc<dyn LedgerBackend>,
}

/// A topic's [`Compaction`], made when first needed (a compaction, a
/// compacted reader, its status, the topic's deletion): most topics are
/// never compacted, and the state is ~220 bytes (issue 19's per-topic
/// cost). Made or not, it behaves the same: a compaction not made yet has
/// not run.
#[derive(Debug)]
pub(crate) struct TopicCompaction {
    env: Arc<CompactionEnv>,
    made: std::sync::OnceLock<Arc<Compaction>>,
}

impl TopicCompaction {
    pub(crate) fn new(env: Arc<CompactionEnv>) -> TopicCompaction {
        TopicCompaction {
            env,
            made: std::sync::OnceLock::new(),
        }
    }

    /// The state of `topic` (always the same topic), made on the first call.
    pub(crate) fn get(&self, topic: &crate::topic_name::TopicName) -> &Arc<Compaction> {
        self.made.get_or_init(|| {
            Arc::new(Compaction::new(
                crate::admin::compaction_key(topic),
                Arc::clone(&self.env.meta),
                Arc::clone(&self.env.ledgers),
            ))
        })
    }

    /// Status of the latest compaction (`NotRun` while never made).
    pub(crate) fn status(&self) -> CompactionStatus {
        self.made
            .get()
            .map_or(CompactionStatus::NotRun, |made| made.status())
    }
}

/// A topic's compaction state.
#[derive(Debug)]
pub(crate) struct Compaction {
    key: String,
    meta: Arc<dyn MetadataStore>,
    ledgers: Arc<dyn LedgerBackend>,
    /// The latest compaction's view, loaded when first needed.
    view: tokio::sync::Mutex<Option<ViewState>>,
    status: Mutex<CompactionStatus>,
}

#[derive(Debug, Clone)]
struct ViewState {
    view: Option<Arc<CompactedView>>,
    version: Option<Version>,
}

impl Compaction {
    /// State of the topic whose record lives at `key`.
    pub(crate) fn new(
        key: String,
        meta: Arc<dyn MetadataStore>,
        ledgers: Arc<dyn LedgerBackend>,
    ) -> Compaction {
        Compaction {
            key,
            meta,
            ledgers,
            view: tokio::sync::Mutex::new(None),
            status: Mutex::new(CompactionStatus::NotRun),
        }
    }

    /// Status of the latest compaction.
    pub(crate) fn status(&self) -> CompactionStatus {
        self.status.lock().clone()
    }

    /// The ledgers compacted entries are read from.
    pub(crate) fn ledgers(&self) -> &Arc<dyn LedgerBackend> {
        &self.ledgers
    }

    /// The latest compacted view (`None`: never compacted).
    pub(crate) async fn view(&self) -> Result<Option<Arc<CompactedView>>, CompactionError> {
        Ok(self.view_state().await?.view)
    }

    async fn view_state(&self) -> Result<ViewState, CompactionError> {
        let mut guard = self.view.lock().await;
        if let Some(state) = guard.as_ref() {
            return Ok(state.clone());
        }
        let state = match self.meta.get(&self.key).await? {
            None => ViewState {
                view: None,
                version: None,
            },
            Some((value, version)) => {
                let record: CompactionRecord = serde_json::from_slice(&value).map_err(|e| {
                    CompactionError::Corrupt(format!("record at {}: {e}", self.key))
                })?;
                let view = self.load_view(record).await?;
                ViewState {
                    view: Some(Arc::new(view)),
                    version: Some(version),
                }
            }
        };
        *guard = Some(state.clone());
        Ok(state)
    }

    /// Rebuilds the index of original positions from the compacted ledger.
    async fn load_view(&self, record: CompactionRecord) -> Result<CompactedView, CompactionError> {
        if record.entries > COMPACTED_ENTRIES_MAX as u64 {
            return Err(CompactionError::Corrupt(format!(
                "record says {} entries, above COMPACTED_ENTRIES_MAX",
                record.entries
            )));
        }
        let mut positions = Vec::with_capacity(record.entries as usize);
        let mut next = 0u64;
        while next < record.entries {
            let last = (next + READ_ENTRIES_MAX as u64).min(record.entries) - 1;
            for data in self.ledgers.read(record.ledger_id, next, last).await? {
                positions.push(split_compacted(data)?.0);
            }
            next = last + 1;
        }
        Ok(CompactedView {
            ledger_id: record.ledger_id,
            horizon: Position::new(record.horizon_ledger_id, record.horizon_entry_id),
            positions,
        })
    }

    /// Marks a compaction as running; `AlreadyRunning` when one is. The
    /// caller then runs it with [`Compaction::run`].
    pub(crate) fn begin(&self) -> Result<(), CompactionError> {
        let mut status = self.status.lock();
        if *status == CompactionStatus::Running {
            return Err(CompactionError::AlreadyRunning);
        }
        *status = CompactionStatus::Running;
        Ok(())
    }

    /// Compacts `log` up to its last confirmed entry, after [`Compaction::begin`].
    pub(crate) async fn run(&self, log: &ManagedLog) -> Result<(), CompactionError> {
        debug_assert_eq!(self.status(), CompactionStatus::Running);
        let result = self.compact_running(log).await;
        *self.status.lock() = match &result {
            Ok(()) => CompactionStatus::Success,
            Err(error) => CompactionStatus::Error(error.to_string()),
        };
        result
    }

    async fn compact_running(&self, log: &ManagedLog) -> Result<(), CompactionError> {
        // The cursor first: from now on the log keeps what is not compacted.
        let cursor = compaction_cursor(log).await?;
        let Some(horizon) = log.last_confirmed() else {
            return Ok(());
        };
        let previous = self.view_state().await?;
        if previous
            .view
            .as_ref()
            .is_some_and(|v| v.horizon() >= horizon)
        {
            return Ok(());
        }
        let source = Source {
            previous: previous.view.clone(),
            ledgers: Arc::clone(&self.ledgers),
            log,
            horizon,
        };

        // Phase one: the newest message of every key.
        let mut newest: HashMap<Bytes, Newest> = HashMap::new();
        let mut reader = source.reader();
        while let Some(entries) = reader.next_batch().await? {
            for entry in entries {
                for message in messages_of(&entry.data) {
                    let Some(key) = message.key else { continue };
                    if newest.len() >= COMPACTION_KEYS_MAX && !newest.contains_key(&key) {
                        return Err(CompactionError::TooManyKeys);
                    }
                    newest.insert(
                        key,
                        Newest {
                            position: entry.position,
                            batch_index: message.batch_index,
                            deleted: message.deleted,
                        },
                    );
                }
            }
        }

        // Phase two: write what is current, in log order.
        let appender = self
            .ledgers
            .create(
                log.persistence(),
                &format!("{}/{COMPACTION_SUBSCRIPTION}", log.name()),
            )
            .await?;
        let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
        let mut positions = Vec::new();
        let mut reader = source.reader();
        let written = async {
            while let Some(entries) = reader.next_batch().await? {
                for entry in entries {
                    let Some(kept) = compact_entry(&entry, &newest) else {
                        continue;
                    };
                    if positions.len() >= COMPACTED_ENTRIES_MAX {
                        return Err(CompactionError::TooManyEntries);
                    }
                    positions.push(entry.position);
                    let done_tx = done_tx.clone();
                    appender.add(
                        join_compacted(entry.position, &kept),
                        Box::new(move |result| {
                            let _ = done_tx.send(result.map(|_| ()));
                        }),
                    );
                }
            }
            Ok::<(), CompactionError>(())
        }
        .await;
        drop(done_tx);
        let mut add_error = None;
        while let Some(result) = done_rx.recv().await {
            if let Err(error) = result {
                add_error.get_or_insert(error);
            }
        }
        let closed = appender.close().await;
        let failure = match (written, add_error, closed) {
            (Err(error), _, _) => Some(error),
            (Ok(()), Some(error), _) | (Ok(()), None, Err(error)) => Some(error.into()),
            (Ok(()), None, Ok(())) => None,
        };
        if let Some(error) = failure {
            self.delete_ledger(appender.ledger_id()).await;
            return Err(error);
        }

        let record = CompactionRecord {
            ledger_id: appender.ledger_id(),
            horizon_ledger_id: horizon.ledger_id,
            horizon_entry_id: horizon.entry_id,
            entries: positions.len() as u64,
        };
        let value = Bytes::from(serde_json::to_vec(&record).map_err(|e| {
            CompactionError::Corrupt(format!("cannot encode the compaction record: {e}"))
        })?);
        let expected = match previous.version {
            Some(version) => ExpectedVersion::Is(version),
            None => ExpectedVersion::Absent,
        };
        let version = match self.meta.put(&self.key, value, expected).await {
            Ok(version) => version,
            Err(error) => {
                self.delete_ledger(appender.ledger_id()).await;
                return Err(error.into());
            }
        };
        let view = Arc::new(CompactedView {
            ledger_id: record.ledger_id,
            horizon,
            positions,
        });
        *self.view.lock().await = Some(ViewState {
            view: Some(Arc::clone(&view)),
            version: Some(version),
        });
        if let Err(error) = cursor.ack_cumulative(horizon) {
            tracing::warn!(log = log.name(), %error, "compaction cursor not moved");
        }
        if let Some(old) = previous.view {
            self.delete_ledger(old.ledger_id()).await;
        }
        tracing::info!(
            log = log.name(),
            horizon = %horizon,
            keys = newest.len(),
            entries = view.entries(),
            ledger_id = view.ledger_id(),
            "topic compacted"
        );
        log.trim().await;
        Ok(())
    }

    async fn delete_ledger(&self, ledger_id: u64) {
        match self.ledgers.delete(ledger_id).await {
            Ok(()) | Err(LedgerBackendError::NoSuchLedger(_)) => {}
            Err(error) => {
                tracing::warn!(ledger_id, %error, "could not delete a compacted ledger");
            }
        }
    }

    /// Deletes the compacted ledger and the record (the topic is deleted).
    pub(crate) async fn delete(&self) -> Result<(), CompactionError> {
        let state = self.view_state().await?;
        if let Some(view) = state.view {
            self.delete_ledger(view.ledger_id()).await;
        }
        match self.meta.delete(&self.key, ExpectedVersion::Any).await {
            Ok(()) | Err(vela_meta::MetaError::NotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
        *self.view.lock().await = None;
        Ok(())
    }
}

#[derive(Debug, Clone, Copy)]
struct Newest {
    position: Position,
    /// −1: not in a batch.
    batch_index: i32,
    deleted: bool,
}

/// The topic as a compacted reader sees it, up to `horizon`.
struct Source<'a> {
    previous: Option<Arc<CompactedView>>,
    ledgers: Arc<dyn LedgerBackend>,
    log: &'a ManagedLog,
    horizon: Position,
}

impl<'a> Source<'a> {
    fn reader(&self) -> SourceReader<'_, 'a> {
        SourceReader {
            source: self,
            next: Position::new(0, 0),
            in_previous: self.previous.is_some(),
            done: false,
        }
    }
}

struct SourceReader<'s, 'a> {
    source: &'s Source<'a>,
    next: Position,
    in_previous: bool,
    done: bool,
}

impl SourceReader<'_, '_> {
    async fn next_batch(&mut self) -> Result<Option<Vec<LogEntry>>, CompactionError> {
        if self.done {
            return Ok(None);
        }
        if self.in_previous
            && let Some(previous) = &self.source.previous
        {
            let entries = previous
                .read(self.source.ledgers.as_ref(), self.next, READ_ENTRIES_MAX)
                .await?;
            match entries.last() {
                Some(last) => {
                    self.next = Position::new(last.position.ledger_id, last.position.entry_id + 1);
                    return Ok(Some(entries));
                }
                None => {
                    self.in_previous = false;
                    self.next = self.source.log.next_position(previous.horizon());
                }
            }
        }
        let log = self.source.log;
        // Trimmed ledgers are skipped by the read (it starts at the first
        // entry held at or after `next`).
        let mut entries = log
            .read(self.next, READ_ENTRIES_MAX, READ_BYTES_MAX)
            .await?;
        entries.retain(|e| e.position <= self.source.horizon);
        match entries.last() {
            Some(last) if last.position < self.source.horizon => {
                self.next = log.next_position(last.position);
            }
            _ => self.done = true,
        }
        if entries.is_empty() {
            return Ok(None);
        }
        Ok(Some(entries))
    }
}

/// One message of an entry as compaction sees it.
struct KeyedMessage {
    key: Option<Bytes>,
    batch_index: i32,
    deleted: bool,
}

/// The messages of a stored entry (one unless batched). Unreadable entries
/// yield nothing: they are kept as they are by phase two (keyless).
fn messages_of(entry: &Bytes) -> Vec<KeyedMessage> {
    let Some(metadata) = crate::codec::entry_metadata(entry) else {
        return Vec::new();
    };
    let Some(count) = metadata.num_messages_in_batch else {
        let payload_empty = payload_of(entry).is_none_or(|p| p.is_empty());
        return vec![KeyedMessage {
            key: metadata.partition_key.map(Bytes::from),
            batch_index: -1,
            deleted: payload_empty || metadata.null_value == Some(true),
        }];
    };
    let Some(batch) = batch_of(entry, &metadata, count) else {
        return Vec::new();
    };
    batch
        .into_iter()
        .enumerate()
        .map(|(index, message)| KeyedMessage {
            key: message.metadata.partition_key.clone().map(Bytes::from),
            batch_index: i32::try_from(index).unwrap_or(i32::MAX),
            deleted: message.metadata.compacted_out == Some(true)
                || message.payload.is_empty()
                || message.metadata.null_value == Some(true),
        })
        .collect()
}

fn payload_of(entry: &Bytes) -> Option<Bytes> {
    let peek = vela_wire::frame::peek_entry(entry).ok()?;
    let start = entry.len() - peek.payload.len();
    Some(entry.slice(start..))
}

/// The uncompressed messages of a batched entry.
fn batch_of(
    entry: &Bytes,
    metadata: &MessageMetadata,
    count: i32,
) -> Option<Vec<vela_wire::batch::BatchMessage>> {
    if !(1..=BATCH_MESSAGES_MAX).contains(&count) {
        return None;
    }
    let payload = payload_of(entry)?;
    let codec = CompressionType::try_from(metadata.compression.unwrap_or(0)).ok()?;
    let uncompressed = if codec == CompressionType::None {
        payload
    } else {
        let size = usize::try_from(metadata.uncompressed_size.unwrap_or(0)).ok()?;
        vela_wire::compression::decompress(codec, &payload, size, vela_wire::FRAME_SIZE_LIMIT_BYTES)
            .ok()?
    };
    vela_wire::batch::parse_batch(&uncompressed, count).ok()
}

/// What phase two keeps of an entry: `None` drops it, else the bytes to
/// store (the entry itself, or its batch with stale messages compacted out).
fn compact_entry(entry: &LogEntry, newest: &HashMap<Bytes, Newest>) -> Option<Bytes> {
    let Some(metadata) = crate::codec::entry_metadata(&entry.data) else {
        // Unreadable metadata: keep it; compaction never loses what it cannot judge.
        return Some(entry.data.clone());
    };
    let is_current = |key: &Option<String>, batch_index: i32| match key {
        None => true,
        Some(key) => newest.get(key.as_bytes()).is_some_and(|n| {
            n.position == entry.position && n.batch_index == batch_index && !n.deleted
        }),
    };
    let Some(count) = metadata.num_messages_in_batch else {
        return is_current(&metadata.partition_key, -1).then(|| entry.data.clone());
    };
    let Some(batch) = batch_of(&entry.data, &metadata, count) else {
        return Some(entry.data.clone());
    };
    let total = batch.len();
    let kept: Vec<vela_wire::batch::BatchMessage> = batch
        .into_iter()
        .enumerate()
        .filter(|(index, message)| {
            let index = i32::try_from(*index).unwrap_or(i32::MAX);
            message.metadata.compacted_out != Some(true)
                && is_current(&message.metadata.partition_key, index)
        })
        .map(|(_, message)| message)
        .collect();
    if kept.is_empty() {
        return None;
    }
    if kept.len() == total {
        return Some(entry.data.clone());
    }
    // Rebuilt uncompressed with the current messages only (the official
    // clients deliver `compacted_out` messages as empty ones, so stale
    // messages are removed rather than marked).
    let mut payload = BytesMut::new();
    vela_wire::batch::build_batch(&kept, &mut payload);
    let mut metadata = metadata;
    metadata.compression = None;
    metadata.uncompressed_size = u32::try_from(payload.len()).ok();
    metadata.num_messages_in_batch = i32::try_from(kept.len()).ok();
    Some(vela_wire::frame::build_stored_entry(
        &metadata.encode_to_vec(),
        &payload,
    ))
}
