//! `vela admin write-path` and `vela admin read-path`: the tables of stage
//! latencies from `/admin/v2/vela/write-path` and `/admin/v2/vela/read-path`.

use anyhow::Context;
use serde_json::Value;
use vela_metrics::Summary;

use super::api::{Api, encode, out};

/// µs as a short human figure.
pub(super) fn micros(us: f64) -> String {
    if us >= 1_000_000.0 {
        format!("{:.2} s", us / 1e6)
    } else if us >= 1000.0 {
        format!("{:.2} ms", us / 1000.0)
    } else {
        format!("{us:.0} µs")
    }
}

/// A stage row of `/admin/v2/vela/write-path` (`count`, `mean_us`,
/// `p50_us`, ...) as the summary every stage's histogram gives.
pub(super) fn stage_summary(row: &Value) -> Summary {
    let figure = |key: &str| row.get(key).and_then(Value::as_f64).unwrap_or(0.0);
    Summary {
        count: row.get("count").and_then(Value::as_u64).unwrap_or(0),
        mean: figure("mean_us"),
        p50: figure("p50_us"),
        p99: figure("p99_us"),
        p999: figure("p999_us"),
        max: figure("max_us"),
    }
}

pub(super) fn write_path(api: &Api, topic: Option<&str>) -> anyhow::Result<()> {
    let path = match topic {
        Some(topic) => format!("/admin/v2/vela/write-path?topic={}", encode(topic)),
        None => "/admin/v2/vela/write-path".to_string(),
    };
    let document = api.get_json(&path)?;
    stage_table(&document)?;
    out(
        "(stages nest: broker publish = broker issue + broker append + broker receipt; broker \
         append ⊃ ledger add ⊃ ledger add wait + bookie add; bookie add ⊃ journal queue wait + \
         write + fdatasync; journal stages count per group / per fdatasync; MAX<=: the upper \
         bound of the slowest sample's histogram bucket)",
    )
}

/// The rows of a stage breakdown, one line each.
fn stage_table(document: &Value) -> anyhow::Result<()> {
    let rows = document
        .get("stages")
        .and_then(Value::as_array)
        .context("answer without stages")?;
    out(&format!(
        "{:<20} {:<22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "STAGE", "SCOPE", "COUNT", "MEAN", "P50", "P99", "P99.9", "MAX<="
    ))?;
    for row in rows {
        let text = |key: &str| {
            row.get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let summary = stage_summary(row);
        out(&format!(
            "{:<20} {:<22} {:>10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            text("stage"),
            text("scope"),
            summary.count,
            micros(summary.mean),
            micros(summary.p50),
            micros(summary.p99),
            micros(summary.p999),
            micros(summary.max),
        ))?;
    }
    Ok(())
}

pub(super) fn read_path(api: &Api) -> anyhow::Result<()> {
    let document = api.get_json("/admin/v2/vela/read-path")?;
    stage_table(&document)?;
    out("")?;
    out(&format!("{:<20} {:<22} {:>14}", "STAGE", "SCOPE", "BYTES"))?;
    for row in document
        .get("bytes")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
    {
        let text = |key: &str| {
            row.get(key)
                .and_then(Value::as_str)
                .unwrap_or("")
                .to_string()
        };
        let bytes = row.get("bytes").and_then(Value::as_u64).unwrap_or(0);
        out(&format!(
            "{:<20} {:<22} {:>14}",
            text("stage"),
            text("scope"),
            bytes
        ))?;
    }
    out(
        "(dispatcher read wait: consumers had permits, nothing was read yet; dispatcher read ⊃ \
         ledger read ⊃ bookie read (cache or entry log); ledger and bookie stages count per \
         entry; bookie_read_log_io: bytes pread, read-ahead included)",
    )
}
