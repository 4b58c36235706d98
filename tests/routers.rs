//! Router behaviour: the worked examples, consistent hashing, errors, concurrency.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;

use prefix_router::*;

fn all_routers(n: u32) -> Vec<Box<dyn Router>> {
    vec![
        Box::new(RoundRobinRouter::new(n).unwrap()),
        Box::new(LeastLoadedRouter::new(n).unwrap()),
        Box::new(PowerOfTwoRouter::new(n).unwrap()),
        Box::new(ConsistentHashRouter::new(n).unwrap()),
        Box::new(AffinityRouter::new(n).unwrap()),
        Box::new(BalancedRouter::new(n).unwrap()),
        Box::new(CacheAwareRouter::new(n).unwrap()),
    ]
}

fn with_suffix(prefix: &[u32], suffix: impl IntoIterator<Item = u32>) -> Vec<u32> {
    prefix.iter().copied().chain(suffix).collect()
}

#[test]
fn shared_system_prompt_goes_to_one_worker_under_cache_aware_policies() {
    let system: Vec<u32> = (0..2_000).map(|i| 1_000 + i).collect();
    let cache_aware: Vec<Box<dyn Router>> = vec![
        Box::new(BalancedRouter::new(4).unwrap()),
        Box::new(CacheAwareRouter::new(4).unwrap()),
    ];
    for router in cache_aware {
        let mut workers = HashSet::new();
        for i in 0..20u32 {
            let prompt = with_suffix(&system, (0..40).map(|j| 200_000 + i * 100 + j));
            let d = router.route(&RouteRequest::new(&prompt)).unwrap();
            workers.insert(d.worker());
            if i > 0 {
                assert!(d.cached_tokens() >= 1_984, "{}: request {i}", router.name());
            }
            router.complete(&d);
        }
        assert_eq!(workers.len(), 1, "{} used {workers:?}", router.name());
    }
    let rr = RoundRobinRouter::new(4).unwrap();
    let mut workers = HashSet::new();
    for i in 0..20u32 {
        let prompt = with_suffix(&system, [i]);
        let d = rr.route(&RouteRequest::new(&prompt)).unwrap();
        workers.insert(d.worker());
        rr.complete(&d);
    }
    assert_eq!(workers.len(), 4);
}

#[test]
fn a_three_turn_conversation_stays_on_one_worker() {
    // Turns of 500, 800 and 1,200 prompt tokens, each extending the previous one.
    let convo: Vec<u32> = (0..1_200).map(|i| 50_000 + i * 7).collect();
    let turns = [500, 800, 1_200];
    let routers: Vec<(Box<dyn Router>, bool)> = vec![
        (Box::new(AffinityRouter::new(4).unwrap()), true),
        (Box::new(BalancedRouter::new(4).unwrap()), false),
    ];
    for (router, with_session) in routers {
        // Other traffic keeps the fleet busy in between.
        let mut seen = Vec::new();
        let mut cached = Vec::new();
        for (t, &len) in turns.iter().enumerate() {
            let noise: Vec<u32> = (0..300).map(|i| 900_000 + t as u32 * 1_000 + i).collect();
            let other = router.route(&RouteRequest::new(&noise)).unwrap();
            let req = RouteRequest::new(&convo[..len]);
            let req = if with_session {
                req.with_session("conversation-1")
            } else {
                req
            };
            let d = router.route(&req).unwrap();
            seen.push(d.worker());
            cached.push(d.cached_tokens());
            router.complete(&d);
            router.complete(&other);
        }
        assert!(
            seen.iter().all(|&w| w == seen[0]),
            "{}: {seen:?}",
            router.name()
        );
        if !with_session {
            // Balanced predicts the history: 496 then 800 tokens (block-aligned).
            assert_eq!(cached, [0, 496, 800], "{}", router.name());
        }
    }
}

#[test]
fn ties_on_an_idle_fleet_spread_instead_of_picking_worker_zero() {
    for router in all_routers(4) {
        let mut workers = HashSet::new();
        for i in 0..8u32 {
            let prompt: Vec<u32> = (0..64).map(|j| i * 1_000 + j).collect();
            let d = router
                .route(&RouteRequest::new(&prompt).with_session(&format!("s{i}")))
                .unwrap();
            workers.insert(d.worker());
            router.complete(&d);
        }
        assert!(
            workers.len() >= 3,
            "{} used only {workers:?}",
            router.name()
        );
    }
}

fn session_placement(router: &ConsistentHashRouter, keys: &[String]) -> Vec<WorkerId> {
    keys.iter()
        .map(|k| {
            let d = router
                .route(&RouteRequest::new(&[1]).with_session(k))
                .unwrap();
            router.complete(&d);
            d.worker()
        })
        .collect()
}

#[test]
fn consistent_hashing_moves_about_one_in_n_plus_one_keys() {
    let keys: Vec<String> = (0..10_000).map(|i| format!("session-{i}")).collect();
    let router = ConsistentHashRouter::new(8).unwrap();
    let before = session_placement(&router, &keys);
    router.add_worker(WorkerId::new(8)).unwrap();
    let after = session_placement(&router, &keys);
    let moved = before.iter().zip(&after).filter(|(a, b)| a != b).count() as f64;
    let ideal = keys.len() as f64 / 9.0;
    assert!(
        moved <= 2.0 * ideal && moved >= ideal / 2.0,
        "moved {moved}, ideal {ideal}"
    );
    assert!(
        before
            .iter()
            .zip(&after)
            .all(|(a, b)| a == b || b.get() == 8),
        "keys only move to the new worker"
    );
    router.remove_worker(WorkerId::new(3)).unwrap();
    let removed = session_placement(&router, &keys);
    for (a, b) in after.iter().zip(&removed) {
        assert!(
            a == b || a.get() == 3,
            "only the removed worker's keys move"
        );
    }
    let moved = after.iter().zip(&removed).filter(|(a, b)| a != b).count() as f64;
    let ideal = keys.len() as f64 / 9.0;
    assert!(
        moved <= 2.0 * ideal && moved >= ideal / 2.0,
        "moved {moved}, ideal {ideal}"
    );
}

#[test]
fn bounded_loads_hold_while_everything_is_in_flight() {
    let router = ConsistentHashRouter::new(8).unwrap();
    // A hot key: every request has the same prefix.
    let prompt: Vec<u32> = (0..256).collect();
    let decisions: Vec<_> = (0..10_000)
        .map(|_| router.route(&RouteRequest::new(&prompt)).unwrap())
        .collect();
    let total: u64 = (0..8)
        .map(|w| router.load(WorkerId::new(w)).unwrap().in_flight)
        .sum();
    assert_eq!(total, 10_000);
    for w in 0..8 {
        let l = router.load(WorkerId::new(w)).unwrap().in_flight;
        assert!(
            l as f64 <= (1.25 * 10_000.0 / 8.0f64).ceil(),
            "worker {w}: {l}"
        );
    }
    for d in &decisions {
        router.complete(d);
    }
    assert!((0..8).all(|w| router.load(WorkerId::new(w)).unwrap().in_flight == 0));
}

#[test]
fn errors_and_harmless_repeats() {
    for router in all_routers(0) {
        assert_eq!(
            router.route(&RouteRequest::new(&[1, 2])).unwrap_err(),
            Error::NoWorkers
        );
    }
    for router in all_routers(2) {
        let name = router.name();
        assert_eq!(
            router.add_worker(WorkerId::new(1)),
            Err(Error::WorkerExists(WorkerId::new(1))),
            "{name}"
        );
        assert_eq!(
            router.remove_worker(WorkerId::new(9)),
            Err(Error::UnknownWorker(WorkerId::new(9)))
        );
        assert!(matches!(
            router.add_worker(WorkerId::new(u32::MAX)),
            Err(Error::WorkerOutOfRange { .. })
        ));
        let d = router.route(&RouteRequest::new(&[7; 40])).unwrap();
        router.complete(&d);
        router.complete(&d);
        assert!(d.is_completed());
        assert_eq!(router.load(d.worker()).unwrap().in_flight, 0, "{name}");
        // Completing after the worker was removed and added again touches nothing.
        let d = router.route(&RouteRequest::new(&[7; 40])).unwrap();
        let w = d.worker();
        router.remove_worker(w).unwrap();
        router.add_worker(w).unwrap();
        let other = router.route(&RouteRequest::new(&[8; 40])).unwrap();
        router.complete(&d);
        let in_flight: u64 = router
            .workers()
            .iter()
            .map(|&w| router.load(w).unwrap().in_flight)
            .sum();
        assert_eq!(in_flight, 1, "{name}: only `other` is in flight");
        router.complete(&other);
        // Unavailable workers get nothing; none available is an error.
        router.set_available(WorkerId::new(0), false).unwrap();
        for _ in 0..4 {
            let d = router.route(&RouteRequest::new(&[1; 20])).unwrap();
            assert_eq!(d.worker(), WorkerId::new(1), "{name}");
            router.complete(&d);
        }
        router.set_available(WorkerId::new(1), false).unwrap();
        assert_eq!(
            router.route(&RouteRequest::new(&[1])).unwrap_err(),
            Error::NoWorkers
        );
        assert!(router.set_available(WorkerId::new(5), true).is_err());
        assert!(router.report_load(WorkerId::new(0), load(3, 1.5)).is_err());
        assert!(router.report_load(WorkerId::new(0), load(3, 0.5)).is_ok());
    }
    assert!(matches!(
        RoundRobinRouter::new(1_000_000),
        Err(Error::WorkerOutOfRange { .. })
    ));
}

#[test]
fn invalid_configurations_are_errors() {
    let mut c = BalancedConfig::default();
    c.alpha = f64::NAN;
    let err = BalancedRouter::with_config(2, c).unwrap_err();
    assert_eq!(err.to_string(), "invalid alpha = NaN: between 0.0 and 1.0");
    c.alpha = 1.5;
    assert!(BalancedRouter::with_config(2, c).is_err());
    let mut c = BalancedConfig::default();
    c.load.prefill_tokens_per_s = 0.0;
    assert!(BalancedRouter::with_config(2, c).is_err());
    for load in [
        LoadConfig::default().with_learning_rate(1.5),
        LoadConfig::default().with_step(StepModel::default().with_max_num_seqs(0)),
        LoadConfig::default().with_step(StepModel::default().with_step_base_s(-1.0)),
    ] {
        let c = BalancedConfig::default().with_load(load);
        assert!(matches!(
            BalancedRouter::with_config(2, c),
            Err(Error::InvalidConfig { .. })
        ));
    }
    let mut c = BalancedConfig::default();
    c.index.block_size = 0;
    assert!(matches!(
        BalancedRouter::with_config(2, c),
        Err(Error::InvalidBlockSize { .. })
    ));
    let mut c = CacheAwareConfig::default();
    c.cache_threshold = -0.1;
    assert!(CacheAwareRouter::with_config(2, c).is_err());
    let mut c = CacheAwareConfig::default();
    c.balance_rel_threshold = f64::INFINITY;
    assert!(CacheAwareRouter::with_config(2, c).is_err());
    let mut c = ConsistentHashConfig::default();
    c.load_factor = 0.9;
    assert!(ConsistentHashRouter::with_config(2, c).is_err());
    let mut c = ConsistentHashConfig::default();
    c.virtual_nodes = 0;
    assert!(ConsistentHashRouter::with_config(2, c).is_err());
    let mut c = AffinityConfig::default();
    c.max_sessions = 0;
    assert!(AffinityRouter::with_config(2, c).is_err());
    let mut c = AffinityConfig::default();
    c.overload_factor = f64::NAN;
    assert!(AffinityRouter::with_config(2, c).is_err());
}

#[test]
fn salts_never_share_cache() {
    let router = BalancedRouter::new(2).unwrap();
    let prompt: Vec<u32> = (0..640).collect();
    let a = router
        .route(&RouteRequest::new(&prompt).with_salt(b"model-a"))
        .unwrap();
    router.complete(&a);
    let a2 = router
        .route(&RouteRequest::new(&prompt).with_salt(b"model-a"))
        .unwrap();
    assert_eq!(a2.cached_tokens(), 640);
    router.complete(&a2);
    let b = router
        .route(&RouteRequest::new(&prompt).with_salt(b"model-b"))
        .unwrap();
    assert_eq!(b.cached_tokens(), 0);
    router.complete(&b);
}

#[test]
fn an_unavailable_worker_keeps_its_mirror() {
    let router = CacheAwareRouter::new(2).unwrap();
    let prompt: Vec<u32> = (0..320).collect();
    let d = router.route(&RouteRequest::new(&prompt)).unwrap();
    router.complete(&d);
    let home = d.worker();
    router.set_available(home, false).unwrap();
    let away = router.route(&RouteRequest::new(&prompt)).unwrap();
    assert_ne!(away.worker(), home);
    router.complete(&away);
    router.set_available(home, true).unwrap();
    // Both now hold it; the index still knows the original holder's blocks.
    assert_eq!(router.index().cached_tokens(home, &[], &prompt), 320);
    router.remove_worker(home).unwrap();
    assert_eq!(router.index().cached_tokens(home, &[], &prompt), 0);
}

#[test]
fn power_of_two_is_deterministic_per_seed() {
    let run = |seed| {
        let mut c = PowerOfTwoConfig::default();
        c.seed = seed;
        let r = PowerOfTwoRouter::with_config(8, c).unwrap();
        (0..50)
            .map(|i| r.route(&RouteRequest::new(&[i])).unwrap().worker().get())
            .collect::<Vec<_>>()
    };
    assert_eq!(run(1), run(1));
    assert_ne!(run(1), run(2));
}

#[test]
fn guards_release_on_drop() {
    let router: Arc<dyn Router> = Arc::new(LeastLoadedRouter::new(3).unwrap());
    {
        let guards: Vec<_> = (0..6)
            .map(|_| RouteGuard::route(router.as_ref(), &RouteRequest::new(&[1])).unwrap())
            .collect();
        assert_eq!(guards.len(), 6);
        assert_eq!(router.load(WorkerId::new(2)).unwrap().in_flight, 2);
    }
    assert!((0..3).all(|w| router.load(WorkerId::new(w)).unwrap().in_flight == 0));
}

#[test]
fn every_router_is_send_sync_and_object_safe() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<RoundRobinRouter>();
    assert_send_sync::<LeastLoadedRouter>();
    assert_send_sync::<PowerOfTwoRouter>();
    assert_send_sync::<ConsistentHashRouter>();
    assert_send_sync::<AffinityRouter>();
    assert_send_sync::<BalancedRouter>();
    assert_send_sync::<CacheAwareRouter>();
    assert_send_sync::<CacheIndex>();
    assert_send_sync::<RouteDecision>();
    assert_send_sync::<Box<dyn Router>>();
    assert_send_sync::<RadixTree>();
    assert_send_sync::<PrefixHasher>();
}

#[test]
fn four_threads_leave_every_load_counter_at_zero() {
    for router in all_routers(5) {
        let router: Arc<dyn Router> = Arc::from(router);
        let threads: Vec<_> = (0..4u32)
            .map(|t| {
                let router = Arc::clone(&router);
                std::thread::spawn(move || {
                    let mut pending = Vec::new();
                    for i in 0..25_000u32 {
                        let prompt: Vec<u32> = (0..48).map(|j| (i % 97) * 1_000 + j).collect();
                        let session = format!("t{t}-{}", i % 50);
                        let d = router
                            .route(&RouteRequest::new(&prompt).with_session(&session))
                            .unwrap();
                        pending.push(d);
                        if pending.len() > 8 {
                            router.complete(&pending.remove(0));
                        }
                    }
                    for d in pending {
                        router.complete(&d);
                    }
                })
            })
            .collect();
        for t in threads {
            t.join().unwrap();
        }
        for w in router.workers() {
            let load = router.load(w).unwrap();
            assert_eq!(
                (
                    load.in_flight,
                    load.prefill_tokens,
                    load.predicted_cached_tokens
                ),
                (0, 0, 0),
                "{} worker {w:?}",
                router.name()
            );
        }
        let routed: u64 = router
            .workers()
            .iter()
            .map(|&w| router.load(w).unwrap().routed)
            .sum();
        assert_eq!(routed, 100_000, "{}", router.name());
    }
}

/// A router written outside the crate implements only the four required methods.
struct Fixed;

impl Router for Fixed {
    fn route(&self, request: &RouteRequest<'_>) -> Result<RouteDecision, Error> {
        let _ = request;
        Err(Error::NoWorkers)
    }
    fn complete(&self, _decision: &RouteDecision) {}
    fn add_worker(&self, _worker: WorkerId) -> Result<(), Error> {
        Ok(())
    }
    fn remove_worker(&self, worker: WorkerId) -> Result<(), Error> {
        Err(Error::UnknownWorker(worker))
    }
}

#[test]
fn outside_routers_need_only_the_contract_methods() {
    let r: Box<dyn Router> = Box::new(Fixed);
    assert_eq!(r.name(), "custom");
    assert!(r.workers().is_empty() && r.load(WorkerId::new(0)).is_none());
    assert_eq!(
        r.route(&RouteRequest::new(&[1])).unwrap_err(),
        Error::NoWorkers
    );
}

/// A report of `waiting` requests and `kv_usage`, measured at time 0.
fn load(waiting: u64, kv_usage: f64) -> EngineLoad {
    EngineLoad::new(waiting, 0, std::time::Duration::ZERO).with_kv_usage(kv_usage)
}
