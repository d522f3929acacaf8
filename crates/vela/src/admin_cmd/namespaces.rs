//! `vela admin namespaces`: namespaces, their permissions and bundles, and
//! their policies (persistence, retention, TTL, deduplication, backlog
//! quotas, ...).

use anyhow::bail;
use clap::Subcommand;
use serde_json::Value;

use super::api::{Api, bytes, encode, namespace_path, out, print_json, seconds, split_list};

#[derive(Debug, Subcommand)]
pub(super) enum NamespacesCmd {
    /// List a tenant's namespaces.
    List { tenant: String },
    /// Topics of a namespace.
    Topics { namespace: String },
    /// Show a namespace's policies.
    Policies { namespace: String },
    /// Show the roles granted actions on a namespace.
    Permissions { namespace: String },
    /// Grant a role actions (produce, consume) on a namespace.
    GrantPermission {
        namespace: String,
        #[arg(long)]
        role: String,
        /// Comma-separated: produce, consume (functions, sources, sinks,
        /// packages are kept but mean nothing here).
        #[arg(long)]
        actions: String,
    },
    /// Revoke a role's grant on a namespace.
    RevokePermission {
        namespace: String,
        #[arg(long)]
        role: String,
    },
    /// Create a namespace.
    Create { namespace: String },
    /// Set the clusters the namespace's topics are replicated among.
    SetClusters {
        namespace: String,
        /// Comma-separated cluster names (the local one included).
        #[arg(short = 'c', long)]
        clusters: String,
    },
    /// Show the namespace's replication clusters.
    GetClusters { namespace: String },
    /// Delete an empty namespace.
    Delete { namespace: String },
    /// List the namespace's bundles (hash ranges of topic names).
    Bundles { namespace: String },
    /// Unload a bundle (its topics move; the next lookup picks an owner).
    Unload {
        namespace: String,
        /// The bundle, e.g. 0x00000000_0x40000000.
        #[arg(short = 'b', long)]
        bundle: String,
    },
    /// Split a bundle in two halves (both stay on its owner).
    SplitBundle {
        namespace: String,
        /// The bundle, e.g. 0x00000000_0x40000000.
        #[arg(short = 'b', long)]
        bundle: String,
    },
    /// Show the persistence policy.
    GetPersistence { namespace: String },
    /// Set the persistence policy (applies from each topic's next ledger).
    SetPersistence {
        namespace: String,
        /// Bookies a ledger is striped over.
        #[arg(short = 'e', long = "bookkeeper-ensemble")]
        ensemble: u32,
        /// Copies of each entry.
        #[arg(short = 'w', long = "bookkeeper-write-quorum")]
        write_quorum: u32,
        /// Copies acknowledged before a publish succeeds.
        #[arg(short = 'a', long = "bookkeeper-ack-quorum")]
        ack_quorum: u32,
        /// Mark-delete rate (accepted, not applied).
        #[arg(short = 'r', long = "ml-mark-delete-max-rate", default_value_t = 0.0)]
        mark_delete_rate: f64,
    },
    /// Remove the persistence policy (back to the broker default).
    RemovePersistence { namespace: String },
    /// Show the retention policy.
    GetRetention { namespace: String },
    /// Set the retention policy.
    SetRetention {
        namespace: String,
        /// Time (e.g. 100m, 3h, 2d, -1 for no limit).
        #[arg(short = 't', long = "time", allow_hyphen_values = true)]
        time: String,
        /// Size (e.g. 10M, 16G, -1 for no limit).
        #[arg(short = 's', long = "size", allow_hyphen_values = true)]
        size: String,
    },
    /// Remove the retention policy.
    RemoveRetention { namespace: String },
    /// Show the message TTL (seconds).
    GetMessageTtl { namespace: String },
    /// Set the message TTL.
    SetMessageTtl {
        namespace: String,
        /// TTL in seconds (pulsar-admin's `-ttl`).
        #[arg(long = "messageTTL", alias = "ttl")]
        ttl: i64,
    },
    /// Remove the message TTL.
    RemoveMessageTtl { namespace: String },
    /// Show whether deduplication is on.
    GetDeduplication { namespace: String },
    /// Turn deduplication on or off.
    SetDeduplication {
        namespace: String,
        /// Enable.
        #[arg(short = 'e', long = "enable", conflicts_with = "disable")]
        enable: bool,
        /// Disable.
        #[arg(short = 'd', long = "disable")]
        disable: bool,
    },
    /// Show the backlog quotas.
    GetBacklogQuotas { namespace: String },
    /// Set a backlog quota.
    SetBacklogQuota {
        namespace: String,
        /// Size limit (e.g. 10M, 16G).
        #[arg(short = 'l', long = "limit", allow_hyphen_values = true)]
        limit: Option<String>,
        /// Time limit (e.g. 3h; pulsar-admin's `-lt`).
        #[arg(long = "limitTime", alias = "lt", allow_hyphen_values = true)]
        limit_time: Option<String>,
        /// producer_request_hold, producer_exception or consumer_backlog_eviction.
        #[arg(short = 'p', long = "policy")]
        policy: String,
        /// destination_storage or message_age.
        #[arg(short = 't', long = "type", default_value = "destination_storage")]
        quota_type: String,
    },
    /// Remove a backlog quota.
    RemoveBacklogQuota {
        namespace: String,
        /// destination_storage or message_age.
        #[arg(short = 't', long = "type", default_value = "destination_storage")]
        quota_type: String,
    },
}

pub(super) fn namespaces(api: &Api, cmd: NamespacesCmd) -> anyhow::Result<()> {
    use NamespacesCmd as N;
    match cmd {
        N::List { tenant } => {
            print_json(&api.get_json(&format!("/admin/v2/namespaces/{}", encode(&tenant)))?)
        }
        N::Topics { namespace } => {
            print_json(&api.get_json(&format!("{}/topics", namespace_path(&namespace)?))?)
        }
        N::Policies { namespace } => print_json(&api.get_json(&namespace_path(&namespace)?)?),
        N::SetClusters {
            namespace,
            clusters,
        } => super::clusters::set_replication(api, &namespace_path(&namespace)?, &clusters),
        N::GetClusters { namespace } => {
            super::clusters::get_replication(api, &namespace_path(&namespace)?, "")
        }
        N::Permissions { namespace } => {
            print_json(&api.get_json(&format!("{}/permissions", namespace_path(&namespace)?))?)
        }
        N::GrantPermission {
            namespace,
            role,
            actions,
        } => {
            let path = format!(
                "{}/permissions/{}",
                namespace_path(&namespace)?,
                encode(&role)
            );
            let actions = serde_json::to_string(&split_list(&actions))?;
            api.call("POST", &path, Some(&actions))?;
            Ok(())
        }
        N::RevokePermission { namespace, role } => {
            let path = format!(
                "{}/permissions/{}",
                namespace_path(&namespace)?,
                encode(&role)
            );
            api.call("DELETE", &path, None)?;
            Ok(())
        }
        N::Bundles { namespace } => {
            print_json(&api.get_json(&format!("{}/bundles", namespace_path(&namespace)?))?)
        }
        N::Unload { namespace, bundle } => {
            let path = format!("{}/{}/unload", namespace_path(&namespace)?, encode(&bundle));
            api.call("PUT", &path, None)?;
            Ok(())
        }
        N::SplitBundle { namespace, bundle } => {
            let path = format!("{}/{}/split", namespace_path(&namespace)?, encode(&bundle));
            api.call("PUT", &path, None)?;
            Ok(())
        }
        N::Create { namespace } => {
            api.call("PUT", &namespace_path(&namespace)?, Some("{}"))?;
            Ok(())
        }
        N::Delete { namespace } => {
            api.call("DELETE", &namespace_path(&namespace)?, None)?;
            Ok(())
        }
        N::GetPersistence { namespace } => policy_get(api, &namespace, "persistence"),
        N::SetPersistence {
            namespace,
            ensemble,
            write_quorum,
            ack_quorum,
            mark_delete_rate,
        } => {
            let body = serde_json::json!({
                "bookkeeperEnsemble": ensemble,
                "bookkeeperWriteQuorum": write_quorum,
                "bookkeeperAckQuorum": ack_quorum,
                "managedLedgerMaxMarkDeleteRate": mark_delete_rate,
            });
            policy_post(api, &namespace, "persistence", &body.to_string())
        }
        N::RemovePersistence { namespace } => policy_delete(api, &namespace, "persistence"),
        N::GetRetention { namespace } => policy_get(api, &namespace, "retention"),
        N::SetRetention {
            namespace,
            time,
            size,
        } => {
            let minutes = match seconds(&time)? {
                -1 => -1,
                s => s / 60,
            };
            let mb = match bytes(&size)? {
                -1 => -1,
                b => b >> 20,
            };
            let body = serde_json::json!({
                "retentionTimeInMinutes": minutes,
                "retentionSizeInMB": mb,
            });
            policy_post(api, &namespace, "retention", &body.to_string())
        }
        N::RemoveRetention { namespace } => policy_delete(api, &namespace, "retention"),
        N::GetMessageTtl { namespace } => policy_get(api, &namespace, "messageTTL"),
        N::SetMessageTtl { namespace, ttl } => {
            policy_post(api, &namespace, "messageTTL", &ttl.to_string())
        }
        N::RemoveMessageTtl { namespace } => policy_delete(api, &namespace, "messageTTL"),
        N::GetDeduplication { namespace } => policy_get(api, &namespace, "deduplication"),
        N::SetDeduplication {
            namespace,
            enable,
            disable,
        } => {
            if enable == disable {
                bail!("give exactly one of --enable and --disable");
            }
            policy_post(api, &namespace, "deduplication", &enable.to_string())
        }
        N::GetBacklogQuotas { namespace } => policy_get(api, &namespace, "backlogQuotaMap"),
        N::SetBacklogQuota {
            namespace,
            limit,
            limit_time,
            policy,
            quota_type,
        } => {
            let limit_size = limit.as_deref().map(bytes).transpose()?.unwrap_or(-1);
            let limit_time = limit_time
                .as_deref()
                .map(seconds)
                .transpose()?
                .unwrap_or(-1);
            let body = serde_json::json!({
                "limitSize": limit_size,
                "limitTime": limit_time,
                "policy": policy,
            });
            let path = format!(
                "{}/backlogQuota?backlogQuotaType={}",
                namespace_path(&namespace)?,
                encode(&quota_type)
            );
            api.call("POST", &path, Some(&body.to_string()))?;
            Ok(())
        }
        N::RemoveBacklogQuota {
            namespace,
            quota_type,
        } => {
            let path = format!(
                "{}/backlogQuota?backlogQuotaType={}",
                namespace_path(&namespace)?,
                encode(&quota_type)
            );
            api.call("DELETE", &path, None)?;
            Ok(())
        }
    }
}

pub(super) fn policy_get(api: &Api, namespace: &str, policy: &str) -> anyhow::Result<()> {
    let value = api.get_json(&format!("{}/{policy}", namespace_path(namespace)?))?;
    match value {
        Value::Null => out("null")?,
        other => print_json(&other)?,
    }
    Ok(())
}

pub(super) fn policy_post(
    api: &Api,
    namespace: &str,
    policy: &str,
    body: &str,
) -> anyhow::Result<()> {
    api.call(
        "POST",
        &format!("{}/{policy}", namespace_path(namespace)?),
        Some(body),
    )?;
    Ok(())
}

pub(super) fn policy_delete(api: &Api, namespace: &str, policy: &str) -> anyhow::Result<()> {
    api.call(
        "DELETE",
        &format!("{}/{policy}", namespace_path(namespace)?),
        None,
    )?;
    Ok(())
}
