//! Authorization: what an authenticated role may do, decided from the
//! records `admin` keeps (Pulsar's authorization provider):
//! - a superuser (`AuthConfig::superuser_roles`) may do anything;
//! - a tenant's admin (`TenantInfo::admin_roles`) may administer the tenant
//!   and its namespaces and topics, and produce and consume on them;
//! - any other role may produce or consume on a namespace's topics when the
//!   namespace grants it that action (`NamespacePolicies::permissions`);
//!   lookups, partitioned metadata and schema reads need either grant.
//!
//! Owns: these rules, shared by the protocol (each PRODUCER, SUBSCRIBE,
//! LOOKUP, ...) and the HTTP layer (each route's requirement). Grants are read
//! at each check (no cache: a revoke applies to the next command).
//! Never: authenticates (that is `auth`: who the client is), or writes grants
//! (`admin` stores them).

use vela_wire::proto::ServerError;

use crate::admin::{Admin, AuthAction};
use crate::auth::{AuthConfig, Authorization};
use crate::error::{AdminError, ServiceError};
use crate::topic_name::NamespaceName;

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

/// Whether `role` may do anything (superuser, or authorization off).
pub(crate) fn is_superuser(config: &AuthConfig, role: &str) -> bool {
    config.authorization == Authorization::Off || config.is_superuser(role)
}

/// Pulsar's answer when a role that is no superuser names a missing tenant.
pub(crate) const TENANT_NOT_FOUND: &str = "Tenant does not exist";

/// Whether `role` may administer `tenant` (superuser or tenant admin).
/// Always true with authorization off; `NotFound` when the tenant does not
/// exist and the role is no superuser.
pub(crate) async fn may_administer(
    config: &AuthConfig,
    admin: &Admin,
    role: &str,
    tenant: &str,
) -> Result<bool, AdminError> {
    if is_superuser(config, role) {
        return Ok(true);
    }
    // Pulsar's `validateTenantAdminAccess`: a tenant that does not exist is
    // NOT_FOUND for anyone but a superuser (TopicNotFound on the protocol,
    // 404 over HTTP), before any grant is looked at.
    match admin.tenant_info(tenant).await? {
        Some(info) => Ok(info.admin_roles.iter().any(|r| r == role)),
        // Pulsar's words, on the protocol and over HTTP alike.
        None => Err(AdminError::Service(ServiceError::new(
            ServerError::TopicNotFound,
            TENANT_NOT_FOUND,
        ))),
    }
}

/// Whether `role` may do `action` on the topics of `ns`.
pub(crate) async fn may_use_namespace(
    config: &AuthConfig,
    admin: &Admin,
    role: &str,
    ns: &NamespaceName,
    action: TopicAction,
) -> Result<bool, AdminError> {
    if may_administer(config, admin, role, &ns.tenant).await? {
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

/// [`may_use_namespace`] as a protocol answer: `AuthorizationError` when
/// refused.
pub(crate) async fn authorize_namespace(
    config: &AuthConfig,
    admin: &Admin,
    role: &str,
    ns: &NamespaceName,
    action: TopicAction,
) -> Result<(), ServiceError> {
    if may_use_namespace(config, admin, role, ns, action).await? {
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeSet;
    use std::sync::Arc;

    use super::*;
    use crate::admin::TenantInfo;
    use crate::auth::jwt;

    fn config() -> AuthConfig {
        let secret = jwt::new_secret().unwrap();
        let mut config = AuthConfig::new(jwt::VerifyKey::secret(&secret).unwrap());
        config.superuser_roles = vec!["root".into()];
        config
    }

    #[tokio::test]
    async fn grants_admins_and_superusers() {
        let config = config();
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
                may_use_namespace(&config, &admin, role, &ns, action)
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
        let e = authorize_namespace(&config, &admin, "stranger", &ns, TopicAction::Produce)
            .await
            .unwrap_err();
        assert_eq!(e.code, ServerError::AuthorizationError);
        assert!(
            !may_administer(&config, &admin, "writer", "acme")
                .await
                .unwrap()
        );
        assert!(
            may_administer(&config, &admin, "boss", "acme")
                .await
                .unwrap()
        );
        assert!(
            !may_administer(&config, &admin, "boss", "public")
                .await
                .unwrap()
        );
        // A missing tenant: NOT_FOUND for all but superusers.
        match may_administer(&config, &admin, "boss", "no-such-tenant").await {
            Err(AdminError::Service(e)) => {
                assert_eq!(e.code, ServerError::TopicNotFound);
                assert_eq!(e.message, TENANT_NOT_FOUND);
            }
            other => panic!("{other:?}"),
        }
        assert!(
            may_administer(&config, &admin, "root", "no-such-tenant")
                .await
                .unwrap()
        );
        admin.revoke_permission(&ns, "writer").await.unwrap();
        assert!(!may("writer", TopicAction::Produce).await);
    }
}
