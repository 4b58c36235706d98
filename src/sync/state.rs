//! Per-worker sync state: the engine-hash map and sequence tracking, and how events change
//! the tree.

use super::blocks::{EngineBlock, EngineBlocks};
use super::tips::Tips;
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

    /// The router path of the stored block `engine` into `out`: from the remembered tips
    /// (taking the tip), else from the tree when the block ends an edge there and `worker`
    /// holds it (the path the mirror holds for it: with chained hashes, the one the parent
    /// links give), else through the parent links, one lookup per block of depth. `false`
    /// when none knows it.
    fn find_path(
        &mut self,
        tree: &RadixTree,
        engine: u64,
        worker: WorkerId,
        out: &mut Vec<BlockHash>,
    ) -> bool {
        self.recent.take(engine, out)
            || self
                .blocks
                .get(engine)
                .is_some_and(|b| tree.path_ending_at(b.router, Some(worker), out))
            || self.path_to(engine, out)
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
    /// Scratch path, kept to avoid allocating per event.
    path: Vec<BlockHash>,
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
            + self.path.capacity() * core::mem::size_of::<BlockHash>()
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
                let root = match parent {
                    None => {
                        path.clear();
                        hasher.root(&[])
                    }
                    Some(p) => {
                        if !ws.find_path(tree, *p, worker, &mut path) {
                            outcome.unknown_parent_blocks = blocks.len();
                            self.path = path;
                            return Ok(outcome);
                        }
                        path[path.len() - 1]
                    }
                };
                let start = path.len();
                hasher.continue_from(root, tokens, &mut path);
                for &engine in blocks {
                    ws.blocks.touch(engine);
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
                tree.insert(worker, &path);
                if let Some(&tip) = blocks.last() {
                    ws.recent.remember(tip, &mut path);
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
                    // Without a path, an ancestor already removed took this block out of
                    // the tree.
                    if ws.find_path(tree, engine, worker, &mut path) {
                        tree.truncate(worker, &path, path.len() - 1);
                        ws.recent.forget_through(&path);
                        // The parent is now a chain tip: remembering it makes evicting a
                        // chain last block first cost O(1) per block, not O(depth).
                        if let Some(parent) = block.parent() {
                            path.pop();
                            ws.recent.remember(parent, &mut path);
                        }
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
