//! The engine's own tests: expectations, group commit, failed commits.

#![allow(clippy::unwrap_used)]

use super::*;

#[test]
fn expectations() {
    let v = Some(Version(5));
    assert_eq!(check_expected("/k", None, ExpectedVersion::Any), Ok(()));
    assert_eq!(check_expected("/k", v, ExpectedVersion::Any), Ok(()));
    assert_eq!(check_expected("/k", None, ExpectedVersion::Absent), Ok(()));
    assert!(matches!(
        check_expected("/k", v, ExpectedVersion::Absent),
        Err(MetaError::Exists {
            actual: Version(5),
            ..
        })
    ));
    assert!(matches!(
        check_expected("/k", None, ExpectedVersion::Is(Version(5))),
        Err(MetaError::NotFound { .. })
    ));
    assert_eq!(
        check_expected("/k", v, ExpectedVersion::Is(Version(5))),
        Ok(())
    );
    assert!(matches!(
        check_expected("/k", v, ExpectedVersion::Is(Version(4))),
        Err(MetaError::BadVersion {
            actual: Version(5),
            ..
        })
    ));
}

use std::sync::Condvar;
use std::sync::atomic::{AtomicBool, AtomicUsize};

use crate::memory::MemoryBackend;

/// A memory backend that blocks like a disk (runs on the blocking pool),
/// whose commits wait while its gate is closed and fail while `fail` is set,
/// and which records how many mutations each commit carried.
#[derive(Debug, Default)]
struct GatedBackend {
    inner: MemoryBackend,
    closed: Mutex<bool>,
    opened: Condvar,
    fail: AtomicBool,
    entered: AtomicUsize,
    commits: Mutex<Vec<usize>>,
}

impl GatedBackend {
    fn set_closed(&self, closed: bool) {
        *self.closed.lock().unwrap() = closed;
        self.opened.notify_all();
    }
}

impl LocalBackend for Arc<GatedBackend> {
    const BLOCKING: bool = true;

    fn get(&self, key: &str) -> Result<Option<Record>, MetaError> {
        self.inner.get(key)
    }

    fn children(&self, path: &str, prefix: &str) -> Result<Vec<String>, MetaError> {
        self.inner.children(path, prefix)
    }

    fn commit(&self, mutations: &[Mutation<'_>], revision: u64) -> Result<(), MetaError> {
        self.entered.fetch_add(1, Ordering::SeqCst);
        let mut closed = self.closed.lock().unwrap();
        while *closed {
            closed = self.opened.wait(closed).unwrap();
        }
        drop(closed);
        self.commits.lock().unwrap().push(mutations.len());
        if self.fail.load(Ordering::SeqCst) {
            return Err(MetaError::Backend {
                op: "commit",
                detail: "injected fsync failure".to_owned(),
            });
        }
        self.inner.commit(mutations, revision)
    }
}

fn gated() -> (LocalStore<Arc<GatedBackend>>, Arc<GatedBackend>) {
    let backend = Arc::new(GatedBackend::default());
    (LocalStore::new(Arc::clone(&backend), 0), backend)
}

/// Waits until `ready` holds; a hang (30 s) fails the test.
async fn until(mut ready: impl FnMut() -> bool) {
    let waited = tokio::time::timeout(Duration::from_secs(30), async {
        while !ready() {
            tokio::time::sleep(Duration::from_millis(1)).await;
        }
    });
    assert!(waited.await.is_ok(), "condition never held");
}

fn queued(store: &LocalStore<Arc<GatedBackend>>) -> usize {
    store.inner.lock().queue.len()
}

fn put_task(
    store: &LocalStore<Arc<GatedBackend>>,
    key: String,
    value: Bytes,
    expected: ExpectedVersion,
) -> tokio::task::JoinHandle<Result<Version, MetaError>> {
    let store = store.clone();
    tokio::spawn(async move { store.put(&key, value, expected, None).await })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_share_a_commit_and_return_only_once_it_is_durable() {
    let (store, backend) = gated();
    let mut watcher = store.watch("/g").await.unwrap();
    backend.set_closed(true);
    let first = put_task(&store, "/g/0".into(), Bytes::new(), ExpectedVersion::Absent);
    until(|| backend.entered.load(Ordering::SeqCst) == 1).await;
    let writers = 100;
    let rest: Vec<_> = (1..=writers)
        .map(|i| {
            put_task(
                &store,
                format!("/g/{i}"),
                Bytes::new(),
                ExpectedVersion::Absent,
            )
        })
        .collect();
    until(|| queued(&store) == writers).await;

    // Nothing is durable yet: no writer has returned, no reader or watcher
    // sees any of it.
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(!first.is_finished());
    assert!(rest.iter().all(|w| !w.is_finished()));
    assert_eq!(store.get("/g/0").await.unwrap(), None);
    assert_eq!(watcher.try_recv(), None);

    backend.set_closed(false);
    assert_eq!(first.await.unwrap().unwrap(), Version(1));
    let mut acked = vec![("/g/0".to_owned(), Version(1))];
    for (i, writer) in rest.into_iter().enumerate() {
        acked.push((format!("/g/{}", i + 1), writer.await.unwrap().unwrap()));
    }
    // The first commit carried the first write; the 100 staged behind it
    // shared the second.
    assert_eq!(*backend.commits.lock().unwrap(), vec![1, writers]);
    for (key, version) in &acked {
        let (_, stored) = store.get(key).await.unwrap().unwrap();
        assert_eq!(stored, *version, "what the writer was told is stored");
    }
    // One revision each, in the order they were staged, and the events in
    // that order.
    acked.sort_by_key(|(_, version)| *version);
    let revisions: Vec<u64> = acked.iter().map(|(_, v)| v.0).collect();
    assert_eq!(revisions, (1..=writers as u64 + 1).collect::<Vec<_>>());
    for (key, version) in acked {
        assert_eq!(
            watcher.try_recv(),
            Some(WatchEvent::Put { key, version }),
            "events in commit order"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_commit_takes_a_bounded_batch() {
    let (store, backend) = gated();
    backend.set_closed(true);
    let first = put_task(
        &store,
        "/b/first".into(),
        Bytes::new(),
        ExpectedVersion::Any,
    );
    until(|| backend.entered.load(Ordering::SeqCst) == 1).await;
    let writers = 2 * COMMIT_BATCH_WRITES_MAX + 5;
    let small: Vec<_> = (0..writers)
        .map(|i| {
            put_task(
                &store,
                format!("/b/{i}"),
                Bytes::new(),
                ExpectedVersion::Any,
            )
        })
        .collect();
    until(|| queued(&store) == writers).await;
    backend.set_closed(false);
    first.await.unwrap().unwrap();
    for writer in small {
        writer.await.unwrap().unwrap();
    }
    assert_eq!(
        *backend.commits.lock().unwrap(),
        vec![1, COMMIT_BATCH_WRITES_MAX, COMMIT_BATCH_WRITES_MAX, 5]
    );

    // By bytes: values of 512 KiB, at most 7 fit COMMIT_BATCH_BYTES_MAX.
    backend.commits.lock().unwrap().clear();
    backend.set_closed(true);
    let entered = backend.entered.load(Ordering::SeqCst);
    let first = put_task(
        &store,
        "/b/first".into(),
        Bytes::new(),
        ExpectedVersion::Any,
    );
    until(|| backend.entered.load(Ordering::SeqCst) == entered + 1).await;
    let value = Bytes::from(vec![7u8; 512 * 1024]);
    let large: Vec<_> = (0..20)
        .map(|i| {
            put_task(
                &store,
                format!("/l/{i}"),
                value.clone(),
                ExpectedVersion::Any,
            )
        })
        .collect();
    until(|| queued(&store) == 20).await;
    backend.set_closed(false);
    first.await.unwrap().unwrap();
    for writer in large {
        writer.await.unwrap().unwrap();
    }
    let commits = backend.commits.lock().unwrap().clone();
    assert_eq!(commits[0], 1);
    assert_eq!(commits[1..].iter().sum::<usize>(), 20);
    assert!(commits[1..].iter().all(|&n| n <= 7), "{commits:?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cas_lost_to_a_staged_write_is_answered_once_that_write_is_durable() {
    let (store, backend) = gated();
    backend.set_closed(true);
    let winner = put_task(
        &store,
        "/k".into(),
        Bytes::from_static(b"a"),
        ExpectedVersion::Absent,
    );
    until(|| backend.entered.load(Ordering::SeqCst) == 1).await;
    let loser = put_task(
        &store,
        "/k".into(),
        Bytes::from_static(b"b"),
        ExpectedVersion::Absent,
    );
    tokio::time::sleep(Duration::from_millis(20)).await;
    assert!(
        !loser.is_finished(),
        "a loser must not learn of a write a crash could still take back"
    );
    backend.set_closed(false);
    let version = winner.await.unwrap().unwrap();
    match loser.await.unwrap() {
        Err(MetaError::Exists { actual, .. }) => assert_eq!(actual, version),
        other => panic!("expected Exists, got {other:?}"),
    }
    assert_eq!(
        store.get("/k").await.unwrap(),
        Some((Bytes::from_static(b"a"), version))
    );
}

/// What a writer sees when the commit holding its write fails: an error,
/// never `Ok`; so does every writer staged behind it (its batch never runs)
/// and a writer whose CAS lost to a write of the failed batch. Watchers see
/// nothing, and the store refuses everything after.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failed_commit_fails_its_writers_and_every_later_one() {
    let (store, backend) = gated();
    let mut watcher = store.watch("/").await.unwrap();
    backend.set_closed(true);
    let failing = put_task(
        &store,
        "/k".into(),
        Bytes::from_static(b"a"),
        ExpectedVersion::Absent,
    );
    until(|| backend.entered.load(Ordering::SeqCst) == 1).await;
    let lost_cas = put_task(
        &store,
        "/k".into(),
        Bytes::from_static(b"b"),
        ExpectedVersion::Absent,
    );
    let behind = put_task(&store, "/other".into(), Bytes::new(), ExpectedVersion::Any);
    until(|| queued(&store) == 1).await;
    backend.fail.store(true, Ordering::SeqCst);
    backend.set_closed(false);
    for writer in [failing, lost_cas, behind] {
        assert!(
            matches!(writer.await.unwrap(), Err(MetaError::Backend { .. })),
            "every writer of the failed commit or behind it gets its error"
        );
    }
    assert_eq!(watcher.try_recv(), None);
    assert_eq!(*backend.commits.lock().unwrap(), vec![1], "never retried");
    assert!(backend.inner.get("/k").unwrap().is_none());
    backend.fail.store(false, Ordering::SeqCst);
    assert!(matches!(
        store
            .put("/x", Bytes::new(), ExpectedVersion::Any, None)
            .await,
        Err(MetaError::Backend { .. })
    ));
    assert!(matches!(
        store.get("/k").await,
        Err(MetaError::Backend { .. })
    ));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ending_a_session_deletes_its_staged_keys_in_one_commit() {
    let (store, backend) = gated();
    let session = store.session(Duration::from_secs(30)).await.unwrap();
    for i in 0..10 {
        store
            .put(
                &format!("/e/{i}"),
                Bytes::new(),
                ExpectedVersion::Absent,
                Some(&session),
            )
            .await
            .unwrap();
    }
    backend.commits.lock().unwrap().clear();
    store
        .end_session(session.id(), SessionState::Closed)
        .await
        .unwrap();
    assert_eq!(*backend.commits.lock().unwrap(), vec![10]);
    assert!(store.children("/e").await.unwrap().is_empty());
    assert!(matches!(
        store
            .put("/e/x", Bytes::new(), ExpectedVersion::Any, Some(&session))
            .await,
        Err(MetaError::SessionExpired { .. })
    ));
}
