//! Transactions end to end over the Pulsar protocol, on in-memory ledgers
//! and metadata: the coordinator carries a commit or abort out on the
//! partitions (transaction buffer: entries invisible until commit, never
//! after abort, later entries held behind an open transaction) and on the
//! subscriptions (pending acks: held, conflicting as Pulsar's, applied on
//! commit, released on abort), also across a broker restart.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use bytes::{Bytes, BytesMut};
use common::{Client, expect_nothing_but_pong, metadata, receipt_seq};
use tokio::io::AsyncWriteExt;
use vela_broker::{Broker, BrokerConfig, BrokerHandle, TransactionConfig};
use vela_log::LogEnv;
use vela_meta::{MemoryStore, MetadataStore};
use vela_wire::proto::{self, BaseCommand, MessageIdData, ServerError, command_subscribe::SubType};

type Txn = (u64, u64);

fn stores() -> (Arc<dyn MetadataStore>, LogEnv) {
    let meta: Arc<dyn MetadataStore> = Arc::new(MemoryStore::new());
    let env = LogEnv::new(
        Arc::clone(&meta),
        Arc::new(vela_log::memory::MemoryBackend(
            vela_log::memory::MemoryLedgers::new(),
        )),
    );
    (meta, env)
}

async fn broker_on(meta: &Arc<dyn MetadataStore>, env: &LogEnv) -> BrokerHandle {
    let mut config = BrokerConfig::new(SocketAddr::from(([127, 0, 0, 1], 0)));
    config.transactions = Some(TransactionConfig {
        timeout_check_interval: Duration::from_millis(50),
        ..TransactionConfig::default()
    });
    Broker::start(config, Arc::clone(meta), env.clone())
        .await
        .unwrap()
}

/// A connection speaking to the transaction coordinator.
struct Tc {
    client: Client,
    next_request: u64,
}

impl Tc {
    async fn connect(addr: SocketAddr) -> Tc {
        let mut client = Client::connect(addr).await;
        client
            .send(proto::CommandTcClientConnectRequest {
                request_id: 1,
                tc_id: 0,
            })
            .await;
        let answer = client.recv().await.command;
        let response = answer
            .tc_client_connect_response
            .expect("TC connect answer");
        assert_eq!(response.error, None, "{response:?}");
        Tc {
            client,
            next_request: 10,
        }
    }

    fn request_id(&mut self) -> u64 {
        self.next_request += 1;
        self.next_request
    }

    async fn new_txn(&mut self) -> Txn {
        let request_id = self.request_id();
        self.client
            .send(proto::CommandNewTxn {
                request_id,
                txn_ttl_seconds: Some(600_000),
                tc_id: Some(0),
            })
            .await;
        let response = self.client.recv().await.command.new_txn_response.unwrap();
        assert_eq!(response.error, None, "{response:?}");
        (
            response.txnid_most_bits.unwrap(),
            response.txnid_least_bits.unwrap(),
        )
    }

    async fn add_partition(&mut self, txn: Txn, topic: &str) {
        let request_id = self.request_id();
        self.client
            .send(proto::CommandAddPartitionToTxn {
                request_id,
                txnid_most_bits: Some(txn.0),
                txnid_least_bits: Some(txn.1),
                partitions: vec![topic.to_string()],
            })
            .await;
        let response = self
            .client
            .recv()
            .await
            .command
            .add_partition_to_txn_response
            .unwrap();
        assert_eq!(response.error, None, "{response:?}");
    }

    async fn add_subscription(&mut self, txn: Txn, topic: &str, subscription: &str) {
        let request_id = self.request_id();
        self.client
            .send(proto::CommandAddSubscriptionToTxn {
                request_id,
                txnid_most_bits: Some(txn.0),
                txnid_least_bits: Some(txn.1),
                subscription: vec![proto::Subscription {
                    topic: topic.to_string(),
                    subscription: subscription.to_string(),
                }],
            })
            .await;
        let response = self
            .client
            .recv()
            .await
            .command
            .add_subscription_to_txn_response
            .unwrap();
        assert_eq!(response.error, None, "{response:?}");
    }

    async fn end(&mut self, txn: Txn, action: proto::TxnAction) {
        let request_id = self.request_id();
        self.client
            .send(proto::CommandEndTxn {
                request_id,
                txnid_most_bits: Some(txn.0),
                txnid_least_bits: Some(txn.1),
                txn_action: Some(action as i32),
            })
            .await;
        let response = self.client.recv().await.command.end_txn_response.unwrap();
        assert_eq!(response.error, None, "{response:?}");
    }
}

/// Sends one message of `txn` (or none) and waits for its receipt.
async fn send(client: &mut Client, producer_id: u64, seq: u64, txn: Option<Txn>, payload: &str) {
    let command = BaseCommand::from(proto::CommandSend {
        producer_id,
        sequence_id: seq,
        txnid_most_bits: txn.map(|t| t.0),
        txnid_least_bits: txn.map(|t| t.1),
        ..Default::default()
    });
    let mut buf = BytesMut::new();
    vela_wire::encode_payload_frame(&command, &metadata(seq), payload.as_bytes(), &mut buf);
    client.stream.write_all(&buf).await.unwrap();
    let frame = client.recv().await;
    assert!(
        frame.command.send_receipt.is_some(),
        "no receipt: {:?}",
        frame.command
    );
    assert_eq!(receipt_seq(&frame), seq);
}

/// The next `n` messages: (consumer id, message id, payload).
async fn receive(client: &mut Client, n: usize) -> Vec<(u64, MessageIdData, Bytes)> {
    let mut out = Vec::new();
    while out.len() < n {
        let frame = client.recv().await;
        let Some(message) = &frame.command.message else {
            panic!("expected MESSAGE, got {:?}", frame.command);
        };
        let payload = frame.payload.as_ref().expect("payload").payload();
        out.push((message.consumer_id, message.message_id.clone(), payload));
    }
    out
}

fn payloads_of(messages: &[(u64, MessageIdData, Bytes)], consumer_id: u64) -> Vec<String> {
    messages
        .iter()
        .filter(|(c, _, _)| *c == consumer_id)
        .map(|(_, _, p)| String::from_utf8_lossy(p).into_owned())
        .collect()
}

#[tokio::test]
async fn commit_shows_messages_on_two_topics_and_abort_never() {
    let (meta, env) = stores();
    let broker = broker_on(&meta, &env).await;
    let addr = broker.pulsar_addr();
    let (a, b) = (
        "persistent://public/default/txn-a",
        "persistent://public/default/txn-b",
    );
    let mut consumer = Client::connect(addr).await;
    consumer.subscribe(a, "s", SubType::Exclusive, 1).await;
    consumer.subscribe(b, "s", SubType::Exclusive, 2).await;
    consumer.flow(1, 100).await;
    consumer.flow(2, 100).await;
    let mut producer = Client::connect(addr).await;
    producer.create_producer(a, 1).await;
    producer.create_producer(b, 2).await;
    let mut tc = Tc::connect(addr).await;

    let txn = tc.new_txn().await;
    tc.add_partition(txn, a).await;
    tc.add_partition(txn, b).await;
    send(&mut producer, 1, 0, None, "plain-0").await;
    send(&mut producer, 1, 1, Some(txn), "txn-1").await;
    send(&mut producer, 2, 0, Some(txn), "txn-b-0").await;
    send(&mut producer, 1, 2, Some(txn), "txn-2").await;
    send(&mut producer, 1, 3, None, "plain-3").await;

    // Only the message before the open transaction goes out: its entries
    // and everything after them wait for the outcome.
    let before = receive(&mut consumer, 1).await;
    assert_eq!(payloads_of(&before, 1), ["plain-0"]);
    expect_nothing_but_pong(&mut consumer).await;

    tc.end(txn, proto::TxnAction::Commit).await;
    let after = receive(&mut consumer, 4).await;
    assert_eq!(payloads_of(&after, 1), ["txn-1", "txn-2", "plain-3"]);
    assert_eq!(payloads_of(&after, 2), ["txn-b-0"]);
    // The commit markers are never delivered.
    expect_nothing_but_pong(&mut consumer).await;

    // Abort: its messages are never delivered; later ones are.
    let aborted = tc.new_txn().await;
    tc.add_partition(aborted, a).await;
    send(&mut producer, 1, 4, Some(aborted), "aborted-4").await;
    send(&mut producer, 1, 5, None, "plain-5").await;
    expect_nothing_but_pong(&mut consumer).await;
    tc.end(aborted, proto::TxnAction::Abort).await;
    let rest = receive(&mut consumer, 1).await;
    assert_eq!(payloads_of(&rest, 1), ["plain-5"]);
    expect_nothing_but_pong(&mut consumer).await;

    // A new subscription from the start sees the same: no aborted
    // message, no marker.
    consumer.subscribe(a, "late", SubType::Exclusive, 3).await;
    consumer.flow(3, 100).await;
    let replayed = receive(&mut consumer, 5).await;
    assert_eq!(
        payloads_of(&replayed, 3),
        ["plain-0", "txn-1", "txn-2", "plain-3", "plain-5"]
    );
    expect_nothing_but_pong(&mut consumer).await;
    let stats = broker.topic_stats(a).await.unwrap().unwrap();
    assert_eq!(
        (
            stats.ongoing_txn_count,
            stats.committed_txn_count,
            stats.aborted_txn_count
        ),
        (0, 1, 1)
    );
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn an_open_transaction_stays_hidden_across_a_restart_and_commits_after_it() {
    let (meta, env) = stores();
    let broker = broker_on(&meta, &env).await;
    let topic = "persistent://public/default/txn-restart";
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(topic, 1).await;
    let mut tc = Tc::connect(broker.pulsar_addr()).await;
    let txn = tc.new_txn().await;
    tc.add_partition(txn, topic).await;
    send(&mut producer, 1, 0, Some(txn), "txn-0").await;
    send(&mut producer, 1, 1, None, "plain-1").await;
    drop((producer, tc));
    broker.shutdown().await.unwrap();

    let broker = broker_on(&meta, &env).await;
    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer.subscribe(topic, "s", SubType::Exclusive, 1).await;
    consumer.flow(1, 100).await;
    expect_nothing_but_pong(&mut consumer).await;
    let mut tc = Tc::connect(broker.pulsar_addr()).await;
    tc.end(txn, proto::TxnAction::Commit).await;
    let messages = receive(&mut consumer, 2).await;
    assert_eq!(payloads_of(&messages, 1), ["txn-0", "plain-1"]);
    broker.shutdown().await.unwrap();
}

/// Sends a transactional ACK and returns the ACK_RESPONSE's error.
async fn txn_ack(
    client: &mut Client,
    consumer_id: u64,
    id: &MessageIdData,
    txn: Txn,
    request_id: u64,
) -> Option<(i32, String)> {
    client
        .send(proto::CommandAck {
            consumer_id,
            ack_type: proto::command_ack::AckType::Individual as i32,
            message_id: vec![MessageIdData {
                ledger_id: id.ledger_id,
                entry_id: id.entry_id,
                ..Default::default()
            }],
            txnid_most_bits: Some(txn.0),
            txnid_least_bits: Some(txn.1),
            request_id: Some(request_id),
            ..Default::default()
        })
        .await;
    let response = client.recv().await.command.ack_response.unwrap();
    assert_eq!(response.request_id, Some(request_id));
    response
        .error
        .map(|e| (e, response.message.unwrap_or_default()))
}

#[tokio::test]
async fn transactional_acks_conflict_survive_a_restart_and_apply_on_commit_only() {
    let (meta, env) = stores();
    let broker = broker_on(&meta, &env).await;
    let topic = "persistent://public/default/txn-acks";
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(topic, 1).await;
    for seq in 0..3 {
        send(&mut producer, 1, seq, None, &format!("m{seq}")).await;
    }
    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer.subscribe(topic, "s", SubType::Shared, 1).await;
    consumer.flow(1, 100).await;
    let messages = receive(&mut consumer, 3).await;
    let ids: HashMap<String, MessageIdData> = messages
        .into_iter()
        .map(|(_, id, p)| (String::from_utf8_lossy(&p).into_owned(), id))
        .collect();

    let mut tc = Tc::connect(broker.pulsar_addr()).await;
    let holder = tc.new_txn().await;
    tc.add_subscription(holder, topic, "s").await;
    assert_eq!(txn_ack(&mut consumer, 1, &ids["m0"], holder, 1).await, None);
    let other = tc.new_txn().await;
    let (code, message) = txn_ack(&mut consumer, 1, &ids["m0"], other, 2)
        .await
        .expect("a conflict");
    assert_eq!(code, ServerError::TransactionConflict as i32);
    assert!(
        message.ends_with(&format!(
            "try to ack message:{}:{} in pending ack status.",
            ids["m0"].ledger_id, ids["m0"].entry_id
        )),
        "{message}"
    );
    drop((producer, consumer, tc));
    broker.shutdown().await.unwrap();

    // After a restart the held ack still conflicts, and everything not
    // acknowledged comes again.
    let broker = broker_on(&meta, &env).await;
    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer.subscribe(topic, "s", SubType::Shared, 1).await;
    consumer.flow(1, 100).await;
    let again = receive(&mut consumer, 3).await;
    assert_eq!(payloads_of(&again, 1), ["m0", "m1", "m2"]);
    let mut tc = Tc::connect(broker.pulsar_addr()).await;
    let third = tc.new_txn().await;
    let (code, _) = txn_ack(&mut consumer, 1, &ids["m0"], third, 3)
        .await
        .expect("still held after the restart");
    assert_eq!(code, ServerError::TransactionConflict as i32);

    // An aborted transaction's ack is released: the message comes again.
    let aborted = tc.new_txn().await;
    tc.add_subscription(aborted, topic, "s").await;
    assert_eq!(
        txn_ack(&mut consumer, 1, &ids["m1"], aborted, 4).await,
        None
    );
    tc.end(aborted, proto::TxnAction::Abort).await;
    let redelivered = receive(&mut consumer, 1).await;
    assert_eq!(payloads_of(&redelivered, 1), ["m1"]);

    // The holder commits (recovered by the coordinator): m0 is acknowledged.
    tc.end(holder, proto::TxnAction::Commit).await;
    let (code, message) = txn_ack(&mut consumer, 1, &ids["m0"], third, 5)
        .await
        .expect("m0 is acknowledged now");
    assert_eq!(code, ServerError::TransactionConflict as i32);
    assert!(message.ends_with("already acked before."), "{message}");
    drop(consumer);

    // A new consumer gets what is not acknowledged: m1 and m2.
    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer.subscribe(topic, "s", SubType::Shared, 2).await;
    consumer.flow(2, 100).await;
    let left = receive(&mut consumer, 2).await;
    assert_eq!(payloads_of(&left, 2), ["m1", "m2"]);
    expect_nothing_but_pong(&mut consumer).await;
    broker.shutdown().await.unwrap();
}

#[tokio::test]
async fn acks_of_ended_transactions_are_released_then_refused_and_records_go_with_the_subscription()
{
    let (meta, env) = stores();
    let broker = broker_on(&meta, &env).await;
    let topic = "persistent://public/default/txn-late-acks";
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(topic, 1).await;
    for seq in 0..4 {
        send(&mut producer, 1, seq, None, &format!("m{seq}")).await;
    }
    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer.subscribe(topic, "s", SubType::Shared, 1).await;
    consumer.flow(1, 100).await;
    let ids: HashMap<String, MessageIdData> = receive(&mut consumer, 4)
        .await
        .into_iter()
        .map(|(_, id, p)| (String::from_utf8_lossy(&p).into_owned(), id))
        .collect();
    let mut tc = Tc::connect(broker.pulsar_addr()).await;

    // t1 commits its ack of m0; then an ack of m2 in t1 arrives late (the
    // low water mark does not cover t1 yet): held for now.
    let t1 = tc.new_txn().await;
    tc.add_subscription(t1, topic, "s").await;
    assert_eq!(txn_ack(&mut consumer, 1, &ids["m0"], t1, 1).await, None);
    tc.end(t1, proto::TxnAction::Commit).await;
    assert_eq!(txn_ack(&mut consumer, 1, &ids["m2"], t1, 2).await, None);

    // t2 ends with a low water mark past t1: t1's late ack is released (m2
    // comes again) and further acks in t1 are refused.
    let t2 = tc.new_txn().await;
    tc.add_subscription(t2, topic, "s").await;
    assert_eq!(txn_ack(&mut consumer, 1, &ids["m1"], t2, 3).await, None);
    tc.end(t2, proto::TxnAction::Commit).await;
    let again = receive(&mut consumer, 1).await;
    assert_eq!(payloads_of(&again, 1), ["m2"]);
    let (code, message) = txn_ack(&mut consumer, 1, &ids["m3"], t1, 4)
        .await
        .expect("an ended transaction's ack is refused");
    assert_eq!(code, ServerError::NotAllowedError as i32);
    assert!(message.contains("has been ended"), "{message}");

    // A held ack's record goes when the subscription is deleted.
    let t3 = tc.new_txn().await;
    tc.add_subscription(t3, topic, "s").await;
    assert_eq!(txn_ack(&mut consumer, 1, &ids["m3"], t3, 5).await, None);
    let records = "/transactions/pending-acks/public/default/persistent/txn-late-acks/s";
    assert_eq!(meta.children(records).await.unwrap().len(), 1);
    consumer
        .send(proto::CommandUnsubscribe {
            consumer_id: 1,
            request_id: 6,
            force: None,
        })
        .await;
    let answer = consumer.recv().await.command;
    assert!(answer.success.is_some(), "{answer:?}");
    assert!(meta.children(records).await.unwrap().is_empty());
    broker.shutdown().await.unwrap();
}

/// Sends one message of `txn` and returns the SEND_ERROR it gets.
async fn send_refused(
    client: &mut Client,
    producer_id: u64,
    seq: u64,
    txn: Txn,
) -> proto::CommandSendError {
    let command = BaseCommand::from(proto::CommandSend {
        producer_id,
        sequence_id: seq,
        txnid_most_bits: Some(txn.0),
        txnid_least_bits: Some(txn.1),
        ..Default::default()
    });
    let mut buf = BytesMut::new();
    vela_wire::encode_payload_frame(&command, &metadata(seq), b"late", &mut buf);
    client.stream.write_all(&buf).await.unwrap();
    let frame = client.recv().await;
    let Some(refused) = frame.command.send_error.clone() else {
        panic!("expected SEND_ERROR, got {:?}", frame.command);
    };
    *refused
}

#[tokio::test]
async fn a_late_send_of_an_ended_transaction_is_refused_and_hides_nothing() {
    let (meta, env) = stores();
    let broker = broker_on(&meta, &env).await;
    let topic = "persistent://public/default/txn-late";
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(topic, 1).await;
    let mut tc = Tc::connect(broker.pulsar_addr()).await;
    let committed = tc.new_txn().await;
    tc.add_partition(committed, topic).await;
    send(&mut producer, 1, 0, Some(committed), "committed-0").await;
    tc.end(committed, proto::TxnAction::Commit).await;
    let aborted = tc.new_txn().await;
    tc.add_partition(aborted, topic).await;
    tc.end(aborted, proto::TxnAction::Abort).await;

    // Late SENDs of either (the coordinator forgot both): Pulsar's refusal;
    // the topic is not held behind them.
    for (seq, txn) in [(1, committed), (2, aborted)] {
        let refused = send_refused(&mut producer, 1, seq, txn).await;
        assert_eq!(refused.error, ServerError::NotAllowedError as i32);
        assert_eq!(
            refused.message,
            format!(
                "Transaction [({},{})] has been ended. Please use a new transaction to send message.",
                txn.0, txn.1
            )
        );
    }
    send(&mut producer, 1, 3, None, "plain-3").await;
    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer.subscribe(topic, "s", SubType::Exclusive, 1).await;
    consumer.flow(1, 100).await;
    let messages = receive(&mut consumer, 2).await;
    assert_eq!(payloads_of(&messages, 1), ["committed-0", "plain-3"]);
    drop((producer, consumer, tc));
    broker.shutdown().await.unwrap();

    // After a restart (the buffer recovered from its log) as well; the
    // committed message is still delivered.
    let broker = broker_on(&meta, &env).await;
    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer.create_producer(topic, 2).await;
    let refused = send_refused(&mut producer, 2, 0, committed).await;
    assert_eq!(refused.error, ServerError::NotAllowedError as i32);
    let mut consumer = Client::connect(broker.pulsar_addr()).await;
    consumer
        .subscribe(topic, "late", SubType::Exclusive, 1)
        .await;
    consumer.flow(1, 100).await;
    let messages = receive(&mut consumer, 2).await;
    assert_eq!(payloads_of(&messages, 1), ["committed-0", "plain-3"]);
    expect_nothing_but_pong(&mut consumer).await;
    broker.shutdown().await.unwrap();
}
