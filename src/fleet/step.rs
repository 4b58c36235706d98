//! [`StepModel`]: the time of one engine step, the measure of every prediction the fleet
//! model makes.

use crate::config::float;
use crate::error::Error;

/// The cost of one engine step, as vLLM's scheduler builds it: a step computes up to
/// `max_num_batched_tokens` tokens, one for each decoding request and the rest prefill
/// chunks, and takes
/// `step_base_s + prefill / prefill_tokens_per_s + decodes × step_s_per_decode +
/// context × step_s_per_context_token` seconds, `context` being the tokens the decodes attend
/// to. The simulator's engine steps by it; [`BalancedRouter`](crate::BalancedRouter)
/// predicts time to first token and decode time by it.
///
/// The defaults model Llama-3.1-70B in FP8 on 8 H100 SXM GPUs (tensor-parallel), estimated
/// from public peak figures: a step reads the weights once (8.8 GB per GPU at 3.35 TB/s)
/// plus kernel launches and 160 all-reduces, so `step_base_s` 0.008; a decode's sampling and
/// bookkeeping about 50 µs; a context token's KV (80 layers × 8 heads × 128 dimensions × K
/// and V, FP8: 160 KiB) read across the 8 GPUs' 26.8 TB/s: 6 ns.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct StepModel {
    /// Tokens computed per step at most (vLLM's `max_num_batched_tokens`). Default 8,192.
    pub max_num_batched_tokens: usize,
    /// Running requests at most (vLLM's `max_num_seqs`): past them, requests wait for one
    /// to finish. Default 256.
    pub max_num_seqs: usize,
    /// Fixed time of a step, seconds. Default 0.008.
    pub step_base_s: f64,
    /// Time per decoding request in a step. Default 0.000 05.
    pub step_s_per_decode: f64,
    /// Time per token of context the step's decodes attend to. Default 0.000 000 006.
    pub step_s_per_context_token: f64,
}

impl Default for StepModel {
    fn default() -> Self {
        Self {
            max_num_batched_tokens: 8_192,
            max_num_seqs: 256,
            step_base_s: 0.008,
            step_s_per_decode: 0.000_05,
            step_s_per_context_token: 0.000_000_006,
        }
    }
}

impl StepModel {
    crate::config::setters! {
        /// Sets [`max_num_batched_tokens`](Self::max_num_batched_tokens).
        with_max_num_batched_tokens: max_num_batched_tokens: usize;
        /// Sets [`max_num_seqs`](Self::max_num_seqs).
        with_max_num_seqs: max_num_seqs: usize;
        /// Sets [`step_base_s`](Self::step_base_s).
        with_step_base_s: step_base_s: f64;
        /// Sets [`step_s_per_decode`](Self::step_s_per_decode).
        with_step_s_per_decode: step_s_per_decode: f64;
        /// Sets [`step_s_per_context_token`](Self::step_s_per_context_token).
        with_step_s_per_context_token: step_s_per_context_token: f64;
    }

    /// Seconds of a step computing `prefill` prompt tokens at `prefill_tokens_per_s` and
    /// one token for each of `decodes` requests attending to `context` tokens.
    #[inline]
    #[must_use]
    pub fn seconds(
        &self,
        prefill: f64,
        decodes: f64,
        context: f64,
        prefill_tokens_per_s: f64,
    ) -> f64 {
        self.step_base_s
            + prefill / prefill_tokens_per_s
            + decodes * self.step_s_per_decode
            + context * self.step_s_per_context_token
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a budget or sequence cap of 0, or a negative or NaN
    /// time.
    pub fn validate(&self) -> Result<(), Error> {
        crate::config::int(
            "max_num_batched_tokens",
            self.max_num_batched_tokens,
            1..,
            "at least 1",
        )?;
        crate::config::int("max_num_seqs", self.max_num_seqs, 1.., "at least 1")?;
        for (field, value) in [
            ("step_base_s", self.step_base_s),
            ("step_s_per_decode", self.step_s_per_decode),
            ("step_s_per_context_token", self.step_s_per_context_token),
        ] {
            float(field, value, 0.0..=f64::MAX, "zero or more seconds")?;
        }
        Ok(())
    }
}
