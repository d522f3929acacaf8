//! Store URLs: which backend a `--metadata` argument names, and opening it.
//!
//! Owns: the URL grammar.
//! - `memory://` a fresh private [`MemoryStore`]; `memory://NAME` the store of
//!   that name in this process (shared while any handle to it lives), so the
//!   parts of an in-process cluster can each open the same URL;
//! - `file:///abs/dir` or a plain path `dir` (no `://`): a [`FileStore`] in `dir`;
//! - `etcd://host:port[,host:port...]`: an [`EtcdStore`].

use std::collections::HashMap;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use crate::error::MetaError;
use crate::etcd::EtcdStore;
use crate::file::FileStore;
use crate::memory::{MemoryStore, WeakMemoryStore};
use crate::store::MetadataStore;

/// Named memory stores one process may hold at once (tests open a few per
/// cluster). When full, opening a new name fails with `LimitReached`.
const NAMED_MEMORY_STORES_MAX: usize = 1024;

/// A parsed store URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum StoreUrl {
    /// `memory://` (private, `name` is `None`) or `memory://NAME` (shared).
    Memory {
        /// The shared store's name.
        name: Option<String>,
    },
    /// `file:///dir` or a plain path.
    File {
        /// The store directory.
        dir: PathBuf,
    },
    /// `etcd://host:port[,host:port...]`.
    Etcd {
        /// `host:port` of each endpoint.
        endpoints: Vec<String>,
    },
}

impl FromStr for StoreUrl {
    type Err = MetaError;

    fn from_str(url: &str) -> Result<Self, MetaError> {
        let bad = |reason: &str| MetaError::BadUrl {
            url: url.to_owned(),
            reason: reason.to_owned(),
        };
        let Some((scheme, rest)) = url.split_once("://") else {
            if url.is_empty() {
                return Err(bad("empty"));
            }
            return Ok(StoreUrl::File {
                dir: PathBuf::from(url),
            });
        };
        match scheme {
            "memory" => {
                let name = rest.trim_end_matches('/');
                if name.contains('/') {
                    return Err(bad("a memory store name must not contain '/'"));
                }
                Ok(StoreUrl::Memory {
                    name: (!name.is_empty()).then(|| name.to_owned()),
                })
            }
            "file" => {
                if !rest.starts_with('/') {
                    return Err(bad("expected file:///absolute/path"));
                }
                Ok(StoreUrl::File {
                    dir: PathBuf::from(rest),
                })
            }
            "etcd" => {
                let list = rest.trim_end_matches('/');
                if list.is_empty() {
                    return Err(bad("no etcd endpoints"));
                }
                let mut endpoints = Vec::new();
                for endpoint in list.split(',') {
                    let Some((host, port)) = endpoint.rsplit_once(':') else {
                        return Err(bad("each etcd endpoint must be host:port"));
                    };
                    if host.is_empty() || host.contains('/') || port.parse::<u16>().is_err() {
                        return Err(bad("each etcd endpoint must be host:port"));
                    }
                    endpoints.push(endpoint.to_owned());
                }
                Ok(StoreUrl::Etcd { endpoints })
            }
            _ => Err(bad(
                "unknown scheme; expected memory://, file:///dir or etcd://host:port",
            )),
        }
    }
}

/// Opens the store `url` names (see the module docs). A malformed URL:
/// `BadUrl` naming it.
pub async fn open_store(url: &str) -> Result<Arc<dyn MetadataStore>, MetaError> {
    match url.parse::<StoreUrl>()? {
        StoreUrl::Memory { name: None } => Ok(Arc::new(MemoryStore::new())),
        StoreUrl::Memory { name: Some(name) } => Ok(Arc::new(named_memory_store(&name)?)),
        StoreUrl::File { dir } => Ok(Arc::new(FileStore::open(dir).await?)),
        StoreUrl::Etcd { endpoints } => Ok(Arc::new(EtcdStore::connect(&endpoints).await?)),
    }
}

static NAMED_MEMORY_STORES: Mutex<Option<HashMap<String, WeakMemoryStore>>> = Mutex::new(None);

fn named_memory_store(name: &str) -> Result<MemoryStore, MetaError> {
    let mut guard = NAMED_MEMORY_STORES
        .lock()
        .unwrap_or_else(|poisoned| poisoned.into_inner());
    let stores = guard.get_or_insert_with(HashMap::new);
    if let Some(store) = stores.get(name).and_then(WeakMemoryStore::upgrade) {
        return Ok(store);
    }
    stores.retain(|_, weak| weak.upgrade().is_some());
    if stores.len() >= NAMED_MEMORY_STORES_MAX {
        return Err(MetaError::LimitReached {
            what: "named memory stores",
            limit: NAMED_MEMORY_STORES_MAX,
        });
    }
    let store = MemoryStore::new();
    stores.insert(name.to_owned(), store.downgrade());
    Ok(store)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn parses_each_scheme_and_rejects_bad_urls() {
        assert_eq!(
            "memory://".parse::<StoreUrl>().unwrap(),
            StoreUrl::Memory { name: None }
        );
        assert_eq!(
            "memory://c1".parse::<StoreUrl>().unwrap(),
            StoreUrl::Memory {
                name: Some("c1".to_owned())
            }
        );
        assert_eq!(
            "file:///var/vela/meta".parse::<StoreUrl>().unwrap(),
            StoreUrl::File {
                dir: PathBuf::from("/var/vela/meta")
            }
        );
        assert_eq!(
            "data/meta".parse::<StoreUrl>().unwrap(),
            StoreUrl::File {
                dir: PathBuf::from("data/meta")
            }
        );
        assert_eq!(
            "etcd://127.0.0.1:2379,h2:2379".parse::<StoreUrl>().unwrap(),
            StoreUrl::Etcd {
                endpoints: vec!["127.0.0.1:2379".to_owned(), "h2:2379".to_owned()]
            }
        );
        for bad in [
            "",
            "zk://h:2181",
            "etcd://",
            "etcd://h",
            "etcd://h:port",
            "file://relative",
            "memory://a/b",
        ] {
            match bad.parse::<StoreUrl>() {
                Err(MetaError::BadUrl { url, .. }) => assert_eq!(url, bad),
                other => panic!("{bad:?} parsed as {other:?}"),
            }
        }
    }

    #[tokio::test]
    async fn named_memory_stores_are_shared_private_ones_are_not() {
        let a = open_store("memory://shared-test").await.unwrap();
        let b = open_store("memory://shared-test").await.unwrap();
        let c = open_store("memory://").await.unwrap();
        a.put(
            "/k",
            bytes::Bytes::from_static(b"v"),
            crate::ExpectedVersion::Absent,
        )
        .await
        .unwrap();
        assert!(b.get("/k").await.unwrap().is_some());
        assert!(c.get("/k").await.unwrap().is_none());
        drop((a, b));
        let again = open_store("memory://shared-test").await.unwrap();
        assert!(
            again.get("/k").await.unwrap().is_none(),
            "a dropped named store starts empty"
        );
    }
}
