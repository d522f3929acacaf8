//! Who serves a topic: this broker's URLs as lookups answer them and its
//! cluster registration publishes them, and the answer to a lookup
//! (`Connect` here or `Redirect` to the owner).
//!
//! Owns nothing of its own. Never: acquires or releases a bundle
//! (`ownership` decides, `served` releases on unload).

use super::{Service, ownership_error};
use crate::error::ServiceError;
use crate::ownership::{BrokerInfo, LoadReport, LookupAnswer};
use crate::topic_name::TopicName;

impl Service {
    /// This broker's URLs as lookups answer them and its cluster
    /// registration publishes them: the Pulsar URL (plain, else TLS), the
    /// TLS one, the admin URL (plain, else HTTPS) and the HTTPS one (each
    /// the internal advertised listener's when it has one), and its
    /// advertised listeners. Read after the HTTP listeners started.
    pub(crate) fn me(&self) -> BrokerInfo {
        let config = &self.config;
        let https_url = config
            .listener_url(|l| &l.https_url)
            .or_else(|| self.https_url.get().cloned());
        let http_url = config
            .listener_url(|l| &l.http_url)
            .or_else(|| self.http_url.get().cloned())
            .or_else(|| https_url.clone());
        BrokerInfo {
            id: config.broker_id(),
            service_url: self.advertised_url.clone(),
            service_url_tls: config.advertised_tls_url(),
            http_url: http_url.unwrap_or_default(),
            http_url_tls: https_url,
            load: LoadReport::default(),
            listeners: config.advertised_listeners.listeners.clone(),
        }
    }

    /// Who serves `topic`, with all its URLs: `Connect` (it owns the topic;
    /// this broker itself in standalone mode) or `Redirect` (the client must
    /// ask that broker, authoritatively). Fails when the namespace does not
    /// exist.
    pub(crate) async fn lookup(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<LookupAnswer, ServiceError> {
        self.namespace_policies_of(topic).await?;
        let Some(ownership) = self.ownership.get() else {
            return Ok(LookupAnswer::Connect(self.me()));
        };
        ownership
            .lookup(topic, authoritative)
            .await
            .map_err(ownership_error)
    }
}
