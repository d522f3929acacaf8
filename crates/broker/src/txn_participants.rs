//! The participants of transactions (`transaction::Participants`) as this
//! broker serves them: END_TXN_ON_PARTITION and END_TXN_ON_SUBSCRIPTION on
//! a topic this broker owns, in process (its transaction buffer, its
//! subscriptions' pending acks), and at the owner through `txn_client`
//! otherwise. The coordinators use [`LocalParticipants`]; the connection
//! serves the two commands with [`end_on_partition`] and
//! [`end_on_subscription`].
//! Never: decides an outcome or retries (the coordinator asks again).

use std::sync::{Arc, Weak};

use vela_wire::proto::ServerError;

use crate::error::ServiceError;
use crate::ownership::{BrokerInfo, LookupAnswer};
use crate::service::Service;
use crate::topic::Topic;
use crate::topic_name::{TopicDomain, TopicName};
use crate::transaction::{ParticipantFuture, Participants, TxnAction, TxnId};
use crate::txn_buffer::TxnKey;

/// The coordinators' participants: this broker's service.
#[derive(Debug)]
pub(crate) struct LocalParticipants(Weak<Service>);

impl LocalParticipants {
    pub(crate) fn new(service: Weak<Service>) -> LocalParticipants {
        LocalParticipants(service)
    }

    fn service(&self) -> Result<Arc<Service>, ServiceError> {
        self.0.upgrade().ok_or_else(|| {
            ServiceError::new(ServerError::ServiceNotReady, "the broker is shutting down")
        })
    }
}

impl Participants for LocalParticipants {
    fn end_on_partition(
        &self,
        topic: String,
        txn: TxnId,
        action: TxnAction,
        low_water: u64,
    ) -> ParticipantFuture {
        let service = self.service();
        Box::pin(async move {
            let commit = action == TxnAction::Commit;
            let service = service?;
            let txn = (txn.most, txn.least);
            end_on_partition(&service, &topic, txn, commit, Some(low_water)).await
        })
    }

    fn end_on_subscription(
        &self,
        topic: String,
        subscription: String,
        txn: TxnId,
        action: TxnAction,
        low_water: u64,
    ) -> ParticipantFuture {
        let service = self.service();
        Box::pin(async move {
            let commit = action == TxnAction::Commit;
            let service = service?;
            end_on_subscription(
                &service,
                &topic,
                &subscription,
                (txn.most, txn.least),
                commit,
                Some(low_water),
            )
            .await
        })
    }
}

/// Where a transaction's outcome on one topic is carried out.
enum Target {
    Local(Arc<Topic>),
    /// The owner.
    Remote(BrokerInfo),
    /// A topic that does not exist or has no transaction state.
    Nothing,
}

/// Where a transaction's outcome is carried out on topic `name`.
async fn target(service: &Service, name: &str) -> Result<Target, ServiceError> {
    let topic = TopicName::parse(name)?;
    if topic.domain == TopicDomain::NonPersistent {
        // No buffer, no pending acks: nothing to carry out.
        return Ok(Target::Nothing);
    }
    if service.ownership.get().is_some() {
        let owner = match service.lookup(&topic, false).await? {
            LookupAnswer::Connect(owner) | LookupAnswer::Redirect(owner) => owner,
        };
        if owner.id != service.me().id {
            return Ok(Target::Remote(owner));
        }
    }
    match service.topic(&topic, false).await {
        Ok(served) => Ok(Target::Local(served)),
        Err(error) if error.code == ServerError::TopicNotFound => Ok(Target::Nothing),
        Err(error) => Err(error),
    }
}

/// END_TXN_ON_PARTITION: on the topic here, or at its owner. `low_water`:
/// the coordinator's low water mark, when it sent one.
pub(crate) async fn end_on_partition(
    service: &Service,
    name: &str,
    txn: TxnKey,
    commit: bool,
    low_water: Option<u64>,
) -> Result<(), ServiceError> {
    match target(service, name).await? {
        Target::Local(topic) => topic.end_txn_on_partition(txn, commit, low_water).await,
        Target::Remote(owner) => {
            let peers = service.peers();
            crate::txn_client::end_on_partition(&owner, &peers, name, txn, commit, low_water).await
        }
        Target::Nothing => Ok(()),
    }
}

/// END_TXN_ON_SUBSCRIPTION: on the topic here, or at its owner.
pub(crate) async fn end_on_subscription(
    service: &Service,
    name: &str,
    subscription: &str,
    txn: TxnKey,
    commit: bool,
    low_water: Option<u64>,
) -> Result<(), ServiceError> {
    match target(service, name).await? {
        Target::Local(topic) => {
            topic
                .end_txn_on_subscription(subscription, txn, commit, low_water)
                .await
        }
        Target::Remote(owner) => {
            let peers = service.peers();
            let (topic, sub) = (name, subscription);
            crate::txn_client::end_on_subscription(
                &owner, &peers, topic, sub, txn, commit, low_water,
            )
            .await
        }
        Target::Nothing => Ok(()),
    }
}
