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
use super::gone::{Dropped, Gone};
use super::store::{Scratch, Stored};
use super::tips::{Tip, Tips};
use crate::fold::FoldMap;
use crate::hash::{BlockHash, PrefixHasher};
use crate::tree::{Position, Tier};
use crate::tree::{RadixTree, WorkerId};

/// The main group's state of one worker.
#[derive(Debug, Default)]
pub(super) struct WorkerSync {
    pub(super) blocks: EngineBlocks,
    /// Chain tips most likely named by the next events.
    recent: Tips,
    /// The block the last placeholder store placed, where the tree has it: a copy's chunks
    /// are named root first, so the next one names the chunk below it.
    placed: Option<Tip>,
    /// Blocks held below the device tier, by router hash: how many lower-tier stores
    /// announced each and were not removed since (absent: none).
    lower: FoldMap<BlockHash, u32>,
    /// Device blocks held more than once, by engine hash: how many copies beyond the first
    /// (vLLM caches a block again when a hit was cut short and recomputes it; each copy's
    /// eviction is reported).
    copies: FoldMap<u64, u32>,
    /// Recorded blocks the device does not hold (only a lower tier does), by engine hash:
    /// every other record's block is on the device.
    lower_only: FoldMap<u64, ()>,
    /// Records dropped lately, once the worker reported a lower tier or while it is on
    /// probation (see `gone` and [`PROBATION`]).
    gone: Gone,
    /// Whether the worker ever reported a lower tier.
    tiered: bool,
    /// Records dropped before the worker reported a lower tier (counted to [`PROBATION`]).
    untiered_drops: u32,
}

/// Records a worker drops before it reports a lower tier are kept among the gone too, up to
/// this many: its first copies to a lower tier may be reported after the device dropped
/// their blocks, before the mirror knows the worker has one (vLLM reports a CPU copy 1 to 3
/// engine steps after it began). A worker that drops as many with no lower tier has none:
/// those records are forgotten and no more are kept.
const PROBATION: u32 = 1024;

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
        self.blocks.allocation_size()
            + self.recent.allocation_size()
            + self.lower.allocation_size()
            + self.copies.allocation_size()
            + self.lower_only.allocation_size()
            + self.gone.allocation_size()
    }

    /// Forgets every engine block and tip.
    pub(super) fn clear(&mut self) {
        self.blocks.clear();
        self.recent.clear();
        self.placed = None;
        self.lower.clear();
        self.copies.clear();
        self.lower_only.clear();
        self.gone.clear();
    }

    /// The router hash of the engine block `engine`, from its record or a record dropped
    /// lately.
    pub(super) fn known_router(&self, engine: u64) -> Option<BlockHash> {
        self.blocks
            .router(engine)
            .or_else(|| self.gone.router(engine))
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
        self.tiered = true;
        *self.lower.entry(router).or_insert(0) += 1;
    }

    /// Whether records the worker drops are kept a while among the gone: once it has a
    /// lower tier, or on probation; counts a drop while it has none.
    fn keeps_dropped(&mut self) -> bool {
        if self.tiered {
            return true;
        }
        self.untiered_drops = self.untiered_drops.saturating_add(1);
        if self.untiered_drops == PROBATION {
            // No lower tier after as many drops: the records kept go, allocation too.
            self.gone = Gone::default();
        }
        self.untiered_drops < PROBATION
    }

    /// Drops the record of `engine` (router hash `router`), keeping it a while among the
    /// gone (see [`Self::keeps_dropped`]).
    fn drop_record(&mut self, engine: u64, router: BlockHash) {
        let parent = if self.keeps_dropped() {
            self.blocks.link(engine)
        } else {
            None
        };
        self.blocks.remove(engine);
        if let Some((_, parent)) = parent {
            let bound = self.blocks.len() / 2;
            let dropped = Dropped { router, parent };
            self.gone.keep(engine, dropped, bound);
        }
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
                None => match self.blocks.router(p).or_else(|| self.gone.router(p)) {
                    // A lower tier's copy of blocks after one the tree has no path for (the
                    // device dropped it, or it is held below the device only): recorded and
                    // announced, not put in the tree.
                    Some(parent) if event.tier != Tier::Device => {
                        self.store_detached(hasher, parent, event, path, outcome);
                        return;
                    }
                    _ => {
                        outcome.unknown_parent_blocks += event.blocks.len();
                        return;
                    }
                },
            },
        };
        let start = path.len();
        hasher.continue_keyed(root, event.tokens, event.keys, path);
        if event.parent.is_none() && event.tier != Tier::Device && event.keys.is_empty() {
            self.salt_from_record(hasher, event, path);
        }
        let again = &mut scratch.again;
        again.clear();
        self.blocks
            .insert_run(event.parent, event.blocks, &path[start..], outcome, again);
        let routers = &path[start..start + event.blocks.len()];
        if event.tier != Tier::Device {
            self.announce_run(event.blocks, routers, again);
        } else {
            for &k in again.iter() {
                let engine = event.blocks[k as usize];
                // Back on the device from a lower tier; or, on the device already, a
                // second copy (unless the store only reports a hit again).
                if self.lower_only.remove(&engine).is_none() && event.copies {
                    *self.copies.entry(engine).or_insert(0) += 1;
                }
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

    /// A lower tier's copy of a prompt's first blocks (`path`, hashed from the root in the
    /// namespace the event names) may lack the prompt's cache salt: vLLM's self-describing
    /// CPU stores carry no extra keys, only the LoRA name. The device's store of the same
    /// first block carried them, so its record (or a record dropped lately) names the
    /// block's namespace; when it differs, `path` is hashed again from that block.
    /// Invariant: an engine hash names one prompt prefix in one namespace, so a record of
    /// the first block is never wrong where the event's namespace disagrees.
    fn salt_from_record(
        &self,
        hasher: &PrefixHasher,
        event: &Stored<'_>,
        path: &mut Vec<BlockHash>,
    ) {
        let Some(&first) = event.blocks.first() else {
            return;
        };
        let Some(recorded) = self
            .blocks
            .router(first)
            .or_else(|| self.gone.router(first))
        else {
            return;
        };
        if path.first() == Some(&recorded) || event.tokens.len() < hasher.block_size() {
            return;
        }
        path.clear();
        path.push(recorded);
        hasher.continue_keyed(recorded, &event.tokens[hasher.block_size()..], &[], path);
    }

    /// A lower-tier store of `blocks` (router hashes `routers`), of which those at the
    /// indices `again` were recorded before: every block is announced, and a block newly
    /// recorded is held below the device only.
    fn announce_run(&mut self, blocks: &[u64], routers: &[BlockHash], again: &[u32]) {
        let mut again = again.iter().map(|&k| k as usize).peekable();
        for (k, (&engine, &router)) in blocks.iter().zip(routers).enumerate() {
            if again.peek() == Some(&k) {
                again.next();
            } else {
                self.lower_only.insert(engine, ());
            }
            self.announce(router);
        }
    }

    /// Records and announces a lower-tier store below `parent`, a router hash with no path
    /// in the tree.
    fn store_detached(
        &mut self,
        hasher: &PrefixHasher,
        parent: BlockHash,
        event: &Stored<'_>,
        path: &mut Vec<BlockHash>,
        outcome: &mut SyncOutcome,
    ) {
        path.clear();
        hasher.continue_keyed(parent, event.tokens, event.keys, path);
        let mut again = Vec::new();
        self.blocks
            .insert_run(event.parent, event.blocks, path, outcome, &mut again);
        self.announce_run(event.blocks, &path[..event.blocks.len()], &again);
    }

    /// Applies a placeholder store: each named block (a chunk's last, `chunk` blocks after
    /// the previous chunk's last) the worker reported before is held at `tier` too, with the
    /// path above it.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn store_placeholder(
        &mut self,
        tree: &mut RadixTree,
        worker: WorkerId,
        blocks: &[u64],
        tier: Tier,
        chunk: usize,
        scratch: &mut Scratch,
        outcome: &mut SyncOutcome,
    ) {
        for &engine in blocks {
            let below = self.below_placed(tree, engine, chunk, worker);
            let found = match below {
                Some(at) => Some(at),
                None => self.locate_or_walk(tree, engine, None, worker, &mut scratch.path),
            };
            let Some(at) = found else {
                // Not in the tree: a block recorded for a lower tier, or copied before the
                // device dropped it and reported after.
                let recorded = self.blocks.router(engine).map(|r| (r, None));
                let dropped = || self.gone.get(engine).map(|d| (d.router, d.parent));
                match recorded.or_else(dropped) {
                    Some((router, parent)) if tier != Tier::Device => {
                        if recorded.is_none() {
                            // Recorded again under its old parent link: a record without
                            // one would stand at the root, and a store below it would
                            // be placed there.
                            let mut quiet = SyncOutcome::default();
                            self.blocks.insert_run(
                                parent,
                                &[engine],
                                &[router],
                                &mut quiet,
                                &mut Vec::new(),
                            );
                            self.lower_only.insert(engine, ());
                        }
                        self.announce(router);
                        outcome.duplicate_blocks += 1;
                    }
                    _ => outcome.unknown_blocks += 1,
                }
                continue;
            };
            if tier != Tier::Device {
                self.announce(at.block());
            }
            if let Some(position) = tree.insert_to(worker, at, tier) {
                outcome.duplicate_blocks += 1;
                self.remember(tree, Tip { engine, position });
                self.placed = Some(Tip { engine, position });
            }
        }
    }

    /// Where the tree holds block `engine` for `worker` when it ends the chunk below the one
    /// the last placeholder placed (`chunk` blocks further on the same path): found from
    /// that position by the block's parent links, without the walk from the root.
    fn below_placed(
        &self,
        tree: &RadixTree,
        engine: u64,
        chunk: usize,
        worker: WorkerId,
    ) -> Option<Position> {
        let placed = self.placed?;
        // The chunk's router hashes, deepest first, up to the placed block.
        let mut routers: smallvec::SmallVec<[BlockHash; 8]> = smallvec::SmallVec::new();
        let mut at = engine;
        for _ in 0..chunk {
            let (router, parent) = self.blocks.link(at)?;
            routers.push(router);
            at = parent?;
        }
        if at != placed.engine {
            return None;
        }
        let mut position = placed.position;
        for &router in routers.iter().rev() {
            position = tree.below(position, router)?;
        }
        tree.resolve(position, worker)
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
        if tier == Tier::Device {
            if let Some(n) = self.copies.get_mut(&engine) {
                // One of several copies went: the block stays held.
                *n -= 1;
                if *n == 0 {
                    self.copies.remove(&engine);
                }
                outcome.removed_blocks += 1;
                return;
            }
        }
        let Some(router) = self.blocks.router(engine) else {
            if tier != Tier::Device && self.gone.get(engine).is_some() {
                // A block the mirror dropped lately, no tier holding it: vLLM's
                // self-describing removal names every block of a chunk, also of a chunk it
                // stored as a placeholder (naming its last block only) for want of the
                // chunk's metadata, so a block before a chunk's last can be removed once
                // more than stores announced it.
                outcome.removed_blocks += 1;
                return;
            }
            outcome.unknown_removed_blocks += 1;
            return;
        };
        // The block's position, or else the end of its path through the parent links.
        // Without either, an ancestor already removed took the block out of the tree.
        let found = self.locate_or_walk(tree, engine, Some(router), worker, path);
        // Whether the block stays held at another tier (read before the tree changes: its
        // node may merge away). In a tree without lower tiers a block is held at the device
        // tier alone, so a lower tier's removal keeps it.
        // The record stays while the block is held elsewhere: a device block while a lower
        // tier announces it, a lower tier's while other announcements stand or the device
        // holds it.
        let kept = if tier == Tier::Device {
            let lower = self.lower_holds(router);
            if lower {
                self.lower_only.insert(engine, ());
            }
            lower
        } else {
            self.withdraw(router) || self.lower_only.remove(&engine).is_none()
        };
        if let Some(at) = found {
            tree.remove_tier_at(worker, at, tier);
        }
        if !kept {
            self.drop_record(engine, router);
        }
        outcome.removed_blocks += 1;
    }

    /// The worker's device tier was cleared: records of blocks it no longer holds at any
    /// tier go; tips are forgotten.
    pub(super) fn cleared_device(&mut self) {
        self.recent.clear();
        self.placed = None;
        self.copies.clear();
        self.lower_only.clear();
        if self.tiered || self.untiered_drops < PROBATION {
            // The records dropped are kept a while among the gone, with their links, as a
            // device removal keeps them: copies issued before the clear are reported after
            // it (vLLM completes pending CPU stores), and name these blocks.
            let lower = &self.lower;
            let mut dropped = Vec::new();
            self.blocks.retain(|engine, router| {
                if !lower.contains_key(&router) {
                    dropped.push(engine);
                }
                true
            });
            let bound = dropped.len();
            for engine in dropped {
                if let Some((router, parent)) = self.blocks.link(engine) {
                    let dropped = Dropped { router, parent };
                    self.gone.keep(engine, dropped, bound);
                }
            }
        }
        let (lower, lower_only) = (&self.lower, &mut self.lower_only);
        self.blocks.retain(|engine, router| {
            let kept = lower.contains_key(&router);
            if kept {
                lower_only.insert(engine, ());
            }
            kept
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One worker's sync state over a tree, with a 64-token prompt of 4 blocks (engine
    /// hashes 1–4) whose router hashes are `routers`.
    struct Fixture {
        hasher: PrefixHasher,
        tree: RadixTree,
        w: WorkerId,
        ws: WorkerSync,
        scratch: Scratch,
        outcome: SyncOutcome,
        tokens: Vec<u32>,
        routers: Vec<BlockHash>,
    }

    impl Fixture {
        fn new() -> Self {
            let hasher = PrefixHasher::new(16).unwrap();
            let mut tree = RadixTree::new();
            tree.track_positions();
            let tokens: Vec<u32> = (1..=64).collect();
            let mut routers = Vec::new();
            hasher.hash_into(&tokens, &mut routers);
            Fixture {
                hasher,
                tree,
                w: WorkerId::new(0),
                ws: WorkerSync::default(),
                scratch: Scratch::default(),
                outcome: SyncOutcome::default(),
                tokens,
                routers,
            }
        }

        /// Stores engine blocks `blocks` from the root, the prompt's first tokens, on `tier`.
        fn store(&mut self, blocks: &[u64], tier: Tier) {
            let stored = Stored {
                parent: None,
                blocks,
                tokens: &self.tokens[..16 * blocks.len()],
                tier,
                salt: &[],
                keys: &[],
                copies: true,
            };
            let Fixture {
                hasher,
                tree,
                w,
                ws,
                scratch,
                outcome,
                ..
            } = self;
            ws.store(hasher, tree, *w, &stored, scratch, outcome);
        }

        /// Stores `blocks` on `tier` as a placeholder of chunks of `chunk` blocks.
        fn placeholder(&mut self, blocks: &[u64], tier: Tier, chunk: usize) {
            let Fixture {
                tree,
                w,
                ws,
                scratch,
                outcome,
                ..
            } = self;
            ws.store_placeholder(tree, *w, blocks, tier, chunk, scratch, outcome);
        }

        /// Removes `blocks` from `tier`, one by one.
        fn remove(&mut self, blocks: &[u64], tier: Tier) {
            let Fixture {
                tree,
                w,
                ws,
                scratch,
                outcome,
                ..
            } = self;
            for &b in blocks {
                ws.remove(tree, *w, b, tier, &mut scratch.path, outcome);
            }
        }
    }

    /// A block the device dropped, brought back for a host copy reported late, is recorded
    /// under its old parent link: linked to nothing it would stand at the root, and a
    /// device store below it that the tree cannot place by position (a block inside a
    /// longer run whose kept position went stale) was placed at the root, so the prompt's
    /// hit stopped before it (placeholder CPU chunks, a device pool small enough to evict
    /// blocks before their copies are reported).
    #[test]
    fn a_record_brought_back_for_a_late_host_copy_keeps_its_parent() {
        let mut f = Fixture::new();
        f.store(&[1, 2, 3, 4], Tier::Device);
        // A host copy of block 1 (the worker now has a lower tier); the device drops
        // blocks 2-4; the host copy of block 4 is reported after that.
        f.placeholder(&[1], Tier::Host, 1);
        f.remove(&[4, 3, 2], Tier::Device);
        f.placeholder(&[4], Tier::Host, 1);
        assert_eq!(f.outcome.unknown_blocks, 0);
        assert_eq!(f.ws.blocks.link(4), Some((f.routers[3], Some(3))));
        let mut path = Vec::new();
        assert!(
            !f.ws.blocks.path_to(4, &mut path),
            "its parent is not recorded"
        );
        // The device computes blocks 1-3 again: block 4's path runs from the root.
        f.store(&[1, 2, 3], Tier::Device);
        assert!(f.ws.blocks.path_to(4, &mut path));
        assert_eq!(path, f.routers);
    }

    /// A device cleared (a prefix-cache reset that keeps the CPU copies) while host copies
    /// were in flight: vLLM reports them after the clear, naming blocks whose records the
    /// clear dropped; they are kept among the gone, so the copies are followed (a reset
    /// with `reset_connector=False` under placeholder chunks of 4 blocks).
    #[test]
    fn copies_reported_after_a_clear_are_followed() {
        let mut f = Fixture::new();
        f.store(&[1, 2, 3, 4], Tier::Device);
        f.placeholder(&[1], Tier::Host, 1);
        f.tree.clear_tier(f.w, Tier::Device);
        f.ws.cleared_device();
        f.placeholder(&[4], Tier::Host, 1);
        assert_eq!(f.outcome.unknown_blocks, 0);
        assert!(f.ws.lower_holds(f.routers[3]));
        assert_eq!(f.ws.blocks.link(4), Some((f.routers[3], Some(3))));
    }

    /// A self-describing engine stores a chunk as a placeholder when it lacks the chunk's
    /// metadata (vLLM keeps it only while the chunk is held, and takes it again on a CPU
    /// hit), then removes the chunk with every block's hash: the blocks before the last,
    /// which the device dropped, are removed as known, not counted as unknown
    /// (self-describing chunks of 4 blocks).
    #[test]
    fn a_chunk_stored_as_a_placeholder_may_be_removed_block_by_block() {
        let mut f = Fixture::new();
        f.store(&[1, 2, 3, 4], Tier::Device);
        f.store(&[1, 2, 3, 4], Tier::Host);
        f.remove(&[1, 2, 3, 4], Tier::Host);
        f.remove(&[4, 3, 2, 1], Tier::Device);
        f.outcome = SyncOutcome::default();
        f.placeholder(&[4], Tier::Host, 4);
        assert_eq!(f.outcome.unknown_blocks, 0);
        assert!(f.ws.lower_holds(f.routers[3]));
        f.outcome = SyncOutcome::default();
        f.remove(&[1, 2, 3, 4], Tier::Host);
        assert_eq!(
            (f.outcome.unknown_removed_blocks, f.outcome.removed_blocks),
            (0, 4)
        );
        assert!(!f.ws.lower_holds(f.routers[3]));
        assert!(!f.ws.has_lower());
    }

    /// The device drops blocks before the worker's first copy to a lower tier is reported
    /// (the copy began before the drop): the records are kept on probation, so the copy is
    /// followed; a worker that drops more than [`PROBATION`] records with no lower tier
    /// keeps none (a worker whose first CPU copies, in chunks of 1 and 4 blocks, named
    /// blocks its GPU had dropped in the same batch).
    #[test]
    fn first_copies_reported_after_the_device_dropped_their_blocks_are_followed() {
        let mut f = Fixture::new();
        f.store(&[1, 2, 3, 4], Tier::Device);
        f.remove(&[4, 3], Tier::Device);
        f.placeholder(&[4], Tier::Host, 1);
        assert_eq!(f.outcome.unknown_blocks, 0);
        assert!(f.ws.lower_holds(f.routers[3]));

        // A worker with no lower tier keeps no dropped record past its probation.
        let mut f = Fixture::new();
        f.tokens = (1..=16 * (PROBATION + 1)).collect();
        let engine: Vec<u64> = (1..=u64::from(PROBATION) + 1).collect();
        f.store(&engine, Tier::Device);
        let reversed: Vec<u64> = engine.iter().rev().copied().collect();
        f.remove(&reversed, Tier::Device);
        assert_eq!(f.ws.gone.router(engine[0]), None);
        assert_eq!(f.ws.gone.allocation_size(), 0);
    }
}
