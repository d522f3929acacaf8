//! Managed log behaviour on in-memory metadata and ledgers: ordering, rollover,
//! reopen with recovery (fencing the previous owner), cursors and trimming.
#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use vela_log::memory::{MemoryBackend, MemoryLedgers};
use vela_log::{CursorStart, LogConfig, LogEnv, LogError, ManagedLog, Position, Retention};

fn env_with_ledgers() -> (LogEnv, Arc<MemoryLedgers>) {
    let ledgers = MemoryLedgers::new();
    let env = LogEnv::new(
        Arc::new(vela_meta::MemoryStore::new()),
        Arc::new(MemoryBackend(Arc::clone(&ledgers))),
    );
    (env, ledgers)
}

/// Ledgers full after 3 entries, rolled over at once (no minimum age).
fn small_ledgers() -> LogConfig {
    LogConfig {
        ledger_entries_max: 3,
        ledger_age_min: Duration::ZERO,
        cursor_persist_interval: Duration::from_millis(1),
        ..LogConfig::default()
    }
}

fn entry(i: u64) -> Bytes {
    Bytes::from(format!("entry-{i}"))
}

async fn append_all(log: &ManagedLog, range: std::ops::Range<u64>) -> Vec<Position> {
    let futures: Vec<_> = range.map(|i| log.append(entry(i))).collect();
    let mut positions = Vec::new();
    for future in futures {
        positions.push(future.await.unwrap());
    }
    positions
}

async fn read_all(log: &ManagedLog) -> Vec<Bytes> {
    let mut out = Vec::new();
    let mut from = log.first_position().unwrap_or(Position::new(0, 0));
    loop {
        let batch = log.read(from, 4, 1 << 20).await.unwrap();
        let Some(last) = batch.last() else { break };
        from = log.next_position(last.position);
        out.extend(batch.into_iter().map(|e| e.data));
    }
    out
}

#[tokio::test]
async fn appends_complete_in_order_and_read_back_across_rollovers() {
    let (env, _) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/a", small_ledgers())
        .await
        .unwrap();
    // A subscription keeps the entries from being trimmed as consumed.
    log.open_cursor("keep", CursorStart::Earliest)
        .await
        .unwrap();
    let positions = append_all(&log, 0..10).await;
    assert!(positions.windows(2).all(|w| w[0] < w[1]), "{positions:?}");
    // Rollover every 3 entries: at least 4 ledgers were used.
    let ledgers: std::collections::BTreeSet<u64> = positions.iter().map(|p| p.ledger_id).collect();
    assert!(ledgers.len() >= 4, "{positions:?}");
    assert_eq!(log.last_confirmed(), positions.last().copied());
    let read = read_all(&log).await;
    assert_eq!(read, (0..10).map(entry).collect::<Vec<_>>());
    assert_eq!(log.stats().entries, 10);
}

#[tokio::test]
async fn reopen_recovers_entries_and_fences_the_previous_owner() {
    let (env, _) = env_with_ledgers();
    let first = ManagedLog::open(&env, "t/ns/persistent/b", small_ledgers())
        .await
        .unwrap();
    first
        .open_cursor("keep", CursorStart::Earliest)
        .await
        .unwrap();
    append_all(&first, 0..5).await;
    // A second owner loads the same log: recovery fences the first one's ledger.
    let second = ManagedLog::open(&env, "t/ns/persistent/b", small_ledgers())
        .await
        .unwrap();
    let late = first.append(entry(99)).await;
    assert!(
        late.is_err(),
        "the deposed owner must not get an append acknowledged: {late:?}"
    );
    assert_eq!(
        read_all(&second).await,
        (0..5).map(entry).collect::<Vec<_>>()
    );
    append_all(&second, 5..8).await;
    assert_eq!(
        read_all(&second).await,
        (0..8).map(entry).collect::<Vec<_>>()
    );
    second.close().await.unwrap();
    let third = ManagedLog::open(&env, "t/ns/persistent/b", small_ledgers())
        .await
        .unwrap();
    assert_eq!(
        read_all(&third).await,
        (0..8).map(entry).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn closed_log_refuses_appends() {
    let (env, _) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/c", LogConfig::default())
        .await
        .unwrap();
    log.close().await.unwrap();
    assert!(matches!(
        log.append(entry(0)).await,
        Err(LogError::Closed(_))
    ));
}

#[tokio::test]
async fn terminated_log_refuses_appends_also_after_a_reopen() {
    let (env, _) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/term", small_ledgers())
        .await
        .unwrap();
    // A subscription keeps the entries (without one they count as consumed).
    log.open_cursor("keep", CursorStart::Earliest)
        .await
        .unwrap();
    let positions = append_all(&log, 0..5).await;
    // Appends in flight when it terminates still complete.
    let in_flight = log.append(entry(5));
    let last = log.terminate().await.unwrap();
    let tail = in_flight.await.unwrap();
    assert_eq!(last, Some(tail));
    assert!(positions.iter().all(|p| *p < tail));
    assert!(log.is_terminated() && !log.is_closed());
    assert!(matches!(
        log.append(entry(6)).await,
        Err(LogError::Terminated(_))
    ));
    assert_eq!(log.terminate().await.unwrap(), Some(tail), "idempotent");
    log.close().await.unwrap();
    let reopened = ManagedLog::open(&env, "t/ns/persistent/term", small_ledgers())
        .await
        .unwrap();
    assert!(reopened.is_terminated());
    assert_eq!(reopened.last_confirmed(), Some(tail));
    assert!(matches!(
        reopened.append(entry(7)).await,
        Err(LogError::Terminated(_))
    ));
    assert_eq!(read_all(&reopened).await.len(), 6);
}

#[tokio::test]
async fn cursor_acks_advance_mark_delete_and_survive_reopen() {
    let (env, _) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/d", small_ledgers())
        .await
        .unwrap();
    let cursor = log.open_cursor("sub", CursorStart::Earliest).await.unwrap();
    let p = append_all(&log, 0..7).await;
    assert_eq!(cursor.backlog_entries(), 7);
    cursor.ack(&[p[1], p[2], p[4]]).unwrap();
    assert_eq!(cursor.mark_delete_position(), None);
    assert!(cursor.is_acked(p[4]) && !cursor.is_acked(p[3]));
    assert_eq!(cursor.backlog_entries(), 4);
    cursor.ack(&[p[0]]).unwrap();
    assert_eq!(cursor.mark_delete_position(), Some(p[2]));
    cursor.ack(&[p[3]]).unwrap();
    // p[4] was acked already; the mark moves over it across the ledger boundary.
    assert_eq!(cursor.mark_delete_position(), Some(p[4]));
    cursor.ack_batch_indexes(p[5], &[0b110]).unwrap();
    assert_eq!(cursor.batch_ack_state(p[5]), Some(vec![0b110]));
    cursor.ack_batch_indexes(p[5], &[0b011]).unwrap();
    assert_eq!(cursor.batch_ack_state(p[5]), Some(vec![0b010]));
    cursor.flush().await.unwrap();
    log.close().await.unwrap();
    drop(log);

    let log = ManagedLog::open(&env, "t/ns/persistent/d", small_ledgers())
        .await
        .unwrap();
    assert_eq!(log.cursor_names(), vec!["sub".to_string()]);
    let cursor = log.cursor("sub").unwrap();
    assert_eq!(cursor.mark_delete_position(), Some(p[4]));
    assert_eq!(cursor.batch_ack_state(p[5]), Some(vec![0b010]));
    assert_eq!(cursor.backlog_entries(), 2);
    cursor.ack_cumulative(p[6]).unwrap();
    assert_eq!(cursor.backlog_entries(), 0);
}

#[tokio::test]
async fn cursor_properties_are_written_at_once_and_survive_a_crash() {
    let (env, _) = env_with_ledgers();
    let name = "t/ns/persistent/props";
    let log = ManagedLog::open(&env, name, small_ledgers()).await.unwrap();
    let cursor = log.open_cursor("sub", CursorStart::Earliest).await.unwrap();
    assert_eq!(cursor.property("flag"), None);
    assert!(cursor.set_property("flag", Some(1)).await.unwrap());
    assert!(
        !cursor.set_property("flag", Some(1)).await.unwrap(),
        "unchanged"
    );
    assert!(cursor.set_property("other", Some(-3)).await.unwrap());
    assert!(cursor.set_property("other", None).await.unwrap());
    // No flush, no close: what set_property wrote is what a new owner reads.
    drop(cursor);
    drop(log);
    let log = ManagedLog::open(&env, name, small_ledgers()).await.unwrap();
    let cursor = log.cursor("sub").unwrap();
    assert_eq!(cursor.property("flag"), Some(1));
    assert_eq!(cursor.property("other"), None);
    assert_eq!(cursor.properties().len(), 1);
    // Acks keep the properties (one record holds both).
    let p = append_all(&log, 0..2).await;
    cursor.ack(&[p[0]]).unwrap();
    cursor.flush().await.unwrap();
    for i in 1..vela_log::CURSOR_PROPERTIES_MAX {
        cursor
            .set_property(&format!("p{i}"), Some(0))
            .await
            .unwrap();
    }
    assert!(matches!(
        cursor.set_property("one-too-many", Some(0)).await,
        Err(LogError::Config(_))
    ));
    log.close().await.unwrap();
    drop(log);
    let log = ManagedLog::open(&env, name, small_ledgers()).await.unwrap();
    let cursor = log.cursor("sub").unwrap();
    assert_eq!(cursor.property("flag"), Some(1));
    assert_eq!(cursor.mark_delete_position(), Some(p[0]));
}

#[tokio::test]
async fn latest_cursor_skips_existing_entries_and_reset_rewinds() {
    let (env, _) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/e", small_ledgers())
        .await
        .unwrap();
    log.open_cursor("keep", CursorStart::Earliest)
        .await
        .unwrap();
    let p = append_all(&log, 0..4).await;
    let cursor = log.open_cursor("late", CursorStart::Latest).await.unwrap();
    assert_eq!(cursor.backlog_entries(), 0);
    append_all(&log, 4..6).await;
    assert_eq!(cursor.backlog_entries(), 2);
    cursor.reset(p[1]).await.unwrap();
    assert_eq!(cursor.mark_delete_position(), Some(p[0]));
    assert_eq!(cursor.backlog_entries(), 5);
    cursor.reset(p[0]).await.unwrap();
    assert_eq!(cursor.mark_delete_position(), None);
}

#[tokio::test]
async fn consumed_ledgers_are_trimmed_and_unconsumed_ones_kept() {
    let (env, ledgers) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/f", small_ledgers())
        .await
        .unwrap();
    let cursor = log.open_cursor("sub", CursorStart::Earliest).await.unwrap();
    let p = append_all(&log, 0..9).await;
    log.trim().await;
    assert_eq!(
        read_all(&log).await.len(),
        9,
        "nothing consumed yet: nothing trimmed"
    );
    cursor.ack_cumulative(p[5]).unwrap();
    log.trim().await;
    let kept = log.ledger_ids();
    assert!(
        !kept.contains(&p[0].ledger_id) && !kept.contains(&p[3].ledger_id),
        "{kept:?}"
    );
    assert!(kept.contains(&p[6].ledger_id));
    assert!(
        !ledgers.ledger_ids().contains(&p[0].ledger_id),
        "trimmed ledgers are deleted"
    );
    assert_eq!(read_all(&log).await, (6..9).map(entry).collect::<Vec<_>>());
    assert_eq!(cursor.backlog_entries(), 3);
}

#[tokio::test]
async fn without_subscriptions_rolled_ledgers_count_as_consumed() {
    // Pulsar's behaviour with no retention: no durable cursor, nothing to keep.
    let (env, ledgers) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/i", small_ledgers())
        .await
        .unwrap();
    let p = append_all(&log, 0..7).await;
    log.trim().await;
    assert!(!ledgers.ledger_ids().contains(&p[0].ledger_id));
    assert_eq!(log.last_confirmed(), Some(p[6]));
}

#[tokio::test]
async fn full_ledgers_roll_over_past_the_minimum_age_and_readers_keep_them_as_long() {
    // Pulsar's rule: a ledger over its entry cap rolls over only once older
    // than the minimum rollover age. Without cursors, a closed ledger stays
    // at least that long after it closed (readers from the earliest entry).
    let (env, ledgers) = env_with_ledgers();
    let age_min = Duration::from_millis(300);
    let config = LogConfig {
        ledger_age_min: age_min,
        ..small_ledgers()
    };
    let log = ManagedLog::open(&env, "t/ns/persistent/min-age", config)
        .await
        .unwrap();
    let p = append_all(&log, 0..7).await;
    assert!(
        p.iter().all(|pos| pos.ledger_id == p[0].ledger_id),
        "no rollover before the minimum age: {p:?}"
    );
    tokio::time::sleep(age_min + Duration::from_millis(50)).await;
    let q = append_all(&log, 7..9).await;
    assert_eq!(
        q[0].ledger_id, p[0].ledger_id,
        "the append that finds it full"
    );
    assert_ne!(
        q[1].ledger_id, p[0].ledger_id,
        "the next one goes to a new ledger"
    );
    log.trim().await;
    assert!(
        ledgers.ledger_ids().contains(&p[0].ledger_id),
        "kept for readers"
    );
    assert_eq!(read_all(&log).await, (0..9).map(entry).collect::<Vec<_>>());
    tokio::time::sleep(age_min + Duration::from_millis(50)).await;
    log.trim().await;
    assert!(
        !ledgers.ledger_ids().contains(&p[0].ledger_id),
        "then trimmed"
    );
}

#[tokio::test]
async fn waiters_wake_on_new_entries() {
    let (env, _) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/g", LogConfig::default())
        .await
        .unwrap();
    let waiter = {
        let log = Arc::clone(&log);
        tokio::spawn(async move { log.wait_for_new_entries(None).await })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    assert!(!waiter.is_finished());
    log.append(entry(0)).await.unwrap();
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn waiting_for_the_next_entry_holds_after_everything_before_was_trimmed() {
    // A tail reader waits at the next position; once every older ledger is
    // trimmed there is no "previous" entry, and the wait must still block.
    let (env, ledgers) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/w", small_ledgers())
        .await
        .unwrap();
    let p = append_all(&log, 0..6).await;
    log.trim().await;
    assert!(
        !ledgers.ledger_ids().contains(&p[0].ledger_id),
        "consumed ledgers trimmed"
    );
    let next = log.next_position(p[5]);
    let waiter = {
        let log = Arc::clone(&log);
        tokio::spawn(async move { log.wait_for_entry_at(next).await })
    };
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!waiter.is_finished(), "no entry at {next} yet");
    let appended = log.append(entry(6)).await.unwrap();
    assert!(appended >= next);
    tokio::time::timeout(Duration::from_secs(5), waiter)
        .await
        .unwrap()
        .unwrap();
}

/// The wake-on-append hook: called once the entry it waits for is
/// confirmed (not before, not twice), replaced by a later registration of
/// the same waiter, cancelled when the waiter drops, and called when the
/// log closes.
#[tokio::test]
async fn an_entry_waiter_is_called_once_its_entry_is_confirmed_or_the_log_closes() {
    use std::sync::atomic::{AtomicUsize, Ordering};
    let counter = |count: &Arc<AtomicUsize>| -> vela_log::EntryHook {
        let count = Arc::clone(count);
        Box::new(move || {
            count.fetch_add(1, Ordering::SeqCst);
        })
    };
    let (env, _) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/hooks", small_ledgers())
        .await
        .unwrap();
    let p = append_all(&log, 0..2).await;
    let next = log.next_position(p[1]);

    let (first, second, dropped) = (
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
        Arc::new(AtomicUsize::new(0)),
    );
    let waiter = log.entry_waiter();
    waiter.wake_at(next, counter(&first));
    // Replaced: only the second hook of this waiter is ever called.
    waiter.wake_at(next, counter(&second));
    let gone = log.entry_waiter();
    gone.wake_at(next, counter(&dropped));
    drop(gone);
    let later = log.entry_waiter();
    let at_close = Arc::new(AtomicUsize::new(0));
    later.wake_at(Position::new(u64::MAX, 0), counter(&at_close));

    // Confirmed when the append completes: the hook ran by then.
    let appended = log.append(entry(2)).await.unwrap();
    assert!(appended >= next);
    assert_eq!(second.load(Ordering::SeqCst), 1);
    assert_eq!(first.load(Ordering::SeqCst), 0, "a replaced hook runs");
    assert_eq!(
        dropped.load(Ordering::SeqCst),
        0,
        "a dropped waiter's hook runs"
    );
    log.append(entry(3)).await.unwrap();
    assert_eq!(second.load(Ordering::SeqCst), 1, "a hook runs once");
    assert_eq!(at_close.load(Ordering::SeqCst), 0);

    log.close().await.unwrap();
    assert_eq!(
        at_close.load(Ordering::SeqCst),
        1,
        "closing calls every hook"
    );
}

#[tokio::test]
async fn deleting_a_log_removes_its_ledgers_and_metadata() {
    let (env, ledgers) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/h", small_ledgers())
        .await
        .unwrap();
    log.open_cursor("s", CursorStart::Earliest).await.unwrap();
    append_all(&log, 0..5).await;
    log.delete().await.unwrap();
    assert!(
        ledgers.ledger_ids().is_empty(),
        "{:?}",
        ledgers.ledger_ids()
    );
    let fresh = ManagedLog::open(&env, "t/ns/persistent/h", small_ledgers())
        .await
        .unwrap();
    assert_eq!(fresh.last_confirmed(), None);
    assert!(fresh.cursor_names().is_empty());
}

/// What a [`CreateHookBackend`] runs before each ledger creation, given the
/// replication asked for.
type CreateHook =
    Box<dyn Fn(vela_log::Persistence) -> vela_log::backend::BoxFuture<'static, ()> + Send + Sync>;

/// The in-memory backend, with a hook run before every ledger creation (to
/// record it, or to let a rival act meanwhile).
struct CreateHookBackend {
    inner: MemoryBackend,
    before_create: CreateHook,
}

impl std::fmt::Debug for CreateHookBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("CreateHookBackend")
    }
}

impl vela_log::LedgerBackend for CreateHookBackend {
    fn create_ledger(
        &self,
        persistence: vela_log::Persistence,
        log_name: &str,
    ) -> vela_log::backend::BoxFuture<
        '_,
        Result<Arc<dyn vela_log::OpenLedger>, vela_log::LedgerBackendError>,
    > {
        let log_name = log_name.to_string();
        let hook = (self.before_create)(persistence);
        Box::pin(async move {
            hook.await;
            self.inner.create_ledger(persistence, &log_name).await
        })
    }

    fn recover(
        &self,
        ledger_id: u64,
    ) -> vela_log::backend::BoxFuture<
        '_,
        Result<vela_log::RecoveredLedger, vela_log::LedgerBackendError>,
    > {
        self.inner.recover(ledger_id)
    }

    fn read(
        &self,
        ledger_id: u64,
        first_entry_id: u64,
        last_entry_id: u64,
    ) -> vela_log::backend::BoxFuture<'_, Result<Vec<Bytes>, vela_log::LedgerBackendError>> {
        self.inner.read(ledger_id, first_entry_id, last_entry_id)
    }

    fn delete(
        &self,
        ledger_id: u64,
    ) -> vela_log::backend::BoxFuture<'_, Result<(), vela_log::LedgerBackendError>> {
        self.inner.delete(ledger_id)
    }
}

#[tokio::test]
async fn set_persistence_reaches_the_next_ledger_only() {
    // The replication each ledger was created with.
    let created_with = Arc::new(parking_lot::Mutex::new(Vec::new()));
    let record = Arc::clone(&created_with);
    let backend = Arc::new(CreateHookBackend {
        inner: MemoryBackend(MemoryLedgers::new()),
        before_create: Box::new(move |persistence| {
            record.lock().push(persistence);
            Box::pin(async {})
        }),
    });
    let env = LogEnv::new(Arc::new(vela_meta::MemoryStore::new()), backend.clone());
    let log = ManagedLog::open(&env, "t/ns/persistent/p", small_ledgers())
        .await
        .unwrap();
    log.open_cursor("keep", CursorStart::Earliest)
        .await
        .unwrap();
    let wide = vela_log::Persistence {
        ensemble: 3,
        write_quorum: 2,
        ack_quorum: 2,
    };
    assert!(
        log.set_persistence(vela_log::Persistence {
            ensemble: 1,
            write_quorum: 2,
            ack_quorum: 1,
        })
        .is_err()
    );
    append_all(&log, 0..2).await;
    log.set_persistence(wide).unwrap();
    assert_eq!(log.persistence(), wide);
    // The open ledger keeps its replication; the rollover at 3 entries uses the new one.
    append_all(&log, 2..4).await;
    tokio::time::sleep(Duration::from_millis(50)).await;
    let created = created_with.lock().clone();
    assert_eq!(created.len(), 2, "{created:?}");
    assert_eq!(created[0], vela_log::Persistence::SINGLE);
    assert_eq!(created[1], wide);
    // position_after counts confirmed entries across ledgers.
    let ledgers = log.ledgers();
    assert_eq!(ledgers.iter().map(|l| l.entries).sum::<u64>(), 4);
    let first = log.position_after(None, 1).unwrap();
    assert_eq!(log.position_after(Some(first), 3), log.last_confirmed());
    assert_eq!(log.position_after(None, 5), None);
}

#[tokio::test]
async fn retention_keeps_consumed_ledgers_by_size_and_by_time() {
    // Unlimited retention: consumed ledgers stay.
    let (env, _) = env_with_ledgers();
    let keep_all = LogConfig {
        retention: Retention {
            time: None,
            size_bytes: None,
        },
        ..small_ledgers()
    };
    let log = ManagedLog::open(&env, "t/ns/persistent/r1", keep_all)
        .await
        .unwrap();
    let cursor = log.open_cursor("sub", CursorStart::Earliest).await.unwrap();
    let p = append_all(&log, 0..9).await;
    cursor.ack_cumulative(p[8]).unwrap();
    log.trim().await;
    assert_eq!(
        read_all(&log).await.len(),
        9,
        "unlimited retention keeps all"
    );
    assert_eq!(log.bytes_after(cursor.mark_delete_position()), 0);

    // A size limit: consumed ledgers go until the log is within it.
    let entry_bytes = entry(0).len() as u64;
    log.set_retention(Retention {
        time: None,
        size_bytes: Some(4 * entry_bytes),
    });
    log.trim().await;
    let left = read_all(&log).await.len() as u64;
    assert!((1..=6).contains(&left), "{left} entries left");
    assert!(log.stats().size_bytes <= 6 * entry_bytes);

    // A time limit not reached yet keeps them; a zero one lets them go.
    log.set_retention(Retention {
        time: Some(Duration::from_secs(3600)),
        size_bytes: None,
    });
    log.trim().await;
    assert_eq!(read_all(&log).await.len() as u64, left);
    log.set_retention(Retention::NONE);
    log.trim().await;
    assert!(
        read_all(&log).await.len() <= 3,
        "only the ledger being written is left"
    );
}

#[tokio::test]
async fn backlog_bytes_and_the_position_that_keeps_a_quota() {
    let (env, _) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/q", small_ledgers())
        .await
        .unwrap();
    let cursor = log.open_cursor("sub", CursorStart::Earliest).await.unwrap();
    let p = append_all(&log, 0..9).await;
    let entry_bytes = entry(0).len() as u64;
    assert_eq!(log.bytes_after(None), 9 * entry_bytes);
    assert_eq!(
        log.bytes_after(cursor.mark_delete_position()),
        9 * entry_bytes
    );
    // Keep at most 3 entries: everything up to p[5] must go.
    assert_eq!(log.position_keeping_bytes(3 * entry_bytes), Some(p[5]));
    cursor.ack_cumulative(p[5]).unwrap();
    assert_eq!(
        log.bytes_after(cursor.mark_delete_position()),
        3 * entry_bytes
    );
    assert_eq!(log.position_keeping_bytes(100 * entry_bytes), None);
}

#[tokio::test]
async fn an_append_refused_at_once_says_so_before_it_is_awaited() {
    let (env, _) = env_with_ledgers();
    let log = ManagedLog::open(&env, "t/ns/persistent/refused", small_ledgers())
        .await
        .unwrap();
    let taken = log.append(entry(0));
    assert!(!taken.is_refused());
    taken.await.unwrap();
    log.close().await.unwrap();
    let refused = log.append(entry(1));
    assert!(refused.is_refused());
    assert!(refused.await.is_err());
}

#[tokio::test]
async fn a_new_log_created_by_a_rival_meanwhile_fences_the_loser_and_keeps_no_ledger_of_it() {
    const NAME: &str = "t/ns/persistent/raced";
    let ledgers = MemoryLedgers::new();
    let store: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
    let rival_env = LogEnv::new(
        Arc::clone(&store),
        Arc::new(MemoryBackend(Arc::clone(&ledgers))),
    );
    // While the first ledger of the log under test is being created, a
    // rival owner creates that same log (two brokers racing to create a
    // new topic).
    let rival = Arc::new(parking_lot::Mutex::new(Some(rival_env.clone())));
    let rival_log = Arc::new(tokio::sync::OnceCell::<Arc<ManagedLog>>::new());
    let rival_opened = Arc::clone(&rival_log);
    let backend = Arc::new(CreateHookBackend {
        inner: MemoryBackend(Arc::clone(&ledgers)),
        before_create: Box::new(move |_| {
            let rival = rival.lock().take();
            let rival_opened = Arc::clone(&rival_opened);
            Box::pin(async move {
                if let Some(env) = rival {
                    let log = ManagedLog::open(&env, NAME, small_ledgers()).await.unwrap();
                    rival_opened.set(log).unwrap();
                }
            })
        }),
    });
    let env = LogEnv::new(
        Arc::clone(&store),
        Arc::clone(&backend) as Arc<dyn vela_log::LedgerBackend>,
    );
    let lost = ManagedLog::open(&env, NAME, small_ledgers()).await;
    assert!(matches!(lost, Err(LogError::Fenced(_))), "{lost:?}");
    // Only the winner's ledger is left, and the winner's log works.
    let winner = rival_log.get().unwrap();
    assert_eq!(ledgers.ledger_ids(), winner.ledger_ids());
    // A subscription keeps rolled-over ledgers from being trimmed.
    winner
        .open_cursor("s", CursorStart::Earliest)
        .await
        .unwrap();
    append_all(winner, 0..4).await;
    assert_eq!(read_all(winner).await.len(), 4);
    // A later owner opens the winner's log with everything in it.
    let reopened = ManagedLog::open(&rival_env, NAME, small_ledgers())
        .await
        .unwrap();
    assert_eq!(read_all(&reopened).await.len(), 4);
}
