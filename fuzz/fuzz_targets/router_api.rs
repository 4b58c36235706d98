//! Arbitrary sequences of router API calls: no panic, and every load counter back at zero
//! once every decision is completed.
#![no_main]

use libfuzzer_sys::fuzz_target;
use prefix_router::{BalancedRouter, CacheEvent, RouteDecision, RouteRequest, Router, WorkerId};

fuzz_target!(|data: &[u8]| {
    let router = BalancedRouter::new(3).expect("three workers");
    let mut pending: Vec<RouteDecision> = Vec::new();
    for op in data.chunks(3) {
        let (kind, x, y) = (op[0], *op.get(1).unwrap_or(&0), *op.get(2).unwrap_or(&0));
        let w = WorkerId::new(u32::from(x % 6));
        let tokens: Vec<u32> = (0..u32::from(y) * 3).map(|t| t % 37).collect();
        match kind % 8 {
            0 | 1 => {
                if let Ok(d) = router.route(&RouteRequest::new(&tokens)) {
                    pending.push(d);
                }
            }
            2 if !pending.is_empty() => {
                let d = pending.swap_remove(usize::from(x) % pending.len());
                router.complete(&d);
            }
            3 => drop(router.add_worker(w)),
            4 => drop(router.remove_worker(w)),
            5 => drop(router.set_available(w, y % 2 == 0)),
            6 => {
                if let Some(sync) = router.cache_sync() {
                    let _ = sync.report_cached(w, &tokens, usize::from(y));
                }
            }
            _ => {
                if let Some(sync) = router.cache_sync() {
                    let n = tokens.len() / 16;
                    let e = CacheEvent::stored(
                        None,
                        (0..n as u64).collect(),
                        tokens[..n * 16].to_vec(),
                    );
                    let _ = sync.apply_event(w, u64::from(y), &e);
                }
            }
        }
    }
    for d in pending {
        router.complete(&d);
    }
    for w in router.workers() {
        let load = router.load(w).expect("registered");
        assert_eq!((load.in_flight, load.prefill_tokens), (0, 0));
    }
});
