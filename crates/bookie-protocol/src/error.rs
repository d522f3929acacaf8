//! `BookieError`: what one request to one bookie can end in, whichever way the
//! request went (TCP, TLS, or a call into a bookie in the same process).
//!
//! Owns: the error type and the one mapping from a bookie's `Status` to it
//! (`BookieError::from_status`). Every transport answers with this type, so the
//! ledger client sees the same outcome for the same bookie answer however it
//! reached the bookie.
//! Never: decides what to do about an error (retry, replace the bookie, fail):
//! that is the ledger client's job.

use crate::entry::{ENTRY_BYTES_MAX, EntryError};
use crate::frame::{PROTOCOL_VERSION, Status};

/// Why a request to a bookie failed. The first eight are the bookie's own
/// answers (its non-OK status codes); the rest are decided on this side.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BookieError {
    /// NO_SUCH_ENTRY: the bookie knows the ledger but not this entry.
    #[error("no such entry")]
    NoSuchEntry,
    /// NO_SUCH_LEDGER: the bookie has nothing of this ledger.
    #[error("no such ledger")]
    NoSuchLedger,
    /// FENCED: a recovery has started on the ledger; normal adds are refused
    /// (a normal add's outcome is unknown).
    #[error("ledger is fenced on this bookie")]
    Fenced,
    /// BAD_REQUEST: the bookie found the request invalid (a bug on one side).
    #[error("bookie rejected the request as malformed")]
    BadRequest,
    /// TOO_MANY_REQUESTS: the bookie is overloaded (its journal queue is full,
    /// or its write cache stayed full for `ADD_ROOM_WAIT_MAX`); retry later.
    #[error("bookie is overloaded")]
    TooManyRequests,
    /// READ_ONLY: the bookie cannot write now (its disk is almost full, or a
    /// journal or storage write failed there). Writers replace it; reads work.
    #[error("bookie is read-only (disk full or failing)")]
    ReadOnly,
    /// IO_ERROR: the bookie failed to read or write its disk.
    #[error("bookie I/O error")]
    IoError,
    /// BAD_VERSION: the bookie does not speak our protocol version.
    #[error("bookie does not speak protocol version {PROTOCOL_VERSION}")]
    BadVersion,
    /// No answer within the request timeout (the outcome is unknown).
    #[error("request timed out")]
    Timeout,
    /// The way to the bookie broke before the answer (could not connect, the
    /// connection closed or carried bytes we cannot parse, the in-process
    /// bookie dropped the request): the outcome is unknown.
    #[error("connection to bookie lost: {0}")]
    ConnectionLost(String),
    /// The entry read back fails its end-to-end check (CRC32C, ids).
    #[error("entry read back is corrupt: {0}")]
    CorruptEntry(#[from] EntryError),
    /// An entry over `ENTRY_BYTES_MAX` was given to `add`; nothing was sent.
    #[error("entry of {len_bytes} bytes is over the {ENTRY_BYTES_MAX}-byte limit")]
    EntryTooLarge {
        /// Its length.
        len_bytes: usize,
    },
    /// The bookie is not in the registry, has no usable address, or is not
    /// one of the bookies in this process.
    #[error("unknown bookie {0}")]
    UnknownBookie(String),
}

impl BookieError {
    /// The error a bookie's non-OK `status` means. The one mapping from the
    /// protocol's status codes, used by every transport.
    pub fn from_status(status: Status) -> BookieError {
        match status {
            Status::NoSuchEntry => BookieError::NoSuchEntry,
            Status::NoSuchLedger => BookieError::NoSuchLedger,
            Status::Fenced => BookieError::Fenced,
            Status::BadRequest => BookieError::BadRequest,
            Status::TooManyRequests => BookieError::TooManyRequests,
            Status::ReadOnly => BookieError::ReadOnly,
            Status::BadVersion => BookieError::BadVersion,
            Status::IoError => BookieError::IoError,
            // OK is not a failure; a caller passing it has a bug. Treated as
            // the protocol violation it would be on the wire.
            Status::Ok => {
                debug_assert!(false, "BookieError::from_status(Ok)");
                BookieError::IoError
            }
        }
    }

    /// Whether the bookie positively says it does not hold the entry (as opposed
    /// to an unknown outcome). Only these answers may prove an entry missing.
    pub fn is_no_entry(&self) -> bool {
        matches!(self, BookieError::NoSuchEntry | BookieError::NoSuchLedger)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_failure_status_maps_to_its_own_error() {
        let failures = [
            (Status::NoSuchEntry, BookieError::NoSuchEntry),
            (Status::NoSuchLedger, BookieError::NoSuchLedger),
            (Status::Fenced, BookieError::Fenced),
            (Status::BadRequest, BookieError::BadRequest),
            (Status::TooManyRequests, BookieError::TooManyRequests),
            (Status::ReadOnly, BookieError::ReadOnly),
            (Status::IoError, BookieError::IoError),
            (Status::BadVersion, BookieError::BadVersion),
        ];
        for (status, error) in failures {
            assert_eq!(BookieError::from_status(status), error, "{status:?}");
        }
        assert!(BookieError::NoSuchLedger.is_no_entry());
        assert!(!BookieError::Timeout.is_no_entry());
    }
}
