//! The broker's metadata session and registration: opening it (`start`),
//! and when it ends (expired: the broker was cut off), dropping every
//! bundle at once and registering again with a new session, until `close`.
//! Also keeps the cache of bundle layouts fresh (a split on any broker
//! empties it).
//!
//! Owns: the two background tasks of an `Ownership`. Never: takes bundles
//! (lookups and topic opens do).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use vela_meta::{ExpectedVersion, MetadataStore};

use super::Ownership;
use super::records::{BUNDLES_PATH, BrokerInfo, OwnershipError, broker_key, encode};

impl Ownership {
    /// Opens a session of `ttl` and registers this broker.
    pub async fn start(
        meta: Arc<dyn MetadataStore>,
        me: BrokerInfo,
        ttl: Duration,
    ) -> Result<Arc<Ownership>, OwnershipError> {
        // Every change of a bundle layout (a split on any broker) empties our
        // cache of layouts: the next lookup reads the new one.
        let layout_changes = meta.watch(BUNDLES_PATH).await?;
        let session = meta.session(ttl).await?;
        meta.put_ephemeral(
            &session,
            &broker_key(&me.id),
            encode(&me),
            ExpectedVersion::Any,
        )
        .await?;
        let (lost, _) = watch::channel(false);
        let ownership = Arc::new(Ownership {
            meta,
            me: Mutex::new(me),
            ttl,
            session: parking_lot::RwLock::new(Arc::new(session)),
            closing: std::sync::atomic::AtomicBool::new(false),
            owned: Mutex::new(BTreeMap::new()),
            layouts: Mutex::new(BTreeMap::new()),
            lost,
        });
        tokio::spawn(watch_session(Arc::downgrade(&ownership)));
        tokio::spawn(watch_layouts(Arc::downgrade(&ownership), layout_changes));
        tracing::info!(broker = %ownership.me.lock().id, "broker registered");
        Ok(ownership)
    }
}

/// Forgets cached bundle layouts whenever one changes in the store.
async fn watch_layouts(ownership: std::sync::Weak<Ownership>, mut changes: vela_meta::Watcher) {
    while changes.recv().await.is_some() {
        let Some(ownership) = ownership.upgrade() else {
            return;
        };
        ownership.layouts.lock().clear();
    }
}

/// When the session ends: drops every bundle (the service unloads the
/// topics on `lost`), then registers again with a new session, retrying
/// with a pause, until `close`.
async fn watch_session(ownership: std::sync::Weak<Ownership>) {
    const RETRY_DELAY: Duration = Duration::from_millis(500);
    loop {
        let mut state = match ownership.upgrade() {
            Some(ownership) => ownership.session.read().state_watch(),
            None => return,
        };
        let ended = loop {
            let now = *state.borrow_and_update();
            if now != vela_meta::SessionState::Alive {
                break now;
            }
            if state.changed().await.is_err() {
                break vela_meta::SessionState::Expired;
            }
        };
        let Some(current) = ownership.upgrade() else {
            return;
        };
        current.owned.lock().clear();
        current.lost.send_replace(true);
        if current.closing.load(std::sync::atomic::Ordering::Acquire) {
            return;
        }
        tracing::error!(
            ?ended,
            "broker session ended: every bundle dropped; registering again"
        );
        drop(current);
        loop {
            tokio::time::sleep(RETRY_DELAY).await;
            let Some(current) = ownership.upgrade() else {
                return;
            };
            if current.closing.load(std::sync::atomic::Ordering::Acquire) {
                return;
            }
            match current.renew_session().await {
                Ok(()) => {
                    tracing::info!("broker registered again with a new session");
                    break;
                }
                Err(error) => tracing::warn!(%error, "cannot register again yet"),
            }
        }
    }
}

impl Ownership {
    /// A new session and registration after the last session ended.
    async fn renew_session(&self) -> Result<(), OwnershipError> {
        let session = self.meta.session(self.ttl).await?;
        let me = self.me();
        if let Err(error) = self
            .meta
            .put_ephemeral(
                &session,
                &broker_key(&me.id),
                encode(&me),
                ExpectedVersion::Any,
            )
            .await
        {
            let _ = session.close().await;
            return Err(error.into());
        }
        *self.session.write() = Arc::new(session);
        self.lost.send_replace(false);
        Ok(())
    }
}
