//! The field's prefill/decode deciders, as baselines for the simulator's `--pd-decider`
//! (the crate's own are `cost`, `always` and `never`). Facts from the projects' sources,
//! with the paths and commits they come from, are in `pd.md` beside this file.
//!
//! - **llm-d** (`prefix-based-pd-decider`, decode first): the decode worker is the default
//!   profile's choice among decode workers (`llmd.rs`); the request is split when its
//!   tokens not cached there reach `nonCachedTokens` (16, the shipped configuration; the
//!   code's default of 0 never splits), the prefill worker then the prefill profile's
//!   choice: prefix-cache score (weight 2) plus queue score (weight 1).
//! - **Dynamo** (conditional disaggregation, `isl_bounding`): the decode worker is Dynamo's
//!   KV-router cost's choice among decode workers (`dynamo.rs`); the prefill stays local
//!   when the tokens not cached there are under 2,048 and under 0.7 of the prompt,
//!   otherwise it goes to the prefill worker of least cost.
//! - **independent** (SGLang's PD router): two independent cache-aware picks, one over the
//!   prefill workers and one over the decode workers, and every request split.
//!
//! Left out: llm-d's topology affinity between the two picks (off by default), Dynamo's
//! optional busy checks (`isl_or_load`, the decode-busy veto), SGLang's data-parallel rank
//! picks (the simulator has none).

use prefix_router::{
    CacheAware, CacheAwareConfig, Candidate, Decide, PairView, Plan, Policy, RouteRequest,
};

use super::dynamo::Dynamo;
use super::full_blocks;
use super::llmd::{Llmd, MAX_PREFIX_BLOCKS};

/// llm-d's shipped `nonCachedTokens`.
pub(crate) const LLMD_NON_CACHED_TOKENS: usize = 16;
/// Dynamo's bound on uncached tokens kept local.
pub(crate) const DYNAMO_LOCAL_TOKENS: usize = 2_048;
/// Dynamo's bound on the uncached share kept local.
pub(crate) const DYNAMO_LOCAL_SHARE: f64 = 0.7;

/// The index among `of` (candidate indices) that `policy` selects.
fn pick(
    policy: &dyn Policy,
    request: &RouteRequest<'_>,
    view: &PairView<'_>,
    of: &[usize],
) -> Option<usize> {
    let subset: Vec<Candidate> = of.iter().map(|&i| view.candidates()[i]).collect();
    if subset.is_empty() {
        return None;
    }
    of.get(policy.select(request, &subset)).copied()
}

/// `Split` when a prefill worker other than `decode` is given, else `Aggregated`.
fn plan(decode: usize, prefill: Option<usize>) -> Plan {
    match prefill {
        Some(prefill) if prefill != decode => Plan::Split { prefill, decode },
        _ => Plan::Aggregated { decode },
    }
}

/// llm-d's decider over blocks of `block_size` tokens.
pub(crate) struct LlmdPd {
    pub(crate) block_size: usize,
}

impl LlmdPd {
    /// The prefill profile's pick among `of`: prefix score × 2 plus queue score.
    fn prefill_pick(
        &self,
        request: &RouteRequest<'_>,
        view: &PairView<'_>,
        of: &[usize],
    ) -> Option<usize> {
        let c = view.candidates();
        let waiting = of.iter().map(|&i| c[i].waiting());
        let (least, most) = (waiting.clone().min()?, waiting.max()?);
        let blocks = full_blocks(request.tokens().len(), self.block_size).min(MAX_PREFIX_BLOCKS);
        let score = |i: usize| {
            let queue = if most == least {
                1.0
            } else {
                (most - c[i].waiting()) as f64 / (most - least) as f64
            };
            let prefix = if blocks == 0 {
                0.0
            } else {
                c[i].matched_blocks().min(blocks) as f64 / blocks as f64
            };
            2.0 * prefix + queue
        };
        of.iter()
            .copied()
            .max_by(|&a, &b| score(a).total_cmp(&score(b)))
    }
}

impl Decide for LlmdPd {
    fn name(&self) -> &'static str {
        "llmd"
    }

    fn decide(&self, request: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        let decoders: Vec<usize> = view.decoders().collect();
        let decode = pick(&Llmd::new(self.block_size), request, view, &decoders).unwrap_or(0);
        let prompt = request.tokens().len();
        let uncached = prompt.saturating_sub(view.candidates()[decode].cached_tokens());
        if uncached < LLMD_NON_CACHED_TOKENS {
            return plan(decode, None);
        }
        let prefillers: Vec<usize> = view.prefillers().filter(|&p| p != decode).collect();
        plan(decode, self.prefill_pick(request, view, &prefillers))
    }
}

/// Dynamo's decider over blocks of `block_size` tokens.
pub(crate) struct DynamoPd {
    pub(crate) block_size: usize,
}

impl Decide for DynamoPd {
    fn name(&self) -> &'static str {
        "dynamo"
    }

    fn decide(&self, request: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        let dynamo = Dynamo::new(self.block_size);
        let decoders: Vec<usize> = view.decoders().collect();
        let decode = pick(&dynamo, request, view, &decoders).unwrap_or(0);
        let prompt = request.tokens().len();
        let uncached = prompt.saturating_sub(view.candidates()[decode].cached_tokens());
        let share = uncached as f64 / prompt.max(1) as f64;
        if uncached < DYNAMO_LOCAL_TOKENS && share < DYNAMO_LOCAL_SHARE {
            return plan(decode, None);
        }
        let prefillers: Vec<usize> = view.prefillers().filter(|&p| p != decode).collect();
        plan(decode, pick(&dynamo, request, view, &prefillers))
    }
}

/// SGLang's PD router: independent cache-aware picks on each side, always split.
pub(crate) struct IndependentPd {
    policy: CacheAware,
}

impl IndependentPd {
    pub(crate) fn new() -> Self {
        Self {
            policy: CacheAware::new(CacheAwareConfig::default())
                .unwrap_or_else(|_| unreachable!("the default configuration is valid")),
        }
    }
}

impl Decide for IndependentPd {
    fn name(&self) -> &'static str {
        "independent"
    }

    fn decide(&self, request: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        let decoders: Vec<usize> = view.decoders().collect();
        let decode = pick(&self.policy, request, view, &decoders).unwrap_or(0);
        let prefillers: Vec<usize> = view.prefillers().filter(|&p| p != decode).collect();
        plan(decode, pick(&self.policy, request, view, &prefillers))
    }
}
