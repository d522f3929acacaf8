//! Real in-process bookies (`vela_bookie::server` on 127.0.0.1, port 0, temp
//! dirs) registered in an in-memory metadata store.
#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

use std::net::SocketAddr;
use std::sync::Arc;

use vela_bookie::bookie::{Bookie, BookieConfig};
use vela_bookie::server::Server;
use vela_ledger::BookieId;

pub struct RealBookie {
    pub id: BookieId,
    pub addr: SocketAddr,
    pub dirs: Arc<tempfile::TempDir>,
    bookie: Arc<Bookie>,
    shutdown: tokio::sync::oneshot::Sender<()>,
    served: tokio::task::JoinHandle<()>,
}

pub fn bookie_config(journal_dir: &std::path::Path, ledger_dir: &std::path::Path) -> BookieConfig {
    let mut config = BookieConfig::new(journal_dir, ledger_dir);
    // Small files keep preallocation cheap in tests.
    config.journal.prealloc_chunk_bytes = 1 << 20;
    config.journal.file_bytes_max = 64 << 20;
    config
}

impl RealBookie {
    pub async fn start(id: &str) -> RealBookie {
        let dirs = Arc::new(tempfile::tempdir().unwrap());
        RealBookie::start_in(id, dirs).await
    }

    pub async fn start_in(id: &str, dirs: Arc<tempfile::TempDir>) -> RealBookie {
        let config = bookie_config(&dirs.path().join("journal"), &dirs.path().join("ledgers"));
        let bookie = tokio::task::spawn_blocking(move || Bookie::open(config))
            .await
            .unwrap()
            .unwrap();
        let bookie = Arc::new(bookie);
        let server = Server::bind("127.0.0.1:0".parse().unwrap(), bookie.clone())
            .await
            .unwrap();
        let addr = server.local_addr();
        let (shutdown, stop) = tokio::sync::oneshot::channel::<()>();
        let served = tokio::spawn(async move {
            server
                .run(async {
                    let _ = stop.await;
                })
                .await
                .unwrap();
        });
        RealBookie {
            id: BookieId::new(id),
            addr,
            dirs,
            bookie,
            shutdown,
            served,
        }
    }

    /// Stops serving and closes the bookie; returns its directories.
    pub async fn stop(self) -> Arc<tempfile::TempDir> {
        let _ = self.shutdown.send(());
        self.served.await.unwrap();
        let bookie = self.bookie;
        tokio::task::spawn_blocking(move || bookie.shutdown())
            .await
            .unwrap();
        self.dirs
    }
}
