//! `AppendBudget`: one byte budget over the appends in flight of every log of
//! a broker (Pulsar's `maxMessagePublishBufferSizeInMB`).
//!
//! Owns: the budget (a FIFO semaphore of bytes). An append holds its payload's
//! bytes from the moment it is queued until it completes (durable or failed):
//! that covers the log's append queue, the ledger writer's window of adds in
//! flight and what the bookies have not answered yet.
//! When full: `ManagedLog::append` refuses at once (`Overloaded`);
//! `ManagedLog::reserve_append` waits (the broker waits there before it reads
//! the next frame of the connection, so producers slow down through TCP).
//! Never: lets an entry larger than the whole budget wait forever (it takes
//! the whole budget instead).

use std::sync::Arc;

use tokio::sync::{OwnedSemaphorePermit, Semaphore, TryAcquireError};

/// The bytes one append holds until it completes.
#[derive(Debug)]
pub struct AppendPermit {
    _permit: Option<OwnedSemaphorePermit>,
    payload_bytes: usize,
}

impl AppendPermit {
    /// Payload bytes of the append this permit was taken for.
    pub fn payload_bytes(&self) -> usize {
        self.payload_bytes
    }
}

/// Bytes of appends in flight over every log sharing it. Cheap to clone.
#[derive(Debug, Clone)]
pub struct AppendBudget {
    semaphore: Arc<Semaphore>,
    /// Permits of the semaphore (bytes, capped at what one acquire may take).
    bytes_max: u32,
}

impl AppendBudget {
    /// A budget of `bytes_max` bytes (capped at 4 GiB - 1: one semaphore
    /// acquire takes a `u32`).
    pub fn new(bytes_max: u64) -> AppendBudget {
        let bytes_max = u32::try_from(bytes_max).unwrap_or(u32::MAX);
        AppendBudget {
            semaphore: Arc::new(Semaphore::new(bytes_max as usize)),
            bytes_max,
        }
    }

    /// The budget in bytes.
    pub fn bytes_max(&self) -> u64 {
        u64::from(self.bytes_max)
    }

    /// Bytes free now.
    pub fn available_bytes(&self) -> u64 {
        self.semaphore.available_permits() as u64
    }

    /// What an entry of `payload_bytes` is charged: its size, but never more
    /// than the whole budget.
    fn charge(&self, payload_bytes: usize) -> u32 {
        u32::try_from(payload_bytes)
            .unwrap_or(u32::MAX)
            .min(self.bytes_max)
    }

    /// Takes room for an append of `payload_bytes` if there is some now.
    pub fn try_take(&self, payload_bytes: usize) -> Option<AppendPermit> {
        let charge = self.charge(payload_bytes);
        if charge == 0 {
            return Some(AppendPermit {
                _permit: None,
                payload_bytes,
            });
        }
        match Arc::clone(&self.semaphore).try_acquire_many_owned(charge) {
            Ok(permit) => Some(AppendPermit {
                _permit: Some(permit),
                payload_bytes,
            }),
            Err(TryAcquireError::NoPermits | TryAcquireError::Closed) => None,
        }
    }

    /// Waits for room for an append of `payload_bytes` (first come, first
    /// served).
    pub async fn take(&self, payload_bytes: usize) -> AppendPermit {
        let charge = self.charge(payload_bytes);
        if charge == 0 {
            return AppendPermit {
                _permit: None,
                payload_bytes,
            };
        }
        // The semaphore is never closed.
        let permit = Arc::clone(&self.semaphore)
            .acquire_many_owned(charge)
            .await
            .ok();
        debug_assert!(permit.is_some(), "the append budget is never closed");
        AppendPermit {
            _permit: permit,
            payload_bytes,
        }
    }
}
