//! `vela admin topics`: topics and partitioned topics, their stats and
//! subscriptions (create, reset, skip, expire, replicated status), unload,
//! terminate, lookup, offload and its status.

use anyhow::{Context, bail};
use clap::Subcommand;
use serde_json::Value;
use vela_broker::TopicName;

use super::api::{
    Api, encode, message_id_json, namespace_path_in, out, print_json, seconds, topic_path,
};

#[derive(Debug, Subcommand)]
pub(super) enum TopicsCmd {
    /// Topics of a namespace (partitions included).
    List { namespace: String },
    /// Partitioned topics of a namespace.
    ListPartitionedTopics { namespace: String },
    /// Create a non-partitioned topic.
    Create { topic: String },
    /// Set a topic's own replication clusters (over its namespace's).
    SetReplicationClusters {
        topic: String,
        /// Comma-separated cluster names.
        #[arg(short = 'c', long)]
        clusters: String,
    },
    /// Show a topic's own replication clusters (`null`: its namespace's).
    GetReplicationClusters {
        topic: String,
        /// The clusters that apply: the namespace's when the topic has none.
        #[arg(long)]
        applied: bool,
    },
    /// Remove a topic's own replication clusters.
    RemoveReplicationClusters { topic: String },
    /// Create a partitioned topic.
    CreatePartitionedTopic {
        topic: String,
        #[arg(short = 'p', long = "partitions")]
        partitions: u32,
    },
    /// Raise the partition count of a partitioned topic.
    UpdatePartitionedTopic {
        topic: String,
        #[arg(short = 'p', long = "partitions")]
        partitions: u32,
    },
    /// Partition count (0 for a non-partitioned topic).
    GetPartitionedTopicMetadata { topic: String },
    /// Delete a topic.
    Delete {
        topic: String,
        /// Close attached clients first.
        #[arg(short = 'f', long = "force")]
        force: bool,
    },
    /// Delete a partitioned topic and its partitions.
    DeletePartitionedTopic {
        topic: String,
        #[arg(short = 'f', long = "force")]
        force: bool,
    },
    /// Topic statistics.
    Stats { topic: String },
    /// Partitioned topic statistics.
    PartitionedStats {
        topic: String,
        /// Include each partition's stats.
        #[arg(long = "per-partition")]
        per_partition: bool,
    },
    /// Internal stats (ledgers, cursors).
    StatsInternal {
        topic: String,
        /// Include each ledger's metadata (replication, bookies).
        #[arg(short = 'm', long = "metadata")]
        metadata: bool,
    },
    /// Subscriptions of a topic.
    Subscriptions { topic: String },
    /// Create a subscription.
    CreateSubscription {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// earliest, latest or LEDGER:ENTRY.
        #[arg(short = 'm', long = "messageId", default_value = "latest")]
        message_id: String,
    },
    /// Delete a subscription.
    Unsubscribe {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// Even with consumers attached.
        #[arg(short = 'f', long = "force")]
        force: bool,
    },
    /// Move a subscription to a time (relative, e.g. 10m ago) or a message id.
    ResetCursor {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// How long ago (e.g. 100s, 10m, 1h).
        #[arg(short = 't', long = "time", conflicts_with = "message_id")]
        time: Option<String>,
        /// earliest, latest or LEDGER:ENTRY.
        #[arg(short = 'm', long = "messageId")]
        message_id: Option<String>,
    },
    /// Skip messages of a subscription.
    Skip {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        #[arg(short = 'n', long = "count")]
        count: u64,
    },
    /// Skip a subscription's whole backlog.
    ClearBacklog {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
    },
    /// Replicate a subscription's position to the topic's other clusters, or
    /// stop (kept with the subscription; pulsar-admin's
    /// set-replicated-subscription-status).
    SetReplicatedSubscriptionStatus {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// Replicate it.
        #[arg(
            short = 'e',
            long = "enable",
            conflicts_with = "disable",
            required_unless_present = "disable"
        )]
        enable: bool,
        /// Stop replicating it.
        #[arg(short = 'd', long = "disable")]
        disable: bool,
    },
    /// Whether a subscription is replicated (each partition's for a
    /// partitioned topic).
    GetReplicatedSubscriptionStatus {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
    },
    /// Acknowledge a subscription's messages older than a time.
    ExpireMessages {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        /// Age (e.g. 100 seconds, or 10m).
        #[arg(short = 't', long = "expireTime")]
        expire_time: String,
    },
    /// Expire messages older than a time on every subscription.
    ExpireMessagesAllSubscriptions {
        topic: String,
        #[arg(short = 't', long = "expireTime")]
        expire_time: String,
    },
    /// Unload a topic (clients reconnect).
    Unload { topic: String },
    /// Terminate a topic: it takes no more messages (prints its last id).
    Terminate { topic: String },
    /// Terminate every partition of a partitioned topic.
    PartitionedTerminate { topic: String },
    /// Which broker serves a topic.
    Lookup { topic: String },
    /// The next messages of a subscription (a missing one is created at
    /// the earliest message, as Pulsar).
    PeekMessages {
        topic: String,
        #[arg(short = 's', long = "subscription")]
        subscription: String,
        #[arg(short = 'n', long = "count", default_value_t = 1)]
        count: u64,
    },
    /// A message by ledger and entry id.
    GetMessageById {
        topic: String,
        #[arg(short = 'l', long = "ledgerId")]
        ledger: u64,
        #[arg(short = 'e', long = "entryId")]
        entry: u64,
    },
    /// The id of the first message published at or after a time.
    GetMessageId {
        topic: String,
        /// How long ago (e.g. 10m).
        #[arg(short = 'd', long = "datetime")]
        ago: String,
    },
    /// A topic's properties.
    GetProperties { topic: String },
    /// Adds or replaces properties (`-p key=value`, repeated).
    UpdateProperties {
        topic: String,
        #[arg(short = 'p', long = "property")]
        properties: Vec<String>,
    },
    /// Removes a property.
    RemoveProperties {
        topic: String,
        #[arg(short = 'k', long = "key")]
        key: String,
    },
    /// Offload the topic's older ledgers to object storage, keeping about
    /// this many of the newest bytes on the bookies (as pulsar-admin).
    Offload {
        topic: String,
        /// Bytes to keep on the bookies.
        #[arg(short = 's', long = "size-threshold")]
        size_threshold: u64,
    },
    /// Status of the topic's last offload.
    OffloadStatus { topic: String },
}

/// The first ledger to keep so that the newest ledgers hold no more than
/// `threshold_bytes` (pulsar-admin's rule, from the internal stats' ledger
/// list, oldest first): its entry 0, or `None` when nothing needs to go.
fn first_ledger_within_threshold(ledgers: &[(u64, u64)], threshold_bytes: u64) -> Option<u64> {
    let mut suffix_bytes = 0u64;
    let mut previous = ledgers.last()?.0;
    for &(ledger_id, size_bytes) in ledgers.iter().rev() {
        suffix_bytes = suffix_bytes.saturating_add(size_bytes);
        if suffix_bytes > threshold_bytes {
            return Some(previous);
        }
        previous = ledger_id;
    }
    None
}

/// A message id as Java's `MessageIdImpl.toString()`: `ledger:entry:partition`.
fn message_id_text(id: &Value) -> String {
    let field = |name: &str| id.get(name).and_then(Value::as_i64).unwrap_or(-1);
    let (ledger, entry) = (field("ledgerId"), field("entryId"));
    format!("{ledger}:{entry}:{}", field("partitionIndex"))
}

pub(super) fn namespace_topics_path(namespace: &str) -> anyhow::Result<String> {
    namespace_path_in("persistent", namespace)
}

pub(super) fn subscription_path(topic: &str, subscription: &str) -> anyhow::Result<String> {
    Ok(format!(
        "{}/subscription/{}",
        topic_path(topic)?,
        encode(subscription)
    ))
}

pub(super) fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as i64)
}

pub(super) fn topics(api: &Api, cmd: TopicsCmd) -> anyhow::Result<()> {
    use TopicsCmd as T;
    let done = |r: anyhow::Result<String>| r.map(|_| ());
    match cmd {
        T::PeekMessages {
            topic,
            subscription,
            count,
        } => super::policies::peek_messages(api, &topic, &subscription, count),
        T::GetMessageById {
            topic,
            ledger,
            entry,
        } => super::policies::message_by_id(api, &topic, ledger, entry),
        T::GetMessageId { topic, ago } => {
            super::policies::message_id_at(api, &topic, now_ms() - seconds(&ago)? * 1000)
        }
        T::GetProperties { topic } => super::policies::properties(api, &topic, &[], None),
        T::UpdateProperties { topic, properties } => {
            super::policies::properties(api, &topic, &properties, None)
        }
        T::RemoveProperties { topic, key } => {
            super::policies::properties(api, &topic, &[], Some(&key))
        }
        T::List { namespace } => print_json(&api.get_json(&namespace_topics_path(&namespace)?)?),
        T::SetReplicationClusters { topic, clusters } => {
            super::clusters::set_replication(api, &topic_path(&topic)?, &clusters)
        }
        T::GetReplicationClusters { topic, applied } => super::clusters::get_replication(
            api,
            &topic_path(&topic)?,
            if applied { "?applied=true" } else { "" },
        ),
        T::RemoveReplicationClusters { topic } => done(api.call(
            "DELETE",
            &format!("{}/replication", topic_path(&topic)?),
            None,
        )),
        T::ListPartitionedTopics { namespace } => print_json(&api.get_json(&format!(
            "{}/partitioned",
            namespace_topics_path(&namespace)?
        ))?),
        T::Create { topic } => done(api.call("PUT", &topic_path(&topic)?, Some("{}"))),
        T::CreatePartitionedTopic { topic, partitions } => done(api.call(
            "PUT",
            &format!("{}/partitions", topic_path(&topic)?),
            Some(&partitions.to_string()),
        )),
        T::UpdatePartitionedTopic { topic, partitions } => done(api.call(
            "POST",
            &format!("{}/partitions", topic_path(&topic)?),
            Some(&partitions.to_string()),
        )),
        T::GetPartitionedTopicMetadata { topic } => {
            print_json(&api.get_json(&format!("{}/partitions", topic_path(&topic)?))?)
        }
        T::Delete { topic, force } => done(api.call(
            "DELETE",
            &format!("{}?force={force}", topic_path(&topic)?),
            None,
        )),
        T::DeletePartitionedTopic { topic, force } => done(api.call(
            "DELETE",
            &format!("{}/partitions?force={force}", topic_path(&topic)?),
            None,
        )),
        T::Stats { topic } => print_json(&api.get_json(&format!("{}/stats", topic_path(&topic)?))?),
        T::PartitionedStats {
            topic,
            per_partition,
        } => print_json(&api.get_json(&format!(
            "{}/partitioned-stats?perPartition={per_partition}",
            topic_path(&topic)?
        ))?),
        T::StatsInternal { topic, metadata } => print_json(&api.get_json(&format!(
            "{}/internalStats?metadata={metadata}",
            topic_path(&topic)?
        ))?),
        T::Subscriptions { topic } => {
            print_json(&api.get_json(&format!("{}/subscriptions", topic_path(&topic)?))?)
        }
        T::CreateSubscription {
            topic,
            subscription,
            message_id,
        } => done(api.call(
            "PUT",
            &subscription_path(&topic, &subscription)?,
            Some(&message_id_json(&message_id)?),
        )),
        T::Unsubscribe {
            topic,
            subscription,
            force,
        } => done(api.call(
            "DELETE",
            &format!(
                "{}?force={force}",
                subscription_path(&topic, &subscription)?
            ),
            None,
        )),
        T::ResetCursor {
            topic,
            subscription,
            time,
            message_id,
        } => {
            let path = subscription_path(&topic, &subscription)?;
            match (time, message_id) {
                (Some(time), None) => {
                    let timestamp = now_ms() - seconds(&time)? * 1000;
                    done(api.call("POST", &format!("{path}/resetcursor/{timestamp}"), None))
                }
                (None, Some(id)) => done(api.call(
                    "POST",
                    &format!("{path}/resetcursor"),
                    Some(&message_id_json(&id)?),
                )),
                _ => bail!("give exactly one of --time and --messageId"),
            }
        }
        T::Skip {
            topic,
            subscription,
            count,
        } => done(api.call(
            "POST",
            &format!("{}/skip/{count}", subscription_path(&topic, &subscription)?),
            None,
        )),
        T::ClearBacklog {
            topic,
            subscription,
        } => done(api.call(
            "POST",
            &format!("{}/skip_all", subscription_path(&topic, &subscription)?),
            None,
        )),
        T::SetReplicatedSubscriptionStatus {
            topic,
            subscription,
            enable,
            disable: _,
        } => done(api.call(
            "POST",
            &format!(
                "{}/replicatedSubscriptionStatus",
                subscription_path(&topic, &subscription)?
            ),
            Some(if enable { "true" } else { "false" }),
        )),
        T::GetReplicatedSubscriptionStatus {
            topic,
            subscription,
        } => print_json(&api.get_json(&format!(
            "{}/replicatedSubscriptionStatus",
            subscription_path(&topic, &subscription)?
        ))?),
        T::ExpireMessages {
            topic,
            subscription,
            expire_time,
        } => done(api.call(
            "POST",
            &format!(
                "{}/expireMessages/{}",
                subscription_path(&topic, &subscription)?,
                seconds(&expire_time)?
            ),
            None,
        )),
        T::ExpireMessagesAllSubscriptions { topic, expire_time } => done(api.call(
            "POST",
            &format!(
                "{}/all_subscription/expireMessages/{}",
                topic_path(&topic)?,
                seconds(&expire_time)?
            ),
            None,
        )),
        T::Unload { topic } => {
            done(api.call("PUT", &format!("{}/unload", topic_path(&topic)?), None))
        }
        T::Terminate { topic } => {
            let text = api.call("POST", &format!("{}/terminate", topic_path(&topic)?), None)?;
            let id = message_id_text(&serde_json::from_str(&text)?);
            out(&format!("Topic successfully terminated at {id}"))
        }
        T::PartitionedTerminate { topic } => {
            let path = format!("{}/terminate/partitions", topic_path(&topic)?);
            let ids: std::collections::BTreeMap<u32, Value> =
                serde_json::from_str(&api.call("POST", &path, None)?)?;
            let ids: Vec<String> = ids
                .iter()
                .map(|(i, id)| format!("{i}={}", message_id_text(id)))
                .collect();
            out(&format!(
                "Topic successfully terminated at {{{}}}",
                ids.join(", ")
            ))
        }
        T::Offload {
            topic,
            size_threshold,
        } => {
            let path = topic_path(&topic)?;
            let stats = api.get_json(&format!("{path}/internalStats"))?;
            let ledgers: Vec<(u64, u64)> = stats["ledgers"]
                .as_array()
                .map(|ledgers| {
                    ledgers
                        .iter()
                        .filter_map(|l| Some((l["ledgerId"].as_u64()?, l["size"].as_u64()?)))
                        .collect()
                })
                .unwrap_or_default();
            if ledgers.is_empty() {
                bail!("Topic doesn't have any data");
            }
            let Some(ledger_id) = first_ledger_within_threshold(&ledgers, size_threshold) else {
                return out("Nothing to offload");
            };
            let id = format!("{ledger_id}:0");
            done(api.call(
                "PUT",
                &format!("{path}/offload"),
                Some(&message_id_json(&id)?),
            ))?;
            out(&format!(
                "Offload triggered for {topic} for messages before {ledger_id}:0:-1"
            ))
        }
        T::OffloadStatus { topic } => {
            print_json(&api.get_json(&format!("{}/offload", topic_path(&topic)?))?)
        }
        T::Lookup { topic } => {
            let name = TopicName::parse(&topic).with_context(|| format!("bad topic {topic:?}"))?;
            let path = format!(
                "/lookup/v2/topic/{}/{}/{}/{}",
                name.domain.as_str(),
                encode(&name.namespace.tenant),
                encode(&name.namespace.namespace),
                encode(&name.local)
            );
            print_json(&api.get_json(&path)?)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_offload_point_keeps_the_newest_bytes() {
        let ledgers = [(1, 100), (2, 100), (3, 100), (4, 10)];
        assert_eq!(first_ledger_within_threshold(&ledgers, 0), Some(4));
        assert_eq!(first_ledger_within_threshold(&ledgers, 150), Some(3));
        assert_eq!(first_ledger_within_threshold(&ledgers, 210), Some(2));
        assert_eq!(first_ledger_within_threshold(&ledgers, 310), None);
        assert_eq!(first_ledger_within_threshold(&[], 0), None);
    }
}
