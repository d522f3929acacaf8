//! The send timeout of a producer whose broker never answers: the producer's
//! background task sleeps while nothing is pending, so a send must wake it
//! for the timeout to be kept (batched and unbatched, after an idle spell).
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use vela_broker::{Broker, BrokerConfig};
use vela_client::{
    BatchingOptions, Client, ClientConfig, ClientError, OutgoingMessage, ProducerOptions,
};
use vela_log::LogEnv;
use vela_log::backend::{
    AddCallback, BoxFuture, LedgerBackend, LedgerBackendError, OpenLedger, Persistence,
    RecoveredLedger, Reserve,
};
use vela_log::memory::{MemoryBackend, MemoryLedgers};

/// In-memory ledgers whose adds are never answered while `hold` is set.
#[derive(Debug)]
struct Holding {
    inner: MemoryBackend,
    hold: Arc<AtomicBool>,
}

struct HoldingLedger {
    inner: Arc<dyn OpenLedger>,
    hold: Arc<AtomicBool>,
    /// Callbacks of held adds: kept, never called.
    held: Mutex<Vec<AddCallback>>,
}

impl std::fmt::Debug for HoldingLedger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HoldingLedger")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl LedgerBackend for Holding {
    fn create_ledger(
        &self,
        persistence: Persistence,
        log_name: &str,
    ) -> BoxFuture<'_, Result<Arc<dyn OpenLedger>, LedgerBackendError>> {
        let created = self.inner.create_ledger(persistence, log_name);
        let hold = Arc::clone(&self.hold);
        Box::pin(async move {
            let inner = created.await?;
            Ok(Arc::new(HoldingLedger {
                inner,
                hold,
                held: Mutex::new(Vec::new()),
            }) as Arc<dyn OpenLedger>)
        })
    }

    fn recover(
        &self,
        ledger_id: u64,
    ) -> BoxFuture<'_, Result<RecoveredLedger, LedgerBackendError>> {
        self.inner.recover(ledger_id)
    }

    fn read(
        &self,
        ledger_id: u64,
        first_entry_id: u64,
        last_entry_id: u64,
    ) -> BoxFuture<'_, Result<Vec<Bytes>, LedgerBackendError>> {
        self.inner.read(ledger_id, first_entry_id, last_entry_id)
    }

    fn delete(&self, ledger_id: u64) -> BoxFuture<'_, Result<(), LedgerBackendError>> {
        self.inner.delete(ledger_id)
    }
}

impl OpenLedger for HoldingLedger {
    fn ledger_id(&self) -> u64 {
        self.inner.ledger_id()
    }

    fn reserve(&self, payload_bytes: usize) -> Reserve {
        self.inner.reserve(payload_bytes)
    }

    fn add(&self, data: Bytes, done: AddCallback) {
        if self.hold.load(Ordering::SeqCst) {
            self.held.lock().unwrap().push(done);
        } else {
            self.inner.add(data, done);
        }
    }

    fn close(&self) -> BoxFuture<'static, Result<(), LedgerBackendError>> {
        self.inner.close()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_the_broker_never_answers_times_out_after_an_idle_spell() {
    let hold = Arc::new(AtomicBool::new(false));
    let ledgers = Holding {
        inner: MemoryBackend(MemoryLedgers::new()),
        hold: Arc::clone(&hold),
    };
    let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
    let env = LogEnv::new(Arc::clone(&meta), Arc::new(ledgers));
    let config = BrokerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    let broker = Broker::start(config, meta, env).await.unwrap();
    let client = Client::new(broker.service_url(), ClientConfig::default()).unwrap();
    let timeout = Duration::from_millis(300);
    let batched = ProducerOptions {
        send_timeout: Some(timeout),
        batching: Some(BatchingOptions::default()),
        ..ProducerOptions::default()
    };
    let unbatched = ProducerOptions {
        batching: None,
        ..batched.clone()
    };
    for (name, options) in [("batched", batched), ("unbatched", unbatched)] {
        let topic = format!("persistent://public/default/timeout-{name}");
        let producer = client.create_producer(&topic, options).await.unwrap();
        hold.store(false, Ordering::SeqCst);
        // Answered: nothing pending afterwards, the producer goes idle.
        let first = producer.send(OutgoingMessage::new(Bytes::from_static(b"one")));
        first.await.unwrap().await.unwrap();
        tokio::time::sleep(3 * timeout).await;
        hold.store(true, Ordering::SeqCst);
        let receipt = producer
            .send(OutgoingMessage::new(Bytes::from_static(b"two")))
            .await
            .unwrap();
        let outcome = tokio::time::timeout(Duration::from_secs(20), receipt)
            .await
            .unwrap_or_else(|_| panic!("{name}: the send never timed out"));
        assert!(
            matches!(outcome, Err(ClientError::Timeout { .. })),
            "{name}: {outcome:?}"
        );
    }
    client.close().await;
    broker.shutdown().await.unwrap();
}
