//! Clusters as metadata (Pulsar's `ClustersBase`) and the replication
//! clusters of namespaces and topics, with Pulsar's checks.
//!
//! Owns the keys `/admin/clusters/{cluster}` ([`ClusterData`] JSON); a
//! topic's own replication clusters are its `replication` policy in its
//! `TopicRecord` (`admin::topic_policies`). Guarantees: a tenant, namespace
//! or topic names only clusters recorded here (checked when set, as
//! Pulsar); a cluster a tenant allows is never deleted ("Cluster not
//! empty"). Never: starts or stops replicators (the broker's `replication`
//! follows these records), or contacts another cluster.

use bytes::Bytes;
use vela_meta::{ExpectedVersion, MetaError};

use super::{
    Admin, AdminError, CLUSTERS_MAX, ClusterData, NamespacePolicies, REPLICATION_CLUSTERS_MAX,
    TenantInfo, TopicRecord,
};
use crate::topic_name::{NamespaceName, TopicName, decode_segment, encode_segment};

/// Pulsar's name for the pseudo-cluster of v1 global namespaces: never a
/// replication cluster.
const GLOBAL_CLUSTER: &str = "global";

fn cluster_key(cluster: &str) -> String {
    format!("/admin/clusters/{}", encode_segment(cluster))
}

/// The key of a topic's replication clusters in its record's policies
/// (Pulsar's topic-level route name).
const REPLICATION_POLICY: &str = "replication";

impl Admin {
    /// Names of the recorded clusters, sorted.
    pub async fn clusters(&self) -> Result<Vec<String>, AdminError> {
        let names = self.meta.children("/admin/clusters").await?;
        let mut names: Vec<String> = names.iter().map(|n| decode_segment(n)).collect();
        names.sort();
        Ok(names)
    }

    /// A cluster's URLs, `None` when it is not recorded.
    pub async fn cluster(&self, cluster: &str) -> Result<Option<ClusterData>, AdminError> {
        let key = cluster_key(cluster);
        let Some((value, _)) = self.meta.get(&key).await? else {
            return Ok(None);
        };
        serde_json::from_slice(&value)
            .map(Some)
            .map_err(|e| AdminError::Corrupt {
                key,
                reason: e.to_string(),
            })
    }

    /// Records a new cluster (409 "Cluster already exists", 400 on a bad
    /// URL, 412 past `CLUSTERS_MAX` or for a bad name).
    pub async fn create_cluster(
        &self,
        cluster: &str,
        data: &ClusterData,
    ) -> Result<(), AdminError> {
        check_cluster_name(cluster)?;
        data.validate()?;
        if self.clusters().await?.len() >= CLUSTERS_MAX {
            return Err(AdminError::Precondition(format!(
                "{CLUSTERS_MAX} clusters are recorded (CLUSTERS_MAX)"
            )));
        }
        let value = serde_json::to_vec(data).map_err(|e| AdminError::Invalid(e.to_string()))?;
        match self
            .meta
            .put(
                &cluster_key(cluster),
                Bytes::from(value),
                ExpectedVersion::Absent,
            )
            .await
        {
            Ok(_) => Ok(()),
            Err(MetaError::Exists { .. }) => Err(AdminError::Exists("Cluster".into())),
            Err(e) => Err(e.into()),
        }
    }

    /// Replaces a cluster's URLs (404 "Cluster does not exist").
    pub async fn update_cluster(
        &self,
        cluster: &str,
        data: &ClusterData,
    ) -> Result<(), AdminError> {
        data.validate()?;
        let key = cluster_key(cluster);
        let Some((_, version)) = self.meta.get(&key).await? else {
            return Err(AdminError::NotFound("Cluster does not exist".into()));
        };
        let value = serde_json::to_vec(data).map_err(|e| AdminError::Invalid(e.to_string()))?;
        self.meta
            .put(&key, Bytes::from(value), ExpectedVersion::Is(version))
            .await?;
        Ok(())
    }

    /// Deletes a cluster no tenant allows (412 "Cluster not empty" else, as
    /// Pulsar refuses a cluster in use; 404 when absent).
    pub async fn delete_cluster(&self, cluster: &str) -> Result<(), AdminError> {
        if self.cluster(cluster).await?.is_none() {
            return Err(AdminError::NotFound("Cluster does not exist".into()));
        }
        for tenant in self.tenants().await? {
            let allowed = self
                .tenant_info(&tenant)
                .await?
                .is_some_and(|info| info.allowed_clusters.iter().any(|c| c == cluster));
            if allowed {
                return Err(AdminError::Precondition("Cluster not empty".into()));
            }
        }
        match self
            .meta
            .delete(&cluster_key(cluster), ExpectedVersion::Any)
            .await
        {
            Ok(()) | Err(MetaError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }

    /// Records the local cluster at start when absent (Pulsar standalone
    /// does the same); an existing record keeps its URLs, but gets the ones
    /// it lacks.
    pub async fn ensure_cluster(
        &self,
        cluster: &str,
        data: &ClusterData,
    ) -> Result<(), AdminError> {
        match self.cluster(cluster).await? {
            None => match self.create_cluster(cluster, data).await {
                Ok(()) | Err(AdminError::Exists(_)) => Ok(()),
                Err(e) => Err(e),
            },
            Some(mut stored) => {
                let before = stored.clone();
                fill(&mut stored.service_url, &data.service_url);
                fill(&mut stored.service_url_tls, &data.service_url_tls);
                fill(&mut stored.broker_service_url, &data.broker_service_url);
                fill(
                    &mut stored.broker_service_url_tls,
                    &data.broker_service_url_tls,
                );
                if stored == before {
                    return Ok(());
                }
                self.update_cluster(cluster, &stored).await
            }
        }
    }

    /// A tenant's allowed clusters must all be recorded (Pulsar's
    /// `validateClusters`: 412).
    pub async fn check_tenant_clusters(&self, info: &TenantInfo) -> Result<(), AdminError> {
        let known = self.clusters().await?;
        let unknown: Vec<&str> = info
            .allowed_clusters
            .iter()
            .filter(|c| *c != GLOBAL_CLUSTER && !known.contains(c))
            .map(String::as_str)
            .collect();
        if !unknown.is_empty() {
            return Err(AdminError::Invalid(format!(
                "Clusters do not exist: {}",
                unknown.join(", ")
            )));
        }
        Ok(())
    }

    /// Checks replication clusters for a namespace or topic of `tenant` as
    /// Pulsar's `internalSetNamespaceReplicationClusters` does and returns
    /// them without repeats, in the order given.
    pub async fn check_replication_clusters(
        &self,
        tenant: &str,
        clusters: &[String],
    ) -> Result<Vec<String>, AdminError> {
        if clusters.is_empty() {
            return Err(AdminError::Precondition(
                "ClusterIds should not be null or empty".into(),
            ));
        }
        let mut unique: Vec<String> = Vec::new();
        for cluster in clusters {
            if !unique.contains(cluster) {
                unique.push(cluster.clone());
            }
        }
        if unique.iter().any(|c| c == GLOBAL_CLUSTER) {
            return Err(AdminError::Precondition(
                "Cannot specify global in the list of replication clusters".into(),
            ));
        }
        if unique.len() > REPLICATION_CLUSTERS_MAX {
            return Err(AdminError::Precondition(format!(
                "more than {REPLICATION_CLUSTERS_MAX} replication clusters"
            )));
        }
        let known = self.clusters().await?;
        let allowed = self
            .tenant_info(tenant)
            .await?
            .map(|info| info.allowed_clusters)
            .unwrap_or_default();
        for cluster in &unique {
            if !known.contains(cluster) {
                return Err(AdminError::Forbidden(format!(
                    "Invalid cluster id: {cluster}"
                )));
            }
            if !allowed.contains(cluster) {
                return Err(AdminError::Forbidden(format!(
                    "Cluster [{cluster}] is not in the list of allowed clusters list for tenant \
                     [{tenant}]"
                )));
            }
        }
        Ok(unique)
    }

    /// Sets a namespace's replication clusters (checked as Pulsar does).
    pub async fn set_namespace_replication(
        &self,
        ns: &NamespaceName,
        clusters: &[String],
    ) -> Result<Vec<String>, AdminError> {
        let clusters = self
            .check_replication_clusters(&ns.tenant, clusters)
            .await?;
        let mut policies = self
            .namespace_policies(ns)
            .await?
            .ok_or_else(|| AdminError::NotFound("Namespace does not exist".into()))?;
        policies.replication_clusters = Some(clusters.clone());
        self.set_namespace_policies(ns, &policies).await?;
        Ok(clusters)
    }

    /// A topic's own replication clusters (`None`: it follows its namespace).
    pub async fn topic_replication(
        &self,
        topic: &TopicName,
    ) -> Result<Option<Vec<String>>, AdminError> {
        Ok(own_replication(&self.topic_record(topic).await?))
    }

    /// Sets (`Some`, checked as Pulsar does) or removes (`None`) a topic's
    /// own replication clusters; a partition's are its partitioned topic's.
    pub async fn set_topic_replication(
        &self,
        topic: &TopicName,
        clusters: Option<&[String]>,
    ) -> Result<(), AdminError> {
        let clusters = match clusters {
            Some(clusters) => Some(
                self.check_replication_clusters(&topic.namespace.tenant, clusters)
                    .await?,
            ),
            None => None,
        };
        self.update_topic_record(topic, |record| {
            match &clusters {
                Some(clusters) => {
                    record.policies.insert(
                        REPLICATION_POLICY.to_string(),
                        serde_json::Value::from(clusters.clone()),
                    );
                }
                None => {
                    record.policies.remove(REPLICATION_POLICY);
                }
            }
            Ok(())
        })
        .await?;
        Ok(())
    }

    /// The clusters `topic` is replicated among: its own list, else its
    /// namespace's, else only `local` (no replication).
    pub async fn effective_replication(
        &self,
        topic: &TopicName,
        local: &str,
    ) -> Result<Vec<String>, AdminError> {
        let record = self.topic_record(topic).await?;
        if own_replication(&record).is_some() {
            return Ok(replication_of(&record, None, local));
        }
        let policies = self.namespace_policies(&topic.namespace).await?;
        Ok(replication_of(&record, policies.as_ref(), local))
    }
}

/// A topic's own replication clusters, from its record.
fn own_replication(record: &TopicRecord) -> Option<Vec<String>> {
    record
        .policies
        .get(REPLICATION_POLICY)
        .and_then(|value| serde_json::from_value(value.clone()).ok())
}

/// The clusters a topic is replicated among, from its record and its
/// namespace's policies as already read: its own list, else its
/// namespace's, else only `local` (no replication).
pub(crate) fn replication_of(
    record: &TopicRecord,
    namespace: Option<&NamespacePolicies>,
    local: &str,
) -> Vec<String> {
    own_replication(record)
        .or_else(|| namespace.and_then(|p| p.replication_clusters.clone()))
        .unwrap_or_else(|| vec![local.to_string()])
}

impl Admin {
    /// Every persistent topic (partitions, not partitioned bases) that
    /// replicates to a cluster other than `local`: the topics of namespaces
    /// whose replication clusters name one, and those whose own list does.
    pub async fn replicated_topics(&self, local: &str) -> Result<Vec<String>, AdminError> {
        let mut out = Vec::new();
        for tenant in self.tenants().await? {
            for ns in self.namespaces(&tenant).await? {
                let Ok(ns) = NamespaceName::parse(&ns) else {
                    continue;
                };
                let namespace_remote = self
                    .namespace_policies(&ns)
                    .await?
                    .and_then(|p| p.replication_clusters)
                    .is_some_and(|clusters| clusters.iter().any(|c| c != local));
                for topic in self.topics_of_namespace(&ns).await? {
                    let Ok(name) = TopicName::parse(&topic) else {
                        continue;
                    };
                    let remote = match self.topic_replication(&name).await? {
                        Some(own) => own.iter().any(|c| c != local),
                        None => namespace_remote,
                    };
                    if remote {
                        out.push(topic);
                    }
                }
            }
        }
        Ok(out)
    }
}

fn fill(slot: &mut Option<String>, value: &Option<String>) {
    if slot.as_deref().is_none_or(str::is_empty) && value.is_some() {
        slot.clone_from(value);
    }
}

/// Pulsar's `NamedEntity.checkName` (412 "Cluster name is not valid").
fn check_cluster_name(cluster: &str) -> Result<(), AdminError> {
    let valid = !cluster.is_empty()
        && cluster.len() <= 256
        && cluster
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '=' | ':' | '.'));
    if valid {
        Ok(())
    } else {
        Err(AdminError::Precondition("Cluster name is not valid".into()))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::admin::NamespacePolicies;

    fn url(broker: &str) -> ClusterData {
        ClusterData {
            broker_service_url: Some(broker.into()),
            ..ClusterData::default()
        }
    }

    #[tokio::test]
    async fn clusters_tenants_and_replication_are_checked_as_pulsar_checks_them() {
        let admin = Admin::new(Arc::new(vela_meta::MemoryStore::new()));
        admin
            .ensure_cluster("a", &url("pulsar://127.0.0.1:1"))
            .await
            .unwrap();
        admin
            .create_cluster("b", &url("pulsar://127.0.0.1:2"))
            .await
            .unwrap();
        assert!(matches!(
            admin
                .create_cluster("b", &url("pulsar://127.0.0.1:2"))
                .await,
            Err(AdminError::Exists(_))
        ));
        assert!(matches!(
            admin.create_cluster("b/c", &ClusterData::default()).await,
            Err(AdminError::Precondition(_))
        ));
        assert!(matches!(
            admin.update_cluster("nope", &ClusterData::default()).await,
            Err(AdminError::NotFound(_))
        ));
        assert_eq!(admin.clusters().await.unwrap(), ["a", "b"]);

        let tenant = TenantInfo {
            admin_roles: vec![],
            allowed_clusters: vec!["a".into(), "c".into()],
        };
        let Err(AdminError::Invalid(message)) = admin.check_tenant_clusters(&tenant).await else {
            panic!("an unknown cluster passed");
        };
        assert!(message.contains("Clusters do not exist: c"), "{message}");
        let tenant = TenantInfo {
            admin_roles: vec![],
            allowed_clusters: vec!["a".into()],
        };
        admin.check_tenant_clusters(&tenant).await.unwrap();
        admin.create_tenant_with("t", &tenant).await.unwrap();
        let ns = NamespaceName::parse("t/ns").unwrap();
        admin
            .create_namespace(&ns, NamespacePolicies::default())
            .await
            .unwrap();

        let refused = |r: Result<Vec<String>, AdminError>| match r {
            Err(AdminError::Forbidden(m) | AdminError::Precondition(m)) => m,
            other => panic!("{other:?}"),
        };
        let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(
            refused(admin.set_namespace_replication(&ns, &[]).await),
            "ClusterIds should not be null or empty"
        );
        assert_eq!(
            refused(
                admin
                    .set_namespace_replication(&ns, &names(&["a", "global"]))
                    .await
            ),
            "Cannot specify global in the list of replication clusters"
        );
        assert_eq!(
            refused(
                admin
                    .set_namespace_replication(&ns, &names(&["a", "x"]))
                    .await
            ),
            "Invalid cluster id: x"
        );
        assert_eq!(
            refused(
                admin
                    .set_namespace_replication(&ns, &names(&["a", "b"]))
                    .await
            ),
            "Cluster [b] is not in the list of allowed clusters list for tenant [t]"
        );
        // Allowed once the tenant allows it; repeats collapse.
        let both = TenantInfo {
            admin_roles: vec![],
            allowed_clusters: names(&["a", "b"]),
        };
        admin.update_tenant("t", &both).await.unwrap();
        assert_eq!(
            admin
                .set_namespace_replication(&ns, &names(&["a", "b", "a"]))
                .await
                .unwrap(),
            ["a", "b"]
        );
        let topic = TopicName::parse("persistent://t/ns/x-partition-1").unwrap();
        assert_eq!(
            admin.effective_replication(&topic, "a").await.unwrap(),
            ["a", "b"]
        );
        // A topic's own list overrides its namespace's, for every partition.
        admin
            .set_topic_replication(
                &TopicName::parse("persistent://t/ns/x").unwrap(),
                Some(names(&["a"]).as_slice()),
            )
            .await
            .unwrap();
        assert_eq!(
            admin.effective_replication(&topic, "a").await.unwrap(),
            ["a"]
        );
        admin.set_topic_replication(&topic, None).await.unwrap();
        assert_eq!(
            admin.effective_replication(&topic, "a").await.unwrap(),
            ["a", "b"]
        );

        // In use by a tenant: kept.
        assert!(matches!(
            admin.delete_cluster("b").await,
            Err(AdminError::Precondition(m)) if m == "Cluster not empty"
        ));
        admin.update_tenant("t", &tenant).await.unwrap();
        admin.delete_cluster("b").await.unwrap();
        assert!(matches!(
            admin.delete_cluster("b").await,
            Err(AdminError::NotFound(_))
        ));
        // The local record gains the URL it lacked, keeps the rest.
        admin
            .ensure_cluster(
                "a",
                &ClusterData {
                    service_url: Some("http://127.0.0.1:8".into()),
                    broker_service_url: Some("pulsar://127.0.0.1:9".into()),
                    ..ClusterData::default()
                },
            )
            .await
            .unwrap();
        let a = admin.cluster("a").await.unwrap().unwrap();
        assert_eq!(
            a.broker_service_url.as_deref(),
            Some("pulsar://127.0.0.1:1")
        );
        assert_eq!(a.service_url.as_deref(), Some("http://127.0.0.1:8"));
    }
}
