//! Writes arbitrary bytes as the body of a journal file (after a valid header,
//! or raw) and opens the journal on it, as a bookie restart would. Oracles: no
//! panic; opening either refuses with an error or replays records; opening
//! again replays exactly the same records (a torn tail was truncated for good,
//! nothing valid was dropped).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vela_bookie::journal::format::{FileHeader, encode_header, file_name};
use vela_bookie::journal::{Journal, JournalConfig, JournalRecord};
use vela_bookie::JournalMark;

fn open(dir: &std::path::Path) -> Result<Vec<JournalRecord>, String> {
    let mut config = JournalConfig::new(dir);
    config.file_bytes_max = 1 << 20;
    config.prealloc_chunk_bytes = 1 << 20;
    config.payload_bytes_max = 64 * 1024;
    config.recycle_files_max = 0;
    config.sync = vela_bookie::journal::JournalSync::Off;
    let mut records = Vec::new();
    let journal = Journal::open(config, JournalMark::default(), |record, _mark| {
        records.push(record);
        Ok::<(), std::io::Error>(())
    })
    .map_err(|e| e.to_string())?;
    journal.shutdown().map_err(|e| e.to_string())?;
    Ok(records)
}

fuzz_target!(|data: &[u8]| {
    let Some((&mode, body)) = data.split_first() else {
        return;
    };
    // tmpfs when there is one: fsync is free there, so many more runs a second.
    let dir = match std::path::Path::new("/dev/shm").is_dir() {
        true => tempfile::tempdir_in("/dev/shm"),
        false => tempfile::tempdir(),
    }
    .expect("temp dir");
    let mut file = Vec::new();
    if mode & 1 == 0 {
        // A valid header block, then the fuzzer's records.
        let header = FileHeader {
            file_id: 1,
            data_offset: 4096,
        };
        let mut block = vec![0u8; 4096];
        encode_header(header, &mut block);
        file.extend_from_slice(&block);
    }
    file.extend_from_slice(body);
    std::fs::write(dir.path().join(file_name(1)), &file).expect("write journal file");
    let first = open(dir.path());
    if let Ok(records) = first {
        let again = open(dir.path()).expect("a journal that opened once opens again");
        assert_eq!(records, again, "a second open replays the same records");
    }
});
