//! `vela bookie`: filled in by issue 10.

use clap::Args;

/// Flags of `vela bookie`.
#[derive(Debug, Args)]
pub(crate) struct BookieArgs {}

pub(crate) fn run(_args: BookieArgs) -> anyhow::Result<()> {
    anyhow::bail!("vela bookie: not implemented yet")
}
