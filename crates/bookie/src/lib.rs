//! vela-bookie: the storage node. Owns a write-ahead journal (`journal`), ledger
//! storage (`storage`: write cache, entry logs, index, read cache), the node
//! that ties them together behind the protocol's operations (`bookie`), the
//! server of the bookie protocol (`server`, over `Bookie`), and the disk space
//! checks that turn a bookie read-only (`disk`). The protocol itself (frames,
//! the packaged entry, the client) is `vela-bookie-protocol`'s.
//!
//! Never: knows of topics, Pulsar or the metadata store's contents; answers an ADD
//! before the journal's fdatasync covers it (unless sync is explicitly off).

pub mod bookie;
mod direct_io;
pub mod disk;
pub mod journal;
pub mod mark;
pub mod server;
pub mod storage;

pub use mark::JournalMark;

/// A map keyed by ids (ledger ids) on the add path: foldhash, a fast hasher
/// with a per-process random seed, where SipHash cost ~3 % of the CPU at
/// 10,000 ledgers written at once.
pub(crate) type IdMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;
/// A set of ids (see `IdMap`).
pub(crate) type IdSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
