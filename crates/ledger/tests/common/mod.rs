//! Shared harness of the ledger tests: a simulated bookie cluster, an in-memory
//! metadata store with the bookies registered, and a client over both.
#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use vela_ledger::sim::SimCluster;
use vela_ledger::{BookieId, EntryId, LedgerClient, LedgerConfig, LedgerId, LedgerReader, Quorum};
use vela_meta::{ExpectedVersion, MemoryStore, MetadataStore, registry};

pub struct Harness {
    pub cluster: SimCluster,
    pub store: Arc<dyn MetadataStore>,
    /// What clients use (the store itself, or a faulty wrapper of it).
    pub client_store: Arc<dyn MetadataStore>,
    pub bookies: Vec<BookieId>,
    pub seed: u64,
}

/// Test timings: short timeouts so fault tests resolve in little virtual time.
pub fn config(seed: u64) -> LedgerConfig {
    LedgerConfig {
        add_timeout: Duration::from_millis(200),
        read_timeout: Duration::from_millis(200),
        recovery_attempts_max: 6,
        recovery_retry_delay: Duration::from_millis(50),
        placement_seed: Some(seed),
        ..LedgerConfig::default()
    }
}

impl Harness {
    pub async fn new(seed: u64, bookie_count: usize) -> Harness {
        let cluster = SimCluster::new(seed);
        let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        let mut bookies = Vec::new();
        for i in 0..bookie_count {
            let id = BookieId::new(format!("bookie-{i}"));
            cluster.add_bookie(&id);
            register(&store, &id).await;
            bookies.push(id);
        }
        Harness {
            cluster,
            client_store: store.clone(),
            store,
            bookies,
            seed,
        }
    }

    /// A client (each call: another process, with its own placement RNG).
    pub fn client(&self) -> LedgerClient {
        self.client_with(config(self.seed))
    }

    pub fn client_with(&self, config: LedgerConfig) -> LedgerClient {
        LedgerClient::new(
            self.client_store.clone(),
            Arc::new(self.cluster.clone()),
            config,
        )
    }
}

/// Registers a bookie (persistently: the tests manage liveness in the sim).
pub async fn register(store: &Arc<dyn MetadataStore>, bookie: &BookieId) {
    register_at(store, bookie, &format!("sim://{bookie}"), None).await;
}

pub async fn register_at(
    store: &Arc<dyn MetadataStore>,
    bookie: &BookieId,
    address: &str,
    rack: Option<&str>,
) {
    let id = registry::BookieId::new(bookie.0.as_str()).unwrap();
    let info = registry::BookieInfo {
        address: address.to_owned(),
        rack: rack.map(str::to_owned),
    };
    let value = registry::encode_bookie_info(&info).unwrap();
    store
        .put(&registry::bookie_key(&id), value, ExpectedVersion::Any)
        .await
        .unwrap();
}

pub fn quorum(e: usize, w: usize, a: usize) -> Quorum {
    Quorum::new(e, w, a).unwrap()
}

pub fn no_properties() -> BTreeMap<String, String> {
    BTreeMap::new()
}

pub fn payload(ledger: LedgerId, entry: u64) -> Bytes {
    Bytes::from(format!(
        "ledger {} entry {entry} {}",
        ledger.0,
        "x".repeat((entry % 7) as usize)
    ))
}

/// Reads every entry 0..=last and returns the payloads.
pub async fn read_all(reader: &LedgerReader) -> Vec<Bytes> {
    let mut out = Vec::new();
    if let Some(last) = reader.last_readable() {
        for e in 0..=last.0 {
            out.push(reader.read(EntryId(e)).await.unwrap());
        }
    }
    out
}

pub mod flaky;
