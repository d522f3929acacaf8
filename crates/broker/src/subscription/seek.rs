//! Finding positions in a topic's log: where a seek (by message id or
//! publish time) lands, and the first entry published at or after a time
//! (also what message expiry and backlog-age quotas use).
//!
//! Owns: the clamping rules (never before the first entry, never past the
//! end) and the binary search over publish times. Never: moves a cursor;
//! callers reset or acknowledge with what these return.

use vela_log::{ManagedLog, Position};

use super::command::SeekTarget;
use crate::codec;
use crate::error::ServiceError;

/// The next position to deliver after a seek to `target`, clamped to the
/// entries the log holds (never past the end: a reset there would count
/// future entries as acknowledged).
pub(crate) async fn resolve_seek(
    log: &ManagedLog,
    target: SeekTarget,
) -> Result<Position, ServiceError> {
    let next = match target {
        SeekTarget::MessageId {
            ledger_id,
            entry_id,
        } => {
            let earliest = ledger_id == u64::MAX && entry_id == u64::MAX;
            let latest = ledger_id == i64::MAX as u64 && entry_id == i64::MAX as u64;
            if earliest {
                Position::new(0, 0)
            } else if latest {
                match log.last_confirmed() {
                    Some(last) => log.next_position(last),
                    None => Position::new(0, 0),
                }
            } else {
                Position::new(ledger_id, entry_id)
            }
        }
        SeekTarget::PublishTime(time_ms) => first_published_at_or_after(log, time_ms)
            .await
            .map_err(ServiceError::from)?,
    };
    let next = match log.first_position() {
        Some(first) if next < first => first,
        _ => next,
    };
    let end = log
        .last_confirmed()
        .map_or(Position::new(0, 0), |last| log.next_position(last));
    Ok(next.min(end))
}

/// First position whose entry was published at or after `time_ms`, or the
/// position after the last entry when none is. A binary search over the
/// log's entries (Pulsar's message finder does the same): publish times are
/// taken as non-decreasing in log order, which holds per producer; it reads
/// about log2(entries) single entries.
pub(crate) async fn first_published_at_or_after(
    log: &ManagedLog,
    time_ms: u64,
) -> Result<Position, vela_log::LogError> {
    let Some(last) = log.last_confirmed() else {
        return Ok(Position::new(0, 0));
    };
    let end = log.next_position(last);
    let total = log.entries_between(None, last);
    // Invariant: entries before index `low` are older; from `high` on, newer.
    let (mut low, mut high) = (0u64, total);
    while low < high {
        let middle = low + (high - low) / 2;
        let Some(position) = log.position_after(None, middle + 1) else {
            high = middle;
            continue;
        };
        let entries = log.read(position, 1, 1).await?;
        let published = entries
            .first()
            .map_or(u64::MAX, |e| codec::entry_publish_time_ms(&e.data));
        if published >= time_ms {
            high = middle;
        } else {
            low = middle + 1;
        }
    }
    Ok(log.position_after(None, low + 1).unwrap_or(end))
}
