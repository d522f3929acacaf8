//! vela-bookie: the storage node. Owns a write-ahead journal (`journal`), ledger
//! storage (`storage`: write cache, entry logs, index, read cache), the bookie
//! wire protocol (`protocol`, `entry`), the server (`server`, over `Bookie`) and
//! the client side of the protocol (`client`, used by `vela-ledger`), and the
//! disk space checks that turn a bookie read-only (`disk`).
//!
//! Never: knows of topics, Pulsar or the metadata store's contents; answers an ADD
//! before the journal's fdatasync covers it (unless sync is explicitly off).

pub mod bookie;
pub mod client;
mod direct_io;
pub mod disk;
pub mod entry;
pub mod journal;
pub mod mark;
pub mod protocol;
pub mod server;
pub mod storage;

pub use mark::JournalMark;
