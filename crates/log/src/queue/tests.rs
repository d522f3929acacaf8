//! Tests of the append queue: order, bounds, failures, rollover hooks.
#![allow(clippy::unwrap_used)]

use super::*;

/// A ledger with a window of `window` adds in flight, completed by the
/// test (`complete`), entry ids from 0.
#[derive(Debug)]
struct FakeLedger {
    ledger_id: u64,
    window: usize,
    inner: Mutex<Fake>,
    room: Notify,
}

#[derive(Default)]
struct Fake {
    reserved: bool,
    next_entry: u64,
    in_flight: VecDeque<(u64, Bytes, AddCallback)>,
    added: Vec<Bytes>,
}

impl std::fmt::Debug for Fake {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Fake").finish_non_exhaustive()
    }
}

impl FakeLedger {
    fn new(ledger_id: u64, window: usize) -> Arc<FakeLedger> {
        Arc::new(FakeLedger {
            ledger_id,
            window,
            inner: Mutex::new(Fake::default()),
            room: Notify::new(),
        })
    }

    /// Completes the oldest add in flight (`Ok`, or with `error`).
    fn complete(&self, error: Option<LedgerBackendError>) -> Option<Bytes> {
        let (entry_id, data, done) = self.inner.lock().in_flight.pop_front()?;
        self.room.notify_waiters();
        match error {
            None => done(Ok(entry_id)),
            Some(error) => done(Err(error)),
        }
        Some(data)
    }

    fn in_flight(&self) -> usize {
        self.inner.lock().in_flight.len()
    }
}

impl OpenLedger for Arc<FakeLedger> {
    fn ledger_id(&self) -> u64 {
        self.ledger_id
    }

    fn reserve(&self, _payload_bytes: usize) -> Reserve {
        let mut fake = self.inner.lock();
        if fake.reserved || fake.in_flight.len() < self.window {
            fake.reserved = true;
            return Reserve::Ready;
        }
        let ledger = Arc::clone(self);
        Reserve::Wait(Box::pin(async move {
            loop {
                let room = ledger.room.notified();
                tokio::pin!(room);
                room.as_mut().enable();
                {
                    let mut fake = ledger.inner.lock();
                    if fake.in_flight.len() < ledger.window {
                        fake.reserved = true;
                        return Ok(());
                    }
                }
                room.await;
            }
        }))
    }

    fn add(&self, data: Bytes, done: AddCallback) {
        let mut fake = self.inner.lock();
        assert!(fake.reserved, "add without a reservation");
        fake.reserved = false;
        let entry_id = fake.next_entry;
        fake.next_entry += 1;
        fake.added.push(data.clone());
        fake.in_flight.push_back((entry_id, data, done));
    }

    fn close(&self) -> BoxFuture<'static, Result<(), LedgerBackendError>> {
        Box::pin(async { Ok(()) })
    }
}

type Outcomes = Arc<Mutex<Vec<(u32, Result<Position, LogError>)>>>;

fn queue(bytes_max: u64, limits: LedgerLimits, full: Arc<AtomicUsize>) -> Arc<AppendQueue> {
    let hooks = QueueHooks {
        ledger_full: Box::new(move |_| {
            full.fetch_add(1, Ordering::Relaxed);
        }),
        next_ledger_wanted: Box::new(|| {}),
        stopped: Box::new(|_| {}),
    };
    let budget = AppendBudget::new(bytes_max);
    Arc::new(AppendQueue::new(Arc::from("t"), budget, limits, hooks))
}

/// Pushes an append of `bytes` bytes; true when it was queued.
fn push(queue: &Arc<AppendQueue>, outcomes: &Outcomes, id: u32, bytes: usize) -> bool {
    let outcomes = Arc::clone(outcomes);
    queue.push(
        Bytes::from(vec![id as u8; bytes]),
        None,
        Box::new(move |result| outcomes.lock().push((id, result))),
    )
}

async fn settle() {
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test]
async fn appends_beyond_the_window_wait_in_order_and_complete_in_order() {
    let ledger = FakeLedger::new(7, 2);
    let q = queue(1 << 20, LedgerLimits::NONE, Arc::default());
    assert!(q.set_writer(Arc::new(Arc::clone(&ledger))));
    let outcomes: Outcomes = Arc::default();
    for id in 0..10 {
        push(&q, &outcomes, id, 10);
    }
    assert_eq!(
        ledger.in_flight(),
        2,
        "the window bounds what is handed over"
    );
    for _ in 0..10 {
        settle().await;
        ledger.complete(None).unwrap();
    }
    settle().await;
    let outcomes = outcomes.lock().clone();
    let expected: Vec<(u32, Result<Position, LogError>)> = (0..10)
        .map(|id| (id, Ok(Position::new(7, u64::from(id)))))
        .collect();
    assert_eq!(format!("{outcomes:?}"), format!("{expected:?}"));
    assert_eq!(
        ledger.inner.lock().added,
        (0..10u8)
            .map(|id| Bytes::from(vec![id; 10]))
            .collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn past_the_bound_an_append_is_refused_at_once_and_the_queue_goes_on() {
    let ledger = FakeLedger::new(1, 1);
    let q = queue(140, LedgerLimits::NONE, Arc::default());
    assert!(q.set_writer(Arc::new(Arc::clone(&ledger))));
    let outcomes: Outcomes = Arc::default();
    // Appends hold their bytes until they complete (in flight or
    // waiting alike): 40 in flight, then 60 + 40 waiting reach the
    // bound, not pass it.
    assert!(push(&q, &outcomes, 0, 40));
    assert!(push(&q, &outcomes, 1, 60));
    assert!(!push(&q, &outcomes, 2, 41), "refused, and told so at once");
    assert!(push(&q, &outcomes, 3, 40));
    assert!(
        matches!(
            outcomes.lock().as_slice(),
            [(2, Err(LogError::Overloaded(_)))]
        ),
        "{:?}",
        outcomes.lock()
    );
    for _ in 0..3 {
        settle().await;
        ledger.complete(None).unwrap();
    }
    let positions: Vec<(u32, u64)> = outcomes
        .lock()
        .iter()
        .filter_map(|(id, r)| r.as_ref().ok().map(|p| (*id, p.entry_id)))
        .collect();
    assert_eq!(positions, vec![(0, 0), (1, 1), (3, 2)]);
    assert!(!q.is_stopped());
}

#[tokio::test]
async fn a_failed_add_stops_the_queue_and_everything_after_it_fails() {
    let ledger = FakeLedger::new(1, 2);
    let q = queue(1 << 20, LedgerLimits::NONE, Arc::default());
    assert!(q.set_writer(Arc::new(Arc::clone(&ledger))));
    let outcomes: Outcomes = Arc::default();
    for id in 0..5 {
        push(&q, &outcomes, id, 10);
    }
    ledger.complete(None).unwrap();
    settle().await;
    ledger
        .complete(Some(LedgerBackendError::Fenced(1)))
        .unwrap();
    settle().await;
    assert!(q.is_stopped());
    push(&q, &outcomes, 5, 10);
    let outcomes = outcomes.lock().clone();
    assert!(matches!(outcomes[0], (0, Ok(_))), "{outcomes:?}");
    // The failed one first, then those still queued, then the refused one.
    let failed: Vec<u32> = outcomes[1..].iter().map(|(id, _)| *id).collect();
    assert_eq!(failed[0], 1);
    assert_eq!(failed.len(), 4, "{outcomes:?}");
    assert!(outcomes[1..].iter().all(|(_, r)| r.is_err()));
    // Entry 2 was handed over before the failure: the ledger answers it.
    assert_eq!(ledger.in_flight(), 1);
}

#[tokio::test]
async fn a_full_ledger_is_detached_and_the_next_one_takes_what_waited() {
    let full = Arc::new(AtomicUsize::new(0));
    let limits = LedgerLimits {
        entries_max: 3,
        ..LedgerLimits::NONE
    };
    // Pulsar's rule: a cap or the maximum age, never before the minimum age.
    let ruled = LedgerLimits {
        entries_max: 3,
        bytes_max: 1000,
        age_max: Duration::from_secs(240),
        age_min: Duration::from_secs(10),
    };
    let young = Duration::from_secs(5);
    let old = Duration::from_secs(11);
    assert!(!ruled.is_full(3, 0, young));
    assert!(ruled.is_full(3, 0, old));
    assert!(ruled.is_full(0, 1000, old));
    assert!(!ruled.is_full(2, 999, old));
    assert!(ruled.is_full(0, 0, Duration::from_secs(240)));
    assert!(limits.is_full(3, 0, Duration::ZERO));
    let q = queue(1 << 20, limits, Arc::clone(&full));
    let first = FakeLedger::new(1, 100);
    assert!(q.set_writer(Arc::new(Arc::clone(&first))));
    let outcomes: Outcomes = Arc::default();
    for id in 0..5 {
        push(&q, &outcomes, id, 10);
    }
    assert_eq!(full.load(Ordering::Relaxed), 1);
    assert_eq!(first.in_flight(), 3);
    while first.complete(None).is_some() {}
    let second = FakeLedger::new(2, 100);
    assert!(q.set_writer(Arc::new(Arc::clone(&second))));
    while second.complete(None).is_some() {}
    let positions: Vec<Position> = outcomes
        .lock()
        .iter()
        .map(|(_, r)| *r.as_ref().unwrap())
        .collect();
    let expected = vec![
        Position::new(1, 0),
        Position::new(1, 1),
        Position::new(1, 2),
        Position::new(2, 0),
        Position::new(2, 1),
    ];
    assert_eq!(positions, expected);
    // Stopped queues refuse a writer.
    q.stop(LogError::Closed("t".into()));
    assert!(!q.set_writer(Arc::new(FakeLedger::new(3, 1))));
}

/// Records the queue's calls: `W` for a nearly full ledger, `F` for a
/// full one (whose `Detached` is kept).
type Recorded = (
    Arc<AppendQueue>,
    Arc<Mutex<String>>,
    Arc<Mutex<Vec<Detached>>>,
);

fn recording_queue(limits: LedgerLimits) -> Recorded {
    let calls: Arc<Mutex<String>> = Arc::default();
    let detached: Arc<Mutex<Vec<Detached>>> = Arc::default();
    let (on_full, on_wanted, kept) = (
        Arc::clone(&calls),
        Arc::clone(&calls),
        Arc::clone(&detached),
    );
    let hooks = QueueHooks {
        ledger_full: Box::new(move |full| {
            on_full.lock().push('F');
            kept.lock().push(full);
        }),
        next_ledger_wanted: Box::new(move || on_wanted.lock().push('W')),
        stopped: Box::new(|_| {}),
    };
    let budget = AppendBudget::new(1 << 20);
    let queue = Arc::new(AppendQueue::new(Arc::from("t"), budget, limits, hooks));
    (queue, calls, detached)
}

#[tokio::test]
async fn the_next_ledger_is_wanted_once_at_three_quarters_before_the_ledger_is_full() {
    let limits = LedgerLimits {
        entries_max: 8,
        ..LedgerLimits::NONE
    };
    let (q, calls, _) = recording_queue(limits);
    let ledger = FakeLedger::new(1, 100);
    assert!(q.set_writer(Arc::new(Arc::clone(&ledger))));
    let outcomes: Outcomes = Arc::default();
    for id in 0..5 {
        push(&q, &outcomes, id, 10);
    }
    assert_eq!(*calls.lock(), "", "5 (+1) of 8: not yet");
    push(&q, &outcomes, 5, 10);
    assert_eq!(*calls.lock(), "W", "6 (+2) of 8: wanted");
    push(&q, &outcomes, 6, 10);
    assert_eq!(*calls.lock(), "W", "told once per ledger");
    push(&q, &outcomes, 7, 10);
    assert_eq!(*calls.lock(), "WF");
    // The next ledger is wanted again, once, when it gets nearly full.
    let second = FakeLedger::new(2, 100);
    assert!(q.set_writer(Arc::new(Arc::clone(&second))));
    for id in 8..14 {
        push(&q, &outcomes, id, 10);
    }
    assert_eq!(*calls.lock(), "WFW");
    // A ledger that is full at its first append is never "nearly" so.
    let one = LedgerLimits {
        entries_max: 1,
        ..LedgerLimits::NONE
    };
    assert!(!one.is_nearly_full(0, 0, Duration::ZERO));
    assert!(one.is_full(1, 0, Duration::ZERO));
    let (q, calls, _) = recording_queue(one);
    assert!(q.set_writer(Arc::new(FakeLedger::new(3, 100))));
    push(&q, &outcomes, 20, 10);
    assert_eq!(*calls.lock(), "F");
}

#[tokio::test]
async fn a_detached_ledger_is_answered_once_every_add_on_it_was_told() {
    let limits = LedgerLimits {
        entries_max: 3,
        ..LedgerLimits::NONE
    };
    let (q, _, detached) = recording_queue(limits);
    let ledger = FakeLedger::new(1, 100);
    assert!(q.set_writer(Arc::new(Arc::clone(&ledger))));
    let outcomes: Outcomes = Arc::default();
    for id in 0..4 {
        push(&q, &outcomes, id, 10);
    }
    let full = detached.lock().pop().unwrap();
    assert_eq!(full.writer().ledger_id(), 1);
    let waiting = tokio::spawn(async move { full.answered().await });
    ledger.complete(None).unwrap();
    ledger.complete(None).unwrap();
    settle().await;
    assert!(!waiting.is_finished(), "one add of the ledger unanswered");
    ledger.complete(None).unwrap();
    assert!(waiting.await.unwrap(), "every add answered");
    assert_eq!(outcomes.lock().len(), 3, "each told before the answer");
    // A failed add answers too (false): the queue stopped.
    let (q, _, detached) = recording_queue(limits);
    let ledger = FakeLedger::new(2, 100);
    assert!(q.set_writer(Arc::new(Arc::clone(&ledger))));
    for id in 0..3 {
        push(&q, &outcomes, id, 10);
    }
    let full = detached.lock().pop().unwrap();
    ledger
        .complete(Some(LedgerBackendError::Fenced(2)))
        .unwrap();
    assert!(!full.answered().await);
    assert!(q.is_stopped());
}

#[tokio::test]
async fn outcomes_on_an_unrecorded_ledger_wait_for_its_record_in_order() {
    let limits = LedgerLimits {
        entries_max: 2,
        ..LedgerLimits::NONE
    };
    let (q, _, _) = recording_queue(limits);
    let first = FakeLedger::new(1, 100);
    assert!(q.set_writer(Arc::new(Arc::clone(&first))));
    let outcomes: Outcomes = Arc::default();
    for id in 0..5 {
        push(&q, &outcomes, id, 10);
    }
    first.complete(None).unwrap();
    first.complete(None).unwrap();
    let second = FakeLedger::new(2, 100);
    let recording = q
        .set_writer_unrecorded(Arc::new(Arc::clone(&second)))
        .unwrap();
    assert_eq!(second.in_flight(), 2, "issued before the record");
    second.complete(None).unwrap();
    second.complete(None).unwrap();
    let told: Vec<u32> = outcomes.lock().iter().map(|(id, _)| *id).collect();
    assert_eq!(told, vec![0, 1], "the second ledger's outcomes are held");
    recording.recorded();
    let positions: Vec<(u32, Position)> = outcomes
        .lock()
        .iter()
        .map(|(id, r)| (*id, *r.as_ref().unwrap()))
        .collect();
    assert_eq!(
        positions,
        vec![
            (0, Position::new(1, 0)),
            (1, Position::new(1, 1)),
            (2, Position::new(2, 0)),
            (3, Position::new(2, 1)),
        ]
    );
    // A record that was not written: what the ledger answered fails.
    let third = FakeLedger::new(3, 100);
    let recording = q
        .set_writer_unrecorded(Arc::new(Arc::clone(&third)))
        .unwrap();
    third.complete(None).unwrap();
    assert_eq!(outcomes.lock().len(), 4);
    recording.failed(LogError::Fenced("t".into()));
    assert!(
        matches!(
            outcomes.lock().as_slice(),
            [.., (4, Err(LogError::Fenced(_)))]
        ),
        "{:?}",
        outcomes.lock()
    );
    // A stopped queue takes no unrecorded ledger.
    q.stop(LogError::Closed("t".into()));
    assert!(
        q.set_writer_unrecorded(Arc::new(FakeLedger::new(4, 1)))
            .is_none()
    );
}

#[tokio::test]
async fn an_appender_closes_once_every_add_was_handed_over() {
    let ledger = FakeLedger::new(4, 1);
    let appender = LedgerAppender::new(Arc::new(Arc::clone(&ledger)));
    let results = Arc::new(Mutex::new(Vec::new()));
    for i in 0..3u8 {
        let results = Arc::clone(&results);
        appender.add(
            Bytes::from(vec![i]),
            Box::new(move |r| results.lock().push(r)),
        );
    }
    let closing = tokio::spawn(appender.close());
    for _ in 0..3 {
        settle().await;
        ledger.complete(None).unwrap();
    }
    closing.await.unwrap().unwrap();
    let results: Vec<u64> = results
        .lock()
        .iter()
        .map(|r| *r.as_ref().unwrap())
        .collect();
    assert_eq!(results, vec![0, 1, 2]);
}
