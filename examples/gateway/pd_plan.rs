//! Where a disaggregated request's two legs go: the [`PairPlanner`] seam, and
//! [`SplitPlanner`], the planner the gateway uses until the crate has a pair router.
//!
//! Targets are numbered on each side on their own, as the gateway numbers upstream targets:
//! target `t` of a side is rank `layout.rank(t)` of endpoint `layout.endpoint(t)` of that
//! side's [`RankLayout`](prefix_router::RankLayout).

use std::sync::Arc;

use prefix_router::{
    Error, RoundRobinRouter, RouteDecision, RouteRequest, Router, WorkerId, WorkerLoad,
};

/// A side of a disaggregated fleet.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Workers that prefill a prompt and hand its KV cache over.
    Prefill,
    /// Workers that decode, reading the KV cache from a prefill worker or prefilling
    /// themselves.
    Decode,
}

impl Role {
    /// The role's name, as `/stats` and errors spell it.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

/// The pair chosen for one request: a decode target, and the prefill target when the
/// prompt is prefilled apart ("split"); without one the decode target prefills it.
#[derive(Debug)]
pub(crate) struct Plan {
    decode: RouteDecision,
    prefill: Option<RouteDecision>,
}

impl Plan {
    /// A plan of `decode`'s target and, when split, `prefill`'s.
    pub(crate) fn new(decode: RouteDecision, prefill: Option<RouteDecision>) -> Self {
        Self { decode, prefill }
    }

    /// The decode side's decision: its target, and the cached tokens predicted there.
    pub(crate) fn decode(&self) -> &RouteDecision {
        &self.decode
    }

    /// The prefill side's decision, when the request is split.
    pub(crate) fn prefill(&self) -> Option<&RouteDecision> {
        self.prefill.as_ref()
    }
}

/// Chooses the pair for each request and hears how its legs went. `Send + Sync`: the
/// gateway calls it from every request.
///
/// Contract: every plan [`plan`](Self::plan) returns gets [`complete`](Self::complete)
/// exactly once, whatever became of the request, after which it holds nothing charged;
/// [`prefill_done`](Self::prefill_done) comes at most once, when the prefill leg answered,
/// and [`first_token`](Self::first_token) at most once, when the decode leg's first
/// content came (a whole answer's arrival).
pub(crate) trait PairPlanner: Send + Sync {
    /// The planner's name, for `/stats`.
    fn name(&self) -> &'static str;

    /// The pair for `request`, charged with its load.
    ///
    /// # Errors
    ///
    /// [`Error::NoWorkers`] when no decode target is available; [`Error::Shed`] when
    /// admission refuses the request; nothing is charged then.
    fn plan(&self, request: &RouteRequest<'_>) -> Result<Plan, Error>;

    /// The prefill leg of `plan` answered: its prefill target's work is done.
    fn prefill_done(&self, plan: &Plan);

    /// The decode leg of `plan` produced its first token.
    fn first_token(&self, plan: &Plan);

    /// `plan`'s request is over: everything it charged is released.
    fn complete(&self, plan: &Plan);

    /// Takes `target` of `role`'s side out of planning, or brings it back.
    fn set_available(&self, role: Role, target: WorkerId, available: bool);

    /// What `target` of `role`'s side is charged with; `None` for an unknown target.
    fn load(&self, role: Role, target: WorkerId) -> Option<WorkerLoad>;
}

/// A stand-in pair planner: the decode target from a router over the decode targets (the
/// gateway's `--policy`), then, always, a prefill target in turn among the available
/// prefill targets (`RoundRobinRouter`), as vLLM's proxy picks them. With no prefill target
/// available, the request is not split: the decode target prefills it.
///
/// The decode router is charged as if the decode target prefilled the prompt until its
/// first token; the prefill router from the plan until the prefill leg answers.
pub(crate) struct SplitPlanner {
    decode: Arc<dyn Router>,
    prefill: RoundRobinRouter,
}

impl SplitPlanner {
    /// A planner choosing decode targets with `decode` and prefill targets among
    /// `0..prefill_targets`.
    ///
    /// # Errors
    ///
    /// When `prefill_targets` is out of the crate's range.
    pub(crate) fn new(decode: Arc<dyn Router>, prefill_targets: u32) -> Result<Self, Error> {
        Ok(Self {
            decode,
            prefill: RoundRobinRouter::new(prefill_targets)?,
        })
    }

    fn side(&self, role: Role) -> &dyn Router {
        match role {
            Role::Prefill => &self.prefill,
            Role::Decode => self.decode.as_ref(),
        }
    }
}

impl PairPlanner for SplitPlanner {
    fn name(&self) -> &'static str {
        "split_round_robin"
    }

    fn plan(&self, request: &RouteRequest<'_>) -> Result<Plan, Error> {
        let decode = self.decode.route(request)?;
        // Admission and sessions are the decode side's: the prefill side sees the prompt.
        let mut prompt = RouteRequest::new(request.tokens()).with_salt(request.salt());
        if let Some(at) = request.time() {
            prompt = prompt.with_time(at);
        }
        match self.prefill.route(&prompt) {
            Ok(prefill) => Ok(Plan::new(decode, Some(prefill))),
            Err(Error::NoWorkers) => Ok(Plan::new(decode, None)),
            Err(e) => {
                self.decode.complete(&decode);
                Err(e)
            }
        }
    }

    fn prefill_done(&self, plan: &Plan) {
        if let Some(prefill) = plan.prefill() {
            self.prefill.complete(prefill);
        }
    }

    fn first_token(&self, plan: &Plan) {
        self.decode.first_token(plan.decode());
    }

    fn complete(&self, plan: &Plan) {
        self.prefill_done(plan);
        self.decode.complete(plan.decode());
    }

    fn set_available(&self, role: Role, target: WorkerId, available: bool) {
        let _ = self.side(role).set_available(target, available);
    }

    fn load(&self, role: Role, target: WorkerId) -> Option<WorkerLoad> {
        self.side(role).load(target)
    }
}
