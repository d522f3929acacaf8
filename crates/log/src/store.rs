//! JSON records in the metadata store, with the log's error mapping: a CAS
//! conflict means another owner changed the record (`LogError::Fenced`).

use std::sync::Arc;

use bytes::Bytes;
use serde::Serialize;
use serde::de::DeserializeOwned;
use vela_meta::{ExpectedVersion, MetaError, MetadataStore};

pub(crate) use vela_meta::Version;

use crate::error::LogError;

#[derive(Debug, Clone)]
pub(crate) struct Store {
    meta: Arc<dyn MetadataStore>,
}

fn meta_error(error: MetaError) -> LogError {
    match error {
        MetaError::BadVersion { key, .. } | MetaError::Exists { key, .. } => LogError::Fenced(key),
        other => LogError::Metadata(other.to_string()),
    }
}

impl Store {
    pub(crate) fn new(meta: Arc<dyn MetadataStore>) -> Store {
        Store { meta }
    }

    pub(crate) async fn get_json<T: DeserializeOwned>(
        &self,
        key: &str,
    ) -> Result<Option<(T, Version)>, LogError> {
        match self.meta.get(key).await.map_err(meta_error)? {
            None => Ok(None),
            Some((bytes, version)) => {
                let value = serde_json::from_slice(&bytes).map_err(|error| {
                    LogError::Metadata(format!("{key}: unreadable record: {error}"))
                })?;
                Ok(Some((value, version)))
            }
        }
    }

    fn encode<T: Serialize>(key: &str, value: &T) -> Result<Bytes, LogError> {
        serde_json::to_vec(value)
            .map(Bytes::from)
            .map_err(|error| LogError::Metadata(format!("{key}: cannot encode record: {error}")))
    }

    /// Creates `key`; `Fenced` if it already exists.
    pub(crate) async fn create_json<T: Serialize>(
        &self,
        key: &str,
        value: &T,
    ) -> Result<Version, LogError> {
        let bytes = Store::encode(key, value)?;
        self.meta
            .put(key, bytes, ExpectedVersion::Absent)
            .await
            .map_err(meta_error)
    }

    /// Replaces `key` if it still has `version`; `Fenced` if not.
    pub(crate) async fn update_json<T: Serialize>(
        &self,
        key: &str,
        value: &T,
        version: Version,
    ) -> Result<Version, LogError> {
        let bytes = Store::encode(key, value)?;
        self.meta
            .put(key, bytes, ExpectedVersion::Is(version))
            .await
            .map_err(meta_error)
    }

    /// Deletes `key`; absent is fine.
    pub(crate) async fn delete(&self, key: &str) -> Result<(), LogError> {
        match self.meta.delete(key, ExpectedVersion::Any).await {
            Ok(()) | Err(MetaError::NotFound { .. }) => Ok(()),
            Err(other) => Err(meta_error(other)),
        }
    }

    pub(crate) async fn children(&self, path: &str) -> Result<Vec<String>, LogError> {
        self.meta.children(path).await.map_err(meta_error)
    }
}
