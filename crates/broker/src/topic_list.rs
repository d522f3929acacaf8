//! The vocabulary of pattern consumers: topic patterns and the topics hash,
//! as Pulsar computes them (its `TopicList`).
//!
//! Owns: [`TopicsPattern`] (a client's regex with the domain scheme taken
//! off, matched in full against a topic's name without scheme and without
//! partition suffix: `persistent://t/ns/a.*` matches `non-persistent://t/ns/
//! ab-partition-3` too; the request's mode decides the domains) and
//! [`topics_hash`] (CRC32C of the sorted names joined by `,`, written as
//! Guava's `HashCode.toString()`: the four bytes little-endian in hex, so
//! no topic is `00000000`). Also the pattern length limit Pulsar applies.
//! Never: lists topics (the service does) or talks to a client.

use crate::topic_name::TopicName;

/// Longest pattern evaluated by the broker (Pulsar's
/// `subscriptionPatternMaxLength`, 50). A longer one: GET_TOPICS_OF_NAMESPACE
/// answers unfiltered (the client filters), WATCH_TOPIC_LIST is refused.
pub(crate) const PATTERN_BYTES_MAX: usize = 50;

/// Longest pattern compiled at all; regex compilation is bounded by it.
const PATTERN_COMPILE_BYTES_MAX: usize = 1024;

/// Why a pattern cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum PatternError {
    /// A scheme other than `persistent` or `non-persistent`.
    #[error("Does not support topic domain: {0}")]
    Domain(String),
    /// Not a regular expression the broker can compile.
    #[error("{0}")]
    Regex(String),
}

/// A pattern consumer's topics pattern.
#[derive(Debug, Clone)]
pub(crate) struct TopicsPattern {
    regex: regex::Regex,
}

/// `persistent://t/ns/x.*` → `t/ns/x.*` (Pulsar's `removeTopicDomainScheme`:
/// a prefix before the domain, as in `^persistent://`, is kept).
pub(crate) fn remove_domain_scheme(pattern: &str) -> Result<String, PatternError> {
    let Some((prefix, rest)) = pattern.split_once("://") else {
        return Ok(pattern.to_string());
    };
    let kept = if prefix == "persistent" || prefix == "non-persistent" {
        ""
    } else if let Some(kept) = prefix.strip_suffix("non-persistent") {
        kept
    } else if let Some(kept) = prefix.strip_suffix("persistent") {
        kept
    } else {
        return Err(PatternError::Domain(prefix.to_string()));
    };
    Ok(format!("{kept}{rest}"))
}

impl TopicsPattern {
    /// Compiles a client's pattern (domain scheme removed first).
    pub(crate) fn new(pattern: &str) -> Result<TopicsPattern, PatternError> {
        let shortened = remove_domain_scheme(pattern)?;
        if shortened.len() > PATTERN_COMPILE_BYTES_MAX {
            return Err(PatternError::Regex(format!(
                "pattern longer than {PATTERN_COMPILE_BYTES_MAX} bytes"
            )));
        }
        // The client's pattern as written first (errors name it), then
        // anchored: Java's `matches()` takes the whole name.
        regex::Regex::new(&shortened).map_err(|e| PatternError::Regex(e.to_string()))?;
        let regex = regex::Regex::new(&format!("^(?:{shortened})$"))
            .map_err(|e| PatternError::Regex(e.to_string()))?;
        Ok(TopicsPattern { regex })
    }

    /// Whether the topic (full name, maybe a partition) matches.
    pub(crate) fn matches(&self, topic: &str) -> bool {
        let Ok(name) = TopicName::parse(topic) else {
            return false;
        };
        let base = name.base();
        let without_scheme = format!(
            "{}/{}/{}",
            base.namespace.tenant, base.namespace.namespace, base.local
        );
        self.regex.is_match(&without_scheme)
    }

    /// The topics of `topics` that match, in their order.
    pub(crate) fn filter<'a>(&self, topics: impl IntoIterator<Item = &'a String>) -> Vec<String> {
        topics
            .into_iter()
            .filter(|t| self.matches(t))
            .cloned()
            .collect()
    }
}

/// The topics hash of a list (Pulsar's `TopicList.calculateHash`): names
/// sorted as Java sorts strings (UTF-16 code units), joined by `,`, CRC32C,
/// written as the four bytes little-endian in lower-case hex.
pub(crate) fn topics_hash<S: AsRef<str>>(topics: &[S]) -> String {
    let mut sorted: Vec<&str> = topics.iter().map(AsRef::as_ref).collect();
    sorted.sort_by(|a, b| a.encode_utf16().cmp(b.encode_utf16()));
    let mut crc = 0u32;
    for (index, topic) in sorted.iter().enumerate() {
        if index > 0 {
            crc = crc32c::crc32c_append(crc, b",");
        }
        crc = crc32c::crc32c_append(crc, topic.as_bytes());
    }
    crc.to_le_bytes()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn hashes_match_pulsars() {
        // Answers of a Pulsar 4.0.8 standalone (GET_TOPICS_OF_NAMESPACE).
        assert_eq!(topics_hash::<&str>(&[]), "00000000");
        assert_eq!(
            topics_hash(&["non-persistent://public/default/np-2f7cfc"]),
            "22377ecb"
        );
        // The order given does not matter.
        let a = ["persistent://t/ns/b", "persistent://t/ns/a"];
        let b = ["persistent://t/ns/a", "persistent://t/ns/b"];
        assert_eq!(topics_hash(&a), topics_hash(&b));
    }

    #[test]
    fn patterns_match_without_scheme_and_partition() {
        let pattern = TopicsPattern::new("persistent://public/default/w-.*").unwrap();
        assert!(pattern.matches("persistent://public/default/w-1"));
        assert!(pattern.matches("non-persistent://public/default/w-x-partition-2"));
        assert!(!pattern.matches("persistent://public/default/x-w-1"));
        assert!(!pattern.matches("persistent://public/other/w-1"));
        // A whole-name match: no substring matches.
        let exact = TopicsPattern::new("public/default/w").unwrap();
        assert!(!exact.matches("persistent://public/default/w-1"));
        assert_eq!(
            remove_domain_scheme("^persistent://public/default/.*").unwrap(),
            "^public/default/.*"
        );
        assert!(matches!(
            TopicsPattern::new("http://public/default/.*"),
            Err(PatternError::Domain(_))
        ));
        assert!(matches!(
            TopicsPattern::new("persistent://public/default/(("),
            Err(PatternError::Regex(_))
        ));
    }
}
