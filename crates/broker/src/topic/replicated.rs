//! Whether a topic's durable subscriptions are replicated (Pulsar's
//! `PersistentSubscription.setReplicated`): kept in memory in the topic's
//! `ReplicatedSubscriptions` and on the subscription's cursor as the
//! property `pulsar.replicated.subscription` = 1 (Pulsar's name and value),
//! so a subscription stays replicated across restarts with no consumer
//! attached; the snapshot controller (`replication::snapshots`) then keeps
//! taking snapshots and sending its updates.
//!
//! Owns: `Topic::set_replicated` and `Topic::replicated_status` (the
//! marks are read back at topic load by `ReplicatedSubscriptions::
//! restore`). Guarantees: the
//! cursor property is written through before `set_replicated` returns
//! Ok, so what a caller was told survives a crash.
//! Never: marks a reader (no cursor) or a replicator's cursor.

use super::Topic;
use super::dedup::REPLICATOR_PREFIX;
use crate::subscription::{REPLICATED_SUBSCRIPTION_PROPERTY, ReplicatedStatusError};

/// A replicator's cursor: replication, not a subscription.
fn is_replicator_cursor(name: &str) -> bool {
    name.starts_with(REPLICATOR_PREFIX)
}

impl Topic {
    /// Marks durable subscription `name` replicated or not, in memory and
    /// on its cursor (written before this returns).
    pub(crate) async fn set_replicated(
        &self,
        name: &str,
        replicated: bool,
    ) -> Result<(), ReplicatedStatusError> {
        let Some(cursor) = self
            .log
            .cursor(name)
            .filter(|_| !is_replicator_cursor(name))
        else {
            return Err(self.status_missing(name));
        };
        let marks = self.replicated_subscriptions();
        if replicated {
            if !marks.mark(name) {
                return Err(ReplicatedStatusError::Limit(
                    crate::subscription::REPLICATED_SUBSCRIPTIONS_MAX,
                ));
            }
            cursor
                .set_property(REPLICATED_SUBSCRIPTION_PROPERTY, Some(1))
                .await
                .map_err(ReplicatedStatusError::Persist)?;
        } else {
            marks.forget(name);
            cursor
                .set_property(REPLICATED_SUBSCRIPTION_PROPERTY, None)
                .await
                .map_err(ReplicatedStatusError::Persist)?;
        }
        Ok(())
    }

    /// Whether subscription `name` is replicated (a reader never is).
    pub(crate) fn replicated_status(&self, name: &str) -> Result<bool, ReplicatedStatusError> {
        // Readers have no cursor: never replicated.
        if !self.subscription_names().iter().any(|n| n == name) {
            return Err(self.status_missing(name));
        }
        Ok(self.replicated_subscriptions().is_replicated(name))
    }

    /// A live reader of that name, else no such subscription.
    fn status_missing(&self, name: &str) -> ReplicatedStatusError {
        if !is_replicator_cursor(name) && self.subscription_names().iter().any(|n| n == name) {
            ReplicatedStatusError::NotDurable
        } else {
            ReplicatedStatusError::NotFound {
                subscription: name.to_string(),
                topic: self.full_name.to_string(),
            }
        }
    }
}
