//! [`PolicyRouter`] as a [`Router`] and as the [`CacheSync`] of its mirror.

use super::Router;
use super::policy::Policy;
use super::policy_router::PolicyRouter;
use crate::error::Error;
use crate::fleet::{Candidates, EngineLoad, FleetSignals, WorkerLoad, WorkerProfile};
use crate::hash::TokenId;
use crate::replica::{Drained, ReplicaOutcome, ReplicaStats};
use crate::request::{RouteDecision, RouteRequest};
use crate::router::{Receipt, ReceiptLine};
use crate::sync::{CacheEvent, CacheSync, EngineSettings, SyncOutcome};
use crate::tree::{Tier, WorkerId};

impl<P: Policy> Router for PolicyRouter<P> {
    fn route(&self, request: &RouteRequest<'_>) -> Result<RouteDecision, Error> {
        self.route_among(request, &mut Candidates::new())
    }

    fn route_with_receipt(
        &self,
        request: &RouteRequest<'_>,
    ) -> Result<(RouteDecision, Receipt), Error> {
        let mut candidates = Candidates::new();
        let decision = self.route_among(request, &mut candidates)?;
        let costs = self.policy.costs(request, &candidates);
        let lines = candidates
            .iter()
            .zip(costs)
            .map(|(c, cost)| ReceiptLine {
                worker: c.worker,
                requests: c.requests(),
                prefill_tokens: c.prefill_tokens(),
                cached_tokens: Tier::ALL.map(|t| c.cached_tokens_at(t)),
                cost,
            })
            .collect();
        let receipt = Receipt {
            policy: self.policy.name(),
            chosen: decision.worker(),
            prompt_tokens: request.tokens().len(),
            candidates: lines,
        };
        Ok((decision, receipt))
    }

    fn complete(&self, decision: &RouteDecision) {
        self.fleet.release(decision);
        self.record_mark(decision, true);
    }

    fn first_token(&self, decision: &RouteDecision) {
        self.fleet.prefilled(decision, None);
        self.record_mark(decision, false);
    }

    fn first_token_after(&self, decision: &RouteDecision, elapsed: std::time::Duration) {
        self.fleet.prefilled(decision, Some(elapsed));
        self.record_mark(decision, false);
    }

    fn tokens_after(&self, decision: &RouteDecision, tokens: u32, elapsed: std::time::Duration) {
        self.fleet.decoded(decision, tokens, elapsed);
    }

    fn set_profile(&self, worker: WorkerId, profile: WorkerProfile) -> Result<(), Error> {
        self.fleet.set_profile(worker, profile)
    }

    fn add_worker(&self, worker: WorkerId) -> Result<(), Error> {
        self.fleet.add(worker)?;
        self.index.reset_worker(worker);
        self.policy.worker_added(worker);
        Ok(())
    }

    fn remove_worker(&self, worker: WorkerId) -> Result<(), Error> {
        self.fleet.remove(worker)?;
        self.index.reset_worker(worker);
        self.policy.worker_removed(worker);
        Ok(())
    }

    fn set_available(&self, worker: WorkerId, available: bool) -> Result<(), Error> {
        self.fleet.set_available(worker, available)
    }

    fn report_load(&self, worker: WorkerId, load: EngineLoad) -> Result<(), Error> {
        self.fleet.report_load(worker, load)
    }

    fn load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        self.fleet.load(worker)
    }

    fn fleet_signals(&self) -> FleetSignals {
        self.fleet.signals()
    }

    fn workers(&self) -> Vec<WorkerId> {
        self.fleet.workers()
    }

    fn name(&self) -> &'static str {
        self.policy.name()
    }

    fn block_size(&self) -> Option<usize> {
        self.policy
            .reads_cache()
            .then(|| self.index.hasher().block_size())
    }

    fn cache_sync(&self) -> Option<&dyn CacheSync> {
        self.policy.reads_cache().then_some(self as &dyn CacheSync)
    }

    fn drain_replica_sync(&self, out: &mut Vec<u8>, max_bytes: usize) -> Drained {
        self.drain(out, max_bytes)
    }

    fn apply_replica_sync(
        &self,
        frame: &[u8],
        now: std::time::Duration,
    ) -> Result<ReplicaOutcome, Error> {
        self.apply(frame, now)
    }

    fn replica_sync_stats(&self) -> Option<ReplicaStats> {
        self.stats()
    }
}

/// Checks that the worker is registered, then feeds the mirror.
impl<P: Policy> CacheSync for PolicyRouter<P> {
    fn apply_event(
        &self,
        worker: WorkerId,
        seq: u64,
        event: &CacheEvent,
    ) -> Result<SyncOutcome, Error> {
        self.fleet.check(worker)?;
        self.index.apply_event(worker, seq, event)
    }

    fn replace_worker_cache(&self, worker: WorkerId, prefixes: &[&[TokenId]]) -> Result<(), Error> {
        self.fleet.check(worker)?;
        self.index.replace_worker_cache(worker, prefixes)
    }

    fn report_cached(
        &self,
        worker: WorkerId,
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(), Error> {
        self.report_cached_salted(worker, &[], tokens, cached_tokens)
    }

    fn report_cached_salted(
        &self,
        worker: WorkerId,
        salt: &[u8],
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(), Error> {
        self.fleet.check(worker)?;
        let (predicted, reported) = self.index.report(worker, salt, tokens, cached_tokens)?;
        self.fleet.reported(worker, predicted, reported);
        Ok(())
    }

    fn set_engine_settings(
        &self,
        worker: WorkerId,
        settings: &EngineSettings,
    ) -> Result<(), Error> {
        self.fleet.check(worker)?;
        self.index.set_engine_settings(worker, settings)
    }
}
