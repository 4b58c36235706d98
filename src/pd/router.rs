//! [`PdRouter`]: pair routing over role-tagged workers, on the crate's mirror and load model.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::decide::{ByCost, Decide};
use super::plan::{PairView, Plan, PlanCost};
use super::receipt::PairReceipt;
use super::role::Role;
use super::sides::Sides;
use super::targets::RunningTargets;
use super::topology::Topology;
use crate::error::Error;
use crate::fleet::Candidate;
use crate::hash::BlockHash;
use crate::policies::{BalancedConfig, BalancedRouter};
use crate::request::{Priority, RouteDecision, RouteRequest};
use crate::router::Admission;
use crate::router::Router;
use crate::tree::WorkerId;

/// How a [`PdRouter`] costs plans.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct PdConfig {
    /// The load model and the mirror's settings, as for [`BalancedRouter`]. Default:
    /// [`BalancedConfig`]'s, reading a fresh report's pending prefill
    /// ([`LoadConfig::prefill_from_report`](crate::LoadConfig::prefill_from_report)).
    pub balanced: BalancedConfig,
    /// Bytes of KV a prompt token takes (2 × layers × KV heads × head size × bytes per
    /// value: Llama-3-8B in BF16, 131,072). Default 131,072.
    pub kv_bytes_per_token: u64,
    /// Where the workers sit and how fast KV moves between them.
    pub topology: Topology,
    /// What a second of delay added to each running decode where a request prefills weighs
    /// against a second of the request's own time ([`PlanCost::harm_s`]). The delay is
    /// spread over the decodes' remaining output, so it weighs less than the request's own
    /// wait; 1 counts it alike. Default 0.05.
    pub stall_weight: f64,
    /// The time-per-output-token target of a request that carries none
    /// ([`RouteRequest::with_tpot_target`]). A request's target, and those of the requests
    /// decoding on a worker, bound the time per output token of the decodes running there
    /// when a request prefills there: an aggregated plan predicted to stretch it past the
    /// tightest of them (the load model's time per output token, the prefill queued there
    /// spread over a request's output, as admission predicts it) is priced out (infinite
    /// harm), and taken only when no other plan is allowed. Default `None`: requests without
    /// a target bound nothing, and a stall is weighed as harm only.
    pub decode_step_limit_s: Option<f64>,
}

impl Default for PdConfig {
    fn default() -> Self {
        let mut balanced = BalancedConfig::default();
        balanced.load.prefill_from_report = true;
        Self {
            balanced,
            kv_bytes_per_token: 131_072,
            topology: Topology::default(),
            stall_weight: 0.05,
            decode_step_limit_s: None,
        }
    }
}

impl PdConfig {
    crate::config::setters! {
        /// Sets [`balanced`](Self::balanced).
        with_balanced: balanced: BalancedConfig;
        /// Sets [`kv_bytes_per_token`](Self::kv_bytes_per_token).
        with_kv_bytes_per_token: kv_bytes_per_token: u64;
        /// Sets [`topology`](Self::topology).
        with_topology: topology: Topology;
        /// Sets [`stall_weight`](Self::stall_weight).
        with_stall_weight: stall_weight: f64;
        /// Sets [`decode_step_limit_s`](Self::decode_step_limit_s).
        with_decode_step_limit_s: decode_step_limit_s: Option<f64>;
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a field out of its range.
    pub fn validate(&self) -> Result<(), Error> {
        self.balanced.validate()?;
        self.topology.validate()?;
        crate::config::float(
            "stall_weight",
            self.stall_weight,
            0.0..=f64::MAX,
            "0 or more",
        )?;
        if let Some(limit) = self.decode_step_limit_s {
            crate::config::float(
                "decode_step_limit_s",
                limit,
                f64::MIN_POSITIVE..=f64::MAX,
                "above 0",
            )?;
        }
        if self.kv_bytes_per_token == 0 {
            return Err(crate::config::invalid("kv_bytes_per_token", 0, "above 0"));
        }
        Ok(())
    }
}

/// A pair routing's answer: the decode worker (charged with the request's decode, and with
/// its prefill when aggregated), the prefill worker when split (charged with the prefill),
/// the plan's predicted cost, and the prompt's blocks for the handoff.
#[derive(Debug)]
pub struct PairDecision {
    decode: RouteDecision,
    prefill: Option<RouteDecision>,
    cost: PlanCost,
    blocks: Vec<BlockHash>,
    handed_off: AtomicBool,
    /// The time-per-output-token target the request decodes under, in whole nanoseconds,
    /// counted among its decode worker's until the request completes (`released`).
    tpot_target_ns: Option<u64>,
    released: AtomicBool,
}

impl PairDecision {
    /// The decode worker's decision.
    #[must_use]
    pub fn decode(&self) -> &RouteDecision {
        &self.decode
    }

    /// The prefill worker's decision, when the request is split.
    #[must_use]
    pub fn prefill(&self) -> Option<&RouteDecision> {
        self.prefill.as_ref()
    }

    /// Whether the request is split (prefilled on another worker).
    #[must_use]
    pub fn is_split(&self) -> bool {
        self.prefill.is_some()
    }

    /// The plan's predicted cost.
    #[must_use]
    pub fn cost(&self) -> PlanCost {
        self.cost
    }
}

/// Routes requests on a fleet whose workers prefill, decode or both ([`Role`]): each
/// request to a decode worker, prefilled there or on a prefill worker whose KV then moves
/// to it, as the decider `D` chooses ([`ByCost`] by default: the plan of least predicted
/// time to first token, decode time and stall to others, no threshold).
///
/// It keeps one mirror and one load model for the whole fleet (a [`BalancedRouter`]'s), so a
/// prompt prefilled on a prefill worker is predicted cached there, and, once the host says
/// the handoff is done ([`prefill_done`](Self::prefill_done)), on the decode worker too:
/// the next turn of the conversation can then go aggregated to that worker.
///
/// ```
/// use prefix_router::{PdConfig, PdRouter, Role, RouteRequest, Router};
///
/// let roles = [Role::Prefill, Role::Decode, Role::Decode];
/// let router = PdRouter::new(&roles, PdConfig::default())?;
/// let prompt: Vec<u32> = (0..4_096).collect();
/// let request = RouteRequest::new(&prompt).with_expected_output(64);
/// let pair = router.route_pair(&request)?;
/// assert_ne!(pair.decode().worker().index(), 0, "a prefill worker never decodes");
/// router.prefill_done(&pair);
/// router.complete(&pair);
/// # Ok::<(), prefix_router::Error>(())
/// ```
pub struct PdRouter<D = ByCost> {
    inner: BalancedRouter,
    roles: Vec<Role>,
    config: PdConfig,
    decider: D,
    /// By worker: requests routed split to it whose handoff has not come.
    arriving: Vec<AtomicU64>,
    /// By worker: the time-per-output-token targets of the requests decoding there.
    running: RunningTargets,
}

impl PdRouter<ByCost> {
    /// A router over workers `0..roles.len()` with those roles, deciding by cost.
    ///
    /// # Errors
    ///
    /// As [`with_decider`](Self::with_decider).
    pub fn new(roles: &[Role], config: PdConfig) -> Result<Self, Error> {
        Self::with_decider(roles, config, ByCost)
    }
}

impl<D: Decide> PdRouter<D> {
    /// A router over workers `0..roles.len()` with those roles, deciding with `decider`.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] when no worker decodes, or for a setting out of range.
    pub fn with_decider(roles: &[Role], config: PdConfig, decider: D) -> Result<Self, Error> {
        if !roles.iter().any(|r| r.decodes()) {
            return Err(crate::config::invalid(
                "roles",
                format!("{} prefill workers", roles.len()),
                "at least one worker that decodes",
            ));
        }
        config.validate()?;
        let n = u32::try_from(roles.len())
            .map_err(|_| crate::config::invalid("roles", roles.len(), "fewer than 2^32 workers"))?;
        let inner = BalancedRouter::with_config(n, config.balanced)?;
        Ok(Self {
            inner,
            roles: roles.to_vec(),
            config,
            decider,
            arriving: roles.iter().map(|_| AtomicU64::new(0)).collect(),
            running: RunningTargets::new(roles.len()),
        })
    }

    /// The router underneath, for load reports, events and profiles
    /// ([`Router::report_load`], [`Router::apply_event`](crate::CacheSync), ...).
    #[must_use]
    pub fn router(&self) -> &BalancedRouter {
        &self.inner
    }

    /// `worker`'s role.
    #[must_use]
    pub fn role(&self, worker: WorkerId) -> Option<Role> {
        self.roles.get(worker.index()).copied()
    }

    /// The decider's name.
    #[must_use]
    pub fn decider_name(&self) -> &'static str {
        self.decider.name()
    }

    /// Routes `request` to a pair (or one decode worker), charging each side.
    ///
    /// A request with a target ([`RouteRequest::with_ttft_target`],
    /// [`with_tpot_target`](RouteRequest::with_tpot_target)) is admitted as
    /// [`Router::route`] admits one, by plans instead of workers: it runs the decider's plan
    /// when that plan is predicted to meet the targets (a sheddable request held to
    /// [`AdmissionConfig::sheddable_share`](crate::AdmissionConfig::sheddable_share) of
    /// them, an oversized prompt served where the rest of its time is within
    /// [`AdmissionConfig::oversized_wait_share`](crate::AdmissionConfig::oversized_wait_share)
    /// of the target), else the cheapest plan that is, else it is refused; a critical
    /// request is never refused.
    ///
    /// # Errors
    ///
    /// [`Error::NoWorkers`] when no worker is available; [`Error::Shed`] when admission
    /// refuses the request (nothing is charged); [`Error::WrongRole`] when the decider chose
    /// a plan the roles forbid; [`Error::InvalidChoice`] for an index outside the
    /// candidates.
    pub fn route_pair(&self, request: &RouteRequest<'_>) -> Result<PairDecision, Error> {
        self.route_pair_explained(request, false)
            .map(|(pair, _)| pair)
    }

    /// [`route_pair`](Self::route_pair), with a [`PairReceipt`]: every plan the roles
    /// allowed and its predicted cost, the decider's choice and the plan that ran.
    ///
    /// # Errors
    ///
    /// As [`route_pair`](Self::route_pair).
    pub fn route_pair_with_receipt(
        &self,
        request: &RouteRequest<'_>,
    ) -> Result<(PairDecision, PairReceipt), Error> {
        let (pair, receipt) = self.route_pair_explained(request, true)?;
        let receipt = receipt.ok_or(Error::NoWorkers)?;
        Ok((pair, receipt))
    }

    /// Routes `request`, with a receipt when `explain`.
    fn route_pair_explained(
        &self,
        request: &RouteRequest<'_>,
        explain: bool,
    ) -> Result<(PairDecision, Option<PairReceipt>), Error> {
        let blocks = self.inner.hash(request);
        let admission = (request.asks_admission() && request.priority() != Priority::Critical)
            .then(|| Admission::of(request, self.inner.load_config()));
        let (cost, chosen, deepest, receipt) =
            self.inner
                .with_candidates(request, &blocks, |candidates, deepest| {
                    if !candidates.iter().any(|c| self.role_of(c).decodes()) {
                        return Err(Error::NoWorkers);
                    }
                    let roles: Vec<Role> = candidates.iter().map(|c| self.role_of(c)).collect();
                    let arriving: Vec<u64> = candidates
                        .iter()
                        .map(|c| self.arriving(c.worker()))
                        .collect();
                    let sides = Sides::all(request, candidates, self.inner.load_config());
                    let step_limits = self.step_limits(request, candidates);
                    let view = PairView {
                        request,
                        candidates,
                        roles: &roles,
                        topology: &self.config.topology,
                        kv_bytes_per_token: self.config.kv_bytes_per_token,
                        stall_weight: self.config.stall_weight,
                        arriving: &arriving,
                        sides: &sides,
                        step_limits: &step_limits,
                    };
                    let decided = self.decider.decide(request, &view);
                    self.check(decided, candidates)?;
                    let plan = match &admission {
                        Some(admission) => self.admit(admission, &view, decided)?,
                        None => decided,
                    };
                    let receipt = explain
                        .then(|| PairReceipt::of(&view, self.decider.name(), (decided, plan)));
                    let cost = view.cost(plan);
                    // The chosen two only: the rest of the snapshot is not needed again.
                    let decode = candidates[plan.decode()];
                    let prefill = plan.prefill().map(|p| candidates[p]);
                    let cached_at = prefill.unwrap_or(decode).worker();
                    Ok(((cost, (decode, prefill), deepest, receipt), cached_at))
                })?;
        let pair = self.charge(request, chosen, deepest, (cost, blocks.to_vec()))?;
        Ok((pair, receipt))
    }

    /// The plan a request asking for admission runs: the decider's when it is predicted to
    /// meet the targets, else the cheapest that is ([`PlanCost::total_s`]).
    ///
    /// # Errors
    ///
    /// [`Error::Shed`], counted in the fleet's signals, when no plan is; it names the
    /// decode worker of the plan nearest to meeting them.
    fn admit(&self, admission: &Admission, view: &PairView<'_>, plan: Plan) -> Result<Plan, Error> {
        let times = |c: &PlanCost| (c.ttft_s, c.prefill_s, c.tpot_s);
        let meets = |c: &PlanCost| {
            let (ttft, own, tpot) = times(c);
            admission.meets_times(ttft, own, tpot)
        };
        if meets(&view.cost(plan)) {
            return Ok(plan);
        }
        let costs: Vec<(Plan, PlanCost)> = view.plans().map(|p| (p, view.cost(p))).collect();
        let cheapest_meeting = costs
            .iter()
            .filter(|(_, c)| meets(c))
            .min_by(|a, b| a.1.total_s().total_cmp(&b.1.total_s()));
        if let Some((plan, _)) = cheapest_meeting {
            return Ok(*plan);
        }
        let nearest = costs.iter().min_by(|a, b| {
            let distance = |c: &PlanCost| admission.distance_of(c.ttft_s, c.tpot_s);
            distance(&a.1).total_cmp(&distance(&b.1))
        });
        let Some((best, cost)) = nearest else {
            return Err(Error::NoWorkers);
        };
        let worker = view.candidates()[best.decode()].worker();
        let shed = admission.refusal(times(cost), worker);
        self.inner.count_shed(&shed);
        Err(Error::Shed(shed))
    }

    /// Requests routed split to `worker` whose handoff has not come.
    fn arriving(&self, worker: WorkerId) -> u64 {
        self.arriving
            .get(worker.index())
            .map_or(0, |a| a.load(Relaxed))
    }

    /// Counts a split request's decode leg on its way to `worker`, or (`arrived`) no
    /// longer: handed off, or dropped before.
    fn on_the_way(&self, worker: WorkerId, arrived: bool) {
        if let Some(a) = self.arriving.get(worker.index()) {
            if arrived {
                let _ = a.fetch_update(Relaxed, Relaxed, |n| Some(n.saturating_sub(1)));
            } else {
                a.fetch_add(1, Relaxed);
            }
        }
    }

    /// The role of `c`'s worker.
    fn role_of(&self, c: &Candidate) -> Role {
        self.role(c.worker()).unwrap_or_default()
    }

    /// Refuses a plan outside the candidates or against the roles.
    fn check(&self, plan: Plan, candidates: &[Candidate]) -> Result<(), Error> {
        let at = |i: usize| {
            candidates.get(i).ok_or(Error::InvalidChoice {
                policy: self.decider.name(),
                index: i,
                candidates: candidates.len(),
            })
        };
        let wrong = |c: &Candidate, wanted| Error::WrongRole {
            worker: c.worker(),
            role: self.role_of(c).name(),
            wanted,
        };
        let d = at(plan.decode())?;
        if !self.role_of(d).decodes() {
            return Err(wrong(d, "decode"));
        }
        if let Some(p) = plan.prefill() {
            let p = at(p)?;
            if p.worker() == d.worker() {
                return Err(wrong(p, "prefill for itself as a pair"));
            }
            if !self.role_of(p).prefills_for_others() {
                return Err(wrong(p, "prefill for another worker"));
            }
        }
        Ok(())
    }

    /// Charges the plan's workers: the prefill worker with the prompt and one output token,
    /// the decode worker with the request (its prompt counted cached when split).
    fn charge(
        &self,
        request: &RouteRequest<'_>,
        (mut d, prefill): (Candidate, Option<Candidate>),
        deepest: u32,
        (cost, blocks): (PlanCost, Vec<BlockHash>),
    ) -> Result<PairDecision, Error> {
        let prefill = match prefill {
            None => None,
            Some(p) => {
                d.assume_cached(request.tokens().len());
                let leg = request.with_expected_output(1);
                Some(
                    self.inner
                        .commit(&p, &leg, deepest)
                        .ok_or(Error::NoWorkers)?,
                )
            }
        };
        let Some(decode) = self.inner.commit(&d, request, deepest) else {
            if let Some(p) = &prefill {
                self.inner.complete(p);
            }
            return Err(Error::NoWorkers);
        };
        if prefill.is_some() {
            self.on_the_way(decode.worker(), false);
        }
        let tpot_target_ns = self.tpot_target_s(request).map(|s| (s * 1e9) as u64);
        if let Some(ns) = tpot_target_ns {
            self.running.add(decode.worker(), ns);
        }
        Ok(PairDecision {
            decode,
            prefill,
            cost,
            blocks,
            handed_off: AtomicBool::new(false),
            tpot_target_ns,
            released: AtomicBool::new(false),
        })
    }

    /// The time-per-output-token target `request` is held to: its own, else the
    /// configured default.
    fn tpot_target_s(&self, request: &RouteRequest<'_>) -> Option<f64> {
        let own = request.tpot_target().map(|t| t.as_secs_f64());
        own.or(self.config.decode_step_limit_s)
    }

    /// By candidate: the tightest time-per-output-token target of `request` and of the
    /// requests decoding there.
    fn step_limits(
        &self,
        request: &RouteRequest<'_>,
        candidates: &[Candidate],
    ) -> Vec<Option<f64>> {
        let own = self.tpot_target_s(request);
        candidates
            .iter()
            .map(|c| match (own, self.running.tightest_s(c.worker())) {
                (Some(a), Some(b)) => Some(a.min(b)),
                (a, b) => a.or(b),
            })
            .collect()
    }

    /// The prefill is done and its KV is on the decode worker: the prefill worker's load is
    /// released, and the decode worker's mirror is credited with the prompt. Once per
    /// decision; a no-op for an aggregated one.
    pub fn prefill_done(&self, pair: &PairDecision) {
        let Some(prefill) = &pair.prefill else {
            return;
        };
        if pair.handed_off.swap(true, Relaxed) {
            return;
        }
        self.on_the_way(pair.decode.worker(), true);
        self.inner.complete(prefill);
        self.inner.credit(pair.decode.worker(), &pair.blocks);
    }

    /// The decode worker's first token came (see [`Router::first_token`]).
    pub fn first_token(&self, pair: &PairDecision) {
        self.inner.first_token(&pair.decode);
    }

    /// The decode worker's first token came `elapsed` after the request was routed. An
    /// aggregated request's timing teaches the router the decode worker's speed, as
    /// [`Router::first_token_after`] does; a split one's does not: its decode leg joined
    /// the worker's queue at the handoff, not when its plan was costed, so its timing
    /// measures no prediction of the router's.
    pub fn first_token_after(&self, pair: &PairDecision, elapsed: Duration) {
        if pair.is_split() {
            self.inner.first_token(&pair.decode);
        } else {
            self.inner.first_token_after(&pair.decode, elapsed);
        }
    }

    /// The request generated `tokens` output tokens after its first on its decode worker in
    /// `elapsed`: teaches the router that worker's decode terms, split or aggregated (see
    /// [`Router::tokens_after`]).
    pub fn tokens_after(&self, pair: &PairDecision, tokens: u32, elapsed: Duration) {
        self.inner.tokens_after(&pair.decode, tokens, elapsed);
    }

    /// A split request's prefill leg sampled its token on the prefill worker `elapsed`
    /// after the request was routed: teaches the router that worker's speed. A no-op for
    /// an aggregated request.
    pub fn prefill_first_token_after(&self, pair: &PairDecision, elapsed: Duration) {
        if let Some(prefill) = &pair.prefill {
            self.inner.first_token_after(prefill, elapsed);
        }
    }

    /// The request is done: releases what it charged on both sides. A split request whose
    /// handoff never came (the transfer failed) credits the decode worker nothing.
    pub fn complete(&self, pair: &PairDecision) {
        if let Some(ns) = pair.tpot_target_ns {
            if !pair.released.swap(true, Relaxed) {
                self.running.remove(pair.decode.worker(), ns);
            }
        }
        if let Some(prefill) = &pair.prefill {
            if !pair.handed_off.swap(true, Relaxed) {
                self.on_the_way(pair.decode.worker(), true);
            }
            self.inner.complete(prefill);
        }
        self.inner.complete(&pair.decode);
    }
}
