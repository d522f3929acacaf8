//! The admin API's JSON bodies: every body type the HTTP routes accept is
//! parsed from arbitrary bytes and, when it parses, turned into the policy it
//! asks for and written back out. Nothing may panic; a body either parses to
//! something valid or is a typed error (400/412 at the edge).
#![no_main]

use libfuzzer_sys::fuzz_target;
use vela_broker::admin::json::{
    BacklogQuotaJson, MessageIdJson, PersistenceJson, PoliciesBody, RetentionJson,
    TenantInfoJson, parse_body, policies_json, ttl_seconds,
};
use vela_broker::admin::{NamespacePolicies, RetentionPolicy};

fuzz_target!(|body: &[u8]| {
    if let Ok(policies) = parse_body::<PoliciesBody>(body, "Policies")
        && let Ok(parsed) = policies.to_policies()
    {
        let _ = policies_json(&parsed, "standalone");
    }
    if let Ok(Some(persistence)) = parse_body::<Option<PersistenceJson>>(body, "PersistencePolicies")
        && let Ok(policy) = persistence.to_policy()
    {
        let _ = PersistenceJson::from_policy(policy);
    }
    if let Ok(Some(retention)) = parse_body::<Option<RetentionJson>>(body, "RetentionPolicies") {
        let policy = RetentionPolicy::from(retention);
        let policies = NamespacePolicies {
            retention: Some(policy),
            ..NamespacePolicies::default()
        };
        let _ = policies_json(&policies, "standalone");
    }
    if let Ok(Some(quota)) = parse_body::<Option<BacklogQuotaJson>>(body, "BacklogQuota") {
        let stored = quota.to_quota();
        let _ = BacklogQuotaJson::from_quota(&stored);
    }
    if let Ok(Some(info)) = parse_body::<Option<TenantInfoJson>>(body, "TenantInfo") {
        let _ = info.to_info();
    }
    if let Ok(Some(id)) = parse_body::<Option<MessageIdJson>>(body, "MessageId") {
        let _ = (id.is_earliest(), id.is_latest());
    }
    if let Ok(Some(ttl)) = parse_body::<Option<i64>>(body, "message TTL") {
        let _ = ttl_seconds(ttl);
    }
    let _ = parse_body::<Option<bool>>(body, "deduplication flag");
    if let Ok(text) = std::str::from_utf8(body) {
        let _ = serde_json::from_str::<serde_json::Value>(text);
    }
});
