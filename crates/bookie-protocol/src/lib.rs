//! vela-bookie-protocol: everything a ledger client and a bookie exchange,
//! and nothing of either side's state.
//!
//! - `entry`: the packaged entry (header, CRC32C, payload) that a ledger
//!   client builds and every bookie journals, stores and returns verbatim;
//! - `frame` and `message` (re-exported here): Vela's own binary, versioned,
//!   length-prefixed protocol, pipelined with request ids: `Op`, `Status`,
//!   `Request`, `Response`, `AddMode`, `ReadMode` and their codec;
//! - `FrameQueue`: encoded frames waiting for a socket, shared by the
//!   client's and the server's writer tasks;
//! - `client`: `BookieClient`, the async client of one bookie over TCP or TLS;
//! - `BookieError`: what one request to one bookie can end in, over any
//!   transport, with the one mapping from the protocol's status codes.
//!
//! Both sides depend on this crate: the storage node (`vela-bookie`, which
//! serves the protocol) and the ledger client (`vela-ledger`, which speaks it).
//! Neither depends on the other.
//!
//! Never: stores anything, knows of journals, ledger storage, ledger metadata,
//! quorums or Pulsar; panics on bytes from a peer.

pub mod client;
pub mod entry;
mod error;
mod frame;
mod message;
mod queue;

#[cfg(test)]
mod tests;

pub use error::BookieError;
pub use frame::{
    FLAG_FENCE, FLAG_RECOVERY, FRAME_BYTES_MAX, FRAME_HEADER_BYTES, LAST_ENTRY, Op,
    PROTOCOL_VERSION, ProtocolError, RESPONSE_OP_BIT, RawFrame, Status, decode_frame,
};
pub use message::{
    AddMode, ReadMode, Request, RequestFrame, Response, ResponseFrame, encode_bad_version,
    encode_request, encode_request_head, encode_response, encode_response_head,
};
pub use queue::FrameQueue;
