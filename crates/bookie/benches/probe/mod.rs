//! The depth-1 fdatasync probe the storage and GC benches run beside the work
//! they measure: 4 KiB writes, each followed by fdatasync, into a file whose
//! blocks are already allocated and synced, so each sync carries data only.
//! Latencies in microseconds.

use std::fs::{File, OpenOptions};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;

/// The probe's file: written round and round.
pub(crate) const PROBE_FILE_BYTES: u64 = 64 * 1024 * 1024;
/// One probe write.
pub(crate) const PROBE_WRITE_BYTES: usize = 4096;

/// A histogram of microseconds, 1 us to 60 s.
pub(crate) fn hist() -> Histogram<u64> {
    Histogram::new_with_bounds(1, 60_000_000, 3).unwrap()
}

/// Records the microseconds since `t` (at least 1).
pub(crate) fn record(h: &mut Histogram<u64>, t: Instant) {
    h.saturating_record((t.elapsed().as_micros() as u64).max(1));
}

/// `n`, p50, p99, p99.9 and max of `h`.
pub(crate) fn summary(h: &Histogram<u64>) -> String {
    format!(
        "n={} p50={}us p99={}us p99.9={}us max={}us",
        h.len(),
        h.value_at_quantile(0.5),
        h.value_at_quantile(0.99),
        h.value_at_quantile(0.999),
        h.max()
    )
}

/// A zero-filled, synced file, so the probe's fdatasync never commits metadata.
pub(crate) fn prepare_probe_file(path: &Path) {
    let f = OpenOptions::new()
        .create(true)
        .write(true)
        .truncate(true)
        .open(path)
        .unwrap();
    let zeros = vec![0u8; 1024 * 1024];
    for i in 0..PROBE_FILE_BYTES / zeros.len() as u64 {
        f.write_all_at(&zeros, i * zeros.len() as u64).unwrap();
    }
    f.sync_all().unwrap();
}

fn probe_once(f: &File, h: &mut Histogram<u64>, offset: &mut u64) {
    let buf = [0xa5u8; PROBE_WRITE_BYTES];
    let t = Instant::now();
    f.write_all_at(&buf, *offset).unwrap();
    f.sync_data().unwrap();
    record(h, t);
    *offset = (*offset + PROBE_WRITE_BYTES as u64) % PROBE_FILE_BYTES;
}

/// Probes `path` for `d`, on this thread.
pub(crate) fn run_probe_for(path: &Path, d: Duration) -> Histogram<u64> {
    let f = OpenOptions::new().write(true).open(path).unwrap();
    let mut h = hist();
    let mut off = 0;
    let end = Instant::now() + d;
    while Instant::now() < end {
        probe_once(&f, &mut h, &mut off);
    }
    h
}

/// Probes `path` on a thread of its own until `stop`.
pub(crate) fn spawn_probe(path: PathBuf, stop: Arc<AtomicBool>) -> JoinHandle<Histogram<u64>> {
    std::thread::spawn(move || {
        let f = OpenOptions::new().write(true).open(&path).unwrap();
        let mut h = hist();
        let mut off = 0;
        while !stop.load(Ordering::Acquire) {
            probe_once(&f, &mut h, &mut off);
        }
        h
    })
}
