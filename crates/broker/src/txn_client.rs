//! The broker-to-broker client of transaction participants (Pulsar's
//! `TransactionBufferClient`): END_TXN_ON_PARTITION and
//! END_TXN_ON_SUBSCRIPTION sent to the broker that owns the topic, when it
//! is not this one.
//!
//! Owns: one short-lived connection per request (CONNECT, the request, its
//! answer), each step within `REQUEST_TIMEOUT`. Plain `pulsar://` URLs
//! only, without credentials: a broker that requires authentication or
//! only listens with TLS refuses it, and the coordinator asks again.
//! Never: retries (the coordinator's participants loop does), or keeps
//! connections.

use std::time::Duration;

use bytes::BytesMut;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use vela_wire::proto::{self, BaseCommand, ServerError};

use crate::error::ServiceError;

/// Longest wait for the connection, CONNECTED and the answer, each.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Largest frame accepted from the other broker (answers are small).
const ANSWER_FRAME_BYTES_MAX: usize = 1 << 20;

fn not_ready(message: impl Into<String>) -> ServiceError {
    ServiceError::new(ServerError::ServiceNotReady, message)
}

/// `host:port` of a `pulsar://` URL.
fn address_of(url: &str) -> Result<&str, ServiceError> {
    url.strip_prefix("pulsar://")
        .map(|rest| rest.trim_end_matches('/'))
        .ok_or_else(|| not_ready(format!("no plain Pulsar URL to reach the owner ({url})")))
}

/// One connection to another broker.
struct Conn {
    stream: TcpStream,
    decoder: vela_wire::FrameDecoder,
    buf: BytesMut,
}

impl Conn {
    async fn open(url: &str) -> Result<Conn, ServiceError> {
        let address = address_of(url)?;
        let stream = tokio::time::timeout(REQUEST_TIMEOUT, TcpStream::connect(address))
            .await
            .map_err(|_| not_ready(format!("connecting to {url} timed out")))?
            .map_err(|e| not_ready(format!("connecting to {url}: {e}")))?;
        let mut conn = Conn {
            stream,
            decoder: vela_wire::FrameDecoder::new(ANSWER_FRAME_BYTES_MAX),
            buf: BytesMut::new(),
        };
        conn.send(proto::CommandConnect {
            client_version: "vela-broker-txn".into(),
            protocol_version: Some(21),
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

/// END_TXN_ON_PARTITION at the broker `url`.
pub(crate) async fn end_on_partition(
    url: &str,
    topic: &str,
    txn: (u64, u64),
    commit: bool,
) -> Result<(), ServiceError> {
    let mut conn = Conn::open(url).await?;
    conn.send(proto::CommandEndTxnOnPartition {
        request_id: 1,
        txnid_most_bits: Some(txn.0),
        txnid_least_bits: Some(txn.1),
        topic: Some(topic.to_string()),
        txn_action: Some(action(commit)),
        txnid_least_bits_of_low_watermark: None,
    })
    .await?;
    let answer = conn.receive().await?;
    match answer.end_txn_on_partition_response {
        Some(response) => result_of(response.error, response.message),
        None => Err(not_ready(format!("unexpected answer {answer:?}"))),
    }
}

/// END_TXN_ON_SUBSCRIPTION at the broker `url`.
pub(crate) async fn end_on_subscription(
    url: &str,
    topic: &str,
    subscription: &str,
    txn: (u64, u64),
    commit: bool,
) -> Result<(), ServiceError> {
    let mut conn = Conn::open(url).await?;
    conn.send(proto::CommandEndTxnOnSubscription {
        request_id: 1,
        txnid_most_bits: Some(txn.0),
        txnid_least_bits: Some(txn.1),
        subscription: Some(proto::Subscription {
            topic: topic.to_string(),
            subscription: subscription.to_string(),
        }),
        txn_action: Some(action(commit)),
        txnid_least_bits_of_low_watermark: None,
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
    fn only_plain_urls_are_reached() {
        assert_eq!(
            address_of("pulsar://10.0.0.1:6650").ok(),
            Some("10.0.0.1:6650")
        );
        assert_eq!(address_of("pulsar://h:1/").ok(), Some("h:1"));
        assert!(address_of("pulsar+ssl://h:6651").is_err());
    }
}
