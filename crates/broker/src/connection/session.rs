//! A connection's session: who the client is and how to answer it. The
//! handshake (CONNECT → CONNECTED, protocol version, client version), token
//! authentication at CONNECT and its refresh (AUTH_CHALLENGE /
//! AUTH_RESPONSE), the authorization check every handler runs before acting
//! on a namespace, and the outbound queue every answer goes through.
//!
//! Owns: [`Session`] (identity, negotiated version, credentials, the
//! outbound and event senders the producers and consumers of this connection
//! are given) and [`Close`], the reason a connection ends.
//! Never: holds producers or consumers (`producer`, `consumer`), or writes to
//! the socket (the `writer` task does, from the outbound queue).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::SystemTime;

use bytes::Bytes;
use tokio::sync::mpsc;
use vela_wire::proto::{self, BaseCommand, ServerError, base_command::Type};

use crate::auth::{self, Principal, TransportIdentity};
use crate::authorization::{self, TopicAction};
use crate::codec::{self, Outbound};
use crate::config::{PROTOCOL_VERSION_MAX, SERVER_VERSION};
use crate::error::ServiceError;
use crate::service::Service;
use crate::subscription::ConnEvent;
use crate::topic_name::NamespaceName;

/// Longest producer, subscription and consumer name kept (bytes). Names are
/// map keys, cursor names and stats fields; Pulsar sets no limit, but real
/// names are short and a bound keeps one client from pinning megabytes per
/// name. Longer producer/subscription names are refused (NotAllowedError);
/// consumer names are truncated.
pub(super) const NAME_BYTES_MAX: usize = 1024;

/// Key-values a PRODUCER or SUBSCRIBE may carry as `metadata` (shown in
/// topic stats, kept while the producer or consumer lives), each key and
/// value at most `NAME_BYTES_MAX`. Past either: the command is refused.
pub(super) const CLIENT_METADATA_ENTRIES_MAX: usize = 64;

/// A PRODUCER's or SUBSCRIBE's `metadata`, within the bounds above.
pub(super) fn client_metadata(
    metadata: &[vela_wire::proto::KeyValue],
) -> Result<std::collections::BTreeMap<String, String>, crate::error::ServiceError> {
    if metadata.len() > CLIENT_METADATA_ENTRIES_MAX
        || metadata
            .iter()
            .any(|kv| kv.key.len() > NAME_BYTES_MAX || kv.value.len() > NAME_BYTES_MAX)
    {
        return Err(crate::error::ServiceError::new(
            vela_wire::proto::ServerError::NotAllowedError,
            format!(
                "metadata holds at most CLIENT_METADATA_ENTRIES_MAX \
                 ({CLIENT_METADATA_ENTRIES_MAX}) key-values of at most {NAME_BYTES_MAX} bytes"
            ),
        ));
    }
    Ok(metadata
        .iter()
        .map(|kv| (kv.key.clone(), kv.value.clone()))
        .collect())
}

/// Why a connection closes (for the log line).
#[derive(Debug)]
pub(super) struct Close(pub(super) String);

/// A command arrived without the sub-message its type requires.
pub(super) fn missing(kind: Type) -> Close {
    Close(format!("{kind:?} without its sub-message"))
}

/// The body a command of type `kind` must carry.
pub(super) fn required<T>(body: Option<Box<T>>, kind: Type) -> Result<T, Close> {
    body.map(|b| *b).ok_or_else(|| missing(kind))
}

/// Authentication state of a connection (empty when auth is off).
#[derive(Debug, Default)]
struct ConnAuth {
    /// What the transport proved (the TLS client certificate's CN).
    transport: TransportIdentity,
    /// Who the client is, after CONNECT.
    principal: Option<Principal>,
    /// The client said it answers AUTH_CHALLENGE (FeatureFlags).
    supports_refresh: bool,
    /// An AUTH_CHALLENGE went out and no valid AUTH_RESPONSE came back yet.
    challenge_pending: bool,
}

/// Identity, handshake and credentials of one connection, and its outbound
/// queue.
#[derive(Debug)]
pub(super) struct Session {
    pub(super) service: Arc<Service>,
    /// Connection id (unique in this broker; producers and consumers are
    /// keyed by it in topics and subscriptions).
    pub(super) id: u64,
    pub(super) peer: SocketAddr,
    /// `peer` as text, one copy shared by the connection's producers and
    /// consumers (their stats show it).
    pub(super) address: Arc<str>,
    /// Frames for the writer task.
    pub(super) out: mpsc::Sender<Outbound>,
    /// Where topics and subscriptions tell this connection that they closed
    /// one of its producers or consumers.
    pub(super) events_tx: mpsc::Sender<ConnEvent>,
    /// CONNECT was answered; every other command needs it.
    pub(super) connected: bool,
    pub(super) protocol_version: i32,
    /// CONNECT's client version, shared as `address` is.
    pub(super) client_version: Arc<str>,
    auth: ConnAuth,
}

impl Session {
    pub(super) fn new(
        service: Arc<Service>,
        id: u64,
        peer: SocketAddr,
        out: mpsc::Sender<Outbound>,
        events_tx: mpsc::Sender<ConnEvent>,
        transport: TransportIdentity,
    ) -> Session {
        Session {
            service,
            id,
            peer,
            address: Arc::from(peer.to_string()),
            out,
            events_tx,
            connected: false,
            protocol_version: 0,
            client_version: Arc::from(""),
            auth: ConnAuth {
                transport,
                ..ConnAuth::default()
            },
        }
    }

    pub(super) async fn send(&self, command: impl Into<BaseCommand>) -> Result<(), Close> {
        self.out
            .send(codec::encode_command(command))
            .await
            .map_err(|_| Close("writer gone".into()))
    }

    pub(super) async fn send_error(
        &self,
        request_id: u64,
        error: ServiceError,
    ) -> Result<(), Close> {
        tracing::debug!(conn = self.id, request_id, error = %error, "request failed");
        self.send(proto::CommandError {
            request_id,
            error: error.code as i32,
            message: error.message,
        })
        .await
    }

    pub(super) async fn send_success(&self, request_id: u64) -> Result<(), Close> {
        self.send(proto::CommandSuccess {
            request_id,
            schema: None,
        })
        .await
    }

    pub(super) async fn on_connect(
        &mut self,
        body: Option<proto::CommandConnect>,
    ) -> Result<(), Close> {
        let Some(connect) = body else {
            return Err(missing(Type::Connect));
        };
        if self.connected {
            return Err(Close("second CONNECT".into()));
        }
        self.protocol_version = connect
            .protocol_version
            .unwrap_or(0)
            .clamp(0, PROTOCOL_VERSION_MAX);
        self.client_version =
            Arc::from(connect.client_version.chars().take(128).collect::<String>());
        if let Some(config) = &self.service.config.auth {
            let data = connect.auth_data.as_deref().unwrap_or_default();
            match config.authenticate(
                connect.auth_method_name.as_deref(),
                data,
                &self.auth.transport,
                SystemTime::now(),
            ) {
                Ok(principal) => self.auth.principal = Some(principal),
                Err(e) => return Err(self.refuse_credentials(e).await),
            }
            self.auth.supports_refresh = connect
                .feature_flags
                .as_ref()
                .and_then(|f| f.supports_auth_refresh)
                .unwrap_or(false);
        }
        self.connected = true;
        tracing::info!(
            conn = self.id,
            peer = %self.peer,
            client = %self.client_version,
            protocol_version = self.protocol_version,
            role = self.auth.principal.as_ref().map(|p| p.role.as_str()),
            "connected"
        );
        self.send(proto::CommandConnected {
            server_version: SERVER_VERSION.to_string(),
            protocol_version: Some(self.protocol_version),
            max_message_size: Some(self.service.config.max_message_size_bytes as i32),
            feature_flags: Some(proto::FeatureFlags {
                supports_get_partitioned_metadata_without_auto_creation: Some(true),
                supports_topic_watchers: Some(true),
                ..proto::FeatureFlags::default()
            }),
        })
        .await
    }

    /// Answers bad credentials as the Java broker does
    /// (`ServerCnx.authenticationFailed`): ERROR with request id −1
    /// (u64::MAX), AuthenticationError and "Failed to authenticate" (the
    /// reason goes to the log only); the caller closes. Clients see it as
    /// Pulsar's make them: the Go client reports the ERROR; the C++ client
    /// (and the Python one over it) takes any answer to CONNECT other than
    /// CONNECTED as a disconnect (`ClientConnection::handleIncomingCommand`)
    /// and reports ConnectError, or retries its lookup into a Timeout.
    async fn refuse_credentials(&self, error: ServiceError) -> Close {
        tracing::info!(conn = self.id, peer = %self.peer, error = %error.message, "authentication failed");
        let _ = self
            .send(proto::CommandError {
                request_id: u64::MAX,
                error: ServerError::AuthenticationError as i32,
                message: "Failed to authenticate".to_string(),
            })
            .await;
        Close(format!("authentication failed: {}", error.message))
    }

    /// The refresh check: an expired token is challenged once; still
    /// expired at the next check (no valid answer) closes the connection.
    pub(super) async fn check_credentials(&mut self) -> Result<(), Close> {
        let expired = self
            .auth
            .principal
            .as_ref()
            .and_then(|p| p.expires_at)
            .is_some_and(|at| at <= SystemTime::now());
        if !expired {
            return Ok(());
        }
        if self.auth.challenge_pending {
            return Err(Close("token expired and not refreshed".into()));
        }
        if !self.auth.supports_refresh {
            return Err(Close(
                "token expired; the client does not support refreshing it".into(),
            ));
        }
        self.auth.challenge_pending = true;
        tracing::debug!(conn = self.id, "token expired: AUTH_CHALLENGE");
        self.send(proto::CommandAuthChallenge {
            server_version: Some(SERVER_VERSION.to_string()),
            challenge: Some(proto::AuthData {
                auth_method_name: Some(auth::TOKEN_METHOD.to_string()),
                auth_data: Some(Bytes::from_static(auth::REFRESH_AUTH_DATA)),
            }),
            protocol_version: Some(self.protocol_version),
        })
        .await
    }

    /// A fresh token in answer to AUTH_CHALLENGE. The role may not change
    /// (as the Java broker insists); a bad token closes the connection.
    pub(super) async fn on_auth_response(
        &mut self,
        body: Option<proto::CommandAuthResponse>,
    ) -> Result<(), Close> {
        let Some(config) = &self.service.config.auth else {
            return Ok(());
        };
        let response = body.and_then(|b| b.response).unwrap_or_default();
        let data = response.auth_data.as_deref().unwrap_or_default();
        let fresh = match config.authenticate(
            response.auth_method_name.as_deref(),
            data,
            &self.auth.transport,
            SystemTime::now(),
        ) {
            Ok(fresh) => fresh,
            Err(e) => return Err(self.refuse_credentials(e).await),
        };
        let role = self.auth.principal.as_ref().map(|p| p.role.as_str());
        if role != Some(fresh.role.as_str()) {
            return Err(Close(format!(
                "AUTH_RESPONSE for role {} on a connection of role {}",
                fresh.role,
                role.unwrap_or("-")
            )));
        }
        tracing::debug!(conn = self.id, role = %fresh.role, "credentials refreshed");
        self.auth.principal = Some(fresh);
        self.auth.challenge_pending = false;
        Ok(())
    }

    /// Whether REACHED_END_OF_TOPIC may be sent: the command exists since
    /// protocol v9, but the C++ client (and Python on it) and the Go client
    /// have no case for it and close the connection when it comes (their
    /// dispatch switches' default branch), so they are never sent it.
    pub(super) fn handles_end_of_topic(&self) -> bool {
        self.protocol_version >= 9
            && !self.client_version.starts_with("Pulsar-CPP-")
            && !self.client_version.starts_with("Pulsar-Go-")
    }

    /// Checks that this connection's role may do `action` on `ns`'s topics
    /// (always fine when auth or authorization is off).
    pub(super) async fn authorize(
        &self,
        ns: &NamespaceName,
        action: TopicAction,
    ) -> Result<(), ServiceError> {
        authorize_role(&self.service, self.role(), ns, action).await
    }

    /// The role this connection authenticated as (none when auth is off).
    pub(super) fn role(&self) -> Option<&str> {
        self.auth.principal.as_ref().map(|p| p.role.as_str())
    }
}

/// [`Session::authorize`] for `role` (from [`Session::role`]), for a task
/// that does not hold the session.
pub(super) async fn authorize_role(
    service: &Service,
    role: Option<&str>,
    ns: &NamespaceName,
    action: TopicAction,
) -> Result<(), ServiceError> {
    let (Some(config), Some(role)) = (&service.config.auth, role) else {
        return Ok(());
    };
    authorization::authorize_namespace(config, &service.admin, role, ns, action).await
}
