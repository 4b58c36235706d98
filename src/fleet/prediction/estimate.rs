//! [`Estimate`]: one worker's load figures as a policy and the predictions see them, taken
//! from its [`LoadState`](super::super::registry::state::LoadState) at one instant.

use super::super::learned::timing::Timing;

/// What a prediction counts of one request: its prompt tokens, those of them uncached on
/// the worker (the prefill it costs there), and the output tokens it is expected to
/// generate.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub(crate) struct RequestShape {
    /// Prompt tokens.
    pub(crate) prompt: u64,
    /// Of those, the tokens the worker lacks and must prefill.
    pub(crate) miss: u64,
    /// Output tokens expected.
    pub(crate) output: u32,
}

impl RequestShape {
    /// A request of `prompt` tokens, `miss` of them uncached, generating `output`.
    #[inline]
    pub(crate) fn new(prompt: u64, miss: u64, output: u32) -> Self {
        Self {
            prompt,
            miss,
            output,
        }
    }
}

/// A worker's load figures as a policy sees them (see [`Candidate`](crate::Candidate)).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
pub(crate) struct Estimate {
    /// Requests on the worker, waiting or running.
    pub(crate) requests: u64,
    /// Of those, requests past their first token (decoding).
    pub(crate) decoding: u64,
    /// Uncached prompt tokens to prefill before a new request's.
    pub(crate) prefill_tokens: u64,
    /// The pairs of tokens their prefill attends to.
    pub(crate) prefill_pairs: u64,
    /// Tokens of context the worker's requests attend to (their prompts and outputs).
    pub(crate) context_tokens: u64,
    /// Tokens of KV the worker's requests hold or will hold once admitted beyond what they
    /// share (their uncached prompt tokens and their outputs).
    pub(crate) kv_tokens: u64,
    /// Fraction of KV in use (0 without a report).
    pub(crate) kv_usage: f32,
    /// Tokens of KV the worker holds (0: unknown).
    pub(crate) kv_capacity_tokens: u64,
    /// The worker's step terms: the configured ones at its profile's speed, corrected by
    /// what its timings taught.
    pub(crate) timing: Timing,
    /// The prefill speed of `timing` relative to the configured rate.
    pub(crate) speed: f32,
    /// The report is past its age and counts as saturation ([`Staleness::Saturated`](crate::Staleness::Saturated)).
    pub(crate) saturated: bool,
    /// What the predictions admission checks read beyond the load as counted; `None` while
    /// the fleet's host reports no timings, or the router learns nothing from them
    /// ([`LoadConfig::learning_rate`](crate::LoadConfig::learning_rate) 0): the predictions
    /// are then the load the policies rank by (see
    /// [`predicted_parts`](Self::predicted_parts)).
    pub(crate) forecast: Option<Forecast>,
}

/// What a worker's predictions read beyond its load as counted, once the host reports
/// timings.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct Forecast {
    /// The worker's forecast terms (`forecast.rs`).
    pub(crate) timing: Timing,
    /// Seconds the worker's queued prefill has been under way: since its last first token,
    /// or since a route found none queued (or since the report whose pending prefill the
    /// estimate reads); 0 with none queued.
    pub(crate) under_way_s: f32,
}
