//! [`Candidate`]: a worker as the fleet model offers it to a policy, with its load snapshot,
//! the mirror's prediction of what it holds of the prompt, and the predictions over both.

use smallvec::SmallVec;

use super::config::LoadConfig;
use super::prediction::estimate::{Estimate, RequestShape};
use crate::tree::Held;
use crate::tree::{Tier, WorkerId};

/// Candidates of one route call; on the stack for fleets of up to 64 workers.
pub(crate) type Candidates = SmallVec<[Candidate; 64]>;

/// A worker the router offers a [`Policy`](crate::Policy), with the load figures and the cache prediction
/// it may score on.
///
/// Loads are a snapshot taken just before the policy runs: other threads may route to the
/// same workers meanwhile, so they are estimates, as a worker's own report is. Where the
/// engine reports its load ([`Router::report_load`](crate::Router::report_load)), the figures are its last report
/// reconciled with this router's own counts since (see [`EngineLoad`](crate::EngineLoad)); a report past its
/// age counts as [`LoadConfig::staleness`] says.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Candidate {
    pub(crate) worker: WorkerId,
    pub(crate) epoch: u64,
    pub(crate) in_flight: u64,
    pub(crate) routed: u64,
    pub(crate) assigned_prefill: u64,
    /// The worker's load key (see [`Candidate::load_ns`]).
    pub(crate) load_ns: u64,
    pub(crate) estimate: Estimate,
    pub(crate) matched_blocks: u32,
    pub(crate) cached_tokens: u32,
    /// Cached tokens by [`Tier::index`].
    pub(crate) cached_by_tier: [u32; 4],
    /// The fleet's load when the request was routed (see [`Candidate::fleet_load`]): the
    /// same for every candidate of one request. An `f32`: it fits where the struct had
    /// padding, and a candidate is copied on every route.
    pub(crate) fleet_load: f32,
    /// KV tokens the worker has free beyond what the mirror believes it holds
    /// (`u32::MAX`: its capacity is unknown; see [`Candidate::kv_room_tokens`]). It fits
    /// where the struct had padding.
    pub(crate) kv_room: u32,
}

impl Candidate {
    /// A worker with the load figures `estimate` that has been routed nothing and holds
    /// nothing; its id is the highest.
    pub(crate) fn idle(estimate: Estimate) -> Candidate {
        Candidate {
            worker: WorkerId::new(u32::MAX),
            epoch: 0,
            in_flight: 0,
            routed: 0,
            assigned_prefill: 0,
            load_ns: 0,
            estimate,
            matched_blocks: 0,
            cached_tokens: 0,
            cached_by_tier: [0; 4],
            fleet_load: 0.0,
            kv_room: u32::MAX,
        }
    }

    /// Records the fleet's load at routing ([`fleet_load`](Self::fleet_load)).
    #[inline]
    pub(crate) fn set_fleet_load(&mut self, load: f32) {
        self.fleet_load = load;
    }

    /// Records that the mirror believes the worker holds `held_tokens` tokens, at any tier:
    /// its room is its KV capacity beyond them, where the capacity is known.
    #[inline]
    pub(crate) fn set_held_tokens(&mut self, held_tokens: u64) {
        let capacity = self.estimate.kv_capacity_tokens;
        self.kv_room = if capacity == 0 {
            u32::MAX
        } else {
            u32::try_from(capacity.saturating_sub(held_tokens)).unwrap_or(u32::MAX - 1)
        };
    }

    /// Counts the whole prompt of `tokens` cached: a decode worker receiving it from a
    /// prefill worker prefills none of it.
    pub(crate) fn assume_cached(&mut self, tokens: usize) {
        self.cached_tokens = u32::try_from(tokens).unwrap_or(u32::MAX);
    }

    /// Records what the mirror says the worker holds of the prompt, in blocks.
    #[inline]
    pub(crate) fn hold(&mut self, held: Held) {
        self.matched_blocks = held.blocks;
        self.cached_by_tier = held.by_tier;
    }

    /// Turns the blocks [`hold`](Self::hold) recorded into tokens: `block_size` a block, at
    /// most the prompt's `tokens`.
    pub(crate) fn set_cached(&mut self, block_size: usize, tokens: usize) {
        let cached = (self.matched_blocks as usize * block_size).min(tokens);
        self.cached_tokens = u32::try_from(cached).unwrap_or(u32::MAX);
        let size = u32::try_from(block_size).unwrap_or(u32::MAX);
        self.cached_by_tier = self.cached_by_tier.map(|b| b.saturating_mul(size));
    }

    /// The fleet's load when the request was routed, from 0 (every worker idle) to 1 (every
    /// worker busy): the mean over the registered workers of their
    /// [`load_ns`](Self::load_ns) capped at [`LoadConfig::busy_horizon`], beyond an idle
    /// worker's (one step of the fleet's least fixed time), as a share of the horizon
    /// beyond it. The same for every candidate of one request.
    #[inline]
    #[must_use]
    pub fn fleet_load(&self) -> f64 {
        f64::from(self.fleet_load)
    }

    /// The KV tokens the worker has free, as far as the router knows: its capacity (told
    /// by [`WorkerProfile::kv_capacity_tokens`](crate::WorkerProfile::kv_capacity_tokens) or
    /// reported in [`EngineLoad::kv_blocks_total`](crate::EngineLoad::kv_blocks_total))
    /// beyond the blocks the mirror believes it holds, cached or in use. `None` when the
    /// capacity is unknown. A request whose new tokens (those it computes and generates)
    /// exceed it evicts cached prefixes there.
    #[inline]
    #[must_use]
    pub fn kv_room_tokens(&self) -> Option<u64> {
        (self.kv_room != u32::MAX).then_some(u64::from(self.kv_room))
    }

    /// The worker.
    #[inline]
    #[must_use]
    pub fn worker(&self) -> WorkerId {
        self.worker
    }

    /// Requests routed to it by this router and not completed, and with replica sync its
    /// peers' (see [`Router::apply_replica_sync`](crate::Router::apply_replica_sync)).
    #[inline]
    #[must_use]
    pub fn in_flight(&self) -> u64 {
        self.in_flight
    }

    /// Requests on the worker, waiting or running: this router's in-flight count, or the
    /// engine's reported count with this router's since when that is larger (it includes
    /// other routers' traffic).
    #[inline]
    #[must_use]
    pub fn requests(&self) -> u64 {
        self.estimate.requests
    }

    /// Of [`requests`](Self::requests), those decoding (past their first token).
    #[inline]
    #[must_use]
    pub fn decoding(&self) -> u64 {
        self.estimate.decoding
    }

    /// Of [`requests`](Self::requests), those waiting for or in their prefill.
    #[inline]
    #[must_use]
    pub fn waiting(&self) -> u64 {
        self.estimate.requests - self.estimate.decoding
    }

    /// Uncached prompt tokens to prefill on the worker before a new request's: this
    /// router's requests whose first token has not come (see [`Router::first_token`](crate::Router::first_token)), or
    /// the engine's reported pending prefill with this router's routes since, when larger;
    /// with [`LoadConfig::prefill_from_report`](crate::LoadConfig::prefill_from_report), a
    /// fresh report's figure alone (it counts the progress of prefills under way).
    #[inline]
    #[must_use]
    pub fn prefill_tokens(&self) -> u64 {
        self.estimate.prefill_tokens
    }

    /// Tokens of context the worker's requests hold: this router's in-flight prompts, or
    /// the reported KV usage times the worker's capacity when known and larger.
    #[inline]
    #[must_use]
    pub fn context_tokens(&self) -> u64 {
        self.estimate.context_tokens
    }

    /// The fraction of KV in use the engine last reported (0 without a fresh report).
    #[inline]
    #[must_use]
    pub fn kv_usage(&self) -> f64 {
        f64::from(self.estimate.kv_usage)
    }

    /// The worker's speed relative to the configured one
    /// ([`LoadConfig::prefill_tokens_per_s`]): its [`WorkerProfile`](crate::WorkerProfile)'s, corrected by the
    /// timings the host reported ([`Router::first_token_after`](crate::Router::first_token_after)).
    #[inline]
    #[must_use]
    pub fn speed(&self) -> f64 {
        f64::from(self.estimate.speed)
    }

    /// Whether the engine's report is past its age and counts as saturation
    /// ([`Staleness::Saturated`](crate::Staleness::Saturated)).
    #[inline]
    #[must_use]
    pub fn saturated(&self) -> bool {
        self.estimate.saturated
    }

    /// The load model's predicted time to first token, in seconds, for a request of
    /// `prompt` tokens, `miss` of them uncached here, each weighing `miss_weight`,
    /// generating `output` tokens (see [`BalancedRouter`](crate::BalancedRouter)). It
    /// counts each queued prompt whole until its first token at the terms the policies
    /// price with; admission's check and
    /// [`RouteDecision::predicted_ttft_s`](crate::RouteDecision::predicted_ttft_s) forecast
    /// it once the host reports timings (`docs/admission.md`).
    #[must_use]
    pub fn predicted_ttft_s(
        &self,
        config: &LoadConfig,
        prompt: usize,
        miss: usize,
        output: u32,
        miss_weight: f64,
    ) -> f64 {
        self.predicted_times(config, prompt, miss, output, miss_weight)
            .0
    }

    /// The worker's load, in whole nanoseconds: the load model's time to a first token of a
    /// request with nothing of its own (the prefill queued there, a step among its decodes,
    /// the wait for a running slot or KV once either is full; an hour more when its report
    /// counts as saturation). Of workers holding a prompt alike, the least loaded is the one
    /// of lowest load (see [`CandidateSet::LeastLoadedPerMatch`](crate::CandidateSet)).
    #[inline]
    #[must_use]
    pub fn load_ns(&self) -> u64 {
        self.load_ns
    }

    /// The load model's predicted time to first token and decode time, in seconds, beyond
    /// [`load_ns`](Self::load_ns), for a request of `prompt` tokens, `miss` of them uncached
    /// here, each weighing `miss_weight`, generating `output` tokens: its own prefill, the
    /// steps it adds, the longer wait for a slot or KV it makes, and its decode.
    /// [`predicted_ttft_s`](Self::predicted_ttft_s) plus
    /// [`predicted_decode_s`](Self::predicted_decode_s) is the load and this.
    ///
    /// It is least on an idle worker with the fleet's least step terms, which a policy
    /// relies on when its [`Policy::cost_above_load_ns`](crate::Policy::cost_above_load_ns)
    /// is built on it.
    #[must_use]
    pub fn predicted_beyond_load_s(
        &self,
        config: &LoadConfig,
        prompt: usize,
        miss: usize,
        output: u32,
        miss_weight: f64,
    ) -> f64 {
        let request = RequestShape::new(prompt as u64, miss as u64, output);
        self.estimate.beyond_load_s(config, request, miss_weight)
    }

    /// [`predicted_ttft_s`](Self::predicted_ttft_s) and
    /// [`predicted_decode_s`](Self::predicted_decode_s), computed together.
    #[must_use]
    pub fn predicted_times(
        &self,
        config: &LoadConfig,
        prompt: usize,
        miss: usize,
        output: u32,
        miss_weight: f64,
    ) -> (f64, f64) {
        let request = RequestShape::new(prompt as u64, miss as u64, output);
        self.estimate.times(config, request, miss_weight)
    }

    /// The load model's time, in seconds, for a request of `prompt` tokens to decode
    /// `output` tokens in this worker's batch, beyond the fixed part of its steps (see
    /// [`BalancedRouter`](crate::BalancedRouter)): the first
    /// [`LoadConfig::decode_horizon_tokens`] of them, the part of the answer the worker's
    /// present decodes share.
    #[must_use]
    pub fn predicted_decode_s(&self, config: &LoadConfig, prompt: usize, output: u32) -> f64 {
        self.estimate.decode_s(config, prompt as u64, output)
    }

    /// Requests routed to it since it was added.
    #[inline]
    #[must_use]
    pub fn routed(&self) -> u64 {
        self.routed
    }

    /// Uncached prompt tokens of every request routed to it since it was added: the prefill
    /// work it was handed in all.
    #[inline]
    #[must_use]
    pub fn assigned_prefill_tokens(&self) -> u64 {
        self.assigned_prefill
    }

    /// Leading blocks of the prompt the mirror believes the worker holds (0 unless the
    /// policy [reads the cache](crate::Policy::reads_cache)).
    #[inline]
    #[must_use]
    pub fn matched_blocks(&self) -> usize {
        self.matched_blocks as usize
    }

    /// Prompt tokens the worker is predicted to have cached: its matched blocks, at most the
    /// prompt (0 unless the policy [reads the cache](crate::Policy::reads_cache)).
    #[inline]
    #[must_use]
    pub fn cached_tokens(&self) -> usize {
        self.cached_tokens as usize
    }

    /// Of [`cached_tokens`](Self::cached_tokens), those the worker holds at `tier` (each
    /// block counted at the best tier holding it).
    #[inline]
    #[must_use]
    pub fn cached_tokens_at(&self, tier: Tier) -> usize {
        self.cached_by_tier[tier.index()] as usize
    }
}
