//! Transactions: the transaction coordinators this broker runs.
//!
//! Owns: [`Coordinators`] (the coordinators of this broker, one per
//! partition of `persistent://pulsar/system/transaction_coordinator_assign`
//! it serves, opened at TC_CLIENT_CONNECT), the transaction id
//! ([`TxnId`]: most significant bits = coordinator id, least = a sequence
//! number), [`TxnError`] with Pulsar's codes and messages, and the admin
//! view of a transaction ([`TxnView`]). `coordinator`: one coordinator (its
//! table, log, timeouts); `record`: its log records; `participants`: the
//! seam through which an outcome reaches the partitions and subscriptions
//! a transaction registered (the service implements it).
//! Never: checks bundle ownership or authorization (the connection does,
//! before asking), or reaches topics other than through `Participants`.
//!
//! Bounds: `TransactionConfig::coordinators` coordinators,
//! `open_per_coordinator_max` open transactions each,
//! `ops_per_transaction_max` partitions plus subscriptions per transaction.

mod coordinator;
mod participants;
mod record;
mod types;

use std::collections::HashMap;
use std::sync::{Arc, OnceLock};

use parking_lot::Mutex;
use tokio::sync::OnceCell;
use vela_log::{LogEnv, Persistence};
use vela_meta::MetadataStore;

use crate::config::TransactionConfig;
use coordinator::Coordinator;
pub(crate) use participants::{ParticipantFuture, Participants};
pub(crate) use types::{CoordinatorStats, TxnAction, TxnError, TxnId, TxnView};

/// The partitioned topic whose partitions name the coordinators (clients
/// look its partitions up to find each coordinator's broker).
pub(crate) const COORDINATOR_ASSIGN_TOPIC: &str =
    "persistent://pulsar/system/transaction_coordinator_assign";

type CoordinatorCell = Arc<OnceCell<Arc<Coordinator>>>;

/// The coordinators of this broker.
#[derive(Debug)]
pub(crate) struct Coordinators {
    config: TransactionConfig,
    env: LogEnv,
    meta: Arc<dyn MetadataStore>,
    persistence: Persistence,
    /// Where outcomes are carried out (set once the service exists).
    participants: OnceLock<Arc<dyn Participants>>,
    open: Mutex<HashMap<u64, CoordinatorCell>>,
}

impl Coordinators {
    pub(crate) fn new(
        config: TransactionConfig,
        env: LogEnv,
        meta: Arc<dyn MetadataStore>,
        persistence: Persistence,
    ) -> Coordinators {
        Coordinators {
            config,
            env,
            meta,
            persistence,
            participants: OnceLock::new(),
            open: Mutex::new(HashMap::new()),
        }
    }

    /// Sets where outcomes are carried out (before the first coordinator
    /// opens; later calls are ignored).
    pub(crate) fn set_participants(&self, participants: Arc<dyn Participants>) {
        let _ = self.participants.set(participants);
    }

    /// Partitions of the assign topic (coordinators in the cluster).
    pub(crate) fn count(&self) -> u32 {
        self.config.coordinators
    }

    /// Coordinator `id`, opening it (replaying its log) if it is not open
    /// or its log failed. The caller checked that this broker owns it.
    pub(crate) async fn connect(&self, id: u64) -> Result<(), TxnError> {
        if id >= u64::from(self.config.coordinators) {
            return Err(TxnError::CoordinatorNotFound(id));
        }
        let cell = {
            let mut open = self.open.lock();
            let failed = open
                .get(&id)
                .and_then(|cell| cell.get())
                .is_some_and(|c| !c.is_ready());
            if failed {
                open.remove(&id);
            }
            Arc::clone(open.entry(id).or_default())
        };
        cell.get_or_try_init(|| {
            Coordinator::open(
                id,
                self.config.clone(),
                &self.env,
                Arc::clone(&self.meta),
                self.persistence,
                self.participants.get().cloned(),
            )
        })
        .await?;
        Ok(())
    }

    /// Coordinator `id` if it is open here.
    fn get(&self, id: u64) -> Result<Arc<Coordinator>, TxnError> {
        self.open
            .lock()
            .get(&id)
            .and_then(|cell| cell.get().cloned())
            .ok_or(TxnError::CoordinatorNotFound(id))
    }

    /// NEW_TXN on coordinator `tc_id`. `Ok(None)`: it is full (no answer).
    pub(crate) async fn new_txn(
        &self,
        tc_id: u64,
        timeout_ms: u64,
        owner: Option<String>,
    ) -> Result<Option<TxnId>, TxnError> {
        self.get(tc_id)?.new_txn(timeout_ms, owner).await
    }

    /// ADD_PARTITION_TO_TXN.
    pub(crate) async fn add_partitions(
        &self,
        id: TxnId,
        role: Option<&str>,
        superuser: bool,
        partitions: Vec<String>,
    ) -> Result<(), TxnError> {
        let coordinator = self.get(id.most)?;
        coordinator
            .add_partitions(id.least, role, superuser, partitions)
            .await
    }

    /// ADD_SUBSCRIPTION_TO_TXN.
    pub(crate) async fn add_subscriptions(
        &self,
        id: TxnId,
        role: Option<&str>,
        superuser: bool,
        subscriptions: Vec<(String, String)>,
    ) -> Result<(), TxnError> {
        let coordinator = self.get(id.most)?;
        coordinator
            .add_subscriptions(id.least, role, superuser, subscriptions)
            .await
    }

    /// END_TXN.
    pub(crate) async fn end(
        &self,
        id: TxnId,
        action: TxnAction,
        role: Option<&str>,
        superuser: bool,
    ) -> Result<(), TxnError> {
        let coordinator = self.get(id.most)?;
        coordinator
            .end(id.least, action, Some((role, superuser)))
            .await
    }

    /// The transaction's state (admin): `Err(CoordinatorNotFound)` when its
    /// coordinator is not open here, `Ok(None)` when it is not open.
    pub(crate) fn view(&self, id: TxnId) -> Result<Option<TxnView>, TxnError> {
        Ok(self.get(id.most)?.view(id.least))
    }

    /// Counts of coordinator `id` if it is open here.
    pub(crate) fn stats_of(&self, id: u64) -> Result<CoordinatorStats, TxnError> {
        Ok(self.get(id)?.stats())
    }

    /// Transactions of coordinator `id` (open here) open for longer than
    /// `age_ms` (admin `slowTransactions`).
    pub(crate) fn slow(&self, id: u64, age_ms: u64) -> Result<Vec<TxnView>, TxnError> {
        Ok(self.get(id)?.slow(age_ms))
    }

    /// Counts of every coordinator open here, by id.
    pub(crate) fn stats(&self) -> Vec<CoordinatorStats> {
        let open: Vec<Arc<Coordinator>> = self
            .open
            .lock()
            .values()
            .filter_map(|cell| cell.get().cloned())
            .collect();
        let mut stats: Vec<CoordinatorStats> = open.iter().map(|c| c.stats()).collect();
        stats.sort_unstable_by_key(|s| s.id);
        stats
    }

    /// Closes every coordinator's log (broker shutdown).
    pub(crate) async fn close(&self) {
        let open: Vec<Arc<Coordinator>> = self
            .open
            .lock()
            .drain()
            .filter_map(|(_, cell)| cell.get().cloned())
            .collect();
        for coordinator in open {
            coordinator.close().await;
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
