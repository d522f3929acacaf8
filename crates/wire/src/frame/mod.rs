//! Pulsar frames: the incremental decoder (here) and the encoders
//! (`encode`).
//!
//! ```text
//! simple : [totalSize u32][commandSize u32][BaseCommand]
//! payload: [totalSize u32][commandSize u32][BaseCommand]
//!          [0x0e02 u16][brokerEntryMetadataSize u32][BrokerEntryMetadata]   optional, MESSAGE only
//!          [0x0e01 u16][CRC32C u32]                                          optional (producers < v6 omit it)
//!          [metadataSize u32][MessageMetadata][payload ... to the end of the frame]
//! ```
//! All integers are big-endian. totalSize counts every byte after itself. The
//! CRC32C covers everything after the checksum field (metadataSize, metadata
//! and payload). The *stored entry* is the bytes from the 0x0e01 magic to the
//! end of the frame, kept verbatim by the broker and re-sent behind a MESSAGE
//! command.
//!
//! Owns: frame layout, size limits, checksum verification, and the SEND fast
//! path (`decode_frame_body`): the usual SEND frame read into scalars and
//! built once, everything else and every error left to the general path,
//! which debug builds run beside it on each fast frame as a check.
//! Guarantees: decode never copies payload bytes (everything is a `Bytes`
//! slice of the frame), never allocates by an unchecked length, never panics
//! on peer bytes. Never does I/O and never interprets payloads (see `batch`,
//! `compression`).

use std::sync::OnceLock;

use bytes::{Buf, BufMut, Bytes, BytesMut};
use prost::Message;

use crate::command::{self, Command};
use crate::error::WireError;
use crate::metadata::{self, MetadataSummary};
use crate::proto::{BrokerEntryMetadata, MessageMetadata, base_command::Type};
use crate::send::{self, SendCommand};

mod encode;
#[cfg(test)]
mod tests;

pub use encode::{
    MessageFrameParts, build_stored_entry, encode_command, encode_message_frame,
    encode_message_header, encode_payload_frame, encode_payload_frame_with,
};

/// Pulsar's default `maxMessageSize` (5 MiB): the most metadata + payload a
/// client may send in one frame, announced in CONNECTED.max_message_size.
pub const MESSAGE_SIZE_MAX_DEFAULT_BYTES: usize = 5 * 1024 * 1024;

/// Room for the command, magic, checksum and sizes on top of the message
/// size: Pulsar's decoders accept maxMessageSize + 10 KiB.
pub const FRAME_HEADER_ROOM_BYTES: usize = 10 * 1024;

/// Default frame limit of [`FrameDecoder`]: 5 MiB + 10 KiB.
pub const FRAME_SIZE_MAX_DEFAULT_BYTES: usize =
    MESSAGE_SIZE_MAX_DEFAULT_BYTES + FRAME_HEADER_ROOM_BYTES;

/// Hard ceiling for any configured frame limit. Keeps every length we accept
/// far below the values whose first byte would be 0x0e (234+ MiB), so that a
/// metadataSize can never be mistaken for a magic number, and bounds the
/// buffer a single peer can make us hold.
pub const FRAME_SIZE_LIMIT_BYTES: usize = 128 * 1024 * 1024;

const _: () = assert!(FRAME_SIZE_MAX_DEFAULT_BYTES <= FRAME_SIZE_LIMIT_BYTES);
const _: () = assert!(FRAME_SIZE_LIMIT_BYTES < 0x0e00_0000);

/// Magic that introduces the CRC32C field.
pub const MAGIC_CRC32C: u16 = 0x0e01;
/// Magic that introduces broker entry metadata.
pub const MAGIC_BROKER_ENTRY_METADATA: u16 = 0x0e02;

/// Bytes of the totalSize field.
const TOTAL_SIZE_BYTES: usize = 4;
/// Bytes of the commandSize field.
const COMMAND_SIZE_BYTES: usize = 4;
/// Bytes of a magic number.
const MAGIC_BYTES: usize = 2;
/// Bytes of a magic + u32 (checksum or broker entry metadata size).
const MAGIC_AND_U32_BYTES: usize = MAGIC_BYTES + 4;
/// Bytes of the metadataSize field.
const METADATA_SIZE_BYTES: usize = 4;

/// One decoded frame: small (see `frame_stays_small` in the tests) because
/// the decoder returns one per SEND and the hot path moves it around.
#[derive(Debug, Clone)]
pub struct Frame {
    /// The command: SEND as a compact [`crate::SendCommand`], anything else
    /// as a boxed prost BaseCommand whose `type` is a known [`Type`] and whose
    /// sub-message is present (checked by the decoder).
    pub command: Command,
    /// The message part of SEND and MESSAGE frames; `None` for every other command.
    pub payload: Option<PayloadSection>,
}

impl Frame {
    /// The command type. `None` only if an `Other` command's `type` was
    /// changed to an unknown value after decoding.
    pub fn command_type(&self) -> Option<Type> {
        self.command.command_type()
    }
}

/// Whether a payload section carried a checksum. A present but wrong checksum
/// is never represented here: decoding fails with
/// [`WireError::ChecksumMismatch`] instead.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Checksum {
    /// 0x0e01 + CRC32C present and verified; the value as sent.
    Verified(u32),
    /// No 0x0e01 (producers that negotiated protocol < v6).
    Absent,
}

/// The message part of a payload frame, or a stored entry.
///
/// Holds one `Bytes` (the section, a slice of the frame) and offsets into it:
/// no payload copy, and accessors that return `Bytes` only bump a reference
/// count when called. The MessageMetadata's structure has been checked at
/// parse time (so [`PayloadSection::summary`] cannot fail); its fields are
/// read only when asked for, as the broker stores the entry without them.
#[derive(Debug, Clone)]
pub struct PayloadSection {
    /// From the optional 0x0e02 block to the end of the frame.
    section: Bytes,
    /// Boxed: only MESSAGE frames to clients that asked for it carry one.
    broker_entry_metadata: Option<Box<BrokerEntryMetadata>>,
    metadata: OnceLock<Box<MessageMetadata>>,
    /// The CRC32C as sent (verified) when `has_checksum`, else 0. Not a
    /// [`Checksum`] (8 bytes): these fields keep a SEND [`Frame`] within
    /// 128 bytes (see [`crate::SendCommand`]).
    checksum: u32,
    /// Offset of 0x0e01, or of metadataSize when there is no checksum; the
    /// metadata starts 4 bytes (metadataSize) after the 0x0e01 block.
    entry_start: u32,
    /// Offset one past the MessageMetadata bytes (start of the payload).
    metadata_end: u32,
    has_checksum: bool,
}

impl PayloadSection {
    /// Parses the bytes that follow a command: optional 0x0e02 block,
    /// optional 0x0e01 + CRC32C (verified), metadataSize, metadata, payload.
    /// Also parses a stored entry. `section` must be at most
    /// [`FRAME_SIZE_LIMIT_BYTES`] long (anything from a [`FrameDecoder`] is).
    /// On a checksum mismatch the error carries `command: None`; the frame
    /// decoder fills it in.
    pub fn parse(section: Bytes) -> Result<PayloadSection, WireError> {
        let layout = Layout::parse(&section, VerifyChecksum::Yes)?;
        metadata::check(&section[layout.metadata_start..layout.metadata_end])?;
        // All offsets are <= FRAME_SIZE_LIMIT_BYTES (checked by Layout), so they fit u32.
        Ok(PayloadSection {
            broker_entry_metadata: layout.broker_entry_metadata.map(Box::new),
            metadata: OnceLock::new(),
            checksum: layout.checksum.unwrap_or(0),
            entry_start: layout.entry_start as u32,
            metadata_end: layout.metadata_end as u32,
            has_checksum: layout.checksum.is_some(),
            section,
        })
    }

    /// Offset of the MessageMetadata bytes.
    fn metadata_start(&self) -> usize {
        let checksum_bytes = if self.has_checksum {
            MAGIC_AND_U32_BYTES
        } else {
            0
        };
        self.entry_start as usize + checksum_bytes + METADATA_SIZE_BYTES
    }

    /// The 0x0e02 block, if the frame had one.
    pub fn broker_entry_metadata(&self) -> Option<&BrokerEntryMetadata> {
        self.broker_entry_metadata.as_deref()
    }

    /// Whether a checksum was present (and then it was valid).
    pub fn checksum(&self) -> Checksum {
        if self.has_checksum {
            Checksum::Verified(self.checksum)
        } else {
            Checksum::Absent
        }
    }

    /// The raw MessageMetadata bytes, exactly as sent.
    pub fn metadata_slice(&self) -> &[u8] {
        &self.section[self.metadata_start()..self.metadata_end as usize]
    }

    /// The raw MessageMetadata bytes as `Bytes` (no copy).
    pub fn metadata_bytes(&self) -> Bytes {
        self.section
            .slice(self.metadata_start()..self.metadata_end as usize)
    }

    /// Metadata fields, scanned on each call without allocating (a few ns
    /// for typical metadata; keep the result when reading several fields).
    /// Spans in it index [`PayloadSection::metadata_slice`].
    pub fn summary(&self) -> MetadataSummary {
        let scanned = MetadataSummary::scan(self.metadata_slice());
        // `parse` checked these very bytes with the same scanner.
        debug_assert!(scanned.is_ok(), "{scanned:?}");
        scanned.unwrap_or_default()
    }

    /// The producer name from the metadata (raw bytes, UTF-8 not checked).
    pub fn producer_name(&self) -> Option<&[u8]> {
        self.summary()
            .producer_name
            .map(|span| span.get(self.metadata_slice()))
    }

    /// The partition key (the message key), if any.
    pub fn partition_key(&self) -> Option<&[u8]> {
        self.summary()
            .partition_key
            .map(|span| span.get(self.metadata_slice()))
    }

    /// The ordering key (wins over the partition key for Key_Shared), if any.
    pub fn ordering_key(&self) -> Option<&[u8]> {
        self.summary()
            .ordering_key
            .map(|span| span.get(self.metadata_slice()))
    }

    /// The fully decoded MessageMetadata, decoded on first call and cached.
    pub fn metadata(&self) -> Result<&MessageMetadata, WireError> {
        if let Some(metadata) = self.metadata.get() {
            return Ok(metadata);
        }
        let decoded = MessageMetadata::decode(self.metadata_bytes())
            .map_err(WireError::protobuf("MessageMetadata"))?;
        Ok(self.metadata.get_or_init(|| Box::new(decoded)))
    }

    /// The payload (possibly compressed, possibly a batch).
    pub fn payload_slice(&self) -> &[u8] {
        &self.section[self.metadata_end as usize..]
    }

    /// The payload as `Bytes` (no copy).
    pub fn payload(&self) -> Bytes {
        self.section.slice(self.metadata_end as usize..)
    }

    /// The entry bytes as received: from 0x0e01 to the end of the frame when
    /// the checksum was present, else from metadataSize to the end.
    pub fn entry_verbatim(&self) -> Bytes {
        self.section.slice(self.entry_start as usize..)
    }

    /// The entry to store: the verbatim bytes (no copy) when the frame had
    /// 0x0e01 + CRC32C, else a canonical copy with the magic and a computed
    /// CRC32C in front (the rare path for producers older than v6).
    pub fn stored_entry(&self) -> Bytes {
        if self.has_checksum {
            self.entry_verbatim()
        } else {
            self.canonical_entry()
        }
    }

    /// [`PayloadSection::stored_entry`] for a caller done with the section
    /// (the broker on SEND): the section's own handle is narrowed instead of
    /// cloned, which saves a reference-count increment and decrement.
    #[inline]
    pub fn into_stored_entry(self) -> Bytes {
        if self.has_checksum {
            let mut section = self.section;
            section.advance(self.entry_start as usize);
            section
        } else {
            self.canonical_entry()
        }
    }

    fn canonical_entry(&self) -> Bytes {
        let entry = &self.section[self.entry_start as usize..];
        let mut buf = BytesMut::with_capacity(MAGIC_AND_U32_BYTES + entry.len());
        buf.put_u16(MAGIC_CRC32C);
        buf.put_u32(crc32c::crc32c(entry));
        buf.extend_from_slice(entry);
        buf.freeze()
    }
}

/// A stored entry looked at without verifying its checksum, e.g. by a
/// dispatcher that needs the message count of an entry it read back from
/// storage (clients verify the CRC on delivery).
#[derive(Debug, Clone)]
pub struct EntryPeek<'a> {
    /// Metadata fields; spans index `metadata`.
    pub summary: MetadataSummary,
    /// The raw MessageMetadata bytes.
    pub metadata: &'a [u8],
    /// The payload.
    pub payload: &'a [u8],
    /// The CRC32C as stored (not verified), if the entry has 0x0e01.
    pub checksum: Option<u32>,
}

/// Reads a stored entry's layout and scans its metadata, without verifying
/// the checksum and without copying. Structural errors are still errors.
pub fn peek_entry(entry: &[u8]) -> Result<EntryPeek<'_>, WireError> {
    let layout = Layout::parse(entry, VerifyChecksum::No)?;
    let metadata = &entry[layout.metadata_start..layout.metadata_end];
    Ok(EntryPeek {
        summary: MetadataSummary::scan(metadata)?,
        metadata,
        payload: &entry[layout.metadata_end..],
        checksum: layout.checksum,
    })
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum VerifyChecksum {
    Yes,
    No,
}

/// Where the parts of a payload section are (offsets into the section). The
/// metadata bytes are the caller's to check (scan or validate).
#[derive(Debug)]
struct Layout {
    broker_entry_metadata: Option<BrokerEntryMetadata>,
    /// The checksum as sent, when 0x0e01 is present.
    checksum: Option<u32>,
    entry_start: usize,
    metadata_start: usize,
    metadata_end: usize,
}

impl Layout {
    fn parse(section: &[u8], verify: VerifyChecksum) -> Result<Layout, WireError> {
        if section.len() > FRAME_SIZE_LIMIT_BYTES {
            return Err(WireError::FrameTooLarge {
                frame_bytes: section.len() as u64,
                max_frame_bytes: FRAME_SIZE_LIMIT_BYTES,
            });
        }
        let mut offset = 0;
        let mut broker_entry_metadata = None;
        if peek_u16(section, offset) == Some(MAGIC_BROKER_ENTRY_METADATA) {
            let size = read_u32(section, offset + MAGIC_BYTES, "broker entry metadata size")?;
            offset += MAGIC_AND_U32_BYTES;
            let available_bytes = section.len() - offset;
            if size as usize > available_bytes {
                return Err(WireError::BrokerEntryMetadataSizeOutOfBounds {
                    size,
                    available_bytes,
                });
            }
            let end = offset + size as usize;
            let decoded = BrokerEntryMetadata::decode(&section[offset..end])
                .map_err(WireError::protobuf("BrokerEntryMetadata"))?;
            broker_entry_metadata = Some(decoded);
            offset = end;
        }

        let entry_start = offset;
        let checksum = match peek_u16(section, offset) {
            Some(MAGIC_CRC32C) => {
                let expected = read_u32(section, offset + MAGIC_BYTES, "checksum")?;
                offset += MAGIC_AND_U32_BYTES;
                if verify == VerifyChecksum::Yes {
                    let computed = crc32c::crc32c(&section[offset..]);
                    if computed != expected {
                        return Err(WireError::ChecksumMismatch {
                            command: None,
                            expected,
                            computed,
                        });
                    }
                }
                Some(expected)
            }
            Some(value) if value >> 8 == 0x0e => return Err(WireError::BadMagic { value }),
            _ => None,
        };

        let metadata_size = read_u32(section, offset, "metadata size")?;
        offset += METADATA_SIZE_BYTES;
        let available_bytes = section.len() - offset;
        if metadata_size as usize > available_bytes {
            return Err(WireError::MetadataSizeOutOfBounds {
                metadata_size,
                available_bytes,
            });
        }
        let metadata_end = offset + metadata_size as usize;
        Ok(Layout {
            broker_entry_metadata,
            checksum,
            entry_start,
            metadata_start: offset,
            metadata_end,
        })
    }
}

/// Incremental decoder over a byte stream (one per connection).
#[derive(Debug)]
pub struct FrameDecoder {
    max_frame_bytes: usize,
    poisoned: bool,
}

impl Default for FrameDecoder {
    fn default() -> Self {
        FrameDecoder::new(FRAME_SIZE_MAX_DEFAULT_BYTES)
    }
}

impl FrameDecoder {
    /// A decoder that rejects frames longer than `max_frame_bytes` (counting
    /// the totalSize field), clamped to [`FRAME_SIZE_LIMIT_BYTES`].
    pub fn new(max_frame_bytes: usize) -> Self {
        FrameDecoder {
            max_frame_bytes: max_frame_bytes.min(FRAME_SIZE_LIMIT_BYTES),
            poisoned: false,
        }
    }

    /// The frame limit in force.
    pub fn max_frame_bytes(&self) -> usize {
        self.max_frame_bytes
    }

    /// Changes the limit (a client learns it from CONNECTED.max_message_size).
    pub fn set_max_frame_bytes(&mut self, max_frame_bytes: usize) {
        self.max_frame_bytes = max_frame_bytes.min(FRAME_SIZE_LIMIT_BYTES);
    }

    /// Decodes the next frame from the front of `buf`.
    ///
    /// `Ok(None)`: the frame is not complete yet; `buf` is untouched except
    /// that its capacity grows to hold the announced frame (at most
    /// `max_frame_bytes`, so one connection can make its owner hold that
    /// much; the server bounds connections). `Ok(Some)`:
    /// the frame has been split off `buf` (no copy). `Err`: see
    /// [`WireError::is_stream_fatal`]; non-fatal errors have consumed the bad
    /// frame.
    pub fn decode(&mut self, buf: &mut BytesMut) -> Result<Option<Frame>, WireError> {
        if self.poisoned {
            return Err(WireError::Poisoned);
        }
        let Some(total_size) = peek_u32(buf, 0) else {
            return Ok(None);
        };
        let frame_bytes = TOTAL_SIZE_BYTES as u64 + u64::from(total_size);
        if frame_bytes > self.max_frame_bytes as u64 {
            self.poisoned = true;
            return Err(WireError::FrameTooLarge {
                frame_bytes,
                max_frame_bytes: self.max_frame_bytes,
            });
        }
        if (total_size as usize) < COMMAND_SIZE_BYTES {
            self.poisoned = true;
            return Err(WireError::FrameTooSmall { total_size });
        }
        let frame_bytes = frame_bytes as usize; // <= max_frame_bytes
        if buf.len() < frame_bytes {
            // Bounded by max_frame_bytes, checked above.
            buf.reserve(frame_bytes - buf.len());
            return Ok(None);
        }
        let frame = buf.split_to(frame_bytes).freeze();
        decode_frame_body(frame, Some)
    }
}

/// Decodes one complete frame (starting with totalSize) held in its own
/// buffer, e.g. a captured one, without copying it. The buffer must hold
/// exactly one frame: a shorter or longer buffer is an error.
pub fn decode_frame(frame: Bytes, max_frame_bytes: usize) -> Result<Frame, WireError> {
    let max_frame_bytes = max_frame_bytes.min(FRAME_SIZE_LIMIT_BYTES);
    let total_size = read_u32(&frame, 0, "total size")?;
    let frame_bytes = TOTAL_SIZE_BYTES as u64 + u64::from(total_size);
    if frame_bytes > max_frame_bytes as u64 {
        return Err(WireError::FrameTooLarge {
            frame_bytes,
            max_frame_bytes,
        });
    }
    if (total_size as usize) < COMMAND_SIZE_BYTES {
        return Err(WireError::FrameTooSmall { total_size });
    }
    if frame_bytes != frame.len() as u64 {
        return Err(WireError::FrameLengthMismatch {
            total_size,
            buffer_bytes: frame.len(),
        });
    }
    decode_frame_body(frame, |frame| frame)
}

/// Decodes a whole frame whose totalSize has been checked against
/// `frame.len()`, handing the frame to `wrap` (`Some` for the stream
/// decoder).
///
/// SEND, a broker's hot frame, takes a fast path: the command by the
/// scanner ([`scan_send_command`]), then the payload section by
/// [`scan_send_section`], each step yielding scalars, and the frame is built
/// once, by `wrap`, right in the caller's result. Why: the general path's
/// intermediate enums (`Result<Layout>`, `Result<PayloadSection>`, a
/// `Result<Frame>` then mapped to `Result<Option<Frame>>`) live in memory,
/// and reloading a value whose stores are still in flight stalls the CPU (no
/// store forwarding): on a 1 KiB SEND that cost as much as all the parsing.
/// Whatever the fast path does not handle it leaves to the general path,
/// which owns every error.
#[inline(always)]
fn decode_frame_body<T>(frame: Bytes, wrap: impl Fn(Frame) -> T) -> Result<T, WireError> {
    debug_assert!(frame.len() >= TOTAL_SIZE_BYTES + COMMAND_SIZE_BYTES);
    let Some((send, command_end)) = scan_send_command(&frame) else {
        return decode_frame_body_general(frame).map(wrap);
    };
    // Tests run with debug assertions: every frame the fast path decodes is
    // checked against the general path.
    #[cfg(debug_assertions)]
    let general = decode_frame_body_general(frame.clone());
    // Advanced now, long before the frame is built: `advance` is out of
    // line, and its stores must not be reloaded while still in flight.
    let mut section = frame;
    section.advance(command_end);
    let Some((checksum, metadata_size)) = scan_send_section(&section) else {
        return decode_payload_section(Command::Send(send), section).map(wrap);
    };
    let frame = Frame {
        command: Command::Send(send),
        payload: Some(PayloadSection {
            section,
            broker_entry_metadata: None,
            metadata: OnceLock::new(),
            checksum,
            entry_start: 0,
            // Below FRAME_SIZE_LIMIT_BYTES: no overflow.
            metadata_end: SEND_SECTION_METADATA_START as u32 + metadata_size,
            has_checksum: true,
        }),
    };
    #[cfg(debug_assertions)]
    check_same_as_general_path(&frame, general);
    Ok(wrap(frame))
}

/// The SEND command of a whole frame and where it ends, when the scanner
/// reads it and a payload section follows; `None` for anything else.
#[inline(always)]
fn scan_send_command(frame: &[u8]) -> Option<(SendCommand, usize)> {
    let command_size = peek_u32(frame, TOTAL_SIZE_BYTES)?;
    let command_start = TOTAL_SIZE_BYTES + COMMAND_SIZE_BYTES;
    let command_end = command_start.checked_add(command_size as usize)?;
    if command_end >= frame.len() {
        return None;
    }
    let send = send::scan_send(&frame[command_start..command_end])?;
    Some((send, command_end))
}

/// Offset of the metadata within a section that starts with 0x0e01 + CRC32C.
const SEND_SECTION_METADATA_START: usize = MAGIC_AND_U32_BYTES + METADATA_SIZE_BYTES;

/// Reads `[0x0e01][crc][metadataSize][metadata][payload]`: the checksum is
/// verified and the metadata checked as [`PayloadSection::parse`] checks
/// them. Returns (checksum, metadataSize), or `None` for anything else
/// (0x0e02, no checksum, a wrong checksum, a malformed part): the general
/// path then parses the section and reports the error.
#[inline(always)]
fn scan_send_section(section: &[u8]) -> Option<(u32, u32)> {
    if peek_u16(section, 0)? != MAGIC_CRC32C {
        return None;
    }
    let checksum = peek_u32(section, MAGIC_BYTES)?;
    let metadata_size = peek_u32(section, MAGIC_AND_U32_BYTES)?;
    let metadata_end = SEND_SECTION_METADATA_START.checked_add(metadata_size as usize)?;
    let metadata = section.get(SEND_SECTION_METADATA_START..metadata_end)?;
    if crc32c::crc32c(&section[MAGIC_AND_U32_BYTES..]) != checksum {
        return None;
    }
    if !metadata::is_well_formed(metadata) {
        return None;
    }
    Some((checksum, metadata_size))
}

/// Panics unless the general path decoded the frame to the same command and
/// payload section.
#[cfg(debug_assertions)]
fn check_same_as_general_path(fast: &Frame, general: Result<Frame, WireError>) {
    let general = match general {
        Ok(general) => general,
        Err(error) => {
            panic!("the SEND fast path accepted a frame the general path rejects: {error}")
        }
    };
    assert_eq!(fast.command, general.command);
    let (Some(fast), Some(general)) = (&fast.payload, &general.payload) else {
        panic!("a SEND frame without its payload section");
    };
    assert_eq!(
        fast.broker_entry_metadata(),
        general.broker_entry_metadata()
    );
    assert_eq!(fast.checksum(), general.checksum());
    assert_eq!(fast.entry_verbatim(), general.entry_verbatim());
    assert_eq!(fast.metadata_slice(), general.metadata_slice());
    assert_eq!(fast.payload_slice(), general.payload_slice());
}

/// The general path: every frame the fast path does not take, and every
/// error.
#[inline(never)]
fn decode_frame_body_general(frame: Bytes) -> Result<Frame, WireError> {
    let command_size = read_u32(&frame, TOTAL_SIZE_BYTES, "command size")?;
    let command_start = TOTAL_SIZE_BYTES + COMMAND_SIZE_BYTES;
    let available_bytes = frame.len() - command_start;
    if command_size as usize > available_bytes {
        return Err(WireError::CommandSizeOutOfBounds {
            command_size,
            available_bytes,
        });
    }
    let command_end = command_start + command_size as usize;
    let (command, command_type) = command::decode_command(&frame[command_start..command_end])?;

    let carries_payload = matches!(command_type, Type::Send | Type::Message);
    if command_end == frame.len() {
        if carries_payload {
            return Err(WireError::MissingPayload { command_type });
        }
        return Ok(Frame {
            command,
            payload: None,
        });
    }
    if !carries_payload {
        return Err(WireError::UnexpectedPayload { command_type });
    }
    // Advancing moves the start of the same handle: no reference-count traffic.
    let mut section = frame;
    section.advance(command_end);
    decode_payload_section(command, section)
}

/// The payload section behind `command` (SEND or MESSAGE), by the general
/// parser; a checksum mismatch names the command.
#[inline(never)]
fn decode_payload_section(command: Command, section: Bytes) -> Result<Frame, WireError> {
    match PayloadSection::parse(section) {
        Ok(section) => Ok(Frame {
            command,
            payload: Some(section),
        }),
        Err(WireError::ChecksumMismatch {
            command: None,
            expected,
            computed,
        }) => Err(WireError::ChecksumMismatch {
            command: Some(command),
            expected,
            computed,
        }),
        Err(error) => Err(error),
    }
}

fn peek_u16(bytes: &[u8], offset: usize) -> Option<u16> {
    let slice = bytes.get(offset..offset.checked_add(2)?)?;
    Some(u16::from_be_bytes([slice[0], slice[1]]))
}

fn peek_u32(bytes: &[u8], offset: usize) -> Option<u32> {
    let slice = bytes.get(offset..offset.checked_add(4)?)?;
    Some(u32::from_be_bytes([slice[0], slice[1], slice[2], slice[3]]))
}

fn read_u32(bytes: &[u8], offset: usize, field: &'static str) -> Result<u32, WireError> {
    peek_u32(bytes, offset).ok_or(WireError::Truncated {
        field,
        needed_bytes: 4,
        available_bytes: bytes.len().saturating_sub(offset),
    })
}
