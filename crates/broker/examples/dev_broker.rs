//! A broker on in-memory metadata and in-memory ledgers, for trying official
//! clients before `vela standalone` exists.
//!
//! Usage: `cargo run -p vela-broker --example dev_broker -- [PORT] [--keepalive-ms N]
//! [--partitioned TOPIC=N]... [--exit-on-stdin-close]`. PORT 0 (the default) picks a free port. Prints
//! `vela-broker listening on pulsar://127.0.0.1:PORT` once ready; stops on
//! Ctrl-C (or when stdin closes, with `--exit-on-stdin-close`).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::AsyncReadExt;
use vela_broker::{Broker, BrokerConfig};

fn usage(message: &str) -> ! {
    eprintln!("dev_broker: {message}");
    eprintln!(
        "usage: dev_broker [PORT] [--keepalive-ms N] [--partitioned TOPIC=N]... [--exit-on-stdin-close]"
    );
    std::process::exit(2);
}

#[tokio::main]
async fn main() {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
    let mut port: u16 = 0;
    let mut keepalive = Duration::from_secs(30);
    let mut partitioned: Vec<(String, u32)> = Vec::new();
    let mut exit_on_stdin_close = false;
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        match arg.as_str() {
            "--keepalive-ms" => {
                let value = args
                    .next()
                    .unwrap_or_else(|| usage("--keepalive-ms needs a value"));
                let ms: u64 = value
                    .parse()
                    .unwrap_or_else(|_| usage("bad --keepalive-ms"));
                keepalive = Duration::from_millis(ms.max(1));
            }
            "--exit-on-stdin-close" => exit_on_stdin_close = true,
            "--partitioned" => {
                let value = args
                    .next()
                    .unwrap_or_else(|| usage("--partitioned needs TOPIC=N"));
                let Some((topic, n)) = value.split_once('=') else {
                    usage("--partitioned needs TOPIC=N")
                };
                let n: u32 = n.parse().unwrap_or_else(|_| usage("bad partition count"));
                partitioned.push((topic.to_string(), n));
            }
            other => port = other.parse().unwrap_or_else(|_| usage("bad port")),
        }
    }
    let mut config = BrokerConfig::new(SocketAddr::from(([127, 0, 0, 1], port)));
    config.keepalive = keepalive;
    let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
    let broker = match Broker::start(config, meta, vela_log::LogEnv::in_memory()).await {
        Ok(broker) => broker,
        Err(e) => {
            eprintln!("dev_broker: {e}");
            std::process::exit(1);
        }
    };
    for (topic, n) in partitioned {
        if let Err(e) = broker.create_partitioned_topic(&topic, n).await {
            eprintln!("dev_broker: partitioned topic {topic}: {e}");
            std::process::exit(1);
        }
    }
    println!("vela-broker listening on {}", broker.service_url());
    let stdin_closed = async {
        if !exit_on_stdin_close {
            std::future::pending::<()>().await;
        }
        let mut stdin = tokio::io::stdin();
        let mut buf = [0u8; 64];
        loop {
            match stdin.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    };
    tokio::select! {
        _ = tokio::signal::ctrl_c() => {}
        _ = stdin_closed => {}
    }
    if let Err(e) = broker.shutdown().await {
        eprintln!("dev_broker: shutdown: {e}");
    }
}
