//! The few parts of an X.509 certificate Vela reads itself: the subject's
//! common name (the TLS authentication provider's role, as Pulsar's
//! `AuthenticationProviderTls` takes it: the first `CN=` of the subject in
//! RFC 2253 order, i.e. the last CN attribute in the certificate's order),
//! and, for the version 1 client certificates webpki refuses
//! (`client_auth`), what checking their signature and validity needs.
//!
//! Owns: a bounded DER walk over `Certificate → tbsCertificate`.
//! Certificate bytes are peer input: every length is checked, nothing
//! panics, and anything unexpected is `None`.
//! Never: verifies anything itself (`client_auth` does, with the provider's
//! signature algorithms), or allocates beyond the CN string.

/// DER tags used here.
const TAG_SEQUENCE: u8 = 0x30;
const TAG_SET: u8 = 0x31;
const TAG_OID: u8 = 0x06;
const TAG_BIT_STRING: u8 = 0x03;
const TAG_UTC_TIME: u8 = 0x17;
const TAG_GENERALIZED_TIME: u8 = 0x18;
/// `[0] EXPLICIT Version` of tbsCertificate.
const TAG_VERSION: u8 = 0xa0;
/// id-at-commonName, 2.5.4.3, as DER content bytes.
const OID_COMMON_NAME: &[u8] = &[0x55, 0x04, 0x03];
/// Longest CN kept, bytes (X.520's ub-common-name is 64 characters).
const COMMON_NAME_BYTES_MAX: usize = 256;

/// The parts of a certificate that checking it by hand needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Certificate<'a> {
    /// The whole tbsCertificate element (what the signature covers).
    pub(crate) tbs: &'a [u8],
    /// True when the version field is absent (X.509 v1).
    pub(crate) is_v1: bool,
    /// The issuer Name element (tag, length and content).
    pub(crate) issuer: &'a [u8],
    /// The subject Name element.
    pub(crate) subject: &'a [u8],
    /// notBefore and notAfter, seconds since the Unix epoch.
    pub(crate) not_before_secs: i64,
    pub(crate) not_after_secs: i64,
    /// The subjectPublicKeyInfo element.
    pub(crate) spki: &'a [u8],
    /// The content of its AlgorithmIdentifier (webpki's `public_key_alg_id`).
    pub(crate) spki_algorithm: &'a [u8],
    /// The public key (the BIT STRING's bytes after its unused-bits byte).
    pub(crate) public_key: &'a [u8],
    /// The content of the signatureAlgorithm (webpki's `signature_alg_id`).
    pub(crate) signature_algorithm: &'a [u8],
    /// The signature bytes.
    pub(crate) signature: &'a [u8],
}

impl<'a> Certificate<'a> {
    /// Parses a DER certificate's structure (no checks of its meaning).
    pub(crate) fn parse(der: &'a [u8]) -> Option<Certificate<'a>> {
        let (tag, certificate, _) = element(der)?;
        expect(tag, TAG_SEQUENCE)?;
        let (tag, tbs_content, rest) = element(certificate)?;
        expect(tag, TAG_SEQUENCE)?;
        let tbs = &certificate[..certificate.len() - rest.len()];
        let (tag, signature_algorithm, rest) = element(rest)?;
        expect(tag, TAG_SEQUENCE)?;
        let (tag, signature, _) = element(rest)?;
        expect(tag, TAG_BIT_STRING)?;
        let signature = bit_string_bytes(signature)?;

        let mut fields = tbs_content;
        let is_v1 = fields.first() != Some(&TAG_VERSION);
        if !is_v1 {
            fields = element(fields)?.2;
        }
        let fields = element(fields)?.2; // serialNumber
        let fields = element(fields)?.2; // signature (inner algorithm)
        let (issuer, fields) = whole(fields, TAG_SEQUENCE)?;
        let (tag, validity, fields) = element(fields)?;
        expect(tag, TAG_SEQUENCE)?;
        let (subject, fields) = whole(fields, TAG_SEQUENCE)?;
        let (spki, _) = whole(fields, TAG_SEQUENCE)?;

        let (tag, not_before, rest) = element(validity)?;
        let not_before_secs = time(tag, not_before)?;
        let (tag, not_after, _) = element(rest)?;
        let not_after_secs = time(tag, not_after)?;

        let (_, spki_content, _) = element(spki)?;
        let (tag, spki_algorithm, rest) = element(spki_content)?;
        expect(tag, TAG_SEQUENCE)?;
        let (tag, public_key, _) = element(rest)?;
        expect(tag, TAG_BIT_STRING)?;
        Some(Certificate {
            tbs,
            is_v1,
            issuer,
            subject,
            not_before_secs,
            not_after_secs,
            spki,
            spki_algorithm,
            public_key: bit_string_bytes(public_key)?,
            signature_algorithm,
            signature,
        })
    }

    /// The subject CN, if it has a non-empty one.
    pub(crate) fn common_name(&self) -> Option<String> {
        let (_, rdns, _) = element(self.subject)?;
        last_common_name(rdns)
    }
}

/// The subject CN of a DER certificate, if it has a non-empty one.
pub fn common_name(certificate: &[u8]) -> Option<String> {
    Certificate::parse(certificate)?.common_name()
}

fn expect(tag: u8, wanted: u8) -> Option<()> {
    (tag == wanted).then_some(())
}

/// The next element with its tag and length, and what follows it.
fn whole(input: &[u8], wanted: u8) -> Option<(&[u8], &[u8])> {
    let (tag, _, rest) = element(input)?;
    expect(tag, wanted)?;
    Some((&input[..input.len() - rest.len()], rest))
}

/// A BIT STRING's bytes, when it has no unused bits (keys and signatures).
fn bit_string_bytes(content: &[u8]) -> Option<&[u8]> {
    match content.split_first() {
        Some((0, bytes)) => Some(bytes),
        _ => None,
    }
}

/// The last CN attribute of an RDNSequence's content.
fn last_common_name(mut rdns: &[u8]) -> Option<String> {
    let mut found = None;
    while !rdns.is_empty() {
        let (tag, mut set, rest) = element(rdns)?;
        rdns = rest;
        expect(tag, TAG_SET)?;
        while !set.is_empty() {
            let (tag, attribute, rest) = element(set)?;
            set = rest;
            expect(tag, TAG_SEQUENCE)?;
            let (tag, oid, value) = element(attribute)?;
            if tag != TAG_OID || oid != OID_COMMON_NAME {
                continue;
            }
            // Any of the DirectoryString types: the content as UTF-8 (BMP
            // and universal strings, never seen in practice, do not decode
            // and count as no CN).
            let (_, text, _) = element(value)?;
            if text.is_empty() || text.len() > COMMON_NAME_BYTES_MAX {
                continue;
            }
            if let Ok(text) = std::str::from_utf8(text) {
                found = Some(text.to_string());
            }
        }
    }
    found
}

/// UTCTime (`YYMMDDHHMMSSZ`, years 1950-2049) or GeneralizedTime
/// (`YYYYMMDDHHMMSSZ`) as seconds since the Unix epoch.
fn time(tag: u8, content: &[u8]) -> Option<i64> {
    let text = std::str::from_utf8(content).ok()?;
    let digits = text.strip_suffix('Z')?;
    if !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    let number = |range: std::ops::Range<usize>| digits.get(range)?.parse::<i64>().ok();
    let (year, rest) = match (tag, digits.len()) {
        (TAG_UTC_TIME, 12) => {
            let yy = number(0..2)?;
            (if yy >= 50 { 1900 + yy } else { 2000 + yy }, 2)
        }
        (TAG_GENERALIZED_TIME, 14) => (number(0..4)?, 4),
        _ => return None,
    };
    let month = number(rest..rest + 2)?;
    let day = number(rest + 2..rest + 4)?;
    let hour = number(rest + 4..rest + 6)?;
    let minute = number(rest + 6..rest + 8)?;
    let second = number(rest + 8..rest + 10)?;
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || hour > 23 || minute > 59 {
        return None;
    }
    let days = days_from_civil(year, month, day);
    Some(days * 86_400 + hour * 3_600 + minute * 60 + second)
}

/// Days since 1970-01-01 of a proleptic Gregorian date.
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let year = if month <= 2 { year - 1 } else { year };
    let era = year.div_euclid(400);
    let year_of_era = year - era * 400;
    let month_index = (month + 9) % 12; // March = 0
    let day_of_year = (153 * month_index + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// One DER element: (tag, content, what follows). Single-byte tags and
/// definite lengths only (DER has no other kind in these structures).
fn element(input: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = input.split_first()?;
    let (&first, mut rest) = rest.split_first()?;
    let length = if first < 0x80 {
        usize::from(first)
    } else {
        let count = usize::from(first & 0x7f);
        if count == 0 || count > 4 || rest.len() < count {
            return None;
        }
        let (bytes, after) = rest.split_at(count);
        rest = after;
        bytes.iter().fold(0usize, |n, b| (n << 8) | usize::from(*b))
    };
    if rest.len() < length {
        return None;
    }
    let (content, after) = rest.split_at(length);
    Some((tag, content, after))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn der(tag: u8, content: &[u8]) -> Vec<u8> {
        let mut out = vec![tag];
        if content.len() < 0x80 {
            out.push(content.len() as u8);
        } else {
            out.push(0x82);
            out.extend_from_slice(&(content.len() as u16).to_be_bytes());
        }
        out.extend_from_slice(content);
        out
    }

    fn attribute(oid: &[u8], text: &str) -> Vec<u8> {
        let mut content = der(TAG_OID, oid);
        content.extend(der(0x0c, text.as_bytes()));
        der(TAG_SET, &der(TAG_SEQUENCE, &content))
    }

    /// A certificate skeleton: only the parts the walk reads are real.
    fn certificate(subject: &[Vec<u8>], with_version: bool) -> Vec<u8> {
        let mut tbs = Vec::new();
        if with_version {
            tbs.extend(der(TAG_VERSION, &der(0x02, &[2])));
        }
        tbs.extend(der(0x02, &[1])); // serial
        tbs.extend(der(TAG_SEQUENCE, &[])); // signature algorithm
        tbs.extend(der(TAG_SEQUENCE, &attribute(OID_COMMON_NAME, "issuer")));
        let mut validity = der(TAG_UTC_TIME, b"210217165655Z");
        validity.extend(der(TAG_GENERALIZED_TIME, b"20410212165655Z"));
        tbs.extend(der(TAG_SEQUENCE, &validity));
        tbs.extend(der(TAG_SEQUENCE, &subject.concat()));
        let mut spki = der(TAG_SEQUENCE, &der(TAG_OID, &[0x2a, 0x03]));
        spki.extend(der(TAG_BIT_STRING, &[0; 200]));
        tbs.extend(der(TAG_SEQUENCE, &spki));
        let mut cert = der(TAG_SEQUENCE, &tbs);
        cert.extend(der(TAG_SEQUENCE, &der(TAG_OID, &[0x2a, 0x04])));
        cert.extend(der(TAG_BIT_STRING, &[0, 1, 2, 3]));
        der(TAG_SEQUENCE, &cert)
    }

    #[test]
    fn the_subject_cn_is_the_role() {
        let org = attribute(&[0x55, 0x04, 0x0a], "Acme");
        let cn = attribute(OID_COMMON_NAME, "admin");
        for with_version in [true, false] {
            let cert = certificate(&[org.clone(), cn.clone()], with_version);
            assert_eq!(common_name(&cert).as_deref(), Some("admin"));
            let parsed = Certificate::parse(&cert).unwrap();
            assert_eq!(parsed.is_v1, !with_version);
            assert_eq!(parsed.signature, &[1, 2, 3]);
            assert_eq!(parsed.public_key.len(), 199);
        }
        // The last CN in DER order (the first in RFC 2253's).
        let other = attribute(OID_COMMON_NAME, "other");
        let cert = certificate(&[other, cn.clone()], true);
        assert_eq!(common_name(&cert).as_deref(), Some("admin"));
        assert_eq!(common_name(&certificate(&[org], true)), None);
    }

    #[test]
    fn validity_times_in_both_forms() {
        let cert = certificate(&[], false);
        let parsed = Certificate::parse(&cert).unwrap();
        // `date -u -d 2021-02-17T16:56:55 +%s`, `... 2041-02-12T16:56:55`.
        assert_eq!(parsed.not_before_secs, 1_613_581_015);
        assert_eq!(parsed.not_after_secs, 2_244_301_015);
        assert_eq!(time(TAG_UTC_TIME, b"700101000000Z"), Some(0));
        assert_eq!(time(TAG_UTC_TIME, b"7001010000Z"), None);
        assert_eq!(time(TAG_GENERALIZED_TIME, b"19700101000000"), None);
    }

    #[test]
    fn truncated_input_is_nothing() {
        let cert = certificate(&[attribute(OID_COMMON_NAME, "admin")], true);
        for cut in 0..cert.len() {
            assert_eq!(Certificate::parse(&cert[..cut]), None, "cut at {cut}");
        }
    }
}
