//! Topic list commands: GET_TOPICS_OF_NAMESPACE (with the client's mode,
//! pattern and hash) and the topic list watchers of this connection
//! (WATCH_TOPIC_LIST, WATCH_TOPIC_LIST_CLOSE, WATCH_TOPIC_UPDATE).
//!
//! As Pulsar 4.0 answers: the list is of persistent topics (PERSISTENT),
//! of non-persistent topics served now with producers or subscriptions
//! (NON_PERSISTENT), or both (ALL); a pattern of at most
//! `topic_list::PATTERN_BYTES_MAX` bytes filters it (`filtered`); the
//! hash is of the list answered and, when it equals the client's, the list
//! is left out (`changed` false). A watcher answers its matching topics
//! (or none when the client's hash is theirs) and then one
//! WATCH_TOPIC_UPDATE per created or deleted topic; a pattern longer than
//! the limit is NotAllowedError, a bad one InvalidTopicName.
//! Owns: [`Watchers`] (this connection's watchers: each forwards its
//! updates to the outbound queue from its own task, started after its
//! WATCH_TOPIC_LIST_SUCCESS is queued so updates never overtake it).
//! Never: reads the metadata store for a watcher (the hub's feeds do).

use std::collections::HashMap;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use vela_wire::proto::{self, ServerError, command_get_topics_of_namespace::Mode};

use super::session::{Close, Session};
use crate::authorization::TopicAction;
use crate::codec::{self, Outbound};
use crate::error::ServiceError;
use crate::topic_list::{PATTERN_BYTES_MAX, TopicsPattern, remove_domain_scheme, topics_hash};
use crate::topic_name::NamespaceName;
use crate::watchers::{Registration, Update, WatchHandle};

/// Watchers one connection may hold (a pattern consumer holds one). When
/// reached: WATCH_TOPIC_LIST gets NotAllowedError.
const WATCHERS_PER_CONNECTION_MAX: usize = 1000;

struct ConnWatcher {
    /// Unregisters the watcher when dropped.
    handle: WatchHandle,
    forward: JoinHandle<()>,
}

impl Drop for ConnWatcher {
    fn drop(&mut self) {
        self.forward.abort();
    }
}

/// The topic list watchers of one connection.
pub(super) struct Watchers {
    map: HashMap<u64, ConnWatcher>,
}

impl Watchers {
    pub(super) fn new() -> Watchers {
        Watchers {
            map: HashMap::new(),
        }
    }

    /// Forgets every watcher (the connection is closing).
    pub(super) fn cleanup(&mut self) {
        self.map.clear();
    }

    pub(super) async fn on_watch(
        &mut self,
        session: &Session,
        body: proto::CommandWatchTopicList,
    ) -> Result<(), Close> {
        let (request_id, watcher_id) = (body.request_id, body.watcher_id);
        if let Some(existing) = self.map.get(&watcher_id) {
            // A retry: the existing watcher's list (as Pulsar, without the
            // hash check).
            let topics = session.service.topic_watchers.matching(&existing.handle);
            let hash = topics_hash(&topics);
            return session
                .send(proto::CommandWatchTopicListSuccess {
                    request_id,
                    watcher_id,
                    topic: topics,
                    topics_hash: hash,
                })
                .await;
        }
        let registration = match self.register(session, &body).await {
            Ok(registration) => registration,
            Err(e) => return session.send_error(request_id, e).await,
        };
        let hash = topics_hash(&registration.topics);
        let topics = if body.topics_hash.as_deref() == Some(hash.as_str()) {
            Vec::new()
        } else {
            registration.topics.clone()
        };
        session
            .send(proto::CommandWatchTopicListSuccess {
                request_id,
                watcher_id,
                topic: topics,
                topics_hash: hash,
            })
            .await?;
        let Registration {
            updates, handle, ..
        } = registration;
        let forward = tokio::spawn(forward(watcher_id, updates, session.out.clone()));
        self.map.insert(watcher_id, ConnWatcher { handle, forward });
        debug_assert!(self.map.len() <= WATCHERS_PER_CONNECTION_MAX);
        Ok(())
    }

    async fn register(
        &self,
        session: &Session,
        body: &proto::CommandWatchTopicList,
    ) -> Result<Registration, ServiceError> {
        let ns = NamespaceName::parse(&body.namespace)?;
        session.authorize(&ns, TopicAction::Lookup).await?;
        if self.map.len() >= WATCHERS_PER_CONNECTION_MAX {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                "WATCHERS_PER_CONNECTION_MAX topic list watchers on this connection",
            ));
        }
        let invalid = |e: crate::topic_list::PatternError| {
            ServiceError::new(
                ServerError::InvalidTopicName,
                format!("Invalid topics pattern: {e}"),
            )
        };
        let shortened = remove_domain_scheme(&body.topics_pattern).map_err(invalid)?;
        if shortened.len() > PATTERN_BYTES_MAX {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                format!(
                    "Unable to create topic list watcher: Pattern longer than maximum: {PATTERN_BYTES_MAX}"
                ),
            ));
        }
        let pattern = TopicsPattern::new(&body.topics_pattern).map_err(invalid)?;
        session.service.topic_watchers.register(&ns, pattern).await
    }

    pub(super) async fn on_close(
        &mut self,
        session: &Session,
        body: proto::CommandWatchTopicListClose,
    ) -> Result<(), Close> {
        // Unknown ids are fine (Pulsar answers SUCCESS too).
        self.map.remove(&body.watcher_id);
        session.send_success(body.request_id).await
    }
}

/// Sends a watcher's updates, in order, until it or the connection goes.
async fn forward(
    watcher_id: u64,
    mut updates: mpsc::Receiver<Update>,
    out: mpsc::Sender<Outbound>,
) {
    while let Some(update) = updates.recv().await {
        let frame = codec::encode_command(proto::CommandWatchTopicUpdate {
            watcher_id,
            new_topics: update.new_topics,
            deleted_topics: update.deleted_topics,
            topics_hash: update.topics_hash,
        });
        if out.send(frame).await.is_err() {
            return;
        }
    }
}

pub(super) async fn on_topics_of_namespace(
    session: &Session,
    body: proto::CommandGetTopicsOfNamespace,
) -> Result<(), Close> {
    let request_id = body.request_id;
    let result = async {
        let ns = NamespaceName::parse(&body.namespace)?;
        session.authorize(&ns, TopicAction::Lookup).await?;
        let mode = body
            .mode
            .and_then(|m| Mode::try_from(m).ok())
            .unwrap_or(Mode::Persistent);
        let mut topics = Vec::new();
        if mode != Mode::NonPersistent {
            topics.extend(session.service.admin.topics_of_namespace(&ns).await?);
        }
        if mode != Mode::Persistent {
            topics.extend(session.service.non_persistent_topics_of(&ns, true));
        }
        Ok::<_, ServiceError>(topics)
    }
    .await;
    let topics = match result {
        Ok(topics) => topics,
        Err(e) => return session.send_error(request_id, e).await,
    };
    // A pattern the broker cannot evaluate (too long, or not a regex it
    // compiles): the whole list, unfiltered; the client filters it.
    let pattern = body
        .topics_pattern
        .as_deref()
        .filter(|p| p.len() <= PATTERN_BYTES_MAX)
        .and_then(|p| TopicsPattern::new(p).ok());
    let (topics, filtered) = match pattern {
        Some(pattern) => (pattern.filter(&topics), true),
        None => (topics, false),
    };
    let hash = topics_hash(&topics);
    let changed = body.topics_hash.as_deref() != Some(hash.as_str());
    session
        .send(proto::CommandGetTopicsOfNamespaceResponse {
            request_id,
            topics: if changed { topics } else { Vec::new() },
            filtered: Some(filtered),
            topics_hash: Some(hash),
            changed: Some(changed),
        })
        .await
}
