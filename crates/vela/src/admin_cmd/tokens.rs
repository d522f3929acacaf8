//! `vela admin tokens`: HS256 secrets, RS256 key pairs in Pulsar's files,
//! minting and checking tokens, all local (no HTTP).

use std::path::PathBuf;
use std::time::{Duration, SystemTime};

use anyhow::{Context, bail};
use clap::Subcommand;

use super::api::{out, seconds};

#[derive(Debug, Subcommand)]
pub(super) enum TokensCmd {
    /// Make a new HS256 secret key (32 random bytes).
    CreateSecretKey {
        /// Write it to this file (raw bytes, mode 0600) instead of printing
        /// it base64-encoded.
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
    },
    /// Make a new RS256 key pair, in the files Pulsar's `tokens
    /// create-key-pair` writes (DER: PKCS#8 private key, SubjectPublicKeyInfo
    /// public key). The private key signs tokens (`create --private-key`);
    /// brokers verify them with the public one (`--auth-token-public-key`).
    CreateKeyPair {
        /// The private key's file (new; mode 0600).
        #[arg(long, value_name = "FILE")]
        output_private_key: PathBuf,
        /// The public key's file (new).
        #[arg(long, value_name = "FILE")]
        output_public_key: PathBuf,
        /// Signature algorithm (Pulsar's flag; RS256 only).
        #[arg(short = 'a', long, default_value = "RS256", value_parser = ["RS256"])]
        signature_algorithm: String,
    },
    /// Mint a token for a role.
    Create {
        /// HS256 secret key file.
        #[arg(
            long,
            conflicts_with = "private_key",
            required_unless_present = "private_key"
        )]
        secret_key: Option<PathBuf>,
        /// RS256 private key file (PEM or DER, PKCS#8 or PKCS#1).
        #[arg(long)]
        private_key: Option<PathBuf>,
        /// The role (the token's `sub`).
        #[arg(short = 's', long)]
        subject: String,
        /// Lifetime (e.g. 30s, 10m, 1h, 2d, 1y); none: never expires.
        #[arg(short = 'e', long, alias = "expiry-time")]
        expiry: Option<String>,
    },
    /// Check a token with a key and print its role and expiry.
    Validate {
        /// The token.
        token: String,
        /// HS256 secret key file.
        #[arg(
            long,
            conflicts_with = "public_key",
            required_unless_present = "public_key"
        )]
        secret_key: Option<PathBuf>,
        /// RS256 public key file (PEM or DER).
        #[arg(long)]
        public_key: Option<PathBuf>,
    },
}

pub(super) fn tokens(cmd: TokensCmd) -> anyhow::Result<()> {
    use base64::Engine;
    use vela_broker::auth::jwt::{self, SigningKey, VerifyKey};

    use crate::security_args::read_key;
    use crate::token_keys::{KeyPairDer, PUBLIC_FILE_MODE, SECRET_FILE_MODE, write_new_file};
    match cmd {
        TokensCmd::CreateSecretKey { output } => {
            let secret = jwt::new_secret()?;
            match output {
                Some(path) => write_new_file(&path, &secret, SECRET_FILE_MODE)
                    .with_context(|| format!("cannot write --output {}", path.display())),
                None => out(&base64::engine::general_purpose::STANDARD.encode(secret)),
            }
        }
        TokensCmd::CreateKeyPair {
            output_private_key,
            output_public_key,
            signature_algorithm: _,
        } => {
            for (flag, path) in [
                ("--output-private-key", &output_private_key),
                ("--output-public-key", &output_public_key),
            ] {
                if path.exists() {
                    bail!(
                        "{flag} {}: the file exists (never overwritten)",
                        path.display()
                    );
                }
            }
            let pair = KeyPairDer::generate()?;
            // The public file first: if the private one cannot be written,
            // no private key is left without its public half.
            write_new_file(&output_public_key, pair.public_der(), PUBLIC_FILE_MODE).with_context(
                || {
                    format!(
                        "cannot write --output-public-key {}",
                        output_public_key.display()
                    )
                },
            )?;
            write_new_file(&output_private_key, pair.private_der(), SECRET_FILE_MODE).with_context(
                || {
                    format!(
                        "cannot write --output-private-key {}",
                        output_private_key.display()
                    )
                },
            )
        }
        TokensCmd::Create {
            secret_key,
            private_key,
            subject,
            expiry,
        } => {
            let key = match (secret_key, private_key) {
                (Some(file), _) => SigningKey::secret(&read_key(&file, "--secret-key")?)
                    .with_context(|| format!("--secret-key {}", file.display()))?,
                (None, Some(file)) => {
                    SigningKey::rsa_private(&read_key(&file, "--private-key")?)
                        .with_context(|| format!("--private-key {}", file.display()))?
                }
                (None, None) => bail!("--secret-key or --private-key is required"),
            };
            let expires_at = match expiry {
                Some(text) => {
                    let secs = seconds(&text).context("--expiry")?;
                    let secs = u64::try_from(secs)
                        .ok()
                        .filter(|s| *s > 0)
                        .with_context(|| format!("--expiry {text}: must be positive"))?;
                    Some(SystemTime::now() + Duration::from_secs(secs))
                }
                None => None,
            };
            out(&key.sign(&subject, expires_at)?)
        }
        TokensCmd::Validate {
            token,
            secret_key,
            public_key,
        } => {
            let key = match (secret_key, public_key) {
                (Some(file), _) => VerifyKey::secret(&read_key(&file, "--secret-key")?)?,
                (None, Some(file)) => VerifyKey::rsa_public(&read_key(&file, "--public-key")?)?,
                (None, None) => bail!("--secret-key or --public-key is required"),
            };
            let verified = key.verify(&token, SystemTime::now())?;
            let expiry = match verified.expires_at {
                Some(at) => format!(
                    "expires in {} s",
                    at.duration_since(SystemTime::now())
                        .unwrap_or_default()
                        .as_secs()
                ),
                None => "never expires".to_string(),
            };
            out(&format!("role {} ({expiry})", verified.subject))
        }
    }
}
