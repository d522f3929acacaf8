//! The messages of the bookie protocol: requests and responses, their bodies,
//! and the codec between them and frames.
//!
//! Owns: `Request`, `Response`, `AddMode`, `ReadMode`, decoding a `RawFrame`'s
//! body (`RawFrame::into_request`, `RawFrame::into_response`) and encoding
//! whole frames (`encode_request`, `encode_response`, and the `_head` variants
//! that leave an entry for the caller to send by reference). Guarantees:
//! `encode_*` and `decode` are exact inverses; a body of the wrong size for its
//! op and status is a typed `ProtocolError::BadBody`, never a panic.
//! Never: interprets entries beyond their length (that is `entry`'s and the
//! bookie's job) or does I/O.

use bytes::{Buf, BufMut, Bytes, BytesMut};

use crate::entry::{ENTRY_BYTES_MAX, LAC_NONE};
use crate::frame::{
    FLAG_FENCE, FLAG_RECOVERY, Op, PROTOCOL_VERSION, ProtocolError, RESPONSE_OP_BIT, RawFrame,
    Status, put_header,
};

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
