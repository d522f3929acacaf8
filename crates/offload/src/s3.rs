//! The S3 driver: a bucket of AWS S3 or of any S3-compatible store (an
//! endpoint), through `object_store`'s S3 client with ring as its crypto and
//! reqwest over rustls (ring) as its HTTP client: no aws-lc-rs, no C build.
//!
//! Credentials come from the usual places, first found wins: the
//! environment (`AWS_ACCESS_KEY_ID`, `AWS_SECRET_ACCESS_KEY`, optional
//! `AWS_SESSION_TOKEN`), then the shared credentials file
//! (`AWS_SHARED_CREDENTIALS_FILE`, else `~/.aws/credentials`; profile
//! `AWS_PROFILE`, else `default`). None found is an error at startup: the
//! driver never asks an instance-metadata service for credentials.
//!
//! Requests are retried by the client a few times within
//! `REQUEST_RETRY_TIMEOUT`, so an unreachable store turns into an error the
//! log shows and retries with its own, longer back-off.

use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::{BackoffConfig, ClientOptions, RetryConfig};

use crate::BuildError;

/// Region signed for when only an endpoint is given (S3-compatible stores
/// accept any; AWS's own default region).
pub const DEFAULT_REGION: &str = "us-east-1";
/// How long the client retries one request before the error goes up.
pub const REQUEST_RETRY_TIMEOUT: Duration = Duration::from_secs(5);
/// Retries of one request within `REQUEST_RETRY_TIMEOUT`.
pub const REQUEST_RETRIES_MAX: usize = 3;
/// Connecting to the store.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);
/// One request, its body included (an 8 MiB part or a ranged read).
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
/// Bytes of the shared credentials file read at most.
const CREDENTIALS_FILE_BYTES_MAX: u64 = 1 << 20;

/// An access key; its secret and token never appear in `Debug`.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Credentials {
    /// `AWS_ACCESS_KEY_ID` / `aws_access_key_id`.
    pub access_key_id: String,
    /// `AWS_SECRET_ACCESS_KEY` / `aws_secret_access_key`.
    pub secret_access_key: String,
    /// `AWS_SESSION_TOKEN` / `aws_session_token`, for temporary keys.
    pub session_token: Option<String>,
    /// Where they were found (for the startup log).
    pub source: String,
}

impl fmt::Debug for S3Credentials {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("S3Credentials")
            .field("access_key_id", &self.access_key_id)
            .field("secret_access_key", &"<redacted>")
            .field(
                "session_token",
                &self.session_token.as_ref().map(|_| "<redacted>"),
            )
            .field("source", &self.source)
            .finish()
    }
}

/// Why no credentials could be had.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum CredentialsError {
    /// Neither the environment nor a credentials file has a key.
    #[error(
        "no S3 credentials: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, or put \
         aws_access_key_id and aws_secret_access_key under [{profile}] in {file}"
    )]
    Missing {
        /// The profile looked for.
        profile: String,
        /// The credentials file looked at.
        file: String,
    },
    /// Half a key.
    #[error("{0} is set but {1} is not")]
    Incomplete(&'static str, &'static str),
    /// The file exists but cannot be read or is too large.
    #[error("cannot read the credentials file {file}: {message}")]
    File {
        /// The file.
        file: String,
        /// What went wrong.
        message: String,
    },
    /// The profile is in the file but lacks a key.
    #[error("profile [{profile}] of {file} lacks {field}")]
    ProfileIncomplete {
        /// The profile.
        profile: String,
        /// The file.
        file: String,
        /// The missing key.
        field: &'static str,
    },
}

impl S3Credentials {
    /// From the process environment, else the shared credentials file.
    pub fn from_environment() -> Result<S3Credentials, CredentialsError> {
        let var = |name: &str| std::env::var(name).ok().filter(|v| !v.is_empty());
        let home = var("HOME").map(PathBuf::from);
        S3Credentials::resolve(&var, home.as_deref())
    }

    /// The lookup with the environment given (`var`) and the home directory.
    pub fn resolve(
        var: &dyn Fn(&str) -> Option<String>,
        home: Option<&Path>,
    ) -> Result<S3Credentials, CredentialsError> {
        match (var("AWS_ACCESS_KEY_ID"), var("AWS_SECRET_ACCESS_KEY")) {
            (Some(access_key_id), Some(secret_access_key)) => {
                return Ok(S3Credentials {
                    access_key_id,
                    secret_access_key,
                    session_token: var("AWS_SESSION_TOKEN"),
                    source: "environment".to_string(),
                });
            }
            (Some(_), None) => {
                return Err(CredentialsError::Incomplete(
                    "AWS_ACCESS_KEY_ID",
                    "AWS_SECRET_ACCESS_KEY",
                ));
            }
            (None, Some(_)) => {
                return Err(CredentialsError::Incomplete(
                    "AWS_SECRET_ACCESS_KEY",
                    "AWS_ACCESS_KEY_ID",
                ));
            }
            (None, None) => {}
        }
        let profile = var("AWS_PROFILE").unwrap_or_else(|| "default".to_string());
        let file = match var("AWS_SHARED_CREDENTIALS_FILE") {
            Some(file) => PathBuf::from(file),
            None => home
                .map(|home| home.join(".aws").join("credentials"))
                .unwrap_or_else(|| PathBuf::from("~/.aws/credentials")),
        };
        let shown = file.display().to_string();
        let text = match read_bounded(&file) {
            Ok(Some(text)) => text,
            Ok(None) => {
                return Err(CredentialsError::Missing {
                    profile,
                    file: shown,
                });
            }
            Err(message) => {
                return Err(CredentialsError::File {
                    file: shown,
                    message,
                });
            }
        };
        let Some(section) = profile_section(&text, &profile) else {
            return Err(CredentialsError::Missing {
                profile,
                file: shown,
            });
        };
        let field = |key: &'static str| {
            section
                .iter()
                .find(|(k, _)| k.eq_ignore_ascii_case(key))
                .map(|(_, v)| v.clone())
                .filter(|v| !v.is_empty())
        };
        let incomplete = |field| CredentialsError::ProfileIncomplete {
            profile: profile.clone(),
            file: shown.clone(),
            field,
        };
        let access_key_id =
            field("aws_access_key_id").ok_or_else(|| incomplete("aws_access_key_id"))?;
        let secret_access_key =
            field("aws_secret_access_key").ok_or_else(|| incomplete("aws_secret_access_key"))?;
        Ok(S3Credentials {
            access_key_id,
            secret_access_key,
            session_token: field("aws_session_token"),
            source: format!("{shown} [{profile}]"),
        })
    }
}

/// The file's text; `None` when it does not exist.
fn read_bounded(file: &Path) -> Result<Option<String>, String> {
    use std::io::Read;
    let handle = match std::fs::File::open(file) {
        Ok(handle) => handle,
        Err(error) if error.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(error) => return Err(error.to_string()),
    };
    let mut text = String::new();
    handle
        .take(CREDENTIALS_FILE_BYTES_MAX + 1)
        .read_to_string(&mut text)
        .map_err(|error| error.to_string())?;
    if text.len() as u64 > CREDENTIALS_FILE_BYTES_MAX {
        return Err(format!("over {CREDENTIALS_FILE_BYTES_MAX} bytes"));
    }
    Ok(Some(text))
}

/// The `key = value` pairs of `[profile]` in an INI text (comments `#` and
/// `;` at a line's start), `None` when the profile is absent.
fn profile_section(text: &str, profile: &str) -> Option<Vec<(String, String)>> {
    let mut pairs: Option<Vec<(String, String)>> = None;
    for line in text.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') || line.starts_with(';') {
            continue;
        }
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            if pairs.is_some() {
                break;
            }
            if name.trim() == profile {
                pairs = Some(Vec::new());
            }
            continue;
        }
        if let (Some(pairs), Some((key, value))) = (pairs.as_mut(), line.split_once('=')) {
            pairs.push((key.trim().to_string(), value.trim().to_string()));
        }
    }
    pairs
}

/// Where the S3 driver writes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct S3Settings {
    /// The bucket (must exist; Pulsar's `s3ManagedLedgerOffloadBucket`).
    pub bucket: String,
    /// The region (Pulsar's `s3ManagedLedgerOffloadRegion`); `None` with
    /// an endpoint signs for `DEFAULT_REGION`.
    pub region: Option<String>,
    /// An S3-compatible store's URL, `http://` or `https://` (Pulsar's
    /// `s3ManagedLedgerOffloadServiceEndpoint`); `None` for AWS.
    pub endpoint: Option<String>,
    /// The access key.
    pub credentials: S3Credentials,
}

impl S3Settings {
    /// Checks what the store cannot: each error names its setting.
    pub fn validate(&self) -> Result<(), String> {
        if self.bucket.trim().is_empty() {
            return Err("the bucket (s3ManagedLedgerOffloadBucket) is empty".to_string());
        }
        if self.region.is_none() && self.endpoint.is_none() {
            return Err(
                "either the region (s3ManagedLedgerOffloadRegion) or the service endpoint \
                 (s3ManagedLedgerOffloadServiceEndpoint) must be set"
                    .to_string(),
            );
        }
        if let Some(endpoint) = &self.endpoint
            && !(endpoint.starts_with("http://") || endpoint.starts_with("https://"))
        {
            return Err(format!(
                "the service endpoint (s3ManagedLedgerOffloadServiceEndpoint) '{endpoint}' \
                 is not an http:// or https:// URL"
            ));
        }
        Ok(())
    }
}

/// Makes ring rustls' process-wide provider (reqwest takes it from there);
/// one already installed is kept.
fn install_ring_provider() {
    if rustls::crypto::CryptoProvider::get_default().is_none() {
        // Losing a race to another installer is fine: a provider is set.
        let _ = rustls::crypto::ring::default_provider().install_default();
    }
}

/// The S3 store the settings name (the offloader's; tests list buckets
/// with it). The bucket is not contacted.
pub fn store(settings: &S3Settings) -> Result<Arc<AmazonS3>, BuildError> {
    let error = |message: String| BuildError::Store {
        driver: "s3",
        message,
    };
    settings.validate().map_err(error)?;
    install_ring_provider();
    let credentials = &settings.credentials;
    let mut builder = AmazonS3Builder::new()
        .with_bucket_name(&settings.bucket)
        .with_region(settings.region.as_deref().unwrap_or(DEFAULT_REGION))
        .with_access_key_id(&credentials.access_key_id)
        .with_secret_access_key(&credentials.secret_access_key)
        .with_retry(RetryConfig {
            backoff: BackoffConfig {
                init_backoff: Duration::from_millis(100),
                max_backoff: Duration::from_secs(2),
                base: 2.0,
            },
            max_retries: REQUEST_RETRIES_MAX,
            retry_timeout: REQUEST_RETRY_TIMEOUT,
        })
        .with_client_options(
            ClientOptions::new()
                .with_connect_timeout(CONNECT_TIMEOUT)
                .with_timeout(REQUEST_TIMEOUT)
                .with_allow_http(
                    settings
                        .endpoint
                        .as_deref()
                        .is_some_and(|e| e.starts_with("http://")),
                ),
        );
    if let Some(token) = &credentials.session_token {
        builder = builder.with_token(token);
    }
    if let Some(endpoint) = &settings.endpoint {
        // Path-style requests (`endpoint/bucket/key`): what S3-compatible
        // stores serve without a wildcard DNS name.
        builder = builder
            .with_endpoint(endpoint.trim_end_matches('/'))
            .with_virtual_hosted_style_request(false);
    }
    let store = builder.build().map_err(|e| error(e.to_string()))?;
    Ok(Arc::new(store))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<String> {
        let map: HashMap<String, String> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        move |name| map.get(name).cloned()
    }

    #[test]
    fn the_environment_comes_first() {
        let home = tempfile::tempdir().unwrap();
        let got = S3Credentials::resolve(
            &env(&[
                ("AWS_ACCESS_KEY_ID", "AKID"),
                ("AWS_SECRET_ACCESS_KEY", "SECRET"),
                ("AWS_SESSION_TOKEN", "TOKEN"),
            ]),
            Some(home.path()),
        )
        .unwrap();
        assert_eq!(got.access_key_id, "AKID");
        assert_eq!(got.secret_access_key, "SECRET");
        assert_eq!(got.session_token.as_deref(), Some("TOKEN"));
        assert_eq!(got.source, "environment");
        let shown = format!("{got:?}");
        assert!(
            !shown.contains("SECRET") && !shown.contains("TOKEN"),
            "{shown}"
        );
    }

    #[test]
    fn half_a_key_in_the_environment_is_refused() {
        let got = S3Credentials::resolve(&env(&[("AWS_ACCESS_KEY_ID", "AKID")]), None);
        assert_eq!(
            got,
            Err(CredentialsError::Incomplete(
                "AWS_ACCESS_KEY_ID",
                "AWS_SECRET_ACCESS_KEY"
            ))
        );
    }

    #[test]
    fn the_shared_file_and_its_profiles() {
        let home = tempfile::tempdir().unwrap();
        std::fs::create_dir(home.path().join(".aws")).unwrap();
        std::fs::write(
            home.path().join(".aws/credentials"),
            "# keys\n[default]\naws_access_key_id = DEF\naws_secret_access_key=DEFSECRET\n\n\
             [other]\n; a comment\naws_access_key_id=OTHER\naws_secret_access_key = OS\n\
             aws_session_token = OT\n[half]\naws_access_key_id=H\n",
        )
        .unwrap();
        let got = S3Credentials::resolve(&env(&[]), Some(home.path())).unwrap();
        assert_eq!(
            (got.access_key_id.as_str(), got.secret_access_key.as_str()),
            ("DEF", "DEFSECRET")
        );
        assert_eq!(got.session_token, None);
        let got =
            S3Credentials::resolve(&env(&[("AWS_PROFILE", "other")]), Some(home.path())).unwrap();
        assert_eq!(got.access_key_id, "OTHER");
        assert_eq!(got.session_token.as_deref(), Some("OT"));
        assert!(got.source.ends_with("[other]"), "{}", got.source);
        let half = S3Credentials::resolve(&env(&[("AWS_PROFILE", "half")]), Some(home.path()));
        assert!(
            matches!(
                half,
                Err(CredentialsError::ProfileIncomplete {
                    field: "aws_secret_access_key",
                    ..
                })
            ),
            "{half:?}"
        );
        let absent = S3Credentials::resolve(&env(&[("AWS_PROFILE", "nope")]), Some(home.path()));
        assert!(
            matches!(absent, Err(CredentialsError::Missing { .. })),
            "{absent:?}"
        );
        // An explicit file wins over the home directory's.
        let file = home.path().join("elsewhere");
        std::fs::write(
            &file,
            "[default]\naws_access_key_id=E\naws_secret_access_key=ES\n",
        )
        .unwrap();
        let got = S3Credentials::resolve(
            &env(&[("AWS_SHARED_CREDENTIALS_FILE", file.to_str().unwrap())]),
            Some(home.path()),
        )
        .unwrap();
        assert_eq!(got.access_key_id, "E");
    }

    #[test]
    fn nothing_anywhere_says_where_it_looked() {
        let home = tempfile::tempdir().unwrap();
        let error = S3Credentials::resolve(&env(&[]), Some(home.path())).unwrap_err();
        let text = error.to_string();
        assert!(text.contains("AWS_ACCESS_KEY_ID"), "{text}");
        assert!(text.contains(".aws/credentials"), "{text}");
    }

    fn settings() -> S3Settings {
        S3Settings {
            bucket: "b".to_string(),
            region: None,
            endpoint: Some("http://127.0.0.1:1".to_string()),
            credentials: S3Credentials {
                access_key_id: "a".to_string(),
                secret_access_key: "s".to_string(),
                session_token: None,
                source: "test".to_string(),
            },
        }
    }

    #[test]
    fn bad_settings_name_their_field() {
        assert_eq!(settings().validate(), Ok(()));
        let mut s = settings();
        s.bucket = " ".to_string();
        assert!(
            s.validate()
                .unwrap_err()
                .contains("s3ManagedLedgerOffloadBucket")
        );
        let mut s = settings();
        s.endpoint = None;
        assert!(
            s.validate()
                .unwrap_err()
                .contains("s3ManagedLedgerOffloadRegion")
        );
        s.region = Some("eu-west-1".to_string());
        assert_eq!(s.validate(), Ok(()));
        let mut s = settings();
        s.endpoint = Some("127.0.0.1:8333".to_string());
        assert!(
            s.validate()
                .unwrap_err()
                .contains("s3ManagedLedgerOffloadServiceEndpoint")
        );
    }

    #[test]
    fn a_store_is_built_without_touching_the_network() {
        assert!(store(&settings()).is_ok());
        let mut s = settings();
        s.bucket.clear();
        assert!(store(&s).is_err());
    }
}
