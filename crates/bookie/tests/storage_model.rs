//! Ledger storage against a reference model, with crashes and journal replay.
//!
//! The test plays the bookie: every state change is applied to storage first,
//! then appended to a simulated journal (a list of ops with increasing offsets).
//! Checkpoints persist the journal offset; a crash drops storage (the write cache
//! is lost, an armed fail point may stop a flush between its entry-log fdatasync
//! and its index commit), reopens it, and replays the journal after the mark that
//! `open` returns. The contract under test: storage + replay never loses or
//! changes anything the model holds, and deleted ledgers stay deleted.
//!
//! Cases: 32 by default, 512 with VELA_TEST_FULL=1. Failures print proptest's
//! minimal op sequence.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use bytes::Bytes;
use proptest::prelude::*;
use vela_bookie::JournalMark;
use vela_bookie::storage::{FailPoint, LedgerStorage, StorageConfig, StorageError};

const LEDGERS: u64 = 4;
const ENTRIES: u64 = 24;

fn payload(l: u64, e: u64) -> Bytes {
    let len = 1 + ((l * 131 + e * 29) % 700) as usize;
    Bytes::from(
        (0..len)
            .map(|i| (i as u64 ^ (l << 4) ^ e) as u8)
            .collect::<Vec<u8>>(),
    )
}

fn config(dir: &Path) -> StorageConfig {
    let mut c = StorageConfig::new(dir);
    c.write_cache_bytes_max = 16 * 1024 * 1024;
    c.flush_threshold_bytes = 1024 * 1024;
    c.read_cache_bytes_max = 64 * 1024;
    c.read_ahead_bytes_max = 4 * 1024;
    c.entry_log_size_max_bytes = 12 * 1024 * 1024;
    c.writeback_step_bytes = 64 * 1024;
    // Compact eagerly so passes actually move entries around, a few entries
    // per slice (records get split across slices), without pacing; deleted
    // logs are cut in small steps.
    c.compaction_live_fraction = 0.9;
    c.compaction_slice_bytes = 2 * 1024;
    c.compaction_bytes_per_s = 0;
    c.log_delete_step_bytes = 4 * 1024;
    c.log_delete_bytes_per_s = 0;
    c
}

#[derive(Debug, Clone)]
enum Op {
    Put(u64, u64),
    Fence(u64),
    Lac(u64, u64),
    Delete(u64),
    Read(u64, u64),
    Flush,
    Checkpoint,
    Gc,
    /// kill -9: the write cache is lost.
    Crash,
    /// kill -9 during a flush, after the entry log's fdatasync, before the index commit.
    CrashInFlush,
    /// kill -9 during a gc pass, right after its first compaction slice is
    /// committed (the log half moved).
    CrashInGc,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        12 => (0..LEDGERS, 0..ENTRIES).prop_map(|(l, e)| Op::Put(l, e)),
        1 => (0..LEDGERS).prop_map(Op::Fence),
        1 => (0..LEDGERS, 0..100u64).prop_map(|(l, v)| Op::Lac(l, v)),
        1 => (0..LEDGERS).prop_map(Op::Delete),
        3 => (0..LEDGERS, 0..ENTRIES).prop_map(|(l, e)| Op::Read(l, e)),
        2 => Just(Op::Flush),
        2 => Just(Op::Checkpoint),
        1 => Just(Op::Gc),
        1 => Just(Op::Crash),
        1 => Just(Op::CrashInFlush),
        1 => Just(Op::CrashInGc),
    ]
}

/// A state change as the journal records it.
#[derive(Debug, Clone)]
enum Record {
    Put(u64, u64),
    Fence(u64),
    Lac(u64, u64),
    Delete(u64),
}

#[derive(Debug, Default)]
struct Model {
    entries: BTreeMap<(u64, u64), Bytes>,
    exists: BTreeSet<u64>,
    deleted: BTreeSet<u64>,
    fenced: BTreeSet<u64>,
    lac: BTreeMap<u64, u64>,
}

impl Model {
    fn apply(&mut self, r: &Record) {
        match *r {
            Record::Put(l, e) => {
                if !self.deleted.contains(&l) {
                    self.exists.insert(l);
                    self.entries.entry((l, e)).or_insert_with(|| payload(l, e));
                }
            }
            Record::Fence(l) => {
                if !self.deleted.contains(&l) {
                    self.exists.insert(l);
                    self.fenced.insert(l);
                }
            }
            Record::Lac(l, v) => {
                if !self.deleted.contains(&l) {
                    self.exists.insert(l);
                    let cur = self.lac.entry(l).or_insert(v);
                    *cur = (*cur).max(v);
                }
            }
            Record::Delete(l) => {
                self.deleted.insert(l);
            }
        }
    }
}

/// Applies a record to storage the way the bookie (and journal replay) does:
/// a refusal because the ledger is deleted is the expected, skipped outcome.
fn apply_storage(s: &LedgerStorage, r: &Record) {
    let res = match *r {
        Record::Put(l, e) => loop {
            match s.put_entry(l, e, payload(l, e)) {
                Err(StorageError::WriteCacheFull { .. }) => {
                    s.flush().unwrap();
                }
                other => break other,
            }
        },
        Record::Fence(l) => s.set_fenced(l).map(|_| ()),
        Record::Lac(l, v) => s.set_explicit_lac(l, v),
        Record::Delete(l) => s.delete_ledger(l),
    };
    match res {
        Ok(()) | Err(StorageError::LedgerDeleted { .. }) => {}
        Err(e) => panic!("{r:?}: {e}"),
    }
}

fn check_read(s: &LedgerStorage, m: &Model, l: u64, e: u64) {
    let got = s.get_entry(l, e);
    if m.deleted.contains(&l) || !m.exists.contains(&l) {
        assert!(
            matches!(got, Err(StorageError::NoSuchLedger { .. })),
            "{l}:{e} -> {got:?}"
        );
    } else if let Some(p) = m.entries.get(&(l, e)) {
        assert_eq!(&got.unwrap(), p, "{l}:{e}");
    } else {
        assert!(
            matches!(got, Err(StorageError::NoSuchEntry { .. })),
            "{l}:{e} -> {got:?}"
        );
    }
}

fn check_all(s: &LedgerStorage, m: &Model) {
    for l in 0..LEDGERS {
        let live = m.exists.contains(&l) && !m.deleted.contains(&l);
        assert_eq!(s.ledger_exists(l).unwrap(), live, "ledger {l}");
        assert_eq!(
            s.is_fenced(l).unwrap(),
            live && m.fenced.contains(&l),
            "fenced {l}"
        );
        if live {
            assert_eq!(
                s.explicit_lac(l).unwrap(),
                m.lac.get(&l).copied(),
                "lac {l}"
            );
            let last = m
                .entries
                .range((l, 0)..=(l, u64::MAX))
                .next_back()
                .map(|((_, e), _)| *e);
            assert_eq!(s.last_entry_id(l).unwrap(), last, "last entry {l}");
        }
        for e in 0..ENTRIES {
            check_read(s, m, l, e);
        }
    }
}

/// `direct_writes`: O_DIRECT entry logs (where the filesystem takes them) or
/// buffered ones with write-back steps.
fn run(ops: &[Op], direct_writes: bool) {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.direct_writes = direct_writes;
    let (mut s, mark) = LedgerStorage::open(c.clone()).unwrap();
    assert_eq!(mark, JournalMark::START);
    let mut model = Model::default();
    // The journal: (offset, record); offsets start at 1.
    let mut journal: Vec<(u64, Record)> = Vec::new();
    let mut checkpointed = JournalMark::START;
    for op in ops {
        let rec = match *op {
            Op::Put(l, e) => Some(Record::Put(l, e)),
            Op::Fence(l) => Some(Record::Fence(l)),
            Op::Lac(l, v) => Some(Record::Lac(l, v)),
            Op::Delete(l) => Some(Record::Delete(l)),
            _ => None,
        };
        if let Some(r) = rec {
            apply_storage(&s, &r);
            model.apply(&r);
            journal.push((journal.len() as u64 + 1, r));
            continue;
        }
        match *op {
            Op::Read(l, e) => check_read(&s, &model, l, e),
            Op::Flush => {
                s.flush().unwrap();
            }
            Op::Checkpoint => {
                let mark = JournalMark {
                    file_id: 1,
                    offset: journal.len() as u64,
                };
                s.checkpoint(mark).unwrap();
                checkpointed = checkpointed.max(mark);
            }
            Op::Gc => {
                s.gc().unwrap();
            }
            Op::Crash | Op::CrashInFlush | Op::CrashInGc => {
                if matches!(op, Op::CrashInGc) {
                    s.set_fail_point(Some(FailPoint::GcAfterCompactionSlice));
                    // A pass with nothing to compact ends normally.
                    if s.gc().is_err() {
                        assert!(matches!(
                            s.put_entry(0, 0, payload(0, 0)),
                            Err(StorageError::Broken(_))
                        ));
                    }
                }
                if matches!(op, Op::CrashInFlush) {
                    s.set_fail_point(Some(FailPoint::FlushBeforeIndexCommit));
                    let mark = JournalMark {
                        file_id: 1,
                        offset: journal.len() as u64,
                    };
                    match s.checkpoint(mark) {
                        // Nothing to flush means nothing to fail.
                        Ok(_) => checkpointed = checkpointed.max(mark),
                        Err(_) => assert!(matches!(
                            s.put_entry(0, 0, payload(0, 0)),
                            Err(StorageError::Broken(_))
                        )),
                    }
                }
                drop(s);
                let (s2, mark) = LedgerStorage::open(c.clone()).unwrap();
                assert_eq!(mark, checkpointed, "open returns the last checkpoint");
                for (off, r) in &journal {
                    if *off > mark.offset {
                        apply_storage(&s2, r);
                    }
                }
                s = s2;
            }
            _ => unreachable!(),
        }
    }
    check_all(&s, &model);
    // And once more after a clean restart with replay of the unflushed tail.
    let mark = s.checkpoint_mark();
    drop(s);
    let (s, m2) = LedgerStorage::open(c).unwrap();
    assert_eq!(m2, mark);
    for (off, r) in &journal {
        if *off > mark.offset {
            apply_storage(&s, r);
        }
    }
    check_all(&s, &model);
    s.gc().unwrap();
    check_all(&s, &model);
}

fn cases() -> u32 {
    if std::env::var("VELA_TEST_FULL").is_ok_and(|v| v == "1") {
        512
    } else {
        32
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: cases(), ..ProptestConfig::default() })]

    #[test]
    fn storage_with_journal_replay_matches_the_model(
        ops in proptest::collection::vec(op(), 1..60),
        direct_writes in any::<bool>(),
    ) {
        run(&ops, direct_writes);
    }
}

/// Readers, a writer that flushes, and gc with compaction all at once: every
/// read of a published entry returns its payload, whichever log it sits in.
#[test]
fn concurrent_reads_during_flush_gc_and_compaction() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    // Deleted logs (12 MiB) are cut in a dozen steps while readers run.
    c.log_delete_step_bytes = 1024 * 1024;
    let (s, _) = LedgerStorage::open(c).unwrap();
    let s = Arc::new(s);
    let big = |l: u64, e: u64| {
        let mut v = vec![(l * 7 + e) as u8; 16 * 1024];
        v[..8].copy_from_slice(&e.to_le_bytes());
        v[8..16].copy_from_slice(&l.to_le_bytes());
        Bytes::from(v)
    };
    const WRITE_LEDGERS: u64 = 3;
    // Round r writes garbage ledger GARBAGE_BASE + r and deletes the previous one.
    const GARBAGE_BASE: u64 = 100;
    let published: Arc<Vec<AtomicU64>> =
        Arc::new((0..WRITE_LEDGERS).map(|_| AtomicU64::new(0)).collect());
    let done = Arc::new(AtomicBool::new(false));

    let writer = {
        let (s, published, done) = (Arc::clone(&s), Arc::clone(&published), Arc::clone(&done));
        std::thread::spawn(move || {
            for round in 0..8u64 {
                // Garbage interleaved with live entries, deleted later: the logs
                // end up mostly dead and get compacted while readers run.
                let garbage = GARBAGE_BASE + round;
                for e in 0..200 {
                    s.put_entry(garbage, e, big(garbage, e)).unwrap();
                    if e % 4 == 0 {
                        for l in 0..WRITE_LEDGERS {
                            let n = published[l as usize].load(Ordering::Acquire);
                            s.put_entry(l, n, big(l, n)).unwrap();
                            published[l as usize].store(n + 1, Ordering::Release);
                        }
                    }
                }
                s.flush().unwrap();
                if round > 0 {
                    s.delete_ledger(garbage - 1).unwrap();
                    s.flush().unwrap();
                }
            }
            done.store(true, Ordering::Release);
        })
    };
    let gc = {
        let (s, done) = (Arc::clone(&s), Arc::clone(&done));
        std::thread::spawn(move || {
            let mut compacted = 0;
            while !done.load(Ordering::Acquire) {
                compacted += s.gc().unwrap().logs_compacted;
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
            compacted + s.gc().unwrap().logs_compacted
        })
    };
    let readers: Vec<_> = (0..2u64)
        .map(|seed| {
            let (s, published, done) = (Arc::clone(&s), Arc::clone(&published), Arc::clone(&done));
            std::thread::spawn(move || {
                let mut x = seed * 0x9e37_79b9 + 1;
                let mut reads = 0u64;
                while !done.load(Ordering::Acquire) || reads < 1000 {
                    x ^= x << 13;
                    x ^= x >> 7;
                    x ^= x << 17;
                    let l = x % WRITE_LEDGERS;
                    let n = published[l as usize].load(Ordering::Acquire);
                    if n == 0 {
                        continue;
                    }
                    let e = (x >> 8) % n;
                    assert_eq!(s.get_entry(l, e).unwrap(), big(l, e), "{l}:{e}");
                    reads += 1;
                }
                reads
            })
        })
        .collect();
    writer.join().unwrap();
    let compacted = gc.join().unwrap();
    for r in readers {
        assert!(r.join().unwrap() >= 1000);
    }
    assert!(
        compacted >= 1,
        "the run was meant to compact at least one log"
    );
    for l in 0..WRITE_LEDGERS {
        for e in 0..published[l as usize].load(Ordering::Acquire) {
            assert_eq!(s.get_entry(l, e).unwrap(), big(l, e));
        }
    }
}
