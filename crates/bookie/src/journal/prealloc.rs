//! Journal files and the preallocator thread: preparing the next file (a
//! recycled one when one is free), giving it its numbered name durably, and
//! zero-filling space ahead of the writer.
//!
//! Owns: `prepare_file`, `install_file`, the free-file list, the zero-fill
//! handle and pace. Guarantees: the preallocator never writes zeros where the
//! writer writes (it claims each step under the space mutex, above the
//! writer's reservation); a new file's header is synced, and its directory
//! entry, before the writer uses it.
//! Never: writes a record, or syncs the inode groups fdatasync while they are
//! being written (zero-fill in the current file is synced per claimed step).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::config::JournalConfig;
use super::error::JournalError;
use super::file::{AlignedBuf, Backend, JournalFile};
use super::format::{self, FileHeader, NEXT_FILE_NAME};
use super::shared::Shared;

/// Zero-fill writes are issued, and claimed, in steps of this size: the buffer
/// stays small and the writer waits at most one step (~1-5 ms) if it catches up.
const ZERO_WRITE_BYTES: usize = 1 << 20;
/// Each zero-fill step goes out in writes of this size: with O_DIRECT every
/// write occupies the device, and a group write queued behind a 1 MiB one
/// waited for all of it (depth-1 journal write p99.9 540 µs; 165-200 µs with
/// 64 KiB pieces, in `cargo bench --bench bookie`).
const ZERO_WRITE_PIECE_BYTES: usize = 64 << 10;

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
pub(super) fn file_cap(config: &JournalConfig) -> u64 {
    let align = config.alignment_bytes as u64;
    config.file_bytes_max.div_ceil(align) * align
}

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
