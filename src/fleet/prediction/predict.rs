//! The load model's predictions: a request's time to first token and decode time on a
//! worker, from its [`Estimate`] and the worker's step terms ([`Timing`]: the configured
//! [`StepModel`], corrected by what its timings taught), as vLLM's
//! scheduler runs a step: a token budget shared by prefill chunks and one token per decode,
//! a cap on running requests, and KV that admission must find free.

use super::super::config::LoadConfig;
use super::super::learned::timing::{TermCounts, Timing, attended};
use super::super::report::SATURATED_PENALTY_S;
#[cfg(doc)]
use super::super::step::StepModel;
use super::estimate::{Estimate, RequestShape};
use crate::request::Limit;

impl Estimate {
    /// Tokens of context the worker's decodes attend to: their share of what its requests
    /// hold.
    fn decode_context(&self) -> f64 {
        if self.requests == 0 {
            return 0.0;
        }
        self.context_tokens as f64 * self.decoding as f64 / self.requests as f64
    }

    /// A request's time to first token and decode time on this worker (`request` is its
    /// prompt tokens, `miss` of them uncached, and its output tokens), by the worker's
    /// [`Timing`]. Time to first token: its queue and its own tokens at the prefill rate,
    /// plus the fixed and decode part of every step they take (a step's budget is shared
    /// with the worker's decodes, one token each), plus its wait for admission
    /// ([`admission_wait`](Self::admission_wait), the running requests generating `output`
    /// tokens). The request's own prefill is weighted as
    /// [`own_prefill_s`](Self::own_prefill_s) says (`miss_weight` 1: its time). A saturated
    /// worker takes an hour more. Decode time: see [`decode_s`](Self::decode_s).
    pub(crate) fn times(
        &self,
        config: &LoadConfig,
        request: RequestShape,
        miss_weight: f64,
    ) -> (f64, f64) {
        // What `ttft_parts(..).total_s()` sums, with the request's own tokens weighted,
        // computed without the parts: this runs for every candidate of every route.
        let RequestShape {
            prompt,
            miss,
            output,
        } = request;
        let t = &self.timing;
        let steps = self.prefill_steps(config, miss);
        let queue = t.prefill_s(self.prefill_tokens as f64, self.prefill_pairs as f64);
        let (decodes, context) = (self.decoding as f64, self.decode_context());
        let overhead = t.step_s(0.0, decodes, context);
        let mut ttft = queue
            + self.own_prefill_s(config, (prompt, miss), miss_weight)
            + steps as f64 * overhead;
        if self.saturated {
            ttft += SATURATED_PENALTY_S;
        }
        if self.must_wait(config, miss, output) {
            ttft += self.admission_wait(config, miss, output).seconds(t);
        }
        let per_step = (decodes + 1.0) * t.step_s_per_decode
            + (context + prompt as f64) * t.step_s_per_context_token;
        (ttft, decode_tokens(config, output) * per_step)
    }

    /// The weighted time of a request's own prefill here (`prompt` tokens, `miss` of them
    /// uncached): its uncached tokens at the worker's rate, once for the request and once
    /// for each request waiting there (each waits for them too), and `miss_weight − 1`
    /// times more at the configured rate (what recomputing them costs the rest of the
    /// fleet, in capacity and in the cache it evicts). That price is the same on every
    /// worker: charged at the worker's own learned rate, it would multiply the noise of
    /// what each worker learned by the weight, and the workers learned a little faster
    /// would draw every cold prompt.
    #[inline]
    fn own_prefill_s(
        &self,
        config: &LoadConfig,
        (prompt, miss): (u64, u64),
        miss_weight: f64,
    ) -> f64 {
        let local = (self.requests - self.decoding) as f64 + 1.0;
        let fleet = (miss_weight - 1.0).max(0.0) * miss as f64 / config.prefill_tokens_per_s;
        self.timing
            .prefill_s(local * miss as f64, attended(prompt, miss) as f64)
            + fleet
    }

    /// A request's predicted time per output token on this worker (`request` is its prompt
    /// tokens, uncached tokens and output tokens): a decode step with it in the batch, plus
    /// the prefill queued here now spread over its output, as the measure of the prefill
    /// chunks its steps will share.
    pub(crate) fn tpot_s(&self, config: &LoadConfig, request: RequestShape) -> f64 {
        let _ = config;
        self.timing.of(&self.tpot_counts(request))
    }

    /// A request's decode step on this worker, at the terms `timing`, with the decodes running there: its time per
    /// output token were no prefill to share its steps. What admission holds a request's
    /// time-per-output-token target to: the prefill queued here now runs before the
    /// request's first token (first come, first served), and what shares its steps after
    /// it is prefill routed later, which no prediction at routing can see. Counting the
    /// queued prefill instead refuses a short answer whose steps would never carry it.
    #[inline]
    fn decode_step_at(&self, timing: &Timing, RequestShape { prompt, .. }: RequestShape) -> f64 {
        let decodes = self.decoding as f64 + 1.0;
        let context = self.decode_context() + prompt as f64;
        timing.step_s(0.0, decodes, context)
    }

    /// The request's predicted times here, as admission checks them and a decision records
    /// them: the one place they are computed. Its time to first token part by part
    /// ([`predicted_parts`](Self::predicted_parts)), its time per output token (the decode
    /// step it would join, at the forecast terms), and that step were the worker idle.
    pub(crate) fn prediction(&self, config: &LoadConfig, shape: RequestShape) -> Prediction {
        let forecast = self.forecast_timing();
        Prediction {
            ttft: self.predicted_parts(config, shape),
            tpot_s: self.decode_step_at(&forecast, shape),
            idle_tpot_s: forecast.step_s(0.0, 1.0, shape.prompt as f64),
        }
    }

    /// The times a decision records when admission checked nothing, at the forecast terms:
    /// the time to first token `forecast_counts` count (the request's
    /// [`forecast_counts`](Self::forecast_counts)), with a saturated worker's hour, and the
    /// decode step of [`prediction`](Self::prediction), without its other parts.
    #[inline]
    pub(crate) fn recorded_prediction(
        &self,
        shape: RequestShape,
        forecast_counts: &TermCounts,
    ) -> (f64, f64) {
        let forecast = self.forecast_timing();
        let saturated = if self.saturated {
            SATURATED_PENALTY_S
        } else {
            0.0
        };
        let ttft_s = forecast.of(forecast_counts) + saturated;
        (ttft_s, self.decode_step_at(&forecast, shape))
    }

    /// The decode step of the requests running on this worker (at least one): what a
    /// running request's time per output token is measured against.
    pub(crate) fn running_step_s(&self) -> f64 {
        let decodes = (self.decoding as f64).max(1.0);
        self.timing.step_s(0.0, decodes, self.decode_context())
    }

    /// The terms [`tpot_s`](Self::tpot_s) counts of each [`Timing`] term.
    pub(crate) fn tpot_counts(
        &self,
        RequestShape { prompt, output, .. }: RequestShape,
    ) -> TermCounts {
        let decodes = self.decoding as f64 + 1.0;
        let context = self.decode_context() + prompt as f64;
        let share = f64::from(output.max(1));
        let queued = (
            self.prefill_tokens as f64 / share,
            self.prefill_pairs as f64 / share,
        );
        TermCounts::new(queued, 1.0, decodes, context)
    }

    /// The parts of the time to first token, each uncached token weighing 1:
    /// [`times`](Self::times) sums them in one go.
    #[inline]
    pub(crate) fn ttft_parts(
        &self,
        config: &LoadConfig,
        RequestShape {
            prompt,
            miss,
            output,
        }: RequestShape,
    ) -> TtftParts {
        let t = &self.timing;
        let steps = self.prefill_steps(config, miss);
        let (decodes, context) = (self.decoding as f64, self.decode_context());
        let overhead = t.step_s(0.0, decodes, context);
        let (wait_s, wait_for_kv) = if self.must_wait(config, miss, output) {
            let wait = self.admission_wait(config, miss, output);
            (wait.seconds(t), wait.for_kv)
        } else {
            (0.0, false)
        };
        let own_s = t.prefill_s(miss as f64, attended(prompt, miss) as f64);
        let own_steps = miss
            .div_ceil(config.step.max_num_batched_tokens as u64)
            .max(1);
        TtftParts {
            queue_s: self.queue_s(),
            drained_s: 0.0,
            own_s,
            idle_s: own_s + own_steps as f64 * t.step_base_s,
            steps_s: steps as f64 * overhead,
            wait_s,
            wait_for_kv,
            saturated: self.saturated,
        }
    }

    /// The terms the time to first token of [`ttft_parts`](Self::ttft_parts) counts of each
    /// [`Timing`] term (without a saturated worker's hour): what a measured time to first
    /// token teaches.
    pub(crate) fn ttft_counts(
        &self,
        config: &LoadConfig,
        RequestShape {
            prompt,
            miss,
            output,
        }: RequestShape,
    ) -> TermCounts {
        let steps = self.prefill_steps(config, miss) as f64;
        let (decodes, context) = (self.decoding as f64, self.decode_context());
        let queue = (self.prefill_tokens + miss) as f64;
        let pairs = (self.prefill_pairs + attended(prompt, miss)) as f64;
        let terms = TermCounts::new((queue, pairs), steps, decodes, context);
        if !self.must_wait(config, miss, output) {
            return terms;
        }
        let wait = self.admission_wait(config, miss, output);
        terms.plus(TermCounts::new((wait.chunk, 0.0), 1.0, decodes, context).times(wait.steps))
    }

    /// The terms the predictions admission checks are made with: the worker's forecast
    /// terms once the host reports timings, else the terms the policies price with.
    #[inline]
    pub(crate) fn forecast_timing(&self) -> Timing {
        self.forecast.map_or(self.timing, |f| f.timing)
    }

    /// This estimate as the predictions admission checks read it: with the worker's
    /// forecast terms (`forecast.rs`) once the host reports timings, else as it is.
    #[inline]
    pub(crate) fn forecasting(&self) -> Estimate {
        match self.forecast {
            Some(f) => Estimate {
                timing: f.timing,
                ..*self
            },
            None => *self,
        }
    }

    /// The parts of a request's predicted time to first token, as admission checks it and
    /// a decision records it: [`ttft_parts`](Self::ttft_parts) at the worker's forecast
    /// terms, with the queued prefill less what the worker prefilled while it was under
    /// way ([`drained`](Self::drained)) and the half step a request arriving mid-step waits
    /// for the one under way to end (while the worker decodes). Without a
    /// [`forecast`](Self::forecast) (a host reporting no timings), `ttft_parts`.
    ///
    /// The policies rank by the load as counted ([`times`](Self::times)): whole prompts
    /// until their first token. That is what a request routed now waits behind in the
    /// worst case, and what keeps the load key a function of counts alone.
    pub(crate) fn predicted_parts(&self, config: &LoadConfig, request: RequestShape) -> TtftParts {
        let Some(forecast) = self.forecast else {
            return self.ttft_parts(config, request);
        };
        let e = self.forecasting();
        let drained = e.drained(config, forecast.under_way_s);
        let mut parts = drained.ttft_parts(config, request);
        parts.drained_s = e.queue_s() - drained.queue_s();
        let step = e.timing.step_s(0.0, e.decoding as f64, e.decode_context());
        parts.steps_s += e.mid_step() * step;
        parts
    }

    /// The terms [`predicted_parts`](Self::predicted_parts) counts of each [`Timing`] term
    /// (without a saturated worker's hour), `counted` being the request's
    /// [`ttft_counts`](Self::ttft_counts): what a measured time to first token teaches the
    /// forecast terms. Without a [`forecast`](Self::forecast), `counted`.
    pub(crate) fn forecast_counts(
        &self,
        config: &LoadConfig,
        request: RequestShape,
        counted: TermCounts,
    ) -> TermCounts {
        let Some(forecast) = self.forecast else {
            return counted;
        };
        let e = self.forecasting();
        let drained = e.drained(config, forecast.under_way_s);
        let terms = if drained.prefill_tokens == e.prefill_tokens {
            counted
        } else {
            drained.ttft_counts(config, request)
        };
        let (decodes, context) = (e.decoding as f64, e.decode_context());
        terms.plus(TermCounts::new((0.0, 0.0), e.mid_step(), decodes, context))
    }

    /// The queued prefill's seconds at the worker's terms, beyond the fixed part of its
    /// steps.
    fn queue_s(&self) -> f64 {
        self.timing
            .prefill_s(self.prefill_tokens as f64, self.prefill_pairs as f64)
    }

    /// The share of a step a request arriving at a random time waits for the step under way
    /// to end: half of one while the worker decodes, none on an idle worker (a queued
    /// prefill's steps are its queue's).
    fn mid_step(&self) -> f64 {
        if self.decoding > 0 { 0.5 } else { 0.0 }
    }

    /// This estimate with its queued prefill less what the worker prefilled in the
    /// `under_way_s` seconds since its last first token: steps of its token budget less its
    /// decodes, each taking a step's time at the worker's terms (the pairs drained in
    /// proportion). A worker slower than its terms drains slower than this: its wait for a
    /// first token is the observed gates' evidence, not the prediction's.
    fn drained(&self, config: &LoadConfig, under_way_s: f32) -> Estimate {
        if self.prefill_tokens == 0 || under_way_s <= 0.0 {
            return *self;
        }
        let queued = self.prefill_tokens as f64;
        let budget = (config.step.max_num_batched_tokens as f64 - self.decoding as f64).max(1.0);
        let chunk = budget.min(queued);
        let pairs_per_token = self.prefill_pairs as f64 / queued;
        let t = &self.timing;
        let step = t.step_s(chunk, self.decoding as f64, self.decode_context())
            + t.prefill_s(0.0, chunk * pairs_per_token);
        let done = (f64::from(under_way_s) / step * chunk).min(queued);
        let left = ((queued - done).ceil() as u64).min(self.prefill_tokens);
        Estimate {
            prefill_tokens: left,
            prefill_pairs: (left as f64 * pairs_per_token) as u64,
            ..*self
        }
    }

    /// Steps the queued prefill and `miss` more tokens take: each step's token budget less
    /// one token per decode.
    #[inline(always)]
    fn prefill_steps(&self, config: &LoadConfig, miss: u64) -> u64 {
        let budget = (config.step.max_num_batched_tokens as u64)
            .saturating_sub(self.decoding)
            .max(1);
        (self.prefill_tokens + miss).div_ceil(budget).max(1)
    }

    /// Whether a request with `miss` uncached tokens generating `output` finds the
    /// worker's running slots or its KV full.
    #[inline]
    fn must_wait(&self, config: &LoadConfig, miss: u64, output: u32) -> bool {
        let seats = self.requests + 1 > config.step.max_num_seqs as u64;
        let capacity = self.kv_capacity_tokens;
        let demand = self.kv_tokens + miss + u64::from(output);
        seats || (capacity > 0 && self.kv_tokens > 0 && demand > capacity)
    }

    /// How long a request with `miss` uncached tokens generating `output` waits for
    /// admission on this worker, the requests running there generating as many: none while
    /// the worker has a free running slot ([`StepModel::max_num_seqs`]) and its KV holds
    /// what its requests add and this one's; past either, until the running requests finish
    /// and free the excess. Each runs `output` steps of a busy worker (a prefill chunk, as
    /// far as prefill is queued, with the decodes), half of them left on average.
    #[cold]
    fn admission_wait(&self, config: &LoadConfig, miss: u64, output: u32) -> Wait {
        let step = &config.step;
        let running = self.decoding.max(1) as f64;
        let seats = (self.requests + 1).saturating_sub(step.max_num_seqs as u64);
        let capacity = self.kv_capacity_tokens;
        let demand = self.kv_tokens + miss + u64::from(output);
        let memory = if capacity == 0 || self.kv_tokens == 0 {
            0.0
        } else {
            demand.saturating_sub(capacity) as f64 / self.kv_tokens as f64
        };
        let excess = (seats as f64 / running).max(memory);
        let decodes = self.decoding as f64;
        let chunk = (step.max_num_batched_tokens as f64 - decodes).max(0.0);
        Wait {
            steps: excess * f64::from(output.max(1)) / 2.0,
            chunk: chunk.min(self.prefill_tokens as f64),
            decodes,
            context: self.decode_context(),
            for_kv: memory > seats as f64 / running,
        }
    }

    /// Seconds a request of `prompt` tokens takes on this worker to decode its `output`
    /// tokens, beyond the fixed part of their steps: every step carries the worker's decodes
    /// and their context with its own, over at most
    /// [`LoadConfig::decode_horizon_tokens`] of them.
    pub(crate) fn decode_s(&self, config: &LoadConfig, prompt: u64, output: u32) -> f64 {
        self.times(config, RequestShape::new(prompt, 0, output), 1.0)
            .1
    }

    /// The worker's load in seconds, for ordering workers that hold alike: its time to a
    /// first token with nothing of a request's own (queued prefill and one step among its
    /// decodes; saturation; the wait for a slot or KV once either is full). A request's
    /// predicted time is this plus [`beyond_load_s`](Self::beyond_load_s).
    #[inline]
    pub(crate) fn load_s(&self, config: &LoadConfig) -> f64 {
        let t = &self.timing;
        let overhead = t.step_s(0.0, self.decoding as f64, self.decode_context());
        let mut load =
            t.prefill_s(self.prefill_tokens as f64, self.prefill_pairs as f64) + overhead;
        if self.saturated {
            load += SATURATED_PENALTY_S;
        }
        if self.must_wait(config, 0, 0) {
            load += self.admission_wait(config, 0, 0).seconds(t);
        }
        load
    }

    /// A request's time to first token and decode time on this worker beyond
    /// [`load_s`](Self::load_s) (`request` is its prompt tokens, `miss` of them uncached,
    /// and its output tokens; each uncached token weighing as in [`times`](Self::times)):
    /// its own prefill, the steps it adds, the longer wait for a slot or KV it makes, and its
    /// decode.
    ///
    /// Every part is at least 0 and grows with each figure of the estimate (requests,
    /// decodes, queued prefill, context, KV, each step term) and with the request's
    /// figures, and the float operations are the same whatever the figures: computed on an
    /// idle worker with the fleet's least terms it is at most what it is on any worker of
    /// the fleet, which is what makes the shortlist exact (`router/shortlist.rs`).
    #[inline]
    pub(crate) fn beyond_load_s(
        &self,
        config: &LoadConfig,
        RequestShape {
            prompt,
            miss,
            output,
        }: RequestShape,
        miss_weight: f64,
    ) -> f64 {
        let t = &self.timing;
        let own = self.own_prefill_s(config, (prompt, miss), miss_weight);
        let (decodes, context) = (self.decoding as f64, self.decode_context());
        let overhead = t.step_s(0.0, decodes, context);
        let more_steps = (self.prefill_steps(config, miss) - 1) as f64 * overhead;
        let longer_wait = if self.must_wait(config, miss, output) {
            let wait = self.admission_wait(config, miss, output).seconds(t);
            let before = if self.must_wait(config, 0, 0) {
                self.admission_wait(config, 0, 0).seconds(t)
            } else {
                0.0
            };
            (wait - before).max(0.0)
        } else {
            0.0
        };
        let per_step = (decodes + 1.0) * t.step_s_per_decode
            + (context + prompt as f64) * t.step_s_per_context_token;
        own + more_steps + longer_wait + decode_tokens(config, output) * per_step
    }
}

/// The output tokens of a request's answer over which its decode time counts the worker's
/// present batch ([`LoadConfig::decode_horizon_tokens`]).
#[inline]
fn decode_tokens(config: &LoadConfig, output: u32) -> f64 {
    f64::from(output.min(config.decode_horizon_tokens))
}

/// A request's wait for admission on a busy worker: `steps` steps, each with a prefill
/// `chunk` and the worker's `decodes` attending to `context` tokens.
#[derive(Clone, Copy, Debug)]
struct Wait {
    steps: f64,
    chunk: f64,
    decodes: f64,
    context: f64,
    /// Whether KV, not a running slot, is what it waits for.
    for_kv: bool,
}

impl Wait {
    /// The wait's seconds by `timing`.
    fn seconds(&self, timing: &Timing) -> f64 {
        self.steps * timing.step_s(self.chunk, self.decodes, self.context)
    }
}

/// A request's predicted times on one worker ([`Estimate::prediction`]).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Prediction {
    /// Its time to first token, part by part.
    pub(crate) ttft: TtftParts,
    /// The decode step it would join: what its time-per-output-token target is held to.
    pub(crate) tpot_s: f64,
    /// Its time per output token on the worker were it idle: a decode step with only its
    /// own context. A target below it no wait can meet.
    pub(crate) idle_tpot_s: f64,
}

/// A request's predicted time to first token on one worker, by part (seconds).
#[derive(Clone, Copy, Debug)]
pub(crate) struct TtftParts {
    /// The prefill queued ahead of it.
    pub(crate) queue_s: f64,
    /// Of the prefill queued when the worker's last first token came, what it is predicted
    /// to have done since (not in `queue_s`).
    pub(crate) drained_s: f64,
    /// Its own uncached prefill.
    pub(crate) own_s: f64,
    /// What it would take on an idle worker: its own prefill and the fixed part of the steps
    /// it takes. A target below it no wait can meet.
    pub(crate) idle_s: f64,
    /// The fixed and decode part of the steps its prefill takes.
    pub(crate) steps_s: f64,
    /// The wait for a running slot or KV.
    pub(crate) wait_s: f64,
    /// Whether that wait is for KV.
    pub(crate) wait_for_kv: bool,
    /// A stale report counting as saturation.
    pub(crate) saturated: bool,
}

impl TtftParts {
    /// The predicted time: a saturated worker takes an hour more.
    #[inline]
    pub(crate) fn total_s(&self) -> f64 {
        let mut time = self.queue_s + self.own_s + self.steps_s;
        if self.saturated {
            time += SATURATED_PENALTY_S;
        }
        time + self.wait_s
    }

    /// Whether the prediction meets a target of `target_s`: the whole time does, or, for a
    /// request that would miss the target on an idle worker too (no worker could meet it),
    /// the rest of the time beyond its own prefill (the wait ahead of it, the steps) is
    /// within `oversized_share` of the target: such a request is served where it delays
    /// little, and refused where the fleet is busy.
    #[inline]
    pub(crate) fn meets(&self, target_s: f64, oversized_share: f64) -> bool {
        meets_target(
            self.total_s(),
            (self.own_s, self.idle_s),
            target_s,
            oversized_share,
        )
    }

    /// What bounds the prediction against a target of `target_s`: the request itself when
    /// even an idle worker would miss the target (no wait helps); a stale report counting
    /// as saturation; else the largest of the queue, the decodes (their share of the steps,
    /// or the wait for a slot) and the wait for KV.
    pub(crate) fn limit(&self, target_s: f64) -> Limit {
        if self.idle_s > target_s {
            return Limit::Prompt;
        }
        if self.saturated {
            return Limit::Stale;
        }
        let (slot_s, kv_s) = if self.wait_for_kv {
            (0.0, self.wait_s)
        } else {
            (self.wait_s, 0.0)
        };
        let decode_s = self.steps_s + slot_s;
        let queue_s = self.queue_s;
        if kv_s >= queue_s && kv_s >= decode_s {
            Limit::Kv
        } else if decode_s > queue_s {
            Limit::Decode
        } else {
            Limit::Queue
        }
    }
}

/// Whether a predicted time to first token of `total_s`, of which `own_s` is the request's
/// own prefill and `idle_s` what it would take on an idle worker, meets a target of
/// `target_s` ([`TtftParts::meets`]).
#[inline]
pub(crate) fn meets_target(
    total_s: f64,
    (own_s, idle_s): (f64, f64),
    target_s: f64,
    oversized_share: f64,
) -> bool {
    total_s <= target_s || (idle_s > target_s && total_s - own_s <= oversized_share * target_s)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::fleet::prediction::estimate::Forecast;

    /// A worker of relative `speed` at its configured terms with `requests` requests,
    /// `decoding` of them decoding, and `prefill` queued tokens (each attending to 3,000),
    /// `context` tokens of context, `kv` tokens of KV of `capacity` (0: unknown).
    fn busy(
        (requests, decoding): (u64, u64),
        (prefill, context, kv, capacity): (u64, u64, u64, u64),
        speed: f64,
    ) -> Estimate {
        Estimate {
            requests,
            decoding,
            prefill_tokens: prefill,
            prefill_pairs: prefill * 3_000,
            context_tokens: context,
            kv_tokens: kv,
            kv_usage: 0.0,
            kv_capacity_tokens: capacity,
            timing: Timing::configured(&LoadConfig::default(), speed),
            speed: speed as f32,
            saturated: false,
            forecast: None,
        }
    }

    proptest! {
        /// `times` sums what `ttft_parts` splits: with no request waiting (each uncached
        /// token then weighs 1) the two agree.
        #[test]
        fn times_sum_the_parts(
            decoding in 0u64..400,
            prefill in 0u64..2_000_000,
            context in 0u64..4_000_000,
            kv in 0u64..2_000_000,
            capacity in prop_oneof![Just(0u64), 100_000u64..4_000_000],
            saturated in any::<bool>(),
            speed in 0.25f64..4.0,
            (prompt, miss, output) in (1u64..100_000, 0u64..100_000, 1u32..4_000),
        ) {
            let e = Estimate {
                saturated,
                ..busy((decoding, decoding), (prefill, context, kv, capacity), speed)
            };
            let config = LoadConfig::default();
            let request = RequestShape::new(prompt, miss.min(prompt), output);
            let whole = e.times(&config, request, 1.0).0;
            let parts = e.ttft_parts(&config, request).total_s();
            // The terms a measured time teaches give the same prediction, but for a
            // saturated worker's hour.
            let terms = e.timing.of(&e.ttft_counts(&config, request));
            let hour = if saturated { SATURATED_PENALTY_S } else { 0.0 };
            prop_assert!(
                (terms + hour - parts).abs() <= 1e-5 * parts.max(1.0),
                "{terms} against {parts}"
            );
            let tpot = e.tpot_s(&config, request);
            let tpot_counts = e.timing.of(&e.tpot_counts(request));
            prop_assert!((tpot - tpot_counts).abs() <= 1e-9 * tpot.max(1.0));
            prop_assert!((whole - parts).abs() <= 1e-9 * whole.max(1.0), "{whole} against {parts}");
            // The load and what the request costs beyond it are the time to first token and
            // the decode time.
            let (ttft, decode) = e.times(&config, request, 10.0);
            let split = e.load_s(&config) + e.beyond_load_s(&config, request, 10.0);
            let sum = ttft + decode;
            prop_assert!((split - sum).abs() <= 1e-9 * sum.max(1.0), "{split} against {sum}");
        }

        /// What a request costs beyond a worker's load is least on an idle worker whose
        /// step terms are at most the worker's: exactly, in floats.
        #[test]
        fn an_idle_worker_with_lesser_terms_costs_least_beyond_its_load(
            requests in 0u64..400,
            decoding_share in 0.0f64..=1.0,
            prefill in 0u64..2_000_000,
            context in 0u64..4_000_000,
            kv in 0u64..2_000_000,
            capacity in prop_oneof![Just(0u64), 100_000u64..4_000_000],
            speed in 0.25f64..4.0,
            lesser in proptest::array::uniform5(0.0f64..=1.0),
            max_num_seqs in 1usize..512,
            (prompt, miss, output) in (1u64..100_000, 0u64..100_000, 0u32..4_000),
            miss_weight in 1.0f64..20.0,
        ) {
            let decoding = (requests as f64 * decoding_share) as u64;
            let e = busy((requests, decoding), (prefill, context, kv, capacity), speed);
            let timing = e.timing;
            let terms = timing.to_array();
            let floor = Estimate {
                timing: Timing::from_array(core::array::from_fn(|i| terms[i] * lesser[i])),
                ..Estimate::default()
            };
            let mut config = LoadConfig::default();
            config.step.max_num_seqs = max_num_seqs;
            let request = RequestShape::new(prompt, miss.min(prompt), output);
            let least = floor.beyond_load_s(&config, request, miss_weight);
            let beyond = e.beyond_load_s(&config, request, miss_weight);
            prop_assert!(least <= beyond, "{least} above {beyond}");
        }

        /// The prediction admission checks and a decision records: without a time under way
        /// it is the load's own; the longer the queue has been
        /// under way, the less of it is left, never below none; the step under way counts
        /// while the worker decodes.
        #[test]
        fn the_prediction_drains_the_queue_under_way(
            (requests, decoding) in (0u64..400, 0.0f64..=1.0)
                .prop_map(|(r, share)| (r, (r as f64 * share) as u64)),
            prefill in 0u64..2_000_000,
            context in 0u64..4_000_000,
            speed in 0.25f64..4.0,
            (earlier, later) in (0.0f32..30.0, 0.0f32..30.0),
            (prompt, miss, output) in (1u64..100_000, 0u64..100_000, 1u32..4_000),
        ) {
            let config = LoadConfig::default();
            let request = RequestShape::new(prompt, miss.min(prompt), output);
            let e = busy((requests, decoding), (prefill, context, 0, 0), speed);
            let told = e.predicted_parts(&config, request).total_s();
            prop_assert_eq!(told, e.ttft_parts(&config, request).total_s());
            let (earlier, later) = (earlier.min(later), earlier.max(later));
            let at = |s: f32| Estimate {
                forecast: Some(Forecast { timing: e.timing, under_way_s: s }),
                ..e
            };
            let (first, then) = (at(earlier), at(later));
            let parts = [first, then].map(|x| x.predicted_parts(&config, request));
            for p in &parts {
                prop_assert!(p.queue_s >= 0.0 && p.drained_s >= 0.0);
                let whole = e.ttft_parts(&config, request);
                prop_assert!((p.queue_s + p.drained_s - whole.queue_s).abs() <= 1e-6 * whole.queue_s.max(1.0));
            }
            prop_assert!(parts[1].queue_s <= parts[0].queue_s);
            for (x, p) in [first, then].iter().zip(&parts) {
                let counted = x.ttft_counts(&config, request);
                let terms = x.timing.of(&x.forecast_counts(&config, request, counted));
                prop_assert!(
                    (terms - p.total_s()).abs() <= 1e-5 * p.total_s().max(1.0),
                    "{terms} against {}", p.total_s()
                );
            }
            let step = e.timing.step_s(0.0, decoding as f64, e.decode_context());
            let mid = if decoding > 0 { step / 2.0 } else { 0.0 };
            let none = at(0.0).predicted_parts(&config, request);
            let whole = e.ttft_parts(&config, request);
            prop_assert!((none.total_s() - whole.total_s() - mid).abs() <= 1e-9 * whole.total_s().max(1.0));
        }
    }
}
