//! One worker's sync state for the main KV-cache group: its engine blocks and chain tips,
//! and how its events change the tree.
//!
//! Glossary: an **engine block** is a block the worker reported, under its engine hash; its
//! **record** holds the router's hash of the same block and a link to its parent (see
//! `blocks`). A **chunk** is a run of blocks a lower tier copies and drops together, named
//! by its last block (vLLM's CPU offloading).
//!
//! Below the device tier the tree holds a hint (a chunk's placeholder marks the whole path
//! above its last block at the tier; its removal unmarks the last block and what hangs
//! below); what a lower tier really holds is counted apart, in [`WorkerSync::lower`]: each
//! block by the number of lower-tier stores that announced it and were not removed since.
//! vLLM announces a block once per chunk that carries it (chunks that share a prefix not
//! aligned to chunks both carry its blocks) and fans a chunk's removal out to the same
//! blocks, so a count, not a flag, says whether a chunk is still there; and a chunk stays
//! loadable when an earlier one is dropped, which the tree's prefix-closed tiers cannot say.

use super::SyncOutcome;
use super::blocks::EngineBlocks;
use super::state::{Scratch, Stored};
use super::tips::{Tip, Tips};
use crate::fold::FoldMap;
use crate::tree::{Position, Tier};
use crate::{BlockHash, PrefixHasher, RadixTree, WorkerId};

/// The main group's state of one worker.
#[derive(Debug, Default)]
pub(super) struct WorkerSync {
    pub(super) blocks: EngineBlocks,
    /// Chain tips most likely named by the next events.
    recent: Tips,
    /// Blocks held below the device tier, by router hash: how many lower-tier stores
    /// announced each and were not removed since (absent: none).
    lower: FoldMap<BlockHash, u32>,
}

impl WorkerSync {
    /// Where the tree holds the stored block `engine` for `worker`: from the block's
    /// remembered tip (taken), or the tree's last-block index and kept positions. Either is
    /// checked by the tree, so the position is the path the mirror holds for the block.
    /// `router` is the block's router hash when the caller has read it already.
    fn locate(
        &mut self,
        tree: &RadixTree,
        engine: u64,
        router: Option<BlockHash>,
        worker: WorkerId,
    ) -> Option<Position> {
        if let Some(tip) = self.recent.take(engine) {
            if let Some(position) = tree.resolve(tip.position, worker) {
                return Some(position);
            }
        }
        let router = match router {
            Some(router) => router,
            None => self.blocks.router(engine)?,
        };
        tree.find(router, worker)
    }

    /// [`Self::locate`], falling back on the path through the parent links.
    fn locate_or_walk(
        &mut self,
        tree: &RadixTree,
        engine: u64,
        router: Option<BlockHash>,
        worker: WorkerId,
        path: &mut Vec<BlockHash>,
    ) -> Option<Position> {
        match self.locate(tree, engine, router, worker) {
            Some(at) => Some(at),
            None if self.blocks.path_to(engine, path) => tree.find_path(path),
            None => None,
        }
    }

    /// Remembers `tip`; a tip it displaces has its position kept by the tree instead, so
    /// that a later event naming that block still finds it without walking the parent links.
    fn remember(&mut self, tree: &mut RadixTree, tip: Tip) {
        if let Some(old) = self.recent.remember(tip) {
            tree.keep(old.position);
        }
    }

    /// Bytes allocated.
    pub(super) fn allocation_size(&self) -> usize {
        self.blocks.allocation_size() + self.recent.allocation_size() + self.lower.allocation_size()
    }

    /// Forgets every engine block and tip.
    pub(super) fn clear(&mut self) {
        self.blocks.clear();
        self.recent.clear();
        self.lower.clear();
    }

    /// Whether a lower tier holds `router` (a store announced it and was not removed).
    #[inline]
    pub(super) fn lower_holds(&self, router: BlockHash) -> bool {
        self.lower.contains_key(&router)
    }

    /// Whether the worker holds anything below the device tier.
    #[inline]
    pub(super) fn has_lower(&self) -> bool {
        !self.lower.is_empty()
    }

    /// A lower-tier store announced `router` once more.
    fn announce(&mut self, router: BlockHash) {
        *self.lower.entry(router).or_insert(0) += 1;
    }

    /// A lower-tier removal withdrew one announcement of `router`; `true` while others stand.
    fn withdraw(&mut self, router: BlockHash) -> bool {
        match self.lower.get_mut(&router) {
            Some(n) if *n > 1 => {
                *n -= 1;
                true
            }
            Some(_) => {
                self.lower.remove(&router);
                false
            }
            None => false,
        }
    }

    /// Applies a `Stored` event with tokens: finds where its blocks go (below the parent's
    /// position, or below the parent's path rebuilt from the links), records them and
    /// inserts them into the tree at the event's tier.
    pub(super) fn store(
        &mut self,
        hasher: &PrefixHasher,
        tree: &mut RadixTree,
        worker: WorkerId,
        event: &Stored<'_>,
        scratch: &mut Scratch,
        outcome: &mut SyncOutcome,
    ) {
        let path = &mut scratch.path;
        path.clear();
        let (root, below) = match event.parent {
            None => (hasher.root(event.salt), None),
            Some(p) => match self.locate(tree, p, None, worker) {
                Some(at) => (at.block(), Some(at)),
                None if self.blocks.path_to(p, path) => (path[path.len() - 1], None),
                None => {
                    outcome.unknown_parent_blocks += event.blocks.len();
                    return;
                }
            },
        };
        let start = path.len();
        hasher.continue_keyed(root, event.tokens, event.keys, path);
        self.blocks
            .insert_run(event.parent, event.blocks, &path[start..], outcome);
        if event.tier != Tier::Device {
            for &router in &path[start..start + event.blocks.len()] {
                self.announce(router);
            }
        }
        let tip = match below {
            Some(at) => tree.insert_below(worker, at, path, event.tier).or_else(|| {
                // The parent is inside an edge the store diverges from: the whole path.
                tree.path_to(at, &mut scratch.full);
                scratch.full.extend_from_slice(path);
                tree.insert_path(worker, &scratch.full, event.tier)
            }),
            None => tree.insert_path(worker, path, event.tier),
        };
        if let (Some(&engine), Some(position)) = (event.blocks.last(), tip) {
            self.remember(tree, Tip { engine, position });
        }
    }

    /// Applies a placeholder store: each named block (a chunk's last) the worker reported
    /// before is held at `tier` too, with the path above it.
    pub(super) fn store_placeholder(
        &mut self,
        tree: &mut RadixTree,
        worker: WorkerId,
        blocks: &[u64],
        tier: Tier,
        scratch: &mut Scratch,
        outcome: &mut SyncOutcome,
    ) {
        for &engine in blocks {
            let found = self.locate_or_walk(tree, engine, None, worker, &mut scratch.path);
            let Some(at) = found else {
                outcome.unknown_blocks += 1;
                continue;
            };
            if tier != Tier::Device {
                self.announce(at.block());
            }
            tree.path_to(at, &mut scratch.full);
            if let Some(position) = tree.insert_path(worker, &scratch.full, tier) {
                outcome.duplicate_blocks += 1;
                self.remember(tree, Tip { engine, position });
            }
        }
    }

    /// Applies the removal of one block from `tier` (below the device tier, one
    /// announcement withdrawn): the block and what hangs below leave the tier in the tree;
    /// a block left at no tier, and announced by no lower-tier store, is gone, and so is
    /// its record.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn remove(
        &mut self,
        tree: &mut RadixTree,
        worker: WorkerId,
        engine: u64,
        tier: Tier,
        path: &mut Vec<BlockHash>,
        outcome: &mut SyncOutcome,
    ) {
        let Some(router) = self.blocks.router(engine) else {
            outcome.unknown_removed_blocks += 1;
            return;
        };
        // The block's position, or else the end of its path through the parent links.
        // Without either, an ancestor already removed took the block out of the tree.
        let found = self.locate_or_walk(tree, engine, Some(router), worker, path);
        // Whether the block stays held at another tier (read before the tree changes: its
        // node may merge away). In a tree without lower tiers a block is held at the device
        // tier alone, so a lower tier's removal keeps it.
        let announced = if tier == Tier::Device {
            self.lower_holds(router)
        } else {
            self.withdraw(router)
        };
        let kept = announced
            || found.is_some_and(|at| {
                if tree.tiered() {
                    tree.tiers_at(worker, at)
                        .is_some_and(|tiers| !tiers.without(tier).is_empty())
                } else {
                    tier != Tier::Device
                }
            });
        if let Some(at) = found {
            tree.remove_tier_at(worker, at, tier);
        }
        if !kept {
            self.blocks.remove(engine);
        }
        outcome.removed_blocks += 1;
    }

    /// The worker's device tier was cleared: records of blocks it no longer holds at any
    /// tier go; tips are forgotten.
    pub(super) fn cleared_device(&mut self, tree: &RadixTree, worker: WorkerId) {
        self.recent.clear();
        if tree.worker_block_count(worker) == 0 && self.lower.is_empty() {
            self.blocks.clear();
            return;
        }
        let mut held = FoldMap::default();
        tree.for_each_held_block(worker, |block| {
            held.insert(block, ());
        });
        let lower = &self.lower;
        self.blocks
            .retain(|router| held.contains_key(&router) || lower.contains_key(&router));
    }
}
