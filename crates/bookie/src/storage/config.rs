//! `StorageConfig`: the knobs of ledger storage, with defaults and validation.

use std::path::PathBuf;
use std::time::Duration;

use super::error::StorageError;

/// Largest entry payload storage accepts. The bookie protocol caps a frame at
/// 5 MiB (BookKeeper's `nettyMaxFrameSizeBytes`); the slack covers headers. Also
/// the bound on any allocation sized by a length read back from an entry log.
pub const ENTRY_PAYLOAD_BYTES_MAX: u32 = 5 * 1024 * 1024 + 64 * 1024;
// Storage keeps every packaged entry the protocol can carry.
const _: () =
    assert!(vela_bookie_protocol::entry::ENTRY_BYTES_MAX <= ENTRY_PAYLOAD_BYTES_MAX as usize);

/// Default of `StorageConfig::log_reads_in_flight_max`. Measured on one
/// virtio disk (bench `backlog-while-producing`, 5 M x 1 KiB drained while a
/// producer writes 20k msg/s, quiet machine): with 2 reads of up to 1 MiB in
/// flight the producer's p99 during the drain was 1.9-2.1x its p99 without
/// one, with 1 it was 1.5-1.6x and the drain 15 % slower (1.10-1.19 vs
/// 1.33-1.39 M msg/s); 4 double the p99, 64 quadruple it.
pub const LOG_READS_IN_FLIGHT_DEFAULT: u64 = 1;

/// Largest pread of an entry-log read while it holds its place at the read
/// gate: a read of a 1 MiB read-ahead span (or a 5 MiB entry) goes to the
/// disk in pieces, so a journal write waits behind one piece at most.
pub const LOG_READ_PIECE_BYTES: u64 = 256 * 1024;

/// Configuration of one ledger dir's storage.
#[derive(Debug, Clone)]
pub struct StorageConfig {
    /// Directory holding entry logs, the index database, `lastMark` and `LOCK`.
    pub ledger_dir: PathBuf,
    /// Memory budget of the write cache, both halves (active + being flushed)
    /// together. When a put would pass it, `put_entry` returns `WriteCacheFull`.
    pub write_cache_bytes_max: u64,
    /// Memory budget of the read cache (FIFO segments, oldest dropped whole).
    pub read_cache_bytes_max: u64,
    /// Largest single read-ahead (one `pread`, one read-cache segment).
    pub read_ahead_bytes_max: u64,
    /// Entry-log reads at the disk at once (cache hits do not count): keeps
    /// catch-up reads from queueing megabytes in front of the journal.
    pub log_reads_in_flight_max: usize,
    /// When the active write cache holds this many bytes, the sync thread is woken
    /// (`wait_for_flush_trigger` returns) to flush early.
    pub flush_threshold_bytes: u64,
    /// The sync thread flushes at least this often (`wait_for_flush_trigger`'s
    /// timeout when the caller passes it).
    pub flush_interval: Duration,
    /// An entry log is closed and a new one started past this size.
    pub entry_log_size_max_bytes: u64,
    /// Incremental write-back step: after this many bytes appended to an entry
    /// log, the range is handed to the kernel (`sync_file_range` WRITE) and the
    /// previous range is waited for, so a flush never leaves more than about two
    /// steps of dirty page cache. `0` turns it off (one `fdatasync` at the end
    /// only: the whole flush sits dirty until then — the benchmark's baseline).
    pub writeback_step_bytes: u64,
    /// Write entry logs with O_DIRECT where the ledger dir's filesystem takes
    /// it (probed when storage opens, and logged); buffered with write-back
    /// steps otherwise or when `false`.
    pub direct_writes: bool,
    /// Page cache of the index database (redb's own, default 1 GiB there):
    /// lookups of recent records hit it; the rest read the index file.
    pub index_cache_bytes_max: u64,
    /// `gc()` compacts a non-active entry log whose live bytes are below this
    /// fraction of its size (0.0 = never compact, only delete fully dead logs).
    pub compaction_live_fraction: f64,
    /// Live bytes compaction copies per slice (at least one entry): the flush
    /// lock is held for one slice's append, fdatasync and index commit at a
    /// time, never for a whole log (`gc` module doc).
    pub compaction_slice_bytes: u64,
    /// Live bytes compaction copies per second at most (0: no limit): its
    /// reads and writes share the device with the journal.
    pub compaction_bytes_per_s: u64,
    /// An entry log gc deletes is first cut down by `ftruncate` in steps of
    /// this many bytes, each synced, before the unlink (0: unlinked at once):
    /// the blocks one step frees (and, on a filesystem mounted with
    /// `discard`, their discard) go to the device in pieces the journal's
    /// writes do not queue behind for long.
    pub log_delete_step_bytes: u64,
    /// Bytes of entry logs gc deletes per second at most (0: no limit).
    pub log_delete_bytes_per_s: u64,
    /// Test-only fail point; `None` in production.
    #[doc(hidden)]
    pub fail_point: Option<FailPoint>,
}

/// Simulated crashes for tests: the flush stops at that point and storage turns
/// `Broken`, as if the process died there.
#[doc(hidden)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FailPoint {
    /// After the entry log is written and fdatasync'ed, before the index commit.
    FlushBeforeIndexCommit,
    /// In a gc pass, right after the first compaction slice is committed
    /// (its entries moved, the rest of the log not yet).
    GcAfterCompactionSlice,
}

impl StorageConfig {
    /// Defaults for a ledger dir: 256 MiB write cache flushed at 64 MiB or every
    /// 10 s, 64 MiB read cache, 64 MiB index cache, 1 GiB entry logs written with
    /// O_DIRECT where possible (else 4 MiB write-back steps), compaction below
    /// 20% live in 4 MiB slices at up to 32 MiB/s, deleted logs cut in 16 MiB
    /// steps at up to 1 GiB/s.
    pub fn new(ledger_dir: impl Into<PathBuf>) -> StorageConfig {
        StorageConfig {
            ledger_dir: ledger_dir.into(),
            write_cache_bytes_max: 256 * 1024 * 1024,
            read_cache_bytes_max: 64 * 1024 * 1024,
            read_ahead_bytes_max: 1024 * 1024,
            log_reads_in_flight_max: LOG_READS_IN_FLIGHT_DEFAULT as usize,
            flush_threshold_bytes: 64 * 1024 * 1024,
            flush_interval: Duration::from_secs(10),
            entry_log_size_max_bytes: 1024 * 1024 * 1024,
            writeback_step_bytes: 4 * 1024 * 1024,
            direct_writes: true,
            index_cache_bytes_max: 64 * 1024 * 1024,
            compaction_live_fraction: 0.2,
            compaction_slice_bytes: 4 * 1024 * 1024,
            compaction_bytes_per_s: 32 * 1024 * 1024,
            log_delete_step_bytes: 16 * 1024 * 1024,
            log_delete_bytes_per_s: 1024 * 1024 * 1024,
            fail_point: None,
        }
    }

    pub(crate) fn validate(&self) -> Result<(), StorageError> {
        let bad = |m: String| Err(StorageError::BadConfig(m));
        let entry_max = u64::from(ENTRY_PAYLOAD_BYTES_MAX);
        if self.write_cache_bytes_max < 2 * entry_max {
            return bad(format!(
                "write_cache_bytes_max {} must hold at least two maximal entries ({})",
                self.write_cache_bytes_max,
                2 * entry_max
            ));
        }
        if self.flush_threshold_bytes == 0
            || self.flush_threshold_bytes > self.write_cache_bytes_max
        {
            return bad(format!(
                "flush_threshold_bytes {} must be in 1..=write_cache_bytes_max ({})",
                self.flush_threshold_bytes, self.write_cache_bytes_max
            ));
        }
        if self.flush_interval.is_zero() {
            return bad("flush_interval must be positive".into());
        }
        if self.entry_log_size_max_bytes < 2 * entry_max {
            return bad(format!(
                "entry_log_size_max_bytes {} must hold at least two maximal entries ({})",
                self.entry_log_size_max_bytes,
                2 * entry_max
            ));
        }
        if self.read_ahead_bytes_max == 0
            || self.read_ahead_bytes_max > self.read_cache_bytes_max.max(1)
        {
            return bad(format!(
                "read_ahead_bytes_max {} must be in 1..=read_cache_bytes_max ({})",
                self.read_ahead_bytes_max, self.read_cache_bytes_max
            ));
        }
        if self.log_reads_in_flight_max == 0 {
            return bad("log_reads_in_flight_max must be at least 1".into());
        }
        if !(0.0..=1.0).contains(&self.compaction_live_fraction) {
            return bad(format!(
                "compaction_live_fraction {} must be within 0.0..=1.0",
                self.compaction_live_fraction
            ));
        }
        if self.compaction_slice_bytes == 0 {
            return bad("compaction_slice_bytes must be positive".into());
        }
        Ok(())
    }
}
