//! `JournalError`: every way the journal can fail, typed. Cloneable because one
//! failed fdatasync fails every waiter of every pending group.

use std::path::PathBuf;
use std::sync::Arc;

/// An error from the journal. I/O sources are shared (`Arc`) so the same failure
/// can be handed to every waiting append.
#[derive(Debug, Clone, thiserror::Error)]
pub enum JournalError {
    /// An I/O call failed. When it happens on the write path the journal is broken
    /// from then on (a failed fsync is never retried).
    #[error("journal I/O error: {op} {path}: {source}")]
    Io {
        /// The operation that failed (`"fdatasync"`, `"pwrite"`, ...).
        op: &'static str,
        /// File or directory it was applied to.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// Another process (or another `Journal` in this one) holds the directory lock.
    #[error("journal directory {dir} is locked by another journal (LOCK file held)")]
    Locked {
        /// The journal directory.
        dir: PathBuf,
    },
    /// A file header is not a Vela journal header of a version we read.
    #[error("journal file {path}: bad header: {reason}")]
    BadHeader {
        /// The file.
        path: PathBuf,
        /// What is wrong (bad magic, unknown version, id mismatch, bad crc).
        reason: String,
    },
    /// Corruption replay does not repair: a bad record in an older file or before
    /// the torn tail, a missing file. The bookie refuses to start.
    #[error("journal corruption in {path} at offset {offset}: {reason}")]
    Corruption {
        /// The file.
        path: PathBuf,
        /// Byte offset of the bad record (or 0 when the whole file is the issue).
        offset: u64,
        /// Why the journal refuses to go on.
        reason: String,
    },
    /// The filesystem refused to open a journal file with O_DIRECT.
    #[error("journal file {path}: O_DIRECT refused by the filesystem: {source}")]
    DirectIoUnsupported {
        /// The file.
        path: PathBuf,
        /// The OS error from open(2).
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The append queue holds `queue_depth_max` records: answer TOO_MANY_REQUESTS.
    #[error("journal queue full ({depth_max} appends waiting)")]
    QueueFull {
        /// The configured bound.
        depth_max: usize,
    },
    /// A record payload larger than `payload_bytes_max`.
    #[error(
        "journal record payload of {payload_bytes} bytes exceeds the limit of {payload_bytes_max}"
    )]
    RecordTooLarge {
        /// Payload size of the refused record.
        payload_bytes: usize,
        /// The configured bound.
        payload_bytes_max: usize,
    },
    /// An earlier write or fdatasync failed; the journal accepts nothing more.
    #[error("journal is broken by an earlier failure: {reason}")]
    Broken {
        /// The first failure.
        reason: String,
    },
    /// The journal was shut down.
    #[error("journal is shut down")]
    ShutDown,
    /// A configuration value is out of range.
    #[error("invalid journal config: {reason}")]
    InvalidConfig {
        /// Which value and why.
        reason: String,
    },
    /// The pmem backend's region is not on a DAX filesystem: mmap refused
    /// MAP_SYNC, so flushing CPU caches would not make a record durable. The
    /// bookie refuses to start unless emulation is allowed.
    #[error(
        "journal pmem region {path}: MAP_SYNC refused ({source}): the filesystem is not DAX \
         (persistent memory mounted with -o dax), so flushing CPU caches would not make a record \
         durable; put the region on a DAX filesystem, or allow emulation \
         (vela: --journal-pmem-allow-emulation; msync per group, not persistent-memory durable)"
    )]
    PmemNotDax {
        /// The region file.
        path: PathBuf,
        /// The error from mmap(2) (EOPNOTSUPP on a filesystem without DAX).
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The pmem backend cannot make records durable on this machine for
    /// another reason (no cache-flush instruction for this CPU architecture).
    #[error("journal pmem region {path}: {reason}")]
    PmemUnsupported {
        /// The region file.
        path: PathBuf,
        /// Why.
        reason: String,
    },
    /// Every slot of the pmem ring holds records ledger storage has not
    /// checkpointed past (the last free one is kept for restarts): the writer
    /// waits for a checkpoint. Surfaces only if the journal shuts down while
    /// it waits, or at open when no slot can be freed.
    #[error(
        "journal pmem region {path}: ring full ({live_slots} of {slot_count} slots hold records not yet checkpointed)"
    )]
    RingFull {
        /// The region file.
        path: PathBuf,
        /// Slots holding files.
        live_slots: usize,
        /// Slots in the ring.
        slot_count: usize,
    },
    /// The replay callback returned an error; replay stopped there.
    #[error("journal replay callback failed: {0}")]
    Replay(Arc<dyn std::error::Error + Send + Sync>),
}

impl JournalError {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        JournalError::Io {
            op,
            path: path.into(),
            source: Arc::new(source),
        }
    }
}
