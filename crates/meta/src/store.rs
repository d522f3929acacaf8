//! The `MetadataStore` trait and the small types of its signatures.
//!
//! Owns: the contract every backend implements and the conformance suite checks.
//! Never does: I/O (backends do).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use bytes::Bytes;

use crate::error::MetaError;
use crate::session::Session;
use crate::watch::Watcher;

/// A boxed, `Send` future: what the object-safe trait methods return, so that the
/// store can be held as `Arc<dyn MetadataStore>`.
pub type BoxFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// The version of a stored key: the store-wide revision of the write that last
/// changed it (etcd's `mod_revision`; a global counter in the local stores).
///
/// Versions only grow, per key and across the store: a key deleted and created
/// again gets a version greater than any it had, so a CAS holding a version read
/// before the delete can never succeed (no ABA). Version 0 is never stored.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Version(pub u64);

impl fmt::Display for Version {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "v{}", self.0)
    }
}

/// The condition a write puts on the key's current state.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub enum ExpectedVersion {
    /// No condition (for `delete`: the key must still exist).
    Any,
    /// The key must not exist (create). Meaningless for `delete`.
    Absent,
    /// The key must exist with exactly this version.
    Is(Version),
}

/// A change seen by a [`Watcher`], delivered in the store's commit order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchEvent {
    /// The key was created or updated and now has this version.
    Put {
        /// The key.
        key: String,
        /// Its new version.
        version: Version,
    },
    /// The key was deleted (explicitly, or with the session that owned it).
    Delete {
        /// The key.
        key: String,
    },
    /// The watcher fell [`crate::WATCH_QUEUE_EVENTS_MAX`] events behind (or an
    /// etcd watch had to be re-created past a compaction): some events were
    /// dropped. Re-read the state you care about; events after this one are
    /// complete again.
    Lagged,
}

/// What a store backend is, for logs and errors.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum BackendKind {
    /// [`crate::MemoryStore`]: process memory, for tests.
    Memory,
    /// [`crate::FileStore`]: a redb file on one machine.
    File,
    /// [`crate::EtcdStore`]: an etcd cluster.
    Etcd,
}

/// A hierarchical, versioned key-value store for metadata (ledgers, topics,
/// ownership, registrations). Never holds message payloads.
///
/// Keys follow the model in [`crate::key`] (`/a/b/c`); values are at most
/// [`crate::VALUE_BYTES_MAX`] bytes. Every method validates its arguments first
/// and answers bad ones with a typed error without touching the backend.
///
/// Writes are linearizable and, once `Ok` is returned, durable to the backend's
/// promise (fsync'ed locally for [`crate::FileStore`], committed by the etcd
/// quorum for [`crate::EtcdStore`]).
pub trait MetadataStore: Send + Sync + fmt::Debug {
    /// Which backend this is.
    fn kind(&self) -> BackendKind;

    /// The value and version of `key`, or `None` if absent.
    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<(Bytes, Version)>, MetaError>>;

    /// Writes `value` at `key` if `expected` holds, returning the new version.
    /// `Absent` on a present key: `Exists`; `Is(v)` on an absent key: `NotFound`;
    /// `Is(v)` on another version: `BadVersion`. A plain put on an ephemeral key
    /// makes it persistent (detaches it from its session).
    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<Version, MetaError>>;

    /// Deletes `key` if `expected` holds: `Any` or `Is(v)`; absent key: `NotFound`;
    /// `Absent`: `InvalidArgument`. Keys below `key` are not touched.
    fn delete<'a>(
        &'a self,
        key: &'a str,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<(), MetaError>>;

    /// Names of the stored keys exactly one level below `path` (`/a/x` is a child
    /// of `/a`; `/a/x/y` is not, even if `/a/x` does not exist), sorted bytewise.
    /// Empty if there are none. At most [`crate::CHILDREN_COUNT_MAX`].
    fn children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<String>, MetaError>>;

    /// Watches `path` and every key below it. Every change committed after this
    /// call returns is delivered, in commit order (a change committed while the
    /// call runs may be delivered too). To follow a state: watch first, then
    /// read, then apply events (re-read on `Lagged`).
    fn watch<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Watcher, MetaError>>;

    /// Opens a session that lives while it is kept alive. Ephemeral keys written
    /// with it are deleted when it is closed or expires. `ttl` is how long the
    /// store keeps the session after its holder stops keeping it alive (its
    /// process died, or the [`Session`] was dropped without `close`); etcd may
    /// round it up to its minimum lease (about 2 s).
    fn session(&self, ttl: Duration) -> BoxFuture<'_, Result<Session, MetaError>>;

    /// Like [`MetadataStore::put`], and binds the key to `session`: the key is
    /// deleted when the session ends. A dead session: `SessionExpired`.
    fn put_ephemeral<'a>(
        &'a self,
        session: &'a Session,
        key: &'a str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<Version, MetaError>>;
}
