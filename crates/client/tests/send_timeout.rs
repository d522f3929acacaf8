//! The send timeout of a producer whose broker never answers: the producer's
//! background task sleeps while nothing is pending, so a send must wake it
//! for the timeout to be kept (batched and unbatched, after an idle spell).
#![allow(clippy::unwrap_used)]

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use vela_broker::{Broker, BrokerConfig};
use vela_client::{
    BatchingOptions, Client, ClientConfig, ClientError, OutgoingMessage, ProducerOptions,
};
use vela_log::LogEnv;
use vela_log::memory::HoldingBackend;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_send_the_broker_never_answers_times_out_after_an_idle_spell() {
    // Held adds are never released: the broker never answers them.
    let ledgers = HoldingBackend::new();
    let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
    let env = LogEnv::new(Arc::clone(&meta), Arc::new(ledgers.clone()));
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
        ledgers.set_holding(false);
        // Answered: nothing pending afterwards, the producer goes idle.
        let first = producer.send(OutgoingMessage::new(Bytes::from_static(b"one")));
        first.await.unwrap().await.unwrap();
        tokio::time::sleep(3 * timeout).await;
        ledgers.set_holding(true);
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
