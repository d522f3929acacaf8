//! `vela perf disk`: the disk's own durable-write latency, the floor under
//! every durable publish: pwrite of one 4 KiB-aligned block (holding
//! `--size` bytes, as the journal writes a lone entry) into a preallocated,
//! zero-filled file, then fdatasync, at depth 1.
//!
//! Owns: its scratch file (created in `--dir`, removed afterwards). Never:
//! touches other files in the directory.

use std::fs::OpenOptions;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;

use super::stats::Recorder;

/// Alignment of the journal's writes (and of this test's).
const BLOCK_BYTES: usize = 4096;
/// Size of the scratch file: written round-robin, never extended (an
/// extending write would make fdatasync commit metadata too).
const FILE_BYTES: u64 = 64 << 20;

/// Flags of `vela perf disk`.
#[derive(Debug, Args)]
pub(crate) struct DiskArgs {
    /// Directory to measure (e.g. the journal's).
    #[arg(long, value_name = "DIR")]
    dir: PathBuf,
    /// Bytes of data per write (padded to 4 KiB blocks).
    #[arg(short = 's', long = "size", default_value_t = 1024)]
    size: usize,
    /// Seconds to measure.
    #[arg(long = "test-duration", visible_alias = "time", default_value_t = 5)]
    test_duration: u64,
    /// Print the summary as one JSON object on stdout.
    #[arg(long)]
    json: bool,
}

pub(crate) fn run(args: DiskArgs) -> anyhow::Result<()> {
    let duration = Duration::from_secs(args.test_duration.max(1));
    let summary = measure(&args.dir, args.size, duration)?;
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    } else {
        println!("{}", summary.text());
    }
    Ok(())
}

/// Depth-1 writes of `size` bytes (in 4 KiB blocks) + fdatasync for
/// `duration`, in a scratch file in `dir` that is removed afterwards. Also
/// what `vela doctor` measures.
pub(crate) fn measure(
    dir: &std::path::Path,
    size: usize,
    duration: Duration,
) -> anyhow::Result<super::stats::Summary> {
    let path = dir.join(format!(".vela-perf-disk-{}", std::process::id()));
    let result = measure_in(&path, size, duration);
    let _ = std::fs::remove_file(&path);
    result
}

fn measure_in(
    path: &std::path::Path,
    size: usize,
    duration: Duration,
) -> anyhow::Result<super::stats::Summary> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .create_new(true)
        .open(path)
        .with_context(|| format!("cannot create {} (--dir)", path.display()))?;
    // Zero-fill and sync once: later writes overwrite allocated blocks.
    let zeros = vec![0u8; 1 << 20];
    let mut offset = 0u64;
    while offset < FILE_BYTES {
        file.write_all_at(&zeros, offset)
            .with_context(|| format!("cannot write {}", path.display()))?;
        offset += zeros.len() as u64;
    }
    file.sync_all()
        .with_context(|| format!("cannot sync {}", path.display()))?;
    let blocks = size.div_ceil(BLOCK_BYTES).max(1);
    let mut block = vec![0u8; blocks * BLOCK_BYTES];
    for (i, byte) in block.iter_mut().enumerate().take(size) {
        *byte = (i % 251) as u8 + 1;
    }
    let recorder = Recorder::new();
    let started = Instant::now();
    let mut offset = 0u64;
    while started.elapsed() < duration {
        if offset + block.len() as u64 > FILE_BYTES {
            offset = 0;
        }
        let write_started = Instant::now();
        file.write_all_at(&block, offset)
            .with_context(|| format!("cannot write {}", path.display()))?;
        file.sync_data()
            .with_context(|| format!("fdatasync of {} failed", path.display()))?;
        recorder.record(write_started.elapsed(), size);
        offset += block.len() as u64;
    }
    Ok(recorder.summary("disk", started.elapsed()))
}
