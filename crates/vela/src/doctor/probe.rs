//! What `vela doctor` measures and reads: each directory's filesystem, mount,
//! device, O_DIRECT and MAP_SYNC answers and depth-1 fdatasync latency, and
//! the kernel settings the rules look at. Missing files (a VM without cpufreq,
//! a kernel without THP) read as `None`, never as errors.
//!
//! Owns: the report types, serialized as `vela doctor --json` prints them
//! (field names are a promise to scripts: add, never rename).
//! Never: writes outside the scratch files of the measurements (removed after).

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::Context;
use serde::Serialize;

/// Bytes per measured write: one 1 KiB entry in a 4 KiB block, the journal's
/// lone-entry write.
const FSYNC_WRITE_BYTES: usize = 1024;

/// Which bookie directory a report is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Role {
    Journal,
    Ledger,
    JournalPmem,
}

/// One directory.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct DirReport {
    pub(crate) role: Role,
    pub(crate) path: PathBuf,
    /// `major:minor` of the filesystem (`st_dev`).
    pub(crate) device: String,
    /// The whole disk under it (`vda` for `vda1`), from /sys/dev/block; none
    /// for filesystems without a block device (tmpfs).
    pub(crate) disk: Option<String>,
    /// /sys/block/DISK/queue/rotational.
    pub(crate) rotational: Option<bool>,
    pub(crate) fs_type: Option<String>,
    pub(crate) mount_point: Option<PathBuf>,
    pub(crate) mount_source: Option<String>,
    /// The mount's options then the superblock's, as /proc/self/mountinfo
    /// lists them.
    pub(crate) mount_options: Option<String>,
    /// `dax` among the mount options (persistent memory mapped directly).
    pub(crate) dax: bool,
    /// Whether an aligned O_DIRECT write works here.
    pub(crate) o_direct: bool,
    /// The error when it does not.
    pub(crate) o_direct_error: Option<String>,
    /// For the pmem directory: whether mmap grants MAP_SYNC, and the cache
    /// flush instruction the journal would use.
    pub(crate) map_sync: Option<MapSync>,
    /// Depth-1 write + fdatasync latency (not for the pmem directory, whose
    /// journal does no fdatasync).
    pub(crate) fsync: Option<FsyncFigures>,
}

#[derive(Debug, Clone, Serialize)]
pub(crate) struct MapSync {
    pub(crate) granted: bool,
    pub(crate) flush_instruction: Option<String>,
    pub(crate) error: Option<String>,
}

/// 4 KiB write (1 KiB of data) + fdatasync at depth 1 into a zero-filled file.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct FsyncFigures {
    pub(crate) samples: u64,
    pub(crate) seconds: f64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
    pub(crate) p999_us: u64,
    pub(crate) max_us: u64,
}

/// Kernel settings that decide how write-back, paging and idle CPUs treat a
/// journal. `None`: not visible here.
#[derive(Debug, Clone, Default, Serialize)]
pub(crate) struct KernelSettings {
    pub(crate) release: Option<String>,
    pub(crate) mem_total_bytes: Option<u64>,
    pub(crate) dirty_ratio: Option<u64>,
    pub(crate) dirty_background_ratio: Option<u64>,
    pub(crate) dirty_bytes: Option<u64>,
    pub(crate) dirty_background_bytes: Option<u64>,
    pub(crate) dirty_expire_centisecs: Option<u64>,
    pub(crate) dirty_writeback_centisecs: Option<u64>,
    /// What the kernel lets dirty before writers are throttled: dirty_bytes,
    /// else dirty_ratio percent of memory (of MemTotal: the kernel's base,
    /// free plus reclaimable memory, is a little smaller).
    pub(crate) dirty_limit_bytes: Option<u64>,
    /// Where background write-back starts, the same way.
    pub(crate) dirty_background_limit_bytes: Option<u64>,
    /// The selected value of /sys/kernel/mm/transparent_hugepage/enabled.
    pub(crate) transparent_hugepage: Option<String>,
    pub(crate) transparent_hugepage_defrag: Option<String>,
    /// Distinct cpufreq governors of the CPUs (empty: no cpufreq, as in most
    /// VMs).
    pub(crate) cpu_governors: Vec<String>,
    pub(crate) clocksource: Option<String>,
    /// cpuidle driver (`haltpoll` in a KVM guest that polls before halting).
    pub(crate) cpuidle_driver: Option<String>,
    /// Guest halt polling window (cpuidle-haltpoll), ns.
    pub(crate) guest_halt_poll_ns: Option<u64>,
    /// Host halt polling window (kvm module), ns: visible on a KVM host.
    pub(crate) kvm_halt_poll_ns: Option<u64>,
}

/// Everything measured and read, before the rules.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Facts {
    pub(crate) dirs: Vec<DirReport>,
    pub(crate) kernel: KernelSettings,
}

/// Measures one directory (which must exist).
pub(crate) fn dir_report(
    role: Role,
    path: &Path,
    fsync_duration: Duration,
) -> anyhow::Result<DirReport> {
    let meta =
        std::fs::metadata(path).with_context(|| format!("cannot stat {}", path.display()))?;
    anyhow::ensure!(meta.is_dir(), "{} is not a directory", path.display());
    let canonical = std::fs::canonicalize(path)
        .with_context(|| format!("cannot resolve {}", path.display()))?;
    let (major, minor) = split_dev(meta.dev());
    let device = format!("{major}:{minor}");
    let mount = read_to_string("/proc/self/mountinfo")
        .and_then(|info| find_mount(&info, &device, &canonical));
    let disk = whole_disk(&device);
    let rotational = disk
        .as_ref()
        .and_then(|d| read_trimmed(&format!("/sys/block/{d}/queue/rotational")))
        .map(|r| r == "1");
    let (o_direct, o_direct_error) = match vela_bookie::disk::direct_io_works(path) {
        Ok(()) => (true, None),
        Err(error) => (false, Some(error.to_string())),
    };
    let map_sync = (role == Role::JournalPmem)
        .then(|| vela_bookie::journal::pmem::probe_map_sync(path))
        .transpose()
        .with_context(|| format!("cannot probe MAP_SYNC in {}", path.display()))?
        .map(|probe| match probe {
            vela_bookie::journal::pmem::MapSyncProbe::Granted { flush_instruction } => MapSync {
                granted: true,
                flush_instruction: flush_instruction.map(str::to_string),
                error: None,
            },
            vela_bookie::journal::pmem::MapSyncProbe::Refused { error } => MapSync {
                granted: false,
                flush_instruction: None,
                error: Some(error),
            },
        });
    let fsync = if role == Role::JournalPmem {
        None
    } else {
        let summary = crate::perf::disk::measure(path, FSYNC_WRITE_BYTES, fsync_duration)
            .with_context(|| format!("cannot measure fdatasync in {}", path.display()))?;
        let us = |ms: f64| (ms * 1000.0).round() as u64;
        Some(FsyncFigures {
            samples: summary.messages,
            seconds: summary.duration_s,
            p50_us: us(summary.latency_ms.p50),
            p99_us: us(summary.latency_ms.p99),
            p999_us: us(summary.latency_ms.p999),
            max_us: us(summary.latency_ms.max),
        })
    };
    let dax = mount.as_ref().is_some_and(|m| {
        m.options
            .split(',')
            .any(|o| o == "dax" || o == "dax=always")
    });
    Ok(DirReport {
        role,
        path: path.to_path_buf(),
        device,
        disk,
        rotational,
        fs_type: mount.as_ref().map(|m| m.fs_type.clone()),
        mount_point: mount.as_ref().map(|m| m.mount_point.clone()),
        mount_source: mount.as_ref().map(|m| m.source.clone()),
        mount_options: mount.map(|m| m.options),
        dax,
        o_direct,
        o_direct_error,
        map_sync,
        fsync,
    })
}

/// glibc's encoding of `dev_t`.
fn split_dev(dev: u64) -> (u64, u64) {
    let major = ((dev >> 8) & 0xfff) | ((dev >> 32) & !0xfff);
    let minor = (dev & 0xff) | ((dev >> 12) & !0xff);
    (major, minor)
}

/// A mount from /proc/self/mountinfo.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Mount {
    pub(crate) mount_point: PathBuf,
    pub(crate) fs_type: String,
    pub(crate) source: String,
    /// Per-mount options, then the superblock's.
    pub(crate) options: String,
}

/// The mount holding `path` (canonical): among the lines with its device,
/// the longest mount point that is a prefix of the path (the last one listed
/// wins a tie: it is mounted over the others).
pub(crate) fn find_mount(mountinfo: &str, device: &str, path: &Path) -> Option<Mount> {
    let mut best: Option<Mount> = None;
    for line in mountinfo.lines() {
        // id parent major:minor root mount-point options [optional...] - type source super-options
        let Some((before, after)) = line.split_once(" - ") else {
            continue;
        };
        let fields: Vec<&str> = before.split(' ').collect();
        let tail: Vec<&str> = after.split(' ').collect();
        if fields.len() < 6 || tail.len() < 3 || fields[2] != device {
            continue;
        }
        let mount_point = PathBuf::from(unescape_mountinfo(fields[4]));
        if !path.starts_with(&mount_point) {
            continue;
        }
        let longer = best
            .as_ref()
            .is_none_or(|b| mount_point.as_os_str().len() >= b.mount_point.as_os_str().len());
        if longer {
            best = Some(Mount {
                mount_point,
                fs_type: tail[0].to_string(),
                source: unescape_mountinfo(tail[1]),
                options: format!("{},{}", fields[5], tail[2]),
            });
        }
    }
    best
}

/// mountinfo escapes space, tab, newline and backslash as octal (`\040`).
fn unescape_mountinfo(field: &str) -> String {
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes
            .get(i + 1..i + 4)
            .filter(|d| bytes[i] == b'\\' && d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match octal {
            Some(d) => {
                let code = d.iter().fold(0u32, |n, b| n * 8 + u32::from(b - b'0'));
                out.push(u8::try_from(code).unwrap_or(b'?'));
                i += 4;
            }
            None => {
                out.push(bytes[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The whole disk of block device `major:minor`: /sys/dev/block/M:m links to
/// the device's directory, a partition's directory sits inside its disk's.
fn whole_disk(device: &str) -> Option<String> {
    let link = PathBuf::from(format!("/sys/dev/block/{device}"));
    let target = std::fs::canonicalize(&link).ok()?;
    let dir = if target.join("partition").exists() {
        target.parent()?.to_path_buf()
    } else {
        target
    };
    dir.file_name()?.to_str().map(str::to_string)
}

fn read_to_string(path: &str) -> Option<String> {
    std::fs::read_to_string(path).ok()
}

fn read_trimmed(path: &str) -> Option<String> {
    read_to_string(path).map(|s| s.trim().to_string())
}

fn read_u64(path: &str) -> Option<u64> {
    read_trimmed(path)?.parse().ok()
}

/// The bracketed choice of a sysfs selector (`always [madvise] never`).
pub(crate) fn selected(choices: &str) -> Option<String> {
    let start = choices.find('[')?;
    let end = choices[start..].find(']')? + start;
    Some(choices[start + 1..end].to_string())
}

/// The kernel's settings, as far as this machine shows them.
pub(crate) fn kernel_settings() -> KernelSettings {
    let mem_total_bytes = read_to_string("/proc/meminfo").and_then(|info| {
        info.lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|rest| {
                rest.trim()
                    .trim_end_matches("kB")
                    .trim()
                    .parse::<u64>()
                    .ok()
            })
            .map(|kib| kib * 1024)
    });
    let vm = |name: &str| read_u64(&format!("/proc/sys/vm/{name}"));
    let (dirty_ratio, dirty_bytes) = (vm("dirty_ratio"), vm("dirty_bytes"));
    let (background_ratio, background_bytes) =
        (vm("dirty_background_ratio"), vm("dirty_background_bytes"));
    let limit = |bytes: Option<u64>, ratio: Option<u64>| match (bytes, ratio, mem_total_bytes) {
        (Some(b), _, _) if b > 0 => Some(b),
        (_, Some(r), Some(mem)) => Some(mem / 100 * r),
        _ => None,
    };
    let mut cpu_governors: Vec<String> = std::fs::read_dir("/sys/devices/system/cpu")
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .and_then(|n| n.strip_prefix("cpu"))
                        .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
                })
                .filter_map(|e| {
                    std::fs::read_to_string(e.path().join("cpufreq/scaling_governor")).ok()
                })
                .map(|g| g.trim().to_string())
                .collect()
        })
        .unwrap_or_default();
    cpu_governors.sort();
    cpu_governors.dedup();
    KernelSettings {
        release: read_trimmed("/proc/sys/kernel/osrelease"),
        mem_total_bytes,
        dirty_ratio,
        dirty_background_ratio: background_ratio,
        dirty_bytes,
        dirty_background_bytes: background_bytes,
        dirty_expire_centisecs: vm("dirty_expire_centisecs"),
        dirty_writeback_centisecs: vm("dirty_writeback_centisecs"),
        dirty_limit_bytes: limit(dirty_bytes, dirty_ratio),
        dirty_background_limit_bytes: limit(background_bytes, background_ratio),
        transparent_hugepage: read_to_string("/sys/kernel/mm/transparent_hugepage/enabled")
            .and_then(|s| selected(&s)),
        transparent_hugepage_defrag: read_to_string("/sys/kernel/mm/transparent_hugepage/defrag")
            .and_then(|s| selected(&s)),
        cpu_governors,
        clocksource: read_trimmed(
            "/sys/devices/system/clocksource/clocksource0/current_clocksource",
        ),
        cpuidle_driver: read_trimmed("/sys/devices/system/cpu/cpuidle/current_driver"),
        guest_halt_poll_ns: read_u64("/sys/module/haltpoll/parameters/guest_halt_poll_ns"),
        kvm_halt_poll_ns: read_u64("/sys/module/kvm/parameters/halt_poll_ns"),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    const MOUNTINFO: &str = "\
22 27 0:21 / /proc rw,relatime - proc proc rw
25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684092k
27 1 254:0 / / rw,relatime - ext4 /dev/vda rw,discard
30 25 0:27 / /dev/shm rw,nosuid - tmpfs tmpfs rw,size=100k
31 27 259:3 / /mnt/pmem\\0400 rw,noatime shared:5 - xfs /dev/pmem0 rw,dax=always
";

    #[test]
    fn the_mount_of_a_path_is_its_device_s_longest_prefix() {
        let root = find_mount(MOUNTINFO, "254:0", Path::new("/work/data")).unwrap();
        assert_eq!(root.mount_point, PathBuf::from("/"));
        assert_eq!(root.fs_type, "ext4");
        assert_eq!(root.options, "rw,relatime,rw,discard");
        // Mounted over: the device says which.
        let shm = find_mount(MOUNTINFO, "0:27", Path::new("/dev/shm/x")).unwrap();
        assert_eq!(shm.options, "rw,nosuid,rw,size=100k");
        // Optional fields, an escaped space.
        let pmem = find_mount(MOUNTINFO, "259:3", Path::new("/mnt/pmem 0/journal")).unwrap();
        assert_eq!(pmem.mount_point, PathBuf::from("/mnt/pmem 0"));
        assert_eq!(pmem.source, "/dev/pmem0");
        assert!(pmem.options.split(',').any(|o| o == "dax=always"));
        assert!(find_mount(MOUNTINFO, "9:9", Path::new("/x")).is_none());
    }

    #[test]
    fn dev_numbers_and_selectors_decode() {
        assert_eq!(split_dev(0xfe00), (254, 0));
        assert_eq!(split_dev(0x1b), (0, 27));
        assert_eq!(
            selected("always [madvise] never\n").as_deref(),
            Some("madvise")
        );
        assert_eq!(selected("none"), None);
    }
}
