//! Each candidate's observed factors as admission's gates read them: the fleet's
//! observations (`observed.rs`) joined with a route's candidates.

use smallvec::SmallVec;
use std::sync::atomic::Ordering::Relaxed;

use super::super::candidate::{Candidate, Candidates};
use super::super::registry::slots::Slots;
use super::super::tracker::Fleet;
use super::worker::ObservedFactors;

impl Fleet {
    /// Each candidate's factors now, in order (see [`factors_of`](Self::factors_of)).
    pub(crate) fn factors(
        &self,
        candidates: &Candidates,
    ) -> SmallVec<[Option<ObservedFactors>; 64]> {
        let now_ns = self.clock.now_ns();
        let slots = self.registry.read();
        let fleet_reporting = self.reporting.load(Relaxed);
        candidates
            .iter()
            .map(|c| factors_in(&slots, c, (now_ns, fleet_reporting)))
            .collect()
    }

    /// Candidate `c`'s factors now: `None` while the host has reported nothing timed for
    /// any worker of the fleet, and for a worker removed since the snapshot. Once one
    /// reports, a worker not yet reporting has factors of 1 and no observed step: the
    /// decode bound's initial window holds it.
    pub(crate) fn factors_of(&self, c: &Candidate) -> Option<ObservedFactors> {
        if !self.reporting.load(Relaxed) {
            return None;
        }
        factors_in(&self.registry.read(), c, (self.clock.now_ns(), true))
    }
}

/// Candidate `c`'s factors in `slots` at `now_ns`, the fleet reporting or not.
#[inline]
fn factors_in(
    slots: &Slots,
    c: &Candidate,
    (now_ns, fleet_reporting): (u64, bool),
) -> Option<ObservedFactors> {
    let r = slots
        .get(c.worker.index())
        .filter(|r| r.slot.epoch == c.epoch)?;
    let outstanding = c.estimate.prefill_tokens > 0;
    r.slot.observed.factors(
        now_ns,
        (outstanding, fleet_reporting),
        &c.estimate.forecast_timing(),
    )
}
