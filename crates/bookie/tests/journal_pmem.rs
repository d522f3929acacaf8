//! The journal on the persistent-memory backend: the file journal's replay
//! guarantees (exactly the acked records, in order; a torn or corrupt tail of
//! the newest file cut at any byte; corruption in an older file refuses to
//! start) over a ring of slots that is reused lap after lap, and the ring's
//! own rules (back-pressure when full, restart with a full ring, no stale
//! record from an earlier lap ever replayed, MAP_SYNC refused without
//! emulation).
//!
//! The region lives on tmpfs (`/dev/shm`, else the temp dir) and runs in
//! emulation (msync per group): no DAX here. What the tests check is the
//! format, the ring and replay, which are the same on DAX; the durability of
//! a cache-line flush is not something a test on DRAM can observe.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::Duration;

use common::journal::{
    Acks, append_all, append_each, entry, mixed_records, on_pmem, open, pmem_base_dir, records_of,
};
use vela_bookie::JournalMark;
use vela_bookie::journal::{
    Journal, JournalConfig, JournalError, JournalRecord, PmemEmulation, pmem,
};

/// Four slots of 256 KiB (the file journal tests' file size) after the 4 KiB
/// header area.
const REGION_BYTES: u64 = 4096 + 4 * (256 << 10);

/// A journal dir and a region dir, removed at the end of the test.
struct Dirs {
    journal: tempfile::TempDir,
    pmem: tempfile::TempDir,
}

fn dirs() -> Dirs {
    Dirs {
        journal: tempfile::tempdir().unwrap(),
        pmem: tempfile::Builder::new()
            .prefix("vela-pmem-test-")
            .tempdir_in(pmem_base_dir())
            .unwrap(),
    }
}

/// The file journal tests' payload and group sizes; `file_bytes_max` and
/// `prealloc_chunk_bytes` stay at their defaults (slots are the files here).
fn config(dirs: &Dirs) -> JournalConfig {
    let mut c = JournalConfig::new(dirs.journal.path());
    c.payload_bytes_max = 16 << 10;
    c.group_bytes_max = 16 << 10;
    on_pmem(c, dirs.pmem.path(), REGION_BYTES)
}

/// Opens a journal and appends ~1.5 MiB, far more than the four 256 KiB slots
/// hold, without waiting: returns the journal, the records and their acks.
fn open_and_overfill(cfg: &JournalConfig) -> (Journal, Vec<JournalRecord>, Acks) {
    let (journal, _) = open(cfg, JournalMark::START).unwrap();
    let records: Vec<JournalRecord> = (0..1000).map(|i| entry(1, i, 1500)).collect();
    let acks = append_each(&journal, &records);
    (journal, records, acks)
}

/// Journal file `file_id` as bytes of the region file: (path, offset, len).
fn located(cfg: &JournalConfig, file_id: u64) -> (PathBuf, u64, u64) {
    let dir = &cfg.pmem.as_ref().unwrap().dir;
    pmem::locate_file(dir, file_id)
        .unwrap()
        .unwrap_or_else(|| panic!("file {file_id} is not in a live slot"))
}

fn read_slot(cfg: &JournalConfig, file_id: u64) -> Vec<u8> {
    let (path, offset, len) = located(cfg, file_id);
    let file = std::fs::File::open(path).unwrap();
    let mut bytes = vec![0u8; len as usize];
    file.read_exact_at(&mut bytes, offset).unwrap();
    bytes
}

fn write_slot(cfg: &JournalConfig, file_id: u64, bytes: &[u8]) {
    let (path, offset, len) = located(cfg, file_id);
    assert_eq!(bytes.len() as u64, len);
    let file = std::fs::OpenOptions::new().write(true).open(path).unwrap();
    file.write_all_at(bytes, offset).unwrap();
}

#[test]
fn replay_after_reopen_returns_exactly_the_appended_records_in_order() {
    let dirs = dirs();
    let cfg = config(&dirs);
    let records = mixed_records(300);
    let (journal, seen) = open(&cfg, JournalMark::START).unwrap();
    assert!(seen.is_empty());
    let marks = append_all(&journal, &records);
    assert!(journal.last_synced_mark() >= *marks.last().unwrap());
    assert!(
        journal.stats().fdatasync_us.count > 0,
        "the flush stage is recorded"
    );
    journal.shutdown().unwrap();
    drop(journal);

    let (journal, seen) = open(&cfg, JournalMark::START).unwrap();
    assert_eq!(records_of(&seen), records);
    let seen_marks: Vec<JournalMark> = seen.iter().map(|(_, m)| *m).collect();
    assert_eq!(
        seen_marks, marks,
        "replay reports the marks the callbacks got"
    );
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
    let dirs = dirs();
    let cfg = config(&dirs);
    // ~560 KiB: three of the four slots (the ring holds no more without a
    // checkpoint).
    let records: Vec<JournalRecord> = (0..400).map(|i| entry(1, i, 1400)).collect();
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let marks = append_all(&journal, &records);
    drop(journal);
    assert!(
        marks.last().unwrap().file_id > marks[0].file_id,
        "the test spans several slots"
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

/// Appends in rounds, each reopened from a checkpoint halfway through it, so
/// the four slots are reused lap after lap; replay from the checkpoint holds
/// exactly the records appended after it, however many records of earlier
/// laps the slots still hold.
#[test]
fn the_ring_wraps_lap_after_lap_and_never_replays_a_stale_record() {
    let dirs = dirs();
    let cfg = config(&dirs);
    let mut checkpoint = JournalMark::START;
    let mut next_entry_id = 0u64;
    for round in 0..12u64 {
        let (journal, seen) = open(&cfg, checkpoint).unwrap();
        assert!(
            seen.is_empty(),
            "round {round}: everything before was checkpointed"
        );
        // ~220 KiB: most of a slot.
        let burst: Vec<JournalRecord> = (0..110)
            .map(|k| entry(round, next_entry_id + k, 1000 + (k as usize * 53) % 2000))
            .collect();
        next_entry_id += burst.len() as u64;
        let marks = append_all(&journal, &burst);
        let halfway = marks[54];
        journal.delete_files_before(halfway).unwrap();
        drop(journal);
        let (journal, seen) = open(&cfg, halfway).unwrap();
        assert_eq!(records_of(&seen), burst[55..].to_vec(), "round {round}");
        checkpoint = journal.last_synced_mark();
        journal.delete_files_before(checkpoint).unwrap();
    }
    assert!(
        checkpoint.file_id > 3 * 4,
        "file ids went round the 4-slot ring several times ({})",
        checkpoint.file_id
    );
}

/// The region file.
fn region_path(cfg: &JournalConfig) -> PathBuf {
    cfg.pmem
        .as_ref()
        .unwrap()
        .dir
        .join(pmem::PMEM_REGION_FILE_NAME)
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    /// Zeros from the cut on (a crash before these bytes were flushed).
    ZeroFrom,
    /// One flipped byte.
    FlipByte,
    /// From the cut on, the bytes the slot held on its previous lap.
    StaleFrom,
}

#[test]
fn torn_tail_cut_at_every_offset_of_the_last_record_replays_the_prefix() {
    let dirs = dirs();
    let cfg = config(&dirs);
    // Earlier laps fill every slot with records valid under older ids, so the
    // stale damage below puts real records of an earlier lap after the cut.
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    for round in 0..6u64 {
        let old: Vec<JournalRecord> = (0..100).map(|i| entry(9, round * 100 + i, 1500)).collect();
        append_all(&journal, &old);
        journal
            .delete_files_before(journal.last_synced_mark())
            .unwrap();
    }
    let checkpoint = journal.last_synced_mark();
    journal.delete_files_before(checkpoint).unwrap();
    drop(journal);
    let before = std::fs::read(region_path(&cfg)).unwrap();

    let records = vec![
        entry(1, 0, 40),
        JournalRecord::Fence { ledger_id: 1 },
        entry(1, 1, 60),
    ];
    let (journal, _) = open(&cfg, checkpoint).unwrap();
    let marks = append_all(&journal, &records);
    drop(journal);
    let after = std::fs::read(region_path(&cfg)).unwrap();
    let file_id = marks[2].file_id;
    let (_, slot_offset, slot_len) = located(&cfg, file_id);
    let pristine = read_slot(&cfg, file_id);
    let previous_lap = before[slot_offset as usize..(slot_offset + slot_len) as usize].to_vec();
    let last_start = marks[1].offset;
    let last_end = marks[2].offset;
    assert!(
        previous_lap[last_start as usize..last_start as usize + 4096]
            .iter()
            .any(|b| *b != 0),
        "the slot held records on an earlier lap"
    );
    for cut in last_start..last_end {
        for damage in [Damage::ZeroFrom, Damage::FlipByte, Damage::StaleFrom] {
            // Each case starts from the region as the crash left it.
            std::fs::write(region_path(&cfg), &after).unwrap();
            let mut bytes = pristine.clone();
            let at = cut as usize;
            match damage {
                Damage::ZeroFrom => bytes[at..].fill(0),
                Damage::FlipByte => bytes[at] ^= 0x40,
                Damage::StaleFrom => bytes[at..].copy_from_slice(&previous_lap[at..]),
            }
            write_slot(&cfg, file_id, &bytes);
            let (journal, seen) = open(&cfg, checkpoint).unwrap();
            assert_eq!(
                records_of(&seen),
                records[..2].to_vec(),
                "cut {cut} {damage:?}"
            );
            if cut % 17 == 0 {
                // After the repair, appends go on and replay sees both.
                let more = vec![entry(2, 0, 30), entry(2, 1, 3)];
                append_all(&journal, &more);
                drop(journal);
                let (_j, seen) = open(&cfg, checkpoint).unwrap();
                let mut want = records[..2].to_vec();
                want.extend(more);
                assert_eq!(
                    records_of(&seen),
                    want,
                    "cut {cut} {damage:?}: after appends"
                );
            }
        }
    }
}

#[test]
fn flipped_bit_in_an_older_slot_refuses_to_start() {
    let dirs = dirs();
    let cfg = config(&dirs);
    let records: Vec<JournalRecord> = (0..300).map(|i| entry(1, i, 2000)).collect();
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let marks = append_all(&journal, &records);
    drop(journal);
    assert!(marks[299].file_id > marks[0].file_id + 1);
    assert_eq!(marks[10].file_id, marks[0].file_id);
    let first = marks[0].file_id;
    let mut bytes = read_slot(&cfg, first);
    bytes[marks[10].offset as usize - 100] ^= 0x10;
    write_slot(&cfg, first, &bytes);
    let err = open(&cfg, JournalMark::START).unwrap_err();
    match &err {
        JournalError::Corruption { path, offset, .. } => {
            assert!(
                path.ends_with(format!("{first:016}.jnl")),
                "{}",
                path.display()
            );
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
    // A replay that starts after the bad record does not need that slot.
    let later = marks.iter().position(|m| m.file_id > first).unwrap();
    let (_journal, seen) = open(&cfg, marks[later]).unwrap();
    assert!(!seen.is_empty());
}

#[test]
fn a_full_ring_holds_appends_until_a_checkpoint_frees_a_slot() {
    let dirs = dirs();
    let cfg = config(&dirs);
    let (journal, records, rx) = open_and_overfill(&cfg);
    // Acks come until the ring is full, then stop.
    let mut acked = 0;
    while let Ok((i, res)) = rx.recv_timeout(Duration::from_millis(500)) {
        assert_eq!(i, acked);
        res.unwrap();
        acked += 1;
    }
    assert!(
        acked > 0 && acked < records.len(),
        "acked {acked} before the ring filled"
    );
    assert!(
        journal.wants_checkpoint(),
        "a full ring asks for a checkpoint"
    );
    assert!(journal.stats().ring_full_waits > 0);
    // Checkpoints free slots; everything completes, in order.
    while acked < records.len() {
        journal
            .delete_files_before(journal.last_synced_mark())
            .unwrap();
        while let Ok((i, res)) = rx.recv_timeout(Duration::from_millis(200)) {
            assert_eq!(i, acked);
            res.unwrap();
            acked += 1;
        }
    }
    journal
        .delete_files_before(journal.last_synced_mark())
        .unwrap();
    assert!(!journal.wants_checkpoint());
}

/// A bookie that crashed with its ring full still opens (one slot is always
/// left for the first file after a restart), and so does one that crashed
/// again before its first checkpoint (the empty newest file's slot is reused).
#[test]
fn a_restart_with_a_full_ring_opens_and_replays_every_acked_record() {
    let dirs = dirs();
    let cfg = config(&dirs);
    let (journal, records, rx) = open_and_overfill(&cfg);
    let mut acked = Vec::new();
    while let Ok((i, res)) = rx.recv_timeout(Duration::from_millis(500)) {
        if res.is_ok() {
            acked.push(i);
        }
    }
    // Shut down with the ring full and no checkpoint coming: what could not
    // be written fails (never acked), nothing hangs.
    let _ = journal.shutdown();
    drop(journal);
    while let Ok((i, res)) = rx.recv_timeout(Duration::from_millis(100)) {
        if res.is_ok() {
            acked.push(i);
        }
    }
    assert!(!acked.is_empty());
    for reopen in 0..3 {
        // No checkpoint between the opens: a crash loop before the first one.
        let (journal, seen) = open(&cfg, JournalMark::START).unwrap();
        let replayed = records_of(&seen);
        assert!(
            replayed.len() >= acked.len(),
            "reopen {reopen}: every acked record replays"
        );
        assert_eq!(
            replayed,
            records[..replayed.len()].to_vec(),
            "reopen {reopen}: in order"
        );
        drop(journal);
    }
}

#[test]
fn without_map_sync_the_backend_refuses_unless_emulation_is_allowed() {
    let dirs = dirs();
    let mut cfg = config(&dirs);
    cfg.pmem.as_mut().unwrap().emulation = PmemEmulation::Refuse;
    match open(&cfg, JournalMark::START) {
        Err(JournalError::PmemNotDax { path, source }) => {
            assert!(path.ends_with(pmem::PMEM_REGION_FILE_NAME));
            let message = JournalError::PmemNotDax { path, source }.to_string();
            assert!(message.contains("MAP_SYNC refused"), "{message}");
            assert!(message.contains("emulation"), "{message}");
        }
        Ok(_) => println!(
            "note: {} is on a DAX filesystem; nothing to refuse",
            pmem_base_dir().display()
        ),
        Err(other) => panic!("expected PmemNotDax, got {other}"),
    }
}

#[test]
fn region_size_and_lock_are_checked() {
    let dirs = dirs();
    let cfg = config(&dirs);
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    // Another journal dir over the same region: the region's lock refuses it.
    let other_dir = tempfile::tempdir().unwrap();
    let mut other = cfg.clone();
    other.dir = other_dir.path().to_path_buf();
    let err = open(&other, JournalMark::START).unwrap_err();
    assert!(matches!(err, JournalError::Locked { .. }), "{err}");
    drop(journal);
    // A different size than the region was made with.
    let mut bigger = cfg.clone();
    bigger.pmem.as_mut().unwrap().region_bytes = 2 * REGION_BYTES;
    let err = open(&bigger, JournalMark::START).unwrap_err();
    assert!(matches!(err, JournalError::InvalidConfig { .. }), "{err}");
    // Slots too small for this config's largest group.
    let fresh = self::dirs();
    let mut small = config(&fresh);
    small.payload_bytes_max = 1 << 20;
    let err = open(&small, JournalMark::START).unwrap_err();
    match err {
        JournalError::InvalidConfig { reason } => assert!(reason.contains("slots of"), "{reason}"),
        other => panic!("expected InvalidConfig, got {other}"),
    }
    // A region file that is not one.
    let junk = self::dirs();
    std::fs::write(
        junk.pmem.path().join(pmem::PMEM_REGION_FILE_NAME),
        b"not a region at all, not zeros either",
    )
    .unwrap();
    let err = open(&config(&junk), JournalMark::START).unwrap_err();
    assert!(matches!(err, JournalError::BadHeader { .. }), "{err}");
}

#[test]
fn sync_off_acks_and_replays() {
    let dirs = dirs();
    let mut cfg = config(&dirs);
    cfg.sync = vela_bookie::journal::JournalSync::Off;
    let (journal, _) = open(&cfg, JournalMark::START).unwrap();
    let records = mixed_records(50);
    append_all(&journal, &records);
    drop(journal);
    let (_j, seen) = open(&cfg, JournalMark::START).unwrap();
    assert_eq!(records_of(&seen), records);
}
