//! vela-offload: tiered storage. `ObjectStoreOffloader` copies a closed
//! ledger to object storage (the `object_store` crate: a local filesystem
//! or an S3 bucket, `s3`) as one large data object plus an index object,
//! and reads entries back with one ranged GET per read.
//!
//! Owns: the objects' layout and names (`format`), the copy (`write`), the
//! reads with their index cache and read budget (`read`), the drivers'
//! settings (`Driver`, `s3`: S3 credentials from the environment or the
//! shared credentials file), the counters.
//! Guarantees: `offload` returns only once both objects are fully and
//! durably stored (the filesystem driver fsyncs files and directories; an
//! S3 PUT or completed multipart upload is durable when answered); objects
//! are written under the attempt's uid, so nothing half-written is ever
//! under a name the log's metadata points to.
//! Memory (broker-wide, see ARCHITECTURE.md "Memory model"): at most
//! `offloads_in_flight_max` copies at once, each holding one read batch of
//! about `PART_BYTES` plus `UPLOAD_PARTS_IN_FLIGHT_MAX + 1` parts; reads hold
//! at most `read_bytes_in_flight_max` bytes of GETs at once (a read asks for
//! no more than that); indexes are cached within `index_cache_bytes_max`.
//! Never: decides what to offload or when (the log does, `vela_log::offload`),
//! touches the log's metadata, or trusts stored bytes (checked: magic,
//! version, CRC32C of the index and of every entry).

mod format;
mod read;
pub mod s3;
mod write;

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use bytes::Bytes;
use object_store::local::LocalFileSystem;
use object_store::{ObjectStore, ObjectStoreExt};
use tokio::sync::Semaphore;
use vela_log::backend::BoxFuture;
use vela_log::{
    LedgerBackend, LedgerBackendError, LedgerOffloader, OffloadCounters, OffloadError,
    OffloadTarget,
};

use read::IndexCache;
pub use s3::{S3Credentials, S3Settings};

/// Size of one multipart upload part (S3 needs at least 5 MiB but for the
/// last) and about the bytes of one read of the ledger being copied.
pub const PART_BYTES: usize = 8 << 20;
/// Parts of one copy uploading at once.
pub const UPLOAD_PARTS_IN_FLIGHT_MAX: usize = 2;
/// Entries of one read of the ledger being copied (fewer when the ledger's
/// mean entry size says `PART_BYTES` would be passed).
pub const COPY_READ_ENTRIES_MAX: u64 = 1024;

/// Where objects go.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Driver {
    /// A directory of the local filesystem (or a mounted one).
    Filesystem {
        /// The directory; created if absent.
        root: std::path::PathBuf,
    },
    /// An S3 bucket (AWS or an S3-compatible store's endpoint).
    S3(S3Settings),
}

impl Driver {
    /// The driver's name, as `--offload-driver` spells it.
    pub fn name(&self) -> &'static str {
        match self {
            Driver::Filesystem { .. } => "filesystem",
            Driver::S3(_) => "s3",
        }
    }
}

/// An offloader's settings.
#[derive(Debug, Clone)]
pub struct OffloadConfig {
    /// Where objects go.
    pub driver: Driver,
    /// Prefix of every object name (e.g. `vela/`); empty for none.
    pub prefix: String,
    /// Bytes of ranged reads in flight at once, broker-wide.
    pub read_bytes_in_flight_max: u64,
    /// Bytes of indexes kept in memory, broker-wide.
    pub index_cache_bytes_max: u64,
    /// Ledgers copied at once, broker-wide.
    pub offloads_in_flight_max: usize,
}

impl OffloadConfig {
    /// Defaults: 64 MiB of reads in flight, 32 MiB of indexes (4 million
    /// entries' offsets), 2 copies at once (about 2 x 32 MiB).
    pub fn new(driver: Driver) -> OffloadConfig {
        OffloadConfig {
            driver,
            prefix: String::new(),
            read_bytes_in_flight_max: 64 << 20,
            index_cache_bytes_max: 32 << 20,
            offloads_in_flight_max: 2,
        }
    }
}

/// Why an offloader could not be built.
#[derive(Debug, thiserror::Error)]
pub enum BuildError {
    /// The store could not be set up (directory, settings).
    #[error("{driver} offload store: {message}")]
    Store {
        /// The driver.
        driver: &'static str,
        /// What went wrong.
        message: String,
    },
}

#[derive(Debug, Default)]
struct Counters {
    offloaded_bytes: AtomicU64,
    offloaded_ledgers: AtomicU64,
    offload_errors: AtomicU64,
    read_errors: AtomicU64,
    read_entries: AtomicU64,
    read_bytes: AtomicU64,
    reads: AtomicU64,
    read_latency_us_total: AtomicU64,
}

/// The offloader over an `object_store` store. Cheap to share.
#[derive(Debug)]
pub struct ObjectStoreOffloader {
    store: Arc<dyn ObjectStore>,
    /// The filesystem driver's store, to remove a crashed upload's staging
    /// file (`{name}#1`), which the store itself never lists or deletes.
    local: Option<Arc<LocalFileSystem>>,
    driver: &'static str,
    prefix: String,
    /// Permits are bytes of ranged reads in flight.
    read_budget: Semaphore,
    read_bytes_max: u64,
    /// Permits are copies in flight.
    copies: Semaphore,
    indexes: IndexCache,
    counters: Counters,
    /// Latency of ranged reads (index fetch included).
    read_latency: vela_metrics::Histogram,
}

/// Semaphores take at most `u32::MAX` permits at once.
const READ_BUDGET_BYTES_CEILING: u64 = u32::MAX as u64;

impl ObjectStoreOffloader {
    /// Builds the offloader (creates a filesystem driver's directory; an
    /// S3 driver's settings are checked, the bucket is not contacted).
    pub fn new(config: OffloadConfig) -> Result<ObjectStoreOffloader, BuildError> {
        let driver = config.driver.name();
        let (store, local): (Arc<dyn ObjectStore>, _) = match &config.driver {
            Driver::Filesystem { root } => {
                std::fs::create_dir_all(root).map_err(|error| BuildError::Store {
                    driver,
                    message: format!("cannot create {}: {error}", root.display()),
                })?;
                let local = LocalFileSystem::new_with_prefix(root)
                    .map_err(|error| BuildError::Store {
                        driver,
                        message: error.to_string(),
                    })?
                    // Durable before `offload` returns: the bookie copy
                    // may be deleted right after.
                    .with_fsync(true);
                let local = Arc::new(local);
                (local.clone() as Arc<dyn ObjectStore>, Some(local))
            }
            Driver::S3(settings) => (s3::store(settings)? as Arc<dyn ObjectStore>, None),
        };
        let mut offloader = ObjectStoreOffloader::over(store, driver, config);
        offloader.local = local;
        Ok(offloader)
    }

    /// The offloader over any `object_store` store (tests, other drivers).
    pub fn over(
        store: Arc<dyn ObjectStore>,
        driver: &'static str,
        config: OffloadConfig,
    ) -> ObjectStoreOffloader {
        let read_bytes_max = config
            .read_bytes_in_flight_max
            .clamp(1, READ_BUDGET_BYTES_CEILING);
        ObjectStoreOffloader {
            store,
            local: None,
            driver,
            prefix: config.prefix,
            read_budget: Semaphore::new(read_bytes_max as usize),
            read_bytes_max,
            copies: Semaphore::new(config.offloads_in_flight_max.max(1)),
            indexes: IndexCache::new(config.index_cache_bytes_max),
            counters: Counters::default(),
            read_latency: vela_metrics::Histogram::default(),
        }
    }

    /// Latency of ranged reads so far.
    pub fn read_latency(&self) -> vela_metrics::Snapshot {
        self.read_latency.snapshot()
    }

    fn store_error(&self, error: object_store::Error) -> OffloadError {
        OffloadError::Store(format!("{}: {error}", self.driver))
    }

    /// Removes the staging file an upload to `path` left when its process
    /// died (filesystem driver only; each attempt's names are its own, so
    /// its upload is the first staged one, `#1`).
    async fn remove_staged(&self, path: &object_store::path::Path) -> Result<(), OffloadError> {
        let Some(local) = &self.local else {
            return Ok(());
        };
        let file = local
            .path_to_filesystem(path)
            .map_err(|error| self.store_error(error))?;
        let mut staged = file.into_os_string();
        staged.push("#1");
        match tokio::fs::remove_file(&staged).await {
            Ok(()) => Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(error) => Err(OffloadError::Store(format!(
                "{}: cannot remove {}: {error}",
                self.driver,
                std::path::Path::new(&staged).display()
            ))),
        }
    }
}

impl LedgerOffloader for ObjectStoreOffloader {
    fn driver_name(&self) -> &str {
        self.driver
    }

    fn offload<'a>(
        &'a self,
        target: OffloadTarget,
        entries: u64,
        size_bytes: u64,
        source: &'a dyn LedgerBackend,
    ) -> BoxFuture<'a, Result<u64, OffloadError>> {
        Box::pin(async move {
            let _copy = self
                .copies
                .acquire()
                .await
                .map_err(|_| OffloadError::Refused("offloader closed".to_string()))?;
            let result = self.copy_ledger(target, entries, size_bytes, source).await;
            match &result {
                Ok(written) => {
                    self.counters
                        .offloaded_bytes
                        .fetch_add(*written, Ordering::Relaxed);
                    self.counters
                        .offloaded_ledgers
                        .fetch_add(1, Ordering::Relaxed);
                }
                Err(_) => {
                    self.counters.offload_errors.fetch_add(1, Ordering::Relaxed);
                }
            }
            result
        })
    }

    fn read(
        &self,
        target: OffloadTarget,
        first_entry_id: u64,
        last_entry_id: u64,
        bytes_max: usize,
    ) -> BoxFuture<'_, Result<Vec<Bytes>, LedgerBackendError>> {
        Box::pin(async move {
            let started = std::time::Instant::now();
            let result = self
                .read_entries(target, first_entry_id, last_entry_id, bytes_max)
                .await;
            let elapsed = started.elapsed();
            self.read_latency.record(elapsed);
            self.counters.reads.fetch_add(1, Ordering::Relaxed);
            self.counters.read_latency_us_total.fetch_add(
                u64::try_from(elapsed.as_micros()).unwrap_or(u64::MAX),
                Ordering::Relaxed,
            );
            match &result {
                Ok(entries) => {
                    let bytes: usize = entries.iter().map(Bytes::len).sum();
                    self.counters
                        .read_entries
                        .fetch_add(entries.len() as u64, Ordering::Relaxed);
                    self.counters
                        .read_bytes
                        .fetch_add(bytes as u64, Ordering::Relaxed);
                }
                Err(error) => {
                    self.counters.read_errors.fetch_add(1, Ordering::Relaxed);
                    tracing::warn!(ledger_id = target.ledger_id, %error, "offloaded read failed");
                }
            }
            result
        })
    }

    fn delete(&self, target: OffloadTarget) -> BoxFuture<'_, Result<(), OffloadError>> {
        Box::pin(async move {
            self.indexes.remove(target);
            let data = format::data_path(&self.prefix, target);
            for path in [&data, &format::index_path(&self.prefix, target)] {
                match self.store.delete(path).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(error) => return Err(self.store_error(error)),
                }
            }
            self.remove_staged(&data).await
        })
    }

    fn counters(&self) -> OffloadCounters {
        let c = &self.counters;
        OffloadCounters {
            offloaded_bytes: c.offloaded_bytes.load(Ordering::Relaxed),
            offloaded_ledgers: c.offloaded_ledgers.load(Ordering::Relaxed),
            offload_errors: c.offload_errors.load(Ordering::Relaxed),
            read_errors: c.read_errors.load(Ordering::Relaxed),
            read_entries: c.read_entries.load(Ordering::Relaxed),
            read_bytes: c.read_bytes.load(Ordering::Relaxed),
            reads: c.reads.load(Ordering::Relaxed),
            read_latency_us_total: c.read_latency_us_total.load(Ordering::Relaxed),
        }
    }
}
