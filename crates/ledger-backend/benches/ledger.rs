//! Ledger client benchmark: ledger add latency at depth 1 beside one bookie's
//! own add latency, measured in the same run on the same disk.
//!
//! Prints, for 1 KiB entries, one add in flight at a time:
//! - `bookie add`: `BookieClient::add` straight to one bookie (the baseline);
//! - `ledger E1/Qw1/Qa1`: `LedgerWriter::add` on that bookie (adds the ledger
//!   client's packaging, writer task and ordering on top of the baseline);
//! - `ledger E2/Qw2/Qa2`: across 3 bookies with separate journal dirs (each add
//!   waits for two fdatasyncs in parallel: the slower of two).
//!
//! The baseline runs before and after the ledger phases (the machine may be
//! shared); ratios use the mean of its two medians.
//!
//! Run: `cargo bench -p vela-ledger-backend --bench ledger` (dir: env VELA_BENCH_DIR,
//! default a temp dir under the workspace's target/; seconds per phase: env
//! VELA_BENCH_SECS, default 4; the whole run stays well under 60 s).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use bytes::Bytes;
use hdrhistogram::Histogram;
use vela_bookie::bookie::{Bookie, BookieConfig};
use vela_bookie::server::Server;
use vela_bookie_protocol::AddMode;
use vela_bookie_protocol::client::{BookieClient, ClientConfig};
use vela_bookie_protocol::entry::{EntryHeader, encode_entry};
use vela_ledger::{BookieClientTransport, BookieId, LedgerClient, LedgerConfig, Quorum};
use vela_meta::registry;
use vela_meta::{ExpectedVersion, MemoryStore, MetadataStore};

const ENTRY_BYTES: usize = 1024;
const WARMUP_ADDS: usize = 200;

struct Running {
    id: BookieId,
    addr: std::net::SocketAddr,
    bookie: Arc<Bookie>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
    _dir: tempfile::TempDir,
}

fn bench_dir(name: &str) -> tempfile::TempDir {
    let base = std::env::var("VELA_BENCH_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|_| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target"));
    std::fs::create_dir_all(&base).unwrap();
    tempfile::Builder::new()
        .prefix(&format!("ledger-bench-{name}-"))
        .tempdir_in(base)
        .unwrap()
}

fn phase_duration() -> Duration {
    let secs = std::env::var("VELA_BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(4);
    Duration::from_secs(secs)
}

async fn start_bookie(name: &str) -> Running {
    let dir = bench_dir(name);
    let config = BookieConfig::new(dir.path().join("journal"), dir.path().join("ledgers"));
    let bookie = Arc::new(
        tokio::task::spawn_blocking(move || Bookie::open(config))
            .await
            .unwrap()
            .expect("bookie opens"),
    );
    let server = Server::bind("127.0.0.1:0".parse().unwrap(), bookie.clone())
        .await
        .unwrap();
    let addr = server.local_addr();
    let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
    let served = tokio::spawn(async move {
        server
            .run(async {
                let _ = stop.await;
            })
            .await
            .unwrap();
    });
    Running {
        id: BookieId::new(name),
        addr,
        bookie,
        shutdown,
        served,
        _dir: dir,
    }
}

impl Running {
    async fn stop(self) {
        let _ = self.shutdown.send(());
        self.served.await.unwrap();
        let bookie = self.bookie;
        tokio::task::spawn_blocking(move || bookie.shutdown())
            .await
            .unwrap();
    }
}

async fn register(store: &Arc<dyn MetadataStore>, bookie: &Running) {
    let id = registry::BookieId::new(bookie.id.0.as_str()).unwrap();
    let info = registry::BookieInfo {
        address: bookie.addr.to_string(),
        rack: None,
    };
    store
        .put(
            &registry::bookie_key(&id),
            registry::encode_bookie_info(&info).unwrap(),
            ExpectedVersion::Any,
        )
        .await
        .unwrap();
}

fn report(name: &str, histogram: &Histogram<u64>) {
    println!(
        "{name:<22} adds={:>6}  p50={:>6} µs  p99={:>6} µs  p99.9={:>6} µs  mean={:>8.1} µs",
        histogram.len(),
        histogram.value_at_quantile(0.5),
        histogram.value_at_quantile(0.99),
        histogram.value_at_quantile(0.999),
        histogram.mean()
    );
}

async fn bookie_baseline(bookie: &Running, ledger_id: u64) -> Histogram<u64> {
    let client = BookieClient::connect(bookie.addr).await.unwrap();
    let payload = vec![7u8; ENTRY_BYTES];
    let mut histogram = Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
    let deadline = Instant::now() + phase_duration();
    let mut entry_id = 0u64;
    while Instant::now() < deadline {
        let header = EntryHeader {
            ledger_id,
            entry_id,
            last_add_confirmed: entry_id.checked_sub(1),
            ledger_length: (entry_id + 1) * ENTRY_BYTES as u64,
        };
        let entry = encode_entry(&header, &payload);
        let started = Instant::now();
        client.add(entry, AddMode::Normal).await.unwrap();
        if entry_id as usize >= WARMUP_ADDS {
            histogram
                .record(started.elapsed().as_micros() as u64)
                .unwrap();
        }
        entry_id += 1;
    }
    histogram
}

async fn ledger_adds(client: &LedgerClient, quorum: Quorum) -> Histogram<u64> {
    let writer = client.create(quorum, BTreeMap::new()).await.unwrap();
    let payload = Bytes::from(vec![7u8; ENTRY_BYTES]);
    let mut histogram = Histogram::new_with_bounds(1, 60_000_000, 3).unwrap();
    let deadline = Instant::now() + phase_duration();
    let mut count = 0usize;
    while Instant::now() < deadline {
        let started = Instant::now();
        writer.add(payload.clone()).await.unwrap();
        if count >= WARMUP_ADDS {
            histogram
                .record(started.elapsed().as_micros() as u64)
                .unwrap();
        }
        count += 1;
    }
    writer.close().await.unwrap();
    histogram
}

fn main() {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        let bookies = vec![
            start_bookie("bookie-0").await,
            start_bookie("bookie-1").await,
            start_bookie("bookie-2").await,
        ];
        println!(
            "ledger bench: depth 1, {ENTRY_BYTES}-byte entries, {:?} per phase, dirs under {}",
            phase_duration(),
            bench_dir("probe").path().parent().unwrap().display()
        );
        let baseline = bookie_baseline(&bookies[0], 1_000_000).await;
        report("bookie add (1 bookie)", &baseline);

        // E1: only bookie-0 registered, so the ledger lands where the baseline ran.
        register(&store, &bookies[0]).await;
        let config = LedgerConfig {
            placement_seed: Some(1),
            ..LedgerConfig::default()
        };
        let transport = Arc::new(BookieClientTransport::new(
            store.clone(),
            ClientConfig::default(),
        ));
        let client = LedgerClient::new(store.clone(), transport, config);
        let one = ledger_adds(&client, Quorum::new(1, 1, 1).unwrap()).await;
        report("ledger E1/Qw1/Qa1", &one);

        register(&store, &bookies[1]).await;
        register(&store, &bookies[2]).await;
        let two = ledger_adds(&client, Quorum::new(2, 2, 2).unwrap()).await;
        report("ledger E2/Qw2/Qa2", &two);

        // The baseline again, on a fresh ledger id: the machine is shared, so
        // bracket the ledger phases and compare against both runs' mean.
        let baseline_after = bookie_baseline(&bookies[0], 2_000_000).await;
        report("bookie add (again)", &baseline_after);
        let base = (baseline.value_at_quantile(0.5) + baseline_after.value_at_quantile(0.5)) as f64
            / 2.0;
        println!(
            "p50 ratio to one bookie's add (mean of both runs): E1/Qw1/Qa1 {:.2}x, E2/Qw2/Qa2 {:.2}x",
            one.value_at_quantile(0.5) as f64 / base,
            two.value_at_quantile(0.5) as f64 / base
        );
        for bookie in bookies {
            bookie.stop().await;
        }
    });
}
