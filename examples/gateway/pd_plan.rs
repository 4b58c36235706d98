//! Where a disaggregated request's two legs go: the [`PairPlanner`] seam the request path
//! sees, and [`PdPlanner`], which plans with the crate's [`PdRouter`].
//!
//! Targets are numbered on each side on their own, as the gateway numbers upstream targets:
//! target `t` of a side is rank `layout.rank(t)` of endpoint `layout.endpoint(t)` of that
//! side's [`RankLayout`](prefix_router::RankLayout).

use prefix_router::{
    Decide, Error, FleetSignals, PairDecision, PdConfig, PdRouter, RouteRequest, Router, WorkerId,
    WorkerLoad,
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
    pair: PairDecision,
    decode: WorkerId,
    prefill: Option<WorkerId>,
}

impl Plan {
    /// The decode side's target.
    pub(crate) fn decode(&self) -> WorkerId {
        self.decode
    }

    /// The prefill side's target, when the request is split.
    pub(crate) fn prefill(&self) -> Option<WorkerId> {
        self.prefill
    }

    /// Prompt tokens predicted cached where the prompt is prefilled: on the prefill target
    /// when split, else on the decode target.
    pub(crate) fn cached_tokens(&self) -> usize {
        self.pair
            .prefill()
            .unwrap_or(self.pair.decode())
            .cached_tokens()
    }
}

/// Chooses the pair for each request and hears how its legs went. `Send + Sync`: the
/// gateway calls it from every request.
///
/// Contract: every plan [`plan`](Self::plan) returns gets [`complete`](Self::complete)
/// exactly once, whatever became of the request, after which it holds nothing charged;
/// [`prefill_done`](Self::prefill_done) comes at most once, when the prefill leg answered,
/// and [`first_token`](Self::first_token) at most once, when the decode leg's first
/// content came (a whole 2xx answer's arrival): the prompt's KV reached the decode target.
pub(crate) trait PairPlanner: Send + Sync {
    /// The planner's name, for `/stats`.
    fn name(&self) -> &'static str;

    /// The pair for `request`, charged with its load.
    ///
    /// # Errors
    ///
    /// [`Error::NoWorkers`] when no decode target is available; nothing is charged then.
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

    /// The fleet signals of the router underneath (`Router::fleet_signals`), over its own
    /// workers: [`target`](Self::target) names the side and target of each.
    fn fleet_signals(&self) -> FleetSignals;

    /// The side and the target there of the router's `worker`; `None` for an unknown one.
    fn target(&self, worker: WorkerId) -> Option<(Role, WorkerId)>;
}

/// Plans with a [`PdRouter`] over both sides: its workers are the prefill targets
/// (`prefix_router::Role::Prefill`) and after them the decode targets
/// (`prefix_router::Role::Decode`), on one mirror and load model.
///
/// The prefill target is released when its leg answers (its compute is done); the decode
/// target's mirror is credited with the prompt ([`PdRouter::prefill_done`]) at the decode
/// leg's first token, when its KV has certainly arrived: a decode leg that fails credits
/// nothing.
pub(crate) struct PdPlanner {
    router: PdRouter<Box<dyn Decide>>,
    prefill_targets: u32,
    decode_targets: u32,
}

impl PdPlanner {
    /// A planner over `prefill_targets` and `decode_targets`, hashing blocks of
    /// `block_size` tokens, deciding with `decider`.
    ///
    /// # Errors
    ///
    /// As [`PdRouter::with_decider`]: no decode target, or a setting out of range.
    pub(crate) fn new(
        prefill_targets: u32,
        decode_targets: u32,
        block_size: usize,
        decider: Box<dyn Decide>,
    ) -> Result<Self, Error> {
        use prefix_router::Role as Does;
        let roles: Vec<Does> = std::iter::repeat_n(Does::Prefill, prefill_targets as usize)
            .chain(std::iter::repeat_n(Does::Decode, decode_targets as usize))
            .collect();
        let mut config = PdConfig::default();
        config.balanced.index.block_size = block_size;
        Ok(Self {
            router: PdRouter::with_decider(&roles, config, decider)?,
            prefill_targets,
            decode_targets,
        })
    }

    /// The router's worker for `target` of `role`'s side.
    fn worker(&self, role: Role, target: WorkerId) -> WorkerId {
        match role {
            Role::Prefill => target,
            Role::Decode => WorkerId::new(self.prefill_targets + target.get()),
        }
    }

    /// The decode side's target of the router's `worker`.
    fn decode_target(&self, worker: WorkerId) -> WorkerId {
        WorkerId::new(worker.get().saturating_sub(self.prefill_targets))
    }
}

impl PairPlanner for PdPlanner {
    fn name(&self) -> &'static str {
        self.router.decider_name()
    }

    fn plan(&self, request: &RouteRequest<'_>) -> Result<Plan, Error> {
        let pair = self.router.route_pair(request)?;
        // The router's roles keep decode workers after the prefill ones, and prefill
        // workers from decoding: each side's target follows from the worker.
        Ok(Plan {
            decode: self.decode_target(pair.decode().worker()),
            prefill: pair.prefill().map(|p| p.worker()),
            pair,
        })
    }

    fn prefill_done(&self, plan: &Plan) {
        if let Some(prefill) = plan.pair.prefill() {
            self.router.router().complete(prefill);
        }
    }

    fn first_token(&self, plan: &Plan) {
        self.router.prefill_done(&plan.pair);
        self.router.first_token(&plan.pair);
    }

    fn complete(&self, plan: &Plan) {
        self.router.complete(&plan.pair);
    }

    fn set_available(&self, role: Role, target: WorkerId, available: bool) {
        let _ = self
            .router
            .router()
            .set_available(self.worker(role, target), available);
    }

    fn load(&self, role: Role, target: WorkerId) -> Option<WorkerLoad> {
        let side = match role {
            Role::Prefill => self.prefill_targets,
            Role::Decode => self.decode_targets,
        };
        (target.get() < side)
            .then(|| self.router.router().load(self.worker(role, target)))
            .flatten()
    }

    fn fleet_signals(&self) -> FleetSignals {
        self.router.router().fleet_signals()
    }

    fn target(&self, worker: WorkerId) -> Option<(Role, WorkerId)> {
        let w = worker.get();
        if w < self.prefill_targets {
            Some((Role::Prefill, worker))
        } else if w - self.prefill_targets < self.decode_targets {
            Some((Role::Decode, self.decode_target(worker)))
        } else {
            None
        }
    }
}
