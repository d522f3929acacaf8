//! Round trips and malformed input of the frame and message codecs.
#![allow(clippy::unwrap_used)]

use bytes::{BufMut, Bytes, BytesMut};
use proptest::prelude::*;

use crate::entry::ENTRY_BYTES_MAX;
use crate::frame::*;
use crate::message::*;

fn request_round_trip(request_id: u64, request: &Request) -> RequestFrame {
    let mut buf = BytesMut::new();
    encode_request(request_id, request, &mut buf);
    let frame = decode_frame(&mut buf).unwrap().unwrap();
    assert!(buf.is_empty());
    frame.into_request().unwrap()
}

fn response_round_trip(request_id: u64, response: &Response) -> ResponseFrame {
    let mut buf = BytesMut::new();
    encode_response(request_id, response, &mut buf);
    let frame = decode_frame(&mut buf).unwrap().unwrap();
    assert!(buf.is_empty());
    frame.into_response().unwrap()
}

#[test]
fn add_request_layout() {
    let mut buf = BytesMut::new();
    let entry = Bytes::from_static(&[9u8; 40]);
    encode_request(
        0x0102,
        &Request::Add {
            mode: AddMode::Recovery,
            entry,
        },
        &mut buf,
    );
    assert_eq!(&buf[..4], &(12u32 + 40).to_be_bytes());
    assert_eq!(buf[4], PROTOCOL_VERSION);
    assert_eq!(buf[5], 1);
    assert_eq!(&buf[6..8], &FLAG_RECOVERY.to_be_bytes());
    assert_eq!(&buf[8..16], &0x0102u64.to_be_bytes());
    assert_eq!(&buf[16..], &[9u8; 40]);
}

#[test]
fn decoder_waits_for_whole_frames_byte_by_byte() {
    let mut wire = BytesMut::new();
    let requests = [
        Request::Read {
            ledger_id: 1,
            entry_id: LAST_ENTRY,
            mode: ReadMode::Fence,
        },
        Request::WriteLac {
            ledger_id: 2,
            lac: 5,
        },
        Request::Add {
            mode: AddMode::Normal,
            entry: Bytes::from_static(b"0123456789"),
        },
    ];
    for (id, request) in requests.iter().enumerate() {
        encode_request(id as u64, request, &mut wire);
    }
    let mut buf = BytesMut::new();
    let mut decoded = Vec::new();
    for byte in wire.iter() {
        buf.put_u8(*byte);
        while let Some(frame) = decode_frame(&mut buf).unwrap() {
            decoded.push(frame.into_request().unwrap().request);
        }
    }
    assert_eq!(decoded, requests);
}

#[test]
fn oversized_length_is_refused_before_buffering() {
    let mut buf = BytesMut::new();
    buf.put_u32(u32::MAX);
    assert_eq!(
        decode_frame(&mut buf),
        Err(ProtocolError::FrameTooLong {
            len_bytes: u32::MAX
        })
    );
    assert!(
        buf.capacity() < 1024,
        "decoder reserved {} bytes",
        buf.capacity()
    );
    let mut buf = BytesMut::new();
    buf.put_u32(11);
    assert_eq!(
        decode_frame(&mut buf),
        Err(ProtocolError::FrameTooShort { len_bytes: 11 })
    );
}

#[test]
fn largest_read_response_fits() {
    let entry = Bytes::from(vec![1u8; ENTRY_BYTES_MAX]);
    let response = Response::Read {
        ledger_id: 1,
        entry_id: 2,
        lac: Some(1),
        entry,
    };
    assert_eq!(response_round_trip(3, &response).response, response);
}

#[test]
fn other_versions_are_answered_with_bad_version() {
    let mut buf = BytesMut::new();
    encode_request(77, &Request::ReadLac { ledger_id: 1 }, &mut buf);
    buf[4] = 9;
    let raw = decode_frame(&mut buf).unwrap().unwrap();
    assert_eq!(
        raw.clone().into_request(),
        Err(ProtocolError::BadVersion { version: 9 })
    );
    let mut answer = BytesMut::new();
    assert!(encode_bad_version(&raw, &mut answer));
    let response = decode_frame(&mut answer)
        .unwrap()
        .unwrap()
        .into_response()
        .unwrap();
    assert_eq!(response.request_id, 77);
    assert_eq!(
        response.response,
        Response::Failed {
            op: Op::ReadLac,
            status: Status::BadVersion
        }
    );
}

#[test]
fn malformed_bodies_and_flags_are_typed_errors() {
    let raw = |op_byte, flags, body: &'static [u8]| RawFrame {
        version: PROTOCOL_VERSION,
        op_byte,
        flags_or_status: flags,
        request_id: 1,
        body: Bytes::from_static(body),
    };
    assert!(matches!(
        raw(2, 0, &[0; 15]).into_request(),
        Err(ProtocolError::BadBody { .. })
    ));
    assert!(matches!(
        raw(2, 2, &[0; 16]).into_request(),
        Err(ProtocolError::UnknownFlags { .. })
    ));
    assert!(matches!(
        raw(9, 0, &[]).into_request(),
        Err(ProtocolError::UnknownOp { .. })
    ));
    assert!(matches!(
        raw(4, 0, &[0xff; 16]).into_request(),
        Err(ProtocolError::BadBody { .. })
    ));
    assert!(matches!(
        raw(1, 0, &[]).into_response(),
        Err(ProtocolError::UnknownOp { .. })
    ));
    assert!(matches!(
        raw(0x81, 99, &[]).into_response(),
        Err(ProtocolError::UnknownStatus { .. })
    ));
    assert!(matches!(
        raw(0x81, 3, &[0]).into_response(),
        Err(ProtocolError::BadBody { .. })
    ));
}

fn arb_request() -> impl Strategy<Value = Request> {
    let mode = prop_oneof![Just(AddMode::Normal), Just(AddMode::Recovery)];
    let read_mode = prop_oneof![Just(ReadMode::Normal), Just(ReadMode::Fence)];
    prop_oneof![
        (mode, proptest::collection::vec(any::<u8>(), 0..256)).prop_map(|(mode, entry)| {
            Request::Add {
                mode,
                entry: Bytes::from(entry),
            }
        }),
        (any::<u64>(), any::<u64>(), read_mode).prop_map(|(ledger_id, entry_id, mode)| {
            Request::Read {
                ledger_id,
                entry_id,
                mode,
            }
        }),
        any::<u64>().prop_map(|ledger_id| Request::ReadLac { ledger_id }),
        (any::<u64>(), 0..u64::MAX)
            .prop_map(|(ledger_id, lac)| Request::WriteLac { ledger_id, lac }),
        any::<u64>().prop_map(|ledger_id| Request::DeleteLedger { ledger_id }),
    ]
}

fn arb_response() -> impl Strategy<Value = Response> {
    let lac = proptest::option::of(0..u64::MAX);
    let op = prop_oneof![
        Just(Op::Add),
        Just(Op::Read),
        Just(Op::ReadLac),
        Just(Op::WriteLac),
        Just(Op::DeleteLedger)
    ];
    prop_oneof![
        (any::<u64>(), any::<u64>()).prop_map(|(ledger_id, entry_id)| Response::Add {
            ledger_id,
            entry_id
        }),
        (
            any::<u64>(),
            any::<u64>(),
            lac.clone(),
            proptest::collection::vec(any::<u8>(), 0..256)
        )
            .prop_map(|(ledger_id, entry_id, lac, entry)| Response::Read {
                ledger_id,
                entry_id,
                lac,
                entry: Bytes::from(entry)
            }),
        (any::<u64>(), lac).prop_map(|(ledger_id, lac)| Response::ReadLac { ledger_id, lac }),
        any::<u64>().prop_map(|ledger_id| Response::WriteLac { ledger_id }),
        any::<u64>().prop_map(|ledger_id| Response::DeleteLedger { ledger_id }),
        (op, 1u16..=8).prop_map(|(op, code)| Response::Failed {
            op,
            status: Status::from_code(code).unwrap()
        }),
    ]
}

proptest! {
    #[test]
    fn requests_round_trip(request_id: u64, request in arb_request()) {
        let frame = request_round_trip(request_id, &request);
        prop_assert_eq!(frame.request_id, request_id);
        prop_assert_eq!(frame.request, request);
    }

    #[test]
    fn responses_round_trip(request_id: u64, response in arb_response()) {
        let frame = response_round_trip(request_id, &response);
        prop_assert_eq!(frame.request_id, request_id);
        prop_assert_eq!(frame.response, response);
    }

    #[test]
    fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        let mut buf = BytesMut::from(&bytes[..]);
        while let Ok(Some(frame)) = decode_frame(&mut buf) {
            let _ = frame.clone().into_request();
            let _ = frame.into_response();
        }
    }

    #[test]
    fn arbitrary_headers_with_valid_length_never_panic(
        version: u8, op_byte: u8, flags: u16, request_id: u64,
        body in proptest::collection::vec(any::<u8>(), 0..64),
    ) {
        let mut buf = BytesMut::new();
        buf.put_u32(12 + body.len() as u32);
        buf.put_u8(version);
        buf.put_u8(op_byte);
        buf.put_u16(flags);
        buf.put_u64(request_id);
        buf.put_slice(&body);
        let frame = decode_frame(&mut buf).unwrap().unwrap();
        prop_assert!(buf.is_empty());
        let _ = frame.clone().into_request();
        let _ = frame.clone().into_response();
        let _ = encode_bad_version(&frame, &mut BytesMut::new());
    }
}
