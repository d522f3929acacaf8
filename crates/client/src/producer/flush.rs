//! When a producer's open batch is sent: the batch timer's deadline.
//!
//! Owns: [`batch_flush_at`]. Guarantees: with tokio's millisecond timer
//! ticks, no message waits longer than the batching `max_delay` for its
//! batch (sub-millisecond delays excepted: the tick rounds them up).

use std::time::Duration;

use tokio::time::Instant;

/// tokio's timers fire on the first whole millisecond tick at or after
/// their deadline (a 1 ms sleep lasts 1-2 ms).
const TIMER_TICK: Duration = Duration::from_millis(1);

/// When the batch whose first message came at `started` is sent: just
/// after `started + max_delay - TIMER_TICK`, so that the tick its timer
/// fires on is at most `started + max_delay`: no message waits longer than
/// `max_delay` for its batch. With `started + max_delay` as the deadline a
/// message of a quiet producer waited up to a tick more (1-2 ms, 1.5 on
/// average, for the default 1 ms; now 0-1 ms). A `max_delay` below one tick
/// keeps its own deadline (the tick rounds it up).
pub(super) fn batch_flush_at(started: Instant, max_delay: Duration) -> Instant {
    match max_delay.checked_sub(TIMER_TICK) {
        Some(early) => started + early + Duration::from_nanos(1),
        None => started + max_delay,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_batch_is_due_within_its_delay_on_the_timer_tick() {
        let started = Instant::now();
        let tick_after = |at: Instant| at.duration_since(started);
        // The default 1 ms: due right after the first message, so the
        // timer's first tick after it sends the batch (0-1 ms later).
        assert_eq!(
            tick_after(batch_flush_at(started, Duration::from_millis(1))),
            Duration::from_nanos(1)
        );
        // Longer delays: one tick early, never later than the delay.
        assert_eq!(
            tick_after(batch_flush_at(started, Duration::from_millis(10))),
            Duration::from_millis(9) + Duration::from_nanos(1)
        );
        // Below a tick, and zero: the delay itself.
        assert_eq!(
            tick_after(batch_flush_at(started, Duration::from_micros(300))),
            Duration::from_micros(300)
        );
        assert_eq!(batch_flush_at(started, Duration::ZERO), started);
    }
}
