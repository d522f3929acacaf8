//! A cluster broker's background duties: load reports, automatic split of
//! hot bundles, and unloading everything when the broker's session ends
//! (ownership then registers again; bundles are taken afresh).
//!
//! Owns: the per-bundle traffic figures between two reports. Never: takes
//! bundles (lookups and topic opens do, see `ownership`).

use std::collections::BTreeMap;
use std::sync::{Arc, Weak};
use std::time::Instant;

use tokio::sync::watch;

use crate::ownership::{BundleRange, LOAD_REPORT_INTERVAL, LoadReport, Ownership, topic_hash};
use crate::service::Service;
use crate::topic_name::{NamespaceName, TopicName};

pub(crate) async fn duties(
    service: Weak<Service>,
    ownership: Arc<Ownership>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut lost = ownership.lost();
    let mut ticker = tokio::time::interval(LOAD_REPORT_INTERVAL);
    let mut last: Option<(Instant, BTreeMap<String, u64>)> = None;
    loop {
        tokio::select! {
            changed = lost.changed() => {
                if changed.is_err() {
                    return;
                }
                let now_lost = *lost.borrow_and_update();
                if now_lost {
                    // Other brokers may own our bundles already: serve nothing
                    // of what we had (their recovery fences our ledgers).
                    let Some(service) = service.upgrade() else { return };
                    let errors = service.close_topics().await;
                    tracing::error!(
                        unload_errors = errors.len(),
                        "cluster session lost: every topic unloaded"
                    );
                }
            }
            _ = shutdown.changed() => return,
            _ = ticker.tick() => {
                let Some(service) = service.upgrade() else { return };
                last = Some(report(&service, &ownership, last).await);
            }
        }
    }
}

/// Sends the load report and splits hot bundles. Returns the counters to
/// compare with next time.
async fn report(
    service: &Service,
    ownership: &Ownership,
    last: Option<(Instant, BTreeMap<String, u64>)>,
) -> (Instant, BTreeMap<String, u64>) {
    let now = Instant::now();
    let counters: BTreeMap<String, u64> = service
        .served_topics()
        .into_iter()
        .filter_map(|name| {
            service
                .served_topic(&name)
                .map(|topic| (name, topic.msg_in_total()))
        })
        .collect();
    let elapsed = last
        .as_ref()
        .map(|(at, _)| now.duration_since(*at).as_secs_f64())
        .unwrap_or(0.0);
    // Per bundle: topics and message rate.
    let mut bundles: BTreeMap<(NamespaceName, BundleRange), (usize, f64)> = BTreeMap::new();
    let owned = ownership.owned();
    let mut total_rate = 0.0;
    for (name, count) in &counters {
        let Ok(topic) = TopicName::parse(name) else {
            continue;
        };
        let rate = match (&last, elapsed > 0.0) {
            (Some((_, before)), true) => {
                count.saturating_sub(before.get(name).copied().unwrap_or(0)) as f64 / elapsed
            }
            _ => 0.0,
        };
        total_rate += rate;
        let hash = topic_hash(&topic);
        if let Some((ns, range)) = owned
            .iter()
            .find(|(ns, r)| *ns == topic.namespace && r.lower <= hash && hash < r.upper)
        {
            let entry = bundles.entry((ns.clone(), *range)).or_default();
            entry.0 += 1;
            entry.1 += rate;
        }
    }
    let load = LoadReport {
        bundles: 0, // filled in by `report_load`
        topics: u32::try_from(counters.len()).unwrap_or(u32::MAX),
        msg_rate_in: total_rate as u64,
    };
    if let Err(error) = ownership.report_load(load).await {
        tracing::warn!(%error, "load report failed");
    }
    for ((ns, range), (topics, rate)) in bundles {
        if topics > service.config.bundle_split_topics_max
            || rate > service.config.bundle_split_msg_rate_max
        {
            match ownership.split(&ns, &range).await {
                Ok(_) => tracing::info!(
                    namespace = %ns, bundle = %range.name(), topics, rate,
                    "hot bundle split"
                ),
                Err(error) => {
                    tracing::warn!(namespace = %ns, bundle = %range.name(), %error, "split failed")
                }
            }
        }
    }
    (now, counters)
}
