//! SEND_RECEIPTs are sent by the appends' completions (no task per SEND):
//! none before its entry is durable, each producer's in SEND order, also
//! when the connection's writer queue is full, and CLOSE_PRODUCER's answer
//! after every receipt before it.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::net::SocketAddr;
use std::sync::Arc;

use bytes::BytesMut;
use common::{Client, Frame, expect_nothing_but_pong};
use vela_broker::{Broker, BrokerConfig, BrokerHandle};
use vela_log::LogEnv;
use vela_log::memory::HoldingBackend;
use vela_wire::proto;

/// A broker on in-memory ledgers whose adds the test holds and releases.
struct Setup {
    broker: BrokerHandle,
    ledgers: HoldingBackend,
}

impl Setup {
    async fn start(tweak: impl FnOnce(&mut BrokerConfig)) -> Setup {
        let ledgers = HoldingBackend::new();
        let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
        let env = LogEnv::new(Arc::clone(&meta), Arc::new(ledgers.clone()));
        let mut config = BrokerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
        tweak(&mut config);
        let broker = Broker::start(config, meta, env).await.unwrap();
        Setup { broker, ledgers }
    }

    /// Makes the held adds of `ledger_id` (all with `None`) durable, in the
    /// order they came, on this thread; how many.
    fn release(&self, ledger_id: Option<u64>) -> usize {
        let released = self
            .ledgers
            .take_held(|add| ledger_id.is_none_or(|id| id == add.ledger_id));
        let count = released.len();
        for add in released {
            add.release();
        }
        count
    }
}

fn receipt_of(frame: &Frame) -> (u64, u64, (u64, u64)) {
    let receipt = frame
        .command
        .send_receipt
        .as_ref()
        .unwrap_or_else(|| panic!("expected SEND_RECEIPT, got {:?}", frame.command));
    let id = receipt.message_id.as_ref().unwrap();
    (
        receipt.producer_id,
        receipt.sequence_id,
        (id.ledger_id, id.entry_id),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_receipt_before_its_add_is_durable_and_each_producer_keeps_send_order() {
    let setup = Setup::start(|_| {}).await;
    let mut client = Client::connect(setup.broker.pulsar_addr()).await;
    client.create_producer("receipts-a", 1).await;
    client.create_producer("receipts-b", 2).await;
    setup.ledgers.set_holding(true);
    let mut frames = BytesMut::new();
    for seq in 0..20 {
        frames.extend_from_slice(&Client::send_frame(1, seq, b"a"));
        frames.extend_from_slice(&Client::send_frame(2, seq, b"b"));
    }
    client.send_bytes(&frames).await;
    // Every SEND was read before the PING: a receipt sent without its add
    // being durable would come first.
    expect_nothing_but_pong(&mut client).await;
    let ledgers = setup.ledgers.held_ledgers();
    assert_eq!(ledgers.len(), 2, "both topics' adds are held: {ledgers:?}");
    assert_eq!(setup.ledgers.held_count(), 40);

    // Producer 2's topic becomes durable first: its receipts, in order,
    // and nothing of producer 1's.
    let (first, second) = (ledgers[0], ledgers[1]);
    assert_eq!(setup.release(Some(second)), 20);
    let mut receipts = Vec::new();
    for _ in 0..20 {
        receipts.push(receipt_of(&client.recv().await));
    }
    let second_producer = receipts[0].0;
    for (seq, (producer, sequence_id, (ledger, _))) in receipts.iter().enumerate() {
        assert_eq!((*producer, *sequence_id), (second_producer, seq as u64));
        assert_eq!(*ledger, second);
    }
    assert!(
        receipts.windows(2).all(|w| w[0].2 < w[1].2),
        "positions grow: {receipts:?}"
    );
    expect_nothing_but_pong(&mut client).await;
    assert_eq!(setup.release(Some(first)), 20);
    for seq in 0..20 {
        let (producer, sequence_id, (ledger, _)) = receipt_of(&client.recv().await);
        assert_ne!(producer, second_producer);
        assert_eq!((sequence_id, ledger), (seq, first));
    }
    setup.broker.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_writer_queue_keeps_receipts_in_order_and_close_after_them() {
    // One frame of room between the receipts and the socket writer: adds
    // made durable in one burst find it full, and a task sends the rest.
    let setup = Setup::start(|config| config.limits.outbound_frames_max = 1).await;
    let mut client = Client::connect(setup.broker.pulsar_addr()).await;
    client.create_producer("full-a", 1).await;
    client.create_producer("full-b", 2).await;
    setup.ledgers.set_holding(true);
    let sends = 300u64;
    let mut frames = BytesMut::new();
    for seq in 0..sends {
        frames.extend_from_slice(&Client::send_frame(1, seq, b"a"));
        frames.extend_from_slice(&Client::send_frame(2, seq, b"b"));
    }
    client.send_bytes(&frames).await;
    client
        .send(proto::CommandCloseProducer {
            producer_id: 1,
            request_id: 77,
            ..Default::default()
        })
        .await;
    expect_nothing_but_pong(&mut client).await;
    assert_eq!(setup.release(None), 2 * sends as usize);
    let mut next = [0u64; 2];
    let mut closed = false;
    while next != [sends, sends] || !closed {
        let frame = client.recv().await;
        if let Some(success) = &frame.command.success {
            assert_eq!(success.request_id, 77);
            assert_eq!(
                next[0], sends,
                "CLOSE_PRODUCER answered before its receipts"
            );
            closed = true;
            continue;
        }
        let (producer, sequence_id, _) = receipt_of(&frame);
        let expected = &mut next[producer as usize - 1];
        assert_eq!(sequence_id, *expected, "producer {producer} out of order");
        *expected += 1;
    }
    // Still serving: a new SEND is answered at once.
    setup.ledgers.set_holding(false);
    client.produce(2, sends, b"b").await;
    let (producer, sequence_id, _) = receipt_of(&client.recv().await);
    assert_eq!((producer, sequence_id), (2, sends));
    setup.broker.shutdown().await.unwrap();
}
