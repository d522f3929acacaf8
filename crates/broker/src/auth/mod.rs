//! Authentication (Pulsar's token method) and authorization (superusers,
//! tenant admins, per-namespace produce/consume grants).
//!
//! Owns: [`AuthConfig`] (the key tokens are checked with, superuser roles,
//! whether authorization is enforced), turning CONNECT / AUTH_RESPONSE /
//! `Authorization: Bearer` credentials into a [`Principal`], and the
//! authorization rules shared by the protocol and the admin API:
//! - a superuser may do anything;
//! - a tenant's admin (`TenantInfo::admin_roles`) may administer the tenant
//!   and its namespaces and topics, and produce and consume on them;
//! - any other role may produce or consume on a namespace's topics when the
//!   namespace grants it that action (`NamespacePolicies::permissions`);
//!   lookups, partitioned metadata and schema reads need either grant.
//!
//! Refusals are `AuthenticationError` (who are you?) or `AuthorizationError`
//! (not allowed) on the protocol, 401 and 403 on HTTP.
//! Never: keeps credentials beyond a connection, or logs a token.

pub mod jwt;

use std::time::{Duration, SystemTime};

use vela_wire::proto::ServerError;

use crate::admin::{Admin, AdminError, AuthAction};
use crate::error::ServiceError;
use crate::topic_name::NamespaceName;

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

    /// Whether `role` may administer `tenant` (superuser or tenant admin).
    /// Always true with authorization off.
    pub(crate) async fn may_administer(
        &self,
        admin: &Admin,
        role: &str,
        tenant: &str,
    ) -> Result<bool, AdminError> {
        if self.authorization == Authorization::Off || self.is_superuser(role) {
            return Ok(true);
        }
        Ok(admin
            .tenant_info(tenant)
            .await?
            .is_some_and(|info| info.admin_roles.iter().any(|r| r == role)))
    }

    /// Whether `role` may do `action` on the topics of `ns`.
    pub(crate) async fn may_use_namespace(
        &self,
        admin: &Admin,
        role: &str,
        ns: &NamespaceName,
        action: TopicAction,
    ) -> Result<bool, AdminError> {
        if self.may_administer(admin, role, &ns.tenant).await? {
            return Ok(true);
        }
        let Some(policies) = admin.namespace_policies(ns).await? else {
            return Ok(false);
        };
        let Some(granted) = policies.permissions.get(role) else {
            return Ok(false);
        };
        Ok(match action {
            TopicAction::Produce => granted.contains(&AuthAction::Produce),
            TopicAction::Consume => granted.contains(&AuthAction::Consume),
            TopicAction::Lookup => {
                granted.contains(&AuthAction::Produce) || granted.contains(&AuthAction::Consume)
            }
        })
    }

    /// [`Self::may_use_namespace`] as a protocol answer: `AuthorizationError`
    /// when refused.
    pub(crate) async fn authorize_namespace(
        &self,
        admin: &Admin,
        role: &str,
        ns: &NamespaceName,
        action: TopicAction,
    ) -> Result<(), ServiceError> {
        if self.may_use_namespace(admin, role, ns, action).await? {
            return Ok(());
        }
        Err(ServiceError::new(
            ServerError::AuthorizationError,
            format!(
                "Client with role {role} is not authorized to {} on namespace {ns}",
                action.verb()
            ),
        ))
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

/// What a client wants to do with a topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum TopicAction {
    /// PRODUCER, schema creation.
    Produce,
    /// SUBSCRIBE (consumers and readers).
    Consume,
    /// LOOKUP, PARTITIONED_METADATA, schema reads, topic lists: either grant.
    Lookup,
}

impl TopicAction {
    fn verb(self) -> &'static str {
        match self {
            TopicAction::Produce => "produce",
            TopicAction::Consume => "consume",
            TopicAction::Lookup => "lookup",
        }
    }
}

fn authentication_error(message: impl Into<String>) -> ServiceError {
    ServiceError::new(ServerError::AuthenticationError, message)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use crate::admin::TenantInfo;

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

    #[tokio::test]
    async fn grants_admins_and_superusers() {
        let (config, _) = config();
        let admin = Admin::new(Arc::new(vela_meta::MemoryStore::new()));
        admin.ensure_defaults().await.unwrap();
        let info = TenantInfo {
            admin_roles: vec!["boss".into()],
            allowed_clusters: vec!["standalone".into()],
        };
        admin.create_tenant_with("acme", &info).await.unwrap();
        let ns = NamespaceName::parse("acme/ns").unwrap();
        admin
            .create_namespace(&ns, Default::default())
            .await
            .unwrap();
        admin
            .grant_permission(&ns, "writer", BTreeSet::from([AuthAction::Produce]))
            .await
            .unwrap();
        let may = |role: &'static str, action| {
            let config = config.clone();
            let admin = admin.clone();
            let ns = ns.clone();
            async move {
                config
                    .may_use_namespace(&admin, role, &ns, action)
                    .await
                    .unwrap()
            }
        };
        assert!(may("root", TopicAction::Consume).await);
        assert!(may("boss", TopicAction::Consume).await);
        assert!(may("writer", TopicAction::Produce).await);
        assert!(may("writer", TopicAction::Lookup).await);
        assert!(!may("writer", TopicAction::Consume).await);
        assert!(!may("stranger", TopicAction::Lookup).await);
        let e = config
            .authorize_namespace(&admin, "stranger", &ns, TopicAction::Produce)
            .await
            .unwrap_err();
        assert_eq!(e.code, ServerError::AuthorizationError);
        assert!(
            !config
                .may_administer(&admin, "writer", "acme")
                .await
                .unwrap()
        );
        assert!(config.may_administer(&admin, "boss", "acme").await.unwrap());
        assert!(
            !config
                .may_administer(&admin, "boss", "public")
                .await
                .unwrap()
        );
        admin.revoke_permission(&ns, "writer").await.unwrap();
        assert!(!may("writer", TopicAction::Produce).await);
    }
}
