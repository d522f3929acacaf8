//! The broker's narrow seam onto `vela-wire`: frames in, frames out, and the
//! few facts the broker reads from a stored entry's metadata.
//!
//! Owns: the shape of an inbound frame as the connection sees it ([`Inbound`])
//! and of an outbound frame ([`Outbound`], a list of `Bytes` written with one
//! vectored write, so a stored entry is never copied into a MESSAGE frame).
//! Never: does I/O, or rewrites the bytes of a stored entry.

use bytes::{BufMut, Bytes, BytesMut};
use prost::Message as _;
use vela_wire::Command;
use vela_wire::proto::{self, BaseCommand};

/// Why an inbound frame could not be used.
#[derive(Debug, thiserror::Error)]
pub(crate) enum FrameError {
    /// The frame is unusable (too large, malformed, unknown command): the
    /// connection closes.
    #[error(transparent)]
    Wire(vela_wire::WireError),
    /// The CRC32C of a SEND does not match; the frame was consumed and the
    /// stream is still in sync.
    #[error("checksum mismatch")]
    ChecksumMismatch {
        /// The command of the bad frame.
        command: Command,
    },
}

/// One decoded frame from a client.
#[derive(Debug)]
pub(crate) struct Inbound {
    /// The command: SEND compact, the rest as prost's BaseCommand.
    pub(crate) command: Command,
    /// For SEND: the stored entry (0x0e01, CRC32C, metadataSize, metadata,
    /// payload), a zero-copy slice of the read buffer when the client sent a
    /// checksum.
    pub(crate) entry: Option<Bytes>,
    /// Size of the whole frame in bytes (including the 4-byte length).
    pub(crate) frame_bytes: usize,
}

/// Incremental frame decoder over a connection's read buffer (wire's
/// `FrameDecoder`).
#[derive(Debug)]
pub(crate) struct Decoder {
    inner: vela_wire::FrameDecoder,
}

impl Decoder {
    /// A decoder refusing frames larger than `max_frame_bytes`.
    pub(crate) fn new(max_frame_bytes: usize) -> Decoder {
        Decoder {
            inner: vela_wire::FrameDecoder::new(max_frame_bytes),
        }
    }

    /// Decodes the next whole frame from `buf`, or `Ok(None)` when more bytes
    /// are needed.
    pub(crate) fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Inbound>, FrameError> {
        let before = buf.len();
        match self.inner.decode(buf) {
            Ok(Some(frame)) => {
                let frame_bytes = before - buf.len();
                Ok(Some(Inbound {
                    command: frame.command,
                    entry: frame.payload.map(|p| p.into_stored_entry()),
                    frame_bytes,
                }))
            }
            Ok(None) => Ok(None),
            Err(vela_wire::WireError::ChecksumMismatch {
                command: Some(command),
                ..
            }) => Err(FrameError::ChecksumMismatch { command }),
            Err(e) => Err(FrameError::Wire(e)),
        }
    }
}

/// An outbound frame: one or two buffers (header, then a stored entry).
#[derive(Debug)]
pub(crate) enum Outbound {
    /// A simple command frame.
    Simple(Bytes),
    /// A MESSAGE: `[totalSize][cmdSize][CommandMessage]` then the stored entry.
    Message {
        /// Size prefix and command.
        header: Bytes,
        /// The stored entry (the log caches its own copy for active readers).
        entry: Bytes,
    },
    /// A MESSAGE of a non-persistent topic: its bytes count against the
    /// in-flight budgets until the writer has written it.
    Charged {
        /// Size prefix and command.
        header: Bytes,
        /// The entry as its producer sent it.
        entry: Bytes,
        /// Given back once written (or dropped unwritten).
        charge: crate::inflight::Charge,
    },
    /// A SEND_RECEIPT; its publish latency is recorded once it is written.
    Receipt {
        /// The SEND_RECEIPT frame.
        frame: Bytes,
        /// When its SEND arrived, and where the latency goes.
        timing: crate::metrics::PublishTiming,
    },
}

/// Encodes a simple command frame.
pub(crate) fn encode_command(command: impl Into<BaseCommand>) -> Outbound {
    let command: BaseCommand = command.into();
    let command_size = command.encoded_len();
    let mut buf = BytesMut::with_capacity(8 + command_size);
    buf.put_u32((4 + command_size) as u32);
    buf.put_u32(command_size as u32);
    // Encoding into a buffer with enough capacity cannot fail.
    let _ = command.encode(&mut buf);
    Outbound::Simple(buf.freeze())
}

/// Encodes a MESSAGE frame around a stored entry without copying the entry.
pub(crate) fn encode_message(message: proto::CommandMessage, entry: Bytes) -> Outbound {
    let command: BaseCommand = message.into();
    let command_size = command.encoded_len();
    let mut header = BytesMut::with_capacity(8 + command_size);
    header.put_u32((4 + command_size + entry.len()) as u32);
    header.put_u32(command_size as u32);
    let _ = command.encode(&mut header);
    Outbound::Message {
        header: header.freeze(),
        entry,
    }
}

/// The size prefix and command of a MESSAGE frame around `entry_bytes`.
pub(crate) fn message_header(message: proto::CommandMessage, entry_bytes: usize) -> Bytes {
    let command: BaseCommand = message.into();
    let command_size = command.encoded_len();
    let mut header = BytesMut::with_capacity(8 + command_size);
    header.put_u32((4 + command_size + entry_bytes) as u32);
    header.put_u32(command_size as u32);
    let _ = command.encode(&mut header);
    header.freeze()
}

/// Decodes the MessageMetadata of a stored entry (`None` if malformed; the
/// entry was checked when it was received, so this means a bug or a bad disk).
pub(crate) fn entry_metadata(entry: &Bytes) -> Option<proto::MessageMetadata> {
    if entry.len() < 10 {
        return None;
    }
    let size = u32::from_be_bytes([entry[6], entry[7], entry[8], entry[9]]) as usize;
    if size > entry.len() - 10 {
        return None;
    }
    proto::MessageMetadata::decode(entry.slice(10..10 + size)).ok()
}

/// The property a replicated message carries: its position in the source
/// cluster's log, `ledger:entry` (Pulsar's name).
pub(crate) const REPL_SOURCE_POSITION_PROPERTY: &str = "__MSG_PROP_REPL_SOURCE_POSITION";

/// A stored entry's MessageMetadata and payload (a slice of the entry, no
/// copy); `None` if malformed.
pub(crate) fn split_entry(entry: &Bytes) -> Option<(proto::MessageMetadata, Bytes)> {
    let metadata = entry_metadata(entry)?;
    let size = u32::from_be_bytes(entry.get(6..10)?.try_into().ok()?) as usize;
    let payload = entry.slice(10usize.checked_add(size)?..);
    Some((metadata, payload))
}

/// Where a replicated entry came from: the cluster (`replicated_from`) and
/// its position there (the `__MSG_PROP_REPL_SOURCE_POSITION` property,
/// `ledger:entry`); `None` for entries produced here or without a
/// readable position.
pub(crate) fn entry_replication_source(entry: &[u8]) -> Option<(String, u64, u64)> {
    let metadata = proto::MessageMetadata::decode(metadata_slice(entry)?).ok()?;
    let from = metadata.replicated_from?;
    let position = metadata
        .properties
        .iter()
        .find(|p| p.key == REPL_SOURCE_POSITION_PROPERTY)?;
    let (ledger_id, entry_id) = position.value.split_once(':')?;
    Some((from, ledger_id.parse().ok()?, entry_id.parse().ok()?))
}

fn metadata_slice(entry: &[u8]) -> Option<&[u8]> {
    let size_bytes: [u8; 4] = entry.get(6..10)?.try_into().ok()?;
    let size = u32::from_be_bytes(size_bytes) as usize;
    entry.get(10..10usize.checked_add(size)?)
}

/// Messages in a stored entry (`num_messages_in_batch`, 1 when absent or
/// unreadable), scanned without allocating: what a delivery costs in permits.
pub(crate) fn entry_message_count(entry: &[u8]) -> u32 {
    metadata_slice(entry)
        .and_then(|m| vela_wire::MetadataSummary::scan(m).ok())
        .and_then(|s| s.num_messages_in_batch)
        .map_or(1, |n| u32::try_from(n).unwrap_or(1).max(1))
}

/// A stored entry's `marker_type` (a marker the broker wrote: never
/// delivered), scanned without allocating; `None` for a message.
pub(crate) fn entry_marker_type(entry: &[u8]) -> Option<i32> {
    metadata_slice(entry)
        .and_then(|m| vela_wire::MetadataSummary::scan(m).ok())
        .and_then(|s| s.marker_type)
}

/// Absolute delivery time of a stored entry in ms (`deliver_at_time`), if set.
pub(crate) fn entry_deliver_at_ms(entry: &[u8]) -> Option<u64> {
    metadata_slice(entry)
        .and_then(|m| vela_wire::MetadataSummary::scan(m).ok())
        .and_then(|s| s.deliver_at_time_ms)
        .and_then(|t| u64::try_from(t).ok())
}

/// Producer name and highest sequence id of a stored entry (for the
/// deduplication table); `None` when unreadable.
pub(crate) fn entry_producer_sequence(entry: &[u8]) -> Option<(String, i64)> {
    let metadata = metadata_slice(entry)?;
    let summary = vela_wire::MetadataSummary::scan(metadata).ok()?;
    let name = std::str::from_utf8(summary.producer_name?.get(metadata)).ok()?;
    let sequence_id = summary.sequence_id?;
    let highest = summary.highest_sequence_id.unwrap_or(0).max(sequence_id);
    Some((name.to_string(), i64::try_from(highest).ok()?))
}

/// Publish time of a stored entry in ms (0 when unreadable).
pub(crate) fn entry_publish_time_ms(entry: &[u8]) -> u64 {
    metadata_slice(entry)
        .and_then(|m| vela_wire::MetadataSummary::scan(m).ok())
        .and_then(|s| s.publish_time_ms)
        .unwrap_or(0)
}
