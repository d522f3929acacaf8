//! `--plot FILE.svg`: the latency percentile curve as a standalone SVG.
//!
//! X: percentile on a "nines" scale (50, 90, 99, 99.9, ... evenly spaced,
//! the way latency tails are read); Y: latency in ms on a log scale. Several
//! series share one plot (e.g. Vela beside Pulsar).
//! Never: reads or measures anything; it only draws the points it is given.

use std::fmt::Write as _;
use std::path::Path;

const WIDTH: f64 = 900.0;
const HEIGHT: f64 = 520.0;
const MARGIN_LEFT: f64 = 80.0;
const MARGIN_RIGHT: f64 = 30.0;
const MARGIN_TOP: f64 = 40.0;
const MARGIN_BOTTOM: f64 = 60.0;
/// Rightmost x: six nines (99.9999); the max sits there.
const NINES_MAX: f64 = 6.0;
const COLORS: [&str; 6] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b",
];

fn nines(percentile: f64) -> f64 {
    let rest = 1.0 - percentile / 100.0;
    if rest <= 10f64.powf(-NINES_MAX) {
        NINES_MAX
    } else {
        -rest.log10()
    }
}

/// Writes the SVG of `series` (label, points of (percentile, ms)) to `path`.
pub(crate) fn write_svg(
    path: &Path,
    title: &str,
    series: &[(String, Vec<(f64, f64)>)],
) -> std::io::Result<()> {
    let values = series
        .iter()
        .flat_map(|(_, points)| points.iter().map(|(_, ms)| *ms))
        .filter(|ms| *ms > 0.0);
    let (low, high) = values.fold((f64::MAX, f64::MIN), |(lo, hi), v| (lo.min(v), hi.max(v)));
    let (low, high) = if low > high { (0.01, 1.0) } else { (low, high) };
    let y_min = 10f64.powf(low.log10().floor());
    let y_max = 10f64.powf(high.log10().ceil().max(y_min.log10() + 1.0));
    let plot_w = WIDTH - MARGIN_LEFT - MARGIN_RIGHT;
    let plot_h = HEIGHT - MARGIN_TOP - MARGIN_BOTTOM;
    let x_of = |percentile: f64| MARGIN_LEFT + nines(percentile) / NINES_MAX * plot_w;
    let y_of = |ms: f64| {
        let ms = ms.max(y_min);
        MARGIN_TOP + plot_h * (1.0 - (ms.log10() - y_min.log10()) / (y_max.log10() - y_min.log10()))
    };

    let mut svg = String::new();
    let _ = writeln!(
        svg,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{WIDTH}" height="{HEIGHT}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(svg, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="24" font-size="15" text-anchor="middle">{}</text>"#,
        WIDTH / 2.0,
        escape(title)
    );
    // X ticks: 0, 90, 99, ... percentiles.
    for n in 0..=NINES_MAX as u32 {
        let percentile = 100.0 * (1.0 - 10f64.powi(-(n as i32)));
        let x = x_of(percentile);
        let label = match n {
            0 => "p0".to_string(),
            _ => format!("p{}", trim(percentile)),
        };
        let _ = writeln!(
            svg,
            r##"<line x1="{x:.1}" y1="{MARGIN_TOP}" x2="{x:.1}" y2="{:.1}" stroke="#ddd"/><text x="{x:.1}" y="{:.1}" text-anchor="middle">{label}</text>"##,
            MARGIN_TOP + plot_h,
            MARGIN_TOP + plot_h + 18.0
        );
    }
    // Y ticks: powers of ten.
    let mut tick = y_min;
    while tick <= y_max * 1.0001 {
        let y = y_of(tick);
        let _ = writeln!(
            svg,
            r##"<line x1="{MARGIN_LEFT}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#ddd"/><text x="{:.1}" y="{:.1}" text-anchor="end">{} ms</text>"##,
            MARGIN_LEFT + plot_w,
            MARGIN_LEFT - 6.0,
            y + 4.0,
            trim(tick)
        );
        tick *= 10.0;
    }
    let _ = writeln!(
        svg,
        r#"<text x="{}" y="{}" text-anchor="middle">percentile</text>"#,
        MARGIN_LEFT + plot_w / 2.0,
        HEIGHT - 15.0
    );
    for (index, (label, points)) in series.iter().enumerate() {
        let color = COLORS[index % COLORS.len()];
        let path: Vec<String> = points
            .iter()
            .map(|(p, ms)| format!("{:.1},{:.1}", x_of(*p), y_of(*ms)))
            .collect();
        let _ = writeln!(
            svg,
            r#"<polyline fill="none" stroke="{color}" stroke-width="2" points="{}"/>"#,
            path.join(" ")
        );
        let legend_y = MARGIN_TOP + 16.0 + 18.0 * index as f64;
        let _ = writeln!(
            svg,
            r#"<rect x="{:.1}" y="{:.1}" width="14" height="4" fill="{color}"/><text x="{:.1}" y="{:.1}">{}</text>"#,
            MARGIN_LEFT + 12.0,
            legend_y - 4.0,
            MARGIN_LEFT + 32.0,
            legend_y,
            escape(label)
        );
    }
    let _ = writeln!(svg, "</svg>");
    std::fs::write(path, svg)
}

fn trim(value: f64) -> String {
    let text = format!("{value:.4}");
    text.trim_end_matches('0').trim_end_matches('.').to_string()
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nines_scale() {
        assert!((nines(0.0) - 0.0).abs() < 1e-9);
        assert!((nines(90.0) - 1.0).abs() < 1e-9);
        assert!((nines(99.9) - 3.0).abs() < 1e-6);
        assert_eq!(nines(100.0), NINES_MAX);
    }

    #[test]
    fn writes_an_svg_with_every_series() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("plot.svg");
        let series = vec![
            (
                "vela".to_string(),
                vec![(0.0, 0.2), (99.0, 0.4), (100.0, 1.5)],
            ),
            (
                "pulsar".to_string(),
                vec![(0.0, 0.5), (99.0, 3.0), (100.0, 20.0)],
            ),
        ];
        write_svg(&path, "sync 1 KiB", &series).expect("write");
        let svg = std::fs::read_to_string(&path).expect("read");
        assert!(svg.starts_with("<svg"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert!(svg.contains("pulsar") && svg.contains("p99.9"));
    }
}
