//! Peer projects' routing policies, for the simulator's comparisons (`--policy
//! llmd|dynamo|aibrix`): each as its project documents and implements it by default,
//! rebuilt on the crate's [`Policy`](prefix_router::Policy) seam. They live in the examples,
//! not in the crate's API: they are baselines to measure against, not recommendations.
//!
//! Each file cites the source it modelled (path and commit read) and says what it left out.
//! What they share, and differ in from the projects:
//!
//! - The cache they read is the crate's mirror ([`Candidate::matched_blocks`]): routed
//!   prompts, corrected by engine events or miss feedback as `--sync` says. The projects'
//!   own indexes differ (llm-d's approximate one hashes characters, AIBrix's too by default,
//!   Dynamo's follows KV events); each file says how.
//! - Their random tie-breaks become [`choose_min`](prefix_router::choose_min)'s: the fewest
//!   requests routed so far, then a per-request rotation. Deterministic, as the simulator
//!   must be; not the same draws.
//! - Blocks are the mirror's (`--block-size`, default 16 tokens).
//! - Under `--admission on`, llm-d's and Dynamo's own admission rules decide which requests
//!   they refuse (`shedding.rs`), in place of the crate's predicted time to first token.
//!
//! [`Candidate::matched_blocks`]: prefix_router::Candidate::matched_blocks

#[path = "aibrix.rs"]
mod aibrix;
#[path = "dynamo.rs"]
mod dynamo;
#[path = "llmd.rs"]
mod llmd;
#[path = "pd.rs"]
mod pd;
#[path = "shedding.rs"]
mod shedding;

pub(crate) use aibrix::Aibrix;
pub(crate) use dynamo::Dynamo;
pub(crate) use llmd::Llmd;
pub(crate) use pd::{DynamoPd, IndependentPd, LlmdPd};

/// Whole blocks of `block_size` tokens in a prompt of `tokens` (a block size of 0 counts
/// as 1): the blocks a prefix cache can hold of it.
pub(crate) fn full_blocks(tokens: usize, block_size: usize) -> usize {
    tokens / block_size.max(1)
}
