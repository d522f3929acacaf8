//! Keeping a bookie registered in the metadata store while the process lives.
//!
//! Owns: the registration's session (an ephemeral key bound to it, see
//! `vela_meta::registry`), the bookie's read-only mark (a second ephemeral key
//! of the same session, kept in step with `set_read_only`), waiting out a
//! previous process's registration of the same id, and registering again with
//! a new session when the store expires ours (an etcd lease lost during a
//! network partition).
//! Never: registers two ids for one bookie, or retries without a pause.

use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use tokio::sync::{oneshot, watch};
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
    read_only: watch::Sender<bool>,
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
        let (read_only, read_only_changes) = watch::channel(false);
        let task = tokio::spawn(keep_registered(
            store,
            id,
            info,
            session,
            stopped,
            read_only_changes,
        ));
        Ok(Registration {
            stop,
            read_only,
            task,
        })
    }

    /// Marks the bookie read-only in the registry (placement of new ensembles
    /// skips it) or clears the mark. Applied in the background, and again after
    /// a re-registration.
    pub(crate) fn set_read_only(&self, read_only: bool) {
        self.read_only.send_if_modified(|current| {
            let changed = *current != read_only;
            *current = read_only;
            changed
        });
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
    mut read_only: watch::Receiver<bool>,
) {
    // The mark as the store has it (a new session starts without one).
    let mut marked = false;
    loop {
        let wanted = *read_only.borrow_and_update();
        if wanted != marked {
            match registry::set_read_only(store.as_ref(), &session, &id, wanted).await {
                Ok(()) => {
                    tracing::info!(bookie = %id, read_only = wanted, "bookie read-only mark updated");
                    marked = wanted;
                }
                Err(error) => {
                    tracing::warn!(bookie = %id, %error, "cannot update the read-only mark; retrying");
                    tokio::select! {
                        _ = &mut stop => return close(session, &id).await,
                        () = tokio::time::sleep(RETRY_DELAY) => continue,
                    }
                }
            }
        }
        tokio::select! {
            _ = &mut stop => return close(session, &id).await,
            changed = read_only.changed() => {
                if changed.is_err() {
                    // The registration handle is gone: as a stop.
                    return close(session, &id).await;
                }
                continue;
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
        marked = false;
        tracing::info!(bookie = %id, "bookie registered again");
    }
}

async fn close(session: vela_meta::Session, id: &BookieId) {
    if let Err(error) = session.close().await {
        tracing::warn!(bookie = %id, %error, "could not remove the registration");
    }
}
