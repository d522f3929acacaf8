//! The committer: takes staged writes off the queue in batches and commits
//! each batch as one atomic, durable backend commit.
//!
//! Owns: the batch bounds and what a commit's end publishes. Exactly one
//! committer runs at a time (`LocalState::committing`, set by the writer that
//! found none running); it holds the state lock only to take a batch and to
//! publish its result, never across the backend's commit, so writers stage
//! the next batch meanwhile. It runs until the queue is empty.

use std::sync::Arc;

use super::{
    COMMIT_BATCH_BYTES_MAX, COMMIT_BATCH_WRITES_MAX, LocalBackend, LocalInner, LocalState,
    Mutation, StagedWrite, lock_watchers,
};
use crate::error::MetaError;

impl LocalState {
    /// The oldest queued writes, at most `COMMIT_BATCH_WRITES_MAX` of them and
    /// `COMMIT_BATCH_BYTES_MAX` bytes (at least one write).
    fn take_batch(&mut self) -> Vec<StagedWrite> {
        let mut batch = Vec::new();
        let mut bytes = 0usize;
        while let Some(next) = self.queue.front() {
            let full = batch.len() >= COMMIT_BATCH_WRITES_MAX
                || (!batch.is_empty() && bytes + next.charged_bytes > COMMIT_BATCH_BYTES_MAX);
            if full {
                break;
            }
            bytes += next.charged_bytes;
            if let Some(write) = self.queue.pop_front() {
                batch.push(write);
            }
        }
        batch
    }
}

/// Fails the store if the committer unwinds between its lock holds, so that
/// no writer waits for a commit that will never come.
struct UnwindGuard<'a, B: LocalBackend> {
    inner: &'a LocalInner<B>,
}

impl<B: LocalBackend> Drop for UnwindGuard<'_, B> {
    fn drop(&mut self) {
        if std::thread::panicking() {
            let mut state = self.inner.lock();
            state.committing = false;
            if state.failed.is_none() {
                let error = MetaError::Backend {
                    op: "commit",
                    detail: "the metadata committer panicked".to_owned(),
                };
                state.fail(&self.inner.durable, error);
            }
        }
    }
}

impl<B: LocalBackend> LocalInner<B> {
    /// Commits queued writes batch by batch until the queue is empty (or a
    /// commit failed), then clears `committing`. Only the writer that set
    /// `committing` calls this. The last batch's durability is published
    /// after this handle on the store is dropped: a writer that saw its
    /// write durable and dropped the store finds the database closed.
    pub(super) fn commit_staged(self: Arc<Self>) {
        let durable = Arc::clone(&self.durable);
        let mut inner = Some(self);
        while let Some(this) = inner.as_ref() {
            let (committed, more) = this.commit_batch();
            if !more {
                inner = None;
            }
            if let Some(revision) = committed {
                // Another committer may have started once `committing` was
                // cleared, and published a later revision already.
                durable.send_modify(|d| d.revision = d.revision.max(revision));
            }
        }
    }

    /// Commits one batch: the revision made durable (`None` when none was),
    /// and whether to go on (`false`: `committing` is cleared).
    fn commit_batch(&self) -> (Option<u64>, bool) {
        let _guard = UnwindGuard { inner: self };
        let batch = {
            let mut state = self.lock();
            debug_assert!(state.committing);
            if state.failed.is_some() || state.queue.is_empty() {
                state.committing = false;
                return (None, false);
            }
            state.take_batch()
        };
        let Some(last) = batch.last().map(|w| w.revision) else {
            return (None, true);
        };
        debug_assert!(batch.windows(2).all(|w| w[0].revision + 1 == w[1].revision));
        let mutations: Vec<Mutation<'_>> = batch
            .iter()
            .flat_map(|write| write.mutations.iter().map(|m| m.as_mutation()))
            .collect();
        let result = self.backend.commit(&mutations, last);
        drop(mutations);
        let mut state = self.lock();
        if let Err(error) = result {
            // Never retried: after a failed fsync the file's state is unknown.
            tracing::error!(%error, writes = batch.len(), "metadata commit failed; the store refuses further operations");
            state.committing = false;
            state.fail(&self.durable, error);
            return (None, false);
        }
        debug_assert_eq!(batch[0].revision, state.durable_revision + 1);
        state.durable_revision = last;
        state.overlay.retain(|_, staged| staged.revision > last);
        {
            let mut watchers = lock_watchers(&self.watchers);
            for mutation in batch.iter().flat_map(|write| &write.mutations) {
                watchers.notify(mutation.key(), &mutation.event());
            }
        }
        let more = !state.queue.is_empty();
        if !more {
            state.committing = false;
        }
        // The batch's staging room is released with `batch`.
        (Some(last), more)
    }
}
