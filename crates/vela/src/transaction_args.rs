//! Transaction coordinator flags (Pulsar's `transactionCoordinatorEnabled`
//! and the coordinator's bounds), shared by `vela standalone` and
//! `vela broker`.

use std::time::Duration;

use clap::Args;
use vela_broker::{BrokerConfig, TransactionConfig};

/// Transaction flags.
#[derive(Debug, Args)]
pub(crate) struct TransactionArgs {
    /// Runs transaction coordinators (off by default, as Pulsar): clients
    /// with transactions enabled find them through
    /// persistent://pulsar/system/transaction_coordinator_assign.
    #[arg(long)]
    transaction_coordinator_enabled: bool,
    /// Coordinators (partitions of transaction_coordinator_assign) when the
    /// topic is created; an existing topic keeps its partitions.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    transaction_coordinators: u32,
    /// Open transactions per coordinator; past it NEW_TXN is not answered
    /// (Pulsar's maxActiveTransactionsPerCoordinator behaviour).
    #[arg(long, default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..=10_000_000))]
    max_open_transactions_per_coordinator: u64,
    /// Partitions plus subscriptions one transaction may register.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=1_000_000))]
    max_operations_per_transaction: u64,
    /// Longest transaction timeout a client may ask for, in seconds.
    #[arg(long, default_value_t = 86_400, value_parser = clap::value_parser!(u64).range(1..=31_536_000))]
    max_transaction_timeout_s: u64,
    /// Transaction state records the broker holds in memory at most, over
    /// every topic and subscription: open and aborted transactions of each
    /// topic's transaction buffer plus positions held by transactional
    /// acks (~100 bytes each). Past it a SEND opening a transaction on a
    /// topic, or a transactional ACK, gets NotAllowedError.
    #[arg(long, default_value_t = 1_000_000, value_parser = clap::value_parser!(u64).range(1..=100_000_000))]
    transaction_state_entries_max: u64,
}

impl TransactionArgs {
    /// Copies the flags into the broker's configuration. (Brokers reach each
    /// other with the `--broker-client-*` flags, `ReplicationArgs`.)
    pub(crate) fn apply(&self, config: &mut BrokerConfig) -> anyhow::Result<()> {
        if !self.transaction_coordinator_enabled {
            config.transactions = None;
            return Ok(());
        }
        config.transactions = Some(TransactionConfig {
            coordinators: self.transaction_coordinators,
            open_per_coordinator_max: usize::try_from(self.max_open_transactions_per_coordinator)
                .unwrap_or(usize::MAX),
            ops_per_transaction_max: usize::try_from(self.max_operations_per_transaction)
                .unwrap_or(usize::MAX),
            timeout_max: Duration::from_secs(self.max_transaction_timeout_s),
            state_entries_max: usize::try_from(self.transaction_state_entries_max)
                .unwrap_or(usize::MAX),
            ..TransactionConfig::default()
        });
        Ok(())
    }
}
