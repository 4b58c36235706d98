//! [`RunningTargets`]: the time-per-output-token targets of the requests decoding on each
//! worker, so that a prefill placed there can be held to the tightest of them.

use std::collections::BTreeMap;
use std::sync::{Mutex, MutexGuard, PoisonError};

use crate::tree::WorkerId;

/// By worker, the targets (in whole nanoseconds) of the requests routed to decode there and
/// not completed, each counted once per request.
///
/// Invariant: a target is added once per request with one and taken back once, so no count
/// goes below zero and a worker's map holds only targets of requests still there.
#[derive(Debug)]
pub(crate) struct RunningTargets {
    by_worker: Vec<Mutex<BTreeMap<u64, u32>>>,
}

impl RunningTargets {
    /// No targets, for workers `0..workers`.
    pub(crate) fn new(workers: usize) -> Self {
        Self {
            by_worker: (0..workers).map(|_| Mutex::default()).collect(),
        }
    }

    fn at(&self, worker: WorkerId) -> Option<MutexGuard<'_, BTreeMap<u64, u32>>> {
        // Nothing panics while holding the lock; a poisoned map is still whole.
        let lock = self.by_worker.get(worker.index())?;
        Some(lock.lock().unwrap_or_else(PoisonError::into_inner))
    }

    /// A request held to `target_ns` decodes on `worker` from now.
    pub(crate) fn add(&self, worker: WorkerId, target_ns: u64) {
        if let Some(mut targets) = self.at(worker) {
            *targets.entry(target_ns).or_default() += 1;
        }
    }

    /// A request held to `target_ns` no longer decodes on `worker`.
    pub(crate) fn remove(&self, worker: WorkerId, target_ns: u64) {
        if let Some(mut targets) = self.at(worker) {
            if let Some(n) = targets.get_mut(&target_ns) {
                *n -= 1;
                if *n == 0 {
                    targets.remove(&target_ns);
                }
            }
        }
    }

    /// The tightest target of the requests decoding on `worker`, in seconds.
    pub(crate) fn tightest_s(&self, worker: WorkerId) -> Option<f64> {
        let targets = self.at(worker)?;
        targets.keys().next().map(|&ns| ns as f64 * 1e-9)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tightest_target_is_of_the_requests_still_there() {
        let targets = RunningTargets::new(2);
        let w = WorkerId::new(0);
        assert_eq!(targets.tightest_s(w), None);
        targets.add(w, 50_000_000);
        targets.add(w, 20_000_000);
        targets.add(w, 20_000_000);
        assert_eq!(targets.tightest_s(w), Some(0.02));
        targets.remove(w, 20_000_000);
        assert_eq!(targets.tightest_s(w), Some(0.02));
        targets.remove(w, 20_000_000);
        assert_eq!(targets.tightest_s(w), Some(0.05));
        assert_eq!(targets.tightest_s(WorkerId::new(1)), None);
        assert_eq!(targets.tightest_s(WorkerId::new(9)), None);
        targets.remove(WorkerId::new(9), 1);
    }
}
