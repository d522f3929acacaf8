//! `RateLimiter`: a rate of messages and bytes per period as two token
//! buckets, behind a topic's publish rate (`topic::throttle`) and the
//! dispatch rates (a topic's, shared by its subscriptions, and each
//! subscription's own, checked by the subscription tasks).
//!
//! Owns: the buckets of one rate. Each bucket holds up to one period of its
//! rate (the burst) and refills continuously; a charge may drive it into
//! debt, and the debt divided by the rate is how long its user waits.
//! Bounds: debt is at most `debt_max_periods` periods of the rate (the
//! caller's bound), so a burst costs at most that long.
//! Never: sleeps or does I/O (the caller waits), or blocks (one short lock).

use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// Shortest wait a rate limiter asks for: below it a timer would wake its
/// task again at once.
const WAIT_MIN: Duration = Duration::from_millis(1);

#[derive(Debug)]
struct Bucket {
    /// Tokens per second.
    rate_per_s: f64,
    /// Most tokens held: one period of them.
    capacity: f64,
    /// Tokens now; negative is debt.
    tokens: f64,
}

impl Bucket {
    fn new(permits: u64, period: Duration) -> Bucket {
        let capacity = permits.max(1) as f64;
        let period_s = period.as_secs_f64().max(WAIT_MIN.as_secs_f64());
        Bucket {
            rate_per_s: capacity / period_s,
            capacity,
            tokens: capacity,
        }
    }

    fn refill(&mut self, elapsed: Duration) {
        self.tokens = (self.tokens + elapsed.as_secs_f64() * self.rate_per_s).min(self.capacity);
    }

    /// Takes `amount`, down to a debt of `debt_max_periods` periods.
    fn take(&mut self, amount: u64, debt_max_periods: f64) {
        self.tokens = (self.tokens - amount as f64).max(-debt_max_periods * self.capacity);
    }

    /// How long until the debt is paid (zero: none).
    fn debt(&self) -> Duration {
        if self.tokens >= 0.0 {
            Duration::ZERO
        } else {
            Duration::from_secs_f64(-self.tokens / self.rate_per_s)
        }
    }

    /// How long until the bucket holds a whole token (`None`: it does).
    fn until_token(&self) -> Option<Duration> {
        (self.tokens < 1.0)
            .then(|| Duration::from_secs_f64((1.0 - self.tokens) / self.rate_per_s).max(WAIT_MIN))
    }
}

#[derive(Debug)]
struct Buckets {
    messages: Option<Bucket>,
    bytes: Option<Bucket>,
    at: Instant,
}

impl Buckets {
    fn refill_to(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.at);
        self.at = self.at.max(now);
        for bucket in [self.messages.as_mut(), self.bytes.as_mut()]
            .into_iter()
            .flatten()
        {
            bucket.refill(elapsed);
        }
    }

    fn each(&self) -> impl Iterator<Item = &Bucket> {
        [self.messages.as_ref(), self.bytes.as_ref()]
            .into_iter()
            .flatten()
    }
}

/// One rate's buckets (messages and bytes per period; either may be
/// unlimited).
#[derive(Debug)]
pub(crate) struct RateLimiter {
    buckets: Mutex<Buckets>,
    debt_max_periods: f64,
}

impl RateLimiter {
    /// Buckets of `messages` and `bytes` per `period`; `None` when neither
    /// side is limited. A charge may leave up to `debt_max_periods` periods
    /// of debt.
    pub(crate) fn new(
        messages: Option<u64>,
        bytes: Option<u64>,
        period: Duration,
        debt_max_periods: f64,
        now: Instant,
    ) -> Option<RateLimiter> {
        if messages.is_none() && bytes.is_none() {
            return None;
        }
        Some(RateLimiter {
            buckets: Mutex::new(Buckets {
                messages: messages.map(|m| Bucket::new(m, period)),
                bytes: bytes.map(|b| Bucket::new(b, period)),
                at: now,
            }),
            debt_max_periods,
        })
    }

    /// Takes `messages` and `bytes` at `now`; returns how long until the
    /// debt this leaves is paid (zero: none).
    pub(crate) fn charge(&self, messages: u64, bytes: u64, now: Instant) -> Duration {
        let mut buckets = self.buckets.lock();
        buckets.refill_to(now);
        let debt_max = self.debt_max_periods;
        if let Some(bucket) = buckets.messages.as_mut() {
            bucket.take(messages, debt_max);
        }
        if let Some(bucket) = buckets.bytes.as_mut() {
            bucket.take(bytes, debt_max);
        }
        buckets.each().map(Bucket::debt).max().unwrap_or_default()
    }

    /// How long until both sides hold a whole token again (`None`: they do
    /// now, more may be taken).
    pub(crate) fn wait(&self, now: Instant) -> Option<Duration> {
        let mut buckets = self.buckets.lock();
        buckets.refill_to(now);
        buckets.each().filter_map(Bucket::until_token).max()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn unlimited_has_no_limiter() {
        assert!(
            RateLimiter::new(None, None, Duration::from_secs(1), 1.0, Instant::now()).is_none()
        );
    }

    #[test]
    fn a_period_of_burst_then_the_rate_over_the_period() {
        // 20 messages per 2 s: 10 per second once the burst is spent.
        let start = Instant::now();
        let limiter =
            RateLimiter::new(Some(20), None, Duration::from_secs(2), 10.0, start).unwrap();
        for _ in 0..20 {
            assert_eq!(limiter.wait(start), None);
            assert_eq!(limiter.charge(1, 100, start), Duration::ZERO);
        }
        // Spent: dispatch waits for a token; one comes every 100 ms.
        assert!(limiter.wait(start).is_some());
        let later = start + Duration::from_millis(100);
        assert_eq!(limiter.wait(later), None);
        // A batch of 5 messages goes into debt: 400 ms to pay it.
        let debt = limiter.charge(5, 100, later);
        assert!((debt.as_secs_f64() - 0.4).abs() < 1e-6, "{debt:?}");
        // A whole token again 500 ms later.
        assert!(limiter.wait(later).unwrap() >= Duration::from_millis(499));
        assert_eq!(limiter.wait(later + Duration::from_millis(501)), None);
    }

    #[test]
    fn bytes_and_messages_both_hold() {
        let start = Instant::now();
        let limiter =
            RateLimiter::new(Some(1000), Some(1000), Duration::from_secs(1), 10.0, start).unwrap();
        limiter.charge(1, 3000, start);
        // The bytes side owes 2 s; the messages side has plenty.
        let wait = limiter.wait(start).unwrap();
        assert!((wait.as_secs_f64() - 2.0).abs() < 0.01, "{wait:?}");
    }

    #[test]
    fn debt_is_bounded() {
        let start = Instant::now();
        let limiter = RateLimiter::new(Some(10), None, Duration::from_secs(1), 3.0, start).unwrap();
        for _ in 0..1000 {
            limiter.charge(100, 0, start);
        }
        // At most 3 periods of debt: 4 s later the bucket is full again.
        assert_eq!(limiter.wait(start + Duration::from_secs(4)), None);
        assert_eq!(
            limiter.charge(10, 0, start + Duration::from_secs(4)),
            Duration::ZERO
        );
    }
}
