//! Default replication flags shared by `vela standalone` and `vela broker`:
//! the (E, Qw, Qa) of new ledgers when a namespace sets none.
//!
//! Owns: the flag names and the checks `1 <= Qa <= Qw <= E <= bookies`,
//! reported naming the flag.

use clap::Args;
use vela_broker::PersistenceConfig;

/// `--ensemble-size`, `--write-quorum`, `--ack-quorum`.
#[derive(Debug, Clone, Args)]
pub(crate) struct PersistenceArgs {
    /// Ensemble size (E) of new ledgers when a namespace sets none.
    #[arg(long, value_name = "E")]
    ensemble_size: Option<u8>,
    /// Write quorum (Qw): copies of each entry. Default: the ensemble size.
    #[arg(long, value_name = "QW")]
    write_quorum: Option<u8>,
    /// Ack quorum (Qa): copies fdatasync'ed before a publish is acknowledged.
    /// Default: the write quorum.
    #[arg(long, value_name = "QA")]
    ack_quorum: Option<u8>,
}

impl PersistenceArgs {
    /// The persistence, with `default_ensemble` when `--ensemble-size` is not
    /// given; `bookies_max`, when known, bounds the ensemble.
    pub(crate) fn resolve(
        &self,
        default_ensemble: u8,
        bookies_max: Option<u8>,
    ) -> anyhow::Result<PersistenceConfig> {
        let ensemble = self.ensemble_size.unwrap_or(default_ensemble);
        let write_quorum = self.write_quorum.unwrap_or(ensemble);
        let ack_quorum = self.ack_quorum.unwrap_or(write_quorum);
        if ensemble == 0 {
            anyhow::bail!("--ensemble-size must be at least 1");
        }
        if let Some(bookies) = bookies_max
            && ensemble > bookies
        {
            anyhow::bail!("--ensemble-size {ensemble} must be between 1 and --bookies ({bookies})");
        }
        if write_quorum == 0 || write_quorum > ensemble {
            anyhow::bail!(
                "--write-quorum {write_quorum} must be between 1 and the ensemble size ({ensemble})"
            );
        }
        if ack_quorum == 0 || ack_quorum > write_quorum {
            anyhow::bail!(
                "--ack-quorum {ack_quorum} must be between 1 and the write quorum ({write_quorum})"
            );
        }
        Ok(PersistenceConfig {
            ensemble,
            write_quorum,
            ack_quorum,
        })
    }
}
