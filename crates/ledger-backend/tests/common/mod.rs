//! Shared harness of the storage-stack tests: bookies registered in an
//! in-memory metadata store, and payloads that name their ledger and entry.
#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use vela_ledger::{BookieId, EntryId, LedgerClient, LedgerError, LedgerId, LedgerReader, Quorum};
use vela_meta::{ExpectedVersion, MetadataStore, registry};

pub mod real;

pub async fn register_at(
    store: &Arc<dyn MetadataStore>,
    bookie: &BookieId,
    address: &str,
    rack: Option<&str>,
) {
    let id = registry::BookieId::new(bookie.0.as_str()).unwrap();
    let info = registry::BookieInfo {
        address: address.to_owned(),
        rack: rack.map(str::to_owned),
    };
    let value = registry::encode_bookie_info(&info).unwrap();
    store
        .put(&registry::bookie_key(&id), value, ExpectedVersion::Any)
        .await
        .unwrap();
}

pub fn quorum(e: usize, w: usize, a: usize) -> Quorum {
    Quorum::new(e, w, a).unwrap()
}

pub fn no_properties() -> BTreeMap<String, String> {
    BTreeMap::new()
}

pub fn payload(ledger: LedgerId, entry: u64) -> Bytes {
    Bytes::from(format!(
        "ledger {} entry {entry} {}",
        ledger.0,
        "x".repeat((entry % 7) as usize)
    ))
}

/// Reads every entry 0..=last and returns the payloads.
pub async fn read_all(reader: &LedgerReader) -> Vec<Bytes> {
    let mut out = Vec::new();
    if let Some(last) = reader.last_readable() {
        for e in 0..=last.0 {
            out.push(reader.read(EntryId(e)).await.unwrap());
        }
    }
    out
}

/// Creates a ledger at `quorum`, adds `payload(id, 0..entries)` and closes
/// it; returns its id.
pub async fn write_closed_ledger(client: &LedgerClient, quorum: Quorum, entries: u64) -> LedgerId {
    let writer = client.create(quorum, no_properties()).await.unwrap();
    let id = writer.ledger_id();
    for e in 0..entries {
        writer.add(payload(id, e)).await.unwrap();
    }
    writer.close().await.unwrap();
    id
}

/// Reads entries 0..=last of `ledger` twice in order (a sequential reader:
/// `bad` arrives through a read-ahead of its neighbours): every entry but
/// `bad` reads back as written, `bad` fails as `expected` says.
pub async fn read_twice_with_one_bad(
    reader: &LedgerReader,
    ledger: LedgerId,
    last: u64,
    bad: u64,
    expected: impl Fn(&LedgerError) -> bool,
) {
    for round in 0..2 {
        for e in 0..=last {
            let read = reader.read(EntryId(e)).await;
            if e == bad {
                assert!(
                    read.as_ref().is_err_and(&expected),
                    "round {round}, entry {e}: {read:?}"
                );
            } else {
                assert_eq!(read.unwrap(), payload(ledger, e));
            }
        }
    }
}

/// Flips a byte inside `needle` in the first entry log of `ledger_dir` that
/// holds it; returns whether one did.
pub fn rot_entry_log(ledger_dir: &std::path::Path, needle: &[u8]) -> bool {
    for entry in std::fs::read_dir(ledger_dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().is_none_or(|e| e != "log") {
            continue;
        }
        let mut bytes = std::fs::read(&path).unwrap();
        if let Some(at) = bytes.windows(needle.len()).position(|w| w == needle) {
            bytes[at + needle.len() / 2] ^= 0x20;
            std::fs::write(&path, &bytes).unwrap();
            return true;
        }
    }
    false
}
