//! The bookie's write-ahead journal.
//!
//! Owns: the journal directory (numbered `.jnl` files, the `LOCK` file) and three
//! OS threads: the writer (drains the append queue, encodes a group into one
//! aligned block, writes it), the force-write thread (one fdatasync for every
//! group written since the last one, then runs their callbacks in order) and the
//! preallocator (zero-fills space ahead of the writer and prepares the next file).
//!
//! Guarantees: an append's callback gets `Ok(mark)` only after an fdatasync
//! covering the record (unless `JournalSync::Off`); callbacks run in append order,
//! from the force-write thread; a failed write or fdatasync is fatal (every
//! waiter fails, later appends return `Broken`, nothing is retried).
//!
//! Never: reads ledger storage; blocks a tokio worker (`append` only takes a
//! mutex to enqueue); fsyncs per record; grows the queue past `queue_depth_max`.
//! Only the force-write thread advances the synced mark.

mod config;
mod error;
mod file;
pub mod format;
mod stats;

pub use config::{
    JOURNAL_ALIGNMENT_BYTES, JOURNAL_PAYLOAD_BYTES_MAX, JOURNAL_QUEUE_DEPTH_MAX,
    JournalBackendKind, JournalConfig, JournalSync,
};
pub use error::JournalError;
pub use format::JournalRecord;
pub use stats::{JournalStats, StageSummary};

use crate::mark::JournalMark;

/// Called once per append with the mark just past the record (durable unless
/// sync is off) or the error that lost it. Runs on the force-write thread: keep it
/// short (hand the result to a channel or a task).
pub type AppendCallback = Box<dyn FnOnce(Result<JournalMark, JournalError>) + Send + 'static>;

/// The write-ahead journal. `Send + Sync`: share it behind an `Arc`.
#[derive(Debug)]
pub struct Journal {
    _private: (),
}

impl Journal {
    /// Opens (creating if needed) the journal in `config.dir`, takes the `LOCK`,
    /// replays every record after `from` in order through `on_record` (with the
    /// mark just past each record), repairs a torn tail of the newest file
    /// (warning with file and offset) and starts the threads. Appends go to a new
    /// file. Refuses to start on corruption anywhere else.
    pub fn open<E, F>(
        config: JournalConfig,
        from: JournalMark,
        on_record: F,
    ) -> Result<Journal, JournalError>
    where
        E: std::error::Error + Send + Sync + 'static,
        F: FnMut(JournalRecord, JournalMark) -> Result<(), E>,
    {
        let _ = (config, from, on_record);
        Err(JournalError::InvalidConfig {
            reason: "not implemented yet".to_string(),
        })
    }

    /// Queues `record`; `done` runs after the fdatasync that covers it. Returns
    /// `QueueFull` (answer TOO_MANY_REQUESTS), `RecordTooLarge`, `Broken` or
    /// `ShutDown` without queueing, and then `done` is never called.
    pub fn append(
        &self,
        record: JournalRecord,
        done: impl FnOnce(Result<JournalMark, JournalError>) + Send + 'static,
    ) -> Result<(), JournalError> {
        let _ = (record, done);
        Err(JournalError::ShutDown)
    }

    /// Every record ending at or before this mark is durable (written, when sync is
    /// off). A checkpoint passes it to ledger storage, then to `delete_files_before`.
    pub fn last_synced_mark(&self) -> JournalMark {
        JournalMark::START
    }

    /// Deletes the journal files whose id is below `mark.file_id` (never the file
    /// being written); returns how many were deleted.
    pub fn delete_files_before(&self, mark: JournalMark) -> Result<usize, JournalError> {
        let _ = mark;
        Ok(0)
    }

    /// Stage latency and group size percentiles.
    pub fn stats(&self) -> JournalStats {
        JournalStats::default()
    }

    /// Writes and syncs everything queued, closes the file with an end record and
    /// joins the threads. Idempotent; later appends return `ShutDown`. `Drop` does
    /// the same.
    pub fn shutdown(&self) -> Result<(), JournalError> {
        Ok(())
    }
}
