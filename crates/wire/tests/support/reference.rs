//! The reference decoder the SEND fast path is checked against, shared by
//! `tests/send_fast_path.rs` and the `frame_decoder` fuzz target: prost for
//! the command, `PayloadSection::parse` for the rest, with the frame rules
//! (command size, type, body, payload presence) spelled out again rather
//! than taken from the decoder under test.

use bytes::Bytes;
use prost::Message;
use vela_wire::command::{command_type, has_body};
use vela_wire::proto::{BaseCommand, base_command::Type};
use vela_wire::{Command, Frame, PayloadSection, WireError};

/// Decodes one whole frame the reference way.
pub(crate) fn reference_decode(frame: &[u8]) -> Result<Frame, WireError> {
    let command_size = u32::from_be_bytes(frame[4..8].try_into().expect("4 bytes"));
    let available_bytes = frame.len() - 8;
    if command_size as usize > available_bytes {
        return Err(WireError::CommandSizeOutOfBounds {
            command_size,
            available_bytes,
        });
    }
    let command_end = 8 + command_size as usize;
    let command =
        BaseCommand::decode(&frame[8..command_end]).map_err(|source| WireError::Protobuf {
            what: "BaseCommand",
            source,
        })?;
    let Some(kind) = command_type(&command) else {
        return Err(WireError::UnknownCommandType {
            value: command.r#type,
        });
    };
    if !has_body(&command, kind) {
        return Err(WireError::MissingCommandBody { command_type: kind });
    }
    let carries_payload = matches!(kind, Type::Send | Type::Message);
    let command = Command::from(command);
    if command_end == frame.len() {
        if carries_payload {
            return Err(WireError::MissingPayload { command_type: kind });
        }
        return Ok(Frame {
            command,
            payload: None,
        });
    }
    if !carries_payload {
        return Err(WireError::UnexpectedPayload { command_type: kind });
    }
    match PayloadSection::parse(Bytes::copy_from_slice(&frame[command_end..])) {
        Ok(section) => Ok(Frame {
            command,
            payload: Some(section),
        }),
        Err(WireError::ChecksumMismatch {
            expected, computed, ..
        }) => Err(WireError::ChecksumMismatch {
            command: Some(command),
            expected,
            computed,
        }),
        Err(error) => Err(error),
    }
}

/// What two payload sections must agree on.
pub(crate) fn section_view(section: &PayloadSection) -> impl PartialEq + std::fmt::Debug {
    (
        section.broker_entry_metadata().cloned(),
        section.checksum(),
        section.entry_verbatim(),
        section.stored_entry(),
        section.metadata_bytes(),
        section.payload(),
        section.summary(),
    )
}
