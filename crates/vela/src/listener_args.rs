//! Advertised listeners of `vela standalone` and `vela broker` (Pulsar's
//! `advertisedListeners` and `internalListenerName`).
//!
//! Owns: the two flags and copying them into `BrokerConfig` (the value is
//! checked by `vela_broker::listeners`, with Pulsar's messages).

use anyhow::Context;
use clap::Args;
use vela_broker::BrokerConfig;
use vela_broker::listeners::parse_advertised_listeners;

/// Advertised listeners.
#[derive(Debug, Args)]
pub(crate) struct ListenerArgs {
    /// Other addresses of this broker, by name, for clients that reach it
    /// another way (another network, a NAT): `name:pulsar://host:port`,
    /// `name:pulsar+ssl://host:port` (at most one of each per name), comma
    /// separated. A lookup naming a listener (the clients' listenerName)
    /// is answered with its URLs; an unknown name is refused as Pulsar
    /// refuses it. The internal listener's URLs are the broker's own.
    #[arg(long, value_name = "LISTENERS")]
    advertised_listeners: Option<String>,
    /// The listener whose URLs this broker publishes as its own (to
    /// clients naming none and to the other brokers). Default: the first
    /// of --advertised-listeners.
    #[arg(long, value_name = "NAME", requires = "advertised_listeners")]
    internal_listener_name: Option<String>,
}

impl ListenerArgs {
    /// Copies the listeners into the broker's configuration.
    pub(crate) fn apply(&self, config: &mut BrokerConfig) -> anyhow::Result<()> {
        let Some(text) = &self.advertised_listeners else {
            return Ok(());
        };
        config.advertised_listeners =
            parse_advertised_listeners(text, self.internal_listener_name.as_deref())
                .context("--advertised-listeners")?;
        Ok(())
    }
}
