//! Where catch-up reads run: the log reads a subscription's read-ahead
//! issues (`read_ahead`), with the ledger reads and, in `vela standalone`,
//! the bookie's storage reads under them, go to a small tokio runtime of
//! their own whose threads run at a lower CPU priority than the rest of the
//! broker (Linux: `nice`, per thread). On a busy machine the kernel then
//! runs the publish path (connection tasks, the ledger writer, the bookie's
//! journal threads) first, and a drain slows down instead of the producers;
//! on an idle one the catch-up threads take whatever CPU is free, so a
//! drain alone runs as fast as before.
//!
//! Owns: [`ReadPool`] and its runtime (one worker thread for the reads'
//! futures; its blocking pool holds the storage reads, each thread niced as
//! it starts).
//! Guarantees: a read spawned here runs to completion or is aborted like
//! any tokio task; nice 0 (`BrokerConfig::catch_up_read_nice`) runs the
//! reads on the caller's runtime, as before this pool existed.
//! Never: runs anything but log reads, or changes the priority of a thread
//! it did not start. What a read starts lazily stays where it belongs: the
//! ledger client's TCP connections to bookies are made on the runtime of
//! their transport (`vela_ledger::BookieClientTransport`), not here.

use std::future::Future;

use tokio::runtime::{Handle, Runtime};
use tokio::task::JoinHandle;

/// Worker threads of the pool's runtime: the reads' futures only wait (the
/// storage reads and their CRC checks run on its blocking threads, one per
/// read, bounded by the bookie transport).
const READ_POOL_WORKER_THREADS: usize = 1;

/// Blocking threads of the pool's runtime: the storage reads of
/// `vela standalone`'s in-process bookies, of which at most
/// `--log-reads-in-flight` are at the disk at once and the rest are read
/// cache hits and CRC checks, so a few threads keep both cores busy. More
/// would only wait at the disk's gate, each with a heap of its own holding
/// the read buffers it made until it runs again.
const READ_POOL_BLOCKING_THREADS_MAX: usize = 8;

/// Largest nice value (Linux: 19, the lowest priority).
pub(crate) const READ_NICE_MAX: i32 = 19;

/// The runtime catch-up reads run on.
#[derive(Debug)]
pub(crate) struct ReadPool {
    /// `None`: reads run on the runtime that spawns them (nice 0).
    runtime: Option<Runtime>,
}

impl ReadPool {
    /// A pool whose threads run at `nice` (0..=`READ_NICE_MAX`; 0: no pool,
    /// reads run on the caller's runtime). A nice value the kernel refuses
    /// is logged once per thread and the thread runs at the usual priority.
    pub(crate) fn new(nice: i32) -> std::io::Result<ReadPool> {
        debug_assert!((0..=READ_NICE_MAX).contains(&nice));
        if nice <= 0 {
            return Ok(ReadPool { runtime: None });
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(READ_POOL_WORKER_THREADS)
            .max_blocking_threads(READ_POOL_BLOCKING_THREADS_MAX)
            .thread_name("vela-catch-up")
            .on_thread_start(move || lower_priority(nice))
            .enable_all()
            .build()?;
        Ok(ReadPool {
            runtime: Some(runtime),
        })
    }

    /// A pool that runs reads on the caller's runtime (tests).
    #[cfg(test)]
    pub(crate) fn inline() -> ReadPool {
        ReadPool { runtime: None }
    }

    /// Whether reads run on threads of their own.
    #[cfg(test)]
    pub(crate) fn is_separate(&self) -> bool {
        self.runtime.is_some()
    }

    /// Runs `read` on the pool (or on the current runtime without one).
    pub(crate) fn spawn<F>(&self, read: F) -> JoinHandle<F::Output>
    where
        F: Future + Send + 'static,
        F::Output: Send + 'static,
    {
        match &self.runtime {
            Some(runtime) => runtime.spawn(read),
            None => Handle::current().spawn(read),
        }
    }
}

impl Drop for ReadPool {
    fn drop(&mut self) {
        // Dropped from async code too (the broker's service): the runtime
        // must not block there. Reads still running are abandoned with it.
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// Lowers the calling thread's CPU priority to `nice` (Linux only: a
/// thread's nice value is its own there).
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn lower_priority(nice: i32) {
    // SAFETY: gettid has no preconditions and cannot fail.
    let tid = unsafe { libc::gettid() };
    // SAFETY: setpriority reads only its integer arguments; PRIO_PROCESS
    // with a thread id changes that one thread on Linux.
    let result = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, nice) };
    if result != 0 {
        let error = std::io::Error::last_os_error();
        tracing::warn!(nice, %error, "cannot lower a catch-up read thread's priority");
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority(_nice: i32) {}

/// The calling thread's nice value (Linux), for tests.
#[cfg(all(test, target_os = "linux"))]
#[allow(unsafe_code)]
fn current_nice() -> i32 {
    // SAFETY: as in `lower_priority`; getpriority may return -1 legitimately,
    // which the tests never set.
    unsafe { libc::getpriority(libc::PRIO_PROCESS, libc::gettid() as libc::id_t) }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Reads spawned on a pool run on its niced threads, and so do the
    /// blocking reads they start; nice 0 keeps them on the caller's runtime.
    #[cfg(target_os = "linux")]
    #[tokio::test]
    async fn reads_run_on_lowered_threads() {
        let base = current_nice();
        let nice = (base + 5).min(READ_NICE_MAX);
        let pool = ReadPool::new(nice).unwrap();
        assert!(pool.is_separate());
        let (worker, blocking) = pool
            .spawn(async {
                let worker = current_nice();
                let blocking = tokio::task::spawn_blocking(current_nice).await.unwrap();
                (worker, blocking)
            })
            .await
            .unwrap();
        assert_eq!(worker, nice);
        assert_eq!(blocking, nice);
        assert_eq!(current_nice(), base, "the caller's thread is left alone");
        drop(pool);

        let inline = ReadPool::new(0).unwrap();
        assert!(!inline.is_separate());
        assert_eq!(inline.spawn(async { current_nice() }).await.unwrap(), base);
    }
}
