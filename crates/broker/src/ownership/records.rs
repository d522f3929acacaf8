//! What cluster ownership keeps in the metadata store: the keys under
//! `/bundles`, `/brokers/available` and `/ownership`, and the records behind
//! them (a broker's registration with its URLs and load, a namespace's
//! bundle boundaries), with the errors of ownership operations.
//!
//! Owns: the key layout and the JSON of these records (a storage format).
//! Never: reads or writes the store (`ownership` and `session` do).

use std::time::Duration;

use bytes::Bytes;
use serde::{Deserialize, Serialize};
use vela_meta::MetaError;

use super::bundle::BundleRange;
use crate::topic_name::{NamespaceName, encode_segment};

/// Registrations of brokers.
pub const BROKERS_PATH: &str = "/brokers/available";

/// How often a broker refreshes its load report.
pub const LOAD_REPORT_INTERVAL: Duration = Duration::from_secs(5);

/// What a broker publishes about itself.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BrokerInfo {
    /// Its id (`host:port` of its Pulsar listener).
    pub id: String,
    /// `pulsar://host:port` (`pulsar+ssl://` when it has no plain port).
    pub service_url: String,
    /// `pulsar+ssl://host:port` when it has a TLS Pulsar port (absent in
    /// records written before brokers published it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_url_tls: Option<String>,
    /// `http://host:port` (admin API; `https://` when it has no plain port).
    pub http_url: String,
    /// `https://host:port` when it has an HTTPS port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_url_tls: Option<String>,
    /// Load, for placing unowned bundles.
    #[serde(default)]
    pub load: LoadReport,
    /// Its advertised listeners by name (lookups naming one get its URLs).
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub listeners: std::collections::BTreeMap<String, crate::listeners::AdvertisedListener>,
}

/// The URLs a lookup answers for a broker, maybe through one of its
/// advertised listeners.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LookupUrls {
    /// `pulsar://host:port` (Pulsar's brokerServiceUrl); `None` for a
    /// broker (or listener) without a plain port.
    pub service_url: Option<String>,
    /// `pulsar+ssl://host:port` (brokerServiceUrlTls).
    pub service_url_tls: Option<String>,
    /// `http://host:port` of its admin API.
    pub http_url: String,
    /// `https://host:port` of its admin API.
    pub http_url_tls: Option<String>,
}

impl BrokerInfo {
    /// `service_url` when it is a plain `pulsar://` URL (a TLS-only broker
    /// publishes none: Pulsar's brokerServiceUrl is then absent).
    pub fn plain_service_url(&self) -> Option<&str> {
        Some(self.service_url.as_str()).filter(|url| url.starts_with("pulsar://"))
    }

    /// Its URLs for a lookup naming `listener` (its own without one); the
    /// error is Pulsar's message for a listener it does not have. A
    /// listener's Pulsar URLs replace the broker's; its HTTP URLs too when
    /// it has them.
    pub fn urls_for(&self, listener: Option<&str>) -> Result<LookupUrls, String> {
        let Some(name) = listener else {
            return Ok(LookupUrls {
                service_url: self.plain_service_url().map(String::from),
                service_url_tls: self.service_url_tls.clone(),
                http_url: self.http_url.clone(),
                http_url_tls: self.http_url_tls.clone(),
            });
        };
        let Some(found) = self.listeners.get(name) else {
            return Err(crate::listeners::unknown_listener(name));
        };
        Ok(LookupUrls {
            service_url: found.service_url.clone(),
            service_url_tls: found.service_url_tls.clone(),
            http_url: found
                .http_url
                .clone()
                .unwrap_or_else(|| self.http_url.clone()),
            http_url_tls: found
                .https_url
                .clone()
                .or_else(|| self.http_url_tls.clone()),
        })
    }
}

/// A broker's load as the others see it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadReport {
    /// Bundles owned.
    pub bundles: u32,
    /// Topics served.
    pub topics: u32,
    /// Messages published per second (last interval).
    pub msg_rate_in: u64,
}

/// Who serves a topic, as a lookup answers it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LookupAnswer {
    /// Connect to this broker (maybe ourselves); it owns the bundle.
    Connect(BrokerInfo),
    /// Ask this broker, authoritatively: it was chosen to own the bundle.
    Redirect(BrokerInfo),
}

/// Failures of ownership operations.
#[derive(Debug, Clone, thiserror::Error)]
pub enum OwnershipError {
    /// The metadata store failed.
    #[error("metadata store: {0}")]
    Meta(#[from] MetaError),
    /// A stored record does not parse.
    #[error("corrupt metadata at {key}: {reason}")]
    Corrupt {
        /// The key.
        key: String,
        /// Why.
        reason: String,
    },
    /// Another broker owns the bundle.
    #[error("bundle {bundle} of {namespace} is owned by {owner}")]
    OwnedElsewhere {
        /// The namespace.
        namespace: String,
        /// The bundle's range name.
        bundle: String,
        /// The owner's service URL.
        owner: String,
    },
    /// No broker is registered (not even this one: its session ended).
    #[error("no broker is available")]
    NoBroker,
    /// This broker's session ended: it owns nothing until it restarts.
    #[error("this broker lost its metadata session")]
    SessionLost,
    /// The bundle cannot be split further, or the namespace has too many.
    #[error("bundle {0} cannot be split")]
    CannotSplit(String),
}

/// Bundle layouts of every namespace.
pub(super) const BUNDLES_PATH: &str = "/bundles";

pub(super) fn bundles_key(ns: &NamespaceName) -> String {
    format!(
        "{BUNDLES_PATH}/{}/{}",
        encode_segment(&ns.tenant),
        encode_segment(&ns.namespace)
    )
}

pub(super) fn owner_key(ns: &NamespaceName, range: &BundleRange) -> String {
    format!(
        "/ownership/{}/{}/{}",
        encode_segment(&ns.tenant),
        encode_segment(&ns.namespace),
        range.name()
    )
}

pub(super) fn broker_key(id: &str) -> String {
    format!("{BROKERS_PATH}/{}", encode_segment(id))
}

#[derive(Debug, Serialize, Deserialize)]
pub(super) struct BundlesRecord {
    pub(super) boundaries: Vec<u64>,
}

pub(super) fn decode<T: serde::de::DeserializeOwned>(
    key: &str,
    bytes: &[u8],
) -> Result<T, OwnershipError> {
    serde_json::from_slice(bytes).map_err(|e| OwnershipError::Corrupt {
        key: key.to_string(),
        reason: e.to_string(),
    })
}

pub(super) fn encode<T: Serialize>(value: &T) -> Bytes {
    // Plain structs of strings and numbers always serialize.
    Bytes::from(serde_json::to_vec(value).unwrap_or_default())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod listener_tests {
    use super::*;

    fn broker(service_url: &str, tls: Option<&str>) -> BrokerInfo {
        BrokerInfo {
            id: "h:1".into(),
            service_url: service_url.into(),
            service_url_tls: tls.map(String::from),
            http_url: "http://h:8080".into(),
            http_url_tls: None,
            load: LoadReport::default(),
            listeners: crate::listeners::parse_advertised_listeners(
                "lan:pulsar+ssl://10.0.0.9:6651",
                None,
            )
            .unwrap()
            .listeners,
        }
    }

    #[test]
    fn a_tls_only_broker_answers_no_plain_url() {
        let tls_only = broker("pulsar+ssl://h:6651", Some("pulsar+ssl://h:6651"));
        let urls = tls_only.urls_for(None).unwrap();
        assert_eq!(urls.service_url, None);
        assert_eq!(urls.service_url_tls.as_deref(), Some("pulsar+ssl://h:6651"));
        let plain = broker("pulsar://h:6650", None).urls_for(None).unwrap();
        assert_eq!(plain.service_url.as_deref(), Some("pulsar://h:6650"));
        let lan = tls_only.urls_for(Some("lan")).unwrap();
        assert_eq!(
            (lan.service_url, lan.service_url_tls.as_deref()),
            (None, Some("pulsar+ssl://10.0.0.9:6651"))
        );
        assert_eq!(lan.http_url, "http://h:8080");
        assert_eq!(
            tls_only.urls_for(Some("wan")).unwrap_err(),
            "the broker do not have wan listener"
        );
    }
}
