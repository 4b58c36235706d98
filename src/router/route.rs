//! A [`PolicyRouter`]'s route path: the candidates its policy is offered (every worker, or
//! the shortlist), the mirror's match, admission's gate, the policy's checked choice, the
//! optimistic insert under the mirror's lock, and the charge; and the pieces of it the pair
//! router shares.

use super::admission::{Admission, Filter, Open};
use super::policy::{CandidateSet, Policy};
use super::policy_router::PolicyRouter;
use super::shortlist::{Classes, Offer, Scoring, fill};
use crate::error::Error;
use crate::fleet::{Candidate, Candidates};
use crate::index::Blocks;
use crate::request::{RouteDecision, RouteRequest};
use crate::tree::WorkerId;

impl<P: Policy> PolicyRouter<P> {
    /// The policy's choice among `candidates`, checked.
    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Result<usize, Error> {
        let chosen = self.policy.select(request, candidates);
        if chosen < candidates.len() {
            Ok(chosen)
        } else {
            Err(Error::InvalidChoice {
                policy: self.policy.name(),
                index: chosen,
                candidates: candidates.len(),
            })
        }
    }

    /// One choice: the candidates the policy asks for, with the mirror's prediction filled
    /// in when it reads the cache; those admission keeps when the request carries a target;
    /// the policy's choice, checked, and the blocks the deepest holder holds.
    #[inline]
    fn choose(
        &self,
        request: &RouteRequest<'_>,
        blocks: &Blocks,
        candidates: &mut Candidates,
        admission: Option<&Admission>,
    ) -> Result<(usize, u32), Error> {
        let Some(admission) = admission else {
            return self.choose_gated(request, blocks, candidates, &Open);
        };
        let choice = self.choose_gated(request, blocks, candidates, admission);
        if let Err(Error::Shed(shed)) = &choice {
            self.fleet.shed(shed);
        }
        choice
    }

    /// [`choose`](Self::choose) with the candidates passed through `gate`.
    ///
    /// For a policy offered the shortlist, its choice among every worker is made from the
    /// shortlist and asked of the gate alone: a gate keeping it keeps the choice the
    /// policy would make among the workers it keeps, so only a refused choice reads every
    /// worker.
    #[inline]
    fn choose_gated<G: Filter>(
        &self,
        request: &RouteRequest<'_>,
        blocks: &Blocks,
        candidates: &mut Candidates,
        gate: &G,
    ) -> Result<(usize, u32), Error> {
        let fleet_load = self.fleet_load();
        if blocks.is_empty() {
            self.fleet.candidates(candidates);
            if candidates.is_empty() {
                return Err(Error::NoWorkers);
            }
            for c in candidates.iter_mut() {
                c.set_fleet_load(fleet_load);
            }
            gate.filter(&self.fleet, (&self.policy, request), candidates)?;
            return Ok((self.select(request, candidates)?, 0));
        }
        let shortlist = self.policy.candidates() == CandidateSet::LeastLoadedPerMatch;
        if shortlist {
            let chosen = self
                .index
                .match_choose_insert_or(blocks, |holders, mirror| {
                    let offer = self.offer(request, fleet_load, mirror);
                    let deepest = deepest_of(holders);
                    let chosen =
                        self.choose_shortlisted(request, holders, candidates, offer, gate)?;
                    Ok(chosen.map(|chosen| ((chosen, deepest), candidates[chosen].worker)))
                })?;
            if let Some(chosen) = chosen {
                return Ok(chosen);
            }
            // The gate refused the shortlist's choice, or needs the policy's choice among
            // every worker: its rule reads them all, snapshotted outside the mirror's lock
            // (a refusal comes under overload, when the lock is busiest).
        }
        self.fleet.candidates(candidates);
        self.index.match_choose_insert(blocks, |holders, mirror| {
            let offer = self.offer(request, fleet_load, mirror);
            fill(candidates, holders);
            if candidates.is_empty() {
                return Err(Error::NoWorkers);
            }
            for c in candidates.iter_mut() {
                offer.complete(c);
            }
            gate.filter(&self.fleet, (&self.policy, request), candidates)?;
            let chosen = self.select(request, candidates)?;
            Ok(((chosen, deepest_of(holders)), candidates[chosen].worker))
        })
    }

    /// The policy's choice among the shortlist of `holders`' classes, widened to every
    /// worker that could cost less; for a policy that bounds its cost by load, made by its
    /// cost as its `select` would make it among every worker. `None` when `gate` does not
    /// pass the choice as it stands (see [`Filter::passes`]).
    #[inline]
    fn choose_shortlisted<G: Filter>(
        &self,
        request: &RouteRequest<'_>,
        holders: &[(WorkerId, crate::tree::Held)],
        candidates: &mut Candidates,
        offer: Offer<'_>,
        gate: &G,
    ) -> Result<Option<usize>, Error> {
        let mut classes = Classes::new();
        classes.group(holders);
        classes.shortlist(&self.fleet, request.key(), candidates);
        if candidates.is_empty() {
            return Err(Error::NoWorkers);
        }
        for c in candidates.iter_mut() {
            offer.complete(c);
        }
        let scoring = Scoring {
            policy: &self.policy,
            request,
            offer,
        };
        let (chosen, exact) = match classes.choose(&self.fleet, &scoring, candidates) {
            Some(chosen) => (chosen, true),
            None => (self.select(request, candidates)?, false),
        };
        let asking = (&self.policy as &dyn Policy, request);
        Ok(gate
            .passes(&self.fleet, asking, (candidates, chosen), exact)
            .then_some(chosen))
    }
}

/// The blocks the deepest of `holders` holds (holders come shallowest first).
#[inline]
fn deepest_of(holders: &[(WorkerId, crate::tree::Held)]) -> u32 {
    holders.last().map_or(0, |h| h.1.blocks)
}

impl<P: Policy> PolicyRouter<P> {
    /// The fleet's load, read once for every candidate of one route.
    #[inline]
    fn fleet_load(&self) -> f32 {
        self.fleet.load_share()
    }

    /// What `request`'s route writes into each candidate, the fleet's load `fleet_load`.
    #[inline]
    fn offer<'m>(
        &self,
        request: &RouteRequest<'_>,
        fleet_load: f32,
        mirror: crate::index::MirrorView<'m>,
    ) -> Offer<'m> {
        Offer {
            block_size: self.index.hasher().block_size(),
            tokens: request.tokens().len(),
            fleet_load,
            mirror,
        }
    }

    /// Every available worker as a candidate for `request` (its blocks `blocks`, hashed by
    /// [`hash`](Self::hash); its time moves the router's clock, as a route's does) with what
    /// the mirror predicts it holds, passed to `choose`,
    /// which returns its answer and the worker the prompt is recorded for.
    pub(crate) fn with_candidates<T>(
        &self,
        request: &RouteRequest<'_>,
        blocks: &Blocks,
        choose: impl FnOnce(&mut Candidates, u32) -> Result<(T, WorkerId), Error>,
    ) -> Result<T, Error> {
        if let Some(at) = request.time() {
            self.fleet.observe_time(at);
        }
        let mut candidates = Candidates::new();
        self.fleet.candidates(&mut candidates);
        if candidates.is_empty() {
            return Err(Error::NoWorkers);
        }
        let fleet_load = self.fleet_load();
        self.index.match_choose_insert(blocks, |holders, mirror| {
            let offer = self.offer(request, fleet_load, mirror);
            fill(&mut candidates, holders);
            for c in candidates.iter_mut() {
                offer.complete(c);
            }
            choose(&mut candidates, deepest_of(holders))
        })
    }

    /// The blocks of `request`'s prompt, as the mirror hashes them.
    pub(crate) fn hash(&self, request: &RouteRequest<'_>) -> Blocks {
        let mut blocks = Blocks::new();
        self.index.hash_request(request, &mut blocks);
        blocks
    }

    /// Charges `candidate`'s worker with `request` (see [`Fleet::commit`](crate::fleet::Fleet::commit)), with its rank.
    pub(crate) fn commit(
        &self,
        candidate: &Candidate,
        request: &RouteRequest<'_>,
        deepest: u32,
    ) -> Option<RouteDecision> {
        let decision = self.fleet.commit(candidate, request, (deepest, None))?;
        Some(decision.with_rank(self.layout.rank(candidate.worker)))
    }

    /// Counts a refusal made outside the route path (pair routing's admission).
    pub(crate) fn count_shed(&self, shed: &crate::request::Shed) {
        self.fleet.shed(shed);
    }

    /// Records that `worker` now holds `blocks`.
    pub(crate) fn credit(&self, worker: WorkerId, blocks: &[crate::hash::BlockHash]) {
        self.index.credit(worker, blocks);
    }

    /// Routes `request`, leaving in `candidates` what the policy chose from.
    pub(super) fn route_among(
        &self,
        request: &RouteRequest<'_>,
        candidates: &mut Candidates,
    ) -> Result<RouteDecision, Error> {
        if let Some(at) = request.time() {
            self.fleet.observe_time(at);
        }
        let mut blocks = Blocks::new();
        if self.policy.reads_cache() {
            self.index.hash_request(request, &mut blocks);
        }
        let admission = request
            .asks_admission()
            .then(|| Admission::of(request, self.fleet.config()));
        // A chosen worker can be removed before it is charged; choose again (bounded).
        for _ in 0..4 {
            let (chosen, deepest) =
                self.choose(request, &blocks, candidates, admission.as_ref())?;
            let candidate = &candidates[chosen];
            // The decision records the prediction admission checked of its worker.
            let checked = admission
                .as_ref()
                .map(|a| a.prediction(self.fleet.config(), candidate));
            let charge = (deepest, checked.as_ref());
            if let Some(decision) = self.fleet.commit(candidate, request, charge) {
                let mut decision = decision.with_rank(self.layout.rank(candidate.worker));
                if let Some(outbox) = &self.replica {
                    self.record_route(outbox, &blocks, &mut decision);
                }
                return Ok(decision);
            }
        }
        Err(Error::NoWorkers)
    }
}
