//! Keeping a bookie registered in the metadata store while the process lives.
//!
//! Owns: the registration's session (an ephemeral key bound to it, see
//! `vela_meta::registry`), waiting out a previous process's registration of
//! the same id, and registering again with a new session when the store
//! expires ours (an etcd lease lost during a network partition).
//! Never: registers two ids for one bookie, or retries without a pause.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use vela_meta::registry::{self, BookieId, BookieInfo};
use vela_meta::{MetaError, MetadataStore, SessionState};

/// Session TTL of a registration: a crashed bookie leaves the available list
/// after this long (BookKeeper's ZooKeeper session timeout is 10-30 s).
pub(crate) const REGISTRATION_TTL: Duration = Duration::from_secs(10);

/// Pause between attempts while a previous registration lingers or the store
/// is unreachable.
const RETRY_DELAY: Duration = Duration::from_millis(500);

/// A live registration; `close` removes it.
#[derive(Debug)]
pub(crate) struct Registration {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
}

impl Registration {
    /// Registers `id` at `info`, waiting up to `wait_max` for an earlier
    /// registration of the same id (a previous process whose session has not
    /// expired yet) to go away.
    pub(crate) async fn start(
        store: Arc<dyn MetadataStore>,
        id: BookieId,
        info: BookieInfo,
        wait_max: Duration,
    ) -> anyhow::Result<Registration> {
        let deadline = Instant::now() + wait_max;
        let session = loop {
            match register_once(&store, &id, &info).await {
                Ok(session) => break session,
                Err(error) if Instant::now() < deadline => {
                    tracing::warn!(bookie = %id, %error, "cannot register yet; retrying");
                    tokio::time::sleep(RETRY_DELAY).await;
                }
                Err(error) => {
                    return Err(error).with_context(|| {
                        format!(
                            "cannot register bookie {id} in the metadata store within {wait_max:?}"
                        )
                    });
                }
            }
        };
        tracing::info!(bookie = %id, address = %info.address, "bookie registered");
        let (stop, stopped) = oneshot::channel();
        let task = tokio::spawn(keep_registered(store, id, info, session, stopped));
        Ok(Registration { stop, task })
    }

    /// Removes the registration (closes its session) and waits for it.
    pub(crate) async fn close(self) {
        let _ = self.stop.send(());
        let _ = self.task.await;
    }
}

async fn register_once(
    store: &Arc<dyn MetadataStore>,
    id: &BookieId,
    info: &BookieInfo,
) -> Result<vela_meta::Session, MetaError> {
    let session = store.session(REGISTRATION_TTL).await?;
    match registry::register_bookie(store.as_ref(), &session, id, info).await {
        Ok(_) => Ok(session),
        Err(error) => {
            let _ = session.close().await;
            Err(error)
        }
    }
}

async fn keep_registered(
    store: Arc<dyn MetadataStore>,
    id: BookieId,
    info: BookieInfo,
    mut session: vela_meta::Session,
    mut stop: oneshot::Receiver<()>,
) {
    loop {
        tokio::select! {
            _ = &mut stop => {
                if let Err(error) = session.close().await {
                    tracing::warn!(bookie = %id, %error, "could not remove the registration");
                }
                return;
            }
            ended = session.ended() => {
                if ended == SessionState::Closed {
                    return;
                }
                tracing::error!(bookie = %id, ?ended, "registration session ended; registering again");
            }
        }
        session = loop {
            tokio::select! {
                _ = &mut stop => return,
                registered = register_once(&store, &id, &info) => match registered {
                    Ok(session) => break session,
                    Err(error) => {
                        tracing::warn!(bookie = %id, %error, "cannot register again yet");
                        tokio::time::sleep(RETRY_DELAY).await;
                    }
                },
            }
        };
        tracing::info!(bookie = %id, "bookie registered again");
    }
}
