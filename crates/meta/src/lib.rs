//! vela-meta: the metadata store.
//!
//! Owns: the [`MetadataStore`] trait (get / put-if-version / delete / children /
//! watch / sessions with ephemeral keys) and its three backends:
//! [`MemoryStore`] (tests, in-process clusters), [`FileStore`] (redb, one
//! machine, fsync'ed) and [`EtcdStore`] (a cluster; consensus is etcd's job).
//! [`open_store`] picks one from a URL. On top of the trait: bookie
//! registration and discovery ([`registry`]) and a CAS-allocated id counter
//! ([`IdAllocator`]).
//!
//! Never does: hold message payloads (values are small metadata records,
//! at most [`VALUE_BYTES_MAX`]), implement consensus, or know what the keys
//! mean beyond the helpers in [`registry`] and [`idgen`].
//!
//! Key model (see [`key`]): slash-separated absolute paths such as
//! `/ledgers/0000000042`; keys are flat (a parent need not exist);
//! `children("/a")` lists the stored keys exactly one level below `/a`;
//! `watch("/a")` reports `/a` and everything below it. Versions are store-wide
//! revisions: they only grow, per key and across deletes.
//!
//! Bounds: [`KEY_BYTES_MAX`], [`VALUE_BYTES_MAX`], [`CHILDREN_COUNT_MAX`],
//! [`WATCH_QUEUE_EVENTS_MAX`] (a lagging watcher gets [`WatchEvent::Lagged`] and
//! must re-read), plus per-store limits on sessions and watchers.

mod error;
mod etcd;
mod file;
pub mod idgen;
pub mod key;
mod local;
mod memory;
pub mod registry;
mod session;
mod store;
mod url;
mod watch;

pub use error::MetaError;
pub use etcd::{ETCD_OP_TIMEOUT, EtcdStore};
pub use file::{FILE_STORE_DB_NAME, FileStore};
pub use idgen::IdAllocator;
pub use key::{CHILDREN_COUNT_MAX, KEY_BYTES_MAX, VALUE_BYTES_MAX};
pub use memory::MemoryStore;
pub use session::{Session, SessionId, SessionState};
pub use store::{BackendKind, BoxFuture, ExpectedVersion, MetadataStore, Version, WatchEvent};
pub use url::{StoreUrl, open_store};
pub use watch::{WATCH_QUEUE_EVENTS_MAX, Watcher};
