//! Advertised listeners (Pulsar's `advertisedListeners` and
//! `internalListenerName`): the names under which a broker publishes other
//! addresses of itself, for clients that reach it another way (another
//! network, a NAT, a proxy). A lookup naming a listener is answered with
//! that listener's URLs.
//!
//! Owns: [`AdvertisedListener`] and [`parse_advertised_listeners`], which
//! checks `name:url,name:url,...` as Pulsar's `MultipleListenerValidator`
//! does, with its messages: every entry names its listener, a listener has
//! at most two URLs and one per scheme (`pulsar`, `pulsar+ssl`, `http`,
//! `https`), no `host:port` serves two listeners, and the internal
//! listener (the first one unless named) is among them. URLs need an
//! explicit port (clients parse them as URIs and the Go client insists).
//! Never: binds anything (the listeners describe addresses, the broker's
//! ports are its own).

use std::collections::{BTreeMap, BTreeSet};

/// Listeners one broker may advertise (each is a few URLs in every
/// registration record). More are refused at startup.
pub const ADVERTISED_LISTENERS_MAX: usize = 64;

/// One advertised listener.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct AdvertisedListener {
    /// `pulsar://host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_url: Option<String>,
    /// `pulsar+ssl://host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_url_tls: Option<String>,
    /// `http://host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http_url: Option<String>,
    /// `https://host:port`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub https_url: Option<String>,
}

/// Listeners by name, and the internal one's name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AdvertisedListeners {
    /// Listener name → its URLs.
    pub listeners: BTreeMap<String, AdvertisedListener>,
    /// The listener whose URLs the broker publishes as its own (Pulsar's
    /// `internalListenerName`: brokers and clients naming no listener use
    /// it).
    pub internal: Option<String>,
}

/// A bad `--advertised-listeners` value (Pulsar's messages).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct ListenerError(pub String);

/// `(scheme, host, port)` of a listener URL; `None` unless it is
/// `scheme://host:port` with a port in 1..=65535.
fn url_parts(url: &str) -> Option<(&str, &str, u16)> {
    let (scheme, rest) = url.split_once("://")?;
    let authority = rest.strip_suffix('/').unwrap_or(rest);
    let (host, port) = authority.rsplit_once(':')?;
    let host_ok = !host.is_empty()
        && host
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '.' | '-' | '_' | '[' | ']' | ':'));
    let port: u16 = port.parse().ok().filter(|p| *p > 0)?;
    (host_ok && !scheme.is_empty()).then_some((scheme, host, port))
}

/// Parses `name:url,name:url,...` (and checks it as Pulsar does); the
/// internal listener is `internal` or else the first one named.
pub fn parse_advertised_listeners(
    text: &str,
    internal: Option<&str>,
) -> Result<AdvertisedListeners, ListenerError> {
    let mut order: Vec<String> = Vec::new();
    let mut urls: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for entry in text.split(',').map(str::trim).filter(|e| !e.is_empty()) {
        let Some((name, url)) = entry.split_once(':').filter(|(name, _)| !name.is_empty()) else {
            return Err(ListenerError(format!(
                "the configure entry `advertisedListeners` is invalid. because {entry} do not contain listener name"
            )));
        };
        let name = name.trim().to_string();
        if !urls.contains_key(&name) {
            order.push(name.clone());
        }
        urls.entry(name).or_default().push(url.trim().to_string());
    }
    if order.len() > ADVERTISED_LISTENERS_MAX {
        return Err(ListenerError(format!(
            "more than ADVERTISED_LISTENERS_MAX ({ADVERTISED_LISTENERS_MAX}) advertised listeners"
        )));
    }
    let Some(first) = order.first() else {
        return Ok(AdvertisedListeners::default());
    };
    let internal = internal
        .filter(|n| !n.is_empty())
        .unwrap_or(first)
        .to_string();
    if !urls.contains_key(&internal) {
        return Err(ListenerError(
            "the `advertisedListeners` configure do not contain `internalListenerName` entry"
                .into(),
        ));
    }
    let mut listeners = BTreeMap::new();
    let mut owners: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for (name, list) in &urls {
        let redundant = || {
            ListenerError(format!(
                "there are redundant configure for listener `{name}`"
            ))
        };
        if list.len() > 2 {
            return Err(redundant());
        }
        let mut listener = AdvertisedListener::default();
        for url in list {
            let invalid = || {
                ListenerError(format!(
                    "the value {url} in the `advertisedListeners` configure is invalid"
                ))
            };
            let (scheme, host, port) = url_parts(url).ok_or_else(invalid)?;
            let slot = match scheme.to_ascii_lowercase().as_str() {
                "pulsar" => &mut listener.service_url,
                "pulsar+ssl" => &mut listener.service_url_tls,
                "http" => &mut listener.http_url,
                "https" => &mut listener.https_url,
                _ => return Err(invalid()),
            };
            if slot.replace(url.clone()).is_some() {
                return Err(redundant());
            }
            let host_port = format!("{host}:{port}");
            let names = owners.entry(host_port.clone()).or_default();
            names.insert(name.clone());
            if names.len() > 1 {
                return Err(ListenerError(format!(
                    "must not specify `{host_port}` to different listener."
                )));
            }
        }
        listeners.insert(name.clone(), listener);
    }
    Ok(AdvertisedListeners {
        listeners,
        internal: Some(internal),
    })
}

/// What a lookup naming an unknown listener is answered (Pulsar's
/// `PulsarServerException` message).
pub fn unknown_listener(name: &str) -> String {
    format!("the broker do not have {name} listener")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn error(text: &str, internal: Option<&str>) -> String {
        parse_advertised_listeners(text, internal).unwrap_err().0
    }

    #[test]
    fn listeners_parse_with_the_internal_one_first_by_default() {
        let parsed = parse_advertised_listeners(
            "internal:pulsar://10.0.0.1:6650, internal:pulsar+ssl://10.0.0.1:6651,\
             external:pulsar://broker.example.com:6650",
            None,
        )
        .unwrap();
        assert_eq!(parsed.internal.as_deref(), Some("internal"));
        let internal = &parsed.listeners["internal"];
        assert_eq!(
            internal.service_url.as_deref(),
            Some("pulsar://10.0.0.1:6650")
        );
        assert_eq!(
            internal.service_url_tls.as_deref(),
            Some("pulsar+ssl://10.0.0.1:6651")
        );
        let external = &parsed.listeners["external"];
        assert_eq!(
            external.service_url.as_deref(),
            Some("pulsar://broker.example.com:6650")
        );
        assert_eq!(external.service_url_tls, None);
        let named = parse_advertised_listeners("a:pulsar://h:1,b:pulsar://h:2", Some("b")).unwrap();
        assert_eq!(named.internal.as_deref(), Some("b"));
        assert_eq!(
            parse_advertised_listeners("", None).unwrap(),
            AdvertisedListeners::default()
        );
    }

    #[test]
    fn bad_values_are_refused_with_pulsars_messages() {
        assert_eq!(
            error(":pulsar://h:1", None),
            "the configure entry `advertisedListeners` is invalid. because :pulsar://h:1 do not contain listener name"
        );
        // The name is what comes before the first colon, as in Pulsar.
        assert_eq!(
            error("pulsar://h:1", None),
            "the value //h:1 in the `advertisedListeners` configure is invalid"
        );
        assert_eq!(
            error("a:pulsar://h:1", Some("b")),
            "the `advertisedListeners` configure do not contain `internalListenerName` entry"
        );
        assert_eq!(
            error("a:pulsar://h:1,a:pulsar://h:2", None),
            "there are redundant configure for listener `a`"
        );
        assert_eq!(
            error("a:pulsar://h:1,a:pulsar+ssl://h:2,a:http://h:3", None),
            "there are redundant configure for listener `a`"
        );
        assert_eq!(
            error("a:pulsar://h:1,b:pulsar+ssl://h:1", None),
            "must not specify `h:1` to different listener."
        );
        assert_eq!(
            error("a:pulsar://h", None),
            "the value pulsar://h in the `advertisedListeners` configure is invalid"
        );
        assert_eq!(
            error("a:ftp://h:1", None),
            "the value ftp://h:1 in the `advertisedListeners` configure is invalid"
        );
        assert_eq!(
            unknown_listener("nope"),
            "the broker do not have nope listener"
        );
    }
}
