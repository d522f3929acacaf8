//! Topic list watchers (WATCH_TOPIC_LIST): pattern consumers told at once
//! when a matching persistent topic of their namespace is created or
//! deleted, instead of finding out at their next poll.
//!
//! Owns: [`TopicListWatchers`], the broker's hub: one feed per watched
//! namespace (a task following the namespace's topic records in the
//! metadata store, so topics created through any broker of a cluster are
//! seen, and keeping the namespace's topic list), and the watchers of each
//! feed with the topics each one's pattern matches. A change re-reads the
//! namespace's list and tells each watcher what it gained or lost, one
//! update per topic as Pulsar sends them, each with the hash of the
//! watcher's list after it. As in Pulsar 4.0, only persistent topics are
//! watched (the records are theirs; non-persistent topics have none).
//!
//! Bounds: `WATCHER_UPDATES_QUEUED_MAX` updates wait for one watcher's
//! connection; when a watcher's queue is full (its client does not read)
//! the watcher is closed on the broker's side: no more updates, and the
//! client's own periodic pattern poll (every client keeps one) still finds
//! the changes. `TOPIC_LIST_WATCHERS_MAX` watchers in all (more are
//! refused with NotAllowedError).
//! Locks: `hub` (short, a leaf; never held across an await).
//! Never: lists non-persistent topics, or blocks a feed on a slow client.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Weak};
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::{mpsc, oneshot, watch};
use vela_meta::MetadataStore;
use vela_wire::proto::ServerError;

use crate::admin::Admin;
use crate::error::ServiceError;
use crate::topic_list::{TopicsPattern, topics_hash};
use crate::topic_name::NamespaceName;

/// Updates queued for one watcher's connection. A namespace changing
/// faster than a client reads for a thousand topic events is a client not
/// reading; its watcher is closed (it falls back to its poll).
pub(crate) const WATCHER_UPDATES_QUEUED_MAX: usize = 1000;

/// Watchers served at once by this broker (each holds its matching topic
/// list). When reached: WATCH_TOPIC_LIST gets NotAllowedError.
pub(crate) const TOPIC_LIST_WATCHERS_MAX: usize = 100_000;

/// Time before a feed reads its namespace again after the metadata store
/// failed it.
const FEED_RETRY: Duration = Duration::from_millis(500);

/// One change a watcher is told about (WATCH_TOPIC_UPDATE).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Update {
    /// Topics it gained.
    pub(crate) new_topics: Vec<String>,
    /// Topics it lost.
    pub(crate) deleted_topics: Vec<String>,
    /// Hash of its list after the change.
    pub(crate) topics_hash: String,
}

struct WatcherState {
    pattern: TopicsPattern,
    matching: BTreeSet<String>,
    updates: mpsc::Sender<Update>,
}

struct Feed {
    topics: BTreeSet<String>,
    watchers: HashMap<u64, WatcherState>,
    /// Set once the first list is read.
    loaded: watch::Receiver<bool>,
    /// Dropped to stop the feed's task.
    _stop: oneshot::Sender<()>,
}

#[derive(Default)]
struct Hub {
    feeds: HashMap<NamespaceName, Feed>,
    watchers: usize,
    next_id: u64,
}

/// A registered watcher: the topics it matches now and its updates.
#[derive(Debug)]
pub(crate) struct Registration {
    /// Topics matching now, sorted.
    pub(crate) topics: Vec<String>,
    /// Changes from now on.
    pub(crate) updates: mpsc::Receiver<Update>,
    /// Unregisters the watcher when dropped.
    pub(crate) handle: WatchHandle,
}

/// A watcher's place in the hub: dropping it unregisters the watcher.
#[derive(Debug)]
pub(crate) struct WatchHandle {
    guard: Guard,
}

#[derive(Debug)]
struct Guard {
    hub: Weak<Mutex<Hub>>,
    namespace: NamespaceName,
    id: u64,
}

impl Drop for Guard {
    fn drop(&mut self) {
        let Some(hub) = self.hub.upgrade() else {
            return;
        };
        let mut hub = hub.lock();
        let Some(feed) = hub.feeds.get_mut(&self.namespace) else {
            return;
        };
        if feed.watchers.remove(&self.id).is_some() {
            let empty = feed.watchers.is_empty();
            hub.watchers -= 1;
            if empty {
                // Its task stops with the stop sender.
                hub.feeds.remove(&self.namespace);
            }
        }
    }
}

/// The broker's topic list watchers.
pub(crate) struct TopicListWatchers {
    admin: Admin,
    meta: Arc<dyn MetadataStore>,
    hub: Arc<Mutex<Hub>>,
}

impl std::fmt::Debug for TopicListWatchers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TopicListWatchers").finish_non_exhaustive()
    }
}

impl TopicListWatchers {
    pub(crate) fn new(admin: Admin, meta: Arc<dyn MetadataStore>) -> TopicListWatchers {
        TopicListWatchers {
            admin,
            meta,
            hub: Arc::default(),
        }
    }

    /// Registers a watcher of `namespace`'s persistent topics matching
    /// `pattern`: the topics matching now, then every change.
    pub(crate) async fn register(
        &self,
        namespace: &NamespaceName,
        pattern: TopicsPattern,
    ) -> Result<Registration, ServiceError> {
        let mut loaded = self.feed(namespace);
        if loaded.wait_for(|done| *done).await.is_err() {
            return Err(ServiceError::new(
                ServerError::MetadataError,
                "topic list of the namespace could not be read",
            ));
        }
        let mut hub = self.hub.lock();
        if hub.watchers >= TOPIC_LIST_WATCHERS_MAX {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                "TOPIC_LIST_WATCHERS_MAX topic list watchers are served already",
            ));
        }
        hub.next_id += 1;
        let id = hub.next_id;
        let Some(feed) = hub.feeds.get_mut(namespace) else {
            // Its last watcher left while this one waited: try again.
            return Err(ServiceError::new(
                ServerError::ServiceNotReady,
                "topic list watcher closed meanwhile, retry",
            ));
        };
        let matching: BTreeSet<String> = pattern.filter(&feed.topics).into_iter().collect();
        let (updates, receiver) = mpsc::channel(WATCHER_UPDATES_QUEUED_MAX);
        let topics: Vec<String> = matching.iter().cloned().collect();
        feed.watchers.insert(
            id,
            WatcherState {
                pattern,
                matching,
                updates,
            },
        );
        hub.watchers += 1;
        debug_assert!(hub.watchers <= TOPIC_LIST_WATCHERS_MAX);
        Ok(Registration {
            topics,
            updates: receiver,
            handle: WatchHandle {
                guard: Guard {
                    hub: Arc::downgrade(&self.hub),
                    namespace: namespace.clone(),
                    id,
                },
            },
        })
    }

    /// The topics a watcher matches now (empty once it was closed).
    pub(crate) fn matching(&self, handle: &WatchHandle) -> Vec<String> {
        let guard = &handle.guard;
        let hub = self.hub.lock();
        hub.feeds
            .get(&guard.namespace)
            .and_then(|feed| feed.watchers.get(&guard.id))
            .map(|watcher| watcher.matching.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The feed of a namespace (started when absent): whether its first
    /// list is read.
    fn feed(&self, namespace: &NamespaceName) -> watch::Receiver<bool> {
        let mut hub = self.hub.lock();
        if let Some(feed) = hub.feeds.get(namespace) {
            return feed.loaded.clone();
        }
        let (loaded_tx, loaded) = watch::channel(false);
        let (stop, stopped) = oneshot::channel();
        hub.feeds.insert(
            namespace.clone(),
            Feed {
                topics: BTreeSet::new(),
                watchers: HashMap::new(),
                loaded: loaded.clone(),
                _stop: stop,
            },
        );
        tokio::spawn(run_feed(
            Arc::downgrade(&self.hub),
            self.admin.clone(),
            Arc::clone(&self.meta),
            namespace.clone(),
            loaded_tx,
            stopped,
        ));
        loaded
    }
}

/// Follows one namespace's topic records: reads its list, applies it, then
/// waits for the next change (several close together make one re-read).
async fn run_feed(
    hub: Weak<Mutex<Hub>>,
    admin: Admin,
    meta: Arc<dyn MetadataStore>,
    namespace: NamespaceName,
    loaded: watch::Sender<bool>,
    mut stopped: oneshot::Receiver<()>,
) {
    let [topics_path, partitioned_path] = admin.topic_list_paths(&namespace);
    let watches = (
        meta.watch(&topics_path).await,
        meta.watch(&partitioned_path).await,
    );
    let (mut topics_watch, mut partitioned_watch) = match watches {
        (Ok(topics), Ok(partitioned)) => (topics, partitioned),
        (Err(error), _) | (_, Err(error)) => {
            tracing::warn!(%namespace, %error, "topic list watch failed");
            // `loaded` goes with this task: waiting registrations fail
            // (MetadataError) and the next one starts a new feed.
            drop_feed(&hub, &namespace);
            return;
        }
    };
    loop {
        match admin.topics_of_namespace(&namespace).await {
            Ok(topics) => {
                let Some(hub) = hub.upgrade() else {
                    return;
                };
                let mut hub = hub.lock();
                let Some(feed) = hub.feeds.get_mut(&namespace) else {
                    return;
                };
                let closed = apply(feed, topics.into_iter().collect());
                let emptied = closed > 0 && feed.watchers.is_empty();
                hub.watchers -= closed;
                if emptied {
                    hub.feeds.remove(&namespace);
                    return;
                }
                let _ = loaded.send(true);
            }
            Err(error) => {
                tracing::warn!(%namespace, %error, "topic list not read; retrying");
                tokio::time::sleep(FEED_RETRY).await;
                continue;
            }
        }
        let ended = tokio::select! {
            _ = &mut stopped => return,
            event = topics_watch.recv() => event.is_none(),
            event = partitioned_watch.recv() => event.is_none(),
        };
        if ended {
            tracing::warn!(%namespace, "topic list watch ended");
            drop_feed(&hub, &namespace);
            return;
        }
        // Changes arriving together make one re-read.
        while topics_watch.try_recv().is_some() || partitioned_watch.try_recv().is_some() {}
    }
}

/// Forgets a namespace's feed and its watchers (its task ended).
fn drop_feed(hub: &Weak<Mutex<Hub>>, namespace: &NamespaceName) {
    let Some(hub) = hub.upgrade() else {
        return;
    };
    let mut hub = hub.lock();
    if let Some(feed) = hub.feeds.remove(namespace) {
        hub.watchers -= feed.watchers.len();
    }
}

/// Applies a namespace's new topic list: each watcher is told, topic by
/// topic, what its pattern gained or lost. A watcher whose queue is full
/// or whose connection is gone is closed. Returns how many were closed.
fn apply(feed: &mut Feed, topics: BTreeSet<String>) -> usize {
    let created: Vec<String> = topics.difference(&feed.topics).cloned().collect();
    let deleted: Vec<String> = feed.topics.difference(&topics).cloned().collect();
    feed.topics = topics;
    if created.is_empty() && deleted.is_empty() {
        return 0;
    }
    let before = feed.watchers.len();
    feed.watchers.retain(|_, watcher| {
        for topic in &deleted {
            if !watcher.matching.remove(topic) {
                continue;
            }
            let update = Update {
                new_topics: Vec::new(),
                deleted_topics: vec![topic.clone()],
                topics_hash: topics_hash(&watcher.matching.iter().collect::<Vec<_>>()),
            };
            if !offer(watcher, update) {
                return false;
            }
        }
        for topic in created.iter().filter(|t| watcher.pattern.matches(t)) {
            watcher.matching.insert(topic.clone());
            let update = Update {
                new_topics: vec![topic.clone()],
                deleted_topics: Vec::new(),
                topics_hash: topics_hash(&watcher.matching.iter().collect::<Vec<_>>()),
            };
            if !offer(watcher, update) {
                return false;
            }
        }
        true
    });
    before - feed.watchers.len()
}

/// Queues an update; false when the watcher must go (queue full: the
/// client does not read; closed: its connection is gone).
fn offer(watcher: &WatcherState, update: Update) -> bool {
    match watcher.updates.try_send(update) {
        Ok(()) => true,
        Err(mpsc::error::TrySendError::Full(_)) => {
            tracing::warn!(
                "a topic list watcher's client does not read its updates \
                 (WATCHER_UPDATES_QUEUED_MAX): the watcher is closed, its client polls"
            );
            false
        }
        Err(mpsc::error::TrySendError::Closed(_)) => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn feed_with(watchers: Vec<(u64, WatcherState)>) -> Feed {
        let (_loaded_tx, loaded) = watch::channel(true);
        let (stop, _stopped) = oneshot::channel();
        Feed {
            topics: BTreeSet::new(),
            watchers: watchers.into_iter().collect(),
            loaded,
            _stop: stop,
        }
    }

    fn watcher(pattern: &str, capacity: usize) -> (WatcherState, mpsc::Receiver<Update>) {
        let (updates, receiver) = mpsc::channel(capacity);
        let state = WatcherState {
            pattern: TopicsPattern::new(pattern).unwrap(),
            matching: BTreeSet::new(),
            updates,
        };
        (state, receiver)
    }

    fn set(names: &[&str]) -> BTreeSet<String> {
        names
            .iter()
            .map(|n| format!("persistent://t/ns/{n}"))
            .collect()
    }

    #[test]
    fn updates_go_topic_by_topic_and_a_full_queue_closes_the_watcher() {
        let (a, mut a_updates) = watcher("persistent://t/ns/a.*", 16);
        let (slow, _slow_updates) = watcher("persistent://t/ns/.*", 1);
        let mut feed = feed_with(vec![(1, a), (2, slow)]);
        // Two new topics: the slow watcher's second update does not fit.
        assert_eq!(apply(&mut feed, set(&["a1", "a2", "b"])), 1);
        assert_eq!(feed.watchers.len(), 1);
        let first = a_updates.try_recv().unwrap();
        assert_eq!(first.new_topics, vec!["persistent://t/ns/a1"]);
        assert_eq!(first.topics_hash, topics_hash(&["persistent://t/ns/a1"]));
        let second = a_updates.try_recv().unwrap();
        assert_eq!(second.new_topics, vec!["persistent://t/ns/a2"]);
        assert!(a_updates.try_recv().is_err(), "b does not match");
        // A deleted topic; nothing changes: no update.
        assert_eq!(apply(&mut feed, set(&["a2", "b"])), 0);
        let deleted = a_updates.try_recv().unwrap();
        assert_eq!(deleted.deleted_topics, vec!["persistent://t/ns/a1"]);
        assert_eq!(deleted.topics_hash, topics_hash(&["persistent://t/ns/a2"]));
        apply(&mut feed, set(&["a2", "b"]));
        assert!(a_updates.try_recv().is_err());
        // A watcher whose connection is gone is closed too.
        drop(a_updates);
        assert_eq!(apply(&mut feed, set(&["a3"])), 1);
        assert!(feed.watchers.is_empty());
    }
}
