//! Randomized fault schedules against the ledger protocol, one seed per run.
//!
//! Each seed picks a cluster size, a quorum and a subset of faults (bookie crash
//! and restart keeping durable data, slow disks, dropped requests, error
//! answers, slow network, writer crash mid-flight, a concurrent recovery,
//! metadata CAS writes failing as unavailable, applied or not), then
//! runs a pipelined writer against them while checking invariants:
//! - the writer's LAC never moves back; entry ids are acknowledged in order;
//! - every entry read (by readers during the run, and at the end) carries the
//!   one payload written for its id;
//! - a reader's LAC never exceeds what the writer had acknowledged;
//! - once a recovery completed, every acknowledged entry is at or below its end
//!   and nothing more is acknowledged past it;
//! - after healing and a final recovery: the ledger is closed at or past the
//!   last acknowledged entry, every entry up to the end reads back exactly, and
//!   every recovery of the ledger agrees on the end.
//!
//! Runs on a current-thread runtime with paused time: a seed replays exactly.
//! `VELA_SEED=n` runs one seed; `VELA_TEST_FULL=1` runs 1000, else 50.
#![allow(clippy::unwrap_used)]

mod common;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use common::*;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use vela_ledger::sim::SimFaults;
use vela_ledger::{EntryId, LedgerError, LedgerId, LedgerMetadata, LedgerState, LedgerWriter};

const SEEDS_DEFAULT: u64 = 50;
const SEEDS_FULL: u64 = 1000;
/// Fault-schedule steps per seed.
const STEPS: usize = 40;
/// Virtual time one seed may take (a normal seed takes a few seconds).
const SEED_VIRTUAL_TIME_MAX: Duration = Duration::from_secs(600);
/// Entries one writer submits at most.
const ENTRIES_MAX: u64 = 400;

#[test]
fn randomized_fault_schedules() {
    let seeds: Vec<u64> = match std::env::var("VELA_SEED") {
        Ok(seed) => {
            let _ = tracing_subscriber::fmt()
                .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
                .with_test_writer()
                .try_init();
            vec![seed.parse().expect("VELA_SEED must be a number")]
        }
        Err(_) => {
            let full = std::env::var("VELA_TEST_FULL").is_ok_and(|v| v == "1");
            (0..if full { SEEDS_FULL } else { SEEDS_DEFAULT }).collect()
        }
    };
    let started = std::time::Instant::now();
    let mut total = Stats::default();
    for seed in seeds {
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .unwrap();
        let outcome = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            runtime.block_on(async {
                // A run that stalls (a liveness bug) fails instead of hanging.
                tokio::time::timeout(SEED_VIRTUAL_TIME_MAX, run_seed(seed))
                    .await
                    .expect("seed did not finish within its virtual time budget")
            })
        }));
        match outcome {
            Ok(stats) => {
                total.seeds += 1;
                total.acked += stats.acked;
                total.ensemble_changes += stats.ensemble_changes;
                total.writer_failed += stats.writer_failed;
                total.concurrent_recoveries += stats.concurrent_recoveries;
                total.tail_kept_unacked += stats.tail_kept_unacked;
            }
            Err(panic) => {
                eprintln!("randomized test failed; reproduce with:");
                eprintln!("VELA_SEED={seed} cargo test -p vela-ledger --test randomized");
                std::panic::resume_unwind(panic);
            }
        }
    }
    eprintln!("randomized: {total:?} in {:?}", started.elapsed());
}

#[derive(Debug, Clone, Copy)]
struct Profile {
    crash: bool,
    slow_disk: bool,
    drop_requests: bool,
    errors: bool,
    slow_network: bool,
    writer_crash: bool,
    concurrent_recovery: bool,
    /// Ledger-metadata CAS writes fail as `Unavailable` (applied or not).
    flaky_metadata: bool,
}

#[derive(Debug, Default)]
struct History {
    /// Payload submitted for each entry id (the k-th submit is entry k).
    submitted: Vec<Bytes>,
    /// Entries acknowledged to the writer.
    acked: BTreeMap<u64, Bytes>,
    /// Highest writer LAC seen.
    lac: Option<EntryId>,
    /// End of the first completed recovery.
    recovered_end: Option<Option<EntryId>>,
    /// Every successful recovery's metadata.
    recoveries: Vec<LedgerMetadata>,
}

fn log(seed: u64, line: String) {
    if std::env::var("VELA_SEED").is_ok() {
        eprintln!(
            "seed={seed} t={}ms {line}",
            START.with(|s| s.elapsed().as_millis())
        );
    }
}

thread_local! {
    static START: tokio::time::Instant = tokio::time::Instant::now();
}

/// What one seed exercised, summed over seeds and printed.
#[derive(Debug, Default, Clone, Copy)]
struct Stats {
    seeds: u64,
    acked: u64,
    ensemble_changes: u64,
    writer_failed: u64,
    concurrent_recoveries: u64,
    tail_kept_unacked: u64,
}

async fn run_seed(seed: u64) -> Stats {
    let mut rng = StdRng::seed_from_u64(seed);
    let bookie_count = rng.random_range(3..=6);
    let ensemble = rng.random_range(1..=(bookie_count - 1).min(4));
    let write = rng.random_range(1..=ensemble);
    let ack = rng.random_range(1..=write);
    let profile = Profile {
        crash: rng.random_bool(0.5),
        slow_disk: rng.random_bool(0.4),
        drop_requests: rng.random_bool(0.4),
        errors: rng.random_bool(0.4),
        slow_network: rng.random_bool(0.4),
        writer_crash: rng.random_bool(0.3),
        concurrent_recovery: rng.random_bool(0.3),
        flaky_metadata: rng.random_bool(0.3),
    };
    let mut h = Harness::new(seed, bookie_count).await;
    let flaky = Arc::new(common::flaky::FlakyStore::new(
        h.store.clone(),
        seed ^ 0xf1a4,
    ));
    if profile.flaky_metadata {
        flaky.random_per_mille.store(200, Ordering::SeqCst);
    }
    h.client_store = flaky.clone();
    log(
        seed,
        format!("bookies={bookie_count} E={ensemble} Qw={write} Qa={ack} {profile:?}"),
    );
    let writer = h
        .client()
        .create(quorum(ensemble, write, ack), no_properties())
        .await
        .unwrap();
    let ledger_id = writer.ledger_id();
    let history = Arc::new(Mutex::new(History::default()));
    let crash_writer = Arc::new(AtomicBool::new(false));
    let adder = tokio::spawn(add_loop(
        seed,
        writer,
        StdRng::seed_from_u64(seed ^ 0x5eed),
        history.clone(),
        crash_writer.clone(),
    ));
    let mut recoveries = Vec::new();
    for step in 0..STEPS {
        tokio::time::sleep(Duration::from_millis(rng.random_range(1..30))).await;
        let bookie = h.bookies[rng.random_range(0..bookie_count)].clone();
        match rng.random_range(0..8) {
            0 if profile.crash => {
                log(seed, format!("step {step}: {bookie} CRASH"));
                h.cluster.kill(&bookie);
            }
            1 if profile.crash => {
                log(seed, format!("step {step}: {bookie} RESTART"));
                h.cluster.restart(&bookie);
            }
            2 => {
                let faults = random_faults(&mut rng, profile);
                log(seed, format!("step {step}: {bookie} faults {faults:?}"));
                h.cluster.set_faults(&bookie, faults);
            }
            3 => {
                log(seed, format!("step {step}: {bookie} healed"));
                h.cluster.set_faults(&bookie, SimFaults::default());
            }
            4 if profile.writer_crash => {
                log(seed, format!("step {step}: WRITER CRASH"));
                crash_writer.store(true, Ordering::Release);
            }
            5 if profile.concurrent_recovery && recoveries.len() < 2 => {
                log(seed, format!("step {step}: concurrent RECOVERY"));
                let client = h.client();
                let history = history.clone();
                recoveries.push(tokio::spawn(async move {
                    recover_and_check(&client, ledger_id, &history).await
                }));
            }
            _ => check_reader(&h, ledger_id, &history).await,
        }
        check_running(&history);
    }
    // Heal, stop the writer (close it or crash it), recover, check.
    flaky.random_per_mille.store(0, Ordering::SeqCst);
    for b in &h.bookies {
        h.cluster.restart(b);
        h.cluster.set_faults(b, SimFaults::default());
    }
    let close = rng.random_bool(0.5);
    crash_writer.store(!close, Ordering::Release);
    let writer = adder.await.unwrap();
    let writer_failed = writer.is_none() && close;
    let closed = match writer {
        Some(writer) if close => writer.close().await.ok(),
        _ => None,
    };
    log(seed, format!("writer closed: {}", closed.is_some()));
    let mut concurrent_recoveries = 0;
    for recovery in recoveries {
        // A recovery during faults may give up (RecoveryIncomplete): fine.
        concurrent_recoveries += u64::from(recovery.await.unwrap().is_ok());
    }
    let client = h.client();
    let mut final_end = None;
    for _ in 0..5 {
        match recover_and_check(&client, ledger_id, &history).await {
            Ok(metadata) => {
                final_end = Some(metadata);
                break;
            }
            Err(LedgerError::RecoveryIncomplete { .. }) => continue,
            Err(e) => panic!("final recovery failed: {e}"),
        }
    }
    let metadata = final_end.expect("final recovery never completed with every bookie healthy");
    assert_eq!(metadata.state, LedgerState::Closed);
    if let Some(closed) = closed {
        assert_eq!(
            closed.last_entry, metadata.last_entry,
            "closed writer and recovery disagree"
        );
    }
    // Everything else is done: take the history out of the lock.
    let history = std::mem::take(&mut *history.lock());
    for other in &history.recoveries {
        assert_eq!(
            other.last_entry, metadata.last_entry,
            "two recoveries disagree on the end"
        );
        assert_eq!(other.length_bytes, metadata.length_bytes);
    }
    let reader = client.open_for_read(ledger_id).await.unwrap();
    if let Some(last) = metadata.last_entry {
        let mut length_bytes = 0;
        for e in 0..=last.0 {
            let got = reader.read(EntryId(e)).await.unwrap();
            assert_eq!(
                got, history.submitted[e as usize],
                "entry {e} has another payload"
            );
            length_bytes += got.len() as u64;
        }
        assert_eq!(length_bytes, metadata.length_bytes);
    }
    log(
        seed,
        format!(
            "done: acked={} end={:?}",
            history.acked.len(),
            metadata.last_entry
        ),
    );
    let acked = history.acked.len() as u64;
    Stats {
        seeds: 1,
        acked,
        ensemble_changes: metadata.ensembles.len() as u64 - 1,
        writer_failed: u64::from(writer_failed),
        concurrent_recoveries,
        tail_kept_unacked: metadata.last_entry.map_or(0, |e| e.0 + 1) - acked,
    }
}

fn random_faults(rng: &mut StdRng, profile: Profile) -> SimFaults {
    let mut faults = SimFaults::default();
    if profile.slow_network && rng.random_bool(0.5) {
        faults.delay_max = Duration::from_millis(rng.random_range(1..300));
        faults.delay_min = faults.delay_max / 2;
    }
    if profile.slow_disk && rng.random_bool(0.5) {
        faults.sync_delay = Duration::from_millis(rng.random_range(1..400));
    }
    if profile.drop_requests && rng.random_bool(0.5) {
        faults.drop_request_per_mille = rng.random_range(0..300);
        faults.drop_response_per_mille = rng.random_range(0..300);
    }
    if profile.errors && rng.random_bool(0.5) {
        faults.error_per_mille = rng.random_range(0..300);
        if rng.random_bool(0.5) {
            faults.overloaded_per_mille = rng.random_range(0..300);
        }
    }
    faults
}

/// Submits windows of pipelined adds until told to crash, the writer fails, or
/// `ENTRIES_MAX`. Returns the writer if it is still usable.
async fn add_loop(
    seed: u64,
    writer: LedgerWriter,
    mut rng: StdRng,
    history: Arc<Mutex<History>>,
    crash: Arc<AtomicBool>,
) -> Option<LedgerWriter> {
    let ledger_id = writer.ledger_id();
    let mut writer = Some(writer);
    let mut next = 0u64;
    while next < ENTRIES_MAX {
        let Some(w) = writer.as_ref() else { break };
        // Pace the writer so its adds overlap the whole fault schedule.
        tokio::time::sleep(Duration::from_millis(rng.random_range(0..25))).await;
        let window = rng.random_range(1..=16);
        let mut pending = Vec::new();
        for _ in 0..window {
            let payload = entry_payload(ledger_id, next, &mut rng);
            history.lock().submitted.push(payload.clone());
            match w.submit(payload).await {
                Ok(add) => pending.push((next, add)),
                Err(e) => panic!("submit failed: {e}"),
            }
            next += 1;
        }
        if crash.load(Ordering::Acquire) {
            // Crash with adds in flight: let the writer send (and some bookies
            // answer) first.
            tokio::time::sleep(Duration::from_micros(rng.random_range(0..400))).await;
            writer = None;
        }
        let mut failed = false;
        for (expected, add) in pending {
            match add.await {
                Ok(entry) => {
                    assert_eq!(entry, EntryId(expected), "acknowledged out of order");
                    let mut h = history.lock();
                    // An ack may arrive after a recovery finished (its quorum
                    // formed before the fence), but never past the recovered end.
                    if let Some(end) = h.recovered_end {
                        assert!(
                            Some(entry) <= end,
                            "entry {expected} acknowledged past the recovered end {end:?}"
                        );
                    }
                    let payload = h.submitted[expected as usize].clone();
                    assert!(h.acked.insert(expected, payload).is_none());
                    if let Some(w) = writer.as_ref() {
                        let lac = w.last_add_confirmed();
                        assert!(lac >= h.lac, "writer LAC moved back");
                        h.lac = lac;
                    }
                }
                Err(e) => {
                    log(seed, format!("add {expected} failed: {e}"));
                    failed = true;
                }
            }
        }
        if failed {
            // A failed writer takes no more adds; leave it to recovery.
            return None;
        }
        if crash.load(Ordering::Acquire) {
            return None;
        }
    }
    writer
}

fn entry_payload(ledger_id: LedgerId, entry: u64, rng: &mut StdRng) -> Bytes {
    let len = rng.random_range(0..64);
    let fill = rng.random::<u8>();
    let mut bytes = format!("{}:{entry}:", ledger_id.0).into_bytes();
    bytes.extend(std::iter::repeat_n(fill, len));
    Bytes::from(bytes)
}

/// Invariants cheap enough to check after every step.
fn check_running(history: &Mutex<History>) {
    let h = history.lock();
    if let Some((&last, _)) = h.acked.iter().next_back() {
        assert_eq!(
            h.acked.len() as u64,
            last + 1,
            "acknowledged entries have a gap"
        );
    }
    if let Some(end) = h.recovered_end
        && let Some((&last, _)) = h.acked.iter().next_back()
    {
        assert!(
            Some(EntryId(last)) <= end,
            "acked entry {last} beyond recovered end {end:?}"
        );
    }
}

/// A plain reader during the run: its LAC is at most the writer's, and what it
/// reads is the one payload of that entry. Reads may fail under faults.
async fn check_reader(h: &Harness, ledger_id: LedgerId, history: &Mutex<History>) {
    let Ok(reader) = h.client().open_for_read(ledger_id).await else {
        return;
    };
    let Some(last) = reader.last_readable() else {
        return;
    };
    {
        let hist = history.lock();
        let acked_last = hist.acked.keys().next_back().copied();
        if !reader.is_closed() {
            assert!(
                Some(last.0) <= acked_last,
                "reader LAC {last} past writer's acks {acked_last:?}"
            );
        }
    }
    if let Ok(got) = reader.read(last).await {
        assert_eq!(
            got,
            history.lock().submitted[last.0 as usize],
            "entry {last} has another payload"
        );
    }
}

async fn recover_and_check(
    client: &vela_ledger::LedgerClient,
    ledger_id: LedgerId,
    history: &Mutex<History>,
) -> Result<LedgerMetadata, LedgerError> {
    let reader = client.open_with_recovery(ledger_id).await?;
    let metadata = reader.metadata().clone();
    assert_eq!(metadata.state, LedgerState::Closed);
    let mut h = history.lock();
    if let Some((&last, _)) = h.acked.iter().next_back() {
        assert!(
            metadata.last_entry >= Some(EntryId(last)),
            "recovery closed at {:?}, before acknowledged entry {last}",
            metadata.last_entry
        );
    }
    if h.recovered_end.is_none() {
        h.recovered_end = Some(metadata.last_entry);
    }
    h.recoveries.push(metadata.clone());
    Ok(metadata)
}
