//! Tenants, namespaces (with policies), partitioned-topic metadata and the
//! registry of created topics, kept in the metadata store.
//!
//! Owns the key layout under `/admin`:
//! - `/admin/tenants/{tenant}` → `{}` (tenant info, JSON)
//! - `/admin/namespaces/{tenant}/{namespace}` → [`NamespacePolicies`] JSON
//! - `/admin/partitioned-topics/{tenant}/{namespace}/{domain}/{local}` → `{"partitions":N}`
//! - `/admin/topics/{tenant}/{namespace}/{domain}/{local}` → `{}` (a non-partitioned
//!   topic or a partition that exists)
//!
//! Local names are percent-encoded in keys so any topic name makes a valid key.
//! The records themselves (tenant info, namespace policies and their
//! validation) are `records`; Pulsar's REST JSON shapes are in `json`
//! (serialization at the edge; the records are Vela's own).
//! Never: opens logs or talks to clients; the broker's service decides when
//! to call these.

pub(crate) mod clusters;
pub mod json;
pub mod offload_policies;
pub mod policy_specs;
mod records;
mod topic_policies;

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use vela_meta::{ExpectedVersion, MetaError, MetadataStore};

pub use crate::error::AdminError;
use crate::topic_name::{NamespaceName, TopicDomain, TopicName};
pub use crate::topic_name::{decode_segment, encode_segment};
pub use records::{
    AuthAction, BACKLOG_QUOTA_POLICIES, BACKLOG_QUOTA_TYPES, BacklogQuota, CLUSTERS_MAX,
    ClusterClient, ClusterData, ENSEMBLE_MAX, GRANTED_ROLES_MAX, NamespacePolicies, PROPERTIES_MAX,
    PROPERTY_BYTES_MAX, REPLICATION_CLUSTERS_MAX, ROLE_BYTES_MAX, RetentionPolicy,
    SUBSCRIPTION_GRANTS_MAX, TenantInfo, TopicRecord,
};

/// Most partitions a partitioned topic may have (Pulsar's
/// `maxNumPartitionsPerPartitionedTopic` is unlimited by default; a bound keeps
/// one request from creating millions of logs).
pub const PARTITIONS_MAX: u32 = 10_000;

#[derive(Debug, Serialize, Deserialize)]
struct PartitionedMetadata {
    partitions: u32,
}

fn tenant_key(tenant: &str) -> String {
    format!("/admin/tenants/{}", encode_segment(tenant))
}

fn namespace_key(ns: &NamespaceName) -> String {
    format!(
        "/admin/namespaces/{}/{}",
        encode_segment(&ns.tenant),
        encode_segment(&ns.namespace)
    )
}

fn namespace_dir(kind: &str, ns: &NamespaceName) -> String {
    format!(
        "/admin/{kind}/{}/{}",
        encode_segment(&ns.tenant),
        encode_segment(&ns.namespace)
    )
}

/// Where a topic's compaction record lives.
pub(crate) fn compaction_key(topic: &TopicName) -> String {
    topic_key("compaction", topic)
}

fn topic_key(kind: &str, topic: &TopicName) -> String {
    format!(
        "{}/{}/{}",
        namespace_dir(kind, &topic.namespace),
        topic.domain.as_str(),
        encode_segment(&topic.local)
    )
}

/// Admin operations over the metadata store.
#[derive(Debug, Clone)]
pub struct Admin {
    meta: Arc<dyn MetadataStore>,
    /// The cluster tenants created by the broker itself are allowed on.
    local_cluster: Arc<str>,
}

impl Admin {
    /// Admin over `meta`, of a broker of the cluster `standalone`.
    pub fn new(meta: Arc<dyn MetadataStore>) -> Admin {
        Admin::for_cluster(meta, crate::config::CLUSTER_NAME_DEFAULT)
    }

    /// Admin over `meta`, of a broker of the cluster `local_cluster`.
    pub fn for_cluster(meta: Arc<dyn MetadataStore>, local_cluster: &str) -> Admin {
        Admin {
            meta,
            local_cluster: Arc::from(local_cluster),
        }
    }

    /// Creates `public` and `public/default` when absent (startup).
    pub async fn ensure_defaults(&self) -> Result<(), AdminError> {
        match self.create_tenant("public").await {
            Ok(()) | Err(AdminError::Exists(_)) => {}
            Err(e) => return Err(e),
        }
        let ns = NamespaceName {
            tenant: "public".into(),
            namespace: "default".into(),
        };
        match self
            .create_namespace(&ns, NamespacePolicies::default())
            .await
        {
            Ok(()) | Err(AdminError::Exists(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates the tenant `pulsar`, the namespace `pulsar/system` and the
    /// partitioned topic `transaction_coordinator_assign` with `partitions`
    /// partitions (one per transaction coordinator) when absent; an existing
    /// topic keeps its partitions.
    pub async fn ensure_coordinator_assign(&self, partitions: u32) -> Result<(), AdminError> {
        match self.create_tenant("pulsar").await {
            Ok(()) | Err(AdminError::Exists(_)) => {}
            Err(e) => return Err(e),
        }
        let ns = NamespaceName {
            tenant: "pulsar".into(),
            namespace: "system".into(),
        };
        match self
            .create_namespace(&ns, NamespacePolicies::default())
            .await
        {
            Ok(()) | Err(AdminError::Exists(_)) => {}
            Err(e) => return Err(e),
        }
        let topic = TopicName::parse("persistent://pulsar/system/transaction_coordinator_assign")
            .map_err(|e| AdminError::Invalid(e.to_string()))?;
        match self.create_partitioned_topic(&topic, partitions).await {
            Ok(()) | Err(AdminError::Exists(_)) => Ok(()),
            Err(e) => Err(e),
        }
    }

    /// Creates a tenant allowed on the local cluster.
    pub async fn create_tenant(&self, tenant: &str) -> Result<(), AdminError> {
        let info = TenantInfo {
            admin_roles: Vec::new(),
            allowed_clusters: vec![self.local_cluster.to_string()],
        };
        self.create_tenant_with(tenant, &info).await
    }

    /// Creates a tenant with its configuration.
    pub async fn create_tenant_with(
        &self,
        tenant: &str,
        info: &TenantInfo,
    ) -> Result<(), AdminError> {
        let key = tenant_key(tenant);
        let value = serde_json::to_vec(info).map_err(|e| AdminError::Invalid(e.to_string()))?;
        match self
            .meta
            .put(&key, Bytes::from(value), ExpectedVersion::Absent)
            .await
        {
            Ok(_) => Ok(()),
            Err(MetaError::Exists { .. }) => Err(AdminError::Exists(format!("tenant {tenant}"))),
            Err(e) => Err(e.into()),
        }
    }

    /// A tenant's configuration, `None` when it does not exist.
    pub async fn tenant_info(&self, tenant: &str) -> Result<Option<TenantInfo>, AdminError> {
        let key = tenant_key(tenant);
        let Some((value, _)) = self.meta.get(&key).await? else {
            return Ok(None);
        };
        let info = serde_json::from_slice(&value).map_err(|e| AdminError::Corrupt {
            key,
            reason: e.to_string(),
        })?;
        Ok(Some(info))
    }

    /// Replaces a tenant's configuration.
    pub async fn update_tenant(&self, tenant: &str, info: &TenantInfo) -> Result<(), AdminError> {
        let key = tenant_key(tenant);
        let Some((_, version)) = self.meta.get(&key).await? else {
            return Err(AdminError::NotFound(format!("Tenant {tenant} not found")));
        };
        let value = serde_json::to_vec(info).map_err(|e| AdminError::Invalid(e.to_string()))?;
        self.meta
            .put(&key, Bytes::from(value), ExpectedVersion::Is(version))
            .await?;
        Ok(())
    }

    /// True if the tenant exists.
    pub async fn tenant_exists(&self, tenant: &str) -> Result<bool, AdminError> {
        Ok(self.meta.get(&tenant_key(tenant)).await?.is_some())
    }

    /// Tenants, sorted.
    pub async fn tenants(&self) -> Result<Vec<String>, AdminError> {
        let names = self.meta.children("/admin/tenants").await?;
        Ok(names.iter().map(|n| decode_segment(n)).collect())
    }

    /// Creates a namespace in an existing tenant.
    pub async fn create_namespace(
        &self,
        ns: &NamespaceName,
        policies: NamespacePolicies,
    ) -> Result<(), AdminError> {
        policies.validate()?;
        if !self.tenant_exists(&ns.tenant).await? {
            return Err(AdminError::NotFound(format!(
                "tenant {} does not exist",
                ns.tenant
            )));
        }
        let value =
            serde_json::to_vec(&policies).map_err(|e| AdminError::Invalid(e.to_string()))?;
        match self
            .meta
            .put(
                &namespace_key(ns),
                Bytes::from(value),
                ExpectedVersion::Absent,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(MetaError::Exists { .. }) => Err(AdminError::Exists(format!("namespace {ns}"))),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes an empty tenant (no namespaces left).
    pub async fn delete_tenant(&self, tenant: &str) -> Result<(), AdminError> {
        if !self.namespaces(tenant).await?.is_empty() {
            return Err(AdminError::Exists(format!("namespaces in tenant {tenant}")));
        }
        match self
            .meta
            .delete(&tenant_key(tenant), ExpectedVersion::Any)
            .await
        {
            Ok(()) => Ok(()),
            Err(MetaError::NotFound { .. }) => Err(AdminError::NotFound(format!(
                "tenant {tenant} does not exist"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes an empty namespace (no topics, no partitioned topics left).
    pub async fn delete_namespace(&self, ns: &NamespaceName) -> Result<(), AdminError> {
        if !self.topics_of_namespace(ns).await?.is_empty() {
            return Err(AdminError::Exists(format!("topics in namespace {ns}")));
        }
        match self
            .meta
            .delete(&namespace_key(ns), ExpectedVersion::Any)
            .await
        {
            Ok(()) => Ok(()),
            Err(MetaError::NotFound { .. }) => Err(AdminError::NotFound(format!(
                "namespace {ns} does not exist"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Namespaces of a tenant, as `tenant/ns`.
    pub async fn namespaces(&self, tenant: &str) -> Result<Vec<String>, AdminError> {
        let dir = format!("/admin/namespaces/{}", encode_segment(tenant));
        let names = self.meta.children(&dir).await?;
        Ok(names
            .iter()
            .map(|n| format!("{tenant}/{}", decode_segment(n)))
            .collect())
    }

    /// The namespace's policies, or `None` when it does not exist.
    pub async fn namespace_policies(
        &self,
        ns: &NamespaceName,
    ) -> Result<Option<NamespacePolicies>, AdminError> {
        let key = namespace_key(ns);
        let Some((value, _)) = self.meta.get(&key).await? else {
            return Ok(None);
        };
        let policies = serde_json::from_slice(&value).map_err(|e| AdminError::Corrupt {
            key,
            reason: e.to_string(),
        })?;
        Ok(Some(policies))
    }

    /// Replaces a namespace's policies.
    pub async fn set_namespace_policies(
        &self,
        ns: &NamespaceName,
        policies: &NamespacePolicies,
    ) -> Result<(), AdminError> {
        policies.validate()?;
        let key = namespace_key(ns);
        if self.meta.get(&key).await?.is_none() {
            return Err(AdminError::NotFound(format!(
                "namespace {ns} does not exist"
            )));
        }
        let value = serde_json::to_vec(policies).map_err(|e| AdminError::Invalid(e.to_string()))?;
        self.meta
            .put(&key, Bytes::from(value), ExpectedVersion::Any)
            .await?;
        Ok(())
    }

    /// Grants `actions` on `ns` to `role`, replacing its earlier grant.
    pub async fn grant_permission(
        &self,
        ns: &NamespaceName,
        role: &str,
        actions: BTreeSet<AuthAction>,
    ) -> Result<(), AdminError> {
        if role.is_empty() || role.len() > ROLE_BYTES_MAX {
            return Err(AdminError::Invalid(format!(
                "role must be 1..={ROLE_BYTES_MAX} bytes"
            )));
        }
        let mut policies = self
            .namespace_policies(ns)
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("Namespace {ns} does not exist")))?;
        if !policies.permissions.contains_key(role)
            && policies.permissions.len() >= GRANTED_ROLES_MAX
        {
            return Err(AdminError::Invalid(format!(
                "namespace {ns} has grants for GRANTED_ROLES_MAX ({GRANTED_ROLES_MAX}) roles"
            )));
        }
        policies.permissions.insert(role.to_string(), actions);
        self.set_namespace_policies(ns, &policies).await
    }

    /// Removes `role`'s grant on `ns` (absent is fine, as Pulsar).
    pub async fn revoke_permission(
        &self,
        ns: &NamespaceName,
        role: &str,
    ) -> Result<(), AdminError> {
        let mut policies = self
            .namespace_policies(ns)
            .await?
            .ok_or_else(|| AdminError::NotFound(format!("Namespace {ns} does not exist")))?;
        if policies.permissions.remove(role).is_some() {
            self.set_namespace_policies(ns, &policies).await?;
        }
        Ok(())
    }

    /// Partitions of `topic` (a base name): `Some(n)` for a partitioned topic.
    pub async fn partitions(&self, topic: &TopicName) -> Result<Option<u32>, AdminError> {
        let key = topic_key("partitioned-topics", &topic.base());
        let Some((value, _)) = self.meta.get(&key).await? else {
            return Ok(None);
        };
        let meta: PartitionedMetadata =
            serde_json::from_slice(&value).map_err(|e| AdminError::Corrupt {
                key,
                reason: e.to_string(),
            })?;
        Ok(Some(meta.partitions))
    }

    /// Creates partitioned-topic metadata with `partitions` partitions.
    pub async fn create_partitioned_topic(
        &self,
        topic: &TopicName,
        partitions: u32,
    ) -> Result<(), AdminError> {
        if topic.partition.is_some() {
            return Err(AdminError::Invalid(format!(
                "{topic} is a partition name, not a base topic"
            )));
        }
        if partitions == 0 || partitions > PARTITIONS_MAX {
            return Err(AdminError::Invalid(format!(
                "partitions must be in 1..={PARTITIONS_MAX}, got {partitions}"
            )));
        }
        if self.namespace_policies(&topic.namespace).await?.is_none() {
            return Err(AdminError::NotFound(format!(
                "namespace {} does not exist",
                topic.namespace
            )));
        }
        if self.topic_exists(topic).await? {
            return Err(AdminError::Exists(format!("non-partitioned topic {topic}")));
        }
        let value = serde_json::to_vec(&PartitionedMetadata { partitions })
            .map_err(|e| AdminError::Invalid(e.to_string()))?;
        match self
            .meta
            .put(
                &topic_key("partitioned-topics", topic),
                Bytes::from(value),
                ExpectedVersion::Absent,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(MetaError::Exists { .. }) => Err(AdminError::Exists(format!("topic {topic}"))),
            Err(e) => Err(e.into()),
        }
    }

    /// Creates a non-partitioned topic: `Exists` when it (or a partitioned
    /// topic of that name) exists already.
    pub async fn create_topic(&self, topic: &TopicName) -> Result<(), AdminError> {
        if self.namespace_policies(&topic.namespace).await?.is_none() {
            return Err(AdminError::NotFound(format!(
                "Namespace {} does not exist",
                topic.namespace
            )));
        }
        if topic.partition.is_none() && self.partitions(topic).await?.is_some() {
            return Err(AdminError::Exists(format!(
                "Partitioned topic {topic} already exists"
            )));
        }
        match self
            .meta
            .put(
                &topic_key("topics", topic),
                Bytes::from_static(b"{}"),
                ExpectedVersion::Absent,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(MetaError::Exists { .. }) => Err(AdminError::Exists(format!(
                "This topic already exists: {topic}"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Base names of the namespace's partitioned topics of `domain`, sorted.
    pub async fn partitioned_topics_of_namespace(
        &self,
        ns: &NamespaceName,
        domain: TopicDomain,
    ) -> Result<Vec<String>, AdminError> {
        let domain = domain.as_str();
        let dir = format!("{}/{domain}", namespace_dir("partitioned-topics", ns));
        let mut out: Vec<String> = self
            .meta
            .children(&dir)
            .await?
            .iter()
            .map(|local| format!("{domain}://{ns}/{}", decode_segment(local)))
            .collect();
        out.sort();
        Ok(out)
    }

    /// Raises the partition count of a partitioned topic (never lowers it:
    /// partitions hold data).
    pub async fn update_partitioned_topic(
        &self,
        topic: &TopicName,
        partitions: u32,
    ) -> Result<(), AdminError> {
        let key = topic_key("partitioned-topics", &topic.base());
        let Some((value, version)) = self.meta.get(&key).await? else {
            return Err(AdminError::NotFound(format!(
                "Partitioned Topic {topic} not found"
            )));
        };
        let current: PartitionedMetadata =
            serde_json::from_slice(&value).map_err(|e| AdminError::Corrupt {
                key: key.clone(),
                reason: e.to_string(),
            })?;
        if partitions <= current.partitions || partitions > PARTITIONS_MAX {
            return Err(AdminError::Invalid(format!(
                "partitions can only grow, up to {PARTITIONS_MAX}: {} -> {partitions}",
                current.partitions
            )));
        }
        let value = serde_json::to_vec(&PartitionedMetadata { partitions })
            .map_err(|e| AdminError::Invalid(e.to_string()))?;
        self.meta
            .put(&key, Bytes::from(value), ExpectedVersion::Is(version))
            .await?;
        Ok(())
    }

    /// Records that a (non-partitioned or partition) topic exists.
    pub async fn register_topic(&self, topic: &TopicName) -> Result<(), AdminError> {
        match self
            .meta
            .put(
                &topic_key("topics", topic),
                Bytes::from_static(b"{}"),
                ExpectedVersion::Absent,
            )
            .await
        {
            Ok(_) | Err(MetaError::Exists { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Forgets a (non-partitioned or partition) topic; absent is fine.
    pub async fn unregister_topic(&self, topic: &TopicName) -> Result<(), AdminError> {
        match self
            .meta
            .delete(&topic_key("topics", topic), ExpectedVersion::Any)
            .await
        {
            Ok(()) | Err(MetaError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Deletes partitioned-topic metadata (the partitions themselves are
    /// deleted by the broker first).
    pub async fn delete_partitioned_metadata(&self, topic: &TopicName) -> Result<(), AdminError> {
        match self
            .meta
            .delete(
                &topic_key("partitioned-topics", &topic.base()),
                ExpectedVersion::Any,
            )
            .await
        {
            Ok(()) => Ok(()),
            Err(MetaError::NotFound { .. }) => Err(AdminError::NotFound(format!(
                "partitioned topic {topic} does not exist"
            ))),
            Err(e) => Err(e.into()),
        }
    }

    /// Where the records of the namespace's persistent topics live: the
    /// created topics and the partitioned ones (topic list watchers follow
    /// both).
    pub(crate) fn topic_list_paths(&self, ns: &NamespaceName) -> [String; 2] {
        ["topics", "partitioned-topics"]
            .map(|kind| format!("{}/persistent", namespace_dir(kind, ns)))
    }

    /// True if the (non-partitioned or partition) topic was created.
    pub async fn topic_exists(&self, topic: &TopicName) -> Result<bool, AdminError> {
        Ok(self.meta.get(&topic_key("topics", topic)).await?.is_some())
    }

    /// Full names of the namespace's persistent topics: every created topic
    /// plus every partition of every partitioned topic, sorted.
    pub async fn topics_of_namespace(&self, ns: &NamespaceName) -> Result<Vec<String>, AdminError> {
        let mut out = Vec::new();
        let domain = "persistent";
        let dir = format!("{}/{domain}", namespace_dir("topics", ns));
        for local in self.meta.children(&dir).await? {
            out.push(format!("{domain}://{ns}/{}", decode_segment(&local)));
        }
        let dir = format!("{}/{domain}", namespace_dir("partitioned-topics", ns));
        for local in self.meta.children(&dir).await? {
            let local = decode_segment(&local);
            let base = TopicName::parse(&format!("{domain}://{ns}/{local}"))
                .map_err(|e| AdminError::Invalid(e.to_string()))?;
            if let Some(n) = self.partitions(&base).await? {
                for i in 0..n {
                    out.push(base.partition(i).to_string());
                }
            }
        }
        out.sort();
        out.dedup();
        Ok(out)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn partitioned_metadata_and_topic_listing() {
        let admin = Admin::new(Arc::new(vela_meta::MemoryStore::new()));
        admin.ensure_defaults().await.unwrap();
        admin.ensure_defaults().await.unwrap();
        let topic = TopicName::parse("p").unwrap();
        assert_eq!(admin.partitions(&topic).await.unwrap(), None);
        admin.create_partitioned_topic(&topic, 3).await.unwrap();
        assert!(matches!(
            admin.create_partitioned_topic(&topic, 3).await,
            Err(AdminError::Exists(_))
        ));
        assert_eq!(
            admin.partitions(&topic.partition(1)).await.unwrap(),
            Some(3)
        );
        admin
            .register_topic(&TopicName::parse("plain").unwrap())
            .await
            .unwrap();
        let ns = NamespaceName::parse("public/default").unwrap();
        assert_eq!(
            admin.topics_of_namespace(&ns).await.unwrap(),
            vec![
                "persistent://public/default/p-partition-0",
                "persistent://public/default/p-partition-1",
                "persistent://public/default/p-partition-2",
                "persistent://public/default/plain",
            ]
        );
        let bad = NamespacePolicies {
            persistence: Some((1, 2, 1)),
            ..Default::default()
        };
        let other = NamespaceName::parse("public/other").unwrap();
        assert!(matches!(
            admin.create_namespace(&other, bad).await,
            Err(AdminError::BadRequest(_))
        ));
        admin
            .create_namespace(&other, NamespacePolicies::default())
            .await
            .unwrap();
        assert!(matches!(
            admin.delete_namespace(&ns).await,
            Err(AdminError::Exists(_))
        ));
        assert!(matches!(
            admin.delete_tenant("public").await,
            Err(AdminError::Exists(_))
        ));
        admin.delete_namespace(&other).await.unwrap();
        assert!(matches!(
            admin.delete_namespace(&other).await,
            Err(AdminError::NotFound(_))
        ));
        let missing = TopicName::parse("nope/ns/x").unwrap();
        assert!(matches!(
            admin.create_partitioned_topic(&missing, 2).await,
            Err(AdminError::NotFound(_))
        ));
    }
}
