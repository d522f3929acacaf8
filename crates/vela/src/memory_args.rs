//! The broker's memory budgets as flags, shared by `vela standalone` and
//! `vela broker`: the entry cache over every topic
//! (`--managed-ledger-cache-size-mb`, Pulsar's managedLedgerCacheSizeMB) and
//! the bytes of publishes in flight over every topic
//! (`--max-message-publish-buffer-mb`, Pulsar's
//! maxMessagePublishBufferSizeInMB).
//!
//! Owns: the flag names, their defaults (sized from the machine's memory:
//! `MachineMemory`), and building the `EntryCache` and `AppendBudget` the
//! broker's logs share.
//! Never: sizes a budget per topic (a broker serves up to 100,000 topics:
//! only a broker-wide budget is a bound).

use clap::Args;
use vela_log::{AppendBudget, EntryCache, LogEnv};

const MIB: u64 = 1024 * 1024;

/// Default entry cache: 1/16 of the machine's memory, at most 256 MiB. The
/// cache serves readers at the tail (and read-ahead); 256 MiB is about 5 s
/// of 50 MB/s of publishing, far more than a tail reader lags, and 1/16
/// leaves room on a small machine for the other budgets of a standalone
/// (the bookie's 256 MiB write cache, its read and index caches, the publish
/// buffer). Pulsar's default is 1/5 of the JVM's direct memory.
const CACHE_DEFAULT_BYTES_MAX: u64 = 256 * MIB;
const CACHE_DEFAULT_MEMORY_DIVISOR: u64 = 16;

/// Default publish buffer: 1/16 of memory, at most 256 MiB: about 5 s of
/// 50 MB/s in flight, far more than the durable-publish latency (ms) needs
/// to keep producers busy; past it connections stop being read. Pulsar's
/// default is 1/2 of the JVM's direct memory.
const PUBLISH_BUFFER_DEFAULT_BYTES_MAX: u64 = 256 * MIB;
const PUBLISH_BUFFER_DEFAULT_MEMORY_DIVISOR: u64 = 16;

/// Used when the machine's memory cannot be read: a small machine.
const MEMORY_FALLBACK_BYTES: u64 = 1024 * MIB;

/// Largest value of either flag: 1 TiB is past any machine this runs on.
const BUDGET_CEILING_MB: u64 = 1024 * 1024;

/// Memory budgets of the broker.
#[derive(Debug, Args)]
pub(crate) struct MemoryArgs {
    /// MiB of entries cached over all topics, for readers at the tail (and
    /// read-ahead). When full, the entries every active reader has passed
    /// go first, then the oldest; readers that miss read from the bookies.
    /// 0 turns the cache off. Default: 1/16 of the machine's memory, at
    /// most 256 MiB.
    #[arg(long, value_parser = clap::value_parser!(u64).range(0..=BUDGET_CEILING_MB))]
    managed_ledger_cache_size_mb: Option<u64>,
    /// MiB of published entries in flight (received, not yet durable) over
    /// all topics. When full, the broker stops reading from producers'
    /// connections until earlier publishes complete: producers slow down,
    /// nothing is refused. Default: 1/16 of the machine's memory, at most
    /// 256 MiB.
    #[arg(long, value_parser = clap::value_parser!(u64).range(1..=BUDGET_CEILING_MB))]
    max_message_publish_buffer_mb: Option<u64>,
}

impl MemoryArgs {
    /// The entry cache's budget in bytes.
    pub(crate) fn cache_bytes(&self) -> u64 {
        self.managed_ledger_cache_size_mb.map_or_else(
            || (machine_memory_bytes() / CACHE_DEFAULT_MEMORY_DIVISOR).min(CACHE_DEFAULT_BYTES_MAX),
            |mb| mb * MIB,
        )
    }

    /// The publish buffer's budget in bytes.
    pub(crate) fn publish_buffer_bytes(&self) -> u64 {
        self.max_message_publish_buffer_mb.map_or_else(
            || {
                (machine_memory_bytes() / PUBLISH_BUFFER_DEFAULT_MEMORY_DIVISOR)
                    .min(PUBLISH_BUFFER_DEFAULT_BYTES_MAX)
            },
            |mb| mb * MIB,
        )
    }

    /// `env` with the broker-wide cache and publish budget of these flags.
    pub(crate) fn apply(&self, env: LogEnv) -> LogEnv {
        let (cache, publish) = (self.cache_bytes(), self.publish_buffer_bytes());
        tracing::info!(
            cache_mib = cache / MIB,
            publish_buffer_mib = publish / MIB,
            "broker memory budgets"
        );
        env.with_memory(EntryCache::new(cache), AppendBudget::new(publish))
    }
}

/// The memory this process may use: the machine's (`MemTotal`), or its
/// cgroup's limit when lower (a container).
fn machine_memory_bytes() -> u64 {
    let total = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|text| parse_mem_total_bytes(&text));
    let cgroup = std::fs::read_to_string("/sys/fs/cgroup/memory.max")
        .ok()
        .and_then(|text| text.trim().parse::<u64>().ok());
    match (total, cgroup) {
        (Some(total), Some(limit)) => total.min(limit),
        (Some(total), None) => total,
        (None, Some(limit)) => limit,
        (None, None) => MEMORY_FALLBACK_BYTES,
    }
}

/// `MemTotal:       24683596 kB` → bytes.
fn parse_mem_total_bytes(meminfo: &str) -> Option<u64> {
    let line = meminfo.lines().find(|l| l.starts_with("MemTotal:"))?;
    let kib: u64 = line.split_whitespace().nth(1)?.parse().ok()?;
    kib.checked_mul(1024)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mem_total_is_read_in_bytes() {
        let text = "MemTotal:       24683596 kB\nMemFree:  1 kB\n";
        assert_eq!(parse_mem_total_bytes(text), Some(24683596 * 1024));
        assert_eq!(parse_mem_total_bytes("nothing"), None);
    }

    #[test]
    fn defaults_are_bounded_and_flags_win() {
        let defaults = MemoryArgs {
            managed_ledger_cache_size_mb: None,
            max_message_publish_buffer_mb: None,
        };
        assert!(defaults.cache_bytes() <= CACHE_DEFAULT_BYTES_MAX);
        assert!(defaults.cache_bytes() > 0);
        assert!(defaults.publish_buffer_bytes() <= PUBLISH_BUFFER_DEFAULT_BYTES_MAX);
        let set = MemoryArgs {
            managed_ledger_cache_size_mb: Some(0),
            max_message_publish_buffer_mb: Some(3),
        };
        assert_eq!(set.cache_bytes(), 0);
        assert_eq!(set.publish_buffer_bytes(), 3 * MIB);
    }
}
