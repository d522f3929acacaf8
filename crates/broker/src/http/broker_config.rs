//! The broker's dynamic configuration (Pulsar's `BrokersBase`
//! `configuration` routes): the settings Vela can change while running,
//! each one the broker-wide layer of a policy (topic > namespace > dynamic
//! configuration > flags), kept in the metadata store at
//! `/admin/dynamic-config` (one JSON map of Pulsar names to values as
//! strings) so every broker and every restart reads the same.
//!
//! A change is applied at once by the broker that took it; the others read
//! the record when they start ([`load`]).
//! Never: accepts a name Vela would not apply (412, as Pulsar answers a
//! non-dynamic one).

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use bytes::Bytes;
use serde_json::{Value, json};
use vela_meta::ExpectedVersion;

use super::api::{ApiError, ApiResult, Shared, no_content};
use crate::admin::AdminError;
use crate::admin::policy_specs::spec_of;
use crate::error::ServiceError;
use crate::service::Service;

const KEY: &str = "/admin/dynamic-config";

/// Pulsar's dynamic settings Vela applies, with the policy key each one is
/// the broker-wide default of.
const DYNAMIC: &[(&str, &str)] = &[
    ("maxProducersPerTopic", "maxProducers"),
    ("maxConsumersPerTopic", "maxConsumers"),
    ("maxConsumersPerSubscription", "maxConsumersPerSubscription"),
    ("maxSubscriptionsPerTopic", "maxSubscriptionsPerTopic"),
    ("maxTopicsPerNamespace", "maxTopicsPerNamespace"),
    ("allowAutoSubscriptionCreation", "autoSubscriptionCreation"),
];

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route("/admin/v2/brokers/configuration", get(names))
        .route("/admin/v2/brokers/configuration/values", get(values))
        .route(
            "/admin/v2/brokers/configuration/{name}/{value}",
            post(update),
        )
        .route(
            "/admin/v2/brokers/configuration/{name}",
            axum::routing::delete(remove),
        )
}

/// A setting's value as the policy it sets.
fn policy_value(name: &str, text: &str) -> Result<(&'static str, Value), ApiError> {
    let Some((_, key)) = DYNAMIC.iter().find(|(n, _)| *n == name) else {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "Can't update non-dynamic configuration",
        ));
    };
    let value = if name == "allowAutoSubscriptionCreation" {
        // Java's Boolean.valueOf, as Pulsar parses it: "true" in any case,
        // anything else is false.
        json!({ "allowAutoSubscriptionCreation": text.eq_ignore_ascii_case("true") })
    } else {
        Value::String(text.to_string())
    };
    let spec = spec_of(key).ok_or_else(|| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            format!("no policy {key}"),
        )
    })?;
    let checked = spec.check(value).map_err(|rejected| {
        ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            format!("invalid value {text} for {name}: {}", rejected.reason),
        )
    })?;
    Ok((key, checked))
}

fn policies_of(settings: &BTreeMap<String, String>) -> BTreeMap<String, Value> {
    settings
        .iter()
        .filter_map(|(name, text)| policy_value(name, text).ok())
        .map(|(key, value)| (key.to_string(), value))
        .collect()
}

async fn read(service: &Service) -> Result<(BTreeMap<String, String>, ExpectedVersion), ApiError> {
    match service.meta.get(KEY).await.map_err(AdminError::from)? {
        Some((value, version)) => {
            let settings = serde_json::from_slice(&value).map_err(|e| {
                ApiError::new(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("corrupt metadata at {KEY}: {e}"),
                )
            })?;
            Ok((settings, ExpectedVersion::Is(version)))
        }
        None => Ok((BTreeMap::new(), ExpectedVersion::Absent)),
    }
}

/// Reads the stored settings into the service (broker start).
pub(crate) async fn load(service: &Service) -> Result<(), ServiceError> {
    let settings = read(service)
        .await
        .map_err(|e| {
            ServiceError::new(
                vela_wire::proto::ServerError::MetadataError,
                format!("{e:?}"),
            )
        })?
        .0;
    service.set_dynamic_policies(policies_of(&settings)).await
}

async fn write(
    service: &Service,
    change: impl Fn(&mut BTreeMap<String, String>),
) -> ApiResult<StatusCode> {
    // Compare-and-set, retried a few times against concurrent changes.
    for _ in 0..8 {
        let (mut settings, expected) = read(service).await?;
        change(&mut settings);
        let value = serde_json::to_vec(&settings)
            .map_err(|e| ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, e.to_string()))?;
        match service.meta.put(KEY, Bytes::from(value), expected).await {
            Ok(_) => {
                service.set_dynamic_policies(policies_of(&settings)).await?;
                return no_content();
            }
            Err(vela_meta::MetaError::BadVersion { .. } | vela_meta::MetaError::Exists { .. }) => {
                continue;
            }
            Err(e) => return Err(AdminError::from(e).into()),
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "the dynamic configuration kept changing; retry",
    ))
}

async fn names() -> axum::Json<Vec<&'static str>> {
    axum::Json(DYNAMIC.iter().map(|(name, _)| *name).collect())
}

async fn values(State(service): Shared) -> ApiResult<axum::Json<BTreeMap<String, String>>> {
    Ok(axum::Json(read(&service).await?.0))
}

/// Pulsar answers 200 here (not 204).
async fn update(
    State(service): Shared,
    Path((name, value)): Path<(String, String)>,
) -> ApiResult<StatusCode> {
    policy_value(&name, &value)?;
    write(&service, |settings| {
        settings.insert(name.clone(), value.clone());
    })
    .await?;
    Ok(StatusCode::OK)
}

async fn remove(State(service): Shared, Path(name): Path<String>) -> ApiResult<StatusCode> {
    if !DYNAMIC.iter().any(|(n, _)| *n == name) {
        return Err(ApiError::new(
            StatusCode::PRECONDITION_FAILED,
            "Can't update non-dynamic configuration",
        ));
    }
    write(&service, |settings| {
        settings.remove(&name);
    })
    .await
}
