//! vLLM event batches into a router's mirror: what both the file and the ZMQ modes do with
//! a payload frame once they have it.

use std::sync::atomic::{AtomicUsize, Ordering::Relaxed};

use prefix_router::sync::vllm::{EngineEvent, decode_batch};
use prefix_router::{
    BalancedConfig, BalancedRouter, CacheSync, EngineSettings, IndexConfig, Router, Sequence,
    WorkerId,
};

use super::engine_settings::{assumed, describe};

/// A router whose mirror is fed by vLLM event batches.
pub(crate) struct Feed {
    pub(crate) router: BalancedRouter,
    /// Per worker: the settings given for its engine (`None`: the index's defaults).
    given: Vec<Option<EngineSettings>>,
    /// Per worker: the events that contradicted its settings.
    conflicts: Vec<AtomicUsize>,
}

impl Feed {
    /// A mirror of `workers` workers hashing and defaulting as `index` says, each worker's
    /// engine with the settings `given` for it (missing or `None`: the defaults).
    ///
    /// # Errors
    /// When `index` or a worker's settings are not valid.
    pub(crate) fn new(
        workers: u32,
        index: IndexConfig,
        mut given: Vec<Option<EngineSettings>>,
    ) -> Result<Self, String> {
        let mut config = BalancedConfig::default();
        config.index = index;
        let router = BalancedRouter::with_config(workers, config).map_err(|e| e.to_string())?;
        given.resize(workers as usize, None);
        for (w, settings) in given.iter().enumerate() {
            if let Some(settings) = settings {
                router
                    .set_engine_settings(WorkerId::new(w as u32), settings)
                    .map_err(|e| format!("worker {w}'s engine settings: {e}"))?;
            }
        }
        Ok(Self {
            router,
            conflicts: (0..workers).map(|_| AtomicUsize::new(0)).collect(),
            given,
        })
    }

    /// One line per worker on the settings the mirror assumes of its engine (what is in
    /// effect: given, learned from its events, or the defaults).
    pub(crate) fn assumed(&self) -> Vec<String> {
        self.router
            .workers()
            .into_iter()
            .map(|w| {
                let effective = self.router.index().engine_settings(w);
                let given = self.given.get(w.index()).and_then(Option::as_ref);
                assumed(&format!("worker {}", w.get()), w.get(), &effective, given)
            })
            .collect()
    }

    /// Decodes one payload frame and applies its events as batch `seq` of `worker`: one line
    /// per event on what it did, or why it was rejected, and a line after an event that
    /// contradicted the worker's settings. `Err` when the frame does not decode (nothing is
    /// applied).
    pub(crate) fn apply(
        &self,
        worker: u32,
        seq: u64,
        payload: &[u8],
    ) -> Result<Vec<String>, String> {
        let batch = decode_batch(payload).map_err(|e| e.to_string())?;
        let mut lines = Vec::new();
        for event in &batch.events {
            let line = match self.router.apply_event(
                WorkerId::new(worker),
                seq,
                &event.to_cache_event(),
            ) {
                Ok(o) => {
                    let mut line = format!(
                        "worker {worker} seq {seq}: {}: stored {}, removed {}, duplicates {}, unknown parent {}",
                        variant(event),
                        o.stored_blocks,
                        o.removed_blocks,
                        o.duplicate_blocks,
                        o.unknown_parent_blocks
                    );
                    match o.sequence {
                        Sequence::Gap { expected, .. } => line.push_str(&format!(
                            " (gap: ask the engine's replay socket for batches from seq {expected})"
                        )),
                        Sequence::Restart { previous, .. } => line.push_str(&format!(
                            " (seq went back from {previous}: the engine restarted, its mirror was cleared)"
                        )),
                        _ => {}
                    }
                    if o.settings_conflicts > 0 {
                        lines.push(line);
                        line = self.conflict(worker, seq, o.settings_conflicts);
                    }
                    line
                }
                Err(e) => format!("worker {worker} seq {seq}: rejected: {e}"),
            };
            lines.push(line);
        }
        Ok(lines)
    }

    /// Counts `n` conflicts of `worker`'s and says what they were against and what the
    /// mirror follows now.
    fn conflict(&self, worker: u32, seq: u64, n: usize) -> String {
        if let Some(count) = self.conflicts.get(worker as usize) {
            count.fetch_add(n, Relaxed);
        }
        let now = self.router.index().engine_settings(WorkerId::new(worker));
        format!(
            "worker {worker} seq {seq}: settings conflict: the engine's event contradicts what \
             {}; the event is followed, the mirror now assumes {}",
            self.against(worker),
            describe(&now)
        )
    }

    /// Cached blocks per worker, as the mirror has them.
    pub(crate) fn blocks(&self) -> Vec<(u32, usize)> {
        self.router
            .workers()
            .into_iter()
            .map(|w| {
                let n = self.router.index().with_tree(|t| t.worker_block_count(w));
                (w.get(), n)
            })
            .collect()
    }

    /// One line per worker whose events contradicted its settings: how many times, and the
    /// settings the mirror assumes now.
    pub(crate) fn conflicts(&self) -> Vec<String> {
        let mut lines = Vec::new();
        for (w, n) in self.conflicts.iter().enumerate() {
            let n = n.load(Relaxed);
            if n == 0 {
                continue;
            }
            let plural = if n == 1 { "" } else { "s" };
            let worker = WorkerId::new(w as u32);
            let now = describe(&self.router.index().engine_settings(worker));
            lines.push(format!(
                "worker {w}: {n} settings conflict{plural}: its engine runs otherwise than {}; \
                 the mirror now assumes {now}",
                self.against(w as u32)
            ));
        }
        lines
    }

    /// What `worker`'s events contradict: the settings given for it, or its earlier events.
    fn against(&self, worker: u32) -> String {
        match self.given.get(worker as usize).and_then(Option::as_ref) {
            Some(given) => format!("--engine-settings {worker}:{} says", describe(given)),
            None => "its earlier events showed".to_owned(),
        }
    }
}

fn variant(event: &EngineEvent) -> &'static str {
    match event {
        EngineEvent::BlockStored { .. } => "BlockStored",
        EngineEvent::BlockRemoved { .. } => "BlockRemoved",
        _ => "AllBlocksCleared",
    }
}
