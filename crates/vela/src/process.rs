//! Process life cycle shared by the commands: the stop signals and the
//! ready line on stdout.
//!
//! Owns: what counts as a request to stop (SIGINT, SIGTERM) and how "ready"
//! is announced (one flushed line on stdout that scripts and tests parse).

use anyhow::Context;
use tokio::signal::unix::{SignalKind, signal};

/// Listens for SIGINT and SIGTERM from now on.
#[derive(Debug)]
pub(crate) struct StopSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl StopSignals {
    /// Installs the handlers (call before announcing readiness, so a signal
    /// sent right after the ready line is not lost).
    pub(crate) fn install() -> anyhow::Result<StopSignals> {
        Ok(StopSignals {
            interrupt: signal(SignalKind::interrupt())
                .context("cannot install the SIGINT handler")?,
            terminate: signal(SignalKind::terminate())
                .context("cannot install the SIGTERM handler")?,
        })
    }

    /// Resolves at the next SIGINT or SIGTERM, with its name.
    pub(crate) async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "SIGINT",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

/// Prints `line` on stdout and flushes it.
pub(crate) fn announce(line: &str) -> anyhow::Result<()> {
    use std::io::Write;
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{line}").context("cannot write to stdout")?;
    stdout.flush().context("cannot write to stdout")
}
