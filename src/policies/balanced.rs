//! Cache score against load score, or predicted time to first token.

use crate::config::float;
use crate::error::Error;
use crate::fleet::{Candidate, LoadConfig, ReloadConfig};
use crate::index::IndexConfig;
use crate::request::RouteRequest;
use crate::router::{CandidateSet, Cost, Policy, PolicyRouter, choose_min};

use super::miss::MissWeight;

/// How [`BalancedRouter`] scores workers.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Scoring {
    /// `alpha · cache_score + (1 − alpha) · load_score`, highest wins.
    Weighted,
    /// Predicted time: the request's time to first token on the worker (its queue, its
    /// uncached tokens at the worker's speed, once more for each request waiting there and
    /// `w − 1` times more at the configured speed, with `w` the [`MissWeight`] (priced by the
    /// fleet's load by default), the steps they take among the
    /// worker's decodes, the wait for a running slot or KV), then its decode in the
    /// worker's batch; lowest wins; equal costs go to the worker handed the least prefill
    /// work so far. The default, and the crate's recommended policy (see the README's
    /// simulator results).
    #[default]
    PredictedTtft,
}

/// Configuration of [`BalancedRouter`].
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct BalancedConfig {
    /// Weight of the cache score against the load score, `0.0..=1.0`. Default 0.5: cache
    /// and load count equally; see [`BalancedRouter`] for the trade-off it sets.
    pub alpha: f64,
    /// Scoring mode. Default [`Scoring::PredictedTtft`].
    pub scoring: Scoring,
    /// How load is read and predicted (the fleet's prefill rate, the step model, report
    /// ages, learned speeds), for [`Scoring::PredictedTtft`].
    pub load: LoadConfig,
    /// For [`Scoring::PredictedTtft`]: how much a token the worker must recompute weighs
    /// against a token already queued there (see [`MissWeight`]). Default
    /// [`MissWeight::Fleet`]: one recomputation on an idle fleet, up to 30 as every worker
    /// queues; [`with_miss_weight`](Self::with_miss_weight)`(w)` fixes it at `w`
    /// (`examples/simulate.rs --miss-weight` compares weights).
    pub miss_weight: MissWeight,
    /// For [`Scoring::PredictedTtft`]: what a second of delay the request's prefill adds to
    /// each request decoding on the worker weighs against a second of the request's own
    /// time. Chunked prefill shares the decode steps, so every token computed there holds
    /// up every answer being decoded there: a token the worker must compute weighs the
    /// [`MissWeight`] plus this times the worker's decoding requests
    /// ([`Candidate::decoding`]). A fleet busy decoding long answers has short prefill
    /// queues, which the fleet's load reads as idle; this prices the recomputation there.
    /// At least 0; default 0.2 (measured on the simulator's `agentic_long` workload at 8×,
    /// answers of 2,000 tokens: 0 kept 90.7 % of the pooled hit ratio, 0.05 95.1 %, 0.2
    /// 97.5 % with a TTFT p99 of 0.27 s against 0.54 s, 1 98.4 % with 0.43 s; the
    /// conversation trace at 4× moved by under 1 % of its hit ratio;
    /// [`PdConfig::stall_weight`](crate::PdConfig::stall_weight) is the disaggregated
    /// router's own, on its plans).
    pub stall_weight: f64,
    /// What a hit below the device tier costs, for [`Scoring::PredictedTtft`]: its reload
    /// time adds to the predicted time to first token. Default [`ReloadConfig::default`].
    pub reload: ReloadConfig,
    /// Hashing and mirror bounds.
    pub index: IndexConfig,
}

impl Default for BalancedConfig {
    fn default() -> Self {
        Self {
            alpha: 0.5,
            scoring: Scoring::PredictedTtft,
            load: LoadConfig::default(),
            miss_weight: MissWeight::default(),
            stall_weight: 0.2,
            reload: ReloadConfig::default(),
            index: IndexConfig::default(),
        }
    }
}

impl BalancedConfig {
    crate::config::setters! {
        /// Sets [`alpha`](Self::alpha).
        with_alpha: alpha: f64;
        /// Sets [`scoring`](Self::scoring).
        with_scoring: scoring: Scoring;
        /// Sets [`load`](Self::load).
        with_load: load: LoadConfig;
        /// Sets [`stall_weight`](Self::stall_weight).
        with_stall_weight: stall_weight: f64;
        /// Sets [`reload`](Self::reload).
        with_reload: reload: ReloadConfig;
        /// Sets [`index`](Self::index).
        with_index: index: IndexConfig;
    }

    /// Sets [`miss_weight`](Self::miss_weight): a number fixes it
    /// ([`MissWeight::Fixed`]), whatever the fleet's load.
    #[must_use]
    pub fn with_miss_weight(mut self, weight: impl Into<MissWeight>) -> Self {
        self.miss_weight = weight.into();
        self
    }

    /// Sets the load model's [`prefill_tokens_per_s`](LoadConfig::prefill_tokens_per_s).
    #[must_use]
    pub fn with_prefill_tokens_per_s(mut self, rate: f64) -> Self {
        self.load.prefill_tokens_per_s = rate;
        self
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] naming the first field out of its range (the index's and
    /// the load model's included); [`Error::InvalidBlockSize`] for a bad block size.
    pub fn validate(&self) -> Result<(), Error> {
        float("alpha", self.alpha, 0.0..=1.0, "between 0.0 and 1.0")?;
        float(
            "stall_weight",
            self.stall_weight,
            0.0..=1e6,
            "between 0.0 and 1e6",
        )?;
        self.miss_weight.validate()?;
        self.load.validate()?;
        self.reload.validate()?;
        self.index.validate()
    }
}

/// Weighs how much of the prompt each worker holds against how loaded it is: the crate's
/// recommended policy.
///
/// **Default: predicted time** ([`Scoring::PredictedTtft`]). For every available worker
/// the router predicts, with the engine's step model ([`StepModel`](crate::StepModel), the
/// one the simulator's engine runs) at the worker's speed ([`Candidate::speed`]):
///
/// - **time to first token**: the prefill queued there ([`Candidate::prefill_tokens`]) and
///   this prompt's uncached tokens at the prefill rate, weighed by the [`MissWeight`] (a
///   recomputed token also costs the fleet capacity and evicts other prefixes, the more so
///   the busier the fleet: one recomputation on an idle fleet, up to 30 once every worker
///   queues half a second; it weighs at least one more for each request waiting there,
///   since each of them waits for it), plus the fixed and
///   per-decode part of every step that takes (the worker's decodes share each step's token
///   budget and stretch its time), plus, once the worker's running slots
///   ([`StepModel::max_num_seqs`](crate::StepModel::max_num_seqs)) or its KV are full, the
///   wait for its running requests to finish and free them;
/// - **decode time**: the request's expected output tokens
///   ([`RouteRequest::with_expected_output`], else
///   [`LoadConfig::default_output_tokens`](crate::LoadConfig::default_output_tokens)), each
///   in a step carrying the worker's decodes and their context, up to
///   [`LoadConfig::decode_horizon_tokens`](crate::LoadConfig::decode_horizon_tokens) of them
///   (beyond, the batch is what the router sends meanwhile, alike on every worker);
/// - plus the reload time of a hit below the device tier;
/// - plus, where the worker's KV capacity is known, its **room**: the request's new tokens
///   (uncached and generated) beyond the KV the worker has free of what the mirror believes
///   it holds ([`Candidate::kv_room_tokens`]) evict cached prefixes, each a miss to come,
///   priced as a miss is now. Sessions then spread before a worker's cache overflows,
///   instead of piling where a shared prompt is and evicting each other's context.
///
/// The cheapest wins; equal costs (a new prefix on an idle fleet) go to the worker handed
/// the least prefill work so far. Load is what the engines report ([`EngineLoad`](crate::EngineLoad),
/// [`Router::report_load`](crate::Router::report_load)) reconciled with this router's own
/// counts; call [`Router::first_token_after`](crate::Router::first_token_after) (or
/// [`first_token`](crate::Router::first_token)) when a first token arrives, or prefill
/// counts as queued until [`complete`](crate::Router::complete). On an idle fleet the cost is
/// the recomputation, so the worker holding the longest prefix wins; when its holders queue
/// while other workers idle, a miss is cheap and the prompt gains a holder there; as the
/// whole fleet fills, a miss costs more and requests wait where their prefix is.
///
/// **Weighted** ([`Scoring::Weighted`]). For every available worker, with `p` the prompt's
/// tokens:
///
/// - `cache_score = cached_tokens / p`, the fraction of the prompt it holds (`0..=1`);
/// - `load_score = 1 − requests / max_requests`, its load relative to the busiest worker
///   (`0..=1`). When all loads are equal every worker gets the same load score (1 on an idle
///   fleet), so the cache score alone decides; the naive min-max normalisation
///   `(max − l) / (max − min)` would divide by zero there;
/// - `score = alpha · cache_score + (1 − alpha) · load_score`; the highest wins, ties go to
///   the worker routed the fewest requests so far, then to a per-request rotation.
///
/// With the default `alpha = 0.5` a worker that holds the whole prompt keeps winning over an
/// idle worker until it carries the most load and the cache advantage is smaller than the
/// load gap.
///
/// In both modes the routed prefix is inserted into the mirror for the chosen worker
/// (optimistically: it will be cached there once the request runs).
///
/// ```
/// use prefix_router::{BalancedRouter, RouteRequest, Router};
///
/// let router = BalancedRouter::new(4)?;
/// let system: Vec<u32> = (0..2_000).collect();
/// let mut workers = Vec::new();
/// for i in 0..20u32 {
///     let prompt: Vec<u32> = system.iter().copied().chain([100_000 + i]).collect();
///     let d = router.route(&RouteRequest::new(&prompt))?;
///     workers.push(d.worker());
///     router.complete(&d);
/// }
/// assert!(workers.iter().all(|&w| w == workers[0]));
/// # Ok::<(), prefix_router::Error>(())
/// ```
pub type BalancedRouter = PolicyRouter<Balanced>;

/// The policy of [`BalancedRouter`].
#[derive(Clone, Copy, Debug)]
pub struct Balanced {
    config: BalancedConfig,
}

impl Balanced {
    /// The policy with `config` (its `index` is the router's business).
    ///
    /// # Errors
    ///
    /// As [`BalancedConfig::validate`].
    pub fn new(config: BalancedConfig) -> Result<Self, Error> {
        config.validate()?;
        Ok(Self { config })
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &BalancedConfig {
        &self.config
    }

    /// [`Scoring::Weighted`]: the highest `alpha · cache + (1 − alpha) · load`.
    fn weighted(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let score = self.weighted_score(request, candidates);
        choose_min(request, candidates, |c| {
            let (cache, load) = score(c);
            cache + load
        })
    }

    /// [`Scoring::Weighted`]'s cost of a candidate among `candidates`, its two terms (minus
    /// the weighted cache score, minus the weighted load score): what
    /// [`weighted`](Self::weighted) ranks by and a receipt shows.
    fn weighted_score(
        &self,
        request: &RouteRequest<'_>,
        candidates: &[Candidate],
    ) -> impl Fn(&Candidate) -> (f64, f64) {
        let max_requests = candidates.iter().map(Candidate::requests).max();
        let max_requests = max_requests.unwrap_or(0);
        let alpha = self.config.alpha;
        let tokens = request.tokens().len();
        move |c: &Candidate| {
            let load = if max_requests == 0 {
                1.0
            } else {
                1.0 - c.requests() as f64 / max_requests as f64
            };
            let cache = if tokens == 0 {
                0.0
            } else {
                c.cached_tokens() as f64 / tokens as f64
            };
            (-alpha * cache, -(1.0 - alpha) * load)
        }
    }

    /// [`Scoring::PredictedTtft`]: the least predicted time.
    fn predicted_ttft(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        choose_min(request, candidates, |c| {
            // Equal costs (an idle fleet, a new prefix): balance the prefill work handed
            // out so far.
            let cost = c.load_ns().saturating_add(self.beyond_load_ns(request, c));
            (cost, c.assigned_prefill_tokens())
        })
    }

    /// [`Scoring::PredictedTtft`]'s cost beyond the candidate's load, in whole
    /// nanoseconds: the load model's time to first token and decode time beyond it
    /// ([`Candidate::predicted_beyond_load_s`]), plus the reload of lower-tier hits and
    /// the KV room's price ([`room_s`](Self::room_s)). With
    /// the load, the load model's time to first token
    /// ([`Candidate::predicted_ttft_s`]) and decode time
    /// ([`Candidate::predicted_decode_s`]) plus the reload.
    #[inline]
    fn beyond_load_ns(&self, request: &RouteRequest<'_>, c: &Candidate) -> u64 {
        let (tokens, miss, output) = self.figures(request, c);
        let (load, miss_weight) = (&self.config.load, self.miss_weight(c));
        let beyond = c.predicted_beyond_load_s(load, tokens, miss, output, miss_weight);
        let room = self.room_s(c, miss, output);
        // Every part grows with the worker's figures (the room's as the worker's room
        // shrinks; an idle worker's is unknown, and costs nothing) and falls with its speed,
        // as the contract of `cost_above_load_ns` asks; the cast is monotone too.
        ((beyond + self.reload_s(c) + room) * 1e9) as u64
    }

    /// Seconds the request's new KV (its uncached tokens `miss` and its `output`) costs
    /// where it overflows the worker's room ([`Candidate::kv_room_tokens`]): each token it
    /// evicts from a cached prefix is a miss to come, priced as a miss is now (at the
    /// configured rate, weighed by the [`MissWeight`]). 0 where the capacity is unknown.
    #[inline]
    fn room_s(&self, c: &Candidate, miss: usize, output: u32) -> f64 {
        // An unknown room is `u32::MAX` tokens: more than any request adds.
        let room = u64::from(c.kv_room);
        let new = miss as u64 + u64::from(output);
        if new <= room {
            return 0.0;
        }
        self.overflow_s(c, new - room)
    }

    /// [`room_s`](Self::room_s) of `overflow` tokens evicted.
    #[cold]
    fn overflow_s(&self, c: &Candidate, overflow: u64) -> f64 {
        let weight = self.config.miss_weight.of(c);
        overflow as f64 * weight / self.config.load.prefill_tokens_per_s
    }

    /// The load model's time to first token and decode time of `c` for `request`.
    #[inline]
    fn terms(&self, request: &RouteRequest<'_>, c: &Candidate) -> (f64, f64) {
        let (tokens, miss, output) = self.figures(request, c);
        let load = &self.config.load;
        c.predicted_times(load, tokens, miss, output, self.miss_weight(c))
    }

    /// What a token `c` must compute weighs: the [`MissWeight`] by the fleet's load, plus
    /// the delay it adds to each request decoding there
    /// ([`BalancedConfig::stall_weight`]). It grows with the worker's decodes and is the
    /// [`MissWeight`]'s alone on an idle worker, as `cost_above_load_ns` asks.
    #[inline]
    fn miss_weight(&self, c: &Candidate) -> f64 {
        self.config.miss_weight.of(c) + self.config.stall_weight * c.decoding() as f64
    }

    /// `request`'s prompt tokens, those of them `c` lacks, and its output tokens (the
    /// configured default when it expects none).
    #[inline]
    fn figures(&self, request: &RouteRequest<'_>, c: &Candidate) -> (usize, usize, u32) {
        let tokens = request.tokens().len();
        let miss = tokens.saturating_sub(c.cached_tokens());
        let output = request
            .expected_output()
            .unwrap_or(self.config.load.default_output_tokens);
        (tokens, miss, output)
    }

    /// Seconds to reload the candidate's hits below the device tier.
    #[inline]
    fn reload_s(&self, c: &Candidate) -> f64 {
        if c.cached_tokens_at(crate::tree::Tier::Device) < c.cached_tokens() {
            self.config.reload.candidate_seconds(c) / c.speed()
        } else {
            0.0
        }
    }
}

impl PolicyRouter<Balanced> {
    /// A router over workers `0..num_workers` with the default configuration.
    ///
    /// # Errors
    ///
    /// [`Error::WorkerOutOfRange`] when `num_workers` exceeds
    /// [`RadixTree::MAX_WORKERS`](crate::RadixTree::MAX_WORKERS).
    pub fn new(num_workers: u32) -> Result<Self, Error> {
        Self::with_config(num_workers, BalancedConfig::default())
    }

    /// A router with `config`.
    ///
    /// # Errors
    ///
    /// As [`new`](Self::new); as [`BalancedConfig::validate`].
    pub fn with_config(num_workers: u32, config: BalancedConfig) -> Result<Self, Error> {
        Self::with_policy_and_load(
            num_workers,
            Balanced::new(config)?,
            config.index,
            config.load,
        )
    }

    /// The configuration.
    #[must_use]
    pub fn config(&self) -> &BalancedConfig {
        self.policy().config()
    }
}

impl Policy for Balanced {
    fn name(&self) -> &'static str {
        match self.config.scoring {
            Scoring::Weighted => "balanced_weighted",
            Scoring::PredictedTtft => "balanced",
        }
    }

    fn reads_cache(&self) -> bool {
        true
    }

    /// With predicted time the shortlist is exact: [`Policy::cost_above_load_ns`] bounds
    /// what a worker holding alike can cost by its load.
    fn candidates(&self) -> CandidateSet {
        match self.config.scoring {
            Scoring::PredictedTtft => CandidateSet::LeastLoadedPerMatch,
            Scoring::Weighted => CandidateSet::All,
        }
    }

    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        match self.config.scoring {
            Scoring::Weighted => self.weighted(request, candidates),
            Scoring::PredictedTtft => self.predicted_ttft(request, candidates),
        }
    }

    fn cost_above_load_ns(&self, request: &RouteRequest<'_>, c: &Candidate) -> Option<u64> {
        match self.config.scoring {
            Scoring::Weighted => None,
            Scoring::PredictedTtft => Some(self.beyond_load_ns(request, c)),
        }
    }

    fn cost(&self, request: &RouteRequest<'_>, c: &Candidate) -> Option<Cost> {
        Some(match self.config.scoring {
            Scoring::PredictedTtft => {
                let (ttft, decode) = self.terms(request, c);
                let (_, miss, output) = self.figures(request, c);
                Cost::of(&[
                    ("ttft_s", ttft),
                    ("decode_s", decode),
                    ("reload_s", self.reload_s(c)),
                    ("kv_room_s", self.room_s(c, miss, output)),
                ])
            }
            // Its load term is relative to the busiest candidate: explained over the whole
            // set, by `costs`.
            Scoring::Weighted => return None,
        })
    }

    fn costs(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Vec<Option<Cost>> {
        match self.config.scoring {
            Scoring::Weighted => {
                let score = self.weighted_score(request, candidates);
                let cost = |(cache, load)| {
                    Cost::of(&[("minus_cache_score", cache), ("minus_load_score", load)])
                };
                candidates.iter().map(|c| Some(cost(score(c)))).collect()
            }
            Scoring::PredictedTtft => candidates.iter().map(|c| self.cost(request, c)).collect(),
        }
    }
}
