//! The topic's policies a running subscription reads ([`DispatchPolicy`]):
//! delayed delivery on or off, unacknowledged limits and the dispatch rates
//! (Pulsar's `dispatchRate`, the topic's, shared by its subscriptions, and
//! `subscriptionDispatchRate`, each subscription's own; and
//! `replicatorDispatchRate`, each replicator's own, which `replication`
//! keeps to), and what a subscription task keeps to of those rates
//! (`Rates`).
//!
//! Owns: the topic's shared dispatch limiter and each subscription task's
//! own (a `rate_limit::RateLimiter` each). Before each entry a
//! subscription sends (new or replayed) it asks both; when either lacks a
//! whole token it sends nothing more and wakes when one is back; each entry
//! sent is charged its messages and bytes to both. Entries wait in the log meanwhile:
//! nothing is dropped or refused.
//! Bounds: a limiter's debt is at most `DISPATCH_DEBT_MAX_PERIODS` periods
//! (one entry may overdraw: a batch of many messages, a large message).
//! Never: applies to non-persistent topics (their messages are handed over
//! at SEND, as Pulsar's non-persistent dispatchers do without a rate).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use parking_lot::Mutex;
use tokio::sync::Notify;
use tokio::sync::futures::Notified;

use crate::config::DispatchRate;
use crate::rate_limit::RateLimiter;

/// Debt a dispatch limiter may carry, in periods of its rate.
const DISPATCH_DEBT_MAX_PERIODS: f64 = 10.0;

/// Policies a running subscription reads at each dispatch (set by the
/// topic when its policies change; relaxed atomics: a change applies from
/// the next dispatch pass).
#[derive(Debug)]
pub(crate) struct DispatchPolicy {
    /// Entries with a future `deliver_at_time` wait (`delayedDelivery`).
    pub(crate) delayed_delivery: AtomicBool,
    /// A consumer with this many entries out and unacknowledged gets no
    /// more until some are acknowledged (`maxUnackedMessagesOnConsumer`,
    /// counted in entries; 0: no limit).
    pub(crate) unacked_per_consumer_max: AtomicU64,
    /// The same for the whole subscription
    /// (`maxUnackedMessagesOnSubscription`).
    pub(crate) unacked_per_subscription_max: AtomicU64,
    /// Dispatch rates, replaced whole (`set_rates`); `None`: none (boxed:
    /// most topics have none, ~120 bytes a topic otherwise).
    rates: Mutex<Option<Box<DispatchRates>>>,
    /// Counts replacements of `rates`: a subscription task takes the lock
    /// only after one.
    rates_version: AtomicU64,
    /// Wakes the subscription tasks parked when the rates are replaced (one
    /// may wait on a timer of the old rates).
    rates_changed: Notify,
}

impl Default for DispatchPolicy {
    fn default() -> DispatchPolicy {
        DispatchPolicy {
            delayed_delivery: AtomicBool::new(true),
            unacked_per_consumer_max: AtomicU64::new(0),
            unacked_per_subscription_max: AtomicU64::new(0),
            rates: Mutex::default(),
            rates_version: AtomicU64::new(0),
            rates_changed: Notify::new(),
        }
    }
}

impl DispatchPolicy {
    /// Replaces the dispatch rates (a policy changed them): subscriptions
    /// keep to the new ones from their next dispatch pass.
    pub(crate) fn set_rates(&self, rates: DispatchRates) {
        let none =
            rates.topic.is_none() && rates.subscription.is_none() && rates.replicator.is_none();
        *self.rates.lock() = (!none).then(|| Box::new(rates));
        self.rates_version.fetch_add(1, Ordering::Release);
        self.rates_changed.notify_waiters();
    }

    /// The replicators' rate and the version of the rates it is of.
    pub(crate) fn replicator_rate(&self) -> (u64, Option<DispatchRate>) {
        let rates = self.rates.lock();
        (
            self.rates_version(),
            rates.as_ref().and_then(|rates| rates.replicator),
        )
    }

    /// How many times the rates were replaced.
    pub(crate) fn rates_version(&self) -> u64 {
        self.rates_version.load(Ordering::Acquire)
    }

    /// Completes at the next replacement of the rates (enable it, then
    /// compare `rates_version`, so none is missed).
    pub(crate) fn rates_changed(&self) -> Notified<'_> {
        self.rates_changed.notified()
    }
}

/// The dispatch rates in force on a topic (replaced whole when a policy
/// changes; a new limiter starts with a full period).
#[derive(Debug, Clone, Default)]
pub(crate) struct DispatchRates {
    /// The topic's limiter, charged by every subscription of the topic.
    pub(crate) topic: Option<Arc<RateLimiter>>,
    /// The rate each subscription keeps to on its own.
    pub(crate) subscription: Option<DispatchRate>,
    /// The rate each replicator of the topic keeps to on its own
    /// (`replicatorDispatchRate`; `replication` reads it).
    pub(crate) replicator: Option<DispatchRate>,
}

impl DispatchRates {
    /// Rates for a topic's and each subscription's `DispatchRate`.
    pub(crate) fn new(
        topic: Option<DispatchRate>,
        subscription: Option<DispatchRate>,
    ) -> DispatchRates {
        DispatchRates {
            topic: topic.and_then(|rate| limiter(rate, Instant::now()).map(Arc::new)),
            subscription,
            replicator: None,
        }
    }

    /// The same, with each replicator's rate.
    pub(crate) fn with_replicator(mut self, replicator: Option<DispatchRate>) -> DispatchRates {
        self.replicator = replicator;
        self
    }
}

/// A limiter of `rate` (`None`: neither side limited), with the dispatch
/// debt bound: subscriptions' and replicators'.
pub(crate) fn limiter(rate: DispatchRate, now: Instant) -> Option<RateLimiter> {
    RateLimiter::new(
        rate.messages_per_period,
        rate.bytes_per_period,
        rate.period,
        DISPATCH_DEBT_MAX_PERIODS,
        now,
    )
}

/// The limiters a subscription task keeps to, as of `version` of its
/// topic's `DispatchPolicy::rates`.
#[derive(Debug, Default)]
pub(super) struct Rates {
    version: u64,
    topic: Option<Arc<RateLimiter>>,
    /// The subscription's own rate, boxed: most subscriptions have none
    /// (~110 bytes of a parked subscription otherwise).
    own: Option<Box<RateLimiter>>,
    /// Held back by a rate: dispatch goes on at this time.
    pub(super) resume_at: Option<tokio::time::Instant>,
}

impl Rates {
    /// Takes the topic's rates when they changed since last asked (one
    /// atomic load otherwise).
    pub(super) fn refresh(&mut self, policy: &DispatchPolicy) {
        let version = policy.rates_version();
        if version == self.version {
            return;
        }
        let rates = policy.rates.lock().as_deref().cloned().unwrap_or_default();
        self.version = version;
        self.topic = rates.topic;
        self.own = rates
            .subscription
            .and_then(|rate| limiter(rate, Instant::now()))
            .map(Box::new);
    }

    /// The version of the topic's rates these are.
    pub(super) fn version(&self) -> u64 {
        self.version
    }

    fn limiters(&self) -> impl Iterator<Item = &RateLimiter> {
        self.topic.as_deref().into_iter().chain(self.own.as_deref())
    }

    /// Whether a rate holds dispatch back now; then `resume_at` says until
    /// when.
    pub(super) fn limited(&mut self) -> bool {
        let now = Instant::now();
        let wait = self.limiters().filter_map(|l| l.wait(now)).max();
        self.resume_at = wait.map(|w| tokio::time::Instant::now() + w);
        wait.is_some()
    }

    /// Charges one entry sent: its messages and bytes.
    pub(super) fn charge(&self, messages: u64, bytes: u64) {
        let now = Instant::now();
        for limiter in self.limiters() {
            limiter.charge(messages, bytes, now);
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    /// `messages` per 100 s: no token comes back while a test runs.
    fn rate(messages: u64) -> DispatchRate {
        DispatchRate {
            messages_per_period: Some(messages),
            bytes_per_period: None,
            period: Duration::from_secs(100),
        }
    }

    #[test]
    fn the_topic_rate_is_shared_and_a_subscription_rate_is_each_ones() {
        let policy = DispatchPolicy::default();
        policy.set_rates(DispatchRates::new(Some(rate(4)), Some(rate(3))));
        let (mut a, mut b) = (Rates::default(), Rates::default());
        a.refresh(&policy);
        b.refresh(&policy);
        // a spends its own 3; b can still send the topic's last one.
        for _ in 0..3 {
            assert!(!a.limited());
            a.charge(1, 10);
        }
        assert!(a.limited() && a.resume_at.is_some());
        assert!(!b.limited());
        b.charge(1, 10);
        // The topic's 4 are spent: both wait.
        assert!(b.limited());
        // Removed: nothing holds either back, at their next refresh.
        policy.set_rates(DispatchRates::default());
        a.refresh(&policy);
        b.refresh(&policy);
        assert!(!a.limited() && !b.limited());
        assert_eq!(a.resume_at, None);
    }

    #[test]
    fn unchanged_rates_keep_their_buckets() {
        let policy = DispatchPolicy::default();
        policy.set_rates(DispatchRates::new(None, Some(rate(1))));
        let mut rates = Rates::default();
        rates.refresh(&policy);
        rates.charge(1, 1);
        rates.refresh(&policy);
        assert!(rates.limited(), "a refresh without a change refilled");
    }
}
