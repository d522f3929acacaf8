//! Entry logs: append-only files of entry records (layout in `format`).
//!
//! Owns: the one active log being appended to (`EntryLogWriter`, used only by
//! the thread holding the storage's flush lock) and the cache of open read-only
//! handles (`LogReaders`, any thread, positional reads only).
//!
//! Two ways of writing, chosen per ledger dir when storage opens:
//! - O_DIRECT (`direct`, where the filesystem takes it): the writer gathers
//!   records in its own reused, 4 KiB-aligned buffer and writes whole blocks
//!   straight to the device, keeping the unaligned tail for the next write. No
//!   page cache is filled (on a VM each fresh page costs a fault: the buffered
//!   copy took a third of both CPUs under a batched publish load) and no dirty
//!   pages are left for write-back to push in front of the journal's
//!   `fdatasync`. `sync()` pads the tail with zeros to a block boundary, so the
//!   next record starts aligned and no written byte is ever rewritten; in this
//!   mode records start at the first block after the header.
//! - Buffered: the writer `pwrite`s `WRITE_BUFFER_BYTES` at a time, and every
//!   `writeback_step_bytes` asks the kernel to start writing the just-written
//!   range (`sync_file_range(WRITE)`) and waits for the range before it. Dirty
//!   page cache from one flush therefore stays near two steps instead of the
//!   whole flush, so the journal's `fdatasync` never queues behind a
//!   multi-hundred-MiB write-back burst (seeds: 3 GB flush bursts took the
//!   journal's fdatasync from <1 ms to 15-22 ms).
//!
//! Either way `sync()` ends every flush with fdatasync: that, not the writes or
//! the steps, is what makes the data durable.
//!
//! Never: rewrites a byte once written, reads through the writer, keeps more than
//! `LOG_READERS_OPEN_MAX` read handles.

use std::collections::HashMap;
use std::fs::File;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use parking_lot::Mutex;

use super::error::StorageError;
use super::format::{self, ENTRY_LOG_HEADER_BYTES};
use super::fs::{self, RangeSync};
use crate::direct_io::{AlignedBuf, DIRECT_IO_ALIGNMENT_BYTES};

/// Bytes gathered before one `pwrite`: large enough that syscalls cost little
/// next to the copy, small enough to stay cache-friendly.
const WRITE_BUFFER_BYTES: usize = 1024 * 1024;

/// O_DIRECT writes of a flush that is keeping up go out in pieces of this size:
/// the device works through each write whole, so a journal write issued
/// meanwhile waits behind up to one piece (a 1 MiB write takes ~350 µs here).
/// Bookie bench, depth-1 1 KiB adds while storage flushes, 4 runs each: journal
/// write p99.9 237-361 µs (1 MiB writes: 461-567), fdatasync p99.9 320-530 µs
/// (620-663). Pieces cost flush bandwidth, which is why a flush that falls
/// behind writes whole buffers again (`FlushPace::CatchUp`).
const YIELDING_WRITE_PIECE_BYTES: usize = 256 * 1024;
const _: () = assert!(YIELDING_WRITE_PIECE_BYTES.is_multiple_of(DIRECT_IO_ALIGNMENT_BYTES));
const _: () = assert!(YIELDING_WRITE_PIECE_BYTES <= WRITE_BUFFER_BYTES);

/// How an O_DIRECT flush shares the device with the journal (buffered writes
/// ignore it: their write-back is paced by `writeback_step_bytes`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlushPace {
    /// Writes of `YIELDING_WRITE_PIECE_BYTES`, so the journal's writes (the
    /// latency users see) wait behind less.
    Yield,
    /// Whole buffers: adds are piling up in the write cache behind this
    /// write-out (`LedgerStorage::flush_pace`), and a slower one would hold
    /// them back.
    CatchUp,
}

/// Open read handles kept at once (one fd per log). 1 GiB logs make 256 handles
/// cover 256 GiB of hot data; beyond that an arbitrary handle is closed.
const LOG_READERS_OPEN_MAX: usize = 256;

/// The active entry log.
#[derive(Debug)]
pub(crate) struct EntryLogWriter {
    dir: PathBuf,
    log_id: u64,
    path: PathBuf,
    /// Opened with O_DIRECT when `direct`.
    file: File,
    direct: bool,
    /// Offset of the first record (the header's size, or a whole block when
    /// `direct`): a log holding records is longer than this.
    records_offset: u64,
    /// File offset where `buf` starts (everything before is `pwrite`n; a block
    /// boundary when `direct`).
    buf_offset: u64,
    buf: AlignedBuf,
    /// Start of the range not yet handed to the kernel for write-back.
    writeback_offset: u64,
    /// The range handed over last, waited for at the next step.
    writeback_pending: Option<(u64, u64)>,
    writeback_step_bytes: u64,
    size_max_bytes: u64,
}

impl EntryLogWriter {
    /// Creates log `log_id` in `dir` durably (header fdatasync'ed, dir synced);
    /// `direct`: later writes use O_DIRECT (the caller probed the filesystem).
    pub(crate) fn create(
        dir: &Path,
        log_id: u64,
        direct: bool,
        writeback_step_bytes: u64,
        size_max_bytes: u64,
    ) -> Result<EntryLogWriter, StorageError> {
        let path = dir.join(format::entry_log_file_name(log_id));
        let buffered = fs::create_durable(&path, &format::encode_entry_log_header(log_id))?;
        let (file, records_offset) = if direct {
            let file = std::fs::OpenOptions::new()
                .write(true)
                .custom_flags(libc::O_DIRECT)
                .open(&path)
                .map_err(|e| StorageError::io("open O_DIRECT", &path, e))?;
            (file, DIRECT_IO_ALIGNMENT_BYTES as u64)
        } else {
            (buffered, ENTRY_LOG_HEADER_BYTES)
        };
        Ok(EntryLogWriter {
            dir: dir.to_path_buf(),
            log_id,
            path,
            file,
            direct,
            records_offset,
            buf_offset: records_offset,
            buf: AlignedBuf::with_capacity(WRITE_BUFFER_BYTES, DIRECT_IO_ALIGNMENT_BYTES),
            writeback_offset: records_offset,
            writeback_pending: None,
            writeback_step_bytes,
            size_max_bytes,
        })
    }

    pub(crate) fn log_id(&self) -> u64 {
        self.log_id
    }

    /// Logical size: header plus every record appended (buffered or not), plus
    /// the padding of earlier `sync`s when `direct`.
    pub(crate) fn size_bytes(&self) -> u64 {
        self.buf_offset + self.buf.len() as u64
    }

    /// Whether a record of `record_bytes` would push this log past its size limit
    /// (an empty log always takes one record).
    pub(crate) fn is_full_for(&self, record_bytes: u64) -> bool {
        self.size_bytes() > self.records_offset
            && self.size_bytes() + record_bytes > self.size_max_bytes
    }

    /// Appends one record; returns its offset in this log. `pace`: how a
    /// buffer write this append triggers shares the device.
    pub(crate) fn append(
        &mut self,
        ledger_id: u64,
        entry_id: u64,
        payload: &[u8],
        pace: FlushPace,
    ) -> Result<u64, StorageError> {
        let offset = self.size_bytes();
        self.buf
            .extend_from_slice(&format::encode_record_header(ledger_id, entry_id, payload));
        self.buf.extend_from_slice(payload);
        if self.buf.len() >= WRITE_BUFFER_BYTES {
            self.write_buffer(false, pace)?;
        }
        Ok(offset)
    }

    /// `pwrite`s the buffer (whole blocks only when `direct`, unless `pad`) and
    /// takes a write-back step if one is due.
    fn write_buffer(&mut self, pad: bool, pace: FlushPace) -> Result<(), StorageError> {
        if self.direct && pad {
            self.buf.pad_to_alignment();
        }
        let write_bytes = if self.direct {
            self.buf.len() / DIRECT_IO_ALIGNMENT_BYTES * DIRECT_IO_ALIGNMENT_BYTES
        } else {
            self.buf.len()
        };
        if write_bytes == 0 {
            return Ok(());
        }
        debug_assert!(
            !self.direct
                || self
                    .buf_offset
                    .is_multiple_of(DIRECT_IO_ALIGNMENT_BYTES as u64)
        );
        let piece_bytes = match pace {
            FlushPace::Yield if self.direct => YIELDING_WRITE_PIECE_BYTES,
            FlushPace::Yield | FlushPace::CatchUp => write_bytes,
        };
        let mut offset = self.buf_offset;
        for piece in self.buf.as_slice()[..write_bytes].chunks(piece_bytes) {
            self.file
                .write_all_at(piece, offset)
                .map_err(|e| StorageError::io("pwrite", &self.path, e))?;
            offset += piece.len() as u64;
        }
        self.buf_offset += write_bytes as u64;
        self.buf.consume_front(write_bytes);
        if self.direct {
            // Nothing sits in the page cache: no write-back to pace.
            self.writeback_offset = self.buf_offset;
            return Ok(());
        }
        if self.writeback_step_bytes > 0
            && self.buf_offset - self.writeback_offset >= self.writeback_step_bytes
        {
            self.writeback_step()?;
        }
        Ok(())
    }

    /// Starts write-back of [writeback_offset, buf_offset) and waits for the
    /// range started at the previous step.
    fn writeback_step(&mut self) -> Result<(), StorageError> {
        let start = self.writeback_offset;
        let len = self.buf_offset - start;
        fs::sync_range(&self.file, &self.path, start, len, RangeSync::StartWrite)?;
        if let Some((prev_start, prev_len)) = self.writeback_pending.take() {
            fs::sync_range(
                &self.file,
                &self.path,
                prev_start,
                prev_len,
                RangeSync::WriteAndWait,
            )?;
        }
        self.writeback_pending = Some((start, len));
        self.writeback_offset = self.buf_offset;
        Ok(())
    }

    /// Writes out the buffer and fdatasyncs: every record appended so far is
    /// durable on return. A failure is fatal to the caller (never retried).
    pub(crate) fn sync(&mut self, pace: FlushPace) -> Result<(), StorageError> {
        self.write_buffer(true, pace)?;
        debug_assert!(self.buf.is_empty());
        self.file
            .sync_data()
            .map_err(|e| StorageError::io("fdatasync", &self.path, e))?;
        self.writeback_pending = None;
        self.writeback_offset = self.buf_offset;
        Ok(())
    }

    /// Syncs this log and creates log `next_id` in its place; returns the id of
    /// the log closed.
    pub(crate) fn rotate(&mut self, next_id: u64, pace: FlushPace) -> Result<u64, StorageError> {
        self.sync(pace)?;
        let next = EntryLogWriter::create(
            &self.dir,
            next_id,
            self.direct,
            self.writeback_step_bytes,
            self.size_max_bytes,
        )?;
        let old = std::mem::replace(self, next);
        Ok(old.log_id)
    }
}

/// Open read handles of entry logs, shared by all readers.
#[derive(Debug)]
pub(crate) struct LogReaders {
    dir: PathBuf,
    files: Mutex<HashMap<u64, Arc<File>>>,
}

impl LogReaders {
    pub(crate) fn new(dir: &Path) -> LogReaders {
        LogReaders {
            dir: dir.to_path_buf(),
            files: Mutex::new(HashMap::new()),
        }
    }

    pub(crate) fn path(&self, log_id: u64) -> PathBuf {
        self.dir.join(format::entry_log_file_name(log_id))
    }

    fn handle(&self, log_id: u64) -> Result<Arc<File>, StorageError> {
        if let Some(f) = self.files.lock().get(&log_id) {
            return Ok(Arc::clone(f));
        }
        let path = self.path(log_id);
        let file = File::open(&path).map_err(|e| StorageError::io("open", &path, e))?;
        // Check the header once per open: a file that is not the log the index
        // names is corruption, not data.
        let mut header = [0u8; format::ENTRY_LOG_HEADER_BYTES as usize];
        file.read_exact_at(&mut header, 0)
            .map_err(|e| StorageError::corruption(&path, 0, format!("cannot read header: {e}")))?;
        let named = format::decode_entry_log_header(&header, &path)?;
        if named != log_id {
            return Err(StorageError::corruption(
                &path,
                0,
                format!("header names log {named}"),
            ));
        }
        fs::advise_no_kernel_read_ahead(&file);
        let f = Arc::new(file);
        let mut files = self.files.lock();
        if files.len() >= LOG_READERS_OPEN_MAX
            && let Some(k) = files.keys().next().copied()
        {
            files.remove(&k);
        }
        files.insert(log_id, Arc::clone(&f));
        Ok(f)
    }

    /// Reads `len` bytes at `offset` of log `log_id` into one buffer. The caller
    /// bounds `len` (index-derived, checked against `ENTRY_PAYLOAD_BYTES_MAX` or
    /// the read-ahead limit) before calling.
    pub(crate) fn read(&self, log_id: u64, offset: u64, len: u64) -> Result<Bytes, StorageError> {
        self.read_in_pieces(log_id, offset, len, u64::MAX, || ())
    }

    /// Like [`LogReaders::read`], in preads of at most `piece_bytes`, each
    /// made while holding what `enter_piece` returns (a place at the read
    /// gate): a journal write queued at the disk behind a catch-up read waits
    /// for one piece, not for the whole read.
    pub(crate) fn read_in_pieces<P>(
        &self,
        log_id: u64,
        offset: u64,
        len: u64,
        piece_bytes: u64,
        mut enter_piece: impl FnMut() -> P,
    ) -> Result<Bytes, StorageError> {
        assert!(piece_bytes > 0, "a read piece holds at least one byte");
        let f = self.handle(log_id)?;
        // Not zero-filled: each pread appends only what the kernel wrote, so
        // the buffer never holds a byte the file did not give.
        let mut buf = Vec::with_capacity(len as usize);
        while (buf.len() as u64) < len {
            let done = buf.len() as u64;
            let piece = piece_bytes.min(len - done);
            let pass = enter_piece();
            let result = read_piece(&f, &mut buf, piece as usize, offset + done);
            drop(pass);
            result.map_err(|e| {
                if e.kind() == std::io::ErrorKind::UnexpectedEof {
                    StorageError::corruption(
                        self.path(log_id),
                        offset,
                        format!("log ends before {len} bytes at this offset"),
                    )
                } else {
                    StorageError::io("pread", self.path(log_id), e)
                }
            })?;
        }
        Ok(Bytes::from(buf))
    }

    /// Forgets the handle of a deleted log (readers holding it finish their read).
    pub(crate) fn forget(&self, log_id: u64) {
        self.files.lock().remove(&log_id);
    }
}

/// Appends exactly `piece` bytes read at `offset` to `buf` (capacity already
/// there), in as many preads as the kernel needs; `UnexpectedEof` if the file
/// ends first (what was read stays in `buf`, and the caller drops it).
fn read_piece(f: &File, buf: &mut Vec<u8>, piece: usize, offset: u64) -> std::io::Result<()> {
    let mut got = 0usize;
    while got < piece {
        match fs::pread_append(f, buf, piece - got, offset + got as u64)? {
            0 => {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::UnexpectedEof,
                    "end of file",
                ));
            }
            n => got += n,
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Appends records of many sizes (one past the write buffer) across several
    /// syncs, switching the flush pace as it goes (so whole-buffer and
    /// piecewise writes both land), then reads each back at the offset
    /// `append` returned.
    fn round_trip(direct: bool) {
        let dir = tempfile::tempdir().unwrap();
        if direct && crate::direct_io::direct_io_works(dir.path()).is_err() {
            eprintln!("skipped: {} refuses O_DIRECT", dir.path().display());
            return;
        }
        let mut writer = EntryLogWriter::create(dir.path(), 1, direct, 64 * 1024, 1 << 30).unwrap();
        let readers = LogReaders::new(dir.path());
        let mut written = Vec::new();
        for entry_id in 0..300u64 {
            let len = match entry_id % 7 {
                0 => 1,
                3 => 5000,
                6 if entry_id == 132 => WRITE_BUFFER_BYTES + 123,
                _ => 40 + entry_id as usize,
            };
            let payload = vec![(entry_id * 13) as u8; len];
            // Entry 132, past the write buffer on its own, goes out in pieces.
            let pace = if entry_id / 25 % 2 == 1 {
                FlushPace::Yield
            } else {
                FlushPace::CatchUp
            };
            let offset = writer.append(9, entry_id, &payload, pace).unwrap();
            written.push((entry_id, offset, payload));
            if entry_id % 50 == 49 {
                writer.sync(pace).unwrap();
                if direct {
                    assert!(
                        writer
                            .size_bytes()
                            .is_multiple_of(DIRECT_IO_ALIGNMENT_BYTES as u64)
                    );
                }
            }
        }
        writer.sync(FlushPace::Yield).unwrap();
        let file_bytes = std::fs::metadata(&writer.path).unwrap().len();
        assert_eq!(file_bytes, writer.size_bytes());
        for (entry_id, offset, payload) in written {
            let len = format::record_bytes(payload.len());
            let record = readers.read(1, offset, len).unwrap();
            let got = format::decode_record(&record, 9, entry_id, &writer.path, offset).unwrap();
            assert_eq!(&got[..], &payload[..], "entry {entry_id} at {offset}");
            // The same record read in pieces of 1,000 bytes: the same bytes,
            // one place at the gate per piece.
            let mut pieces = 0u64;
            let in_pieces = readers
                .read_in_pieces(1, offset, len, 1000, || pieces += 1)
                .unwrap();
            assert_eq!(in_pieces, record, "entry {entry_id} read in pieces");
            assert_eq!(
                pieces,
                len.div_ceil(1000),
                "entry {entry_id}: one pass per piece"
            );
        }
        // Past the end in pieces: an error naming the log, not a short buffer.
        let end = writer.size_bytes();
        let err = readers
            .read_in_pieces(1, end - 10, 3000, 1000, || ())
            .unwrap_err();
        assert!(err.to_string().contains("log ends before"), "{err}");
    }

    #[test]
    fn buffered_log_reads_back_every_record_at_its_offset() {
        round_trip(false);
    }

    #[test]
    fn direct_log_reads_back_every_record_at_its_offset_with_block_padded_syncs() {
        round_trip(true);
    }
}
