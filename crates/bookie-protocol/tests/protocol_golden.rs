//! The bookie protocol's bytes, pinned: every request and response kind against
//! its expected hex. A change here is a wire-format change: bump
//! `PROTOCOL_VERSION` and keep old peers in mind.
#![allow(clippy::unwrap_used)]

use bytes::{Bytes, BytesMut};
use vela_bookie_protocol::entry::{EntryHeader, encode_entry};
use vela_bookie_protocol::{
    AddMode, LAST_ENTRY, Op, ReadMode, Request, Response, Status, decode_frame, encode_request,
    encode_response,
};

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|byte| format!("{byte:02x}")).collect()
}

/// Encodes, compares with `expected` (spaces ignored), decodes back.
fn check_request(request_id: u64, request: Request, expected: &str) {
    let mut wire = BytesMut::new();
    encode_request(request_id, &request, &mut wire);
    assert_eq!(hex(&wire), expected.replace(' ', ""), "{request:?}");
    let frame = decode_frame(&mut wire)
        .unwrap()
        .unwrap()
        .into_request()
        .unwrap();
    assert_eq!((frame.request_id, frame.request), (request_id, request));
}

fn check_response(request_id: u64, response: Response, expected: &str) {
    let mut wire = BytesMut::new();
    encode_response(request_id, &response, &mut wire);
    assert_eq!(hex(&wire), expected.replace(' ', ""), "{response:?}");
    let frame = decode_frame(&mut wire)
        .unwrap()
        .unwrap()
        .into_response()
        .unwrap();
    assert_eq!((frame.request_id, frame.response), (request_id, response));
}

/// The CRC is standard CRC32C (Castagnoli, reflected, init and xorout
/// 0xffffffff): a102509e was computed independently of the crc32c crate.
#[test]
fn packaged_entry_bytes() {
    let header = EntryHeader {
        ledger_id: 1,
        entry_id: 2,
        last_add_confirmed: None,
        ledger_length: 3,
    };
    let entry = encode_entry(&header, b"hi");
    assert_eq!(
        hex(&entry),
        "0000000000000001 0000000000000002 ffffffffffffffff 0000000000000003 a102509e 6869"
            .replace(' ', "")
    );
}

#[test]
fn request_bytes() {
    // len | version | op | flags | request_id | body
    check_request(
        7,
        Request::Add {
            mode: AddMode::Recovery,
            entry: Bytes::from_static(b"entry"),
        },
        "00000011 01 01 0001 0000000000000007 656e747279",
    );
    check_request(
        8,
        Request::Read {
            ledger_id: 1,
            entry_id: LAST_ENTRY,
            mode: ReadMode::Fence,
        },
        "0000001c 01 02 0001 0000000000000008 0000000000000001 ffffffffffffffff",
    );
    check_request(
        9,
        Request::ReadLac { ledger_id: 2 },
        "00000014 01 03 0000 0000000000000009 0000000000000002",
    );
    check_request(
        10,
        Request::WriteLac {
            ledger_id: 2,
            lac: 5,
        },
        "0000001c 01 04 0000 000000000000000a 0000000000000002 0000000000000005",
    );
    check_request(
        11,
        Request::DeleteLedger { ledger_id: 3 },
        "00000014 01 05 0000 000000000000000b 0000000000000003",
    );
}

#[test]
fn response_bytes() {
    // len | version | op | 0x80 | status | request_id | body
    check_response(
        7,
        Response::Add {
            ledger_id: 1,
            entry_id: 2,
        },
        "0000001c 01 81 0000 0000000000000007 0000000000000001 0000000000000002",
    );
    check_response(
        8,
        Response::Read {
            ledger_id: 1,
            entry_id: 4,
            lac: None,
            entry: Bytes::from_static(b"e"),
        },
        "00000025 01 82 0000 0000000000000008 0000000000000001 0000000000000004 ffffffffffffffff 65",
    );
    check_response(
        9,
        Response::ReadLac {
            ledger_id: 2,
            lac: Some(3),
        },
        "0000001c 01 83 0000 0000000000000009 0000000000000002 0000000000000003",
    );
    check_response(
        10,
        Response::WriteLac { ledger_id: 2 },
        "00000014 01 84 0000 000000000000000a 0000000000000002",
    );
    check_response(
        11,
        Response::DeleteLedger { ledger_id: 3 },
        "00000014 01 85 0000 000000000000000b 0000000000000003",
    );
    let statuses = [
        (Status::NoSuchEntry, "0001"),
        (Status::NoSuchLedger, "0002"),
        (Status::Fenced, "0003"),
        (Status::BadRequest, "0004"),
        (Status::TooManyRequests, "0005"),
        (Status::ReadOnly, "0006"),
        (Status::IoError, "0007"),
        (Status::BadVersion, "0008"),
    ];
    for (status, code) in statuses {
        check_response(
            12,
            Response::Failed {
                op: Op::Add,
                status,
            },
            &format!("0000000c 01 81 {code} 000000000000000c"),
        );
    }
}
