//! Keeps served topics' policies current when another broker (or this one)
//! changes them in the metadata store: one watch on the namespace policies
//! and one on the topic-level records. A change to a namespace re-applies
//! it to this broker's served topics of that namespace; a change to a topic
//! record re-applies it to the served topic (or its served partitions). So
//! in a cluster an admin request answered by any broker reaches the broker
//! serving the topic, as Pulsar's topic-policies service does with its
//! `__change_events` system topic.
//!
//! Bounds: events are handled one at a time, each with at most two store
//! reads; a watcher that falls behind (`Lagged`) re-applies the stored
//! policies of every served topic once.
//! Never: writes to the store.

use std::sync::{Arc, Weak};

use vela_meta::WatchEvent;

use crate::service::Service;
use crate::topic_name::{NamespaceName, TopicName, decode_segment};

const NAMESPACES_PATH: &str = "/admin/namespaces";
const TOPIC_POLICIES_PATH: &str = "/admin/topic-policies";

/// Starts the watch task (broker start).
pub(crate) async fn start(service: &Arc<Service>) -> Result<(), vela_meta::MetaError> {
    let namespaces = service.meta.watch(NAMESPACES_PATH).await?;
    let topics = service.meta.watch(TOPIC_POLICIES_PATH).await?;
    tokio::spawn(run(Arc::downgrade(service), namespaces, topics));
    Ok(())
}

/// What a changed key names.
#[derive(Debug, PartialEq, Eq)]
enum Changed {
    Namespace(NamespaceName),
    Topic(TopicName),
}

fn changed(key: &str) -> Option<Changed> {
    if let Some(rest) = key.strip_prefix(TOPIC_POLICIES_PATH) {
        let parts: Vec<String> = rest
            .split('/')
            .filter(|s| !s.is_empty())
            .map(decode_segment)
            .collect();
        let [tenant, namespace, domain, local] = parts.as_slice() else {
            return None;
        };
        return TopicName::parse(&format!("{domain}://{tenant}/{namespace}/{local}"))
            .ok()
            .map(Changed::Topic);
    }
    let rest = key.strip_prefix(NAMESPACES_PATH)?;
    let parts: Vec<String> = rest
        .split('/')
        .filter(|s| !s.is_empty())
        .map(decode_segment)
        .collect();
    let [tenant, namespace] = parts.as_slice() else {
        return None;
    };
    NamespaceName::parse(&format!("{tenant}/{namespace}"))
        .ok()
        .map(Changed::Namespace)
}

async fn run(
    service: Weak<Service>,
    mut namespaces: vela_meta::Watcher,
    mut topics: vela_meta::Watcher,
) {
    loop {
        let event = tokio::select! {
            event = namespaces.recv() => event,
            event = topics.recv() => event,
        };
        let Some(event) = event else {
            return;
        };
        let Some(service) = service.upgrade() else {
            return;
        };
        let result = match event {
            WatchEvent::Put { key, .. } | WatchEvent::Delete { key } => match changed(&key) {
                Some(Changed::Namespace(ns)) => reapply_namespace(&service, &ns).await,
                Some(Changed::Topic(topic)) => reapply_topic(&service, &topic).await,
                None => Ok(()),
            },
            WatchEvent::Lagged => reapply_all(&service).await,
        };
        if let Err(error) = result {
            tracing::warn!(%error, "stored policies not re-applied");
        }
    }
}

async fn reapply_namespace(
    service: &Service,
    ns: &NamespaceName,
) -> Result<(), crate::error::AdminError> {
    let served = service
        .served_topic_handles()
        .iter()
        .any(|t| t.name.namespace == *ns);
    if !served {
        return Ok(());
    }
    if let Some(policies) = service.admin.namespace_policies(ns).await? {
        service.apply_policies(ns, &policies);
    }
    Ok(())
}

async fn reapply_topic(
    service: &Service,
    topic: &TopicName,
) -> Result<(), crate::error::AdminError> {
    let base = topic.base();
    let served = service
        .served_topic_handles()
        .iter()
        .any(|t| t.name.base() == base);
    if !served {
        return Ok(());
    }
    let record = service.admin.topic_record(&base).await?;
    service
        .apply_topic_record(&base, &record)
        .await
        .map_err(crate::error::AdminError::Service)
}

async fn reapply_all(service: &Service) -> Result<(), crate::error::AdminError> {
    let mut bases: Vec<TopicName> = service
        .served_topic_handles()
        .iter()
        .map(|t| t.name.base())
        .collect();
    bases.sort_by_key(|t| t.to_string());
    bases.dedup();
    for base in bases {
        reapply_topic(service, &base).await?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn keys_name_what_changed() {
        assert_eq!(
            changed("/admin/namespaces/public/default"),
            Some(Changed::Namespace(
                NamespaceName::parse("public/default").unwrap()
            ))
        );
        assert_eq!(
            changed("/admin/topic-policies/public/default/persistent/t%2D1"),
            Some(Changed::Topic(
                TopicName::parse("persistent://public/default/t-1").unwrap()
            ))
        );
        assert_eq!(changed("/admin/namespaces/public"), None);
        assert_eq!(changed("/admin/tenants/public"), None);
    }
}
