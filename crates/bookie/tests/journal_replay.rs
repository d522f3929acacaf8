//! Journal behaviour a bookie relies on: replay returns exactly what was acked,
//! in order; a torn tail is cut at any byte and the journal goes on; corruption
//! in an older file refuses to start; rotation, deletion, back-pressure, locking.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use common::journal::{append_all, config, entry, mixed_records, open, records_of};
use vela_bookie::JournalMark;
use vela_bookie::journal::{JournalBackendKind, JournalError, JournalRecord, format};

fn journal_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "jnl"))
        .collect();
    files.sort();
    files
}

#[test]
fn replay_after_reopen_returns_exactly_the_appended_records_in_order() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let records = mixed_records(300);
    let (journal, seen) = open(&cfg, JournalMark::START).unwrap();
    assert!(seen.is_empty());
    let marks = append_all(&journal, &records);
    assert!(journal.last_synced_mark() >= *marks.last().unwrap());
    journal.shutdown().unwrap();
    drop(journal);

    let (journal, seen) = open(&cfg, JournalMark::START).unwrap();
    assert_eq!(records_of(&seen), records);
    let seen_marks: Vec<JournalMark> = seen.iter().map(|(_, m)| *m).collect();
    assert_eq!(
        seen_marks, marks,
        "replay reports the marks the callbacks got"
    );
    // A second generation of appends after the first replay.
    let more = mixed_records(50);
    append_all(&journal, &more);
    drop(journal);
    let (_journal, seen) = open(&cfg, JournalMark::START).unwrap();
    let mut all = records.clone();
    all.extend(more);
    assert_eq!(records_of(&seen), all);
}

#[test]
fn replay_from_a_mark_skips_what_it_covers() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let records = mixed_records(400);
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let marks = append_all(&journal, &records);
    drop(journal);
    assert!(
        marks.last().unwrap().file_id > marks[0].file_id,
        "the test spans several files"
    );
    for cut in [0usize, 1, 150, 250, 399] {
        let (_journal, seen) = open(&cfg, marks[cut]).unwrap();
        assert_eq!(
            records_of(&seen),
            records[cut + 1..].to_vec(),
            "from mark of record {cut}"
        );
    }
}

#[test]
fn rotation_spreads_records_over_files_and_delete_files_before_removes_old_ones() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let records: Vec<JournalRecord> = (0..600).map(|i| entry(1, i, 2000)).collect();
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let marks = append_all(&journal, &records);
    let files = journal_files(dir.path());
    assert!(
        files.len() >= 4,
        "1.2 MB over 256 KiB files rotates: {files:?}"
    );
    for f in &files {
        assert!(std::fs::metadata(f).unwrap().len() <= cfg.file_bytes_max + 4096);
    }
    // A checkpoint at record 300: files before its file go, the rest stay.
    let checkpoint = marks[300];
    let deleted = journal.delete_files_before(checkpoint).unwrap();
    assert_eq!(deleted as u64, checkpoint.file_id - marks[0].file_id);
    // Never deletes the file being written, whatever the mark says.
    journal
        .delete_files_before(JournalMark {
            file_id: u64::MAX,
            offset: 0,
        })
        .unwrap();
    let after = append_all(&journal, &[entry(9, 9, 10)]);
    drop(journal);
    assert!(!journal_files(dir.path()).is_empty());
    let (_journal, seen) = open(&cfg, after[0]).unwrap();
    assert!(seen.is_empty());
}

#[test]
fn replay_after_checkpoint_deletion_starts_at_the_mark() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let records: Vec<JournalRecord> = (0..400).map(|i| entry(1, i, 2000)).collect();
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let marks = append_all(&journal, &records);
    let checkpoint = marks[250];
    journal.delete_files_before(checkpoint).unwrap();
    drop(journal);
    let (_journal, seen) = open(&cfg, checkpoint).unwrap();
    assert_eq!(records_of(&seen), records[251..].to_vec());
}

#[test]
fn a_missing_mark_file_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    append_all(&journal, &mixed_records(5));
    drop(journal);
    let err = open(
        &cfg,
        JournalMark {
            file_id: 77,
            offset: 0,
        },
    )
    .unwrap_err();
    assert!(matches!(err, JournalError::Corruption { .. }), "{err}");
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    Truncate,
    ZeroFrom,
    FlipByte,
}

#[test]
fn torn_tail_cut_at_every_offset_of_the_last_record_replays_the_prefix() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let records = vec![
        entry(1, 0, 40),
        JournalRecord::Fence { ledger_id: 1 },
        entry(1, 1, 60),
    ];
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let marks = append_all(&journal, &records);
    drop(journal);
    let file = journal_files(dir.path()).pop().unwrap();
    let pristine = std::fs::read(&file).unwrap();
    let last_start = marks[1].offset;
    let last_end = marks[2].offset;
    for cut in last_start..last_end {
        for damage in [Damage::Truncate, Damage::ZeroFrom, Damage::FlipByte] {
            // Restore the directory to "just the crashed file".
            for f in journal_files(dir.path()) {
                std::fs::remove_file(f).unwrap();
            }
            let mut bytes = pristine.clone();
            match damage {
                Damage::Truncate => bytes.truncate(cut as usize),
                Damage::ZeroFrom => bytes[cut as usize..].fill(0),
                // A bit flip inside the last record: caught by its crc, the tail
                // of the newest file is cut there too.
                Damage::FlipByte => bytes[cut as usize] ^= 0x40,
            }
            std::fs::write(&file, &bytes).unwrap();

            let (journal, seen) = open(&cfg, JournalMark::START).unwrap();
            assert_eq!(
                records_of(&seen),
                records[..2].to_vec(),
                "cut {cut} {damage:?}"
            );
            if cut % 17 == 0 {
                // After the repair, appends continue and replay sees both.
                let more = vec![entry(2, 0, 30), entry(2, 1, 3)];
                append_all(&journal, &more);
                drop(journal);
                let (_j, seen) = open(&cfg, JournalMark::START).unwrap();
                let mut want = records[..2].to_vec();
                want.extend(more);
                assert_eq!(records_of(&seen), want, "cut {cut}: after appends");
            }
        }
    }
}

/// Returns the byte range of `mark`'s record given the previous record's mark.
fn flip_byte(path: &Path, at: u64) {
    let mut bytes = std::fs::read(path).unwrap();
    bytes[at as usize] ^= 0x10;
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn flipped_bit_in_the_newest_file_tail_is_truncated() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let records = mixed_records(20);
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let marks = append_all(&journal, &records);
    drop(journal);
    let file = journal_files(dir.path()).pop().unwrap();
    // Flip a byte inside the payload of the last record.
    flip_byte(&file, marks[19].offset - 2);
    let (_journal, seen) = open(&cfg, JournalMark::START).unwrap();
    assert_eq!(records_of(&seen), records[..19].to_vec());
}

#[test]
fn flipped_bit_in_an_older_file_refuses_to_start() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let records: Vec<JournalRecord> = (0..300).map(|i| entry(1, i, 1500)).collect();
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let marks = append_all(&journal, &records);
    drop(journal);
    assert!(marks[299].file_id > marks[0].file_id + 1);
    // Record 10 is in the first file, followed by valid records.
    assert_eq!(marks[10].file_id, marks[0].file_id);
    let first = dir.path().join(format!("{:016}.jnl", marks[0].file_id));
    flip_byte(&first, marks[10].offset - 100);
    let err = open(&cfg, JournalMark::START).unwrap_err();
    match &err {
        JournalError::Corruption { path, offset, .. } => {
            assert_eq!(path, &first);
            // Replay stops at the end of the last good record: right after
            // record 9, or at the next block when record 10 began a new
            // write group (groups are padded to the alignment).
            let flipped = marks[10].offset - 100;
            assert!(
                marks[9].offset <= *offset && *offset < flipped,
                "corruption reported at {offset}, record 9 ends at {}, flipped byte at {flipped}",
                marks[9].offset
            );
        }
        other => panic!("expected corruption, got {other}"),
    }
    // A replay that starts after the bad record does not need that file.
    let (_journal, seen) = open(
        &cfg,
        marks[marks
            .iter()
            .position(|m| m.file_id > marks[0].file_id)
            .unwrap()],
    )
    .unwrap();
    assert!(!seen.is_empty());
}

#[test]
fn bad_magic_is_a_typed_error_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    append_all(&journal, &mixed_records(3));
    drop(journal);
    let file = journal_files(dir.path()).pop().unwrap();
    flip_byte(&file, 1);
    let err = open(&cfg, JournalMark::START).unwrap_err();
    match err {
        JournalError::BadHeader { path, reason } => {
            assert_eq!(path, file);
            assert!(reason.contains("magic"), "{reason}");
        }
        other => panic!("expected BadHeader, got {other}"),
    }
}

#[test]
fn a_second_journal_on_the_same_dir_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let err = open(&cfg, JournalMark::START).unwrap_err();
    assert!(matches!(err, JournalError::Locked { .. }), "{err}");
    drop(journal);
    open(&cfg, JournalMark::START).unwrap();
}

#[test]
fn a_full_queue_answers_queue_full_and_every_accepted_append_completes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.queue_depth_max = 8;
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    // The first callback blocks the force-write thread until released.
    let (release_tx, release_rx) = mpsc::channel::<()>();
    let (done_tx, done_rx) = mpsc::channel();
    let tx = done_tx.clone();
    journal
        .append(entry(1, 0, 10), move |res| {
            release_rx.recv().unwrap();
            tx.send(res.is_ok()).unwrap();
        })
        .unwrap();
    let mut accepted = 1;
    let mut full = None;
    for i in 1..100_000u64 {
        let tx = done_tx.clone();
        match journal.append(entry(1, i, 10), move |res| tx.send(res.is_ok()).unwrap()) {
            Ok(()) => accepted += 1,
            Err(e) => {
                full = Some(e.error);
                break;
            }
        }
    }
    let full = full.expect("the queue must fill while the force-write thread is stuck");
    assert!(
        matches!(full, JournalError::QueueFull { depth_max: 8 }),
        "{full}"
    );
    release_tx.send(()).unwrap();
    for _ in 0..accepted {
        assert!(done_rx.recv_timeout(Duration::from_secs(20)).unwrap());
    }
    // Room again.
    append_all(&journal, &[entry(2, 0, 1)]);
}

#[test]
fn appends_after_shutdown_are_refused_and_oversized_records_too() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = config(dir.path());
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let err = journal
        .append(entry(1, 0, cfg.payload_bytes_max + 1), |_| {})
        .unwrap_err()
        .error;
    assert!(matches!(err, JournalError::RecordTooLarge { .. }));
    journal.shutdown().unwrap();
    journal.shutdown().unwrap();
    let err = journal.append(entry(1, 0, 1), |_| {}).unwrap_err().error;
    assert!(matches!(err, JournalError::ShutDown));
}

#[test]
fn group_wait_policy_without_flush_when_empty_still_completes() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.flush_when_queue_empty = false;
    cfg.group_wait_max = Duration::from_micros(300);
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let records = mixed_records(100);
    append_all(&journal, &records);
    let stats = journal.stats();
    assert!(stats.group_entries.count > 0 && stats.fdatasync_us.count > 0);
    drop(journal);
    let (_j, seen) = open(&cfg, JournalMark::START).unwrap();
    assert_eq!(records_of(&seen), records);
}

#[test]
fn direct_io_backend_round_trip() {
    // /tmp and /work are ext4 here; tmpfs would refuse O_DIRECT.
    let base = std::env::var("VELA_TEST_DIR")
        .unwrap_or_else(|_| std::env::temp_dir().display().to_string());
    let dir = tempfile::tempdir_in(base).unwrap();
    let mut cfg = config(dir.path());
    cfg.backend = JournalBackendKind::Direct;
    let (journal, _) = match open(&cfg, JournalMark::START) {
        Ok(j) => j,
        Err(JournalError::DirectIoUnsupported { path, source }) => {
            println!(
                "note: O_DIRECT refused on {} ({source}); skipping",
                path.display()
            );
            return;
        }
        Err(e) => panic!("{e}"),
    };
    let records = mixed_records(200);
    append_all(&journal, &records);
    drop(journal);
    let (_j, seen) = open(&cfg, JournalMark::START).unwrap();
    assert_eq!(records_of(&seen), records);
}

#[test]
fn sync_off_acks_and_replays() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.sync = vela_bookie::journal::JournalSync::Off;
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let records = mixed_records(50);
    append_all(&journal, &records);
    drop(journal);
    let (_j, seen) = open(&cfg, JournalMark::START).unwrap();
    assert_eq!(records_of(&seen), records);
}

#[test]
fn bad_config_is_a_typed_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.alignment_bytes = 3000;
    assert!(matches!(
        open(&cfg, JournalMark::START),
        Err(JournalError::InvalidConfig { .. })
    ));
    let mut cfg = config(dir.path());
    cfg.file_bytes_max = 8192;
    assert!(matches!(
        open(&cfg, JournalMark::START),
        Err(JournalError::InvalidConfig { .. })
    ));
}

fn free_files(dir: &Path) -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_str().unwrap().ends_with(".jnl.free"))
        .collect();
    files.sort();
    files
}

#[test]
fn reused_files_never_resurrect_their_old_records() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = config(dir.path());
    cfg.recycle_files_max = 2;
    let old: Vec<JournalRecord> = (0..500).map(|i| entry(1, i, 1500)).collect();
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let marks = append_all(&journal, &old);
    let checkpoint = *marks.last().unwrap();
    let retired = journal.delete_files_before(checkpoint).unwrap();
    assert!(retired >= 3);
    assert!(
        free_files(dir.path()).len() <= 2,
        "at most recycle_files_max kept"
    );
    drop(journal);

    // The next journal's first file is a reused one.
    let (journal, seen) = open(&cfg, checkpoint).unwrap();
    assert!(seen.is_empty());
    let new: Vec<JournalRecord> = (0..5).map(|i| entry(2, i, 700)).collect();
    let new_marks = append_all(&journal, &new);
    drop(journal);

    // Crash shape: right after the new records, where the FileEnd record went,
    // put a block of the file's old life holding a record valid under its old id.
    let new_id = new_marks[0].file_id;
    let reused = dir.path().join(format!("{new_id:016}.jnl"));
    let mut bytes = std::fs::read(&reused).unwrap();
    let end_block = (new_marks[4].offset as usize).div_ceil(4096) * 4096;
    let stale = (end_block + 4096..bytes.len() - 4096)
        .step_by(4096)
        .find(|at| {
            (1..new_id).any(|old_id| {
                matches!(
                    format::decode_record(&bytes[*at..], old_id, 1 << 20),
                    format::Decoded::Record { .. }
                )
            })
        });
    let stale = stale.expect("the reused file still holds old records");
    let block = bytes[stale..stale + 4096].to_vec();
    bytes[end_block..end_block + 4096].copy_from_slice(&block);
    std::fs::write(&reused, &bytes).unwrap();

    let (_journal, seen) = open(&cfg, checkpoint).unwrap();
    assert_eq!(records_of(&seen), new);
}
