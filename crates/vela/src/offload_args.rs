//! Tiered storage flags, shared by `vela standalone` and `vela broker`:
//! where closed ledgers are offloaded (`--offload-driver`, its settings),
//! the broker-wide budgets of the offloader, and the broker's default
//! offload policy (Pulsar's `managedLedgerOffloadThresholdInBytes`,
//! `managedLedgerOffloadThresholdInSeconds`,
//! `managedLedgerOffloadDeletionLagMs`).
//!
//! Owns: the flag names and building the `ObjectStoreOffloader` the logs
//! share. Drivers built: `filesystem` (a directory, local or mounted).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use vela_broker::BrokerConfig;
use vela_log::{LogEnv, OffloadPolicy};
use vela_offload::{Driver, ObjectStoreOffloader, OffloadConfig};

const MIB: u64 = 1024 * 1024;

/// Where offloaded ledgers go.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DriverName {
    /// A directory (`--offload-directory`).
    Filesystem,
}

/// Tiered storage flags.
#[derive(Debug, Args)]
pub(crate) struct OffloadArgs {
    /// Offload closed ledgers to this store (off when absent: data stays
    /// on the bookies).
    #[arg(long, value_enum)]
    offload_driver: Option<DriverName>,
    /// The filesystem driver's directory (created if absent).
    #[arg(long, value_name = "DIR")]
    offload_directory: Option<PathBuf>,
    /// Offload a topic's older closed ledgers once the newer ones hold
    /// more than this many bytes (−1: off). Namespace policies override it.
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    offload_threshold_bytes: i64,
    /// Offload closed ledgers older than this many seconds (−1: off).
    #[arg(long, default_value_t = -1, allow_negative_numbers = true)]
    offload_threshold_seconds: i64,
    /// Delete the bookies' copy of an offloaded ledger this many ms after
    /// its offload completed (−1: keep it).
    #[arg(long, default_value_t = 4 * 3600 * 1000, allow_negative_numbers = true)]
    offload_deletion_lag_ms: i64,
    /// MiB of ranged reads from the store in flight at once, broker-wide.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=4095))]
    offload_read_mb: u64,
    /// MiB of offloaded ledgers' indexes cached, broker-wide (8 bytes an
    /// entry).
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(0..=65_536))]
    offload_index_cache_mb: u64,
}

/// A Pulsar-style number where a negative value means "off".
fn non_negative(value: i64) -> Option<u64> {
    u64::try_from(value).ok()
}

impl OffloadArgs {
    /// The broker's default offload policy.
    pub(crate) fn apply(&self, config: &mut BrokerConfig) {
        config.offload_policy = OffloadPolicy {
            threshold_bytes: non_negative(self.offload_threshold_bytes),
            threshold_age: non_negative(self.offload_threshold_seconds).map(Duration::from_secs),
            deletion_lag: non_negative(self.offload_deletion_lag_ms).map(Duration::from_millis),
        };
    }

    /// `env` with the offloader these flags name, if any.
    pub(crate) fn offloader(&self, env: LogEnv) -> anyhow::Result<LogEnv> {
        let Some(driver) = self.offload_driver else {
            if self.offload_directory.is_some() {
                bail!("--offload-directory needs --offload-driver filesystem");
            }
            return Ok(env);
        };
        let driver = match driver {
            DriverName::Filesystem => {
                let Some(root) = self.offload_directory.clone() else {
                    bail!("--offload-driver filesystem needs --offload-directory");
                };
                Driver::Filesystem { root }
            }
        };
        let mut config = OffloadConfig::new(driver);
        config.read_bytes_in_flight_max = self.offload_read_mb * MIB;
        config.index_cache_bytes_max = self.offload_index_cache_mb * MIB;
        let offloader = ObjectStoreOffloader::new(config).context("cannot set up offloading")?;
        tracing::info!(
            driver = offloader_name(&offloader),
            read_mib = self.offload_read_mb,
            index_cache_mib = self.offload_index_cache_mb,
            "offloading closed ledgers"
        );
        Ok(env.with_offloader(Arc::new(offloader)))
    }
}

fn offloader_name(offloader: &ObjectStoreOffloader) -> String {
    use vela_log::LedgerOffloader;
    offloader.driver_name().to_string()
}
