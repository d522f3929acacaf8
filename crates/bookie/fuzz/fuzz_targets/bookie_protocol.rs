//! Feeds arbitrary bytes, cut into arbitrary chunks, to the bookie protocol's
//! frame decoder, as the server (requests) and the client (responses) read
//! them. Oracles: no panic; a decoded request or response re-encodes to a
//! frame that decodes to the same value.
#![no_main]

use bytes::BytesMut;
use libfuzzer_sys::fuzz_target;
use vela_bookie_protocol::{decode_frame, encode_request, encode_response};

fuzz_target!(|data: &[u8]| {
    let Some((&seed, stream)) = data.split_first() else {
        return;
    };
    let chunk_bytes = usize::from(seed % 64) + 1;
    let mut buf = BytesMut::new();
    for chunk in stream.chunks(chunk_bytes) {
        buf.extend_from_slice(chunk);
        loop {
            match decode_frame(&mut buf) {
                Ok(Some(raw)) => {
                    if let Ok(request) = raw.clone().into_request() {
                        let mut encoded = BytesMut::new();
                        encode_request(request.request_id, &request.request, &mut encoded);
                        let again = decode_frame(&mut encoded)
                            .expect("re-encoded request decodes")
                            .expect("re-encoded request is complete")
                            .into_request()
                            .expect("re-encoded request parses");
                        assert_eq!(again, request);
                    }
                    if let Ok(response) = raw.into_response() {
                        let mut encoded = BytesMut::new();
                        encode_response(response.request_id, &response.response, &mut encoded);
                        let again = decode_frame(&mut encoded)
                            .expect("re-encoded response decodes")
                            .expect("re-encoded response is complete")
                            .into_response()
                            .expect("re-encoded response parses");
                        assert_eq!(again, response);
                    }
                }
                Ok(None) => break,
                // A framing error ends the connection.
                Err(_) => return,
            }
        }
    }
});
