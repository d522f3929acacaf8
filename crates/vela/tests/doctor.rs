//! `vela doctor` as an operator's script runs it: `--json` against
//! directories on tmpfs (where the rules that must fail there do: memory is
//! not storage, two tmpfs directories share a device, tmpfs has no MAP_SYNC),
//! the exit status following the failed rules, and `--ignore`.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

/// tmpfs when there is one (the case this test is about); the checks that
/// depend on it say so.
fn base_dir() -> (PathBuf, bool) {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        (shm.to_path_buf(), true)
    } else {
        (std::env::temp_dir(), false)
    }
}

/// Runs `vela doctor --json` with `args`; returns the exit code and the report.
fn doctor(args: &[&str]) -> (i32, Value) {
    let output = Command::new(env!("CARGO_BIN_EXE_vela"))
        .arg("doctor")
        .args(["--json", "--seconds", "1"])
        .args(args)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let report: Value = serde_json::from_str(&stdout).unwrap_or_else(|e| {
        panic!(
            "not JSON ({e}): {stdout}\nstderr: {}",
            String::from_utf8_lossy(&output.stderr)
        )
    });
    (output.status.code().unwrap(), report)
}

fn finding<'a>(report: &'a Value, rule: &str) -> &'a Value {
    report["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["rule"] == rule)
        .unwrap_or_else(|| panic!("no finding {rule}"))
}

#[test]
fn json_report_on_tmpfs_fails_the_rules_tmpfs_breaks_and_exits_1() {
    let (base, tmpfs) = base_dir();
    let dir = tempfile::tempdir_in(base).unwrap();
    let (journal, ledgers, pmem) = (
        dir.path().join("journal"),
        dir.path().join("ledgers"),
        dir.path().join("pmem"),
    );
    for d in [&journal, &ledgers, &pmem] {
        std::fs::create_dir(d).unwrap();
    }
    let (code, report) = doctor(&[
        "--journal-dir",
        journal.to_str().unwrap(),
        "--ledger-dir",
        ledgers.to_str().unwrap(),
        "--journal-pmem-path",
        pmem.to_str().unwrap(),
    ]);
    assert_eq!(report["version"], 1);
    let dirs = report["dirs"].as_array().unwrap();
    assert_eq!(dirs.len(), 3);
    assert_eq!(dirs[0]["role"], "journal");
    assert_eq!(dirs[1]["role"], "ledger");
    assert_eq!(dirs[2]["role"], "journal-pmem");
    for d in &dirs[..2] {
        let fsync = &d["fsync"];
        assert!(fsync["samples"].as_u64().unwrap() > 0, "{d}");
        for field in ["p50_us", "p99_us", "p999_us", "max_us"] {
            assert!(fsync[field].is_u64(), "{field} in {d}");
        }
        assert!(fsync["p50_us"].as_u64() <= fsync["max_us"].as_u64());
        assert!(d["o_direct"].is_boolean());
        assert!(d["device"].as_str().unwrap().contains(':'));
        assert!(d["mount_point"].is_string() && d["mount_options"].is_string());
    }
    assert!(
        dirs[2]["fsync"].is_null(),
        "the pmem journal does no fdatasync"
    );
    assert!(dirs[2]["map_sync"]["granted"].is_boolean());
    let kernel = &report["kernel"];
    for field in [
        "dirty_ratio",
        "dirty_background_ratio",
        "dirty_bytes",
        "dirty_background_bytes",
        "dirty_expire_centisecs",
        "dirty_writeback_centisecs",
        "dirty_limit_bytes",
        "transparent_hugepage",
        "cpu_governors",
        "clocksource",
        "guest_halt_poll_ns",
        "kvm_halt_poll_ns",
    ] {
        assert!(
            kernel.get(field).is_some(),
            "kernel.{field} missing: {kernel}"
        );
    }
    for f in report["findings"].as_array().unwrap() {
        for field in ["rule", "severity", "summary", "reason"] {
            assert!(f[field].is_string(), "{field} of {f}");
        }
        if f["severity"] == "fail" || f["severity"] == "warn" {
            assert!(f["fix"].is_string(), "a failing rule says what to do: {f}");
        }
    }
    if tmpfs {
        assert_eq!(dirs[0]["fs_type"], "tmpfs");
        assert_eq!(finding(&report, "volatile-storage")["severity"], "fail");
        assert_eq!(
            finding(&report, "journal-ledger-same-device")["severity"],
            "fail"
        );
        assert_eq!(
            finding(&report, "journal-pmem-map-sync")["severity"],
            "fail"
        );
    }
    let failed = report["failed"].as_u64().unwrap();
    assert_eq!(
        code,
        if failed > 0 { 1 } else { 0 },
        "exit status follows the failed rules"
    );
    if tmpfs {
        assert!(failed >= 3);
    }
}

#[test]
fn ignored_rules_are_reported_but_do_not_fail_the_run() {
    let (base, _) = base_dir();
    let dir = tempfile::tempdir_in(base).unwrap();
    // Every rule that can fail, whatever this machine's disks and sysctls.
    let (code, report) = doctor(&[
        "--journal-dir",
        dir.path().to_str().unwrap(),
        "--ignore",
        "journal-fsync-p99,volatile-storage,writeback-dirty",
    ]);
    assert_eq!(report["failed"], 0, "{report}");
    assert_eq!(code, 0);
    assert_eq!(
        finding(&report, "journal-ledger-same-device")["severity"],
        "skip"
    );
    assert_eq!(finding(&report, "volatile-storage")["ignored"], true);

    let output = Command::new(env!("CARGO_BIN_EXE_vela"))
        .args(["doctor", "--journal-dir", "/", "--ignore", "no-such-rule"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&output.stderr).contains("--ignore"));
    let output = Command::new(env!("CARGO_BIN_EXE_vela"))
        .args(["doctor", "--journal-dir", "/no/such/dir"])
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&output.stderr).contains("/no/such/dir"));
}
