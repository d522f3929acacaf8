//! Helpers of the journal tests (`journal_replay`, `journal_pmem`,
//! `journal_crash`): configs, opening with replay, appending, and records.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::time::Duration;

use bytes::Bytes;
use vela_bookie::JournalMark;
use vela_bookie::journal::{
    Journal, JournalBackendKind, JournalConfig, JournalError, JournalRecord, PMEM_ALIGNMENT_BYTES,
    PmemConfig, PmemEmulation,
};

/// Small files and chunks so tests rotate and preallocate often.
pub(crate) fn config(dir: &Path) -> JournalConfig {
    let mut c = JournalConfig::new(dir);
    c.payload_bytes_max = 16 << 10;
    c.group_bytes_max = 16 << 10;
    c.file_bytes_max = 256 << 10;
    c.prealloc_chunk_bytes = 64 << 10;
    c
}

/// `c` on the persistent-memory backend: a region of `region_bytes` in
/// `pmem_dir`, in emulation (no DAX under test).
pub(crate) fn on_pmem(mut c: JournalConfig, pmem_dir: &Path, region_bytes: u64) -> JournalConfig {
    c.backend = JournalBackendKind::Pmem;
    c.alignment_bytes = PMEM_ALIGNMENT_BYTES;
    c.pmem = Some(PmemConfig {
        dir: pmem_dir.to_path_buf(),
        region_bytes,
        emulation: PmemEmulation::Allow,
    });
    c
}

/// Where pmem regions go: tmpfs when there is one (the case the README
/// documents), else the temp dir.
pub(crate) fn pmem_base_dir() -> PathBuf {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        shm.to_path_buf()
    } else {
        std::env::temp_dir()
    }
}

/// The error of a replay callback that never fails.
#[derive(Debug)]
pub(crate) struct Never;
impl std::fmt::Display for Never {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("never")
    }
}
impl std::error::Error for Never {}

/// The one helper that opens a journal: returns it and what replay handed back.
pub(crate) fn open(
    cfg: &JournalConfig,
    from: JournalMark,
) -> Result<(Journal, Vec<(JournalRecord, JournalMark)>), JournalError> {
    let mut seen = Vec::new();
    let journal = Journal::open(cfg.clone(), from, |record, mark| {
        seen.push((record, mark));
        Ok::<(), Never>(())
    })?;
    Ok((journal, seen))
}

/// What [`append_each`]'s callbacks send: the record's index and its result.
pub(crate) type Acks = mpsc::Receiver<(usize, Result<JournalMark, JournalError>)>;

/// Appends every record without waiting; each callback sends its record's
/// index and result to the returned receiver.
pub(crate) fn append_each(journal: &Journal, records: &[JournalRecord]) -> Acks {
    let (tx, rx) = mpsc::channel();
    for (i, r) in records.iter().enumerate() {
        let tx = tx.clone();
        journal
            .append(r.clone(), move |res| tx.send((i, res)).unwrap())
            .unwrap();
    }
    rx
}

/// Appends every record and waits for all callbacks; returns their marks.
pub(crate) fn append_all(journal: &Journal, records: &[JournalRecord]) -> Vec<JournalMark> {
    let rx = append_each(journal, records);
    let mut marks = vec![JournalMark::START; records.len()];
    let mut last = None;
    for _ in 0..records.len() {
        let (i, res) = rx.recv_timeout(Duration::from_secs(20)).unwrap();
        // Callbacks run in append order.
        assert!(
            last.is_none_or(|l| l + 1 == i),
            "callback order {last:?} then {i}"
        );
        last = Some(i);
        marks[i] = res.unwrap();
    }
    assert!(marks.windows(2).all(|w| w[0] < w[1]), "marks increase");
    marks
}

pub(crate) fn entry(ledger_id: u64, entry_id: u64, payload_bytes: usize) -> JournalRecord {
    let payload: Vec<u8> = (0..payload_bytes)
        .map(|i| (i as u64 * 31 + entry_id) as u8)
        .collect();
    JournalRecord::Entry {
        ledger_id,
        entry_id,
        payload: Bytes::from(payload),
    }
}

pub(crate) fn mixed_records(count: u64) -> Vec<JournalRecord> {
    (0..count)
        .map(|i| match i % 7 {
            3 => JournalRecord::Fence { ledger_id: i },
            4 => JournalRecord::ExplicitLac {
                ledger_id: 2,
                lac: i,
            },
            5 => JournalRecord::LedgerDeleted { ledger_id: i + 100 },
            _ => entry(i % 3, i, (i as usize * 97) % 3000),
        })
        .collect()
}

pub(crate) fn records_of(seen: &[(JournalRecord, JournalMark)]) -> Vec<JournalRecord> {
    seen.iter().map(|(r, _)| r.clone()).collect()
}
