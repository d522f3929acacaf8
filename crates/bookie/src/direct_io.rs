//! What O_DIRECT writers share (the journal's `Direct` backend and the entry
//! logs): `AlignedBuf`, memory aligned for O_DIRECT without unsafe code, and
//! `direct_io_works`, the probe that decides whether a directory's filesystem
//! takes O_DIRECT writes at all.
//!
//! Why O_DIRECT here: on this project's target machines (VMs whose guest memory
//! the host hands out lazily) a buffered write of new data pays a page fault per
//! 4 KiB of fresh page cache, and later dirty-page write-back competes with the
//! journal's fdatasync. Writing from our own reused, aligned buffers avoids both.
//!
//! Never: does I/O beyond the probe's one file.

use std::fs::OpenOptions;
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::Path;

/// Offsets, lengths and buffer addresses of every O_DIRECT write are multiples
/// of this (the largest logical block size of common devices).
pub(crate) const DIRECT_IO_ALIGNMENT_BYTES: usize = 4096;

/// Name of the file `direct_io_works` writes and removes.
const DIRECT_IO_PROBE_FILE_NAME: &str = ".direct-io-probe";

/// Whether `dir`'s filesystem takes an aligned O_DIRECT write. Any failure
/// counts as "no": the caller then writes buffered, and real trouble with the
/// directory shows up when its files are opened.
pub fn direct_io_works(dir: &Path) -> Result<(), io::Error> {
    let path = dir.join(DIRECT_IO_PROBE_FILE_NAME);
    let written = OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .custom_flags(libc::O_DIRECT)
        .open(&path)
        .and_then(|file| {
            let block = AlignedBuf::zeroed(DIRECT_IO_ALIGNMENT_BYTES, DIRECT_IO_ALIGNMENT_BYTES);
            file.write_all_at(block.as_slice(), 0)
        });
    let _ = std::fs::remove_file(&path);
    written
}

/// `direct_io_works` with a log line either way, naming `what` writes there
/// (the journal, the entry logs): whether to write `dir` with O_DIRECT.
pub(crate) fn choose_direct_io(dir: &Path, what: &str) -> bool {
    match direct_io_works(dir) {
        Ok(()) => {
            tracing::info!(dir = %dir.display(), "{what}: O_DIRECT writes");
            true
        }
        Err(error) => {
            tracing::info!(dir = %dir.display(), %error,
                "{what}: the filesystem refused an O_DIRECT write; writing through the page cache");
            false
        }
    }
}

/// A byte buffer whose start is aligned to `alignment` (for O_DIRECT), built on
/// a `Vec` with slack so no unsafe code is needed. Its length can change within
/// the capacity; growing past it reallocates (and keeps the contents).
#[derive(Debug)]
pub(crate) struct AlignedBuf {
    vec: Vec<u8>,
    start: usize,
    len: usize,
    alignment: usize,
}

impl AlignedBuf {
    /// A zeroed buffer of `len` bytes (`len` a multiple of `alignment`).
    pub(crate) fn zeroed(len: usize, alignment: usize) -> AlignedBuf {
        let mut buf = AlignedBuf::with_capacity(len, alignment);
        buf.len = len;
        buf
    }

    /// An empty buffer with room for `capacity` bytes before it reallocates.
    pub(crate) fn with_capacity(capacity: usize, alignment: usize) -> AlignedBuf {
        assert!(alignment.is_power_of_two());
        let vec = vec![0u8; capacity + alignment];
        let start = vec.as_ptr().align_offset(alignment);
        assert!(start < alignment);
        AlignedBuf {
            vec,
            start,
            len: 0,
            alignment,
        }
    }

    fn capacity(&self) -> usize {
        self.vec.len() - self.alignment
    }

    /// Makes the buffer `len` bytes long, all zero (reallocates only to grow).
    pub(crate) fn reset_zeroed(&mut self, len: usize) {
        if len > self.capacity() {
            *self = AlignedBuf::zeroed(len.next_power_of_two(), self.alignment);
        }
        self.len = len;
        let range = self.start..self.start + len;
        self.vec[range].fill(0);
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Appends `bytes`, reallocating (to twice what is needed) past the capacity.
    pub(crate) fn extend_from_slice(&mut self, bytes: &[u8]) {
        let new_len = self.len + bytes.len();
        if new_len > self.capacity() {
            let mut grown = AlignedBuf::with_capacity(new_len * 2, self.alignment);
            grown.extend_from_slice(self.as_slice());
            *self = grown;
        }
        let at = self.start + self.len;
        self.vec[at..at + bytes.len()].copy_from_slice(bytes);
        self.len = new_len;
    }

    /// Appends zeros up to the next multiple of the alignment.
    pub(crate) fn pad_to_alignment(&mut self) {
        let padded = self.len.next_multiple_of(self.alignment);
        if padded > self.capacity() {
            self.extend_from_slice(&vec![0u8; padded - self.len]);
            return;
        }
        let range = self.start + self.len..self.start + padded;
        self.vec[range].fill(0);
        self.len = padded;
    }

    /// Drops the first `n` bytes, moving the rest to the (aligned) front.
    pub(crate) fn consume_front(&mut self, n: usize) {
        assert!(n <= self.len);
        let from = self.start + n..self.start + self.len;
        self.vec.copy_within(from, self.start);
        self.len -= n;
    }

    pub(crate) fn as_slice(&self) -> &[u8] {
        &self.vec[self.start..self.start + self.len]
    }

    pub(crate) fn as_mut_slice(&mut self) -> &mut [u8] {
        &mut self.vec[self.start..self.start + self.len]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn is_aligned(buf: &AlignedBuf) -> bool {
        (buf.as_slice().as_ptr() as usize).is_multiple_of(buf.alignment)
    }

    #[test]
    fn grows_pads_and_consumes_keeping_contents_aligned() {
        let mut buf = AlignedBuf::with_capacity(8, 4096);
        buf.extend_from_slice(b"abc");
        buf.extend_from_slice(&[7u8; 5000]);
        assert!(is_aligned(&buf));
        assert_eq!(buf.len(), 5003);
        assert_eq!(&buf.as_slice()[..4], b"abc\x07");
        buf.pad_to_alignment();
        assert_eq!(buf.len(), 8192);
        assert!(buf.as_slice()[5003..].iter().all(|b| *b == 0));
        buf.consume_front(4096);
        assert_eq!(buf.len(), 4096);
        assert!(is_aligned(&buf));
        assert_eq!(buf.as_slice()[0], 7);
        assert_eq!(buf.as_slice()[906], 7);
        assert_eq!(buf.as_slice()[907], 0);
        buf.pad_to_alignment();
        assert_eq!(buf.len(), 4096, "an aligned length needs no padding");
        buf.consume_front(4096);
        assert!(buf.is_empty());
    }
}
