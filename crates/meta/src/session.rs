//! Sessions: the lifetime that ephemeral keys are bound to.
//!
//! Owns: the [`Session`] handle and its state. The backend keeps the session
//! alive (etcd: a lease keep-alive task; local stores: the handle itself) and
//! publishes its end through a `watch` channel the handle reads.
//!
//! Life cycle: `Alive` until `close()` (ephemeral keys deleted at once, state
//! `Closed`) or expiry (the store stopped hearing from the holder for the TTL, or
//! a test forced it; keys deleted, state `Expired`). Dropping a live handle
//! without `close()` stops keeping it alive, so it expires one TTL later, as if
//! its process had died. A holder of ownership must stop acting as owner as soon
//! as [`Session::ended`] resolves.

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::watch;

use crate::error::MetaError;
use crate::store::BoxFuture;

/// Identifies a session within its store (the lease id on etcd).
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SessionId(pub u64);

impl fmt::Display for SessionId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "session-{:x}", self.0)
    }
}

/// Where a session is in its life.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum SessionState {
    /// Kept alive; its ephemeral keys exist.
    Alive,
    /// The store let it lapse (or the store itself is gone); its ephemeral keys
    /// are deleted, or will be by the store without this process's help.
    Expired,
    /// Closed by its holder; its ephemeral keys are deleted.
    Closed,
}

/// The backend side of a session handle.
pub(crate) trait SessionControl: Send + Sync + fmt::Debug {
    /// Ends the session now and deletes its ephemeral keys.
    fn close(&self, id: SessionId) -> BoxFuture<'_, Result<(), MetaError>>;
    /// The handle was dropped while alive: stop keeping the session alive, so it
    /// expires after its TTL.
    fn abandon(&self, id: SessionId);
}

/// A live session of one store. See the module docs for its life cycle.
#[derive(Debug)]
pub struct Session {
    id: SessionId,
    ttl: Duration,
    store_id: u64,
    state: watch::Receiver<SessionState>,
    control: Option<Arc<dyn SessionControl>>,
}

impl Session {
    pub(crate) fn new(
        id: SessionId,
        ttl: Duration,
        store_id: u64,
        state: watch::Receiver<SessionState>,
        control: Arc<dyn SessionControl>,
    ) -> Self {
        Self {
            id,
            ttl,
            store_id,
            state,
            control: Some(control),
        }
    }

    /// The session's id.
    pub fn id(&self) -> SessionId {
        self.id
    }

    /// The time-to-live the store granted (etcd may round the request up).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }

    /// The state now.
    pub fn state(&self) -> SessionState {
        *self.state.borrow()
    }

    /// True while the session is `Alive`.
    pub fn is_alive(&self) -> bool {
        self.state() == SessionState::Alive
    }

    /// Resolves when the session is no longer alive, with the state it ended in.
    /// Cancel-safe; use it in `select!` next to the work the session guards.
    pub async fn ended(&self) -> SessionState {
        let mut state = self.state.clone();
        loop {
            let now = *state.borrow_and_update();
            if now != SessionState::Alive {
                return now;
            }
            if state.changed().await.is_err() {
                // The store side is gone: nothing keeps the session alive.
                return SessionState::Expired;
            }
        }
    }

    /// Ends the session and deletes its ephemeral keys before returning. Closing
    /// a session that already ended is `Ok`.
    pub async fn close(mut self) -> Result<(), MetaError> {
        match self.control.take() {
            Some(control) if self.is_alive() => control.close(self.id).await,
            _ => Ok(()),
        }
    }

    /// Like [`Session::close`], through a shared reference (for a session
    /// shared by several users of one process).
    pub async fn close_shared(&self) -> Result<(), MetaError> {
        match &self.control {
            Some(control) if self.is_alive() => control.close(self.id).await,
            _ => Ok(()),
        }
    }

    /// The session's state as a watch: it changes once, when the session ends.
    pub fn state_watch(&self) -> watch::Receiver<SessionState> {
        self.state.clone()
    }

    /// `Ok` if this session belongs to `store_id` and is alive.
    pub(crate) fn check_usable(&self, store_id: u64) -> Result<(), MetaError> {
        if self.store_id != store_id {
            return Err(MetaError::ForeignSession { session: self.id });
        }
        if !self.is_alive() {
            return Err(MetaError::SessionExpired { session: self.id });
        }
        Ok(())
    }
}

impl Drop for Session {
    fn drop(&mut self) {
        if let Some(control) = self.control.take()
            && self.is_alive()
        {
            control.abandon(self.id);
        }
    }
}
