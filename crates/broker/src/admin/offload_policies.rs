//! Pulsar's `offloadPolicies` object (`OffloadPoliciesImpl`): its check
//! (Pulsar's: a supported driver, a bucket for the drivers that need one,
//! typed fields), its defaults (what Pulsar answers for fields a POST left
//! out), and the numbers Vela applies from it.
//!
//! Applied: `managedLedgerOffloadThresholdInBytes`,
//! `managedLedgerOffloadThresholdInSeconds` and
//! `managedLedgerOffloadDeletionLagInMillis`, field by field topic >
//! namespace > the namespace's older `offloadThreshold`,
//! `offloadThresholdInSeconds`, `offloadDeletionLagMs` > the broker's flags
//! (Pulsar's `mergeConfiguration` and its compatibility with the older
//! fields). The driver, bucket, region and endpoint are stored and served
//! back; a broker offloads to its own store (`--offload-driver`), one per
//! broker, whatever a namespace names.
//! Never: touches the store or routes requests.

use serde_json::{Map, Value};

use super::json::int_of;

/// A refused object: Pulsar's status (412 when `precondition`, else 400)
/// and message (`policy_specs` turns it into its `Rejected`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Refused {
    /// 412 (a rule broken) rather than 400 (malformed).
    pub precondition: bool,
    /// Pulsar's reason.
    pub reason: String,
}

impl Refused {
    fn precondition(reason: impl Into<String>) -> Refused {
        Refused {
            precondition: true,
            reason: reason.into(),
        }
    }

    fn malformed(reason: impl Into<String>) -> Refused {
        Refused {
            precondition: false,
            reason: reason.into(),
        }
    }
}

/// Pulsar's `OffloadPoliciesImpl.DRIVER_NAMES` (compared without case).
pub const DRIVER_NAMES: [&str; 6] = [
    "S3",
    "aws-s3",
    "google-cloud-storage",
    "filesystem",
    "azureblob",
    "aliyun-oss",
];

/// Fields holding strings.
const STRING_FIELDS: &[&str] = &[
    "offloadersDirectory",
    "managedLedgerOffloadDriver",
    "managedLedgerOffloadedReadPriority",
    "s3ManagedLedgerOffloadRegion",
    "s3ManagedLedgerOffloadBucket",
    "s3ManagedLedgerOffloadServiceEndpoint",
    "s3ManagedLedgerOffloadCredentialId",
    "s3ManagedLedgerOffloadCredentialSecret",
    "s3ManagedLedgerOffloadRole",
    "s3ManagedLedgerOffloadRoleSessionName",
    "gcsManagedLedgerOffloadRegion",
    "gcsManagedLedgerOffloadBucket",
    "gcsManagedLedgerOffloadServiceAccountKeyFile",
    "fileSystemProfilePath",
    "fileSystemURI",
    "managedLedgerOffloadBucket",
    "managedLedgerOffloadRegion",
    "managedLedgerOffloadServiceEndpoint",
];

/// Fields holding integers.
const INTEGER_FIELDS: &[&str] = &[
    "managedLedgerOffloadMaxThreads",
    "managedLedgerOffloadPrefetchRounds",
    "managedLedgerOffloadThresholdInBytes",
    "managedLedgerOffloadThresholdInSeconds",
    "managedLedgerOffloadDeletionLagInMillis",
    "s3ManagedLedgerOffloadMaxBlockSizeInBytes",
    "s3ManagedLedgerOffloadReadBufferSizeInBytes",
    "gcsManagedLedgerOffloadMaxBlockSizeInBytes",
    "gcsManagedLedgerOffloadReadBufferSizeInBytes",
    "managedLedgerOffloadMaxBlockSizeInBytes",
    "managedLedgerOffloadReadBufferSizeInBytes",
];

/// Pulsar's `OffloadedReadPriority` values.
const READ_PRIORITIES: [&str; 2] = ["TIERED_STORAGE_FIRST", "BOOKKEEPER_FIRST"];

/// Pulsar's field initializers: what a GET shows for fields never set.
fn defaults() -> [(&'static str, Value); 9] {
    const BLOCK_BYTES: i64 = 64 * 1024 * 1024;
    const READ_BUFFER_BYTES: i64 = 1024 * 1024;
    [
        ("offloadersDirectory", Value::from("./offloaders")),
        ("managedLedgerOffloadMaxThreads", Value::from(2)),
        ("managedLedgerOffloadPrefetchRounds", Value::from(1)),
        (
            "managedLedgerOffloadedReadPriority",
            Value::from("TIERED_STORAGE_FIRST"),
        ),
        (
            "s3ManagedLedgerOffloadMaxBlockSizeInBytes",
            Value::from(BLOCK_BYTES),
        ),
        (
            "s3ManagedLedgerOffloadReadBufferSizeInBytes",
            Value::from(READ_BUFFER_BYTES),
        ),
        (
            "s3ManagedLedgerOffloadRoleSessionName",
            Value::from("pulsar-s3-offload"),
        ),
        (
            "gcsManagedLedgerOffloadMaxBlockSizeInBytes",
            Value::from(BLOCK_BYTES),
        ),
        (
            "gcsManagedLedgerOffloadReadBufferSizeInBytes",
            Value::from(READ_BUFFER_BYTES),
        ),
    ]
}

fn is_driver(driver: Option<&str>, names: &[&str]) -> bool {
    driver.is_some_and(|d| names.iter().any(|n| n.eq_ignore_ascii_case(d)))
}

fn non_empty(object: &Map<String, Value>, field: &str) -> bool {
    object
        .get(field)
        .and_then(Value::as_str)
        .is_some_and(|s| !s.is_empty())
}

/// Checks a POSTed object as Pulsar does; the object to store: the known
/// fields given, Pulsar's defaults for the others, and the flags Pulsar's
/// JSON carries (`s3Driver`, `gcsDriver`, `fileSystemDriver`).
pub fn check(value: Value) -> Result<Value, Refused> {
    let Value::Object(given) = value else {
        return Err(Refused::malformed("OffloadPolicies must be an object"));
    };
    let mut object = Map::new();
    for (field, value) in given {
        if value.is_null() {
            continue;
        }
        if STRING_FIELDS.contains(&field.as_str()) {
            if !value.is_string() {
                return Err(Refused::malformed(format!("{field} must be a string")));
            }
        } else if INTEGER_FIELDS.contains(&field.as_str()) {
            let Some(n) = int_of(&value) else {
                return Err(Refused::malformed(format!("{field} must be a number")));
            };
            object.insert(field, Value::from(n));
            continue;
        } else if field == "managedLedgerExtraConfigurations" {
            let strings = value
                .as_object()
                .is_some_and(|m| m.values().all(Value::is_string));
            if !strings {
                return Err(Refused::malformed(
                    "managedLedgerExtraConfigurations must map names to strings",
                ));
            }
        } else {
            // Pulsar's reader ignores unknown fields (and the derived
            // flags a GET shows, when posted back).
            continue;
        }
        object.insert(field, value);
    }
    if let Some(priority) = object
        .get("managedLedgerOffloadedReadPriority")
        .and_then(Value::as_str)
        && !READ_PRIORITIES.contains(&priority)
    {
        return Err(Refused::malformed(format!(
            "managedLedgerOffloadedReadPriority must be one of {}",
            READ_PRIORITIES.join(", ")
        )));
    }
    let driver = object
        .get("managedLedgerOffloadDriver")
        .and_then(Value::as_str);
    if !is_driver(driver, &DRIVER_NAMES) {
        return Err(Refused::precondition(format!(
            "The driver is not supported, support value: {}",
            DRIVER_NAMES.join(",")
        )));
    }
    let s3 = is_driver(driver, &DRIVER_NAMES[..2]);
    let gcs = is_driver(driver, &DRIVER_NAMES[2..3]);
    let filesystem = is_driver(driver, &DRIVER_NAMES[3..4]);
    let bucket_valid = non_empty(&object, "managedLedgerOffloadBucket")
        || filesystem
        || (s3 && non_empty(&object, "s3ManagedLedgerOffloadBucket"))
        || (gcs && non_empty(&object, "gcsManagedLedgerOffloadBucket"));
    if !bucket_valid {
        return Err(Refused::precondition(
            "The bucket must be specified for namespace offload.",
        ));
    }
    for (field, value) in defaults() {
        object.entry(field).or_insert(value);
    }
    object.insert("s3Driver".into(), Value::from(s3));
    object.insert("gcsDriver".into(), Value::from(gcs));
    object.insert("fileSystemDriver".into(), Value::from(filesystem));
    Ok(Value::Object(object))
}

/// The numbers Vela applies from `offloadPolicies` objects, each the first
/// level that sets it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct OffloadFields {
    /// `managedLedgerOffloadThresholdInBytes` (negative: no automatic
    /// offload by size).
    pub threshold_bytes: Option<i64>,
    /// `managedLedgerOffloadThresholdInSeconds` (negative: none by age).
    pub threshold_seconds: Option<i64>,
    /// `managedLedgerOffloadDeletionLagInMillis` (negative: keep the
    /// bookie copy).
    pub deletion_lag_ms: Option<i64>,
}

impl OffloadFields {
    /// Field by field, the first of `levels` (most specific first) that
    /// sets it.
    pub fn merge<'a>(levels: impl IntoIterator<Item = Option<&'a Value>> + Clone) -> OffloadFields {
        let field = |name: &str| {
            levels
                .clone()
                .into_iter()
                .flatten()
                .find_map(|object| object.get(name).filter(|v| !v.is_null()).and_then(int_of))
        };
        OffloadFields {
            threshold_bytes: field("managedLedgerOffloadThresholdInBytes"),
            threshold_seconds: field("managedLedgerOffloadThresholdInSeconds"),
            deletion_lag_ms: field("managedLedgerOffloadDeletionLagInMillis"),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn pulsars_refusals() {
        let refused = check(json!({"managedLedgerOffloadBucket": "b"})).unwrap_err();
        assert!(refused.precondition);
        assert_eq!(
            refused.reason,
            "The driver is not supported, support value: \
             S3,aws-s3,google-cloud-storage,filesystem,azureblob,aliyun-oss"
        );
        assert!(check(json!({"managedLedgerOffloadDriver": "hdfs"})).is_err());
        let refused = check(json!({"managedLedgerOffloadDriver": "aws-s3"})).unwrap_err();
        assert_eq!(
            refused.reason,
            "The bucket must be specified for namespace offload."
        );
        assert!(refused.precondition);
        // The S3 bucket counts for S3 drivers only.
        assert!(
            check(json!({"managedLedgerOffloadDriver": "azureblob",
                         "s3ManagedLedgerOffloadBucket": "b"}))
            .is_err()
        );
        let malformed = check(json!({"managedLedgerOffloadDriver": "filesystem",
                                     "managedLedgerOffloadThresholdInBytes": "x"}))
        .unwrap_err();
        assert!(!malformed.precondition, "{malformed:?}");
        assert!(check(json!([1])).is_err());
        assert!(
            check(json!({"managedLedgerOffloadDriver": "filesystem",
                         "managedLedgerOffloadedReadPriority": "SOMETIMES"}))
            .is_err()
        );
    }

    #[test]
    fn accepted_objects_get_pulsars_defaults_and_flags() {
        let stored = check(json!({
            "managedLedgerOffloadDriver": "S3",
            "s3ManagedLedgerOffloadBucket": "b",
            "managedLedgerOffloadThresholdInBytes": "1024",
            "managedLedgerOffloadDeletionLagInMillis": 0,
            "s3Driver": false,
            "unknown": 1,
        }))
        .unwrap();
        assert_eq!(stored["managedLedgerOffloadThresholdInBytes"], 1024);
        assert_eq!(stored["managedLedgerOffloadDeletionLagInMillis"], 0);
        assert_eq!(stored["managedLedgerOffloadMaxThreads"], 2);
        assert_eq!(stored["offloadersDirectory"], "./offloaders");
        assert_eq!(
            stored["managedLedgerOffloadedReadPriority"],
            "TIERED_STORAGE_FIRST"
        );
        assert_eq!(stored["s3Driver"], true);
        assert_eq!(stored["gcsDriver"], false);
        assert!(stored.get("unknown").is_none());
        // What a GET shows is accepted back unchanged.
        assert_eq!(check(stored.clone()).unwrap(), stored);
        let generic = check(json!({"managedLedgerOffloadDriver": "aliyun-oss",
                                   "managedLedgerOffloadBucket": "b"}));
        assert!(generic.is_ok());
    }

    #[test]
    fn fields_merge_most_specific_first() {
        let topic = json!({"managedLedgerOffloadThresholdInBytes": 5});
        let namespace = json!({"managedLedgerOffloadThresholdInBytes": 7,
                               "managedLedgerOffloadDeletionLagInMillis": 0});
        let merged = OffloadFields::merge([Some(&topic), Some(&namespace)]);
        assert_eq!(
            merged,
            OffloadFields {
                threshold_bytes: Some(5),
                threshold_seconds: None,
                deletion_lag_ms: Some(0),
            }
        );
        assert_eq!(OffloadFields::merge([None, None]), OffloadFields::default());
    }
}
