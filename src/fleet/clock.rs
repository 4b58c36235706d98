//! The router's clock: the latest time a request or a report carried, on the host's clock
//! (the crate reads none), and when the next fresh report goes stale.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Nanoseconds of `d`, saturating.
#[inline]
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// How far ahead of the clock one time may move it. A time further ahead is held until a
/// second time near it confirms it: one timestamp of another clock (wall time among
/// monotonic seconds, a peer's skewed frame) would otherwise move the clock forward for
/// good, and with it every decay and report age the router reads. A minute: longer than
/// any gap between a busy gateway's requests, reports (a scrape interval is seconds) and
/// heartbeats, far shorter than the offset between two unrelated clocks.
pub(crate) const MAX_CLOCK_STEP: Duration = Duration::from_secs(60);

/// The clock, lock-free.
///
/// Invariants: `now_ns` never goes back; it moves by more than [`MAX_CLOCK_STEP`] at once
/// only on the first time it is told, or on a time that a held one (`held_ns`) within the
/// step confirms.
#[derive(Debug)]
pub(crate) struct Clock {
    /// The latest time a report or a request carried (nanoseconds).
    now_ns: AtomicU64,
    /// Whether any time was told; until then the clock reads 0 and measures no span.
    told: AtomicBool,
    /// The last time that was too far ahead to take on its own (nanoseconds; 0: none).
    held_ns: AtomicU64,
    /// No report goes stale before this time (nanoseconds; a lower bound): past it, the
    /// load keys must be refreshed.
    expiry_ns: AtomicU64,
}

impl Default for Clock {
    fn default() -> Self {
        Self {
            now_ns: AtomicU64::new(0),
            told: AtomicBool::new(false),
            held_ns: AtomicU64::new(0),
            expiry_ns: AtomicU64::new(u64::MAX),
        }
    }
}

impl Clock {
    /// The clock's time, nanoseconds.
    #[inline]
    pub(crate) fn now_ns(&self) -> u64 {
        self.now_ns.load(Relaxed)
    }

    /// The clock's time.
    pub(crate) fn now(&self) -> Duration {
        Duration::from_nanos(self.now_ns())
    }

    /// Whether the host ever told the clock a time (a request's, a report's, a frame's).
    /// A clock never told stands at 0: nothing it would time (a rate, a wait, an age) has
    /// a span.
    #[inline]
    pub(crate) fn told(&self) -> bool {
        self.told.load(Relaxed)
    }

    /// Moves the clock to `at`, if later (and, when more than [`MAX_CLOCK_STEP`] ahead,
    /// confirmed): `Some(now)` when some report may have gone stale by then (the caller
    /// refreshes the loads and sets the next expiry).
    #[inline]
    pub(crate) fn observe(&self, at: Duration) -> Option<u64> {
        let now = nanos(at);
        let first = !self.told.load(Relaxed) && !self.told.swap(true, Relaxed);
        let current = self.now_ns.load(Relaxed);
        if !first && now > current.saturating_add(nanos(MAX_CLOCK_STEP)) && !self.jump(now) {
            return None;
        }
        self.now_ns.fetch_max(now, Relaxed);
        (now > self.expiry_ns.load(Relaxed)).then_some(now)
    }

    /// Whether the clock may jump to `now`, far ahead of it: when the time held before is
    /// within [`MAX_CLOCK_STEP`] of it. Holds `now` otherwise.
    #[cold]
    fn jump(&self, now: u64) -> bool {
        let held = self.held_ns.swap(now, Relaxed);
        held != 0 && held.abs_diff(now) <= nanos(MAX_CLOCK_STEP)
    }

    /// A report goes stale at `stale_at` (nanoseconds).
    pub(crate) fn expires_at(&self, stale_at: u64) {
        self.expiry_ns.fetch_min(stale_at, Relaxed);
    }

    /// The next report goes stale at `next` (nanoseconds; `u64::MAX` for none), after a
    /// refresh found every report staler.
    pub(crate) fn next_expiry(&self, next: u64) {
        self.expiry_ns.store(next, Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn secs(s: u64) -> Duration {
        Duration::from_secs(s)
    }

    #[test]
    fn one_odd_time_does_not_move_the_clock_for_good() {
        let clock = Clock::default();
        assert!(!clock.told());
        clock.observe(secs(100));
        assert!(clock.told());
        assert_eq!(clock.now(), secs(100), "the first time is taken whole");
        clock.observe(secs(130));
        assert_eq!(clock.now(), secs(130), "within the step");
        // Wall time among monotonic seconds: held, not taken.
        clock.observe(secs(1_765_000_000));
        assert_eq!(clock.now(), secs(130));
        clock.observe(secs(131));
        assert_eq!(clock.now(), secs(131));
        // Two far times apart from each other confirm nothing.
        clock.observe(secs(10_000));
        clock.observe(secs(20_000));
        assert_eq!(clock.now(), secs(131));
        // A gateway idle for an hour: its next two times confirm each other.
        clock.observe(secs(20_010));
        assert_eq!(clock.now(), secs(20_010));
        // Never back.
        clock.observe(secs(5));
        assert_eq!(clock.now(), secs(20_010));
    }
}
