//! A replicator's dispatch rate: the topic's `replicatorDispatchRate`
//! (topic policy, else the namespace's; Pulsar's), kept by each replicator
//! on its own (one per topic and remote cluster), as Pulsar's
//! `DispatchRateLimiter` of type REPLICATOR.
//!
//! Owns: the replicator's `RateLimiter`, made again when the topic's rates
//! are replaced (`DispatchPolicy::set_rates`). Before each entry it sends
//! the replicator asks it; without a whole token it sends nothing more
//! until one is back (entries wait in the log behind its cursor); each
//! entry sent is charged its messages and bytes.
//! Bounds: the limiter's debt, as the subscriptions' (one entry may
//! overdraw).
//! Never: drops or refuses an entry.

use std::time::{Duration, Instant};

use crate::rate_limit::RateLimiter;
use crate::subscription::{DispatchPolicy, dispatch_limiter};

#[derive(Debug, Default)]
pub(super) struct ReplicatorRate {
    /// The version of the topic's rates the limiter is of.
    version: Option<u64>,
    limiter: Option<RateLimiter>,
}

impl ReplicatorRate {
    /// Takes the topic's replicator rate when the rates were replaced
    /// since (one atomic load otherwise).
    pub(super) fn refresh(&mut self, policy: &DispatchPolicy) {
        if self.version == Some(policy.rates_version()) {
            return;
        }
        let (version, rate) = policy.replicator_rate();
        self.version = Some(version);
        self.limiter = rate.and_then(|rate| dispatch_limiter(rate, Instant::now()));
    }

    /// How long until the next entry may go (`None`: now).
    pub(super) fn wait(&self) -> Option<Duration> {
        self.limiter.as_ref()?.wait(Instant::now())
    }

    /// Charges an entry sent.
    pub(super) fn charge(&self, messages: u64, bytes: u64) {
        if let Some(limiter) = &self.limiter {
            limiter.charge(messages, bytes, Instant::now());
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::config::DispatchRate;
    use crate::subscription::DispatchRates;

    #[test]
    fn a_replicator_keeps_to_the_topic_s_replicator_rate() {
        let policy = DispatchPolicy::default();
        let mut rate = ReplicatorRate::default();
        rate.refresh(&policy);
        assert_eq!(rate.wait(), None, "no rate: unlimited");
        // 3 messages per 100 s: no token comes back while the test runs.
        let three = DispatchRate {
            messages_per_period: Some(3),
            bytes_per_period: None,
            period: Duration::from_secs(100),
        };
        policy.set_rates(DispatchRates::new(None, None).with_replicator(Some(three)));
        rate.refresh(&policy);
        for _ in 0..3 {
            assert_eq!(rate.wait(), None);
            rate.charge(1, 100);
        }
        assert!(rate.wait().is_some(), "the fourth waits");
        // Not the subscriptions' rate: theirs is unlimited.
        assert!(policy.replicator_rate().1.is_some());
        policy.set_rates(DispatchRates::new(None, None));
        rate.refresh(&policy);
        assert_eq!(rate.wait(), None, "removed");
    }
}
