//! The journal's threads: writer, force-write and preallocator, and the state
//! they share.
//!
//! Owns: the append queue, group commit, the aligned group buffer, rotation,
//! the synced mark, and the broken flag.
//!
//! Access rules: only the writer writes records and advances the write offset;
//! groups are synced and completed (fdatasync, `synced_mark`, callbacks) by the
//! force-write thread, or by the writer while `force_pending` is 0 (so one
//! thread at a time, and callbacks run in append order); only the preallocator
//! zero-fills space and creates the next file, publishing `SpaceState` under its
//! mutex. Any I/O failure marks the journal broken; from then on every queued
//! or new append fails, and nothing is retried.

use std::collections::VecDeque;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::mpsc::{Receiver, SyncSender};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use super::AppendCallback;
use super::config::{JournalConfig, JournalSync};
use super::error::JournalError;
use super::file::{AlignedBuf, Backend, JournalFile};
use super::format::{self, FileHeader, JournalRecord, NEXT_FILE_NAME};
use super::stats::StatsCell;
use crate::mark::JournalMark;

/// Groups written but not yet synced that the writer may hand over before it
/// blocks. Bounds the memory of waiters in flight (the append queue bounds the
/// rest); 64 groups is far more than one fdatasync ever covers in practice.
pub(crate) const FORCE_WRITE_GROUPS_MAX: usize = 64;

/// Zero-fill writes are issued, and claimed, in steps of this size: the buffer
/// stays small and the writer waits at most one step (~1-5 ms) if it catches up.
const ZERO_WRITE_BYTES: usize = 1 << 20;
/// Each zero-fill step goes out in writes of this size: with O_DIRECT every
/// write occupies the device, and a group write queued behind a 1 MiB one
/// waited for all of it (depth-1 journal write p99.9 540 µs; 165-200 µs with
/// 64 KiB pieces, in `cargo bench --bench bookie`).
const ZERO_WRITE_PIECE_BYTES: usize = 64 << 10;

/// One queued append.
pub(crate) struct Pending {
    pub(crate) record: JournalRecord,
    pub(crate) done: AppendCallback,
    pub(crate) enqueued: Instant,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("record", &self.record)
            .finish_non_exhaustive()
    }
}

#[derive(Debug, Default)]
pub(crate) struct QueueState {
    pub(crate) items: VecDeque<Pending>,
    /// Encoded bytes of `items`.
    pub(crate) bytes: usize,
    pub(crate) closed: bool,
    /// What the writer sleeps for, so `append` wakes it (a futex call) only when
    /// that happens, not once per record.
    pub(crate) writer_waits_for: WriterWait,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(crate) enum WriterWait {
    /// Not sleeping.
    #[default]
    Nothing,
    /// Sleeping on an empty queue: wake on the first record.
    Records,
    /// Holding a group back: wake once this many bytes are queued.
    Bytes(usize),
}

impl QueueState {
    /// Called by `append` after a push: whether to wake the writer.
    pub(crate) fn should_wake_writer(&self) -> bool {
        match self.writer_waits_for {
            WriterWait::Nothing => false,
            WriterWait::Records => true,
            WriterWait::Bytes(bytes) => self.bytes >= bytes,
        }
    }
}

/// Space the preallocator has made ready for the writer.
///
/// Zero-fill is only a performance matter (replay reads any bytes past the end
/// safely); the one rule is that the preallocator never writes zeros where the
/// writer writes. So the preallocator claims each step (`filling`) under the
/// mutex and only above `writer_reserved`; the writer reserves its range under
/// the mutex before writing, waits only when a claimed step overlaps it, and
/// otherwise writes into unfilled space (counted: that fdatasync then commits
/// allocation metadata) rather than wait for zeros.
#[derive(Debug)]
pub(crate) struct SpaceState {
    /// The writer's current file.
    pub(crate) file_id: u64,
    pub(crate) file: Arc<dyn JournalFile>,
    /// Below this the file is zero-filled, reused, or reserved by the writer.
    pub(crate) allocated_end: u64,
    /// Highest end the writer has reserved in the current file.
    pub(crate) writer_reserved: u64,
    /// The zero-fill step in progress: (file id, from).
    pub(crate) filling: Option<(u64, u64)>,
    /// Where the writer has written up to (published once per group).
    pub(crate) writer_offset: u64,
    /// Bytes the writer has written since open, across files (for its rate).
    pub(crate) written_bytes_total: u64,
    /// The next file, header synced, first chunk zero-filled, still named
    /// `NEXT_FILE_NAME`.
    pub(crate) next: Option<(Arc<dyn JournalFile>, u64)>,
    pub(crate) stop: bool,
}

/// State shared by the handle and the threads.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) config: JournalConfig,
    pub(crate) backend: Backend,
    pub(crate) queue: Mutex<QueueState>,
    pub(crate) queue_cv: Condvar,
    pub(crate) space: Mutex<SpaceState>,
    pub(crate) space_cv: Condvar,
    /// Written only by the force-write thread.
    pub(crate) synced_mark: Mutex<JournalMark>,
    pub(crate) broken: AtomicBool,
    pub(crate) broken_reason: Mutex<Option<String>>,
    /// Set once `shutdown` sealed the file of a broken journal.
    pub(crate) sealed: AtomicBool,
    /// Groups handed to the force-write thread and not yet completed.
    pub(crate) force_pending: AtomicUsize,
    /// Id of the file the writer appends to (files below may be deleted).
    pub(crate) writer_file_id: AtomicU64,
    pub(crate) stats: StatsCell,
}

impl Shared {
    /// Marks the journal broken (first reason wins) and wakes every waiter.
    pub(crate) fn fail(&self, error: &JournalError) {
        if let Ok(mut reason) = self.broken_reason.lock()
            && reason.is_none()
        {
            tracing::error!(%error, "journal: fatal I/O failure, the journal accepts no more appends");
            *reason = Some(error.to_string());
        }
        self.broken.store(true, Ordering::SeqCst);
        self.queue_cv.notify_all();
        self.space_cv.notify_all();
    }

    pub(crate) fn broken_error(&self) -> JournalError {
        let reason = self
            .broken_reason
            .lock()
            .ok()
            .and_then(|r| r.clone())
            .unwrap_or_else(|| "unknown".to_string());
        JournalError::Broken { reason }
    }

    fn is_broken(&self) -> bool {
        self.broken.load(Ordering::SeqCst)
    }

    fn lock_space(&self) -> MutexGuard<'_, SpaceState> {
        self.space.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn lock_queue(&self) -> MutexGuard<'_, QueueState> {
        self.queue.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// What the writer hands the force-write thread.
pub(crate) enum ForceItem {
    /// A group written to `file`, ending at `end_mark`.
    Written {
        file: Arc<dyn JournalFile>,
        end_mark: JournalMark,
        waiters: Vec<(AppendCallback, JournalMark)>,
        oldest_enqueued: Option<Instant>,
    },
    /// Appends that failed (the journal is broken): fail them in order.
    Failed {
        waiters: Vec<AppendCallback>,
        error: JournalError,
    },
    /// No more items: exit after this.
    Stop,
}

// ---------------------------------------------------------------------------
// Files.
// ---------------------------------------------------------------------------

/// Creates `NEXT_FILE_NAME` for `file_id`, from a recycled file when one is
/// free (its old records fail the crc seeded with the new id, and its blocks are
/// already allocated and written), else from scratch: header block, then
/// zero-filled space up to at least one chunk, synced. Returns the file and how
/// far it is allocated.
pub(crate) fn prepare_file(
    config: &JournalConfig,
    backend: &Backend,
    zeros: &Zeros,
    file_id: u64,
    zero_fill_first_chunk: bool,
) -> Result<(Arc<dyn JournalFile>, u64), JournalError> {
    let dir = &config.dir;
    let path = dir.join(NEXT_FILE_NAME);
    if backend.exists(&path) {
        backend.remove(&path)?;
    }
    if let Some(free) = backend.list_free_files(dir)?.first() {
        backend.rename(free, &path)?;
    }
    let file = backend.open(&path, true)?;
    let align = config.alignment_bytes as u64;
    let data_offset = config.data_offset();
    let cap = file_cap(config);
    let recycled_end = file.len().map_err(|e| JournalError::io("stat", &path, e))? / align * align;
    let mut header = AlignedBuf::zeroed(data_offset as usize, config.alignment_bytes);
    format::encode_header(
        FileHeader {
            file_id,
            data_offset: data_offset as u32,
        },
        header.as_mut_slice(),
    );
    file.write_at(header.as_slice(), 0).map_err(|e| {
        // Some filesystems accept O_DIRECT at open and refuse the first write.
        if e.raw_os_error() == Some(libc::EINVAL)
            && matches!(
                backend,
                Backend::Kind(super::config::JournalBackendKind::Direct)
            )
        {
            JournalError::DirectIoUnsupported {
                path: path.clone(),
                source: Arc::new(e),
            }
        } else {
            JournalError::io("pwrite", &path, e)
        }
    })?;
    let allocated = recycled_end.clamp(data_offset, cap);
    let end = if zero_fill_first_chunk {
        allocated.max((data_offset + config.prealloc_chunk_bytes).min(cap))
    } else {
        allocated
    };
    zeros.fill(file.as_ref(), allocated, end)?;
    file.sync_data()
        .map_err(|e| JournalError::io("fdatasync", &path, e))?;
    Ok((file, end))
}

/// Files waiting to be reused, oldest first.
pub(crate) fn list_free_files(dir: &Path) -> Result<Vec<PathBuf>, JournalError> {
    let mut free = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| JournalError::io("read_dir", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| JournalError::io("read_dir", dir, e))?;
        let name = entry.file_name();
        if name
            .to_str()
            .is_some_and(|n| n.ends_with(format::FREE_FILE_SUFFIX))
        {
            free.push(entry.path());
        }
    }
    free.sort();
    Ok(free)
}

/// Gives the prepared next file its numbered name, durably.
pub(crate) fn install_file(
    backend: &Backend,
    dir: &Path,
    file_id: u64,
    file: &dyn JournalFile,
) -> Result<PathBuf, JournalError> {
    let from = dir.join(NEXT_FILE_NAME);
    let to = dir.join(format::file_name(file_id));
    backend.rename(&from, &to)?;
    file.renamed(&to);
    backend.sync_dir(dir)?;
    Ok(to)
}

/// The zeros a zero-fill writes, one piece at a time: allocated once by each
/// filler (the preallocator keeps its own for its lifetime), not per step.
pub(crate) struct Zeros {
    piece: AlignedBuf,
}

impl Zeros {
    pub(crate) fn new(config: &JournalConfig) -> Zeros {
        let piece_bytes = ZERO_WRITE_PIECE_BYTES.max(config.alignment_bytes);
        Zeros {
            piece: AlignedBuf::zeroed(piece_bytes, config.alignment_bytes),
        }
    }

    /// Writes zeros over [from, to) of `file`, unsynced.
    fn fill(&self, file: &dyn JournalFile, from: u64, to: u64) -> Result<(), JournalError> {
        let piece = self.piece.as_slice();
        let mut at = from;
        while at < to {
            let n = (to - at).min(piece.len() as u64) as usize;
            file.write_at(&piece[..n], at)
                .map_err(|e| JournalError::io("pwrite zeros", file.path(), e))?;
            at += n as u64;
        }
        Ok(())
    }
}

/// Files never grow past this: the size limit rounded up to the alignment.
fn file_cap(config: &JournalConfig) -> u64 {
    let align = config.alignment_bytes as u64;
    config.file_bytes_max.div_ceil(align) * align
}

// ---------------------------------------------------------------------------
// Preallocator thread.
// ---------------------------------------------------------------------------

/// Prepares the next file as soon as there is none (a reused file when one is
/// free) and zero-fills it at the writer's pace (as far as the writer is in the
/// current file plus two chunks), unsynced per step and synced once: that inode
/// is not the one groups fdatasync, so the fill never rides on their syncs. In
/// the current file (the first one after open, or when the next file could not
/// be filled in time) it keeps up to two chunks zero-filled ahead of the writer
/// in claimed steps, each synced right away: dirty zeros or an uncommitted size
/// change there would be flushed by the next group's fdatasync (measured: depth-1
/// p50 +110 µs when syncing once per 16 MiB chunk instead). Stops zero-filling
/// while the writer is fast (see `ZERO_FILL_WRITER_RATE_MAX_BYTES_PER_SEC`).
pub(crate) fn run_preallocator(shared: Arc<Shared>) {
    let config = &shared.config;
    let chunk = config.prealloc_chunk_bytes;
    let step = ZERO_WRITE_BYTES.max(config.alignment_bytes) as u64;
    let cap = file_cap(config);
    let mut rate = WriterRate::new();
    let zeros = Zeros::new(config);
    let mut direct: Vec<(u64, Arc<dyn JournalFile>)> = Vec::with_capacity(3);
    let mut direct_ok = true;
    // The next file has zero-fill not yet synced.
    let mut next_unsynced: Option<Arc<dyn JournalFile>> = None;
    loop {
        enum Work {
            /// Zero-fill [from, to) of `file` (id), then sync it if asked.
            Fill(Arc<dyn JournalFile>, u64, u64, u64, bool),
            Next(u64, bool),
            SyncNext(Arc<dyn JournalFile>),
        }
        let work = {
            let mut space = shared.lock_space();
            loop {
                if space.stop || shared.is_broken() {
                    return;
                }
                let fast = rate.is_fast(space.written_bytes_total);
                let base = space.allocated_end.max(space.writer_reserved);
                let next_urgent = space.writer_offset + 4 * chunk >= cap || base >= cap;
                if space.next.is_none() && next_urgent {
                    break Work::Next(space.file_id + 1, !fast);
                }
                // 1. Lookahead in the current file (synced per step).
                if !fast && base < cap && base < space.writer_offset + 2 * chunk {
                    let to = (base + step).min(cap);
                    space.filling = Some((space.file_id, base));
                    break Work::Fill(space.file.clone(), space.file_id, base, to, true);
                }
                // 2. The next file, early, so it can be filled before it is used.
                if space.next.is_none() {
                    break Work::Next(space.file_id + 1, !fast);
                }
                // 3. Fill the next file, unsynced per step: its inode is not the
                // one groups fdatasync, so this never lands in their syncs.
                // Paced with the writer (filled about as far as the writer is
                // in the current file, plus two chunks) so the zeros go out at
                // the journal's own rate, not as one burst after each rotation.
                if let Some((next, next_end)) = space.next.as_ref()
                    && !fast
                    && *next_end < cap
                    && *next_end < space.writer_offset + 2 * chunk
                {
                    let (next, from) = (next.clone(), *next_end);
                    let to = (from + step).min(cap);
                    space.filling = Some((space.file_id + 1, from));
                    break Work::Fill(next, space.file_id + 1, from, to, false);
                }
                // 4. One sync for the filled next file.
                if let Some(next) = next_unsynced.take() {
                    break Work::SyncNext(next);
                }
                (space, _) = shared
                    .space_cv
                    .wait_timeout(space, WRITER_RATE_WINDOW)
                    .unwrap_or_else(|p| p.into_inner());
            }
        };
        let result = match work {
            Work::Fill(file, file_id, from, to, sync_after) => {
                let fill_with = |target: &Arc<dyn JournalFile>| {
                    zeros.fill(target.as_ref(), from, to).and_then(|()| {
                        if !sync_after {
                            return Ok(());
                        }
                        target
                            .sync_data()
                            .map_err(|e| JournalError::io("fdatasync", target.path(), e))
                    })
                };
                let mut filled = None;
                if direct_ok {
                    let target = zero_fill_handle(&shared, &mut direct, file_id, &file);
                    if !Arc::ptr_eq(&target, &file) {
                        match fill_with(&target) {
                            Ok(()) => filled = Some(Ok(())),
                            Err(e) => {
                                // A filesystem that opens O_DIRECT but refuses its
                                // writes: fill through the page cache from now on.
                                tracing::warn!(error = %e, "journal: O_DIRECT zero-fill failed; using buffered zero-fill");
                                direct_ok = false;
                                direct.clear();
                            }
                        }
                    }
                }
                let filled = filled.unwrap_or_else(|| fill_with(&file));
                let mut space = shared.lock_space();
                space.filling = None;
                if filled.is_ok() {
                    if space.file_id == file_id {
                        space.allocated_end = space.allocated_end.max(to);
                    } else if let Some((next, next_end)) = space.next.as_mut()
                        && Arc::ptr_eq(next, &file)
                    {
                        *next_end = (*next_end).max(to);
                        next_unsynced = Some(file);
                    }
                }
                shared.space_cv.notify_all();
                filled
            }
            Work::Next(file_id, zero_fill_first_chunk) => prepare_file(
                config,
                &shared.backend,
                &zeros,
                file_id,
                zero_fill_first_chunk,
            )
            .map(|(file, end)| {
                let mut space = shared.lock_space();
                space.next = Some((file, end));
                shared.space_cv.notify_all();
            }),
            Work::SyncNext(file) => file
                .sync_data()
                .map_err(|e| JournalError::io("fdatasync", file.path(), e)),
        };
        match result {
            Ok(()) => {}
            // A full pmem ring: wait for a checkpoint to free a slot.
            Err(e @ JournalError::RingFull { .. })
                if super::pmem::wait_for_free_slot(&shared, &e) => {}
            Err(e) => {
                shared.fail(&e);
                return;
            }
        }
    }
}

/// The handle zero-fill goes through: for the buffered backend, an O_DIRECT
/// handle on the same file when the filesystem takes it, so the zeros never sit
/// dirty in the page cache where a group's fdatasync (which flushes the whole
/// file) would have to write them out; else the writer's own handle. Measured
/// here at depth 1 (journal p50 minus raw p50, 3 runs each): +55..+77 µs with
/// buffered zero-fill, -9..+61 µs (median +23) with O_DIRECT zero-fill.
fn zero_fill_handle(
    shared: &Shared,
    direct: &mut Vec<(u64, Arc<dyn JournalFile>)>,
    file_id: u64,
    file: &Arc<dyn JournalFile>,
) -> Arc<dyn JournalFile> {
    let buffered = matches!(
        shared.backend,
        Backend::Kind(super::config::JournalBackendKind::Buffered)
    );
    if !buffered || !shared.config.alignment_bytes.is_multiple_of(4096) {
        return file.clone();
    }
    if let Some((_, handle)) = direct.iter().find(|(id, _)| *id == file_id) {
        return handle.clone();
    }
    let direct_backend = Backend::Kind(super::config::JournalBackendKind::Direct);
    match direct_backend.open(&file.path(), false) {
        Ok(handle) => {
            // Handles for the current and the next file.
            direct.retain(|(id, _)| *id + 1 >= file_id);
            direct.push((file_id, handle.clone()));
            handle
        }
        Err(_) => file.clone(),
    }
}

/// How often the preallocator measures the writer's rate.
const WRITER_RATE_WINDOW: Duration = Duration::from_millis(100);

/// Above this rate of file consumption the preallocator stops zero-filling:
/// groups are then large, so the allocation metadata their fdatasync commits is
/// cheap next to their data, while zero-filling would double the bytes written.
/// Depth-1 traffic of 1 KiB entries consumes ~30 MB/s (a 4 KiB block per
/// ~130 µs) and keeps zero-filled space.
const ZERO_FILL_WRITER_RATE_MAX_BYTES_PER_SEC: f64 = 128.0 * 1024.0 * 1024.0;

/// The writer's recent rate of file consumption, sampled by the preallocator.
#[derive(Debug)]
struct WriterRate {
    since: Instant,
    written_bytes_total: u64,
    fast: bool,
}

impl WriterRate {
    fn new() -> WriterRate {
        WriterRate {
            since: Instant::now(),
            written_bytes_total: 0,
            fast: false,
        }
    }

    /// Whether the writer wrote faster than the limit over the last window.
    fn is_fast(&mut self, written_bytes_total: u64) -> bool {
        let elapsed = self.since.elapsed();
        if elapsed >= WRITER_RATE_WINDOW {
            let advanced = written_bytes_total.saturating_sub(self.written_bytes_total);
            self.fast =
                advanced as f64 / elapsed.as_secs_f64() > ZERO_FILL_WRITER_RATE_MAX_BYTES_PER_SEC;
            self.since = Instant::now();
            self.written_bytes_total = written_bytes_total;
        }
        self.fast
    }
}

// ---------------------------------------------------------------------------
// Writer thread.
// ---------------------------------------------------------------------------

/// The writer's own state.
struct Writer {
    shared: Arc<Shared>,
    to_force: SyncSender<ForceItem>,
    file_id: u64,
    file: Arc<dyn JournalFile>,
    offset: u64,
    buf: AlignedBuf,
    /// The one group the writer syncs itself (`sync_inline`), kept to reuse
    /// its allocation: empty between groups.
    inline_batch: Vec<ForceItem>,
}

pub(crate) fn run_writer(
    shared: Arc<Shared>,
    to_force: SyncSender<ForceItem>,
    file_id: u64,
    file: Arc<dyn JournalFile>,
) {
    let offset = shared.config.data_offset();
    let alignment = shared.config.alignment_bytes;
    let mut writer = Writer {
        shared,
        to_force,
        file_id,
        file,
        offset,
        buf: AlignedBuf::zeroed(alignment.max(64 << 10), alignment),
        inline_batch: Vec::with_capacity(1),
    };
    while let Some(group) = writer.gather() {
        writer.write_group(group);
    }
    writer.close();
}

impl Writer {
    /// Takes the next group from the queue, per the policy: at least one record;
    /// more while they are queued, until `group_bytes_max`; when the queue runs
    /// empty, flush at once if `flush_when_queue_empty` and the force-write thread
    /// is idle, else wait for more records (or for the force-write thread) until
    /// the oldest record has waited `group_wait_max`. `None` when closed and
    /// drained.
    fn gather(&mut self) -> Option<Vec<Pending>> {
        let config = &self.shared.config;
        let mut queue = self.shared.lock_queue();
        while queue.items.is_empty() {
            if queue.closed {
                return None;
            }
            queue.writer_waits_for = WriterWait::Records;
            queue = self
                .shared
                .queue_cv
                .wait(queue)
                .unwrap_or_else(|p| p.into_inner());
        }
        queue.writer_waits_for = WriterWait::Nothing;
        let mut group = Vec::new();
        let mut bytes = 0usize;
        let deadline = queue
            .items
            .front()
            .map(|p| p.enqueued + config.group_wait_max);
        loop {
            while let Some(p) = queue.items.pop_front() {
                let len = p.record.encoded_len();
                queue.bytes -= len;
                bytes += len;
                group.push(p);
                if bytes >= config.group_bytes_max {
                    return Some(group);
                }
            }
            if queue.closed {
                return Some(group);
            }
            // Flush when the queue is empty, but only once the force-write thread
            // can take the group: while it syncs, writing now would not make the
            // records durable any sooner, and waiting lets the group grow (fewer
            // writes and less padding under load; no delay at depth 1).
            if config.flush_when_queue_empty
                && self.shared.force_pending.load(Ordering::SeqCst) == 0
            {
                return Some(group);
            }
            let now = Instant::now();
            let Some(deadline) = deadline.filter(|d| *d > now) else {
                return Some(group);
            };
            queue.writer_waits_for = WriterWait::Bytes(config.group_bytes_max - bytes);
            let (q, _) = self
                .shared
                .queue_cv
                .wait_timeout(queue, deadline - now)
                .unwrap_or_else(|p| p.into_inner());
            queue = q;
            queue.writer_waits_for = WriterWait::Nothing;
        }
    }

    fn send(&self, item: ForceItem) {
        // The force-write thread only exits after `Stop`, which the writer sends
        // last; a send error means it panicked, and then waiters are dropped.
        let _ = self.to_force.send(item);
    }

    fn fail_group(&self, group: Vec<Pending>, error: JournalError) {
        self.send(ForceItem::Failed {
            waiters: group.into_iter().map(|p| p.done).collect(),
            error,
        });
    }

    fn write_group(&mut self, group: Vec<Pending>) {
        if self.shared.is_broken() {
            let error = self.shared.broken_error();
            self.fail_group(group, error);
            return;
        }
        let taken = Instant::now();
        let oldest = group.first().map(|p| p.enqueued);
        let align = self.shared.config.alignment_bytes as u64;
        let records_len: usize = group.iter().map(|p| p.record.encoded_len()).sum();
        let padding = format::padding_len(self.offset + records_len as u64, align);
        let total = records_len + padding;
        debug_assert!(total as u64 <= self.shared.config.group_len_max());
        // Keep one block free at the end of every file for its FileEnd record.
        if self.offset + total as u64 + align > file_cap(&self.shared.config)
            && let Err(e) = self.rotate()
        {
            self.shared.fail(&e);
            self.fail_group(group, e);
            return;
        }
        if let Err(e) = self.reserve_space(self.offset + total as u64) {
            self.fail_group(group, e);
            return;
        }
        // Encode.
        self.buf.reset_zeroed(total);
        let out = self.buf.as_mut_slice();
        let mut at = 0usize;
        let mut waiters = Vec::with_capacity(group.len());
        for p in group {
            let len = format::encode_record(&p.record, self.file_id, &mut out[at..]);
            at += len;
            let mark = JournalMark {
                file_id: self.file_id,
                offset: self.offset + at as u64,
            };
            waiters.push((p.done, mark));
        }
        if padding > 0 {
            format::encode_padding(padding, self.file_id, &mut out[at..]);
        }
        debug_assert!((self.offset + total as u64).is_multiple_of(align));
        let started = Instant::now();
        if let Err(e) = self.file.write_at(self.buf.as_slice(), self.offset) {
            let e = JournalError::io("pwrite", self.file.path(), e);
            self.shared.fail(&e);
            self.send(ForceItem::Failed {
                waiters: waiters.into_iter().map(|(done, _)| done).collect(),
                error: e,
            });
            return;
        }
        let write_time = started.elapsed();
        let entries = waiters.len();
        self.offset += total as u64;
        self.publish_offset(total as u64);
        let queue_wait = oldest
            .map(|t| taken.saturating_duration_since(t))
            .unwrap_or_default();
        self.shared
            .stats
            .record_group(queue_wait, write_time, entries, total);
        let written = ForceItem::Written {
            file: self.file.clone(),
            end_mark: JournalMark {
                file_id: self.file_id,
                offset: self.offset,
            },
            waiters,
            oldest_enqueued: oldest,
        };
        if self.sync_inline() {
            // Nothing to pipeline with: handing over would only add a thread
            // wake-up (tens of µs on an idle machine) to this group's latency.
            self.inline_batch.push(written);
            sync_and_complete(&self.shared, &mut self.inline_batch);
        } else {
            self.shared.force_pending.fetch_add(1, Ordering::SeqCst);
            self.send(written);
        }
    }

    /// Whether the writer syncs and completes the group it just wrote itself:
    /// when the force-write thread has nothing pending (so completions stay in
    /// append order) and no record is queued (so there is no next group to
    /// gather while this one syncs). That is the depth-1 case; under load the
    /// groups go to the force-write thread and the two threads pipeline.
    fn sync_inline(&self) -> bool {
        if self.shared.force_pending.load(Ordering::SeqCst) != 0 {
            return false;
        }
        self.shared.lock_queue().items.is_empty()
    }

    fn publish_offset(&self, group_bytes: u64) {
        let chunk = self.shared.config.prealloc_chunk_bytes;
        let mut space = self.shared.lock_space();
        space.writer_offset = self.offset;
        space.written_bytes_total += group_bytes;
        if space.allocated_end < self.offset + 2 * chunk {
            self.shared.space_cv.notify_all();
        }
    }

    /// Reserves the current file up to `end` for the writer: waits only while
    /// a zero-fill step overlapping it is in progress, else takes unfilled space
    /// as it is (see `SpaceState`).
    fn reserve_space(&self, end: u64) -> Result<(), JournalError> {
        let mut space = self.shared.lock_space();
        space.writer_reserved = space.writer_reserved.max(end);
        let mut waited = false;
        loop {
            if self.shared.is_broken() {
                return Err(self.shared.broken_error());
            }
            if end <= space.allocated_end {
                return Ok(());
            }
            match space.filling {
                Some((file_id, from)) if file_id == self.file_id && from < end => {
                    if !waited {
                        waited = true;
                        self.shared.stats.record_prealloc_wait();
                    }
                    space = self
                        .shared
                        .space_cv
                        .wait(space)
                        .unwrap_or_else(|p| p.into_inner());
                }
                _ => {
                    space.allocated_end = end;
                    self.shared.stats.record_unfilled_write();
                    self.shared.space_cv.notify_all();
                    return Ok(());
                }
            }
        }
    }

    /// Writes a FileEnd record at the current offset and syncs it (so an older
    /// file always ends with a durable FileEnd). The space after it stays
    /// allocated for when the file is reused.
    fn end_file(&mut self) -> Result<JournalMark, JournalError> {
        let align = self.shared.config.alignment_bytes;
        self.reserve_space(self.offset + align as u64)?;
        self.buf.reset_zeroed(align);
        format::encode_file_end(self.file_id, self.buf.as_mut_slice());
        let path = self.file.path();
        self.file
            .write_at(self.buf.as_slice(), self.offset)
            .map_err(|e| JournalError::io("pwrite", &path, e))?;
        self.file
            .sync_data()
            .map_err(|e| JournalError::io("fdatasync", &path, e))?;
        Ok(JournalMark {
            file_id: self.file_id,
            offset: self.offset,
        })
    }

    /// Closes the current file and switches to the next one.
    fn rotate(&mut self) -> Result<(), JournalError> {
        self.end_file()?;
        let next_id = self.file_id + 1;
        let data_offset = self.shared.config.data_offset();
        // One critical section: the preallocator must neither prepare a file
        // under the id being installed nor reuse `NEXT_FILE_NAME` before the
        // rename, so the switch (and the rename) happen under its mutex.
        let mut space = self.shared.lock_space();
        let (file, allocated_end) = loop {
            if self.shared.is_broken() {
                return Err(self.shared.broken_error());
            }
            if let Some(next) = space.next.take() {
                break next;
            }
            self.shared.space_cv.notify_all();
            space = self
                .shared
                .space_cv
                .wait(space)
                .unwrap_or_else(|p| p.into_inner());
        };
        // Any zero-fill of it not yet synced must not ride on a group's sync.
        file.sync_data()
            .map_err(|e| JournalError::io("fdatasync", file.path(), e))?;
        install_file(
            &self.shared.backend,
            &self.shared.config.dir,
            next_id,
            file.as_ref(),
        )?;
        space.file_id = next_id;
        space.file = file.clone();
        space.allocated_end = allocated_end;
        space.writer_reserved = data_offset;
        space.writer_offset = data_offset;
        self.shared.space_cv.notify_all();
        drop(space);
        self.file_id = next_id;
        self.file = file;
        self.offset = data_offset;
        self.shared.writer_file_id.store(next_id, Ordering::SeqCst);
        Ok(())
    }

    /// Shutdown: end the file, let the force-write thread finish, stop.
    fn close(mut self) {
        if !self.shared.is_broken() {
            match self.end_file() {
                Ok(mark) => {
                    self.shared.force_pending.fetch_add(1, Ordering::SeqCst);
                    self.send(ForceItem::Written {
                        file: self.file.clone(),
                        end_mark: mark,
                        waiters: Vec::new(),
                        oldest_enqueued: None,
                    });
                }
                Err(e) => self.shared.fail(&e),
            }
        }
        self.send(ForceItem::Stop);
        let mut space = self.shared.lock_space();
        space.stop = true;
        self.shared.space_cv.notify_all();
    }
}

// ---------------------------------------------------------------------------
// Force-write thread.
// ---------------------------------------------------------------------------

/// Takes every group handed over since its last pass, syncs and completes
/// them (`sync_and_complete`), then wakes the writer if it holds a group back
/// for this thread.
pub(crate) fn run_force_writer(shared: Arc<Shared>, from_writer: Receiver<ForceItem>) {
    let mut batch: Vec<ForceItem> = Vec::with_capacity(FORCE_WRITE_GROUPS_MAX);
    loop {
        let Ok(first) = from_writer.recv() else {
            return;
        };
        batch.push(first);
        while batch.len() < FORCE_WRITE_GROUPS_MAX {
            let Ok(item) = from_writer.try_recv() else {
                break;
            };
            batch.push(item);
        }
        let Completed { groups, stop } = sync_and_complete(&shared, &mut batch);
        if groups > 0 && shared.force_pending.fetch_sub(groups, Ordering::SeqCst) == groups {
            // Idle now: wake the writer if it holds a group back for us.
            let _queue = shared.lock_queue();
            shared.queue_cv.notify_all();
        }
        if stop {
            return;
        }
    }
}

/// What one `sync_and_complete` pass did.
struct Completed {
    /// `Written` groups completed.
    groups: usize,
    /// A `Stop` was among the items.
    stop: bool,
}

/// Does one fdatasync per file among the written groups of `batch` (one in the
/// steady state), then completes their waiters in order, advances the synced
/// mark, and drains `batch`. Callers guarantee no other thread is completing
/// groups at the same time (see the module's access rules), so waiters complete
/// in append order.
fn sync_and_complete(shared: &Shared, batch: &mut Vec<ForceItem>) -> Completed {
    let sync_on = shared.config.sync == JournalSync::Fdatasync;
    let mut stop = false;
    // Sync each distinct file of the written groups, oldest first.
    let mut sync_error: Option<JournalError> = None;
    let mut sync_time: Option<Duration> = None;
    let mut groups = 0usize;
    if sync_on && !shared.is_broken() {
        let mut last: Option<&Arc<dyn JournalFile>> = None;
        for item in batch.iter() {
            if let ForceItem::Written { file, .. } = item {
                groups += 1;
                if last.is_some_and(|l| Arc::ptr_eq(l, file)) {
                    continue;
                }
                let started = Instant::now();
                if let Err(e) = file.sync_data() {
                    let e = JournalError::io("fdatasync", file.path(), e);
                    shared.fail(&e);
                    sync_error = Some(e);
                    break;
                }
                *sync_time.get_or_insert(Duration::ZERO) += started.elapsed();
                last = Some(file);
            }
        }
    }
    if sync_error.is_none() && !shared.is_broken() {
        let end = batch.iter().rev().find_map(|item| match item {
            ForceItem::Written { end_mark, .. } => Some(*end_mark),
            _ => None,
        });
        if let Some(end) = end
            && let Ok(mut synced) = shared.synced_mark.lock()
        {
            *synced = (*synced).max(end);
        }
    }
    shared.stats.record_sync(sync_time, groups);
    let failure = sync_error.or_else(|| shared.is_broken().then(|| shared.broken_error()));
    let now = Instant::now();
    let mut groups_done = 0usize;
    for item in batch.drain(..) {
        match item {
            ForceItem::Written {
                waiters,
                oldest_enqueued,
                ..
            } => {
                groups_done += 1;
                for (done, mark) in waiters {
                    match &failure {
                        None => done(Ok(mark)),
                        Some(e) => done(Err(e.clone())),
                    }
                }
                if let Some(t) = oldest_enqueued.filter(|_| failure.is_none()) {
                    shared.stats.record_done(now.saturating_duration_since(t));
                }
            }
            ForceItem::Failed { waiters, error } => {
                for done in waiters {
                    done(Err(error.clone()));
                }
            }
            ForceItem::Stop => stop = true,
        }
    }
    Completed {
        groups: groups_done,
        stop,
    }
}
