//! Compiles `proto/pulsar.proto` into Rust types with prost-build.
//!
//! protoc comes from `protoc-bin-vendored`, so building this crate needs no
//! system protoc. `bytes` fields become `bytes::Bytes` so that decoding from a
//! `Bytes` buffer slices instead of copying.

/// Every sub-message field of BaseCommand (all fields but `type`).
const BASE_COMMAND_BODIES: &[&str] = &[
    "connect",
    "connected",
    "subscribe",
    "producer",
    "send",
    "send_receipt",
    "send_error",
    "message",
    "ack",
    "flow",
    "unsubscribe",
    "success",
    "error",
    "close_producer",
    "close_consumer",
    "producer_success",
    "ping",
    "pong",
    "redeliverUnacknowledgedMessages",
    "partitionMetadata",
    "partitionMetadataResponse",
    "lookupTopic",
    "lookupTopicResponse",
    "consumerStats",
    "consumerStatsResponse",
    "reachedEndOfTopic",
    "seek",
    "getLastMessageId",
    "getLastMessageIdResponse",
    "active_consumer_change",
    "getTopicsOfNamespace",
    "getTopicsOfNamespaceResponse",
    "getSchema",
    "getSchemaResponse",
    "authChallenge",
    "authResponse",
    "ackResponse",
    "getOrCreateSchema",
    "getOrCreateSchemaResponse",
    "newTxn",
    "newTxnResponse",
    "addPartitionToTxn",
    "addPartitionToTxnResponse",
    "addSubscriptionToTxn",
    "addSubscriptionToTxnResponse",
    "endTxn",
    "endTxnResponse",
    "endTxnOnPartition",
    "endTxnOnPartitionResponse",
    "endTxnOnSubscription",
    "endTxnOnSubscriptionResponse",
    "tcClientConnectRequest",
    "tcClientConnectResponse",
    "watchTopicList",
    "watchTopicListSuccess",
    "watchTopicUpdate",
    "watchTopicListClose",
    "topicMigrated",
];

fn main() -> Result<(), Box<dyn std::error::Error>> {
    const PROTO: &str = "proto/pulsar.proto";
    println!("cargo:rerun-if-changed={PROTO}");
    println!("cargo:rerun-if-changed=build.rs");

    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    let mut config = prost_build::Config::new();
    config.protoc_executable(protoc);
    config.bytes(["."]);
    // One frame carries one command: boxing the ~60 optional sub-messages keeps
    // BaseCommand small (a pointer each) so creating and moving it is cheap.
    for field in BASE_COMMAND_BODIES {
        config.boxed(format!(".pulsar.proto.BaseCommand.{field}"));
    }
    config.compile_protos(&[PROTO], &["proto"])?;
    Ok(())
}
