//! vLLM's KV event batches applied to a router's mirror, for `Router` and `PairRouter`
//! alike: decoded in Rust with the GIL released.

use std::collections::HashMap;
use std::sync::{Mutex, PoisonError};

use prefix_router::sync::vllm::{apply_batch, decode_batch};
use prefix_router::{CacheSync, RankLayout};
use pyo3::prelude::*;

use crate::errors::OrRaise;
use crate::signals::SyncOutcome;

/// The last batch seq applied per endpoint, for batches given without one.
#[derive(Default)]
pub(crate) struct Seqs(Mutex<HashMap<u32, u64>>);

impl Seqs {
    /// The seq to apply a batch with: the one given, else the endpoint's last plus one
    /// (0 for its first).
    fn next(&self, endpoint: u32, given: Option<u64>) -> u64 {
        let mut seqs = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        let seq = given.unwrap_or_else(|| seqs.get(&endpoint).map_or(0, |s| s.wrapping_add(1)));
        seqs.insert(endpoint, seq);
        seq
    }
}

/// Decodes `payload` (one vLLM batch from the engine at `endpoint`) and applies it.
pub(crate) fn apply(
    py: Python<'_>,
    sync: &(dyn CacheSync + Sync),
    layout: RankLayout,
    seqs: &Seqs,
    endpoint: u32,
    payload: &[u8],
    seq: Option<u64>,
) -> PyResult<SyncOutcome> {
    let seq = seqs.next(endpoint, seq);
    let outcome = py
        .detach(|| {
            let batch = decode_batch(payload)?;
            apply_batch(sync, &layout, endpoint, seq, &batch)
        })
        .or_raise()?;
    Ok(SyncOutcome::of(&outcome))
}
