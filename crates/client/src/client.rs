//! `Client`: the entry point: service URL, connection pool, topic lookup,
//! partitioned-topic metadata, and producer/consumer ids.
//!
//! Owns: one connection per broker address (reconnected on demand), the
//! lookup protocol (LOOKUP answered with Connect or Redirect, authoritative
//! flag carried along, at most `LOOKUP_REDIRECTS_MAX` hops), and the
//! client-wide memory limit shared by its producers.
//! Never: holds a lock across an `.await` other than the pool's async mutex
//! (which only guards connecting).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use vela_wire::proto::command_lookup_topic_response::LookupType;
use vela_wire::proto::{BaseCommand, CommandLookupTopic, CommandPartitionedTopicMetadata};

use crate::connection::Connection;
use crate::consumer::{Consumer, ConsumerOptions};
use crate::error::ClientError;
use crate::producer::{Producer, ProducerOptions};

/// Lookup hops (redirects) before giving up: a cluster redirects once or
/// twice; more means brokers disagree about ownership.
pub const LOOKUP_REDIRECTS_MAX: usize = 20;

/// Tunables of a client.
#[derive(Debug, Clone)]
pub struct ClientConfig {
    /// Deadline of each request (lookup, create producer, subscribe, ...).
    pub operation_timeout: Duration,
    /// Deadline of TCP connect plus the CONNECT handshake.
    pub connect_timeout: Duration,
    /// Bytes of messages all producers of this client may have pending (sent,
    /// not yet acknowledged) at once; `None`: no client-wide limit (each
    /// producer still has its own).
    pub memory_limit_bytes: Option<usize>,
    /// TLS toward brokers of a `pulsar+ssl://` service URL (the roots
    /// trusted); `None`: such URLs are refused.
    pub tls: Option<Arc<rustls::ClientConfig>>,
    /// A token sent at CONNECT (auth method `token`); `None`: no
    /// credentials.
    pub auth_token: Option<String>,
}

impl Default for ClientConfig {
    fn default() -> ClientConfig {
        ClientConfig {
            operation_timeout: Duration::from_secs(30),
            connect_timeout: Duration::from_secs(10),
            memory_limit_bytes: None,
            tls: None,
            auth_token: None,
        }
    }
}

/// A Pulsar client. Cheap to clone.
#[derive(Debug, Clone)]
pub struct Client {
    pub(crate) inner: Arc<ClientInner>,
}

#[derive(Debug)]
pub(crate) struct ClientInner {
    service_addr: String,
    /// The service URL is `pulsar+ssl://`: every connection is TLS, and
    /// lookups follow the brokers' TLS URLs.
    tls: bool,
    pub(crate) config: ClientConfig,
    pool: tokio::sync::Mutex<HashMap<String, Connection>>,
    next_id: AtomicU64,
    /// Client-wide byte budget of pending messages (`memory_limit_bytes`).
    pub(crate) memory: Option<Arc<Semaphore>>,
}

/// `host:port` of a `pulsar://` URL, or of a `pulsar+ssl://` one when
/// `tls`.
fn parse_url(url: &str, tls: bool) -> Result<String, ClientError> {
    let bad = |reason| ClientError::InvalidUrl {
        url: url.to_string(),
        reason,
    };
    let (scheme, expected) = if tls {
        ("pulsar+ssl://", "expected pulsar+ssl://host:port")
    } else {
        ("pulsar://", "expected pulsar://host:port")
    };
    let rest = url.strip_prefix(scheme).ok_or_else(|| bad(expected))?;
    let rest = rest.trim_end_matches('/');
    // Several hosts: take the first (each is a full broker).
    let first = rest.split(',').next().unwrap_or_default();
    let (host, port) = first.rsplit_once(':').ok_or_else(|| bad("missing :port"))?;
    if host.is_empty() {
        return Err(bad("missing host"));
    }
    port.parse::<u16>().map_err(|_| bad("bad port"))?;
    Ok(first.to_string())
}

impl Client {
    /// A client of the cluster at `url` (`pulsar://host:port`). Connects lazily.
    pub fn new(url: &str, config: ClientConfig) -> Result<Client, ClientError> {
        let tls = url.starts_with("pulsar+ssl://");
        if tls && config.tls.is_none() {
            return Err(ClientError::InvalidUrl {
                url: url.to_string(),
                reason: "a pulsar+ssl:// URL needs ClientConfig::tls (the roots trusted)",
            });
        }
        let service_addr = parse_url(url, tls)?;
        let memory = config
            .memory_limit_bytes
            .map(|bytes| Arc::new(Semaphore::new(bytes.min(Semaphore::MAX_PERMITS))));
        Ok(Client {
            inner: Arc::new(ClientInner {
                service_addr,
                tls,
                config,
                pool: tokio::sync::Mutex::new(HashMap::new()),
                next_id: AtomicU64::new(1),
                memory,
            }),
        })
    }

    /// Creates a producer on `topic` (all partitions of a partitioned topic).
    pub async fn create_producer(
        &self,
        topic: &str,
        options: ProducerOptions,
    ) -> Result<Producer, ClientError> {
        Producer::create(self.clone(), topic, options).await
    }

    /// Subscribes to `topic` (all partitions of a partitioned topic).
    pub async fn subscribe(
        &self,
        topic: &str,
        options: ConsumerOptions,
    ) -> Result<Consumer, ClientError> {
        Consumer::subscribe(self.clone(), topic, options).await
    }

    /// Closes every connection. Producers and consumers still open fail.
    pub async fn close(&self) {
        let mut pool = self.inner.pool.lock().await;
        for (_, connection) in pool.drain() {
            connection.close("client closed");
        }
    }

    /// Partitions of `topic` (0: not partitioned).
    pub async fn partitions(&self, topic: &str) -> Result<u32, ClientError> {
        let connection = self.connection(&self.inner.service_addr).await?;
        let answer = connection
            .request(
                "partitioned metadata",
                self.inner.config.operation_timeout,
                |request_id| {
                    BaseCommand::from(CommandPartitionedTopicMetadata {
                        topic: topic.to_string(),
                        request_id,
                        ..Default::default()
                    })
                },
            )
            .await?;
        let response = answer.partition_metadata_response.ok_or_else(|| {
            ClientError::Protocol("expected PARTITIONED_METADATA_RESPONSE".into())
        })?;
        Ok(response.partitions.unwrap_or(0))
    }

    /// Registers `schema` on `topic` unless it is there (the broker checks
    /// it against the topic's compatibility strategy); its version there.
    /// What a replicator does before sending messages of a schema.
    pub async fn get_or_create_schema(
        &self,
        topic: &str,
        schema: vela_wire::proto::Schema,
    ) -> Result<Vec<u8>, ClientError> {
        let connection = self.lookup(topic).await?;
        let answer = connection
            .request(
                "get or create schema",
                self.inner.config.operation_timeout,
                |request_id| {
                    BaseCommand::from(vela_wire::proto::CommandGetOrCreateSchema {
                        request_id,
                        topic: topic.to_string(),
                        schema: schema.clone(),
                        ..Default::default()
                    })
                },
            )
            .await?;
        answer
            .get_or_create_schema_response
            .and_then(|response| response.schema_version)
            .map(|version| version.to_vec())
            .ok_or_else(|| ClientError::Protocol("expected GET_OR_CREATE_SCHEMA_RESPONSE".into()))
    }

    /// The connection to the broker that serves `topic`, following redirects.
    pub(crate) async fn lookup(&self, topic: &str) -> Result<Connection, ClientError> {
        let mut addr = self.inner.service_addr.clone();
        let mut authoritative = false;
        for _ in 0..LOOKUP_REDIRECTS_MAX {
            let connection = self.connection(&addr).await?;
            let answer = connection
                .request(
                    "lookup",
                    self.inner.config.operation_timeout,
                    |request_id| {
                        BaseCommand::from(CommandLookupTopic {
                            topic: topic.to_string(),
                            request_id,
                            authoritative: Some(authoritative),
                            ..Default::default()
                        })
                    },
                )
                .await?;
            let response = answer
                .lookup_topic_response
                .ok_or_else(|| ClientError::Protocol("expected LOOKUP_RESPONSE".into()))?;
            let tls = self.inner.tls;
            let target_url = if tls {
                response.broker_service_url_tls.as_deref()
            } else {
                response.broker_service_url.as_deref()
            };
            let target = target_url.map(|url| parse_url(url, tls)).transpose()?;
            let proxied = response.proxy_through_service_url.unwrap_or(false);
            match response.response() {
                LookupType::Connect => {
                    return match target {
                        Some(target) if !proxied => self.connection(&target).await,
                        _ => Ok(connection),
                    };
                }
                LookupType::Redirect => {
                    let Some(target) = target else {
                        return Err(ClientError::Protocol(
                            "redirect without a broker URL".into(),
                        ));
                    };
                    authoritative = response.authoritative.unwrap_or(false);
                    addr = target;
                }
                LookupType::Failed => {
                    // The connection layer turns Failed into an error already.
                    return Err(ClientError::Protocol("lookup failed".into()));
                }
            }
        }
        Err(ClientError::TooManyRedirects(topic.to_string()))
    }

    /// The pooled connection to `addr`, connecting when there is none or the
    /// last one ended.
    pub(crate) async fn connection(&self, addr: &str) -> Result<Connection, ClientError> {
        let mut pool = self.inner.pool.lock().await;
        if let Some(connection) = pool.get(addr)
            && !connection.is_closed()
        {
            return Ok(connection.clone());
        }
        let config = &self.inner.config;
        let tls = if self.inner.tls {
            config.tls.clone()
        } else {
            None
        };
        let security = crate::connection::Security {
            tls,
            token: config.auth_token.clone(),
        };
        let connection = Connection::connect(addr, config.connect_timeout, &security).await?;
        pool.insert(addr.to_string(), connection.clone());
        Ok(connection)
    }

    /// A fresh producer or consumer id (unique within this client, so one id
    /// stays valid across reconnects to any broker).
    pub(crate) fn next_id(&self) -> u64 {
        self.inner.next_id.fetch_add(1, Ordering::Relaxed)
    }
}

/// The name of partition `index` of `topic`.
pub(crate) fn partition_name(topic: &str, index: u32) -> String {
    format!("{topic}-partition-{index}")
}

#[cfg(test)]
mod tests {
    use super::parse_url;

    fn parse_service_url(url: &str) -> Result<String, crate::ClientError> {
        parse_url(url, false)
    }

    #[test]
    fn service_urls() {
        assert_eq!(
            parse_service_url("pulsar://127.0.0.1:6650").ok(),
            Some("127.0.0.1:6650".to_string())
        );
        assert_eq!(
            parse_service_url("pulsar://h:1/").ok(),
            Some("h:1".to_string())
        );
        assert!(parse_service_url("http://h:1").is_err());
        assert!(parse_service_url("pulsar://h").is_err());
        assert!(parse_service_url("pulsar://:1").is_err());
        assert!(parse_service_url("pulsar://h:x").is_err());
        assert_eq!(
            parse_url("pulsar+ssl://h:6651", true).ok(),
            Some("h:6651".to_string())
        );
        assert!(parse_url("pulsar://h:6651", true).is_err());
        assert!(parse_service_url("pulsar+ssl://h:6651").is_err());
    }
}
