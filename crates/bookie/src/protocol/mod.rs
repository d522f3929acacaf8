//! The bookie protocol: Vela's own binary, versioned, length-prefixed protocol
//! between ledger clients and bookies, pipelined with request ids.
//!
//! Owns: the frame layout, op codes, flags, status codes and the codec for
//! requests and responses. Guarantees: `encode_*` and `decode_*` are exact
//! inverses; any byte string fed to the decoder yields a frame, "need more
//! bytes", or a typed `ProtocolError`, never a panic, and no allocation larger
//! than `FRAME_BYTES_MAX` (the length is checked before anything is buffered).
//! Entries in decoded frames are `Bytes` slices of the read buffer (no copy).
//! Never: does I/O (except `FrameQueue::write_to`, the writer tasks' one
//! socket write), or interprets entries beyond their length (that is `entry`'s
//! and the bookie's job).
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

mod queue;

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::entry::{ENTRY_BYTES_MAX, LAC_NONE};

pub(crate) use queue::FrameQueue;

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

const LEN_PREFIX_BYTES: usize = 4;
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
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum AddMode {
    /// A writer's add: refused with `FENCED` once the ledger is fenced.
    Normal,
    /// A recovery add (re-replicating an entry while closing a ledger): accepted
    /// on fenced ledgers.
    Recovery,
}

/// Whether a READ fences the ledger.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReadMode {
    /// Just read.
    Normal,
    /// Fence the ledger, durably, then read: after the answer no normal ADD to
    /// this ledger succeeds on this bookie.
    Fence,
}

/// A request, without its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Request {
    /// Store a packaged entry (its header names ledger and entry).
    Add {
        /// Normal or recovery.
        mode: AddMode,
        /// The packaged entry, stored verbatim.
        entry: Bytes,
    },
    /// Read one entry.
    Read {
        /// Ledger to read.
        ledger_id: u64,
        /// Entry to read, or `LAST_ENTRY`.
        entry_id: u64,
        /// Normal or fencing read.
        mode: ReadMode,
    },
    /// Read the bookie's known LAC of a ledger.
    ReadLac {
        /// Ledger asked about.
        ledger_id: u64,
    },
    /// Store an explicit LAC.
    WriteLac {
        /// Ledger.
        ledger_id: u64,
        /// Its last-add-confirmed (never `u64::MAX`).
        lac: u64,
    },
    /// Delete a ledger.
    DeleteLedger {
        /// Ledger to delete.
        ledger_id: u64,
    },
}

impl Request {
    /// The op code of this request.
    pub fn op(&self) -> Op {
        match self {
            Request::Add { .. } => Op::Add,
            Request::Read { .. } => Op::Read,
            Request::ReadLac { .. } => Op::ReadLac,
            Request::WriteLac { .. } => Op::WriteLac,
            Request::DeleteLedger { .. } => Op::DeleteLedger,
        }
    }
}

/// A response, without its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Response {
    /// The entry is durable on this bookie.
    Add {
        /// Ledger of the stored entry.
        ledger_id: u64,
        /// Its entry id.
        entry_id: u64,
    },
    /// The entry read.
    Read {
        /// Ledger read.
        ledger_id: u64,
        /// Entry returned (the actual id when `LAST_ENTRY` was asked).
        entry_id: u64,
        /// The bookie's known LAC for the ledger.
        lac: Option<u64>,
        /// The packaged entry as stored.
        entry: Bytes,
    },
    /// The bookie's known LAC.
    ReadLac {
        /// Ledger asked about.
        ledger_id: u64,
        /// Its LAC (`None`: no entry confirmed that this bookie knows of).
        lac: Option<u64>,
    },
    /// The explicit LAC is durable.
    WriteLac {
        /// Ledger.
        ledger_id: u64,
    },
    /// The deletion is durable.
    DeleteLedger {
        /// Ledger deleted.
        ledger_id: u64,
    },
    /// The request failed with `status` (never `Status::Ok`).
    Failed {
        /// Op of the failed request.
        op: Op,
        /// Why.
        status: Status,
    },
}

impl Response {
    /// The op this response answers.
    pub fn op(&self) -> Op {
        match self {
            Response::Add { .. } => Op::Add,
            Response::Read { .. } => Op::Read,
            Response::ReadLac { .. } => Op::ReadLac,
            Response::WriteLac { .. } => Op::WriteLac,
            Response::DeleteLedger { .. } => Op::DeleteLedger,
            Response::Failed { op, .. } => *op,
        }
    }

    /// Its status (`Ok` unless `Failed`).
    pub fn status(&self) -> Status {
        match self {
            Response::Failed { status, .. } => *status,
            _ => Status::Ok,
        }
    }
}

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

/// A decoded request with its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RequestFrame {
    /// Id to echo in the response.
    pub request_id: u64,
    /// The request.
    pub request: Request,
}

/// A decoded response with its id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseFrame {
    /// Id of the request answered.
    pub request_id: u64,
    /// The response.
    pub response: Response,
}

impl RawFrame {
    /// Decodes a request of `PROTOCOL_VERSION` (the caller answers other
    /// versions with `BAD_VERSION`, see `Op::from_byte`).
    pub fn into_request(self) -> Result<RequestFrame, ProtocolError> {
        if self.version != PROTOCOL_VERSION {
            return Err(ProtocolError::BadVersion {
                version: self.version,
            });
        }
        let op = Op::from_byte(self.op_byte).ok_or(ProtocolError::UnknownOp {
            op_byte: self.op_byte,
        })?;
        let flags = self.flags_or_status;
        let known_flags = match op {
            Op::Add => FLAG_RECOVERY,
            Op::Read => FLAG_FENCE,
            Op::ReadLac | Op::WriteLac | Op::DeleteLedger => 0,
        };
        if flags & !known_flags != 0 {
            return Err(ProtocolError::UnknownFlags { op, flags });
        }
        let mut body = self.body;
        let bad_body = ProtocolError::BadBody {
            op,
            len_bytes: body.len(),
        };
        let request = match op {
            Op::Add => Request::Add {
                mode: if flags & FLAG_RECOVERY != 0 {
                    AddMode::Recovery
                } else {
                    AddMode::Normal
                },
                entry: body,
            },
            Op::Read => {
                let [ledger_id, entry_id] = fixed_words(&mut body).ok_or(bad_body)?;
                let mode = if flags & FLAG_FENCE != 0 {
                    ReadMode::Fence
                } else {
                    ReadMode::Normal
                };
                Request::Read {
                    ledger_id,
                    entry_id,
                    mode,
                }
            }
            Op::ReadLac => {
                let [ledger_id] = fixed_words(&mut body).ok_or(bad_body)?;
                Request::ReadLac { ledger_id }
            }
            Op::WriteLac => {
                let [ledger_id, lac] = fixed_words(&mut body).ok_or(bad_body.clone())?;
                if lac == LAC_NONE {
                    return Err(bad_body);
                }
                Request::WriteLac { ledger_id, lac }
            }
            Op::DeleteLedger => {
                let [ledger_id] = fixed_words(&mut body).ok_or(bad_body)?;
                Request::DeleteLedger { ledger_id }
            }
        };
        Ok(RequestFrame {
            request_id: self.request_id,
            request,
        })
    }

    /// Decodes a response of `PROTOCOL_VERSION`.
    pub fn into_response(self) -> Result<ResponseFrame, ProtocolError> {
        if self.version != PROTOCOL_VERSION {
            return Err(ProtocolError::BadVersion {
                version: self.version,
            });
        }
        let unknown_op = ProtocolError::UnknownOp {
            op_byte: self.op_byte,
        };
        if self.op_byte & RESPONSE_OP_BIT == 0 {
            return Err(unknown_op);
        }
        let op = Op::from_byte(self.op_byte & !RESPONSE_OP_BIT).ok_or(unknown_op)?;
        let code = self.flags_or_status;
        let status = Status::from_code(code).ok_or(ProtocolError::UnknownStatus { code })?;
        let mut body = self.body;
        let bad_body = ProtocolError::BadBody {
            op,
            len_bytes: body.len(),
        };
        let response = if status != Status::Ok {
            if !body.is_empty() {
                return Err(bad_body);
            }
            Response::Failed { op, status }
        } else {
            match op {
                Op::Add => {
                    let [ledger_id, entry_id] = fixed_words(&mut body).ok_or(bad_body)?;
                    Response::Add {
                        ledger_id,
                        entry_id,
                    }
                }
                Op::Read => {
                    let [ledger_id, entry_id, lac] = leading_words(&mut body).ok_or(bad_body)?;
                    Response::Read {
                        ledger_id,
                        entry_id,
                        lac: lac_from_wire(lac),
                        entry: body,
                    }
                }
                Op::ReadLac => {
                    let [ledger_id, lac] = fixed_words(&mut body).ok_or(bad_body)?;
                    Response::ReadLac {
                        ledger_id,
                        lac: lac_from_wire(lac),
                    }
                }
                Op::WriteLac => {
                    let [ledger_id] = fixed_words(&mut body).ok_or(bad_body)?;
                    Response::WriteLac { ledger_id }
                }
                Op::DeleteLedger => {
                    let [ledger_id] = fixed_words(&mut body).ok_or(bad_body)?;
                    Response::DeleteLedger { ledger_id }
                }
            }
        };
        Ok(ResponseFrame {
            request_id: self.request_id,
            response,
        })
    }
}

/// Takes `N` big-endian u64s off the front of `body`; `None` if it is shorter.
fn leading_words<const N: usize>(body: &mut Bytes) -> Option<[u64; N]> {
    if body.len() < N * 8 {
        return None;
    }
    let mut words = [0u64; N];
    for word in &mut words {
        *word = body.get_u64();
    }
    Some(words)
}

/// Exactly `N` big-endian u64s: `None` if `body` has any other length.
fn fixed_words<const N: usize>(body: &mut Bytes) -> Option<[u64; N]> {
    if body.len() != N * 8 {
        return None;
    }
    leading_words(body)
}

fn lac_from_wire(lac: u64) -> Option<u64> {
    (lac != LAC_NONE).then_some(lac)
}

fn lac_to_wire(lac: Option<u64>) -> u64 {
    debug_assert!(lac != Some(LAC_NONE));
    lac.unwrap_or(LAC_NONE)
}

/// Appends the frame header; `body_bytes` is the length of the body that the
/// caller appends next.
fn put_header(
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

/// Appends one request frame to `dst`.
///
/// Panics if an ADD's entry is over `ENTRY_BYTES_MAX` (callers check sizes; the
/// client returns a typed error first).
pub fn encode_request(request_id: u64, request: &Request, dst: &mut BytesMut) {
    if let Some(entry) = encode_request_head(request_id, request, dst) {
        dst.put_slice(entry);
    }
}

/// Appends a request frame to `dst` except an ADD's entry, which it returns:
/// the caller sends those bytes right after (without copying them).
pub fn encode_request_head<'a>(
    request_id: u64,
    request: &'a Request,
    dst: &mut BytesMut,
) -> Option<&'a Bytes> {
    let op_byte = request.op() as u8;
    match request {
        Request::Add { mode, entry } => {
            assert!(entry.len() <= ENTRY_BYTES_MAX, "entry over ENTRY_BYTES_MAX");
            let flags = match mode {
                AddMode::Normal => 0,
                AddMode::Recovery => FLAG_RECOVERY,
            };
            put_header(dst, op_byte, flags, request_id, entry.len());
            return Some(entry);
        }
        Request::Read {
            ledger_id,
            entry_id,
            mode,
        } => {
            let flags = match mode {
                ReadMode::Normal => 0,
                ReadMode::Fence => FLAG_FENCE,
            };
            put_header(dst, op_byte, flags, request_id, 16);
            dst.put_u64(*ledger_id);
            dst.put_u64(*entry_id);
        }
        Request::ReadLac { ledger_id } | Request::DeleteLedger { ledger_id } => {
            put_header(dst, op_byte, 0, request_id, 8);
            dst.put_u64(*ledger_id);
        }
        Request::WriteLac { ledger_id, lac } => {
            assert!(*lac != LAC_NONE, "WRITE_LAC of the reserved u64::MAX");
            put_header(dst, op_byte, 0, request_id, 16);
            dst.put_u64(*ledger_id);
            dst.put_u64(*lac);
        }
    }
    None
}

/// Appends one response frame to `dst`.
pub fn encode_response(request_id: u64, response: &Response, dst: &mut BytesMut) {
    if let Some(entry) = encode_response_head(request_id, response, dst) {
        dst.put_slice(entry);
    }
}

/// Appends a response frame to `dst` except a READ's entry, which it returns:
/// the caller sends those bytes right after (without copying them).
pub fn encode_response_head<'a>(
    request_id: u64,
    response: &'a Response,
    dst: &mut BytesMut,
) -> Option<&'a Bytes> {
    let op_byte = response.op() as u8 | RESPONSE_OP_BIT;
    let status = response.status() as u16;
    match response {
        Response::Add {
            ledger_id,
            entry_id,
        } => {
            put_header(dst, op_byte, status, request_id, 16);
            dst.put_u64(*ledger_id);
            dst.put_u64(*entry_id);
        }
        Response::Read {
            ledger_id,
            entry_id,
            lac,
            entry,
        } => {
            put_header(dst, op_byte, status, request_id, 24 + entry.len());
            dst.put_u64(*ledger_id);
            dst.put_u64(*entry_id);
            dst.put_u64(lac_to_wire(*lac));
            return Some(entry);
        }
        Response::ReadLac { ledger_id, lac } => {
            put_header(dst, op_byte, status, request_id, 16);
            dst.put_u64(*ledger_id);
            dst.put_u64(lac_to_wire(*lac));
        }
        Response::WriteLac { ledger_id } | Response::DeleteLedger { ledger_id } => {
            put_header(dst, op_byte, status, request_id, 8);
            dst.put_u64(*ledger_id);
        }
        Response::Failed { status: failed, .. } => {
            debug_assert!(*failed != Status::Ok, "Failed with status OK");
            put_header(dst, op_byte, status, request_id, 0);
        }
    }
    None
}

/// Appends a `BAD_VERSION` answer to a frame of another version whose op byte
/// this version knows. Returns false (nothing appended) when it does not: then
/// the frame cannot be answered and the connection should be closed.
pub fn encode_bad_version(raw: &RawFrame, dst: &mut BytesMut) -> bool {
    match Op::from_byte(raw.op_byte) {
        Some(op) => {
            encode_response(
                raw.request_id,
                &Response::Failed {
                    op,
                    status: Status::BadVersion,
                },
                dst,
            );
            true
        }
        None => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

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
}
