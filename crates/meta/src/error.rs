//! The crate's one error type.
//!
//! Owns: every way a metadata operation can fail, as a typed value. Outcomes the
//! caller acts on (`BadVersion`, `Exists`, `NotFound`, `SessionExpired`) are their
//! own variants; backend failures carry the backend's message as text so that no
//! backend type leaks into the public API.

use crate::session::SessionId;
use crate::store::{ExpectedVersion, Version};

/// Why a metadata operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// The key is not a valid path (see the key model in the crate docs).
    #[error("bad key {key:?}: {reason}")]
    BadKey {
        /// The key as given (truncated to 128 bytes).
        key: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The key is longer than [`crate::KEY_BYTES_MAX`].
    #[error("key is {key_bytes} bytes, the limit is {key_bytes_max}")]
    KeyTooLong {
        /// Length of the rejected key.
        key_bytes: usize,
        /// The limit.
        key_bytes_max: usize,
    },
    /// The value is longer than [`crate::VALUE_BYTES_MAX`].
    #[error("value for {key:?} is {value_bytes} bytes, the limit is {value_bytes_max}")]
    ValueTooLarge {
        /// The key the value was for.
        key: String,
        /// Length of the rejected value.
        value_bytes: usize,
        /// The limit.
        value_bytes_max: usize,
    },
    /// A conditional write expected one version and found another.
    #[error("bad version for {key:?}: expected {expected:?}, found {actual}")]
    BadVersion {
        /// The key.
        key: String,
        /// What the caller expected.
        expected: ExpectedVersion,
        /// The version the key has now.
        actual: Version,
    },
    /// A create (`ExpectedVersion::Absent`) found the key already present.
    #[error("key {key:?} already exists (version {actual})")]
    Exists {
        /// The key.
        key: String,
        /// The version the key has now.
        actual: Version,
    },
    /// The operation needs the key to exist and it does not.
    #[error("key {key:?} not found")]
    NotFound {
        /// The key.
        key: String,
    },
    /// An argument combination that has no meaning (e.g. delete expecting `Absent`).
    #[error("invalid argument: {reason}")]
    InvalidArgument {
        /// What is wrong.
        reason: &'static str,
    },
    /// The session has expired or was closed; its ephemeral keys are gone.
    #[error("session {session} has expired or was closed")]
    SessionExpired {
        /// The session.
        session: SessionId,
    },
    /// The session was created by another store instance.
    #[error("session {session} belongs to another metadata store")]
    ForeignSession {
        /// The session.
        session: SessionId,
    },
    /// A listing would exceed [`crate::CHILDREN_COUNT_MAX`].
    #[error("{parent:?} has more than {children_count_max} children")]
    TooManyChildren {
        /// The parent path.
        parent: String,
        /// The limit.
        children_count_max: usize,
    },
    /// A bounded in-process table (watchers, sessions, ephemeral keys) is full.
    #[error("too many {what}: the limit is {limit}")]
    LimitReached {
        /// Which table.
        what: &'static str,
        /// Its limit.
        limit: usize,
    },
    /// A CAS loop gave up after too many conflicting writers.
    #[error("gave up on {key:?} after {attempts} conflicting CAS attempts")]
    Contention {
        /// The contended key.
        key: String,
        /// Attempts made.
        attempts: u32,
    },
    /// An id counter cannot go further without overflowing `u64`.
    #[error("id counter {key:?} is exhausted")]
    IdsExhausted {
        /// The counter key.
        key: String,
    },
    /// The store URL cannot be used.
    #[error("bad metadata store url {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },
    /// Another process (or another store in this process) has the database open.
    #[error("metadata database {path:?} is already open by another store")]
    AlreadyOpen {
        /// The database file.
        path: String,
    },
    /// A stored record (ours or a helper's encoding) does not decode.
    #[error("corrupt record at {key:?}: {reason}")]
    Corruption {
        /// The key or file holding the record.
        key: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The backend cannot be reached now (connection lost, timeout). For a write
    /// the outcome is unknown: it may or may not have been applied.
    #[error("metadata backend unavailable during {op}: {detail}")]
    Unavailable {
        /// The operation.
        op: &'static str,
        /// The backend's message.
        detail: String,
    },
    /// The backend failed in a way retrying will not fix (I/O error, failed
    /// fsync, protocol error). A local store that hit this refuses further writes.
    #[error("metadata backend failed during {op}: {detail}")]
    Backend {
        /// The operation.
        op: &'static str,
        /// The backend's message.
        detail: String,
    },
}

impl MetaError {
    /// True when a retry of the same call may succeed later (`Unavailable`).
    pub fn is_transient(&self) -> bool {
        matches!(self, MetaError::Unavailable { .. })
    }
}
