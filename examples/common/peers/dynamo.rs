//! Dynamo's KV router (its default worker selector): a cost in blocks per worker, the
//! lowest wins.
//!
//! Read in `ai-dynamo/dynamo` (too large to clone here; single files read from a stored
//! index):
//!
//! - `lib/kv-router/src/scheduling/selector/default.rs` and `selector/mod.rs` at commit
//!   `07a6c9ce3bb096cfaf353fe69ee578e105c6a512`: the cost (logit) of a worker is
//!   `prefill_load_scale * max(raw_prefill_blocks - overlap_credit_blocks, 0) +
//!   decode_blocks + decode_active_request_weight * active_requests`, where
//!   `raw_prefill_blocks` is the prefill tokens the router tracks as active on the worker
//!   plus this request's prompt, over the block size, and `overlap_credit_blocks` is
//!   `overlap_score_credit * device + host_cache_hit_weight * host + disk_cache_hit_weight *
//!   disk` overlap blocks (plus a shared-cache term); at temperature 0 the lowest cost wins,
//!   ties drawn at random;
//! - `lib/kv-router/src/scheduling/config.rs` at commit
//!   `0243c51bb6e8958be89df4978b5761677c9adc23`: the defaults `overlap_score_credit` 1.0,
//!   `prefill_load_scale` 1.0, `host_cache_hit_weight` 0.75, `disk_cache_hit_weight` 0.25,
//!   `router_temperature` 0, `shared_cache_multiplier` 0, `router_track_output_blocks`
//!   false, `router_assume_kv_reuse` true; a later stored version of the same file (whose
//!   commit the index did not record) adds `decode_active_request_weight` and
//!   `overlap_score_credit_decay`, both 0 by default;
//! - `lib/kv-router/src/sequences/prompt_registry.rs` at commit
//!   `312d34274a83ad625ac6927b21b31062f32bba6c`: `decode_blocks` is the blocks of the
//!   worker's active requests (their prompts, each block counted once) plus this request's
//!   blocks not shared with them;
//! - the sequence trackers under `lib/kv-router/src/sequences/` (versions stored without
//!   a commit): a request adds its prompt less the overlap it was routed with to its
//!   worker's active prefill tokens until its prefill is marked completed, and its blocks
//!   until it is freed.
//!
//! Modelled: that cost with those defaults. The active prefill tokens are
//! [`Candidate::prefill_tokens`] (this router's requests awaiting their first token, or the
//! engine's reported pending prefill when larger); the overlap is the mirror's blocks by tier
//! ([`Candidate::cached_tokens_at`]), the remote tier getting the shared-cache multiplier, 0.
//! The decode blocks are [`Candidate::context_tokens`] over the block size plus the prompt's
//! whole blocks: each request's blocks counted for it, as Dynamo does with
//! `router_assume_kv_reuse` false (the candidate's counts carry no block identities to count
//! a shared block once), and with their outputs, as Dynamo does with
//! `router_track_output_blocks` (the candidate's context includes them). Active requests are
//! [`Candidate::in_flight`] (weight 0 by default).
//!
//! Under admission the busy thresholds refuse requests (`shedding.rs`). Left out: the
//! router's request queue (`router_queue_threshold`),
//! temperature sampling (off by default), the overlap-credit decay (off by default),
//! prefill/decode disaggregation and its conditional variants, replica sync, the
//! prefill-load model (off by default).

use prefix_router::{Admit, Candidate, Cost, Policy, RouteRequest, Tier, choose_min};

use super::full_blocks;
use super::shedding::dynamo_admit;

/// Dynamo's default selector over the mirror's blocks of `block_size` tokens.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Dynamo {
    block_size: usize,
    /// Credit for a block cached on the device.
    pub(crate) overlap_score_credit: f64,
    /// Credit for a block cached in host memory.
    pub(crate) host_cache_hit_weight: f64,
    /// Credit for a block cached on local disk.
    pub(crate) disk_cache_hit_weight: f64,
    /// Credit for a block in a shared (remote) store.
    pub(crate) shared_cache_multiplier: f64,
    /// Scale of the prefill term once the credit is taken off.
    pub(crate) prefill_load_scale: f64,
    /// Cost of each active request, in blocks.
    pub(crate) decode_active_request_weight: f64,
}

/// A worker's cost, term by term, in blocks.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) struct DynamoCost {
    /// `prefill_load_scale * max(raw_prefill_blocks - overlap_credit_blocks, 0)`.
    pub(crate) prefill: f64,
    /// Blocks the worker's requests would hold with this one.
    pub(crate) decode: f64,
    /// `decode_active_request_weight * active_requests`.
    pub(crate) active: f64,
}

impl DynamoCost {
    /// The cost: the sum of the terms.
    pub(crate) fn total(&self) -> f64 {
        self.prefill + self.decode + self.active
    }
}

impl Dynamo {
    /// The policy with Dynamo's defaults, for a mirror of blocks of `block_size` tokens.
    pub(crate) fn new(block_size: usize) -> Self {
        Self {
            block_size: block_size.max(1),
            overlap_score_credit: 1.0,
            host_cache_hit_weight: 0.75,
            disk_cache_hit_weight: 0.25,
            shared_cache_multiplier: 0.0,
            prefill_load_scale: 1.0,
            decode_active_request_weight: 0.0,
        }
    }

    /// The credit, in blocks, for what `c` holds of the prompt at each tier.
    fn overlap_credit_blocks(&self, c: &Candidate) -> f64 {
        let blocks = |tier| (c.cached_tokens_at(tier) / self.block_size) as f64;
        self.overlap_score_credit * blocks(Tier::Device)
            + self.host_cache_hit_weight * blocks(Tier::Host)
            + self.disk_cache_hit_weight * blocks(Tier::Disk)
            + self.shared_cache_multiplier * blocks(Tier::Remote)
    }

    /// The cost of sending a prompt of `prompt` tokens to `c`.
    pub(crate) fn cost_of(&self, prompt: usize, c: &Candidate) -> DynamoCost {
        let size = self.block_size as f64;
        let raw_prefill_blocks = (c.prefill_tokens() as f64 + prompt as f64) / size;
        let adjusted = (raw_prefill_blocks - self.overlap_credit_blocks(c)).max(0.0);
        let active_blocks = c.context_tokens() / self.block_size as u64;
        let decode = active_blocks as f64 + full_blocks(prompt, self.block_size) as f64;
        DynamoCost {
            prefill: self.prefill_load_scale * adjusted,
            decode,
            active: self.decode_active_request_weight * c.in_flight() as f64,
        }
    }
}

impl Policy for Dynamo {
    fn name(&self) -> &'static str {
        "dynamo"
    }

    fn reads_cache(&self) -> bool {
        true
    }

    /// The project's own admission rule (`shedding.rs`).
    fn admit(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Admit {
        let _ = request;
        dynamo_admit(candidates)
    }

    /// The lowest cost.
    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let prompt = request.tokens().len();
        choose_min(request, candidates, |c| self.cost_of(prompt, c).total())
    }

    fn cost(&self, request: &RouteRequest<'_>, candidate: &Candidate) -> Option<Cost> {
        let cost = self.cost_of(request.tokens().len(), candidate);
        Some(Cost::of(&[
            ("prefill_blocks", cost.prefill),
            ("decode_blocks", cost.decode),
            ("active_requests", cost.active),
        ]))
    }
}
