//! The ledger client against real in-process bookies (journal + storage on
//! temp dirs, the bookie protocol over 127.0.0.1) through
//! `BookieClientTransport`.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::real::RealBookie;
use common::*;
use vela_bookie_protocol::client::ClientConfig;
use vela_ledger::{
    BookieClientTransport, EntryId, LedgerClient, LedgerConfig, LedgerError, LedgerState,
};
use vela_meta::{MemoryStore, MetadataStore};

struct Cluster {
    store: Arc<dyn MetadataStore>,
    bookies: Vec<RealBookie>,
}

impl Cluster {
    async fn start(count: usize) -> Cluster {
        let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        let mut bookies = Vec::new();
        for i in 0..count {
            let bookie = RealBookie::start(&format!("bookie-{i}")).await;
            register_at(&store, &bookie.id, &bookie.addr.to_string(), None).await;
            bookies.push(bookie);
        }
        Cluster { store, bookies }
    }

    fn client(&self) -> LedgerClient {
        let client_config = ClientConfig {
            request_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(1),
            ..ClientConfig::default()
        };
        let transport = BookieClientTransport::new(self.store.clone(), client_config);
        let config = LedgerConfig {
            add_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(2),
            recovery_retry_delay: Duration::from_millis(50),
            placement_seed: Some(7),
            ..LedgerConfig::default()
        };
        LedgerClient::new(self.store.clone(), Arc::new(transport), config)
    }

    async fn stop(self) {
        for bookie in self.bookies {
            bookie.stop().await;
        }
    }
}

#[tokio::test]
async fn pipelined_writes_close_and_read_back_on_real_bookies() {
    let cluster = Cluster::start(3).await;
    let writer = cluster
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    let mut pending = Vec::new();
    for e in 0..300 {
        pending.push(writer.submit(payload(id, e)).await.unwrap());
    }
    for (e, add) in pending.into_iter().enumerate() {
        assert_eq!(add.await.unwrap(), EntryId(e as u64));
    }
    let closed = writer.close().await.unwrap();
    assert_eq!(closed.last_entry, Some(EntryId(299)));
    let reader = cluster.client().open_for_read(id).await.unwrap();
    let all = read_all(&reader).await;
    assert_eq!(all.len(), 300);
    for (e, got) in all.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64));
    }
    let client = cluster.client();
    client.delete(id).await.unwrap();
    assert!(client.metadata(id).await.is_err());
    cluster.stop().await;
}

/// A connection that a read opens from another runtime (the broker's
/// catch-up threads) is started on the transport's own runtime: the adds
/// that later share the pooled connection keep working after that other
/// runtime is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_opened_by_a_read_on_another_runtime_outlives_it() {
    let cluster = Cluster::start(1).await;
    let writer = cluster
        .client()
        .create(quorum(1, 1, 1), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    writer.add(payload(id, 0)).await.unwrap();
    writer.close().await.unwrap();
    // A fresh client, no connection yet: its first one is made by a read
    // running on another runtime.
    let client = cluster.client();
    let reader = client.open_for_read(id).await.unwrap();
    let other = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let read = other
        .spawn(async move { reader.read(EntryId(0)).await })
        .await
        .unwrap()
        .unwrap();
    assert_eq!(read, payload(id, 0));
    other.shutdown_background();
    let next = client
        .create(quorum(1, 1, 1), no_properties())
        .await
        .unwrap();
    let next_id = next.ledger_id();
    next.add(payload(next_id, 0)).await.unwrap();
    cluster.stop().await;
}

#[tokio::test]
async fn recovery_on_real_bookies_fences_the_old_writer() {
    let cluster = Cluster::start(3).await;
    let writer = cluster
        .client()
        .create(quorum(3, 3, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..20 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let reader = cluster.client().open_with_recovery(id).await.unwrap();
    assert_eq!(reader.metadata().state, LedgerState::Closed);
    assert_eq!(reader.last_readable(), Some(EntryId(19)));
    let err = writer.add(payload(id, 20)).await.unwrap_err();
    assert!(err.is_fenced(), "{err}");
    assert_eq!(read_all(&reader).await.len(), 20);
    cluster.stop().await;
}

#[tokio::test]
async fn a_stopped_bookie_is_replaced_and_nothing_acknowledged_is_lost() {
    let mut cluster = Cluster::start(4).await;
    let writer = cluster
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..50 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let metadata = cluster.client().metadata(id).await.unwrap();
    let victim = metadata.last_ensemble().1[0].clone();
    let index = cluster.bookies.iter().position(|b| b.id == victim).unwrap();
    let stopped = cluster.bookies.remove(index);
    let _dirs = stopped.stop().await;
    let mut acked = 50;
    for e in 50..100 {
        writer.add(payload(id, e)).await.unwrap();
        acked += 1;
    }
    let metadata = cluster.client().metadata(id).await.unwrap();
    assert_eq!(metadata.ensembles.len(), 2);
    assert!(!metadata.last_ensemble().1.contains(&victim));
    drop(writer); // the writer "crashes" without closing
    let reader = cluster.client().open_with_recovery(id).await.unwrap();
    let last = reader.last_readable().unwrap();
    assert!(last.0 + 1 >= acked);
    // Entries of the first segment that the victim held have their other
    // replica (Qw=2) on a live bookie: reads fail over to it.
    let all = read_all(&reader).await;
    for (e, got) in all.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64));
    }
    cluster.stop().await;
}

#[tokio::test]
async fn recovery_with_a_stopped_bookie_on_real_bookies_at_2_2_2() {
    let mut cluster = Cluster::start(3).await;
    let writer = cluster
        .client()
        .create(quorum(2, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..30 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let metadata = cluster.client().metadata(id).await.unwrap();
    let victim = metadata.last_ensemble().1[0].clone();
    let index = cluster.bookies.iter().position(|b| b.id == victim).unwrap();
    let _dirs = cluster.bookies.remove(index).stop().await;
    drop(writer);
    let reader = cluster.client().open_with_recovery(id).await.unwrap();
    assert_eq!(reader.last_readable(), Some(EntryId(29)));
    assert!(!reader.metadata().last_ensemble().1.contains(&victim));
    let all = read_all(&reader).await;
    for (e, got) in all.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64));
    }
    cluster.stop().await;
}

/// Over TCP the bookie checks each stored record itself before it answers
/// (its peer may be any client): a copy rotten on disk is answered as an I/O
/// error, every time, and its neighbours are read as usual.
#[tokio::test]
async fn a_rotten_copy_is_refused_by_the_bookie_over_tcp() {
    let mut cluster = Cluster::start(1).await;
    let id = write_closed_ledger(&cluster.client(), quorum(1, 1, 1), 5).await;
    // A clean stop flushes the entries into the entry logs.
    let dirs = cluster.bookies.remove(0).stop().await;
    assert!(rot_entry_log(&dirs.path().join("ledgers"), &payload(id, 2)));
    let bookie = RealBookie::start_in("bookie-0", dirs).await;
    register_at(&cluster.store, &bookie.id, &bookie.addr.to_string(), None).await;
    cluster.bookies.push(bookie);
    let client = cluster.client();
    let reader = client.open_for_read(id).await.unwrap();
    read_twice_with_one_bad(&reader, id, 4, 2, |e| {
        matches!(e, LedgerError::EntryUnavailable { .. })
    })
    .await;
    // The bookie refused the bytes; the client never saw them.
    assert_eq!(client.stats().corrupt_reads, 0);
    cluster.stop().await;
}
