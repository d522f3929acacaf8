//! Replay on open, with its stated tolerance.
//!
//! Owns: reading the journal files after a mark, handing records back in order,
//! and repairing the tail of the newest file.
//!
//! Tolerance: every file but the newest must read as a clean run of valid
//! records ending with a FileEnd record (the writer syncs a FileEnd into a file
//! before the next file gets its name); any bad, short or missing record there is
//! `Corruption` and the journal refuses to start. The newest file may end in a
//! torn or corrupt record or in zeros (a crash while groups were in flight): replay
//! stops at the first such record, `warn!`s file and offset, and writes a FileEnd
//! record there so the file reads clean from then on. The writer never appends to
//! a replayed file: `Journal::open` starts a new one.
//!
//! Never: skips a bad record to read what follows; allocates by an unchecked
//! length field (lengths are bounded by `payload_bytes_max`).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::config::JournalConfig;
use super::error::JournalError;
use super::file::{AlignedBuf, Backend, JournalFile};
use super::format::{
    self, Decoded, DecodedRecord, HEADER_BYTES, JournalRecord, NEXT_FILE_NAME, RECORD_HEADER_BYTES,
};
use crate::mark::JournalMark;

/// Replay reads files in pieces of this size: large enough for sequential
/// throughput, small enough to keep replay memory flat.
const READ_CHUNK_BYTES: usize = 1 << 20;

/// What replay found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ReplayOutcome {
    /// The id the writer's first file gets.
    pub(crate) next_file_id: u64,
    /// Mark just past the last valid record (or `from` when nothing was read).
    pub(crate) end_mark: JournalMark,
}

/// Lists the journal file ids in `dir`, sorted.
pub(crate) fn list_file_ids(dir: &Path) -> Result<Vec<u64>, JournalError> {
    let mut ids = Vec::new();
    let entries = std::fs::read_dir(dir).map_err(|e| JournalError::io("read_dir", dir, e))?;
    for entry in entries {
        let entry = entry.map_err(|e| JournalError::io("read_dir", dir, e))?;
        if let Some(id) = entry.file_name().to_str().and_then(format::parse_file_name) {
            ids.push(id);
        }
    }
    ids.sort_unstable();
    Ok(ids)
}

/// How a file's scan ended.
#[derive(Debug)]
enum ScanEnd {
    /// A FileEnd record at this offset.
    Clean,
    /// Zeros where the next record should start.
    Zeros,
    /// A torn or corrupt record (or end of file mid-record).
    Bad(String),
}

/// Replays every record after `from`; see the module docs for the rules.
pub(crate) fn replay<E, F>(
    config: &JournalConfig,
    backend: &Backend,
    from: JournalMark,
    on_record: &mut F,
) -> Result<ReplayOutcome, JournalError>
where
    E: std::error::Error + Send + Sync + 'static,
    F: FnMut(JournalRecord, JournalMark) -> Result<(), E>,
{
    let dir = &config.dir;
    let ids = backend.list_file_ids(dir)?;
    let newest = ids.last().copied();
    // A next file the preallocator was preparing holds no records: back to the
    // pool of reusable files (or away when the pool is full).
    let next = dir.join(NEXT_FILE_NAME);
    if backend.exists(&next) {
        let free = backend.list_free_files(dir)?.len();
        if free < config.recycle_files_max {
            let id = newest.map_or(from.file_id, |n| n.max(from.file_id)) + 1;
            backend.rename(&next, &dir.join(format::free_file_name(id)))?;
        } else {
            backend.remove(&next)?;
        }
    }
    let to_replay: Vec<u64> = ids
        .iter()
        .copied()
        .filter(|id| *id >= from.file_id)
        .collect();
    if from.file_id > 0 && to_replay.first() != Some(&from.file_id) {
        return Err(JournalError::Corruption {
            path: dir.join(format::file_name(from.file_id)),
            offset: 0,
            reason: format!(
                "the replay mark points into file {} but it is missing (files present: {:?})",
                from.file_id, ids
            ),
        });
    }
    for pair in to_replay.windows(2) {
        if pair[1] != pair[0] + 1 {
            return Err(JournalError::Corruption {
                path: dir.join(format::file_name(pair[0] + 1)),
                offset: 0,
                reason: format!(
                    "journal file {} is missing between {} and {}",
                    pair[0] + 1,
                    pair[0],
                    pair[1]
                ),
            });
        }
    }
    let mut end_mark = from;
    for &id in &to_replay {
        let path = dir.join(format::file_name(id));
        let is_newest = Some(id) == newest;
        let (end_offset, scan_end) = scan_file(config, backend, &path, id, from, on_record)?;
        end_mark = end_mark.max(JournalMark {
            file_id: id,
            offset: end_offset,
        });
        match scan_end {
            ScanEnd::Clean => {}
            ScanEnd::Zeros | ScanEnd::Bad(_) if !is_newest => {
                let reason = match scan_end {
                    ScanEnd::Bad(r) => format!("bad record in an older file: {r}"),
                    _ => "older file ends without an end record".to_string(),
                };
                return Err(JournalError::Corruption {
                    path,
                    offset: end_offset,
                    reason,
                });
            }
            ScanEnd::Zeros => {
                tracing::info!(file = %path.display(), offset = end_offset, "journal: newest file was not closed; ending it");
                write_file_end(config, backend, &path, id, end_offset)?;
            }
            ScanEnd::Bad(reason) => {
                tracing::warn!(
                    file = %path.display(),
                    offset = end_offset,
                    %reason,
                    "journal: torn, corrupt or stale (reused file) record in the newest file; the log ends there"
                );
                write_file_end(config, backend, &path, id, end_offset)?;
            }
        }
    }
    let next_file_id = match newest {
        Some(id) => id + 1,
        None => from.file_id + 1,
    };
    Ok(ReplayOutcome {
        next_file_id,
        end_mark,
    })
}

/// Reads one file, calling back for records past `from`. Returns where the
/// records stop and why.
fn scan_file<E, F>(
    config: &JournalConfig,
    backend: &Backend,
    path: &Path,
    file_id: u64,
    from: JournalMark,
    on_record: &mut F,
) -> Result<(u64, ScanEnd), JournalError>
where
    E: std::error::Error + Send + Sync + 'static,
    F: FnMut(JournalRecord, JournalMark) -> Result<(), E>,
{
    let file = backend.open_read(path)?;
    let file_len = file.len().map_err(|e| JournalError::io("stat", path, e))?;
    let header = read_header(file.as_ref(), path, file_id)?;
    let record_bytes_max =
        RECORD_HEADER_BYTES + 16 + config.payload_bytes_max.max(config.alignment_bytes);
    let mut reader = Window::new(file, path.to_path_buf(), file_len);
    let mut pos = u64::from(header.data_offset);
    let mut want = RECORD_HEADER_BYTES;
    loop {
        if pos >= file_len {
            return Ok((
                pos,
                ScanEnd::Bad("end of file without an end record".to_string()),
            ));
        }
        let bytes = reader.at(pos, want)?;
        match format::decode_record(bytes, file_id, record_bytes_max) {
            Decoded::Record { record, len } => {
                let end = pos + len as u64;
                match record {
                    DecodedRecord::FileEnd => return Ok((pos, ScanEnd::Clean)),
                    DecodedRecord::Padding => {}
                    DecodedRecord::User(record) => {
                        let mark = JournalMark {
                            file_id,
                            offset: end,
                        };
                        if mark > from {
                            on_record(record, mark)
                                .map_err(|e| JournalError::Replay(Arc::new(e)))?;
                        }
                    }
                }
                pos = end;
                want = RECORD_HEADER_BYTES;
            }
            Decoded::End => {
                if bytes.len() < 4 && pos + (bytes.len() as u64) < file_len {
                    // Window too small to see a whole length field: read more.
                    want = RECORD_HEADER_BYTES;
                    continue;
                }
                return Ok((pos, ScanEnd::Zeros));
            }
            Decoded::Short { len } => {
                if pos + len as u64 > file_len {
                    return Ok((
                        pos,
                        ScanEnd::Bad(format!("record of {len} bytes cut by the end of the file")),
                    ));
                }
                if bytes.len() >= len {
                    return Ok((pos, ScanEnd::Bad("short record".to_string())));
                }
                want = len;
            }
            Decoded::Invalid { reason } => return Ok((pos, ScanEnd::Bad(reason))),
        }
    }
}

fn read_header(
    file: &dyn JournalFile,
    path: &Path,
    file_id: u64,
) -> Result<format::FileHeader, JournalError> {
    let mut block = vec![0u8; HEADER_BYTES];
    let n = file
        .read_at(&mut block, 0)
        .map_err(|e| JournalError::io("read", path, e))?;
    let header = format::decode_header(&block[..n]).map_err(|reason| JournalError::BadHeader {
        path: path.to_path_buf(),
        reason,
    })?;
    if header.file_id != file_id {
        return Err(JournalError::BadHeader {
            path: path.to_path_buf(),
            reason: format!(
                "header names file {} but the file name says {file_id}",
                header.file_id
            ),
        });
    }
    if u64::from(header.data_offset) < HEADER_BYTES as u64 || header.data_offset % 512 != 0 {
        return Err(JournalError::BadHeader {
            path: path.to_path_buf(),
            reason: format!("bad data offset {}", header.data_offset),
        });
    }
    Ok(header)
}

/// A sliding read window over a file.
struct Window {
    file: Arc<dyn JournalFile>,
    path: PathBuf,
    file_len: u64,
    buf: Vec<u8>,
    buf_offset: u64,
}

impl Window {
    fn new(file: Arc<dyn JournalFile>, path: PathBuf, file_len: u64) -> Window {
        Window {
            file,
            path,
            file_len,
            buf: Vec::new(),
            buf_offset: 0,
        }
    }

    /// Bytes from `pos`: at least `want` of them unless the file ends first.
    fn at(&mut self, pos: u64, want: usize) -> Result<&[u8], JournalError> {
        let buf_end = self.buf_offset + self.buf.len() as u64;
        let covered = pos >= self.buf_offset && pos + want as u64 <= buf_end;
        let at_eof = pos >= self.buf_offset && buf_end == self.file_len;
        if !covered && !at_eof {
            let read_len = want.max(READ_CHUNK_BYTES) as u64;
            let read_len = read_len.min(self.file_len.saturating_sub(pos)) as usize;
            self.buf.resize(read_len, 0);
            let n = self
                .file
                .read_at(&mut self.buf, pos)
                .map_err(|e| JournalError::io("read", &self.path, e))?;
            self.buf.truncate(n);
            self.buf_offset = pos;
        }
        let start = (pos - self.buf_offset) as usize;
        Ok(&self.buf[start.min(self.buf.len())..])
    }
}

/// Writes a FileEnd record at `offset` of the newest file (rewriting the aligned
/// block(s) around it) and syncs, so later opens read the file as complete.
pub(crate) fn write_file_end(
    config: &JournalConfig,
    backend: &Backend,
    path: &Path,
    file_id: u64,
    offset: u64,
) -> Result<(), JournalError> {
    let align = config.alignment_bytes as u64;
    let block_start = offset / align * align;
    let end = offset + RECORD_HEADER_BYTES as u64;
    let block_end = end.div_ceil(align) * align;
    let file = backend.open(path, false)?;
    let mut buf = AlignedBuf::zeroed((block_end - block_start) as usize, config.alignment_bytes);
    {
        let keep = (offset - block_start) as usize;
        let slice = buf.as_mut_slice();
        // Read whole aligned blocks (O_DIRECT needs it), keep what precedes `offset`.
        let n = file
            .read_at(slice, block_start)
            .map_err(|e| JournalError::io("read", path, e))?;
        slice[n.min(keep)..].fill(0);
        format::encode_file_end(file_id, &mut slice[keep..]);
    }
    file.write_at(buf.as_slice(), block_start)
        .map_err(|e| JournalError::io("pwrite", path, e))?;
    file.sync_data()
        .map_err(|e| JournalError::io("fdatasync", path, e))?;
    if let Some(dir) = path.parent() {
        backend.sync_dir(dir)?;
    }
    Ok(())
}
