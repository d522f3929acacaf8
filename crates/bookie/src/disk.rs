//! Disk space of the bookie's directories, and the thresholds that turn the
//! bookie read-only before a disk fills (BookKeeper's `diskUsageThreshold` and
//! `diskUsageLwmThreshold`).
//!
//! Owns: `DiskThresholds` (validated), `DiskUsage` and the probe that measures
//! it (`statvfs`, or a test double). The one `unsafe` block of this module is
//! the `statvfs` call.
//! Never: decides what the bookie does with a measure (`Bookie`'s disk monitor
//! does), or writes anything.

use std::ffi::CString;
use std::fmt;
use std::io;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

/// Whether a directory's filesystem takes an aligned O_DIRECT write (the probe
/// the journal's `auto` backend and the entry logs decide by; `vela doctor`
/// reports it).
pub use crate::direct_io::direct_io_works;

/// Default usage at which a bookie turns read-only: BookKeeper's default. On a
/// 1 TB disk that leaves 50 GB for what is in flight (write cache flushes,
/// journal files being filled, compaction).
pub const DISK_USAGE_MAX_DEFAULT: f64 = 0.95;

/// Default usage below which a read-only bookie takes adds again: 5 points
/// under the max, so a disk hovering at the threshold does not flap.
pub const DISK_USAGE_LWM_DEFAULT: f64 = 0.90;

/// Default period of the disk check: a `statvfs` per directory costs a few
/// µs; at 1 s a disk filling at 500 MB/s moves 0.05 % of 1 TB between checks.
pub const DISK_CHECK_INTERVAL_DEFAULT: Duration = Duration::from_secs(1);

/// When a bookie turns read-only, and back.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct DiskThresholds {
    /// Used fraction (0..=1) of any bookie directory's filesystem at or above
    /// which the bookie refuses new adds. 1.0: only when completely full.
    pub usage_max: f64,
    /// Used fraction below which (on every directory) a read-only bookie takes
    /// adds again, and a failed one reopens its journal and storage.
    pub usage_lwm: f64,
    /// How often the usage is measured.
    pub check_interval: Duration,
}

impl Default for DiskThresholds {
    fn default() -> DiskThresholds {
        DiskThresholds {
            usage_max: DISK_USAGE_MAX_DEFAULT,
            usage_lwm: DISK_USAGE_LWM_DEFAULT,
            check_interval: DISK_CHECK_INTERVAL_DEFAULT,
        }
    }
}

impl DiskThresholds {
    /// Checks `0 < usage_lwm <= usage_max <= 1` and a check interval of
    /// 10 ms..=1 h.
    pub fn validate(&self) -> Result<(), String> {
        if !(self.usage_max > 0.0 && self.usage_max <= 1.0) {
            return Err(format!(
                "disk usage max {} must be in (0, 1]",
                self.usage_max
            ));
        }
        if !(self.usage_lwm > 0.0 && self.usage_lwm <= self.usage_max) {
            return Err(format!(
                "disk usage low-water mark {} must be in (0, usage max {}]",
                self.usage_lwm, self.usage_max
            ));
        }
        if self.check_interval < Duration::from_millis(10)
            || self.check_interval > Duration::from_secs(3600)
        {
            return Err(format!(
                "disk check interval {:?} must be 10 ms..=1 h",
                self.check_interval
            ));
        }
        Ok(())
    }
}

/// Size and free space of one filesystem, as `df` counts them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DiskUsage {
    /// Space writers can use at all: used plus available (blocks reserved
    /// for root are left out, as `df`'s Use% leaves them out, so a bookie
    /// turns read-only when `df` shows the threshold).
    pub total_bytes: u64,
    /// Space an unprivileged writer can still use (`f_bavail`: the bookie
    /// does not count on the blocks reserved for root).
    pub available_bytes: u64,
}

impl DiskUsage {
    /// Used fraction, 0..=1 (a filesystem of size 0 counts as full).
    pub fn used_fraction(&self) -> f64 {
        if self.total_bytes == 0 {
            return 1.0;
        }
        let available = self.available_bytes.min(self.total_bytes);
        1.0 - available as f64 / self.total_bytes as f64
    }
}

type ProbeFn = dyn Fn(&Path) -> io::Result<DiskUsage> + Send + Sync;

/// How the bookie measures a directory's filesystem: `statvfs`, or in tests
/// a function that says what the disk looks like.
#[derive(Clone)]
pub struct DiskProbe(Arc<ProbeFn>);

impl DiskProbe {
    /// The real thing: `statvfs(2)`.
    pub fn statvfs() -> DiskProbe {
        DiskProbe(Arc::new(statvfs_usage))
    }

    /// A probe answering with `probe` (tests simulate a filling disk).
    pub fn new(probe: impl Fn(&Path) -> io::Result<DiskUsage> + Send + Sync + 'static) -> Self {
        DiskProbe(Arc::new(probe))
    }

    /// Measures the filesystem holding `path`.
    pub fn measure(&self, path: &Path) -> io::Result<DiskUsage> {
        (self.0)(path)
    }
}

impl Default for DiskProbe {
    fn default() -> DiskProbe {
        DiskProbe::statvfs()
    }
}

impl fmt::Debug for DiskProbe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("DiskProbe")
    }
}

/// `statvfs(2)` of the filesystem holding `path`.
pub fn statvfs_usage(path: &Path) -> io::Result<DiskUsage> {
    let c_path = CString::new(path.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "path holds a NUL byte"))?;
    let mut stat = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `c_path` is a NUL-terminated string that outlives the call and
    // `stat` points to writable memory of the struct's size; statvfs only
    // writes the struct, and we read it only when the call succeeded.
    #[allow(unsafe_code)]
    let stat = unsafe {
        if libc::statvfs(c_path.as_ptr(), stat.as_mut_ptr()) != 0 {
            return Err(io::Error::last_os_error());
        }
        stat.assume_init()
    };
    // Field widths differ between platforms; all are unsigned counts.
    #[allow(clippy::unnecessary_cast)]
    let (blocks, free, available, fragment) = (
        stat.f_blocks as u64,
        stat.f_bfree as u64,
        stat.f_bavail as u64,
        stat.f_frsize as u64,
    );
    // df: Use% = used / (used + available), used = blocks - free.
    let used = blocks.saturating_sub(free);
    Ok(DiskUsage {
        total_bytes: used.saturating_add(available).saturating_mul(fragment),
        available_bytes: available.saturating_mul(fragment),
    })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn statvfs_measures_a_real_directory() {
        let dir = tempfile::tempdir().unwrap();
        let usage = statvfs_usage(dir.path()).unwrap();
        assert!(usage.total_bytes > 0);
        assert!(usage.available_bytes <= usage.total_bytes);
        let used = usage.used_fraction();
        assert!((0.0..=1.0).contains(&used), "{used}");
        assert!(statvfs_usage(&dir.path().join("missing")).is_err());
    }

    #[test]
    fn used_fraction_and_thresholds() {
        let usage = |available_bytes| DiskUsage {
            total_bytes: 1000,
            available_bytes,
        };
        assert_eq!(usage(1000).used_fraction(), 0.0);
        assert_eq!(usage(0).used_fraction(), 1.0);
        assert!((usage(50).used_fraction() - 0.95).abs() < 1e-9);
        assert_eq!(
            DiskUsage {
                total_bytes: 0,
                available_bytes: 0
            }
            .used_fraction(),
            1.0
        );
        assert!(DiskThresholds::default().validate().is_ok());
        for (usage_max, usage_lwm) in [(0.0, 0.0), (1.5, 0.9), (0.9, 0.95), (0.9, 0.0)] {
            let thresholds = DiskThresholds {
                usage_max,
                usage_lwm,
                ..DiskThresholds::default()
            };
            assert!(thresholds.validate().is_err(), "{usage_max} {usage_lwm}");
        }
    }
}
