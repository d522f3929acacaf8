//! The seam between the ledger client and bookies.
//!
//! Owns: `BookieTransport` (the requests the ledger protocol needs). What a
//! request means, and what it can end in (`BookieError`, `AddMode`,
//! `ReadMode`), is the bookie protocol's (`vela_bookie_protocol`): every
//! transport answers in its terms, so the ledger protocol cannot tell them
//! apart.
//! Never: decides anything about quorums, retries or ensembles: one request, one
//! answer. Implementations: `sim::SimCluster` (in-memory, with faults),
//! `bookie_client::BookieClientTransport` (the real protocol over TCP or TLS),
//! and the in-process transport of `vela standalone` (`vela-ledger-backend`).

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;

pub use vela_bookie_protocol::{AddMode, BookieError, ReadMode};

use crate::types::{BookieId, EntryId, LedgerId};

/// A request in flight to one bookie.
pub type BookieFuture<T> = Pin<Box<dyn Future<Output = Result<T, BookieError>> + Send + 'static>>;

/// The requests the ledger protocol sends to bookies. Every future is `'static`
/// (implementations clone what they need) so callers can run many in parallel.
pub trait BookieTransport: Send + Sync + std::fmt::Debug + 'static {
    /// Stores `packaged` (a packaged entry, see `crate::entry`) on `bookie`;
    /// resolves once the bookie has made it durable.
    fn add(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        packaged: Bytes,
        mode: AddMode,
    ) -> BookieFuture<()>;

    /// Reads the packaged entry `entry_id`; with `ReadMode::Fence` fences first.
    /// The bytes are unverified: every caller checks the packaged entry's
    /// CRC32C and ids (`entry::unpackage`) before using or passing on any of
    /// them, and a transport may rely on that (`LocalBookies` skips the
    /// bookie's own record CRC for normal reads).
    fn read(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        mode: ReadMode,
    ) -> BookieFuture<Bytes>;

    /// The bookie's last-add-confirmed for the ledger (the highest LAC carried by
    /// an entry it stores; `None` if none). With `ReadMode::Fence` fences first,
    /// and a bookie without the ledger answers `None` (it now holds a fenced,
    /// empty ledger).
    fn read_lac(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        mode: ReadMode,
    ) -> BookieFuture<Option<EntryId>>;

    /// Drops everything the bookie holds of the ledger.
    fn delete_ledger(&self, bookie: &BookieId, ledger_id: LedgerId) -> BookieFuture<()>;
}
