//! Concurrency stress and router API sequences.
//!
//! `stress`: 8 threads run mixed operations (route, complete, add / remove worker, mark
//! unavailable, apply events, report_cached) on one router; afterwards the mirror validates,
//! every load counter is back to zero, and no operation took longer than a bound. CI runs
//! 2,000 operations per thread;
//! `STRESS_OPS=50000 cargo test --release --test integration stress::` runs the full
//! 8 × 50,000.

#![allow(clippy::unwrap_used)]

use std::sync::Arc;
use std::time::{Duration, Instant};

use prefix_router::*;
use proptest::prelude::*;

/// SplitMix64 for the threads' choices (seeded: the interleaving varies, the choices don't).
fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

fn prompt(r: u64) -> Vec<u32> {
    let shared = (r % 5) as u32;
    let len = 16 + (r >> 8) as usize % 300;
    (0..len as u32)
        .map(|i| {
            if i < 64 {
                shared * 1_000 + i
            } else {
                (r as u32 ^ i) % 150_000
            }
        })
        .collect()
}

fn stress(router: Arc<dyn Router>, threads: u64, ops: u64) -> Duration {
    let workers = 12u32;
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let router = Arc::clone(&router);
            std::thread::spawn(move || {
                let mut pending: Vec<RouteDecision> = Vec::new();
                let mut slowest = Duration::ZERO;
                let mut seq = 0u64;
                for i in 0..ops {
                    let r = mix(t << 32 | i);
                    let w = WorkerId::new((r % u64::from(workers)) as u32);
                    let started = Instant::now();
                    match (r >> 40) % 100 {
                        0..=54 => {
                            let p = prompt(r);
                            let session = format!("s{}", r % 97);
                            if let Ok(d) =
                                router.route(&RouteRequest::new(&p).with_session(&session))
                            {
                                pending.push(d);
                            }
                        }
                        55..=79 => {
                            if !pending.is_empty() {
                                let d = pending.swap_remove((r % pending.len() as u64) as usize);
                                router.first_token(&d);
                                router.complete(&d);
                                router.complete(&d); // twice: harmless
                            }
                        }
                        80..=82 => {
                            let _ = router.add_worker(w);
                        }
                        83..=84 => {
                            let _ = router.remove_worker(w);
                        }
                        85..=88 => {
                            let _ = router.set_available(w, r % 2 == 0);
                        }
                        89..=94 => {
                            if let Some(sync) = router.cache_sync() {
                                seq += 1;
                                let p = prompt(r);
                                let blocks = p.len() / 16;
                                let event = if r % 3 == 0 {
                                    CacheEvent::removed(vec![r % 50])
                                } else {
                                    CacheEvent::stored(
                                        None,
                                        (0..blocks as u64).map(|b| r % 50 + b).collect(),
                                        p[..blocks * 16].to_vec(),
                                    )
                                };
                                let _ = sync.apply_event(w, seq, &event);
                            }
                        }
                        _ => {
                            if let Some(sync) = router.cache_sync() {
                                let p = prompt(r);
                                let _ = sync.report_cached(w, &p, (r % 400) as usize);
                            }
                        }
                    }
                    slowest = slowest.max(started.elapsed());
                }
                for d in pending {
                    router.complete(&d);
                }
                slowest
            })
        })
        .collect();
    handles
        .into_iter()
        .map(|h| h.join().unwrap())
        .max()
        .unwrap()
}

fn check_idle(router: &dyn Router) {
    for w in router.workers() {
        let load = router.load(w).unwrap();
        assert_eq!(
            (
                load.in_flight,
                load.prefill_tokens,
                load.predicted_cached_tokens
            ),
            (0, 0, 0),
            "{}: worker {w:?}",
            router.name()
        );
    }
}

#[test]
fn eight_threads_of_mixed_operations_leave_a_valid_idle_router() {
    let ops = std::env::var("STRESS_OPS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(2_000u64);
    let balanced = Arc::new(BalancedRouter::new(8).unwrap());
    let cache_aware = Arc::new(CacheAwareRouter::new(8).unwrap());
    let affinity = Arc::new(AffinityRouter::new(8).unwrap());
    for router in [
        balanced.clone() as Arc<dyn Router>,
        cache_aware.clone(),
        affinity.clone(),
    ] {
        let started = Instant::now();
        let slowest = stress(Arc::clone(&router), 8, ops);
        eprintln!(
            "{}: 8 threads x {ops} operations in {:?}, slowest operation {slowest:?}",
            router.name(),
            started.elapsed()
        );
        assert!(
            slowest < Duration::from_secs(2),
            "an operation blocked for {slowest:?}"
        );
        check_idle(router.as_ref());
    }
    balanced.index().with_tree(|t| t.validate()).unwrap();
    cache_aware.index().with_tree(|t| t.validate()).unwrap();
}

#[derive(Clone, Debug)]
enum Call {
    Route(u8, Option<u8>),
    Complete(u8),
    FirstToken(u8),
    Add(u8),
    Remove(u8),
    Available(u8, bool),
    Report(u8, u8, u16),
    Event(u8, u8, u8),
}

fn call() -> impl Strategy<Value = Call> {
    prop_oneof![
        4 => (any::<u8>(), proptest::option::of(0u8..6)).prop_map(|(p, s)| Call::Route(p, s)),
        3 => any::<u8>().prop_map(Call::Complete),
        1 => any::<u8>().prop_map(Call::FirstToken),
        1 => (0u8..10).prop_map(Call::Add),
        1 => (0u8..10).prop_map(Call::Remove),
        1 => ((0u8..10), any::<bool>()).prop_map(|(w, a)| Call::Available(w, a)),
        1 => ((0u8..10), any::<u8>(), any::<u16>()).prop_map(|(w, p, c)| Call::Report(w, p, c)),
        1 => ((0u8..10), any::<u8>(), any::<u8>()).prop_map(|(w, p, s)| Call::Event(w, p, s)),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Any sequence of API calls: no panic, decisions only for registered available
    /// workers, and every counter back at zero once everything is completed.
    #[test]
    fn router_api_sequences_never_break_invariants(calls in prop::collection::vec(call(), 1..80)) {
        let routers: Vec<Box<dyn Router>> = vec![
            Box::new(BalancedRouter::new(3).unwrap()),
            Box::new(CacheAwareRouter::new(3).unwrap()),
            Box::new(ConsistentHashRouter::new(3).unwrap()),
            Box::new(AffinityRouter::new(3).unwrap()),
        ];
        for router in routers {
            let mut pending: Vec<RouteDecision> = Vec::new();
            for c in &calls {
                match *c {
                    Call::Route(p, s) => {
                        let tokens = prompt(u64::from(p) * 7_919);
                        let session = s.map(|s| format!("s{s}"));
                        let mut req = RouteRequest::new(&tokens);
                        if let Some(s) = &session {
                            req = req.with_session(s);
                        }
                        match router.route(&req) {
                            Ok(d) => {
                                let load = router.load(d.worker()).unwrap();
                                prop_assert!(load.available && load.in_flight >= 1);
                                prop_assert!(d.cached_tokens() <= tokens.len());
                                pending.push(d);
                            }
                            Err(e) => prop_assert_eq!(e, Error::NoWorkers),
                        }
                    }
                    Call::Complete(i) if !pending.is_empty() => {
                        let d = pending.remove(usize::from(i) % pending.len());
                        router.complete(&d);
                    }
                    Call::FirstToken(i) if !pending.is_empty() => {
                        router.first_token(&pending[usize::from(i) % pending.len()]);
                    }
                    Call::Add(w) => { let _ = router.add_worker(WorkerId::new(w.into())); }
                    Call::Remove(w) => { let _ = router.remove_worker(WorkerId::new(w.into())); }
                    Call::Available(w, a) => { let _ = router.set_available(WorkerId::new(w.into()), a); }
                    Call::Report(w, p, c) => {
                        if let Some(sync) = router.cache_sync() {
                            let tokens = prompt(u64::from(p) * 7_919);
                            let _ = sync.report_cached(WorkerId::new(w.into()), &tokens, c.into());
                        }
                    }
                    Call::Event(w, p, s) => {
                        if let Some(sync) = router.cache_sync() {
                            let tokens = prompt(u64::from(p) * 7_919);
                            let n = tokens.len() / 16;
                            let e = CacheEvent::stored(
                                None,
                                (0..n as u64).map(|b| u64::from(p) << 16 | b).collect(),
                                tokens[..n * 16].to_vec(),
                            );
                            let _ = sync.apply_event(WorkerId::new(w.into()), s.into(), &e);
                        }
                    }
                    _ => {}
                }
            }
            for d in pending {
                router.complete(&d);
            }
            check_idle(router.as_ref());
        }
    }
}

#[test]
fn public_types_that_cross_threads_are_send_sync_and_unwind_safe() {
    fn check<T: Send + Sync + std::panic::UnwindSafe + std::panic::RefUnwindSafe>() {}
    check::<PrefixHasher>();
    check::<BlockHash>();
    check::<WorkerId>();
    check::<RadixTree>();
    check::<PrefixMatch>();
    check::<Error>();
    check::<CacheEvent>();
    check::<SyncOutcome>();
    check::<RoundRobinRouter>();
    check::<LeastLoadedRouter>();
    check::<PowerOfTwoRouter>();
    check::<ConsistentHashRouter>();
    check::<AffinityRouter>();
    check::<BalancedRouter>();
    check::<CacheAwareRouter>();
    check::<CacheIndex>();
    check::<RouteDecision>();
    check::<WorkerLoad>();
    #[cfg(feature = "sim")]
    {
        check::<prefix_router::sim::Simulation>();
        check::<prefix_router::sim::SimReport>();
    }
}

#[test]
fn different_secret_seeds_disagree_on_hashes_and_each_stays_consistent() {
    let router = |seed| {
        let mut c = BalancedConfig::default();
        c.index.seed = seed;
        BalancedRouter::with_config(4, c).unwrap()
    };
    let (a, b) = (router(0x1111_2222), router(0x3333_4444));
    let tokens: Vec<u32> = (0..640).collect();
    let (ha, hb) = (
        a.index().hasher().hash(&tokens),
        b.index().hasher().hash(&tokens),
    );
    assert_eq!(ha.len(), 40);
    assert!(ha.iter().all(|h| !hb.contains(h)), "no hash in common");
    for r in [&a, &b] {
        let first = r.route(&RouteRequest::new(&tokens)).unwrap();
        r.complete(&first);
        let again = r.route(&RouteRequest::new(&tokens)).unwrap();
        assert_eq!(
            (again.worker(), again.cached_tokens()),
            (first.worker(), 640)
        );
        r.complete(&again);
    }
}
