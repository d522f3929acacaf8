//! vela-wire: the Pulsar binary protocol codec.
//!
//! Owns: our own `proto/pulsar.proto` (compiled by prost into [`proto`]), the
//! frame layout and its incremental decoder ([`FrameDecoder`]), CRC32C
//! checksums, the encoders for simple, payload and MESSAGE frames, the batch
//! format ([`batch`]) and the compression codecs ([`compression`]).
//!
//! Guarantees: bytes from a peer are input, never trusted. Every malformed
//! frame is a typed [`WireError`] (no panic, no allocation sized by an
//! unchecked length); decoding hands out `Bytes` slices of the read buffer and
//! never copies payloads.
//!
//! Never does: I/O (no sockets, files or async), protocol state (which command
//! is allowed when, version negotiation), or anything about topics, storage
//! or dispatch.
//!
//! Map:
//! - `frame`: [`FrameDecoder`] (stream -> [`Frame`]), [`PayloadSection`]
//!   (checksum, metadata, payload, stored entry), size limits; the encoders
//!   in `frame::encode`.
//! - `command`: [`Command`] (a frame's command: [`SendCommand`] or a boxed
//!   prost BaseCommand), `From<CommandX> for BaseCommand`, the type <->
//!   sub-message table.
//! - `send`: [`SendCommand`] and the scanner that reads SEND (the hot
//!   command) from the bytes, leaving anything unusual to prost.
//! - `metadata`: [`MetadataSummary`], an allocation-free scan of the
//!   MessageMetadata fields the broker reads per message.
//! - `batch`, `compression`: the batch payload format and the five codecs.
//! - `hash`: the key hash (partition routing, Key_Shared slots).
//!
//! Error policy for a server: after [`WireError::ChecksumMismatch`] answer
//! SEND_ERROR(ChecksumError) with the command it carries and keep reading;
//! after any other error close the connection (the frame has been consumed,
//! but a peer that sends malformed frames is not worth keeping).

pub mod batch;
pub mod command;
pub mod compression;
mod error;
pub mod frame;
pub mod hash;
pub mod metadata;
mod send;

/// Prost types generated from `proto/pulsar.proto` (package `pulsar.proto`).
/// Sub-messages of `BaseCommand` are boxed; build a command with
/// `BaseCommand::from(proto::CommandPing {})`, which sets `type` too.
#[allow(
    missing_docs,
    clippy::all,
    clippy::pedantic,
    unreachable_pub,
    missing_debug_implementations
)]
pub mod proto {
    include!(concat!(env!("OUT_DIR"), "/pulsar.proto.rs"));
}

pub use command::Command;
pub use error::WireError;
pub use frame::{
    Checksum, EntryPeek, FRAME_HEADER_ROOM_BYTES, FRAME_SIZE_LIMIT_BYTES,
    FRAME_SIZE_MAX_DEFAULT_BYTES, Frame, FrameDecoder, MESSAGE_SIZE_MAX_DEFAULT_BYTES,
    MessageFrameParts, PayloadSection, build_stored_entry, decode_frame, encode_command,
    encode_message_frame, encode_message_header, encode_payload_frame, encode_payload_frame_with,
    peek_entry,
};
pub use metadata::{ByteSpan, MetadataSummary};
pub use send::SendCommand;
