//! Parses arbitrary bytes as a batch payload with an arbitrary count.
//! Oracles: no panic; a parsed batch rebuilds into bytes that parse to the
//! same messages.
#![no_main]

use bytes::{Bytes, BytesMut};
use libfuzzer_sys::fuzz_target;
use vela_wire::batch::{BatchIter, build_batch, parse_batch};

fuzz_target!(|data: &[u8]| {
    // First 4 bytes: the count (num_messages_in_batch); the rest: the payload.
    if data.len() < 4 {
        return;
    }
    let count = i32::from_be_bytes([data[0], data[1], data[2], data[3]]);
    let buffer = Bytes::copy_from_slice(&data[4..]);
    if let Ok(iter) = BatchIter::new(buffer.clone(), count) {
        for record in iter {
            if record.is_err() {
                break;
            }
        }
    }
    if let Ok(messages) = parse_batch(&buffer, count) {
        assert_eq!(messages.len(), count as usize);
        let mut rebuilt = BytesMut::new();
        build_batch(&messages, &mut rebuilt);
        let again = parse_batch(&rebuilt.freeze(), count).expect("a rebuilt batch parses");
        assert_eq!(again, messages);
    }
});
