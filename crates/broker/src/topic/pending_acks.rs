//! Transactional acknowledgements of a topic's subscriptions (Pulsar's
//! `PendingAckHandle`): an ACK with a transaction id holds its positions
//! for that transaction; they become real acknowledgements when it commits
//! and are released (sent again) when it aborts.
//!
//! Owns: [`PendingAcks`], per subscription (loaded on first use): the
//! positions each open transaction acknowledged (with their batch ack
//! sets), the one transaction's cumulative ack, the conflict rules and
//! messages of Pulsar's `PendingAckHandleImpl` (TransactionConflict), and
//! their durable record: one metadata key per (subscription, transaction),
//! `/transactions/pending-acks/{log}/{subscription}/{most}-{least}`, written
//! before the ack is answered and deleted once the outcome is applied (on
//! commit after the cursor was flushed), so held acks survive a restart.
//!
//! Bounds: every held position counts against the broker-wide
//! `TxnBudget` (`TransactionConfig::state_entries_max`); when it is full a
//! transactional ack gets NotAllowedError.
//! Never: decides an outcome, or applies an ack before its commit.

use std::collections::HashMap;
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;
use serde::{Deserialize, Serialize};
use tokio::sync::OnceCell;
use vela_log::{ManagedLog, Position};
use vela_meta::{ExpectedVersion, MetaError, MetadataStore};
use vela_wire::proto::{MessageIdData, ServerError};

use crate::error::ServiceError;
use crate::txn_buffer::{TxnBudget, TxnKey};

/// Pulsar's `TxnID.toString()`.
fn txn_text(txn: TxnKey) -> String {
    format!("({},{})", txn.0, txn.1)
}

/// One transaction's acknowledgements on one subscription, as stored.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
struct TxnRecord {
    /// (ledger, entry, ack set: empty for the whole entry).
    individual: Vec<(u64, u64, Vec<u64>)>,
    cumulative: Option<(u64, u64)>,
}

impl TxnRecord {
    fn held(&self) -> usize {
        self.individual.len() + usize::from(self.cumulative.is_some())
    }
}

#[derive(Debug, Default)]
struct SubState {
    /// Position → the transactions holding it (with their ack sets).
    individual: HashMap<Position, Vec<(TxnKey, Vec<u64>)>>,
    txns: HashMap<TxnKey, TxnRecord>,
    /// The one transaction with a cumulative ack, and its position.
    cumulative: Option<(TxnKey, Position)>,
    /// Coordinator id → its low water mark as last heard (one entry per
    /// coordinator).
    low_water: HashMap<u64, u64>,
}

impl SubState {
    fn apply(&mut self, txn: TxnKey, record: &TxnRecord) {
        for (ledger, entry, ack_set) in &record.individual {
            self.individual
                .entry(Position::new(*ledger, *entry))
                .or_default()
                .push((txn, ack_set.clone()));
        }
        if let Some((ledger, entry)) = record.cumulative {
            self.cumulative = Some((txn, Position::new(ledger, entry)));
        }
    }

    /// Forgets `txn`, returning what it held.
    fn take(&mut self, txn: TxnKey) -> Option<TxnRecord> {
        let record = self.txns.remove(&txn)?;
        for (ledger, entry, _) in &record.individual {
            let position = Position::new(*ledger, *entry);
            if let Some(holders) = self.individual.get_mut(&position) {
                holders.retain(|(holder, _)| *holder != txn);
                if holders.is_empty() {
                    self.individual.remove(&position);
                }
            }
        }
        if self.cumulative.is_some_and(|(holder, _)| holder == txn) {
            self.cumulative = None;
        }
        Some(record)
    }
}

/// True when the batch indexes two ack sets acknowledge may overlap (a set
/// bit is an index not acknowledged; an empty set is the whole entry). The
/// batch size is not known here, so the bits past it count as acknowledged
/// by both: two transactions acknowledging different indexes of one batch
/// conflict (safe: one of them aborts), where Pulsar, knowing the size,
/// lets both through.
fn overlaps(a: &[u64], b: &[u64]) -> bool {
    if a.is_empty() || b.is_empty() {
        return true;
    }
    a.iter().zip(b).any(|(x, y)| !x & !y != 0)
}

/// The pending acks of one subscription.
#[derive(Debug, Default)]
struct SubAcks {
    loaded: OnceCell<()>,
    state: Mutex<SubState>,
    /// Serializes the metadata writes of this subscription's records.
    writes: tokio::sync::Mutex<()>,
}

/// What a committed or aborted transaction held on a subscription.
#[derive(Debug, Default)]
pub(crate) struct Released {
    pub(crate) individual: Vec<(Position, Vec<u64>)>,
    pub(crate) cumulative: Option<Position>,
}

/// The pending acks of every subscription of a topic.
#[derive(Debug)]
pub(crate) struct PendingAcks {
    topic: String,
    log: Arc<ManagedLog>,
    meta: Arc<dyn MetadataStore>,
    budget: Arc<TxnBudget>,
    subs: Mutex<HashMap<String, Arc<SubAcks>>>,
}

/// A subscription name as one metadata key level.
fn key_level(name: &str) -> String {
    name.replace('%', "%25").replace('/', "%2F")
}

fn conflict(message: String) -> ServiceError {
    ServiceError::new(ServerError::TransactionConflict, message)
}

impl PendingAcks {
    pub(crate) fn new(
        topic: String,
        log: Arc<ManagedLog>,
        meta: Arc<dyn MetadataStore>,
        budget: Arc<TxnBudget>,
    ) -> PendingAcks {
        PendingAcks {
            topic,
            log,
            meta,
            budget,
            subs: Mutex::new(HashMap::new()),
        }
    }

    fn sub_prefix(&self, subscription: &str) -> String {
        format!(
            "/transactions/pending-acks/{}/{}",
            self.log.name(),
            key_level(subscription)
        )
    }

    fn record_key(&self, subscription: &str, txn: TxnKey) -> String {
        format!("{}/{}-{}", self.sub_prefix(subscription), txn.0, txn.1)
    }

    /// The subscription's pending acks, read from their records the first
    /// time.
    async fn sub(&self, subscription: &str) -> Result<Arc<SubAcks>, ServiceError> {
        let sub = Arc::clone(
            self.subs
                .lock()
                .entry(subscription.to_string())
                .or_default(),
        );
        sub.loaded
            .get_or_try_init(|| async {
                let prefix = self.sub_prefix(subscription);
                let mut state = SubState::default();
                for child in self.meta.children(&prefix).await.map_err(meta_error)? {
                    let Some((most, least)) = child.split_once('-') else {
                        continue;
                    };
                    let (Ok(most), Ok(least)) = (most.parse::<u64>(), least.parse::<u64>()) else {
                        continue;
                    };
                    let key = format!("{prefix}/{child}");
                    let Some((bytes, _)) = self.meta.get(&key).await.map_err(meta_error)? else {
                        continue;
                    };
                    let record: TxnRecord = serde_json::from_slice(&bytes).map_err(|e| {
                        ServiceError::new(
                            ServerError::UnknownError,
                            format!("pending ack record {key} is corrupt: {e}"),
                        )
                    })?;
                    self.budget.take_forced(record.held());
                    state.apply((most, least), &record);
                    state.txns.insert((most, least), record);
                }
                if !state.txns.is_empty() {
                    tracing::info!(topic = %self.topic, subscription, txns = state.txns.len(), "pending acks recovered");
                }
                *sub.state.lock() = state;
                Ok::<(), ServiceError>(())
            })
            .await?;
        Ok(sub)
    }

    /// A transactional ACK: checks Pulsar's conflicts, holds the positions
    /// for `txn` and makes that durable before returning.
    pub(crate) async fn ack(
        &self,
        subscription: &str,
        txn: TxnKey,
        ids: &[MessageIdData],
        cumulative: bool,
    ) -> Result<(), ServiceError> {
        let Some(cursor) = self.log.cursor(subscription) else {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                format!(
                    "[{}][{subscription}] transactional acks need a durable subscription",
                    self.topic
                ),
            ));
        };
        let sub = self.sub(subscription).await?;
        let _writes = sub.writes.lock().await;
        let prefix = format!(
            "[{}][{subscription}] Transaction:{}",
            self.topic,
            txn_text(txn)
        );
        let record = {
            let mut state = sub.state.lock();
            if state.low_water.get(&txn.0).is_some_and(|low| txn.1 <= *low) {
                // Its coordinator ended it: nothing would ever apply or
                // release this acknowledgement.
                return Err(ServiceError::new(
                    ServerError::NotAllowedError,
                    format!(
                        "Transaction [{}] has been ended. Please use a new transaction to acknowledge messages.",
                        txn_text(txn)
                    ),
                ));
            }
            let mut added = TxnRecord::default();
            if cumulative {
                let [id] = ids else {
                    return Err(ServiceError::new(
                        ServerError::NotAllowedError,
                        format!(
                            "{prefix} invalid cumulative ack received with multiple message ids."
                        ),
                    ));
                };
                let position = Position::new(id.ledger_id, id.entry_id);
                if let Some(mark_delete) = cursor.mark_delete_position()
                    && position <= mark_delete
                {
                    return Err(conflict(format!(
                        "{prefix} try to cumulative ack position: {position} within range of cursor's markDeletePosition: {mark_delete}"
                    )));
                }
                if let Some((holder, current)) = state.cumulative
                    && (holder != txn || position <= current)
                {
                    return Err(conflict(format!(
                        "{prefix} try to cumulative batch ack position: {position} within range of current currentPosition: {current}"
                    )));
                }
                added.cumulative = Some((position.ledger_id, position.entry_id));
            } else {
                for id in ids {
                    let position = Position::new(id.ledger_id, id.entry_id);
                    let ack_set: Vec<u64> = id.ack_set.iter().map(|w| *w as u64).collect();
                    let acked_before = cursor.is_acked(position)
                        || (!ack_set.is_empty()
                            && cursor
                                .batch_ack_state(position)
                                .is_some_and(|state| overlaps(&ack_set, &state)));
                    if acked_before {
                        return Err(conflict(format!(
                            "{prefix} try to ack message:{position} already acked before."
                        )));
                    }
                    if let Some(holders) = state.individual.get(&position)
                        && holders.iter().any(|(_, held)| overlaps(held, &ack_set))
                    {
                        let what = if ack_set.is_empty() {
                            "message"
                        } else {
                            "batch message"
                        };
                        return Err(conflict(format!(
                            "{prefix} try to ack {what}:{position} in pending ack status."
                        )));
                    }
                    added
                        .individual
                        .push((position.ledger_id, position.entry_id, ack_set));
                }
            }
            if !self.budget.try_take(added.held()) {
                return Err(ServiceError::new(
                    ServerError::NotAllowedError,
                    self.budget.full_error().to_string(),
                ));
            }
            state.apply(txn, &added);
            let record = state.txns.entry(txn).or_default();
            record.individual.extend(added.individual);
            if added.cumulative.is_some() {
                if record.cumulative.is_some() {
                    // Replaced, not added: one cumulative position per txn.
                    self.budget.release(1);
                }
                record.cumulative = added.cumulative;
            }
            record.clone()
        };
        // As Pulsar, the in-memory state stays when the write fails: the
        // transaction is then aborted (by its client or its timeout).
        let bytes = serde_json::to_vec(&record)
            .map_err(|e| ServiceError::new(ServerError::UnknownError, e.to_string()))?;
        self.meta
            .put(
                &self.record_key(subscription, txn),
                Bytes::from(bytes),
                ExpectedVersion::Any,
            )
            .await
            .map_err(meta_error)?;
        Ok(())
    }

    /// What `txn` holds on `subscription`, forgotten in memory (the record
    /// stays until [`PendingAcks::forget`]). `None`: nothing held.
    pub(crate) async fn release(
        &self,
        subscription: &str,
        txn: TxnKey,
    ) -> Result<Option<Released>, ServiceError> {
        let sub = self.sub(subscription).await?;
        let _writes = sub.writes.lock().await;
        let Some(record) = sub.state.lock().take(txn) else {
            return Ok(None);
        };
        self.budget.release(record.held());
        Ok(Some(Released {
            individual: record
                .individual
                .into_iter()
                .map(|(ledger, entry, ack_set)| (Position::new(ledger, entry), ack_set))
                .collect(),
            cumulative: record
                .cumulative
                .map(|(ledger, entry)| Position::new(ledger, entry)),
        }))
    }

    /// Notes coordinator `most`'s low water mark on `subscription`: its
    /// transactions at or below it are refused from now on; returns those
    /// that still hold acknowledgements here (they arrived after their
    /// transaction ended: the caller releases them).
    pub(crate) async fn note_low_water(
        &self,
        subscription: &str,
        most: u64,
        low_water: u64,
    ) -> Result<Vec<TxnKey>, ServiceError> {
        let sub = self.sub(subscription).await?;
        let mut state = sub.state.lock();
        let mark = state.low_water.entry(most).or_insert(0);
        *mark = (*mark).max(low_water);
        let mark = *mark;
        Ok(state
            .txns
            .keys()
            .filter(|(m, least)| *m == most && *least <= mark)
            .copied()
            .collect())
    }

    /// Transactions holding acknowledgements on `subscription` now, and the
    /// low water marks heard there (coordinator id → mark), for the admin
    /// API (Pulsar's `TransactionPendingAckStats`).
    pub(crate) async fn stats(
        &self,
        subscription: &str,
    ) -> Result<(u64, Vec<(u64, u64)>), ServiceError> {
        let sub = self.sub(subscription).await?;
        let state = sub.state.lock();
        let mut marks: Vec<(u64, u64)> = state.low_water.iter().map(|(m, l)| (*m, *l)).collect();
        marks.sort_unstable();
        Ok((state.txns.len() as u64, marks))
    }

    /// The cumulative acknowledgement `txn` holds on `subscription`, if any
    /// (Pulsar's `TransactionInPendingAckStats`).
    pub(crate) async fn cumulative_of(
        &self,
        subscription: &str,
        txn: TxnKey,
    ) -> Result<Option<Position>, ServiceError> {
        let sub = self.sub(subscription).await?;
        let state = sub.state.lock();
        Ok(state
            .cumulative
            .filter(|(holder, _)| *holder == txn)
            .map(|(_, position)| position))
    }

    /// Forgets every acknowledgement held on `subscription` and deletes its
    /// records (the subscription was deleted).
    pub(crate) async fn drop_subscription(&self, subscription: &str) -> Result<(), ServiceError> {
        let removed = self.subs.lock().remove(subscription);
        if let Some(sub) = removed {
            let state = std::mem::take(&mut *sub.state.lock());
            self.budget
                .release(state.txns.values().map(TxnRecord::held).sum());
        }
        self.delete_records(&self.sub_prefix(subscription)).await
    }

    /// Deletes the records of every subscription (the topic is being
    /// deleted; call before its cursors go).
    pub(crate) async fn delete_all(&self) -> Result<(), ServiceError> {
        let mut names = self.log.cursor_names();
        names.extend(self.subs.lock().keys().cloned());
        names.sort();
        names.dedup();
        for name in names {
            self.delete_records(&self.sub_prefix(&name)).await?;
        }
        Ok(())
    }

    async fn delete_records(&self, prefix: &str) -> Result<(), ServiceError> {
        for child in self.meta.children(prefix).await.map_err(meta_error)? {
            match self
                .meta
                .delete(&format!("{prefix}/{child}"), ExpectedVersion::Any)
                .await
            {
                Ok(()) | Err(MetaError::NotFound { .. }) => {}
                Err(error) => return Err(meta_error(error)),
            }
        }
        Ok(())
    }

    /// Deletes the record of `txn` on `subscription` (its outcome applied).
    pub(crate) async fn forget(&self, subscription: &str, txn: TxnKey) -> Result<(), ServiceError> {
        match self
            .meta
            .delete(&self.record_key(subscription, txn), ExpectedVersion::Any)
            .await
        {
            Ok(()) | Err(MetaError::NotFound { .. }) => Ok(()),
            Err(error) => Err(meta_error(error)),
        }
    }
}

impl Drop for PendingAcks {
    fn drop(&mut self) {
        let held: usize = self
            .subs
            .get_mut()
            .values()
            .map(|sub| {
                sub.state
                    .lock()
                    .txns
                    .values()
                    .map(TxnRecord::held)
                    .sum::<usize>()
            })
            .sum();
        self.budget.release(held);
    }
}

fn meta_error(error: MetaError) -> ServiceError {
    ServiceError::new(ServerError::MetadataError, error.to_string())
}
