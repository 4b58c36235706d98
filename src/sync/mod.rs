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
mod state;
mod tips;
#[cfg(feature = "vllm")]
pub mod vllm;

pub(crate) use self::state::SyncState;

use crate::{Error, TokenId, WorkerId};

/// One change to a worker's KV cache, as an engine reports it.
///
/// Block hashes are the **engine's** opaque 64-bit keys, not the router's.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum CacheEvent {
    /// The worker cached `blocks` (consecutive, in order) after the block `parent` (`None`:
    /// at the root). `tokens` holds the token IDs of all of them, `block_size` per block.
    Stored {
        /// The engine hash of the block before the first stored one.
        parent: Option<u64>,
        /// Engine hashes of the stored blocks.
        blocks: Vec<u64>,
        /// Token IDs of the stored blocks, concatenated.
        tokens: Vec<TokenId>,
    },
    /// The worker evicted these blocks (engine hashes). What hangs below them can no longer
    /// be reached by a prefix match, so the mirror drops it too.
    Removed {
        /// Engine hashes of the evicted blocks.
        blocks: Vec<u64>,
    },
    /// The worker dropped its whole cache.
    Cleared,
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
    /// Stores of blocks already stored, and removals of blocks still stored more than once
    /// (counted per worker and engine hash; nothing changes).
    pub duplicate_blocks: usize,
    /// Blocks skipped because their parent is unknown (never stored, or removed): nothing
    /// is corrupted; a snapshot or replay repairs the mirror.
    pub unknown_parent_blocks: usize,
    /// Removals of blocks that were never stored (ignored).
    pub unknown_removed_blocks: usize,
}

impl SyncOutcome {
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
/// let event = CacheEvent::Stored { parent: None, blocks: vec![11, 12], tokens: tokens.clone() };
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

    /// `worker` reported that it had `cached_tokens` of the prompt `tokens` cached (for
    /// example in its response's usage): the mirror is set to exactly that many whole
    /// blocks of the prompt, trimming what was predicted beyond it.
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
}
