//! What the mirror needs to know of each worker's engine beyond its events: the settings a
//! host gives per worker ([`EngineSettings`]), what the worker's self-describing events
//! show, and the index's defaults, resolved per worker ([`Settings`]).
//!
//! Precedence, per setting and per worker: what the worker's events show (a group's kind and
//! window, the engine's block size, the blocks of a self-describing lower-tier chunk), then
//! what the host set for the worker, then the index's default. An event that contradicts
//! the host's setting is followed and counted ([`SyncOutcome::settings_conflicts`]):
//! settings never mix across workers.

use super::{GroupKind, SyncOutcome};
use crate::error::Error;

/// What the mirror needs to know of one worker's engine that its events may not say, for
/// fleets whose engines are configured differently (two vLLM configurations side by side
/// during an upgrade, hybrid models with other windows, CPU offloading with other chunk
/// sizes). Every field left `None` (or a group left out) takes what the worker's events
/// show, else the index's default ([`IndexConfig`](crate::IndexConfig)).
///
/// ```
/// use prefix_router::{
///     CacheEvent, CacheIndex, CacheSync, EngineSettings, GroupKind, IndexConfig, WorkerId,
/// };
///
/// let index = CacheIndex::new(IndexConfig::default())?;
/// // Worker 1 runs a hybrid model whose group 1 keeps a sliding window of 512 tokens, and
/// // offloads to CPU in chunks of 4 blocks.
/// let hybrid = EngineSettings::default()
///     .with_group(1, GroupKind::SlidingWindow { tokens: 512 })
///     .with_host_chunk_blocks(4);
/// index.set_engine_settings(WorkerId::new(1), &hybrid)?;
/// assert_eq!(index.engine_settings(WorkerId::new(1)).host_chunk_blocks, Some(4));
/// // Worker 0 keeps the index's defaults.
/// assert_eq!(index.engine_settings(WorkerId::new(0)).host_chunk_blocks, Some(1));
/// # Ok::<(), prefix_router::Error>(())
/// ```
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct EngineSettings {
    /// Blocks per chunk of the worker's lower tier: vLLM's offloaded block size over its GPU
    /// block size (`blocks_per_chunk`). Needed where the worker's CPU stores are placeholders
    /// (without `self_describing_kv_events`); self-describing stores show it.
    pub host_chunk_blocks: Option<usize>,
    /// Whether the worker's requests report their prefix hit again as a store
    /// (`kv_cache_report_mode=full`): see
    /// [`IndexConfig::full_reports`](crate::IndexConfig::full_reports). Nothing on the wire
    /// tells a report from a recomputed block's copy, so only the host can say.
    pub full_reports: Option<bool>,
    /// The kind of each KV-cache group beyond the main one, by group index (a hybrid model's
    /// sliding window, Mamba). A group left out takes the kind its events state, else full
    /// attention.
    pub groups: Vec<(u32, GroupKind)>,
}

impl EngineSettings {
    /// Sets [`host_chunk_blocks`](Self::host_chunk_blocks).
    #[must_use]
    pub fn with_host_chunk_blocks(mut self, blocks: usize) -> Self {
        self.host_chunk_blocks = Some(blocks);
        self
    }

    /// Sets [`full_reports`](Self::full_reports).
    #[must_use]
    pub fn with_full_reports(mut self, full: bool) -> Self {
        self.full_reports = Some(full);
        self
    }

    /// Sets group `group`'s kind (replacing one set before).
    #[must_use]
    pub fn with_group(mut self, group: u32, kind: GroupKind) -> Self {
        self.groups.retain(|(g, _)| *g != group);
        self.groups.push((group, kind));
        self.groups.sort_unstable_by_key(|(g, _)| *g);
        self
    }

    /// The kind set for group `group`, if any.
    #[must_use]
    pub fn group(&self, group: u32) -> Option<GroupKind> {
        self.groups
            .iter()
            .find(|(g, _)| *g == group)
            .map(|(_, kind)| *kind)
    }

    /// Checks every field.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidConfig`] for a chunk of 0 blocks, a group index of 0 (the main group
    /// is full attention), or a sliding window of 0 tokens.
    pub fn validate(&self) -> Result<(), Error> {
        if let Some(chunk) = self.host_chunk_blocks {
            crate::config::int("host_chunk_blocks", chunk, 1.., "at least 1")?;
        }
        for &(group, kind) in &self.groups {
            if group == 0 {
                return Err(crate::config::invalid(
                    "groups",
                    0,
                    "groups beyond the main one (1 and up): group 0 is full attention",
                ));
            }
            if kind == (GroupKind::SlidingWindow { tokens: 0 }) {
                return Err(crate::config::invalid(
                    "groups",
                    "a sliding window of 0 tokens",
                    "a window of at least 1 token",
                ));
            }
        }
        Ok(())
    }
}

/// One worker's settings as the mirror applies them: the host's, and what its events
/// showed.
#[derive(Clone, Debug, Default)]
pub(super) struct Settings {
    /// What the host set.
    set: EngineSettings,
    /// Blocks per lower-tier chunk a self-describing store showed.
    shown_chunk: Option<usize>,
    /// Group kinds the worker's events stated.
    shown_groups: Vec<(u32, GroupKind)>,
}

impl Settings {
    /// The host's settings for the worker (validated).
    pub(super) fn set(&mut self, settings: &EngineSettings) {
        self.set = settings.clone();
    }

    /// Forgets what the events showed (the engine restarted, perhaps configured otherwise);
    /// the host's settings stay.
    pub(super) fn forget_shown(&mut self) {
        self.shown_chunk = None;
        self.shown_groups.clear();
    }

    /// Blocks per lower-tier chunk: shown, set, else `default`.
    pub(super) fn chunk_blocks(&self, default: usize) -> usize {
        self.shown_chunk
            .or(self.set.host_chunk_blocks)
            .unwrap_or(default)
    }

    /// Whether the worker reports prefix hits again: set, else `default`.
    pub(super) fn full_reports(&self, default: bool) -> bool {
        self.set.full_reports.unwrap_or(default)
    }

    /// Group `group`'s kind: stated by its events, set, else full attention.
    pub(super) fn group_kind(&self, group: u32) -> GroupKind {
        self.shown_groups
            .iter()
            .find(|(g, _)| *g == group)
            .map(|(_, kind)| *kind)
            .or_else(|| self.set.group(group))
            .unwrap_or_default()
    }

    /// A store of group `group` stated `kind`: remembered when it states more than full
    /// attention (vLLM's events without a spec decode as full attention), counted in
    /// `outcome` when it contradicts the host's setting or an earlier event.
    pub(super) fn show_group(&mut self, group: u32, kind: GroupKind, outcome: &mut SyncOutcome) {
        if kind == GroupKind::FullAttention {
            return;
        }
        let before = self.group_kind(group);
        if before != kind && (before != GroupKind::FullAttention || self.set.group(group).is_some())
        {
            outcome.settings_conflicts += 1;
        }
        self.shown_groups.retain(|(g, _)| *g != group);
        self.shown_groups.push((group, kind));
    }

    /// A self-describing lower-tier store of `blocks` router blocks: whole chunks (vLLM
    /// publishes one store per chunk), so the chunk is the greatest common divisor of every
    /// such store's length. Counted in `outcome` when it is no whole number of the chunks
    /// the host set.
    pub(super) fn show_chunk(&mut self, blocks: usize, outcome: &mut SyncOutcome) {
        if blocks == 0 {
            return;
        }
        if self.set.host_chunk_blocks.is_some_and(|c| blocks % c != 0) {
            outcome.settings_conflicts += 1;
        }
        self.shown_chunk = Some(self.shown_chunk.map_or(blocks, |c| gcd(c, blocks)));
    }

    /// The settings in effect, with `defaults` filling what neither the host nor the events
    /// said.
    pub(super) fn effective(&self, default_chunk: usize, default_full: bool) -> EngineSettings {
        let mut groups = self.set.groups.clone();
        for &(g, kind) in &self.shown_groups {
            groups.retain(|(h, _)| *h != g);
            groups.push((g, kind));
        }
        groups.sort_unstable_by_key(|(g, _)| *g);
        EngineSettings {
            host_chunk_blocks: Some(self.chunk_blocks(default_chunk)),
            full_reports: Some(self.full_reports(default_full)),
            groups,
        }
    }
}

/// The greatest common divisor of `a` and `b`.
fn gcd(mut a: usize, mut b: usize) -> usize {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}
