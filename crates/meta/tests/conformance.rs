//! One conformance suite, run against every backend: memory, redb file, and a
//! real etcd process. Plus the file store's durability tests (reopen, kill -9).
//!
//! Boundary helper: `run_conformance(&Backend)` is the only code that drives
//! the suite; each backend test only builds a `Backend`.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeSet;
use std::io::{BufRead, BufReader};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use vela_meta::registry::{self, BookieId, BookieInfo};
use vela_meta::{
    BoxFuture, EtcdStore, ExpectedVersion, FileStore, IdAllocator, MemoryStore, MetaError,
    MetadataStore, SessionId, SessionState, VALUE_BYTES_MAX, Version, WatchEvent, Watcher,
};

/// How long any single expected event may take. Generous: it only bounds a
/// failing run, a passing one takes milliseconds (or a TTL).
const EVENT_WAIT: Duration = Duration::from_secs(15);

/// A backend under test.
struct Backend {
    name: &'static str,
    store: Arc<dyn MetadataStore>,
    /// Expires a session as if its lease lapsed (not a close).
    expire: Box<dyn Fn(SessionId) -> BoxFuture<'static, ()> + Send + Sync>,
    /// TTL for the expiry cases (etcd rounds it up to its minimum).
    short_ttl: Duration,
    /// Children written for the large listing: above 1000 crosses an etcd page;
    /// the local stores need fewer (each write is an fsync for the file store).
    many_children: usize,
}

macro_rules! cases {
    ($backend:expr, $($case:ident),+ $(,)?) => {
        $(
            let started = Instant::now();
            $case($backend, concat!("/conformance/", stringify!($case))).await;
            println!("{}: {} ok ({:?})", $backend.name, stringify!($case), started.elapsed());
        )+
    };
}

async fn run_conformance(b: &Backend) {
    cases!(
        b,
        get_put_cas,
        delete_with_version,
        children_listing,
        watch_delivers_in_order,
        ephemeral_deleted_on_close,
        ephemeral_deleted_on_expiry,
        ephemeral_deleted_after_dropped_handle_ttl,
        plain_put_detaches_ephemeral,
        concurrent_cas_loses_no_update,
        limits_are_typed_errors,
        bookie_registry,
        id_allocator_unique_across_allocators,
        ledger_ids_increase_across_allocators,
    );
}

fn val(s: &str) -> Bytes {
    Bytes::copy_from_slice(s.as_bytes())
}

async fn next_event(watcher: &mut Watcher) -> WatchEvent {
    tokio::time::timeout(EVENT_WAIT, watcher.recv())
        .await
        .unwrap_or_else(|_| panic!("no event on {} within {EVENT_WAIT:?}", watcher.path()))
        .expect("watch stream ended")
}

async fn get_put_cas(b: &Backend, root: &str) {
    let s = &b.store;
    let k = format!("{root}/k");
    assert_eq!(s.get(&k).await.unwrap(), None);

    let v1 = s
        .put(&k, val("one"), ExpectedVersion::Absent)
        .await
        .unwrap();
    assert_eq!(s.get(&k).await.unwrap(), Some((val("one"), v1)));
    match s.put(&k, val("x"), ExpectedVersion::Absent).await {
        Err(MetaError::Exists { actual, .. }) => assert_eq!(actual, v1),
        other => panic!("create over an existing key: {other:?}"),
    }

    let v2 = s
        .put(&k, val("two"), ExpectedVersion::Is(v1))
        .await
        .unwrap();
    assert!(v2 > v1);
    match s.put(&k, val("stale"), ExpectedVersion::Is(v1)).await {
        Err(MetaError::BadVersion {
            actual, expected, ..
        }) => {
            assert_eq!(actual, v2);
            assert_eq!(expected, ExpectedVersion::Is(v1));
        }
        other => panic!("CAS with a stale version: {other:?}"),
    }
    assert_eq!(
        s.get(&k).await.unwrap(),
        Some((val("two"), v2)),
        "a failed CAS changes nothing"
    );

    let missing = format!("{root}/missing");
    assert!(matches!(
        s.put(&missing, val("x"), ExpectedVersion::Is(v2)).await,
        Err(MetaError::NotFound { .. })
    ));
    assert_eq!(s.get(&missing).await.unwrap(), None);

    let v3 = s.put(&k, val("three"), ExpectedVersion::Any).await.unwrap();
    assert!(v3 > v2);
    let empty = s
        .put(&format!("{root}/empty"), Bytes::new(), ExpectedVersion::Any)
        .await
        .unwrap();
    assert_eq!(
        s.get(&format!("{root}/empty")).await.unwrap(),
        Some((Bytes::new(), empty))
    );
}

async fn delete_with_version(b: &Backend, root: &str) {
    let s = &b.store;
    let k = format!("{root}/k");
    assert!(matches!(
        s.delete(&k, ExpectedVersion::Any).await,
        Err(MetaError::NotFound { .. })
    ));
    let v1 = s.put(&k, val("a"), ExpectedVersion::Absent).await.unwrap();
    let v2 = s.put(&k, val("b"), ExpectedVersion::Is(v1)).await.unwrap();
    match s.delete(&k, ExpectedVersion::Is(v1)).await {
        Err(MetaError::BadVersion { actual, .. }) => assert_eq!(actual, v2),
        other => panic!("delete with a stale version: {other:?}"),
    }
    assert!(matches!(
        s.delete(&k, ExpectedVersion::Absent).await,
        Err(MetaError::InvalidArgument { .. })
    ));
    s.delete(&k, ExpectedVersion::Is(v2)).await.unwrap();
    assert_eq!(s.get(&k).await.unwrap(), None);
    assert!(matches!(
        s.delete(&k, ExpectedVersion::Is(v2)).await,
        Err(MetaError::NotFound { .. })
    ));
    // Re-created: a version newer than any before, so an old CAS cannot match.
    let v3 = s.put(&k, val("c"), ExpectedVersion::Absent).await.unwrap();
    assert!(v3 > v2);
    assert!(matches!(
        s.put(&k, val("d"), ExpectedVersion::Is(v2)).await,
        Err(MetaError::BadVersion { .. })
    ));
    s.delete(&k, ExpectedVersion::Any).await.unwrap();
    // Deleting a key leaves the keys below it alone.
    let child = format!("{k}/child");
    s.put(&k, val("p"), ExpectedVersion::Any).await.unwrap();
    s.put(&child, val("c"), ExpectedVersion::Any).await.unwrap();
    s.delete(&k, ExpectedVersion::Any).await.unwrap();
    assert!(s.get(&child).await.unwrap().is_some());
}

async fn children_listing(b: &Backend, root: &str) {
    let s = &b.store;
    let p = format!("{root}/p");
    for key in ["b", "a", "c/deep", "a-x", "z9"] {
        s.put(&format!("{p}/{key}"), val(key), ExpectedVersion::Any)
            .await
            .unwrap();
    }
    // Siblings sharing the string prefix are not children.
    s.put(&format!("{p}x"), val("sibling"), ExpectedVersion::Any)
        .await
        .unwrap();
    s.put(
        &format!("{p}x/y"),
        val("sibling child"),
        ExpectedVersion::Any,
    )
    .await
    .unwrap();
    assert_eq!(s.children(&p).await.unwrap(), vec!["a", "a-x", "b", "z9"]);
    // `c` exists only as a parent of a stored key: not a child itself.
    assert_eq!(s.children(&format!("{p}/c")).await.unwrap(), vec!["deep"]);
    assert!(
        s.children(&format!("{root}/nothing"))
            .await
            .unwrap()
            .is_empty()
    );
    let top = s.children("/").await.unwrap();
    assert!(
        !top.contains(&"conformance".to_owned()),
        "no key /conformance was stored: {top:?}"
    );
    s.put("/conformance", val("top"), ExpectedVersion::Any)
        .await
        .unwrap();
    assert!(
        s.children("/")
            .await
            .unwrap()
            .contains(&"conformance".to_owned())
    );
    s.delete("/conformance", ExpectedVersion::Any)
        .await
        .unwrap();
    // Many children (on etcd: more than one page of 1000 keys).
    let many = format!("{root}/many");
    let names: Vec<String> = (0..b.many_children).map(|i| format!("n{i:05}")).collect();
    for chunk in names.chunks(100) {
        let tasks: Vec<_> = chunk
            .iter()
            .map(|name| {
                let store = Arc::clone(s);
                let key = format!("{many}/{name}");
                let value = val(name);
                tokio::spawn(
                    async move { store.put(&key, value, ExpectedVersion::Any).await.unwrap() },
                )
            })
            .collect();
        for task in tasks {
            task.await.unwrap();
        }
    }
    assert_eq!(s.children(&many).await.unwrap(), names);
}

async fn watch_delivers_in_order(b: &Backend, root: &str) {
    let s = &b.store;
    let w_path = format!("{root}/w");
    let mut watcher = s.watch(&w_path).await.unwrap();
    let k = format!("{w_path}/a");
    let v1 = s.put(&k, val("1"), ExpectedVersion::Absent).await.unwrap();
    let v2 = s.put(&k, val("2"), ExpectedVersion::Is(v1)).await.unwrap();
    // Outside the watched subtree: never reported.
    s.put(&format!("{w_path}x"), val("sibling"), ExpectedVersion::Any)
        .await
        .unwrap();
    s.put(&format!("{root}/other"), val("o"), ExpectedVersion::Any)
        .await
        .unwrap();
    s.delete(&k, ExpectedVersion::Is(v2)).await.unwrap();
    let v_self = s
        .put(&w_path, val("self"), ExpectedVersion::Any)
        .await
        .unwrap();
    let deep = format!("{w_path}/x/y");
    let v_deep = s
        .put(&deep, val("deep"), ExpectedVersion::Any)
        .await
        .unwrap();

    let expected = vec![
        WatchEvent::Put {
            key: k.clone(),
            version: v1,
        },
        WatchEvent::Put {
            key: k.clone(),
            version: v2,
        },
        WatchEvent::Delete { key: k.clone() },
        WatchEvent::Put {
            key: w_path.clone(),
            version: v_self,
        },
        WatchEvent::Put {
            key: deep.clone(),
            version: v_deep,
        },
    ];
    let mut seen = Vec::new();
    for _ in 0..expected.len() {
        seen.push(next_event(&mut watcher).await);
    }
    assert_eq!(seen, expected);
    tokio::time::sleep(Duration::from_millis(50)).await;
    assert_eq!(watcher.try_recv(), None, "no event outside the subtree");

    // Two watchers see the same order.
    let mut w1 = s.watch(&w_path).await.unwrap();
    let mut w2 = s.watch(&w_path).await.unwrap();
    let mut versions = Vec::new();
    for i in 0..20 {
        versions.push(
            s.put(&k, val(&i.to_string()), ExpectedVersion::Any)
                .await
                .unwrap(),
        );
    }
    for w in [&mut w1, &mut w2] {
        for v in &versions {
            assert_eq!(
                next_event(w).await,
                WatchEvent::Put {
                    key: k.clone(),
                    version: *v
                }
            );
        }
    }
}

async fn ephemeral_deleted_on_close(b: &Backend, root: &str) {
    let s = &b.store;
    let session = s.session(Duration::from_secs(10)).await.unwrap();
    assert_eq!(session.state(), SessionState::Alive);
    let k = format!("{root}/owner");
    let mut watcher = s.watch(root).await.unwrap();
    let v = s
        .put_ephemeral(&session, &k, val("me"), ExpectedVersion::Absent)
        .await
        .unwrap();
    assert_eq!(s.get(&k).await.unwrap(), Some((val("me"), v)));
    // A second owner cannot take it while the session lives.
    let rival = s.session(Duration::from_secs(10)).await.unwrap();
    assert!(matches!(
        s.put_ephemeral(&rival, &k, val("rival"), ExpectedVersion::Absent)
            .await,
        Err(MetaError::Exists { .. })
    ));
    assert_eq!(
        next_event(&mut watcher).await,
        WatchEvent::Put {
            key: k.clone(),
            version: v
        }
    );

    session.close().await.unwrap();
    assert_eq!(
        next_event(&mut watcher).await,
        WatchEvent::Delete { key: k.clone() }
    );
    assert_eq!(s.get(&k).await.unwrap(), None);
    // Now the rival can own it.
    s.put_ephemeral(&rival, &k, val("rival"), ExpectedVersion::Absent)
        .await
        .unwrap();
    rival.close().await.unwrap();
    assert_eq!(s.get(&k).await.unwrap(), None);
}

async fn ephemeral_deleted_on_expiry(b: &Backend, root: &str) {
    let s = &b.store;
    // Short TTL: the etcd holder learns of a revoked lease at its next
    // keep-alive, a third of the TTL later.
    let session = s.session(b.short_ttl).await.unwrap();
    let keys: Vec<String> = (0..3).map(|i| format!("{root}/e{i}")).collect();
    for k in &keys {
        s.put_ephemeral(&session, k, val("x"), ExpectedVersion::Any)
            .await
            .unwrap();
    }
    let persistent = format!("{root}/persistent");
    s.put(&persistent, val("stays"), ExpectedVersion::Any)
        .await
        .unwrap();
    let mut watcher = s.watch(root).await.unwrap();

    (b.expire)(session.id()).await;
    let ended = tokio::time::timeout(EVENT_WAIT, session.ended())
        .await
        .expect("session end");
    assert_eq!(ended, SessionState::Expired);
    let mut deleted = BTreeSet::new();
    for _ in 0..keys.len() {
        match next_event(&mut watcher).await {
            WatchEvent::Delete { key } => deleted.insert(key),
            other => panic!("expected deletes, got {other:?}"),
        };
    }
    assert_eq!(deleted, keys.iter().cloned().collect());
    for k in &keys {
        assert_eq!(s.get(k).await.unwrap(), None);
    }
    assert!(s.get(&persistent).await.unwrap().is_some());
    match s
        .put_ephemeral(&session, &keys[0], val("late"), ExpectedVersion::Any)
        .await
    {
        Err(MetaError::SessionExpired { session: id }) => assert_eq!(id, session.id()),
        other => panic!("put with an expired session: {other:?}"),
    }
    assert_eq!(s.get(&keys[0]).await.unwrap(), None);
    session.close().await.unwrap();
}

async fn ephemeral_deleted_after_dropped_handle_ttl(b: &Backend, root: &str) {
    let s = &b.store;
    let session = s.session(b.short_ttl).await.unwrap();
    let ttl = session.ttl();
    let k = format!("{root}/crashed-owner");
    let mut watcher = s.watch(&k).await.unwrap();
    s.put_ephemeral(&session, &k, val("x"), ExpectedVersion::Absent)
        .await
        .unwrap();
    assert!(matches!(
        next_event(&mut watcher).await,
        WatchEvent::Put { .. }
    ));
    let dropped_at = Instant::now();
    drop(session); // as if the process died: nobody keeps the session alive
    let event = tokio::time::timeout(ttl + EVENT_WAIT, watcher.recv())
        .await
        .expect("delete after ttl");
    assert_eq!(event, Some(WatchEvent::Delete { key: k.clone() }));
    assert!(
        dropped_at.elapsed() >= ttl.mul_f64(0.5),
        "the key outlived its owner by the TTL ({ttl:?}), not {:?}",
        dropped_at.elapsed()
    );
    assert_eq!(s.get(&k).await.unwrap(), None);
}

async fn plain_put_detaches_ephemeral(b: &Backend, root: &str) {
    let s = &b.store;
    let session = s.session(Duration::from_secs(10)).await.unwrap();
    let k = format!("{root}/k");
    s.put_ephemeral(&session, &k, val("e"), ExpectedVersion::Absent)
        .await
        .unwrap();
    let v = s
        .put(&k, val("persistent now"), ExpectedVersion::Any)
        .await
        .unwrap();
    session.close().await.unwrap();
    assert_eq!(s.get(&k).await.unwrap(), Some((val("persistent now"), v)));
}

async fn concurrent_cas_loses_no_update(b: &Backend, root: &str) {
    const TASKS: u64 = 4;
    const INCREMENTS_PER_TASK: u64 = 25;
    let k = format!("{root}/counter");
    b.store
        .put(&k, val("0"), ExpectedVersion::Absent)
        .await
        .unwrap();
    let mut tasks = Vec::new();
    for _ in 0..TASKS {
        let store = Arc::clone(&b.store);
        let k = k.clone();
        tasks.push(tokio::spawn(async move {
            let mut conflicts = 0u64;
            for _ in 0..INCREMENTS_PER_TASK {
                loop {
                    let (value, version) = store.get(&k).await.unwrap().unwrap();
                    let n: u64 = std::str::from_utf8(&value).unwrap().parse().unwrap();
                    // Let the other tasks run between read and write, so CAS
                    // conflicts happen on every backend (memory never yields).
                    tokio::task::yield_now().await;
                    match store
                        .put(&k, val(&(n + 1).to_string()), ExpectedVersion::Is(version))
                        .await
                    {
                        Ok(_) => break,
                        Err(MetaError::BadVersion { .. }) => conflicts += 1,
                        Err(other) => panic!("CAS failed: {other}"),
                    }
                }
            }
            conflicts
        }));
    }
    let mut conflicts = 0;
    for t in tasks {
        conflicts += t.await.unwrap();
    }
    let (value, _) = b.store.get(&k).await.unwrap().unwrap();
    assert_eq!(value, val(&(TASKS * INCREMENTS_PER_TASK).to_string()));
    println!("{}: concurrent CAS: {conflicts} conflicts retried", b.name);
}

async fn limits_are_typed_errors(b: &Backend, root: &str) {
    let s = &b.store;
    let k = format!("{root}/big");
    let too_big = Bytes::from(vec![7u8; VALUE_BYTES_MAX + 1]);
    match s.put(&k, too_big.clone(), ExpectedVersion::Any).await {
        Err(MetaError::ValueTooLarge {
            value_bytes,
            value_bytes_max,
            ..
        }) => {
            assert_eq!(value_bytes, VALUE_BYTES_MAX + 1);
            assert_eq!(value_bytes_max, VALUE_BYTES_MAX);
        }
        other => panic!("oversized value: {other:?}"),
    }
    let session = s.session(Duration::from_secs(10)).await.unwrap();
    assert!(matches!(
        s.put_ephemeral(&session, &k, too_big, ExpectedVersion::Any)
            .await,
        Err(MetaError::ValueTooLarge { .. })
    ));
    session.close().await.unwrap();
    assert_eq!(s.get(&k).await.unwrap(), None);
    let at_limit = Bytes::from(vec![7u8; VALUE_BYTES_MAX]);
    let v = s
        .put(&k, at_limit.clone(), ExpectedVersion::Any)
        .await
        .unwrap();
    assert_eq!(s.get(&k).await.unwrap(), Some((at_limit, v)));

    let long_key = format!("{root}/{}", "x".repeat(vela_meta::KEY_BYTES_MAX));
    assert!(matches!(
        s.get(&long_key).await,
        Err(MetaError::KeyTooLong { .. })
    ));
    assert!(matches!(
        s.put(&long_key, val("x"), ExpectedVersion::Any).await,
        Err(MetaError::KeyTooLong { .. })
    ));
    for bad in ["", "relative", "/", "/trailing/", "/a//b", "/a/../b"] {
        assert!(
            matches!(
                s.put(bad, val("x"), ExpectedVersion::Any).await,
                Err(MetaError::BadKey { .. })
            ),
            "{bad:?}"
        );
    }
    assert!(matches!(
        s.children("/a//b").await,
        Err(MetaError::BadKey { .. })
    ));
    assert!(matches!(
        s.watch("nope").await,
        Err(MetaError::BadKey { .. })
    ));
}

async fn bookie_registry(b: &Backend, _root: &str) {
    let s = b.store.as_ref();
    let mut watcher = registry::watch_bookies(s).await.unwrap();
    assert!(registry::list_bookies(s).await.unwrap().is_empty());
    let session = s.session(Duration::from_secs(10)).await.unwrap();
    let id = BookieId::new("127.0.0.1:3181").unwrap();
    let info = BookieInfo {
        address: "127.0.0.1:3181".to_owned(),
        rack: Some("/r1".to_owned()),
    };
    registry::register_bookie(s, &session, &id, &info)
        .await
        .unwrap();
    let other = s.session(Duration::from_secs(10)).await.unwrap();
    let id2 = BookieId::new("b2").unwrap();
    let info2 = BookieInfo {
        address: "10.1.1.1:3181".to_owned(),
        rack: None,
    };
    registry::register_bookie(s, &other, &id2, &info2)
        .await
        .unwrap();
    assert!(matches!(
        registry::register_bookie(s, &other, &id, &info2).await,
        Err(MetaError::Exists { .. })
    ));
    assert!(matches!(
        next_event(&mut watcher).await,
        WatchEvent::Put { .. }
    ));
    assert!(matches!(
        next_event(&mut watcher).await,
        WatchEvent::Put { .. }
    ));
    assert_eq!(
        registry::list_bookies(s).await.unwrap(),
        vec![(id.clone(), info.clone()), (id2.clone(), info2)]
    );
    other.close().await.unwrap();
    assert_eq!(
        next_event(&mut watcher).await,
        WatchEvent::Delete {
            key: registry::bookie_key(&id2)
        }
    );
    assert_eq!(
        registry::list_bookies(s).await.unwrap(),
        vec![(id.clone(), info)]
    );
    // Read-only marks: idempotent both ways, gone with the session.
    assert!(registry::list_read_only(s).await.unwrap().is_empty());
    for _ in 0..2 {
        registry::set_read_only(s, &session, &id, true)
            .await
            .unwrap();
    }
    assert_eq!(registry::list_read_only(s).await.unwrap(), vec![id.clone()]);
    for _ in 0..2 {
        registry::set_read_only(s, &session, &id, false)
            .await
            .unwrap();
    }
    assert!(registry::list_read_only(s).await.unwrap().is_empty());
    registry::set_read_only(s, &session, &id, true)
        .await
        .unwrap();
    session.close().await.unwrap();
    assert!(registry::list_bookies(s).await.unwrap().is_empty());
    assert!(registry::list_read_only(s).await.unwrap().is_empty());
}

async fn id_allocator_unique_across_allocators(b: &Backend, root: &str) {
    let key = format!("{root}/idgen");
    let allocators: Vec<Arc<IdAllocator>> = (0..3)
        .map(|_| Arc::new(IdAllocator::new(Arc::clone(&b.store), &key, 7).unwrap()))
        .collect();
    let mut tasks = Vec::new();
    for allocator in &allocators {
        for _ in 0..2 {
            let allocator = Arc::clone(allocator);
            tasks.push(tokio::spawn(async move {
                let mut ids = Vec::new();
                for _ in 0..20 {
                    ids.push(allocator.next_id().await.unwrap());
                }
                ids
            }));
        }
    }
    let mut all = Vec::new();
    for t in tasks {
        let ids = t.await.unwrap();
        assert!(
            ids.windows(2).all(|w| w[0] < w[1]),
            "ids from one allocator increase: {ids:?}"
        );
        all.extend(ids);
    }
    let unique: BTreeSet<u64> = all.iter().copied().collect();
    assert_eq!(unique.len(), all.len(), "duplicate ids handed out");
    assert!(!unique.contains(&0));
    // 6 callers x 20 ids from ranges of 7: at most 3 allocators' partial ranges wasted.
    let (counter, _) = b.store.get(&key).await.unwrap().unwrap();
    let next: u64 = std::str::from_utf8(&counter).unwrap().parse().unwrap();
    assert!(next > *unique.last().unwrap());
    assert!(
        next <= 1 + 120 + 3 * 7,
        "counter {next} reserved far more than used"
    );
}

async fn ledger_ids_increase_across_allocators(b: &Backend, root: &str) {
    // What the managed log relies on: a ledger created later, by any
    // process, has a greater id.
    let key = format!("{root}/ledger-idgen");
    let range = vela_meta::idgen::LEDGER_ID_RANGE_LEN;
    let first = IdAllocator::new(Arc::clone(&b.store), &key, range).unwrap();
    let second = IdAllocator::new(Arc::clone(&b.store), &key, range).unwrap();
    let mut ids = Vec::new();
    for round in 0..10 {
        let allocator = if round % 3 == 0 { &second } else { &first };
        ids.push(allocator.next_id().await.unwrap());
    }
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "{ids:?}");
}

// ---------------------------------------------------------------- memory

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_memory() {
    let store = MemoryStore::new();
    let expirer = store.clone();
    let backend = Backend {
        name: "memory",
        store: Arc::new(store),
        expire: Box::new(move |id| {
            let s = expirer.clone();
            Box::pin(async move { s.expire_session(id).await.unwrap() })
        }),
        short_ttl: Duration::from_millis(200),
        many_children: 300,
    };
    run_conformance(&backend).await;
}

#[tokio::test]
async fn memory_session_of_another_store_is_rejected() {
    let a = MemoryStore::new();
    let b = MemoryStore::new();
    let session = a.session(Duration::from_secs(5)).await.unwrap();
    assert!(matches!(
        b.put_ephemeral(&session, "/k", val("x"), ExpectedVersion::Any)
            .await,
        Err(MetaError::ForeignSession { .. })
    ));
}

#[tokio::test]
async fn lagging_watcher_is_told_to_reread() {
    let store = MemoryStore::new();
    let mut watcher = store.watch("/lag").await.unwrap();
    let total = vela_meta::WATCH_QUEUE_EVENTS_MAX + 5;
    let mut last = Version(0);
    for i in 0..total {
        last = store
            .put("/lag/k", val(&i.to_string()), ExpectedVersion::Any)
            .await
            .unwrap();
    }
    let mut puts = 0;
    loop {
        match next_event(&mut watcher).await {
            WatchEvent::Put { .. } => puts += 1,
            WatchEvent::Lagged => break,
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(puts, vela_meta::WATCH_QUEUE_EVENTS_MAX);
    // After Lagged: re-read, and later events arrive again.
    assert_eq!(store.get("/lag/k").await.unwrap().unwrap().1, last);
    let v = store
        .put("/lag/k", val("after"), ExpectedVersion::Any)
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut watcher).await,
        WatchEvent::Put {
            key: "/lag/k".to_owned(),
            version: v
        }
    );
}

// ---------------------------------------------------------------- file (redb)

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_file() {
    let dir = tempfile::tempdir().unwrap();
    let store = FileStore::open(dir.path()).await.unwrap();
    let expirer = store.clone();
    let backend = Backend {
        name: "file",
        store: Arc::new(store),
        expire: Box::new(move |id| {
            let s = expirer.clone();
            Box::pin(async move { s.expire_session(id).await.unwrap() })
        }),
        short_ttl: Duration::from_millis(200),
        many_children: 300,
    };
    run_conformance(&backend).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn file_store_survives_reopen_and_drops_ephemerals() {
    let dir = tempfile::tempdir().unwrap();
    let url = format!("file://{}", dir.path().display());
    let (v_persistent, v_before_reopen) = {
        let store = vela_meta::open_store(&url).await.unwrap();
        let v = store
            .put("/keep", val("kept"), ExpectedVersion::Absent)
            .await
            .unwrap();
        let session = store.session(Duration::from_secs(60)).await.unwrap();
        store
            .put_ephemeral(
                &session,
                "/bookies/available/b1",
                val("gone"),
                ExpectedVersion::Absent,
            )
            .await
            .unwrap();
        let last = store
            .put("/other", val("o"), ExpectedVersion::Any)
            .await
            .unwrap();
        // A second store on the same directory is refused while this one is open.
        assert!(matches!(
            FileStore::open(dir.path()).await,
            Err(MetaError::AlreadyOpen { .. })
        ));
        drop(session); // the process "dies": its session goes with it
        (v, last)
    };
    let store = vela_meta::open_store(&url).await.unwrap();
    assert_eq!(
        store.get("/keep").await.unwrap(),
        Some((val("kept"), v_persistent))
    );
    assert_eq!(
        store.get("/bookies/available/b1").await.unwrap(),
        None,
        "ephemeral keys die with their process"
    );
    let v = store
        .put("/keep", val("new"), ExpectedVersion::Is(v_persistent))
        .await
        .unwrap();
    assert!(v > v_before_reopen, "versions keep growing across restarts");
}

/// Env var that turns `file_store_survives_kill_9` into its own child process.
const CRASH_CHILD_ENV: &str = "VELA_META_CRASH_CHILD_DIR";

#[test]
fn file_store_survives_kill_9() {
    if let Ok(dir) = std::env::var(CRASH_CHILD_ENV) {
        crash_child(Path::new(&dir));
    }
    let dir = tempfile::tempdir().unwrap();
    let mut child = KillOnDrop(
        Command::new(std::env::current_exe().unwrap())
            .args([
                "file_store_survives_kill_9",
                "--exact",
                "--nocapture",
                "--test-threads",
                "1",
            ])
            .env(CRASH_CHILD_ENV, dir.path())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .unwrap(),
    );
    let stdout = child.0.stdout.take().unwrap();
    let mut acked = Vec::new();
    for line in BufReader::new(stdout).lines() {
        let line = line.unwrap();
        if let Some(i) = line.strip_prefix("acked ") {
            acked.push(i.parse::<u64>().unwrap());
            if acked.len() == 40 {
                break;
            }
        }
    }
    assert_eq!(
        acked.len(),
        40,
        "the child stopped before acknowledging 40 writes"
    );
    child.0.kill().unwrap(); // SIGKILL: no destructor, no flush, no clean close
    child.0.wait().unwrap();

    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = FileStore::open(dir.path()).await.unwrap();
        for i in &acked {
            let (value, _) = store
                .get(&format!("/crash/{i:06}"))
                .await
                .unwrap()
                .unwrap_or_else(|| panic!("acknowledged write {i} lost"));
            assert_eq!(value, val(&format!("value {i}")));
        }
        assert_eq!(
            store.get("/crash/owner").await.unwrap(),
            None,
            "ephemeral key of the dead process"
        );
        store
            .put("/after", val("x"), ExpectedVersion::Absent)
            .await
            .unwrap();
    });
}

/// Child role: write keys forever, printing each acknowledgement, until killed.
fn crash_child(dir: &Path) -> ! {
    let runtime = tokio::runtime::Runtime::new().unwrap();
    runtime.block_on(async {
        let store = FileStore::open(dir).await.unwrap();
        let session = store.session(Duration::from_secs(60)).await.unwrap();
        store
            .put_ephemeral(&session, "/crash/owner", val("me"), ExpectedVersion::Absent)
            .await
            .unwrap();
        for i in 0u64.. {
            store
                .put(
                    &format!("/crash/{i:06}"),
                    val(&format!("value {i}")),
                    ExpectedVersion::Absent,
                )
                .await
                .unwrap();
            println!("acked {i}");
        }
    });
    unreachable!("the loop above only ends when the process is killed")
}

struct KillOnDrop(Child);

impl Drop for KillOnDrop {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

// ---------------------------------------------------------------- etcd

/// A real etcd server on loopback, killed when dropped.
struct EtcdServer {
    binary: PathBuf,
    args: Vec<String>,
    process: Option<KillOnDrop>,
    client_port: u16,
    log: PathBuf,
    _data: tempfile::TempDir,
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

fn etcd_binary() -> Option<PathBuf> {
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .chain([PathBuf::from("/usr/bin")])
        .map(|dir| dir.join("etcd"))
        .find(|path| path.is_file())
}

impl EtcdServer {
    /// Starts etcd on free loopback ports and waits until it answers.
    async fn start(binary: &Path) -> (Self, EtcdStore) {
        // tmpfs when available: etcd fsyncs its WAL on every write.
        let data = if Path::new("/dev/shm").is_dir() {
            tempfile::tempdir_in("/dev/shm").unwrap()
        } else {
            tempfile::tempdir().unwrap()
        };
        let client_port = free_port();
        let peer_port = free_port();
        let client_url = format!("http://127.0.0.1:{client_port}");
        let peer_url = format!("http://127.0.0.1:{peer_port}");
        let args = vec![
            "--name=vela-test".to_owned(),
            format!("--data-dir={}", data.path().join("data").display()),
            format!("--listen-client-urls={client_url}"),
            format!("--advertise-client-urls={client_url}"),
            format!("--listen-peer-urls={peer_url}"),
            format!("--initial-advertise-peer-urls={peer_url}"),
            format!("--initial-cluster=vela-test={peer_url}"),
            "--initial-cluster-state=new".to_owned(),
        ];
        let mut server = Self {
            binary: binary.to_path_buf(),
            args,
            process: None,
            client_port,
            log: data.path().join("etcd.log"),
            _data: data,
        };
        server.spawn();
        let store = server.wait_healthy().await;
        (server, store)
    }

    fn spawn(&mut self) {
        let log_file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .unwrap();
        let process = Command::new(&self.binary)
            .args(&self.args)
            .stdout(log_file.try_clone().unwrap())
            .stderr(log_file)
            .spawn()
            .unwrap();
        self.process = Some(KillOnDrop(process));
    }

    async fn wait_healthy(&mut self) -> EtcdStore {
        let endpoint = vec![format!("127.0.0.1:{}", self.client_port)];
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            match EtcdStore::connect(&endpoint).await {
                Ok(store) => return store,
                Err(error) => {
                    if let Some(Ok(Some(status))) = self.process.as_mut().map(|p| p.0.try_wait()) {
                        panic!("etcd exited ({status}):\n{}", self.log_tail());
                    }
                    if Instant::now() > deadline {
                        panic!(
                            "etcd not healthy after 30 s ({error}):\n{}",
                            self.log_tail()
                        );
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }
        }
    }

    /// kill -9, then start again on the same ports and data.
    async fn restart(&mut self) {
        drop(self.process.take());
        self.spawn();
        self.wait_healthy().await;
    }

    fn log_tail(&self) -> String {
        let text = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(30)..].join("\n")
    }

    fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.client_port)
    }
}

/// The etcd binary, or `None` (and a loud message) when the suite may be skipped.
fn etcd_or_skip(test: &str) -> Option<PathBuf> {
    match etcd_binary() {
        Some(binary) => Some(binary),
        None if std::env::var_os("VELA_REQUIRE_ETCD").is_some() => {
            panic!(
                "{test}: VELA_REQUIRE_ETCD is set but no etcd binary was found (apt-get install etcd-server)"
            )
        }
        None => {
            eprintln!(
                "\n!!!!!!!! {test}: SKIPPED: no etcd binary (apt-get install etcd-server; set VELA_REQUIRE_ETCD=1 to fail instead) !!!!!!!!\n"
            );
            None
        }
    }
}

/// Revokes lease `lease_id` through etcd's JSON gateway (`POST /v3/lease/revoke`
/// on the client port), as another etcd client would: the store under test
/// learns of it only from etcd.
async fn revoke_lease_behind_the_store(endpoint: &str, lease_id: u64) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let address = endpoint.trim_start_matches("http://").to_owned();
    let body = format!("{{\"ID\":\"{lease_id}\"}}");
    let request = format!(
        "POST /v3/lease/revoke HTTP/1.1\r\nHost: {address}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    );
    let mut stream = tokio::net::TcpStream::connect(&address).await.unwrap();
    stream.write_all(request.as_bytes()).await.unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).await.unwrap();
    assert!(
        response.starts_with("HTTP/1.1 200"),
        "lease revoke through etcd's gateway: {response}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn conformance_etcd() {
    let Some(binary) = etcd_or_skip("conformance_etcd") else {
        return;
    };
    let started = Instant::now();
    let (server, store) = EtcdServer::start(&binary).await;
    println!("etcd: healthy after {:?}", started.elapsed());
    let endpoint = server.endpoint();
    let backend = Backend {
        name: "etcd",
        store: Arc::new(store),
        // An expiry as etcd does it: the lease is revoked behind the holder's
        // back; its keep-alive task must notice and report `Expired`.
        expire: Box::new(move |id| {
            let endpoint = endpoint.clone();
            Box::pin(async move {
                revoke_lease_behind_the_store(&endpoint, id.0).await;
            })
        }),
        short_ttl: Duration::from_secs(1),
        many_children: 2500,
    };
    run_conformance(&backend).await;

    // open_store with an etcd:// URL reaches the same data.
    let url = format!("etcd://127.0.0.1:{}", server.client_port);
    let reopened = vela_meta::open_store(&url).await.unwrap();
    assert!(
        reopened
            .get("/conformance/get_put_cas/k")
            .await
            .unwrap()
            .is_some()
    );
    drop(server);
    println!("etcd: suite done in {:?}", started.elapsed());
}

#[tokio::test]
async fn etcd_unreachable_is_a_typed_error() {
    let port = free_port(); // nothing listens there
    let result = EtcdStore::connect(&[format!("127.0.0.1:{port}")]).await;
    assert!(
        matches!(result, Err(MetaError::Unavailable { .. })),
        "{result:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_restart_keeps_watches_and_sessions() {
    let Some(binary) = etcd_or_skip("etcd_restart_keeps_watches_and_sessions") else {
        return;
    };
    // The keep-alive task sends every TTL/3 = 2 s. Timeline from the grant:
    // 2 s first keep-alive (its stream now exists), 2.5 s kill -9 and restart
    // (~1-2 s), 4 s keep-alive finds the stream broken, 6 s reconnects and is
    // acknowledged. Without that reconnect the holder declares the session
    // expired at 2 s + TTL = 8 s; at 9 s it must still be alive.
    const SESSION_TTL: Duration = Duration::from_secs(6);
    let (mut server, store) = EtcdServer::start(&binary).await;
    let granted_at = tokio::time::Instant::now();
    let session = store.session(SESSION_TTL).await.unwrap();
    assert_eq!(session.ttl(), SESSION_TTL);
    store
        .put_ephemeral(&session, "/r/owner", val("me"), ExpectedVersion::Absent)
        .await
        .unwrap();
    let mut watcher = store.watch("/r").await.unwrap();
    let v1 = store
        .put("/r/a", val("1"), ExpectedVersion::Absent)
        .await
        .unwrap();
    assert_eq!(
        next_event(&mut watcher).await,
        WatchEvent::Put {
            key: "/r/a".to_owned(),
            version: v1
        }
    );

    tokio::time::sleep_until(granted_at + SESSION_TTL * 5 / 12).await;
    let started = Instant::now();
    server.restart().await;
    println!("etcd restarted in {:?}", started.elapsed());
    // The first calls after the restart may find the connection broken.
    let deadline = Instant::now() + EVENT_WAIT;
    let v2 = loop {
        match store.put("/r/b", val("2"), ExpectedVersion::Absent).await {
            Ok(v) => break v,
            Err(error) if error.is_transient() && Instant::now() < deadline => {
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
            Err(error) => panic!("put after restart: {error}"),
        }
    };
    // The watch was re-created from the next unseen revision: the event is
    // there, with no `Lagged` and nothing lost.
    assert_eq!(
        next_event(&mut watcher).await,
        WatchEvent::Put {
            key: "/r/b".to_owned(),
            version: v2
        }
    );
    // The lease survived the restart (shorter than the TTL), and the keep-alive
    // task reconnected (see the timeline above): alive, its key kept.
    tokio::time::sleep_until(granted_at + SESSION_TTL * 3 / 2).await;
    assert_eq!(session.state(), SessionState::Alive);
    assert!(store.get("/r/owner").await.unwrap().is_some());
    session.close().await.unwrap();
    assert_eq!(
        next_event(&mut watcher).await,
        WatchEvent::Delete {
            key: "/r/owner".to_owned()
        }
    );
    println!("etcd restart test done in {:?}", started.elapsed());
}
