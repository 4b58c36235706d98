//! vLLM event batches into a router's mirror: what both the file and the ZMQ modes do with
//! a payload frame once they have it.

use prefix_router::sync::vllm::{EngineEvent, decode_batch};
use prefix_router::{BalancedRouter, CacheSync, Router, Sequence, WorkerId};

/// A router whose mirror is fed by vLLM event batches.
pub(crate) struct Feed {
    pub(crate) router: BalancedRouter,
}

impl Feed {
    pub(crate) fn new(workers: u32) -> Result<Self, prefix_router::Error> {
        Ok(Self {
            router: BalancedRouter::new(workers)?,
        })
    }

    /// Decodes one payload frame and applies its events as batch `seq` of `worker`: one line
    /// per event on what it did, or why it was rejected. `Err` when the frame does not decode
    /// (nothing is applied).
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
                    line
                }
                Err(e) => format!("worker {worker} seq {seq}: rejected: {e}"),
            };
            lines.push(line);
        }
        Ok(lines)
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
}

fn variant(event: &EngineEvent) -> &'static str {
    match event {
        EngineEvent::BlockStored { .. } => "BlockStored",
        EngineEvent::BlockRemoved { .. } => "BlockRemoved",
        _ => "AllBlocksCleared",
    }
}
