//! Schema compatibility as Pulsar's `SchemaRegistryServiceImpl` decides it:
//! the strategies (Pulsar's `SchemaCompatibilityStrategy`), the check of a
//! producer's new schema against the topic's versions, and the check of a
//! consumer's schema.
//!
//! - Producer (`checkCompatibilityWithLatest` / `WithAll`): ALWAYS_COMPATIBLE
//!   takes anything; ALWAYS_INCOMPATIBLE refuses every new schema; otherwise
//!   the type must be the latest version's, and Avro and JSON schemas (Avro
//!   JSON text) are checked with Avro's rules (`avro`): BACKWARD: the new
//!   schema reads data of the existing ones; FORWARD: the existing ones read
//!   data of the new one; FULL: both; the `_TRANSITIVE` variants against
//!   every version, the others against the latest. Other types have no
//!   structural check.
//! - Consumer (`checkConsumerCompatibility`): ALWAYS_COMPATIBLE takes
//!   anything; BACKWARD, FORWARD, FORWARD_TRANSITIVE and FULL check that the
//!   consumer's schema reads the latest version (BACKWARD against the
//!   latest); the others check against every version with the strategy.
//!
//! Refusals are `IncompatibleSchema` with Pulsar's wording.
//! Never: stores anything (the registry does), or checks Protobuf or
//! KeyValue structure (Pulsar's checkers for those are not reproduced: such
//! schemas are compatible when their type matches).

use vela_wire::proto::{self, ServerError};

use super::avro::AvroSchema;
use crate::error::ServiceError;

/// Pulsar's `SchemaCompatibilityStrategy` (UNDEFINED is `None` where a
/// strategy may be unset).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CompatibilityStrategy {
    /// Every new schema is refused.
    AlwaysIncompatible,
    /// Every schema is taken, of any type.
    AlwaysCompatible,
    /// The new schema reads data written with the latest one.
    Backward,
    /// The latest schema reads data written with the new one.
    Forward,
    /// Both.
    Full,
    /// The new schema reads data written with every version.
    BackwardTransitive,
    /// Every version reads data written with the new schema.
    ForwardTransitive,
    /// Both, against every version.
    FullTransitive,
}

impl CompatibilityStrategy {
    /// Pulsar's broker default (`schemaCompatibilityStrategy=FULL`).
    pub const DEFAULT: CompatibilityStrategy = CompatibilityStrategy::Full;

    const ALL: [(CompatibilityStrategy, &'static str); 8] = [
        (
            CompatibilityStrategy::AlwaysIncompatible,
            "ALWAYS_INCOMPATIBLE",
        ),
        (CompatibilityStrategy::AlwaysCompatible, "ALWAYS_COMPATIBLE"),
        (CompatibilityStrategy::Backward, "BACKWARD"),
        (CompatibilityStrategy::Forward, "FORWARD"),
        (CompatibilityStrategy::Full, "FULL"),
        (
            CompatibilityStrategy::BackwardTransitive,
            "BACKWARD_TRANSITIVE",
        ),
        (
            CompatibilityStrategy::ForwardTransitive,
            "FORWARD_TRANSITIVE",
        ),
        (CompatibilityStrategy::FullTransitive, "FULL_TRANSITIVE"),
    ];

    /// Pulsar's name (`FULL`, `BACKWARD_TRANSITIVE`, ...).
    pub fn name(self) -> &'static str {
        Self::ALL
            .iter()
            .find(|(s, _)| *s == self)
            .map_or("FULL", |(_, name)| name)
    }

    /// A strategy from its name (any case); `Ok(None)` for `UNDEFINED`.
    pub fn parse(name: &str) -> Result<Option<CompatibilityStrategy>, String> {
        let name = name.trim().trim_matches('"');
        if name.eq_ignore_ascii_case("UNDEFINED") {
            return Ok(None);
        }
        Self::ALL
            .iter()
            .find(|(_, known)| known.eq_ignore_ascii_case(name))
            .map(|(s, _)| Some(*s))
            .ok_or_else(|| format!("unknown schema compatibility strategy {name:?}"))
    }

    fn transitive(self) -> bool {
        matches!(
            self,
            CompatibilityStrategy::BackwardTransitive
                | CompatibilityStrategy::ForwardTransitive
                | CompatibilityStrategy::FullTransitive
        )
    }
}

/// Identical schemas: same type, data and properties (one version).
pub(crate) fn same_schema(a: &proto::Schema, b: &proto::Schema) -> bool {
    a.r#type == b.r#type && a.schema_data == b.schema_data && a.properties == b.properties
}

fn incompatible(message: impl Into<String>) -> ServiceError {
    ServiceError::new(ServerError::IncompatibleSchema, message)
}

fn type_name(kind: i32) -> String {
    proto::schema::Type::try_from(kind)
        .map_or_else(|_| kind.to_string(), |t| format!("{t:?}").to_uppercase())
}

/// Whether a schema of this type is checked with Avro's rules.
fn is_struct(kind: i32) -> bool {
    kind == proto::schema::Type::Avro as i32 || kind == proto::schema::Type::Json as i32
}

/// Checks a producer's new schema (not identical to any version) against
/// the topic's versions, oldest first.
pub(crate) fn check_new_schema(
    versions: &[proto::Schema],
    new: &proto::Schema,
    strategy: CompatibilityStrategy,
) -> Result<(), ServiceError> {
    let Some(latest) = versions.last() else {
        return Ok(());
    };
    match strategy {
        CompatibilityStrategy::AlwaysCompatible => return Ok(()),
        CompatibilityStrategy::AlwaysIncompatible => {
            return Err(incompatible(format!(
                "Incompatible schema: exists schema type {}, new schema type {} \
                 (strategy ALWAYS_INCOMPATIBLE)",
                type_name(latest.r#type),
                type_name(new.r#type)
            )));
        }
        _ => {}
    }
    if latest.r#type != new.r#type {
        return Err(incompatible(format!(
            "Incompatible schema: exists schema type {}, new schema type {}",
            type_name(latest.r#type),
            type_name(new.r#type)
        )));
    }
    let against: &[proto::Schema] = if strategy.transitive() {
        versions
    } else {
        std::slice::from_ref(latest)
    };
    check_struct(against, new, strategy)
}

/// Checks a consumer's schema against the topic's versions, oldest first
/// (at least one).
pub(crate) fn check_consumer_schema(
    versions: &[proto::Schema],
    schema: &proto::Schema,
    strategy: CompatibilityStrategy,
) -> Result<(), ServiceError> {
    use CompatibilityStrategy::*;
    if strategy == AlwaysCompatible {
        return Ok(());
    }
    let Some(latest) = versions.last() else {
        return Err(incompatible("Topic does not have schema to check"));
    };
    match strategy {
        Backward | Forward | ForwardTransitive | Full => {
            if latest.r#type != schema.r#type {
                return Err(incompatible(format!(
                    "Incompatible schema: exists schema type {}, new schema type {}",
                    type_name(latest.r#type),
                    type_name(schema.r#type)
                )));
            }
            check_struct(std::slice::from_ref(latest), schema, Backward)
        }
        _ => {
            if versions.iter().any(|v| same_schema(v, schema)) && strategy != AlwaysIncompatible {
                return Ok(());
            }
            check_new_schema(versions, schema, strategy)
        }
    }
}

/// Avro's rules for Avro and JSON schemas of the same type; nothing for
/// other types. A JSON schema that is not Avro JSON (the old Jackson
/// format) is let through, as Pulsar lets it through.
fn check_struct(
    against: &[proto::Schema],
    new: &proto::Schema,
    strategy: CompatibilityStrategy,
) -> Result<(), ServiceError> {
    use CompatibilityStrategy::*;
    if !is_struct(new.r#type) {
        return Ok(());
    }
    let json = new.r#type == proto::schema::Type::Json as i32;
    let parse = |schema: &proto::Schema| AvroSchema::parse(&schema.schema_data);
    let failed = |detail: String| {
        incompatible(format!(
            "Error during schema compatibility check with strategy {}: {detail}",
            strategy.name()
        ))
    };
    let new_schema = match parse(new) {
        Ok(parsed) => parsed,
        Err(_) if json => return Ok(()),
        Err(e) => return Err(failed(format!("the new schema does not parse: {e}"))),
    };
    for existing in against {
        let old = match parse(existing) {
            Ok(parsed) => parsed,
            Err(_) if json => continue,
            Err(e) => return Err(failed(format!("an existing schema does not parse: {e}"))),
        };
        let backward = matches!(
            strategy,
            Backward | BackwardTransitive | Full | FullTransitive
        );
        let forward = matches!(
            strategy,
            Forward | ForwardTransitive | Full | FullTransitive
        );
        if backward {
            new_schema.can_read(&old).map_err(|e| {
                failed(format!(
                    "the new schema cannot read data of an existing one: {e}"
                ))
            })?;
        }
        if forward {
            old.can_read(&new_schema).map_err(|e| {
                failed(format!(
                    "an existing schema cannot read data of the new one: {e}"
                ))
            })?;
        }
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use bytes::Bytes;

    use super::*;

    fn avro(fields: &str) -> proto::Schema {
        proto::Schema {
            name: "s".into(),
            schema_data: Bytes::from(format!(
                r#"{{"type":"record","name":"R","fields":[{fields}]}}"#
            )),
            r#type: proto::schema::Type::Avro as i32,
            properties: vec![],
        }
    }

    #[test]
    fn strategies_parse_and_name() {
        for (strategy, name) in CompatibilityStrategy::ALL {
            assert_eq!(CompatibilityStrategy::parse(name).unwrap(), Some(strategy));
            assert_eq!(strategy.name(), name);
        }
        assert_eq!(
            CompatibilityStrategy::parse("\"forward\"").unwrap(),
            Some(CompatibilityStrategy::Forward)
        );
        assert_eq!(CompatibilityStrategy::parse("UNDEFINED").unwrap(), None);
        assert!(CompatibilityStrategy::parse("SOMETIMES").is_err());
    }

    #[test]
    fn producer_checks_follow_the_strategy() {
        use CompatibilityStrategy::*;
        // v1 optional age; v2 required age: v2 cannot read v1's nulls, v1
        // reads v2's ints.
        let v1 = avro(r#"{"name":"age","type":["null","int"],"default":null}"#);
        let v2 = avro(r#"{"name":"age","type":"int"}"#);
        let versions = [v1.clone()];
        assert!(check_new_schema(&versions, &v2, Forward).is_ok());
        for strategy in [
            Backward,
            Full,
            BackwardTransitive,
            FullTransitive,
            AlwaysIncompatible,
        ] {
            let e = check_new_schema(&versions, &v2, strategy).unwrap_err();
            assert_eq!(e.code, ServerError::IncompatibleSchema, "{strategy:?}");
        }
        assert!(check_new_schema(&versions, &v2, AlwaysCompatible).is_ok());
        // Transitive strategies look past the latest version.
        let v3 = avro(r#"{"name":"age","type":"int"},{"name":"x","type":"int","default":0}"#);
        let history = [v1.clone(), v2.clone()];
        assert!(check_new_schema(&history, &v3, ForwardTransitive).is_ok());
        assert!(
            check_new_schema(&history, &v3, BackwardTransitive).is_err(),
            "v3 cannot read v1"
        );
        assert!(
            check_new_schema(&history, &v3, Backward).is_ok(),
            "v3 reads v2"
        );
        let string = proto::Schema {
            r#type: proto::schema::Type::String as i32,
            schema_data: Bytes::new(),
            ..v1.clone()
        };
        assert!(check_new_schema(&versions, &string, Full).is_err());
        assert!(check_new_schema(&versions, &string, AlwaysCompatible).is_ok());
        assert!(
            check_new_schema(&[], &string, AlwaysIncompatible).is_ok(),
            "the first schema"
        );
    }

    #[test]
    fn consumer_schemas_must_read_the_latest_version() {
        use CompatibilityStrategy::*;
        let ints = avro(r#"{"name":"a","type":"int"},{"name":"b","type":"int"}"#);
        let strings = avro(r#"{"name":"a","type":"string"},{"name":"b","type":"int"}"#);
        let longs = avro(r#"{"name":"a","type":"long"},{"name":"b","type":"int"}"#);
        let versions = [ints.clone()];
        assert!(check_consumer_schema(&versions, &ints, Full).is_ok());
        assert!(check_consumer_schema(&versions, &longs, Full).is_ok());
        assert!(check_consumer_schema(&versions, &strings, Full).is_err());
        assert!(check_consumer_schema(&versions, &strings, AlwaysCompatible).is_ok());
        assert!(check_consumer_schema(&[], &ints, Full).is_err());
        assert!(check_consumer_schema(&versions, &ints, AlwaysIncompatible).is_err());
        assert!(check_consumer_schema(&versions, &ints, FullTransitive).is_ok());
    }
}
