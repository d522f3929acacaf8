//! The broker-wide budget of entries subscriptions hold: out to consumers
//! and not acknowledged, waiting to be sent again, or delayed (Pulsar's
//! maxUnackedMessagesPerBroker, counted in entries).
//!
//! Owns: [`HeldEntries`], one per broker, shared by every subscription
//! task. Each task reports its own count after it changes (`HeldShare`);
//! while the broker-wide count is at its bound, subscriptions read no new
//! entries (redeliveries and acknowledgements go on, and free room); the
//! task that brings the count back under the bound wakes the waiting ones.
//! Why: each held entry costs ~64 bytes of index (position, owner, slot in
//! a B-tree); the per-subscription bounds (`UNACKED_ENTRIES_MAX` ...) are
//! 100,000s, which times 100,000 subscriptions is no bound at all.
//! Never: drops or refuses an entry already held (the count may pass the
//! bound by one read batch per subscription: bounded by what one read adds).

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::sync::Notify;

/// Entries held by every subscription of the broker.
#[derive(Debug)]
pub(crate) struct HeldEntries {
    held: AtomicUsize,
    max: usize,
    freed: Notify,
}

impl HeldEntries {
    pub(crate) fn new(max: usize) -> Arc<HeldEntries> {
        Arc::new(HeldEntries {
            held: AtomicUsize::new(0),
            max: max.max(1),
            freed: Notify::new(),
        })
    }

    /// Entries held now over all subscriptions.
    pub(crate) fn held(&self) -> usize {
        self.held.load(Ordering::Acquire)
    }

    /// The bound.
    pub(crate) fn max(&self) -> usize {
        self.max
    }

    /// At the bound: no subscription reads new entries.
    pub(crate) fn is_full(&self) -> bool {
        self.held() >= self.max
    }

    /// Resolves once the count went under the bound after being at it
    /// (enable the future, then check `is_full`, then await it).
    pub(crate) fn freed(&self) -> tokio::sync::futures::Notified<'_> {
        self.freed.notified()
    }
}

/// One subscription's share of the count: what it reported last.
#[derive(Debug)]
pub(crate) struct HeldShare {
    budget: Arc<HeldEntries>,
    reported: usize,
}

impl HeldShare {
    pub(crate) fn new(budget: Arc<HeldEntries>) -> HeldShare {
        HeldShare {
            budget,
            reported: 0,
        }
    }

    /// The broker-wide budget.
    pub(crate) fn budget(&self) -> &Arc<HeldEntries> {
        &self.budget
    }

    /// The subscription holds `now` entries: the broker-wide count follows,
    /// and subscriptions waiting for room are woken when it went under the
    /// bound.
    pub(crate) fn report(&mut self, now: usize) {
        let before = self.reported;
        self.reported = now;
        if now > before {
            self.budget.held.fetch_add(now - before, Ordering::AcqRel);
        } else if now < before {
            let was = self.budget.held.fetch_sub(before - now, Ordering::AcqRel);
            // Accounting: a share never gives back more than it reported.
            debug_assert!(was >= before - now);
            let after = was - (before - now);
            if was >= self.budget.max && after < self.budget.max {
                self.budget.freed.notify_waiters();
            }
        }
    }
}

impl Drop for HeldShare {
    fn drop(&mut self) {
        self.report(0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn shares_add_up_and_waiters_are_woken_under_the_bound() {
        let budget = HeldEntries::new(10);
        let mut a = HeldShare::new(Arc::clone(&budget));
        let mut b = HeldShare::new(Arc::clone(&budget));
        a.report(6);
        b.report(5);
        assert_eq!(budget.held(), 11);
        assert!(budget.is_full());
        let freed = budget.freed();
        tokio::pin!(freed);
        freed.as_mut().enable();
        b.report(2);
        assert!(!budget.is_full());
        freed.await;
        drop(a);
        drop(b);
        assert_eq!(budget.held(), 0, "dropped shares give everything back");
    }
}
