//! Per-worker sync state: the engine-hash map and sequence tracking, and how events change
//! the tree.

use super::blocks::{EngineBlock, EngineBlocks};
use super::tips::{Tip, Tips};
use super::{CacheEvent, Sequence, SyncOutcome};
use crate::fold::FoldMap;
use crate::tree::Position;
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

/// Paths reused from event to event, so that applying one allocates nothing once warm.
#[derive(Debug, Default)]
struct Scratch {
    /// The router path of a store (or of a removed block found through the parent links).
    path: Vec<BlockHash>,
    /// A store's whole path from the root, when it must be inserted whole.
    full: Vec<BlockHash>,
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

    /// Where the tree holds the stored block `engine` for `worker`: from the block's
    /// remembered tip (taken), or the tree's last-block index and kept positions (`router`:
    /// the block's router hash when the caller has its record; looked up otherwise). Either
    /// is checked by the tree, so the position is the path the mirror holds for the block
    /// (with chained hashes, the one its parent links give).
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
            None => self.blocks.get(engine)?.router,
        };
        tree.find(router, worker)
    }

    /// Remembers `tip`; a tip it displaces has its position kept by the tree instead, so
    /// that a later event naming that block (a conversation's next turn, say) still finds it
    /// without walking the parent links.
    fn remember(&mut self, tree: &mut RadixTree, tip: Tip) {
        if let Some(old) = self.recent.remember(tip) {
            tree.keep(old.position);
        }
    }

    fn clear(&mut self) {
        self.blocks.clear();
        self.extra_refs.clear();
        self.recent.clear();
    }

    /// Applies a `Stored` event: finds where its blocks go (below the parent's position, or
    /// below the parent's path rebuilt from the links), records them in the engine map and
    /// inserts them into the tree.
    fn store(
        &mut self,
        hasher: &PrefixHasher,
        tree: &mut RadixTree,
        worker: WorkerId,
        event: Stored<'_>,
        scratch: &mut Scratch,
        outcome: &mut SyncOutcome,
    ) {
        let path = &mut scratch.path;
        path.clear();
        let (root, below) = match event.parent {
            None => (hasher.root(&[]), None),
            Some(p) => match self.locate(tree, p, None, worker) {
                Some(at) => (at.block(), Some(at)),
                None if self.path_to(p, path) => (path[path.len() - 1], None),
                None => {
                    outcome.unknown_parent_blocks = event.blocks.len();
                    return;
                }
            },
        };
        let start = path.len();
        hasher.continue_from(root, event.tokens, path);
        self.record(event.parent, event.blocks, &path[start..], outcome);
        let tip = match below {
            Some(at) => tree.insert_below(worker, at, path).or_else(|| {
                // The parent is inside an edge the store diverges from: the whole path.
                tree.path_to(at, &mut scratch.full);
                scratch.full.extend_from_slice(path);
                tree.insert_path(worker, &scratch.full)
            }),
            None => tree.insert_path(worker, path),
        };
        if let (Some(&engine), Some(position)) = (event.blocks.last(), tip) {
            self.remember(tree, Tip { engine, position });
        }
    }

    /// Records stored blocks (engine hashes with their router hashes) in the engine map:
    /// new ones, and duplicates counted apart.
    fn record(
        &mut self,
        parent: Option<u64>,
        blocks: &[u64],
        routers: &[BlockHash],
        outcome: &mut SyncOutcome,
    ) {
        if self.blocks.touch_pays() {
            for &engine in blocks {
                self.blocks.touch(engine);
            }
        }
        let mut prev = parent;
        for (&engine, &router) in blocks.iter().zip(routers) {
            let block = EngineBlock {
                engine,
                router,
                parent: prev.unwrap_or(engine),
            };
            if self.blocks.insert(block) {
                outcome.stored_blocks += 1;
            } else {
                let extra = self.extra_refs.entry(engine).or_insert(0);
                *extra = extra.saturating_add(1);
                outcome.duplicate_blocks += 1;
            }
            prev = Some(engine);
        }
    }

    /// Applies the removal of one block.
    fn remove(
        &mut self,
        tree: &mut RadixTree,
        worker: WorkerId,
        engine: u64,
        path: &mut Vec<BlockHash>,
        outcome: &mut SyncOutcome,
    ) {
        let Some(&block) = self.blocks.get(engine) else {
            outcome.unknown_removed_blocks += 1;
            return;
        };
        if let Some(extra) = self.extra_refs.get_mut(&engine) {
            *extra -= 1;
            if *extra == 0 {
                self.extra_refs.remove(&engine);
            }
            outcome.duplicate_blocks += 1;
            return;
        }
        // The block's position in the tree, or else the end of its path through the parent
        // links. Without either, an ancestor already removed took the block out of the tree.
        let found = match self.locate(tree, engine, Some(block.router), worker) {
            Some(at) => Some(at),
            None if self.path_to(engine, path) => tree.find_path(path),
            None => None,
        };
        if let Some(at) = found {
            // The parent now ends an edge the worker holds, so the tree's index finds it
            // when it is evicted next (a chain evicted last block first costs O(1) a block).
            tree.truncate_at(worker, at);
        }
        self.blocks.remove(engine);
        outcome.removed_blocks += 1;
    }
}

/// The fields of a `Stored` event.
#[derive(Clone, Copy)]
struct Stored<'e> {
    parent: Option<u64>,
    blocks: &'e [u64],
    tokens: &'e [TokenId],
}

/// Sync state of every worker of one mirror.
#[derive(Debug, Default)]
pub(crate) struct SyncState {
    workers: Vec<WorkerSync>,
    scratch: Scratch,
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

/// Where batch `seq` stands against the last one seen (`None`: the first).
fn classify(last: Option<u64>, seq: u64) -> Sequence {
    match last {
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
    }
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
        let paths = self.scratch.path.capacity() + self.scratch.full.capacity();
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
            + paths * core::mem::size_of::<BlockHash>()
    }

    /// Applies one event to `tree`: checks it, classifies its sequence number (a restart
    /// clears the worker first), then applies it.
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
        tree.track_positions();
        let mut outcome = SyncOutcome {
            sequence: classify(ws.last_seq, seq),
            ..SyncOutcome::default()
        };
        if let Sequence::Restart { .. } = outcome.sequence {
            ws.clear();
            tree.remove_worker(worker);
        }
        ws.last_seq = Some(seq);
        let (ws, scratch) = (&mut self.workers[worker.index()], &mut self.scratch);
        match event {
            CacheEvent::Stored {
                parent,
                blocks,
                tokens,
            } => {
                let stored = Stored {
                    parent: *parent,
                    blocks,
                    tokens,
                };
                ws.store(hasher, tree, worker, stored, scratch, &mut outcome);
            }
            CacheEvent::Removed { blocks } => {
                for &engine in blocks {
                    ws.remove(tree, worker, engine, &mut scratch.path, &mut outcome);
                }
            }
            CacheEvent::Cleared => {
                ws.clear();
                tree.remove_worker(worker);
            }
        }
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
            hasher.hash_into(prefix, &mut self.scratch.path);
            tree.insert(worker, &self.scratch.path);
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
        let path = &mut self.scratch.path;
        hasher.hash_salted_into(salt, tokens, path);
        let held = tree.held_prefix(worker, path);
        let reported = (cached_tokens / hasher.block_size()).min(path.len());
        if reported < held {
            tree.truncate(worker, path, reported);
        } else if reported > held {
            tree.insert(worker, &path[..reported]);
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
