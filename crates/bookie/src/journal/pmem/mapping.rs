//! The journal's only `unsafe` code: a shared mapping of the persistent-memory
//! region file, copies into and out of it, and making a range of it durable
//! (cache-line flushes + SFENCE under MAP_SYNC, or msync).
//!
//! Owns: the mapping (`mmap` in `Mapping::map`, `munmap` in `Drop`) and the
//! CPU's cache-flush instruction, detected once per region.
//!
//! Invariants that make the `unsafe` blocks sound:
//! 1. `ptr .. ptr + len` is one live `MAP_SHARED` mapping for the whole life
//!    of the `Mapping`: created by `map`, unmapped only by `Drop`, never moved.
//! 2. Every access is checked against `len` with `assert!` before any pointer
//!    arithmetic: an offset out of range is our bug, and going on would touch
//!    memory that is not the region.
//! 3. No two threads touch overlapping bytes at the same time with one of them
//!    writing. The journal's access rules give that: each slot of the region
//!    has one writer at a time (the writer thread for the current slot, the
//!    preallocator for the next one, replay and sealing only while no journal
//!    thread runs), and slot-table entries are written under the region's
//!    mutex. Flushing (CLWB and friends, msync) is not a Rust memory access
//!    and may overlap anything.
//! 4. The file is never shortened while mapped: the region holds an exclusive
//!    `flock` on it and never truncates it. A process that truncated it anyway
//!    would make accesses fault (SIGBUS), the same class of event as a disk
//!    vanishing, not memory corruption.
//!
//! Never: decides what to write; writes through any other pointer.

#![allow(unsafe_code)]

use std::fs::File;
use std::io;
use std::os::fd::AsRawFd;
use std::ptr::NonNull;

/// Cache-line size of every CPU the flush loop supports (x86-64). Groups are
/// aligned to at least this, so two groups never share a line and flushing
/// one never races the writer filling the next.
pub(crate) const CACHE_LINE_BYTES: usize = 64;

/// The instruction that writes a cache line back towards memory, best first.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum FlushInstruction {
    /// Writes the line back and may keep it cached (Skylake-SP and later).
    Clwb,
    /// Writes back and evicts; ordered by SFENCE, so a group's flushes overlap.
    Clflushopt,
    /// Writes back and evicts, each flush ordered after the previous one
    /// (slowest; every x86-64 CPU has it).
    Clflush,
}

impl FlushInstruction {
    /// The best flush instruction this CPU has, `None` off x86-64.
    pub(crate) fn detect() -> Option<FlushInstruction> {
        detect_flush()
    }

    /// Lower-case name for logs and stats.
    pub(crate) fn name(self) -> &'static str {
        match self {
            FlushInstruction::Clwb => "clwb",
            FlushInstruction::Clflushopt => "clflushopt",
            FlushInstruction::Clflush => "clflush",
        }
    }
}

#[cfg(target_arch = "x86_64")]
fn detect_flush() -> Option<FlushInstruction> {
    use std::arch::x86_64::{__cpuid, __cpuid_count, __get_cpuid_max};
    let (max_leaf, _) = __get_cpuid_max(0);
    if max_leaf >= 7 {
        let leaf7 = __cpuid_count(7, 0);
        // CPUID.(EAX=7,ECX=0):EBX bit 24 = CLWB, bit 23 = CLFLUSHOPT.
        if leaf7.ebx & (1 << 24) != 0 {
            return Some(FlushInstruction::Clwb);
        }
        if leaf7.ebx & (1 << 23) != 0 {
            return Some(FlushInstruction::Clflushopt);
        }
    }
    // CPUID.01H:EDX bit 19 = CLFSH.
    (__cpuid(1).edx & (1 << 19) != 0).then_some(FlushInstruction::Clflush)
}

#[cfg(not(target_arch = "x86_64"))]
fn detect_flush() -> Option<FlushInstruction> {
    None
}

/// How a range of the mapping is made durable.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Persistence {
    /// The file is on a DAX filesystem and mapped with MAP_SYNC: stores reach
    /// persistent memory once their cache lines are flushed and an SFENCE
    /// orders the flushes; no system call.
    CacheFlush(FlushInstruction),
    /// `msync(MS_SYNC)` of the pages: the emulation path when MAP_SYNC is
    /// refused (as durable as the filesystem's writeback of those pages; on
    /// tmpfs, memory only).
    Msync,
}

/// Whether `map` asks for MAP_SYNC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum MapSync {
    /// `MAP_SHARED_VALIDATE | MAP_SYNC`: fails (EOPNOTSUPP) unless the file is
    /// on a DAX filesystem, where page faults then commit the block mapping
    /// before they return, so flushed stores are durable without msync.
    Required,
    /// Plain `MAP_SHARED`.
    No,
}

/// A shared, writable mapping of a whole file.
#[derive(Debug)]
pub(crate) struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is plain shared memory; invariant 3 of the module docs
// (disjoint writers, mutex-guarded table entries) rules out data races, and
// `ptr` stays valid while the `Mapping` lives (invariant 1).
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Maps the first `len` bytes of `file` (read-write, shared). The file must
    /// be at least `len` long and stay so (invariant 4).
    pub(crate) fn map(file: &File, len: usize, sync: MapSync) -> io::Result<Mapping> {
        if len == 0 {
            return Err(io::Error::new(io::ErrorKind::InvalidInput, "empty mapping"));
        }
        let flags = match sync {
            MapSync::Required => map_sync_flags()?,
            MapSync::No => libc::MAP_SHARED,
        };
        // SAFETY: a fresh mapping at an address the kernel picks (null hint),
        // of an open file descriptor; nothing aliases it yet. The result is
        // checked for MAP_FAILED before use.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                flags,
                file.as_raw_fd(),
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        let ptr = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| io::Error::other("mmap returned a null mapping"))?;
        Ok(Mapping { ptr, len })
    }

    fn check(&self, offset: usize, len: usize) {
        assert!(
            offset.checked_add(len).is_some_and(|end| end <= self.len),
            "mapping access [{offset}, +{len}) outside the {} mapped bytes",
            self.len
        );
    }

    /// Copies `data` into the mapping at `offset` (plain stores: they sit in
    /// the CPU cache until `persist`).
    pub(crate) fn write(&self, offset: usize, data: &[u8]) {
        self.check(offset, data.len());
        // SAFETY: in bounds (checked above, invariant 2); `data` is a Rust
        // slice, so it cannot overlap the mapping's memory that no slice
        // borrows; no other thread touches these bytes now (invariant 3).
        unsafe {
            std::ptr::copy_nonoverlapping(data.as_ptr(), self.ptr.as_ptr().add(offset), data.len());
        }
    }

    /// Copies bytes at `offset` out of the mapping into `out`.
    pub(crate) fn read(&self, offset: usize, out: &mut [u8]) {
        self.check(offset, out.len());
        // SAFETY: in bounds (invariant 2); no thread writes these bytes now
        // (invariant 3); `out` is a distinct Rust buffer.
        unsafe {
            std::ptr::copy_nonoverlapping(
                self.ptr.as_ptr().add(offset),
                out.as_mut_ptr(),
                out.len(),
            );
        }
    }

    /// Stores one 8-byte little-endian value at an 8-byte aligned `offset` in a
    /// single store: persistent memory never tears an aligned 8-byte store, so
    /// after `persist` the value is either the old or the new one, never a mix.
    pub(crate) fn store_u64(&self, offset: usize, value: u64) {
        self.check(offset, 8);
        assert!(
            offset.is_multiple_of(8),
            "unaligned 8-byte store at {offset}"
        );
        // SAFETY: in bounds and 8-aligned (checked above; the mapping starts
        // page-aligned); callers hold the region's table mutex (invariant 3).
        // A volatile store is one 8-byte `mov`, not split into smaller ones.
        unsafe {
            std::ptr::write_volatile(self.ptr.as_ptr().add(offset).cast::<u64>(), value.to_le());
        }
    }

    /// Makes `[offset, offset + len)` durable: flushes its cache lines and
    /// fences (`CacheFlush`), or msyncs its pages (`Msync`). Callable from any
    /// thread for bytes another thread wrote, once those stores are visible to
    /// this thread (the journal hands groups over through a mutex or channel):
    /// a cache-line flush acts on the line wherever it is cached.
    pub(crate) fn persist(&self, offset: usize, len: usize, how: Persistence) -> io::Result<()> {
        self.check(offset, len);
        if len == 0 {
            return Ok(());
        }
        match how {
            Persistence::CacheFlush(instruction) => {
                self.flush_lines(offset, len, instruction);
                Ok(())
            }
            Persistence::Msync => self.msync(offset, len),
        }
    }

    fn msync(&self, offset: usize, len: usize) -> io::Result<()> {
        let page = page_bytes();
        let start = offset / page * page;
        let end = (offset + len).next_multiple_of(page).min(self.len);
        // SAFETY: `[start, end)` lies within the mapping (offset and len were
        // checked; rounding stays inside it since the mapping starts
        // page-aligned and `end` is clamped to its length); msync does not
        // change memory contents.
        let rc = unsafe {
            libc::msync(
                self.ptr.as_ptr().add(start).cast::<libc::c_void>(),
                end - start,
                libc::MS_SYNC,
            )
        };
        if rc != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    #[cfg(target_arch = "x86_64")]
    fn flush_lines(&self, offset: usize, len: usize, instruction: FlushInstruction) {
        let base = self.ptr.as_ptr() as usize;
        let first = (base + offset) / CACHE_LINE_BYTES * CACHE_LINE_BYTES;
        let end = base + offset + len;
        let mut line = first.max(base);
        // The first line may start before `offset` but never before the
        // mapping (page-aligned base); the last ends inside the mapping's
        // last page.
        while line < end {
            let p = line as *const u8;
            // SAFETY: `p` is inside the mapping (invariant 2, range checked in
            // `persist`); the flush instructions read no data into Rust, write
            // none, and fault only on unmapped addresses. Each was detected
            // with CPUID before a `Persistence::CacheFlush` naming it exists.
            unsafe {
                match instruction {
                    FlushInstruction::Clwb => {
                        std::arch::asm!("clwb [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    FlushInstruction::Clflushopt => {
                        std::arch::asm!("clflushopt [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                    FlushInstruction::Clflush => {
                        std::arch::asm!("clflush [{0}]", in(reg) p, options(nostack, preserves_flags))
                    }
                }
            }
            line += CACHE_LINE_BYTES;
        }
        // SAFETY: SFENCE only orders this thread's stores and flushes; SSE is
        // part of x86-64's baseline.
        unsafe { std::arch::x86_64::_mm_sfence() };
    }

    #[cfg(not(target_arch = "x86_64"))]
    fn flush_lines(&self, _offset: usize, _len: usize, instruction: FlushInstruction) {
        // `FlushInstruction::detect` returns None off x86-64, so no
        // `Persistence::CacheFlush` can be built here.
        unreachable!(
            "{} has no implementation on this architecture",
            instruction.name()
        );
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: exactly the mapping `map` created (invariant 1); no slice
        // into it outlives the `Mapping` (accesses copy in and out).
        let rc = unsafe { libc::munmap(self.ptr.as_ptr().cast::<libc::c_void>(), self.len) };
        if rc != 0 {
            tracing::error!(error = %io::Error::last_os_error(), "journal: munmap of the pmem region failed");
        }
    }
}

#[cfg(target_os = "linux")]
fn map_sync_flags() -> io::Result<libc::c_int> {
    Ok(libc::MAP_SHARED_VALIDATE | libc::MAP_SYNC)
}

#[cfg(not(target_os = "linux"))]
fn map_sync_flags() -> io::Result<libc::c_int> {
    Err(io::Error::new(
        io::ErrorKind::Unsupported,
        "MAP_SYNC exists on Linux only",
    ))
}

fn page_bytes() -> usize {
    // SAFETY: sysconf reads a constant of the running system.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(page)
        .ok()
        .filter(|p| *p > 0)
        .unwrap_or(4096)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn scratch(len: u64) -> (tempfile::NamedTempFile, File) {
        let named = tempfile::NamedTempFile::new().unwrap();
        let file = named.reopen().unwrap();
        file.set_len(len).unwrap();
        (named, file)
    }

    #[test]
    fn writes_read_back_and_reach_the_file() {
        use std::os::unix::fs::FileExt;
        let (_named, file) = scratch(1 << 16);
        let map = Mapping::map(&file, 1 << 16, MapSync::No).unwrap();
        map.write(4095, b"across a page");
        map.store_u64(8, 0x1122_3344_5566_7788);
        map.persist(0, 1 << 16, Persistence::Msync).unwrap();
        let mut out = [0u8; 13];
        map.read(4095, &mut out);
        assert_eq!(&out, b"across a page");
        let mut on_disk = [0u8; 8];
        file.read_exact_at(&mut on_disk, 8).unwrap();
        assert_eq!(u64::from_le_bytes(on_disk), 0x1122_3344_5566_7788);
    }

    #[test]
    fn every_flush_instruction_the_cpu_has_runs() {
        let (_named, file) = scratch(1 << 16);
        let map = Mapping::map(&file, 1 << 16, MapSync::No).unwrap();
        map.write(100, &[7u8; 3000]);
        let best = FlushInstruction::detect();
        let candidates = [
            FlushInstruction::Clwb,
            FlushInstruction::Clflushopt,
            FlushInstruction::Clflush,
        ];
        // Everything from the best one down is present (CLFLUSH always is).
        let start = best.map_or(candidates.len(), |b| {
            candidates.iter().position(|c| *c == b).unwrap()
        });
        for instruction in &candidates[start..] {
            map.persist(100, 3000, Persistence::CacheFlush(*instruction))
                .unwrap();
            map.persist(0, 1 << 16, Persistence::CacheFlush(*instruction))
                .unwrap();
        }
        let mut out = [0u8; 3000];
        map.read(100, &mut out);
        assert!(out.iter().all(|b| *b == 7));
    }

    #[test]
    #[should_panic(expected = "outside")]
    fn an_access_past_the_end_is_refused() {
        let (_named, file) = scratch(4096);
        let map = Mapping::map(&file, 4096, MapSync::No).unwrap();
        map.write(4090, b"too long");
    }
}
