//! An in-memory bookie cluster with fault injection, for tests.
//!
//! Owns: simulated bookies (entries, fenced flag, LAC per ledger, each like a real
//! bookie), and the simulated network between the client and them.
//!
//! Fault model (what the ledger protocol claims to survive, and nothing more):
//! - a bookie may crash (`kill`) and come back (`restart`); a crash loses what it
//!   had not made durable yet (entries and fences whose answer was not sent) and
//!   keeps everything it had answered for;
//! - a request or its answer may be delayed (uniform `delay_min..=delay_max` each
//!   way), dropped (never answered: the caller's timeout must notice), or answered
//!   with an error without effect;
//! - making an add or a fence durable takes `sync_delay` (a slow disk).
//!
//! Never: loses an answered add, reorders a bookie's own state, or answers a
//! normal add on a fenced ledger.
//!
//! Determinism: one seeded RNG drives every random choice, in request order; run
//! it on a current-thread tokio runtime with paused time and a seed replays a run.
//! Requests run as detached tasks, so a request already "on the wire" still
//! reaches the bookie after the caller gives up (or crashes).

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::oneshot;

use crate::entry::carried_lac;
use crate::transport::{AddMode, BookieError, BookieFuture, BookieTransport, ReadMode};
use crate::types::{BookieId, EntryId, LedgerId};

/// Faults and timing of one simulated bookie (and its link). Rates are per mille.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimFaults {
    /// Shortest one-way network delay.
    pub delay_min: Duration,
    /// Longest one-way network delay.
    pub delay_max: Duration,
    /// Time to make an add or a fence durable.
    pub sync_delay: Duration,
    /// Requests answered with `BookieError::IoError` without effect.
    pub error_per_mille: u32,
    /// Requests refused with `BookieError::TooManyRequests` without effect
    /// (a full journal queue or write cache: back-pressure).
    pub overloaded_per_mille: u32,
    /// Requests lost on the way in: no effect, no answer.
    pub drop_request_per_mille: u32,
    /// Answers lost on the way out: the request took effect, no answer.
    pub drop_response_per_mille: u32,
}

impl Default for SimFaults {
    fn default() -> SimFaults {
        SimFaults {
            delay_min: Duration::from_micros(20),
            delay_max: Duration::from_micros(200),
            sync_delay: Duration::from_micros(100),
            error_per_mille: 0,
            overloaded_per_mille: 0,
            drop_request_per_mille: 0,
            drop_response_per_mille: 0,
        }
    }
}

/// A simulated cluster of bookies; also the `BookieTransport` that reaches them.
/// Cheap to clone (shared state).
#[derive(Debug, Clone)]
pub struct SimCluster {
    inner: Arc<Mutex<SimState>>,
}

#[derive(Debug)]
struct SimState {
    rng: StdRng,
    bookies: BTreeMap<BookieId, SimBookie>,
}

#[derive(Debug, Default)]
struct SimBookie {
    alive: bool,
    /// Refuses normal adds with `ReadOnly` (a full disk).
    read_only: bool,
    /// Bumped on every crash: work started before it may not complete after it.
    epoch: u64,
    faults: SimFaults,
    ledgers: BTreeMap<LedgerId, SimLedger>,
}

#[derive(Debug, Default)]
struct SimLedger {
    entries: BTreeMap<EntryId, SimEntry>,
    fence: Fence,
}

#[derive(Debug)]
struct SimEntry {
    packaged: Bytes,
    durable: bool,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
enum Fence {
    #[default]
    None,
    /// Fenced in memory (normal adds refused), not yet durable.
    Pending,
    Durable,
}

/// What the network does to one request, drawn when it is sent.
#[derive(Debug, Clone, Copy)]
struct Plan {
    delay_in: Duration,
    delay_out: Duration,
    sync_delay: Duration,
    error: bool,
    overloaded: bool,
    drop_request: bool,
    drop_response: bool,
}

impl SimCluster {
    /// An empty cluster whose random choices follow `seed`.
    pub fn new(seed: u64) -> SimCluster {
        SimCluster {
            inner: Arc::new(Mutex::new(SimState {
                rng: StdRng::seed_from_u64(seed),
                bookies: BTreeMap::new(),
            })),
        }
    }

    /// Adds a running bookie with default faults (none, small delays).
    pub fn add_bookie(&self, bookie: &BookieId) {
        let mut state = self.inner.lock();
        let entry = state.bookies.entry(bookie.clone()).or_default();
        entry.alive = true;
    }

    /// The ids of all bookies, sorted.
    pub fn bookie_ids(&self) -> Vec<BookieId> {
        self.inner.lock().bookies.keys().cloned().collect()
    }

    /// Crashes a bookie: it refuses connections until `restart`, and loses what
    /// it had not made durable.
    pub fn kill(&self, bookie: &BookieId) {
        let mut state = self.inner.lock();
        let Some(b) = state.bookies.get_mut(bookie) else {
            return;
        };
        b.alive = false;
        b.epoch += 1;
        for ledger in b.ledgers.values_mut() {
            ledger.entries.retain(|_, e| e.durable);
            if ledger.fence == Fence::Pending {
                ledger.fence = Fence::None;
            }
        }
    }

    /// Brings a crashed bookie back with its durable state.
    pub fn restart(&self, bookie: &BookieId) {
        if let Some(b) = self.inner.lock().bookies.get_mut(bookie) {
            b.alive = true;
        }
    }

    /// Whether the bookie is running.
    pub fn is_alive(&self, bookie: &BookieId) -> bool {
        self.inner
            .lock()
            .bookies
            .get(bookie)
            .is_some_and(|b| b.alive)
    }

    /// Replaces a bookie's faults.
    pub fn set_faults(&self, bookie: &BookieId, faults: SimFaults) {
        if let Some(b) = self.inner.lock().bookies.get_mut(bookie) {
            b.faults = faults;
        }
    }

    /// Makes a bookie refuse normal adds with `ReadOnly` (its disk filled up),
    /// or take them again.
    pub fn set_read_only(&self, bookie: &BookieId, read_only: bool) {
        if let Some(b) = self.inner.lock().bookies.get_mut(bookie) {
            b.read_only = read_only;
        }
    }

    /// Flips a bit in the copy of an entry a bookie holds (bit rot, a bad
    /// sector read back): its reads return bytes that fail the entry's CRC.
    /// Returns whether the bookie held the entry.
    pub fn corrupt_entry(&self, bookie: &BookieId, ledger: LedgerId, entry: EntryId) -> bool {
        let mut state = self.inner.lock();
        let Some(stored) = state
            .bookies
            .get_mut(bookie)
            .and_then(|b| b.ledgers.get_mut(&ledger))
            .and_then(|l| l.entries.get_mut(&entry))
        else {
            return false;
        };
        let mut bytes = stored.packaged.to_vec();
        if let Some(last) = bytes.last_mut() {
            *last ^= 0x01;
        }
        stored.packaged = Bytes::from(bytes);
        true
    }

    /// The packaged entry a bookie holds (durable or not), if any.
    pub fn stored_entry(
        &self,
        bookie: &BookieId,
        ledger: LedgerId,
        entry: EntryId,
    ) -> Option<Bytes> {
        let state = self.inner.lock();
        let e = state
            .bookies
            .get(bookie)?
            .ledgers
            .get(&ledger)?
            .entries
            .get(&entry)?;
        Some(e.packaged.clone())
    }

    /// Whether a bookie has the ledger fenced (durably or not).
    pub fn is_fenced(&self, bookie: &BookieId, ledger: LedgerId) -> bool {
        let state = self.inner.lock();
        state
            .bookies
            .get(bookie)
            .and_then(|b| b.ledgers.get(&ledger))
            .is_some_and(|l| l.fence != Fence::None)
    }

    /// Whether a bookie holds anything of the ledger.
    pub fn has_ledger(&self, bookie: &BookieId, ledger: LedgerId) -> bool {
        let state = self.inner.lock();
        state
            .bookies
            .get(bookie)
            .is_some_and(|b| b.ledgers.contains_key(&ledger))
    }

    fn plan(&self, bookie: &BookieId) -> Plan {
        let mut state = self.inner.lock();
        let faults = state
            .bookies
            .get(bookie)
            .map(|b| b.faults.clone())
            .unwrap_or_default();
        let rng = &mut state.rng;
        let mut delay = || {
            if faults.delay_max <= faults.delay_min {
                faults.delay_min
            } else {
                rng.random_range(faults.delay_min..=faults.delay_max)
            }
        };
        let delay_in = delay();
        let delay_out = delay();
        let mut chance = |per_mille: u32| per_mille > 0 && rng.random_range(0..1000) < per_mille;
        Plan {
            delay_in,
            delay_out,
            sync_delay: faults.sync_delay,
            error: chance(faults.error_per_mille),
            overloaded: chance(faults.overloaded_per_mille),
            drop_request: chance(faults.drop_request_per_mille),
            drop_response: chance(faults.drop_response_per_mille),
        }
    }

    /// Runs `work` at the bookie after the inbound delay, applying the plan's
    /// faults around it. `work` returns the answer and, if the answer must wait
    /// for durability, the epoch it was applied in plus a completion step.
    fn request<T, W, D>(&self, bookie: &BookieId, work: W, make_durable: D) -> BookieFuture<T>
    where
        T: Send + 'static,
        W: FnOnce(&mut SimBookie) -> Result<T, BookieError> + Send + 'static,
        D: FnOnce(&mut SimBookie) + Send + 'static,
    {
        let plan = self.plan(bookie);
        let inner = self.inner.clone();
        let bookie = bookie.clone();
        let (tx, rx) = oneshot::channel::<Result<T, BookieError>>();
        tokio::spawn(async move {
            tokio::time::sleep(plan.delay_in).await;
            if plan.drop_request {
                return;
            }
            let applied = {
                let mut state = inner.lock();
                match state.bookies.get_mut(&bookie) {
                    None => Err(BookieError::UnknownBookie(bookie.0.clone())),
                    Some(b) if !b.alive => Err(BookieError::ConnectionLost("refused".into())),
                    Some(_) if plan.error => Err(BookieError::IoError),
                    Some(_) if plan.overloaded => Err(BookieError::TooManyRequests),
                    Some(b) => work(b).map(|answer| (answer, b.epoch)),
                }
            };
            let answer = match applied {
                Err(e) => Err(e),
                Ok((answer, epoch)) => {
                    tokio::time::sleep(plan.sync_delay).await;
                    let mut state = inner.lock();
                    match state.bookies.get_mut(&bookie) {
                        Some(b) if b.alive && b.epoch == epoch => {
                            make_durable(b);
                            Ok(answer)
                        }
                        // Crashed before the work was durable: the connection broke.
                        _ => Err(BookieError::ConnectionLost("bookie crashed".into())),
                    }
                }
            };
            if plan.drop_response {
                return;
            }
            tokio::time::sleep(plan.delay_out).await;
            let _ = tx.send(answer);
        });
        Box::pin(async move {
            match rx.await {
                Ok(answer) => answer,
                // Dropped on the way: no answer ever comes; the caller's timeout
                // decides.
                Err(_) => std::future::pending().await,
            }
        })
    }
}

impl SimBookie {
    fn lac(&self, ledger: LedgerId) -> Option<EntryId> {
        let l = self.ledgers.get(&ledger)?;
        l.entries
            .values()
            .filter_map(|e| carried_lac(&e.packaged).ok().flatten())
            .max()
    }

    fn fence(&mut self, ledger: LedgerId) {
        let l = self.ledgers.entry(ledger).or_default();
        if l.fence == Fence::None {
            l.fence = Fence::Pending;
        }
    }

    fn fence_durable(&mut self, ledger: LedgerId) {
        if let Some(l) = self.ledgers.get_mut(&ledger)
            && l.fence == Fence::Pending
        {
            l.fence = Fence::Durable;
        }
    }
}

impl BookieTransport for SimCluster {
    fn add(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        packaged: Bytes,
        mode: AddMode,
    ) -> BookieFuture<()> {
        self.request(
            bookie,
            move |b| {
                if carried_lac(&packaged).is_err() {
                    return Err(BookieError::BadRequest);
                }
                if b.read_only && mode == AddMode::Normal {
                    return Err(BookieError::ReadOnly);
                }
                let l = b.ledgers.entry(ledger_id).or_default();
                if l.fence != Fence::None && mode == AddMode::Normal {
                    return Err(BookieError::Fenced);
                }
                // A re-write (recovery) of an entry the bookie already made
                // durable stays durable: the earlier journal record survives a
                // crash whatever happens to the new one.
                let durable = l.entries.get(&entry_id).is_some_and(|e| e.durable);
                l.entries.insert(entry_id, SimEntry { packaged, durable });
                Ok(())
            },
            move |b| {
                if let Some(e) = b
                    .ledgers
                    .get_mut(&ledger_id)
                    .and_then(|l| l.entries.get_mut(&entry_id))
                {
                    e.durable = true;
                }
            },
        )
    }

    fn read(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        entry_id: EntryId,
        mode: ReadMode,
    ) -> BookieFuture<Bytes> {
        self.request(
            bookie,
            move |b| {
                if mode == ReadMode::Fence {
                    b.fence(ledger_id);
                }
                let l = b.ledgers.get(&ledger_id).ok_or(BookieError::NoSuchLedger)?;
                let e = l.entries.get(&entry_id).ok_or(BookieError::NoSuchEntry)?;
                Ok(e.packaged.clone())
            },
            move |b| b.fence_durable(ledger_id),
        )
    }

    fn read_lac(
        &self,
        bookie: &BookieId,
        ledger_id: LedgerId,
        mode: ReadMode,
    ) -> BookieFuture<Option<EntryId>> {
        self.request(
            bookie,
            move |b| {
                if mode == ReadMode::Fence {
                    b.fence(ledger_id);
                } else if !b.ledgers.contains_key(&ledger_id) {
                    return Err(BookieError::NoSuchLedger);
                }
                Ok(b.lac(ledger_id))
            },
            move |b| b.fence_durable(ledger_id),
        )
    }

    fn delete_ledger(&self, bookie: &BookieId, ledger_id: LedgerId) -> BookieFuture<()> {
        self.request(
            bookie,
            move |b| {
                b.ledgers.remove(&ledger_id);
                Ok(())
            },
            |_| {},
        )
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::entry::package;

    fn setup() -> (SimCluster, BookieId) {
        let cluster = SimCluster::new(1);
        let bookie = BookieId::new("b");
        cluster.add_bookie(&bookie);
        (cluster, bookie)
    }

    fn entry(entry: u64, lac: Option<u64>) -> Bytes {
        package(
            LedgerId(1),
            EntryId(entry),
            lac.map(EntryId),
            entry + 1,
            b"x",
        )
    }

    #[tokio::test(start_paused = true)]
    async fn fenced_ledger_refuses_normal_adds_and_takes_recovery_adds() {
        let (cluster, b) = setup();
        let (l, e0) = (LedgerId(1), EntryId(0));
        cluster
            .add(&b, l, e0, entry(0, None), AddMode::Normal)
            .await
            .unwrap();
        assert_eq!(
            cluster.read_lac(&b, l, ReadMode::Fence).await.unwrap(),
            None
        );
        assert!(cluster.is_fenced(&b, l));
        let refused = cluster
            .add(&b, l, EntryId(1), entry(1, Some(0)), AddMode::Normal)
            .await;
        assert_eq!(refused, Err(BookieError::Fenced));
        cluster
            .add(&b, l, EntryId(1), entry(1, Some(0)), AddMode::Recovery)
            .await
            .unwrap();
        assert_eq!(
            cluster.read_lac(&b, l, ReadMode::Normal).await.unwrap(),
            Some(EntryId(0))
        );
        assert_eq!(
            cluster.read(&b, l, EntryId(2), ReadMode::Normal).await,
            Err(BookieError::NoSuchEntry)
        );
        assert_eq!(
            cluster.read(&b, LedgerId(9), e0, ReadMode::Normal).await,
            Err(BookieError::NoSuchLedger)
        );
    }

    #[tokio::test(start_paused = true)]
    async fn crash_keeps_answered_adds_and_loses_unanswered_ones() {
        let (cluster, b) = setup();
        let l = LedgerId(1);
        cluster
            .add(&b, l, EntryId(0), entry(0, None), AddMode::Normal)
            .await
            .unwrap();
        cluster.set_faults(
            &b,
            SimFaults {
                sync_delay: Duration::from_secs(1),
                ..SimFaults::default()
            },
        );
        let slow = cluster.add(&b, l, EntryId(1), entry(1, Some(0)), AddMode::Normal);
        tokio::time::sleep(Duration::from_millis(10)).await;
        assert!(cluster.stored_entry(&b, l, EntryId(1)).is_some());
        cluster.kill(&b);
        assert!(matches!(slow.await, Err(BookieError::ConnectionLost(_))));
        cluster.restart(&b);
        assert!(cluster.stored_entry(&b, l, EntryId(0)).is_some());
        assert!(cluster.stored_entry(&b, l, EntryId(1)).is_none());
        let down = BookieId::new("b");
        cluster.kill(&down);
        assert!(matches!(
            cluster.read(&down, l, EntryId(0), ReadMode::Normal).await,
            Err(BookieError::ConnectionLost(_))
        ));
    }
}
