//! Journal configuration: the group-commit policy, durability choice, backend and
//! the bounds. Owns validation of the numbers (a bad config is a typed error at
//! `Journal::open`, never a panic later on the write path).

use std::path::PathBuf;
use std::time::Duration;

use super::error::JournalError;
use super::format::{HEADER_BYTES, RECORD_HEADER_BYTES};
use super::pmem::{PMEM_CACHE_LINE_BYTES, PmemConfig};

/// Default bound on appends waiting for the journal thread. ~65 ms of adds at
/// 250k adds/s: enough to ride out one slow fdatasync, small enough that a stuck
/// disk turns into `QueueFull` (TOO_MANY_REQUESTS) instead of unbounded memory.
pub const JOURNAL_QUEUE_DEPTH_MAX: usize = 16_384;

/// Default write alignment: 4 KiB is the page size and the physical sector size of
/// the SSDs we target, and the alignment O_DIRECT needs.
pub const JOURNAL_ALIGNMENT_BYTES: usize = 4096;
const _: () = assert!(JOURNAL_ALIGNMENT_BYTES.is_power_of_two());

/// Default number of retired files kept for reuse: two files cover the steady
/// state (one being prepared as the next file, one spare) at 2 x 512 MiB of disk.
pub const JOURNAL_RECYCLE_FILES_MAX: usize = 2;

/// Largest payload one record may carry: Pulsar's default max message size is
/// 5 MiB; a batch entry plus metadata stays below 8 MiB. Replay refuses to
/// allocate for a length field above this bound.
pub const JOURNAL_PAYLOAD_BYTES_MAX: usize = 8 << 20;

/// How durable an acknowledged append is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalSync {
    /// The append callback runs only after an `fdatasync` covering the record:
    /// survives kill -9 of the bookie and power loss.
    Fdatasync,
    /// The callback runs right after the record is written to the OS (page cache
    /// or, with O_DIRECT, the device queue) without a cache flush: survives kill -9
    /// of the bookie, NOT a power loss or kernel crash. Only when the operator
    /// explicitly chooses it.
    Off,
}

/// Which file backend the journal writes through.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JournalBackendKind {
    /// Buffered `pwrite` into the page cache + `fdatasync`.
    Buffered,
    /// `O_DIRECT` writes from aligned buffers (+ `fdatasync` for the device cache).
    /// Needs `alignment_bytes` to be a multiple of 4096. If the filesystem refuses
    /// O_DIRECT, `Journal::open` fails with `JournalError::DirectIoUnsupported`.
    Direct,
    /// `Direct` when the journal directory's filesystem takes an O_DIRECT write
    /// and `alignment_bytes` is a multiple of 4096, else `Buffered` (logged).
    /// The default: group writes skip the copy into the page cache (about 12 %
    /// more batched throughput here) at the same depth-1 latency.
    Auto,
    /// A ring of slots in a memory-mapped region on persistent memory
    /// (`JournalConfig::pmem`): a group is made durable by cache-line flushes
    /// and one SFENCE instead of fdatasync. Needs a DAX filesystem (MAP_SYNC)
    /// unless emulation is allowed. See `journal::pmem`.
    Pmem,
}

/// Journal configuration. `JournalConfig::new(dir)` gives the defaults; fields
/// are public so the bookie config can override each.
#[derive(Debug, Clone)]
pub struct JournalConfig {
    /// Directory holding the journal files and the `LOCK` file.
    pub dir: PathBuf,
    /// Durability of acknowledged appends.
    pub sync: JournalSync,
    /// File backend.
    pub backend: JournalBackendKind,
    /// Longest time the first record of a group waits for more records before the
    /// group is written (µs resolution). Only matters when `flush_when_queue_empty`
    /// is off or the queue keeps refilling.
    pub group_wait_max: Duration,
    /// A group is written once it holds at least this many encoded bytes.
    pub group_bytes_max: usize,
    /// Write the group as soon as the queue is empty (lowest latency; under load
    /// groups still grow while the previous group is being synced). On by default.
    pub flush_when_queue_empty: bool,
    /// Every write starts and ends on this boundary (power of two, 512..=1 MiB;
    /// O_DIRECT needs a multiple of 4096; the pmem backend takes 64..=64 KiB,
    /// `PMEM_ALIGNMENT_BYTES` being its natural choice).
    pub alignment_bytes: usize,
    /// A file is closed and the next one started once the next group would not fit
    /// below this size.
    pub file_bytes_max: u64,
    /// Zero-fill lookahead: the preallocation thread keeps up to two chunks of
    /// zero-filled space ahead of the writer (in the current file, and at the
    /// same pace in the next file, which it prepares early), in 1 MiB steps, so a
    /// group's fdatasync does not have to flush zeros or commit a size change.
    /// The first chunk of a new file is filled before the file is used.
    pub prealloc_chunk_bytes: u64,
    /// Bound on queued appends; when full `append` returns `QueueFull`.
    pub queue_depth_max: usize,
    /// Largest payload one record may carry (see `JOURNAL_PAYLOAD_BYTES_MAX`).
    pub payload_bytes_max: usize,
    /// Retired files (see `delete_files_before`) kept for reuse instead of
    /// deleted, each up to `file_bytes_max` of disk. Writing into a reused file
    /// needs no zero-fill and no allocation, so in the steady state the disk
    /// writes each journal byte once (a fresh file is written twice: zeros, then
    /// records). 0 disables reuse.
    pub recycle_files_max: usize,
    /// The writer and force-write threads ask for I/O priority class
    /// realtime (Linux `ioprio_set`; needs `CAP_SYS_NICE` or `CAP_SYS_ADMIN`,
    /// else they stay best effort and say so in the log), so the block
    /// layer's scheduler dispatches journal writes before queued page-cache
    /// writeback and bulk storage I/O (`io_priority` module). The
    /// preallocator stays best effort. On by default.
    pub realtime_io: bool,
    /// The region of the `Pmem` backend (ignored by the others). Its slots are
    /// the journal's files: `file_bytes_max`, `prealloc_chunk_bytes` and
    /// `recycle_files_max` do not apply (every slot is reused).
    pub pmem: Option<PmemConfig>,
}

impl JournalConfig {
    /// Defaults: fdatasync, buffered backend, flush when the queue is empty,
    /// 1 ms max group wait, 512 KiB groups, 4 KiB alignment, 512 MiB files,
    /// 16 MiB preallocation chunks, `JOURNAL_QUEUE_DEPTH_MAX` queued appends,
    /// `JOURNAL_RECYCLE_FILES_MAX` reusable files, realtime I/O priority for
    /// the writer and force-write threads.
    pub fn new(dir: impl Into<PathBuf>) -> JournalConfig {
        JournalConfig {
            dir: dir.into(),
            sync: JournalSync::Fdatasync,
            backend: JournalBackendKind::Auto,
            group_wait_max: Duration::from_millis(1),
            group_bytes_max: 512 << 10,
            flush_when_queue_empty: true,
            alignment_bytes: JOURNAL_ALIGNMENT_BYTES,
            file_bytes_max: 512 << 20,
            prealloc_chunk_bytes: 16 << 20,
            queue_depth_max: JOURNAL_QUEUE_DEPTH_MAX,
            payload_bytes_max: JOURNAL_PAYLOAD_BYTES_MAX,
            recycle_files_max: JOURNAL_RECYCLE_FILES_MAX,
            realtime_io: true,
            pmem: None,
        }
    }

    /// Largest encoded group: a group stops gathering once it reaches
    /// `group_bytes_max`, so it may exceed it by one record plus padding.
    pub(crate) fn group_len_max(&self) -> u64 {
        let record_max = (RECORD_HEADER_BYTES + 16 + self.payload_bytes_max) as u64;
        self.group_bytes_max as u64 + record_max + 2 * self.alignment_bytes as u64
    }

    /// Where records start in a file (after the header block).
    pub(crate) fn data_offset(&self) -> u64 {
        HEADER_BYTES.max(self.alignment_bytes) as u64
    }

    /// Smallest file that holds its header, one largest group and the end
    /// record block.
    pub(crate) fn file_bytes_min(&self) -> u64 {
        self.data_offset() + self.group_len_max() + self.alignment_bytes as u64
    }

    /// Checks the relations the writer relies on.
    pub(crate) fn validate(&self) -> Result<(), JournalError> {
        let bad = |reason: String| Err(JournalError::InvalidConfig { reason });
        let align = self.alignment_bytes;
        if self.backend == JournalBackendKind::Pmem {
            // Groups never share a cache line (the flush of one never races
            // the writer filling the next), and a slot ends on a group boundary.
            if !align.is_power_of_two() || !(PMEM_CACHE_LINE_BYTES..=(64 << 10)).contains(&align) {
                return bad(format!(
                    "the pmem backend needs alignment_bytes a power of two in {PMEM_CACHE_LINE_BYTES}..=65536, got {align}"
                ));
            }
            if self.pmem.is_none() {
                return bad("the pmem backend needs its region (JournalConfig::pmem)".to_string());
            }
        } else if !align.is_power_of_two() || !(512..=(1 << 20)).contains(&align) {
            return bad(format!(
                "alignment_bytes {align} must be a power of two in 512..=1048576"
            ));
        }
        if self.backend == JournalBackendKind::Direct && !align.is_multiple_of(4096) {
            return bad(format!(
                "the O_DIRECT backend needs alignment_bytes a multiple of 4096, got {align}"
            ));
        }
        if self.group_bytes_max == 0 || self.group_bytes_max > (64 << 20) {
            return bad(format!(
                "group_bytes_max {} must be in 1..=64 MiB",
                self.group_bytes_max
            ));
        }
        if self.queue_depth_max == 0 {
            return bad("queue_depth_max must be at least 1".to_string());
        }
        if self.payload_bytes_max == 0 || self.payload_bytes_max > (256 << 20) {
            return bad(format!(
                "payload_bytes_max {} must be in 1..=256 MiB",
                self.payload_bytes_max
            ));
        }
        if self.prealloc_chunk_bytes < align as u64
            || !self.prealloc_chunk_bytes.is_multiple_of(align as u64)
        {
            return bad(format!(
                "prealloc_chunk_bytes {} must be a non-zero multiple of alignment_bytes {align}",
                self.prealloc_chunk_bytes
            ));
        }
        // A file must hold its header, one largest group and the end record block.
        let file_min = self.file_bytes_min();
        if self.file_bytes_max < file_min {
            return bad(format!(
                "file_bytes_max {} must be at least {file_min} (header + largest group + end block)",
                self.file_bytes_max
            ));
        }
        if self.group_wait_max > Duration::from_secs(1) {
            return bad(format!(
                "group_wait_max {:?} must be at most 1 s",
                self.group_wait_max
            ));
        }
        Ok(())
    }
}
