//! vela-ledger: the ledger client.
//!
//! A ledger is an append-only sequence of entries striped over an ensemble of
//! bookies. This crate owns everything a ledger's writer and readers do:
//! - `metadata`: the stored ledger metadata (quorum, segments, state, end) and
//!   its format; every update is a CAS on the metadata store's version;
//! - `placement`: which bookies hold an ensemble (random, rack-aware);
//! - `writer`: `LedgerWriter`: pipelined striped quorum writes, ordered acks,
//!   the LAC, ensemble changes, close;
//! - `reader`: `LedgerReader`: reads with fail-over, LAC reads;
//! - `recovery`: fencing and closing a ledger another writer may still hold;
//! - `client`: `LedgerClient`: create (ids from `vela_meta::IdAllocator`,
//!   bookies from `vela_meta::registry`), open, recover, delete, stats;
//! - `transport`: the `BookieTransport` seam, with `sim::SimCluster` (in-memory
//!   bookies with fault injection, for tests here and in crates above) and
//!   `BookieClientTransport` (real bookies over
//!   `vela_bookie_protocol::client`); bookies in the same process (`vela
//!   standalone`) are reached through `vela-ledger-backend`'s `LocalBookies`;
//! - `entry`: packaging, over `vela_bookie_protocol::entry` (which owns the
//!   format);
//! - `autorecovery`: `AutoRecovery` copies the entries of lost bookies to
//!   replacements until every entry again has Qw copies.
//!
//! Bounds: pending adds per writer (`PENDING_ADDS_MAX`, `PENDING_BYTES_MAX`;
//! `submit` waits), segments per ledger (`metadata::ENSEMBLES_MAX`), CAS and
//! recovery retries (`LedgerConfig`), range reads (`READ_RANGE_ENTRIES_MAX`).
//!
//! Guarantees: an add is acknowledged only when Qa bookies of its write set made
//! it durable and every earlier add was acknowledged; once `open_with_recovery`
//! returns, the ledger is closed at a point that includes every acknowledged
//! entry, and the writer it fenced gets nothing more acknowledged.
//! Never: knows of topics or Pulsar, stores payloads in the metadata store,
//! implements consensus (the metadata store's CAS decides races), decides
//! "missing" from an error or timeout, or holds a lock across an `.await`.

mod autorecovery;
mod bookie_client;
mod client;
mod client_core;
mod entry;
mod error;
mod placement;
mod reader;
mod recovery;
mod stats;
mod store;
mod writer;

pub mod metadata;
pub mod sim;
pub mod transport;
pub mod types;

pub use autorecovery::{
    AUTORECOVERY_LEADER_KEY, AutoRecovery, AutoRecoveryConfig, COPIES_IN_FLIGHT_MAX, PassReport,
};
pub use bookie_client::BookieClientTransport;
pub use client::LedgerClient;
pub use client_core::{LedgerConfig, PENDING_ADDS_MAX, PENDING_BYTES_MAX};
pub use entry::{ENTRY_PAYLOAD_BYTES_MAX, EntryError};
pub use error::LedgerError;
pub use metadata::{LedgerMetadata, LedgerState};
pub use reader::{LedgerReader, READ_RANGE_ENTRIES_MAX, READ_RANGE_PARALLELISM};
pub use stats::LedgerStats;
pub use transport::{AddMode, BookieError, BookieFuture, BookieTransport, ReadMode};
pub use types::{BookieId, EntryId, LedgerId, Quorum, QuorumError};
pub use writer::{AddCallback, AddPermit, LedgerWriter, PendingAdd};
