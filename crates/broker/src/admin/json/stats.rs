//! Pulsar's stats documents (TopicStats, PartitionedTopicStats,
//! PersistentTopicInternalStats) built from the broker's own stats.
//!
//! Owns: their field names and shapes as Pulsar's Java classes serialize
//! them. Never: reads a topic or the metadata store (its inputs are
//! snapshots taken by the caller).

use std::collections::BTreeMap;

use serde_json::{Value, json};
use vela_log::{LedgerDescription, LedgerSummary, Position};

use crate::stats::{SubscriptionStats, TopicStats};

fn position_text(position: Option<Position>) -> String {
    match position {
        Some(p) => format!("{}:{}", p.ledger_id, p.entry_id),
        None => "-1:-1".to_string(),
    }
}

/// Adds `msgDropRate` to a non-persistent topic's, publisher's or
/// subscription's document (Pulsar's `NonPersistent*Stats`).
fn with_drop_rate(mut document: Value, rate: Option<f64>) -> Value {
    if let (Value::Object(map), Some(rate)) = (&mut document, rate) {
        map.insert("msgDropRate".into(), json!(rate));
    }
    document
}

pub(super) fn subscription_json(sub: &SubscriptionStats) -> Value {
    let consumers: Vec<Value> = sub
        .consumers
        .iter()
        .map(|c| {
            json!({
                "msgRateOut": 0.0,
                "msgThroughputOut": 0.0,
                "bytesOutCounter": 0,
                "msgOutCounter": c.msg_out_counter,
                "msgRateRedeliver": 0.0,
                "chunkedMessageRate": 0.0,
                "consumerName": c.consumer_name,
                "availablePermits": c.available_permits,
                "unackedMessages": c.unacked_messages,
                "avgMessagesPerEntry": 0,
                "blockedConsumerOnUnackedMsgs": false,
                "address": c.address,
                "connectedSince": "",
                "clientVersion": c.client_version,
                "lastAckedTimestamp": 0,
                "lastConsumedTimestamp": 0,
                "lastConsumedFlowTimestamp": c.last_flow_ms,
                "readPositionWhenJoining": c.joined_fence.map(|p| position_text(Some(p))),
                "metadata": c.metadata
            })
        })
        .collect();
    // Key_Shared consumers that joined while entries were out, with the
    // position they take nothing at or after until earlier ones are acked.
    let after_mark_delete: serde_json::Map<String, Value> = sub
        .consumers
        .iter()
        .filter_map(|c| {
            let fence = c.joined_fence?;
            Some((c.consumer_name.clone(), json!(position_text(Some(fence)))))
        })
        .collect();
    let document = json!({
        "msgRateOut": sub.msg_rate_out,
        "msgThroughputOut": sub.msg_throughput_out,
        "bytesOutCounter": sub.bytes_out_counter,
        "msgOutCounter": sub.msg_out_counter,
        "msgRateRedeliver": sub.msg_rate_redeliver,
        "messageAckRate": 0.0,
        "chunkedMessageRate": 0,
        "msgBacklog": sub.msg_backlog,
        "backlogSize": 0,
        "earliestMsgPublishTimeInBacklog": 0,
        "msgBacklogNoDelayed": sub.msg_backlog,
        "blockedSubscriptionOnUnackedMsgs": false,
        "msgDelayed": 0,
        "msgInReplay": sub.msg_in_replay,
        "unackedMessages": sub.unacked_messages,
        "type": sub.sub_type,
        "activeConsumerName": sub.active_consumer,
        "msgRateExpired": 0.0,
        "totalMsgExpired": sub.msg_expired_counter,
        "lastExpireTimestamp": 0,
        "lastConsumedFlowTimestamp": 0,
        "lastConsumedTimestamp": 0,
        "lastAckedTimestamp": 0,
        "lastMarkDeleteAdvancedTimestamp": 0,
        "consumers": consumers,
        "isDurable": sub.durable,
        "isReplicated": sub.replicated,
        "allowOutOfOrderDelivery": false,
        "consumersAfterMarkDeletePosition": after_mark_delete,
        "nonContiguousDeletedMessagesRanges": 0,
        "nonContiguousDeletedMessagesRangesSerializedSize": 0,
        "delayedMessageIndexSizeInBytes": 0,
        "subscriptionProperties": {},
        "filterProcessedMsgCount": 0,
        "filterAcceptedMsgCount": 0,
        "filterRejectedMsgCount": 0,
        "filterRescheduledMsgCount": 0
    });
    with_drop_rate(document, sub.msg_drop_rate)
}

/// Pulsar's TopicStats document.
pub fn topic_stats_json(stats: &TopicStats, owner_broker: &str) -> Value {
    let publishers: Vec<Value> = stats
        .publishers
        .iter()
        .map(|p| {
            let average_msg_size = if p.msg_rate_in > 0.0 {
                p.msg_throughput_in / p.msg_rate_in
            } else {
                0.0
            };
            let document = json!({
                "accessMode": p.access_mode,
                "msgRateIn": p.msg_rate_in,
                "msgThroughputIn": p.msg_throughput_in,
                "averageMsgSize": average_msg_size,
                "chunkedMessageRate": 0.0,
                "producerId": p.producer_id,
                "supportsPartialProducer": false,
                "producerName": p.producer_name,
                "address": p.address,
                "connectedSince": "",
                "clientVersion": p.client_version,
                "metadata": p.metadata
            });
            with_drop_rate(document, p.msg_drop_rate)
        })
        .collect();
    let subscriptions: serde_json::Map<String, Value> = stats
        .subscriptions
        .iter()
        .map(|s| (s.name.clone(), subscription_json(s)))
        .collect();
    let average_msg_size = if stats.msg_in_counter == 0 {
        0.0
    } else {
        stats.bytes_in_counter as f64 / stats.msg_in_counter as f64
    };
    let backlog_size: u64 = stats
        .subscriptions
        .iter()
        .map(|s| s.msg_backlog)
        .max()
        .unwrap_or(0);
    let mut document = json!({
        "msgRateIn": stats.msg_rate_in,
        "msgThroughputIn": stats.msg_throughput_in,
        "msgRateOut": stats.msg_rate_out,
        "msgThroughputOut": stats.msg_throughput_out,
        "bytesInCounter": stats.bytes_in_counter,
        "msgInCounter": stats.msg_in_counter,
        "systemTopicBytesInCounter": 0,
        "bytesOutCounter": stats.bytes_out_counter,
        "msgOutCounter": stats.msg_out_counter,
        "bytesOutInternalCounter": 0,
        "averageMsgSize": average_msg_size,
        "msgChunkPublished": false,
        "storageSize": stats.storage_size_bytes,
        "backlogSize": backlog_size,
        "backlogQuotaLimitSize": -1,
        "backlogQuotaLimitTime": -1,
        "oldestBacklogMessageAgeSeconds": -1,
        "publishRateLimitedTimes": 0,
        "earliestMsgPublishTimeInBacklogs": 0,
        "offloadedStorageSize": 0,
        "lastOffloadLedgerId": 0,
        "lastOffloadSuccessTimeStamp": 0,
        "lastOffloadFailureTimeStamp": 0,
        "ongoingTxnCount": stats.ongoing_txn_count,
        "abortedTxnCount": stats.aborted_txn_count,
        "committedTxnCount": stats.committed_txn_count,
        "waitingPublishers": 0,
        "publishers": publishers,
        "subscriptions": subscriptions,
        "replication": replication_json(&stats.replication),
        "deduplicationStatus": if stats.deduplication_enabled { "Enabled" } else { "Disabled" },
        "nonContiguousDeletedMessagesRanges": 0,
        "nonContiguousDeletedMessagesRangesSerializedSize": 0,
        "delayedMessageIndexSizeInBytes": 0,
        "compaction": {
            "lastCompactionRemovedEventCount": 0,
            "lastCompactionSucceedTimestamp": 0,
            "lastCompactionFailedTimestamp": 0,
            "lastCompactionDurationTimeInMills": 0
        },
        "ownerBroker": owner_broker
    });
    if let (Value::Object(map), Some(_)) = (&mut document, stats.msg_drop_rate) {
        // Nothing is stored: no deduplication status (as Pulsar's document).
        map.remove("deduplicationStatus");
    }
    with_drop_rate(document, stats.msg_drop_rate)
}

/// Pulsar's `replication` map of topic stats: remote cluster →
/// ReplicatorStats (the `In` fields: what that cluster's replicator
/// publishes here).
fn replication_json(replication: &[crate::stats::ReplicationStats]) -> Value {
    let map: serde_json::Map<String, Value> = replication
        .iter()
        .map(|r| {
            let doc = json!({
                "msgRateIn": r.msg_rate_in,
                "msgInCount": r.msg_in_counter,
                "bytesInCount": r.bytes_in_counter,
                "msgThroughputIn": r.msg_throughput_in,
                "msgRateOut": r.msg_rate_out,
                "msgOutCount": r.msg_out_counter,
                "bytesOutCount": r.bytes_out_counter,
                "msgThroughputOut": r.msg_throughput_out,
                "msgRateExpired": 0.0,
                "replicationBacklog": r.backlog,
                "connected": r.connected,
                "replicationDelayInSeconds": r.delay_seconds,
                "inboundConnection": r.inbound_connection,
                "inboundConnectedSince": null,
                "outboundConnection": null,
                "outboundConnectedSince": null,
            });
            (r.remote_cluster.clone(), doc)
        })
        .collect();
    Value::Object(map)
}

/// Sums partitions' stats into one (Pulsar's partitioned-stats aggregate).
pub fn aggregate(topic: &str, partitions: &[TopicStats]) -> TopicStats {
    let mut out = TopicStats {
        topic: topic.to_string(),
        ..TopicStats::default()
    };
    let mut subscriptions: BTreeMap<String, SubscriptionStats> = BTreeMap::new();
    for p in partitions {
        out.msg_in_counter += p.msg_in_counter;
        out.bytes_in_counter += p.bytes_in_counter;
        out.msg_out_counter += p.msg_out_counter;
        out.bytes_out_counter += p.bytes_out_counter;
        out.entries += p.entries;
        out.storage_size_bytes += p.storage_size_bytes;
        out.ledgers += p.ledgers;
        out.msg_rate_in += p.msg_rate_in;
        out.msg_throughput_in += p.msg_throughput_in;
        out.msg_rate_out += p.msg_rate_out;
        out.msg_throughput_out += p.msg_throughput_out;
        out.deduplication_enabled |= p.deduplication_enabled;
        out.publish_latency.merge(&p.publish_latency);
        out.storage_write_latency.merge(&p.storage_write_latency);
        out.publishers.extend(p.publishers.iter().cloned());
        if let Some(rate) = p.msg_drop_rate {
            out.msg_drop_rate = Some(out.msg_drop_rate.unwrap_or(0.0) + rate);
        }
        out.msg_drop_counter += p.msg_drop_counter;
        for r in &p.replication {
            match out
                .replication
                .iter_mut()
                .find(|o| o.remote_cluster == r.remote_cluster)
            {
                Some(o) => {
                    o.msg_rate_in += r.msg_rate_in;
                    o.msg_throughput_in += r.msg_throughput_in;
                    o.msg_in_counter += r.msg_in_counter;
                    o.bytes_in_counter += r.bytes_in_counter;
                    o.inbound_connection =
                        o.inbound_connection.take().or(r.inbound_connection.clone());
                    o.msg_rate_out += r.msg_rate_out;
                    o.msg_throughput_out += r.msg_throughput_out;
                    o.msg_out_counter += r.msg_out_counter;
                    o.bytes_out_counter += r.bytes_out_counter;
                    o.backlog += r.backlog;
                    o.connected &= r.connected;
                    o.delay_seconds = o.delay_seconds.max(r.delay_seconds);
                }
                None => out.replication.push(r.clone()),
            }
        }
        out.ongoing_txn_count += p.ongoing_txn_count;
        out.committed_txn_count += p.committed_txn_count;
        out.aborted_txn_count += p.aborted_txn_count;
        for s in &p.subscriptions {
            let merged = subscriptions
                .entry(s.name.clone())
                .or_insert_with(|| SubscriptionStats {
                    name: s.name.clone(),
                    sub_type: s.sub_type.clone(),
                    durable: s.durable,
                    ..SubscriptionStats::default()
                });
            merged.replicated |= s.replicated;
            merged.msg_backlog += s.msg_backlog;
            merged.unacked_messages += s.unacked_messages;
            merged.msg_out_counter += s.msg_out_counter;
            merged.bytes_out_counter += s.bytes_out_counter;
            merged.msg_redeliver_counter += s.msg_redeliver_counter;
            merged.msg_rate_out += s.msg_rate_out;
            merged.msg_throughput_out += s.msg_throughput_out;
            merged.msg_rate_redeliver += s.msg_rate_redeliver;
            merged.msg_expired_counter += s.msg_expired_counter;
            merged.msg_in_replay += s.msg_in_replay;
            if let Some(rate) = s.msg_drop_rate {
                merged.msg_drop_rate = Some(merged.msg_drop_rate.unwrap_or(0.0) + rate);
            }
            merged.msg_drop_counter += s.msg_drop_counter;
            merged.consumers.extend(s.consumers.iter().cloned());
        }
    }
    out.subscriptions = subscriptions.into_values().collect();
    out
}

/// Pulsar's PartitionedTopicStats document.
pub fn partitioned_stats_json(
    topic: &str,
    partitions: &[TopicStats],
    partition_count: u32,
    per_partition: bool,
    owner_broker: &str,
) -> Value {
    let mut document = topic_stats_json(&aggregate(topic, partitions), owner_broker);
    let per: serde_json::Map<String, Value> = if per_partition {
        partitions
            .iter()
            .map(|p| (p.topic.clone(), topic_stats_json(p, owner_broker)))
            .collect()
    } else {
        serde_json::Map::new()
    };
    if let Value::Object(map) = &mut document {
        map.insert("metadata".into(), json!({ "partitions": partition_count }));
        map.insert("partitions".into(), Value::Object(per));
    }
    document
}

/// BookKeeper's LedgerMetadata text, as Pulsar puts it in internal stats.
pub fn ledger_metadata_text(description: &LedgerDescription) -> String {
    let ensembles: Vec<String> = description
        .ensembles
        .iter()
        .map(|(first, bookies)| format!("{first}=[{}]", bookies.join(", ")))
        .collect();
    format!(
        "LedgerMetadata{{formatVersion=3, ensembleSize={}, writeQuorumSize={}, \
         ackQuorumSize={}, state={}, digestType=CRC32C, password=base64:, ensembles={{{}}}, \
         ctime={}}}",
        description.persistence.ensemble,
        description.persistence.write_quorum,
        description.persistence.ack_quorum,
        description.state,
        ensembles.join(", "),
        description.ctime_ms
    )
}

/// Inputs of an internal-stats document.
#[derive(Debug)]
pub struct InternalStatsInput<'a> {
    /// The log's ledgers, oldest first (the last is being written).
    pub ledgers: &'a [LedgerSummary],
    /// Metadata text per ledger (only with `?metadata=true`).
    pub metadata: &'a BTreeMap<u64, String>,
    /// Newest confirmed entry.
    pub last_confirmed: Option<Position>,
    /// Entries appended since the topic opened here.
    pub entries_added: u64,
    /// Subscriptions (mark-delete and read positions).
    pub subscriptions: &'a [SubscriptionStats],
}

/// Pulsar's PersistentTopicInternalStats document.
pub fn internal_stats_json(input: &InternalStatsInput<'_>) -> Value {
    let ledgers: Vec<Value> = input
        .ledgers
        .iter()
        .map(|l| {
            json!({
                "ledgerId": l.ledger_id,
                "entries": l.entries,
                "size": l.size_bytes,
                "timestamp": l.created_unix_ms,
                "offloaded": l.offloaded,
                "underReplicated": false,
                "metadata": input.metadata.get(&l.ledger_id),
            })
        })
        .collect();
    let current = input.ledgers.last();
    let cursors: serde_json::Map<String, Value> = input
        .subscriptions
        .iter()
        .filter(|s| s.durable)
        .map(|s| {
            (
                s.name.clone(),
                json!({
                    "markDeletePosition": position_text(s.mark_delete),
                    "readPosition": position_text(s.read_position),
                    "waitingReadOp": s.waiting_for_entries,
                    "pendingReadOps": u8::from(s.read_in_flight),
                    "messagesConsumedCounter": s.msg_out_counter,
                    "cursorLedger": -1,
                    "cursorLedgerLastEntry": -1,
                    "individuallyDeletedMessages": "[]",
                    "lastLedgerSwitchTimestamp": "",
                    "state": "Open",
                    "active": !s.consumers.is_empty(),
                    "numberOfEntriesSinceFirstNotAckedMessage": s.msg_backlog,
                    "totalNonContiguousDeletedMessagesRange": 0,
                    "subscriptionHavePendingRead": s.read_in_flight,
                    "subscriptionHavePendingReplayRead": false,
                    "properties": s.cursor_properties
                }),
            )
        })
        .collect();
    let last_confirmed = match (input.last_confirmed, current) {
        (Some(p), _) => position_text(Some(p)),
        (None, Some(l)) => format!("{}:-1", l.ledger_id),
        (None, None) => "-1:-1".to_string(),
    };
    json!({
        "entriesAddedCounter": input.entries_added,
        "numberOfEntries": input.ledgers.iter().map(|l| l.entries).sum::<u64>(),
        "totalSize": input.ledgers.iter().map(|l| l.size_bytes).sum::<u64>(),
        "currentLedgerEntries": current.map_or(0, |l| l.entries),
        "currentLedgerSize": current.map_or(0, |l| l.size_bytes),
        "lastLedgerCreatedTimestamp": current.map_or(String::new(), |l| l.created_unix_ms.to_string()),
        "waitingCursorsCount": 0,
        "pendingAddEntriesCount": 0,
        "lastConfirmedEntry": last_confirmed,
        "state": "LedgerOpened",
        "ledgers": ledgers,
        "cursors": cursors,
        "schemaLedgers": [],
        "compactedLedger": {
            "ledgerId": -1, "entries": -1, "size": -1, "offloaded": false, "underReplicated": false
        }
    })
}
