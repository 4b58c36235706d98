//! Keeping the mirror honest: engine KV events, snapshots and miss feedback.
//!
//! The mirror is optimistic: it believes a worker holds what was routed there. Three ways
//! keep it true when workers evict, all through [`CacheSync`]:
//!
//! 1. **Events**: [`CacheSync::apply_event`] applies an engine's `Stored` / `Removed` /
//!    `Cleared` events. The engine's block hashes are opaque keys: the router recomputes its
//!    own chained hashes from the event's token IDs, continuing from the parent's router hash
//!    found through a per-worker engine-hash map, so engine hash algorithms and seeds never
//!    need to match the router's. Sequence numbers are tracked per worker.
//! 2. **Snapshots**: [`CacheSync::replace_worker_cache`] replaces a worker's whole state.
//! 3. **Miss feedback**: [`CacheSync::report_cached`] corrects the mirror from the cached
//!    token count a worker reports for a request (for example OpenAI-style
//!    `usage.prompt_tokens_details.cached_tokens`).
//!
//! Without any of them, bound the mirror by capacity
//! ([`IndexConfig::worker_capacity_blocks`](crate::IndexConfig::worker_capacity_blocks)) or
//! by age ([`IndexConfig::ttl`](crate::IndexConfig::ttl)).

mod blocks;
mod event;
mod gone;
mod groups;
mod hit;
mod settings;
mod state;
mod store;
mod tips;
#[cfg(feature = "vllm")]
pub mod vllm;
mod worker;

pub use self::event::CacheEvent;
pub use self::settings::EngineSettings;
pub(crate) use self::state::SyncState;
pub(crate) use self::store::SyncConfig;

use crate::error::Error;

use crate::hash::TokenId;

use crate::tree::WorkerId;

/// How a KV-cache group decides which blocks a prefix hit needs (vLLM's `kv_cache_spec_kind`):
/// see [`CacheEvent::with_group_kind`]. Group 0, the main one, is always full attention.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum GroupKind {
    /// Every block of the hit (full attention; also any kind the router does not know).
    #[default]
    FullAttention,
    /// The blocks of the last `tokens` tokens before the hit's end.
    SlidingWindow {
        /// The window, in tokens.
        tokens: usize,
    },
    /// The block ending the hit (the state a Mamba layer saved there).
    Mamba,
}

impl GroupKind {
    /// The kind vLLM's `kv_cache_spec_kind` and `kv_cache_spec_sliding_window` name:
    /// `sliding_window` (with a window) and `mamba` are recognised, anything else is full
    /// attention.
    #[must_use]
    pub fn from_spec(kind: Option<&str>, sliding_window: Option<u32>) -> GroupKind {
        match (kind, sliding_window) {
            (Some(k), Some(w)) if k.contains("sliding") => {
                GroupKind::SlidingWindow { tokens: w as usize }
            }
            (Some(k), _) if k.contains("mamba") => GroupKind::Mamba,
            _ => GroupKind::FullAttention,
        }
    }
}

/// Where an event's sequence number stands against the worker's previous one.
///
/// `seq` is the engine's **batch** sequence number: every event of one batch carries the
/// same seq, so a seq equal to the last one continues that batch and last + 1 starts the
/// next.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum Sequence {
    /// The first event seen from this worker, or the same / next batch.
    #[default]
    InOrder,
    /// Batches were skipped: the event is applied, but the host should ask the engine to
    /// replay from `expected`.
    Gap {
        /// The seq that should have come next.
        expected: u64,
        /// The seq that came.
        received: u64,
    },
    /// The seq went backwards (the engine restarted): the worker's mirror was cleared, then
    /// the event applied.
    Restart {
        /// The last seq seen before.
        previous: u64,
        /// The seq that came.
        received: u64,
    },
}

/// What [`CacheSync::apply_event`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct SyncOutcome {
    /// The sequence check.
    pub sequence: Sequence,
    /// Blocks newly stored in the mirror.
    pub stored_blocks: usize,
    /// Blocks removed from the mirror.
    pub removed_blocks: usize,
    /// Stores of blocks the worker was already known to hold: a second copy on the device
    /// (vLLM recomputed the block; each copy's eviction is reported, and the block stays
    /// held until the last one), a copy at another tier, or a prefix hit reported again
    /// (with [`IndexConfig::full_reports`](crate::IndexConfig::full_reports): recency
    /// changes, nothing else).
    pub duplicate_blocks: usize,
    /// Blocks skipped because their parent is unknown (never stored, or removed): nothing
    /// is corrupted; a snapshot or replay repairs the mirror.
    pub unknown_parent_blocks: usize,
    /// Removals of blocks that were never stored (ignored).
    pub unknown_removed_blocks: usize,
    /// Placeholder stores naming blocks the worker never reported (ignored).
    pub unknown_blocks: usize,
    /// Events that contradicted the worker's settings ([`EngineSettings`]: a group's kind
    /// or window, a lower tier's chunk size): the event's word was followed, for this
    /// worker only. Nonzero means the host configured the worker otherwise than its engine
    /// runs.
    pub settings_conflicts: usize,
    /// Blocks of events the mirror does not track: a KV-cache group beyond
    /// [`IndexConfig::max_groups`](crate::IndexConfig::max_groups), a lower tier of a group
    /// other than the main one, engine blocks finer than the router's past the last whole
    /// router block (ignored).
    pub skipped_blocks: usize,
}

impl SyncOutcome {
    /// Adds `other`'s block counts to this outcome's (the sequence check stays).
    pub fn add(&mut self, other: &SyncOutcome) {
        self.stored_blocks += other.stored_blocks;
        self.removed_blocks += other.removed_blocks;
        self.duplicate_blocks += other.duplicate_blocks;
        self.unknown_parent_blocks += other.unknown_parent_blocks;
        self.unknown_removed_blocks += other.unknown_removed_blocks;
        self.unknown_blocks += other.unknown_blocks;
        self.skipped_blocks += other.skipped_blocks;
        self.settings_conflicts += other.settings_conflicts;
    }

    /// The seq to replay from when batches were skipped.
    #[must_use]
    pub fn replay_from(&self) -> Option<u64> {
        match self.sequence {
            Sequence::Gap { expected, .. } => Some(expected),
            _ => None,
        }
    }
}

/// The three ways to keep a mirror of worker caches true. Implemented by
/// [`CacheIndex`](crate::CacheIndex) and the routers that keep one
/// ([`BalancedRouter`](crate::BalancedRouter), [`CacheAwareRouter`](crate::CacheAwareRouter)).
///
/// ```
/// use prefix_router::{BalancedRouter, CacheEvent, CacheSync, RouteRequest, Router, WorkerId};
///
/// let router = BalancedRouter::new(2)?;
/// let tokens: Vec<u32> = (0..32).collect(); // two blocks of 16
/// // Worker 1's engine reports that it cached both blocks (its own hash keys 11 and 12).
/// let event = CacheEvent::stored(None, vec![11, 12], tokens.clone());
/// let outcome = router.apply_event(WorkerId::new(1), 0, &event)?;
/// assert_eq!(outcome.stored_blocks, 2);
/// let d = router.route(&RouteRequest::new(&tokens))?;
/// assert_eq!((d.worker(), d.cached_tokens()), (WorkerId::new(1), 32));
/// router.complete(&d);
/// # Ok::<(), prefix_router::Error>(())
/// ```
pub trait CacheSync {
    /// Applies one engine event for `worker`, in the batch with sequence number `seq`.
    ///
    /// # Errors
    ///
    /// [`Error::BlockSizeMismatch`] when the event's tokens per block differ from the
    /// router's block size; [`Error::InvalidEvent`] when its tokens are not a whole number of
    /// blocks; [`Error::UnknownWorker`] (routers) or [`Error::WorkerOutOfRange`] for a bad
    /// worker. Nothing changes on error.
    fn apply_event(
        &self,
        worker: WorkerId,
        seq: u64,
        event: &CacheEvent,
    ) -> Result<SyncOutcome, Error>;

    /// Replaces everything the mirror believes `worker` holds by `prefixes` (token IDs of
    /// each cached prefix, from the root): the periodic-snapshot mode.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] (routers) or [`Error::WorkerOutOfRange`] for a bad worker.
    fn replace_worker_cache(&self, worker: WorkerId, prefixes: &[&[TokenId]]) -> Result<(), Error>;

    /// `worker` reported that it had `cached_tokens` of the prompt `tokens` cached when the
    /// request came (for example in its response's usage), and computed the rest. The
    /// mirror trims what it predicted wrongly: the prompt's blocks from the first one the
    /// worker did not have, and every other prompt's blocks below them; then it holds the
    /// whole prompt, as the worker now does.
    ///
    /// # Errors
    ///
    /// [`Error::UnknownWorker`] (routers) or [`Error::WorkerOutOfRange`] for a bad worker.
    fn report_cached(
        &self,
        worker: WorkerId,
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(), Error>;

    /// Like [`report_cached`](Self::report_cached) for a request routed with a salt
    /// ([`RouteRequest::with_salt`](crate::RouteRequest::with_salt)). The default handles
    /// the empty salt and ignores other reports; the crate's implementations handle every
    /// salt.
    ///
    /// # Errors
    ///
    /// As [`report_cached`](Self::report_cached).
    fn report_cached_salted(
        &self,
        worker: WorkerId,
        salt: &[u8],
        tokens: &[TokenId],
        cached_tokens: usize,
    ) -> Result<(), Error> {
        if salt.is_empty() {
            self.report_cached(worker, tokens, cached_tokens)
        } else {
            Ok(())
        }
    }

    /// Sets what the mirror needs to know of `worker`'s engine that its events may not say
    /// (see [`EngineSettings`]): its lower tier's chunk size, whether it reports prefix hits
    /// again, its KV-cache groups' kinds. Settings apply to this worker alone; the index's
    /// defaults ([`IndexConfig`](crate::IndexConfig)) stay for the others. Settings survive
    /// an engine restart (a sequence number going back); removing the worker forgets them.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for settings that do not
    /// [validate](EngineSettings::validate); [`Error::UnknownWorker`] (routers) or
    /// [`Error::WorkerOutOfRange`] for a bad worker. The default (for implementations
    /// outside the crate) refuses with [`Error::InvalidConfig`]: it keeps no per-worker
    /// settings.
    fn set_engine_settings(
        &self,
        worker: WorkerId,
        settings: &EngineSettings,
    ) -> Result<(), Error> {
        let _ = (worker, settings);
        Err(crate::config::invalid(
            "engine_settings",
            "per-worker settings",
            "a mirror that keeps them (CacheIndex, or a router reading the cache)",
        ))
    }
}
