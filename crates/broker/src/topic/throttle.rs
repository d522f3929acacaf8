//! `PublishThrottle`: a topic's publish rate (messages and bytes per second)
//! as two token buckets (`rate_limit::RateLimiter`, period one second), and
//! how long a connection must stop reading to keep to it.
//!
//! Owns: the buckets of one topic (shared by every producer of the topic).
//! Each bucket holds up to one second of its rate (the burst a producer may
//! send at once) and refills continuously; a SEND takes its messages and bytes
//! and may drive a bucket into debt; the debt, divided by the rate, is the
//! pause its connection takes before reading the next frame. So no message is
//! ever refused: producers past the rate are slowed by TCP back-pressure, as
//! Pulsar does by turning off auto-read on their connections.
//! Bounds: a pause is at most `THROTTLE_PAUSE_MAX` (keep-alives and shutdown
//! wait behind it); debt is at most `THROTTLE_DEBT_MAX` of the rate, so a
//! flood from many connections at once costs each at most that long.
//! Never: sleeps or does I/O (the caller pauses), or blocks (one short lock).

use std::time::{Duration, Instant};

use crate::config::PublishRate;
use crate::rate_limit::RateLimiter;

/// Longest pause of a connection after one SEND: long enough that the rate
/// holds for any single producer, short enough for keep-alive PINGs (30 s)
/// and shutdown not to notice.
pub(crate) const THROTTLE_PAUSE_MAX: Duration = Duration::from_secs(1);

/// Debt the buckets may carry, in seconds of the rate: bounds how far many
/// connections sending at once can run ahead of the rate (each pays with its
/// pause) and how long a topic stays throttled after a burst.
const THROTTLE_DEBT_MAX_S: f64 = 10.0;

/// A topic's publish-rate buckets.
#[derive(Debug)]
pub(crate) struct PublishThrottle {
    limiter: RateLimiter,
}

impl PublishThrottle {
    /// Buckets for `rate`; `None` when nothing is limited.
    pub(crate) fn new(rate: PublishRate, now: Instant) -> Option<PublishThrottle> {
        RateLimiter::new(
            rate.messages_per_s,
            rate.bytes_per_s,
            Duration::from_secs(1),
            THROTTLE_DEBT_MAX_S,
            now,
        )
        .map(|limiter| PublishThrottle { limiter })
    }

    /// Charges one SEND of `messages` messages and `bytes` bytes at `now`;
    /// returns how long its connection should stop reading (`None`: within
    /// the rate), at most `THROTTLE_PAUSE_MAX`.
    pub(crate) fn charge(&self, messages: u64, bytes: u64, now: Instant) -> Option<Duration> {
        let pause = self.limiter.charge(messages, bytes, now);
        (!pause.is_zero()).then(|| pause.min(THROTTLE_PAUSE_MAX))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn rate(messages_per_s: Option<u64>, bytes_per_s: Option<u64>) -> PublishRate {
        PublishRate {
            messages_per_s,
            bytes_per_s,
        }
    }

    #[test]
    fn unlimited_has_no_throttle() {
        assert!(PublishThrottle::new(rate(None, None), Instant::now()).is_none());
    }

    #[test]
    fn a_burst_of_one_second_passes_then_the_rate_holds() {
        let start = Instant::now();
        let throttle = PublishThrottle::new(rate(Some(100), None), start).unwrap();
        for _ in 0..100 {
            assert_eq!(throttle.charge(1, 10, start), None);
        }
        // The 101st is one message of debt: 10 ms at 100 msg/s.
        let pause = throttle.charge(1, 10, start).unwrap();
        assert!((pause.as_secs_f64() - 0.01).abs() < 1e-6, "{pause:?}");
        // Sending at the rate after paying: no more pauses.
        let mut now = start + Duration::from_millis(10);
        for _ in 0..1000 {
            now += Duration::from_millis(10);
            assert_eq!(throttle.charge(1, 10, now), None);
        }
    }

    #[test]
    fn simulated_producers_get_the_rate_and_no_more() {
        // Two producers on one topic, each sending as fast as its pauses let
        // it, for 10 simulated seconds: together they get ~the byte rate.
        let start = Instant::now();
        let throttle = PublishThrottle::new(rate(Some(1_000_000), Some(50_000)), start).unwrap();
        let end = start + Duration::from_secs(10);
        let mut next_send = [start, start];
        let mut sent_bytes = 0u64;
        loop {
            let (which, at) = if next_send[0] <= next_send[1] {
                (0, next_send[0])
            } else {
                (1, next_send[1])
            };
            if at >= end {
                break;
            }
            sent_bytes += 1000;
            let pause = throttle.charge(1, 1000, at).unwrap_or_default();
            assert!(pause <= THROTTLE_PAUSE_MAX);
            // A send takes 100 µs of the producer's time plus the pause.
            next_send[which] = at + Duration::from_micros(100) + pause;
        }
        let rate = sent_bytes as f64 / 10.0;
        // 10 s at 50 kB/s plus the one-second burst, and at most one send of
        // slack per producer.
        assert!(
            (500_000.0..=560_000.0).contains(&(rate * 10.0)),
            "{rate} B/s"
        );
    }

    #[test]
    fn debt_and_pauses_are_bounded() {
        let start = Instant::now();
        let throttle = PublishThrottle::new(rate(Some(10), Some(1000)), start).unwrap();
        for _ in 0..10_000 {
            let pause = throttle.charge(100, 100_000, start).unwrap();
            assert!(pause <= THROTTLE_PAUSE_MAX);
        }
        // Debt stops at 10 s of the rate: 11 s later the buckets are full again.
        assert_eq!(throttle.charge(1, 1, start + Duration::from_secs(11)), None);
    }
}
