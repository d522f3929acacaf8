//! Topic and namespace names: parsing, short-name expansion and partition
//! suffixes.
//!
//! Owns: the grammar of `{persistent|non-persistent}://tenant/namespace/local`,
//! the short forms clients may send (`x` → `persistent://public/default/x`,
//! `t/ns/x` → `persistent://t/ns/x`), the legacy 4-part form
//! `persistent://tenant/cluster/ns/local` (the cluster is dropped), and
//! `-partition-N` suffixes, and the percent-encoded form of name segments
//! in metadata keys (`encode_segment`).
//! Never: touches the metadata store or decides whether a topic exists.

use std::fmt;

/// Longest topic name accepted, in bytes. Names become metadata keys and log
/// names; Pulsar has no fixed limit but real names are short, and a bound keeps
/// a hostile client from making us store megabyte keys.
pub const TOPIC_NAME_BYTES_MAX: usize = 1024;

/// Suffix that names partition `i` of a partitioned topic: `local-partition-i`.
pub const PARTITION_SUFFIX: &str = "-partition-";

/// Tenant and namespace that short topic names expand into.
pub const DEFAULT_TENANT: &str = "public";
/// See [`DEFAULT_TENANT`].
pub const DEFAULT_NAMESPACE: &str = "default";

/// Why a topic or namespace name was rejected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid topic name '{name}': {reason}")]
pub struct InvalidName {
    /// The name as received (truncated to a sane length for logs).
    pub name: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

fn invalid(name: &str, reason: &'static str) -> InvalidName {
    let mut shown: String = name.chars().take(200).collect();
    if shown.len() < name.len() {
        shown.push('…');
    }
    InvalidName {
        name: shown,
        reason,
    }
}

/// `persistent` or `non-persistent`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum TopicDomain {
    /// Stored in a managed log.
    Persistent,
    /// Not stored (accepted by the parser; the broker refuses to serve it).
    NonPersistent,
}

impl TopicDomain {
    /// The scheme as written in topic names.
    pub fn as_str(self) -> &'static str {
        match self {
            TopicDomain::Persistent => "persistent",
            TopicDomain::NonPersistent => "non-persistent",
        }
    }
}

/// A namespace `tenant/namespace`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct NamespaceName {
    /// Tenant (e.g. `public`).
    pub tenant: String,
    /// Namespace inside the tenant (e.g. `default`).
    pub namespace: String,
}

impl NamespaceName {
    /// Parses `tenant/namespace` (as sent in GET_TOPICS_OF_NAMESPACE).
    pub fn parse(name: &str) -> Result<NamespaceName, InvalidName> {
        let mut parts = name.split('/');
        let (Some(tenant), Some(namespace), None) = (parts.next(), parts.next(), parts.next())
        else {
            return Err(invalid(name, "a namespace is 'tenant/namespace'"));
        };
        check_segment(name, tenant)?;
        check_segment(name, namespace)?;
        Ok(NamespaceName {
            tenant: tenant.to_string(),
            namespace: namespace.to_string(),
        })
    }
}

impl fmt::Display for NamespaceName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.tenant, self.namespace)
    }
}

/// A fully qualified topic name. `partition` is `Some(i)` when the local name
/// ends with `-partition-i`.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct TopicName {
    /// persistent or non-persistent.
    pub domain: TopicDomain,
    /// Tenant and namespace.
    pub namespace: NamespaceName,
    /// Local name, including any `-partition-i` suffix.
    pub local: String,
    /// Partition index parsed from the suffix.
    pub partition: Option<u32>,
}

impl TopicName {
    /// Parses and expands a topic name as a client sent it.
    pub fn parse(name: &str) -> Result<TopicName, InvalidName> {
        if name.is_empty() {
            return Err(invalid(name, "empty"));
        }
        if name.len() > TOPIC_NAME_BYTES_MAX {
            return Err(invalid(name, "longer than TOPIC_NAME_BYTES_MAX"));
        }
        let (domain, rest) = if let Some(rest) = name.strip_prefix("persistent://") {
            (TopicDomain::Persistent, rest)
        } else if let Some(rest) = name.strip_prefix("non-persistent://") {
            (TopicDomain::NonPersistent, rest)
        } else if name.contains("://") {
            return Err(invalid(
                name,
                "unknown domain (persistent or non-persistent)",
            ));
        } else {
            // Short forms: `local` or `tenant/namespace/local`.
            let parts: Vec<&str> = name.split('/').collect();
            return match parts.as_slice() {
                [local] => TopicName::build(
                    name,
                    TopicDomain::Persistent,
                    DEFAULT_TENANT,
                    DEFAULT_NAMESPACE,
                    local,
                ),
                [tenant, namespace, local] => {
                    TopicName::build(name, TopicDomain::Persistent, tenant, namespace, local)
                }
                _ => Err(invalid(
                    name,
                    "a short name is 'local' or 'tenant/namespace/local'",
                )),
            };
        };
        let parts: Vec<&str> = rest.splitn(4, '/').collect();
        match parts.as_slice() {
            [tenant, namespace, local] => TopicName::build(name, domain, tenant, namespace, local),
            // Legacy form with a cluster between tenant and namespace.
            [tenant, _cluster, namespace, local] if !local.contains('/') => {
                TopicName::build(name, domain, tenant, namespace, local)
            }
            _ => Err(invalid(name, "expected domain://tenant/namespace/local")),
        }
    }

    fn build(
        original: &str,
        domain: TopicDomain,
        tenant: &str,
        namespace: &str,
        local: &str,
    ) -> Result<TopicName, InvalidName> {
        check_segment(original, tenant)?;
        check_segment(original, namespace)?;
        if local.is_empty() {
            return Err(invalid(original, "empty local name"));
        }
        if local.chars().any(|c| c.is_control()) {
            return Err(invalid(original, "control character in local name"));
        }
        let partition = parse_partition_suffix(local);
        Ok(TopicName {
            domain,
            namespace: NamespaceName {
                tenant: tenant.to_string(),
                namespace: namespace.to_string(),
            },
            local: local.to_string(),
            partition,
        })
    }

    /// The name of partition `index` of this (base) topic.
    pub fn partition(&self, index: u32) -> TopicName {
        TopicName {
            domain: self.domain,
            namespace: self.namespace.clone(),
            local: format!("{}{}{}", self.local, PARTITION_SUFFIX, index),
            partition: Some(index),
        }
    }

    /// The base topic (partition suffix removed); itself when not a partition.
    pub fn base(&self) -> TopicName {
        match self.partition {
            None => self.clone(),
            Some(index) => {
                let suffix = format!("{PARTITION_SUFFIX}{index}");
                let local = self
                    .local
                    .strip_suffix(&suffix)
                    .unwrap_or(&self.local)
                    .to_string();
                TopicName {
                    domain: self.domain,
                    namespace: self.namespace.clone(),
                    local,
                    partition: None,
                }
            }
        }
    }

    /// Name of the topic's managed log: `tenant/namespace/persistent/local`.
    pub fn log_name(&self) -> String {
        format!(
            "{}/{}/{}/{}",
            self.namespace.tenant,
            self.namespace.namespace,
            self.domain.as_str(),
            self.local
        )
    }

    /// Partition index to put in MessageIdData.partition (−1 when none).
    pub fn partition_index(&self) -> i32 {
        self.partition
            .and_then(|p| i32::try_from(p).ok())
            .unwrap_or(-1)
    }
}

impl fmt::Display for TopicName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}://{}/{}/{}",
            self.domain.as_str(),
            self.namespace.tenant,
            self.namespace.namespace,
            self.local
        )
    }
}

/// Pulsar allows `[-=:.\w]` in tenant and namespace names.
/// Percent-encodes a name segment for use in a metadata key.
pub fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_') {
            out.push(byte as char);
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

/// Inverse of [`encode_segment`] (lenient: bad escapes are kept as is).
pub fn decode_segment(segment: &str) -> String {
    let bytes = segment.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(value) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(value);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn check_segment(original: &str, segment: &str) -> Result<(), InvalidName> {
    if segment.is_empty() {
        return Err(invalid(original, "empty tenant or namespace"));
    }
    let ok = segment
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '=' | ':' | '.' | '_'));
    if !ok {
        return Err(invalid(
            original,
            "tenant and namespace allow only [-=:._a-zA-Z0-9]",
        ));
    }
    Ok(())
}

fn parse_partition_suffix(local: &str) -> Option<u32> {
    let at = local.rfind(PARTITION_SUFFIX)?;
    let digits = &local[at + PARTITION_SUFFIX.len()..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn full(name: &str) -> String {
        TopicName::parse(name).unwrap().to_string()
    }

    #[test]
    fn short_names_expand_like_the_clients() {
        assert_eq!(full("x"), "persistent://public/default/x");
        assert_eq!(full("t/ns/x"), "persistent://t/ns/x");
        assert_eq!(full("persistent://t/ns/x"), "persistent://t/ns/x");
        assert_eq!(full("non-persistent://t/ns/x"), "non-persistent://t/ns/x");
        assert_eq!(full("persistent://t/cluster/ns/x"), "persistent://t/ns/x");
    }

    #[test]
    fn partitions_parse_and_build() {
        let topic = TopicName::parse("persistent://public/default/p-partition-3").unwrap();
        assert_eq!(topic.partition, Some(3));
        assert_eq!(topic.base().to_string(), "persistent://public/default/p");
        assert_eq!(topic.base().partition(3), topic);
        assert_eq!(topic.partition_index(), 3);
        assert_eq!(TopicName::parse("p-partition-x").unwrap().partition, None);
        assert_eq!(TopicName::parse("p").unwrap().partition_index(), -1);
        assert_eq!(topic.log_name(), "public/default/persistent/p-partition-3");
    }

    #[test]
    fn bad_names_are_errors() {
        for bad in [
            "",
            "a/b",
            "a/b/c/d",
            "http://a/b/c",
            "persistent://a/b",
            "persistent://a/b/",
            "persistent://a b/c/d",
            "persistent:///ns/x",
        ] {
            assert!(TopicName::parse(bad).is_err(), "{bad:?} should be rejected");
        }
        assert!(TopicName::parse(&"x".repeat(TOPIC_NAME_BYTES_MAX + 1)).is_err());
        assert!(NamespaceName::parse("public/default").is_ok());
        assert!(NamespaceName::parse("public").is_err());
    }

    #[test]
    fn segments_round_trip() {
        for s in ["plain", "a.b", "..", "with space", "ü/x", "%41"] {
            let encoded = encode_segment(s);
            assert!(!encoded.contains('/') && encoded != "." && encoded != "..");
            assert_eq!(decode_segment(&encoded), s);
        }
    }
}
