//! Unit tests of the journal threads through the fault-injecting backend: the
//! order of writes, syncs and callbacks, and what a failed write or fsync does.
#![allow(clippy::unwrap_used)]

use std::sync::atomic::Ordering;
use std::sync::{Arc, mpsc};
use std::time::Duration;

use bytes::Bytes;

use super::file::Backend;
use super::file::faulty::{FaultPlan, Op};
use super::{Journal, JournalConfig, JournalError, JournalRecord, format};
use crate::mark::JournalMark;

#[derive(Debug)]
struct Never;
impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}
impl std::error::Error for Never {}

fn open_faulty(dir: &std::path::Path, plan: &Arc<FaultPlan>) -> Journal {
    let mut cfg = JournalConfig::new(dir);
    cfg.payload_bytes_max = 16 << 10;
    cfg.group_bytes_max = 16 << 10;
    cfg.file_bytes_max = 1 << 20;
    cfg.prealloc_chunk_bytes = 64 << 10;
    Journal::open_with_backend(
        cfg,
        Backend::Faulty(plan.clone()),
        JournalMark::START,
        |_, _| Ok::<(), Never>(()),
    )
    .unwrap()
}

fn entry(entry_id: u64, payload_bytes: usize) -> JournalRecord {
    JournalRecord::Entry {
        ledger_id: 1,
        entry_id,
        payload: Bytes::from(vec![entry_id as u8; payload_bytes]),
    }
}

/// Appends `count` records, each callback logging itself; returns the results.
fn append_logged(
    dir: &std::path::Path,
    journal: &Journal,
    plan: &Arc<FaultPlan>,
    first_id: u64,
    count: u64,
) -> Vec<Result<JournalMark, JournalError>> {
    let (tx, rx) = mpsc::channel();
    for i in first_id..first_id + count {
        let tx = tx.clone();
        let plan = plan.clone();
        let dir = dir.to_path_buf();
        journal
            .append(entry(i, 100 + (i as usize * 37) % 900), move |res| {
                if let Ok(mark) = &res {
                    plan.push(Op::Callback {
                        path: dir.join(format::file_name(mark.file_id)),
                        offset: mark.offset,
                    });
                }
                tx.send(res).unwrap();
            })
            .unwrap();
    }
    (0..count)
        .map(|_| rx.recv_timeout(Duration::from_secs(20)).unwrap())
        .collect()
}

#[test]
fn callbacks_run_only_after_an_fdatasync_that_started_after_their_write() {
    let dir = tempfile::tempdir().unwrap();
    let plan = Arc::new(FaultPlan::default());
    let journal = open_faulty(dir.path(), &plan);
    // Several bursts so groups of several sizes happen.
    for burst in 0..20 {
        let results = append_logged(dir.path(), &journal, &plan, burst * 50, 50);
        assert!(results.iter().all(|r| r.is_ok()));
    }
    let ops = plan.ops();
    let mut callbacks = 0;
    for (i, op) in ops.iter().enumerate() {
        let Op::Callback { path, offset } = op else {
            continue;
        };
        callbacks += 1;
        // The last write before the callback covering the record's last byte.
        let write_at = ops[..i]
            .iter()
            .rposition(|o| matches!(o, Op::Write { path: p, offset: w, len } if p == path && *w < *offset && *offset <= *w + *len as u64))
            .unwrap_or_else(|| panic!("no write covers the record ending at {offset}"));
        // A sync started after that write and ended before the callback.
        let synced = ops[write_at..i].iter().any(|o| match o {
            Op::SyncStart { path: p, id } => {
                p == path && ops[write_at..i].contains(&Op::SyncEnd { id: *id })
            }
            _ => false,
        });
        assert!(
            synced,
            "callback for offset {offset} at op {i} without a covering sync: {:?}",
            &ops[..=i]
        );
    }
    assert_eq!(callbacks, 1000);
}

/// Appends after a fault: each append is refused as `Broken` or accepted and
/// then failed in its callback; none succeeds.
fn append_expecting_failure(journal: &Journal, first_id: u64, count: u64) {
    let (tx, rx) = mpsc::channel();
    let mut accepted = 0;
    for i in first_id..first_id + count {
        let tx = tx.clone();
        match journal.append(entry(i, 100), move |res| tx.send(res).unwrap()) {
            Ok(()) => accepted += 1,
            Err(e) => assert!(matches!(e, JournalError::Broken { .. }), "{e}"),
        }
    }
    // `accepted` may be 0: a sync of the journal's own (file preallocation,
    // rollover) can hit the fault before the first append and break it.
    for _ in 0..accepted {
        let res = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        assert!(res.is_err(), "{res:?}");
    }
}

#[test]
fn a_failed_fdatasync_fails_every_waiter_and_breaks_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let plan = Arc::new(FaultPlan::default());
    let journal = open_faulty(dir.path(), &plan);
    assert!(
        append_logged(dir.path(), &journal, &plan, 0, 10)
            .iter()
            .all(|r| r.is_ok())
    );
    plan.fail_syncs.store(true, Ordering::SeqCst);
    append_expecting_failure(&journal, 10, 10);
    // Never retried: still broken after syncs would work again.
    plan.fail_syncs.store(false, Ordering::SeqCst);
    let err = journal.append(entry(99, 1), |_| {}).unwrap_err();
    assert!(matches!(err, JournalError::Broken { .. }), "{err}");
    assert!(matches!(
        journal.shutdown(),
        Err(JournalError::Broken { .. })
    ));
}

#[test]
fn a_failed_write_fails_its_waiters_and_breaks_the_journal() {
    let dir = tempfile::tempdir().unwrap();
    let plan = Arc::new(FaultPlan::default());
    let journal = open_faulty(dir.path(), &plan);
    assert!(
        append_logged(dir.path(), &journal, &plan, 0, 5)
            .iter()
            .all(|r| r.is_ok())
    );
    plan.fail_writes.store(true, Ordering::SeqCst);
    append_expecting_failure(&journal, 5, 5);
    let err = journal.append(entry(99, 1), |_| {}).unwrap_err();
    assert!(matches!(err, JournalError::Broken { .. }), "{err}");
}
