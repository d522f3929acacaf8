//! The schema registry over REST (Pulsar's `SchemasResource`, under
//! `/admin/v2/schemas/{tenant}/{namespace}/{topic}`): the latest schema or a
//! version (also what the Go client's HTTP lookup fetches), every version,
//! registering one (the schema producers are then checked against), the
//! version of a schema, a compatibility test and deleting the topic's
//! schema. Registering BYTES (the default) is refused with 406.
//!
//! Shapes: GET answers `{version, type, timestamp, data, properties}` with
//! Pulsar's type names and the definition as text; POST takes `{type,
//! schema, properties}`. Registration and the compatibility test check the
//! schema under the strategy that applies to the topic (topic, namespace,
//! broker default: `Service::schema_strategy`) with `schema::compat`, as a
//! producer's schema is checked.
//! Never: keeps state; the registry is in the metadata store.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use vela_wire::proto::{self, schema::Type};

use super::api::{ApiError, ApiResult, Shared, topic_of};
use crate::admin::json::parse_body;
use crate::service::Service;
use crate::topic_name::TopicName;

const S: &str = "/admin/v2/schemas/{tenant}/{namespace}/{topic}";

pub(super) fn routes() -> Router<Arc<Service>> {
    Router::new()
        .route(
            &format!("{S}/schema"),
            get(latest).post(register).delete(delete),
        )
        .route(&format!("{S}/schema/{{version}}"), get(by_version))
        .route(&format!("{S}/schemas"), get(all))
        .route(&format!("{S}/version"), post(version_of))
        .route(&format!("{S}/compatibility"), post(compatibility))
}

/// Pulsar's `SchemaType` names, by protocol type.
const TYPE_NAMES: &[(Type, &str)] = &[
    (Type::None, "NONE"),
    (Type::String, "STRING"),
    (Type::Json, "JSON"),
    (Type::Protobuf, "PROTOBUF"),
    (Type::Avro, "AVRO"),
    (Type::Bool, "BOOLEAN"),
    (Type::Int8, "INT8"),
    (Type::Int16, "INT16"),
    (Type::Int32, "INT32"),
    (Type::Int64, "INT64"),
    (Type::Float, "FLOAT"),
    (Type::Double, "DOUBLE"),
    (Type::Date, "DATE"),
    (Type::Time, "TIME"),
    (Type::Timestamp, "TIMESTAMP"),
    (Type::KeyValue, "KEY_VALUE"),
    (Type::Instant, "INSTANT"),
    (Type::LocalDate, "LOCAL_DATE"),
    (Type::LocalTime, "LOCAL_TIME"),
    (Type::LocalDateTime, "LOCAL_DATE_TIME"),
    (Type::ProtobufNative, "PROTOBUF_NATIVE"),
];

fn type_name(kind: i32) -> &'static str {
    TYPE_NAMES
        .iter()
        .find(|(t, _)| *t as i32 == kind)
        .map_or("NONE", |(_, name)| name)
}

fn type_of(name: &str) -> ApiResult<Type> {
    let upper = name.to_ascii_uppercase();
    // "BYTES" is Pulsar's name for raw bytes (NONE on the wire).
    if upper == "BYTES" {
        return Ok(Type::None);
    }
    TYPE_NAMES
        .iter()
        .find(|(_, n)| *n == upper)
        .map(|(t, _)| *t)
        .ok_or_else(|| ApiError::bad_request(format!("unknown schema type {name}")))
}

fn topic(tenant: &str, namespace: &str, local: &str) -> ApiResult<TopicName> {
    Ok(topic_of("persistent", tenant, namespace, local)?.base())
}

async fn schema_json(
    service: &Service,
    topic: &TopicName,
    version: u64,
    schema: &proto::Schema,
) -> ApiResult<Value> {
    let properties: BTreeMap<&str, &str> = schema
        .properties
        .iter()
        .map(|kv| (kv.key.as_str(), kv.value.as_str()))
        .collect();
    Ok(json!({
        "version": version,
        "type": type_name(schema.r#type),
        "timestamp": service.schemas.registered_at_ms(topic, version).await?,
        "data": String::from_utf8_lossy(&schema.schema_data),
        "properties": properties,
    }))
}

fn not_found() -> ApiError {
    ApiError::not_found("Schema not found")
}

async fn latest(
    State(service): Shared,
    Path((tenant, namespace, local)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic(&tenant, &namespace, &local)?;
    stored_schema(&service, &topic, None).await
}

/// A stored version (`None`: the latest) as Pulsar's GetSchemaResponse, or 404.
async fn stored_schema(
    service: &Service,
    topic: &TopicName,
    version: Option<u64>,
) -> ApiResult<axum::Json<Value>> {
    let (version, schema) = service
        .schemas
        .get(topic, version)
        .await?
        .ok_or_else(not_found)?;
    Ok(axum::Json(
        schema_json(service, topic, version, &schema).await?,
    ))
}

async fn by_version(
    State(service): Shared,
    Path((tenant, namespace, local, version)): Path<(String, String, String, String)>,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic(&tenant, &namespace, &local)?;
    let version: u64 = version
        .parse()
        .map_err(|_| ApiError::bad_request(format!("bad schema version {version}")))?;
    stored_schema(&service, &topic, Some(version)).await
}

async fn all(
    State(service): Shared,
    Path((tenant, namespace, local)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic(&tenant, &namespace, &local)?;
    let versions = service.schemas.all(&topic).await?;
    if versions.is_empty() {
        return Err(not_found());
    }
    let mut out = Vec::with_capacity(versions.len());
    for (version, schema) in &versions {
        out.push(schema_json(&service, &topic, *version, schema).await?);
    }
    Ok(axum::Json(json!({ "getSchemaResponses": out })))
}

/// Pulsar's PostSchemaPayload.
#[derive(Debug, Deserialize)]
struct PostSchema {
    #[serde(rename = "type")]
    kind: String,
    #[serde(default)]
    schema: Option<String>,
    #[serde(default)]
    properties: Option<BTreeMap<String, String>>,
}

fn schema_from(topic: &TopicName, body: &[u8]) -> ApiResult<proto::Schema> {
    schema_of(topic, payload(body)?)
}

fn payload(body: &[u8]) -> ApiResult<PostSchema> {
    let post: Option<PostSchema> = parse_body(body, "PostSchemaPayload")?;
    post.ok_or_else(|| ApiError::bad_request("the schema payload is missing"))
}

fn schema_of(topic: &TopicName, post: PostSchema) -> ApiResult<proto::Schema> {
    Ok(proto::Schema {
        name: topic.local.clone(),
        schema_data: post.schema.unwrap_or_default().into_bytes().into(),
        r#type: type_of(&post.kind)? as i32,
        properties: post
            .properties
            .unwrap_or_default()
            .into_iter()
            .map(|(key, value)| proto::KeyValue { key, value })
            .collect(),
    })
}

async fn register(
    State(service): Shared,
    Path((tenant, namespace, local)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic(&tenant, &namespace, &local)?;
    let post = payload(&body)?;
    if post.kind.eq_ignore_ascii_case("BYTES") {
        // Raw bytes are every topic's schema while none is registered
        // (Pulsar's SchemasResourceBase.postSchemaAsync refuses them first,
        // with this message; Pulsar 4.0.8 predates the check and stores
        // them as a version).
        return Err(ApiError::new(
            StatusCode::NOT_ACCEPTABLE,
            "Do not upload a BYTES schema, because it's the default schema type",
        ));
    }
    if service
        .admin
        .namespace_policies(&topic.namespace)
        .await?
        .is_none()
    {
        return Err(ApiError::not_found("Namespace does not exist"));
    }
    let schema = schema_of(&topic, post)?;
    let strategy = service.schema_strategy(&topic).await?;
    match service
        .schemas
        .get_or_create(&topic, &schema, strategy)
        .await
    {
        Ok(version) => Ok(axum::Json(json!({ "version": { "version": version } }))),
        Err(e) if e.code == proto::ServerError::IncompatibleSchema => {
            Err(ApiError::new(StatusCode::CONFLICT, e.message))
        }
        Err(e) => Err(e.into()),
    }
}

async fn version_of(
    State(service): Shared,
    Path((tenant, namespace, local)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic(&tenant, &namespace, &local)?;
    let schema = schema_from(&topic, &body)?;
    match service.schemas.version_of(&topic, &schema).await? {
        Some(version) => Ok(axum::Json(json!({ "version": version }))),
        None => Err(ApiError::not_found("Not found schema")),
    }
}

/// Whether a schema would be accepted under the strategy that applies to
/// the topic (`Service::schema_strategy`, checked by `schema::compat`), and
/// that strategy.
async fn compatibility(
    State(service): Shared,
    Path((tenant, namespace, local)): Path<(String, String, String)>,
    body: Bytes,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic(&tenant, &namespace, &local)?;
    let schema = schema_from(&topic, &body)?;
    let strategy = service.schema_strategy(&topic).await?;
    let compatible = service
        .schemas
        .is_compatible(&topic, &schema, strategy)
        .await?;
    Ok(axum::Json(json!({
        "compatibility": compatible,
        "schemaCompatibilityStrategy": strategy.name(),
    })))
}

async fn delete(
    State(service): Shared,
    Path((tenant, namespace, local)): Path<(String, String, String)>,
) -> ApiResult<axum::Json<Value>> {
    let topic = topic(&tenant, &namespace, &local)?;
    let deleted = service.schemas.delete_all(&topic).await?;
    Ok(axum::Json(
        json!({ "version": deleted.map_or(-1, |v| v as i64) }),
    ))
}
