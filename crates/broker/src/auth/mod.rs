//! Authentication (Pulsar's `AuthenticationService`): who a client is.
//!
//! Owns: [`AuthConfig`] (the providers, the anonymous role, superuser roles,
//! whether authorization is enforced) and turning CONNECT / AUTH_RESPONSE /
//! HTTP credentials into a [`Principal`]. What a role may then do is
//! `authorization`'s job. Providers, as Pulsar's: token (`jwt`), Basic
//! (`basic`, an htpasswd file) and TLS (the CN of the client certificate the
//! TLS listener verified, `vela_tls::x509`), any of them at once.
//!
//! Rules (Pulsar's `BinaryAuthSession.doAuthentication` and
//! `AuthenticationService.authenticateHttpRequest`):
//! - CONNECT names a method: a configured provider checks the credentials,
//!   and a refusal is final (no fallback); a method no provider has (none
//!   at all, `none`, or an unknown name) gets the anonymous role when one is
//!   configured, else is refused;
//! - HTTP names no method: each configured provider tries the request, the
//!   first that accepts it gives the role; when none does, the anonymous
//!   role, else 401.
//!
//! Refusals are `AuthenticationError` on the protocol, 401 on HTTP.
//! Never: keeps credentials beyond a connection, logs a token or password,
//! or reads the metadata store.

pub mod basic;
pub mod jwt;

use std::time::{Duration, SystemTime};

use vela_wire::proto::ServerError;

use crate::error::ServiceError;

/// `auth_method_name` of Pulsar's token plugin (CONNECT, AuthData).
pub const TOKEN_METHOD: &str = "token";
/// `auth_method_name` of Pulsar's Basic plugin.
pub const BASIC_METHOD: &str = "basic";
/// `auth_method_name` of Pulsar's TLS plugin.
pub const TLS_METHOD: &str = "tls";

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

/// Authentication settings (Pulsar's `authenticationEnabled` with its
/// `authenticationProviders`, `anonymousUserRole` and `superUserRoles`).
#[derive(Debug, Clone)]
pub struct AuthConfig {
    /// The token provider: the key tokens are verified with (HS256 secret
    /// or RS256 public key).
    pub token_key: Option<jwt::VerifyKey>,
    /// The Basic provider: the users of its htpasswd file.
    pub basic_users: Option<basic::BasicUsers>,
    /// The TLS provider: the role is the CN of the client certificate the
    /// TLS listeners verified (they need a trust file to ask for one).
    pub tls_client_certificates: bool,
    /// The role of a client whose credentials no provider takes (Pulsar's
    /// `anonymousUserRole`); `None`: such clients are refused.
    pub anonymous_role: Option<String>,
    /// Roles allowed everything (Pulsar's `superUserRoles`).
    pub superuser_roles: Vec<String>,
    /// Whether grants are checked.
    pub authorization: Authorization,
    /// How often a connection checks whether its token expired (Pulsar's
    /// `authenticationRefreshCheckSeconds`, 60 s). An expired connection is
    /// challenged once and closed at the next check if it did not answer.
    pub refresh_check_interval: Duration,
}

/// What a connection brings besides its CONNECT: the CN of the client
/// certificate its TLS listener verified, if any.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct TransportIdentity {
    /// Subject CN of the verified client certificate.
    pub(crate) certificate_cn: Option<String>,
}

impl AuthConfig {
    /// Token authentication with `token_key`, authorization enforced, no
    /// superusers, no anonymous role, Pulsar's 60 s refresh check.
    pub fn new(token_key: jwt::VerifyKey) -> AuthConfig {
        AuthConfig {
            token_key: Some(token_key),
            ..AuthConfig::without_providers()
        }
    }

    /// No provider yet (add them to the fields): authorization enforced, no
    /// superusers, no anonymous role, Pulsar's 60 s refresh check.
    pub fn without_providers() -> AuthConfig {
        AuthConfig {
            token_key: None,
            basic_users: None,
            tls_client_certificates: false,
            anonymous_role: None,
            superuser_roles: Vec::new(),
            authorization: Authorization::Enforced,
            refresh_check_interval: Duration::from_secs(60),
        }
    }

    /// The configured providers' method names (for the log).
    pub fn provider_names(&self) -> Vec<&'static str> {
        let mut names = Vec::new();
        if self.token_key.is_some() {
            names.push(TOKEN_METHOD);
        }
        if self.basic_users.is_some() {
            names.push(BASIC_METHOD);
        }
        if self.tls_client_certificates {
            names.push(TLS_METHOD);
        }
        names
    }

    /// Checks credentials sent with `method` (CONNECT's `auth_method_name`,
    /// AuthData's) at `now`, on a connection that brought `transport`.
    pub(crate) fn authenticate(
        &self,
        method: Option<&str>,
        data: &[u8],
        transport: &TransportIdentity,
        now: SystemTime,
    ) -> Result<Principal, ServiceError> {
        match method {
            Some(TOKEN_METHOD) if self.token_key.is_some() => {
                let token = std::str::from_utf8(data)
                    .map_err(|_| authentication_error("token is not UTF-8"))?;
                self.authenticate_token(token, now)
            }
            Some(BASIC_METHOD) => match &self.basic_users {
                Some(users) => users
                    .authenticate(data)
                    .map(Principal::lasting)
                    .map_err(authentication_error),
                None => self.anonymous(),
            },
            Some(TLS_METHOD) if self.tls_client_certificates => transport
                .certificate_cn
                .clone()
                .map(Principal::lasting)
                .ok_or_else(|| {
                    authentication_error("Client unable to authenticate with TLS certificate")
                }),
            _ => self.anonymous(),
        }
    }

    /// The anonymous role, or the refusal Pulsar gives without one.
    fn anonymous(&self) -> Result<Principal, ServiceError> {
        self.anonymous_role
            .clone()
            .map(Principal::lasting)
            .ok_or_else(|| {
                authentication_error("No anonymous role, and no authentication provider configured")
            })
    }

    /// Checks an HTTP request's credentials: its `Authorization` header and
    /// the client certificate of its connection, by each provider in turn;
    /// the anonymous role when none accepts them.
    pub(crate) fn authenticate_http(
        &self,
        authorization_header: Option<&str>,
        transport: &TransportIdentity,
        now: SystemTime,
    ) -> Result<Principal, ServiceError> {
        if let Some(header) = authorization_header {
            if let (Some(token), Some(_)) = (bearer(header), &self.token_key)
                && let Ok(principal) = self.authenticate_token(token, now)
            {
                return Ok(principal);
            }
            if let Some(users) = &self.basic_users
                && let Ok(role) = users.authenticate_header(header)
            {
                return Ok(Principal::lasting(role));
            }
        }
        if self.tls_client_certificates
            && let Some(cn) = &transport.certificate_cn
        {
            return Ok(Principal::lasting(cn.clone()));
        }
        self.anonymous_role
            .clone()
            .map(Principal::lasting)
            .ok_or_else(|| authentication_error("Authentication required"))
    }

    /// Checks a bare token (HTTP `Authorization: Bearer`).
    pub(crate) fn authenticate_token(
        &self,
        token: &str,
        now: SystemTime,
    ) -> Result<Principal, ServiceError> {
        let Some(key) = &self.token_key else {
            return Err(authentication_error("no token authentication provider"));
        };
        let verified = key
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

/// The token of an `Authorization: Bearer <token>` header value.
fn bearer(header: &str) -> Option<&str> {
    let (scheme, token) = header.split_once(' ')?;
    scheme
        .eq_ignore_ascii_case("bearer")
        .then(|| token.trim())
        .filter(|t| !t.is_empty())
}

/// An authenticated client.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Principal {
    /// The role (the token's subject, the Basic user, the certificate's
    /// CN, or the anonymous role).
    pub(crate) role: String,
    /// When its credentials expire, if they do.
    pub(crate) expires_at: Option<SystemTime>,
}

impl Principal {
    /// A role whose credentials do not expire.
    fn lasting(role: impl Into<String>) -> Principal {
        Principal {
            role: role.into(),
            expires_at: None,
        }
    }
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
        let none = TransportIdentity::default();
        let principal = config
            .authenticate(Some("token"), token.as_bytes(), &none, now)
            .unwrap();
        assert_eq!(principal.role, "alice");
        for method in [None, Some(""), Some("none"), Some("tls"), Some("basic")] {
            let e = config
                .authenticate(method, token.as_bytes(), &none, now)
                .unwrap_err();
            assert_eq!(e.code, ServerError::AuthenticationError);
        }
        let e = config
            .authenticate(Some("token"), b"garbage", &none, now)
            .unwrap_err();
        assert_eq!(e.code, ServerError::AuthenticationError);
    }

    #[test]
    fn anonymous_role_for_methods_no_provider_has_never_for_bad_credentials() {
        let (mut config, _) = config();
        config.anonymous_role = Some("anon".into());
        config.basic_users = Some(
            basic::BasicUsers::parse(b"alice:$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/\n").unwrap(),
        );
        config.tls_client_certificates = true;
        let now = SystemTime::now();
        let none = TransportIdentity::default();
        let with_cert = TransportIdentity {
            certificate_cn: Some("client".into()),
        };
        for method in [None, Some("none"), Some("unknown")] {
            let p = config.authenticate(method, b"", &none, now).unwrap();
            assert_eq!(p.role, "anon", "{method:?}");
        }
        let basic = config
            .authenticate(Some("basic"), b"alice:secret", &none, now)
            .unwrap();
        assert_eq!(basic.role, "alice");
        // Credentials a provider refuses are refused, not anonymous.
        for (method, data) in [("basic", &b"alice:wrong"[..]), ("token", b"garbage")] {
            let e = config
                .authenticate(Some(method), data, &none, now)
                .unwrap_err();
            assert_eq!(e.code, ServerError::AuthenticationError);
        }
        assert!(config.authenticate(Some("tls"), b"", &none, now).is_err());
        let tls = config
            .authenticate(Some("tls"), b"", &with_cert, now)
            .unwrap();
        assert_eq!(tls.role, "client");
        // HTTP: each provider in turn, then the anonymous role.
        let http = |header: Option<&str>, transport| {
            config
                .authenticate_http(header, transport, now)
                .unwrap()
                .role
        };
        let basic_header = "Basic YWxpY2U6c2VjcmV0"; // alice:secret
        assert_eq!(http(Some(basic_header), &none), "alice");
        assert_eq!(http(None, &with_cert), "client");
        assert_eq!(http(Some("Bearer bad"), &none), "anon");
        assert_eq!(http(None, &none), "anon");
        config.anonymous_role = None;
        assert!(config.authenticate_http(None, &none, now).is_err());
        assert!(config.authenticate(None, b"", &none, now).is_err());
    }
}
