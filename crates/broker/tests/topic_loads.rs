//! Many topics opened at once on one connection (issue 19): the
//! connection's reader never waits for a topic to open, so a
//! PARTITIONED_METADATA sent behind hundreds of PRODUCERs whose topics are
//! still opening is answered at once; past the per-connection queue of
//! commands waiting for a load a PRODUCER is answered ServiceNotReady (a
//! retriable error), and every command queued is answered once the loads
//! go on. Nor does it wait for a new subscription's cursor to be written.
//!
//! Deterministic: the topics' log records (the cursors' records) are
//! written through a metadata store whose puts for them wait behind a gate
//! the test opens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;

use common::{Client, PutHookStore};
use tokio::sync::watch;
use vela_meta::MetadataStore;
use vela_wire::proto::{self, ServerError};

/// `connection::deferred::DEFERRED_LOADS_MAX` and `DEFERRED_WAITING_MAX`
/// (private to the broker): loads running and commands waiting per
/// connection.
const LOADS_RUNNING: u64 = 64;
const COMMANDS_WAITING: u64 = 1024;

/// Topics whose puts wait for the gate.
const GATED: &str = "gated-";

fn producer(producer_id: u64) -> proto::CommandProducer {
    proto::CommandProducer {
        topic: format!("persistent://public/default/{GATED}{producer_id}"),
        producer_id,
        request_id: producer_id,
        ..Default::default()
    }
}

/// A broker (in-memory ledgers) whose metadata puts of keys containing
/// `marker` wait until the returned gate is set to true.
async fn broker_gating_puts(
    marker: &'static str,
) -> (Arc<watch::Sender<bool>>, vela_broker::BrokerHandle) {
    let gate = Arc::new(watch::channel(false).0);
    let gate_of_puts = Arc::clone(&gate);
    let store = PutHookStore::new(Box::new(move |key: &str| {
        let mut open = key.contains(marker).then(|| gate_of_puts.subscribe());
        Box::pin(async move {
            if let Some(open) = open.as_mut() {
                let _ = open.wait_for(|open| *open).await;
            }
        })
    }));
    let meta: Arc<dyn MetadataStore> = store;
    let ledgers = vela_log::memory::MemoryBackend(vela_log::memory::MemoryLedgers::new());
    let log_env = vela_log::LogEnv::new(Arc::clone(&meta), Arc::new(ledgers));
    (gate, common::start_broker_on(meta, log_env).await)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_answers_lookups_while_many_topics_open_and_refuses_past_its_queue() {
    // Puts of keys naming a gated topic wait until the gate opens.
    let (gate, broker) = broker_gating_puts(GATED).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;

    // Every load runs or waits (the gate is shut), and one more is refused.
    let admitted = LOADS_RUNNING + COMMANDS_WAITING;
    let refused_id = admitted;
    let mut frames = bytes::BytesMut::new();
    for producer_id in 0..=refused_id {
        vela_wire::encode_command(&producer(producer_id).into(), &mut frames);
    }
    client.send_bytes(&frames).await;
    client
        .send(proto::CommandPartitionedTopicMetadata {
            topic: "persistent://public/default/other".into(),
            request_id: 1 << 40,
            ..Default::default()
        })
        .await;

    // Answered while every load still waits: first the refusal, then the
    // lookup (in the order they were sent; nothing else is answered yet).
    let first = client.recv().await.command;
    let error = first.error.expect("the PRODUCER past the queue is refused");
    assert_eq!(error.request_id, refused_id);
    assert_eq!(error.error, ServerError::ServiceNotReady as i32);
    let second = client.recv().await.command;
    let metadata = second
        .partition_metadata_response
        .expect("PARTITIONED_METADATA is answered behind the waiting PRODUCERs");
    assert_eq!(metadata.request_id, 1 << 40);
    assert_eq!(
        metadata.response,
        Some(proto::command_partitioned_topic_metadata_response::LookupType::Success as i32),
        "{metadata:?}"
    );
    assert_eq!(metadata.partitions, Some(0));

    // The gate opens: every PRODUCER admitted succeeds, once.
    gate.send_replace(true);
    let mut succeeded = vec![false; admitted as usize];
    for _ in 0..admitted {
        let command = client.recv().await.command;
        let Some(success) = command.producer_success.as_deref() else {
            panic!("expected PRODUCER_SUCCESS, got {command:?}");
        };
        let id = success.request_id as usize;
        assert!(!succeeded[id], "PRODUCER {id} answered twice");
        succeeded[id] = true;
    }
    assert!(succeeded.iter().all(|s| *s));
    drop(client);
    broker.shutdown().await.unwrap();
}

/// Subscriptions whose cursor puts wait for the gate.
const GATED_SUBSCRIPTION: &str = "gated-subscription";

fn subscribe(topic: &str, consumer_id: u64) -> proto::CommandSubscribe {
    proto::CommandSubscribe {
        topic: format!("persistent://public/default/{topic}"),
        subscription: GATED_SUBSCRIPTION.into(),
        sub_type: proto::command_subscribe::SubType::Exclusive as i32,
        consumer_id,
        request_id: consumer_id,
        ..Default::default()
    }
}

/// A SUBSCRIBE that creates its subscription writes the new cursor off the
/// connection's reader, on a topic already open as on one still to open:
/// a lookup sent behind it is answered while the cursor's write waits, and
/// the SUBSCRIBE is answered once it is done.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscribe_creating_its_cursor_leaves_the_connection_free() {
    let (gate, broker) = broker_gating_puts(GATED_SUBSCRIPTION).await;
    let mut client = Client::connect(broker.pulsar_addr()).await;
    // The topic is open (its producer is served).
    client
        .create_producer("persistent://public/default/open", 100)
        .await;

    client.send(subscribe("open", 1)).await;
    client.send(subscribe("not-open-yet", 2)).await;
    client
        .send(proto::CommandPartitionedTopicMetadata {
            topic: "persistent://public/default/other".into(),
            request_id: 1 << 40,
            ..Default::default()
        })
        .await;
    // Answered while both cursors' writes wait (before this change the
    // reader waited for the first one: nothing came).
    let first = client.recv().await.command;
    let metadata = first
        .partition_metadata_response
        .expect("PARTITIONED_METADATA is answered behind the SUBSCRIBEs");
    assert_eq!(metadata.request_id, 1 << 40);

    gate.send_replace(true);
    let mut answered = [false; 2];
    for _ in 0..2 {
        let command = client.recv().await.command;
        let Some(success) = command.success else {
            panic!("expected SUCCESS for a SUBSCRIBE, got {command:?}");
        };
        let id = success.request_id as usize - 1;
        assert!(!answered[id], "SUBSCRIBE {id} answered twice");
        answered[id] = true;
    }
    // Each subscription exists, its consumer attached: a message produced
    // on the open topic reaches it.
    client.flow(1, 10).await;
    client.produce(100, 0, b"after the gate").await;
    let (mut receipted, mut delivered) = (false, false);
    for _ in 0..2 {
        // The receipt and the message, in either order.
        let frame = client.recv().await;
        if frame.command.send_receipt.is_some() {
            receipted = true;
            continue;
        }
        let (message, payload) = common::message_of(&frame);
        assert_eq!(message.consumer_id, 1);
        assert_eq!(payload.as_ref(), b"after the gate");
        delivered = true;
    }
    assert!(receipted && delivered);
    drop(client);
    broker.shutdown().await.unwrap();
}
