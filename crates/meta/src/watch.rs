//! Watchers: a bounded event queue per watcher, and the in-process registry the
//! local stores notify.
//!
//! Owns: the queue between a store (producer) and one [`Watcher`] (consumer) and
//! the lag rule. Guarantees: events come out in the order they were pushed; when
//! the queue is full the producer never blocks and never grows the queue: the
//! event is dropped, the queue is marked lagged, every later event is dropped
//! too until the consumer has drained the queue, and then the consumer receives
//! one [`WatchEvent::Lagged`]. So a consumer sees an exact prefix of the events,
//! then `Lagged`, then exact events again.

use std::collections::VecDeque;
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};

use tokio::sync::Notify;

use crate::error::MetaError;
use crate::key::in_subtree;
use crate::store::WatchEvent;

/// Events one watcher may have queued. Metadata changes come in small bursts (a
/// broker failing over some thousand bundles); a consumer further behind than
/// this re-reads the state instead, which costs less than unbounded memory.
pub const WATCH_QUEUE_EVENTS_MAX: usize = 1024;

/// Watchers one local store serves. Each costs a scan per write; a process has
/// a handful per component, so this only stops a leak from growing forever.
/// When full, `watch` fails with `LimitReached`.
pub(crate) const LOCAL_WATCHERS_MAX: usize = 65_536;

#[derive(Debug, Default)]
struct QueueState {
    events: VecDeque<WatchEvent>,
    lagged: bool,
    /// The producer side is gone: after the queued events, `recv` returns `None`.
    closed: bool,
    /// The consumer side is gone: the producer may forget this queue.
    watcher_dropped: bool,
}

/// What happened to a pushed event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Pushed {
    /// Queued (or dropped under the lag rule); keep the queue.
    Kept,
    /// The watcher is gone; forget the queue.
    WatcherGone,
}

/// The shared queue of one watcher.
#[derive(Debug, Default)]
pub(crate) struct WatchQueue {
    state: Mutex<QueueState>,
    notify: Notify,
}

impl WatchQueue {
    fn lock(&self) -> MutexGuard<'_, QueueState> {
        // A poisoned queue only means a panic elsewhere; its data is still valid.
        self.state
            .lock()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Queues `event` under the lag rule. Never blocks.
    pub(crate) fn push(&self, event: WatchEvent) -> Pushed {
        let mut state = self.lock();
        if state.watcher_dropped {
            return Pushed::WatcherGone;
        }
        if state.lagged {
            return Pushed::Kept;
        }
        if state.events.len() >= WATCH_QUEUE_EVENTS_MAX {
            state.lagged = true;
            return Pushed::Kept;
        }
        state.events.push_back(event);
        drop(state);
        self.notify.notify_one();
        Pushed::Kept
    }

    /// Ends the stream: the watcher gets what is queued, then `None`.
    pub(crate) fn close(&self) {
        self.lock().closed = true;
        self.notify.notify_one();
    }

    pub(crate) fn is_watcher_dropped(&self) -> bool {
        self.lock().watcher_dropped
    }

    fn pop(&self) -> Popped {
        let mut state = self.lock();
        if let Some(event) = state.events.pop_front() {
            return Popped::Event(event);
        }
        if state.lagged {
            state.lagged = false;
            return Popped::Event(WatchEvent::Lagged);
        }
        if state.closed {
            return Popped::Closed;
        }
        Popped::Empty
    }
}

enum Popped {
    Event(WatchEvent),
    Empty,
    Closed,
}

/// Something a watcher keeps alive while it lives (e.g. the task feeding it from
/// etcd), released when the watcher is dropped.
pub(crate) trait WatchGuard: Send + Sync + fmt::Debug {}

/// Receives the changes below one path, in commit order. Dropping it stops the
/// watch.
#[derive(Debug)]
pub struct Watcher {
    path: String,
    queue: Arc<WatchQueue>,
    _guard: Option<Box<dyn WatchGuard>>,
}

impl Watcher {
    pub(crate) fn new(
        path: String,
        queue: Arc<WatchQueue>,
        guard: Option<Box<dyn WatchGuard>>,
    ) -> Self {
        Self {
            path,
            queue,
            _guard: guard,
        }
    }

    /// The watched path.
    pub fn path(&self) -> &str {
        &self.path
    }

    /// The next event. `None` once a local store (memory, file) was dropped; an
    /// etcd watcher re-creates its watch after failures and only ends when dropped.
    pub async fn recv(&mut self) -> Option<WatchEvent> {
        loop {
            match self.queue.pop() {
                Popped::Event(event) => return Some(event),
                Popped::Closed => return None,
                // A push between `pop` and here leaves a permit: no lost wake-up.
                Popped::Empty => self.queue.notify.notified().await,
            }
        }
    }

    /// The next event if one is queued now.
    pub fn try_recv(&mut self) -> Option<WatchEvent> {
        match self.queue.pop() {
            Popped::Event(event) => Some(event),
            Popped::Empty | Popped::Closed => None,
        }
    }
}

impl Drop for Watcher {
    fn drop(&mut self) {
        self.queue.lock().watcher_dropped = true;
    }
}

/// The watchers of a local store. Callers hold the store's state lock while
/// notifying, so events reach every watcher in commit order.
#[derive(Debug, Default)]
pub(crate) struct LocalWatchers {
    entries: Vec<(String, Arc<WatchQueue>)>,
}

impl LocalWatchers {
    pub(crate) fn add(&mut self, path: &str) -> Result<Watcher, MetaError> {
        self.entries
            .retain(|(_, queue)| !queue.is_watcher_dropped());
        if self.entries.len() >= LOCAL_WATCHERS_MAX {
            return Err(MetaError::LimitReached {
                what: "watchers",
                limit: LOCAL_WATCHERS_MAX,
            });
        }
        let queue = Arc::new(WatchQueue::default());
        self.entries.push((path.to_owned(), Arc::clone(&queue)));
        Ok(Watcher::new(path.to_owned(), queue, None))
    }

    /// Delivers the event for a change of `key` to every watcher whose path
    /// covers it, and forgets watchers that were dropped.
    pub(crate) fn notify(&mut self, key: &str, event: &WatchEvent) {
        self.entries.retain(|(path, queue)| {
            if !in_subtree(path, key) {
                return !queue.is_watcher_dropped();
            }
            queue.push(event.clone()) == Pushed::Kept
        });
    }
}

impl Drop for LocalWatchers {
    fn drop(&mut self) {
        for (_, queue) in &self.entries {
            queue.close();
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::store::Version;

    fn put(i: u64) -> WatchEvent {
        WatchEvent::Put {
            key: format!("/k{i}"),
            version: Version(i),
        }
    }

    #[tokio::test]
    async fn lagging_watcher_gets_prefix_then_lagged_then_new_events() {
        let mut watchers = LocalWatchers::default();
        let mut watcher = watchers.add("/").unwrap();
        let total = WATCH_QUEUE_EVENTS_MAX as u64 + 10;
        for i in 1..=total {
            watchers.notify(&format!("/k{i}"), &put(i));
        }
        for i in 1..=WATCH_QUEUE_EVENTS_MAX as u64 {
            assert_eq!(watcher.recv().await, Some(put(i)));
        }
        assert_eq!(watcher.recv().await, Some(WatchEvent::Lagged));
        assert_eq!(watcher.try_recv(), None);
        watchers.notify("/k9999", &put(9999));
        assert_eq!(watcher.recv().await, Some(put(9999)));
    }

    #[tokio::test]
    async fn events_filtered_by_subtree_and_dropped_watchers_forgotten() {
        let mut watchers = LocalWatchers::default();
        let mut a = watchers.add("/a").unwrap();
        let b = watchers.add("/b").unwrap();
        drop(b);
        watchers.notify("/ab", &put(1));
        watchers.notify("/a/x", &put(2));
        assert_eq!(watchers.entries.len(), 1);
        assert_eq!(a.recv().await, Some(put(2)));
        drop(watchers);
        assert_eq!(a.recv().await, None);
    }
}
