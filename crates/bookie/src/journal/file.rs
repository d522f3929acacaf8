//! The narrow I/O seam under the journal: `JournalFile` and its backends
//! (buffered + fdatasync, O_DIRECT, slots of a persistent-memory region
//! (`journal::pmem`), and in tests a fault-injecting wrapper), plus directory
//! helpers. Aligned buffers and the O_DIRECT probe are in
//! `crate::direct_io` (shared with the entry logs).
//!
//! Never: decides what to write or when; interprets bytes.

use std::fs::{File, OpenOptions};
use std::io;
use std::os::unix::fs::{FileExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::config::JournalBackendKind;
use super::error::JournalError;
use super::pmem::Region;
pub(crate) use crate::direct_io::AlignedBuf;

/// One journal file as the journal threads see it. Offsets and lengths passed to
/// `write_at` are multiples of the configured alignment, buffers aligned too.
pub(crate) trait JournalFile: Send + Sync + std::fmt::Debug {
    /// Writes all of `buf` at `offset`.
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()>;
    /// Reads into `buf` from `offset`; returns the bytes read (short at EOF).
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize>;
    /// `fdatasync`.
    fn sync_data(&self) -> io::Result<()>;
    /// Truncates or extends the file.
    #[allow(dead_code)] // part of the seam; used by tests
    fn set_len(&self, len: u64) -> io::Result<()>;
    /// Current file size.
    #[allow(dead_code)] // part of the seam; used by tests
    fn len(&self) -> io::Result<u64>;
    /// Current path, for errors and logs.
    fn path(&self) -> PathBuf;
    /// Records that the file was renamed to `to`.
    fn renamed(&self, to: &Path);
}

/// Which backend opens files, and where the journal's files live: every
/// name the journal threads and replay use (numbered files, the next file,
/// retired files kept for reuse) goes through these methods, so a backend
/// whose files are not directory entries can stand behind the same names.
/// Tests add a fault-injecting one.
#[derive(Debug, Clone)]
pub(crate) enum Backend {
    Kind(JournalBackendKind),
    /// Slots of a mapped persistent-memory region, named like files.
    Pmem(Arc<Region>),
    #[cfg(test)]
    Faulty(Arc<faulty::FaultPlan>),
}

impl Backend {
    /// Ids of the journal files present, sorted.
    pub(crate) fn list_file_ids(&self, dir: &Path) -> Result<Vec<u64>, JournalError> {
        match self {
            Backend::Pmem(region) => Ok(region.list_file_ids()),
            _ => super::replay::list_file_ids(dir),
        }
    }

    /// Retired files waiting to be reused, oldest first. None in a pmem
    /// region: its free slots are taken in ring order by `open` of the next
    /// file.
    pub(crate) fn list_free_files(&self, dir: &Path) -> Result<Vec<PathBuf>, JournalError> {
        match self {
            Backend::Pmem(_) => Ok(Vec::new()),
            _ => super::prealloc::list_free_files(dir),
        }
    }

    /// Whether a journal file of that name exists.
    pub(crate) fn exists(&self, path: &Path) -> bool {
        match self {
            Backend::Pmem(region) => region.exists(path),
            _ => path.exists(),
        }
    }

    /// Renames a journal file (durable once `sync_dir` returns).
    pub(crate) fn rename(&self, from: &Path, to: &Path) -> Result<(), JournalError> {
        match self {
            Backend::Pmem(region) => region.rename(from, to),
            _ => std::fs::rename(from, to).map_err(|e| JournalError::io("rename", from, e)),
        }
    }

    /// Removes a journal file (durable once `sync_dir` returns).
    pub(crate) fn remove(&self, path: &Path) -> Result<(), JournalError> {
        match self {
            Backend::Pmem(region) => region.remove(path),
            _ => std::fs::remove_file(path).map_err(|e| JournalError::io("remove", path, e)),
        }
    }

    /// Makes the renames and removals so far durable (a pmem region's table
    /// changes are durable when they return).
    pub(crate) fn sync_dir(&self, dir: &Path) -> Result<(), JournalError> {
        match self {
            Backend::Pmem(_) => Ok(()),
            _ => sync_dir(dir),
        }
    }

    /// Whether the backend wants ledger storage to checkpoint now, to free
    /// space (a pmem ring more than half full).
    pub(crate) fn wants_checkpoint(&self) -> bool {
        match self {
            Backend::Pmem(region) => region.wants_checkpoint(),
            _ => false,
        }
    }

    /// Opens a journal file for replay: reads only, through the page cache
    /// whatever the write backend (Linux keeps it coherent with O_DIRECT
    /// writes), or from the mapped region.
    pub(crate) fn open_read(&self, path: &Path) -> Result<Arc<dyn JournalFile>, JournalError> {
        if let Backend::Pmem(region) = self {
            return region.open_file(path, false);
        }
        let file = File::open(path).map_err(|e| JournalError::io("open", path, e))?;
        Ok(Arc::new(PlainFile {
            file,
            path: std::sync::Mutex::new(path.to_path_buf()),
        }))
    }

    /// Opens (or creates) `path` for the journal threads.
    pub(crate) fn open(
        &self,
        path: &Path,
        create: bool,
    ) -> Result<Arc<dyn JournalFile>, JournalError> {
        match self {
            Backend::Kind(JournalBackendKind::Buffered) => {
                Ok(Arc::new(PlainFile::open(path, create, false)?))
            }
            // `Journal::open` resolves Auto before any file is opened.
            Backend::Kind(JournalBackendKind::Auto) => {
                debug_assert!(false, "JournalBackendKind::Auto reached a file open");
                Ok(Arc::new(PlainFile::open(path, create, false)?))
            }
            Backend::Kind(JournalBackendKind::Direct) => {
                Ok(Arc::new(PlainFile::open(path, create, true)?))
            }
            Backend::Pmem(region) => region.open_file(path, create),
            // `Journal::open` maps the region and hands over `Backend::Pmem`.
            Backend::Kind(JournalBackendKind::Pmem) => Err(JournalError::InvalidConfig {
                reason: "the pmem backend opens through its mapped region".to_string(),
            }),
            #[cfg(test)]
            Backend::Faulty(plan) => Ok(Arc::new(faulty::FaultyFile {
                inner: PlainFile::open(path, create, false)?,
                plan: plan.clone(),
            })),
        }
    }
}

/// A file opened buffered or with O_DIRECT; both use pwrite/pread/fdatasync.
#[derive(Debug)]
pub(crate) struct PlainFile {
    file: File,
    path: std::sync::Mutex<PathBuf>,
}

impl PlainFile {
    fn open(path: &Path, create: bool, direct: bool) -> Result<PlainFile, JournalError> {
        let mut options = OpenOptions::new();
        options
            .read(true)
            .write(true)
            .create(create)
            .truncate(false);
        if direct {
            options.custom_flags(libc::O_DIRECT);
        }
        match options.open(path) {
            Ok(file) => Ok(PlainFile {
                file,
                path: std::sync::Mutex::new(path.to_path_buf()),
            }),
            Err(e) if direct && e.raw_os_error() == Some(libc::EINVAL) => {
                Err(JournalError::DirectIoUnsupported {
                    path: path.to_path_buf(),
                    source: Arc::new(e),
                })
            }
            Err(e) => Err(JournalError::io("open", path, e)),
        }
    }
}

impl JournalFile for PlainFile {
    fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
        self.file.write_all_at(buf, offset)
    }
    fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
        let mut done = 0;
        while done < buf.len() {
            match self.file.read_at(&mut buf[done..], offset + done as u64) {
                Ok(0) => break,
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
        Ok(done)
    }
    fn sync_data(&self) -> io::Result<()> {
        self.file.sync_data()
    }
    fn set_len(&self, len: u64) -> io::Result<()> {
        self.file.set_len(len)
    }
    fn len(&self) -> io::Result<u64> {
        Ok(self.file.metadata()?.len())
    }
    fn path(&self) -> PathBuf {
        self.path.lock().map(|p| p.clone()).unwrap_or_default()
    }
    fn renamed(&self, to: &Path) {
        if let Ok(mut p) = self.path.lock() {
            *p = to.to_path_buf();
        }
    }
}

/// `fsync` on a directory, so created, renamed and removed names are durable.
pub(crate) fn sync_dir(dir: &Path) -> Result<(), JournalError> {
    let d = File::open(dir).map_err(|e| JournalError::io("open dir", dir, e))?;
    d.sync_all()
        .map_err(|e| JournalError::io("fsync dir", dir, e))
}

#[cfg(test)]
pub(crate) mod faulty {
    //! A backend that logs every operation and can fail after N of them, to test
    //! ordering (callbacks only after sync) and failure handling.

    use std::io;
    use std::path::{Path, PathBuf};
    use std::sync::Mutex;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use super::{JournalFile, PlainFile};

    /// One logged operation.
    #[derive(Debug, Clone, PartialEq, Eq)]
    pub(crate) enum Op {
        Write {
            path: PathBuf,
            offset: u64,
            len: usize,
        },
        SyncStart {
            path: PathBuf,
            id: u64,
        },
        SyncEnd {
            id: u64,
        },
        Callback {
            path: PathBuf,
            offset: u64,
        },
    }

    #[derive(Debug, Default)]
    pub(crate) struct FaultPlan {
        /// Once set, every write fails.
        pub(crate) fail_writes: AtomicBool,
        /// Once set, every sync fails.
        pub(crate) fail_syncs: AtomicBool,
        pub(crate) sync_ids: AtomicU64,
        pub(crate) log: Mutex<Vec<Op>>,
    }

    impl FaultPlan {
        pub(crate) fn push(&self, op: Op) {
            if let Ok(mut log) = self.log.lock() {
                log.push(op);
            }
        }

        pub(crate) fn ops(&self) -> Vec<Op> {
            self.log.lock().map(|l| l.clone()).unwrap_or_default()
        }
    }

    #[derive(Debug)]
    pub(crate) struct FaultyFile {
        pub(crate) inner: PlainFile,
        pub(crate) plan: std::sync::Arc<FaultPlan>,
    }

    impl JournalFile for FaultyFile {
        fn write_at(&self, buf: &[u8], offset: u64) -> io::Result<()> {
            if self.plan.fail_writes.load(Ordering::SeqCst) {
                return Err(io::Error::other("injected write fault"));
            }
            self.inner.write_at(buf, offset)?;
            self.plan.push(Op::Write {
                path: self.path(),
                offset,
                len: buf.len(),
            });
            Ok(())
        }
        fn read_at(&self, buf: &mut [u8], offset: u64) -> io::Result<usize> {
            self.inner.read_at(buf, offset)
        }
        fn sync_data(&self) -> io::Result<()> {
            if self.plan.fail_syncs.load(Ordering::SeqCst) {
                return Err(io::Error::other("injected sync fault"));
            }
            let id = self.plan.sync_ids.fetch_add(1, Ordering::SeqCst);
            self.plan.push(Op::SyncStart {
                path: self.path(),
                id,
            });
            self.inner.sync_data()?;
            self.plan.push(Op::SyncEnd { id });
            Ok(())
        }
        fn set_len(&self, len: u64) -> io::Result<()> {
            self.inner.set_len(len)
        }
        fn len(&self) -> io::Result<u64> {
            self.inner.len()
        }
        fn path(&self) -> PathBuf {
            self.inner.path()
        }
        fn renamed(&self, to: &Path) {
            self.inner.renamed(to)
        }
    }
}
