//! Authentication (Pulsar's token method): who a client is.
//!
//! Owns: [`AuthConfig`] (the key tokens are checked with, superuser roles,
//! whether authorization is enforced) and turning CONNECT / AUTH_RESPONSE /
//! `Authorization: Bearer` credentials into a [`Principal`]. What a role may
//! then do is `authorization`'s job.
//!
//! Refusals are `AuthenticationError` on the protocol, 401 on HTTP.
//! Never: keeps credentials beyond a connection, logs a token, or reads the
//! metadata store.

pub mod jwt;

use std::time::{Duration, SystemTime};

use vela_wire::proto::ServerError;

use crate::error::ServiceError;

/// `auth_method_name` of Pulsar's token plugin (CONNECT, AuthData).
pub const TOKEN_METHOD: &str = "token";

/// `auth_data` of the AUTH_CHALLENGE asking a client for fresh credentials
/// (the Java broker's `AuthData.REFRESH_AUTH_DATA`).
pub const REFRESH_AUTH_DATA: &[u8] = b"refresh";

/// Whether authenticated roles are checked against grants.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Authorization {
    /// Superusers, tenant admins and namespace grants decide (Pulsar's
    /// `authorizationEnabled=true`).
    Enforced,
    /// Any authenticated role may do anything (authentication only).
    Off,
}

/// Token authentication settings (Pulsar's `authenticationEnabled` with
/// `AuthenticationProviderToken`).
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The key tokens are verified with (HS256 secret or RS256 public key).
    pub token_key: jwt::VerifyKey,
    /// Roles allowed everything (Pulsar's `superUserRoles`).
    pub superuser_roles: Vec<String>,
    /// Whether grants are checked.
    pub authorization: Authorization,
    /// How often a connection checks whether its token expired (Pulsar's
    /// `authenticationRefreshCheckSeconds`, 60 s). An expired connection is
    /// challenged once and closed at the next check if it did not answer.
    pub refresh_check_interval: Duration,
}

impl AuthConfig {
    /// Token authentication with `token_key`, authorization enforced, no
    /// superusers, Pulsar's 60 s refresh check.
    pub fn new(token_key: jwt::VerifyKey) -> AuthConfig {
        AuthConfig {
            token_key,
            superuser_roles: Vec::new(),
            authorization: Authorization::Enforced,
            refresh_check_interval: Duration::from_secs(60),
        }
    }

    /// Checks credentials sent with `method` (CONNECT's `auth_method_name`,
    /// AuthData's) at `now`. Only the token method is known.
    pub(crate) fn authenticate(
        &self,
        method: Option<&str>,
        data: &[u8],
        now: SystemTime,
    ) -> Result<Principal, ServiceError> {
        match method {
            Some(TOKEN_METHOD) => {}
            None | Some("") | Some("none") => {
                return Err(authentication_error(
                    "authentication required: no credentials",
                ));
            }
            Some(other) => {
                return Err(authentication_error(format!(
                    "unsupported authentication method {:?} (this broker knows \"token\")",
                    other.chars().take(64).collect::<String>()
                )));
            }
        }
        let token =
            std::str::from_utf8(data).map_err(|_| authentication_error("token is not UTF-8"))?;
        self.authenticate_token(token, now)
    }

    /// Checks a bare token (HTTP `Authorization: Bearer`).
    pub(crate) fn authenticate_token(
        &self,
        token: &str,
        now: SystemTime,
    ) -> Result<Principal, ServiceError> {
        let verified = self
            .token_key
            .verify(token, now)
            .map_err(|e| authentication_error(format!("failed to authenticate token: {e}")))?;
        Ok(Principal {
            role: verified.subject,
            expires_at: verified.expires_at,
        })
    }

    /// True if `role` is a superuser.
    pub(crate) fn is_superuser(&self, role: &str) -> bool {
        self.superuser_roles.iter().any(|r| r == role)
    }
}

/// An authenticated client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    /// The role (the token's subject).
    pub(crate) role: String,
    /// When its credentials expire, if they do.
    pub(crate) expires_at: Option<SystemTime>,
}

fn authentication_error(message: impl Into<String>) -> ServiceError {
    ServiceError::new(ServerError::AuthenticationError, message)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn config() -> (AuthConfig, jwt::SigningKey) {
        let secret = jwt::new_secret().unwrap();
        let mut config = AuthConfig::new(jwt::VerifyKey::secret(&secret).unwrap());
        config.superuser_roles = vec!["root".into()];
        (config, jwt::SigningKey::secret(&secret).unwrap())
    }

    #[test]
    fn connect_credentials() {
        let (config, signer) = config();
        let now = SystemTime::now();
        let token = signer.sign("alice", None).unwrap();
        let principal = config
            .authenticate(Some("token"), token.as_bytes(), now)
            .unwrap();
        assert_eq!(principal.role, "alice");
        for method in [None, Some(""), Some("none"), Some("tls")] {
            let e = config
                .authenticate(method, token.as_bytes(), now)
                .unwrap_err();
            assert_eq!(e.code, ServerError::AuthenticationError);
        }
        let e = config
            .authenticate(Some("token"), b"garbage", now)
            .unwrap_err();
        assert_eq!(e.code, ServerError::AuthenticationError);
    }
}
