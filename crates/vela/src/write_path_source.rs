//! The write-path and read-path stages below the broker in `vela
//! standalone`: the ledger client's adds and reads and each in-process
//! bookie's add, journal and read stages, handed
//! to the broker as a `vela_broker::WritePathSource` (the broker never
//! depends on the bookie; this process owns both and wires them).
//!
//! Owns: handing the ledger client's and bookies' stage histograms
//! (`vela_metrics` snapshots, the type every stage records into) to the
//! broker at each scrape, and their counters and states as the broker's
//! storage metrics (corrupt reads, ensemble changes, bookie modes and disk
//! usage). Never: records anything itself, converts histograms, or blocks
//! (a few snapshots per scrape; the disk usage is the bookie's last measure).

use std::sync::Arc;

use vela_bookie::bookie::Bookie;
use vela_bookie::bookie::BookieMode;
use vela_broker::{Stage, StageLatency, StorageFamily, StorageMetric, WritePathSource};
use vela_ledger::{BookieId, LedgerClient};

/// Ledger client and bookies of one standalone process.
#[derive(Debug)]
pub(crate) struct StandaloneStages {
    ledgers: LedgerClient,
    bookies: Vec<(BookieId, Arc<Bookie>)>,
}

impl StandaloneStages {
    pub(crate) fn new(ledgers: LedgerClient, bookies: Vec<(BookieId, Arc<Bookie>)>) -> Self {
        StandaloneStages { ledgers, bookies }
    }
}

impl WritePathSource for StandaloneStages {
    fn stages(&self) -> Vec<StageLatency> {
        let client = |stage, latency| StageLatency {
            stage,
            instance: "ledger-client".to_string(),
            latency,
        };
        let mut out = vec![
            client(Stage::LedgerAdd, self.ledgers.add_latency()),
            client(Stage::LedgerAddWait, self.ledgers.add_wait_latency()),
            client(Stage::LedgerRead, self.ledgers.read_latency()),
        ];
        for (id, bookie) in &self.bookies {
            let histograms = bookie.latency_histograms();
            for (stage, histogram) in [
                (Stage::BookieAdd, histograms.add_us),
                (Stage::JournalQueueWait, histograms.journal.queue_wait_us),
                (Stage::JournalWrite, histograms.journal.write_us),
                (Stage::JournalFdatasync, histograms.journal.fdatasync_us),
                (Stage::BookieReadCache, histograms.read_cache_us),
                (Stage::BookieReadLog, histograms.read_log_us),
            ] {
                out.push(StageLatency {
                    stage,
                    instance: id.0.clone(),
                    latency: histogram,
                });
            }
        }
        out
    }

    fn storage_metrics(&self) -> Vec<StorageMetric> {
        let metric = |family, instance: &str, label, value| StorageMetric {
            family,
            instance: instance.to_string(),
            label,
            value,
        };
        let client = "ledger-client";
        let stats = self.ledgers.stats();
        let mut out = vec![
            metric(
                StorageFamily::CorruptReads,
                client,
                None,
                stats.corrupt_reads as f64,
            ),
            metric(
                StorageFamily::EnsembleChanges,
                client,
                None,
                stats.ensemble_changes as f64,
            ),
            metric(
                StorageFamily::ReadBytes,
                client,
                Some(("stage", Stage::LedgerRead.as_str().to_string())),
                self.ledgers.read_bytes() as f64,
            ),
        ];
        for (id, bookie) in &self.bookies {
            let instance = id.0.as_str();
            let state = bookie.state();
            for mode in [
                BookieMode::Writable,
                BookieMode::ReadOnly,
                BookieMode::Failed,
            ] {
                let value = if state.mode == mode { 1.0 } else { 0.0 };
                out.push(metric(
                    StorageFamily::BookieMode,
                    instance,
                    Some(("mode", mode.as_str().to_string())),
                    value,
                ));
            }
            out.push(metric(
                StorageFamily::BookieReadOnlyEntered,
                instance,
                None,
                state.read_only_entered_count as f64,
            ));
            for (dir, usage) in &state.disk_usage {
                if let Some(usage) = usage {
                    out.push(metric(
                        StorageFamily::BookieDiskUsage,
                        instance,
                        Some(("dir", dir.display().to_string())),
                        usage.used_fraction(),
                    ));
                }
            }
            let stats = bookie.stats();
            out.push(metric(
                StorageFamily::CorruptReads,
                instance,
                None,
                stats.corrupt_reads as f64,
            ));
            let budgets = &bookie.config().storage;
            out.push(metric(
                StorageFamily::BookieWriteCacheBytes,
                instance,
                Some(("max", budgets.write_cache_bytes_max.to_string())),
                (stats.storage.write_cache_active_bytes + stats.storage.write_cache_flushing_bytes)
                    as f64,
            ));
            out.push(metric(
                StorageFamily::BookieReadCacheBytes,
                instance,
                Some(("max", budgets.read_cache_bytes_max.to_string())),
                stats.storage.read_cache_bytes as f64,
            ));
            let histograms = bookie.latency_histograms();
            for (stage, bytes) in [
                (Stage::BookieReadCache.as_str(), histograms.read_cache_bytes),
                (Stage::BookieReadLog.as_str(), histograms.read_log_bytes),
                ("bookie_read_log_io", histograms.read_log_io_bytes),
            ] {
                out.push(metric(
                    StorageFamily::ReadBytes,
                    instance,
                    Some(("stage", stage.to_string())),
                    bytes as f64,
                ));
            }
        }
        out
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::net::SocketAddr;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use vela_broker::{Broker, BrokerConfig};
    use vela_ledger::sim::SimCluster;
    use vela_ledger::{EntryId, LedgerConfig, Quorum};
    use vela_meta::{ExpectedVersion, MemoryStore, MetadataStore, registry};

    use super::*;

    async fn get_metrics(addr: SocketAddr) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        stream
            .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
            .await
            .unwrap();
        let mut body = String::new();
        stream.read_to_string(&mut body).await.unwrap();
        body
    }

    /// A copy that fails its CRC is read from the other replica, and the
    /// broker's /metrics counts it.
    #[tokio::test]
    async fn a_corrupt_read_is_served_by_another_replica_and_exported() {
        let store: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
        let cluster = SimCluster::new(5);
        for name in ["b0", "b1"] {
            let id = BookieId::new(name);
            cluster.add_bookie(&id);
            let key = registry::bookie_key(&registry::BookieId::new(name).unwrap());
            let info = registry::BookieInfo {
                address: format!("sim://{name}"),
                rack: None,
            };
            let value = registry::encode_bookie_info(&info).unwrap();
            store.put(&key, value, ExpectedVersion::Any).await.unwrap();
        }
        let config = LedgerConfig {
            read_timeout: Duration::from_secs(5),
            ..LedgerConfig::default()
        };
        let ledgers = LedgerClient::new(store.clone(), Arc::new(cluster.clone()), config);
        let quorum = Quorum::new(2, 2, 2).unwrap();
        let writer = ledgers.create(quorum, Default::default()).await.unwrap();
        let id = writer.ledger_id();
        for e in 0..5u8 {
            writer.add(bytes::Bytes::from(vec![e; 10])).await.unwrap();
        }
        writer.close().await.unwrap();
        let first = ledgers.metadata(id).await.unwrap().write_set(EntryId(2))[0].clone();
        assert!(cluster.corrupt_entry(&first, id, EntryId(2)));
        let reader = ledgers.open_for_read(id).await.unwrap();
        assert_eq!(&reader.read(EntryId(2)).await.unwrap()[..], &[2u8; 10][..]);

        let broker = Broker::start(
            BrokerConfig::new("127.0.0.1:0".parse().unwrap()),
            store.clone(),
            vela_log::LogEnv::in_memory(),
        )
        .await
        .unwrap();
        broker
            .add_write_path_source(Arc::new(StandaloneStages::new(ledgers, Vec::new())))
            .unwrap();
        let http = broker
            .start_http("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        let metrics = get_metrics(http.local_addr()).await;
        assert!(
            metrics.contains(
                "vela_corrupt_reads_total{cluster=\"standalone\",instance=\"ledger-client\"} 1\n"
            ),
            "{metrics}"
        );
        assert!(metrics.contains("# TYPE vela_corrupt_reads_total counter"));
        http.stop().await;
        broker.shutdown().await.unwrap();
    }
}
