//! The broker-to-broker client of transaction participants (Pulsar's
//! `TransactionBufferClient`): END_TXN_ON_PARTITION and
//! END_TXN_ON_SUBSCRIPTION sent to the broker that owns the topic, when it
//! is not this one.
//!
//! Owns: one short-lived connection per request (CONNECT, the request, its
//! answer), each step within `REQUEST_TIMEOUT`; the owner's URL and the
//! credentials come from the broker-client settings every broker client
//! shares (`broker_client::PeerCredentials`: over TLS to the owner's
//! `pulsar+ssl://` URL when `brokerClientTlsEnabled` and the owner has
//! one, CONNECT with the token of the token plugin). A broker that refuses
//! (no credentials, TLS only) is asked again by the coordinator.
//! Never: retries (the coordinator's participants loop does), or keeps
//! connections.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::TcpStream;
use vela_wire::proto::{self, BaseCommand, ServerError};

use crate::broker_client::{PeerCredentials, PulsarRoute};
use crate::error::ServiceError;
use crate::ownership::BrokerInfo;

/// Longest wait for the connection, CONNECTED and the answer, each.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest frame accepted from the other broker (answers are small).
const ANSWER_FRAME_BYTES_MAX: usize = 1 << 20;

fn not_ready(message: impl Into<String>) -> ServiceError {
    ServiceError::new(ServerError::ServiceNotReady, message)
}

/// `host:port` of a URL with `scheme` (`pulsar://` or `pulsar+ssl://`).
fn address_of<'u>(url: &'u str, scheme: &str) -> Result<&'u str, ServiceError> {
    url.strip_prefix(scheme)
        .map(|rest| rest.trim_end_matches('/'))
        .ok_or_else(|| not_ready(format!("no {scheme} URL to reach the owner ({url})")))
}

/// A byte stream to another broker, plain or TLS.
trait Io: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> Io for T {}

/// One connection to another broker.
struct Conn {
    stream: Box<dyn Io>,
    decoder: vela_wire::FrameDecoder,
    buf: BytesMut,
}

impl Conn {
    async fn open(owner: &BrokerInfo, peers: &PeerCredentials) -> Result<Conn, ServiceError> {
        let (url, tls) = match peers.pulsar_route(owner) {
            PulsarRoute::Plain(url) => (url, None),
            PulsarRoute::Tls(url, tls) => (url, Some(tls)),
        };
        let address = address_of(
            &url,
            if tls.is_some() {
                "pulsar+ssl://"
            } else {
                "pulsar://"
            },
        )?;
        let connecting = async {
            let tcp = TcpStream::connect(address)
                .await
                .map_err(|e| not_ready(format!("connecting to {url}: {e}")))?;
            let Some(tls) = tls else {
                return Ok::<Box<dyn Io>, ServiceError>(Box::new(tcp));
            };
            let host = address.rsplit_once(':').map_or(address, |(host, _)| host);
            let name = vela_tls::ServerName::try_from(host.trim_matches(['[', ']']).to_string())
                .map_err(|e| not_ready(format!("{url}: {e}")))?;
            let stream = vela_tls::TlsConnector::from(tls)
                .connect(name, tcp)
                .await
                .map_err(|e| not_ready(format!("TLS to {url}: {e}")))?;
            Ok(Box::new(stream))
        };
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, connecting)
            .await
            .map_err(|_| not_ready(format!("connecting to {url} timed out")))??;
        let mut conn = Conn {
            stream,
            decoder: vela_wire::FrameDecoder::new(ANSWER_FRAME_BYTES_MAX),
            buf: BytesMut::new(),
        };
        let token = peers.token.as_ref();
        conn.send(proto::CommandConnect {
            client_version: "vela-broker-txn".into(),
            protocol_version: Some(21),
            auth_method_name: token.map(|_| "token".to_string()),
            auth_data: token.map(|t| bytes::Bytes::from(t.clone().into_bytes())),
            ..Default::default()
        })
        .await?;
        let answer = conn.receive().await?;
        if answer.connected.is_none() {
            return Err(not_ready(format!("{url} refused CONNECT: {answer:?}")));
        }
        Ok(conn)
    }

    async fn send(&mut self, command: impl Into<BaseCommand>) -> Result<(), ServiceError> {
        let mut out = BytesMut::new();
        vela_wire::encode_command(&command.into(), &mut out);
        self.stream
            .write_all(&out)
            .await
            .map_err(|e| not_ready(format!("writing to a broker: {e}")))
    }

    /// The next command other than PING (answered).
    async fn receive(&mut self) -> Result<BaseCommand, ServiceError> {
        tokio::time::timeout(REQUEST_TIMEOUT, async {
            loop {
                let frame = self
                    .decoder
                    .decode(&mut self.buf)
                    .map_err(|e| not_ready(format!("a broker's answer: {e}")))?;
                if let Some(frame) = frame {
                    let command = frame.command.into_base_command();
                    if command.ping.is_some() {
                        self.send(proto::CommandPong {}).await?;
                        continue;
                    }
                    return Ok(command);
                }
                let read = self
                    .stream
                    .read_buf(&mut self.buf)
                    .await
                    .map_err(|e| not_ready(format!("reading from a broker: {e}")))?;
                if read == 0 {
                    return Err(not_ready("the broker closed the connection"));
                }
            }
        })
        .await
        .map_err(|_| not_ready("the broker did not answer in time"))?
    }
}

/// The error fields of an answer as a result.
fn result_of(error: Option<i32>, message: Option<String>) -> Result<(), ServiceError> {
    match error {
        None => Ok(()),
        Some(code) => Err(ServiceError::new(
            ServerError::try_from(code).unwrap_or(ServerError::UnknownError),
            message.unwrap_or_default(),
        )),
    }
}

fn action(commit: bool) -> i32 {
    if commit {
        proto::TxnAction::Commit as i32
    } else {
        proto::TxnAction::Abort as i32
    }
}

/// END_TXN_ON_PARTITION at broker `owner`.
pub(crate) async fn end_on_partition(
    owner: &BrokerInfo,
    peers: &PeerCredentials,
    topic: &str,
    txn: (u64, u64),
    commit: bool,
    low_water: Option<u64>,
) -> Result<(), ServiceError> {
    let mut conn = Conn::open(owner, peers).await?;
    conn.send(proto::CommandEndTxnOnPartition {
        request_id: 1,
        txnid_most_bits: Some(txn.0),
        txnid_least_bits: Some(txn.1),
        topic: Some(topic.to_string()),
        txn_action: Some(action(commit)),
        txnid_least_bits_of_low_watermark: low_water,
    })
    .await?;
    let answer = conn.receive().await?;
    match answer.end_txn_on_partition_response {
        Some(response) => result_of(response.error, response.message),
        None => Err(not_ready(format!("unexpected answer {answer:?}"))),
    }
}

/// END_TXN_ON_SUBSCRIPTION at broker `owner`.
pub(crate) async fn end_on_subscription(
    owner: &BrokerInfo,
    peers: &PeerCredentials,
    topic: &str,
    subscription: &str,
    txn: (u64, u64),
    commit: bool,
    low_water: Option<u64>,
) -> Result<(), ServiceError> {
    let mut conn = Conn::open(owner, peers).await?;
    conn.send(proto::CommandEndTxnOnSubscription {
        request_id: 1,
        txnid_most_bits: Some(txn.0),
        txnid_least_bits: Some(txn.1),
        subscription: Some(proto::Subscription {
            topic: topic.to_string(),
            subscription: subscription.to_string(),
        }),
        txn_action: Some(action(commit)),
        txnid_least_bits_of_low_watermark: low_water,
    })
    .await?;
    let answer = conn.receive().await?;
    match answer.end_txn_on_subscription_response {
        Some(response) => result_of(response.error, response.message),
        None => Err(not_ready(format!("unexpected answer {answer:?}"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_need_the_route_s_scheme() {
        assert_eq!(
            address_of("pulsar://10.0.0.1:6650/", "pulsar://").ok(),
            Some("10.0.0.1:6650")
        );
        assert!(address_of("pulsar+ssl://h:6651", "pulsar://").is_err());
    }
}
