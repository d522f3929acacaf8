//! Placement reads the bookie registry through a listing that concurrent
//! ledger creations share: a creation still sees every registration change
//! made before it was called, and many creations at once all succeed.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Harness, no_properties, quorum, register};
use vela_ledger::{BookieId, LedgerError};
use vela_meta::registry;

#[tokio::test(start_paused = true)]
async fn a_creation_sees_the_registry_as_it_was_when_called() {
    let h = Harness::new(31, 2).await;
    let client = h.client();
    let err = client
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap_err();
    assert!(
        matches!(err, LedgerError::NotEnoughBookies { available: 2, .. }),
        "{err}"
    );
    // A third bookie joins: the same client's next creation places on it.
    let third = BookieId::new("bookie-2");
    h.cluster.add_bookie(&third);
    register(&h.store, &third).await;
    let writer = client
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    writer.close().await.unwrap();
    // One turns read-only: the next creation no longer counts it.
    let session = h.store.session(Duration::from_secs(60)).await.unwrap();
    let id = registry::BookieId::new("bookie-0").unwrap();
    registry::set_read_only(h.store.as_ref(), &session, &id, true)
        .await
        .unwrap();
    let err = client
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap_err();
    assert!(
        matches!(
            err,
            LedgerError::NotEnoughBookies {
                available: 2,
                read_only: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn many_creations_at_once_share_listings_and_all_succeed() {
    let h = Harness::new(32, 3).await;
    let client = h.client();
    let creations: Vec<_> = (0..200)
        .map(|_| {
            let client = client.clone();
            tokio::spawn(async move { client.create(quorum(2, 2, 2), no_properties()).await })
        })
        .collect();
    let mut ids = BTreeSet::new();
    for creation in creations {
        let writer = creation.await.unwrap().unwrap();
        assert!(
            ids.insert(writer.ledger_id()),
            "a ledger id handed out twice"
        );
        let ensemble = client.metadata(writer.ledger_id()).await.unwrap();
        let bookies: BTreeSet<_> = ensemble.last_ensemble().1.iter().cloned().collect();
        assert_eq!(bookies.len(), 2, "two distinct bookies");
        assert!(bookies.iter().all(|b| h.bookies.contains(b)));
    }
}
