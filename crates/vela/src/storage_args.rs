//! Bookie storage flags shared by `vela bookie` and `vela standalone`: the
//! journal's durability, backend (files, or a ring on persistent memory) and
//! group commit, cache sizes, flush and gc periods, and the disk usage
//! thresholds of the read-only mode.
//!
//! Owns: the flag names, their ranges (clap rejects a bad value naming the
//! flag) and turning them into a `BookieConfig`'s journal and storage parts.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, ValueEnum};
use vela_bookie::bookie::BookieConfig;
use vela_bookie::disk::DiskThresholds;
use vela_bookie::journal::{
    JournalBackendKind, JournalSync, PMEM_ALIGNMENT_BYTES, PMEM_REGION_BYTES_DEFAULT, PmemConfig,
    PmemEmulation,
};

/// Journal and ledger-storage tuning of a bookie.
#[derive(Debug, Clone, Args)]
pub(crate) struct StorageArgs {
    /// When an ADD is acknowledged: after fdatasync (survives power loss), or
    /// `off`: after the write only (survives a crash of the bookie, not of the
    /// machine).
    #[arg(long, value_enum, default_value_t = SyncArg::Fdatasync)]
    journal_sync: SyncArg,
    /// Journal backend: O_DIRECT where the filesystem takes it (auto), page
    /// cache (buffered), O_DIRECT or fail (direct), or a ring in a
    /// memory-mapped region on persistent memory (pmem: cache-line flushes
    /// instead of fdatasync; needs --journal-pmem-path on a DAX filesystem).
    #[arg(long, value_enum, default_value_t = BackendArg::Auto)]
    journal_backend: BackendArg,
    /// Directory on a DAX filesystem (persistent memory mounted with -o dax)
    /// for the pmem journal's region file (`journal.pmem`; standalone: one
    /// per bookie, in bookie-N/ under it). With --journal-backend pmem only.
    #[arg(long, value_name = "DIR", required_if_eq("journal_backend", "pmem"))]
    journal_pmem_path: Option<PathBuf>,
    /// Size of the pmem journal's region in MiB, created (zero-filled) at the
    /// first start; an existing region must have this size. Ledger storage
    /// is asked to checkpoint once half of it holds records.
    #[arg(long, default_value_t = PMEM_REGION_BYTES_DEFAULT >> 20,
          value_parser = clap::value_parser!(u64).range(64..=4_194_304))]
    journal_pmem_size_mb: u64,
    /// Start the pmem journal even where MAP_SYNC is refused (not a DAX
    /// filesystem: tmpfs, ext4 without dax): each group is then msync'ed,
    /// which is NOT persistent-memory durability (on tmpfs nothing survives a
    /// reboot). For tests and benchmarks; logged at warn.
    #[arg(long)]
    journal_pmem_allow_emulation: bool,
    /// Longest time a journal group waits for more records, in microseconds
    /// (groups are written at once when the queue is empty).
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(0..=1_000_000))]
    journal_group_wait_us: u64,
    /// Adds queued for the journal at most; past it ADDs get TOO_MANY_REQUESTS.
    #[arg(long, default_value_t = vela_bookie::journal::JOURNAL_QUEUE_DEPTH_MAX as u64,
          value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    journal_queue_depth: u64,
    /// Write cache budget in MiB (both halves); a flush starts at a quarter of it.
    /// At least 11 (two maximal entries). When it is full, an add waits (up to
    /// 500 ms, in arrival order) for a flush to free room before it is refused
    /// with TOO_MANY_REQUESTS: the same in standalone and over TCP.
    #[arg(long, default_value_t = 256, value_parser = clap::value_parser!(u64).range(11..=1_048_576))]
    write_cache_mb: u64,
    /// Read cache budget in MiB.
    #[arg(long, default_value_t = 64, value_parser = clap::value_parser!(u64).range(1..=1_048_576))]
    read_cache_mb: u64,
    /// Entry-log reads at the disk at once (reads from the read cache do not
    /// count). Catch-up readers queue large sequential reads; more of them in
    /// flight buys little throughput on one disk and delays the journal's
    /// writes and fdatasyncs behind them (producer latency during a drain).
    #[arg(long, default_value_t = vela_bookie::storage::LOG_READS_IN_FLIGHT_DEFAULT,
          value_parser = clap::value_parser!(u64).range(1..=1024))]
    log_reads_in_flight: u64,
    /// Checkpoint (flush the write cache to entry logs) at least this often, ms.
    #[arg(long, default_value_t = 10_000, value_parser = clap::value_parser!(u64).range(1..=3_600_000))]
    flush_interval_ms: u64,
    /// Run storage garbage collection this often, seconds.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u64).range(1..=86_400))]
    gc_interval_s: u64,
    /// Live bytes storage GC's compaction copies per second at most, MiB/s
    /// (0: no limit). Compaction's reads and writes share the disk with the
    /// journal; at this pace a pass's 256 MiB take 8 s.
    #[arg(long, default_value_t = 32, value_parser = clap::value_parser!(u64).range(0..=1_048_576))]
    compaction_rate_mb_s: u64,
    /// Entry-log bytes storage GC deletes per second at most, MiB/s (0: no
    /// limit).
    #[arg(long, default_value_t = 1024, value_parser = clap::value_parser!(u64).range(0..=1_048_576))]
    gc_delete_rate_mb_s: u64,
    /// Storage GC cuts a deleted entry log down in steps of this many MiB,
    /// each synced, before its unlink (0: unlinked at once), so the blocks it
    /// frees (and their discards, on a filesystem mounted with `discard`)
    /// reach the disk in pieces the journal's fdatasync does not wait behind.
    #[arg(long, default_value_t = 16, value_parser = clap::value_parser!(u64).range(0..=1_048_576))]
    gc_delete_step_mb: u64,
    /// Disk usage (percent of the filesystem of the journal or ledger
    /// directory) at which the bookie turns read-only: new adds are refused
    /// (producers get errors, or writers move to other bookies) while reads
    /// go on. BookKeeper's diskUsageThreshold.
    #[arg(long, default_value_t = 95.0, value_parser = parse_percent)]
    disk_usage_max_percent: f64,
    /// Disk usage below which a read-only bookie takes adds again (and one
    /// whose disk writes failed reopens its journal and storage). At most
    /// --disk-usage-max-percent. BookKeeper's diskUsageLwmThreshold.
    #[arg(long, default_value_t = 90.0, value_parser = parse_percent)]
    disk_usage_lwm_percent: f64,
    /// How often disk usage is checked, ms.
    #[arg(long, default_value_t = 1000, value_parser = clap::value_parser!(u64).range(10..=3_600_000))]
    disk_check_interval_ms: u64,
}

/// A percentage in (0, 100].
fn parse_percent(value: &str) -> Result<f64, String> {
    let percent: f64 = value
        .parse()
        .map_err(|_| format!("`{value}` is not a number"))?;
    if percent > 0.0 && percent <= 100.0 {
        Ok(percent)
    } else {
        Err(format!("{percent} is not a percentage in (0, 100]"))
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum SyncArg {
    Fdatasync,
    Off,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
enum BackendArg {
    Auto,
    Buffered,
    Direct,
    Pmem,
}

impl StorageArgs {
    /// Applies the flags to `config` (whose directories are already set).
    /// Fails, naming the flags, if the low-water mark is above the max.
    pub(crate) fn apply(&self, config: &mut BookieConfig) -> anyhow::Result<()> {
        if self.disk_usage_lwm_percent > self.disk_usage_max_percent {
            anyhow::bail!(
                "--disk-usage-lwm-percent {} must be at most --disk-usage-max-percent {}",
                self.disk_usage_lwm_percent,
                self.disk_usage_max_percent
            );
        }
        config.journal.sync = match self.journal_sync {
            SyncArg::Fdatasync => JournalSync::Fdatasync,
            SyncArg::Off => JournalSync::Off,
        };
        config.journal.backend = match self.journal_backend {
            BackendArg::Auto => JournalBackendKind::Auto,
            BackendArg::Buffered => JournalBackendKind::Buffered,
            BackendArg::Direct => JournalBackendKind::Direct,
            BackendArg::Pmem => JournalBackendKind::Pmem,
        };
        match (self.journal_backend, &self.journal_pmem_path) {
            (BackendArg::Pmem, Some(dir)) => {
                config.journal.alignment_bytes = PMEM_ALIGNMENT_BYTES;
                config.journal.pmem = Some(PmemConfig {
                    dir: dir.clone(),
                    region_bytes: self.journal_pmem_size_mb << 20,
                    emulation: if self.journal_pmem_allow_emulation {
                        PmemEmulation::Allow
                    } else {
                        PmemEmulation::Refuse
                    },
                });
            }
            // clap requires the path with the backend.
            (BackendArg::Pmem, None) => {
                anyhow::bail!("--journal-backend pmem needs --journal-pmem-path")
            }
            (_, Some(_)) => anyhow::bail!(
                "--journal-pmem-path is for --journal-backend pmem (the journal backend is {:?})",
                self.journal_backend
            ),
            (_, None) if self.journal_pmem_allow_emulation => {
                anyhow::bail!("--journal-pmem-allow-emulation is for --journal-backend pmem")
            }
            (_, None) => {}
        }
        config.journal.group_wait_max = Duration::from_micros(self.journal_group_wait_us);
        // Range-checked by clap (1..=1_048_576): fits usize.
        config.journal.queue_depth_max = self.journal_queue_depth as usize;
        config.storage.write_cache_bytes_max = self.write_cache_mb << 20;
        config.storage.flush_threshold_bytes = config.storage.write_cache_bytes_max / 4;
        config.storage.read_cache_bytes_max = self.read_cache_mb << 20;
        // Range-checked by clap (1..=1024): fits usize.
        config.storage.log_reads_in_flight_max = self.log_reads_in_flight as usize;
        config.storage.read_ahead_bytes_max = config
            .storage
            .read_ahead_bytes_max
            .min(config.storage.read_cache_bytes_max);
        config.storage.flush_interval = Duration::from_millis(self.flush_interval_ms);
        config.gc_interval = Duration::from_secs(self.gc_interval_s);
        config.storage.compaction_bytes_per_s = self.compaction_rate_mb_s << 20;
        config.storage.log_delete_bytes_per_s = self.gc_delete_rate_mb_s << 20;
        config.storage.log_delete_step_bytes = self.gc_delete_step_mb << 20;
        config.disk = DiskThresholds {
            usage_max: self.disk_usage_max_percent / 100.0,
            usage_lwm: self.disk_usage_lwm_percent / 100.0,
            check_interval: Duration::from_millis(self.disk_check_interval_ms),
        };
        Ok(())
    }
}
