//! Schema registry: versioned schemas per topic in the metadata store.
//!
//! Key layout: `/schemas/{tenant}/{namespace}/{local}/{version:020}` → the
//! protobuf-encoded `Schema` (partitions share their base topic's schemas).
//! Versions count from 0. On the wire a version is 8 bytes, big-endian (the
//! Java broker's `LongSchemaVersion`). Beside each version,
//! `{version:020}-time` holds when it was registered (ms, decimal), for the
//! REST API's `timestamp`.
//!
//! Compatibility (`compat`, Pulsar's rules and strategies; `avro`, Avro's
//! resolution rules): a schema identical (type, data, properties) to an
//! existing version reuses that version; a new one is checked against the
//! versions with the topic's strategy before it becomes the next version; a
//! consumer's schema is checked without being stored (unless the topic has
//! no schema and no producer: then it is registered, as Pulsar's
//! `addSchemaIfIdleOrCheckCompatible`).
//! The topic-level strategy is kept here too:
//! `/schema-policies/{tenant}/{namespace}/{local}` → its name.
//! Never: decides which strategy applies (the service resolves topic,
//! namespace and broker default).

pub(crate) mod avro;
pub mod compat;

pub use compat::CompatibilityStrategy;
use compat::same_schema;

use std::sync::Arc;

use bytes::Bytes;
use prost::Message as _;
use vela_meta::{ExpectedVersion, MetaError, MetadataStore};
use vela_wire::proto::{self, ServerError};

use crate::error::ServiceError;
use crate::topic_name::{TopicName, encode_segment};

/// Versions kept per topic: a bound on the registry's key count per topic.
/// When reached: new schemas get IncompatibleSchema.
pub const SCHEMA_VERSIONS_MAX: u64 = 1000;

/// Encodes a schema version as the Java broker does (8 bytes, big-endian).
pub fn encode_version(version: u64) -> Bytes {
    Bytes::copy_from_slice(&version.to_be_bytes())
}

/// Decodes an 8-byte big-endian version.
pub fn decode_version(bytes: &[u8]) -> Option<u64> {
    let array: [u8; 8] = bytes.try_into().ok()?;
    Some(u64::from_be_bytes(array))
}

/// True for "no schema" (None type with empty data, or bytes schema).
pub fn is_empty_schema(schema: &proto::Schema) -> bool {
    schema.r#type == proto::schema::Type::None as i32 && schema.schema_data.is_empty()
}

/// The registry.
#[derive(Debug, Clone)]
pub struct SchemaRegistry {
    meta: Arc<dyn MetadataStore>,
}

fn topic_dir(topic: &TopicName) -> String {
    let base = topic.base();
    format!(
        "/schemas/{}/{}/{}",
        encode_segment(&base.namespace.tenant),
        encode_segment(&base.namespace.namespace),
        encode_segment(&base.local)
    )
}

fn policy_key(topic: &TopicName) -> String {
    let base = topic.base();
    format!(
        "/schema-policies/{}/{}/{}",
        encode_segment(&base.namespace.tenant),
        encode_segment(&base.namespace.namespace),
        encode_segment(&base.local)
    )
}

fn meta_error(e: MetaError) -> ServiceError {
    ServiceError::new(ServerError::MetadataError, e.to_string())
}

impl SchemaRegistry {
    /// A registry over `meta`.
    pub fn new(meta: Arc<dyn MetadataStore>) -> SchemaRegistry {
        SchemaRegistry { meta }
    }

    async fn versions(&self, topic: &TopicName) -> Result<Vec<u64>, ServiceError> {
        let children = self
            .meta
            .children(&topic_dir(topic))
            .await
            .map_err(meta_error)?;
        let mut versions: Vec<u64> = children.iter().filter_map(|c| c.parse().ok()).collect();
        versions.sort_unstable();
        Ok(versions)
    }

    /// A given version, or the latest when `version` is `None`.
    pub async fn get(
        &self,
        topic: &TopicName,
        version: Option<u64>,
    ) -> Result<Option<(u64, proto::Schema)>, ServiceError> {
        let version = match version {
            Some(v) => v,
            None => match self.versions(topic).await?.last() {
                Some(v) => *v,
                None => return Ok(None),
            },
        };
        let key = format!("{}/{version:020}", topic_dir(topic));
        let Some((value, _)) = self.meta.get(&key).await.map_err(meta_error)? else {
            return Ok(None);
        };
        let schema = proto::Schema::decode(value).map_err(|e| {
            ServiceError::new(
                ServerError::MetadataError,
                format!("corrupt schema at {key}: {e}"),
            )
        })?;
        Ok(Some((version, schema)))
    }

    /// Every version of the topic's schema, oldest first.
    pub async fn all(&self, topic: &TopicName) -> Result<Vec<(u64, proto::Schema)>, ServiceError> {
        let mut all = Vec::new();
        for version in self.versions(topic).await? {
            if let Some(found) = self.get(topic, Some(version)).await? {
                all.push(found);
            }
        }
        Ok(all)
    }

    /// The version of `schema`, registering it when new and compatible
    /// with the versions under `strategy` (a producer's schema).
    pub async fn get_or_create(
        &self,
        topic: &TopicName,
        schema: &proto::Schema,
        strategy: CompatibilityStrategy,
    ) -> Result<u64, ServiceError> {
        let all = self.all(topic).await?;
        if let Some((version, _)) = all
            .iter()
            .find(|(_, existing)| same_schema(existing, schema))
        {
            return Ok(*version);
        }
        let versions: Vec<proto::Schema> = all.iter().map(|(_, s)| s.clone()).collect();
        compat::check_new_schema(&versions, schema, strategy)?;
        let next = all.last().map_or(0, |(v, _)| v + 1);
        if next >= SCHEMA_VERSIONS_MAX {
            return Err(ServiceError::new(
                ServerError::IncompatibleSchema,
                "SCHEMA_VERSIONS_MAX reached",
            ));
        }
        let key = format!("{}/{next:020}", topic_dir(topic));
        let value = Bytes::from(schema.encode_to_vec());
        match self.meta.put(&key, value, ExpectedVersion::Absent).await {
            Ok(_) => {
                let now_ms = std::time::SystemTime::now()
                    .duration_since(std::time::UNIX_EPOCH)
                    .map_or(0, |d| d.as_millis());
                self.meta
                    .put(
                        &format!("{key}-time"),
                        Bytes::from(now_ms.to_string()),
                        ExpectedVersion::Any,
                    )
                    .await
                    .map_err(meta_error)?;
                Ok(next)
            }
            Err(MetaError::Exists { .. }) => Err(ServiceError::new(
                ServerError::ServiceNotReady,
                "concurrent schema registration, retry",
            )),
            Err(e) => Err(meta_error(e)),
        }
    }

    /// Whether `schema` would be accepted by `get_or_create` under
    /// `strategy` (an identical version counts as accepted), without
    /// registering it (Pulsar's `isCompatible`).
    pub async fn is_compatible(
        &self,
        topic: &TopicName,
        schema: &proto::Schema,
        strategy: CompatibilityStrategy,
    ) -> Result<bool, ServiceError> {
        let all = self.all(topic).await?;
        if all
            .iter()
            .any(|(_, existing)| same_schema(existing, schema))
        {
            return Ok(true);
        }
        let versions: Vec<proto::Schema> = all.into_iter().map(|(_, s)| s).collect();
        match compat::check_new_schema(&versions, schema, strategy) {
            Ok(()) => Ok(true),
            Err(e) if e.code == ServerError::IncompatibleSchema => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// A consumer's schema: checked against the versions under `strategy`
    /// (Pulsar's `checkConsumerCompatibility`), or registered when the topic
    /// has no schema and is `idle` (no producer).
    pub async fn check_consumer(
        &self,
        topic: &TopicName,
        schema: &proto::Schema,
        strategy: CompatibilityStrategy,
        idle: bool,
    ) -> Result<(), ServiceError> {
        let all = self.all(topic).await?;
        if all.is_empty() && idle {
            return self
                .get_or_create(topic, schema, strategy)
                .await
                .map(|_| ());
        }
        let versions: Vec<proto::Schema> = all.into_iter().map(|(_, s)| s).collect();
        compat::check_consumer_schema(&versions, schema, strategy)
    }

    /// The topic-level strategy, if one is set.
    pub async fn topic_strategy(
        &self,
        topic: &TopicName,
    ) -> Result<Option<CompatibilityStrategy>, ServiceError> {
        let Some((value, _)) = self
            .meta
            .get(&policy_key(topic))
            .await
            .map_err(meta_error)?
        else {
            return Ok(None);
        };
        let name = String::from_utf8_lossy(&value);
        CompatibilityStrategy::parse(&name).map_err(|e| {
            ServiceError::new(ServerError::MetadataError, format!("stored strategy: {e}"))
        })
    }

    /// Sets (`Some`) or removes (`None`) the topic-level strategy.
    pub async fn set_topic_strategy(
        &self,
        topic: &TopicName,
        strategy: Option<CompatibilityStrategy>,
    ) -> Result<(), ServiceError> {
        let key = policy_key(topic);
        match strategy {
            Some(strategy) => self
                .meta
                .put(
                    &key,
                    Bytes::from_static(strategy.name().as_bytes()),
                    ExpectedVersion::Any,
                )
                .await
                .map(|_| ())
                .map_err(meta_error),
            None => match self.meta.delete(&key, ExpectedVersion::Any).await {
                Ok(_) | Err(MetaError::NotFound { .. }) => Ok(()),
                Err(e) => Err(meta_error(e)),
            },
        }
    }

    /// When a version was registered (ms; 0 when not recorded).
    pub async fn registered_at_ms(
        &self,
        topic: &TopicName,
        version: u64,
    ) -> Result<u64, ServiceError> {
        let key = format!("{}/{version:020}-time", topic_dir(topic));
        Ok(match self.meta.get(&key).await.map_err(meta_error)? {
            Some((value, _)) => std::str::from_utf8(&value)
                .ok()
                .and_then(|s| s.parse().ok())
                .unwrap_or(0),
            None => 0,
        })
    }

    /// The version an identical schema (type, data, properties) has.
    pub async fn version_of(
        &self,
        topic: &TopicName,
        schema: &proto::Schema,
    ) -> Result<Option<u64>, ServiceError> {
        Ok(self
            .all(topic)
            .await?
            .into_iter()
            .find(|(_, existing)| same_schema(existing, schema))
            .map(|(version, _)| version))
    }

    /// Deletes every version of the topic's schema; the newest version
    /// deleted, `None` when it had none. The next schema registered starts
    /// at version 0 again (Pulsar keeps counting after a non-forced delete).
    /// The topic-level strategy is a policy and stays.
    pub async fn delete_all(&self, topic: &TopicName) -> Result<Option<u64>, ServiceError> {
        let dir = topic_dir(topic);
        let versions = self.versions(topic).await?;
        for child in self.meta.children(&dir).await.map_err(meta_error)? {
            match self
                .meta
                .delete(&format!("{dir}/{child}"), ExpectedVersion::Any)
                .await
            {
                Ok(()) | Err(MetaError::NotFound { .. }) => {}
                Err(e) => return Err(meta_error(e)),
            }
        }
        Ok(versions.last().copied())
    }

    /// True when the topic has at least one schema.
    pub async fn has_schema(&self, topic: &TopicName) -> Result<bool, ServiceError> {
        Ok(!self.versions(topic).await?.is_empty())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn schema(kind: proto::schema::Type, data: &[u8]) -> proto::Schema {
        proto::Schema {
            name: "s".into(),
            schema_data: Bytes::copy_from_slice(data),
            r#type: kind as i32,
            properties: vec![],
        }
    }

    const ALWAYS: CompatibilityStrategy = CompatibilityStrategy::AlwaysCompatible;

    #[tokio::test]
    async fn topic_strategies_are_stored_and_removed() {
        let registry = SchemaRegistry::new(Arc::new(vela_meta::MemoryStore::new()));
        let topic = TopicName::parse("t-partition-2").unwrap();
        assert_eq!(registry.topic_strategy(&topic).await.unwrap(), None);
        let forward = Some(CompatibilityStrategy::Forward);
        registry.set_topic_strategy(&topic, forward).await.unwrap();
        let base = TopicName::parse("t").unwrap();
        assert_eq!(registry.topic_strategy(&base).await.unwrap(), forward);
        registry.set_topic_strategy(&topic, None).await.unwrap();
        registry.set_topic_strategy(&topic, None).await.unwrap();
        assert_eq!(registry.topic_strategy(&topic).await.unwrap(), None);
    }

    #[tokio::test]
    async fn versions_are_reused_and_incremented() {
        let registry = SchemaRegistry::new(Arc::new(vela_meta::MemoryStore::new()));
        let topic = TopicName::parse("t-partition-1").unwrap();
        let json_a = schema(proto::schema::Type::Json, b"{\"a\":1}");
        let json_b = schema(proto::schema::Type::Json, b"{\"b\":1}");
        assert_eq!(
            registry
                .get_or_create(&topic, &json_a, ALWAYS)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            registry
                .get_or_create(&topic, &json_a, ALWAYS)
                .await
                .unwrap(),
            0
        );
        assert_eq!(
            registry
                .get_or_create(&TopicName::parse("t").unwrap(), &json_b, ALWAYS)
                .await
                .unwrap(),
            1
        );
        let string = schema(proto::schema::Type::String, b"");
        let err = registry
            .get_or_create(&topic, &string, CompatibilityStrategy::Full)
            .await
            .unwrap_err();
        assert_eq!(err.code, ServerError::IncompatibleSchema);
        assert_eq!(registry.get(&topic, None).await.unwrap().unwrap().0, 1);
        assert_eq!(decode_version(&encode_version(258)), Some(258));
        assert_eq!(encode_version(1).as_ref(), &[0, 0, 0, 0, 0, 0, 0, 1]);
    }
}
