//! One copy of a namespace's resolved policies for all its topics that have
//! none of their own: a `TopicPolicies` is ~500 bytes, the same for every
//! such topic of a namespace, and a broker may serve 100,000 topics.
//!
//! Owns: [`SharedPolicies`], a map namespace → the copy last resolved for
//! it. A topic is handed the copy only when its own resolution is equal to
//! it (so sharing never changes what a topic enforces); a different
//! resolution (the namespace's policies or the broker's dynamic ones
//! changed) replaces the map's copy, and topics still holding the old one
//! keep it until they are applied the new one (`Service::apply_policies`
//! goes over every served topic of the namespace).
//! Bounds: the map holds at most `max(SHARED_NAMESPACES_MIN, 2 × the
//! namespaces whose copy a topic holds)` entries: past that, the entries no
//! topic holds are dropped (amortized: a prune at most every doubling).
//! Never: resolves policies (`TopicPolicies::resolve`) or applies them.

use std::collections::HashMap;
use std::sync::Arc;

use parking_lot::Mutex;

use super::TopicPolicies;
use crate::admin::TopicRecord;
use crate::topic_name::NamespaceName;

/// Entries the map holds before it first drops those no topic holds.
const SHARED_NAMESPACES_MIN: usize = 64;

#[derive(Debug)]
struct Copies {
    by_namespace: HashMap<NamespaceName, Arc<TopicPolicies>>,
    /// The map's size at which the next insert prunes it.
    prune_at: usize,
}

/// The copies of the namespaces' resolved policies (module docs).
#[derive(Debug)]
pub(crate) struct SharedPolicies(Mutex<Copies>);

impl Default for SharedPolicies {
    fn default() -> SharedPolicies {
        SharedPolicies(Mutex::new(Copies {
            by_namespace: HashMap::new(),
            prune_at: SHARED_NAMESPACES_MIN,
        }))
    }
}

impl SharedPolicies {
    /// `resolved`, the policies of a topic of `ns` whose own record is
    /// `record`: the namespace's shared copy when equal, else a new copy
    /// (shared from now on when the topic has no policies of its own).
    pub(crate) fn share(
        &self,
        ns: &NamespaceName,
        record: &TopicRecord,
        resolved: TopicPolicies,
    ) -> Arc<TopicPolicies> {
        let mut copies = self.0.lock();
        if let Some(shared) = copies.by_namespace.get(ns)
            && **shared == resolved
        {
            return Arc::clone(shared);
        }
        let copy = Arc::new(resolved);
        // A topic's own policies or quotas make its resolution its own: it
        // would replace the copy every other topic of `ns` shares.
        if !record.policies.is_empty() || !record.backlog_quotas.is_empty() {
            return copy;
        }
        if !copies.by_namespace.contains_key(ns) && copies.by_namespace.len() >= copies.prune_at {
            copies
                .by_namespace
                .retain(|_, shared| Arc::strong_count(shared) > 1);
            copies.prune_at = (copies.by_namespace.len() * 2).max(SHARED_NAMESPACES_MIN);
        }
        copies.by_namespace.insert(ns.clone(), Arc::clone(&copy));
        debug_assert!(copies.by_namespace.len() <= copies.prune_at);
        copy
    }

    /// Namespaces with a copy (tests).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.0.lock().by_namespace.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn ns(index: usize) -> NamespaceName {
        NamespaceName::parse(&format!("tenant/ns-{index}")).unwrap()
    }

    fn ttl(seconds: u64) -> TopicPolicies {
        TopicPolicies {
            message_ttl: Some(Duration::from_secs(seconds)),
            ..TopicPolicies::default()
        }
    }

    #[test]
    fn topics_of_a_namespace_share_one_copy_until_it_changes() {
        let shared = SharedPolicies::default();
        let none = TopicRecord::default();
        let first = shared.share(&ns(0), &none, ttl(10));
        let second = shared.share(&ns(0), &none, ttl(10));
        assert!(Arc::ptr_eq(&first, &second));
        // Another namespace with equal policies: its own copy.
        assert!(!Arc::ptr_eq(&first, &shared.share(&ns(1), &none, ttl(10))));
        // Changed: a new copy, shared from then on; the old one unchanged.
        let changed = shared.share(&ns(0), &none, ttl(20));
        assert_eq!(changed.message_ttl, Some(Duration::from_secs(20)));
        assert_eq!(first.message_ttl, Some(Duration::from_secs(10)));
        assert!(Arc::ptr_eq(&changed, &shared.share(&ns(0), &none, ttl(20))));
    }

    #[test]
    fn a_topic_with_its_own_policies_gets_its_own_copy() {
        let shared = SharedPolicies::default();
        let none = TopicRecord::default();
        let namespace_copy = shared.share(&ns(0), &none, ttl(10));
        let mut own = TopicRecord::default();
        own.policies
            .insert("messageTTL".into(), serde_json::json!(30));
        let topic_copy = shared.share(&ns(0), &own, ttl(30));
        assert_eq!(topic_copy.message_ttl, Some(Duration::from_secs(30)));
        // The namespace's copy is still the one shared.
        assert!(Arc::ptr_eq(
            &namespace_copy,
            &shared.share(&ns(0), &none, ttl(10))
        ));
        // Own policies resolving to the namespace's: the shared copy.
        assert!(Arc::ptr_eq(
            &namespace_copy,
            &shared.share(&ns(0), &own, ttl(10))
        ));
    }

    #[test]
    fn copies_no_topic_holds_are_dropped_as_namespaces_come_and_go() {
        let shared = SharedPolicies::default();
        let none = TopicRecord::default();
        let held: Vec<_> = (0..10)
            .map(|i| shared.share(&ns(i), &none, ttl(1)))
            .collect();
        for i in 10..10_000 {
            drop(shared.share(&ns(i), &none, ttl(1)));
            assert!(shared.len() <= SHARED_NAMESPACES_MIN.max(2 * held.len()) + 1);
        }
        for (i, copy) in held.iter().enumerate() {
            assert!(Arc::ptr_eq(copy, &shared.share(&ns(i), &none, ttl(1))));
        }
    }
}
