//! Many topics opened at once on one connection (issue 19): the
//! connection's reader never waits for a topic to open, so a
//! PARTITIONED_METADATA sent behind hundreds of PRODUCERs whose topics are
//! still opening is answered at once; past the per-connection queue of
//! commands waiting for a load a PRODUCER is answered ServiceNotReady (a
//! retriable error), and every command queued is answered once the loads
//! go on.
//!
//! Deterministic: the topics' log records are written through a metadata
//! store whose puts for them wait behind a gate the test opens.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use common::Client;
use tokio::sync::watch;
use vela_meta::{
    BackendKind, BoxFuture, ExpectedVersion, MetaError, MetadataStore, Session, Version, Watcher,
};
use vela_wire::proto::{self, ServerError};

/// `connection::deferred::DEFERRED_LOADS_MAX` and `DEFERRED_WAITING_MAX`
/// (private to the broker): loads running and commands waiting per
/// connection.
const LOADS_RUNNING: u64 = 64;
const COMMANDS_WAITING: u64 = 1024;

/// Topics whose puts wait for the gate.
const GATED: &str = "gated-";

/// A memory store whose puts of keys naming a gated topic wait until the
/// gate opens.
#[derive(Debug)]
struct GatedPuts {
    inner: Arc<dyn MetadataStore>,
    open: watch::Sender<bool>,
}

impl MetadataStore for GatedPuts {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }

    fn get<'a>(
        &'a self,
        key: &'a str,
    ) -> BoxFuture<'a, Result<Option<(Bytes, Version)>, MetaError>> {
        self.inner.get(key)
    }

    fn put<'a>(
        &'a self,
        key: &'a str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<Version, MetaError>> {
        Box::pin(async move {
            if key.contains(GATED) {
                let mut open = self.open.subscribe();
                let _ = open.wait_for(|open| *open).await;
            }
            self.inner.put(key, value, expected).await
        })
    }

    fn delete<'a>(
        &'a self,
        key: &'a str,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<(), MetaError>> {
        self.inner.delete(key, expected)
    }

    fn children<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Vec<String>, MetaError>> {
        self.inner.children(path)
    }

    fn watch<'a>(&'a self, path: &'a str) -> BoxFuture<'a, Result<Watcher, MetaError>> {
        self.inner.watch(path)
    }

    fn session(&self, ttl: Duration) -> BoxFuture<'_, Result<Session, MetaError>> {
        self.inner.session(ttl)
    }

    fn put_ephemeral<'a>(
        &'a self,
        session: &'a Session,
        key: &'a str,
        value: Bytes,
        expected: ExpectedVersion,
    ) -> BoxFuture<'a, Result<Version, MetaError>> {
        self.inner.put_ephemeral(session, key, value, expected)
    }
}

fn producer(producer_id: u64) -> proto::CommandProducer {
    proto::CommandProducer {
        topic: format!("persistent://public/default/{GATED}{producer_id}"),
        producer_id,
        request_id: producer_id,
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_connection_answers_lookups_while_many_topics_open_and_refuses_past_its_queue() {
    let store = Arc::new(GatedPuts {
        inner: Arc::new(vela_meta::MemoryStore::new()),
        open: watch::channel(false).0,
    });
    let meta: Arc<dyn MetadataStore> = Arc::clone(&store) as Arc<dyn MetadataStore>;
    let ledgers = vela_log::memory::MemoryBackend(vela_log::memory::MemoryLedgers::new());
    let log_env = vela_log::LogEnv::new(Arc::clone(&meta), Arc::new(ledgers));
    let broker = common::start_broker_on(meta, log_env).await;
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
    store.open.send_replace(true);
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
