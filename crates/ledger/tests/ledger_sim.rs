//! Ledger protocol behaviour against the simulated bookie cluster (paused time,
//! current-thread runtime: deterministic).
#![allow(clippy::unwrap_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::*;
use vela_ledger::sim::SimFaults;
use vela_ledger::{EntryId, LedgerConfig, LedgerError, LedgerState};

#[tokio::test(start_paused = true)]
async fn pipelined_adds_complete_in_order_and_read_back() {
    let h = Harness::new(1, 3).await;
    let client = h.client();
    let writer = client
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
    assert_eq!(writer.last_add_confirmed(), Some(EntryId(199)));
    let closed = writer.close().await.unwrap();
    assert_eq!(closed.state, LedgerState::Closed);
    assert_eq!(closed.last_entry, Some(EntryId(199)));
    let expected_length: u64 = (0..200).map(|e| payload(id, e).len() as u64).sum();
    assert_eq!(closed.length_bytes, expected_length);

    let reader = h.client().open_for_read(id).await.unwrap();
    assert!(reader.is_closed());
    let all = read_all(&reader).await;
    assert_eq!(all.len(), 200);
    assert_eq!(client.stats().add_us.count, 200);
    assert!(client.stats().add_us.p50 > 0.0);
    for (e, got) in all.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64));
    }
    assert!(matches!(
        reader.read(EntryId(200)).await,
        Err(LedgerError::BeyondLastConfirmed { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn entries_are_striped_over_the_write_sets() {
    let h = Harness::new(2, 3).await;
    let writer = h
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..6 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let metadata = h.client().metadata(id).await.unwrap();
    for e in 0..6u64 {
        let write_set = metadata.write_set(EntryId(e));
        for bookie in &h.bookies {
            let stored = h.cluster.stored_entry(bookie, id, EntryId(e)).is_some();
            assert_eq!(stored, write_set.contains(bookie), "entry {e} on {bookie}");
        }
    }
}

#[tokio::test(start_paused = true)]
async fn open_for_read_sees_up_to_the_piggybacked_lac() {
    let h = Harness::new(3, 3).await;
    let writer = h
        .client()
        .create(quorum(3, 3, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..10 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let mut reader = h.client().open_for_read(id).await.unwrap();
    assert!(!reader.is_closed());
    // Entry 9 carries LAC 8: the last entry's own ack is not yet known to bookies.
    assert_eq!(reader.last_readable(), Some(EntryId(8)));
    assert_eq!(reader.read(EntryId(8)).await.unwrap(), payload(id, 8));
    assert!(reader.read(EntryId(9)).await.is_err());
    writer.add(payload(id, 10)).await.unwrap();
    assert_eq!(reader.read_lac().await.unwrap(), Some(EntryId(9)));
    // The writer was never fenced by a plain reader.
    writer.add(payload(id, 11)).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn adds_continue_after_an_ensemble_change() {
    let h = Harness::new(4, 5).await;
    let writer = h
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..10 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let before = h.client().metadata(id).await.unwrap();
    let victim = before.last_ensemble().1[1].clone();
    h.cluster.kill(&victim);
    for e in 10..30 {
        assert_eq!(writer.add(payload(id, e)).await.unwrap(), EntryId(e));
    }
    let after = h.client().metadata(id).await.unwrap();
    assert_eq!(after.ensembles.len(), 2, "{:?}", after.ensembles);
    let (first, ensemble) = after.last_ensemble();
    assert_eq!(first, EntryId(10));
    assert!(!ensemble.contains(&victim));
    assert_eq!(ensemble[0], before.last_ensemble().1[0]);
    assert_eq!(ensemble[2], before.last_ensemble().1[2]);
    writer.close().await.unwrap();
    let all = read_all(&h.client().open_for_read(id).await.unwrap()).await;
    assert_eq!(all.len(), 30);
    for (e, got) in all.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64));
    }
}

#[tokio::test(start_paused = true)]
async fn slow_bookie_timeout_triggers_an_ensemble_change_with_pending_adds_resent() {
    let h = Harness::new(5, 4).await;
    let writer = h
        .client()
        .create(quorum(3, 3, 3), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    writer.add(payload(id, 0)).await.unwrap();
    let slow = h.client().metadata(id).await.unwrap().last_ensemble().1[2].clone();
    h.cluster.set_faults(
        &slow,
        SimFaults {
            delay_min: Duration::from_secs(10),
            delay_max: Duration::from_secs(10),
            ..SimFaults::default()
        },
    );
    let mut pending = Vec::new();
    for e in 1..50 {
        pending.push(writer.submit(payload(id, e)).await.unwrap());
    }
    for (i, add) in pending.into_iter().enumerate() {
        assert_eq!(add.await.unwrap(), EntryId(i as u64 + 1));
    }
    let metadata = h.client().metadata(id).await.unwrap();
    assert_eq!(metadata.ensembles.len(), 2);
    assert!(!metadata.last_ensemble().1.contains(&slow));
}

#[tokio::test(start_paused = true)]
async fn not_enough_bookies_is_a_typed_error() {
    let h = Harness::new(6, 2).await;
    let err = h
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap_err();
    assert!(matches!(
        err,
        LedgerError::NotEnoughBookies {
            needed: 3,
            available: 2,
            read_only: 0
        }
    ));
}

#[tokio::test(start_paused = true)]
async fn ensemble_change_without_spare_bookie_fails_pending_adds_with_typed_error() {
    let h = Harness::new(7, 3).await;
    let writer = h
        .client()
        .create(quorum(3, 3, 3), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    writer.add(payload(id, 0)).await.unwrap();
    h.cluster.kill(&h.bookies[0]);
    let err = writer.add(payload(id, 1)).await.unwrap_err();
    assert!(matches!(err, LedgerError::NotEnoughBookies { .. }), "{err}");
    let err = writer.add(payload(id, 2)).await.unwrap_err();
    assert!(matches!(err, LedgerError::WriterFailed { .. }), "{err}");
}

#[tokio::test(start_paused = true)]
async fn second_writer_recovery_fences_the_first() {
    let h = Harness::new(8, 3).await;
    let writer = h
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..5 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let recovered = h.client().open_with_recovery(id).await.unwrap();
    assert!(recovered.is_closed());
    assert_eq!(recovered.last_readable(), Some(EntryId(4)));
    for bookie in &h.bookies {
        assert!(h.cluster.is_fenced(bookie, id));
    }
    // The old writer can get nothing acknowledged any more.
    for e in 5..10 {
        let err = writer.add(payload(id, e)).await.unwrap_err();
        assert!(err.is_fenced(), "{err}");
    }
    assert!(writer.close().await.unwrap_err().is_fenced());
    // Nothing past entry 4 became readable.
    let again = h.client().open_with_recovery(id).await.unwrap();
    assert_eq!(again.metadata(), recovered.metadata());
    assert_eq!(read_all(&again).await.len(), 5);
}

#[tokio::test(start_paused = true)]
async fn recovery_of_concurrent_writer_never_loses_acknowledged_entries() {
    // The writer keeps adding while another client recovers: every add it got
    // acknowledged is in the recovered ledger, and nothing after the fence is.
    let h = Harness::new(9, 3).await;
    let writer = h
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    let adder = tokio::spawn(async move {
        let mut acked = Vec::new();
        for e in 0..1000 {
            match writer.add(payload(id, e)).await {
                Ok(entry) => acked.push(entry),
                Err(err) => {
                    assert!(err.is_fenced(), "{err}");
                    break;
                }
            }
        }
        acked
    });
    tokio::time::sleep(Duration::from_millis(20)).await;
    let reader = h.client().open_with_recovery(id).await.unwrap();
    let acked = adder.await.unwrap();
    assert!(!acked.is_empty() && acked.len() < 1000);
    let last = reader.last_readable().unwrap();
    assert!(last >= *acked.last().unwrap());
    let all = read_all(&reader).await;
    for (e, got) in all.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64));
    }
}

#[tokio::test(start_paused = true)]
async fn recovery_keeps_a_half_written_tail_consistently() {
    // Qw=3, Qa=2. Entries 0..9 acked. Then two bookies drop every request, so
    // entries 10.. reach only one bookie and are never acknowledged. After the
    // writer dies, recovery may keep or drop them, but every recovery and reader
    // sees the same end.
    let h = Harness::new(10, 3).await;
    let writer = h
        .client()
        .create(quorum(3, 3, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..10 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let drop_all = SimFaults {
        drop_request_per_mille: 1000,
        ..SimFaults::default()
    };
    h.cluster.set_faults(&h.bookies[0], drop_all.clone());
    h.cluster.set_faults(&h.bookies[1], drop_all);
    let mut pending = Vec::new();
    for e in 10..13 {
        pending.push(writer.submit(payload(id, e)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_millis(50)).await;
    drop(writer); // crash: the adds never complete
    for add in pending {
        assert!(add.await.is_err());
    }
    for b in &h.bookies {
        h.cluster.set_faults(b, SimFaults::default());
    }
    // Entries 10..12 are on bookie-2 only.
    assert!(
        h.cluster
            .stored_entry(&h.bookies[2], id, EntryId(12))
            .is_some()
    );
    let first = h.client().open_with_recovery(id).await.unwrap();
    let last = first.last_readable().unwrap();
    // Acknowledged entries are in; bookie-2 answered, so the tail was found.
    assert_eq!(last, EntryId(12));
    let second = h.client().open_with_recovery(id).await.unwrap();
    assert_eq!(second.metadata(), first.metadata());
    let all = read_all(&h.client().open_for_read(id).await.unwrap()).await;
    assert_eq!(all.len(), 13);
    // The tail was re-replicated to the whole write set.
    for b in &h.bookies {
        assert!(h.cluster.stored_entry(b, id, EntryId(12)).is_some());
    }
}

#[tokio::test(start_paused = true)]
async fn recovery_drops_a_tail_that_no_bookie_kept() {
    // Entries 10.. never reached any bookie: the ledger closes at entry 9 exactly.
    let h = Harness::new(11, 3).await;
    let writer = h
        .client()
        .create(quorum(3, 3, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..10 {
        writer.add(payload(id, e)).await.unwrap();
    }
    for b in &h.bookies {
        h.cluster.set_faults(
            b,
            SimFaults {
                drop_request_per_mille: 1000,
                ..SimFaults::default()
            },
        );
    }
    let _pending = writer.submit(payload(id, 10)).await.unwrap();
    drop(writer);
    for b in &h.bookies {
        h.cluster.set_faults(b, SimFaults::default());
    }
    let reader = h.client().open_with_recovery(id).await.unwrap();
    assert_eq!(reader.last_readable(), Some(EntryId(9)));
    let expected_length: u64 = (0..10).map(|e| payload(id, e).len() as u64).sum();
    assert_eq!(reader.metadata().length_bytes, expected_length);
}

#[tokio::test(start_paused = true)]
async fn recovery_waits_for_fencing_coverage_and_then_succeeds() {
    // E=3 Qw=3 Qa=2: coverage needs 2 fenced of 3. With two bookies down,
    // recovery cannot decide and says so, leaving the ledger IN_RECOVERY; once a
    // bookie returns it completes.
    let h = Harness::new(12, 3).await;
    let writer = h
        .client()
        .create(quorum(3, 3, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..4 {
        writer.add(payload(id, e)).await.unwrap();
    }
    drop(writer);
    h.cluster.kill(&h.bookies[0]);
    h.cluster.kill(&h.bookies[1]);
    let err = h.client().open_with_recovery(id).await.unwrap_err();
    assert!(
        matches!(err, LedgerError::RecoveryIncomplete { .. }),
        "{err}"
    );
    assert_eq!(
        h.client().metadata(id).await.unwrap().state,
        LedgerState::InRecovery
    );
    h.cluster.restart(&h.bookies[1]);
    let reader = h.client().open_with_recovery(id).await.unwrap();
    assert_eq!(reader.last_readable(), Some(EntryId(3)));
}

#[tokio::test(start_paused = true)]
async fn submit_waits_when_pending_adds_are_at_the_bound() {
    let h = Harness::new(13, 3).await;
    let config = LedgerConfig {
        pending_adds_max: 4,
        ..config(13)
    };
    let writer = h
        .client_with(config)
        .create(quorum(3, 3, 3), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for b in &h.bookies {
        h.cluster.set_faults(
            b,
            SimFaults {
                delay_min: Duration::from_millis(50),
                delay_max: Duration::from_millis(50),
                ..SimFaults::default()
            },
        );
    }
    let mut pending = Vec::new();
    for e in 0..4 {
        pending.push(writer.submit(payload(id, e)).await.unwrap());
    }
    // A fifth add waits for room: not within 10 ms, but once the first completes.
    let fifth =
        tokio::time::timeout(Duration::from_millis(10), writer.submit(payload(id, 4))).await;
    assert!(fifth.is_err(), "submit did not wait at the bound");
    let fifth = writer.submit(payload(id, 4)).await.unwrap();
    for add in pending {
        add.await.unwrap();
    }
    assert_eq!(fifth.await.unwrap(), EntryId(4));
}

#[tokio::test(start_paused = true)]
async fn delete_removes_bookie_data_and_metadata() {
    let h = Harness::new(14, 4).await;
    let writer = h
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..5 {
        writer.add(payload(id, e)).await.unwrap();
    }
    writer.close().await.unwrap();
    let client = h.client();
    client.delete(id).await.unwrap();
    for b in &h.bookies {
        assert!(!h.cluster.has_ledger(b, id));
    }
    assert!(matches!(
        client.metadata(id).await,
        Err(LedgerError::NoSuchLedger(_))
    ));
    client.delete(id).await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn oversized_payload_is_rejected_before_queueing() {
    let h = Harness::new(15, 1).await;
    let writer = h
        .client()
        .create(quorum(1, 1, 1), no_properties())
        .await
        .unwrap();
    let big = Bytes::from(vec![0u8; vela_ledger::ENTRY_PAYLOAD_BYTES_MAX + 1]);
    assert!(matches!(
        writer.add(big).await,
        Err(LedgerError::PayloadTooLarge { .. })
    ));
    assert_eq!(
        writer.add(Bytes::from_static(b"ok")).await.unwrap(),
        EntryId(0)
    );
}

/// One named fault applied to one bookie of the ensemble while a writer adds
/// pipelined entries, then the writer crashes and another client recovers.
#[derive(Debug, Clone, Copy)]
enum Fault {
    Killed,
    SlowDisk,
    Erroring,
    SlowNetwork,
    DroppingRequests,
}

async fn acked_adds_survive_recovery(fault: Fault, seed: u64) {
    let h = Harness::new(seed, 5).await;
    let writer = h
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    let target = h.client().metadata(id).await.unwrap().last_ensemble().1[0].clone();
    let mut acked = Vec::new();
    for round in 0..10u64 {
        if round == 3 {
            match fault {
                Fault::Killed => h.cluster.kill(&target),
                Fault::SlowDisk => h.cluster.set_faults(
                    &target,
                    SimFaults {
                        sync_delay: Duration::from_millis(300),
                        ..SimFaults::default()
                    },
                ),
                Fault::Erroring => h.cluster.set_faults(
                    &target,
                    SimFaults {
                        error_per_mille: 500,
                        ..SimFaults::default()
                    },
                ),
                Fault::SlowNetwork => h.cluster.set_faults(
                    &target,
                    SimFaults {
                        delay_min: Duration::from_millis(50),
                        delay_max: Duration::from_millis(150),
                        ..SimFaults::default()
                    },
                ),
                Fault::DroppingRequests => h.cluster.set_faults(
                    &target,
                    SimFaults {
                        drop_request_per_mille: 300,
                        drop_response_per_mille: 300,
                        ..SimFaults::default()
                    },
                ),
            }
        }
        let mut pending = Vec::new();
        for e in round * 10..round * 10 + 10 {
            pending.push((e, writer.submit(payload(id, e)).await.unwrap()));
        }
        for (e, add) in pending {
            assert_eq!(add.await.unwrap(), EntryId(e), "{fault:?}");
            acked.push(e);
        }
    }
    // Crash with a last window in flight.
    let mut in_flight = Vec::new();
    for e in 100..110 {
        in_flight.push(writer.submit(payload(id, e)).await.unwrap());
    }
    tokio::time::sleep(Duration::from_micros(150)).await;
    drop(writer);
    let reader = h.client().open_with_recovery(id).await.unwrap();
    let last = reader.last_readable().unwrap();
    assert!(
        last >= EntryId(99),
        "{fault:?}: recovered end {last} before acked 99"
    );
    let all = read_all(&reader).await;
    for (e, got) in all.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64), "{fault:?}: entry {e}");
    }
    let again = h.client().open_with_recovery(id).await.unwrap();
    assert_eq!(again.metadata(), reader.metadata());
}

#[tokio::test(start_paused = true)]
async fn acked_adds_survive_recovery_with_a_killed_bookie() {
    acked_adds_survive_recovery(Fault::Killed, 20).await;
}

#[tokio::test(start_paused = true)]
async fn acked_adds_survive_recovery_with_a_slow_disk() {
    acked_adds_survive_recovery(Fault::SlowDisk, 21).await;
}

#[tokio::test(start_paused = true)]
async fn acked_adds_survive_recovery_with_an_erroring_bookie() {
    acked_adds_survive_recovery(Fault::Erroring, 22).await;
}

#[tokio::test(start_paused = true)]
async fn acked_adds_survive_recovery_with_a_slow_network() {
    acked_adds_survive_recovery(Fault::SlowNetwork, 23).await;
}

#[tokio::test(start_paused = true)]
async fn acked_adds_survive_recovery_with_dropped_requests() {
    acked_adds_survive_recovery(Fault::DroppingRequests, 24).await;
}

#[tokio::test(start_paused = true)]
async fn racing_recoveries_converge_on_one_end() {
    let h = Harness::new(25, 3).await;
    let writer = h
        .client()
        .create(quorum(3, 3, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..30 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let mut in_flight = Vec::new();
    for e in 30..40 {
        in_flight.push(writer.submit(payload(id, e)).await.unwrap());
    }
    let (a, b, c) = (h.client(), h.client(), h.client());
    let (ra, rb, rc) = tokio::join!(
        a.open_with_recovery(id),
        b.open_with_recovery(id),
        c.open_with_recovery(id)
    );
    let (ra, rb, rc) = (ra.unwrap(), rb.unwrap(), rc.unwrap());
    assert_eq!(ra.metadata(), rb.metadata());
    assert_eq!(rb.metadata(), rc.metadata());
    assert!(ra.last_readable() >= Some(EntryId(29)));
    // Adds still pending at the fence either made it (and are in) or failed.
    for (i, add) in in_flight.into_iter().enumerate() {
        if let Ok(entry) = add.await {
            assert_eq!(entry, EntryId(30 + i as u64));
            assert!(Some(entry) <= ra.last_readable());
        }
    }
}

#[tokio::test(start_paused = true)]
async fn placement_spreads_ensembles_across_racks() {
    let h = Harness::new(26, 0).await;
    let racks = ["r1", "r1", "r1", "r2", "r2", "r3"];
    let mut bookies = Vec::new();
    for (i, rack) in racks.iter().enumerate() {
        let id = vela_ledger::BookieId::new(format!("rack-bookie-{i}"));
        h.cluster.add_bookie(&id);
        register_at(&h.store, &id, "sim://", Some(rack)).await;
        bookies.push((id, *rack));
    }
    let client = h.client();
    for _ in 0..20 {
        let writer = client
            .create(quorum(3, 2, 2), no_properties())
            .await
            .unwrap();
        let metadata = client.metadata(writer.ledger_id()).await.unwrap();
        let mut used: Vec<&str> = metadata
            .last_ensemble()
            .1
            .iter()
            .map(|b| bookies.iter().find(|(id, _)| id == b).unwrap().1)
            .collect();
        used.sort();
        assert_eq!(used, vec!["r1", "r2", "r3"]);
    }
}

#[tokio::test(start_paused = true)]
async fn range_reads_return_payloads_in_order_failing_over() {
    let h = Harness::new(27, 4).await;
    let writer = h
        .client()
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..100 {
        writer.add(payload(id, e)).await.unwrap();
    }
    writer.close().await.unwrap();
    // One bookie of the ensemble is down: every entry still has a replica.
    let down = h.client().metadata(id).await.unwrap().last_ensemble().1[1].clone();
    h.cluster.kill(&down);
    let reader = h.client().open_for_read(id).await.unwrap();
    let range = reader.read_range(EntryId(10), EntryId(89)).await.unwrap();
    assert_eq!(range.len(), 80);
    for (i, got) in range.iter().enumerate() {
        assert_eq!(got, &payload(id, 10 + i as u64));
    }
    assert!(matches!(
        reader.read_range(EntryId(5), EntryId(4)).await,
        Err(LedgerError::BadRange { .. })
    ));
    assert!(matches!(
        reader.read_range(EntryId(0), EntryId(100)).await,
        Err(LedgerError::BeyondLastConfirmed { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn replacements_that_keep_failing_end_in_a_typed_error_not_a_spin() {
    // 4 bookies, E=3: one ensemble member and the only spare are both down but
    // still registered. The writer swaps between them with backoff, then gives
    // up; the metadata keeps one segment for the failed position, not one per try.
    let h = Harness::new(28, 4).await;
    let writer = h
        .client()
        .create(quorum(3, 3, 3), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    writer.add(payload(id, 0)).await.unwrap();
    let metadata = h.client().metadata(id).await.unwrap();
    let member = metadata.last_ensemble().1[0].clone();
    let spare = h
        .bookies
        .iter()
        .find(|b| !metadata.last_ensemble().1.contains(b))
        .unwrap()
        .clone();
    h.cluster.kill(&member);
    h.cluster.kill(&spare);
    let started = tokio::time::Instant::now();
    let err = writer.add(payload(id, 1)).await.unwrap_err();
    assert!(
        matches!(err, LedgerError::TooManyEnsembleChanges(_)),
        "{err}"
    );
    assert!(
        started.elapsed() >= std::time::Duration::from_secs(5),
        "no backoff"
    );
    let metadata = h.client().metadata(id).await.unwrap();
    assert_eq!(metadata.ensembles.len(), 2);
    // Recovery still closes the ledger with the acknowledged entry.
    h.cluster.restart(&member);
    let reader = h.client().open_with_recovery(id).await.unwrap();
    assert!(reader.last_readable() >= Some(EntryId(0)));
}

#[tokio::test(start_paused = true)]
async fn recovery_replaces_a_dead_bookie_when_qa_equals_qw() {
    // Pulsar's default 2/2/2: one dead bookie of the last ensemble must not
    // block recovery forever. The found tail is re-written to a spare, recorded
    // as a new segment at close.
    let h = Harness::new(29, 3).await;
    let writer = h
        .client()
        .create(quorum(2, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..10 {
        writer.add(payload(id, e)).await.unwrap();
    }
    let metadata = h.client().metadata(id).await.unwrap();
    let dead = metadata.last_ensemble().1[1].clone();
    h.cluster.kill(&dead);
    drop(writer);
    let reader = h.client().open_with_recovery(id).await.unwrap();
    let closed = reader.metadata();
    assert_eq!(closed.state, LedgerState::Closed);
    assert_eq!(closed.last_entry, Some(EntryId(9)));
    // Entry 9 (past the piggybacked LAC 8) was re-written away from the dead
    // bookie, in a new segment.
    assert_eq!(closed.ensembles.len(), 2, "{:?}", closed.ensembles);
    assert_eq!(*closed.ensembles.keys().last().unwrap(), EntryId(9));
    assert!(!closed.last_ensemble().1.contains(&dead));
    let all = read_all(&reader).await;
    assert_eq!(all.len(), 10);
    for (e, got) in all.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64));
    }
}

#[tokio::test(start_paused = true)]
async fn unavailable_metadata_store_during_cas_is_ridden_out() {
    // Each metadata CAS (ensemble change, close, recovery) first fails as
    // Unavailable, with or without having been applied: the client re-reads
    // and decides, and ends where it would have without the failure.
    for apply_then_fail in [false, true] {
        let h = Harness::new(30, 4).await;
        let flaky = Arc::new(common::flaky::FlakyStore {
            apply_then_fail,
            ..common::flaky::FlakyStore::new(h.store.clone(), 30)
        });
        let store: Arc<dyn vela_meta::MetadataStore> = flaky.clone();
        let client =
            vela_ledger::LedgerClient::new(store.clone(), Arc::new(h.cluster.clone()), config(30));
        let writer = client
            .create(quorum(3, 2, 2), no_properties())
            .await
            .unwrap();
        let id = writer.ledger_id();
        for e in 0..5 {
            writer.add(payload(id, e)).await.unwrap();
        }
        let victim = client.metadata(id).await.unwrap().last_ensemble().1[0].clone();
        h.cluster.kill(&victim);
        flaky
            .failing_puts
            .store(1, std::sync::atomic::Ordering::SeqCst);
        for e in 5..10 {
            writer.add(payload(id, e)).await.unwrap();
        }
        assert_eq!(client.metadata(id).await.unwrap().ensembles.len(), 2);
        flaky
            .failing_puts
            .store(1, std::sync::atomic::Ordering::SeqCst);
        let closed = writer.close().await.unwrap();
        assert_eq!(
            closed.last_entry,
            Some(EntryId(9)),
            "apply_then_fail={apply_then_fail}"
        );
        // Recovery of a closed ledger is a no-op.
        let reader = client.open_with_recovery(id).await.unwrap();
        assert_eq!(reader.metadata(), &closed);
        // And a recovery whose CASes fail once each still closes the ledger.
        let writer = client
            .create(quorum(3, 2, 2), no_properties())
            .await
            .unwrap();
        let id = writer.ledger_id();
        for e in 0..3 {
            writer.add(payload(id, e)).await.unwrap();
        }
        drop(writer);
        flaky
            .failing_puts
            .store(2, std::sync::atomic::Ordering::SeqCst);
        let reader = client.open_with_recovery(id).await.unwrap();
        assert_eq!(reader.last_readable(), Some(EntryId(2)));
    }
}

#[tokio::test(start_paused = true)]
async fn an_overloaded_bookie_slows_adds_down_without_an_ensemble_change() {
    // One bookie refusing half the adds with TOO_MANY_REQUESTS: back-pressure.
    // With no spare bookie, treating it as a failure would fail the writer.
    let h = Harness::new(5, 1).await;
    h.cluster.set_faults(
        &h.bookies[0],
        SimFaults {
            overloaded_per_mille: 500,
            ..SimFaults::default()
        },
    );
    let writer = h
        .client()
        .create(quorum(1, 1, 1), no_properties())
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
    let closed = writer.close().await.unwrap();
    assert_eq!(closed.ensembles.len(), 1, "no ensemble change");
    h.cluster.set_faults(&h.bookies[0], SimFaults::default());
    let reader = h.client().open_for_read(id).await.unwrap();
    assert_eq!(read_all(&reader).await.len(), 200);
}

#[tokio::test(start_paused = true)]
async fn a_bookie_overloaded_past_the_add_timeout_is_replaced() {
    let h = Harness::new(6, 2).await;
    let writer = h
        .client()
        .create(quorum(1, 1, 1), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    let first = h.client().metadata(id).await.unwrap().last_ensemble().1[0].clone();
    h.cluster.set_faults(
        &first,
        SimFaults {
            overloaded_per_mille: 1000,
            ..SimFaults::default()
        },
    );
    assert_eq!(writer.add(payload(id, 0)).await.unwrap(), EntryId(0));
    // Nothing was acknowledged before the change, so the new ensemble
    // replaces the first one from entry 0.
    let metadata = h.client().metadata(id).await.unwrap();
    assert_ne!(metadata.last_ensemble().1[0], first);
}

#[tokio::test(start_paused = true)]
async fn a_corrupt_copy_is_read_from_another_replica_and_counted() {
    let h = Harness::new(31, 3).await;
    let client = h.client();
    let writer = client
        .create(quorum(3, 2, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..20 {
        writer.add(payload(id, e)).await.unwrap();
    }
    writer.close().await.unwrap();
    let metadata = client.metadata(id).await.unwrap();
    // The first replica of entries 3 and 7 rots; readers ask it first.
    for e in [3, 7] {
        let first = metadata.write_set(EntryId(e))[0].clone();
        assert!(h.cluster.corrupt_entry(&first, id, EntryId(e)));
    }
    let reader = client.open_for_read(id).await.unwrap();
    for e in [3u64, 7] {
        assert_eq!(reader.read(EntryId(e)).await.unwrap(), payload(id, e));
    }
    let range = reader.read_range(EntryId(0), EntryId(19)).await.unwrap();
    for (e, got) in range.iter().enumerate() {
        assert_eq!(got, &payload(id, e as u64));
    }
    // The two single reads met one corrupt copy each, the range two.
    assert_eq!(client.stats().corrupt_reads, 4);
    // With every copy bad the read fails, typed.
    let second = metadata.write_set(EntryId(3))[1].clone();
    assert!(h.cluster.corrupt_entry(&second, id, EntryId(3)));
    assert!(matches!(
        reader.read(EntryId(3)).await,
        Err(LedgerError::Corrupt { .. })
    ));
}

#[tokio::test(start_paused = true)]
async fn a_read_only_bookie_is_replaced_and_never_placed() {
    let h = Harness::new(32, 4).await;
    let client = h.client();
    let writer = client
        .create(quorum(3, 3, 2), no_properties())
        .await
        .unwrap();
    let id = writer.ledger_id();
    for e in 0..5 {
        writer.add(payload(id, e)).await.unwrap();
    }
    // One bookie's disk fills: it refuses adds and is marked in the registry.
    let full = client.metadata(id).await.unwrap().last_ensemble().1[0].clone();
    h.cluster.set_read_only(&full, true);
    let session = h.store.session(Duration::from_secs(60)).await.unwrap();
    let registry_id = vela_meta::registry::BookieId::new(full.0.as_str()).unwrap();
    vela_meta::registry::set_read_only(h.store.as_ref(), &session, &registry_id, true)
        .await
        .unwrap();
    for e in 5..20 {
        assert_eq!(writer.add(payload(id, e)).await.unwrap(), EntryId(e));
    }
    let metadata = client.metadata(id).await.unwrap();
    let (_, ensemble) = metadata.last_ensemble();
    assert!(!ensemble.contains(&full), "{ensemble:?}");
    // New ensembles skip it: with 3 of 4 writable, E=4 cannot be placed.
    let error = client
        .create(quorum(4, 2, 2), no_properties())
        .await
        .unwrap_err();
    assert!(
        matches!(
            error,
            LedgerError::NotEnoughBookies {
                needed: 4,
                available: 3,
                read_only: 1
            }
        ),
        "{error}"
    );
    // Reads of what it holds still work.
    writer.close().await.unwrap();
    let all = read_all(&client.open_for_read(id).await.unwrap()).await;
    assert_eq!(all.len(), 20);
}
