//! Basic authentication (Pulsar's `AuthenticationProviderBasic`): user names
//! and password hashes from an htpasswd file, credentials as `user:password`
//! in CONNECT's auth data (method `basic`) or in an HTTP
//! `Authorization: Basic base64(user:password)` header.
//!
//! Owns: [`BasicUsers`] (the file, parsed once at start) and checking a
//! password against a hash. Hashes accepted: APR1 (`$apr1$salt$hash`,
//! `htpasswd -m`: MD5-crypt with Apache's magic, the scheme Pulsar's
//! provider checks first) and bcrypt (`$2a$`, `$2b$`, `$2y$`, `htpasswd -B`).
//! Pulsar's provider also takes traditional DES crypt(3) (`htpasswd -d`,
//! which keeps 8 characters of a password); this one refuses such a file at
//! start, naming the user, rather than refusing that user's logins later.
//! Guarantees: hashes are compared in constant time; a failed check says
//! "Unknown user or invalid password" whatever failed (Pulsar's message).
//! Never: logs a password or a hash, or keeps a password.

use std::collections::HashMap;

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use md5::{Digest, Md5};

/// Largest htpasswd file read, bytes (about 10,000 users with bcrypt
/// hashes). Bounds what a wrong path makes us read.
pub const BASIC_FILE_BYTES_MAX: usize = 1024 * 1024;

/// Longest credentials accepted, bytes. bcrypt reads 72 bytes of a
/// password; user names are short. Bounds the hashing work of a request.
const CREDENTIALS_BYTES_MAX: usize = 1024;

/// MD5-crypt's rounds (fixed by the algorithm).
const MD5_CRYPT_ROUNDS: usize = 1000;

/// MD5-crypt keeps at most 8 characters of salt.
const MD5_CRYPT_SALT_BYTES_MAX: usize = 8;

/// The refusal every failed check gets (Pulsar's wording).
pub(crate) const BAD_CREDENTIALS: &str = "Unknown user or invalid password";

/// Why an htpasswd file is refused at start.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BasicFileError {
    /// A line is not `user:hash`.
    #[error("line {line}: not `user:hash` (the format of the password auth conf file is invalid)")]
    Format {
        /// 1-based line number.
        line: usize,
    },
    /// A hash of a scheme this broker does not check.
    #[error(
        "line {line}: user {user:?}: password hash scheme not supported (use $apr1$ from \
         `htpasswd -m` or bcrypt from `htpasswd -B`)"
    )]
    Scheme {
        /// 1-based line number.
        line: usize,
        /// The user.
        user: String,
    },
    /// Larger than [`BASIC_FILE_BYTES_MAX`], or not UTF-8.
    #[error("{0}")]
    Unreadable(String),
}

/// The users of an htpasswd file.
#[derive(Clone)]
pub struct BasicUsers {
    users: HashMap<String, Hash>,
}

impl std::fmt::Debug for BasicUsers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // Never the hashes.
        f.debug_struct("BasicUsers")
            .field("users", &self.users.len())
            .finish()
    }
}

#[derive(Clone)]
enum Hash {
    /// `$apr1$salt$digest`: the whole string, and its salt.
    Apr1 { full: String, salt: String },
    /// `$2?$cost$...`.
    Bcrypt(String),
}

impl BasicUsers {
    /// Parses an htpasswd file's content: one `user:hash` per line (blank
    /// lines skipped).
    pub fn parse(content: &[u8]) -> Result<BasicUsers, BasicFileError> {
        if content.len() > BASIC_FILE_BYTES_MAX {
            return Err(BasicFileError::Unreadable(format!(
                "larger than {BASIC_FILE_BYTES_MAX} bytes"
            )));
        }
        let text = std::str::from_utf8(content)
            .map_err(|_| BasicFileError::Unreadable("not UTF-8".into()))?;
        let mut users = HashMap::new();
        for (index, raw) in text.lines().enumerate() {
            let line = index + 1;
            let entry = raw.trim_end_matches('\r');
            if entry.trim().is_empty() {
                continue;
            }
            let mut parts = entry.split(':');
            let (Some(user), Some(hash), None) = (parts.next(), parts.next(), parts.next()) else {
                return Err(BasicFileError::Format { line });
            };
            let hash = if let Some(rest) = hash.strip_prefix("$apr1$") {
                let salt = rest.split('$').next().unwrap_or_default();
                if rest.split('$').count() != 2 || salt.len() > MD5_CRYPT_SALT_BYTES_MAX {
                    return Err(BasicFileError::Format { line });
                }
                Hash::Apr1 {
                    full: hash.to_string(),
                    salt: salt.to_string(),
                }
            } else if ["$2a$", "$2b$", "$2y$"].iter().any(|p| hash.starts_with(p)) {
                Hash::Bcrypt(hash.to_string())
            } else {
                return Err(BasicFileError::Scheme {
                    line,
                    user: user.to_string(),
                });
            };
            users.insert(user.to_string(), hash);
        }
        Ok(BasicUsers { users })
    }

    /// The number of users.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// True when the file named no user.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Checks `user:password` (CONNECT's auth data); the role is the user.
    pub(crate) fn authenticate(&self, credentials: &[u8]) -> Result<String, &'static str> {
        if credentials.len() > CREDENTIALS_BYTES_MAX {
            return Err(BAD_CREDENTIALS);
        }
        let text =
            std::str::from_utf8(credentials).map_err(|_| "Base64 decoded params are invalid")?;
        let (user, password) = text
            .split_once(':')
            .ok_or("Base64 decoded params are invalid")?;
        let hash = self.users.get(user).ok_or(BAD_CREDENTIALS)?;
        let matches = match hash {
            Hash::Apr1 { full, salt } => {
                constant_time_eq(apr1(password.as_bytes(), salt).as_bytes(), full.as_bytes())
            }
            Hash::Bcrypt(hash) => bcrypt::verify(password, hash).unwrap_or(false),
        };
        if matches {
            Ok(user.to_string())
        } else {
            Err(BAD_CREDENTIALS)
        }
    }

    /// Checks an HTTP `Authorization` header value `Basic base64(user:pw)`.
    pub(crate) fn authenticate_header(&self, header: &str) -> Result<String, &'static str> {
        let (scheme, encoded) = header
            .split_once(' ')
            .ok_or("Authentication token has to be started with \"Basic \"")?;
        if !scheme.eq_ignore_ascii_case("basic") {
            return Err("Authentication token has to be started with \"Basic \"");
        }
        let decoded = STANDARD
            .decode(encoded.trim())
            .map_err(|_| "Base64 decoding is failure")?;
        self.authenticate(&decoded)
    }
}

/// Apache's MD5-crypt (`$apr1$`): MD5-crypt with the magic `$apr1$`.
fn apr1(password: &[u8], salt: &str) -> String {
    const MAGIC: &[u8] = b"$apr1$";
    let salt = &salt.as_bytes()[..salt.len().min(MD5_CRYPT_SALT_BYTES_MAX)];
    let alternate = Md5::new()
        .chain_update(password)
        .chain_update(salt)
        .chain_update(password)
        .finalize();
    let mut context = Md5::new()
        .chain_update(password)
        .chain_update(MAGIC)
        .chain_update(salt);
    for chunk_start in (0..password.len()).step_by(16) {
        let take = (password.len() - chunk_start).min(16);
        context.update(&alternate[..take]);
    }
    let mut bits = password.len();
    while bits > 0 {
        if bits & 1 == 1 {
            context.update([0u8]);
        } else {
            context.update(&password[..password.len().min(1)]);
        }
        bits >>= 1;
    }
    let mut digest = context.finalize();
    for round in 0..MD5_CRYPT_ROUNDS {
        let mut step = Md5::new();
        if round % 2 == 1 {
            step.update(password);
        } else {
            step.update(digest);
        }
        if round % 3 != 0 {
            step.update(salt);
        }
        if round % 7 != 0 {
            step.update(password);
        }
        if round % 2 == 1 {
            step.update(digest);
        } else {
            step.update(password);
        }
        digest = step.finalize();
    }
    let d = digest;
    let mut out = String::with_capacity(MAGIC.len() + salt.len() + 23);
    out.push_str("$apr1$");
    out.push_str(&String::from_utf8_lossy(salt));
    out.push('$');
    for (a, b, c) in [(0, 6, 12), (1, 7, 13), (2, 8, 14), (3, 9, 15), (4, 10, 5)] {
        let value = u32::from(d[a]) << 16 | u32::from(d[b]) << 8 | u32::from(d[c]);
        crypt64(&mut out, value, 4);
    }
    crypt64(&mut out, u32::from(d[11]), 2);
    out
}

/// crypt(3)'s base-64: `count` characters of `value`, low bits first.
fn crypt64(out: &mut String, mut value: u32, count: usize) {
    const ALPHABET: &[u8; 64] = b"./0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz";
    for _ in 0..count {
        out.push(char::from(ALPHABET[(value & 0x3f) as usize]));
        value >>= 6;
    }
}

fn constant_time_eq(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn apr1_matches_openssl() {
        // `openssl passwd -apr1 -salt abcdefgh secret`, `-salt xy pässword`.
        assert_eq!(
            apr1(b"secret", "abcdefgh"),
            "$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/"
        );
        assert_eq!(
            apr1("pässword".as_bytes(), "xy"),
            "$apr1$xy$AofaYvXdKuw7EgsdcGZZn0"
        );
    }

    #[test]
    fn users_of_both_schemes_authenticate() {
        let bcrypt_hash = bcrypt::hash("hunter2", 4).unwrap();
        let file = format!("alice:$apr1$abcdefgh$h9FWgUz3n9YxylKLlR5SQ/\n\nbob:{bcrypt_hash}\n");
        let users = BasicUsers::parse(file.as_bytes()).unwrap();
        assert_eq!(users.len(), 2);
        assert_eq!(users.authenticate(b"alice:secret").unwrap(), "alice");
        assert_eq!(users.authenticate(b"bob:hunter2").unwrap(), "bob");
        for bad in [
            &b"alice:wrong"[..],
            b"bob:secret",
            b"carol:secret",
            b"nocolon",
        ] {
            assert!(users.authenticate(bad).is_err(), "{bad:?}");
        }
        let header = format!("Basic {}", STANDARD.encode("alice:secret"));
        assert_eq!(users.authenticate_header(&header).unwrap(), "alice");
        assert!(users.authenticate_header("Bearer x").is_err());
        assert!(users.authenticate_header("Basic !!!").is_err());
        // No hash in the debug output.
        assert!(!format!("{users:?}").contains("apr1"));
    }

    #[test]
    fn bad_files_are_refused_naming_the_line() {
        assert_eq!(
            BasicUsers::parse(b"alice\n").unwrap_err(),
            BasicFileError::Format { line: 1 }
        );
        assert_eq!(
            BasicUsers::parse(b"a:$apr1$s$h\nb:x:y\n").unwrap_err(),
            BasicFileError::Format { line: 2 }
        );
        // DES crypt(3), which Pulsar also takes: refused at start.
        assert_eq!(
            BasicUsers::parse(b"carol:abJnggxhB/yWI\n").unwrap_err(),
            BasicFileError::Scheme {
                line: 1,
                user: "carol".into()
            }
        );
    }
}
