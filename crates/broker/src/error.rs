//! Errors: the public [`BrokerError`], the [`ServiceError`] that becomes an
//! ERROR (or SEND_ERROR) frame with a Pulsar `ServerError` code, and the
//! [`AdminError`] of metadata operations (tenants, namespaces, topics, cursor
//! admin), mapped to HTTP statuses by `http` and to protocol codes here.
//!
//! Never: decides whether a connection closes; the connection does.

use vela_wire::proto::ServerError;

use crate::topic_name::InvalidName;

/// Failures of the broker's public API.
#[derive(Debug, thiserror::Error)]
pub enum BrokerError {
    /// Binding or accepting on the listener failed.
    #[error("listener: {0}")]
    Io(#[from] std::io::Error),
    /// Metadata operations at startup or from the admin API failed.
    #[error("admin: {0}")]
    Admin(#[from] AdminError),
    /// A topic name given to the API is invalid.
    #[error(transparent)]
    InvalidName(#[from] InvalidName),
    /// A request on a topic failed (same codes as the protocol's errors).
    #[error(transparent)]
    Service(#[from] ServiceError),
    /// Closing a topic's log failed at shutdown.
    #[error("log: {0}")]
    Log(#[from] vela_log::LogError),
    /// Joining the cluster failed (registration, session).
    #[error("cluster: {0}")]
    Cluster(String),
    /// The TLS certificate or key cannot be used.
    #[error("tls: {0}")]
    Tls(#[from] crate::tls::TlsError),
    /// The configuration is inconsistent (the message names the field).
    #[error("config: {0}")]
    Config(String),
}

/// Failures of admin operations.
#[derive(Debug, thiserror::Error)]
pub enum AdminError {
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Meta(#[from] vela_meta::MetaError),
    /// A stored record does not parse.
    #[error("corrupt metadata at {key}: {reason}")]
    Corrupt {
        /// Key of the record.
        key: String,
        /// Parser message.
        reason: String,
    },
    /// The thing to create exists already.
    #[error("{0} already exists")]
    Exists(String),
    /// The tenant, namespace, topic or subscription is absent: the whole
    /// message, as the caller words it (Pulsar's texts where it has one).
    #[error("{0}")]
    NotFound(String),
    /// A request argument breaks a policy rule (Pulsar answers 412).
    #[error("invalid: {0}")]
    Invalid(String),
    /// A request is malformed (Pulsar answers 400).
    #[error("{0}")]
    BadRequest(String),
    /// Clients are attached and the operation was not forced (412).
    #[error("{0}")]
    Busy(String),
    /// The operation does not apply to this kind of object (405).
    #[error("{0}")]
    NotAllowed(String),
    /// A request names something it may not use, e.g. a cluster the
    /// tenant is not allowed on (Pulsar answers 403 with this message).
    #[error("{0}")]
    Forbidden(String),
    /// A precondition fails; Pulsar's exact 412 message, unprefixed.
    #[error("{0}")]
    Precondition(String),
    /// The operation on a topic failed.
    #[error(transparent)]
    Service(#[from] ServiceError),
}

/// An error answered to a client request: the protocol code and a message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{code:?}: {message}")]
pub struct ServiceError {
    /// Pulsar's ServerError code.
    pub code: ServerError,
    /// Human-readable message (sent in the required `message` field).
    pub message: String,
}

impl ServiceError {
    /// Builds an error.
    pub fn new(code: ServerError, message: impl Into<String>) -> ServiceError {
        ServiceError {
            code,
            message: message.into(),
        }
    }
}

/// What a producer of a terminated topic is answered (Pulsar's
/// `TopicTerminatedException` message).
pub(crate) fn topic_terminated() -> ServiceError {
    ServiceError::new(
        ServerError::TopicTerminatedError,
        "Topic was already terminated",
    )
}

impl From<InvalidName> for ServiceError {
    fn from(e: InvalidName) -> Self {
        ServiceError::new(ServerError::InvalidTopicName, e.to_string())
    }
}

impl From<AdminError> for ServiceError {
    fn from(e: AdminError) -> Self {
        let code = match &e {
            AdminError::NotFound(_) => ServerError::TopicNotFound,
            AdminError::Invalid(_) | AdminError::BadRequest(_) => ServerError::InvalidTopicName,
            AdminError::Exists(_)
            | AdminError::NotAllowed(_)
            | AdminError::Forbidden(_)
            | AdminError::Precondition(_) => ServerError::NotAllowedError,
            AdminError::Busy(_) => ServerError::ConsumerBusy,
            AdminError::Meta(_) | AdminError::Corrupt { .. } => ServerError::MetadataError,
            AdminError::Service(service) => return service.clone(),
        };
        ServiceError::new(code, e.to_string())
    }
}

impl From<vela_log::LogError> for ServiceError {
    fn from(e: vela_log::LogError) -> Self {
        let code = match &e {
            vela_log::LogError::Metadata(_) => ServerError::MetadataError,
            vela_log::LogError::Fenced(_) | vela_log::LogError::Closed(_) => {
                ServerError::ServiceNotReady
            }
            vela_log::LogError::Overloaded(_) => ServerError::TooManyRequests,
            vela_log::LogError::Terminated(_) => return topic_terminated(),
            _ => ServerError::PersistenceError,
        };
        ServiceError::new(code, e.to_string())
    }
}
