//! Where a transaction's outcome is carried out: the partitions it
//! produced to (their transaction buffers) and the subscriptions it
//! acknowledged on (their pending acks), as Pulsar's coordinator calls
//! `TransactionBufferClient.commitTxnOnTopic` / `commitTxnOnSubscription`.
//!
//! Owns: the [`Participants`] seam (the service implements it: in process
//! for topics served here), and [`tell_all`], which asks every participant,
//! `PARTICIPANT_REQUESTS_IN_FLIGHT_MAX` at a time, each within
//! `PARTICIPANT_TIMEOUT`, and asks again those that failed (backing off
//! from `RETRY_DELAY_MIN` to `RETRY_DELAY_MAX`) until all answered or the
//! coordinator stops. Participants are idempotent, so asking twice is safe.
//! Never: writes the coordinator's log.

use std::collections::HashSet;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::time::Duration;

use vela_wire::proto::ServerError;

use super::types::{TxnAction, TxnId};
use crate::error::ServiceError;

/// One participant's answer.
pub(crate) type ParticipantFuture =
    Pin<Box<dyn Future<Output = Result<(), ServiceError>> + Send + 'static>>;

/// The participants of transactions (END_TXN_ON_PARTITION and
/// END_TXN_ON_SUBSCRIPTION). Both must be idempotent. `low_water` is the
/// coordinator's low water mark (every transaction of `txn`'s coordinator
/// with a sequence number at or below it has ended), as Pulsar's
/// `txnid_least_bits_of_low_watermark`.
pub(crate) trait Participants: Send + Sync + std::fmt::Debug {
    /// Writes the outcome's marker on `topic` (a partition) once durable.
    fn end_on_partition(
        &self,
        topic: String,
        txn: TxnId,
        action: TxnAction,
        low_water: u64,
    ) -> ParticipantFuture;

    /// Applies (commit) or releases (abort) the acknowledgements `txn` holds
    /// on `subscription` of `topic`.
    fn end_on_subscription(
        &self,
        topic: String,
        subscription: String,
        txn: TxnId,
        action: TxnAction,
        low_water: u64,
    ) -> ParticipantFuture;
}

/// Participants asked at once for one transaction.
const PARTICIPANT_REQUESTS_IN_FLIGHT_MAX: usize = 64;
/// How long one participant may take to answer before it is asked again.
const PARTICIPANT_TIMEOUT: Duration = Duration::from_secs(30);
/// First pause before asking failed participants again.
const RETRY_DELAY_MIN: Duration = Duration::from_millis(100);
/// Longest pause between two rounds.
const RETRY_DELAY_MAX: Duration = Duration::from_secs(5);

/// A participant of one transaction.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(super) enum Target {
    Partition(String),
    Subscription(String, String),
}

/// Tells every target `action`, asking again those that failed, until all
/// answered (`Ok`) or `stopped()` turns true (the last error).
pub(super) async fn tell_all(
    participants: &Arc<dyn Participants>,
    txn: TxnId,
    action: TxnAction,
    low_water: u64,
    mut targets: Vec<Target>,
    stopped: impl Fn() -> bool,
) -> Result<(), ServiceError> {
    let mut delay = RETRY_DELAY_MIN;
    loop {
        let mut answered: HashSet<Target> = HashSet::new();
        let mut last_error: Option<ServiceError> = None;
        for chunk in targets.chunks(PARTICIPANT_REQUESTS_IN_FLIGHT_MAX) {
            let mut asked = tokio::task::JoinSet::new();
            for target in chunk {
                let participants = Arc::clone(participants);
                let target = target.clone();
                asked.spawn(async move {
                    let answer = match &target {
                        Target::Partition(topic) => {
                            participants.end_on_partition(topic.clone(), txn, action, low_water)
                        }
                        Target::Subscription(topic, subscription) => participants
                            .end_on_subscription(
                                topic.clone(),
                                subscription.clone(),
                                txn,
                                action,
                                low_water,
                            ),
                    };
                    let result = tokio::time::timeout(PARTICIPANT_TIMEOUT, answer)
                        .await
                        .unwrap_or_else(|_| {
                            Err(ServiceError::new(
                                ServerError::ServiceNotReady,
                                "the participant did not answer in time",
                            ))
                        });
                    (target, result)
                });
            }
            while let Some(joined) = asked.join_next().await {
                match joined {
                    Ok((target, Ok(()))) => {
                        answered.insert(target);
                    }
                    Ok((target, Err(error))) => {
                        tracing::debug!(%txn, ?target, %error, "transaction participant failed");
                        last_error = Some(error);
                    }
                    Err(error) => {
                        last_error = Some(ServiceError::new(
                            ServerError::UnknownError,
                            format!("transaction participant task failed: {error}"),
                        ));
                    }
                }
            }
        }
        targets.retain(|target| !answered.contains(target));
        if targets.is_empty() {
            return Ok(());
        }
        let error = last_error.unwrap_or_else(|| {
            ServiceError::new(ServerError::UnknownError, "a participant did not answer")
        });
        if stopped() {
            return Err(error);
        }
        tracing::warn!(%txn, left = targets.len(), %error, "transaction participants failed: asking again");
        tokio::time::sleep(delay).await;
        delay = (delay * 2).min(RETRY_DELAY_MAX);
    }
}
