//! The public policy seam: a policy written outside the crate, wrapped in a `PolicyRouter`,
//! gets load tracking, the mirror and event sync, and its contract is enforced.

#![allow(clippy::unwrap_used)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use prefix_router::{
    Balanced, BalancedConfig, BalancedRouter, CacheEvent, CacheSync, Candidate, Cost, Error,
    IndexConfig, Policy, PolicyRouter, RouteDecision, RouteRequest, Router, WorkerId, choose_min,
};

/// Picks the candidate at a fixed index, records what it was offered.
#[derive(Default)]
struct Fixed {
    index: usize,
    reads: bool,
    seen: Mutex<Vec<Vec<(WorkerId, usize, u64)>>>,
    added: AtomicUsize,
    removed: AtomicUsize,
}

impl Policy for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }

    fn reads_cache(&self) -> bool {
        self.reads
    }

    fn select(&self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let offered = candidates
            .iter()
            .map(|c| (c.worker(), c.cached_tokens(), c.in_flight()))
            .collect();
        self.seen.lock().unwrap().push(offered);
        self.index
    }

    fn worker_added(&self, _: WorkerId) {
        self.added.fetch_add(1, Ordering::Relaxed);
    }

    fn worker_removed(&self, _: WorkerId) {
        self.removed.fetch_add(1, Ordering::Relaxed);
    }
}

fn fixed(index: usize, reads: bool) -> Fixed {
    Fixed {
        index,
        reads,
        ..Fixed::default()
    }
}

#[test]
fn a_custom_policy_gets_load_tracking_and_worker_hooks() {
    let router = PolicyRouter::with_policy(3, fixed(2, false), IndexConfig::default()).unwrap();
    assert_eq!(router.policy().added.load(Ordering::Relaxed), 3);
    let tokens: Vec<u32> = (0..40).collect();
    let first = router.route(&RouteRequest::new(&tokens)).unwrap();
    let second = router.route(&RouteRequest::new(&tokens)).unwrap();
    assert_eq!(first.worker(), WorkerId::new(2));
    assert_eq!(router.load(WorkerId::new(2)).unwrap().in_flight, 2);
    // The second choice saw the first request in flight, and no cache figures.
    let seen = router.policy().seen.lock().unwrap().clone();
    assert_eq!(seen[1][2], (WorkerId::new(2), 0, 1));
    router.complete(&first);
    router.complete(&second);
    assert_eq!(router.load(WorkerId::new(2)).unwrap().in_flight, 0);
    router.remove_worker(WorkerId::new(0)).unwrap();
    assert_eq!(router.policy().removed.load(Ordering::Relaxed), 1);
    assert_eq!(router.name(), "fixed");
    assert!(router.cache_sync().is_none(), "it does not read the cache");
    assert_eq!(router.block_size(), None);
}

#[test]
fn a_policy_that_reads_the_cache_sees_what_events_stored() {
    let router = PolicyRouter::with_policy(2, fixed(0, true), IndexConfig::default()).unwrap();
    let tokens: Vec<u32> = (0..32).collect();
    let event = CacheEvent::stored(None, vec![7, 8], tokens.clone());
    router.apply_event(WorkerId::new(1), 0, &event).unwrap();
    let d = router.route(&RouteRequest::new(&tokens)).unwrap();
    let seen = router.policy().seen.lock().unwrap().clone();
    assert_eq!(seen[0][1].1, 32, "worker 1 holds both blocks");
    assert_eq!(seen[0][0].1, 0);
    // Worker 0 was chosen: the prompt is now mirrored there too.
    assert_eq!(
        router.index().cached_tokens(WorkerId::new(0), &[], &tokens),
        32
    );
    assert_eq!(d.cached_tokens(), 0);
    assert!(router.cache_sync().is_some());
    assert_eq!(router.block_size(), Some(16));
}

#[test]
fn a_choice_out_of_range_is_an_error_and_charges_nothing() {
    let router = PolicyRouter::with_policy(2, fixed(5, true), IndexConfig::default()).unwrap();
    let tokens: Vec<u32> = (0..32).collect();
    let err = router.route(&RouteRequest::new(&tokens)).unwrap_err();
    assert_eq!(
        err,
        Error::InvalidChoice {
            policy: "fixed",
            index: 5,
            candidates: 2
        }
    );
    for w in 0..2 {
        let w = WorkerId::new(w);
        assert_eq!(router.load(w).unwrap().in_flight, 0);
        assert_eq!(router.index().cached_tokens(w, &[], &tokens), 0);
    }
}

#[test]
fn choose_min_spreads_ties_over_workers() {
    struct Tie;
    impl Policy for Tie {
        fn name(&self) -> &'static str {
            "tie"
        }
        fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
            choose_min(request, candidates, |_| 0)
        }
    }
    let router = PolicyRouter::with_policy(4, Tie, IndexConfig::default()).unwrap();
    let mut used = std::collections::HashSet::new();
    for i in 0..16u32 {
        let d = router.route(&RouteRequest::new(&[i, 1, 2])).unwrap();
        used.insert(d.worker());
    }
    assert_eq!(used.len(), 4, "every worker takes a share of equal choices");
}

#[test]
fn policy_routers_are_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<PolicyRouter<Fixed>>();
    assert_send_sync::<BalancedRouter>();
}

/// `Balanced` over every worker, for comparing with its shortlist.
struct EveryWorker(Balanced);

impl Policy for EveryWorker {
    fn name(&self) -> &'static str {
        "every_worker"
    }
    fn reads_cache(&self) -> bool {
        true
    }
    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        self.0.select(request, candidates)
    }
    fn cost(&self, request: &RouteRequest<'_>, candidate: &Candidate) -> Option<Cost> {
        self.0.cost(request, candidate)
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(64))]

    /// `BalancedRouter` scores a shortlist (the least loaded worker of each amount cached,
    /// and of none): through shared prefixes, loads that come and go, unavailable workers,
    /// and workers removed and added again (ids with no worker among those with one), it
    /// decides as the same policy scoring every worker does, or, where the load key orders
    /// workers holding alike otherwise than a request's cost does (the key is a time to
    /// first token without the request's own decode time; the request's miss weight grows
    /// with a worker's waiting requests, its steps with the worker's queue), picks a worker
    /// whose cost is within five times the best (seen: up to four times, a holder whose
    /// long decodes the key does not weigh ranking first among holders alike). From the
    /// first such step on the two routers' loads differ, and the comparison ends.
    #[test]
    fn the_shortlist_decides_as_every_worker_does(
        ops in proptest::collection::vec((0u32..6, 1usize..6, 0u8..5), 1..120),
        workers in 2u32..12,
    ) {
        let shortlist = BalancedRouter::new(workers).unwrap();
        let every = PolicyRouter::with_policy(
            workers,
            EveryWorker(Balanced::new(BalancedConfig::default()).unwrap()),
            IndexConfig::default(),
        )
        .unwrap();
        let routers: [&dyn Router; 2] = [&shortlist, &every];
        let mut open: Vec<[RouteDecision; 2]> = Vec::new();
        for (i, (prefix, blocks, action)) in ops.into_iter().enumerate() {
            let prompt: Vec<u32> = (0..blocks as u32 * 16)
                .map(|t| if t < 32 { prefix * 1000 + t } else { i as u32 * 1000 + t })
                .collect();
            let request = RouteRequest::new(&prompt);
            let a = routers[0].route(&request).unwrap();
            let (b, receipt) = routers[1].route_with_receipt(&request).unwrap();
            if a.worker() != b.worker() {
                let cost = |w: WorkerId| {
                    let line = receipt.candidates.iter().find(|l| l.worker == w);
                    line.and_then(|l| l.cost.clone()).unwrap()
                };
                let (chosen, best) = (cost(a.worker()), cost(b.worker()));
                proptest::prop_assert!(
                    chosen.total() <= best.total() * 5.0 + 1e-9,
                    "op {}: {}", i, receipt
                );
                break;
            }
            proptest::prop_assert_eq!(a.cached_tokens(), b.cached_tokens());
            open.push([a, b]);
            match action {
                0 if !open.is_empty() => {
                    let [a, b] = open.remove(0);
                    routers[0].complete(&a);
                    routers[1].complete(&b);
                }
                1 => {
                    if let Some([a, b]) = open.last() {
                        routers[0].first_token(a);
                        routers[1].first_token(b);
                    }
                }
                2 => {
                    let w = WorkerId::new(i as u32 % workers);
                    let available = i % 3 != 0 || w.get() == 0;
                    // A removed worker is unknown to both.
                    let set = routers.map(|r| r.set_available(w, available).is_ok());
                    proptest::prop_assert_eq!(set[0], set[1]);
                }
                3 => {
                    // Worker 0 stays, so that a route always has a worker.
                    let w = WorkerId::new(1 + i as u32 % (workers - 1));
                    for r in routers {
                        if r.remove_worker(w).is_err() {
                            r.add_worker(w).unwrap();
                        }
                    }
                }
                _ => {}
            }
        }
    }
}
