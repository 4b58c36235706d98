//! What a worker would reuse of a prompt, as vLLM computes its hit from what it holds: the
//! device prefix, cut where a KV-cache group stops it, then whole chunks loaded back from a
//! lower tier.
//!
//! vLLM's rules, mirrored here:
//! - the device hit is the full-attention prefix, at most `max_device` blocks (vLLM leaves
//!   at least the prompt's last token to compute), then cut by every other group in turn
//!   until none cuts it further ([`Groups::allows`](super::groups::Groups::allows));
//! - the offloading connector looks up chunks of `chunk` blocks from the one holding the
//!   device hit's end, and counts the run of them it holds, whole chunks of the prompt
//!   only; what they add counts only when it is at least one chunk beyond the device hit
//!   (vLLM loads less than a chunk never). A chunk is held when its last block is
//!   announced by a lower tier: the last block names the chunk.

use super::state::SyncState;
use crate::hash::BlockHash;
use crate::tree::Held;
use crate::tree::WorkerId;

impl SyncState {
    /// What `worker` would reuse of the prompt `blocks`, given what the tree says it holds
    /// of them (`held`, its device blocks a prefix), with at most `max_device` blocks from
    /// the device tier.
    pub(crate) fn reusable(
        &self,
        worker: WorkerId,
        blocks: &[BlockHash],
        held: Held,
        max_device: usize,
    ) -> Held {
        let mut device = (held.by_tier[0] as usize).min(max_device);
        if device > 0 && self.groups().any() {
            device = self.groups().allows(worker, blocks, device);
        }
        let mut reuse = Held::device(device);
        let Some(ws) = self.worker_sync(worker).filter(|ws| ws.has_lower()) else {
            return reuse;
        };
        let chunk = self.chunk_blocks(worker);
        let chunks = blocks.len() / chunk;
        let mut end = device / chunk;
        while end < chunks && ws.lower_holds(blocks[(end + 1) * chunk - 1]) {
            end += 1;
        }
        let end = end * chunk;
        if end >= device + chunk {
            let lower = end - device;
            reuse.blocks = u32::try_from(end).unwrap_or(u32::MAX);
            // The loaded blocks count at the best lower tier the tree saw them at.
            let tier = (1..4).find(|&t| held.by_tier[t] > 0).unwrap_or(1);
            reuse.by_tier[tier] = u32::try_from(lower).unwrap_or(u32::MAX);
        }
        reuse
    }
}
