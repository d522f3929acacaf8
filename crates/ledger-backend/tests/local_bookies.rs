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
use vela_bookie_protocol::Status;
use vela_ledger::{BookieId, EntryId, LedgerClient, LedgerConfig, LedgerError, LedgerState};
use vela_ledger_backend::LocalBookies;
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_failing_the_bookies_own_check_is_read_from_the_other_replica() {
    let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let local = Local::open(2, tempfile::tempdir().unwrap(), store).await;
    let client = local.client();
    let writer = client
        .create(quorum(2, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..5 {
        writer.add(payload(id, e)).await.unwrap();
    }
    writer.close().await.unwrap();
    let first = client.metadata(id).await.unwrap().write_set(EntryId(2))[0].clone();
    // A clean stop flushes the entries into the entry logs; one byte of the
    // first replica's copy of entry 2 then rots on disk.
    let (dirs, store) = local.close().await;
    assert!(rot_entry_log(
        &dirs.path().join(&first.0).join("ledgers"),
        &payload(id, 2)
    ));
    let local = Local::open(2, dirs, store).await;
    let client = local.client();
    let reader = client.open_for_read(id).await.unwrap();
    for e in 0..5 {
        assert_eq!(reader.read(EntryId(e)).await.unwrap(), payload(id, e));
    }
    // In process, the ledger client's end-to-end check caught the rotten copy
    // (storage skipped its own record CRC for this reader: one check, not two).
    assert_eq!(client.stats().corrupt_reads, 1);
    let rotten = &local.bookies.iter().find(|(b, _)| *b == first).unwrap().1;
    assert_eq!(rotten.stats().corrupt_reads, 0);
    local.close().await;
}

/// One copy only, rotten on disk: the in-process read reports it (never hands
/// out the bad bytes), every time it is asked; and a reader that relies on
/// the bookie's own check (what the TCP server answers) still gets it checked
/// although the unchecked copy now sits in the bookie's read cache.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotten_only_copy_is_reported_in_process_and_by_the_bookies_check() {
    let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let local = Local::open(1, tempfile::tempdir().unwrap(), store).await;
    let id = write_closed_ledger(&local.client(), quorum(1, 1, 1), 5).await;
    let (dirs, store) = local.close().await;
    assert!(rot_entry_log(
        &dirs.path().join("local-0").join("ledgers"),
        &payload(id, 2)
    ));
    let local = Local::open(1, dirs, store).await;
    let client = local.client();
    let reader = client.open_for_read(id).await.unwrap();
    read_twice_with_one_bad(&reader, id, 4, 2, |e| {
        matches!(e, LedgerError::Corrupt { .. })
    })
    .await;
    assert_eq!(client.stats().corrupt_reads, 2);
    let bookie = Arc::clone(&local.bookies[0].1);
    let checked = tokio::task::spawn_blocking(move || {
        let answer = bookie.read_entry(id.0, 2);
        (answer, bookie.stats().corrupt_reads)
    })
    .await
    .unwrap();
    assert!(matches!(checked, (Err(Status::IoError), 1)), "{checked:?}");
    local.close().await;
}
