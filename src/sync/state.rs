//! Per-worker sync state: the engine-hash map and sequence tracking, and how events change
//! the tree.

use super::blocks::{EngineBlock, EngineBlocks};
use super::tips::{Tip, Tips};
use super::{CacheEvent, Sequence, SyncOutcome};
use crate::tree::FoldMap;
use crate::{BlockHash, Error, PrefixHasher, RadixTree, TokenId, WorkerId};

#[derive(Debug, Default)]
struct WorkerSync {
    last_seq: Option<u64>,
    blocks: EngineBlocks,
    /// Stores of a block beyond its first (duplicates are rare, so they live apart and the
    /// main map's entries stay small).
    extra_refs: FoldMap<u64, u32>,
    /// Chain tips most likely named by the next events.
    recent: Tips,
}

impl WorkerSync {
    /// The router path from the root to `engine` (inclusive), through the parent links.
    /// `false` when an ancestor is unknown (or the links loop: a hostile stream).
    fn path_to(&self, engine: u64, out: &mut Vec<BlockHash>) -> bool {
        out.clear();
        let mut next = Some(engine);
        while let Some(e) = next {
            let Some(block) = self.blocks.get(e) else {
                return false;
            };
            if out.len() > self.blocks.len() {
                return false;
            }
            out.push(block.router);
            next = block.parent();
        }
        out.reverse();
        true
    }

    /// Where the tree holds the stored block `engine` for `worker`: the node, the block's
    /// depth and its router hash, from the block's remembered tip (taken) or the tree's index
    /// of edges' last blocks and kept positions (`router`: the block's router hash when the
    /// caller has its record; looked up otherwise). Either is checked by the tree, so the
    /// position is the path the mirror holds for the block (with chained hashes, the one its
    /// parent links give).
    fn locate(
        &mut self,
        tree: &RadixTree,
        engine: u64,
        router: Option<BlockHash>,
        worker: WorkerId,
    ) -> Option<(u32, usize, BlockHash)> {
        if let Some(tip) = self.recent.take(engine) {
            let depth = tip.depth as usize;
            if let Some(node) = tree.position(tip.node, depth, tip.router, worker) {
                return Some((node, depth, tip.router));
            }
        }
        let router = match router {
            Some(router) => router,
            None => self.blocks.get(engine)?.router,
        };
        let (node, depth) = tree.indexed_position(router, worker)?;
        Some((node, depth, router))
    }

    /// Remembers `tip`; a tip it displaces has its position kept by the tree instead, so
    /// that a later event naming that block (a conversation's next turn, say) still finds it
    /// without walking the parent links.
    fn remember(&mut self, tree: &mut RadixTree, tip: Tip) {
        if let Some(old) = self.recent.remember(tip) {
            tree.keep_position(old.router, old.node, old.depth as usize);
        }
    }

    fn clear(&mut self) {
        self.blocks.clear();
        self.extra_refs.clear();
        self.recent.clear();
    }
}

/// Sync state of every worker of one mirror.
#[derive(Debug, Default)]
pub(crate) struct SyncState {
    workers: Vec<WorkerSync>,
    /// Scratch paths, kept to avoid allocating per event.
    path: Vec<BlockHash>,
    scratch: Vec<BlockHash>,
}

fn check_worker(worker: WorkerId) -> Result<(), Error> {
    if worker.get() >= RadixTree::MAX_WORKERS {
        return Err(Error::WorkerOutOfRange {
            worker: worker.get(),
            limit: RadixTree::MAX_WORKERS,
        });
    }
    Ok(())
}

impl SyncState {
    fn worker(&mut self, worker: WorkerId) -> &mut WorkerSync {
        let w = worker.index();
        if self.workers.len() <= w {
            self.workers.resize_with(w + 1, WorkerSync::default);
        }
        &mut self.workers[w]
    }

    /// Forgets the worker's engine map (its mirror is being replaced or removed).
    pub(crate) fn forget(&mut self, worker: WorkerId) {
        if let Some(ws) = self.workers.get_mut(worker.index()) {
            ws.clear();
            ws.last_seq = None;
        }
    }

    /// Bytes allocated by the engine maps.
    pub(crate) fn memory_bytes(&self) -> usize {
        self.workers.capacity() * core::mem::size_of::<WorkerSync>()
            + self
                .workers
                .iter()
                .map(|w| {
                    w.blocks.allocation_size()
                        + w.extra_refs.allocation_size()
                        + w.recent.allocation_size()
                })
                .sum::<usize>()
            + (self.path.capacity() + self.scratch.capacity()) * core::mem::size_of::<BlockHash>()
    }

    /// Applies one event to `tree`.
    pub(crate) fn apply(
        &mut self,
        hasher: &PrefixHasher,
        tree: &mut RadixTree,
        worker: WorkerId,
        seq: u64,
        event: &CacheEvent,
    ) -> Result<SyncOutcome, Error> {
        check_worker(worker)?;
        validate(hasher, event)?;
        let ws = self.worker(worker);
        if let CacheEvent::Stored { blocks, .. } = event {
            if ws.blocks.len().saturating_add(blocks.len()) > EngineBlocks::MAX_LEN {
                return Err(Error::InvalidEvent(format!(
                    "worker {} would hold more than {} engine blocks",
                    worker.get(),
                    EngineBlocks::MAX_LEN
                )));
            }
        }
        tree.index_last_blocks();
        let mut outcome = SyncOutcome::default();
        let mut path = core::mem::take(&mut self.path);
        let mut full = core::mem::take(&mut self.scratch);
        let ws = self.worker(worker);
        outcome.sequence = match ws.last_seq {
            Some(last) if seq == last || seq == last.wrapping_add(1) => Sequence::InOrder,
            Some(last) if seq > last => Sequence::Gap {
                expected: last + 1,
                received: seq,
            },
            Some(last) => Sequence::Restart {
                previous: last,
                received: seq,
            },
            None => Sequence::InOrder,
        };
        if let Sequence::Restart { .. } = outcome.sequence {
            ws.clear();
            tree.remove_worker(worker);
        }
        ws.last_seq = Some(seq);
        match event {
            CacheEvent::Stored {
                parent,
                blocks,
                tokens,
            } => {
                // The new blocks go below a position of the tree (no path needed), or below
                // the path in `path` (empty at the root).
                path.clear();
                let mut below = None;
                let root = match parent {
                    None => hasher.root(&[]),
                    Some(p) => match ws.locate(tree, *p, None, worker) {
                        Some((node, depth, router)) => {
                            below = Some((node, depth));
                            router
                        }
                        None if ws.path_to(*p, &mut path) => path[path.len() - 1],
                        None => {
                            outcome.unknown_parent_blocks = blocks.len();
                            self.path = path;
                            self.scratch = full;
                            return Ok(outcome);
                        }
                    },
                };
                let start = path.len();
                hasher.continue_from(root, tokens, &mut path);
                if ws.blocks.touch_pays() {
                    for &engine in blocks {
                        ws.blocks.touch(engine);
                    }
                }
                let mut prev = *parent;
                for (&engine, &router) in blocks.iter().zip(&path[start..]) {
                    let block = EngineBlock {
                        engine,
                        router,
                        parent: prev.unwrap_or(engine),
                    };
                    if ws.blocks.insert(block) {
                        outcome.stored_blocks += 1;
                    } else {
                        let extra = ws.extra_refs.entry(engine).or_insert(0);
                        *extra = extra.saturating_add(1);
                        outcome.duplicate_blocks += 1;
                    }
                    prev = Some(engine);
                }
                let depth = match below {
                    Some((node, depth)) => {
                        if !tree.insert_below(worker, node, depth, &path) {
                            // The parent is inside an edge: the whole path, then.
                            tree.path_to_position(node, depth, &mut full);
                            full.extend_from_slice(&path);
                            tree.insert(worker, &full);
                        }
                        depth + path.len()
                    }
                    None => {
                        tree.insert(worker, &path);
                        path.len()
                    }
                };
                if let (Some(&engine), Some(&router)) = (blocks.last(), path.last()) {
                    let node = tree.last_insert_end();
                    ws.remember(
                        tree,
                        Tip {
                            engine,
                            router,
                            node,
                            depth: depth_u32(depth),
                        },
                    );
                }
            }
            CacheEvent::Removed { blocks } => {
                for &engine in blocks {
                    let Some(&block) = ws.blocks.get(engine) else {
                        outcome.unknown_removed_blocks += 1;
                        continue;
                    };
                    if let Some(extra) = ws.extra_refs.get_mut(&engine) {
                        *extra -= 1;
                        if *extra == 0 {
                            ws.extra_refs.remove(&engine);
                        }
                        outcome.duplicate_blocks += 1;
                        continue;
                    }
                    // The block's position in the tree, or else the node holding the end
                    // of its path through the parent links. Without either, an ancestor
                    // already removed took the block out of the tree.
                    let found = match ws.locate(tree, engine, Some(block.router), worker) {
                        Some((node, depth, _)) => Some((node, depth)),
                        None if ws.path_to(engine, &mut path) => {
                            tree.node_holding_end(&path).map(|node| (node, path.len()))
                        }
                        None => None,
                    };
                    if let Some((node, depth)) = found {
                        // The parent now ends an edge the worker holds, so the tree's index
                        // finds it when it is evicted next (a chain evicted last block first
                        // costs O(1) per block).
                        tree.truncate_at(worker, node, depth - 1);
                    }
                    ws.blocks.remove(engine);
                    outcome.removed_blocks += 1;
                }
            }
            CacheEvent::Cleared => {
                ws.clear();
                tree.remove_worker(worker);
            }
        }
        self.path = path;
        self.scratch = full;
        Ok(outcome)
    }

    /// Replaces the worker's mirror by `prefixes`.
    pub(crate) fn replace(
        &mut self,
        hasher: &PrefixHasher,
        tree: &mut RadixTree,
        worker: WorkerId,
        prefixes: &[&[TokenId]],
    ) -> Result<(), Error> {
        check_worker(worker)?;
        self.worker(worker).clear();
        tree.remove_worker(worker);
        for prefix in prefixes {
            hasher.hash_into(prefix, &mut self.path);
            tree.insert(worker, &self.path);
        }
        Ok(())
    }

    /// Sets the worker's mirror of `tokens` (salted with `salt`) to `cached_tokens`.
    pub(crate) fn report(
        &mut self,
        hasher: &PrefixHasher,
        tree: &mut RadixTree,
        worker: WorkerId,
        salt: &[u8],
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(), Error> {
        check_worker(worker)?;
        hasher.hash_salted_into(salt, tokens, &mut self.path);
        let held = tree.held_prefix(worker, &self.path);
        let reported = (cached_tokens / hasher.block_size()).min(self.path.len());
        if reported < held {
            tree.truncate(worker, &self.path, reported);
        } else if reported > held {
            tree.insert(worker, &self.path[..reported]);
        }
        Ok(())
    }
}

/// A path length as a tip stores it (saturating: a tip of an absurdly deep block is stale,
/// never wrong).
fn depth_u32(depth: usize) -> u32 {
    u32::try_from(depth).unwrap_or(u32::MAX)
}

/// Checks an event against the router's block size before anything changes.
fn validate(hasher: &PrefixHasher, event: &CacheEvent) -> Result<(), Error> {
    let CacheEvent::Stored { blocks, tokens, .. } = event else {
        return Ok(());
    };
    let block_size = hasher.block_size();
    if tokens.len() == blocks.len() * block_size {
        return Ok(());
    }
    if !blocks.is_empty() && tokens.len() % blocks.len() == 0 {
        return Err(Error::BlockSizeMismatch {
            engine: tokens.len() / blocks.len(),
            router: block_size,
        });
    }
    Err(Error::InvalidEvent(format!(
        "a stored event has {} token ids for {} blocks: expected {} tokens per block",
        tokens.len(),
        blocks.len(),
        block_size
    )))
}
