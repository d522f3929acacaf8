//! Auto-recovery against the simulated cluster: a lost bookie's entries are
//! copied until every entry has Qw copies again, checked bookie by bookie; an
//! open ledger's writer keeps its last segment and closes cleanly afterwards.
#![allow(clippy::unwrap_used)]

mod common;

use std::time::Duration;

use common::*;
use vela_ledger::{
    AutoRecovery, AutoRecoveryConfig, BookieId, BookieTransport, EntryId, LedgerId, LedgerMetadata,
    ReadMode,
};
use vela_meta::{ExpectedVersion, registry};

fn config() -> AutoRecoveryConfig {
    AutoRecoveryConfig {
        lost_grace: Duration::ZERO,
        scan_interval: Duration::from_millis(100),
        full_audit_interval: Duration::from_secs(3600),
    }
}

/// The bookie is gone: crashed and no longer registered.
async fn lose(h: &Harness, bookie: &BookieId) {
    h.cluster.kill(bookie);
    let id = registry::BookieId::new(bookie.0.as_str()).unwrap();
    h.store
        .delete(&registry::bookie_key(&id), ExpectedVersion::Any)
        .await
        .unwrap();
}

/// Every entry of `0..=last` is on every bookie of its write set.
async fn assert_fully_replicated(h: &Harness, id: LedgerId, metadata: &LedgerMetadata, last: u64) {
    for entry in 0..=last {
        for bookie in metadata.write_set(EntryId(entry)) {
            let read = h
                .cluster
                .read(&bookie, id, EntryId(entry), ReadMode::Normal)
                .await;
            assert!(read.is_ok(), "entry {entry} missing on {bookie}: {read:?}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn a_lost_bookie_of_a_closed_ledger_is_replaced_after_its_entries_are_copied() {
    let h = Harness::new(21, 3).await;
    let writer = h
        .client()
        .create(quorum(2, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..100 {
        writer.add(payload(id, e)).await.unwrap();
    }
    writer.close().await.unwrap();
    let before = h.client().metadata(id).await.unwrap();
    let victim = before.last_ensemble().1[0].clone();
    lose(&h, &victim).await;

    let mut recovery = AutoRecovery::new(h.client(), config());
    let report = recovery.pass().await.unwrap();
    assert_eq!(report.segments_fixed, 1);
    assert_eq!(report.entries_copied, 100, "{report:?}");
    assert!(report.failures.is_empty(), "{report:?}");
    assert_eq!(report.lost_bookies, vec![victim.clone()]);

    let after = h.client().metadata(id).await.unwrap();
    assert!(!after.all_bookies().contains(&victim));
    assert_fully_replicated(&h, id, &after, 99).await;
    // Nothing more to do.
    assert_eq!(recovery.pass().await.unwrap().segments_fixed, 0);
    let reader = h.client().open_for_read(id).await.unwrap();
    assert_eq!(read_all(&reader).await.len(), 100);
}

#[tokio::test(start_paused = true)]
async fn an_open_ledger_keeps_its_last_segment_and_its_writer_closes_afterwards() {
    let h = Harness::new(22, 4).await;
    let writer = h
        .client()
        .create(quorum(2, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..50 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let victim = h.client().metadata(id).await.unwrap().last_ensemble().1[0].clone();
    lose(&h, &victim).await;
    // The writer notices on its next adds and moves its last segment off.
    for e in 50..80 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let during = h.client().metadata(id).await.unwrap();
    assert_eq!(during.ensembles.len(), 2);

    let mut recovery = AutoRecovery::new(h.client(), config());
    let report = recovery.pass().await.unwrap();
    assert_eq!(report.segments_fixed, 1, "{report:?}");
    assert_eq!(report.entries_copied, 50);

    // The writer's metadata is stale now: its next change and its close
    // re-read and keep the fixed first segment.
    for e in 80..90 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let closed = writer.close().await.unwrap();
    assert_eq!(closed.last_entry, Some(EntryId(89)));
    let after = h.client().metadata(id).await.unwrap();
    assert!(!after.all_bookies().contains(&victim), "{after:?}");
    assert_fully_replicated(&h, id, &after, 89).await;
}

#[tokio::test(start_paused = true)]
async fn a_bookie_back_within_the_grace_period_costs_no_copying() {
    let h = Harness::new(23, 3).await;
    let writer = h
        .client()
        .create(quorum(2, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    writer.add(payload(id, 0)).await.unwrap();
    writer.close().await.unwrap();
    let victim = h.client().metadata(id).await.unwrap().last_ensemble().1[0].clone();
    lose(&h, &victim).await;
    let mut recovery = AutoRecovery::new(
        h.client(),
        AutoRecoveryConfig {
            lost_grace: Duration::from_secs(60),
            ..config()
        },
    );
    let report = recovery.pass().await.unwrap();
    assert_eq!(report.segments_fixed, 0);
    assert!(report.lost_bookies.is_empty());
    // Back: restarted and registered again.
    h.cluster.restart(&victim);
    register(&h.store, &victim).await;
    tokio::time::advance(Duration::from_secs(120)).await;
    let report = recovery.pass().await.unwrap();
    assert_eq!(report.segments_fixed, 0);
}

/// A ledger (E = Qw = Qa = 2) with entry 0, closed.
async fn closed_ledger_of_one_entry(h: &Harness) -> LedgerId {
    let writer = h
        .client()
        .create(quorum(2, 2, 2), no_properties())
        .await
        .unwrap();
    writer.add(payload(writer.ledger_id(), 0)).await.unwrap();
    writer.close().await.unwrap();
    writer.ledger_id()
}

#[tokio::test(start_paused = true)]
async fn a_pass_reads_only_new_ledgers_and_those_listing_a_missing_bookie() {
    let h = Harness::new(24, 4).await;
    let mut ids = Vec::new();
    for _ in 0..6 {
        ids.push(closed_ledger_of_one_entry(&h).await);
    }
    let mut recovery = AutoRecovery::new(h.client(), config());
    // The first pass reads every ledger; the next ones nothing, while every
    // bookie is available and no ledger is new.
    assert_eq!(recovery.pass().await.unwrap().ledgers_checked, 6);
    assert_eq!(recovery.pass().await.unwrap().ledgers_checked, 0);

    ids.push(closed_ledger_of_one_entry(&h).await);
    assert_eq!(recovery.pass().await.unwrap().ledgers_checked, 1);

    // A lost bookie: exactly the ledgers that list it are read and fixed.
    let victim = h.client().metadata(ids[0]).await.unwrap().last_ensemble().1[0].clone();
    let mut listing = 0;
    for id in &ids {
        if h.client()
            .metadata(*id)
            .await
            .unwrap()
            .all_bookies()
            .contains(&victim)
        {
            listing += 1;
        }
    }
    lose(&h, &victim).await;
    let report = recovery.pass().await.unwrap();
    assert_eq!(report.ledgers_checked, listing, "{report:?}");
    assert_eq!(report.segments_fixed, listing, "{report:?}");
    for id in &ids {
        let after = h.client().metadata(*id).await.unwrap();
        assert!(!after.all_bookies().contains(&victim), "{after:?}");
        assert_fully_replicated(&h, *id, &after, 0).await;
    }
    // What was fixed is read once more (its last read listed the victim),
    // then nothing until the full audit reads every ledger again.
    assert_eq!(recovery.pass().await.unwrap().ledgers_checked, listing);
    assert_eq!(recovery.pass().await.unwrap().ledgers_checked, 0);
    tokio::time::advance(Duration::from_secs(3600)).await;
    assert_eq!(recovery.pass().await.unwrap().ledgers_checked, 7);
}
