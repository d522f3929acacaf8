//! Tiered storage flags, shared by `vela standalone` and `vela broker`:
//! where closed ledgers are offloaded (`--offload-driver`, its settings),
//! the broker-wide budgets of the offloader, and the broker's default
//! offload policy (Pulsar's `managedLedgerOffloadThresholdInBytes`,
//! `managedLedgerOffloadThresholdInSeconds`,
//! `managedLedgerOffloadDeletionLagMs`).
//!
//! Owns: the flag names and building the `ObjectStoreOffloader` the logs
//! share. Drivers built: `filesystem` (a directory, local or mounted) and
//! `s3` (Pulsar's `aws-s3` and `S3` too, in any case, as Pulsar's
//! `managedLedgerOffloadDriver`): `--offload-bucket`, `--offload-region`,
//! `--offload-service-endpoint` are Pulsar's `s3ManagedLedgerOffloadBucket`,
//! `s3ManagedLedgerOffloadRegion`, `s3ManagedLedgerOffloadServiceEndpoint`
//! (those names in kebab case are accepted as aliases); credentials from
//! the environment or the shared credentials file (`vela_offload::s3`).

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use vela_broker::BrokerConfig;
use vela_log::{LogEnv, OffloadPolicy};
use vela_offload::{Driver, ObjectStoreOffloader, OffloadConfig, S3Credentials, S3Settings};

const MIB: u64 = 1024 * 1024;

/// Where offloaded ledgers go (names compared without case, as Pulsar's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub(crate) enum DriverName {
    /// A directory (`--offload-directory`).
    Filesystem,
    /// An S3 bucket (`--offload-bucket`, `--offload-region` and/or
    /// `--offload-service-endpoint`).
    #[value(name = "s3", alias = "aws-s3")]
    S3,
}

/// Tiered storage flags.
#[derive(Debug, Args)]
pub(crate) struct OffloadArgs {
    /// Offload closed ledgers to this store (off when absent: data stays
    /// on the bookies).
    #[arg(long, value_enum, ignore_case = true)]
    offload_driver: Option<DriverName>,
    /// The filesystem driver's directory (created if absent).
    #[arg(long, value_name = "DIR")]
    offload_directory: Option<PathBuf>,
    /// The S3 driver's bucket, which must exist (Pulsar's
    /// s3ManagedLedgerOffloadBucket).
    #[arg(
        long,
        value_name = "BUCKET",
        alias = "s3-managed-ledger-offload-bucket"
    )]
    offload_bucket: Option<String>,
    /// The S3 driver's region (Pulsar's s3ManagedLedgerOffloadRegion);
    /// with only an endpoint, us-east-1 is signed for.
    #[arg(
        long,
        value_name = "REGION",
        alias = "s3-managed-ledger-offload-region"
    )]
    offload_region: Option<String>,
    /// An S3-compatible store's URL, http:// or https:// (Pulsar's
    /// s3ManagedLedgerOffloadServiceEndpoint); absent for AWS.
    #[arg(
        long,
        value_name = "URL",
        alias = "s3-managed-ledger-offload-service-endpoint"
    )]
    offload_service_endpoint: Option<String>,
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

    /// The driver these flags name (`None`: offloading off); each refusal
    /// names the flag. S3 credentials are looked up here.
    pub(crate) fn driver(&self) -> anyhow::Result<Option<Driver>> {
        let s3_flags = [
            ("--offload-bucket", self.offload_bucket.is_some()),
            ("--offload-region", self.offload_region.is_some()),
            (
                "--offload-service-endpoint",
                self.offload_service_endpoint.is_some(),
            ),
        ];
        let misplaced = |driver: &str, flags: &[(&str, bool)]| -> anyhow::Result<()> {
            match flags.iter().find(|(_, set)| *set) {
                Some((flag, _)) => bail!("{flag} needs --offload-driver {driver}"),
                None => Ok(()),
            }
        };
        let Some(driver) = self.offload_driver else {
            misplaced(
                "filesystem",
                &[("--offload-directory", self.offload_directory.is_some())],
            )?;
            misplaced("s3", &s3_flags)?;
            return Ok(None);
        };
        let driver = match driver {
            DriverName::Filesystem => {
                misplaced("s3", &s3_flags)?;
                let Some(root) = self.offload_directory.clone() else {
                    bail!("--offload-driver filesystem needs --offload-directory");
                };
                Driver::Filesystem { root }
            }
            DriverName::S3 => {
                misplaced(
                    "filesystem",
                    &[("--offload-directory", self.offload_directory.is_some())],
                )?;
                let Some(bucket) = self.offload_bucket.clone().filter(|b| !b.trim().is_empty())
                else {
                    bail!(
                        "--offload-driver s3 needs --offload-bucket (Pulsar's \
                         s3ManagedLedgerOffloadBucket): the bucket the ledgers go to"
                    );
                };
                if self.offload_region.is_none() && self.offload_service_endpoint.is_none() {
                    bail!(
                        "--offload-driver s3 needs --offload-region (AWS) or \
                         --offload-service-endpoint (an S3-compatible store's URL)"
                    );
                }
                let credentials = S3Credentials::from_environment()
                    .context("--offload-driver s3 needs credentials")?;
                let settings = S3Settings {
                    bucket,
                    region: self.offload_region.clone(),
                    endpoint: self.offload_service_endpoint.clone(),
                    credentials,
                };
                if let Err(message) = settings.validate() {
                    bail!("--offload-driver s3: {message}");
                }
                tracing::info!(
                    bucket = %settings.bucket,
                    region = settings.region.as_deref().unwrap_or(vela_offload::s3::DEFAULT_REGION),
                    endpoint = settings.endpoint.as_deref().unwrap_or("AWS"),
                    credentials = %settings.credentials.source,
                    "S3 offload driver"
                );
                Driver::S3(settings)
            }
        };
        Ok(Some(driver))
    }

    /// `env` with the offloader these flags name, if any.
    pub(crate) fn offloader(&self, env: LogEnv) -> anyhow::Result<LogEnv> {
        let Some(driver) = self.driver()? else {
            return Ok(env);
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

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, Parser)]
    struct Flags {
        #[command(flatten)]
        offload: OffloadArgs,
    }

    fn parse(args: &[&str]) -> Result<OffloadArgs, clap::Error> {
        Flags::try_parse_from(std::iter::once("vela").chain(args.iter().copied()))
            .map(|flags| flags.offload)
    }

    #[test]
    fn pulsars_driver_names_in_any_case() {
        for name in ["s3", "S3", "aws-s3", "AWS-S3", "Aws-S3"] {
            let args = parse(&["--offload-driver", name]).unwrap();
            assert_eq!(args.offload_driver, Some(DriverName::S3), "{name}");
        }
        for name in ["filesystem", "FileSystem"] {
            let args = parse(&["--offload-driver", name]).unwrap();
            assert_eq!(args.offload_driver, Some(DriverName::Filesystem), "{name}");
        }
        let error = parse(&["--offload-driver", "gcs"]).unwrap_err().to_string();
        assert!(
            error.contains("s3") && error.contains("filesystem"),
            "{error}"
        );
    }

    #[test]
    fn pulsars_setting_names_are_aliases() {
        let args = parse(&[
            "--offload-driver",
            "aws-s3",
            "--s3-managed-ledger-offload-bucket",
            "b",
            "--s3-managed-ledger-offload-region",
            "r",
            "--s3-managed-ledger-offload-service-endpoint",
            "http://127.0.0.1:1",
        ])
        .unwrap();
        assert_eq!(args.offload_bucket.as_deref(), Some("b"));
        assert_eq!(args.offload_region.as_deref(), Some("r"));
        assert_eq!(
            args.offload_service_endpoint.as_deref(),
            Some("http://127.0.0.1:1")
        );
    }

    #[test]
    fn a_bad_configuration_names_the_flag() {
        let refusal = |args: &[&str]| parse(args).unwrap().driver().unwrap_err().to_string();
        let text = refusal(&["--offload-driver", "s3", "--offload-region", "r"]);
        assert!(text.contains("--offload-bucket"), "{text}");
        let text = refusal(&["--offload-driver", "S3", "--offload-bucket", "b"]);
        assert!(
            text.contains("--offload-region") && text.contains("--offload-service-endpoint"),
            "{text}"
        );
        let text = refusal(&["--offload-bucket", "b"]);
        assert!(
            text.contains("--offload-bucket needs --offload-driver s3"),
            "{text}"
        );
        let text = refusal(&["--offload-driver", "filesystem", "--offload-bucket", "b"]);
        assert!(
            text.contains("--offload-bucket needs --offload-driver s3"),
            "{text}"
        );
        let text = refusal(&["--offload-driver", "filesystem"]);
        assert!(text.contains("--offload-directory"), "{text}");
        assert!(parse(&[]).unwrap().driver().unwrap().is_none());
    }
}
