//! Transaction coordinator commands: TC_CLIENT_CONNECT, NEW_TXN,
//! ADD_PARTITION_TO_TXN, ADD_SUBSCRIPTION_TO_TXN, END_TXN; and the
//! participant commands another broker's coordinator sends
//! (END_TXN_ON_PARTITION, END_TXN_ON_SUBSCRIPTION: a superuser's when
//! authentication is on), served by the same code as in-process outcomes.
//!
//! With transactions off each is answered ERROR(NotAllowedError,
//! "Transactions are not enabled.") as Pulsar does. TC_CLIENT_CONNECT opens
//! the coordinator (after checking, in a cluster, that this broker owns its
//! assign partition); the others are served by the coordinator open here
//! (TransactionCoordinatorNotFound otherwise). Each request that writes the
//! transaction log is answered from a task of its own once its record is
//! durable, at most `TXN_REQUESTS_IN_FLIGHT_MAX` per connection (past it
//! the reader waits: TCP back-pressure).
//! Never: blocks the reader on the log.

use std::sync::Arc;

use tokio::sync::Semaphore;
use vela_wire::proto::{self, ServerError};

use super::session::{Close, Session};
use crate::codec;
use crate::error::ServiceError;
use crate::service::Service;
use crate::topic_name::TopicName;
use crate::transaction::{COORDINATOR_ASSIGN_TOPIC, Coordinators, TxnAction, TxnError, TxnId};

/// A response to a command on one transaction: each carries the request
/// id, the transaction id and the error, if any.
trait TxnResponse {
    fn answer(request_id: u64, id: TxnId, result: Result<(), ServiceError>) -> proto::BaseCommand;
}

macro_rules! txn_responses {
    ($($response:ident),+) => {$(
        impl TxnResponse for proto::$response {
            fn answer(
                request_id: u64,
                id: TxnId,
                result: Result<(), ServiceError>,
            ) -> proto::BaseCommand {
                let (error, message) = split(result);
                proto::$response {
                    request_id,
                    txnid_least_bits: Some(id.least),
                    txnid_most_bits: Some(id.most),
                    error,
                    message,
                }
                .into()
            }
        }
    )+};
}

txn_responses!(
    CommandAddPartitionToTxnResponse,
    CommandAddSubscriptionToTxnResponse,
    CommandEndTxnResponse,
    CommandEndTxnOnPartitionResponse,
    CommandEndTxnOnSubscriptionResponse
);

/// Who sent a command: the role, and whether it is a superuser.
struct Caller {
    role: Option<String>,
    superuser: bool,
}

/// Transaction requests of one connection waiting for the log.
pub(super) const TXN_REQUESTS_IN_FLIGHT_MAX: usize = 1000;

/// A topic name of a request, checked to parse and kept as the client
/// wrote it (the admin API shows it so, as Pulsar's).
fn topic_of(name: &str) -> Result<String, ServiceError> {
    TopicName::parse(name)?;
    Ok(name.to_string())
}

/// The connection's transaction requests in flight.
#[derive(Debug)]
pub(super) struct TxnRequests {
    permits: Arc<Semaphore>,
}

impl TxnRequests {
    pub(super) fn new() -> TxnRequests {
        TxnRequests {
            permits: Arc::new(Semaphore::new(TXN_REQUESTS_IN_FLIGHT_MAX)),
        }
    }

    /// The coordinators, or the answer Pulsar gives when transactions are off.
    async fn coordinators(
        session: &Session,
        request_id: u64,
    ) -> Result<Option<Arc<Coordinators>>, Close> {
        match &session.service.transactions {
            Some(coordinators) => Ok(Some(Arc::clone(coordinators))),
            None => {
                let error = ServiceError::new(
                    ServerError::NotAllowedError,
                    "Transactions are not enabled.",
                );
                session.send_error(request_id, error).await?;
                Ok(None)
            }
        }
    }

    /// Runs `work` in a task holding one permit; its answer goes out
    /// through the connection's outbound queue.
    async fn spawn<F>(&self, session: &Session, work: F) -> Result<(), Close>
    where
        F: std::future::Future<Output = proto::BaseCommand> + Send + 'static,
    {
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| Close("transaction requests closed".into()))?;
        let out = session.out.clone();
        tokio::spawn(async move {
            let answer = work.await;
            // The connection may have closed meanwhile: nobody to answer.
            let _ = out.send(codec::encode_command(answer)).await;
            drop(permit);
        });
        Ok(())
    }

    pub(super) async fn on_tc_connect(
        &self,
        session: &Session,
        body: proto::CommandTcClientConnectRequest,
    ) -> Result<(), Close> {
        let request_id = body.request_id;
        let Some(coordinators) = Self::coordinators(session, request_id).await? else {
            return Ok(());
        };
        let service = Arc::clone(&session.service);
        self.spawn(session, async move {
            let result = async {
                let assign = TopicName::parse(COORDINATOR_ASSIGN_TOPIC)?.partition(
                    u32::try_from(body.tc_id).map_err(|_| {
                        ServiceError::from(TxnError::CoordinatorNotFound(body.tc_id))
                    })?,
                );
                if let Some(ownership) = service.ownership.get() {
                    ownership
                        .check_owned(&assign)
                        .await
                        .map_err(crate::service::ownership_error)?;
                }
                coordinators.connect(body.tc_id).await?;
                Ok::<(), ServiceError>(())
            }
            .await;
            let (error, message) = split(result);
            proto::CommandTcClientConnectResponse {
                request_id,
                error,
                message,
            }
            .into()
        })
        .await
    }

    pub(super) async fn on_new_txn(
        &self,
        session: &Session,
        body: proto::CommandNewTxn,
    ) -> Result<(), Close> {
        let request_id = body.request_id;
        let Some(coordinators) = Self::coordinators(session, request_id).await? else {
            return Ok(());
        };
        let tc_id = body.tc_id.unwrap_or(0);
        // The field is named in seconds; clients send milliseconds and
        // Pulsar's coordinator reads milliseconds.
        let timeout_ms = body.txn_ttl_seconds.unwrap_or(0);
        let owner = session.role().map(str::to_string);
        let permit = Arc::clone(&self.permits)
            .acquire_owned()
            .await
            .map_err(|_| Close("transaction requests closed".into()))?;
        let out = session.out.clone();
        tokio::spawn(async move {
            let answer = match coordinators.new_txn(tc_id, timeout_ms, owner).await {
                Ok(Some(id)) => proto::CommandNewTxnResponse {
                    request_id,
                    txnid_least_bits: Some(id.least),
                    txnid_most_bits: Some(id.most),
                    error: None,
                    message: None,
                },
                // As Pulsar at maxActiveTransactionsPerCoordinator: no answer.
                Ok(None) => {
                    tracing::warn!(tc_id, "open transactions at the bound: NEW_TXN unanswered");
                    drop(permit);
                    return;
                }
                Err(error) => {
                    let error = ServiceError::from(error);
                    proto::CommandNewTxnResponse {
                        request_id,
                        txnid_least_bits: None,
                        txnid_most_bits: Some(tc_id),
                        error: Some(error.code as i32),
                        message: Some(error.message),
                    }
                }
            };
            let _ = out.send(codec::encode_command(answer)).await;
            drop(permit);
        });
        Ok(())
    }

    fn caller(session: &Session) -> Caller {
        let role = session.role().map(str::to_string);
        let superuser = match (&session.service.config.auth, &role) {
            (Some(auth), Some(role)) => auth.is_superuser(role),
            _ => false,
        };
        Caller { role, superuser }
    }

    /// A client's command on transaction `id`, served by the coordinators
    /// (answered Pulsar's way when transactions are off): `op` runs in a
    /// task of its own and its outcome is answered as `R`.
    async fn coordinator_op<R, F, Fut>(
        &self,
        session: &Session,
        request_id: u64,
        id: TxnId,
        op: F,
    ) -> Result<(), Close>
    where
        R: TxnResponse,
        F: FnOnce(Arc<Coordinators>, Caller) -> Fut,
        Fut: std::future::Future<Output = Result<(), ServiceError>> + Send + 'static,
    {
        let Some(coordinators) = Self::coordinators(session, request_id).await? else {
            return Ok(());
        };
        let work = op(coordinators, Self::caller(session));
        self.spawn(
            session,
            async move { R::answer(request_id, id, work.await) },
        )
        .await
    }

    /// Another broker's coordinator ending transaction `id` here: refused
    /// unless its caller may (`check_participant_caller`); `op` runs in a
    /// task of its own with the outcome asked for (true: commit) and is
    /// answered as `R`.
    async fn participant_op<R, F, Fut>(
        &self,
        session: &Session,
        request_id: u64,
        id: TxnId,
        action: Option<i32>,
        op: F,
    ) -> Result<(), Close>
    where
        R: TxnResponse,
        F: FnOnce(Arc<Service>, bool) -> Fut + Send + 'static,
        Fut: std::future::Future<Output = Result<(), ServiceError>> + Send,
    {
        let allowed = Self::check_participant_caller(session);
        let service = Arc::clone(&session.service);
        self.spawn(session, async move {
            let result = async {
                allowed?;
                op(service, action_of(action)?).await
            }
            .await;
            R::answer(request_id, id, result)
        })
        .await
    }

    pub(super) async fn on_add_partitions(
        &self,
        session: &Session,
        body: proto::CommandAddPartitionToTxn,
    ) -> Result<(), Close> {
        let id = txn_id(body.txnid_most_bits, body.txnid_least_bits);
        self.coordinator_op::<proto::CommandAddPartitionToTxnResponse, _, _>(
            session,
            body.request_id,
            id,
            |coordinators, caller| async move {
                let partitions = body
                    .partitions
                    .iter()
                    .map(|p| topic_of(p))
                    .collect::<Result<Vec<_>, _>>()?;
                coordinators
                    .add_partitions(id, caller.role.as_deref(), caller.superuser, partitions)
                    .await?;
                Ok(())
            },
        )
        .await
    }

    pub(super) async fn on_add_subscriptions(
        &self,
        session: &Session,
        body: proto::CommandAddSubscriptionToTxn,
    ) -> Result<(), Close> {
        let id = txn_id(body.txnid_most_bits, body.txnid_least_bits);
        self.coordinator_op::<proto::CommandAddSubscriptionToTxnResponse, _, _>(
            session,
            body.request_id,
            id,
            |coordinators, caller| async move {
                let subscriptions = body
                    .subscription
                    .iter()
                    .map(|s| Ok((topic_of(&s.topic)?, s.subscription.clone())))
                    .collect::<Result<Vec<_>, ServiceError>>()?;
                coordinators
                    .add_subscriptions(id, caller.role.as_deref(), caller.superuser, subscriptions)
                    .await?;
                Ok(())
            },
        )
        .await
    }

    pub(super) async fn on_end_txn(
        &self,
        session: &Session,
        body: proto::CommandEndTxn,
    ) -> Result<(), Close> {
        let id = txn_id(body.txnid_most_bits, body.txnid_least_bits);
        let action = action_of(body.txn_action).map(|commit| {
            if commit {
                TxnAction::Commit
            } else {
                TxnAction::Abort
            }
        });
        self.coordinator_op::<proto::CommandEndTxnResponse, _, _>(
            session,
            body.request_id,
            id,
            |coordinators, caller| async move {
                coordinators
                    .end(id, action?, caller.role.as_deref(), caller.superuser)
                    .await?;
                Ok(())
            },
        )
        .await
    }
}

fn txn_id(most: Option<u64>, least: Option<u64>) -> TxnId {
    TxnId {
        most: most.unwrap_or(0),
        least: least.unwrap_or(0),
    }
}

/// The error fields of a response.
fn split(result: Result<(), ServiceError>) -> (Option<i32>, Option<String>) {
    match result {
        Ok(()) => (None, None),
        Err(error) => (Some(error.code as i32), Some(error.message)),
    }
}

/// The outcome an END_TXN_ON_* command asks for.
fn action_of(action: Option<i32>) -> Result<bool, ServiceError> {
    match action.map(proto::TxnAction::try_from) {
        Some(Ok(proto::TxnAction::Commit)) => Ok(true),
        Some(Ok(proto::TxnAction::Abort)) => Ok(false),
        other => Err(ServiceError::new(
            ServerError::InvalidTxnStatus,
            format!("Unsupported txnAction {other:?}"),
        )),
    }
}

impl TxnRequests {
    /// Participant commands come from brokers: with authentication on,
    /// only a superuser may send them.
    fn check_participant_caller(session: &Session) -> Result<(), ServiceError> {
        let superuser = Self::caller(session).superuser;
        if session.service.config.auth.is_some() && !superuser {
            return Err(ServiceError::new(
                ServerError::AuthorizationError,
                "only a superuser may end a transaction on a topic",
            ));
        }
        Ok(())
    }

    pub(super) async fn on_end_txn_on_partition(
        &self,
        session: &Session,
        body: proto::CommandEndTxnOnPartition,
    ) -> Result<(), Close> {
        let id = txn_id(body.txnid_most_bits, body.txnid_least_bits);
        self.participant_op::<proto::CommandEndTxnOnPartitionResponse, _, _>(
            session,
            body.request_id,
            id,
            body.txn_action,
            move |service, commit| async move {
                let topic = body.topic.unwrap_or_default();
                crate::txn_participants::end_on_partition(
                    &service,
                    &topic,
                    (id.most, id.least),
                    commit,
                    body.txnid_least_bits_of_low_watermark,
                )
                .await
            },
        )
        .await
    }

    pub(super) async fn on_end_txn_on_subscription(
        &self,
        session: &Session,
        body: proto::CommandEndTxnOnSubscription,
    ) -> Result<(), Close> {
        let id = txn_id(body.txnid_most_bits, body.txnid_least_bits);
        self.participant_op::<proto::CommandEndTxnOnSubscriptionResponse, _, _>(
            session,
            body.request_id,
            id,
            body.txn_action,
            move |service, commit| async move {
                let Some(subscription) = body.subscription else {
                    return Err(ServiceError::new(
                        ServerError::InvalidTopicName,
                        "END_TXN_ON_SUBSCRIPTION without a subscription",
                    ));
                };
                crate::txn_participants::end_on_subscription(
                    &service,
                    &subscription.topic,
                    &subscription.subscription,
                    (id.most, id.least),
                    commit,
                    body.txnid_least_bits_of_low_watermark,
                )
                .await
            },
        )
        .await
    }
}
