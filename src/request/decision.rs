//! [`RouteDecision`]: where a request went, what was predicted of it, and the load it
//! charged, released once.

use std::sync::atomic::{AtomicU8, AtomicU64, Ordering};

use crate::tree::WorkerId;

/// Where a request went, what the router predicted, and the load it charged.
///
/// Release the load exactly once with [`Router::complete`](crate::Router::complete) (or hold a [`RouteGuard`](crate::RouteGuard), which
/// releases on drop); completing again is a no-op. Not `Clone`, so one decision is one
/// charge.
#[derive(Debug)]
#[non_exhaustive]
pub struct RouteDecision {
    worker: WorkerId,
    epoch: u64,
    prompt_tokens: usize,
    matched_blocks: usize,
    cached_tokens: usize,
    /// Cached tokens by [`Tier::index`](crate::Tier::index).
    cached_by_tier: [u32; 4],
    /// The worker's data-parallel rank in its endpoint.
    rank: u32,
    /// Seconds to first token and per output token the load model predicted.
    predicted_s: (f64, f64),
    /// How much of each of the worker's step terms each prediction counted (the fleet
    /// model's `TermCounts`, for time to first token and per output token): what the timings the
    /// host reports later teach.
    terms: ([f32; 5], [f32; 5]),
    /// The terms of the predicted time to first token as admission's forecast counts them
    /// (the fleet model's forecast terms learn from these).
    forecast_counts: [f32; 5],
    /// Output tokens the request was charged with (its expected output).
    output_tokens: u32,
    /// Whether the worker's report counted as saturation when the request was routed: its
    /// predicted time carries the penalty, not a time to learn from.
    saturated: bool,
    /// `RELEASED`, `PREFILLED` and `DECODED` bits: each set once, by one atomic operation.
    state: AtomicU8,
    /// The request's number in the router's replica sync records (0: none).
    sync: u64,
    /// The router's clock when it routed the request (nanoseconds).
    routed_ns: u64,
    /// One more than the prompt tokens the worker had prefilled in all when the request's
    /// first token came, its own included (0 before): what it prefilled after is the
    /// prefill that shared the request's decode steps.
    prefilled_mark: AtomicU64,
    /// The furthest progress reported: output tokens after the first (high 24 bits) and
    /// the microseconds they took (low 40 bits); 0 before any report.
    progress: AtomicU64,
}

/// Bits of [`RouteDecision`]'s progress that hold microseconds.
const MICROS_BITS: u32 = 40;

const RELEASED: u8 = 1;
const PREFILLED: u8 = 2;
const DECODED: u8 = 4;

impl RouteDecision {
    pub(crate) fn new(
        worker: WorkerId,
        epoch: u64,
        prompt_tokens: usize,
        matched_blocks: usize,
        cached_tokens: usize,
        cached_by_tier: [u32; 4],
    ) -> Self {
        Self {
            worker,
            epoch,
            prompt_tokens,
            matched_blocks,
            cached_tokens,
            cached_by_tier,
            rank: 0,
            predicted_s: (0.0, 0.0),
            terms: ([0.0; 5], [0.0; 5]),
            forecast_counts: [0.0; 5],
            output_tokens: 0,
            saturated: false,
            state: AtomicU8::new(0),
            sync: 0,
            routed_ns: 0,
            prefilled_mark: AtomicU64::new(0),
            progress: AtomicU64::new(0),
        }
    }

    /// The same decision with the load model's predictions (`(ttft_s, tpot_s)`) and the
    /// terms they counted, charging the worker with `output_tokens` to generate.
    pub(crate) fn with_prediction(
        mut self,
        predicted_s: (f64, f64),
        terms: ([f32; 5], [f32; 5]),
        output_tokens: u32,
    ) -> Self {
        self.predicted_s = predicted_s;
        self.terms = terms;
        self.output_tokens = output_tokens;
        self
    }

    /// The same decision with the terms its forecast time to first token counted.
    pub(crate) fn with_forecast_counts(mut self, terms: [f32; 5]) -> Self {
        self.forecast_counts = terms;
        self
    }

    /// The same decision on a worker whose report counted as saturation, or not.
    pub(crate) fn saturated(mut self, saturated: bool) -> Self {
        self.saturated = saturated;
        self
    }

    /// Whether the worker's report counted as saturation when the request was routed.
    pub(crate) fn was_saturated(&self) -> bool {
        self.saturated
    }

    /// The terms the forecast time to first token counted.
    pub(crate) fn forecast_counts(&self) -> [f32; 5] {
        self.forecast_counts
    }

    /// The same decision routed at the router's clock time `routed_ns`.
    pub(crate) fn routed_at(mut self, routed_ns: u64) -> Self {
        self.routed_ns = routed_ns;
        self
    }

    /// Records that the worker had prefilled `total` prompt tokens in all when the
    /// request's first token came.
    pub(crate) fn set_prefilled_mark(&self, total: u64) {
        self.prefilled_mark
            .store(total.saturating_add(1), Ordering::Relaxed);
    }

    /// The prompt tokens the worker had prefilled in all when the request's first token
    /// came; `None` before it came.
    pub(crate) fn prefilled_mark(&self) -> Option<u64> {
        self.prefilled_mark.load(Ordering::Relaxed).checked_sub(1)
    }

    /// The router's clock when it routed the request (nanoseconds).
    pub(crate) fn routed_ns(&self) -> u64 {
        self.routed_ns
    }

    /// Records a progress report of `tokens` output tokens after the first in `elapsed`:
    /// the tokens and seconds since the furthest report before it, when this one goes
    /// further in both (a repeated, reordered or late report returns `None`).
    pub(crate) fn advance(&self, tokens: u32, elapsed: std::time::Duration) -> Option<(u32, f64)> {
        let tokens = tokens.min((1 << (64 - MICROS_BITS)) - 1);
        let micros = u64::try_from(elapsed.as_micros())
            .unwrap_or(u64::MAX)
            .min((1 << MICROS_BITS) - 1);
        let packed = (u64::from(tokens) << MICROS_BITS) | micros;
        let mut before = self.progress.load(Ordering::Acquire);
        loop {
            let (t0, m0) = (
                (before >> MICROS_BITS) as u32,
                before & ((1 << MICROS_BITS) - 1),
            );
            if tokens <= t0 || micros < m0 {
                return None;
            }
            match self.progress.compare_exchange_weak(
                before,
                packed,
                Ordering::AcqRel,
                Ordering::Acquire,
            ) {
                Ok(_) => return Some((tokens - t0, (micros - m0) as f64 * 1e-6)),
                Err(now) => before = now,
            }
        }
    }

    /// The terms the time-to-first-token prediction counted.
    pub(crate) fn ttft_counts(&self) -> [f32; 5] {
        self.terms.0
    }

    /// The terms the time-per-output-token prediction counted.
    pub(crate) fn tpot_counts(&self) -> [f32; 5] {
        self.terms.1
    }

    /// Output tokens the decision charged its worker with.
    pub(crate) fn output_tokens(&self) -> u32 {
        self.output_tokens
    }

    /// Seconds to first token the router's load model predicted for the request on its
    /// worker when it routed it (0 for routers without a load model):
    /// [`Router::first_token_after`](crate::Router::first_token_after) compares the time
    /// measured with it. Once the host reports timed first tokens, it is admission's
    /// forecast: the prefill queued ahead less what the worker is predicted to have
    /// prefilled since its last first token, with half a step under way while it decodes,
    /// at the worker's forecast terms (`docs/admission.md`).
    #[must_use]
    pub fn predicted_ttft_s(&self) -> f64 {
        self.predicted_s.0
    }

    /// Seconds per output token the router's load model predicted for the request on its
    /// worker when it routed it (0 for routers without a load model):
    /// [`Router::tokens_after`](crate::Router::tokens_after) compares the time measured
    /// with it.
    #[must_use]
    pub fn predicted_tpot_s(&self) -> f64 {
        self.predicted_s.1
    }

    /// Numbers the decision `sync` in the router's replica sync records.
    pub(crate) fn set_sync(&mut self, sync: u64) {
        self.sync = sync;
    }

    /// The decision's number in the router's replica sync records (0: none).
    pub(crate) fn sync(&self) -> u64 {
        self.sync
    }

    /// The same decision for a worker at data-parallel rank `rank`.
    pub(crate) fn with_rank(mut self, rank: u32) -> Self {
        self.rank = rank;
        self
    }

    /// The chosen worker's data-parallel rank within its endpoint (see
    /// [`RankLayout`](crate::RankLayout); 0 with one rank per endpoint): what a host sends
    /// as vLLM's `X-data-parallel-rank` header.
    #[must_use]
    pub fn rank(&self) -> u32 {
        self.rank
    }

    /// Of [`cached_tokens`](Self::cached_tokens), those the worker is predicted to hold at
    /// `tier` (each block at the best tier holding it).
    #[must_use]
    pub fn cached_tokens_at(&self, tier: crate::tree::Tier) -> usize {
        self.cached_by_tier[tier.index()] as usize
    }

    /// The chosen worker.
    #[must_use]
    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    /// Prompt tokens the router predicts the worker has cached (0 for policies without a
    /// cache index).
    #[must_use]
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens
    }

    /// Leading blocks of the prompt the router believes the worker holds.
    #[must_use]
    pub fn matched_blocks(&self) -> usize {
        self.matched_blocks
    }

    /// Tokens in the prompt.
    #[must_use]
    pub fn prompt_tokens(&self) -> usize {
        self.prompt_tokens
    }

    /// Tokens the worker is predicted to prefill: prompt minus cached.
    #[must_use]
    pub fn prefill_tokens(&self) -> usize {
        self.prompt_tokens - self.cached_tokens
    }

    /// Whether the load of this decision was already released.
    #[must_use]
    pub fn is_completed(&self) -> bool {
        self.state.load(Ordering::Acquire) & RELEASED != 0
    }

    pub(crate) fn epoch(&self) -> u64 {
        self.epoch
    }

    /// Marks the decision released (and so prefilled). `None` if it already was released,
    /// else whether the prefill was still outstanding.
    pub(crate) fn mark_released(&self) -> Option<bool> {
        let before = self.state.fetch_or(RELEASED | PREFILLED, Ordering::AcqRel);
        (before & RELEASED == 0).then_some(before & PREFILLED == 0)
    }

    /// Marks the prefill done; false if it already was (or the decision was released).
    pub(crate) fn mark_prefilled(&self) -> bool {
        self.state.fetch_or(PREFILLED, Ordering::AcqRel) & (PREFILLED | RELEASED) == 0
    }

    /// Marks its output timed; false if it already was.
    pub(crate) fn mark_decoded(&self) -> bool {
        self.state.fetch_or(DECODED, Ordering::AcqRel) & DECODED == 0
    }
}
