//! Topic-level policies and topic properties, kept in the metadata store:
//! `/admin/topic-policies/{tenant}/{namespace}/{domain}/{local}` → a
//! [`TopicRecord`] (JSON). A partitioned topic's record is its base name's,
//! shared by its partitions, as Pulsar keys topic policies by the
//! partitioned topic.
//!
//! Why the metadata store and not a system topic (Pulsar's
//! `__change_events`): the store is already where namespace policies, topic
//! registrations and ownership live, it is replicated by etcd in a cluster
//! (so a record survives restarts and ownership moves, and every broker
//! reads the same one), and a topic load reads one key rather than
//! replaying a topic. A change is applied by the broker that made it to the
//! topics it serves; other brokers read the record when they load the topic
//! (a topic is served by one broker at a time).
//!
//! Never: checks values (`policy_specs`) or applies them (`policies`).

use bytes::Bytes;
use vela_meta::{ExpectedVersion, MetaError};

use super::records::TopicRecord;
use super::{Admin, AdminError, topic_key};
use crate::topic_name::TopicName;

/// Attempts of a read-change-write of one record before giving up (another
/// admin request changed it each time).
const UPDATE_ATTEMPTS_MAX: usize = 16;

fn record_key(topic: &TopicName) -> String {
    topic_key("topic-policies", &topic.base())
}

impl Admin {
    /// The topic's record (empty when none was stored).
    pub async fn topic_record(&self, topic: &TopicName) -> Result<TopicRecord, AdminError> {
        let key = record_key(topic);
        let Some((value, _)) = self.meta.get(&key).await? else {
            return Ok(TopicRecord::default());
        };
        serde_json::from_slice(&value).map_err(|e| AdminError::Corrupt {
            key,
            reason: e.to_string(),
        })
    }

    /// Reads, changes and stores the topic's record (compare-and-set, retried
    /// when another request changed it meanwhile); the record stored.
    pub async fn update_topic_record(
        &self,
        topic: &TopicName,
        change: impl Fn(&mut TopicRecord) -> Result<(), AdminError>,
    ) -> Result<TopicRecord, AdminError> {
        let key = record_key(topic);
        for _ in 0..UPDATE_ATTEMPTS_MAX {
            let (mut record, expected) = match self.meta.get(&key).await? {
                Some((value, version)) => {
                    let record: TopicRecord =
                        serde_json::from_slice(&value).map_err(|e| AdminError::Corrupt {
                            key: key.clone(),
                            reason: e.to_string(),
                        })?;
                    (record, ExpectedVersion::Is(version))
                }
                None => (TopicRecord::default(), ExpectedVersion::Absent),
            };
            change(&mut record)?;
            record.validate()?;
            let result = if record.is_empty() {
                match expected {
                    ExpectedVersion::Absent => return Ok(record),
                    _ => self.meta.delete(&key, expected).await,
                }
            } else {
                let value =
                    serde_json::to_vec(&record).map_err(|e| AdminError::Invalid(e.to_string()))?;
                self.meta
                    .put(&key, Bytes::from(value), expected)
                    .await
                    .map(|_| ())
            };
            match result {
                Ok(()) => return Ok(record),
                Err(
                    MetaError::BadVersion { .. }
                    | MetaError::Exists { .. }
                    | MetaError::NotFound { .. },
                ) => continue,
                Err(e) => return Err(e.into()),
            }
        }
        Err(AdminError::Busy(format!(
            "the policies of {topic} changed {UPDATE_ATTEMPTS_MAX} times while being updated; \
             retry"
        )))
    }

    /// Forgets the topic's record (the topic was deleted); absent is fine.
    pub async fn delete_topic_record(&self, topic: &TopicName) -> Result<(), AdminError> {
        match self
            .meta
            .delete(&record_key(topic), ExpectedVersion::Any)
            .await
        {
            Ok(()) | Err(MetaError::NotFound { .. }) => Ok(()),
            Err(e) => Err(e.into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use super::*;

    #[tokio::test]
    async fn records_are_shared_by_partitions_and_removed_when_empty() {
        let admin = Admin::new(Arc::new(vela_meta::MemoryStore::new()));
        let base = TopicName::parse("persistent://public/default/p").unwrap();
        let stored = admin
            .update_topic_record(&base.partition(2), |r| {
                r.policies.insert("maxProducers".into(), 3.into());
                Ok(())
            })
            .await
            .unwrap();
        assert_eq!(admin.topic_record(&base).await.unwrap(), stored);
        assert!(
            admin
                .update_topic_record(&base, |r| {
                    r.properties = (0..=super::super::PROPERTIES_MAX)
                        .map(|i| (i.to_string(), String::new()))
                        .collect();
                    Ok(())
                })
                .await
                .is_err()
        );
        admin
            .update_topic_record(&base, |r| {
                r.policies.clear();
                Ok(())
            })
            .await
            .unwrap();
        assert!(admin.meta.get(&record_key(&base)).await.unwrap().is_none());
    }
}
