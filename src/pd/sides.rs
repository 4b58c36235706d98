//! What a plan's cost needs of each candidate, predicted once per routing: its time to
//! first token as the request's aggregated worker, as its prefill worker (one output
//! token) and as the seat of its decode leg, and its decode figures.

use crate::fleet::{Candidate, LoadConfig, RequestShape, TtftParts};
use crate::request::RouteRequest;

/// One candidate's predictions for one request ([`PairView`](super::PairView)'s costs
/// combine them).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Sides {
    /// Prompt tokens it lacks.
    pub(crate) miss: u64,
    /// Prefilling what it lacks and decoding here.
    pub(crate) aggregated: TtftParts,
    /// Prefilling what it lacks here for another worker (one output token).
    pub(crate) prefill_leg: TtftParts,
    /// A decode leg arriving with its KV: nothing to prefill.
    pub(crate) seat: TtftParts,
    /// The request's time per output token here.
    pub(crate) tpot_s: f64,
    /// The request's decode time here.
    pub(crate) decode_s: f64,
    /// A decode leg's first step here, once its KV is in.
    pub(crate) first_step_s: f64,
    /// The time per output token of the decodes running here with its prefill queued here
    /// too; 0 when none runs or it lacks nothing.
    pub(crate) stalled_tpot_s: f64,
}

impl Sides {
    /// Every candidate's predictions for `request`, in the candidates' order.
    pub(crate) fn all(
        request: &RouteRequest<'_>,
        candidates: &[Candidate],
        config: &LoadConfig,
    ) -> Vec<Sides> {
        let prompt = request.tokens().len() as u64;
        let output = request
            .expected_output()
            .unwrap_or(config.default_output_tokens);
        candidates
            .iter()
            .map(|c| Sides::of(c, config, (prompt, output)))
            .collect()
    }

    /// `c`'s predictions for a request of `prompt` tokens generating `output`.
    fn of(c: &Candidate, config: &LoadConfig, (prompt, output): (u64, u32)) -> Sides {
        let miss = prompt.saturating_sub(c.cached_tokens() as u64);
        let e = &c.estimate;
        Sides {
            miss,
            aggregated: e.ttft_parts(config, RequestShape::new(prompt, miss, output)),
            prefill_leg: e.ttft_parts(config, RequestShape::new(prompt, miss, 1)),
            seat: e.ttft_parts(config, RequestShape::new(prompt, 0, output)),
            tpot_s: e.tpot_s(config, RequestShape::new(prompt, 0, output)),
            decode_s: decode_step_s(c, prompt) * f64::from(output),
            first_step_s: first_step_s(c, config, prompt),
            stalled_tpot_s: stalled_tpot_s(c, config, (prompt, miss)),
        }
    }
}

/// How long a request arriving with its KV waits on decode worker `d` for its first token:
/// the rest of the step running there (half of one on average) and its own step, each
/// carrying a chunk of the prefill queued there as far as the budget goes.
fn first_step_s(d: &Candidate, config: &LoadConfig, prompt: u64) -> f64 {
    let budget = config.step.max_num_batched_tokens as f64;
    let chunk = (d.prefill_tokens() as f64).min(budget);
    let decodes = d.decoding() as f64 + 1.0;
    let context = d.context_tokens() as f64 + prompt as f64;
    1.5 * d.estimate.timing.step_s(chunk, decodes, context)
}

/// The time per output token of `c`'s running decodes with a prefill of `miss` tokens of a
/// `prompt`-token request queued there too: the load model's time per output token (a
/// decode step, with the prefill queued spread over a default request's output, as
/// admission predicts it); 0 when no decode runs there or nothing is to prefill.
fn stalled_tpot_s(c: &Candidate, config: &LoadConfig, (prompt, miss): (u64, u64)) -> f64 {
    if c.decoding() == 0 || miss == 0 {
        return 0.0;
    }
    let mut e = c.estimate;
    e.prefill_tokens += miss;
    e.prefill_pairs += crate::fleet::attended(prompt, miss);
    e.tpot_s(
        config,
        RequestShape::new(prompt, 0, config.default_output_tokens),
    )
}

/// A decode step on `d` once a request of `prompt` tokens decodes there: every request there
/// now is ahead of it, so decodes beside it.
fn decode_step_s(d: &Candidate, prompt: u64) -> f64 {
    let decodes = d.requests() as f64 + 1.0;
    let context = d.context_tokens() as f64 + prompt as f64;
    d.estimate.timing.step_s(0.0, decodes, context)
}
