//! The public policy seam: a policy written outside the crate, wrapped in a `PolicyRouter`,
//! gets load tracking, the mirror and event sync, and its contract is enforced.

#![allow(clippy::unwrap_used)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use prefix_router::{
    BalancedRouter, CacheEvent, CacheSync, Candidate, Error, IndexConfig, Policy, PolicyRouter,
    RouteRequest, Router, WorkerId, choose_min,
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
