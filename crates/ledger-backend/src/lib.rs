//! vela-ledger-backend: where the storage stack is wired together. The two
//! adapters that need crates which otherwise never meet live here, so that
//! neither the log (`vela-log`), the ledger client (`vela-ledger`) nor the
//! broker above them depends on the storage node:
//! - `ReplicatedLedgers` (`replicated`): the log's `LedgerBackend` over the
//!   ledger client (ledgers replicated on bookies), used by `vela standalone`
//!   and `vela broker`;
//! - `LocalBookies` (`local`): the ledger client's `BookieTransport` over
//!   bookies in this process (`vela standalone`), calling `Bookie::add`, the
//!   same entry point the bookie's TCP server uses.
//!
//! The integration tests of the whole stack live here too: the log over the
//! ledger client, the ledger client over in-process and TCP bookies, and the
//! back-pressure of a full bookie write cache seen from both transports.
//!
//! Never: holds topic, ledger or bookie state of its own beyond a cache of
//! ledger readers; adds a queue or retry of its own on the write path (the
//! log's append queue and the ledger writer's retries are the only ones).

mod local;
mod replicated;

pub use local::{LOCAL_READS_IN_FLIGHT_MAX, LocalBookies};
pub use replicated::ReplicatedLedgers;
