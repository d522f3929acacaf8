//! The doctor's rules: each turns the measured facts into a finding with a
//! severity, what was seen, why it matters (tied to what the seed analyses
//! measured, or saying it was not measured there) and the fix.
//!
//! Owns: the thresholds (named below, with their source). Never: measures or
//! reads anything (pure over `Facts`, so every rule is unit-tested).

use serde::Serialize;

use super::probe::{DirReport, Facts, Role};

/// Seed 001's applied vm.dirty_ratio: at most this percent of memory dirty.
const DIRTY_LIMIT_MEMORY_PERCENT_MAX: u64 = 2;
/// Seed 001's applied vm.dirty_background_ratio.
const DIRTY_BACKGROUND_MEMORY_PERCENT_MAX: u64 = 1;
/// Seed 001's applied vm.dirty_expire_centisecs.
const DIRTY_EXPIRE_CENTISECS_MAX: u64 = 500;
/// Seed 001's applied vm.dirty_writeback_centisecs.
const DIRTY_WRITEBACK_CENTISECS_MAX: u64 = 100;
/// Clock sources read through the vDSO (no system call per read).
const FAST_CLOCKSOURCES: [&str; 4] = [
    "tsc",
    "kvm-clock",
    "hyperv_clocksource_tsc_page",
    "arch_sys_counter",
];
/// Filesystems that live in memory.
const VOLATILE_FILESYSTEMS: [&str; 2] = ["tmpfs", "ramfs"];

/// How bad a finding is. Only `Fail` makes `vela doctor` exit non-zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum Severity {
    Ok,
    Info,
    /// Not applicable here, or not visible.
    Skip,
    Warn,
    Fail,
}

/// The rules, by the names `--ignore` and the JSON use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Rule {
    JournalFsyncP99,
    VolatileStorage,
    JournalLedgerSameDevice,
    WritebackDirty,
    WritebackExpire,
    JournalODirect,
    LedgerODirect,
    JournalPmemMapSync,
    TransparentHugepages,
    CpuGovernor,
    Clocksource,
    HaltPolling,
}

impl Rule {
    /// The kebab-case name.
    pub(crate) fn name(self) -> String {
        serde_json::to_value(self)
            .ok()
            .and_then(|v| v.as_str().map(str::to_string))
            .unwrap_or_default()
    }
}

/// One rule's verdict.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Finding {
    pub(crate) rule: Rule,
    pub(crate) severity: Severity,
    /// The operator asked to ignore this rule (`--ignore`): reported, never
    /// counted as a failure.
    pub(crate) ignored: bool,
    /// What was seen.
    pub(crate) summary: String,
    /// Why it matters.
    pub(crate) reason: &'static str,
    /// What to do, when something should be done.
    pub(crate) fix: Option<&'static str>,
}

/// Thresholds the operator may set.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    /// `journal-fsync-p99` fails above this.
    pub(crate) fsync_p99_max_us: u64,
}

const FSYNC_REASON: &str = "Every ADD is answered after the journal's fdatasync, so its tail is the bookie's tail. \
Seed 001 measured journal fdatasync at 5.1 ms p50 on production SSDs and 2.65-6.61 ms on an NVMe worn to 119% of its \
rated life (28-39% of publish latency), against 0.02 ms on a new NVMe; the millisecond-write-path seed measured 44 µs for a write + fsync on \
NVMe. A p99 over the limit points at worn or shared media.";
const FSYNC_FIX: &str = "Put the journal on a dedicated, healthy NVMe (wear: `nvme smart-log` percentage_used, or \
`smartctl -a`) that nothing else writes, or on persistent memory (--journal-backend pmem).";

const VOLATILE_REASON: &str = "tmpfs and ramfs keep files in memory: fdatasync there costs nothing, and every entry, \
acknowledged or not, is gone at the next reboot or power loss.";
const VOLATILE_FIX: &str = "Put --journal-dir and --ledger-dir on disk filesystems (ext4, xfs).";

const SAME_DEVICE_REASON: &str = "Ledger storage writes far more than the journal; on one device the journal's \
fdatasync queues behind its flushes. Seed 001: dedicating a small NVMe exclusively to journals was the highest-impact \
hardware change. Separate devices are necessary, not sufficient: seed 001 also saw write-back stall fdatasync across \
separate NVMe drives sharing the kernel's block layer (see writeback-dirty).";
const SAME_DEVICE_FIX: &str =
    "Give the journal a device of its own: --journal-dir on a filesystem on another disk.";

const DIRTY_REASON: &str = "Seed 001 found a ~3 GB write-back burst during a ledger flush stretching the journal's \
fdatasync from under 1 ms to 15-22 ms, even with journal and ledgers on separate NVMe drives, and limited the bursts \
with vm.dirty_ratio=2 and vm.dirty_background_ratio=1 (from 40). Vela writes entry logs with O_DIRECT where the \
filesystem takes it, so its own flushes leave little dirty; other writers on the host, and entry logs where O_DIRECT \
is refused, still fill the page cache.";
const DIRTY_FIX: &str = "sysctl -w vm.dirty_ratio=2 vm.dirty_background_ratio=1 (or vm.dirty_bytes and \
vm.dirty_background_bytes of that size), kept in /etc/sysctl.d/.";

const EXPIRE_REASON: &str = "Dirty pages older than dirty_expire_centisecs are written back every \
dirty_writeback_centisecs; longer periods let more pile up per burst. Seed 001 applied 500 and 100 with the dirty \
ratios.";
const EXPIRE_FIX: &str = "sysctl -w vm.dirty_expire_centisecs=500 vm.dirty_writeback_centisecs=100";

const JOURNAL_O_DIRECT_REASON: &str = "Where O_DIRECT is refused the journal (backend auto) writes through the page \
cache: a copy per group (about 12% less batched throughput, measured on this project's machines) and pages the \
fdatasync must flush.";
const LEDGER_O_DIRECT_REASON: &str = "Where O_DIRECT is refused the entry logs go through the page cache, written back \
in 4 MiB sync_file_range steps: dirty pages on the way to a device the journal may share (see writeback-dirty).";
const O_DIRECT_FIX: &str = "Use a filesystem that takes O_DIRECT (ext4, xfs) for the directory.";

const MAP_SYNC_REASON: &str = "The pmem journal makes records durable with CPU cache-line flushes, which reach \
persistent memory only through a MAP_SYNC mapping on a DAX filesystem; without it the bookie refuses to start (or, \
with --journal-pmem-allow-emulation, msyncs each group, which is not persistent-memory durable). Seed 004 measured the \
journal on Optane PMem at 0.655 ms system p99 against 1.475 ms on an NVMe SSD.";
const MAP_SYNC_FIX: &str = "Create an fsdax namespace (`ndctl create-namespace -m fsdax`), mount its filesystem with \
-o dax (ext4, xfs) and point --journal-pmem-path there.";

const THP_REASON: &str = "With transparent huge pages always on, page faults may compact memory and khugepaged \
collapses pages in the background, stalling threads for milliseconds at random; seed 001's OS tuning set \
transparent_hugepage=madvise.";
const THP_FIX: &str = "echo madvise > /sys/kernel/mm/transparent_hugepage/enabled (boot: transparent_hugepage=madvise)";

const GOVERNOR_REASON: &str = "A depth-1 add wakes several threads in turn (network task, journal writer, \
completion); a CPU clocked down while idle adds its ramp-up to each wake-up. Not measured by the seeds: DESIGN budgets \
about 100 µs above the disk's fdatasync for everything but the disk.";
const GOVERNOR_FIX: &str = "cpupower frequency-set -g performance";

const CLOCKSOURCE_REASON: &str = "The journal and the bookie time every group and add for the write-path histograms; \
hpet and acpi_pm reads are system calls of about a microsecond, against tens of nanoseconds through the vDSO.";
const CLOCKSOURCE_FIX: &str =
    "Use tsc (boot: clocksource=tsc, with tsc=reliable where the TSC is stable).";

const HALT_POLLING_REASON: &str = "On a VM an idle vCPU halts and takes tens of µs to wake (the broker's arrival \
stamps show it), on every hop of a depth-1 add. Guest halt polling (cpuidle-haltpoll) or the host's kvm halt_poll_ns \
spin briefly before halting, trading CPU for wake-up latency. Reported only.";

/// Every rule over `facts`, in a fixed order.
pub(crate) fn findings(facts: &Facts, limits: Limits, ignored: &[Rule]) -> Vec<Finding> {
    let mut out = vec![
        journal_fsync(facts, limits),
        volatile_storage(facts),
        same_device(facts),
        writeback_dirty(facts),
        writeback_expire(facts),
        o_direct(facts, Role::Journal),
        o_direct(facts, Role::Ledger),
        map_sync(facts),
        transparent_hugepages(facts),
        cpu_governor(facts),
        clocksource(facts),
        halt_polling(facts),
    ];
    for finding in &mut out {
        finding.ignored = ignored.contains(&finding.rule);
    }
    out
}

fn finding(
    rule: Rule,
    severity: Severity,
    summary: String,
    reason: &'static str,
    fix: Option<&'static str>,
) -> Finding {
    Finding {
        rule,
        severity,
        ignored: false,
        summary,
        reason,
        fix: (severity >= Severity::Warn).then_some(fix).flatten(),
    }
}

fn dir(facts: &Facts, role: Role) -> Option<&DirReport> {
    facts.dirs.iter().find(|d| d.role == role)
}

fn journal_fsync(facts: &Facts, limits: Limits) -> Finding {
    let rule = Rule::JournalFsyncP99;
    let Some(fsync) = dir(facts, Role::Journal).and_then(|d| d.fsync) else {
        return finding(
            rule,
            Severity::Skip,
            "no journal directory measured".into(),
            FSYNC_REASON,
            None,
        );
    };
    let severity = if fsync.p99_us > limits.fsync_p99_max_us {
        Severity::Fail
    } else {
        Severity::Ok
    };
    let summary = format!(
        "journal 4 KiB write + fdatasync at depth 1: p50 {} µs, p99 {} µs, p99.9 {} µs, max {} µs \
         over {} writes (limit p99 {} µs)",
        fsync.p50_us,
        fsync.p99_us,
        fsync.p999_us,
        fsync.max_us,
        fsync.samples,
        limits.fsync_p99_max_us
    );
    finding(rule, severity, summary, FSYNC_REASON, Some(FSYNC_FIX))
}

fn volatile_storage(facts: &Facts) -> Finding {
    let volatile: Vec<String> = facts
        .dirs
        .iter()
        .filter(|d| d.role != Role::JournalPmem)
        .filter(|d| {
            d.fs_type
                .as_deref()
                .is_some_and(|t| VOLATILE_FILESYSTEMS.contains(&t))
        })
        .map(|d| {
            format!(
                "{} ({})",
                d.path.display(),
                d.fs_type.as_deref().unwrap_or("?")
            )
        })
        .collect();
    if volatile.is_empty() {
        return finding(
            Rule::VolatileStorage,
            Severity::Ok,
            "journal and ledger directories are on persistent filesystems".into(),
            VOLATILE_REASON,
            None,
        );
    }
    finding(
        Rule::VolatileStorage,
        Severity::Fail,
        format!("in memory: {}", volatile.join(", ")),
        VOLATILE_REASON,
        Some(VOLATILE_FIX),
    )
}

fn same_device(facts: &Facts) -> Finding {
    let rule = Rule::JournalLedgerSameDevice;
    let (Some(journal), Some(ledger)) = (dir(facts, Role::Journal), dir(facts, Role::Ledger))
    else {
        return finding(
            rule,
            Severity::Skip,
            "no ledger directory given".into(),
            SAME_DEVICE_REASON,
            None,
        );
    };
    let same_fs = journal.device == ledger.device;
    let same_disk = journal.disk.is_some() && journal.disk == ledger.disk;
    if same_fs || same_disk {
        let what = if same_fs {
            format!("the same filesystem (device {})", journal.device)
        } else {
            format!("the same disk ({})", journal.disk.as_deref().unwrap_or("?"))
        };
        return finding(
            rule,
            Severity::Fail,
            format!("journal and ledger directories are on {what}"),
            SAME_DEVICE_REASON,
            Some(SAME_DEVICE_FIX),
        );
    }
    finding(
        rule,
        Severity::Ok,
        format!(
            "journal on {} ({}), ledgers on {} ({})",
            journal.device,
            journal.disk.as_deref().unwrap_or("no block device"),
            ledger.device,
            ledger.disk.as_deref().unwrap_or("no block device")
        ),
        SAME_DEVICE_REASON,
        None,
    )
}

fn writeback_dirty(facts: &Facts) -> Finding {
    let rule = Rule::WritebackDirty;
    let k = &facts.kernel;
    let (Some(mem), Some(limit), Some(background)) = (
        k.mem_total_bytes,
        k.dirty_limit_bytes,
        k.dirty_background_limit_bytes,
    ) else {
        return finding(
            rule,
            Severity::Skip,
            "vm.dirty_* settings not visible".into(),
            DIRTY_REASON,
            None,
        );
    };
    let limit_max = mem / 100 * DIRTY_LIMIT_MEMORY_PERCENT_MAX;
    let background_max = mem / 100 * DIRTY_BACKGROUND_MEMORY_PERCENT_MAX;
    let severity = if limit > limit_max || background > background_max {
        Severity::Fail
    } else {
        Severity::Ok
    };
    let summary = format!(
        "dirty limit {} MiB, background {} MiB of {} MiB memory (vm.dirty_ratio {}, dirty_background_ratio {}, \
         dirty_bytes {}, dirty_background_bytes {}); at most {} and {} MiB ({}% and {}%)",
        limit >> 20,
        background >> 20,
        mem >> 20,
        opt(k.dirty_ratio),
        opt(k.dirty_background_ratio),
        opt(k.dirty_bytes),
        opt(k.dirty_background_bytes),
        limit_max >> 20,
        background_max >> 20,
        DIRTY_LIMIT_MEMORY_PERCENT_MAX,
        DIRTY_BACKGROUND_MEMORY_PERCENT_MAX,
    );
    finding(rule, severity, summary, DIRTY_REASON, Some(DIRTY_FIX))
}

fn writeback_expire(facts: &Facts) -> Finding {
    let rule = Rule::WritebackExpire;
    let k = &facts.kernel;
    let (Some(expire), Some(writeback)) = (k.dirty_expire_centisecs, k.dirty_writeback_centisecs)
    else {
        return finding(
            rule,
            Severity::Skip,
            "vm.dirty_*_centisecs not visible".into(),
            EXPIRE_REASON,
            None,
        );
    };
    let severity =
        if expire > DIRTY_EXPIRE_CENTISECS_MAX || writeback > DIRTY_WRITEBACK_CENTISECS_MAX {
            Severity::Warn
        } else {
            Severity::Ok
        };
    let summary = format!(
        "vm.dirty_expire_centisecs {expire}, vm.dirty_writeback_centisecs {writeback} \
         (at most {DIRTY_EXPIRE_CENTISECS_MAX} and {DIRTY_WRITEBACK_CENTISECS_MAX})"
    );
    finding(rule, severity, summary, EXPIRE_REASON, Some(EXPIRE_FIX))
}

fn o_direct(facts: &Facts, role: Role) -> Finding {
    let (rule, reason) = match role {
        Role::Ledger => (Rule::LedgerODirect, LEDGER_O_DIRECT_REASON),
        _ => (Rule::JournalODirect, JOURNAL_O_DIRECT_REASON),
    };
    let Some(d) = dir(facts, role) else {
        return finding(
            rule,
            Severity::Skip,
            "directory not given".into(),
            reason,
            None,
        );
    };
    if d.o_direct {
        return finding(
            rule,
            Severity::Ok,
            format!("{}: O_DIRECT writes work", d.path.display()),
            reason,
            None,
        );
    }
    finding(
        rule,
        Severity::Warn,
        format!(
            "{}: O_DIRECT refused ({})",
            d.path.display(),
            d.o_direct_error.as_deref().unwrap_or("?")
        ),
        reason,
        Some(O_DIRECT_FIX),
    )
}

fn map_sync(facts: &Facts) -> Finding {
    let rule = Rule::JournalPmemMapSync;
    let Some(d) = dir(facts, Role::JournalPmem) else {
        return finding(
            rule,
            Severity::Skip,
            "no --journal-pmem-path given".into(),
            MAP_SYNC_REASON,
            None,
        );
    };
    let Some(probe) = &d.map_sync else {
        return finding(
            rule,
            Severity::Skip,
            "not probed".into(),
            MAP_SYNC_REASON,
            None,
        );
    };
    match (probe.granted, &probe.flush_instruction) {
        (true, Some(instruction)) => finding(
            rule,
            Severity::Ok,
            format!(
                "{}: MAP_SYNC granted (DAX); records flushed with {instruction} + sfence",
                d.path.display()
            ),
            MAP_SYNC_REASON,
            None,
        ),
        (true, None) => finding(
            rule,
            Severity::Fail,
            format!(
                "{}: MAP_SYNC granted, but the journal has no cache-flush instruction for this CPU architecture",
                d.path.display()
            ),
            MAP_SYNC_REASON,
            Some(MAP_SYNC_FIX),
        ),
        (false, _) => finding(
            rule,
            Severity::Fail,
            format!(
                "{}: MAP_SYNC refused ({}){}",
                d.path.display(),
                probe.error.as_deref().unwrap_or("?"),
                if d.dax { "" } else { "; not mounted with dax" }
            ),
            MAP_SYNC_REASON,
            Some(MAP_SYNC_FIX),
        ),
    }
}

fn transparent_hugepages(facts: &Facts) -> Finding {
    let rule = Rule::TransparentHugepages;
    let Some(enabled) = facts.kernel.transparent_hugepage.as_deref() else {
        return finding(
            rule,
            Severity::Skip,
            "transparent huge pages not visible".into(),
            THP_REASON,
            None,
        );
    };
    let severity = if enabled == "always" {
        Severity::Warn
    } else {
        Severity::Ok
    };
    let summary = format!(
        "transparent_hugepage {enabled}, defrag {}",
        facts
            .kernel
            .transparent_hugepage_defrag
            .as_deref()
            .unwrap_or("?")
    );
    finding(rule, severity, summary, THP_REASON, Some(THP_FIX))
}

fn cpu_governor(facts: &Facts) -> Finding {
    let rule = Rule::CpuGovernor;
    let governors = &facts.kernel.cpu_governors;
    if governors.is_empty() {
        return finding(
            rule,
            Severity::Skip,
            "no cpufreq here (typical in a VM: the host decides)".into(),
            GOVERNOR_REASON,
            None,
        );
    }
    let severity = if governors.iter().all(|g| g == "performance") {
        Severity::Ok
    } else {
        Severity::Warn
    };
    finding(
        rule,
        severity,
        format!("cpufreq governors: {}", governors.join(", ")),
        GOVERNOR_REASON,
        Some(GOVERNOR_FIX),
    )
}

fn clocksource(facts: &Facts) -> Finding {
    let rule = Rule::Clocksource;
    let Some(source) = facts.kernel.clocksource.as_deref() else {
        return finding(
            rule,
            Severity::Skip,
            "clock source not visible".into(),
            CLOCKSOURCE_REASON,
            None,
        );
    };
    let severity = if FAST_CLOCKSOURCES.contains(&source) {
        Severity::Ok
    } else {
        Severity::Warn
    };
    finding(
        rule,
        severity,
        format!("clock source {source}"),
        CLOCKSOURCE_REASON,
        Some(CLOCKSOURCE_FIX),
    )
}

fn halt_polling(facts: &Facts) -> Finding {
    let k = &facts.kernel;
    let mut seen = Vec::new();
    if let Some(driver) = &k.cpuidle_driver {
        seen.push(format!("cpuidle driver {driver}"));
    }
    if let Some(ns) = k.guest_halt_poll_ns {
        seen.push(format!("guest_halt_poll_ns {ns}"));
    }
    if let Some(ns) = k.kvm_halt_poll_ns {
        seen.push(format!("kvm halt_poll_ns {ns}"));
    }
    let (severity, summary) = if seen.is_empty() {
        (Severity::Skip, "halt polling not visible".to_string())
    } else {
        (Severity::Info, seen.join(", "))
    };
    finding(
        Rule::HaltPolling,
        severity,
        summary,
        HALT_POLLING_REASON,
        None,
    )
}

fn opt(value: Option<u64>) -> String {
    value.map_or_else(|| "?".to_string(), |v| v.to_string())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::path::PathBuf;

    use super::super::probe::{FsyncFigures, KernelSettings, MapSync};
    use super::*;

    fn dir_report(role: Role, device: &str, disk: Option<&str>, fs_type: &str) -> DirReport {
        DirReport {
            role,
            path: PathBuf::from(format!("/data/{role:?}")),
            device: device.to_string(),
            disk: disk.map(str::to_string),
            rotational: Some(false),
            fs_type: Some(fs_type.to_string()),
            mount_point: Some(PathBuf::from("/data")),
            mount_source: Some("/dev/x".to_string()),
            mount_options: Some("rw".to_string()),
            dax: false,
            o_direct: true,
            o_direct_error: None,
            map_sync: None,
            fsync: (role != Role::JournalPmem).then_some(FsyncFigures {
                samples: 1000,
                seconds: 3.0,
                p50_us: 90,
                p99_us: 400,
                p999_us: 900,
                max_us: 2000,
            }),
        }
    }

    /// A host as the seeds recommend: separate NVMe drives, tuned sysctls.
    fn good() -> Facts {
        Facts {
            dirs: vec![
                dir_report(Role::Journal, "259:1", Some("nvme0n1"), "ext4"),
                dir_report(Role::Ledger, "259:2", Some("nvme1n1"), "xfs"),
            ],
            kernel: KernelSettings {
                mem_total_bytes: Some(64 << 30),
                dirty_ratio: Some(2),
                dirty_background_ratio: Some(1),
                dirty_bytes: Some(0),
                dirty_background_bytes: Some(0),
                dirty_limit_bytes: Some((64 << 30) / 100 * 2),
                dirty_background_limit_bytes: Some((64 << 30) / 100),
                dirty_expire_centisecs: Some(500),
                dirty_writeback_centisecs: Some(100),
                transparent_hugepage: Some("madvise".into()),
                transparent_hugepage_defrag: Some("madvise".into()),
                cpu_governors: vec!["performance".into()],
                clocksource: Some("tsc".into()),
                ..KernelSettings::default()
            },
        }
    }

    fn severity_of(findings: &[Finding], rule: Rule) -> Severity {
        findings.iter().find(|f| f.rule == rule).unwrap().severity
    }

    const LIMITS: Limits = Limits {
        fsync_p99_max_us: 1000,
    };

    #[test]
    fn a_tuned_host_passes_every_rule() {
        let findings = findings(&good(), LIMITS, &[]);
        for f in &findings {
            assert!(f.severity <= Severity::Skip, "{f:?}");
            assert!(f.fix.is_none(), "no fix offered for a passing rule: {f:?}");
        }
        assert_eq!(findings.len(), 12);
    }

    #[test]
    fn each_rule_fails_or_warns_on_what_the_seeds_measured() {
        // Worn SSD: seed 001's 5.1 ms.
        let mut facts = good();
        facts.dirs[0].fsync.as_mut().unwrap().p99_us = 5100;
        let f = findings(&facts, LIMITS, &[]);
        assert_eq!(severity_of(&f, Rule::JournalFsyncP99), Severity::Fail);
        assert!(f[0].summary.contains("p99 5100 µs"), "{}", f[0].summary);
        assert!(f[0].fix.is_some());

        // Partitions of one disk.
        let mut facts = good();
        facts.dirs[1].disk = Some("nvme0n1".into());
        assert_eq!(
            severity_of(
                &findings(&facts, LIMITS, &[]),
                Rule::JournalLedgerSameDevice
            ),
            Severity::Fail
        );

        // Default dirty ratios (20/10).
        let mut facts = good();
        facts.kernel.dirty_ratio = Some(20);
        facts.kernel.dirty_limit_bytes = Some((64 << 30) / 100 * 20);
        assert_eq!(
            severity_of(&findings(&facts, LIMITS, &[]), Rule::WritebackDirty),
            Severity::Fail
        );

        let mut facts = good();
        facts.kernel.dirty_expire_centisecs = Some(3000);
        facts.kernel.transparent_hugepage = Some("always".into());
        facts.kernel.cpu_governors = vec!["performance".into(), "powersave".into()];
        facts.kernel.clocksource = Some("hpet".into());
        facts.dirs[1].o_direct = false;
        let f = findings(&facts, LIMITS, &[]);
        for rule in [
            Rule::WritebackExpire,
            Rule::TransparentHugepages,
            Rule::CpuGovernor,
            Rule::Clocksource,
            Rule::LedgerODirect,
        ] {
            assert_eq!(severity_of(&f, rule), Severity::Warn, "{rule:?}");
        }

        // tmpfs journal: in memory, and the same device as a tmpfs ledger dir.
        let mut facts = good();
        facts.dirs = vec![
            dir_report(Role::Journal, "0:27", None, "tmpfs"),
            dir_report(Role::Ledger, "0:27", None, "tmpfs"),
            dir_report(Role::JournalPmem, "0:27", None, "tmpfs"),
        ];
        facts.dirs[2].map_sync = Some(MapSync {
            granted: false,
            flush_instruction: None,
            error: Some("Operation not supported (os error 95)".into()),
        });
        let f = findings(&facts, LIMITS, &[Rule::VolatileStorage]);
        assert_eq!(severity_of(&f, Rule::VolatileStorage), Severity::Fail);
        assert!(
            f.iter()
                .find(|x| x.rule == Rule::VolatileStorage)
                .unwrap()
                .ignored
        );
        assert_eq!(
            severity_of(&f, Rule::JournalLedgerSameDevice),
            Severity::Fail
        );
        assert_eq!(severity_of(&f, Rule::JournalPmemMapSync), Severity::Fail);
    }

    #[test]
    fn what_is_not_visible_is_skipped() {
        let facts = Facts {
            dirs: vec![dir_report(Role::Journal, "8:1", Some("sda"), "ext4")],
            kernel: KernelSettings::default(),
        };
        let f = findings(&facts, LIMITS, &[]);
        for rule in [
            Rule::JournalLedgerSameDevice,
            Rule::WritebackDirty,
            Rule::WritebackExpire,
            Rule::LedgerODirect,
            Rule::JournalPmemMapSync,
            Rule::TransparentHugepages,
            Rule::CpuGovernor,
            Rule::Clocksource,
            Rule::HaltPolling,
        ] {
            assert_eq!(severity_of(&f, rule), Severity::Skip, "{rule:?}");
        }
        assert_eq!(Rule::JournalFsyncP99.name(), "journal-fsync-p99");
    }
}
