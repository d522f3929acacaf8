//! `vela doctor`: what an operator runs on a bookie host before trusting it
//! with a journal. Measures the journal and ledger directories (4 KiB write +
//! fdatasync at depth 1, O_DIRECT, filesystem, mount options, device), reads
//! the kernel's write-back, huge-page, CPU frequency, clock source and halt
//! polling settings, and prints findings, each with what was seen, why it
//! matters (tied to what the seed analyses measured) and the fix. `--json`
//! prints the same as one JSON object.
//!
//! Exit status: 0 when no rule failed (warnings allowed), 1 when one did (or
//! the doctor itself could not run, with a message on stderr), 2 for bad
//! flags.
//!
//! Owns: the flags, the text and JSON output. The measuring is in `probe`,
//! the verdicts in `rules`. Never: changes a setting or writes outside the
//! directories' scratch files (removed afterwards).

mod probe;
mod rules;

use std::path::PathBuf;
use std::time::Duration;

use clap::Args;
use serde::Serialize;

use probe::{DirReport, Facts, KernelSettings, Role};
use rules::{Finding, Limits, Rule, Severity};

/// Version of the JSON report (bumped when a field changes meaning).
const REPORT_VERSION: u32 = 1;

/// Flags of `vela doctor`.
#[derive(Debug, Args)]
pub(crate) struct DoctorArgs {
    /// The journal directory to check (it must exist).
    #[arg(long, value_name = "DIR")]
    journal_dir: PathBuf,
    /// The ledger directory to check (it must exist).
    #[arg(long, value_name = "DIR")]
    ledger_dir: Option<PathBuf>,
    /// The directory meant for the pmem journal (--journal-backend pmem):
    /// checked for MAP_SYNC (a DAX filesystem).
    #[arg(long, value_name = "DIR")]
    journal_pmem_path: Option<PathBuf>,
    /// Seconds of write + fdatasync per directory.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u64).range(1..=600))]
    seconds: u64,
    /// The journal's fdatasync p99 above which `journal-fsync-p99` fails, µs.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    fsync_p99_max_us: u64,
    /// Rules to report but not count as failures (comma-separated names as
    /// printed, e.g. writeback-dirty).
    #[arg(long, value_enum, value_delimiter = ',', value_name = "RULE")]
    ignore: Vec<Rule>,
    /// Print the report as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

/// The report `--json` prints.
#[derive(Debug, Serialize)]
struct Report {
    version: u32,
    dirs: Vec<DirReport>,
    kernel: KernelSettings,
    findings: Vec<Finding>,
    /// Rules that failed (not ignored): the exit status is 1 when above 0.
    failed: usize,
    warned: usize,
}

pub(crate) fn run(args: DoctorArgs) -> anyhow::Result<()> {
    let duration = Duration::from_secs(args.seconds);
    let mut dirs = vec![probe::dir_report(
        Role::Journal,
        &args.journal_dir,
        duration,
    )?];
    if let Some(ledger_dir) = &args.ledger_dir {
        dirs.push(probe::dir_report(Role::Ledger, ledger_dir, duration)?);
    }
    if let Some(pmem_dir) = &args.journal_pmem_path {
        dirs.push(probe::dir_report(Role::JournalPmem, pmem_dir, duration)?);
    }
    let facts = Facts {
        dirs,
        kernel: probe::kernel_settings(),
    };
    let limits = Limits {
        fsync_p99_max_us: args.fsync_p99_max_us,
    };
    let findings = rules::findings(&facts, limits, &args.ignore);
    let counted = |severity: Severity| {
        findings
            .iter()
            .filter(|f| f.severity == severity && !f.ignored)
            .count()
    };
    let report = Report {
        version: REPORT_VERSION,
        failed: counted(Severity::Fail),
        warned: counted(Severity::Warn),
        dirs: facts.dirs,
        kernel: facts.kernel,
        findings,
    };
    if args.json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", text(&report));
    }
    if report.failed > 0 {
        std::process::exit(1);
    }
    Ok(())
}

/// The human-readable report.
fn text(report: &Report) -> String {
    let mut out = String::new();
    for d in &report.dirs {
        let role = match d.role {
            Role::Journal => "journal",
            Role::Ledger => "ledger",
            Role::JournalPmem => "journal pmem",
        };
        out.push_str(&format!(
            "{role} {}: {} on {} ({}), mounted at {} {}; device {}{}; O_DIRECT {}{}\n",
            d.path.display(),
            d.fs_type.as_deref().unwrap_or("?"),
            d.mount_source.as_deref().unwrap_or("?"),
            d.disk
                .as_deref()
                .map_or("no block device".to_string(), |disk| match d.rotational {
                    Some(true) => format!("disk {disk}, rotational"),
                    _ => format!("disk {disk}"),
                }),
            d.mount_point
                .as_ref()
                .map_or("?".to_string(), |m| m.display().to_string()),
            d.mount_options.as_deref().unwrap_or(""),
            d.device,
            if d.dax { ", dax" } else { "" },
            if d.o_direct { "yes" } else { "refused" },
            d.map_sync.as_ref().map_or(String::new(), |m| if m.granted {
                format!(
                    "; MAP_SYNC granted ({})",
                    m.flush_instruction
                        .as_deref()
                        .unwrap_or("no flush instruction")
                )
            } else {
                format!("; MAP_SYNC refused ({})", m.error.as_deref().unwrap_or("?"))
            }),
        ));
        if let Some(f) = &d.fsync {
            out.push_str(&format!(
                "  4 KiB write + fdatasync, depth 1: p50 {} µs  p99 {} µs  p99.9 {} µs  max {} µs  ({} writes in {:.1} s)\n",
                f.p50_us, f.p99_us, f.p999_us, f.max_us, f.samples, f.seconds
            ));
        }
    }
    let k = &report.kernel;
    out.push_str(&format!(
        "kernel {}: vm.dirty_ratio {} dirty_background_ratio {} dirty_bytes {} dirty_background_bytes {} \
         dirty_expire_centisecs {} dirty_writeback_centisecs {}; THP {}; governor {}; clocksource {}\n\n",
        k.release.as_deref().unwrap_or("?"),
        show(k.dirty_ratio),
        show(k.dirty_background_ratio),
        show(k.dirty_bytes),
        show(k.dirty_background_bytes),
        show(k.dirty_expire_centisecs),
        show(k.dirty_writeback_centisecs),
        k.transparent_hugepage.as_deref().unwrap_or("?"),
        if k.cpu_governors.is_empty() {
            "not visible".to_string()
        } else {
            k.cpu_governors.join(",")
        },
        k.clocksource.as_deref().unwrap_or("?"),
    ));
    let mut ordered: Vec<&Finding> = report.findings.iter().collect();
    ordered.sort_by_key(|f| std::cmp::Reverse(f.severity));
    for f in ordered {
        let label = match f.severity {
            Severity::Fail => "FAIL",
            Severity::Warn => "WARN",
            Severity::Info => "INFO",
            Severity::Skip => "SKIP",
            Severity::Ok => "OK",
        };
        let ignored = if f.ignored { " (ignored)" } else { "" };
        out.push_str(&format!(
            "{label:<4} {}{ignored}: {}\n",
            f.rule.name(),
            f.summary
        ));
        if f.severity >= Severity::Warn || f.severity == Severity::Info {
            out.push_str(&format!("     why: {}\n", f.reason));
        }
        if let Some(fix) = f.fix {
            out.push_str(&format!("     fix: {fix}\n"));
        }
    }
    out.push_str(&format!(
        "\n{} failed, {} warnings\n",
        report.failed, report.warned
    ));
    out
}

fn show(value: Option<u64>) -> String {
    value.map_or_else(|| "?".to_string(), |v| v.to_string())
}
