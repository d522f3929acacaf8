//! The ring's bookkeeping, below the journal threads: slot order, the slot
//! kept for restarts, what a reopen frees, and slot bounds. Replay, torn
//! tails and laps through the whole journal are in `tests/journal_pmem.rs`.
#![allow(clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::*;
use crate::journal::config::JournalBackendKind;

/// Four 256 KiB slots.
const REGION_BYTES: u64 = HEADER_AREA_BYTES + 4 * (256 << 10);

fn config(journal_dir: &Path, pmem_dir: &Path) -> JournalConfig {
    let mut c = JournalConfig::new(journal_dir);
    c.backend = JournalBackendKind::Pmem;
    c.alignment_bytes = PMEM_ALIGNMENT_BYTES;
    c.payload_bytes_max = 16 << 10;
    c.group_bytes_max = 16 << 10;
    c.pmem = Some(PmemConfig {
        dir: pmem_dir.to_path_buf(),
        region_bytes: REGION_BYTES,
        emulation: PmemEmulation::Allow,
    });
    c
}

fn next_path(dir: &Path) -> PathBuf {
    dir.join(format::NEXT_FILE_NAME)
}

fn file_path(dir: &Path, id: u64) -> PathBuf {
    dir.join(format::file_name(id))
}

/// Takes a slot for the next file, writes its header and installs it as `id`.
fn install(region: &Arc<Region>, dir: &Path, id: u64) -> Result<usize, JournalError> {
    let file = region.open_file(&next_path(dir), true)?;
    let mut header = vec![0u8; format::HEADER_BYTES];
    format::encode_header(
        format::FileHeader {
            file_id: id,
            data_offset: format::HEADER_BYTES as u32,
        },
        &mut header,
    );
    file.write_at(&header, 0).unwrap();
    file.sync_data().unwrap();
    region.rename(&next_path(dir), &file_path(dir, id))?;
    let slots = region.lock();
    Ok(slots.find_live(id).unwrap())
}

#[test]
fn slots_are_taken_in_ring_order_keeping_one_for_the_next_restart() {
    let journal_dir = tempfile::tempdir().unwrap();
    let pmem_dir = tempfile::tempdir().unwrap();
    let cfg = config(journal_dir.path(), pmem_dir.path());
    let dir = journal_dir.path();
    let region = Region::open(&cfg, JournalMark::START).unwrap();
    assert_eq!(install(&region, dir, 1).unwrap(), 0);
    assert_eq!(install(&region, dir, 2).unwrap(), 1);
    assert_eq!(install(&region, dir, 3).unwrap(), 2);
    // The last free slot is kept for the first file after a restart.
    let err = region.open_file(&next_path(dir), true).unwrap_err();
    assert!(
        matches!(
            err,
            JournalError::RingFull {
                live_slots: 3,
                slot_count: 4,
                ..
            }
        ),
        "{err}"
    );
    assert!(region.wants_checkpoint());
    assert_eq!(region.list_file_ids(), vec![1, 2, 3]);
    // A checkpoint retires file 1: the ring goes on after slot 2, not back to 0.
    region
        .rename(&file_path(dir, 1), &dir.join("0000000000000001.jnl.free"))
        .unwrap();
    assert!(!region.exists(&file_path(dir, 1)));
    assert_eq!(install(&region, dir, 4).unwrap(), 3);
    region.remove(&file_path(dir, 2)).unwrap();
    region.remove(&file_path(dir, 3)).unwrap();
    assert_eq!(install(&region, dir, 5).unwrap(), 0);
    assert!(!region.wants_checkpoint());
    drop(region);

    // The table is durable: a reopen sees the same files.
    let region = Region::open(&cfg, JournalMark::START).unwrap();
    assert_eq!(region.list_file_ids(), vec![4, 5]);
    assert!(region.exists(&file_path(dir, 5)));
    assert!(!region.exists(&next_path(dir)));
}

#[test]
fn a_reopen_frees_checkpointed_slots_and_only_then_an_empty_newest_file() {
    let journal_dir = tempfile::tempdir().unwrap();
    let pmem_dir = tempfile::tempdir().unwrap();
    let cfg = config(journal_dir.path(), pmem_dir.path());
    let dir = journal_dir.path();
    {
        let region = Region::open(&cfg, JournalMark::START).unwrap();
        for id in 1..=3 {
            install(&region, dir, id).unwrap();
        }
        // The reserve, as a restart takes it.
        let region_again = region.clone();
        region_again.lock().first_taken = false;
        install(&region, dir, 4).unwrap();
    }
    // Storage checkpointed into file 3: files 1 and 2 are free again.
    let from = JournalMark {
        file_id: 3,
        offset: 4096,
    };
    let region = Region::open(&cfg, from).unwrap();
    assert_eq!(region.list_file_ids(), vec![3, 4]);
    drop(region);
    // Nothing checkpointed and no slot free: the newest file holds no record,
    // so its slot is the one a restart may reuse.
    {
        let region = Region::open(&cfg, JournalMark::START).unwrap();
        install(&region, dir, 1).unwrap();
        region.lock().first_taken = false;
        install(&region, dir, 2).unwrap();
        assert_eq!(region.list_file_ids(), vec![1, 2, 3, 4]);
    }
    let region = Region::open(&cfg, JournalMark::START).unwrap();
    assert_eq!(
        region.list_file_ids(),
        vec![1, 2, 3],
        "the empty newest file's slot is free"
    );
}

#[test]
fn a_slot_refuses_writes_past_its_end_and_reads_short() {
    let journal_dir = tempfile::tempdir().unwrap();
    let pmem_dir = tempfile::tempdir().unwrap();
    let cfg = config(journal_dir.path(), pmem_dir.path());
    let region = Region::open(&cfg, JournalMark::START).unwrap();
    let file = region
        .open_file(&next_path(journal_dir.path()), true)
        .unwrap();
    let slot_bytes = file.len().unwrap();
    assert_eq!(slot_bytes, 256 << 10);
    let err = file.write_at(&[1u8; 512], slot_bytes - 256).unwrap_err();
    assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
    file.write_at(&[7u8; 256], slot_bytes - 256).unwrap();
    file.sync_data().unwrap();
    let mut buf = [0u8; 1024];
    assert_eq!(file.read_at(&mut buf, slot_bytes - 256).unwrap(), 256);
    assert!(buf[..256].iter().all(|b| *b == 7));
    assert_eq!(file.read_at(&mut buf, slot_bytes).unwrap(), 0);
    assert!(file.set_len(0).is_err());
    // A name the ring does not know.
    assert!(
        region
            .open_file(&journal_dir.path().join("other"), true)
            .is_err()
    );
}
