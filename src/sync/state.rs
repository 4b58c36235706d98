//! The sync state of one mirror: sequence tracking, and each event routed to the worker and
//! group it changes.

use super::groups::Groups;
use super::settings::{EngineSettings, Settings};
use super::store::{Scratch, Stored, SyncConfig};
use super::worker::WorkerSync;
use super::{CacheEvent, Sequence, SyncOutcome};
use crate::error::Error;
use crate::hash::{BlockHash, PrefixHasher, TokenId};
use crate::tree::Tier;
use crate::tree::{RadixTree, WorkerId};

/// Sync state of every worker of one mirror.
#[derive(Debug, Default)]
pub(crate) struct SyncState {
    config: SyncConfig,
    /// The last batch seq per worker.
    seqs: Vec<Option<u64>>,
    /// The main group, per worker.
    workers: Vec<WorkerSync>,
    /// Each worker's settings: the host's and what its events showed.
    settings: Vec<Settings>,
    groups: Groups,
    scratch: Scratch,
    /// Whether a store below the device tier was ever applied.
    lower: bool,
    /// The main group's last store, when it was a prefix hit reported again: its worker,
    /// first engine block and token count (the other groups' reports of it follow).
    reported: Option<(WorkerId, u64, usize)>,
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
    /// A sync state configured by `config`.
    pub(crate) fn new(config: SyncConfig) -> Self {
        Self {
            config,
            ..Self::default()
        }
    }

    fn worker(&mut self, worker: WorkerId) -> &mut WorkerSync {
        let w = worker.index();
        if self.workers.len() <= w {
            self.workers.resize_with(w + 1, WorkerSync::default);
            self.seqs.resize(w + 1, None);
            self.settings.resize_with(w + 1, Settings::default);
        }
        &mut self.workers[w]
    }

    /// `worker`'s settings, default ones when it has none.
    fn settings_of(&self, worker: WorkerId) -> Option<&Settings> {
        self.settings.get(worker.index())
    }

    /// Blocks per lower-tier chunk of `worker`.
    pub(super) fn chunk_blocks(&self, worker: WorkerId) -> usize {
        self.settings_of(worker)
            .map_or(self.config.chunk_blocks, |s| {
                s.chunk_blocks(self.config.chunk_blocks)
            })
    }

    /// Whether `worker` reports prefix hits again.
    fn full_reports(&self, worker: WorkerId) -> bool {
        self.settings_of(worker)
            .map_or(self.config.full_reports, |s| {
                s.full_reports(self.config.full_reports)
            })
    }

    /// Sets `worker`'s engine settings (see [`EngineSettings`]).
    pub(crate) fn set_settings(
        &mut self,
        hasher: &PrefixHasher,
        worker: WorkerId,
        settings: &EngineSettings,
    ) -> Result<(), Error> {
        check_worker(worker)?;
        settings.validate()?;
        self.worker(worker);
        self.settings[worker.index()].set(settings);
        self.join_groups(hasher, worker);
        Ok(())
    }

    /// `worker`'s engine settings in effect: the host's, what its events showed, the
    /// index's defaults.
    pub(crate) fn settings(&self, worker: WorkerId) -> EngineSettings {
        let (chunk, full) = (self.config.chunk_blocks, self.config.full_reports);
        self.settings_of(worker)
            .map_or_else(Settings::default, Clone::clone)
            .effective(chunk, full)
    }

    /// Makes `worker` a member of every group its settings name, with their windows.
    fn join_groups(&mut self, hasher: &PrefixHasher, worker: WorkerId) {
        let Some(settings) = self.settings.get(worker.index()) else {
            return;
        };
        for (group, kind) in settings.effective(1, false).groups {
            if group < self.config.max_groups {
                self.groups.join(worker, group, kind, hasher.block_size());
            }
        }
    }

    /// The main group's state of `worker`, if it has one.
    pub(super) fn worker_sync(&self, worker: WorkerId) -> Option<&WorkerSync> {
        self.workers.get(worker.index())
    }

    /// Whether what the tree holds can differ from what a worker would reuse beyond the
    /// device cap: groups beyond the main one are mirrored, or a lower tier was reported.
    #[inline]
    pub(crate) fn refines(&self) -> bool {
        self.lower || self.groups.any()
    }

    /// The groups beyond the main one.
    pub(crate) fn groups(&self) -> &Groups {
        &self.groups
    }

    /// The groups beyond the main one, to record a routed prompt.
    pub(crate) fn groups_mut(&mut self) -> &mut Groups {
        &mut self.groups
    }

    /// Forgets the worker's engine maps and what its events showed of its settings (its
    /// mirror is being replaced, or its engine restarted); the host's settings stay.
    pub(crate) fn forget(&mut self, hasher: &PrefixHasher, worker: WorkerId) {
        if let Some(ws) = self.workers.get_mut(worker.index()) {
            ws.clear();
            self.seqs[worker.index()] = None;
            self.settings[worker.index()].forget_shown();
        }
        self.groups.forget(worker);
        self.join_groups(hasher, worker);
    }

    /// Forgets everything of `worker`, its settings too (it was removed or added anew).
    pub(crate) fn reset(&mut self, worker: WorkerId) {
        if let Some(ws) = self.workers.get_mut(worker.index()) {
            ws.clear();
            self.seqs[worker.index()] = None;
            self.settings[worker.index()] = Settings::default();
        }
        self.groups.forget(worker);
    }

    /// Bytes allocated by the engine maps.
    pub(crate) fn memory_bytes(&self) -> usize {
        let s = &self.scratch;
        let paths = (s.path.capacity() + s.full.capacity()) * core::mem::size_of::<BlockHash>()
            + s.coarse.capacity() * 8
            + s.again.capacity() * 4;
        self.workers.capacity() * core::mem::size_of::<WorkerSync>()
            + self.seqs.capacity() * core::mem::size_of::<Option<u64>>()
            + self
                .workers
                .iter()
                .map(WorkerSync::allocation_size)
                .sum::<usize>()
            + self.groups.memory_bytes()
            + paths
    }

    /// Applies one event to `tree`: checks it, classifies its sequence number (a restart
    /// clears the worker first), then applies it to its group.
    pub(crate) fn apply(
        &mut self,
        hasher: &PrefixHasher,
        tree: &mut RadixTree,
        worker: WorkerId,
        seq: u64,
        event: &CacheEvent,
    ) -> Result<SyncOutcome, Error> {
        check_worker(worker)?;
        let ratio = check(hasher, event)?;
        if let CacheEvent::Stored { blocks, .. } = event {
            let held = self.worker(worker).blocks.len();
            if held.saturating_add(blocks.len()) > super::blocks::EngineBlocks::MAX_LEN {
                return Err(Error::InvalidEvent(format!(
                    "worker {} would hold more than {} engine blocks",
                    worker.get(),
                    super::blocks::EngineBlocks::MAX_LEN
                )));
            }
        }
        tree.track_positions();
        self.worker(worker);
        let w = worker.index();
        let mut outcome = SyncOutcome {
            sequence: classify(self.seqs[w], seq),
            ..SyncOutcome::default()
        };
        if let Sequence::Restart { .. } = outcome.sequence {
            self.forget(hasher, worker);
            tree.remove_worker(worker);
        }
        self.seqs[w] = Some(seq);
        match event {
            CacheEvent::Stored { .. } => {
                self.stored(hasher, tree, worker, event, ratio, &mut outcome)
            }
            CacheEvent::Removed {
                blocks,
                tier,
                group,
            } => {
                self.removed(tree, worker, blocks, *tier, *group, &mut outcome);
            }
            CacheEvent::Cleared => {
                tree.clear_tier(worker, Tier::Device);
                self.workers[w].cleared_device();
                self.groups.clear_device(worker);
            }
        }
        Ok(outcome)
    }

    /// Applies a `Stored` event whose blocks hold `ratio` engine blocks per router block.
    fn stored(
        &mut self,
        hasher: &PrefixHasher,
        tree: &mut RadixTree,
        worker: WorkerId,
        event: &CacheEvent,
        ratio: usize,
        outcome: &mut SyncOutcome,
    ) {
        let CacheEvent::Stored {
            parent,
            blocks,
            tokens,
            tier,
            group,
            salt,
            keys,
            kind,
            ..
        } = event
        else {
            return;
        };
        if *group >= self.config.max_groups {
            outcome.skipped_blocks += blocks.len();
            return;
        }
        self.lower |= *tier != Tier::Device;
        if *group > 0 && *tier != Tier::Device {
            self.stored_lower_group(hasher, worker, event, ratio, outcome);
            return;
        }
        if tokens.is_empty() {
            self.stored_placeholder(tree, worker, event, outcome);
            return;
        }
        let mut coarse = core::mem::take(&mut self.scratch.coarse);
        let blocks = router_blocks(blocks, ratio, &mut coarse, outcome);
        // A group beyond the main one may name only some blocks of its tokens (see
        // `Groups::store`): it keeps them all.
        let router_tokens = if *group > 0 && ratio == 1 {
            tokens.len()
        } else {
            blocks.len() * hasher.block_size()
        };
        let mut stored = Stored {
            parent: *parent,
            blocks,
            tokens: &tokens[..router_tokens],
            tier: *tier,
            salt,
            keys,
            copies: true,
        };
        if self.reported_again(hasher, tree, worker, *group, &stored) {
            stored.copies = false;
            if *group > 0 {
                // It names blocks of the hit the group does not hold (vLLM reports the
                // group's hit whole, window or not): nothing to learn.
                outcome.duplicate_blocks += blocks.len();
                self.scratch.coarse = coarse;
                return;
            }
        }
        let settings = &mut self.settings[worker.index()];
        if *group == 0 {
            if *tier != Tier::Device {
                settings.show_chunk(blocks.len(), outcome);
            }
            let ws = &mut self.workers[worker.index()];
            ws.store(hasher, tree, worker, &stored, &mut self.scratch, outcome);
        } else {
            settings.show_group(*group, *kind, outcome);
            let kind = settings.group_kind(*group);
            let main = self.workers.get(worker.index()).map(|ws| &ws.blocks);
            let path = &mut self.scratch.path;
            self.groups
                .store(hasher, (worker, kind), *group, &stored, main, path, outcome);
        }
        self.scratch.coarse = coarse;
    }

    /// Applies a lower tier's store of a group beyond the main one (vLLM's CPU copy of a
    /// sliding-window group's chunk, a placeholder naming its last block): the chunk is
    /// held below the device in that group.
    fn stored_lower_group(
        &mut self,
        hasher: &PrefixHasher,
        worker: WorkerId,
        event: &CacheEvent,
        ratio: usize,
        outcome: &mut SyncOutcome,
    ) {
        let CacheEvent::Stored {
            blocks,
            tokens,
            group,
            kind,
            ..
        } = event
        else {
            return;
        };
        let settings = &mut self.settings[worker.index()];
        settings.show_group(*group, *kind, outcome);
        let kind = settings.group_kind(*group);
        let main = &self.workers[worker.index()];
        // Engine blocks finer than the router's name router blocks by their last.
        let whole = !tokens.is_empty();
        let mut coarse = core::mem::take(&mut self.scratch.coarse);
        let named = if whole {
            router_blocks(blocks, ratio, &mut coarse, outcome)
        } else {
            blocks.as_slice()
        };
        self.groups.store_lower(
            (worker, kind, hasher.block_size()),
            *group,
            named,
            whole,
            |engine| main.known_router(engine),
            outcome,
        );
        self.scratch.coarse = coarse;
    }

    /// Applies a `Stored` event without tokens (a lower tier's copy named by hashes only):
    /// the main group's chunks are placed below the blocks they continue; another group's
    /// are skipped.
    fn stored_placeholder(
        &mut self,
        tree: &mut RadixTree,
        worker: WorkerId,
        event: &CacheEvent,
        outcome: &mut SyncOutcome,
    ) {
        let CacheEvent::Stored {
            blocks,
            tier,
            group,
            ..
        } = event
        else {
            return;
        };
        if *group != 0 {
            outcome.skipped_blocks += blocks.len();
            return;
        }
        let chunk = self.chunk_blocks(worker);
        let ws = &mut self.workers[worker.index()];
        ws.store_placeholder(
            tree,
            worker,
            blocks,
            *tier,
            chunk,
            &mut self.scratch,
            outcome,
        );
    }

    /// Whether a device store is a prefix hit reported again (vLLM's
    /// `kv_cache_report_mode=full` reports each request's hit as a store from the root),
    /// when engines are configured to report so: a store from the root whose whole span
    /// `worker` would reuse already, every group's window included. A store from the root
    /// of blocks the device holds but would not reuse whole (a hybrid hit cut short, then
    /// recomputed) makes second copies. Without full reports every store of held blocks
    /// makes second copies: nothing on the wire tells a report from a copy of a block
    /// recomputed because vLLM always computes a prompt's last token (a one-block prompt
    /// cached whole), so the configuration says which engines send.
    fn reported_again(
        &mut self,
        hasher: &PrefixHasher,
        tree: &RadixTree,
        worker: WorkerId,
        group: u32,
        event: &Stored<'_>,
    ) -> bool {
        let candidate = self.full_reports(worker)
            && event.parent.is_none()
            && event.tier == Tier::Device
            && event.blocks.first().is_some_and(|&first| {
                self.workers
                    .get(worker.index())
                    .is_some_and(|ws| ws.blocks.router(first).is_some())
            });
        let key = event
            .blocks
            .first()
            .map(|&b| (worker, b, event.tokens.len()));
        if group > 0 {
            // A group's report follows the main group's report of the same hit.
            return candidate && self.reported.is_some() && self.reported == key;
        }
        self.reported = None;
        if !candidate {
            return false;
        }
        let path = &mut self.scratch.full;
        path.clear();
        hasher.continue_keyed(hasher.root(event.salt), event.tokens, event.keys, path);
        let mut device = 0;
        tree.for_each_held(path, |w, held| {
            if w == worker {
                device = held.by_tier[0] as usize;
            }
        });
        let again = device == path.len() && self.groups.allows(worker, path, device) == device;
        if again {
            self.reported = key;
        }
        again
    }

    /// Applies a `Removed` event.
    fn removed(
        &mut self,
        tree: &mut RadixTree,
        worker: WorkerId,
        blocks: &[u64],
        tier: Tier,
        group: u32,
        outcome: &mut SyncOutcome,
    ) {
        if group >= self.config.max_groups {
            outcome.skipped_blocks += blocks.len();
            return;
        }
        if group > 0 && tier != Tier::Device {
            self.groups.remove_lower(worker, group, blocks, outcome);
            return;
        }
        if group > 0 {
            self.groups.remove(worker, group, blocks, outcome);
            return;
        }
        let ws = &mut self.workers[worker.index()];
        for &engine in blocks {
            ws.remove(tree, worker, engine, tier, &mut self.scratch.path, outcome);
        }
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
        self.seqs[worker.index()] = None;
        self.groups.clear(worker);
        tree.remove_worker(worker);
        for prefix in prefixes {
            hasher.hash_into(prefix, &mut self.scratch.path);
            tree.insert(worker, &self.scratch.path);
            // Every group the worker's engine has holds the prefixes too.
            self.groups.routed(worker, &self.scratch.path);
        }
        Ok(())
    }

    /// The worker had `cached_tokens` of `tokens` (salted with `salt`) cached when the
    /// request came and has computed the rest: the mirror drops, for the worker, the
    /// prompt's blocks from the first one it did not have and everything below them, then
    /// holds the whole prompt. Returns the tokens the mirror predicted before.
    pub(crate) fn report(
        &mut self,
        hasher: &PrefixHasher,
        tree: &mut RadixTree,
        worker: WorkerId,
        salt: &[u8],
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<usize, Error> {
        check_worker(worker)?;
        let path = &mut self.scratch.path;
        hasher.hash_salted_into(salt, tokens, path);
        let held = tree.held_prefix(worker, path);
        let reported = (cached_tokens / hasher.block_size()).min(path.len());
        if reported < held {
            tree.truncate(worker, path, reported);
        }
        tree.insert(worker, path);
        Ok(held * hasher.block_size())
    }
}

/// The engine blocks of a store that name router blocks: all of them, or for engine blocks
/// `ratio` times finer than the router's, the last of each router block's (into `coarse`);
/// a run that does not end on a router block is cut there.
fn router_blocks<'b>(
    blocks: &'b [u64],
    ratio: usize,
    coarse: &'b mut Vec<u64>,
    outcome: &mut SyncOutcome,
) -> &'b [u64] {
    if ratio == 1 {
        return blocks;
    }
    let whole = blocks.len() / ratio * ratio;
    outcome.skipped_blocks += blocks.len() - whole;
    coarse.clear();
    coarse.extend(blocks[..whole].iter().skip(ratio - 1).step_by(ratio));
    coarse.as_slice()
}

/// Checks an event against the router's block size before anything changes; returns how
/// many of the event's blocks make one router block (1 unless the event's blocks are finer).
fn check(hasher: &PrefixHasher, event: &CacheEvent) -> Result<usize, Error> {
    let CacheEvent::Stored {
        blocks,
        tokens,
        block_size,
        group,
        ..
    } = event
    else {
        return Ok(1);
    };
    if tokens.is_empty() && matches!(block_size, None | Some(0)) {
        return Ok(1); // a placeholder: blocks named, no tokens
    }
    let router = hasher.block_size();
    let engine = match block_size {
        Some(size) => *size,
        None if blocks.is_empty() => router,
        None => tokens.len() / blocks.len(),
    };
    // A group beyond the main one may name only some of its tokens' blocks (a sliding
    // window's store), never more.
    let sparse = *group > 0 && block_size.is_some();
    let fits = if sparse {
        tokens.len() % engine == 0 && tokens.len() >= blocks.len() * engine
    } else {
        tokens.len() == blocks.len() * engine
    };
    if engine == 0 || !fits {
        return Err(Error::InvalidEvent(format!(
            "a stored event has {} token ids for {} blocks: expected {} tokens per block",
            tokens.len(),
            blocks.len(),
            if engine == 0 { router } else { engine }
        )));
    }
    if engine == router || (engine < router && router % engine == 0) {
        return Ok(router / engine);
    }
    Err(Error::BlockSizeMismatch { engine, router })
}
