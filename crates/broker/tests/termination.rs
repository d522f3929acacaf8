//! Topic termination as Pulsar does it: producers closed and refused with
//! TopicTerminatedError, consumers told REACHED_END_OF_TOPIC once they
//! acknowledged everything (unless their client closes on it), and the
//! state survives a broker restart.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::{Client, PutHookStore, expect_nothing_but_pong, message_of, receipt_seq};
use vela_meta::MetadataStore;
use vela_wire::proto::{
    self, ServerError, command_ack::AckType, command_subscribe::InitialPosition,
    command_subscribe::SubType,
};

fn env() -> (Arc<dyn vela_meta::MetadataStore>, vela_log::LogEnv) {
    let meta: Arc<dyn vela_meta::MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
    let ledgers = vela_log::memory::MemoryBackend(vela_log::memory::MemoryLedgers::new());
    let log_env = vela_log::LogEnv::new(Arc::clone(&meta), Arc::new(ledgers));
    (meta, log_env)
}

async fn connect_as(addr: std::net::SocketAddr, client_version: &str) -> Client {
    let mut client = Client::raw(addr).await;
    client
        .send(proto::CommandConnect {
            client_version: client_version.into(),
            protocol_version: Some(21),
            ..Default::default()
        })
        .await;
    assert!(client.recv().await.command.connected.is_some());
    client
}

async fn refused_producer(
    client: &mut Client,
    topic: &str,
    producer_id: u64,
) -> proto::CommandError {
    client
        .send(proto::CommandProducer {
            topic: topic.into(),
            producer_id,
            request_id: 77,
            ..Default::default()
        })
        .await;
    let command = client.recv().await.command;
    *command.error.expect("ERROR")
}

#[tokio::test]
async fn terminated_topics_refuse_producers_and_tell_consumers_the_end() {
    let (meta, log_env) = env();
    let broker = common::start_broker_on(Arc::clone(&meta), log_env.clone()).await;
    let topic = "persistent://public/default/ends";
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(topic, 1).await;
    for seq in 0..2 {
        producer.produce(1, seq, b"x").await;
        receipt_seq(&producer.recv().await);
    }
    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer.subscribe(topic, "s", SubType::Exclusive, 1).await;
    consumer.flow(1, 10).await;
    let ids = [
        message_of(&consumer.recv().await).0.message_id.clone(),
        message_of(&consumer.recv().await).0.message_id.clone(),
    ];
    // A C++/Python client would close its connection on the command.
    let mut cpp = connect_as(broker.pulsar_addr(), "Pulsar-CPP-v3.7.0").await;
    cpp.subscribe(topic, "cpp", SubType::Exclusive, 1).await;

    let last = broker.terminate_topic(topic).await.unwrap();
    assert_eq!(last, Some((ids[1].ledger_id, ids[1].entry_id)));
    assert_eq!(
        broker.terminate_topic(topic).await.unwrap(),
        last,
        "idempotent"
    );
    assert!(producer.recv().await.command.close_producer.is_some());
    let error = refused_producer(&mut producer, topic, 2).await;
    assert_eq!(error.error, ServerError::TopicTerminatedError as i32);

    // Not yet: two messages are not acknowledged.
    expect_nothing_but_pong(&mut consumer).await;
    consumer
        .send(proto::CommandAck {
            consumer_id: 1,
            ack_type: AckType::Cumulative as i32,
            message_id: vec![ids[1].clone()],
            ..Default::default()
        })
        .await;
    let end = consumer.recv().await.command.reached_end_of_topic;
    assert_eq!(end.map(|e| e.consumer_id), Some(1));
    expect_nothing_but_pong(&mut consumer).await;
    cpp.flow(1, 10).await;
    for _ in 0..2 {
        message_of(&cpp.recv().await);
    }
    cpp.send(proto::CommandAck {
        consumer_id: 1,
        ack_type: AckType::Cumulative as i32,
        message_id: vec![ids[1].clone()],
        ..Default::default()
    })
    .await;
    expect_nothing_but_pong(&mut cpp).await;
    drop((producer, consumer, cpp));
    broker.shutdown().await.unwrap();

    // After a restart: still terminated; a new subscription at the end
    // learns it at once.
    let broker = common::start_broker_on(meta, log_env).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    let error = refused_producer(&mut client, topic, 3).await;
    assert_eq!(error.error, ServerError::TopicTerminatedError as i32);
    client
        .send(proto::CommandSubscribe {
            topic: topic.into(),
            subscription: "late".into(),
            sub_type: SubType::Exclusive as i32,
            consumer_id: 9,
            request_id: 9,
            initial_position: Some(InitialPosition::Latest as i32),
            ..Default::default()
        })
        .await;
    let answer = client.recv().await.command;
    assert!(answer.success.is_some(), "{answer:?}");
    client.flow(9, 10).await;
    let end = client.recv().await.command.reached_end_of_topic;
    assert_eq!(end.map(|e| e.consumer_id), Some(9));
    broker.shutdown().await.unwrap();
}

/// How long a put takes once `slow` is set: the log's record of a
/// termination is then written while SENDs arrive.
const PUT_DELAY: Duration = Duration::from_millis(50);

/// SENDs in flight while the topic is terminated: the producer's client
/// hears CLOSE_PRODUCER before any SEND_ERROR (the Go client fails its
/// pending sends with ErrTopicTerminated only when the producer it
/// re-attaches after CLOSE_PRODUCER is refused; a SEND_ERROR first makes it
/// forget the producer, and its sends time out).
#[tokio::test]
async fn producers_hear_close_producer_before_send_errors_of_a_termination() {
    let slow = Arc::new(AtomicBool::new(false));
    let slowing = Arc::clone(&slow);
    let store = PutHookStore::new(Box::new(move |_key: &str| {
        let slow = slowing.load(Ordering::SeqCst);
        Box::pin(async move {
            if slow {
                tokio::time::sleep(PUT_DELAY).await;
            }
        })
    }));
    let meta: Arc<dyn MetadataStore> = Arc::clone(&store) as Arc<dyn MetadataStore>;
    let ledgers = vela_log::memory::MemoryBackend(vela_log::memory::MemoryLedgers::new());
    let log_env = vela_log::LogEnv::new(Arc::clone(&meta), Arc::new(ledgers));
    let broker = common::start_broker_on(meta, log_env).await;
    let topic = "persistent://public/default/ends-while-sending";
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(topic, 1).await;
    producer.produce(1, 0, b"x").await;
    assert_eq!(receipt_seq(&producer.recv().await), 0);
    let mut sends = Vec::new();
    for seq in 1..=500 {
        sends.extend_from_slice(&Client::send_frame(1, seq, b"x"));
    }
    producer.send_bytes(&sends).await;
    slow.store(true, Ordering::SeqCst);
    broker.terminate_topic(topic).await.unwrap();
    slow.store(false, Ordering::SeqCst);
    let mut receipts = 0;
    loop {
        let command = producer.recv().await.command;
        if command.close_producer.is_some() {
            break;
        }
        assert!(
            command.send_error.is_none(),
            "SEND_ERROR before CLOSE_PRODUCER: {command:?}"
        );
        assert!(command.send_receipt.is_some(), "{command:?}");
        receipts += 1;
    }
    assert!(receipts <= 500);
    let error = refused_producer(&mut producer, topic, 2).await;
    assert_eq!(error.error, ServerError::TopicTerminatedError as i32);
    drop(producer);
    broker.shutdown().await.unwrap();
}
