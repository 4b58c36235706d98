//! The two references that bound any router's hit ratio on a workload.

use super::request::{Prompt, Request};
use crate::error::Error;
use crate::hash::{PrefixHasher, TokenId};
use crate::tree::{RadixTree, TreeConfig, WorkerId};

const W0: WorkerId = WorkerId::new(0);

/// An unbounded tree (for the references and the modelled caches).
pub(super) fn unbounded() -> Result<RadixTree, Error> {
    RadixTree::with_config(
        TreeConfig::default()
            .with_max_blocks(usize::MAX)
            .with_max_nodes(usize::MAX)
            .with_chained(true),
    )
}

/// The reference hit ratios of a workload.
#[derive(Clone, Copy, Debug, Default)]
pub(super) struct References {
    /// One infinite cache shared by all workers.
    pub(super) ideal: f64,
    /// One LRU cache of the whole fleet's capacity.
    pub(super) pooled: f64,
    /// The infinite-cache ratio counted in content blocks, for traces of content blocks.
    pub(super) ideal_blocks: Option<f64>,
}

impl References {
    /// The references of `requests` hashed by `hasher`, for a fleet of `pooled_blocks`
    /// blocks in all.
    pub(super) fn compute(
        requests: &[Request],
        hasher: &PrefixHasher,
        pooled_blocks: usize,
    ) -> Result<Self, Error> {
        let bs = hasher.block_size();
        let mut ideal = unbounded()?;
        let mut pooled = unbounded()?;
        pooled.set_capacity(W0, pooled_blocks);
        let (mut total, mut hit_ideal, mut hit_pooled) = (0u64, 0u64, 0u64);
        let mut tokens = Vec::new();
        let mut blocks = Vec::new();
        for r in requests {
            r.prompt.tokens_into(&mut tokens);
            hasher.hash_into(&tokens, &mut blocks);
            total += tokens.len() as u64;
            hit_ideal += (ideal.held_prefix(W0, &blocks) * bs) as u64;
            hit_pooled += (pooled.held_prefix(W0, &blocks) * bs) as u64;
            ideal.insert(W0, &blocks);
            pooled.insert(W0, &blocks);
        }
        let ratio = |hit: u64| {
            if total == 0 {
                0.0
            } else {
                hit as f64 / total as f64
            }
        };
        Ok(Self {
            ideal: ratio(hit_ideal),
            pooled: ratio(hit_pooled),
            ideal_blocks: content_block_ideal(requests)?,
        })
    }
}

/// For traces of content blocks (Mooncake's hash ids): the infinite-cache hit ratio
/// counted in content blocks, each id one block including a request's trailing partial
/// one. This is how trace hit ratios are usually quoted; the token-based ideal does not
/// count partial blocks.
fn content_block_ideal(requests: &[Request]) -> Result<Option<f64>, Error> {
    let mut ideal = unbounded()?;
    let hasher = PrefixHasher::new(1)?;
    let (mut hit, mut total) = (0u64, 0u64);
    let mut chain = Vec::new();
    let mut pairs = Vec::new();
    for r in requests {
        let Prompt::Blocks { ids, .. } = &r.prompt else {
            return Ok(None);
        };
        // Chain the ids (as pairs of u32 "tokens" hashed at block size 1, keeping every
        // second hash) so that equal ids after different prefixes differ.
        let ids32: Vec<TokenId> = ids
            .iter()
            .flat_map(|&id| [id as u32, (id >> 32) as u32])
            .collect();
        hasher.hash_into(&ids32, &mut pairs);
        chain.clear();
        chain.extend(pairs.iter().skip(1).step_by(2).copied());
        hit += ideal.held_prefix(W0, &chain) as u64;
        total += chain.len() as u64;
        ideal.insert(W0, &chain);
    }
    Ok((total > 0).then(|| hit as f64 / total as f64))
}
