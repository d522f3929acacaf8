//! The rules of the ledger list a log keeps: a new ledger's id is above
//! every ledger's of the log, and ledgers carry wall-clock stamps
//! (creation, close) that retention compares.
//!
//! Used by the log's open and by its rollover; never holds a lock.

use std::time::{SystemTime, UNIX_EPOCH};

use super::config::LogEnv;
use crate::error::LogError;
use crate::format::LedgerInfo;

/// Entries are ordered by (ledger id, entry id): a new ledger must have a
/// greater id than every ledger of the log. The ledger client's ids increase
/// across processes; a store that broke that (a reset counter) must not
/// scramble the log: the new ledger is deleted and the log refuses.
pub(super) async fn check_ledger_order(
    env: &LogEnv,
    name: &str,
    ledgers: &[LedgerInfo],
    new_ledger_id: u64,
) -> Result<(), LogError> {
    let newest = ledgers.iter().map(|l| l.ledger_id).max();
    match newest {
        Some(newest) if new_ledger_id <= newest => {
            let _ = env.parts.ledgers.delete(new_ledger_id).await;
            tracing::error!(
                log = name,
                new_ledger_id,
                newest,
                "ledger ids went backwards"
            );
            Err(LogError::Metadata(format!(
                "log {name}: new ledger {new_ledger_id} is not above its newest ledger {newest} \
                 (the ledger id counter went backwards)"
            )))
        }
        _ => Ok(()),
    }
}

pub(super) fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}
