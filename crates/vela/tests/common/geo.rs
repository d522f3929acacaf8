//! Two `vela standalone` clusters, `a` and `b`, that know each other as
//! clusters and replicate the namespace `geo/ns` both ways: what the
//! geo-replication tests share.

use std::path::Path;

use super::Standalone;

/// Panics unless `answer` is a 2xx.
pub(crate) fn ok(answer: (u16, String), what: &str) {
    assert!(
        (200..300).contains(&answer.0),
        "{what}: HTTP {} {}",
        answer.0,
        answer.1
    );
}

/// `vela admin --admin-url {broker} args...`: its output; panics when it
/// fails.
pub(crate) fn vela_admin(broker: &Standalone, args: &[&str]) -> String {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_vela"))
        .arg("admin")
        .arg("--admin-url")
        .arg(format!("http://{}", broker.http_addr))
        .args(args)
        .output()
        .expect("vela admin runs");
    assert!(
        output.status.success(),
        "vela admin {args:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

/// Records `other` as cluster `name` on `broker` (`vela admin clusters
/// create`).
pub(crate) fn add_cluster(broker: &Standalone, name: &str, other: &Standalone) {
    record_cluster(broker, "create", name, other);
}

/// Replaces `broker`'s record of cluster `name` with `other`'s URLs (`vela
/// admin clusters update`; after `other` restarted on new ports).
pub(crate) fn update_cluster(broker: &Standalone, name: &str, other: &Standalone) {
    record_cluster(broker, "update", name, other);
}

fn record_cluster(broker: &Standalone, verb: &str, name: &str, other: &Standalone) {
    vela_admin(
        broker,
        &[
            "clusters",
            verb,
            name,
            "--broker-url",
            other.pulsar_url.trim_end_matches('/'),
            "--url",
            &format!("http://{}", other.http_addr),
        ],
    );
}

/// Tenant `geo` allowed on both, namespace `geo/ns` replicated among both,
/// with `vela admin`.
pub(crate) fn replicated_namespace(broker: &Standalone) {
    vela_admin(broker, &["tenants", "create", "geo", "-c", "a,b"]);
    vela_admin(broker, &["namespaces", "create", "geo/ns"]);
    vela_admin(
        broker,
        &["namespaces", "set-clusters", "geo/ns", "-c", "a,b"],
    );
    // Lists print one item a line.
    let clusters = vela_admin(broker, &["namespaces", "get-clusters", "geo/ns"]);
    assert_eq!(clusters.lines().collect::<Vec<_>>(), ["a", "b"]);
}

/// Two standalones, `a` (on `a_dir` when given) and `b`, each started with
/// `args` too, replicating `geo/ns` both ways.
pub(crate) fn two_clusters(a_dir: Option<&Path>, args: &[&str]) -> (Standalone, Standalone) {
    let with = |name: &'static str| {
        let mut all = vec!["--cluster-name", name];
        all.extend_from_slice(args);
        all
    };
    let a = match a_dir {
        Some(dir) => Standalone::start_in(dir, &with("a")),
        None => Standalone::start(&with("a")),
    };
    let b = Standalone::start(&with("b"));
    add_cluster(&a, "b", &b);
    add_cluster(&b, "a", &a);
    replicated_namespace(&a);
    replicated_namespace(&b);
    (a, b)
}
