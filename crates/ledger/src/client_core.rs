//! `ClientCore`: what every writer, reader and recovery of one ledger client
//! shares (the metadata store, the bookie transport, the configuration, the
//! placement RNG, id allocation and stats), with the configuration itself
//! (`LedgerConfig`) and the bounds on a writer's adds in flight.
//!
//! Never: does anything itself; `client`, `writer`, `reader` and `recovery`
//! act on it (this module needs none of them).

use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use rand::rngs::StdRng;
use vela_meta::{IdAllocator, MetadataStore};

use crate::entry::ENTRY_PAYLOAD_BYTES_MAX;
use crate::error::LedgerError;
use crate::placement::BookieCandidate;
use crate::stats::Stats;
use crate::store::BookieListing;
use crate::transport::BookieTransport;

/// Default bound on adds in flight per ledger. At ~200k entries/s and a 2 ms
/// quorum round trip about 400 are in flight; 4096 absorbs a slow bookie for a
/// few ms more. When reached, `submit` waits (back-pressure to the producer).
pub const PENDING_ADDS_MAX: usize = 4096;

/// Default bound on payload bytes in flight per ledger: 64 MiB, a few hundred ms
/// of a 1 Gbit/s link. When reached, `submit` waits.
pub const PENDING_BYTES_MAX: usize = 64 * 1024 * 1024;

const _: () = assert!(ENTRY_PAYLOAD_BYTES_MAX <= PENDING_BYTES_MAX);
const _: () = assert!(PENDING_BYTES_MAX <= u32::MAX as usize);

/// Tunables of a ledger client.
#[derive(Debug, Clone)]
pub struct LedgerConfig {
    /// An add not acknowledged by a bookie within this is treated as that
    /// bookie's failure (ensemble change). BookKeeper's default.
    pub add_timeout: Duration,
    /// A read (or LAC read, or fence) not answered within this counts as an
    /// unknown answer: readers fail over, recovery retries.
    pub read_timeout: Duration,
    /// Adds in flight per writer before `submit` waits.
    pub pending_adds_max: usize,
    /// Payload bytes in flight per writer before `submit` waits (clamped to
    /// `ENTRY_PAYLOAD_BYTES_MAX..=PENDING_BYTES_MAX`).
    pub pending_bytes_max: usize,
    /// Rounds recovery spends on bookies that do not answer (fencing, reads of
    /// an entry of unknown state, re-writes) before `RecoveryIncomplete`.
    pub recovery_attempts_max: u32,
    /// Pause between those rounds.
    pub recovery_retry_delay: Duration,
    /// Seed of the placement RNG (`None`: from the OS). Tests pass one so a run
    /// replays.
    pub placement_seed: Option<u64>,
}

impl Default for LedgerConfig {
    fn default() -> LedgerConfig {
        LedgerConfig {
            add_timeout: Duration::from_secs(5),
            read_timeout: Duration::from_secs(5),
            pending_adds_max: PENDING_ADDS_MAX,
            pending_bytes_max: PENDING_BYTES_MAX,
            recovery_attempts_max: 10,
            recovery_retry_delay: Duration::from_millis(500),
            placement_seed: None,
        }
    }
}

/// What writers, readers and recovery share.
#[derive(Debug)]
pub(crate) struct ClientCore {
    pub(crate) store: Arc<dyn MetadataStore>,
    pub(crate) transport: Arc<dyn BookieTransport>,
    pub(crate) config: LedgerConfig,
    pub(crate) rng: Mutex<StdRng>,
    /// Ledger ids (ranges reserved by CAS on `vela_meta::idgen::LEDGER_ID_KEY`).
    pub(crate) ids: IdAllocator,
    /// The registry's bookies, as placement reads them.
    pub(crate) bookies: BookieListing,
    pub(crate) stats: Stats,
}

impl ClientCore {
    /// The bookies available now (a listing read after this call began).
    pub(crate) async fn available_bookies(&self) -> Result<Arc<Vec<BookieCandidate>>, LedgerError> {
        self.bookies.read(&self.store).await
    }
}
