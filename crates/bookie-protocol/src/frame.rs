//! The frame: the fixed header every message of the bookie protocol starts
//! with, its op codes and status codes, and cutting frames off a byte stream.
//!
//! Owns: the frame layout (below), `Op`, `Status`, `ProtocolError`, `RawFrame`
//! and `decode_frame`. Guarantees: any byte string fed to `decode_frame` yields
//! a frame, "need more bytes", or a typed `ProtocolError`, never a panic, and no
//! allocation larger than `FRAME_BYTES_MAX` (the length is checked before
//! anything is buffered); bodies are `Bytes` slices of the read buffer (no
//! copy). Never: decodes bodies (that is `message`'s job) or does I/O.
//!
//! # Frame
//!
//! ```text
//! { len u32 | version u8 | op u8 | flags_or_status u16 | request_id u64 | body }
//! ```
//! Big-endian. `len` counts the bytes after itself (12 + body). The 12-byte
//! header layout is the same in every protocol version, so a peer can always
//! frame, and answer a frame of a version it does not speak with `BAD_VERSION`.
//! A request carries flags in the u16; a response has the request's op with
//! `RESPONSE_OP_BIT` set, the same `request_id`, and its status code in the u16.
//! Responses may come in any order (reads finish before adds that wait for an
//! fdatasync); the client matches them by `request_id`.
//!
//! | op | request body | OK response body |
//! |----|--------------|------------------|
//! | ADD 1 (flag RECOVERY 0x1) | packaged entry (`entry.rs`) | ledger_id u64, entry_id u64 |
//! | READ 2 (flag FENCE 0x1) | ledger_id u64, entry_id u64 (`LAST_ENTRY` = the last one) | ledger_id u64, entry_id u64, lac u64, packaged entry |
//! | READ_LAC 3 | ledger_id u64 | ledger_id u64, lac u64 |
//! | WRITE_LAC 4 | ledger_id u64, lac u64 | ledger_id u64 |
//! | DELETE_LEDGER 5 | ledger_id u64 | ledger_id u64 |
//!
//! A response with any status but OK has an empty body. A LAC of `u64::MAX`
//! means "none known".

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::entry::ENTRY_BYTES_MAX;

/// The version this code speaks. A request of any other version is answered
/// with `Status::BadVersion`.
pub const PROTOCOL_VERSION: u8 = 1;
/// Bytes of `len` plus the fixed header.
pub const FRAME_HEADER_BYTES: usize = 16;
/// Largest frame, length prefix included: the largest packaged entry plus room for
/// the frame header and a READ response's 24 bytes of fixed fields, rounded up so
/// later versions can add a few fields. A longer length prefix is a protocol
/// error before any of the frame is buffered.
pub const FRAME_BYTES_MAX: usize = ENTRY_BYTES_MAX + 1024;
/// Entry id of a READ asking for the ledger's last stored entry.
pub const LAST_ENTRY: u64 = u64::MAX;
/// Set in the op byte of every response.
pub const RESPONSE_OP_BIT: u8 = 0x80;
/// ADD flag: a recovery add, accepted even when the ledger is fenced.
pub const FLAG_RECOVERY: u16 = 0x0001;
/// READ flag: fence the ledger (durably) before answering.
pub const FLAG_FENCE: u16 = 0x0001;

pub(crate) const LEN_PREFIX_BYTES: usize = 4;
const _: () = assert!(FRAME_HEADER_BYTES == LEN_PREFIX_BYTES + 1 + 1 + 2 + 8);
const _: () = assert!(FRAME_BYTES_MAX >= ENTRY_BYTES_MAX + FRAME_HEADER_BYTES + 24);
const _: () = assert!(FRAME_BYTES_MAX <= u32::MAX as usize);

/// Operation codes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum Op {
    /// Store an entry.
    Add = 1,
    /// Read an entry (optionally fencing the ledger first).
    Read = 2,
    /// Read the bookie's last-add-confirmed for a ledger.
    ReadLac = 3,
    /// Store an explicit last-add-confirmed for a ledger.
    WriteLac = 4,
    /// Delete a ledger's entries and state.
    DeleteLedger = 5,
}

impl Op {
    /// The op of a request op byte, if this version defines it.
    pub fn from_byte(byte: u8) -> Option<Op> {
        Some(match byte {
            1 => Op::Add,
            2 => Op::Read,
            3 => Op::ReadLac,
            4 => Op::WriteLac,
            5 => Op::DeleteLedger,
            _ => return None,
        })
    }
}

/// Status of a response.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u16)]
pub enum Status {
    /// Done.
    Ok = 0,
    /// The ledger exists on this bookie but not that entry.
    NoSuchEntry = 1,
    /// This bookie holds nothing of that ledger.
    NoSuchLedger = 2,
    /// The ledger is fenced: normal adds are refused.
    Fenced = 3,
    /// The request is well framed but invalid (bad entry header, size).
    BadRequest = 4,
    /// A bounded queue or cache is full; retry later or elsewhere.
    TooManyRequests = 5,
    /// The bookie accepts no writes (disk full or broken journal).
    ReadOnly = 6,
    /// A disk error on this bookie.
    IoError = 7,
    /// The request's protocol version is not spoken by this bookie.
    BadVersion = 8,
}

impl Status {
    /// The status of a wire code, if this version defines it.
    pub fn from_code(code: u16) -> Option<Status> {
        Some(match code {
            0 => Status::Ok,
            1 => Status::NoSuchEntry,
            2 => Status::NoSuchLedger,
            3 => Status::Fenced,
            4 => Status::BadRequest,
            5 => Status::TooManyRequests,
            6 => Status::ReadOnly,
            7 => Status::IoError,
            8 => Status::BadVersion,
            _ => return None,
        })
    }
}

/// How an ADD treats a fenced ledger.
/// Why bytes are not a valid frame. After any of these the connection's byte
/// stream cannot be trusted: close it.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ProtocolError {
    /// Length prefix smaller than the fixed header.
    #[error("frame length {len_bytes} is below the {}-byte header", FRAME_HEADER_BYTES - LEN_PREFIX_BYTES)]
    FrameTooShort {
        /// The length prefix.
        len_bytes: u32,
    },
    /// Length prefix above `FRAME_BYTES_MAX`.
    #[error("frame length {len_bytes} is over the {FRAME_BYTES_MAX}-byte limit")]
    FrameTooLong {
        /// The length prefix.
        len_bytes: u32,
    },
    /// An op byte this version does not define (or a request op where a
    /// response was expected, or the reverse).
    #[error("unknown op byte {op_byte:#04x}")]
    UnknownOp {
        /// The op byte.
        op_byte: u8,
    },
    /// Flags this version does not define for the op.
    #[error("unknown flags {flags:#06x} for {op:?}")]
    UnknownFlags {
        /// The op.
        op: Op,
        /// The flags.
        flags: u16,
    },
    /// A status code this version does not define.
    #[error("unknown status code {code}")]
    UnknownStatus {
        /// The code.
        code: u16,
    },
    /// A body of the wrong size for its op and status.
    #[error("{op:?} body of {len_bytes} bytes is malformed")]
    BadBody {
        /// The op.
        op: Op,
        /// Length of the body.
        len_bytes: usize,
    },
    /// A frame of another protocol version where only this version is spoken
    /// (responses: a bookie never answers in a version it was not asked in).
    #[error("unsupported protocol version {version}")]
    BadVersion {
        /// The frame's version.
        version: u8,
    },
}

/// A framed message: header fields and body, before the op-specific decode.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RawFrame {
    /// Protocol version of the sender.
    pub version: u8,
    /// Op byte (with `RESPONSE_OP_BIT` in responses).
    pub op_byte: u8,
    /// Flags (requests) or status code (responses).
    pub flags_or_status: u16,
    /// Request id chosen by the client.
    pub request_id: u64,
    /// The body: a slice of the read buffer.
    pub body: Bytes,
}

/// Takes one whole frame off the front of `src`, or returns `Ok(None)` when more
/// bytes are needed (having reserved room for the rest of the frame). Checks the
/// length prefix before reserving or buffering anything.
pub fn decode_frame(src: &mut BytesMut) -> Result<Option<RawFrame>, ProtocolError> {
    if src.len() < LEN_PREFIX_BYTES {
        return Ok(None);
    }
    let len_bytes = u32::from_be_bytes([src[0], src[1], src[2], src[3]]);
    let frame_bytes = LEN_PREFIX_BYTES + len_bytes as usize;
    if frame_bytes < FRAME_HEADER_BYTES {
        return Err(ProtocolError::FrameTooShort { len_bytes });
    }
    if frame_bytes > FRAME_BYTES_MAX {
        return Err(ProtocolError::FrameTooLong { len_bytes });
    }
    if src.len() < frame_bytes {
        src.reserve(frame_bytes - src.len());
        return Ok(None);
    }
    let mut frame = src.split_to(frame_bytes);
    frame.advance(LEN_PREFIX_BYTES);
    let version = frame.get_u8();
    let op_byte = frame.get_u8();
    let flags_or_status = frame.get_u16();
    let request_id = frame.get_u64();
    Ok(Some(RawFrame {
        version,
        op_byte,
        flags_or_status,
        request_id,
        body: frame.freeze(),
    }))
}

/// Appends the frame header; `body_bytes` is the length of the body that the
/// caller appends next.
pub(crate) fn put_header(
    dst: &mut BytesMut,
    op_byte: u8,
    flags_or_status: u16,
    request_id: u64,
    body_bytes: usize,
) {
    let frame_bytes = FRAME_HEADER_BYTES + body_bytes;
    assert!(
        frame_bytes <= FRAME_BYTES_MAX,
        "frame of {frame_bytes} bytes over FRAME_BYTES_MAX"
    );
    // Room for the header and fixed fields; a payload grows `dst` itself.
    dst.reserve(FRAME_HEADER_BYTES + 24);
    // Fits: FRAME_BYTES_MAX <= u32::MAX (checked at compile time above).
    dst.put_u32((frame_bytes - LEN_PREFIX_BYTES) as u32);
    dst.put_u8(PROTOCOL_VERSION);
    dst.put_u8(op_byte);
    dst.put_u16(flags_or_status);
    dst.put_u64(request_id);
}
