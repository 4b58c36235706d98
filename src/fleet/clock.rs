//! The router's clock: the latest time a request or a report carried, on the host's clock
//! (the crate reads none), and when the next fresh report goes stale.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// Nanoseconds of `d`, saturating.
#[inline]
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

/// The clock, lock-free.
#[derive(Debug)]
pub(crate) struct Clock {
    /// The latest time a report or a request carried (nanoseconds).
    now_ns: AtomicU64,
    /// No report goes stale before this time (nanoseconds; a lower bound): past it, the
    /// load keys must be refreshed.
    expiry_ns: AtomicU64,
}

impl Default for Clock {
    fn default() -> Self {
        Self {
            now_ns: AtomicU64::new(0),
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

    /// Moves the clock to `at`, if later: `Some(now)` when some report may have gone stale
    /// by then (the caller refreshes the loads and sets the next expiry).
    #[inline]
    pub(crate) fn observe(&self, at: Duration) -> Option<u64> {
        let now = nanos(at);
        self.now_ns.fetch_max(now, Relaxed);
        (now > self.expiry_ns.load(Relaxed)).then_some(now)
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
