//! Latency and throughput accounting of `vela perf`: HDR histograms per
//! interval and for the whole run, progress lines, the final summary (text or
//! JSON).
//!
//! Owns: the units (latencies recorded in µs, printed in ms) and the
//! percentiles reported. Never: measures anything itself.

use std::sync::Arc;
use std::time::{Duration, Instant};

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;

/// Largest latency recorded: one hour in µs (anything slower is clamped).
const LATENCY_US_MAX: u64 = 3_600_000_000;

fn histogram() -> Histogram<u64> {
    // 1 µs .. 1 h at 3 significant digits: ~200 KiB per histogram.
    Histogram::new_with_bounds(1, LATENCY_US_MAX, 3).expect("constant histogram bounds are valid")
}

/// Counters and histograms shared by the workers of one run.
#[derive(Debug)]
pub(crate) struct Recorder {
    inner: Mutex<Counts>,
}

#[derive(Debug)]
struct Counts {
    interval: Histogram<u64>,
    total: Histogram<u64>,
    interval_messages: u64,
    interval_bytes: u64,
    interval_failures: u64,
    total_messages: u64,
    total_bytes: u64,
    total_failures: u64,
}

impl Recorder {
    pub(crate) fn new() -> Arc<Recorder> {
        Arc::new(Recorder {
            inner: Mutex::new(Counts {
                interval: histogram(),
                total: histogram(),
                interval_messages: 0,
                interval_bytes: 0,
                interval_failures: 0,
                total_messages: 0,
                total_bytes: 0,
                total_failures: 0,
            }),
        })
    }

    /// One message done after `latency`, carrying `bytes` of payload.
    pub(crate) fn record(&self, latency: Duration, bytes: usize) {
        let us = u64::try_from(latency.as_micros())
            .unwrap_or(u64::MAX)
            .clamp(1, LATENCY_US_MAX);
        let mut counts = self.inner.lock();
        counts.interval.saturating_record(us);
        counts.total.saturating_record(us);
        counts.interval_messages += 1;
        counts.interval_bytes += bytes as u64;
        counts.total_messages += 1;
        counts.total_bytes += bytes as u64;
    }

    /// A message that failed.
    pub(crate) fn failure(&self) {
        let mut counts = self.inner.lock();
        counts.interval_failures += 1;
        counts.total_failures += 1;
    }

    /// Forgets the run so far (end of the warm-up); intervals go on.
    pub(crate) fn reset_totals(&self) {
        let mut counts = self.inner.lock();
        counts.total.reset();
        counts.total_messages = 0;
        counts.total_bytes = 0;
        counts.total_failures = 0;
    }

    /// Messages done so far.
    pub(crate) fn total_messages(&self) -> u64 {
        self.inner.lock().total_messages
    }

    /// Ends an interval of `elapsed`: its progress figures.
    pub(crate) fn take_interval(&self, elapsed: Duration) -> Interval {
        let mut counts = self.inner.lock();
        let seconds = elapsed.as_secs_f64().max(1e-9);
        let interval = Interval {
            messages_per_s: counts.interval_messages as f64 / seconds,
            mb_per_s: counts.interval_bytes as f64 / seconds / 1e6,
            failures: counts.interval_failures,
            latency_ms: Percentiles::of(&counts.interval),
        };
        counts.interval.reset();
        counts.interval_messages = 0;
        counts.interval_bytes = 0;
        counts.interval_failures = 0;
        interval
    }

    /// The whole run's figures.
    pub(crate) fn summary(&self, kind: &'static str, elapsed: Duration) -> Summary {
        let counts = self.inner.lock();
        let seconds = elapsed.as_secs_f64().max(1e-9);
        Summary {
            kind,
            duration_s: seconds,
            messages: counts.total_messages,
            bytes: counts.total_bytes,
            failures: counts.total_failures,
            messages_per_s: counts.total_messages as f64 / seconds,
            mb_per_s: counts.total_bytes as f64 / seconds / 1e6,
            latency_ms: Percentiles::of(&counts.total),
            latency_curve_ms: curve(&counts.total),
        }
    }
}

/// Latency percentiles in milliseconds.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Percentiles {
    pub(crate) mean: f64,
    pub(crate) p50: f64,
    pub(crate) p95: f64,
    pub(crate) p99: f64,
    pub(crate) p999: f64,
    pub(crate) p9999: f64,
    pub(crate) max: f64,
}

impl Percentiles {
    fn of(histogram: &Histogram<u64>) -> Percentiles {
        let ms = |us: u64| us as f64 / 1000.0;
        let at = |q: f64| ms(histogram.value_at_quantile(q));
        Percentiles {
            mean: histogram.mean() / 1000.0,
            p50: at(0.50),
            p95: at(0.95),
            p99: at(0.99),
            p999: at(0.999),
            p9999: at(0.9999),
            max: ms(histogram.max()),
        }
    }
}

/// (percentile, latency ms) points from p0 to the max, denser towards the
/// tail: what the percentile plot draws.
fn curve(histogram: &Histogram<u64>) -> Vec<(f64, f64)> {
    if histogram.is_empty() {
        return Vec::new();
    }
    // "Nines" steps: 0, 50, 75, 87.5, ... up to 99.9999.
    let mut points = Vec::new();
    let mut remaining = 1.0f64;
    while remaining > 1e-6 {
        let q = 1.0 - remaining;
        points.push((q * 100.0, histogram.value_at_quantile(q) as f64 / 1000.0));
        remaining /= 2.0_f64.sqrt();
    }
    points.push((100.0, histogram.max() as f64 / 1000.0));
    points
}

/// One progress interval.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Interval {
    pub(crate) messages_per_s: f64,
    pub(crate) mb_per_s: f64,
    pub(crate) failures: u64,
    pub(crate) latency_ms: Percentiles,
}

impl Interval {
    /// The progress line: `KIND  T s  msg/s  MB/s  failed  p50 p99 p99.9 max`.
    pub(crate) fn line(&self, kind: &str, at: Duration) -> String {
        let l = &self.latency_ms;
        format!(
            "{kind} {:>7.1}s {:>11.0} msg/s {:>8.2} MB/s failed {:>3} | latency ms p50 {:.3} p99 {:.3} p99.9 {:.3} max {:.3}",
            at.as_secs_f64(),
            self.messages_per_s,
            self.mb_per_s,
            self.failures,
            l.p50,
            l.p99,
            l.p999,
            l.max
        )
    }
}

/// The final summary of a run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Summary {
    pub(crate) kind: &'static str,
    pub(crate) duration_s: f64,
    pub(crate) messages: u64,
    pub(crate) bytes: u64,
    pub(crate) failures: u64,
    pub(crate) messages_per_s: f64,
    pub(crate) mb_per_s: f64,
    pub(crate) latency_ms: Percentiles,
    pub(crate) latency_curve_ms: Vec<(f64, f64)>,
}

impl Summary {
    pub(crate) fn text(&self) -> String {
        let l = &self.latency_ms;
        format!(
            "{kind} summary: {messages} messages in {duration:.1} s ({failures} failed): {rate:.0} msg/s, {mb:.2} MB/s\n\
             {kind} latency ms: mean {mean:.3} p50 {p50:.3} p95 {p95:.3} p99 {p99:.3} p99.9 {p999:.3} p99.99 {p9999:.3} max {max:.3}",
            kind = self.kind,
            messages = self.messages,
            duration = self.duration_s,
            failures = self.failures,
            rate = self.messages_per_s,
            mb = self.mb_per_s,
            mean = l.mean,
            p50 = l.p50,
            p95 = l.p95,
            p99 = l.p99,
            p999 = l.p999,
            p9999 = l.p9999,
            max = l.max,
        )
    }
}

/// Prints a progress line every `interval` until `done` says stop.
pub(crate) async fn report_progress(
    recorder: Arc<Recorder>,
    kind: &'static str,
    interval: Duration,
    started: Instant,
    mut done: tokio::sync::watch::Receiver<bool>,
) {
    let mut last = Instant::now();
    let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
    loop {
        tokio::select! {
            _ = ticker.tick() => {
                let now = Instant::now();
                let figures = recorder.take_interval(now - last);
                last = now;
                eprintln!("{}", figures.line(kind, now - started));
            }
            _ = done.wait_for(|done| *done) => return,
        }
    }
}
