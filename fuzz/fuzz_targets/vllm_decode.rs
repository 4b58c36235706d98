//! The vLLM event decoder on arbitrary bytes: an `Error` or a batch, never a panic; a decoded
//! batch can always be applied to a router without a panic.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router::sync::vllm::decode_batch;
use prefix_router::{BalancedRouter, CacheSync, WorkerId};

fuzz_target!(|data: &[u8]| {
    if let Ok(batch) = decode_batch(data) {
        let router = BalancedRouter::new(1).expect("one worker");
        for event in &batch.events {
            let _ = router.apply_event(WorkerId::new(0), 0, &event.to_cache_event());
        }
    }
});
