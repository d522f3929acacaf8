//! Decodes arbitrary bytes as a journal record (what replay does at each
//! offset). Oracles: no panic; nothing sized by an unchecked length (the
//! record bound is small); a record that decodes re-encodes to the same bytes.
#![no_main]

use libfuzzer_sys::fuzz_target;
use vela_bookie::journal::format::{Decoded, DecodedRecord, decode_record, encode_record};

/// Small record bound so that "too long" is reached quickly.
const RECORD_BYTES_MAX: usize = 64 * 1024;

fuzz_target!(|data: &[u8]| {
    // First byte picks the file id the CRC is bound to.
    let Some((&file_id, bytes)) = data.split_first() else {
        return;
    };
    let file_id = u64::from(file_id % 4);
    match decode_record(bytes, file_id, RECORD_BYTES_MAX) {
        Decoded::Record { record, len } => {
            assert!(len <= bytes.len());
            if let DecodedRecord::User(record) = record {
                assert_eq!(record.encoded_len(), len);
                let mut out = vec![0u8; len];
                assert_eq!(encode_record(&record, file_id, &mut out), len);
                assert_eq!(&out[..], &bytes[..len], "a decoded record re-encodes to its bytes");
            }
        }
        Decoded::Short { len } => assert!(len > bytes.len()),
        Decoded::End | Decoded::Invalid { .. } => {}
    }
});
