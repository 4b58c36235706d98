//! Plans for a request on a disaggregated fleet, their predicted costs, and the deciders
//! that choose among them.

use super::role::Role;
use super::sides::Sides;
use super::topology::Topology;
use crate::fleet::Candidate;
use crate::request::RouteRequest;

/// Where a request runs: on one decode worker that prefills it too, or prefilled on one
/// worker and decoded on another after its KV moves. Indices are into the
/// [`PairView`]'s candidates.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plan {
    /// Prefilled and decoded on `decode`.
    Aggregated {
        /// The decode worker's candidate index.
        decode: usize,
    },
    /// Prefilled on `prefill`, its KV moved to `decode`, decoded there.
    Split {
        /// The prefill worker's candidate index.
        prefill: usize,
        /// The decode worker's candidate index.
        decode: usize,
    },
}

impl Plan {
    /// The decode worker's candidate index.
    #[must_use]
    pub fn decode(self) -> usize {
        match self {
            Plan::Aggregated { decode } | Plan::Split { decode, .. } => decode,
        }
    }

    /// The prefill worker's candidate index, for a split plan.
    #[must_use]
    pub fn prefill(self) -> Option<usize> {
        match self {
            Plan::Aggregated { .. } => None,
            Plan::Split { prefill, .. } => Some(prefill),
        }
    }
}

/// A plan's predicted cost, by the load model.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
#[non_exhaustive]
pub struct PlanCost {
    /// Time to first token. Split: the prefill worker's queue and the request's own
    /// uncached prefill there and the KV transfer, or the prefill queued on the decode
    /// worker (which its decode leg waits behind) when that takes longer; then the decode
    /// worker's wait for a slot, the rest of its running step and its own. Aggregated: the
    /// decode worker's own time to first token.
    pub ttft_s: f64,
    /// Time per output token on the decode worker.
    pub tpot_s: f64,
    /// The delay its prefill adds to others where it prefills: to the decodes running
    /// there, summed over them (each waits for the prefill's compute in the steps they
    /// share), times [`PdConfig::stall_weight`](crate::PdConfig::stall_weight) (the time per
    /// output token that disaggregation spares a decode worker's running requests); and,
    /// on a decode worker, to each request whose KV is on its way there (routed split, its
    /// handoff not yet come), whose first token waits behind the prefill, counted whole.
    /// Infinite for an aggregated plan whose prefill would stretch the time per output token
    /// of the decodes running on the decode worker past the tightest target of the request
    /// and of the requests decoding there
    /// ([`PdConfig::decode_step_limit_s`](crate::PdConfig::decode_step_limit_s) for those
    /// without one).
    pub harm_s: f64,
    /// Seconds moving the KV the decode worker lacks (0 aggregated).
    pub transfer_s: f64,
    /// Bytes of KV moved (0 aggregated).
    pub transfer_bytes: u64,
    /// Of `ttft_s`, the request's own uncached prefill, on whichever worker prefills it.
    pub prefill_s: f64,
    /// The request's own decode time: its output at the decode worker's step with it and
    /// every request there now in the batch (those waiting now are ahead of it). The
    /// prefill queued there runs before its first token and is counted in `ttft_s`, not
    /// here.
    pub decode_s: f64,
}

impl PlanCost {
    /// What the cost decider minimises: the request's time to first token and decode time,
    /// and the delay it adds to others.
    #[must_use]
    pub fn total_s(&self) -> f64 {
        self.ttft_s + self.decode_s + self.harm_s
    }
}

/// What a [`Decide`](crate::Decide) sees: every available worker as a [`Candidate`] (loads and what each
/// holds of the prompt) with its role, and the cost of any plan.
pub struct PairView<'a> {
    pub(crate) request: &'a RouteRequest<'a>,
    pub(crate) candidates: &'a [Candidate],
    pub(crate) roles: &'a [Role],
    pub(crate) topology: &'a Topology,
    pub(crate) kv_bytes_per_token: u64,
    pub(crate) stall_weight: f64,
    /// By candidate: requests routed split to it whose handoff has not come.
    pub(crate) arriving: &'a [u64],
    /// By candidate: its predictions for the request.
    pub(crate) sides: &'a [Sides],
    /// By candidate: the tightest time-per-output-token target of the request and of the
    /// requests decoding there, which a prefill there must not stretch their time per
    /// output token past.
    pub(crate) step_limits: &'a [Option<f64>],
}

impl PairView<'_> {
    /// The candidates.
    #[must_use]
    pub fn candidates(&self) -> &[Candidate] {
        self.candidates
    }

    /// Candidate `i`'s role.
    #[must_use]
    pub fn role(&self, i: usize) -> Role {
        self.roles.get(i).copied().unwrap_or_default()
    }

    /// Indices of the candidates that may decode.
    pub fn decoders(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.candidates.len()).filter(|&i| self.role(i).decodes())
    }

    /// Indices of the candidates that may prefill for another.
    pub fn prefillers(&self) -> impl Iterator<Item = usize> + '_ {
        (0..self.candidates.len()).filter(|&i| self.role(i).prefills_for_others())
    }

    /// The predicted cost of `plan` (indices as [`Plan`] says; a plan the roles forbid is
    /// costed all the same, and refused when chosen).
    #[must_use]
    pub fn cost(&self, plan: Plan) -> PlanCost {
        let at = plan.decode();
        let d = &self.sides[at];
        match plan.prefill() {
            None => PlanCost {
                ttft_s: d.aggregated.total_s(),
                prefill_s: d.aggregated.own_s,
                tpot_s: d.tpot_s,
                harm_s: self.harm_s(at, d.miss) + self.over_limit_s(at, d),
                decode_s: d.decode_s,
                ..PlanCost::default()
            },
            Some(from) => {
                let p = &self.sides[from];
                let bytes = d.miss.saturating_mul(self.kv_bytes_per_token);
                let (source, sink) = (self.candidates[from].worker(), self.candidates[at].worker());
                let transfer_s = bytes as f64 / self.topology.bytes_per_s(source, sink);
                // The decode worker drains the prefill queued there while the prefill leg
                // runs and the KV moves; the decode leg waits for what is left (FCFS).
                let ready_s = p.prefill_leg.total_s() + transfer_s;
                let drained_s = d.seat.total_s() - d.seat.wait_s;
                PlanCost {
                    ttft_s: ready_s.max(drained_s) + d.seat.wait_s + d.first_step_s,
                    prefill_s: p.prefill_leg.own_s,
                    tpot_s: d.tpot_s,
                    harm_s: self.harm_s(from, p.miss),
                    transfer_s,
                    transfer_bytes: bytes,
                    decode_s: d.decode_s,
                }
            }
        }
    }

    /// Infinite when prefilling on candidate `at` (its predictions `d`) would stretch its
    /// running decodes' time per output token past its limit; else 0.
    fn over_limit_s(&self, at: usize, d: &Sides) -> f64 {
        match self.step_limits.get(at).copied().flatten() {
            Some(limit) if d.stalled_tpot_s > limit => f64::INFINITY,
            _ => 0.0,
        }
    }

    /// The compute of a prefill of `miss` tokens on `c`: what each request behind it or
    /// sharing its steps waits.
    fn delay_s(&self, c: &Candidate, miss: u64) -> f64 {
        let prompt = self.request.tokens().len() as u64;
        c.estimate
            .timing
            .prefill_s(miss as f64, crate::fleet::attended(prompt, miss) as f64)
    }

    /// The delay a prefill of `miss` tokens on candidate `i` adds to others: its running
    /// decodes', summed and weighed by the stall weight, and that of each request on its
    /// way there, whole.
    pub(super) fn harm_s(&self, i: usize, miss: u64) -> f64 {
        let c = &self.candidates[i];
        let arriving = self.arriving.get(i).copied().unwrap_or(0) as f64;
        (self.stall_weight * c.decoding() as f64 + arriving) * self.delay_s(c, miss)
    }

    /// Every plan the roles allow: each decode worker aggregated, and split with each
    /// prefill worker but itself.
    pub fn plans(&self) -> impl Iterator<Item = Plan> + '_ {
        self.decoders().flat_map(move |decode| {
            let split = self
                .prefillers()
                .filter(move |&p| p != decode)
                .map(move |prefill| Plan::Split { prefill, decode });
            std::iter::once(Plan::Aggregated { decode }).chain(split)
        })
    }
}
