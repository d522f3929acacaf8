//! `vela admin topic-policies`, `namespace-policies`, `schemas`, `brokers`
//! (beyond healthcheck) and the message reads of `topics`: one generic
//! get/set/remove per policy, named as in Pulsar's REST routes (the broker's
//! `policy_specs` table lists them: `list` prints it), values given as JSON.

use anyhow::{Context, bail};
use clap::Subcommand;
use vela_broker::admin::policy_specs::POLICY_SPECS;

use super::api::{Api, encode, namespace_path, out, print_json, topic_path};

/// Policies kept typed by the namespace routes, also settable per topic.
const TYPED_NAMESPACE_POLICIES: &[&str] = &[
    "persistence",
    "retention",
    "messageTTL",
    "compactionThreshold",
    "deduplication",
];

#[derive(Debug, Subcommand)]
pub(super) enum PolicyCmd {
    /// The policy names this scope takes.
    List,
    /// A policy's value (nothing printed when unset).
    Get {
        policy: String,
        /// Topic (topic-policies) or tenant/namespace (namespace-policies).
        target: String,
        /// Topics: the value in force (the topic's, else its namespace's,
        /// else the broker's).
        #[arg(long)]
        applied: bool,
    },
    /// Sets a policy to a JSON value (`5`, `true`, `{"publishThrottlingRateInMsg":100}`).
    Set {
        policy: String,
        target: String,
        value: String,
    },
    /// Removes a policy (the next scope's value applies).
    Remove { policy: String, target: String },
}

#[derive(Debug, Subcommand)]
pub(super) enum SchemasCmd {
    /// The latest schema of a topic, or `--version`.
    Get {
        topic: String,
        #[arg(long)]
        version: Option<u64>,
    },
    /// Every version of a topic's schema.
    GetAll { topic: String },
    /// Registers a schema: `--type AVRO --schema '{...}'`.
    Upload {
        topic: String,
        #[arg(long = "type")]
        kind: String,
        /// The definition (AVRO/JSON: the schema JSON as text).
        #[arg(long)]
        schema: String,
    },
    /// Deletes a topic's schema.
    Delete { topic: String },
}

#[derive(Debug, Subcommand)]
pub(super) enum BrokersCmd {
    /// Check the broker answers.
    Healthcheck,
    /// Active brokers of the cluster.
    List {
        #[arg(default_value = "standalone")]
        cluster: String,
    },
    /// The leader broker.
    LeaderBroker,
    /// Settings the dynamic configuration takes.
    ListDynamicConfig,
    /// The dynamic settings set.
    GetAllDynamicConfig,
    /// Sets a dynamic setting.
    UpdateDynamicConfig {
        #[arg(long = "config")]
        config: String,
        #[arg(long = "value")]
        value: String,
    },
    /// Removes a dynamic setting.
    DeleteDynamicConfig {
        #[arg(long = "config")]
        config: String,
    },
}

fn policy_names(topic: bool) -> Vec<&'static str> {
    let mut names: Vec<&'static str> = POLICY_SPECS
        .iter()
        .filter_map(|s| {
            if topic {
                s.topic_route
            } else {
                s.namespace_route
            }
        })
        .collect();
    names.extend(["backlogQuota", "backlogQuotaMap"]);
    if !topic {
        names.extend(TYPED_NAMESPACE_POLICIES);
    }
    names.sort_unstable();
    names
}

fn check_name(topic: bool, policy: &str) -> anyhow::Result<()> {
    if !policy_names(topic).contains(&policy) {
        bail!("unknown policy {policy:?}; `list` shows them");
    }
    Ok(())
}

fn json_arg(value: &str) -> anyhow::Result<String> {
    let parsed: serde_json::Value =
        serde_json::from_str(value).with_context(|| format!("{value:?} is not JSON"))?;
    Ok(parsed.to_string())
}

fn print_optional(text: &str) -> anyhow::Result<()> {
    if text.trim().is_empty() {
        return Ok(());
    }
    match serde_json::from_str(text) {
        Ok(value) => print_json(&value),
        Err(_) => out(text),
    }
}

pub(super) fn topic_policies(api: &Api, cmd: PolicyCmd) -> anyhow::Result<()> {
    policies(api, cmd, true)
}

pub(super) fn namespace_policies(api: &Api, cmd: PolicyCmd) -> anyhow::Result<()> {
    policies(api, cmd, false)
}

fn policies(api: &Api, cmd: PolicyCmd, topic: bool) -> anyhow::Result<()> {
    let base = |target: &str| {
        if topic {
            topic_path(target)
        } else {
            namespace_path(target)
        }
    };
    match cmd {
        PolicyCmd::List => {
            for name in policy_names(topic) {
                println!("{name}");
            }
            Ok(())
        }
        PolicyCmd::Get {
            policy,
            target,
            applied,
        } => {
            check_name(topic, &policy)?;
            let query = if applied { "?applied=true" } else { "" };
            let path = format!("{}/{policy}{query}", base(&target)?);
            print_optional(&api.call("GET", &path, None)?)
        }
        PolicyCmd::Set {
            policy,
            target,
            value,
        } => {
            check_name(topic, &policy)?;
            let path = format!("{}/{policy}", base(&target)?);
            out(&api.call("POST", &path, Some(&json_arg(&value)?))?)
        }
        PolicyCmd::Remove { policy, target } => {
            check_name(topic, &policy)?;
            let path = format!("{}/{policy}", base(&target)?);
            out(&api.call("DELETE", &path, None)?)
        }
    }
}

/// `topics peek-messages`: the next `count` unacknowledged messages of a
/// subscription (payloads as text where they are UTF-8).
pub(super) fn peek_messages(
    api: &Api,
    topic: &str,
    subscription: &str,
    count: u64,
) -> anyhow::Result<()> {
    for n in 1..=count {
        let path = format!(
            "{}/subscription/{}/position/{n}",
            topic_path(topic)?,
            encode(subscription)
        );
        match api.call("GET", &path, None) {
            Ok(payload) => println!("{n}: {payload}"),
            Err(e) if e.to_string().contains("HTTP 404") => break,
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

/// `topics get-message-by-id`.
pub(super) fn message_by_id(api: &Api, topic: &str, ledger: u64, entry: u64) -> anyhow::Result<()> {
    let path = format!("{}/ledger/{ledger}/entry/{entry}", topic_path(topic)?);
    out(&api.call("GET", &path, None)?)
}

/// `topics get-message-id`: the first message published at or after a
/// time (ms since the epoch).
pub(super) fn message_id_at(api: &Api, topic: &str, time_ms: i64) -> anyhow::Result<()> {
    let path = format!("{}/messageid/{time_ms}", topic_path(topic)?);
    print_json(&api.get_json(&path)?)
}

/// `topics get-properties`, `update-properties -p k=v`, `remove-properties -k`.
pub(super) fn properties(
    api: &Api,
    topic: &str,
    update: &[String],
    remove: Option<&str>,
) -> anyhow::Result<()> {
    let path = format!("{}/properties", topic_path(topic)?);
    if let Some(key) = remove {
        return out(&api.call("DELETE", &format!("{path}?key={}", encode(key)), None)?);
    }
    if !update.is_empty() {
        let mut map = serde_json::Map::new();
        for pair in update {
            let Some((k, v)) = pair.split_once('=') else {
                bail!("properties are key=value, got {pair:?}");
            };
            map.insert(k.to_string(), serde_json::Value::String(v.to_string()));
        }
        return out(&api.call(
            "PUT",
            &path,
            Some(&serde_json::Value::Object(map).to_string()),
        )?);
    }
    print_json(&api.get_json(&path)?)
}

fn schema_path(topic: &str) -> anyhow::Result<String> {
    let rest = topic_path(topic)?;
    // /admin/v2/persistent/t/ns/x -> /admin/v2/schemas/t/ns/x
    Ok(rest.replacen("/admin/v2/persistent/", "/admin/v2/schemas/", 1))
}

pub(super) fn schemas(api: &Api, cmd: SchemasCmd) -> anyhow::Result<()> {
    match cmd {
        SchemasCmd::Get { topic, version } => {
            let suffix = version.map_or(String::new(), |v| format!("/{v}"));
            print_json(&api.get_json(&format!("{}/schema{suffix}", schema_path(&topic)?))?)
        }
        SchemasCmd::GetAll { topic } => {
            print_json(&api.get_json(&format!("{}/schemas", schema_path(&topic)?))?)
        }
        SchemasCmd::Upload {
            topic,
            kind,
            schema,
        } => {
            let body = serde_json::json!({ "type": kind, "schema": schema, "properties": {} });
            out(&api.call(
                "POST",
                &format!("{}/schema", schema_path(&topic)?),
                Some(&body.to_string()),
            )?)
        }
        SchemasCmd::Delete { topic } => {
            out(&api.call("DELETE", &format!("{}/schema", schema_path(&topic)?), None)?)
        }
    }
}

pub(super) fn brokers(api: &Api, cmd: BrokersCmd) -> anyhow::Result<()> {
    match cmd {
        BrokersCmd::Healthcheck => out(&api.call("GET", "/admin/v2/brokers/health", None)?),
        BrokersCmd::List { cluster } => {
            print_json(&api.get_json(&format!("/admin/v2/brokers/{}", encode(&cluster)))?)
        }
        BrokersCmd::LeaderBroker => print_json(&api.get_json("/admin/v2/brokers/leaderBroker")?),
        BrokersCmd::ListDynamicConfig => {
            print_json(&api.get_json("/admin/v2/brokers/configuration")?)
        }
        BrokersCmd::GetAllDynamicConfig => {
            print_json(&api.get_json("/admin/v2/brokers/configuration/values")?)
        }
        BrokersCmd::UpdateDynamicConfig { config, value } => out(&api.call(
            "POST",
            &format!(
                "/admin/v2/brokers/configuration/{}/{}",
                encode(&config),
                encode(&value)
            ),
            None,
        )?),
        BrokersCmd::DeleteDynamicConfig { config } => out(&api.call(
            "DELETE",
            &format!("/admin/v2/brokers/configuration/{}", encode(&config)),
            None,
        )?),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_come_from_the_broker_table() {
        assert!(policy_names(true).contains(&"maxProducers"));
        assert!(policy_names(false).contains(&"maxProducersPerTopic"));
        assert!(policy_names(false).contains(&"retention"));
        assert!(check_name(true, "maxTopicsPerNamespace").is_err());
        assert_eq!(
            schema_path("persistent://public/default/t").unwrap_or_default(),
            "/admin/v2/schemas/public/default/t"
        );
    }
}
