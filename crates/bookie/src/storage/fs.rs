//! The few file-system calls storage makes durable: create a file durably,
//! replace one atomically, sync a directory, lock the ledger dir, the
//! write-back hints (`sync_file_range`), and the entry-log read into a
//! buffer's spare capacity (`pread_append`). All `unsafe` of the storage
//! module is here, each with its SAFETY note.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::Path;

use super::error::StorageError;

/// fsyncs a directory so entries created, renamed or removed in it survive a
/// power cut.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), StorageError> {
    let d = File::open(dir).map_err(|e| StorageError::io("open dir", dir, e))?;
    d.sync_all()
        .map_err(|e| StorageError::io("fsync dir", dir, e))
}

/// Writes `bytes` to `dir/name` so that after return either the old file or the
/// new one is there whole: temp file, fdatasync, rename over, fsync the dir.
pub(crate) fn replace_atomically(dir: &Path, name: &str, bytes: &[u8]) -> Result<(), StorageError> {
    let tmp = dir.join(format!("{name}.tmp"));
    let dst = dir.join(name);
    {
        let mut f = OpenOptions::new()
            .write(true)
            .create(true)
            .truncate(true)
            .open(&tmp)
            .map_err(|e| StorageError::io("create", &tmp, e))?;
        f.write_all(bytes)
            .map_err(|e| StorageError::io("write", &tmp, e))?;
        f.sync_data()
            .map_err(|e| StorageError::io("fdatasync", &tmp, e))?;
    }
    std::fs::rename(&tmp, &dst).map_err(|e| StorageError::io("rename", &dst, e))?;
    sync_dir(dir)
}

/// Creates `path` (must not exist), writes `header`, fdatasyncs it and then the
/// directory, and returns the open file (read + write) positioned nowhere in
/// particular: callers use positional I/O only.
pub(crate) fn create_durable(path: &Path, header: &[u8]) -> Result<File, StorageError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .map_err(|e| StorageError::io("create", path, e))?;
    std::os::unix::fs::FileExt::write_all_at(&f, header, 0)
        .map_err(|e| StorageError::io("pwrite", path, e))?;
    f.sync_data()
        .map_err(|e| StorageError::io("fdatasync", path, e))?;
    if let Some(dir) = path.parent() {
        sync_dir(dir)?;
    }
    Ok(f)
}

/// Takes an exclusive `flock` on `dir/LOCK` (created if missing). The lock lives
/// as long as the returned file; a second holder gets `Locked`.
pub(crate) fn lock_dir(path: &Path) -> Result<File, StorageError> {
    let f = OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(path)
        .map_err(|e| StorageError::io("open", path, e))?;
    // SAFETY: flock takes a file descriptor we own (kept open by `f`) and two
    // integer flags; it touches no memory of ours.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if rc != 0 {
        let err = std::io::Error::last_os_error();
        if err.raw_os_error() == Some(libc::EWOULDBLOCK) {
            return Err(StorageError::Locked {
                path: path.to_path_buf(),
            });
        }
        return Err(StorageError::io("flock", path, err));
    }
    Ok(f)
}

/// Tells the kernel not to read ahead on `file` (POSIX_FADV_RANDOM). Entry-log
/// reads bring their own bounded read-ahead into the read cache; the kernel's
/// (up to the device's read_ahead_kb, 8 MiB on the benchmark machine) would
/// queue megabytes of reads that no gate bounds, in front of the journal's
/// writes. Advice only: a refusal is logged at debug and reads go on.
pub(crate) fn advise_no_kernel_read_ahead(file: &File) {
    // SAFETY: posix_fadvise takes a file descriptor we own (borrowed from
    // `file` for the call) and integers; it touches no memory of ours.
    #[allow(unsafe_code)]
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    if rc != 0 {
        tracing::debug!(errno = rc, "posix_fadvise(RANDOM) refused on an entry log");
    }
}

/// Reads up to `want` bytes at `offset` of `file` into `buf`'s spare capacity
/// (which must hold `want` more bytes) and grows `buf` by exactly the bytes
/// the kernel wrote; returns that count (0 at the end of the file). No
/// zero-filling first: a catch-up read of hundreds of MiB/s would otherwise
/// write every byte twice. A short or failed read leaves nothing unwritten
/// inside `buf.len()`: only bytes the kernel reported written are counted.
pub(crate) fn pread_append(
    file: &File,
    buf: &mut Vec<u8>,
    want: usize,
    offset: u64,
) -> std::io::Result<usize> {
    let spare = buf.spare_capacity_mut();
    assert!(
        spare.len() >= want,
        "pread_append past the buffer's capacity"
    );
    let off = libc::off_t::try_from(offset).map_err(|_| {
        std::io::Error::new(std::io::ErrorKind::InvalidInput, "offset out of range")
    })?;
    loop {
        // SAFETY: the pointer and `want` describe writable memory we own
        // (the first `want` bytes of `buf`'s spare capacity, checked above);
        // pread writes at most `want` bytes there and touches nothing else.
        #[allow(unsafe_code)]
        let n = unsafe {
            libc::pread(
                file.as_raw_fd(),
                spare.as_mut_ptr().cast::<libc::c_void>(),
                want,
                off,
            )
        };
        if n < 0 {
            let err = std::io::Error::last_os_error();
            if err.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(err);
        }
        let n = n as usize;
        debug_assert!(n <= want);
        let n = n.min(want);
        // SAFETY: pread returned `n`: the kernel wrote the `n` bytes right
        // after `buf.len()`, within the capacity; every byte up to the new
        // length is initialised.
        #[allow(unsafe_code)]
        unsafe {
            buf.set_len(buf.len() + n)
        };
        return Ok(n);
    }
}

/// How `sync_file_range` is asked to treat a range.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum RangeSync {
    /// Start write-back of the range's dirty pages; do not wait.
    StartWrite,
    /// Start write-back and wait until the range's pages are written.
    WriteAndWait,
}

/// `sync_file_range` on Linux: moves dirty pages of a range to the device. It is a
/// smoothing tool, not a durability one (no metadata, no device cache flush): the
/// final `fdatasync` still makes a flush durable. Elsewhere: `fdatasync`.
pub(crate) fn sync_range(
    file: &File,
    path: &Path,
    offset: u64,
    len: u64,
    how: RangeSync,
) -> Result<(), StorageError> {
    #[cfg(target_os = "linux")]
    {
        let flags = match how {
            RangeSync::StartWrite => libc::SYNC_FILE_RANGE_WRITE,
            RangeSync::WriteAndWait => {
                libc::SYNC_FILE_RANGE_WAIT_BEFORE
                    | libc::SYNC_FILE_RANGE_WRITE
                    | libc::SYNC_FILE_RANGE_WAIT_AFTER
            }
        };
        let off = i64::try_from(offset)
            .map_err(|_| StorageError::BadConfig(format!("offset {offset} too large")))?;
        let n = i64::try_from(len)
            .map_err(|_| StorageError::BadConfig(format!("length {len} too large")))?;
        // SAFETY: sync_file_range takes a descriptor we own (kept open by `file`)
        // and three integers; it reads or writes no memory of ours.
        #[allow(unsafe_code)]
        let rc = unsafe { libc::sync_file_range(file.as_raw_fd(), off, n, flags) };
        if rc != 0 {
            return Err(StorageError::io(
                "sync_file_range",
                path,
                std::io::Error::last_os_error(),
            ));
        }
        Ok(())
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = (offset, len, how);
        file.sync_data()
            .map_err(|e| StorageError::io("fdatasync", path, e))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// A short read (the file ends) grows the buffer by exactly what was read,
    /// after what it held: no unwritten byte is ever inside its length.
    #[test]
    fn pread_append_counts_only_the_bytes_read() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, b"0123456789").unwrap();
        let f = File::open(&path).unwrap();
        let mut buf = Vec::with_capacity(64);
        buf.extend_from_slice(b"ab");
        assert_eq!(pread_append(&f, &mut buf, 4, 1).unwrap(), 4);
        assert_eq!(buf, b"ab1234");
        assert_eq!(pread_append(&f, &mut buf, 50, 7).unwrap(), 3);
        assert_eq!(buf, b"ab1234789");
        assert_eq!(pread_append(&f, &mut buf, 10, 10).unwrap(), 0);
        assert_eq!(buf.len(), 9);
    }
}
