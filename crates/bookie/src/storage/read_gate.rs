//! `ReadGate`: at most `max` entry-log reads at the disk at once.
//!
//! Catch-up readers issue many large sequential reads in parallel (every
//! dispatcher's read-ahead, several entries each, each with the storage's own
//! read-ahead). Queued at the device all at once they sit in front of the
//! journal's writes and fdatasyncs, and a producer's add waits behind megabytes
//! of reads. The gate keeps the device queue short: a read passes it once per
//! piece of at most `LOG_READ_PIECE_BYTES`, so a journal write waits for at
//! most `max` pieces. Reads served from the read cache never pass through it.
//!
//! Blocking: callers are storage reads on blocking threads, never async tasks.

use std::sync::{Condvar, Mutex};

#[derive(Debug)]
pub(super) struct ReadGate {
    max: usize,
    in_flight: Mutex<usize>,
    freed: Condvar,
}

/// One read's place at the gate; the place is given back on drop.
pub(super) struct Pass<'a> {
    gate: &'a ReadGate,
}

impl ReadGate {
    pub(super) fn new(max: usize) -> Self {
        assert!(max > 0, "a read gate lets at least one read through");
        Self {
            max,
            in_flight: Mutex::new(0),
            freed: Condvar::new(),
        }
    }

    /// Waits for a place (blocking the calling thread).
    pub(super) fn enter(&self) -> Pass<'_> {
        let mut in_flight = self.in_flight.lock().unwrap_or_else(|e| e.into_inner());
        while *in_flight >= self.max {
            in_flight = self
                .freed
                .wait(in_flight)
                .unwrap_or_else(|e| e.into_inner());
        }
        *in_flight += 1;
        debug_assert!(*in_flight <= self.max);
        Pass { gate: self }
    }
}

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut in_flight = self
            .gate
            .in_flight
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        debug_assert!(*in_flight > 0);
        *in_flight -= 1;
        drop(in_flight);
        self.gate.freed.notify_one();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};

    #[test]
    fn never_more_than_max_inside() {
        let gate = Arc::new(ReadGate::new(2));
        let inside = Arc::new(AtomicUsize::new(0));
        let peak = Arc::new(AtomicUsize::new(0));
        let threads: Vec<_> = (0..8)
            .map(|_| {
                let (gate, inside, peak) = (gate.clone(), inside.clone(), peak.clone());
                std::thread::spawn(move || {
                    for _ in 0..50 {
                        let _pass = gate.enter();
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        peak.fetch_max(now, Ordering::SeqCst);
                        std::thread::yield_now();
                        inside.fetch_sub(1, Ordering::SeqCst);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().expect("reader thread");
        }
        assert!(peak.load(Ordering::SeqCst) <= 2);
        assert_eq!(inside.load(Ordering::SeqCst), 0);
    }
}
