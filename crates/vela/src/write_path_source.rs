//! The write-path stages below the broker in `vela standalone`: the ledger
//! client's adds and each in-process bookie's add and journal stages, handed
//! to the broker as a `vela_broker::WritePathSource` (the broker never
//! depends on the bookie; this process owns both and wires them).
//!
//! Owns: converting the ledger client's and bookies' HDR histograms into the
//! broker's `LatencySnapshot` at each scrape. Never: records anything itself
//! or blocks (copies a few histograms per scrape).

use std::sync::Arc;

use vela_bookie::bookie::Bookie;
use vela_broker::{LatencySnapshot, Stage, StageLatency, WritePathSource};
use vela_ledger::{BookieId, LedgerClient};

/// Ledger client and bookies of one standalone process.
#[derive(Debug)]
pub(crate) struct StandaloneStages {
    ledgers: LedgerClient,
    bookies: Vec<(BookieId, Arc<Bookie>)>,
}

impl StandaloneStages {
    pub(crate) fn new(ledgers: LedgerClient, bookies: Vec<(BookieId, Arc<Bookie>)>) -> Self {
        StandaloneStages { ledgers, bookies }
    }
}

/// An HDR histogram (µs) as the broker's snapshot.
fn snapshot(histogram: &hdrhistogram::Histogram<u64>) -> LatencySnapshot {
    LatencySnapshot::from_values(
        histogram
            .iter_recorded()
            .map(|v| (v.value_iterated_to(), v.count_since_last_iteration())),
    )
}

impl WritePathSource for StandaloneStages {
    fn stages(&self) -> Vec<StageLatency> {
        let mut out = vec![StageLatency {
            stage: Stage::LedgerAdd,
            instance: "ledger-client".to_string(),
            latency: snapshot(&self.ledgers.add_latency_histogram()),
        }];
        for (id, bookie) in &self.bookies {
            let histograms = bookie.latency_histograms();
            for (stage, histogram) in [
                (Stage::BookieAdd, &histograms.add_us),
                (Stage::JournalQueueWait, &histograms.journal.queue_wait_us),
                (Stage::JournalWrite, &histograms.journal.write_us),
                (Stage::JournalFdatasync, &histograms.journal.fdatasync_us),
            ] {
                out.push(StageLatency {
                    stage,
                    instance: id.0.clone(),
                    latency: snapshot(histogram),
                });
            }
        }
        out
    }
}
