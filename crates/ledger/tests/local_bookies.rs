//! The ledger client over bookies in the same process (`LocalBookies`, as
//! `vela standalone` runs them): pipelined quorum writes, recovery that fences
//! the old writer, and entries that survive closing and reopening the bookies.
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::real::bookie_config;
use common::*;
use vela_bookie::bookie::Bookie;
use vela_ledger::{BookieId, EntryId, LedgerClient, LedgerConfig, LedgerState, LocalBookies};
use vela_meta::{MemoryStore, MetadataStore};

struct Local {
    store: Arc<dyn MetadataStore>,
    dirs: tempfile::TempDir,
    bookies: Vec<(BookieId, Arc<Bookie>)>,
}

impl Local {
    async fn open(count: usize, dirs: tempfile::TempDir, store: Arc<dyn MetadataStore>) -> Local {
        let mut bookies = Vec::new();
        for i in 0..count {
            let id = BookieId::new(format!("local-{i}"));
            let dir = dirs.path().join(&id.0);
            let config = bookie_config(&dir.join("journal"), &dir.join("ledgers"));
            let bookie = tokio::task::spawn_blocking(move || Bookie::open(config))
                .await
                .unwrap()
                .unwrap();
            register_at(&store, &id, &format!("local:{id}"), None).await;
            bookies.push((id, Arc::new(bookie)));
        }
        Local {
            store,
            dirs,
            bookies,
        }
    }

    fn client(&self) -> LedgerClient {
        let config = LedgerConfig {
            add_timeout: Duration::from_secs(2),
            read_timeout: Duration::from_secs(2),
            recovery_retry_delay: Duration::from_millis(50),
            placement_seed: Some(11),
            ..LedgerConfig::default()
        };
        let transport = LocalBookies::new(self.bookies.iter().cloned());
        LedgerClient::new(self.store.clone(), Arc::new(transport), config)
    }

    async fn close(self) -> (tempfile::TempDir, Arc<dyn MetadataStore>) {
        for (_, bookie) in self.bookies {
            tokio::task::spawn_blocking(move || bookie.shutdown())
                .await
                .unwrap();
        }
        (self.dirs, self.store)
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_quorum_writes_recover_fence_and_survive_reopening() {
    let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let local = Local::open(3, tempfile::tempdir().unwrap(), store).await;
    let writer = local
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    let mut pending = Vec::new();
    for e in 0..200 {
        pending.push(writer.submit(payload(id, e)).await.unwrap());
    }
    for (e, add) in pending.into_iter().enumerate() {
        assert_eq!(add.await.unwrap(), EntryId(e as u64));
    }

    // Another client takes the ledger over: fenced, closed at entry 199.
    let reader = local.client().open_with_recovery(id).await.unwrap();
    assert_eq!(reader.metadata().state, LedgerState::Closed);
    assert_eq!(reader.last_readable(), Some(EntryId(199)));
    let late = writer.add(payload(id, 200)).await.unwrap_err();
    assert!(late.is_fenced(), "{late}");
    // Clients hold the bookies (the transport): drop them before reopening.
    drop((writer, reader));

    // Close the bookies and open them again from their directories.
    let (dirs, store) = local.close().await;
    let local = Local::open(3, dirs, store).await;
    let reader = local.client().open_for_read(id).await.unwrap();
    let all = read_all(&reader).await;
    assert_eq!(all.len(), 200);
    for (e, got) in all.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64));
    }
    local.client().delete(id).await.unwrap();
    local.close().await;
}
