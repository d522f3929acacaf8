//! Figures storage reports: per flush, per gc pass, and a snapshot of the whole.

use std::time::Duration;

use crate::JournalMark;

/// What one `flush()` did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct FlushStats {
    /// Entries appended to entry logs.
    pub entry_count: u64,
    /// Entries skipped because the index already held them (journal replay).
    pub duplicate_count: u64,
    /// Bytes appended to entry logs (records, headers included).
    pub bytes_written: u64,
    /// Index records (one per ledger per flush, more if split) committed.
    pub index_record_count: u64,
    /// Appending, incremental write-back and the final fdatasync of the log.
    pub log_write_duration: Duration,
    /// The durable index transaction.
    pub index_commit_duration: Duration,
    /// How long the flush waited for the flush lock (held by another flush
    /// or by a gc step) before it could start.
    pub lock_wait_duration: Duration,
}

/// What one `gc()` pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcStats {
    /// Entry logs deleted because no live ledger had data in them.
    pub logs_deleted: u64,
    /// Entry logs whose live entries were copied to the active log, then deleted.
    pub logs_compacted: u64,
    /// Entries copied by compaction.
    pub entries_copied: u64,
    /// File bytes freed (sizes of the deleted logs).
    pub bytes_reclaimed: u64,
    /// Deleted ledgers whose index records were removed.
    pub ledgers_purged: u64,
    /// Logs that could not be compacted (corrupt record); they are skipped by
    /// later passes of this process and reported here once.
    pub compaction_errors: u64,
    /// Compaction slices committed (each under the flush lock on its own).
    pub compaction_slices: u64,
    /// Where the pass spent its time, step by step (`gc` module doc).
    pub timings: GcTimings,
}

/// Time one `gc()` pass spent in each step. Steps under the flush lock are
/// the ones a flush (and, once the write cache is full, an add) can wait for;
/// `flush_lock_held_max` is the longest the pass held it at once.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcTimings {
    /// The whole pass.
    pub pass: Duration,
    /// Reading which ledgers are deleted and the active log (flush lock).
    pub snapshot: Duration,
    /// Reading the logs' usage from the index (no lock).
    pub usage: Duration,
    /// Index commits removing dead and compacted logs (flush lock).
    pub log_remove_commit: Duration,
    /// Truncating and unlinking deleted log files, pacing included (no lock).
    pub log_delete: Duration,
    /// Compaction: reading and verifying live records from old logs (no lock).
    pub compaction_read: Duration,
    /// Compaction: appending the copies to the active log (flush lock).
    pub compaction_append: Duration,
    /// Compaction: fdatasync of the copies (flush lock).
    pub compaction_sync: Duration,
    /// Compaction: index commits of the moved records (flush lock).
    pub compaction_commit: Duration,
    /// Sleeping to keep compaction and deletion within their rates.
    pub pacing: Duration,
    /// Index commits purging deleted ledgers' records (flush lock).
    pub purge_commit: Duration,
    /// The longest the pass held the flush lock at once.
    pub flush_lock_held_max: Duration,
}

/// Snapshot of storage state and counters since open.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StorageStats {
    /// Bytes (accounted) in the active write cache half.
    pub write_cache_active_bytes: u64,
    /// Entries in the active write cache half.
    pub write_cache_active_entries: u64,
    /// Bytes in the half being flushed (0 when no flush runs).
    pub write_cache_flushing_bytes: u64,
    /// Puts refused with `WriteCacheFull`.
    pub write_cache_full_count: u64,
    /// Bytes held by the read cache.
    pub read_cache_bytes: u64,
    /// Reads answered by the read cache.
    pub read_cache_hit_count: u64,
    /// Reads that went to an entry log.
    pub entry_log_read_count: u64,
    /// Bytes `pread` from entry logs (read-ahead included).
    pub entry_log_read_bytes: u64,
    /// Flushes completed.
    pub flush_count: u64,
    /// Entry-log bytes written by all flushes.
    pub flushed_bytes_total: u64,
    /// Id of the entry log being appended to.
    pub active_log_id: u64,
    /// The last checkpointed journal mark.
    pub checkpoint_mark: JournalMark,
    /// The last non-empty flush (timings for the write-path breakdown).
    pub last_flush: FlushStats,
    /// The longest any flush waited for the flush lock since open.
    pub flush_lock_wait_max: Duration,
}
