//! A disaggregated fleet on the batched engine
//! ([`Simulation::run_pd`](crate::sim::Simulation::run_pd)): each request routed through a
//! [`PdRouter`], run as vLLM's NIXL connector runs a disaggregated request.
//!
//! Glossary: a request's **decode leg** is the request on its decode worker; a split
//! request's **prefill leg** is its prompt with one output token on its prefill worker
//! (sequence `n + i` of a run of `n` requests, request `i`'s decode leg being `i`); the
//! **handoff** is the moment the prompt's KV is on the decode worker.
//!
//! What is modelled:
//! - an aggregated plan runs on its decode worker as in a plain run;
//! - a split plan's prefill leg runs on the prefill worker like any request, finding its
//!   cached prefix there and caching the prompt's blocks (its engine events tell the
//!   router); when it finishes, the KV the decode worker lacks moves: the prompt's tokens
//!   past the prefix the decode worker's pool holds at that moment (never its last token,
//!   as vLLM counts `prompt_len - num_computed_tokens`), times
//!   [`ClusterConfig::kv_bytes_per_token`](crate::sim::ClusterConfig::kv_bytes_per_token),
//!   at [`ClusterConfig::kv_transfer_bytes_per_s`](crate::sim::ClusterConfig::kv_transfer_bytes_per_s).
//!   The bytes are recomputed from the decode worker's true cache, not taken from the
//!   plan's [`PlanCost::transfer_bytes`](crate::PlanCost::transfer_bytes): that is the
//!   router's prediction from its mirror and its own bytes per token, and the simulator
//!   measures the truth the prediction is judged against;
//! - at the handoff the host calls [`PdRouter::prefill_done`] and the decode leg joins the
//!   decode worker's waiting queue with its prompt's KV present
//!   ([`Seq::remote_prefix`]): admitted, it takes its cached prefix as hits and blocks for
//!   the rest, computes only its last prompt token (a decode in the step) and samples its
//!   first token at the end of that step, when the loaded blocks become cached blocks of
//!   its pool (its engine events tell the router, as vLLM's do);
//! - time to first token runs from arrival to the decode leg's first token; time per
//!   output token and end to end come from the decode leg. The router learns each worker's
//!   speed from its own leg: the prefill worker's from routing to the prefill leg's end,
//!   an aggregated request's decode worker's from routing to its first token; a split
//!   request's decode leg teaches nothing ([`PdRouter::first_token_after`]);
//! - a split request's record names its prefill worker and the bytes moved; its cached
//!   tokens are those its prefill leg found. With [`SyncMode::Feedback`] the prefill leg
//!   (or an aggregated request) reports what it found; a decode leg reports nothing, the
//!   handoff having credited its worker with the prompt it then holds.
//!
//! What is left out:
//! - NIXL's asynchronous load: vLLM allocates the decode leg's blocks before the transfer,
//!   pins its local hits, and keeps stepping its other requests while the KV arrives; here
//!   the decode leg takes its blocks only after the transfer, so blocks it held locally and
//!   lost meanwhile are counted as loaded, not moved again;
//! - the prefill worker holding the prompt's blocks until the decode worker pulls them (or
//!   `VLLM_NIXL_ABORT_REQUEST_TIMEOUT` passes): here they are freed, still cached, when the
//!   prefill leg finishes;
//! - contention: every transfer runs at the full bandwidth whatever else moves on the link,
//!   with no topology (the router's [`Topology`](crate::Topology) is its own belief) and no
//!   setup or handshake latency;
//! - the first token the prefill leg samples is not sent to the client; the network between
//!   proxy and workers costs nothing;
//! - the decode worker's host tier is not asked for the pulled prompt; faults are refused by
//!   `run_pd`.

use std::time::Duration;

use super::super::config::SyncMode;
use super::super::replicas::Replicas;
use super::super::report::SimReport;
use super::super::scheduler::{Outcome, Seq, SeqId};
use super::super::simulation::Simulation;
use super::{HANDOFF, Run};
use crate::error::Error;
use crate::pd::{Decide, PairDecision, PdRouter};
use crate::router::Router;
use crate::tree::WorkerId;

/// Replays `sim` through `router`, whose inner router is `replicas`' only replica.
pub(in crate::sim) fn run(
    sim: &Simulation,
    replicas: Replicas<'_>,
    router: &PdRouter<Box<dyn Decide>>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimReport, Error> {
    Run::with_replicas_sinks(sim, replicas)
        .disaggregated(router)
        .drive(progress)
}

/// The disaggregated run's state beside the engine's.
pub(super) struct PdHost<'s> {
    router: &'s PdRouter<Box<dyn Decide>>,
    /// Request `i`'s routing until it finishes.
    pairs: Vec<Option<Pair>>,
    /// Requests whose KV is moving.
    in_transit: usize,
    kv_bytes_per_token: u64,
    bytes_per_s: f64,
}

impl PdHost<'_> {
    /// Whether some request's KV is moving.
    pub(super) fn moving(&self) -> bool {
        self.in_transit > 0
    }

    /// The request of sequence `id` and whether `id` is its prefill leg.
    fn leg(&self, id: SeqId) -> (usize, bool) {
        let n = self.pairs.len();
        if id >= n { (id - n, true) } else { (id, false) }
    }
}

/// A routed request.
struct Pair {
    decision: PairDecision,
    /// When it was routed, seconds.
    at: f64,
    /// The decode worker's index in the fleet.
    decode: usize,
    /// A split request's decode leg, until the handoff.
    decode_leg: Option<Seq>,
}

/// Seconds as a duration (0 for a negative time).
fn elapsed(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds.max(0.0))
}

impl<'s> Run<'s> {
    /// The same replay routing through `router` (see the module docs).
    pub(super) fn disaggregated(mut self, router: &'s PdRouter<Box<dyn Decide>>) -> Self {
        let n = self.sim.replayed().len();
        self.seqs.resize_with(2 * n, || None);
        self.tally.pd_decider = Some(router.decider_name().to_owned());
        self.pd = Some(PdHost {
            router,
            pairs: (0..n).map(|_| None).collect(),
            in_transit: 0,
            kv_bytes_per_token: self.sim.config().kv_bytes_per_token,
            bytes_per_s: self.sim.config().kv_transfer_bytes_per_s,
        });
        self
    }

    /// Routes request `i` arriving at `now` to a pair and queues its first leg: the prefill
    /// leg on the prefill worker when split, else the request on its decode worker.
    pub(super) fn dispatch_pair(&mut self, i: usize, now: f64) -> Result<(), Error> {
        let Some(router) = self.pd.as_ref().map(|pd| pd.router) else {
            return Ok(());
        };
        let sim = self.sim;
        let tokens = sim.prompt(i);
        let (request, priority) = sim.admitted_request(i, &tokens, now);
        self.tally.asked(i, priority);
        let started = sim
            .config()
            .measure_decision_time
            .then(std::time::Instant::now);
        let decision = match router.route_pair(&request) {
            Ok(decision) => decision,
            Err(Error::Shed(shed)) => {
                self.tally.shed(i, now, tokens.len(), shed.gate);
                self.clock.ended(i, now);
                return Ok(());
            }
            Err(e) => return Err(e),
        };
        if let Some(started) = started {
            self.tally.timed(i, started.elapsed().as_nanos());
        }
        let decode = decision.decode().worker();
        let prefill = decision
            .prefill()
            .map(crate::request::RouteDecision::worker);
        let workers = self.workers.len();
        if let Some(w) = [Some(decode), prefill]
            .into_iter()
            .flatten()
            .find(|w| w.index() >= workers)
        {
            router.complete(&decision);
            return Err(Error::UnknownWorker(w));
        }
        let blocks = sim.hasher().hash(&tokens);
        // A split request's prediction is its plan's (the decode leg's decision sees only
        // its own leg); an aggregated one's is its decision's, as a plain router's.
        let predicted = if decision.is_split() {
            let plan = decision.cost();
            (plan.ttft_s, plan.tpot_s)
        } else {
            let d = decision.decode();
            (d.predicted_ttft_s(), d.predicted_tpot_s())
        };
        self.tally
            .routed(i, (now, tokens.len()), (decode.get(), 0), predicted);
        let output = sim.replayed()[i].output_tokens;
        let (w, id, decode_leg) = match prefill {
            None => {
                self.seqs[i] = Some(Seq::new(tokens, blocks, output));
                (decode.index(), i, None)
            }
            Some(p) => {
                let mut leg = Seq::new(tokens.clone(), blocks.clone(), output);
                leg.remote_prefix = true;
                let n = sim.replayed().len();
                self.seqs[n + i] = Some(Seq::new(tokens, blocks, 1));
                (p.index(), n + i, Some(leg))
            }
        };
        if let Some(pd) = self.pd.as_mut() {
            pd.pairs[i] = Some(Pair {
                decision,
                at: now,
                decode: decode.index(),
                decode_leg,
            });
        }
        self.workers[w].scheduler.enqueue(id);
        if self.workers[w].step.is_none() {
            self.start_or_defer(w, now)?;
        }
        Ok(())
    }

    /// What outcome `o` of worker `w` at `now` means to the router and the tally.
    pub(super) fn handle_leg(&mut self, o: Outcome, w: usize, now: f64) -> Result<(), Error> {
        let Some(pd) = self.pd.as_ref() else {
            return Ok(());
        };
        match o {
            Outcome::Admitted { seq, hit, host } => {
                return self.leg_admitted(seq, w, now, hit, host);
            }
            Outcome::FirstToken(id) => self.leg_first_token(id, now),
            Outcome::Finished(id) => self.leg_finished(id, w, now),
            Outcome::Progress(id) => self.leg_progress(id, now),
            Outcome::Preempted(id) => self.tally.preempted(pd.leg(id).0),
            Outcome::Rejected(id) => {
                let i = pd.leg(id).0;
                self.tally.rejected(i);
                self.seqs[id] = None;
                self.finish_pair(i);
                self.clock.ended(i, now);
            }
        }
        Ok(())
    }

    /// Sequence `id` was first admitted on worker `w` at `now`, finding `hit` prompt tokens
    /// cached (`host` from the host tier): the request's admission, unless its prefill leg
    /// was admitted first; feedback from any leg but a split request's decode leg.
    fn leg_admitted(
        &mut self,
        id: SeqId,
        w: usize,
        now: f64,
        hit: usize,
        host: usize,
    ) -> Result<(), Error> {
        let Some(pd) = self.pd.as_ref() else {
            return Ok(());
        };
        let (i, prefill_leg) = pd.leg(id);
        self.tally.admitted(i, now, hit, host);
        let split = pd.pairs[i].as_ref().is_some_and(|p| p.decision.is_split());
        if (split && !prefill_leg) || self.sim.config().sync != SyncMode::Feedback {
            return Ok(());
        }
        let (Some(sync), Some(seq)) = (pd.router.router().cache_sync(), self.seqs[id].as_ref())
        else {
            return Ok(());
        };
        sync.report_cached(WorkerId::new(w as u32), &seq.prompt, hit)
    }

    /// Sequence `id` sampled its first token at `now`: the request's first token when it is
    /// the decode leg. The router hears it for the leg's own decision.
    fn leg_first_token(&mut self, id: SeqId, now: f64) {
        let Some(pd) = self.pd.as_ref() else {
            return;
        };
        let (i, prefill_leg) = pd.leg(id);
        let Some(pair) = pd.pairs[i].as_ref() else {
            return;
        };
        let router = pd.router;
        if prefill_leg {
            router.prefill_first_token_after(&pair.decision, elapsed(now - pair.at));
        } else {
            self.tally.first_token(i, now);
            router.first_token_after(&pair.decision, elapsed(now - pair.at));
        }
    }

    /// Sequence `id` streamed more of its answer by `now`: a decode leg's host reports its
    /// progress to the decode worker.
    fn leg_progress(&mut self, id: SeqId, now: f64) {
        let Some(pd) = self.pd.as_ref() else {
            return;
        };
        let (i, prefill_leg) = pd.leg(id);
        let generated = self.seqs[id].as_ref().map_or(0, |s| s.generated);
        if let (false, Some(pair), Some(first)) = (
            prefill_leg,
            pd.pairs[i].as_ref(),
            self.tally.first_token_at(i),
        ) {
            let decoded = elapsed((now - first).max(0.0));
            pd.router
                .tokens_after(&pair.decision, generated.saturating_sub(1), decoded);
        }
    }

    /// Sequence `id` finished on worker `w` at `now`: a decode leg completes its request; a
    /// prefill leg starts its KV's move to the decode worker (see the module docs).
    fn leg_finished(&mut self, id: SeqId, w: usize, now: f64) {
        let Some(pd) = self.pd.as_mut() else {
            return;
        };
        let (i, prefill_leg) = pd.leg(id);
        self.seqs[id] = None;
        if !prefill_leg {
            let output = self.sim.replayed()[i].output_tokens.max(1);
            self.tally.finished(i, now, output);
            // The host streamed the answer: its output tokens teach the decode worker.
            if let (Some(pair), Some(first)) = (pd.pairs[i].as_ref(), self.tally.first_token_at(i))
            {
                let decoded = elapsed((now - first).max(0.0));
                pd.router.tokens_after(&pair.decision, output - 1, decoded);
            }
            self.finish_pair(i);
            self.clock.ended(i, now);
            return;
        }
        let Some(pair) = pd.pairs[i].as_ref() else {
            return;
        };
        let Some(leg) = pair.decode_leg.as_ref() else {
            return;
        };
        let held = self.workers[pair.decode]
            .scheduler
            .pool_prefix_tokens(&leg.hashes, leg.prompt.len());
        let bytes = (leg.prompt.len() - held) as u64 * pd.kv_bytes_per_token;
        pd.in_transit += 1;
        self.tally.transferred(i, w as u32, bytes);
        let seconds = bytes as f64 / pd.bytes_per_s;
        self.clock.schedule(now + seconds, HANDOFF, i);
    }

    /// Request `i`'s KV is on its decode worker at `now`: the router hears the handoff, and
    /// the decode leg joins the worker's queue.
    pub(super) fn handoff(&mut self, i: usize, now: f64) -> Result<(), Error> {
        let Some(pd) = self.pd.as_mut() else {
            return Ok(());
        };
        pd.in_transit = pd.in_transit.saturating_sub(1);
        let Some(pair) = pd.pairs[i].as_mut() else {
            return Ok(());
        };
        pd.router.prefill_done(&pair.decision);
        let Some(leg) = pair.decode_leg.take() else {
            return Ok(());
        };
        let w = pair.decode;
        self.seqs[i] = Some(leg);
        self.workers[w].scheduler.enqueue(i);
        if self.workers[w].step.is_none() {
            self.start_or_defer(w, now)?;
        }
        Ok(())
    }

    /// Request `i` is done (finished or dropped): the router releases both sides.
    fn finish_pair(&mut self, i: usize) {
        if let Some(pd) = self.pd.as_mut() {
            if let Some(pair) = pd.pairs[i].take() {
                pd.router.complete(&pair.decision);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::requests;
    use super::*;
    use crate::index::{CacheIndex, IndexConfig};
    use crate::pd::{AlwaysSplit, ByCost, PdConfig, Role};
    use crate::sim::{BatchConfig, ClusterConfig, WorkerSpec};
    use proptest::prelude::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// On a disaggregated fleet of small pools (evictions, preemptions, rejections), a
        /// mirror fed only every worker's engine events predicts exactly the prefix each
        /// pool would give every prompt, after every tick: the blocks a decode leg loads
        /// are cached and published as computed ones are.
        #[test]
        fn events_keep_a_mirror_equal_to_every_pool_when_kv_moves(
            requests in requests(),
            roles in proptest::collection::vec(0usize..3, 2..5),
            blocks in 2usize..12,
            budget in 4usize..24,
            by_cost in any::<bool>(),
        ) {
            let mut roles: Vec<Role> = roles.into_iter().map(|r| Role::ALL[r]).collect();
            roles[0] = Role::Prefill;
            roles[1] = Role::Decode;
            let fleet: Vec<WorkerSpec> = roles
                .iter()
                .map(|&r| WorkerSpec::new(1.0, blocks * 4).with_role(r))
                .collect();
            let batch = BatchConfig::default()
                .with_step(crate::fleet::StepModel::default().with_max_num_batched_tokens(budget));
            let config = ClusterConfig::default()
                .with_block_size(4)
                .with_engine(crate::sim::Engine::Batched)
                .with_kv_transfer_bytes_per_s(1e8)
                .with_measure_decision_time(false)
                .with_batch(batch);
            let sim = Simulation::with_fleet(requests, config, fleet).unwrap();
            let decider: Box<dyn Decide> = if by_cost { Box::new(ByCost) } else { Box::new(AlwaysSplit) };
            let mut pd = PdConfig::default();
            pd.balanced.index = pd.balanced.index.with_block_size(4);
            let router = PdRouter::with_decider(&roles, pd, decider).unwrap();
            let inner: [&dyn Router; 1] = [router.router()];
            let replicas = Replicas::new(&inner, sim.config()).unwrap();
            let mirror = CacheIndex::new(IndexConfig::default().with_block_size(4)).unwrap();
            let mut run = Run::new(&sim, replicas, vec![Some(&mirror)]).disaggregated(&router);
            while let Some((now, tick)) = run.clock.next() {
                run.tick(now, tick).unwrap();
                let arrived = run.clock.arrived();
                for w in 0..roles.len() {
                    for i in 0..arrived {
                        let tokens = sim.prompt(i);
                        let hashes = sim.hasher().hash(&tokens);
                        let truth = run.workers[w].scheduler.cached_prefix(&hashes) * 4;
                        let id = WorkerId::new(w as u32);
                        let predicted = mirror.cached_tokens(id, &[], &tokens);
                        prop_assert_eq!(predicted, truth, "worker {} at {}", w, now);
                    }
                }
            }
            let moved = run.pd.as_ref().map_or(1, |pd| pd.in_transit);
            prop_assert_eq!(moved, 0);
            let report = run.report();
            prop_assert_eq!(report.requests, sim.requests().len());
            let done = report.request_records.iter().all(|r| r.e2e_s.is_some() || r.rejected);
            prop_assert!(done, "every request finished or was dropped");
        }
    }
}
