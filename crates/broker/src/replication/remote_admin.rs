//! A remote cluster's admin API, as replicators need it: creating a
//! partitioned topic's metadata there when a partition of it replicates
//! (Pulsar creates it on every replication cluster, with
//! `createLocalTopicOnly`, so the remote's clients see the same
//! partitioned topic).
//!
//! Owns: one blocking HTTP agent per remote (ureq, run in blocking tasks),
//! the remote's `serviceUrl` (`serviceUrlTls` when TLS is on) and its
//! `Authorization` header (the replicators' token).
//! Never: blocks a worker, logs the token, or changes a remote topic that
//! has partitions already (a different count is reported, not fixed).

use std::sync::Arc;
use std::time::Duration;

use crate::topic_name::{TopicName, encode_segment};

/// Time one request to a remote's admin API may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(30);

/// Largest answer body read.
const ANSWER_BYTES_MAX: u64 = 64 << 10;

/// The admin API of one remote cluster.
pub(super) struct RemoteAdmin {
    agent: ureq::Agent,
    base: String,
    /// `Bearer <token>`, when the replicators authenticate.
    authorization: Option<String>,
}

impl std::fmt::Debug for RemoteAdmin {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteAdmin")
            .field("base", &self.base)
            .finish_non_exhaustive()
    }
}

/// What the remote said about a partitioned topic.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Created {
    /// Created now, or there with this many partitions already.
    Same,
    /// There with another count of partitions.
    Other(u32),
}

impl RemoteAdmin {
    /// The admin API at `base` (`http://` or `https://host:port`);
    /// `roots`: PEM file contents its certificate must chain to.
    pub(super) fn new(
        base: &str,
        roots: Option<&[u8]>,
        token: Option<&str>,
    ) -> Result<RemoteAdmin, String> {
        Ok(RemoteAdmin {
            agent: crate::broker_client::admin_agent(roots, REQUEST_TIMEOUT)?,
            base: base.trim_end_matches('/').to_string(),
            authorization: token.map(|t| format!("Bearer {t}")),
        })
    }

    /// Makes `topic` (a base name) a partitioned topic of `partitions` on
    /// the remote, unless it is one there already.
    pub(super) async fn ensure_partitioned(
        self: &Arc<RemoteAdmin>,
        topic: &TopicName,
        partitions: u32,
    ) -> Result<Created, String> {
        let path = format!(
            "{}/admin/v2/{}/{}/{}/{}/partitions",
            self.base,
            topic.domain.as_str(),
            encode_segment(&topic.namespace.tenant),
            encode_segment(&topic.namespace.namespace),
            encode_segment(&topic.local),
        );
        let this = Arc::clone(self);
        tokio::task::spawn_blocking(move || this.ensure_blocking(&path, partitions))
            .await
            .map_err(|e| e.to_string())?
    }

    fn ensure_blocking(&self, path: &str, partitions: u32) -> Result<Created, String> {
        let (status, body) = self.call("GET", path, None)?;
        if status == 200 {
            let doc: serde_json::Value = serde_json::from_str(&body).map_err(|e| e.to_string())?;
            let there = doc["partitions"].as_u64().unwrap_or(0);
            if there > 0 {
                return Ok(if there == u64::from(partitions) {
                    Created::Same
                } else {
                    Created::Other(u32::try_from(there).unwrap_or(u32::MAX))
                });
            }
        }
        let put = format!("{path}?createLocalTopicOnly=true");
        match self.call("PUT", &put, Some(&partitions.to_string()))? {
            (status, _) if (200..300).contains(&status) || status == 409 => Ok(Created::Same),
            (status, body) => Err(format!("PUT {put}: HTTP {status} {body}")),
        }
    }

    fn call(&self, method: &str, url: &str, body: Option<&str>) -> Result<(u16, String), String> {
        let auth = self.authorization.as_deref();
        let result = match body {
            None => {
                let request = self.agent.get(url);
                match auth {
                    Some(value) => request.header("Authorization", value).call(),
                    None => request.call(),
                }
            }
            Some(body) => {
                let request = self
                    .agent
                    .put(url)
                    .header("Content-Type", "application/json");
                match auth {
                    Some(value) => request.header("Authorization", value).send(body),
                    None => request.send(body),
                }
            }
        };
        let mut response = result.map_err(|e| format!("{method} {url}: {e}"))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .with_config()
            .limit(ANSWER_BYTES_MAX)
            .read_to_string()
            .map_err(|e| format!("{method} {url}: {e}"))?;
        Ok((status, text))
    }
}
