//! `vela admin write-path`: the table of write-path stage latencies from
//! `/admin/v2/vela/write-path`.

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
    let rows = document
        .get("stages")
        .and_then(Value::as_array)
        .context("write-path answer without stages")?;
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
    out(
        "(stages nest: broker publish ⊃ ledger add ⊃ bookie add ⊃ journal queue wait + write + \
         fdatasync; journal stages count per group / per fdatasync; MAX<=: the upper bound of \
         the slowest sample's histogram bucket)",
    )
}
