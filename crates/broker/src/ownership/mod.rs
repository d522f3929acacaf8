//! Cluster ownership: which broker serves which namespace bundle, and the
//! lookup answer that follows from it.
//!
//! Owns, in the metadata store:
//! - `/bundles/{tenant}/{namespace}`: the namespace's bundle boundaries (hash
//!   ranges of topic names, Pulsar's layout: `BUNDLES_DEFAULT` equal ranges of
//!   the CRC32 of the full topic name, the last one closed at 0xffffffff);
//!   created on first use, changed only by a split (CAS);
//! - `/brokers/available/{id}`: this broker's registration (URLs and a load
//!   report, refreshed every `LOAD_REPORT_INTERVAL`), ephemeral;
//! - `/ownership/{tenant}/{namespace}/{range}`: the owner of a bundle,
//!   ephemeral on the owner's session.
//!
//! Guarantees: a broker serves a topic only while it holds its bundle's key
//! (`check_owned`); when its session ends it drops every bundle at once (the
//! service unloads the topics, see `lost`), then registers again with a new
//! session and takes bundles afresh as lookups come. What makes a deposed
//! broker harmless before it notices is the ledger protocol: the next owner
//! opens each log with recovery, which fences the old writer.
//! Never: takes a bundle whose key another broker holds, or answers a lookup
//! for a namespace that does not exist.

mod bundle;
mod records;
mod session;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::Mutex;
use tokio::sync::watch;
use vela_meta::{ExpectedVersion, MetaError, MetadataStore, Session};

use crate::topic_name::{NamespaceName, TopicName};
pub use bundle::{
    BUNDLES_DEFAULT, BUNDLES_PER_NAMESPACE_MAX, BundleRange, default_layout, topic_hash,
};
use bundle::{HASH_END, even_boundaries};
pub use records::{
    BROKERS_PATH, BrokerInfo, LOAD_REPORT_INTERVAL, LoadReport, LookupAnswer, LookupUrls,
    OwnershipError,
};
use records::{BundlesRecord, broker_key, bundles_key, decode, encode, owner_key};

/// Brokers owning at most this many bundles more than the least loaded one
/// are candidates for a new bundle.
const LOAD_TOLERANCE_BUNDLES: u32 = 2;

/// A broker's view and holdings of cluster ownership.
#[derive(Debug)]
pub struct Ownership {
    meta: Arc<dyn MetadataStore>,
    me: Mutex<BrokerInfo>,
    ttl: Duration,
    /// The current session; replaced when one ends (`session`).
    session: parking_lot::RwLock<Arc<Session>>,
    /// Set by `close`: no new session after the current one.
    closing: std::sync::atomic::AtomicBool,
    /// Bundles held, by namespace.
    owned: Mutex<BTreeMap<NamespaceName, BTreeSet<BundleRange>>>,
    /// Bundle boundaries read so far (refreshed on a miss or a split).
    layouts: Mutex<BTreeMap<NamespaceName, Vec<u64>>>,
    lost: watch::Sender<bool>,
}

impl Ownership {
    /// This broker's registration.
    pub fn me(&self) -> BrokerInfo {
        self.me.lock().clone()
    }

    /// True while this broker has no session (the last one ended; it owns
    /// nothing and is registering again).
    pub fn lost(&self) -> watch::Receiver<bool> {
        self.lost.subscribe()
    }

    fn check_session(&self) -> Result<Arc<Session>, OwnershipError> {
        let session = Arc::clone(&self.session.read());
        if *self.lost.borrow() || !session.is_alive() {
            return Err(OwnershipError::SessionLost);
        }
        Ok(session)
    }

    /// The namespace's bundle boundaries, creating the default layout.
    async fn boundaries(&self, ns: &NamespaceName) -> Result<Vec<u64>, OwnershipError> {
        if let Some(layout) = self.layouts.lock().get(ns) {
            return Ok(layout.clone());
        }
        self.reload_boundaries(ns).await
    }

    async fn reload_boundaries(&self, ns: &NamespaceName) -> Result<Vec<u64>, OwnershipError> {
        let key = bundles_key(ns);
        let layout = match self.meta.get(&key).await? {
            Some((value, _)) => decode::<BundlesRecord>(&key, &value)?.boundaries,
            None => {
                let record = BundlesRecord {
                    boundaries: even_boundaries(BUNDLES_DEFAULT),
                };
                match self
                    .meta
                    .put(&key, encode(&record), ExpectedVersion::Absent)
                    .await
                {
                    Ok(_) => record.boundaries,
                    // Another broker created it first: read theirs.
                    Err(MetaError::Exists { .. }) => match self.meta.get(&key).await? {
                        Some((value, _)) => decode::<BundlesRecord>(&key, &value)?.boundaries,
                        None => record.boundaries,
                    },
                    Err(error) => return Err(error.into()),
                }
            }
        };
        let valid = layout.len() >= 2
            && layout.first() == Some(&0)
            && layout.last() == Some(&HASH_END)
            && layout.windows(2).all(|w| w[0] < w[1]);
        if !valid {
            return Err(OwnershipError::Corrupt {
                key,
                reason: "bundle boundaries must rise from 0 to 2^32".to_string(),
            });
        }
        self.layouts.lock().insert(ns.clone(), layout.clone());
        Ok(layout)
    }

    /// The bundles of a namespace.
    pub async fn bundles(&self, ns: &NamespaceName) -> Result<Vec<BundleRange>, OwnershipError> {
        let layout = self.boundaries(ns).await?;
        Ok(layout
            .windows(2)
            .map(|w| BundleRange {
                lower: w[0],
                upper: w[1],
            })
            .collect())
    }

    /// The bundle that holds `topic`.
    pub async fn bundle_of(&self, topic: &TopicName) -> Result<BundleRange, OwnershipError> {
        let hash = topic_hash(topic);
        self.bundles(&topic.namespace)
            .await?
            .into_iter()
            .find(|range| range.contains(hash))
            .ok_or_else(|| OwnershipError::Corrupt {
                key: bundles_key(&topic.namespace),
                reason: format!("no bundle holds hash {hash:#x}"),
            })
    }

    /// The owner of a bundle, if any.
    pub async fn owner(
        &self,
        ns: &NamespaceName,
        range: &BundleRange,
    ) -> Result<Option<BrokerInfo>, OwnershipError> {
        let key = owner_key(ns, range);
        match self.meta.get(&key).await? {
            Some((value, _)) => Ok(Some(decode(&key, &value)?)),
            None => Ok(None),
        }
    }

    /// The owner of a bundle, unless its process is gone: a broker that
    /// crashed keeps its keys until its session expires (seconds), but its
    /// host answers a connection to its port with a refusal at once. Then
    /// the ownership key is deleted (only that version of it) and the bundle
    /// is free now. Safe even if the refusal misled us: whoever takes the
    /// bundle recovers each log with fencing, so the old owner could get
    /// nothing more acknowledged. Only a refusal counts; a timeout (a slow or
    /// partitioned owner) does not.
    async fn live_owner(
        &self,
        ns: &NamespaceName,
        range: &BundleRange,
    ) -> Result<Option<BrokerInfo>, OwnershipError> {
        let key = owner_key(ns, range);
        let Some((value, version)) = self.meta.get(&key).await? else {
            return Ok(None);
        };
        let owner: BrokerInfo = decode(&key, &value)?;
        if owner.id == self.me.lock().id || !refuses_connections(&owner.service_url).await {
            return Ok(Some(owner));
        }
        match self.meta.delete(&key, ExpectedVersion::Is(version)).await {
            Ok(()) => {
                tracing::warn!(
                    namespace = %ns, bundle = %range.name(), owner = %owner.service_url,
                    "the owner's port refuses connections: its process is gone; bundle freed"
                );
                Ok(None)
            }
            // Changed meanwhile (taken over, or released): read it again.
            Err(MetaError::BadVersion { .. } | MetaError::NotFound { .. }) => {
                self.owner(ns, range).await
            }
            Err(error) => Err(error.into()),
        }
    }

    /// The registered brokers.
    pub async fn brokers(&self) -> Result<Vec<BrokerInfo>, OwnershipError> {
        let mut brokers = Vec::new();
        for name in self.meta.children(BROKERS_PATH).await? {
            let key = format!("{BROKERS_PATH}/{name}");
            if let Some((value, _)) = self.meta.get(&key).await? {
                match decode::<BrokerInfo>(&key, &value) {
                    Ok(info) => brokers.push(info),
                    Err(error) => tracing::warn!(%error, "skipping a broker registration"),
                }
            }
        }
        Ok(brokers)
    }

    /// Takes `range` of `ns` for this broker. `Ok(false)` if another broker
    /// holds it.
    pub async fn acquire(
        &self,
        ns: &NamespaceName,
        range: &BundleRange,
    ) -> Result<bool, OwnershipError> {
        let session = self.check_session()?;
        if self
            .owned
            .lock()
            .get(ns)
            .is_some_and(|owned| owned.contains(range))
        {
            return Ok(true);
        }
        let me = self.me();
        match self
            .meta
            .put_ephemeral(
                &session,
                &owner_key(ns, range),
                encode(&me),
                ExpectedVersion::Absent,
            )
            .await
        {
            Ok(_) => {
                self.owned
                    .lock()
                    .entry(ns.clone())
                    .or_default()
                    .insert(*range);
                tracing::info!(namespace = %ns, bundle = %range.name(), "bundle acquired");
                // Others place new bundles by our count: tell them now.
                let load = self.me.lock().load;
                if let Err(error) = self.report_load(load).await {
                    tracing::warn!(%error, "load report failed");
                }
                Ok(true)
            }
            Err(MetaError::Exists { .. }) => {
                // Ours from an earlier life of this session? Then keep it.
                Ok(self
                    .owner(ns, range)
                    .await?
                    .is_some_and(|owner| owner.id == me.id && owner.service_url == me.service_url))
            }
            Err(error) => Err(error.into()),
        }
    }

    /// Gives a bundle up (its topics must be unloaded first).
    pub async fn release(
        &self,
        ns: &NamespaceName,
        range: &BundleRange,
    ) -> Result<(), OwnershipError> {
        let held = self
            .owned
            .lock()
            .get_mut(ns)
            .is_some_and(|owned| owned.remove(range));
        if held {
            match self
                .meta
                .delete(&owner_key(ns, range), ExpectedVersion::Any)
                .await
            {
                Ok(()) | Err(MetaError::NotFound { .. }) => {}
                Err(error) => return Err(error.into()),
            }
            tracing::info!(namespace = %ns, bundle = %range.name(), "bundle released");
        }
        Ok(())
    }

    /// Whether this broker holds the bundle of `topic`; if the bundle has no
    /// owner, takes it. `OwnedElsewhere` otherwise (the client looks up again).
    pub async fn check_owned(&self, topic: &TopicName) -> Result<(), OwnershipError> {
        self.check_session()?;
        let range = self.bundle_of(topic).await?;
        // Clears the key of an owner whose process is gone.
        self.live_owner(&topic.namespace, &range).await?;
        if self.acquire(&topic.namespace, &range).await? {
            return Ok(());
        }
        let owner = self
            .owner(&topic.namespace, &range)
            .await?
            .map_or_else(|| "nobody".to_string(), |o| o.service_url);
        Err(OwnershipError::OwnedElsewhere {
            namespace: topic.namespace.to_string(),
            bundle: range.name(),
            owner,
        })
    }

    /// Who serves `topic`: its bundle's owner, or for an unowned bundle, the
    /// least loaded broker (this one takes it when it is that broker, or when
    /// the lookup is authoritative: another broker sent the client here).
    pub async fn lookup(
        &self,
        topic: &TopicName,
        authoritative: bool,
    ) -> Result<LookupAnswer, OwnershipError> {
        self.check_session()?;
        let range = self.bundle_of(topic).await?;
        if let Some(owner) = self.live_owner(&topic.namespace, &range).await? {
            return Ok(LookupAnswer::Connect(owner));
        }
        let me = self.me();
        let chosen = if authoritative {
            me.clone()
        } else {
            self.least_loaded(&topic.namespace, &range).await?
        };
        if chosen.id != me.id {
            return Ok(LookupAnswer::Redirect(chosen));
        }
        if self.acquire(&topic.namespace, &range).await? {
            return Ok(LookupAnswer::Connect(me));
        }
        // Lost a race: whoever won serves it.
        match self.owner(&topic.namespace, &range).await? {
            Some(owner) => Ok(LookupAnswer::Connect(owner)),
            None => Err(OwnershipError::NoBroker),
        }
    }

    /// The broker to own an unowned bundle: among the brokers whose reported
    /// bundle count is within `LOAD_TOLERANCE_BUNDLES` of the lowest, the one
    /// the bundle hashes to (rendezvous hashing). Load reports are seconds
    /// old; the hash spreads bundles assigned meanwhile instead of sending
    /// them all to the same "least loaded" broker.
    async fn least_loaded(
        &self,
        ns: &NamespaceName,
        range: &BundleRange,
    ) -> Result<BrokerInfo, OwnershipError> {
        let brokers = self.brokers().await?;
        let lowest = brokers
            .iter()
            .map(|b| b.load.bundles)
            .min()
            .ok_or(OwnershipError::NoBroker)?;
        let bundle = format!("{ns}/{}", range.name());
        let mut candidates: Vec<BrokerInfo> = brokers
            .into_iter()
            .filter(|b| b.load.bundles <= lowest.saturating_add(LOAD_TOLERANCE_BUNDLES))
            .collect();
        candidates.sort_by_key(|b| {
            std::cmp::Reverse((
                crc32fast::hash(format!("{}|{bundle}", b.id).as_bytes()),
                b.id.clone(),
            ))
        });
        // A crashed broker stays registered until its session expires: skip
        // one whose port refuses connections rather than send clients there.
        let me = self.me.lock().id.clone();
        for candidate in candidates {
            if candidate.id == me || !refuses_connections(&candidate.service_url).await {
                return Ok(candidate);
            }
        }
        Ok(self.me())
    }

    /// Bundles held now.
    pub fn owned(&self) -> Vec<(NamespaceName, BundleRange)> {
        self.owned
            .lock()
            .iter()
            .flat_map(|(ns, ranges)| ranges.iter().map(move |r| (ns.clone(), *r)))
            .collect()
    }

    /// Whether `topic`'s bundle is one this broker holds (no store access:
    /// from the layouts and holdings known).
    pub fn holds(&self, topic: &TopicName) -> bool {
        let hash = topic_hash(topic);
        self.owned
            .lock()
            .get(&topic.namespace)
            .is_some_and(|ranges| ranges.iter().any(|r| r.contains(hash)))
    }

    /// Splits an owned bundle in two halves, both kept by this broker.
    pub async fn split(
        &self,
        ns: &NamespaceName,
        range: &BundleRange,
    ) -> Result<(BundleRange, BundleRange), OwnershipError> {
        self.check_session()?;
        let key = bundles_key(ns);
        let (value, version) = self
            .meta
            .get(&key)
            .await?
            .ok_or_else(|| OwnershipError::CannotSplit(range.name()))?;
        let mut layout = decode::<BundlesRecord>(&key, &value)?.boundaries;
        let middle = range.lower + (range.upper - range.lower) / 2;
        let position = layout.iter().position(|b| *b == range.lower);
        let is_bundle = position.is_some_and(|p| layout.get(p + 1) == Some(&range.upper));
        if !is_bundle || middle == range.lower || layout.len() > BUNDLES_PER_NAMESPACE_MAX {
            return Err(OwnershipError::CannotSplit(range.name()));
        }
        if let Some(position) = position {
            layout.insert(position + 1, middle);
        }
        self.meta
            .put(
                &key,
                encode(&BundlesRecord {
                    boundaries: layout.clone(),
                }),
                ExpectedVersion::Is(version),
            )
            .await?;
        self.layouts.lock().insert(ns.clone(), layout);
        let low = BundleRange {
            lower: range.lower,
            upper: middle,
        };
        let high = BundleRange {
            lower: middle,
            upper: range.upper,
        };
        let held = self
            .owned
            .lock()
            .get(ns)
            .is_some_and(|owned| owned.contains(range));
        if held {
            self.acquire(ns, &low).await?;
            self.acquire(ns, &high).await?;
            self.release(ns, range).await?;
        }
        tracing::info!(namespace = %ns, bundle = %range.name(), "bundle split");
        Ok((low, high))
    }

    /// Refreshes the load report in this broker's registration.
    pub async fn report_load(&self, mut load: LoadReport) -> Result<(), OwnershipError> {
        let session = self.check_session()?;
        load.bundles = u32::try_from(self.owned().len()).unwrap_or(u32::MAX);
        let me = {
            let mut me = self.me.lock();
            me.load = load;
            me.clone()
        };
        self.meta
            .put_ephemeral(
                &session,
                &broker_key(&me.id),
                encode(&me),
                ExpectedVersion::Any,
            )
            .await?;
        Ok(())
    }

    /// Ends the session: ownership keys and the registration go away now
    /// rather than at session expiry (a clean shutdown).
    pub async fn close(&self) {
        self.closing
            .store(true, std::sync::atomic::Ordering::Release);
        self.owned.lock().clear();
        self.lost.send_replace(true);
        let session = Arc::clone(&self.session.read());
        if let Err(error) = session.close_shared().await {
            tracing::warn!(%error, "closing the broker session failed");
        }
    }
}

/// How long a liveness probe of another broker's port may take.
const OWNER_PROBE_TIMEOUT: Duration = Duration::from_millis(300);

/// Whether `service_url`'s port answers a connection with a refusal (the
/// process behind it is gone). Anything else (accepted, timed out, no route)
/// is not proof.
async fn refuses_connections(service_url: &str) -> bool {
    let Some(address) = service_url
        .strip_prefix("pulsar://")
        .or_else(|| service_url.strip_prefix("pulsar+ssl://"))
    else {
        return false;
    };
    match tokio::time::timeout(OWNER_PROBE_TIMEOUT, tokio::net::TcpStream::connect(address)).await {
        Ok(Err(error)) => error.kind() == std::io::ErrorKind::ConnectionRefused,
        _ => false,
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn info(id: &str) -> BrokerInfo {
        BrokerInfo {
            id: id.to_string(),
            service_url: format!("pulsar://{id}"),
            service_url_tls: None,
            http_url: format!("http://{id}"),
            http_url_tls: None,
            load: LoadReport::default(),
            listeners: std::collections::BTreeMap::new(),
        }
    }

    #[test]
    fn registrations_without_tls_urls_still_parse() {
        // As brokers wrote them before the TLS URLs were published.
        let old = br#"{"id":"h:1","service_url":"pulsar://h:1","http_url":"http://h:2",
            "load":{"bundles":1,"topics":2,"msg_rate_in":3}}"#;
        let info: BrokerInfo = decode("/brokers/available/h:1", old).unwrap();
        assert_eq!(info.service_url_tls, None);
        assert_eq!(info.http_url_tls, None);
        assert_eq!(info.load.topics, 2);
        // And the TLS URLs round-trip.
        let mut tls = info.clone();
        tls.service_url_tls = Some("pulsar+ssl://h:3".to_string());
        tls.http_url_tls = Some("https://h:4".to_string());
        let back: BrokerInfo = decode("k", &encode(&tls)).unwrap();
        assert_eq!(back, tls);
        // Without them the record is written as before.
        assert!(
            !String::from_utf8(encode(&info).to_vec())
                .unwrap()
                .contains("tls")
        );
    }

    fn connect_id(answer: LookupAnswer) -> String {
        match answer {
            LookupAnswer::Connect(owner) => owner.id,
            LookupAnswer::Redirect(chosen) => panic!("redirect to {}", chosen.id),
        }
    }

    #[tokio::test]
    async fn two_brokers_agree_on_one_owner_and_a_split_keeps_it() {
        let meta: Arc<dyn MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
        let a = Ownership::start(meta.clone(), info("a:1"), Duration::from_secs(10))
            .await
            .unwrap();
        let b = Ownership::start(meta.clone(), info("b:1"), Duration::from_secs(10))
            .await
            .unwrap();
        let topic = TopicName::parse("persistent://public/default/t1").unwrap();
        // An authoritative lookup at b makes b the owner; a then points there.
        let answer = b.lookup(&topic, true).await.unwrap();
        assert_eq!(connect_id(answer), "b:1");
        assert_eq!(connect_id(a.lookup(&topic, false).await.unwrap()), "b:1");
        assert!(b.check_owned(&topic).await.is_ok());
        assert!(matches!(
            a.check_owned(&topic).await,
            Err(OwnershipError::OwnedElsewhere { .. })
        ));
        // Split: b keeps both halves; the topic stays on b.
        let range = b.bundle_of(&topic).await.unwrap();
        let (low, high) = b.split(&topic.namespace, &range).await.unwrap();
        assert!(b.holds(&topic));
        assert_eq!(b.owned().len(), 2);
        assert!(low.upper == high.lower);
        // a re-reads the layout on its next miss.
        a.reload_boundaries(&topic.namespace).await.unwrap();
        assert_eq!(a.bundles(&topic.namespace).await.unwrap().len(), 5);
        assert_eq!(connect_id(a.lookup(&topic, false).await.unwrap()), "b:1");
        // b stops: its bundles are free; a takes the topic.
        b.close().await;
        assert!(*b.lost().borrow());
        assert_eq!(connect_id(a.lookup(&topic, false).await.unwrap()), "a:1");
    }

    #[tokio::test]
    async fn an_expired_session_drops_every_bundle_then_registers_again() {
        let memory = Arc::new(vela_meta::MemoryStore::new());
        let meta: Arc<dyn MetadataStore> = memory.clone();
        let a = Ownership::start(meta.clone(), info("a:1"), Duration::from_secs(10))
            .await
            .unwrap();
        let topic = TopicName::parse("persistent://public/default/t2").unwrap();
        assert_eq!(connect_id(a.lookup(&topic, false).await.unwrap()), "a:1");
        assert!(a.holds(&topic));
        let mut lost = a.lost();
        let old_session = a.session.read().id();
        memory.expire_session(old_session).await.unwrap();
        lost.wait_for(|lost| *lost).await.unwrap();
        assert!(!a.holds(&topic), "bundles dropped with the session");
        // The ownership key went with the session; a registers again.
        lost.wait_for(|lost| !*lost).await.unwrap();
        assert_ne!(a.session.read().id(), old_session);
        assert_eq!(a.brokers().await.unwrap().len(), 1);
        assert_eq!(connect_id(a.lookup(&topic, false).await.unwrap()), "a:1");
        assert!(a.holds(&topic));
    }

    #[tokio::test]
    async fn a_bundle_of_a_broker_whose_port_refuses_is_freed_at_once() {
        let meta: Arc<dyn MetadataStore> = Arc::new(vela_meta::MemoryStore::new());
        // A port nobody listens on: connections are refused.
        let closed = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let dead_port = closed.local_addr().unwrap().port();
        drop(closed);
        let mut dead_info = info("dead:1");
        dead_info.service_url = format!("pulsar://127.0.0.1:{dead_port}");
        let dead = Ownership::start(meta.clone(), dead_info, Duration::from_secs(60))
            .await
            .unwrap();
        let topic = TopicName::parse("persistent://public/default/t3").unwrap();
        assert_eq!(
            connect_id(dead.lookup(&topic, true).await.unwrap()),
            "dead:1"
        );
        // Its session lives on (60 s), but its port refuses: another broker
        // takes the bundle now.
        let live_listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let mut live_info = info("live:1");
        live_info.service_url = format!("pulsar://{}", live_listener.local_addr().unwrap());
        let live = Ownership::start(meta, live_info, Duration::from_secs(60))
            .await
            .unwrap();
        assert_eq!(
            connect_id(live.lookup(&topic, true).await.unwrap()),
            "live:1"
        );
        assert!(live.holds(&topic));
        // A live owner (its port accepts) keeps its bundle.
        let other = Ownership::start(
            Arc::clone(&live.meta),
            info("other:1"),
            Duration::from_secs(60),
        )
        .await
        .unwrap();
        assert_eq!(
            connect_id(other.lookup(&topic, true).await.unwrap()),
            "live:1"
        );
    }
}
