//! The journal threads' I/O priority: class realtime for the writer and the
//! force-write thread (Linux `ioprio_set` on the calling thread).
//!
//! Why: the block layer's scheduler (mq-deadline, bfq) keeps one queue per
//! priority class and dispatches realtime requests before best-effort ones.
//! At best effort a journal write shares the write queue with everything else
//! on the device, sorted by sector: page-cache writeback (the flusher wakes
//! every `dirty_writeback_centisecs`, 5 s by default, and queues whatever
//! expired at once: 100-200 MiB at a time on the benchmark VM while other
//! builds ran), entry-log flushes and reads. Measured there (virtio,
//! mq-deadline, `backlog-while-producing`), a block trace of one run: each
//! of its four journal stalls of 18-51 ms (a slow write, then as slow an
//! fdatasync, every add behind them waiting) fell on one of the flusher's
//! bursts, and the stalled writes reached the device only after the burst
//! had (then served in under 1 ms). Queueing below the guest (the host's
//! device under load) and CPU starvation are out of this class's reach.
//!
//! Owns nothing; never changes what is written or when it is durable. A
//! thread that may not raise its class (no `CAP_SYS_NICE` or
//! `CAP_SYS_ADMIN`) stays best effort: the caller logs that once.

use super::stats::StatsCell;

/// `ioprio_set`/`ioprio_get` target: one thread (0 = the calling one).
#[cfg(target_os = "linux")]
const IOPRIO_WHO_PROCESS: libc::c_int = 1;
/// Priority classes (`include/uapi/linux/ioprio.h`).
#[cfg(target_os = "linux")]
pub(crate) const IOPRIO_CLASS_RT: u32 = 1;
#[cfg(target_os = "linux")]
const IOPRIO_CLASS_SHIFT: u32 = 13;
/// Level within the realtime class (0 highest, 7 lowest): the middle, so an
/// operator can still put something above the journal.
pub(crate) const JOURNAL_REALTIME_LEVEL: u32 = 4;

/// Moves the calling thread's I/O to class realtime at `level` (0..=7).
/// `Err` when the kernel refuses (typically `EPERM`) or on other systems
/// (`Unsupported`).
pub(crate) fn raise_current_thread_to_realtime(level: u32) -> std::io::Result<()> {
    debug_assert!(level <= 7, "I/O priority level {level} out of 0..=7");
    #[cfg(target_os = "linux")]
    {
        let value = (IOPRIO_CLASS_RT << IOPRIO_CLASS_SHIFT) | level.min(7);
        // SAFETY: ioprio_set takes three integers and reads no memory of
        // ours; `0` names the calling thread.
        #[allow(unsafe_code)]
        let result = unsafe {
            libc::syscall(
                libc::SYS_ioprio_set,
                IOPRIO_WHO_PROCESS,
                0 as libc::c_int,
                value as libc::c_int,
            )
        };
        if result == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }
    #[cfg(not(target_os = "linux"))]
    {
        let _ = level;
        Err(std::io::ErrorKind::Unsupported.into())
    }
}

/// The I/O priority class of thread `tid` (0: the calling thread).
#[cfg(all(test, target_os = "linux"))]
pub(crate) fn thread_class(tid: libc::pid_t) -> std::io::Result<u32> {
    // SAFETY: ioprio_get takes two integers and reads no memory of ours.
    #[allow(unsafe_code)]
    let result = unsafe { libc::syscall(libc::SYS_ioprio_get, IOPRIO_WHO_PROCESS, tid) };
    if result < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok((result as u32) >> IOPRIO_CLASS_SHIFT)
}

/// Called first thing by a journal thread: realtime I/O when `wanted`
/// (counted in the journal's stats), a log line when refused (once per
/// thread start, i.e. per journal open).
pub(crate) fn apply(wanted: bool, thread: &str, stats: &StatsCell) {
    if !wanted {
        return;
    }
    match raise_current_thread_to_realtime(JOURNAL_REALTIME_LEVEL) {
        Ok(()) => stats.record_realtime_io_thread(),
        Err(error) => tracing::info!(
            thread,
            %error,
            "journal: I/O priority class realtime refused; staying best effort \
             (journal writes may wait behind page-cache writeback)"
        ),
    }
}
