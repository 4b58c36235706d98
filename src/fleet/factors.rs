//! Each candidate's observed factors as admission's gates read them: the fleet's
//! observations (`observed.rs`) joined with a route's candidates.

use smallvec::SmallVec;

use super::candidate::{Candidate, Candidates};
use super::observed::Factors;
use super::tracker::Fleet;

impl Fleet {
    /// Each candidate's factors now, in order: `None` for every worker while the host
    /// reports nothing timed for any candidate, and for a worker removed since the
    /// snapshot. Once one reports, a worker not yet reporting has factors of 1 and no
    /// observed step: the decode bound's initial window holds it.
    pub(crate) fn factors(&self, candidates: &Candidates) -> SmallVec<[Option<Factors>; 64]> {
        let now_ns = self.clock.now_ns();
        let slots = self.registry.read();
        let current = |c: &Candidate| {
            slots
                .get(c.worker.index())
                .filter(|r| r.slot.epoch == c.epoch)
        };
        let any = candidates
            .iter()
            .any(|c| current(c).is_some_and(|r| r.slot.observed.reporting()));
        candidates
            .iter()
            .map(|c| {
                let outstanding = c.estimate.prefill_tokens > 0;
                let observed = &current(c)?.slot.observed;
                observed.factors(now_ns, (outstanding, any), &c.estimate.timing)
            })
            .collect()
    }
}
