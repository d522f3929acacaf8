//! Flags shaping how brokers keep topics (ledger rollover, how often
//! namespace policies are enforced), shared by `vela standalone` and
//! `vela broker`.

use std::time::Duration;

use clap::Args;
use vela_broker::BrokerConfig;

/// Topic storage and policy-enforcement flags.
#[derive(Debug, Args)]
pub(crate) struct TopicArgs {
    /// A topic's ledger rolls over after this many entries (Pulsar's
    /// managedLedgerMaxEntriesPerLedger). Consumed data is freed a whole
    /// ledger at a time, so smaller ledgers free space sooner.
    #[arg(long, default_value_t = 50_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    ledger_max_entries: u64,
    /// Seconds between two passes applying message TTL, backlog quotas and
    /// retention to the topics served.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    policy_check_interval_s: u64,
}

impl TopicArgs {
    /// Copies the flags into the broker's configuration.
    pub(crate) fn apply(&self, config: &mut BrokerConfig) {
        config.ledger_entries_max = self.ledger_max_entries;
        config.policy_check_interval = Duration::from_secs(self.policy_check_interval_s);
    }
}
