//! KV-cache groups beyond the main one (hybrid models: sliding-window, Mamba or further
//! attention layers), and how they cut a prefix hit short.
//!
//! An engine reports each group's blocks apart, with hashes that do not name the group, so
//! each group keeps its own engine blocks: equal hashes of two groups never meet. The main
//! group (0) is mirrored by the tree. Every other group keeps, per worker, the set of router
//! blocks it holds, and a hit of `n` blocks stands only as far as each group allows, as
//! vLLM's hybrid coordinator decides it:
//!
//! - full attention: every block of the hit;
//! - sliding window of `w` tokens: the last `⌈w / block size⌉` blocks before the hit's end
//!   (all of them for a shorter hit);
//! - Mamba: the block ending the hit (its state).
//!
//! The hit is the longest that every group allows. Below the device tier a group's chunks
//! are kept apart too (vLLM's CPU offloading copies a sliding-window group's chunks and
//! names each by its last block, a placeholder); how a worker loads them back is
//! `SyncState::reusable`'s.

use super::GroupKind;
use super::SyncOutcome;
use super::blocks::EngineBlocks;
use super::store::Stored;
use crate::fold::FoldMap;
use crate::hash::{BlockHash, PrefixHasher};
use crate::tree::WorkerId;

/// One worker's state in one group.
#[derive(Debug, Default)]
struct GroupWorker {
    /// Whether the worker's engine has this group (its events or its settings say so): only
    /// then does the group cut its hits. Workers of one router may run different models.
    member: bool,
    /// The group's kind on this worker.
    kind: GroupKind,
    /// Tokens per block of the router (and of the engine's blocks it mirrors).
    block_size: usize,
    /// Blocks before a hit's end the group needs on this worker: all of them
    /// (`usize::MAX`), a sliding window's, or one (Mamba's state).
    window: usize,
    blocks: EngineBlocks,
    /// Router blocks held, by hash, with how many copies the engine reported stored and
    /// not removed since (0 for a block only routed there).
    present: FoldMap<BlockHash, u32>,
    /// Chunks a lower tier holds, by the router hash of their last block, with how many
    /// stores announced them and were not removed since.
    lower: FoldMap<BlockHash, u32>,
    /// The router hash of each chunk's last block a lower tier announced, by engine hash
    /// (a removal names the engine hash, which the device may have dropped since).
    lower_names: FoldMap<u64, BlockHash>,
}

/// One group beyond the main one.
#[derive(Debug, Default)]
struct Group {
    workers: Vec<GroupWorker>,
}

/// The blocks before a hit's end a group of `kind` needs, at `block_size` tokens a block.
pub(super) fn window(kind: GroupKind, block_size: usize) -> usize {
    match kind {
        // vLLM's `cdiv(sliding_window - 1, block_size)`: the hit's last token is the
        // window's newest, so the window reaches `w - 1` tokens behind it.
        GroupKind::SlidingWindow { tokens } => tokens.saturating_sub(1).div_ceil(block_size).max(1),
        GroupKind::Mamba => 1,
        _ => usize::MAX,
    }
}

/// Every group beyond the main one: group `g` is `groups[g - 1]`.
#[derive(Debug, Default)]
pub(crate) struct Groups {
    groups: Vec<Group>,
    /// A store's engine blocks found, reused from event to event.
    named: Vec<u64>,
    /// The indices of blocks a store had recorded (unused by groups), reused likewise.
    again: Vec<u32>,
}

impl Group {
    fn worker(&mut self, worker: WorkerId) -> &mut GroupWorker {
        let w = worker.index();
        if self.workers.len() <= w {
            self.workers.resize_with(w + 1, GroupWorker::default);
        }
        &mut self.workers[w]
    }

    /// `worker`'s engine has this group, of `kind`, at `block_size` tokens a block.
    fn member(&mut self, worker: WorkerId, kind: GroupKind, block_size: usize) -> &mut GroupWorker {
        let state = self.worker(worker);
        state.member = true;
        state.kind = kind;
        state.block_size = block_size;
        state.window = window(kind, block_size);
        state
    }

    /// How many of the first `hit` blocks of `blocks` this group lets `worker` hit: all of
    /// them when the worker's engine has no such group.
    fn allows(&self, worker: WorkerId, blocks: &[BlockHash], hit: usize) -> usize {
        let Some(state) = self.workers.get(worker.index()).filter(|s| s.member) else {
            return hit;
        };
        let window = state.window;
        // The longest end at or before `hit` whose last `window` blocks (all blocks, for an
        // end closer to the root) are held.
        let mut end = hit;
        let mut run = 0;
        for i in (0..hit).rev() {
            if state.present.contains_key(&blocks[i]) {
                run += 1;
                if run >= window {
                    return end;
                }
            } else {
                end = i;
                run = 0;
            }
        }
        end
    }
}

impl Groups {
    /// Whether any group beyond the main one is mirrored.
    #[inline]
    pub(crate) fn any(&self) -> bool {
        !self.groups.is_empty()
    }

    /// Group `group` (at least 1), created if new.
    fn group(&mut self, group: u32) -> &mut Group {
        let g = group as usize - 1;
        if self.groups.len() <= g {
            self.groups.resize_with(g + 1, Group::default);
        }
        &mut self.groups[g]
    }

    /// `worker`'s engine has group `group` (at least 1) of `kind`, at `block_size` tokens a
    /// block: its settings say so, before any event of the group.
    pub(super) fn join(
        &mut self,
        worker: WorkerId,
        group: u32,
        kind: GroupKind,
        block_size: usize,
    ) {
        self.group(group).member(worker, kind, block_size);
    }

    /// The sliding windows of `worker`'s groups (group index, window in tokens, tokens a
    /// block), in group order.
    pub(crate) fn windows(&self, worker: WorkerId) -> smallvec::SmallVec<[(u32, usize, usize); 4]> {
        let mut out = smallvec::SmallVec::new();
        for (g, group) in self.groups.iter().enumerate() {
            if let Some(state) = group.workers.get(worker.index()).filter(|s| s.member) {
                if let GroupKind::SlidingWindow { tokens } = state.kind {
                    out.push((g as u32 + 1, tokens, state.block_size));
                }
            }
        }
        out
    }

    /// Whether a lower tier of `worker` holds group `group`'s chunk ending with `last`.
    pub(crate) fn lower_holds(&self, worker: WorkerId, group: u32, last: BlockHash) -> bool {
        self.groups
            .get(group as usize - 1)
            .and_then(|g| g.workers.get(worker.index()))
            .is_some_and(|s| s.lower.contains_key(&last))
    }

    /// Applies a lower tier's store of group `group` (at least 1): each named block ends a
    /// chunk the tier now holds (a placeholder names the chunk's last block; a store with
    /// tokens names all of its blocks, the last one naming the chunk). `resolve` gives the
    /// router hash of an engine hash the worker's main group knows (kept or dropped
    /// lately); the group's own blocks are asked next.
    pub(super) fn store_lower(
        &mut self,
        (worker, kind, block_size): (WorkerId, GroupKind, usize),
        group: u32,
        blocks: &[u64],
        whole: bool,
        resolve: impl Fn(u64) -> Option<BlockHash>,
        outcome: &mut SyncOutcome,
    ) {
        let named = if whole {
            blocks.last().map_or(&[][..], core::slice::from_ref)
        } else {
            blocks
        };
        let mut found: smallvec::SmallVec<[(u64, BlockHash); 8]> = smallvec::SmallVec::new();
        for &engine in named {
            let router = resolve(engine).or_else(|| {
                self.groups
                    .iter()
                    .filter_map(|g| g.workers.get(worker.index()))
                    .find_map(|state| state.blocks.router(engine))
            });
            match router {
                Some(router) => found.push((engine, router)),
                None => outcome.unknown_blocks += 1,
            }
        }
        let state = self.group(group).member(worker, kind, block_size);
        for (engine, router) in found {
            *state.lower.entry(router).or_insert(0) += 1;
            state.lower_names.insert(engine, router);
            outcome.stored_blocks += 1;
        }
    }

    /// Applies a lower tier's removal of group `group` (at least 1): each named block ends
    /// a chunk one announcement of which is withdrawn.
    pub(super) fn remove_lower(
        &mut self,
        worker: WorkerId,
        group: u32,
        blocks: &[u64],
        outcome: &mut SyncOutcome,
    ) {
        let Some(state) = self
            .groups
            .get_mut(group as usize - 1)
            .and_then(|g| g.workers.get_mut(worker.index()))
        else {
            outcome.unknown_removed_blocks += blocks.len();
            return;
        };
        for &engine in blocks {
            let Some(&router) = state.lower_names.get(&engine) else {
                outcome.unknown_removed_blocks += 1;
                continue;
            };
            outcome.removed_blocks += 1;
            match state.lower.get_mut(&router) {
                Some(n) if *n > 1 => *n -= 1,
                _ => {
                    state.lower.remove(&router);
                    state.lower_names.remove(&engine);
                }
            }
        }
    }

    /// How many of the first `hit` blocks of `blocks` every group lets `worker` hit: vLLM's
    /// fixed point, each group cutting the hit in turn until none cuts it further (a group
    /// that allows a shorter hit may need another group's window to end there too).
    pub(crate) fn allows(&self, worker: WorkerId, blocks: &[BlockHash], hit: usize) -> usize {
        let mut hit = hit;
        loop {
            let cut = self.groups.iter().fold(hit, |hit, g| {
                if hit == 0 {
                    0
                } else {
                    g.allows(worker, blocks, hit)
                }
            });
            if cut == hit {
                return hit;
            }
            hit = cut;
        }
    }

    /// The router hash of the engine block `engine` as any group of `worker` knows it,
    /// `main` (the main group's engine blocks) first. An engine hash names a prompt
    /// position whatever the group (vLLM's hashes carry no group id), so a group whose own
    /// copy of a block is gone still continues from the position another group knows.
    fn router(
        &self,
        worker: WorkerId,
        main: Option<&EngineBlocks>,
        engine: u64,
    ) -> Option<BlockHash> {
        main.and_then(|m| m.router(engine)).or_else(|| {
            self.groups
                .iter()
                .filter_map(|g| g.workers.get(worker.index()))
                .find_map(|state| state.blocks.router(engine))
        })
    }

    /// The prompt `blocks` was routed to `worker`: every group its engine has will hold it
    /// once it runs.
    pub(crate) fn routed(&mut self, worker: WorkerId, blocks: &[BlockHash]) {
        for g in &mut self.groups {
            let Some(state) = g.workers.get_mut(worker.index()).filter(|s| s.member) else {
                continue;
            };
            for &b in blocks {
                state.present.entry(b).or_insert(0);
            }
        }
    }

    /// Applies a device-tier store of group `group` (at least 1).
    ///
    /// A store that names every block of its tokens is chained from its parent, looked up
    /// in every group's blocks, `main`'s first (see [`Self::router`]). A sliding-window
    /// group's store may name only some blocks of its tokens (vLLM caches only the blocks
    /// a later hit could use, and skips those already freed): each named block is then
    /// found by its engine hash, as the full-attention group stored it just before. Blocks
    /// found neither way are counted as of an unknown parent.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn store(
        &mut self,
        hasher: &PrefixHasher,
        (worker, kind): (WorkerId, GroupKind),
        group: u32,
        event: &Stored<'_>,
        main: Option<&EngineBlocks>,
        path: &mut Vec<BlockHash>,
        outcome: &mut SyncOutcome,
    ) {
        self.group(group).member(worker, kind, hasher.block_size());
        path.clear();
        let mut named = core::mem::take(&mut self.named);
        named.clear();
        let whole = event.tokens.len() == event.blocks.len() * hasher.block_size();
        let root = match event.parent {
            None => Some(hasher.root(event.salt)),
            Some(p) => self.router(worker, main, p),
        };
        match root {
            Some(root) if whole => {
                hasher.continue_keyed(root, event.tokens, event.keys, path);
                path.truncate(event.blocks.len());
                named.extend_from_slice(event.blocks);
            }
            _ => {
                for &engine in event.blocks {
                    match self.router(worker, main, engine) {
                        Some(router) => {
                            named.push(engine);
                            path.push(router);
                        }
                        None => outcome.unknown_parent_blocks += 1,
                    }
                }
            }
        }
        // The group's engine blocks are looked up by hash only, never walked by their
        // links, so a run with gaps is recorded as one.
        let mut again = core::mem::take(&mut self.again);
        let state = self.group(group).worker(worker);
        state
            .blocks
            .insert_run(event.parent, &named, path, outcome, &mut again);
        for &router in path.iter() {
            *state.present.entry(router).or_insert(0) += 1;
        }
        again.clear();
        self.again = again;
        self.named = named;
    }

    /// Applies a device-tier removal of group `group` (at least 1).
    pub(super) fn remove(
        &mut self,
        worker: WorkerId,
        group: u32,
        blocks: &[u64],
        outcome: &mut SyncOutcome,
    ) {
        let g = group as usize - 1;
        let Some(state) = self
            .groups
            .get_mut(g)
            .and_then(|g| g.workers.get_mut(worker.index()))
        else {
            outcome.unknown_removed_blocks += blocks.len();
            return;
        };
        for &engine in blocks {
            let Some(router) = state.blocks.router(engine) else {
                outcome.unknown_removed_blocks += 1;
                continue;
            };
            outcome.removed_blocks += 1;
            match state.present.get_mut(&router) {
                // One of several copies went: the block stays held.
                Some(n) if *n > 1 => *n -= 1,
                _ => {
                    state.present.remove(&router);
                    state.blocks.remove(engine);
                }
            }
        }
    }

    /// Forgets everything `worker`'s device holds in every group (its device cache was
    /// dropped; a lower tier keeps its chunks); its engine keeps its groups.
    pub(crate) fn clear_device(&mut self, worker: WorkerId) {
        for g in &mut self.groups {
            if let Some(state) = g.workers.get_mut(worker.index()) {
                state.blocks.clear();
                state.present.clear();
            }
        }
    }

    /// Forgets everything `worker` holds in every group, at every tier; its engine keeps
    /// its groups.
    pub(crate) fn clear(&mut self, worker: WorkerId) {
        self.clear_device(worker);
        for g in &mut self.groups {
            if let Some(state) = g.workers.get_mut(worker.index()) {
                state.lower.clear();
                state.lower_names.clear();
            }
        }
    }

    /// Forgets everything `worker` holds in every group, and which groups its engine has.
    pub(crate) fn forget(&mut self, worker: WorkerId) {
        for g in &mut self.groups {
            if let Some(state) = g.workers.get_mut(worker.index()) {
                *state = GroupWorker::default();
            }
        }
    }

    /// Bytes allocated.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.groups
            .iter()
            .flat_map(|g| &g.workers)
            .map(|w| {
                w.blocks.allocation_size()
                    + w.present.allocation_size()
                    + w.lower.allocation_size()
                    + w.lower_names.allocation_size()
            })
            .sum::<usize>()
            + self.named.capacity() * 8
            + self.again.capacity() * 4
    }
}
