//! llm-d's default scheduling profile: three weighted scorers summed, the highest total
//! wins.
//!
//! Read in `llm-d/llm-d-inference-scheduler` at commit
//! `520af47896e5f06e43d09aca281a1149187b0ffd` (Go module `github.com/llm-d/llm-d-router`,
//! which now holds the endpoint picker of `gateway-api-inference-extension`):
//!
//! - `pkg/epp/config/loader/defaults.go`: the default profile is the queue scorer (weight
//!   2), the KV-cache utilisation scorer (2) and the prefix-cache scorer (3), no filter, and
//!   a max-score picker added when none is configured;
//! - `pkg/epp/scheduling/scheduler_profile.go`: an endpoint's total is the sum of each
//!   scorer's score, clamped to `0..=1`, times its weight;
//! - `pkg/epp/framework/plugins/scheduling/scorer/queuedepth/queue.go`: `(max - q) / (max -
//!   min)` of the endpoints' waiting queues (`num_requests_waiting`), 1 for all when they
//!   are equal;
//! - `.../scorer/kvcacheutilization/kvcache_utilization.go`: `1 - KV usage`;
//! - `.../scorer/prefix/plugin.go`: matched blocks over the prompt's blocks;
//! - `.../picker/maxscore/picker.go`: shuffles, then takes the highest score (random among
//!   ties);
//! - `pkg/epp/framework/plugins/requestcontrol/dataproducer/approximateprefix/`
//!   (`types.go`, `hashing.go`, `plugin.go`): the default prefix index hashes the request
//!   body in blocks of 16 tokens (the engine's block size when it reports one) times 4
//!   characters a token, the trailing partial block included, at most 256 blocks, into an
//!   LRU of 31,250 blocks per server (the engine's block count when reported); a block
//!   counts for the servers holding it until the first block no server holds.
//!
//! Modelled: the three scorers, their weights and the picker. The prefix score is the
//! mirror's matched blocks over the prompt's whole blocks, both capped at 256: tokens, not
//! characters, as llm-d's precise prefix scorer (`scorer/preciseprefixcache/`, fed by KV
//! events) counts them; a prompt shorter than a block scores 0 everywhere, as in llm-d. The
//! queue is [`Candidate::waiting`]: the engine's reported waiting requests plus this
//! router's since (requests awaiting their first token when no report came). KV usage is
//! the engine's last report ([`Candidate::kv_usage`], 0 without a fresh one).
//!
//! Under admission the saturation detector and the legacy admission controller refuse
//! sheddable requests (`shedding.rs`). Left out: flow control (the admission queue ahead of
//! scheduling, behind a feature gate off by default), the precise scorer's per-tier weights (a block counts alike at every tier
//! here), the approximate index's own LRU (the mirror's capacity bounds it instead),
//! prefill/decode and data-parallel profiles, LoRA affinity.

use prefix_router::{Admit, Candidate, Policy, RouteRequest, choose_min};

use super::full_blocks;
use super::shedding::llmd_admit;

/// The queue scorer's weight in the default profile.
pub(crate) const QUEUE_WEIGHT: f64 = 2.0;
/// The KV-cache utilisation scorer's weight.
pub(crate) const KV_WEIGHT: f64 = 2.0;
/// The prefix-cache scorer's weight.
pub(crate) const PREFIX_WEIGHT: f64 = 3.0;
/// Blocks of a prompt the prefix index considers at most.
pub(crate) const MAX_PREFIX_BLOCKS: usize = 256;

/// llm-d's default profile over the mirror's blocks of `block_size` tokens.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Llmd {
    block_size: usize,
}

impl Llmd {
    /// The policy for a mirror of blocks of `block_size` tokens.
    pub(crate) fn new(block_size: usize) -> Self {
        Self { block_size }
    }

    /// The weighted total of `c` (higher wins): `queue` is the smallest and largest waiting
    /// queue among the candidates, `blocks` the prompt's blocks the prefix scorer counts.
    pub(crate) fn score(c: &Candidate, queue: (u64, u64), blocks: usize) -> f64 {
        let (least, most) = queue;
        let queue_score = if most == least {
            1.0
        } else {
            (most - c.waiting()) as f64 / (most - least) as f64
        };
        let kv_score = 1.0 - c.kv_usage();
        let prefix_score = if blocks == 0 {
            0.0
        } else {
            c.matched_blocks().min(blocks) as f64 / blocks as f64
        };
        QUEUE_WEIGHT * queue_score.clamp(0.0, 1.0)
            + KV_WEIGHT * kv_score.clamp(0.0, 1.0)
            + PREFIX_WEIGHT * prefix_score.clamp(0.0, 1.0)
    }
}

impl Policy for Llmd {
    fn name(&self) -> &'static str {
        "llmd"
    }

    fn reads_cache(&self) -> bool {
        true
    }

    /// The project's own admission rule (`shedding.rs`).
    fn admit(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> Admit {
        llmd_admit(request.priority(), candidates)
    }

    /// The highest weighted total. No [`cost`](Policy::cost): the queue score is relative to
    /// the other candidates, which a single candidate's cost does not see.
    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let waiting = candidates.iter().map(Candidate::waiting);
        let least = waiting.clone().min().unwrap_or(0);
        let most = waiting.max().unwrap_or(0);
        let blocks = full_blocks(request.tokens().len(), self.block_size).min(MAX_PREFIX_BLOCKS);
        choose_min(request, candidates, |c| {
            -Self::score(c, (least, most), blocks)
        })
    }
}
