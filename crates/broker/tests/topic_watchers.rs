//! Topic list watchers and GET_TOPICS_OF_NAMESPACE as Pulsar 4.0 answers
//! them: the feature flag, one update per created or deleted topic with the
//! hash of the watcher's list, the client's hash honoured, patterns matched
//! without domain and partition suffix, the errors.

#![allow(clippy::unwrap_used, clippy::expect_used)]

mod common;

use common::Client;
use vela_wire::proto::{self, ServerError, command_get_topics_of_namespace::Mode};

const PATTERN: &str = "persistent://public/default/w-.*";

async fn watch(
    client: &mut Client,
    watcher_id: u64,
    pattern: &str,
    hash: Option<&str>,
) -> proto::BaseCommand {
    client
        .send(proto::CommandWatchTopicList {
            request_id: 100 + watcher_id,
            watcher_id,
            namespace: "public/default".into(),
            topics_pattern: pattern.into(),
            topics_hash: hash.map(String::from),
        })
        .await;
    client.recv().await.command
}

async fn next_update(client: &mut Client) -> proto::CommandWatchTopicUpdate {
    let command = client.recv().await.command;
    let text = format!("{command:?}");
    *command
        .watch_topic_update
        .unwrap_or_else(|| panic!("expected an update: {text}"))
}

async fn topics_of(
    client: &mut Client,
    mode: Mode,
    pattern: Option<&str>,
    hash: Option<&str>,
) -> proto::CommandGetTopicsOfNamespaceResponse {
    client
        .send(proto::CommandGetTopicsOfNamespace {
            request_id: 7,
            namespace: "public/default".into(),
            mode: Some(mode as i32),
            topics_pattern: pattern.map(String::from),
            topics_hash: hash.map(String::from),
            ..Default::default()
        })
        .await;
    *client
        .recv()
        .await
        .command
        .get_topics_of_namespace_response
        .unwrap()
}

#[tokio::test]
async fn watchers_learn_of_created_and_deleted_topics_at_once() {
    let broker = common::start_broker().await;
    let mut watcher = Client::raw(broker.pulsar_addr()).await;
    watcher
        .send(proto::CommandConnect {
            client_version: "test".into(),
            protocol_version: Some(21),
            ..Default::default()
        })
        .await;
    let connected = watcher.recv().await.command.connected.unwrap();
    assert_eq!(
        connected.feature_flags.unwrap().supports_topic_watchers,
        Some(true)
    );

    let success = watch(&mut watcher, 1, PATTERN, None)
        .await
        .watch_topic_list_success
        .unwrap();
    assert_eq!(
        (success.topic.len(), success.topics_hash.as_str()),
        (0, "00000000")
    );

    let mut producer = Client::connect(broker.pulsar_addr()).await;
    producer
        .create_producer("persistent://public/default/w-a", 1)
        .await;
    producer
        .create_producer("persistent://public/default/other", 2)
        .await;
    let mut np_producer = Client::connect(broker.pulsar_addr()).await;
    np_producer
        .create_producer("non-persistent://public/default/w-np", 3)
        .await;
    let update = next_update(&mut watcher).await;
    assert_eq!(update.new_topics, vec!["persistent://public/default/w-a"]);
    assert_eq!(
        update.topics_hash,
        vela_hash(&["persistent://public/default/w-a"])
    );

    broker
        .create_partitioned_topic("persistent://public/default/w-p", 2)
        .await
        .unwrap();
    let mut seen: Vec<String> = Vec::new();
    for _ in 0..2 {
        seen.extend(next_update(&mut watcher).await.new_topics);
    }
    seen.sort();
    assert_eq!(
        seen,
        vec![
            "persistent://public/default/w-p-partition-0",
            "persistent://public/default/w-p-partition-1"
        ]
    );

    drop(producer);
    broker
        .delete_topic("persistent://public/default/w-a")
        .await
        .unwrap();
    let update = next_update(&mut watcher).await;
    assert_eq!(
        update.deleted_topics,
        vec!["persistent://public/default/w-a"]
    );

    // GET_TOPICS_OF_NAMESPACE agrees on the list and its hash.
    let answer = topics_of(&mut watcher, Mode::Persistent, Some(PATTERN), None).await;
    assert_eq!(answer.filtered, Some(true));
    assert_eq!(answer.topics.len(), 2);
    assert_eq!(
        answer.topics_hash.as_deref(),
        Some(update.topics_hash.as_str())
    );
    let same = topics_of(
        &mut watcher,
        Mode::Persistent,
        Some(PATTERN),
        Some(&update.topics_hash),
    )
    .await;
    assert_eq!((same.changed, same.topics.len()), (Some(false), 0));
    // The pattern's domain does not matter; the mode does.
    let np = topics_of(&mut watcher, Mode::NonPersistent, Some(PATTERN), None).await;
    assert_eq!(np.topics, vec!["non-persistent://public/default/w-np"]);
    let all = topics_of(&mut watcher, Mode::All, None, None).await;
    assert_eq!((all.filtered, all.topics.len()), (Some(false), 4));

    // A second watcher with the current hash gets no list.
    let success = watch(&mut watcher, 2, PATTERN, Some(&update.topics_hash))
        .await
        .watch_topic_list_success
        .unwrap();
    assert!(success.topic.is_empty());
    let long = format!("persistent://public/default/{}", "x".repeat(60));
    let error = watch(&mut watcher, 3, &long, None).await.error.unwrap();
    assert_eq!(error.error, ServerError::NotAllowedError as i32);
    assert_eq!(
        error.message,
        "Unable to create topic list watcher: Pattern longer than maximum: 50"
    );
    let error = watch(&mut watcher, 4, "persistent://public/default/((", None)
        .await
        .error
        .unwrap();
    assert_eq!(error.error, ServerError::InvalidTopicName as i32);
    watcher
        .send(proto::CommandWatchTopicListClose {
            request_id: 9,
            watcher_id: 2,
        })
        .await;
    assert!(watcher.recv().await.command.success.is_some());
    broker.shutdown().await.unwrap();
}

/// The hash as Pulsar computes it (checked against Pulsar's own answers in
/// the unit tests of `topic_list`): CRC32C, little-endian hex.
fn vela_hash(topics: &[&str]) -> String {
    let mut sorted = topics.to_vec();
    sorted.sort();
    let crc = crc32c::crc32c(sorted.join(",").as_bytes());
    crc.to_le_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}
