//! `ClientError`: what the client's callers see.

use std::time::Duration;

use vela_wire::proto::ServerError;

/// Failures of client operations.
#[derive(Debug, Clone, thiserror::Error)]
pub enum ClientError {
    /// The service URL does not parse.
    #[error("invalid service URL {url:?}: {reason}")]
    InvalidUrl {
        /// The URL given.
        url: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// TCP connect or the CONNECT handshake failed.
    #[error("cannot connect to {addr}: {reason}")]
    Connect {
        /// `host:port` tried.
        addr: String,
        /// Why.
        reason: String,
    },
    /// The connection broke (or was closed) before the answer came.
    #[error("connection to {addr} lost: {reason}")]
    Disconnected {
        /// `host:port` of the broker.
        addr: String,
        /// Why.
        reason: String,
    },
    /// No answer within the operation's timeout.
    #[error("{operation} timed out after {timeout:?}")]
    Timeout {
        /// What was waited for.
        operation: &'static str,
        /// How long.
        timeout: Duration,
    },
    /// The broker answered with an error.
    #[error("broker error {code:?}: {message}")]
    Server {
        /// Pulsar's error code.
        code: ServerError,
        /// The broker's message.
        message: String,
    },
    /// The producer's pending queue (messages or bytes) or the client's memory
    /// limit is full and the producer was told not to wait.
    #[error("producer queue is full: {0}")]
    QueueFull(&'static str),
    /// A message larger than the broker accepts.
    #[error("message of {len_bytes} bytes is over the broker's {max_bytes}-byte limit")]
    MessageTooLarge {
        /// Size of the message.
        len_bytes: usize,
        /// The broker's limit (from CONNECTED).
        max_bytes: usize,
    },
    /// The broker sent something the protocol does not allow here.
    #[error("protocol violation: {0}")]
    Protocol(String),
    /// A lookup kept redirecting.
    #[error("lookup of {0} redirected too many times")]
    TooManyRedirects(String),
    /// The producer, consumer or client is closed.
    #[error("closed")]
    Closed,
    /// Too many requests in flight on one connection.
    #[error("too many requests in flight on the connection to {0}")]
    TooManyRequests(String),
}

impl ClientError {
    /// Whether retrying on a new connection may succeed (the operation is
    /// retried by the producer's and consumer's reconnect loops).
    pub fn is_retriable(&self) -> bool {
        match self {
            ClientError::Connect { .. }
            | ClientError::Disconnected { .. }
            | ClientError::Timeout { .. }
            | ClientError::TooManyRequests(_)
            | ClientError::TooManyRedirects(_) => true,
            ClientError::Server { code, .. } => matches!(
                code,
                ServerError::ServiceNotReady
                    | ServerError::TooManyRequests
                    | ServerError::PersistenceError
                    | ServerError::MetadataError
                    | ServerError::UnknownError
                    | ServerError::ProducerBusy
                    | ServerError::ConsumerBusy
            ),
            _ => false,
        }
    }
}
