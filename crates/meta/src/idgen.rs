//! Unique ids from a CAS-allocated counter (ledger ids).
//!
//! Owns: the counter record at a key (default [`LEDGER_ID_KEY`]): the decimal
//! ASCII of the next id no allocator has reserved (human-readable in
//! `etcdctl get`). An [`IdAllocator`] reserves a range of `range_len` ids with
//! one CAS (`ExpectedVersion::Is` / `Absent`) and hands them out locally, so one
//! store write serves `range_len` ids. Ids are unique across every allocator of
//! every process on the same key; they increase within one allocator, but not
//! across allocators, and the unused rest of a range is lost when its process
//! stops (gaps are normal). With a range of one id (the ledger allocator),
//! ids increase across every allocator too: an id is only ever taken from a
//! reservation made after its caller started, so it is greater than every id
//! any allocator handed out before. Concurrent callers of such an allocator
//! share one CAS: it reserves one id for each caller waiting at that moment
//! (at most `SHARED_RESERVATION_IDS_MAX`), and ids it reserved for callers that
//! turned out to be served already are lost (a gap). The first id is 1: 0 is
//! never handed out, so callers may use it as "none".

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use tokio::sync::Mutex;

use crate::error::MetaError;
use crate::key::validate_key;
use crate::store::{ExpectedVersion, MetadataStore};

/// Where ledger ids are allocated.
pub const LEDGER_ID_KEY: &str = "/ledgers/idgen";

/// Ids reserved per CAS by default: with ~1-10 ms per durable CAS, one range
/// covers a burst of 1000 creations.
pub const ID_RANGE_LEN_DEFAULT: u64 = 1000;

/// Ledger ids are reserved one at a time: a topic's log orders its entries by
/// (ledger id, entry id), so the ledger a new owner creates after taking a
/// topic over must have a greater id than every ledger of the log, whichever
/// broker created those. Ids taken one per CAS increase across every process
/// (each reads the counter when it allocates); ranges would not. A ledger is
/// created at topic load and rollover, so one CAS each costs nothing that
/// matters.
pub const LEDGER_ID_RANGE_LEN: u64 = 1;

/// Ids one shared reservation (range of one id, concurrent callers) takes at
/// most: one per caller waiting, so one CAS serves a burst of topic loads.
const SHARED_RESERVATION_IDS_MAX: u64 = 1024;

/// CAS attempts before `reserve` gives up with `Contention`. Each failure means
/// another allocator succeeded, so 64 in a row is pathological.
const ID_CAS_ATTEMPTS_MAX: u32 = 64;

/// The first id of a fresh counter.
const ID_FIRST: u64 = 1;

/// Longest counter record: `u64::MAX` has 20 decimal digits.
const COUNTER_BYTES_MAX: usize = 20;

/// Hands out unique ids reserved in ranges from a counter key.
#[derive(Debug)]
pub struct IdAllocator {
    store: Arc<dyn MetadataStore>,
    key: String,
    range_len: u64,
    /// Ids reserved and not yet handed out. The async mutex makes concurrent
    /// callers share one refill instead of each reserving a range.
    reserved: Mutex<Reserved>,
    /// Callers so far (with a range of one id): caller number `n` may take an
    /// id from the reservation only if `n <= Reserved::callers_covered`.
    callers: AtomicU64,
}

#[derive(Debug, Default)]
struct Reserved {
    ids: Range<u64>,
    /// With a range of one id: the callers that had started when `ids` was
    /// reserved (`callers` read before the CAS).
    callers_covered: u64,
}

impl IdAllocator {
    /// An allocator on counter `key`, reserving `range_len` (>= 1) ids at a time.
    pub fn new(
        store: Arc<dyn MetadataStore>,
        key: &str,
        range_len: u64,
    ) -> Result<Self, MetaError> {
        validate_key(key)?;
        if range_len == 0 {
            return Err(MetaError::InvalidArgument {
                reason: "an id range must hold at least one id",
            });
        }
        Ok(Self {
            store,
            key: key.to_owned(),
            range_len,
            reserved: Mutex::new(Reserved::default()),
            callers: AtomicU64::new(0),
        })
    }

    /// The ledger id allocator: [`LEDGER_ID_KEY`], [`LEDGER_ID_RANGE_LEN`]
    /// (ids increase across processes).
    pub fn for_ledgers(store: Arc<dyn MetadataStore>) -> Self {
        Self {
            store,
            key: LEDGER_ID_KEY.to_owned(),
            range_len: LEDGER_ID_RANGE_LEN,
            reserved: Mutex::new(Reserved::default()),
            callers: AtomicU64::new(0),
        }
    }

    /// The next unique id.
    pub async fn next_id(&self) -> Result<u64, MetaError> {
        if self.range_len == 1 {
            return self.next_id_shared().await;
        }
        let mut reserved = self.reserved.lock().await;
        if reserved.ids.is_empty() {
            reserved.ids = self.reserve(self.range_len).await?;
        }
        let id = reserved.ids.start;
        reserved.ids.start += 1;
        debug_assert!(id >= ID_FIRST);
        Ok(id)
    }

    /// An id from a reservation made after this call started (see the module
    /// doc), reserving one for every caller waiting.
    async fn next_id_shared(&self) -> Result<u64, MetaError> {
        let me = self.callers.fetch_add(1, Ordering::SeqCst) + 1;
        let mut reserved = self.reserved.lock().await;
        if reserved.ids.is_empty() || me > reserved.callers_covered {
            let started = self.callers.load(Ordering::SeqCst);
            debug_assert!(started >= me);
            let ids = (started - me + 1).min(SHARED_RESERVATION_IDS_MAX);
            reserved.ids = self.reserve(ids).await?;
            reserved.callers_covered = started;
        }
        let id = reserved.ids.start;
        reserved.ids.start += 1;
        debug_assert!(id >= ID_FIRST);
        Ok(id)
    }

    /// Reserves the next `len` ids with a CAS on the counter.
    async fn reserve(&self, len: u64) -> Result<Range<u64>, MetaError> {
        for _ in 0..ID_CAS_ATTEMPTS_MAX {
            let (start, expected) = match self.store.get(&self.key).await? {
                None => (ID_FIRST, ExpectedVersion::Absent),
                Some((value, version)) => (
                    decode_counter(&self.key, &value)?,
                    ExpectedVersion::Is(version),
                ),
            };
            let end = start
                .checked_add(len)
                .ok_or_else(|| MetaError::IdsExhausted {
                    key: self.key.clone(),
                })?;
            let value = Bytes::from(end.to_string());
            match self.store.put(&self.key, value, expected).await {
                Ok(_) => return Ok(start..end),
                Err(
                    MetaError::BadVersion { .. }
                    | MetaError::Exists { .. }
                    | MetaError::NotFound { .. },
                ) => {
                    continue;
                }
                Err(other) => return Err(other),
            }
        }
        Err(MetaError::Contention {
            key: self.key.clone(),
            attempts: ID_CAS_ATTEMPTS_MAX,
        })
    }
}

fn decode_counter(key: &str, value: &[u8]) -> Result<u64, MetaError> {
    let corrupt = || MetaError::Corruption {
        key: key.to_owned(),
        reason: format!("id counter is not a decimal u64 >= {ID_FIRST}"),
    };
    if value.is_empty() || value.len() > COUNTER_BYTES_MAX || !value.iter().all(u8::is_ascii_digit)
    {
        return Err(corrupt());
    }
    let text = std::str::from_utf8(value).map_err(|_| corrupt())?;
    match text.parse::<u64>() {
        Ok(next) if next >= ID_FIRST => Ok(next),
        _ => Err(corrupt()),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// Concurrent callers of the ledger allocator share reservations, and a
    /// call that starts after others returned, on any allocator, gets a
    /// greater id than all of them (no leftover of an earlier reservation).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn shared_reservations_keep_ids_unique_and_increasing() {
        let store: Arc<dyn MetadataStore> = Arc::new(crate::MemoryStore::new());
        let first = Arc::new(IdAllocator::for_ledgers(Arc::clone(&store)));
        let second = IdAllocator::for_ledgers(Arc::clone(&store));
        for _round in 0..3 {
            let callers: Vec<_> = (0..200)
                .map(|_| {
                    let first = Arc::clone(&first);
                    tokio::spawn(async move { first.next_id().await.unwrap() })
                })
                .collect();
            let mut ids = Vec::new();
            for caller in callers {
                ids.push(caller.await.unwrap());
            }
            ids.sort_unstable();
            ids.dedup();
            assert_eq!(ids.len(), 200, "unique");
            let newest = ids[ids.len() - 1];
            let from_second = second.next_id().await.unwrap();
            assert!(from_second > newest);
            let from_first = first.next_id().await.unwrap();
            assert!(from_first > from_second, "no id reserved before the call");
        }
    }

    #[test]
    fn counter_decoding() {
        assert_eq!(decode_counter("/k", b"1001").unwrap(), 1001);
        assert_eq!(
            decode_counter("/k", b"18446744073709551615").unwrap(),
            u64::MAX
        );
        for bad in [
            &b""[..],
            b"0",
            b"-1",
            b"12a",
            b" 1",
            b"18446744073709551616",
            b"000000000000000000001",
        ] {
            assert!(
                matches!(decode_counter("/k", bad), Err(MetaError::Corruption { .. })),
                "{bad:?}"
            );
        }
    }
}
