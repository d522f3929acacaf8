//! Closing every served topic at once: broker shutdown, or a cluster
//! session lost (`cluster`).
//!
//! Owns: the bound on topic closes in flight. A topic's close detaches its
//! clients, closes its ledger (a metadata write) and flushes every cursor
//! that moved (a metadata write each). One topic after another, 100,000
//! loaded topics are 100,000 durable commits in a row (about a minute);
//! `TOPIC_CLOSES_IN_FLIGHT_MAX` at once, the metadata store shares its
//! commits among them (the embedded store's group commit, etcd's own
//! batching), so they take seconds. Guarantees: every topic is closed (a
//! failed close is returned, the others go on); closes never hold more than
//! the bound of tasks.

use std::sync::Arc;

use tokio::task::JoinSet;
use vela_log::LogError;

use crate::nonpersistent::NonPersistentTopic;
use crate::topic::Topic;

/// Topics closed at once. Each close is a task holding a few futures; the
/// writes of that many closes fill a few of the metadata store's commits.
pub(crate) const TOPIC_CLOSES_IN_FLIGHT_MAX: usize = 256;

/// Closes every topic, at most `TOPIC_CLOSES_IN_FLIGHT_MAX` at once, and
/// returns the errors of the closes that failed.
pub(crate) async fn close_all(
    topics: Vec<Arc<Topic>>,
    non_persistent: Vec<Arc<NonPersistentTopic>>,
) -> Vec<LogError> {
    let closes = topics.into_iter().map(|topic| async move {
        let result = topic.close().await;
        if let Err(error) = &result {
            tracing::warn!(topic = %topic.full_name, %error, "topic close failed");
        }
        result.err()
    });
    let mut errors: Vec<LogError> = bounded(closes).await.into_iter().flatten().collect();
    let np_closes = non_persistent.into_iter().map(|topic| async move {
        topic.close().await;
        None::<LogError>
    });
    errors.extend(bounded(np_closes).await.into_iter().flatten());
    errors
}

/// Runs every future as its own task, at most `TOPIC_CLOSES_IN_FLIGHT_MAX`
/// at once; their outputs in completion order (a task that panicked is
/// logged and has none).
async fn bounded<F>(futures: impl Iterator<Item = F>) -> Vec<F::Output>
where
    F: std::future::Future + Send + 'static,
    F::Output: Send + 'static,
{
    let mut futures = futures.peekable();
    let mut running = JoinSet::new();
    let mut outputs = Vec::new();
    loop {
        while running.len() < TOPIC_CLOSES_IN_FLIGHT_MAX {
            match futures.next() {
                Some(future) => {
                    running.spawn(future);
                }
                None => break,
            }
        }
        match running.join_next().await {
            Some(Ok(output)) => outputs.push(output),
            Some(Err(error)) => tracing::error!(%error, "a topic close task failed"),
            None if futures.peek().is_none() => return outputs,
            None => {}
        }
    }
}
