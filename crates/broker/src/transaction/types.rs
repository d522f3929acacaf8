//! The vocabulary of transactions: [`TxnId`], [`TxnAction`], [`TxnError`]
//! (Pulsar's codes and messages) and [`TxnView`] (what the admin API shows).
//! Never: holds state.

use vela_wire::proto::ServerError;

use super::record::TxnStatus;
use crate::error::ServiceError;

/// A transaction id as Pulsar's `TxnID`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) struct TxnId {
    /// The coordinator's id.
    pub(crate) most: u64,
    /// The coordinator's sequence number.
    pub(crate) least: u64,
}

impl std::fmt::Display for TxnId {
    /// Pulsar's `TxnID.toString()`: `(most,least)`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "({},{})", self.most, self.least)
    }
}

/// What END_TXN asks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub(crate) enum TxnAction {
    Commit,
    Abort,
}

impl TxnAction {
    /// The action a COMMITTING or ABORTING transaction carries out.
    pub(super) fn of_status(status: TxnStatus) -> Option<TxnAction> {
        match status {
            TxnStatus::Committing => Some(TxnAction::Commit),
            TxnStatus::Aborting => Some(TxnAction::Abort),
            _ => None,
        }
    }

    /// The status a transaction is in while this action is carried out.
    pub(super) fn in_progress(self) -> TxnStatus {
        match self {
            TxnAction::Commit => TxnStatus::Committing,
            TxnAction::Abort => TxnStatus::Aborting,
        }
    }
}

/// Failures of transaction requests, with Pulsar's messages.
#[derive(Debug, thiserror::Error)]
pub(crate) enum TxnError {
    #[error("Transaction coordinator with id {0} not found!")]
    CoordinatorNotFound(u64),
    #[error("The transaction with this txdID `{0}`not found ")]
    NotFound(TxnId),
    #[error("Expect Txn `{id}` to be in {expected} status but it is in {actual} status")]
    InvalidStatus {
        id: TxnId,
        expected: TxnStatus,
        actual: TxnStatus,
    },
    #[error("Client ({role}) is neither the owner of the transaction {id} nor a super user")]
    NotOwner { id: TxnId, role: String },
    #[error(
        "transaction {id} registered {max} partitions and subscriptions already (the most one may)"
    )]
    TooManyOps { id: TxnId, max: usize },
    #[error("the transaction log is full for now (append queue): retry")]
    Busy,
    #[error("transaction log: {0}")]
    Log(#[from] vela_log::LogError),
    #[error("transaction sequence: {0}")]
    Meta(#[from] vela_meta::MetaError),
    #[error("transaction log is corrupt: {0}")]
    Corrupt(String),
    #[error("transaction participants did not all answer: {0}")]
    Participant(String),
}

impl From<TxnError> for ServiceError {
    fn from(error: TxnError) -> ServiceError {
        let code = match &error {
            TxnError::CoordinatorNotFound(_) => ServerError::TransactionCoordinatorNotFound,
            TxnError::NotFound(_) | TxnError::NotOwner { .. } => ServerError::TransactionNotFound,
            TxnError::InvalidStatus { .. } => ServerError::InvalidTxnStatus,
            TxnError::TooManyOps { .. } => ServerError::NotAllowedError,
            TxnError::Busy => ServerError::TooManyRequests,
            TxnError::Log(log) => return ServiceError::from(log.clone()),
            TxnError::Meta(_) => ServerError::MetadataError,
            TxnError::Corrupt(_) => ServerError::UnknownError,
            TxnError::Participant(_) => ServerError::ServiceNotReady,
        };
        ServiceError::new(code, error.to_string())
    }
}

/// A transaction as the admin API shows it.
#[derive(Debug, Clone)]
pub(crate) struct TxnView {
    pub(crate) id: TxnId,
    pub(crate) status: TxnStatus,
    pub(crate) open_unix_ms: u64,
    pub(crate) timeout_ms: u64,
    pub(crate) owner: Option<String>,
    pub(crate) produced: Vec<String>,
    pub(crate) acked: Vec<(String, Vec<String>)>,
}

/// One coordinator's counts since it opened (`/metrics`: Pulsar's
/// `pulsar_txn_*` families).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct CoordinatorStats {
    pub(crate) id: u64,
    /// Serving (its log did not fail): Pulsar's state `Ready`.
    pub(crate) ready: bool,
    /// The highest sequence number opened (Pulsar's `leastSigBits`).
    pub(crate) last_seq: u64,
    /// Every transaction at or below it ended (Pulsar's `lowWaterMark`).
    pub(crate) low_water_mark: u64,
    /// When the coordinator began opening and finished replaying its log.
    pub(crate) recover_start_unix_ms: u64,
    pub(crate) recover_end_unix_ms: u64,
    /// Transactions not yet ended.
    pub(crate) active: u64,
    pub(crate) created: u64,
    pub(crate) committed: u64,
    /// Aborted, timed-out ones included (as Pulsar counts).
    pub(crate) aborted: u64,
    pub(crate) timed_out: u64,
    /// Records made durable in its log.
    pub(crate) appended: u64,
}
