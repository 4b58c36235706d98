//! [`Estimate`]: one worker's load figures as a policy and the predictions see them, taken
//! from its [`LoadState`](super::state::LoadState) at one instant.

use super::timing::Timing;

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
}
