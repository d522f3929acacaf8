//! The Pulsar listeners' accept loops: connection caps (in all, shared by
//! the listeners, and per client IP on each) checked before a connection
//! task exists, and a refused connection told why.
//!
//! Owns: the per-IP counts and the refusals in flight (bounded by
//! `REFUSALS_IN_FLIGHT_MAX`, each by `REFUSAL_WRITE_TIMEOUT`).
//! Never: reads from a connection (the TLS handshake runs in the
//! connection's task, so a slow client never holds up the accept loop).

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use crate::service::Service;
use crate::{codec, connection, tls};

/// Refused connections being told why at once. A client that never reads
/// its ERROR must not hold a task for long: each gets `REFUSAL_WRITE_TIMEOUT`,
/// and past this many in flight the rest are closed without a word.
const REFUSALS_IN_FLIGHT_MAX: usize = 256;
const REFUSAL_WRITE_TIMEOUT: Duration = Duration::from_secs(1);

/// Accepts on one Pulsar listener (plain, or TLS with `certs`) within
/// `ConnectionCaps`: one past the total (`slots`, shared by the listeners) or
/// its IP's share on this listener gets ERROR(NotAllowedError) saying which
/// (Pulsar's answer) and is closed, with a log line.
pub(crate) async fn accept_loop(
    listener: TcpListener,
    service: Arc<Service>,
    mut shutdown: watch::Receiver<bool>,
    certs: Option<Arc<tls::TlsCertificates>>,
    slots: Arc<Semaphore>,
) {
    let caps = service.config.connection_caps;
    let mut connections = JoinSet::new();
    let mut refusals = JoinSet::new();
    // Open connections per client IP; an entry goes when its count drops to 0.
    let mut per_ip: HashMap<IpAddr, usize> = HashMap::new();
    loop {
        tokio::select! {
            _ = shutdown.changed() => break,
            Some(joined) = connections.join_next(), if !connections.is_empty() => {
                match joined {
                    Ok(ip) => {
                        if let Some(count) = per_ip.get_mut(&ip) {
                            *count -= 1;
                            if *count == 0 {
                                per_ip.remove(&ip);
                            }
                        }
                    }
                    Err(e) => {
                        // The count of a panicked task's IP stays (it is
                        // unknown here): a broker bug, logged.
                        tracing::error!(error = %e, "connection task panicked (a broker bug)");
                    }
                }
            }
            Some(_) = refusals.join_next(), if !refusals.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let ip = peer.ip();
                    let from_ip = per_ip.get(&ip).copied().unwrap_or(0);
                    let slot = Arc::clone(&slots).try_acquire_owned().ok();
                    let refusal = if slot.is_none() {
                        Some(format!("Reached the maximum number of connections ({})", caps.total_max))
                    } else if from_ip >= caps.per_ip_max {
                        Some(format!(
                            "Reached the maximum number of connections on address {ip} ({})",
                            caps.per_ip_max
                        ))
                    } else {
                        None
                    };
                    let (Some(slot), None) = (slot, refusal.as_ref()) else {
                        let message = refusal.unwrap_or_default();
                        tracing::warn!(%peer, %message, "connection refused");
                        if refusals.len() < REFUSALS_IN_FLIGHT_MAX {
                            refusals.spawn(refuse(stream, message));
                        }
                        continue;
                    };
                    *per_ip.entry(ip).or_insert(0) += 1;
                    let service = Arc::clone(&service);
                    let shutdown = shutdown.clone();
                    match &certs {
                        None => connections.spawn(async move {
                            let _slot = slot;
                            connection::serve(service, stream, peer, shutdown).await;
                            ip
                        }),
                        // The handshake runs in the connection's task: a
                        // slow client never holds up the accept loop.
                        Some(certs) => {
                            let acceptor = certs.acceptor();
                            connections.spawn(async move {
                                let _slot = slot;
                                connection::serve_tls(service, acceptor, stream, peer, shutdown).await;
                                ip
                            })
                        }
                    };
                }
                Err(e) => {
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(std::time::Duration::from_millis(10)).await;
                }
            },
        }
    }
    drop(listener);
    refusals.abort_all();
    while connections.join_next().await.is_some() {}
}

/// Writes ERROR(NotAllowedError, `message`) with request id -1 (as Pulsar's
/// broker does before the handshake) and closes the connection.
async fn refuse(mut stream: TcpStream, message: String) {
    use tokio::io::AsyncWriteExt;
    let frame = match codec::encode_command(vela_wire::proto::CommandError {
        request_id: u64::MAX,
        error: vela_wire::proto::ServerError::NotAllowedError as i32,
        message,
    }) {
        codec::Outbound::Simple(bytes) => bytes,
        codec::Outbound::Message { header, .. } | codec::Outbound::Charged { header, .. } => header,
        codec::Outbound::Receipt { frame, .. } => frame,
    };
    let write = async {
        stream.write_all(&frame).await?;
        stream.shutdown().await
    };
    let _ = tokio::time::timeout(REFUSAL_WRITE_TIMEOUT, write).await;
}
