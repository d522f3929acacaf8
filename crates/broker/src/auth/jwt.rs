//! JSON Web Tokens as Pulsar's token authentication uses them: compact JWS
//! (`header.claims.signature`, base64url without padding), signed with
//! HS256 (a shared secret) or RS256 (an RSA key pair), the role in `sub`,
//! expiry in `exp` (seconds since the epoch).
//!
//! Owns: parsing and checking tokens ([`VerifyKey::verify`]), minting them
//! ([`SigningKey::sign`], for `vela admin tokens create`), and reading keys in
//! the forms Pulsar writes them (raw secret bytes; DER or PEM RSA keys).
//! Guarantees: the header's `alg` must be the key's algorithm (no `none`, no
//! HS256 token checked against an RSA public key); `exp` and `nbf` are
//! honoured with no clock skew allowance (Pulsar's default); a token larger
//! than [`TOKEN_BYTES_MAX`] is refused before any decoding.
//! Never: trusts a claim before the signature checks out.
//!
//! Whose code does what: signatures are ring's (the provider rustls uses
//! here), key files are read by `rustls-pki-types` (PEM, private keys) and
//! RustCrypto's `spki`/`pkcs1` (public keys), base64url is the `base64`
//! crate's; only the compact-JWS split and the claim checks are ours. No JWT
//! crate fits: `jsonwebtoken` 10 signs with aws-lc (a C/C++ build) or a
//! second RustCrypto stack (`rsa` 0.9, p256, p384, ed25519), its 9.x line
//! brings `simple_asn1`/`num-bigint`/`time` and reads only PKCS#1 DER
//! (Pulsar writes SubjectPublicKeyInfo), `jwt-simple` builds BoringSSL.

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine;
use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use pkcs1::RsaPublicKeyRef;
use ring::signature::{self, KeyPair};
use ring::{hmac, rand};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{PrivateKeyDer, SubjectPublicKeyInfoDer};
use serde_json::{Value, json};
use spki::SubjectPublicKeyInfoRef;

/// Largest token accepted, bytes. Pulsar's tokens are a few hundred bytes
/// (an RS256 signature is 342 characters at 2048 bits); 16 KiB leaves room
/// for large claim sets while bounding the work one CONNECT can cause.
pub const TOKEN_BYTES_MAX: usize = 16 * 1024;

/// Largest key file accepted, bytes (an RSA-8192 PEM private key is ~6.4 KiB).
pub const KEY_FILE_BYTES_MAX: usize = 64 * 1024;

/// Latest expiry kept, seconds since the epoch (year ~2514): a larger `exp`
/// is taken as this, never as a panic.
const EXPIRY_SECS_MAX: f64 = 17_179_869_180.0;

/// Smallest HS256 secret accepted, bytes: RFC 7518 §3.2 asks for a key at
/// least as long as the hash (256 bits); Pulsar's `create-secret-key` makes 32.
pub const SECRET_BYTES_MIN: usize = 32;

/// Why a token or key was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum JwtError {
    /// Not `a.b.c` with base64url parts and JSON header and claims.
    #[error("malformed token: {0}")]
    Malformed(&'static str),
    /// Larger than [`TOKEN_BYTES_MAX`].
    #[error("token larger than {TOKEN_BYTES_MAX} bytes")]
    TooLarge,
    /// The header names another algorithm than the broker's key.
    #[error("token algorithm {found:?} does not match the broker's key ({expected})")]
    Algorithm {
        /// `alg` of the token.
        found: String,
        /// The key's algorithm.
        expected: &'static str,
    },
    /// The signature does not verify.
    #[error("bad token signature")]
    Signature,
    /// `exp` is in the past.
    #[error("token expired")]
    Expired,
    /// `nbf` is in the future.
    #[error("token not valid yet")]
    NotYetValid,
    /// No `sub` claim (or not a non-empty string).
    #[error("token has no subject (sub claim)")]
    NoSubject,
    /// A key file does not hold a usable key.
    #[error("bad key: {0}")]
    BadKey(String),
}

/// A token's verified content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// The role (`sub`).
    pub subject: String,
    /// When the token stops being valid (`exp`), if it expires.
    pub expires_at: Option<SystemTime>,
}

/// The key tokens are checked with.
#[derive(Clone)]
pub enum VerifyKey {
    /// HS256: the shared secret.
    Secret(hmac::Key),
    /// RS256: an RSA public key (PKCS#1 RSAPublicKey DER, as ring wants it).
    RsaPublic(Vec<u8>),
}

impl std::fmt::Debug for VerifyKey {
    // Never print key material.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            VerifyKey::Secret(_) => "VerifyKey::Secret(HS256)",
            VerifyKey::RsaPublic(_) => "VerifyKey::RsaPublic(RS256)",
        })
    }
}

impl VerifyKey {
    /// An HS256 key from the secret's bytes (a Pulsar secret-key file holds
    /// the raw bytes).
    pub fn secret(secret: &[u8]) -> Result<VerifyKey, JwtError> {
        check_secret(secret)?;
        Ok(VerifyKey::Secret(hmac::Key::new(hmac::HMAC_SHA256, secret)))
    }

    /// An RS256 key from a public-key file's bytes: PEM (`PUBLIC KEY` or
    /// `RSA PUBLIC KEY`) or DER (SubjectPublicKeyInfo, as Pulsar's
    /// `create-key-pair` writes it, or PKCS#1).
    pub fn rsa_public(file: &[u8]) -> Result<VerifyKey, JwtError> {
        let der = if is_pem(file) {
            public_key_pem(file)?
        } else {
            file.to_vec()
        };
        // SubjectPublicKeyInfo wraps the PKCS#1 key; a bare PKCS#1 key is
        // taken as it is.
        let pkcs1 = match SubjectPublicKeyInfoRef::try_from(der.as_slice()) {
            Ok(spki) if spki.algorithm.oid == pkcs1::ALGORITHM_OID => spki
                .subject_public_key
                .as_bytes()
                .ok_or_else(|| JwtError::BadKey("RSA public key bits not whole bytes".into()))?
                .to_vec(),
            Ok(_) => return Err(JwtError::BadKey("not an RSA public key".into())),
            Err(_) => der,
        };
        // ring checks the key only when verifying: check its shape and size
        // here so a bad file fails at startup.
        let key = RsaPublicKeyRef::try_from(pkcs1.as_slice()).map_err(|_| {
            JwtError::BadKey(
                "not an RSA public key (PEM or DER SubjectPublicKeyInfo / PKCS#1)".into(),
            )
        })?;
        // 2048..8192 bits, as ring's RSA_PKCS1_2048_8192_SHA256 requires
        // (`as_bytes` has no leading zeros).
        let modulus_bits = key.modulus.as_bytes().len() * 8;
        if !(2048..=8192).contains(&modulus_bits) {
            return Err(JwtError::BadKey(format!(
                "RSA key of {modulus_bits} bits: 2048 to 8192 needed"
            )));
        }
        Ok(VerifyKey::RsaPublic(pkcs1))
    }

    /// The JWS algorithm this key checks.
    pub fn algorithm(&self) -> &'static str {
        match self {
            VerifyKey::Secret(_) => "HS256",
            VerifyKey::RsaPublic(_) => "RS256",
        }
    }

    /// Checks `token` at time `now`: size, shape, algorithm, signature, then
    /// `exp`, `nbf` and `sub`.
    pub fn verify(&self, token: &str, now: SystemTime) -> Result<Verified, JwtError> {
        if token.len() > TOKEN_BYTES_MAX {
            return Err(JwtError::TooLarge);
        }
        let token = token.trim();
        let mut parts = token.split('.');
        let (Some(header_b64), Some(claims_b64), Some(signature_b64), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(JwtError::Malformed("expected three dot-separated parts"));
        };
        let header = decode_json(header_b64, "header")?;
        let alg = header.get("alg").and_then(Value::as_str).unwrap_or("");
        if alg != self.algorithm() {
            return Err(JwtError::Algorithm {
                found: alg.to_string(),
                expected: self.algorithm(),
            });
        }
        let signature = URL_SAFE_NO_PAD
            .decode(signature_b64)
            .map_err(|_| JwtError::Malformed("signature is not base64url"))?;
        // The signed input is the two first parts exactly as sent.
        let signed_len = header_b64.len() + 1 + claims_b64.len();
        let signed = &token.as_bytes()[..signed_len];
        match self {
            VerifyKey::Secret(key) => {
                hmac::verify(key, signed, &signature).map_err(|_| JwtError::Signature)?
            }
            VerifyKey::RsaPublic(der) => {
                signature::UnparsedPublicKey::new(&signature::RSA_PKCS1_2048_8192_SHA256, der)
                    .verify(signed, &signature)
                    .map_err(|_| JwtError::Signature)?
            }
        }
        let claims = decode_json(claims_b64, "claims")?;
        let now_s = now
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let expires_at = match claims.get("exp") {
            None | Some(Value::Null) => None,
            Some(exp) => {
                let exp = exp
                    .as_f64()
                    .ok_or(JwtError::Malformed("exp is not a number"))?;
                if exp <= now_s {
                    return Err(JwtError::Expired);
                }
                // Clamped: `from_secs_f64` panics on infinity; a NaN `exp`
                // also lands here (comparisons with NaN are false).
                Some(UNIX_EPOCH + Duration::from_secs_f64(exp.min(EXPIRY_SECS_MAX)))
            }
        };
        if let Some(nbf) = claims.get("nbf").filter(|v| !v.is_null()) {
            let nbf = nbf
                .as_f64()
                .ok_or(JwtError::Malformed("nbf is not a number"))?;
            if nbf > now_s {
                return Err(JwtError::NotYetValid);
            }
        }
        let subject = claims
            .get("sub")
            .and_then(Value::as_str)
            .filter(|s| !s.is_empty())
            .ok_or(JwtError::NoSubject)?;
        Ok(Verified {
            subject: subject.to_string(),
            expires_at,
        })
    }
}

/// The key tokens are minted with.
pub enum SigningKey {
    /// HS256: the shared secret.
    Secret(hmac::Key),
    /// RS256: an RSA private key.
    RsaPrivate(signature::RsaKeyPair),
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            SigningKey::Secret(_) => "SigningKey::Secret(HS256)",
            SigningKey::RsaPrivate(_) => "SigningKey::RsaPrivate(RS256)",
        })
    }
}

impl SigningKey {
    /// An HS256 key from the secret's bytes.
    pub fn secret(secret: &[u8]) -> Result<SigningKey, JwtError> {
        check_secret(secret)?;
        Ok(SigningKey::Secret(hmac::Key::new(
            hmac::HMAC_SHA256,
            secret,
        )))
    }

    /// An RS256 key from a private-key file's bytes: PEM (`PRIVATE KEY`,
    /// `RSA PRIVATE KEY`) or DER (PKCS#8, as Pulsar writes it, or PKCS#1).
    pub fn rsa_private(file: &[u8]) -> Result<SigningKey, JwtError> {
        let bad = |e: ring::error::KeyRejected| JwtError::BadKey(format!("RSA private key: {e}"));
        let pair = if is_pem(file) {
            match PrivateKeyDer::from_pem_slice(file)
                .map_err(|e| JwtError::BadKey(format!("PEM: {e}")))?
            {
                PrivateKeyDer::Pkcs8(der) => {
                    signature::RsaKeyPair::from_pkcs8(der.secret_pkcs8_der()).map_err(bad)?
                }
                PrivateKeyDer::Pkcs1(der) => {
                    signature::RsaKeyPair::from_der(der.secret_pkcs1_der()).map_err(bad)?
                }
                _ => return Err(JwtError::BadKey("not an RSA private key".into())),
            }
        } else {
            signature::RsaKeyPair::from_pkcs8(file)
                .or_else(|_| signature::RsaKeyPair::from_der(file))
                .map_err(bad)?
        };
        Ok(SigningKey::RsaPrivate(pair))
    }

    /// The JWS algorithm this key signs with.
    pub fn algorithm(&self) -> &'static str {
        match self {
            SigningKey::Secret(_) => "HS256",
            SigningKey::RsaPrivate(_) => "RS256",
        }
    }

    /// The public half of an RSA key as PKCS#1 DER (`None` for a secret).
    pub fn rsa_public_pkcs1(&self) -> Option<Vec<u8>> {
        match self {
            SigningKey::Secret(_) => None,
            SigningKey::RsaPrivate(pair) => Some(pair.public_key().as_ref().to_vec()),
        }
    }

    /// A token for `subject`, expiring at `expires_at` when given. The
    /// header carries only `alg` (and `typ`), as Pulsar's tokens do.
    pub fn sign(&self, subject: &str, expires_at: Option<SystemTime>) -> Result<String, JwtError> {
        let header = json!({"alg": self.algorithm(), "typ": "JWT"});
        let mut claims = json!({"sub": subject});
        if let Some(at) = expires_at {
            let secs = at
                .duration_since(UNIX_EPOCH)
                .map_err(|_| JwtError::Malformed("expiry before 1970"))?
                .as_secs();
            claims["exp"] = json!(secs);
        }
        let mut token = format!(
            "{}.{}",
            URL_SAFE_NO_PAD.encode(header.to_string()),
            URL_SAFE_NO_PAD.encode(claims.to_string())
        );
        let signature = match self {
            SigningKey::Secret(key) => hmac::sign(key, token.as_bytes()).as_ref().to_vec(),
            SigningKey::RsaPrivate(pair) => {
                let mut out = vec![0u8; pair.public().modulus_len()];
                pair.sign(
                    &signature::RSA_PKCS1_SHA256,
                    &rand::SystemRandom::new(),
                    token.as_bytes(),
                    &mut out,
                )
                .map_err(|_| JwtError::BadKey("RSA signing failed".into()))?;
                out
            }
        };
        token.push('.');
        token.push_str(&URL_SAFE_NO_PAD.encode(signature));
        Ok(token)
    }
}

/// A new random HS256 secret ([`SECRET_BYTES_MIN`] bytes), as Pulsar's
/// `tokens create-secret-key` makes.
pub fn new_secret() -> Result<Vec<u8>, JwtError> {
    let mut secret = vec![0u8; SECRET_BYTES_MIN];
    ring::rand::SecureRandom::fill(&rand::SystemRandom::new(), &mut secret)
        .map_err(|_| JwtError::BadKey("no system randomness".into()))?;
    Ok(secret)
}

fn check_secret(secret: &[u8]) -> Result<(), JwtError> {
    if secret.len() < SECRET_BYTES_MIN {
        return Err(JwtError::BadKey(format!(
            "HS256 secret of {} bytes: at least {SECRET_BYTES_MIN} needed",
            secret.len()
        )));
    }
    Ok(())
}

fn is_pem(file: &[u8]) -> bool {
    file.iter()
        .position(|b| !b.is_ascii_whitespace())
        .is_some_and(|start| file[start..].starts_with(b"-----BEGIN "))
}

/// The DER of a PEM public key: `PUBLIC KEY` (SubjectPublicKeyInfo) or
/// `RSA PUBLIC KEY` (PKCS#1).
fn public_key_pem(file: &[u8]) -> Result<Vec<u8>, JwtError> {
    if let Ok(spki) = SubjectPublicKeyInfoDer::from_pem_slice(file) {
        return Ok(spki.as_ref().to_vec());
    }
    let text =
        std::str::from_utf8(file).map_err(|_| JwtError::BadKey("PEM is not UTF-8".into()))?;
    match pkcs1::der::Document::from_pem(text.trim()) {
        Ok(("RSA PUBLIC KEY", der)) => Ok(der.into_vec()),
        _ => Err(JwtError::BadKey(
            "no PUBLIC KEY or RSA PUBLIC KEY PEM section".into(),
        )),
    }
}

fn decode_json(part: &str, what: &'static str) -> Result<Value, JwtError> {
    let bytes = URL_SAFE_NO_PAD.decode(part).map_err(|_| {
        JwtError::Malformed(if what == "header" {
            "header is not base64url"
        } else {
            "claims are not base64url"
        })
    })?;
    let value: Value = serde_json::from_slice(&bytes).map_err(|_| {
        JwtError::Malformed(if what == "header" {
            "header is not JSON"
        } else {
            "claims are not JSON"
        })
    })?;
    if !value.is_object() {
        return Err(JwtError::Malformed("header or claims not a JSON object"));
    }
    Ok(value)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    /// An RSA-2048 key pair (private PKCS#8 PEM, public SPKI PEM) made by
    /// `openssl` for this run, so no key material is kept in git.
    fn test_rsa_pems() -> (String, String) {
        let openssl = |args: &[&str], input: Option<&str>| {
            use std::io::Write;
            let mut child = std::process::Command::new("openssl")
                .args(args)
                .stdin(std::process::Stdio::piped())
                .stdout(std::process::Stdio::piped())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("openssl runs");
            if let Some(input) = input {
                child
                    .stdin
                    .take()
                    .unwrap()
                    .write_all(input.as_bytes())
                    .unwrap();
            }
            let out = child.wait_with_output().unwrap();
            assert!(out.status.success(), "openssl {args:?} failed");
            String::from_utf8(out.stdout).unwrap()
        };
        let private = openssl(
            &[
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
            ],
            None,
        );
        let public = openssl(&["pkey", "-pubout"], Some(&private));
        (private, public)
    }

    fn now() -> SystemTime {
        SystemTime::now()
    }

    #[test]
    fn hs256_round_trip_and_claims() {
        let secret = new_secret().unwrap();
        let signer = SigningKey::secret(&secret).unwrap();
        let verifier = VerifyKey::secret(&secret).unwrap();
        let token = signer.sign("alice", None).unwrap();
        let verified = verifier.verify(&token, now()).unwrap();
        assert_eq!(verified.subject, "alice");
        assert_eq!(verified.expires_at, None);

        let later = now() + Duration::from_secs(3600);
        let token = signer.sign("bob", Some(later)).unwrap();
        let verified = verifier.verify(&token, now()).unwrap();
        assert!(verified.expires_at.is_some());
        assert_eq!(
            verifier.verify(&token, later + Duration::from_secs(1)),
            Err(JwtError::Expired)
        );

        let other = VerifyKey::secret(&new_secret().unwrap()).unwrap();
        assert_eq!(other.verify(&token, now()), Err(JwtError::Signature));
    }

    #[test]
    fn tampering_and_garbage_are_refused() {
        let secret = new_secret().unwrap();
        let signer = SigningKey::secret(&secret).unwrap();
        let verifier = VerifyKey::secret(&secret).unwrap();
        let token = signer.sign("alice", None).unwrap();
        // Claims swapped for another subject's, signature kept.
        let forged_claims = URL_SAFE_NO_PAD.encode(r#"{"sub":"admin"}"#);
        let parts: Vec<&str> = token.split('.').collect();
        let forged = format!("{}.{}.{}", parts[0], forged_claims, parts[2]);
        assert_eq!(verifier.verify(&forged, now()), Err(JwtError::Signature));
        // alg none.
        let none_header = URL_SAFE_NO_PAD.encode(r#"{"alg":"none"}"#);
        let unsigned = format!("{none_header}.{}.", parts[1]);
        assert!(matches!(
            verifier.verify(&unsigned, now()),
            Err(JwtError::Algorithm { .. })
        ));
        for garbage in [
            "",
            "a",
            "a.b",
            "a.b.c.d",
            "!!.!!.!!",
            "e30.e30.",
            "W10.W10.AA",
        ] {
            assert!(verifier.verify(garbage, now()).is_err(), "{garbage}");
        }
        let huge = "a".repeat(TOKEN_BYTES_MAX + 1);
        assert_eq!(verifier.verify(&huge, now()), Err(JwtError::TooLarge));
        // No subject.
        let header = URL_SAFE_NO_PAD.encode(r#"{"alg":"HS256"}"#);
        let claims = URL_SAFE_NO_PAD.encode(r#"{"exp":99999999999}"#);
        let input = format!("{header}.{claims}");
        let key = hmac::Key::new(hmac::HMAC_SHA256, &secret);
        let sig = URL_SAFE_NO_PAD.encode(hmac::sign(&key, input.as_bytes()));
        assert_eq!(
            verifier.verify(&format!("{input}.{sig}"), now()),
            Err(JwtError::NoSubject)
        );
        // nbf in the future.
        let claims = URL_SAFE_NO_PAD.encode(r#"{"sub":"x","nbf":99999999999}"#);
        let input = format!("{header}.{claims}");
        let sig = URL_SAFE_NO_PAD.encode(hmac::sign(&key, input.as_bytes()));
        assert_eq!(
            verifier.verify(&format!("{input}.{sig}"), now()),
            Err(JwtError::NotYetValid)
        );
        assert!(VerifyKey::secret(b"short").is_err());
    }

    #[test]
    fn rs256_round_trip_pem_and_der() {
        let (private_pem, public_pem) = test_rsa_pems();
        let signer = SigningKey::rsa_private(private_pem.as_bytes()).unwrap();
        let verifier = VerifyKey::rsa_public(public_pem.as_bytes()).unwrap();
        let token = signer.sign("carol", None).unwrap();
        assert_eq!(verifier.verify(&token, now()).unwrap().subject, "carol");
        // DER SubjectPublicKeyInfo (Pulsar's file format) and bare PKCS#1.
        let spki = SubjectPublicKeyInfoDer::from_pem_slice(public_pem.as_bytes()).unwrap();
        let from_der = VerifyKey::rsa_public(spki.as_ref()).unwrap();
        assert_eq!(from_der.verify(&token, now()).unwrap().subject, "carol");
        let pkcs1 = signer.rsa_public_pkcs1().unwrap();
        let from_pkcs1 = VerifyKey::rsa_public(&pkcs1).unwrap();
        assert_eq!(from_pkcs1.verify(&token, now()).unwrap().subject, "carol");
        // PKCS#1 in PEM (`RSA PUBLIC KEY`).
        let body = base64::engine::general_purpose::STANDARD.encode(&pkcs1);
        let lines: Vec<&str> = body
            .as_bytes()
            .chunks(64)
            .map(|line| std::str::from_utf8(line).unwrap())
            .collect();
        let pkcs1_pem = format!(
            "-----BEGIN RSA PUBLIC KEY-----\n{}\n-----END RSA PUBLIC KEY-----\n",
            lines.join("\n")
        );
        let from_pkcs1_pem = VerifyKey::rsa_public(pkcs1_pem.as_bytes()).unwrap();
        assert_eq!(
            from_pkcs1_pem.verify(&token, now()).unwrap().subject,
            "carol"
        );
        // An HS256 token is not checked against the RSA key (alg confusion).
        let hs = SigningKey::secret(&new_secret().unwrap())
            .unwrap()
            .sign("carol", None)
            .unwrap();
        assert!(matches!(
            verifier.verify(&hs, now()),
            Err(JwtError::Algorithm { .. })
        ));
        assert!(VerifyKey::rsa_public(b"not a key").is_err());
        assert!(SigningKey::rsa_private(b"not a key").is_err());
    }
}
