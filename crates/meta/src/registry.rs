//! Bookie registration and discovery.
//!
//! Owns: the layout under [`BOOKIES_AVAILABLE_PATH`] and the record format of a
//! registration. A bookie registers as the ephemeral key
//! `/bookies/available/<id>` of its session, so it disappears when the bookie
//! dies (after the session TTL) or closes its session. Clients list the
//! available bookies, and watch the path to learn when to list again.
//!
//! Record format (JSON, a compatibility promise: add fields only as optional):
//! `{"address":"10.0.0.5:3181","rack":"/rack-1"}` (`rack` omitted when unset).
//!
//! A bookie that cannot take new adds (disk almost full, a failed disk write)
//! also holds the ephemeral key `/bookies/read-only/<id>` (empty value) of the
//! same session, as BookKeeper's `available/readonly`: placement of new
//! ensembles skips it, readers still reach it through its registration.

use bytes::Bytes;
use serde::{Deserialize, Serialize};

use crate::error::MetaError;
use crate::key::validate_segment;
use crate::session::Session;
use crate::store::{ExpectedVersion, MetadataStore, Version};
use crate::watch::Watcher;

/// Parent of the bookie registrations.
pub const BOOKIES_AVAILABLE_PATH: &str = "/bookies/available";

/// Parent of the read-only marks of registered bookies.
pub const BOOKIES_READ_ONLY_PATH: &str = "/bookies/read-only";

/// Longest bookie id, address or rack name, in bytes (a DNS name is at most 253).
pub const BOOKIE_FIELD_BYTES_MAX: usize = 255;

/// A bookie's id: one key segment, usually its `host:port`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct BookieId(String);

impl BookieId {
    /// Checks that `id` is usable as a key segment (no `/`, not empty, not `.`/`..`,
    /// at most [`BOOKIE_FIELD_BYTES_MAX`] bytes).
    pub fn new(id: impl Into<String>) -> Result<Self, MetaError> {
        let id = id.into();
        if id.len() > BOOKIE_FIELD_BYTES_MAX {
            return Err(MetaError::KeyTooLong {
                key_bytes: id.len(),
                key_bytes_max: BOOKIE_FIELD_BYTES_MAX,
            });
        }
        validate_segment(&id)?;
        Ok(Self(id))
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for BookieId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// What a bookie publishes about itself.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct BookieInfo {
    /// Where clients connect (`host:port`).
    pub address: String,
    /// Its rack or failure domain, for placement.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rack: Option<String>,
}

/// The key of bookie `id`'s registration.
pub fn bookie_key(id: &BookieId) -> String {
    format!("{BOOKIES_AVAILABLE_PATH}/{id}")
}

/// Encodes a registration record.
pub fn encode_bookie_info(info: &BookieInfo) -> Result<Bytes, MetaError> {
    check_info(info)?;
    serde_json::to_vec(info)
        .map(Bytes::from)
        .map_err(|_| MetaError::InvalidArgument {
            reason: "bookie info does not encode as JSON",
        })
}

/// Decodes the registration record stored at `key`.
pub fn decode_bookie_info(key: &str, bytes: &[u8]) -> Result<BookieInfo, MetaError> {
    let info: BookieInfo =
        serde_json::from_slice(bytes).map_err(|error| MetaError::Corruption {
            key: key.to_owned(),
            reason: format!("bookie registration is not valid JSON: {error}"),
        })?;
    check_info(&info).map_err(|error| MetaError::Corruption {
        key: key.to_owned(),
        reason: error.to_string(),
    })?;
    Ok(info)
}

fn check_info(info: &BookieInfo) -> Result<(), MetaError> {
    let too_long = |s: &str| s.len() > BOOKIE_FIELD_BYTES_MAX;
    if info.address.is_empty()
        || too_long(&info.address)
        || info.rack.as_deref().is_some_and(too_long)
    {
        return Err(MetaError::InvalidArgument {
            reason: "bookie address must be 1..=255 bytes and rack at most 255 bytes",
        });
    }
    Ok(())
}

/// Registers bookie `id` as available for as long as `session` lives. Another
/// live registration of the same id: `Exists` (a restarted bookie may have to
/// wait for its previous session's TTL).
pub async fn register_bookie(
    store: &dyn MetadataStore,
    session: &Session,
    id: &BookieId,
    info: &BookieInfo,
) -> Result<Version, MetaError> {
    let value = encode_bookie_info(info)?;
    store
        .put_ephemeral(session, &bookie_key(id), value, ExpectedVersion::Absent)
        .await
}

/// The key of bookie `id`'s read-only mark.
pub fn read_only_key(id: &BookieId) -> String {
    format!("{BOOKIES_READ_ONLY_PATH}/{id}")
}

/// Marks bookie `id` read-only (or not) for as long as `session` lives.
/// Idempotent.
pub async fn set_read_only(
    store: &dyn MetadataStore,
    session: &Session,
    id: &BookieId,
    read_only: bool,
) -> Result<(), MetaError> {
    let key = read_only_key(id);
    if read_only {
        store
            .put_ephemeral(session, &key, Bytes::new(), ExpectedVersion::Any)
            .await
            .map(|_| ())
    } else {
        match store.delete(&key, ExpectedVersion::Any).await {
            Ok(()) | Err(MetaError::NotFound { .. }) => Ok(()),
            Err(error) => Err(error),
        }
    }
}

/// Ids of the bookies marked read-only now, sorted.
pub async fn list_read_only(store: &dyn MetadataStore) -> Result<Vec<BookieId>, MetaError> {
    let mut ids = Vec::new();
    for name in store.children(BOOKIES_READ_ONLY_PATH).await? {
        if let Ok(id) = BookieId::new(name) {
            ids.push(id);
        }
    }
    Ok(ids)
}

/// The bookies registered now, sorted by id. A registration that does not
/// decode is skipped and logged, so one bad record does not hide the others.
pub async fn list_bookies(
    store: &dyn MetadataStore,
) -> Result<Vec<(BookieId, BookieInfo)>, MetaError> {
    let mut bookies = Vec::new();
    for name in store.children(BOOKIES_AVAILABLE_PATH).await? {
        let Ok(id) = BookieId::new(name) else {
            continue;
        };
        let key = bookie_key(&id);
        // Gone since the listing: the bookie just left.
        let Some((value, _)) = store.get(&key).await? else {
            continue;
        };
        match decode_bookie_info(&key, &value) {
            Ok(info) => bookies.push((id, info)),
            Err(error) => tracing::warn!(%error, "skipping a bookie registration"),
        }
    }
    Ok(bookies)
}

/// Watches the registrations: any event means "list again" (`Lagged` too).
/// Create the watcher before the first [`list_bookies`] so no change is missed.
pub async fn watch_bookies(store: &dyn MetadataStore) -> Result<Watcher, MetaError> {
    store.watch(BOOKIES_AVAILABLE_PATH).await
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trip_and_bad_records() {
        let info = BookieInfo {
            address: "10.0.0.5:3181".to_owned(),
            rack: Some("/rack-1".to_owned()),
        };
        let bytes = encode_bookie_info(&info).unwrap();
        assert_eq!(
            &bytes[..],
            br#"{"address":"10.0.0.5:3181","rack":"/rack-1"}"#
        );
        assert_eq!(decode_bookie_info("/k", &bytes).unwrap(), info);
        let no_rack = decode_bookie_info("/k", br#"{"address":"h:1"}"#).unwrap();
        assert_eq!(no_rack.rack, None);
        for bad in [&b"{"[..], br#"{"rack":"r"}"#, br#"{"address":""}"#, b"\xff"] {
            assert!(matches!(
                decode_bookie_info("/k", bad),
                Err(MetaError::Corruption { .. })
            ));
        }
        assert!(BookieId::new("a/b").is_err());
        assert!(BookieId::new("").is_err());
        assert!(BookieId::new("x".repeat(BOOKIE_FIELD_BYTES_MAX + 1)).is_err());
        assert_eq!(
            bookie_key(&BookieId::new("h:3181").unwrap()),
            "/bookies/available/h:3181"
        );
    }
}
