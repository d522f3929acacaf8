//! The key model: slash-separated absolute paths, and the size limits.
//!
//! Owns: what a valid key, path and value are, and the subtree / direct-child
//! relations every backend must agree on. Pure functions, no I/O.
//!
//! A key is `/seg[/seg...]`: it starts with `/`, has no empty segment, no trailing
//! `/`, no `.` or `..` segment and no control characters. A *path* (the argument of
//! `children` and `watch`) is a key or the root `/`. Keys are flat: a key exists
//! whether or not its parent key does (as in etcd, unlike ZooKeeper), and deleting
//! a key never touches keys below it.

use crate::error::MetaError;

/// Longest key, in bytes. Pulsar's deepest paths
/// (`/managed-ledgers/<tenant>/<ns>/persistent/<topic>/<cursor>`) stay far below it;
/// a bound keeps listings and watch events small on every backend.
pub const KEY_BYTES_MAX: usize = 1024;

/// Largest value, in bytes. etcd rejects requests above 1.5 MiB by default and
/// ZooKeeper nodes above 1 MiB; Vela's metadata (ledger metadata, cursor state,
/// registrations) is kilobytes, so 1 MiB leaves room and fits every backend.
pub const VALUE_BYTES_MAX: usize = 1024 * 1024;

/// Most names one `children` call returns. A listing of this size is ~50 MB of
/// strings; trees that can grow beyond it must be sharded by their owner (as
/// BookKeeper's hierarchical ledger layout does). Beyond it: `TooManyChildren`.
pub const CHILDREN_COUNT_MAX: usize = 1_000_000;

const _: () = assert!(KEY_BYTES_MAX < VALUE_BYTES_MAX);

/// Checks that `key` is a valid key (see the module docs); the root is not a key.
pub fn validate_key(key: &str) -> Result<(), MetaError> {
    validate_path(key)?;
    if key == "/" {
        return Err(bad(key, "the root '/' is not a key"));
    }
    Ok(())
}

/// Checks that `path` is a valid key or the root `/`.
pub fn validate_path(path: &str) -> Result<(), MetaError> {
    if path.len() > KEY_BYTES_MAX {
        return Err(MetaError::KeyTooLong {
            key_bytes: path.len(),
            key_bytes_max: KEY_BYTES_MAX,
        });
    }
    if !path.starts_with('/') {
        return Err(bad(path, "must start with '/'"));
    }
    if path == "/" {
        return Ok(());
    }
    if path.ends_with('/') {
        return Err(bad(path, "must not end with '/'"));
    }
    if path.chars().any(|c| c.is_control()) {
        return Err(bad(path, "must not contain control characters"));
    }
    for segment in path[1..].split('/') {
        if segment.is_empty() {
            return Err(bad(path, "has an empty segment"));
        }
        if segment == "." || segment == ".." {
            return Err(bad(path, "has a '.' or '..' segment"));
        }
    }
    Ok(())
}

/// Checks that a single key segment (a child name, a bookie id) is valid.
pub fn validate_segment(segment: &str) -> Result<(), MetaError> {
    if segment.contains('/') {
        return Err(bad(segment, "a name must not contain '/'"));
    }
    validate_key(&format!("/{segment}"))
}

/// Checks a value's size against [`VALUE_BYTES_MAX`].
pub(crate) fn validate_value(key: &str, value_bytes: usize) -> Result<(), MetaError> {
    if value_bytes > VALUE_BYTES_MAX {
        return Err(MetaError::ValueTooLarge {
            key: key.to_owned(),
            value_bytes,
            value_bytes_max: VALUE_BYTES_MAX,
        });
    }
    Ok(())
}

/// The string every key below `path` starts with: `"/"` for the root, `path + "/"`
/// otherwise.
pub(crate) fn children_prefix(path: &str) -> String {
    debug_assert!(validate_path(path).is_ok());
    if path == "/" {
        "/".to_owned()
    } else {
        format!("{path}/")
    }
}

/// The name of `key` if it is a direct child of the path whose
/// [`children_prefix`] is `prefix`.
pub(crate) fn direct_child<'k>(prefix: &str, key: &'k str) -> Option<&'k str> {
    let rest = key.strip_prefix(prefix)?;
    if rest.is_empty() || rest.contains('/') {
        None
    } else {
        Some(rest)
    }
}

/// True when `key` is `path` itself or below it (what `watch(path)` reports).
pub(crate) fn in_subtree(path: &str, key: &str) -> bool {
    if path == "/" {
        return true;
    }
    match key.strip_prefix(path) {
        Some(rest) => rest.is_empty() || rest.starts_with('/'),
        None => false,
    }
}

/// The smallest byte string greater than every string starting with `prefix`
/// (the end of a prefix range). Valid paths never end in 0xff, so the last byte
/// is simply incremented.
pub(crate) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Only reachable for an all-0xff prefix: "no end" in etcd's convention.
    vec![0]
}

fn bad(key: &str, reason: &'static str) -> MetaError {
    let mut shown = key.to_owned();
    if shown.len() > 128 {
        let mut cut = 128;
        while !shown.is_char_boundary(cut) {
            cut -= 1;
        }
        shown.truncate(cut);
    }
    MetaError::BadKey { key: shown, reason }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_accepted_and_rejected() {
        for good in [
            "/a",
            "/ledgers/0000000042",
            "/a/b:c/d-e_f",
            "/bookies/available/127.0.0.1:3181",
        ] {
            assert_eq!(validate_key(good), Ok(()), "{good}");
        }
        for badk in [
            "", "a", "/", "/a/", "//a", "/a//b", "/a/./b", "/a/..", "/a\0b", "/a\nb",
        ] {
            assert!(
                matches!(validate_key(badk), Err(MetaError::BadKey { .. })),
                "{badk:?}"
            );
        }
        assert_eq!(validate_path("/"), Ok(()));
        let long = format!("/{}", "x".repeat(KEY_BYTES_MAX));
        assert!(matches!(
            validate_key(&long),
            Err(MetaError::KeyTooLong { .. })
        ));
        let at_limit = format!("/{}", "x".repeat(KEY_BYTES_MAX - 1));
        assert_eq!(validate_key(&at_limit), Ok(()));
        assert!(validate_segment("a/b").is_err());
        assert!(validate_segment("").is_err());
        assert_eq!(validate_segment("host:3181"), Ok(()));
    }

    #[test]
    fn children_and_subtrees() {
        let p = children_prefix("/a");
        assert_eq!(direct_child(&p, "/a/x"), Some("x"));
        assert_eq!(direct_child(&p, "/a/x/y"), None);
        assert_eq!(direct_child(&p, "/ab"), None);
        assert_eq!(direct_child(&p, "/a"), None);
        assert_eq!(direct_child(&children_prefix("/"), "/a"), Some("a"));
        assert!(in_subtree("/a", "/a"));
        assert!(in_subtree("/a", "/a/b/c"));
        assert!(!in_subtree("/a", "/ab"));
        assert!(in_subtree("/", "/ab"));
        assert_eq!(prefix_end("/a/"), b"/a0".to_vec());
    }

    #[test]
    fn values_bounded() {
        assert_eq!(validate_value("/k", VALUE_BYTES_MAX), Ok(()));
        assert!(matches!(
            validate_value("/k", VALUE_BYTES_MAX + 1),
            Err(MetaError::ValueTooLarge { .. })
        ));
    }
}
