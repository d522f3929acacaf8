//! The process's allocator: mimalloc (ARCHITECTURE.md, "Memory model"), or
//! the system's (glibc malloc) when the environment has
//! `VELA_SYSTEM_ALLOCATOR=1` at start, so that heap profilers which
//! interpose malloc (heaptrack, valgrind) see every allocation
//! (`bench/idle_topics.py --heaptrack`).
//!
//! Owns: the choice, made once at the process's first allocation and kept.
//! Never: changes allocator afterwards (a block is always freed by the
//! allocator that made it), or allocates while choosing.
#![allow(unsafe_code)]

use std::alloc::{GlobalAlloc, Layout, System};
use std::sync::atomic::{AtomicU8, Ordering};

const UNDECIDED: u8 = 0;
const MIMALLOC: u8 = 1;
const SYSTEM: u8 = 2;

/// The choice, once made.
static CHOICE: AtomicU8 = AtomicU8::new(UNDECIDED);

/// mimalloc, or malloc under `VELA_SYSTEM_ALLOCATOR=1`.
#[derive(Debug)]
pub(crate) struct VelaAllocator;

#[inline]
fn system() -> bool {
    match CHOICE.load(Ordering::Relaxed) {
        MIMALLOC => false,
        SYSTEM => true,
        _ => decide(),
    }
}

#[cold]
fn decide() -> bool {
    // SAFETY: `getenv` reads the environment block without allocating; the
    // first allocation happens before `main`, when nothing writes the
    // environment.
    let value = unsafe { libc::getenv(c"VELA_SYSTEM_ALLOCATOR".as_ptr()) };
    // SAFETY: a non-null `getenv` answer points at a NUL-terminated string.
    let wanted = !value.is_null() && unsafe { *value } == b'1' as libc::c_char;
    let choice = if wanted { SYSTEM } else { MIMALLOC };
    // Threads racing here read the same environment: the same answer.
    match CHOICE.compare_exchange(UNDECIDED, choice, Ordering::Relaxed, Ordering::Relaxed) {
        Ok(_) => wanted,
        Err(made) => made == SYSTEM,
    }
}

// SAFETY: every call goes to one allocator for the process's lifetime (the
// choice never changes once made), which upholds `GlobalAlloc`'s contract.
unsafe impl GlobalAlloc for VelaAllocator {
    #[inline]
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            if system() {
                System.alloc(layout)
            } else {
                mimalloc::MiMalloc.alloc(layout)
            }
        }
    }

    #[inline]
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's guarantees.
        unsafe {
            if system() {
                System.alloc_zeroed(layout)
            } else {
                mimalloc::MiMalloc.alloc_zeroed(layout)
            }
        }
    }

    #[inline]
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: `ptr` came from the same allocator (the choice is fixed).
        unsafe {
            if system() {
                System.dealloc(ptr, layout)
            } else {
                mimalloc::MiMalloc.dealloc(ptr, layout)
            }
        }
    }

    #[inline]
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` came from the same allocator (the choice is fixed).
        unsafe {
            if system() {
                System.realloc(ptr, layout, new_size)
            } else {
                mimalloc::MiMalloc.realloc(ptr, layout, new_size)
            }
        }
    }
}
