//! Typed errors for frames read from a peer.
//!
//! Every malformed input maps to one variant; nothing in this crate panics on
//! peer bytes. The broker's policy per variant is in [`WireError::is_stream_fatal`]
//! and the variant docs.

use crate::command::Command;
use crate::proto::base_command::Type;

/// Why a frame could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum WireError {
    /// The frame's totalSize announces more than the decoder accepts. Detected
    /// from the first 4 bytes, before any of the frame is buffered.
    #[error("frame of {frame_bytes} bytes exceeds the limit of {max_frame_bytes} bytes")]
    FrameTooLarge {
        frame_bytes: u64,
        max_frame_bytes: usize,
    },

    /// totalSize is smaller than the 4-byte commandSize field it must contain.
    #[error("frame totalSize {total_size} cannot hold the 4-byte commandSize")]
    FrameTooSmall { total_size: u32 },

    /// [`crate::decode_frame`] was given a buffer whose length is not
    /// 4 + totalSize.
    #[error(
        "buffer of {buffer_bytes} bytes does not hold exactly one frame of totalSize {total_size}"
    )]
    FrameLengthMismatch {
        total_size: u32,
        buffer_bytes: usize,
    },

    /// commandSize points past the end of the frame.
    #[error("commandSize {command_size} exceeds the {available_bytes} bytes left in the frame")]
    CommandSizeOutOfBounds {
        command_size: u32,
        available_bytes: usize,
    },

    /// A fixed-size field (magic, checksum, a size) is cut off by the end of the frame.
    #[error("frame ends inside the {field} ({needed_bytes} bytes needed, {available_bytes} left)")]
    Truncated {
        field: &'static str,
        needed_bytes: usize,
        available_bytes: usize,
    },

    /// The 0x0e02 block's size points past the end of the frame.
    #[error("broker entry metadata size {size} exceeds the {available_bytes} bytes left")]
    BrokerEntryMetadataSizeOutOfBounds { size: u32, available_bytes: usize },

    /// metadataSize points past the end of the frame.
    #[error("metadataSize {metadata_size} exceeds the {available_bytes} bytes left in the frame")]
    MetadataSizeOutOfBounds {
        metadata_size: u32,
        available_bytes: usize,
    },

    /// Two bytes that look like a magic number (0x0eXX) but are neither
    /// 0x0e01 (checksum) nor 0x0e02 (broker entry metadata).
    #[error("unknown magic 0x{value:04x} after the command")]
    BadMagic { value: u16 },

    /// The CRC32C over metadataSize + metadata + payload does not match the
    /// frame's checksum field. The frame has been consumed and the stream is
    /// still in sync: the broker answers SEND_ERROR(ChecksumError) using the
    /// command (when the error came from a whole frame) and keeps reading.
    #[error("checksum mismatch: frame says 0x{expected:08x}, computed 0x{computed:08x}")]
    ChecksumMismatch {
        command: Option<Command>,
        expected: u32,
        computed: u32,
    },

    /// Protobuf bytes that do not decode (`what` names the message).
    #[error("undecodable {what}: {source}")]
    Protobuf {
        what: &'static str,
        #[source]
        source: prost::DecodeError,
    },

    /// Hand-parsed protobuf (the metadata scan) that is malformed.
    #[error("malformed {what}: {reason}")]
    MalformedProtobuf {
        what: &'static str,
        reason: &'static str,
    },

    /// BaseCommand.type holds a value this codec does not know.
    #[error("unknown command type {value}")]
    UnknownCommandType { value: i32 },

    /// BaseCommand.type names a command whose sub-message is absent.
    #[error("{command_type:?} command without its sub-message")]
    MissingCommandBody { command_type: Type },

    /// SEND or MESSAGE without a payload section.
    #[error("{command_type:?} command without a payload")]
    MissingPayload { command_type: Type },

    /// A payload section after a command that never carries one.
    #[error("{command_type:?} command followed by a payload")]
    UnexpectedPayload { command_type: Type },

    /// A previous error left the byte stream at an unknown position; the
    /// connection must be closed.
    #[error("the frame stream is unusable after an earlier error")]
    Poisoned,
}

impl WireError {
    /// True when the byte stream cannot continue after this error (the frame
    /// boundary is lost): the connection must be closed. For all other errors
    /// the bad frame has been consumed and the next `decode` reads the next
    /// frame; whether to go on is the caller's policy (the broker continues
    /// only after [`WireError::ChecksumMismatch`]).
    pub fn is_stream_fatal(&self) -> bool {
        matches!(
            self,
            WireError::FrameTooLarge { .. } | WireError::FrameTooSmall { .. } | WireError::Poisoned
        )
    }

    pub(crate) fn protobuf(what: &'static str) -> impl FnOnce(prost::DecodeError) -> WireError {
        move |source| WireError::Protobuf { what, source }
    }
}
