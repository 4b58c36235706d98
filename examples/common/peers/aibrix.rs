//! AIBrix's `prefix-cache` routing algorithm: the pod holding the longest part of the
//! prompt, unless its running requests are past the mean plus one standard deviation; the
//! least-request pod when the load is imbalanced beyond 8 requests or nothing matches.
//!
//! Read in `vllm-project/aibrix` at commit `e3e10f9e4aebe9aac5e7d992fb87d2648e01628b`:
//!
//! - `pkg/plugins/gateway/algorithms/prefix_cache.go` (`routeOriginal` and its helpers):
//!   when the largest and smallest running-request counts across ready pods differ by more
//!   than 8 (`AIBRIX_PREFIX_CACHE_POD_RUNNING_REQUEST_IMBALANCE_ABS_COUNT`), only the pods at
//!   the smallest count are matched; the matched pods are sorted by match percentage,
//!   highest first, then by running requests, fewest first (after a shuffle, so ties are
//!   random), and the first whose count is at most the mean plus 1
//!   (`AIBRIX_PREFIX_CACHE_STANDARD_DEVIATION_FACTOR`) standard deviation of all ready pods'
//!   counts wins; with no matched pod, or none within that bound, the pod with the fewest
//!   running requests (random among ties);
//! - `pkg/plugins/gateway/algorithms/least_request.go` (`getRequestCounts`): the counts are
//!   the gateway's own running requests per pod;
//! - `pkg/plugins/gateway/algorithms/util.go`: the standard deviation is the sample one
//!   (divided by `n - 1`, 0 for one pod);
//! - `pkg/utils/prefixcacheindexer/hash.go`: the index hashes the tokenizer's output (the
//!   `character` tokenizer by default: the prompt's bytes) in whole blocks of 4
//!   (`AIBRIX_PREFIX_CACHE_BLOCK_SIZE`), in one LRU of 200,000 blocks for all pods whose
//!   entries expire after 20 minutes unused; a pod's match percentage is its leading blocks
//!   held times 100 over the prompt's blocks, in whole percent; pods holding no block do not
//!   match.
//!
//! Modelled: that rule, the counts being [`Candidate::in_flight`] (this router's requests
//! not completed, as AIBrix's gateway counts its own), the match percentage being the
//! mirror's matched blocks over the prompt's whole blocks of the mirror's size (16 tokens by
//! default, not 4 characters).
//!
//! Left out: the KV-event-synced index variant (off by default; it needs AIBrix's remote
//! tokenizer), the index's 20-minute expiry and global capacity (the mirror's capacity
//! bounds it instead), multi-port pods.

use std::cmp::Reverse;

use prefix_router::{Candidate, Policy, RouteRequest, choose_min};

use super::full_blocks;

/// Running requests between the busiest and the idlest pod beyond which the load counts as
/// imbalanced.
pub(crate) const IMBALANCE_ABS_COUNT: u64 = 8;
/// Standard deviations above the mean a matched pod's running requests may be.
pub(crate) const STD_DEV_FACTOR: f64 = 1.0;

/// AIBrix's `prefix-cache` algorithm over the mirror's blocks of `block_size` tokens.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Aibrix {
    block_size: usize,
}

impl Aibrix {
    /// The policy for a mirror of blocks of `block_size` tokens.
    pub(crate) fn new(block_size: usize) -> Self {
        Self { block_size }
    }

    /// The whole percent of a prompt of `prompt` tokens that `c` holds (0 for a prompt of
    /// no whole block).
    pub(crate) fn match_percent(&self, prompt: usize, c: &Candidate) -> usize {
        let blocks = full_blocks(prompt, self.block_size);
        if blocks == 0 {
            return 0;
        }
        c.matched_blocks().min(blocks) * 100 / blocks
    }

    /// The mean and the sample standard deviation of the candidates' running requests.
    pub(crate) fn mean_and_std_dev(candidates: &[Candidate]) -> (f64, f64) {
        let n = candidates.len() as f64;
        if candidates.is_empty() {
            return (0.0, 0.0);
        }
        let mean = candidates.iter().map(|c| c.in_flight() as f64).sum::<f64>() / n;
        if candidates.len() < 2 {
            return (mean, 0.0);
        }
        let squares: f64 = candidates
            .iter()
            .map(|c| (c.in_flight() as f64 - mean).powi(2))
            .sum();
        (mean, (squares / (n - 1.0)).sqrt())
    }
}

impl Policy for Aibrix {
    fn name(&self) -> &'static str {
        "aibrix"
    }

    fn reads_cache(&self) -> bool {
        true
    }

    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let prompt = request.tokens().len();
        let counts = candidates.iter().map(Candidate::in_flight);
        let least = counts.clone().min().unwrap_or(0);
        let imbalanced = counts.max().unwrap_or(0) - least > IMBALANCE_ABS_COUNT;
        let (mean, std_dev) = Self::mean_and_std_dev(candidates);
        let bound = mean + STD_DEV_FACTOR * std_dev;
        let eligible = |c: &Candidate| {
            self.match_percent(prompt, c) > 0
                && (!imbalanced || c.in_flight() == least)
                && c.in_flight() as f64 <= bound
        };
        if candidates.iter().any(eligible) {
            choose_min(request, candidates, |c| {
                let percent = self.match_percent(prompt, c);
                (!eligible(c), Reverse(percent), c.in_flight())
            })
        } else {
            choose_min(request, candidates, Candidate::in_flight)
        }
    }
}
