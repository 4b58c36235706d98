//! What a worker would reuse of a prompt, as vLLM computes its hit from what it holds: the
//! device prefix, cut where a KV-cache group stops it, then whole chunks loaded back from a
//! lower tier.
//!
//! vLLM's rules, mirrored here:
//! - the device hit is the full-attention prefix, at most `max_device` blocks (vLLM leaves
//!   at least the prompt's last token to compute), then cut by every other group in turn
//!   until none cuts it further ([`Groups::allows`](super::groups::Groups::allows));
//! - the offloading connector (`_lookup_complete_chunks`) looks up chunks of `chunk`
//!   blocks from the one holding the device hit's end, whole chunks of the prompt only,
//!   and loads what they add only when it is at least one chunk beyond the device hit
//!   (vLLM loads less than a chunk never). A chunk is held when its last block is
//!   announced by a lower tier: the last block names the chunk.
//! - full attention alone: the run of chunks held from that chunk on, up to the prompt's
//!   end (all of it: nothing is left to compute there, as vLLM recomputes the last token
//!   after the load);
//! - with sliding-window groups (a hybrid model whose every group is offloaded): the hit
//!   ends at most one token before the prompt's end; the full-attention group cuts it to
//!   its run of chunks, then each window group, widest first, to the end of the last run
//!   of chunks it holds that covers its window (scanned from the right; the first run may
//!   need a wider window when the end is not chunk-aligned), or else to its run of held
//!   chunks from the lookup's start; a cut makes the window groups look again, until the
//!   hit stands.

use smallvec::SmallVec;

use super::state::SyncState;
use super::worker::WorkerSync;
use crate::hash::BlockHash;
use crate::tree::Held;
use crate::tree::WorkerId;

/// A sliding-window group of a worker, for the lower tier's lookup: its index, and its
/// window in chunks (vLLM's `get_sliding_window_size_in_chunks`).
#[derive(Clone, Copy)]
struct Window {
    group: u32,
    tokens: usize,
    chunks: usize,
}

impl Window {
    /// vLLM's `load_window_size_in_chunks`: the chunks a load ending at `end` tokens must
    /// hold, the window widened by the padding to the next chunk boundary.
    fn load_chunks(self, end: usize, chunk_tokens: usize) -> usize {
        let padding = (chunk_tokens - end % chunk_tokens) % chunk_tokens;
        self.chunks
            .max((self.tokens - 1 + padding).div_ceil(chunk_tokens))
    }
}

impl SyncState {
    /// Whether a load from `worker`'s lower tiers to the end of a prompt of whole chunks
    /// stops one token short of it, the last token left to compute: so vLLM's connector
    /// does for a hybrid model (one with sliding-window groups).
    pub(crate) fn loads_lower_short(&self, worker: WorkerId) -> bool {
        self.worker_sync(worker).is_some_and(|ws| ws.has_lower())
            && !self.groups().windows(worker).is_empty()
    }

    /// What `worker` would reuse of the prompt `blocks`, given what the tree says it holds
    /// of them (`held`, its device blocks a prefix), with at most `max_device` blocks from
    /// the device tier. `max_device` one short of `blocks` says the prompt ends on a block
    /// boundary (as `CacheIndex::reusable_tokens` calls it); a hit vLLM ends one token
    /// before such a prompt's end is counted to its end, in whole blocks (see
    /// [`Self::loads_lower_short`]).
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
        let windows = self.groups().windows(worker);
        let end = if windows.is_empty() {
            full_attention_end(ws, blocks, device, chunk)
        } else {
            let aligned = max_device.checked_add(1) == Some(blocks.len());
            self.hybrid_end(worker, ws, blocks, device, chunk, aligned, &windows)
        };
        if end > device {
            let lower = end - device;
            reuse.blocks = u32::try_from(end).unwrap_or(u32::MAX);
            // The loaded blocks count at the best lower tier the tree saw them at.
            let tier = (1..4).find(|&t| held.by_tier[t] > 0).unwrap_or(1);
            reuse.by_tier[tier] = u32::try_from(lower).unwrap_or(u32::MAX);
        }
        reuse
    }

    /// The end, in blocks, of what a hybrid worker's lower tier adds to a `device` hit of
    /// the prompt `blocks` (`device` when it adds nothing): vLLM's lookup with
    /// sliding-window groups, in tokens of `windows`' block size. `aligned`: the prompt
    /// ends on a block boundary. A hit ending one token before the prompt's end is counted
    /// to the end.
    #[allow(clippy::too_many_arguments)]
    fn hybrid_end(
        &self,
        worker: WorkerId,
        ws: &WorkerSync,
        blocks: &[BlockHash],
        device: usize,
        chunk: usize,
        aligned: bool,
        windows: &[(u32, usize, usize)],
    ) -> usize {
        let block_size = windows[0].2;
        let chunk_tokens = chunk * block_size;
        // The prompt's length in tokens: exact when it ends on a block boundary; otherwise
        // any length past its whole blocks gives the same hit (every cut is then a whole
        // number of chunks), so the least one stands for it.
        let prompt = blocks.len() * block_size + usize::from(!aligned);
        let keys = blocks.len() / chunk;
        let computed = device * block_size;
        // Full attention (group 0) first, then the windows, widest first (a stable sort:
        // vLLM's order for equal widths is the groups' order).
        let mut order: SmallVec<[Option<Window>; 4]> = SmallVec::new();
        order.push(None);
        let mut sw: SmallVec<[Window; 4]> = windows
            .iter()
            .map(|&(group, tokens, _)| Window {
                group,
                tokens,
                chunks: tokens.div_ceil(chunk_tokens),
            })
            .collect();
        sw.sort_by_key(|w| core::cmp::Reverse(w.chunks));
        order.extend(sw.iter().copied().map(Some));
        let last_block = |k: usize| blocks[(k + 1) * chunk - 1];
        let holds = |group: Option<Window>, k: usize| match group {
            None => ws.lower_holds(last_block(k)),
            Some(w) => self.groups().lower_holds(worker, w.group, last_block(k)),
        };
        // vLLM leaves the prompt's last token to compute when a window group is offloaded.
        let mut max_hit = prompt - 1;
        let mut hit = 0;
        let mut pass: SmallVec<[Option<Window>; 4]> = order.clone();
        while !pass.is_empty() {
            let mut looked_up_window = false;
            let groups = core::mem::take(&mut pass);
            for group in groups {
                max_hit = max_hit.min(keys * chunk_tokens);
                if max_hit < computed + chunk_tokens {
                    return device;
                }
                let chunks = max_hit.div_ceil(chunk_tokens).min(keys);
                let start = computed / chunk_tokens;
                let run = match group {
                    None => (start..chunks).take_while(|&k| holds(None, k)).count(),
                    Some(w) => {
                        let end = max_hit.min(chunks * chunk_tokens);
                        let first = w.load_chunks(end, chunk_tokens);
                        window_run(start, chunks, w.chunks, first, |k| holds(group, k))
                    }
                };
                if run == 0 {
                    return device;
                }
                max_hit = max_hit.min(chunk_tokens * (start + run));
                let new_hit = max_hit - computed;
                if new_hit < chunk_tokens {
                    return device;
                }
                if new_hit < hit && looked_up_window && pass.is_empty() {
                    // A cut after a window group looked: the windows look again.
                    pass.extend(sw.iter().copied().map(Some));
                }
                looked_up_window |= group.is_some();
                hit = new_hit;
            }
        }
        (computed + hit).div_ceil(block_size)
    }
}

/// The end of what a full-attention worker's lower tier adds to a `device` hit, in blocks
/// (`device` when it adds nothing): the run of chunks held from the one holding the
/// device hit's end, counted when it reaches at least a chunk beyond the device hit.
fn full_attention_end(ws: &WorkerSync, blocks: &[BlockHash], device: usize, chunk: usize) -> usize {
    let chunks = blocks.len() / chunk;
    let mut end = device / chunk;
    while end < chunks && ws.lower_holds(blocks[(end + 1) * chunk - 1]) {
        end += 1;
    }
    let end = end * chunk;
    if end >= device + chunk { end } else { device }
}

/// vLLM's `_sliding_window_lookup` over chunks `start..end`: scanning from the right, the
/// end (counted from `start`) of the first run of `window` chunks held, the rightmost run
/// needing `first` (a wider window when the load's end is not chunk-aligned) until a chunk
/// is missing; without such a run, the chunks held from `start` on.
fn window_run(
    start: usize,
    end: usize,
    window: usize,
    first: usize,
    holds: impl Fn(usize) -> bool,
) -> usize {
    let mut run = 0;
    let mut required = first;
    for idx in (0..end.saturating_sub(start)).rev() {
        if holds(start + idx) {
            run += 1;
        } else {
            run = 0;
            required = window;
        }
        if run == required {
            return idx + required;
        }
    }
    run
}
