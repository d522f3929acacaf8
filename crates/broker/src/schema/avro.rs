//! Avro schemas as far as compatibility checks need them: parsing the JSON
//! form (primitives, records with field defaults and aliases, enums with
//! an optional default, arrays, maps, fixed, unions, named references,
//! logical types read as their underlying type) and Avro's resolution rule,
//! "can a reader with schema R read data written with schema W", as Avro's
//! `ResolvingGrammarGenerator` decides it for Pulsar's
//! `AvroSchemaBasedCompatibilityCheck`:
//! - same primitive, or a promotion (int → long → float → double,
//!   string ↔ bytes);
//! - records (names are not compared): every reader field is either in the
//!   writer (by name or one of the reader field's aliases), readable from
//!   it, or has a default; writer fields the reader lacks are skipped;
//! - enums with the same full name: every writer symbol is a reader symbol,
//!   unless the reader has a default; fixed: same full name and size;
//! - arrays and maps: their items and values;
//! - a writer union: every branch readable by the reader; a reader union:
//!   the branch Avro would pick for the writer (same type and name first,
//!   then a record of the same short name, then any record, then a
//!   promotion) readable.
//!
//! Owns: [`AvroSchema`] (an arena of nodes, named types resolved at parse
//! time, recursive records by index). Schema text is peer input: parsing
//! and checking are bounded by [`DEPTH_MAX`] and [`NODES_MAX`] and fail with
//! a message, never a panic.
//! Never: reads or writes data, or validates defaults against their types
//! (Pulsar parses with `setValidateDefaults(false)`).

use std::collections::{HashMap, HashSet};

use serde_json::Value;

/// Deepest nesting of types parsed or compared: Avro schemas of real
/// applications nest a handful of levels; this bounds the recursion a
/// schema sent by a client can cause.
pub(crate) const DEPTH_MAX: usize = 64;

/// Most type nodes in one schema (each named or anonymous type is one).
pub(crate) const NODES_MAX: usize = 10_000;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Primitive {
    Null,
    Boolean,
    Int,
    Long,
    Float,
    Double,
    Bytes,
    String,
}

impl Primitive {
    fn parse(name: &str) -> Option<Primitive> {
        Some(match name {
            "null" => Primitive::Null,
            "boolean" => Primitive::Boolean,
            "int" => Primitive::Int,
            "long" => Primitive::Long,
            "float" => Primitive::Float,
            "double" => Primitive::Double,
            "bytes" => Primitive::Bytes,
            "string" => Primitive::String,
            _ => return None,
        })
    }

    /// Avro's promotions: data written as `writer` read as `self`.
    fn promotes_from(self, writer: Primitive) -> bool {
        use Primitive::*;
        matches!(
            (writer, self),
            (Int, Long | Float | Double)
                | (Long, Float | Double)
                | (Float, Double)
                | (String, Bytes)
                | (Bytes, String)
        )
    }
}

#[derive(Debug, Clone)]
struct Field {
    name: String,
    aliases: Vec<String>,
    node: usize,
    has_default: bool,
}

#[derive(Debug, Clone)]
enum Node {
    Primitive(Primitive),
    Record {
        full_name: String,
        fields: Vec<Field>,
    },
    Enum {
        full_name: String,
        symbols: Vec<String>,
        has_default: bool,
    },
    Fixed {
        full_name: String,
        size: u64,
    },
    Array(usize),
    Map(usize),
    Union(Vec<usize>),
    /// A record being parsed (only while its fields are).
    Pending,
}

impl Node {
    fn kind(&self) -> &'static str {
        match self {
            Node::Primitive(_) => "primitive",
            Node::Record { .. } => "record",
            Node::Enum { .. } => "enum",
            Node::Fixed { .. } => "fixed",
            Node::Array(_) => "array",
            Node::Map(_) => "map",
            Node::Union(_) => "union",
            Node::Pending => "pending",
        }
    }

    fn describe(&self) -> String {
        match self {
            Node::Primitive(p) => format!("{p:?}").to_lowercase(),
            Node::Record { full_name, .. }
            | Node::Enum { full_name, .. }
            | Node::Fixed { full_name, .. } => format!("{} {full_name}", self.kind()),
            other => other.kind().to_string(),
        }
    }
}

/// A parsed Avro schema.
#[derive(Debug, Clone)]
pub(crate) struct AvroSchema {
    nodes: Vec<Node>,
    root: usize,
}

fn short_name(full_name: &str) -> &str {
    full_name.rsplit('.').next().unwrap_or(full_name)
}

struct Parser {
    nodes: Vec<Node>,
    named: HashMap<String, usize>,
}

impl Parser {
    fn push(&mut self, node: Node) -> Result<usize, String> {
        if self.nodes.len() >= NODES_MAX {
            return Err(format!("schema has more than {NODES_MAX} types"));
        }
        self.nodes.push(node);
        Ok(self.nodes.len() - 1)
    }

    fn full_name(
        object: &serde_json::Map<String, Value>,
        namespace: &str,
    ) -> Result<(String, String), String> {
        let name = object
            .get("name")
            .and_then(Value::as_str)
            .ok_or("named type without a name")?;
        let space = match object.get("namespace").and_then(Value::as_str) {
            Some(space) => space.to_string(),
            None => namespace.to_string(),
        };
        let full = if name.contains('.') || space.is_empty() {
            name.to_string()
        } else {
            format!("{space}.{name}")
        };
        let space = full
            .rsplit_once('.')
            .map_or(String::new(), |(s, _)| s.to_string());
        Ok((full, space))
    }

    fn define(&mut self, full_name: &str, index: usize) {
        self.named.insert(full_name.to_string(), index);
    }

    fn reference(&self, name: &str, namespace: &str) -> Option<usize> {
        let qualified = format!("{namespace}.{name}");
        self.named
            .get(name)
            .or_else(|| self.named.get(&qualified))
            .copied()
            .or_else(|| {
                self.named
                    .iter()
                    .find(|(full, _)| short_name(full) == name)
                    .map(|(_, index)| *index)
            })
    }

    fn parse(&mut self, value: &Value, namespace: &str, depth: usize) -> Result<usize, String> {
        if depth > DEPTH_MAX {
            return Err(format!("schema nested deeper than {DEPTH_MAX}"));
        }
        match value {
            Value::String(name) => match Primitive::parse(name) {
                Some(p) => self.push(Node::Primitive(p)),
                None => self
                    .reference(name, namespace)
                    .ok_or_else(|| format!("unknown type {name:?}")),
            },
            Value::Array(branches) => {
                let mut parsed = Vec::with_capacity(branches.len());
                for branch in branches {
                    parsed.push(self.parse(branch, namespace, depth + 1)?);
                }
                self.push(Node::Union(parsed))
            }
            Value::Object(object) => self.parse_object(object, namespace, depth),
            other => Err(format!("not a schema: {other}")),
        }
    }

    fn parse_object(
        &mut self,
        object: &serde_json::Map<String, Value>,
        namespace: &str,
        depth: usize,
    ) -> Result<usize, String> {
        let kind = object.get("type").ok_or("type object without \"type\"")?;
        let Some(kind) = kind.as_str() else {
            // {"type": {...}} or {"type": [...]}: the inner type.
            return self.parse(kind, namespace, depth + 1);
        };
        match kind {
            "record" | "error" => {
                let (full_name, space) = Self::full_name(object, namespace)?;
                let index = self.push(Node::Pending)?;
                self.define(&full_name, index);
                let fields_json = object
                    .get("fields")
                    .and_then(Value::as_array)
                    .ok_or_else(|| format!("record {full_name} without fields"))?;
                let mut fields = Vec::with_capacity(fields_json.len());
                for field in fields_json {
                    let field = field.as_object().ok_or("a field is not an object")?;
                    let name = field
                        .get("name")
                        .and_then(Value::as_str)
                        .ok_or("field without a name")?;
                    let ty = field.get("type").ok_or("field without a type")?;
                    fields.push(Field {
                        name: name.to_string(),
                        aliases: string_list(field.get("aliases")),
                        node: self.parse(ty, &space, depth + 1)?,
                        has_default: field.contains_key("default"),
                    });
                }
                self.nodes[index] = Node::Record { full_name, fields };
                Ok(index)
            }
            "enum" => {
                let (full_name, _) = Self::full_name(object, namespace)?;
                let node = Node::Enum {
                    full_name: full_name.clone(),
                    symbols: string_list(object.get("symbols")),
                    has_default: object.contains_key("default"),
                };
                let index = self.push(node)?;
                self.define(&full_name, index);
                Ok(index)
            }
            "fixed" => {
                let (full_name, _) = Self::full_name(object, namespace)?;
                let size = object
                    .get("size")
                    .and_then(Value::as_u64)
                    .ok_or_else(|| format!("fixed {full_name} without a size"))?;
                let index = self.push(Node::Fixed {
                    full_name: full_name.clone(),
                    size,
                })?;
                self.define(&full_name, index);
                Ok(index)
            }
            "array" => {
                let items = object.get("items").ok_or("array without items")?;
                let items = self.parse(items, namespace, depth + 1)?;
                self.push(Node::Array(items))
            }
            "map" => {
                let values = object.get("values").ok_or("map without values")?;
                let values = self.parse(values, namespace, depth + 1)?;
                self.push(Node::Map(values))
            }
            // A primitive (with a logical type or other properties), or a
            // reference to a named type.
            name => self.parse(&Value::String(name.to_string()), namespace, depth + 1),
        }
    }
}

fn string_list(value: Option<&Value>) -> Vec<String> {
    value
        .and_then(Value::as_array)
        .map(|items| {
            items
                .iter()
                .filter_map(Value::as_str)
                .map(String::from)
                .collect()
        })
        .unwrap_or_default()
}

impl AvroSchema {
    /// Parses a schema's JSON text.
    pub(crate) fn parse(text: &[u8]) -> Result<AvroSchema, String> {
        let value: Value =
            serde_json::from_slice(text).map_err(|e| format!("not an Avro schema: {e}"))?;
        let mut parser = Parser {
            nodes: Vec::new(),
            named: HashMap::new(),
        };
        let root = parser.parse(&value, "", 0)?;
        Ok(AvroSchema {
            nodes: parser.nodes,
            root,
        })
    }

    /// Ok when data written with `writer` can be read with `self`; else
    /// what cannot be read.
    pub(crate) fn can_read(&self, writer: &AvroSchema) -> Result<(), String> {
        Check {
            reader: self,
            writer,
            seen: HashSet::new(),
        }
        .check(self.root, writer.root, 0)
    }
}

struct Check<'a> {
    reader: &'a AvroSchema,
    writer: &'a AvroSchema,
    /// Record pairs being compared (a recursive record compares as
    /// compatible where it meets itself again, as Avro's `seen` map).
    seen: HashSet<(usize, usize)>,
}

impl Check<'_> {
    fn check(&mut self, r: usize, w: usize, depth: usize) -> Result<(), String> {
        if depth > DEPTH_MAX {
            return Err(format!("schemas nested deeper than {DEPTH_MAX}"));
        }
        let (reader, writer) = (&self.reader.nodes[r], &self.writer.nodes[w]);
        match (reader, writer) {
            (_, Node::Union(branches)) => {
                for &branch in branches {
                    self.check(r, branch, depth + 1)?;
                }
                Ok(())
            }
            (Node::Union(branches), _) => match self.best_branch(branches, w) {
                Some(branch) => self.check(branch, w, depth + 1),
                None => Err(format!(
                    "{} cannot be read by any branch of the reader's union",
                    writer.describe()
                )),
            },
            (Node::Primitive(rp), Node::Primitive(wp)) if rp == wp || rp.promotes_from(*wp) => {
                Ok(())
            }
            (
                Node::Record { fields: rf, .. },
                Node::Record {
                    fields: wf,
                    full_name,
                },
            ) => {
                if !self.seen.insert((r, w)) {
                    return Ok(());
                }
                let (rf, wf) = (rf.clone(), wf.clone());
                for field in &rf {
                    let found = wf.iter().find(|candidate| {
                        candidate.name == field.name || field.aliases.contains(&candidate.name)
                    });
                    match found {
                        Some(written) => self
                            .check(field.node, written.node, depth + 1)
                            .map_err(|e| format!("field {}: {e}", field.name))?,
                        None if field.has_default => {}
                        None => {
                            return Err(format!(
                                "reader field {} is not in the writer's record {full_name} and has no default",
                                field.name
                            ));
                        }
                    }
                }
                Ok(())
            }
            (
                Node::Enum {
                    full_name: rn,
                    symbols: rs,
                    has_default,
                },
                Node::Enum {
                    full_name: wn,
                    symbols: ws,
                    ..
                },
            ) if rn == wn => match ws.iter().find(|s| !rs.contains(s)) {
                Some(missing) if !has_default => Err(format!(
                    "enum {rn}: the reader has no symbol {missing} and no default"
                )),
                _ => Ok(()),
            },
            (
                Node::Fixed {
                    full_name: rn,
                    size: rs,
                },
                Node::Fixed {
                    full_name: wn,
                    size: ws,
                },
            ) if rn == wn && rs == ws => Ok(()),
            (Node::Array(ri), Node::Array(wi)) => self.check(*ri, *wi, depth + 1),
            (Node::Map(rv), Node::Map(wv)) => self.check(*rv, *wv, depth + 1),
            _ => Err(format!(
                "found {}, expecting {}",
                writer.describe(),
                reader.describe()
            )),
        }
    }

    /// The reader union's branch Avro picks for the writer's type.
    fn best_branch(&self, branches: &[usize], w: usize) -> Option<usize> {
        let writer = &self.writer.nodes[w];
        let node = |b: usize| &self.reader.nodes[b];
        let named = |n: &Node| match n {
            Node::Record { full_name, .. }
            | Node::Enum { full_name, .. }
            | Node::Fixed { full_name, .. } => Some(full_name.clone()),
            _ => None,
        };
        let exact = branches.iter().copied().find(|&b| {
            let reader = node(b);
            match (reader, writer) {
                (Node::Primitive(rp), Node::Primitive(wp)) => rp == wp,
                (Node::Array(_), Node::Array(_)) | (Node::Map(_), Node::Map(_)) => true,
                _ => {
                    reader.kind() == writer.kind()
                        && named(reader).is_some()
                        && named(reader) == named(writer)
                }
            }
        });
        let by_short_name = || {
            branches.iter().copied().find(|&b| {
                let reader = node(b);
                reader.kind() == writer.kind()
                    && match (named(reader), named(writer)) {
                        (Some(rn), Some(wn)) => short_name(&rn) == short_name(&wn),
                        _ => false,
                    }
            })
        };
        let any_record = || {
            branches.iter().copied().find(|&b| {
                matches!(node(b), Node::Record { .. }) && matches!(writer, Node::Record { .. })
            })
        };
        let promoted = || {
            branches.iter().copied().find(|&b| match (node(b), writer) {
                (Node::Primitive(rp), Node::Primitive(wp)) => rp.promotes_from(*wp),
                _ => false,
            })
        };
        exact
            .or_else(by_short_name)
            .or_else(any_record)
            .or_else(promoted)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn schema(text: &str) -> AvroSchema {
        AvroSchema::parse(text.as_bytes()).unwrap()
    }

    fn record(name: &str, fields: &str) -> AvroSchema {
        schema(&format!(
            r#"{{"type":"record","name":"{name}","fields":[{fields}]}}"#
        ))
    }

    #[test]
    fn promotions_and_mismatches() {
        assert!(schema(r#""long""#).can_read(&schema(r#""int""#)).is_ok());
        assert!(
            schema(r#""double""#)
                .can_read(&schema(r#""float""#))
                .is_ok()
        );
        assert!(
            schema(r#""bytes""#)
                .can_read(&schema(r#""string""#))
                .is_ok()
        );
        assert!(schema(r#""int""#).can_read(&schema(r#""long""#)).is_err());
        assert!(schema(r#""string""#).can_read(&schema(r#""int""#)).is_err());
        let date = schema(r#"{"type":"int","logicalType":"date"}"#);
        assert!(date.can_read(&schema(r#""int""#)).is_ok());
    }

    #[test]
    fn records_need_defaults_for_new_reader_fields_and_ignore_names() {
        let v1 = record("User1", r#"{"name":"name","type":"string"}"#);
        let v2 = record(
            "User2",
            r#"{"name":"name","type":"string"},{"name":"age","type":"int","default":0}"#,
        );
        let v3 = record(
            "User3",
            r#"{"name":"name","type":"string"},{"name":"age","type":"int"}"#,
        );
        assert!(v2.can_read(&v1).is_ok(), "default fills the new field");
        assert!(v1.can_read(&v2).is_ok(), "writer fields are skipped");
        let error = v3.can_read(&v1).unwrap_err();
        assert!(error.contains("age"), "{error}");
        let renamed = record(
            "User4",
            r#"{"name":"full","aliases":["name"],"type":"string"}"#,
        );
        assert!(renamed.can_read(&v1).is_ok(), "aliases");
    }

    #[test]
    fn unions_both_ways() {
        // Python's optional fields: ["null", T] with a null default.
        let optional = record(
            "A",
            r#"{"name":"age","type":["null","int"],"default":null}"#,
        );
        let required = record("A", r#"{"name":"age","type":"int"}"#);
        assert!(
            optional.can_read(&required).is_ok(),
            "int read as [null,int]"
        );
        assert!(
            required.can_read(&optional).is_err(),
            "null cannot be read as int"
        );
        let wide = record("A", r#"{"name":"age","type":["null","long"]}"#);
        assert!(
            wide.can_read(&required).is_ok(),
            "int promoted into a union"
        );
        let text = record("A", r#"{"name":"age","type":["null","string"]}"#);
        assert!(text.can_read(&required).is_err());
    }

    #[test]
    fn enums_fixed_arrays_maps_and_named_references() {
        let colors = |symbols: &str, default: &str| {
            schema(&format!(
                r#"{{"type":"enum","name":"Color","symbols":[{symbols}]{default}}}"#
            ))
        };
        let rg = colors(r#""R","G""#, "");
        let rgb = colors(r#""R","G","B""#, "");
        assert!(rgb.can_read(&rg).is_ok());
        assert!(rg.can_read(&rgb).is_err());
        assert!(
            colors(r#""R","G""#, r#","default":"R""#)
                .can_read(&rgb)
                .is_ok()
        );
        let fixed = |size: u32| schema(&format!(r#"{{"type":"fixed","name":"F","size":{size}}}"#));
        assert!(fixed(16).can_read(&fixed(16)).is_ok());
        assert!(fixed(16).can_read(&fixed(8)).is_err());
        let arrays = schema(r#"{"type":"array","items":"long"}"#);
        assert!(
            arrays
                .can_read(&schema(r#"{"type":"array","items":"int"}"#))
                .is_ok()
        );
        let maps = schema(r#"{"type":"map","values":"string"}"#);
        assert!(
            maps.can_read(&schema(r#"{"type":"map","values":"int"}"#))
                .is_err()
        );
        // A recursive record refers to itself by name.
        let list = schema(
            r#"{"type":"record","name":"Node","namespace":"x","fields":[
                {"name":"value","type":"int"},
                {"name":"next","type":["null","Node"]}]}"#,
        );
        assert!(list.can_read(&list).is_ok());
    }

    #[test]
    fn bad_input_is_an_error_not_a_panic() {
        for text in [
            "not json",
            "{}",
            r#"{"type":"record"}"#,
            r#"{"type":"record","name":"R","fields":[{"name":"x"}]}"#,
            r#""Unknown""#,
            "42",
        ] {
            assert!(AvroSchema::parse(text.as_bytes()).is_err(), "{text}");
        }
        let deep = format!("{}\"int\"{}", "[".repeat(100), "]".repeat(100));
        assert!(AvroSchema::parse(deep.as_bytes()).is_err());
    }
}
