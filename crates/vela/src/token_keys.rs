//! Key files of token authentication, as `vela admin tokens` makes them.
//!
//! Owns: generating an RS256 key pair in the files Pulsar's `tokens
//! create-key-pair` writes (raw DER, no PEM: the private key as PKCS#8, the
//! public key as X.509 SubjectPublicKeyInfo), which `tokens create
//! --private-key` and the brokers' `--auth-token-public-key` read; writing
//! key files. RSA keys come from the `rsa` crate: ring, which signs and
//! verifies tokens, cannot generate them.
//! Never: overwrites a file (a key in use must not be replaced by mistake),
//! or leaves a secret or private key readable by others (mode 0600).

use std::path::Path;
use std::time::SystemTime;

use anyhow::Context;
use rsa::pkcs8::{EncodePrivateKey, EncodePublicKey, SecretDocument};
use vela_broker::auth::jwt::{SigningKey, VerifyKey};

/// Modulus of a new RS256 key, bits: what Pulsar's `create-key-pair` makes
/// (jjwt's RS256 size); brokers verify 2048 to 8192.
const RSA_KEY_BITS: usize = 2048;

/// Mode of a secret or private key file: its owner reads and writes it.
pub(crate) const SECRET_FILE_MODE: u32 = 0o600;

/// Mode of a public key file: everyone may read it.
pub(crate) const PUBLIC_FILE_MODE: u32 = 0o644;

/// A new RS256 key pair, DER-encoded.
pub(crate) struct KeyPairDer {
    /// PKCS#8 PrivateKeyInfo (zeroed when dropped).
    private_pkcs8: SecretDocument,
    /// X.509 SubjectPublicKeyInfo.
    public_spki: Vec<u8>,
}

impl KeyPairDer {
    /// Generates a key from the OS random source and checks that a token
    /// signed with it verifies with its public half, as brokers will read
    /// them.
    pub(crate) fn generate() -> anyhow::Result<KeyPairDer> {
        let key = rsa::PrivateKey::new(&mut getrandom::SysRng, RSA_KEY_BITS)
            .map_err(|e| anyhow::anyhow!("cannot generate an RSA key: {e}"))?;
        let private_pkcs8 = key
            .to_pkcs8_der()
            .map_err(|e| anyhow::anyhow!("cannot encode the private key: {e}"))?;
        let public_spki = key
            .to_public_key()
            .to_public_key_der()
            .map_err(|e| anyhow::anyhow!("cannot encode the public key: {e}"))?
            .into_vec();
        let pair = KeyPairDer {
            private_pkcs8,
            public_spki,
        };
        pair.check()
            .context("the new key pair does not sign and verify")?;
        Ok(pair)
    }

    fn check(&self) -> anyhow::Result<()> {
        let signing = SigningKey::rsa_private(self.private_pkcs8.as_bytes())?;
        let verify = VerifyKey::rsa_public(&self.public_spki)?;
        let token = signing.sign("key-pair-check", None)?;
        verify.verify(&token, SystemTime::now())?;
        Ok(())
    }

    /// PKCS#8 DER of the private key.
    pub(crate) fn private_der(&self) -> &[u8] {
        self.private_pkcs8.as_bytes()
    }

    /// SubjectPublicKeyInfo DER of the public key.
    pub(crate) fn public_der(&self) -> &[u8] {
        &self.public_spki
    }
}

/// Writes `bytes` to a new file with `mode` (fails if `path` exists), synced.
pub(crate) fn write_new_file(path: &Path, bytes: &[u8], mode: u32) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)?;
    file.write_all(bytes)?;
    file.sync_all()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn a_new_pair_verifies_its_own_tokens_only() {
        let pair = KeyPairDer::generate().unwrap();
        let other = KeyPairDer::generate().unwrap();
        let token = SigningKey::rsa_private(pair.private_der())
            .unwrap()
            .sign("app", None)
            .unwrap();
        let verified = VerifyKey::rsa_public(pair.public_der())
            .unwrap()
            .verify(&token, SystemTime::now())
            .unwrap();
        assert_eq!(verified.subject, "app");
        let wrong = VerifyKey::rsa_public(other.public_der()).unwrap();
        assert!(wrong.verify(&token, SystemTime::now()).is_err());
    }

    #[test]
    fn key_files_are_never_overwritten() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("private.key");
        write_new_file(&path, b"first", SECRET_FILE_MODE).unwrap();
        assert!(write_new_file(&path, b"second", SECRET_FILE_MODE).is_err());
        assert_eq!(std::fs::read(&path).unwrap(), b"first");
        use std::os::unix::fs::PermissionsExt;
        let mode = std::fs::metadata(&path).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, SECRET_FILE_MODE);
    }
}
