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
}
