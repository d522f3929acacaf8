//! The `vela` binary: command line, configuration and the wiring of the crates
//! into processes (`standalone`, `bookie`, `broker`, `admin`, `perf`), and
//! `doctor`, the check of a bookie host's journal media and kernel settings.
//!
//! Owns: argument parsing, logging setup, exit codes. Never: protocol or storage
//! logic (that lives in the crates); a bad flag or config value is reported
//! naming the field, and the process exits with status 2.

mod admin_cmd;
mod allocator;
mod bookie_cmd;
mod bookie_tls_args;
mod broker_args;
mod broker_cmd;
mod doctor;
mod ledgers_cmd;
mod limit_args;
mod listener_args;
mod memory_args;
mod offload_args;
mod perf;
mod persistence_args;
mod process;
mod registration;
mod replication_args;
mod security_args;
mod standalone;
mod storage_args;
mod token_keys;
mod topic_args;
mod transaction_args;
mod write_path_source;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "vela",
    version,
    about = "A durable, replicated, Pulsar-compatible message broker"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Administer a broker over its HTTP API (pulsar-admin's commands), and
    /// show the write-path latency breakdown.
    Admin(admin_cmd::AdminArgs),
    /// Run a storage node (journal + ledger storage) serving the bookie protocol.
    Bookie(bookie_cmd::BookieArgs),
    /// Run a broker of a cluster: Pulsar protocol and HTTP admin, bundles
    /// owned through the metadata store, ledgers on registered bookies.
    Broker(broker_cmd::BrokerArgs),
    /// Run everything on one machine: embedded metadata, N bookies and a broker
    /// in one process, listening on 127.0.0.1.
    Standalone(standalone::StandaloneArgs),
    /// Ledger tools: list, verify every copy of every entry.
    Ledgers(ledgers_cmd::LedgersArgs),
    /// Load generators (pulsar-perf's flags): produce, consume, disk.
    Perf(perf::PerfArgs),
    /// Check a bookie host before trusting it with a journal: fdatasync
    /// latency, O_DIRECT, mounts and devices of the journal and ledger
    /// directories, kernel write-back and CPU settings; findings with the
    /// fix. Exits 1 when a rule fails.
    Doctor(doctor::DoctorArgs),
}

#[global_allocator]
static GLOBAL: allocator::VelaAllocator = allocator::VelaAllocator;

fn main() {
    let cli = Cli::parse();
    init_logging();
    let result = match cli.command {
        Command::Admin(args) => admin_cmd::run(args),
        Command::Bookie(args) => bookie_cmd::run(args),
        Command::Broker(args) => broker_cmd::run(args),
        Command::Standalone(args) => standalone::run(args),
        Command::Perf(args) => perf::run(args),
        Command::Ledgers(args) => ledgers_cmd::run(args),
        Command::Doctor(args) => doctor::run(args),
    };
    if let Err(error) = result {
        eprintln!("vela: {}", error_report(&error));
        std::process::exit(1);
    }
}

/// The error and its causes on one line, as `{:#}` prints them, but leaving
/// out a cause whose text the previous one already quotes (an error type that
/// puts its source in its own message and also returns it as `source()`).
fn error_report(error: &anyhow::Error) -> String {
    let mut report = String::new();
    let mut previous = String::new();
    for cause in error.chain() {
        let text = cause.to_string();
        if !previous.contains(&text) {
            if !report.is_empty() {
                report.push_str(": ");
            }
            report.push_str(&text);
        }
        previous = text;
    }
    report
}

fn init_logging() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("VELA_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
}

#[cfg(test)]
mod tests {
    use super::error_report;

    #[derive(Debug, thiserror::Error)]
    #[error("disk says no")]
    struct Io;

    #[derive(Debug, thiserror::Error)]
    enum Open {
        #[error("journal: {0}")]
        Journal(#[from] Io),
    }

    #[test]
    fn a_cause_the_message_already_quotes_is_printed_once() {
        let error = anyhow::Error::new(Open::from(Io)).context("cannot open bookie 0");
        assert_eq!(
            error_report(&error),
            "cannot open bookie 0: journal: disk says no"
        );
        let plain = anyhow::Error::new(Io).context("cannot open bookie 0");
        assert_eq!(error_report(&plain), "cannot open bookie 0: disk says no");
    }
}
