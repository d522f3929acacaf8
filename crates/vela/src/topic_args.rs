//! Flags shaping how brokers keep topics (ledger rollover, how often
//! namespace policies are enforced), shared by `vela standalone` and
//! `vela broker`.

use std::time::Duration;

use anyhow::bail;
use clap::Args;
use vela_broker::BrokerConfig;

/// Topic storage and policy-enforcement flags.
#[derive(Debug, Args)]
pub(crate) struct TopicArgs {
    /// A topic's ledger is full after this many entries (Pulsar's
    /// managedLedgerMaxEntriesPerLedger). Consumed data is freed a whole
    /// ledger at a time, so smaller ledgers free space sooner.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    ledger_max_entries: u64,
    /// A topic's ledger is full after this many MiB (Pulsar's
    /// managedLedgerMaxSizePerLedgerMbytes).
    #[arg(long, default_value_t = 2048, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    ledger_max_size_mb: u64,
    /// A full ledger rolls over only once this old, min (Pulsar's
    /// managedLedgerMinLedgerRolloverTimeMinutes; 0: at once). A topic
    /// without subscriptions also keeps a closed ledger this long, so
    /// readers always find the data of the last N minutes.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(0..=525_600))]
    ledger_min_rollover_minutes: u64,
    /// A ledger this old is full, min (Pulsar's
    /// managedLedgerMaxLedgerRolloverTimeMinutes).
    #[arg(long, default_value_t = 240, value_parser = clap::value_parser!(u64).range(1..=525_600))]
    ledger_max_rollover_minutes: u64,
    /// Seconds between two passes applying message TTL, backlog quotas and
    /// retention to the topics served.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    policy_check_interval_s: u64,
}

impl TopicArgs {
    /// Checks the flags and copies them into the broker's configuration.
    pub(crate) fn apply(&self, config: &mut BrokerConfig) -> anyhow::Result<()> {
        if self.ledger_min_rollover_minutes > self.ledger_max_rollover_minutes {
            bail!(
                "--ledger-min-rollover-minutes ({}) is above --ledger-max-rollover-minutes ({})",
                self.ledger_min_rollover_minutes,
                self.ledger_max_rollover_minutes
            );
        }
        config.ledger_entries_max = self.ledger_max_entries;
        config.ledger_bytes_max = self.ledger_max_size_mb << 20;
        config.ledger_rollover_min = Duration::from_secs(self.ledger_min_rollover_minutes * 60);
        config.ledger_rollover_max = Duration::from_secs(self.ledger_max_rollover_minutes * 60);
        config.policy_check_interval = Duration::from_secs(self.policy_check_interval_s);
        Ok(())
    }
}
