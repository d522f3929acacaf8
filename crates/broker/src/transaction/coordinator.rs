//! One transaction coordinator (one partition of
//! `transaction_coordinator_assign`): its open transactions, their durable
//! log, their timeouts.
//!
//! Owns: [`Coordinator`]: the table of transactions not yet ended, the
//! managed log `pulsar/system/persistent/__transaction_log_{id}` (one
//! [`Record`] per change) with the cursor whose acknowledgements free the
//! records of ended transactions, the allocator of sequence numbers (ranges
//! reserved in the metadata store, so an id is never handed out twice, also
//! after the log was trimmed or another broker took over), and the task
//! that aborts timed-out transactions and finishes the ones a crash left
//! COMMITTING or ABORTING.
//!
//! Invariant: every change is checked and applied under the table's lock
//! and its record appended under that same lock (`ManagedLog::append` never
//! waits), so the log's order is the order of the changes; a request is
//! answered only once its record is durable, and records complete in log
//! order, so whatever was answered is recovered. A log failure stops the
//! coordinator (every later request: TransactionCoordinatorNotFound) until
//! it is opened again, which replays the log.
//! The outcome reaches the participants (`participants`: the partitions'
//! buffers and the subscriptions' pending acks) between the COMMITTING /
//! ABORTING record and the final one, which is written only once every
//! participant answered.
//! Never: reaches topics itself (the `Participants` seam does).

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use parking_lot::Mutex;
use tokio::sync::watch;
use vela_log::{AppendFuture, CursorStart, LogConfig, LogEnv, ManagedLog, Persistence, Position};
use vela_meta::{IdAllocator, MetadataStore};

use super::participants::{Participants, Target, tell_all};
use super::record::{Record, TxnStatus};
use super::types::{CoordinatorStats, TxnAction, TxnError, TxnId, TxnView};
use crate::config::TransactionConfig;

/// The cursor whose acknowledgements free the records of ended transactions.
const LOG_CURSOR: &str = "coordinator";
/// Entries read per step when replaying the log.
const REPLAY_BATCH_ENTRIES: usize = 1000;
/// Bytes read per step when replaying the log.
const REPLAY_BATCH_BYTES: usize = 8 << 20;
/// Sequence numbers reserved per metadata write.
const SEQ_RANGE_LEN: u64 = 1000;

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
}

/// A transaction not yet ended.
#[derive(Debug)]
struct Txn {
    status: TxnStatus,
    open_unix_ms: u64,
    timeout_ms: u64,
    owner: Option<String>,
    produced: BTreeSet<String>,
    acked: BTreeMap<String, BTreeSet<String>>,
    /// Log positions of its records (acknowledged once it ended).
    positions: Vec<Position>,
    /// Set while one request writes its final status; the others wait for
    /// it (`true` once it is durable; dropped unsent when it failed).
    ending: Option<watch::Receiver<bool>>,
}

impl Txn {
    fn ops(&self) -> usize {
        self.produced.len() + self.acked.values().map(BTreeSet::len).sum::<usize>()
    }

    fn deadline_unix_ms(&self) -> u64 {
        self.open_unix_ms.saturating_add(self.timeout_ms)
    }
}

#[derive(Debug, Default)]
struct State {
    txns: HashMap<u64, Txn>,
    /// The highest sequence number opened (replayed or new).
    last_seq: u64,
}

impl State {
    /// Pulsar's low water mark: every transaction of this coordinator with
    /// a sequence number at or below it has ended.
    fn low_water_mark(&self) -> u64 {
        match self.txns.keys().min() {
            Some(oldest) => oldest.saturating_sub(1),
            None => self.last_seq,
        }
    }
}

/// One coordinator. Shared behind an `Arc`.
#[derive(Debug)]
pub(crate) struct Coordinator {
    id: u64,
    config: TransactionConfig,
    log: Arc<ManagedLog>,
    cursor: Arc<vela_log::Cursor>,
    seqs: IdAllocator,
    /// Where outcomes are carried out (`None`: nowhere, unit tests).
    participants: Option<Arc<dyn Participants>>,
    state: Mutex<State>,
    /// The log failed: every request is refused until the coordinator is
    /// opened again.
    failed: AtomicBool,
    /// Counts since this coordinator opened (Pulsar's `pulsar_txn_*`).
    created: AtomicU64,
    committed: AtomicU64,
    aborted: AtomicU64,
    timed_out: AtomicU64,
    appended: AtomicU64,
    /// When opening began and when its replay ended (Unix ms).
    recover_start_unix_ms: u64,
    recover_end_unix_ms: AtomicU64,
    /// Held from taking a sequence number until it is in the table.
    allocating: tokio::sync::Mutex<()>,
}

/// The managed log of coordinator `id` (Pulsar's `__transaction_log_{id}`).
pub(super) fn log_name(id: u64) -> String {
    format!("pulsar/system/persistent/__transaction_log_{id}")
}

impl Coordinator {
    /// Opens coordinator `id`: opens its log (fencing a previous owner),
    /// replays it and starts its timeout task.
    pub(super) async fn open(
        id: u64,
        config: TransactionConfig,
        env: &LogEnv,
        meta: Arc<dyn MetadataStore>,
        persistence: Persistence,
        participants: Option<Arc<dyn Participants>>,
    ) -> Result<Arc<Coordinator>, TxnError> {
        let log_config = LogConfig {
            persistence,
            ..LogConfig::default()
        };
        let log = ManagedLog::open(env, &log_name(id), log_config).await?;
        let cursor = log.open_cursor(LOG_CURSOR, CursorStart::Earliest).await?;
        let seq_key = format!("/transactions/coordinators/{id}/sequence");
        let seqs = IdAllocator::new(meta, &seq_key, SEQ_RANGE_LEN)?;
        let coordinator = Arc::new(Coordinator {
            id,
            config,
            log,
            cursor,
            seqs,
            participants,
            state: Mutex::new(State::default()),
            failed: AtomicBool::new(false),
            created: AtomicU64::new(0),
            committed: AtomicU64::new(0),
            aborted: AtomicU64::new(0),
            timed_out: AtomicU64::new(0),
            appended: AtomicU64::new(0),
            recover_start_unix_ms: unix_ms(),
            recover_end_unix_ms: AtomicU64::new(0),
            allocating: tokio::sync::Mutex::new(()),
        });
        if let Err(error) = coordinator.replay().await {
            // Nothing keeps the log open for a retry: the next connect reopens it.
            coordinator.close().await;
            return Err(error);
        }
        coordinator
            .recover_end_unix_ms
            .store(unix_ms(), Ordering::Release);
        let open = coordinator.state.lock().txns.len();
        tracing::info!(coordinator = id, open, "transaction coordinator opened");
        tokio::spawn(tick_loop(
            Arc::downgrade(&coordinator),
            coordinator.config.timeout_check_interval,
        ));
        Ok(coordinator)
    }

    /// Rebuilds the table from the records after the cursor's mark.
    async fn replay(&self) -> Result<(), TxnError> {
        let Some(last) = self.log.last_confirmed() else {
            return Ok(());
        };
        let mut from = match self.cursor.mark_delete_position() {
            Some(mark) => self.log.next_position(mark),
            None => match self.log.first_position() {
                Some(first) => first,
                None => return Ok(()),
            },
        };
        let mut state = State::default();
        while from <= last {
            let entries = self
                .log
                .read(from, REPLAY_BATCH_ENTRIES, REPLAY_BATCH_BYTES)
                .await?;
            let Some(newest) = entries.last().map(|e| e.position) else {
                break;
            };
            for entry in entries {
                if self.cursor.is_acked(entry.position) {
                    continue;
                }
                let record = Record::decode(&entry.data).map_err(|error| {
                    TxnError::Corrupt(format!(
                        "{} at {:?}: {error}",
                        log_name(self.id),
                        entry.position
                    ))
                })?;
                apply(&mut state, record, Some(entry.position));
            }
            from = self.log.next_position(newest);
        }
        *self.state.lock() = state;
        Ok(())
    }

    fn check_ready(&self) -> Result<(), TxnError> {
        if self.failed.load(Ordering::Acquire) || self.log.is_closed() {
            return Err(TxnError::CoordinatorNotFound(self.id));
        }
        Ok(())
    }

    /// True while the coordinator can serve (its log did not fail).
    pub(super) fn is_ready(&self) -> bool {
        self.check_ready().is_ok()
    }

    /// Waits for a record; a failure stops the coordinator.
    async fn durable(&self, append: AppendFuture) -> Result<Position, TxnError> {
        match append.await {
            Ok(position) => {
                self.appended.fetch_add(1, Ordering::Relaxed);
                Ok(position)
            }
            Err(error) => {
                if !matches!(error, vela_log::LogError::Overloaded(_)) {
                    self.failed.store(true, Ordering::Release);
                }
                tracing::warn!(coordinator = self.id, %error, "transaction log append failed");
                Err(error.into())
            }
        }
    }

    fn txn_id(&self, seq: u64) -> TxnId {
        TxnId {
            most: self.id,
            least: seq,
        }
    }

    /// Opens a transaction timing out after `timeout_ms` (cut to the
    /// configured maximum). `Ok(None)`: the coordinator holds
    /// `open_per_coordinator_max` transactions (Pulsar sends no answer).
    pub(super) async fn new_txn(
        &self,
        timeout_ms: u64,
        owner: Option<String>,
    ) -> Result<Option<TxnId>, TxnError> {
        self.check_ready()?;
        if self.state.lock().txns.len() >= self.config.open_per_coordinator_max {
            return Ok(None);
        }
        // A sequence number is in the table before the next one is taken,
        // so the low water mark never passes one about to open.
        let allocating = self.allocating.lock().await;
        let seq = self.seqs.next_id().await?;
        let max_ms = u64::try_from(self.config.timeout_max.as_millis()).unwrap_or(u64::MAX);
        let record = Record::New {
            seq,
            open_unix_ms: unix_ms(),
            timeout_ms: timeout_ms.min(max_ms),
            owner,
        };
        let append = {
            let mut state = self.state.lock();
            if state.txns.len() >= self.config.open_per_coordinator_max {
                return Ok(None);
            }
            let append = self.log.append(record.encode());
            if append.is_refused() {
                None
            } else {
                apply(&mut state, record, None);
                Some(append)
            }
        };
        drop(allocating);
        let Some(append) = append else {
            return Err(TxnError::Busy);
        };
        let position = self.durable(append).await?;
        self.record_position(seq, position);
        self.created.fetch_add(1, Ordering::Relaxed);
        Ok(Some(self.txn_id(seq)))
    }

    /// Notes where a record applied under the lock landed in the log.
    fn record_position(&self, seq: u64, position: Position) {
        if let Some(txn) = self.state.lock().txns.get_mut(&seq) {
            txn.positions.push(position);
        }
    }

    /// Checks that `role` may act on the open transaction `seq` and that
    /// `ops` more operations fit; applies `record` and appends it.
    fn change(
        &self,
        seq: u64,
        role: Option<&str>,
        superuser: bool,
        record: Record,
        added_ops: usize,
    ) -> Result<AppendFuture, TxnError> {
        self.check_ready()?;
        let id = self.txn_id(seq);
        let mut state = self.state.lock();
        let txn = state.txns.get(&seq).ok_or(TxnError::NotFound(id))?;
        check_owner(txn, id, role, superuser)?;
        if txn.status != TxnStatus::Open {
            return Err(TxnError::InvalidStatus {
                id,
                expected: TxnStatus::Open,
                actual: txn.status,
            });
        }
        if txn.ops() + added_ops > self.config.ops_per_transaction_max {
            return Err(TxnError::TooManyOps {
                id,
                max: self.config.ops_per_transaction_max,
            });
        }
        let append = self.log.append(record.encode());
        if append.is_refused() {
            return Err(TxnError::Busy);
        }
        apply(&mut state, record, None);
        Ok(append)
    }

    /// ADD_PARTITION_TO_TXN: the transaction produced to `partitions`.
    pub(super) async fn add_partitions(
        &self,
        seq: u64,
        role: Option<&str>,
        superuser: bool,
        partitions: Vec<String>,
    ) -> Result<(), TxnError> {
        let added = partitions.len();
        let record = Record::AddPartitions { seq, partitions };
        let append = self.change(seq, role, superuser, record, added)?;
        let position = self.durable(append).await?;
        self.record_position(seq, position);
        Ok(())
    }

    /// ADD_SUBSCRIPTION_TO_TXN: the transaction acknowledged on these
    /// (topic, subscription) pairs.
    pub(super) async fn add_subscriptions(
        &self,
        seq: u64,
        role: Option<&str>,
        superuser: bool,
        subscriptions: Vec<(String, String)>,
    ) -> Result<(), TxnError> {
        let added = subscriptions.len();
        let record = Record::AddSubscriptions { seq, subscriptions };
        let append = self.change(seq, role, superuser, record, added)?;
        let position = self.durable(append).await?;
        self.record_position(seq, position);
        Ok(())
    }

    /// END_TXN (and timeouts, with no role check): OPEN → COMMITTING or
    /// ABORTING (durable), then the final status (durable), after which the
    /// transaction is forgotten (a second END_TXN: TransactionNotFound). A
    /// transaction already COMMITTING is finished again by a commit (a
    /// client's retry); asking the other outcome is InvalidTxnStatus.
    pub(super) async fn end(
        &self,
        seq: u64,
        action: TxnAction,
        caller: Option<(Option<&str>, bool)>,
    ) -> Result<(), TxnError> {
        self.check_ready()?;
        let id = self.txn_id(seq);
        let target = action.in_progress();
        let append = {
            let mut state = self.state.lock();
            let txn = state.txns.get(&seq).ok_or(TxnError::NotFound(id))?;
            if let Some((role, superuser)) = caller {
                check_owner(txn, id, role, superuser)?;
            }
            if txn.status == TxnStatus::Open {
                let record = Record::Status {
                    seq,
                    from: TxnStatus::Open,
                    to: target,
                };
                let append = self.log.append(record.encode());
                if append.is_refused() {
                    return Err(TxnError::Busy);
                }
                apply(&mut state, record, None);
                Some(append)
            } else if txn.status == target {
                None
            } else {
                return Err(TxnError::InvalidStatus {
                    id,
                    expected: target,
                    actual: txn.status,
                });
            }
        };
        if let Some(append) = append {
            let position = self.durable(append).await?;
            self.record_position(seq, position);
        }
        self.finish(seq, target).await
    }

    /// Carries out a COMMITTING or ABORTING transaction: tells its
    /// participants (every partition it produced to, every subscription it
    /// acknowledged on; asked again until all answered), then writes the
    /// final status and frees its records. One runner at a time;
    /// concurrent callers wait for it.
    async fn finish(&self, seq: u64, in_progress: TxnStatus) -> Result<(), TxnError> {
        let id = self.txn_id(seq);
        let (Some(ended), Some(action)) = (in_progress.ended(), TxnAction::of_status(in_progress))
        else {
            return Err(TxnError::InvalidStatus {
                id,
                expected: TxnStatus::Committing,
                actual: in_progress,
            });
        };
        enum Step {
            Gone,
            Wait(watch::Receiver<bool>),
            Run(Vec<Target>, watch::Sender<bool>),
        }
        let step = {
            let mut state = self.state.lock();
            match state.txns.get_mut(&seq) {
                // Gone: another request finished it meanwhile.
                None => Step::Gone,
                Some(txn) => match &txn.ending {
                    Some(waiting) => Step::Wait(waiting.clone()),
                    None => {
                        let (done, waiting) = watch::channel(false);
                        txn.ending = Some(waiting);
                        let mut targets: Vec<Target> = txn
                            .produced
                            .iter()
                            .cloned()
                            .map(Target::Partition)
                            .collect();
                        for (topic, subscriptions) in &txn.acked {
                            targets.extend(
                                subscriptions
                                    .iter()
                                    .map(|sub| Target::Subscription(topic.clone(), sub.clone())),
                            );
                        }
                        Step::Run(targets, done)
                    }
                },
            }
        };
        let (targets, done) = match step {
            Step::Gone => return Ok(()),
            Step::Wait(mut waiting) => {
                return match waiting.wait_for(|done| *done).await {
                    Ok(_) => Ok(()),
                    Err(_) => Err(TxnError::CoordinatorNotFound(self.id)),
                };
            }
            Step::Run(targets, done) => (targets, done),
        };
        // Whatever fails below leaves the transaction to the next try (a
        // client's retry or the tick); waiters hear of the failure.
        let stop_running = || {
            if let Some(txn) = self.state.lock().txns.get_mut(&seq) {
                txn.ending = None;
            }
        };
        let low_water = self.low_water_mark();
        debug_assert!(
            low_water < seq,
            "an ending transaction is below the low water mark"
        );
        if let Some(participants) = &self.participants
            && !targets.is_empty()
            && let Err(error) = tell_all(participants, id, action, low_water, targets, || {
                !self.is_ready()
            })
            .await
        {
            stop_running();
            return Err(TxnError::Participant(error.to_string()));
        }
        let record = Record::Status {
            seq,
            from: in_progress,
            to: ended,
        };
        let append = self.log.append(record.encode());
        if append.is_refused() {
            stop_running();
            return Err(TxnError::Busy);
        }
        let position = match self.durable(append).await {
            Ok(position) => position,
            Err(error) => {
                stop_running();
                return Err(error);
            }
        };
        let positions = {
            let mut state = self.state.lock();
            state.txns.remove(&seq).map(|txn| txn.positions)
        };
        let _ = done.send(true);
        let counter = match ended {
            TxnStatus::Committed => &self.committed,
            _ => &self.aborted,
        };
        counter.fetch_add(1, Ordering::Relaxed);
        let mut positions = positions.unwrap_or_default();
        positions.push(position);
        if let Err(error) = self.cursor.ack(&positions) {
            // Records stay until a restart replays and frees them.
            tracing::warn!(coordinator = self.id, %error, "could not free the records of an ended transaction");
        }
        tracing::debug!(coordinator = self.id, ?id, status = %ended, "transaction ended");
        Ok(())
    }

    /// Aborts timed-out transactions; finishes those a crash left
    /// COMMITTING or ABORTING; trims freed ledgers.
    async fn tick(self: &Arc<Self>) {
        if !self.is_ready() {
            return;
        }
        let now = unix_ms();
        let due: Vec<(u64, Option<TxnStatus>)> = {
            let state = self.state.lock();
            state
                .txns
                .iter()
                .filter_map(|(seq, txn)| match txn.status {
                    TxnStatus::Open if txn.deadline_unix_ms() <= now => Some((*seq, None)),
                    status @ (TxnStatus::Committing | TxnStatus::Aborting)
                        if txn.ending.is_none() =>
                    {
                        Some((*seq, Some(status)))
                    }
                    _ => None,
                })
                .collect()
        };
        for (seq, in_progress) in due {
            // One task each: a transaction whose participants do not answer
            // yet holds up no other (its `ending` keeps the tick from
            // starting it twice).
            let coordinator = Arc::clone(self);
            tokio::spawn(async move { coordinator.end_due(seq, in_progress).await });
        }
        self.log.trim().await;
    }

    /// Ends one transaction the tick found due.
    async fn end_due(&self, seq: u64, in_progress: Option<TxnStatus>) {
        {
            let result = match in_progress {
                None => {
                    tracing::info!(
                        coordinator = self.id,
                        seq,
                        "transaction timed out: aborting"
                    );
                    let result = self.end(seq, TxnAction::Abort, None).await;
                    if result.is_ok() {
                        self.timed_out.fetch_add(1, Ordering::Relaxed);
                    }
                    result
                }
                Some(status) => self.finish(seq, status).await,
            };
            if let Err(error) = result {
                tracing::debug!(coordinator = self.id, seq, %error, "could not end a transaction");
            }
        }
    }

    /// The transaction's state for the admin API (`None`: not open).
    pub(super) fn view(&self, seq: u64) -> Option<TxnView> {
        let state = self.state.lock();
        let txn = state.txns.get(&seq)?;
        Some(TxnView {
            id: self.txn_id(seq),
            status: txn.status,
            open_unix_ms: txn.open_unix_ms,
            timeout_ms: txn.timeout_ms,
            owner: txn.owner.clone(),
            produced: txn.produced.iter().cloned().collect(),
            acked: txn
                .acked
                .iter()
                .map(|(topic, subs)| (topic.clone(), subs.iter().cloned().collect()))
                .collect(),
        })
    }

    /// Transactions open for longer than `age_ms` now (Pulsar's
    /// `getSlowTransactions`).
    pub(super) fn slow(&self, age_ms: u64) -> Vec<TxnView> {
        let now = unix_ms();
        let seqs: Vec<u64> = self
            .state
            .lock()
            .txns
            .iter()
            .filter(|(_, txn)| now.saturating_sub(txn.open_unix_ms) > age_ms)
            .map(|(seq, _)| *seq)
            .collect();
        seqs.into_iter().filter_map(|seq| self.view(seq)).collect()
    }

    /// The low water mark now (see `State::low_water_mark`).
    pub(super) fn low_water_mark(&self) -> u64 {
        self.state.lock().low_water_mark()
    }

    /// Its counts and open transactions now.
    pub(super) fn stats(&self) -> CoordinatorStats {
        let (active, last_seq, low_water_mark) = {
            let state = self.state.lock();
            (
                state.txns.len() as u64,
                state.last_seq,
                state.low_water_mark(),
            )
        };
        CoordinatorStats {
            id: self.id,
            ready: self.is_ready(),
            last_seq,
            low_water_mark,
            recover_start_unix_ms: self.recover_start_unix_ms,
            recover_end_unix_ms: self.recover_end_unix_ms.load(Ordering::Acquire),
            active,
            created: self.created.load(Ordering::Relaxed),
            committed: self.committed.load(Ordering::Relaxed),
            aborted: self.aborted.load(Ordering::Relaxed),
            timed_out: self.timed_out.load(Ordering::Relaxed),
            appended: self.appended.load(Ordering::Relaxed),
        }
    }

    /// Closes the log (the coordinator serves nothing more).
    pub(super) async fn close(&self) {
        self.failed.store(true, Ordering::Release);
        if let Err(error) = self.cursor.flush().await {
            tracing::debug!(coordinator = self.id, %error, "transaction log cursor flush failed");
        }
        if let Err(error) = self.log.close().await {
            tracing::debug!(coordinator = self.id, %error, "transaction log close failed");
        }
    }
}

fn check_owner(txn: &Txn, id: TxnId, role: Option<&str>, superuser: bool) -> Result<(), TxnError> {
    match (&txn.owner, role) {
        (Some(owner), Some(role)) if owner != role && !superuser => Err(TxnError::NotOwner {
            id,
            role: role.to_string(),
        }),
        _ => Ok(()),
    }
}

/// Applies one record to the table (replay, with its position; live
/// changes after their checks, whose position is noted once durable).
/// Records of transactions no longer in the table are ignored: their
/// transaction ended and its records were freed.
fn apply(state: &mut State, record: Record, position: Option<Position>) {
    let seq = record.seq();
    if let Record::New {
        open_unix_ms,
        timeout_ms,
        owner,
        ..
    } = record
    {
        state.last_seq = state.last_seq.max(seq);
        state.txns.insert(
            seq,
            Txn {
                status: TxnStatus::Open,
                open_unix_ms,
                timeout_ms,
                owner,
                produced: BTreeSet::new(),
                acked: BTreeMap::new(),
                positions: position.into_iter().collect(),
                ending: None,
            },
        );
        return;
    }
    let Some(txn) = state.txns.get_mut(&seq) else {
        return;
    };
    txn.positions.extend(position);
    match record {
        Record::New { .. } => {}
        Record::AddPartitions { partitions, .. } => txn.produced.extend(partitions),
        Record::AddSubscriptions { subscriptions, .. } => {
            for (topic, subscription) in subscriptions {
                txn.acked.entry(topic).or_default().insert(subscription);
            }
        }
        Record::Status { to, .. } => {
            if matches!(to, TxnStatus::Committed | TxnStatus::Aborted) {
                state.txns.remove(&seq);
            } else {
                txn.status = to;
            }
        }
    }
}

async fn tick_loop(coordinator: Weak<Coordinator>, interval: Duration) {
    let mut ticker = tokio::time::interval(interval.max(Duration::from_millis(10)));
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let Some(coordinator) = coordinator.upgrade() else {
            return;
        };
        if coordinator.failed.load(Ordering::Acquire) {
            return;
        }
        coordinator.tick().await;
    }
}

#[cfg(test)]
impl Coordinator {
    /// Appends a record without applying it (what a crash right after the
    /// append leaves).
    pub(super) async fn append_for_test(&self, record: Record) {
        self.log.append(record.encode()).await.expect("test append");
    }
}
