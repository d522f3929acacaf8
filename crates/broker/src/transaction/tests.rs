//! The coordinator over in-memory ledgers and metadata: the state machine,
//! Pulsar's errors, recovery from the log, timeouts, bounds.

use std::sync::Arc;
use std::time::Duration;

use vela_log::{LogEnv, Persistence};
use vela_meta::{MemoryStore, MetadataStore};
use vela_wire::proto::ServerError;

use crate::error::ServiceError;

use super::record::TxnStatus;
use super::*;

fn config() -> TransactionConfig {
    TransactionConfig {
        coordinators: 2,
        open_per_coordinator_max: 3,
        ops_per_transaction_max: 2,
        timeout_max: Duration::from_secs(3600),
        timeout_check_interval: Duration::from_millis(20),
        ..TransactionConfig::default()
    }
}

fn coordinators(env: &LogEnv, meta: &Arc<dyn MetadataStore>) -> Coordinators {
    Coordinators::new(config(), env.clone(), Arc::clone(meta), Persistence::SINGLE)
}

fn env() -> (LogEnv, Arc<dyn MetadataStore>) {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let ledgers = Arc::new(vela_log::memory::MemoryBackend(
        vela_log::memory::MemoryLedgers::new(),
    ));
    (LogEnv::new(Arc::clone(&meta), ledgers), meta)
}

const HOUR_MS: u64 = 3_600_000;

#[tokio::test]
async fn commit_abort_and_pulsar_errors() {
    let (env, meta) = env();
    let tcs = coordinators(&env, &meta);
    assert!(matches!(
        tcs.new_txn(0, HOUR_MS, None).await,
        Err(TxnError::CoordinatorNotFound(0))
    ));
    assert!(matches!(
        tcs.connect(2).await,
        Err(TxnError::CoordinatorNotFound(2))
    ));
    tcs.connect(1).await.unwrap();
    let id = tcs.new_txn(1, HOUR_MS, None).await.unwrap().unwrap();
    assert_eq!(id.most, 1);
    tcs.add_partitions(
        id,
        None,
        false,
        vec!["persistent://public/default/a".into()],
    )
    .await
    .unwrap();
    tcs.add_subscriptions(
        id,
        None,
        false,
        vec![("persistent://public/default/b".into(), "s".into())],
    )
    .await
    .unwrap();
    let view = tcs.view(id).unwrap().unwrap();
    assert_eq!(view.status, TxnStatus::Open);
    assert_eq!(
        view.produced,
        vec!["persistent://public/default/a".to_string()]
    );
    assert_eq!(view.acked.len(), 1);
    // The ops bound.
    let error = tcs
        .add_partitions(
            id,
            None,
            false,
            vec!["persistent://public/default/c".into()],
        )
        .await
        .unwrap_err();
    assert_eq!(ServiceError::from(error).code, ServerError::NotAllowedError);

    tcs.end(id, TxnAction::Commit, None, false).await.unwrap();
    assert!(
        tcs.view(id).unwrap().is_none(),
        "ended transactions are forgotten"
    );
    let again = tcs
        .end(id, TxnAction::Commit, None, false)
        .await
        .unwrap_err();
    let again = ServiceError::from(again);
    assert_eq!(again.code, ServerError::TransactionNotFound);
    assert_eq!(
        again.message,
        format!(
            "The transaction with this txdID `(1,{})`not found ",
            id.least
        )
    );

    let aborted = tcs.new_txn(1, HOUR_MS, None).await.unwrap().unwrap();
    assert_ne!(aborted, id);
    tcs.end(aborted, TxnAction::Abort, None, false)
        .await
        .unwrap();
    let error = ServiceError::from(
        tcs.add_partitions(aborted, None, false, vec![])
            .await
            .unwrap_err(),
    );
    assert_eq!(error.code, ServerError::TransactionNotFound);
    let stats = tcs.stats();
    assert_eq!(stats.len(), 1);
    let stats = stats[0];
    assert_eq!(
        (
            stats.id,
            stats.active,
            stats.created,
            stats.committed,
            stats.aborted
        ),
        (1, 0, 2, 1, 1)
    );
    // NEW, ADD_PARTITION, ADD_SUBSCRIPTION and two statuses, then NEW and
    // two statuses.
    assert_eq!(stats.appended, 5 + 3);
}

#[tokio::test]
async fn owners_and_superusers() {
    let (env, meta) = env();
    let tcs = coordinators(&env, &meta);
    tcs.connect(0).await.unwrap();
    let id = tcs
        .new_txn(0, HOUR_MS, Some("alice".into()))
        .await
        .unwrap()
        .unwrap();
    let error = ServiceError::from(
        tcs.end(id, TxnAction::Commit, Some("bob"), false)
            .await
            .unwrap_err(),
    );
    assert_eq!(error.code, ServerError::TransactionNotFound);
    assert_eq!(
        error.message,
        format!("Client (bob) is neither the owner of the transaction {id} nor a super user")
    );
    tcs.end(id, TxnAction::Commit, Some("root"), true)
        .await
        .unwrap();
}

#[tokio::test]
async fn open_transactions_are_bounded_without_an_answer() {
    let (env, meta) = env();
    let tcs = coordinators(&env, &meta);
    tcs.connect(0).await.unwrap();
    for _ in 0..3 {
        assert!(tcs.new_txn(0, HOUR_MS, None).await.unwrap().is_some());
    }
    assert!(tcs.new_txn(0, HOUR_MS, None).await.unwrap().is_none());
}

#[tokio::test]
async fn timed_out_transactions_abort() {
    let (env, meta) = env();
    let tcs = coordinators(&env, &meta);
    tcs.connect(0).await.unwrap();
    let id = tcs.new_txn(0, 30, None).await.unwrap().unwrap();
    let kept = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    // Counted once the abort is durable (after the table forgot it).
    while tcs.stats()[0].timed_out == 0 {
        assert!(tokio::time::Instant::now() < deadline, "never timed out");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(tcs.view(id).unwrap().is_none());
    assert!(tcs.view(kept).unwrap().is_some());
    let stats = tcs.stats()[0];
    assert_eq!((stats.active, stats.timed_out, stats.aborted), (1, 1, 1));
    let error = ServiceError::from(
        tcs.end(id, TxnAction::Commit, None, false)
            .await
            .unwrap_err(),
    );
    assert_eq!(error.code, ServerError::TransactionNotFound);
}

#[tokio::test]
async fn the_log_recovers_open_transactions_and_forgets_ended_ones() {
    let (env, meta) = env();
    let (open, committed, committing) = {
        let tcs = coordinators(&env, &meta);
        tcs.connect(0).await.unwrap();
        let open = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
        tcs.add_partitions(
            open,
            None,
            false,
            vec!["persistent://public/default/a".into()],
        )
        .await
        .unwrap();
        let committed = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
        tcs.end(committed, TxnAction::Commit, None, false)
            .await
            .unwrap();
        // Left COMMITTING, as a crash between the two records would.
        let committing = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
        let coordinator = tcs.get(0).unwrap();
        let record = record::Record::Status {
            seq: committing.least,
            from: TxnStatus::Open,
            to: TxnStatus::Committing,
        };
        coordinator_log_append(&coordinator, record).await;
        tcs.close().await;
        (open, committed, committing)
    };
    let tcs = coordinators(&env, &meta);
    tcs.connect(0).await.unwrap();
    let view = tcs.view(open).unwrap().unwrap();
    assert_eq!(view.status, TxnStatus::Open);
    assert_eq!(
        view.produced,
        vec!["persistent://public/default/a".to_string()]
    );
    assert!(tcs.view(committed).unwrap().is_none());
    // The COMMITTING one is finished by the coordinator.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tcs.view(committing).unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "never finished");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    // Ids are never reused after a restart.
    let next = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
    assert!(next.least > committing.least);
    tcs.end(open, TxnAction::Abort, None, false).await.unwrap();
}

async fn coordinator_log_append(coordinator: &Coordinator, record: record::Record) {
    coordinator.append_for_test(record).await;
}

/// Participants that record what they are told and fail the first
/// `failures` requests.
#[derive(Debug, Default)]
struct Recording {
    failures: std::sync::atomic::AtomicUsize,
    told: parking_lot::Mutex<Vec<(String, TxnAction)>>,
    /// (transaction, the low water mark it came with).
    low_waters: parking_lot::Mutex<Vec<(TxnId, u64)>>,
}

impl Recording {
    fn answer(&self, what: String, action: TxnAction) -> Result<(), ServiceError> {
        let failing = self
            .failures
            .fetch_update(
                std::sync::atomic::Ordering::AcqRel,
                std::sync::atomic::Ordering::Acquire,
                |n| n.checked_sub(1),
            )
            .is_ok();
        if failing {
            return Err(ServiceError::new(ServerError::ServiceNotReady, "not yet"));
        }
        self.told.lock().push((what, action));
        Ok(())
    }
}

impl Participants for Recording {
    fn end_on_partition(
        &self,
        topic: String,
        txn: TxnId,
        action: TxnAction,
        low_water: u64,
    ) -> ParticipantFuture {
        self.low_waters.lock().push((txn, low_water));
        let result = self.answer(topic, action);
        Box::pin(async move { result })
    }

    fn end_on_subscription(
        &self,
        topic: String,
        subscription: String,
        _txn: TxnId,
        action: TxnAction,
        _low_water: u64,
    ) -> ParticipantFuture {
        let result = self.answer(format!("{topic}/{subscription}"), action);
        Box::pin(async move { result })
    }
}

#[tokio::test]
async fn every_participant_is_told_before_the_final_status_is_written() {
    let (env, meta) = env();
    let participants = Arc::new(Recording::default());
    participants
        .failures
        .store(3, std::sync::atomic::Ordering::Release);
    let (committing, aborted) = {
        let tcs = coordinators(&env, &meta);
        tcs.set_participants(Arc::clone(&participants) as Arc<dyn Participants>);
        tcs.connect(0).await.unwrap();
        let id = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
        tcs.add_partitions(
            id,
            None,
            false,
            vec!["persistent://public/default/a".into()],
        )
        .await
        .unwrap();
        tcs.add_subscriptions(
            id,
            None,
            false,
            vec![("persistent://public/default/b".into(), "s".into())],
        )
        .await
        .unwrap();
        // The first rounds fail: END_TXN answers only once both answered.
        tcs.end(id, TxnAction::Commit, None, false).await.unwrap();
        let mut told = participants.told.lock().clone();
        told.sort_by(|a, b| a.0.cmp(&b.0));
        assert_eq!(
            told,
            [
                (
                    "persistent://public/default/a".to_string(),
                    TxnAction::Commit
                ),
                (
                    "persistent://public/default/b/s".to_string(),
                    TxnAction::Commit
                ),
            ]
        );
        assert!(tcs.view(id).unwrap().is_none());
        participants.told.lock().clear();

        // A transaction left COMMITTING (a crash before its participants
        // answered) and one aborted with no participant.
        let committing = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
        tcs.add_partitions(
            committing,
            None,
            false,
            vec!["persistent://public/default/c".into()],
        )
        .await
        .unwrap();
        let coordinator = tcs.get(0).unwrap();
        coordinator_log_append(
            &coordinator,
            record::Record::Status {
                seq: committing.least,
                from: TxnStatus::Open,
                to: TxnStatus::Committing,
            },
        )
        .await;
        let aborted = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
        tcs.end(aborted, TxnAction::Abort, None, false)
            .await
            .unwrap();
        assert!(
            participants.told.lock().is_empty(),
            "no participants to tell"
        );
        tcs.close().await;
        (committing, aborted)
    };
    // After a restart the coordinator tells the COMMITTING one's
    // participants, then forgets it.
    let tcs = coordinators(&env, &meta);
    tcs.set_participants(Arc::clone(&participants) as Arc<dyn Participants>);
    tcs.connect(0).await.unwrap();
    assert!(tcs.view(aborted).unwrap().is_none());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while tcs.view(committing).unwrap().is_some() {
        assert!(tokio::time::Instant::now() < deadline, "never finished");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(
        participants.told.lock().clone(),
        [(
            "persistent://public/default/c".to_string(),
            TxnAction::Commit
        )]
    );
}

#[tokio::test]
async fn participants_hear_a_low_water_mark_below_every_open_transaction() {
    let (env, meta) = env();
    let participants = Arc::new(Recording::default());
    let tcs = coordinators(&env, &meta);
    tcs.set_participants(Arc::clone(&participants) as Arc<dyn Participants>);
    tcs.connect(0).await.unwrap();
    let topic = "persistent://public/default/lwm".to_string();
    let first = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
    let second = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
    for id in [first, second] {
        tcs.add_partitions(id, None, false, vec![topic.clone()])
            .await
            .unwrap();
    }
    // The first is still open: the mark stays below it.
    tcs.end(second, TxnAction::Commit, None, false)
        .await
        .unwrap();
    tcs.end(first, TxnAction::Abort, None, false).await.unwrap();
    let third = tcs.new_txn(0, HOUR_MS, None).await.unwrap().unwrap();
    tcs.add_partitions(third, None, false, vec![topic.clone()])
        .await
        .unwrap();
    tcs.end(third, TxnAction::Commit, None, false)
        .await
        .unwrap();
    let heard = participants.low_waters.lock().clone();
    assert_eq!(
        heard,
        vec![
            (second, first.least - 1),
            (first, first.least - 1),
            (third, third.least - 1),
        ]
    );
    let stats = tcs.stats();
    assert_eq!(stats[0].low_water_mark, third.least);
    assert_eq!(stats[0].last_seq, third.least);
}
