//! `FileStore`: the durable metadata store for one machine, in a redb file.
//!
//! Owns: the directory's `metadata.redb` and its record format. Guarantees: a
//! write returns only after its redb write transaction committed with
//! `Durability::Immediate` (redb fsyncs the file before `commit` returns), so an
//! acknowledged write survives kill -9 and power loss. One process at a time:
//! redb locks the file, a second open gets `AlreadyOpen`.
//!
//! Watches and sessions are in-process (see the local engine). Ephemeral keys are
//! flagged on disk and deleted when the store opens, since the sessions of the
//! process that wrote them died with it.
//!
//! Never does: blocking I/O on a tokio worker (every redb call runs on the
//! blocking pool).

use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::Bytes;
use redb::{Database, Durability, ReadableDatabase, ReadableTable, TableDefinition};

use crate::error::MetaError;
use crate::key::{CHILDREN_COUNT_MAX, direct_child};
use crate::local::{LocalBackend, LocalStore, Mutation, Record};
use crate::memory::local_metadata_store;
use crate::session::{Session, SessionId, SessionState};
use crate::store::{BackendKind, BoxFuture, ExpectedVersion, MetadataStore, Version};
use crate::watch::Watcher;

/// Page cache of the store's database (redb's own default is 1 GiB, all of
/// it resident once touched): the metadata of 100,000 topics (log records,
/// cursors, ledgers, registrations) is ~100 MB on disk, and only the keys
/// of topics in use are hot. Reads past it go to the page cache and disk.
const FILE_STORE_CACHE_BYTES: usize = 32 * 1024 * 1024;

/// The database file inside the store directory.
pub const FILE_STORE_DB_NAME: &str = "metadata.redb";

/// key → encoded record (see `encode_record`).
const KV_TABLE: TableDefinition<&str, &[u8]> = TableDefinition::new("kv");
/// Store-wide counters: `format` and `revision`.
const META_TABLE: TableDefinition<&str, u64> = TableDefinition::new("meta");
const META_FORMAT: &str = "format";
const META_REVISION: &str = "revision";

/// Version of the record format in `KV_TABLE`. Bump it with a migration.
const FORMAT_VERSION: u64 = 1;

/// Record flag: the key belongs to a session (deleted at open).
const FLAG_EPHEMERAL: u8 = 0b0000_0001;
const FLAGS_KNOWN: u8 = FLAG_EPHEMERAL;

/// Bytes before the value in an encoded record.
const RECORD_HEADER_BYTES: usize = 1 + 8;

// Record layout (format 1), hand-encoded:
// { flags u8 | version u64 LE | value bytes }
fn encode_record(record: &Record) -> Vec<u8> {
    let mut out = Vec::with_capacity(RECORD_HEADER_BYTES + record.value.len());
    out.push(if record.ephemeral { FLAG_EPHEMERAL } else { 0 });
    out.extend_from_slice(&record.version.0.to_le_bytes());
    out.extend_from_slice(&record.value);
    out
}

fn decode_record(key: &str, bytes: &[u8]) -> Result<Record, MetaError> {
    let corrupt = |reason: String| MetaError::Corruption {
        key: key.to_owned(),
        reason,
    };
    let (header, value) = bytes.split_at_checked(RECORD_HEADER_BYTES).ok_or_else(|| {
        corrupt(format!(
            "record of {} bytes is shorter than its header",
            bytes.len()
        ))
    })?;
    let flags = header[0];
    if flags & !FLAGS_KNOWN != 0 {
        return Err(corrupt(format!("unknown flags {flags:#04x}")));
    }
    let mut version_bytes = [0u8; 8];
    version_bytes.copy_from_slice(&header[1..]);
    let version = u64::from_le_bytes(version_bytes);
    if version == 0 {
        return Err(corrupt("version 0".to_owned()));
    }
    if value.len() > crate::key::VALUE_BYTES_MAX {
        return Err(corrupt(format!(
            "value of {} bytes exceeds the limit",
            value.len()
        )));
    }
    Ok(Record {
        value: Bytes::copy_from_slice(value),
        version: Version(version),
        ephemeral: flags & FLAG_EPHEMERAL != 0,
    })
}

fn redb_error<E: Into<redb::Error>>(op: &'static str) -> impl FnOnce(E) -> MetaError {
    move |error| MetaError::Backend {
        op,
        detail: error.into().to_string(),
    }
}

#[derive(Debug)]
pub(crate) struct RedbBackend {
    db: Database,
}

impl LocalBackend for RedbBackend {
    const BLOCKING: bool = true;

    fn get(&self, key: &str) -> Result<Option<Record>, MetaError> {
        let txn = self.db.begin_read().map_err(redb_error("get"))?;
        let table = txn.open_table(KV_TABLE).map_err(redb_error("get"))?;
        let found = table.get(key).map_err(redb_error("get"))?;
        match found {
            Some(guard) => Ok(Some(decode_record(key, guard.value())?)),
            None => Ok(None),
        }
    }

    fn children(&self, path: &str, prefix: &str) -> Result<Vec<String>, MetaError> {
        let txn = self.db.begin_read().map_err(redb_error("children"))?;
        let table = txn.open_table(KV_TABLE).map_err(redb_error("children"))?;
        let mut names = Vec::new();
        for item in table
            .range::<&str>(prefix..)
            .map_err(redb_error("children"))?
        {
            let (key, _) = item.map_err(redb_error("children"))?;
            let key = key.value();
            if !key.starts_with(prefix) {
                break;
            }
            if let Some(name) = direct_child(prefix, key) {
                if names.len() >= CHILDREN_COUNT_MAX {
                    return Err(MetaError::TooManyChildren {
                        parent: path.to_owned(),
                        children_count_max: CHILDREN_COUNT_MAX,
                    });
                }
                names.push(name.to_owned());
            }
        }
        Ok(names)
    }

    fn commit(&self, mutations: &[Mutation<'_>], revision: u64) -> Result<(), MetaError> {
        let mut txn = self.db.begin_write().map_err(redb_error("commit"))?;
        // Named choice, not the default by accident: fsync before commit returns.
        txn.set_durability(Durability::Immediate)
            .map_err(|error| MetaError::Backend {
                op: "commit",
                detail: error.to_string(),
            })?;
        {
            let mut kv = txn.open_table(KV_TABLE).map_err(redb_error("commit"))?;
            for mutation in mutations {
                match mutation {
                    Mutation::Put { key, record } => {
                        let encoded = encode_record(record);
                        kv.insert(*key, encoded.as_slice())
                            .map_err(redb_error("commit"))?;
                    }
                    Mutation::Delete { key } => {
                        kv.remove(*key).map_err(redb_error("commit"))?;
                    }
                }
            }
            let mut meta = txn.open_table(META_TABLE).map_err(redb_error("commit"))?;
            meta.insert(META_REVISION, revision)
                .map_err(redb_error("commit"))?;
        }
        txn.commit().map_err(redb_error("commit"))
    }
}

impl RedbBackend {
    /// Opens or creates the database in `dir`, checks its format, deletes the
    /// ephemeral keys left by the previous process, and returns the last revision.
    fn open(dir: &Path) -> Result<(Self, u64), MetaError> {
        let io_error = |op: &'static str| {
            move |error: std::io::Error| MetaError::Backend {
                op,
                detail: format!("{}: {error}", dir.display()),
            }
        };
        if !dir.is_dir() {
            std::fs::create_dir_all(dir).map_err(io_error("create store directory"))?;
            // Make the new directory's own entry durable.
            if let Some(parent) = dir.parent().filter(|p| !p.as_os_str().is_empty()) {
                std::fs::File::open(parent)
                    .and_then(|d| d.sync_all())
                    .map_err(io_error("sync parent of store directory"))?;
            }
        }
        let path = dir.join(FILE_STORE_DB_NAME);
        let db = Database::builder()
            .set_cache_size(FILE_STORE_CACHE_BYTES)
            .create(&path)
            .map_err(|error| match error {
                redb::DatabaseError::DatabaseAlreadyOpen => MetaError::AlreadyOpen {
                    path: path.display().to_string(),
                },
                other => MetaError::Backend {
                    op: "open",
                    detail: format!("{}: {other}", path.display()),
                },
            })?;
        // The file may be new: make its directory entry durable too.
        std::fs::File::open(dir)
            .and_then(|d| d.sync_all())
            .map_err(io_error("sync store directory"))?;
        Self::init(db, &path.display().to_string())
    }

    /// Checks the format of an open database, deletes the ephemeral keys left by
    /// the previous process, and returns the last revision.
    fn init(db: Database, name: &str) -> Result<(Self, u64), MetaError> {
        let mut txn = db.begin_write().map_err(redb_error("open"))?;
        txn.set_durability(Durability::Immediate)
            .map_err(|error| MetaError::Backend {
                op: "open",
                detail: error.to_string(),
            })?;
        let (revision, ephemeral_keys) = {
            let mut meta = txn.open_table(META_TABLE).map_err(redb_error("open"))?;
            let format = meta
                .get(META_FORMAT)
                .map_err(redb_error("open"))?
                .map(|g| g.value());
            match format {
                None => {
                    meta.insert(META_FORMAT, FORMAT_VERSION)
                        .map_err(redb_error("open"))?;
                }
                Some(FORMAT_VERSION) => {}
                Some(other) => {
                    return Err(MetaError::Corruption {
                        key: name.to_owned(),
                        reason: format!("format {other}, this build reads format {FORMAT_VERSION}"),
                    });
                }
            }
            let revision = meta
                .get(META_REVISION)
                .map_err(redb_error("open"))?
                .map(|g| g.value());
            let mut kv = txn.open_table(KV_TABLE).map_err(redb_error("open"))?;
            let mut ephemeral_keys = Vec::new();
            for item in kv.iter().map_err(redb_error("open"))? {
                let (key, value) = item.map_err(redb_error("open"))?;
                if decode_record(key.value(), value.value())?.ephemeral {
                    ephemeral_keys.push(key.value().to_owned());
                }
            }
            for key in &ephemeral_keys {
                kv.remove(key.as_str()).map_err(redb_error("open"))?;
            }
            (revision.unwrap_or(0), ephemeral_keys)
        };
        txn.commit().map_err(redb_error("open"))?;
        if !ephemeral_keys.is_empty() {
            tracing::info!(
                path = name,
                count = ephemeral_keys.len(),
                "deleted ephemeral metadata keys left by the previous process"
            );
        }
        Ok((Self { db }, revision))
    }
}

/// The durable metadata store for one machine: a redb file in a directory.
/// Cheap to clone: clones share the open database.
#[derive(Debug, Clone)]
pub struct FileStore {
    engine: LocalStore<RedbBackend>,
    dir: PathBuf,
}

impl FileStore {
    /// Opens (or creates) the store in `dir`. Ephemeral keys of the previous
    /// process are deleted. Another open store on the same directory:
    /// `AlreadyOpen`.
    pub async fn open(dir: impl AsRef<Path>) -> Result<Self, MetaError> {
        let dir = dir.as_ref().to_path_buf();
        let open_dir = dir.clone();
        let (backend, revision) = tokio::task::spawn_blocking(move || RedbBackend::open(&open_dir))
            .await
            .map_err(|join_error| MetaError::Backend {
                op: "open",
                detail: join_error.to_string(),
            })??;
        Ok(Self {
            engine: LocalStore::new(backend, revision),
            dir,
        })
    }

    /// The store's directory.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Expires session `id` now, as if its holder had died: its ephemeral keys
    /// are deleted and its handle reports `Expired`.
    pub async fn expire_session(&self, id: SessionId) -> Result<(), MetaError> {
        self.engine.end_session(id, SessionState::Expired).await
    }
}

local_metadata_store!(FileStore, BackendKind::File);

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};

    /// redb's in-memory storage whose `sync_data` fails while `fail_sync` is set.
    #[derive(Debug)]
    struct FaultySync {
        inner: redb::backends::InMemoryBackend,
        fail_sync: Arc<AtomicBool>,
    }

    impl redb::StorageBackend for FaultySync {
        fn len(&self) -> Result<u64, std::io::Error> {
            self.inner.len()
        }
        fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), std::io::Error> {
            self.inner.read(offset, out)
        }
        fn set_len(&self, len: u64) -> Result<(), std::io::Error> {
            self.inner.set_len(len)
        }
        fn sync_data(&self) -> Result<(), std::io::Error> {
            if self.fail_sync.load(Ordering::SeqCst) {
                return Err(std::io::Error::other("injected fsync failure"));
            }
            self.inner.sync_data()
        }
        fn write(&self, offset: u64, data: &[u8]) -> Result<(), std::io::Error> {
            self.inner.write(offset, data)
        }
    }

    #[tokio::test]
    async fn failed_fsync_is_fatal_and_never_retried() {
        let fail_sync = Arc::new(AtomicBool::new(false));
        let storage = FaultySync {
            inner: redb::backends::InMemoryBackend::new(),
            fail_sync: Arc::clone(&fail_sync),
        };
        let db = Database::builder().create_with_backend(storage).unwrap();
        let (backend, revision) = RedbBackend::init(db, "faulty").unwrap();
        let store = FileStore {
            engine: LocalStore::new(backend, revision),
            dir: PathBuf::new(),
        };
        let v = store
            .put("/k", Bytes::from_static(b"1"), ExpectedVersion::Absent)
            .await
            .unwrap();
        let mut watcher = store.watch("/k").await.unwrap();

        fail_sync.store(true, Ordering::SeqCst);
        let failed = store
            .put("/k", Bytes::from_static(b"2"), ExpectedVersion::Is(v))
            .await;
        assert!(
            matches!(failed, Err(MetaError::Backend { .. })),
            "{failed:?}"
        );
        assert_eq!(
            watcher.try_recv(),
            None,
            "no event for a write that was not acknowledged"
        );

        // The disk "recovers"; the store must not: the file's state is unknown.
        fail_sync.store(false, Ordering::SeqCst);
        assert!(matches!(
            store
                .put("/other", Bytes::new(), ExpectedVersion::Any)
                .await,
            Err(MetaError::Backend { .. })
        ));
        assert!(matches!(
            store.get("/k").await,
            Err(MetaError::Backend { .. })
        ));
    }

    /// Concurrent writers share commits; what each was told is on disk after
    /// the store is closed and opened again, and revisions go on from there.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn concurrent_writes_are_durable_across_a_reopen() {
        let dir = tempfile::tempdir().unwrap();
        let store = FileStore::open(dir.path()).await.unwrap();
        let writers: Vec<_> = (0..64)
            .map(|i| {
                let store = store.clone();
                tokio::spawn(async move {
                    let key = format!("/c/{i:02}");
                    let value = Bytes::from(format!("v{i}"));
                    let version = store
                        .put(&key, value.clone(), ExpectedVersion::Absent)
                        .await
                        .unwrap();
                    (key, value, version)
                })
            })
            .collect();
        let mut acked = Vec::new();
        for writer in writers {
            acked.push(writer.await.unwrap());
        }
        let newest = acked.iter().map(|(_, _, v)| *v).max().unwrap();
        drop(store);

        let store = FileStore::open(dir.path()).await.unwrap();
        for (key, value, version) in &acked {
            assert_eq!(
                store.get(key).await.unwrap(),
                Some((value.clone(), *version))
            );
        }
        assert_eq!(store.children("/c").await.unwrap().len(), 64);
        let next = store
            .put("/c/next", Bytes::new(), ExpectedVersion::Absent)
            .await
            .unwrap();
        assert!(next > newest, "revisions never repeat after a reopen");
    }

    #[test]
    fn record_round_trip_and_corruption() {
        let record = Record {
            value: Bytes::from_static(b"hello"),
            version: Version(42),
            ephemeral: true,
        };
        let encoded = encode_record(&record);
        assert_eq!(decode_record("/k", &encoded).unwrap(), record);
        for cut in 0..RECORD_HEADER_BYTES {
            assert!(matches!(
                decode_record("/k", &encoded[..cut]),
                Err(MetaError::Corruption { .. })
            ));
        }
        let mut bad_flags = encoded.clone();
        bad_flags[0] = 0x80;
        assert!(matches!(
            decode_record("/k", &bad_flags),
            Err(MetaError::Corruption { .. })
        ));
        let mut zero_version = encoded;
        zero_version[1..9].copy_from_slice(&0u64.to_le_bytes());
        assert!(matches!(
            decode_record("/k", &zero_version),
            Err(MetaError::Corruption { .. })
        ));
    }
}
