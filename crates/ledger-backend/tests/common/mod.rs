//! Shared harness of the storage-stack tests: bookies registered in an
//! in-memory metadata store, and payloads that name their ledger and entry.
#![allow(clippy::unwrap_used, dead_code, unreachable_pub)]

use std::collections::BTreeMap;
use std::sync::Arc;

use bytes::Bytes;
use vela_ledger::{BookieId, EntryId, LedgerId, LedgerReader, Quorum};
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
