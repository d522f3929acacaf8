//! The write-path and read-path stages the service reports: the broker's
//! own histograms and the registered sources' (ledger client, bookies),
//! with their storage metrics, for `/metrics` and `/admin/v2/vela/*`.
//!
//! Owns nothing of its own: the sources are `Service::write_path_sources`
//! (at most `WRITE_PATH_SOURCES_MAX`). Never: records a latency (the stages'
//! owners do).

use std::sync::Arc;

use vela_wire::proto::ServerError;

use super::Service;
use crate::error::ServiceError;
use crate::metrics::{Stage, StageLatency, WritePathSource};

impl Service {
    /// Registers a source of write-path stages (ledger client, bookies).
    pub(crate) fn add_write_path_source(
        &self,
        source: Arc<dyn WritePathSource>,
    ) -> Result<(), ServiceError> {
        let mut sources = self.write_path_sources.lock();
        if sources.len() >= crate::metrics::WRITE_PATH_SOURCES_MAX {
            return Err(ServiceError::new(
                ServerError::NotAllowedError,
                "WRITE_PATH_SOURCES_MAX sources are registered",
            ));
        }
        sources.push(source);
        Ok(())
    }

    /// Every write-path and read-path stage: the broker's own (publish
    /// latency, the subscriptions' reads), then the registered sources'
    /// stages.
    pub(crate) fn write_path(&self) -> Vec<StageLatency> {
        let broker = |stage, latency| StageLatency {
            stage,
            instance: "broker".to_string(),
            latency,
        };
        let reads = &self.metrics.reads;
        let mut stages = vec![
            broker(
                Stage::BrokerPublish,
                self.metrics.publish_latency.snapshot(),
            ),
            broker(Stage::BrokerIssue, self.metrics.issue_latency.snapshot()),
            broker(Stage::BrokerAppend, self.metrics.append_latency.snapshot()),
            broker(
                Stage::BrokerReceipt,
                self.metrics.receipt_latency.snapshot(),
            ),
            broker(Stage::DispatcherReadWait, reads.read_wait.snapshot()),
            broker(Stage::DispatcherRead, reads.read.snapshot()),
        ];
        let sources: Vec<Arc<dyn WritePathSource>> = self.write_path_sources.lock().clone();
        for source in sources {
            stages.extend(source.stages());
        }
        stages
    }

    /// The registered sources' storage metrics, each source's bounded by
    /// `STORAGE_METRICS_PER_SOURCE_MAX`.
    pub(crate) fn storage_metrics(&self) -> Vec<crate::metrics::StorageMetric> {
        let sources: Vec<Arc<dyn WritePathSource>> = self.write_path_sources.lock().clone();
        let mut out = vec![
            crate::metrics::StorageMetric {
                family: crate::metrics::StorageFamily::ReadAheadBytes,
                instance: "broker".to_string(),
                label: Some(("max", self.config.read_ahead_bytes_max.to_string())),
                value: self.reads.budget.held_bytes() as f64,
            },
            crate::metrics::StorageMetric {
                family: crate::metrics::StorageFamily::ReadBytes,
                instance: "broker".to_string(),
                label: Some(("stage", Stage::DispatcherRead.as_str().to_string())),
                value: self
                    .metrics
                    .reads
                    .read_bytes
                    .load(std::sync::atomic::Ordering::Relaxed) as f64,
            },
        ];
        for source in sources {
            let mut metrics = source.storage_metrics();
            if metrics.len() > crate::metrics::STORAGE_METRICS_PER_SOURCE_MAX {
                tracing::warn!(
                    count = metrics.len(),
                    "a write-path source returned too many storage metrics; dropping the rest"
                );
                metrics.truncate(crate::metrics::STORAGE_METRICS_PER_SOURCE_MAX);
            }
            out.extend(metrics);
        }
        out
    }
}
