//! The served topics once open: listing them, unloading (one topic, or a
//! bundle's, handing the bundle back), deleting, and closing them all at
//! shutdown.
//!
//! Owns nothing of its own: the maps are `Service::topics` and
//! `Service::np_topics`. Never: opens a topic except to delete one that is
//! not served (through `Service::topic`), or decides ownership (`ownership`
//! does; it is only released here).

use std::sync::Arc;

use vela_wire::proto::ServerError;

use super::{Service, ownership_error};
use crate::error::ServiceError;
use crate::ownership::BundleRange;
use crate::topic::Topic;
use crate::topic_name::{TopicDomain, TopicName};

impl Service {
    /// Unloads every served topic of `range` in `ns`, then gives the bundle up.
    pub(crate) async fn unload_bundle(
        &self,
        ns: &crate::topic_name::NamespaceName,
        range: &BundleRange,
    ) -> Result<usize, ServiceError> {
        let Some(ownership) = self.ownership.get() else {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                "bundles are served by one broker in standalone mode",
            ));
        };
        let unloaded = self.unload_topics_of(ns, range).await?;
        ownership
            .release(ns, range)
            .await
            .map_err(ownership_error)?;
        Ok(unloaded)
    }

    /// Unloads every served topic of `range` in `ns`.
    pub(crate) async fn unload_topics_of(
        &self,
        ns: &crate::topic_name::NamespaceName,
        range: &BundleRange,
    ) -> Result<usize, ServiceError> {
        let mut unloaded = 0;
        for name in self.served_topics() {
            let Ok(topic) = TopicName::parse(&name) else {
                continue;
            };
            if &topic.namespace == ns && range.contains(crate::ownership::topic_hash(&topic)) {
                self.unload(&name).await?;
                unloaded += 1;
            }
        }
        Ok(unloaded)
    }

    /// Full names of the topics served now (persistent and
    /// non-persistent), sorted.
    pub(crate) fn served_topics(&self) -> Vec<String> {
        let mut names: Vec<String> = self
            .topics
            .lock()
            .iter()
            .filter(|(_, c)| c.get().is_some())
            .map(|(n, _)| n.to_string())
            .collect();
        names.extend(self.np_topics.lock().keys().cloned());
        names.sort();
        names
    }

    /// The topics served now (opened), in no particular order.
    pub(crate) fn served_topic_handles(&self) -> Vec<Arc<Topic>> {
        self.topics
            .lock()
            .values()
            .filter_map(|c| c.get().cloned())
            .filter(|t| !t.log.is_closed())
            .collect()
    }

    /// The topic if it is served now.
    pub(crate) fn served_topic(&self, full_name: &str) -> Option<Arc<Topic>> {
        self.topics
            .lock()
            .get(full_name)
            .and_then(|c| c.get().cloned())
    }

    /// Unloads a served topic: its clients are closed (they look up again and
    /// re-attach, reopening it). False when it was not served.
    pub(crate) async fn unload(&self, full_name: &str) -> Result<bool, ServiceError> {
        let served = self
            .topics
            .lock()
            .remove(full_name)
            .and_then(|c| c.get().cloned());
        match served {
            Some(topic) => {
                topic.close().await?;
                tracing::info!(topic = full_name, "topic unloaded");
                Ok(true)
            }
            None => {
                let np = self.np_topics.lock().remove(full_name);
                let Some(topic) = np else {
                    return Ok(false);
                };
                topic.close().await;
                tracing::info!(topic = full_name, "non-persistent topic unloaded");
                Ok(true)
            }
        }
    }

    /// Deletes a (non-partitioned or partition) topic: clients closed, log,
    /// cursors and ledgers deleted, registration removed.
    pub(crate) async fn delete_topic(&self, topic: &TopicName) -> Result<(), ServiceError> {
        let full_name = topic.to_string();
        if topic.domain == TopicDomain::NonPersistent {
            // Nothing is stored: closing its clients is all there is.
            let served = self.np_topics.lock().remove(&full_name);
            let Some(served) = served else {
                return Err(ServiceError::new(
                    ServerError::TopicNotFound,
                    format!("Topic {topic} not found"),
                ));
            };
            served.close().await;
            tracing::info!(topic = %full_name, "non-persistent topic deleted");
            return Ok(());
        }
        let served = self
            .topics
            .lock()
            .remove(full_name.as_str())
            .and_then(|c| c.get().cloned());
        let served = match served {
            Some(served) => served,
            None => {
                if !self.admin.topic_exists(topic).await? {
                    return Err(ServiceError::new(
                        ServerError::TopicNotFound,
                        format!("Topic {topic} does not exist"),
                    ));
                }
                self.topic(topic, false).await?;
                match self
                    .topics
                    .lock()
                    .remove(full_name.as_str())
                    .and_then(|c| c.get().cloned())
                {
                    Some(served) => served,
                    None => {
                        return Err(ServiceError::new(
                            ServerError::ServiceNotReady,
                            "topic changed while deleting, retry",
                        ));
                    }
                }
            }
        };
        served.delete().await?;
        self.admin.unregister_topic(topic).await?;
        tracing::info!(topic = %full_name, "topic deleted");
        Ok(())
    }

    /// Closes every topic (shutdown), many at once (`shutdown::close_all`).
    pub(crate) async fn close_topics(&self) -> Vec<vela_log::LogError> {
        let topics = self
            .topics
            .lock()
            .drain()
            .filter_map(|(_, c)| c.get().cloned())
            .collect();
        let np = self.np_topics.lock().drain().map(|(_, t)| t).collect();
        crate::shutdown::close_all(topics, np).await
    }
}
