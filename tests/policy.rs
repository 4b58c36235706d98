//! The public policy seam: a policy written outside the crate, wrapped in a `PolicyRouter`,
//! gets load tracking, the mirror and event sync, and its contract is enforced.

#![allow(clippy::unwrap_used)]

use std::sync::Mutex;
use std::sync::atomic::{AtomicUsize, Ordering};

use prefix_router::{
    Balanced, BalancedConfig, BalancedRouter, CacheEvent, CacheSync, Candidate, Cost, EngineLoad,
    Error, IndexConfig, LoadConfig, MissWeight, Policy, PolicyRouter, Priority, ReloadConfig,
    ReplicaConfig, RouteDecision, RouteRequest, Router, Staleness, StepModel, Tier, WorkerId,
    WorkerProfile, choose_min,
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

/// One step of [`the_shortlist_decides_as_every_worker_does`].
#[derive(Clone, Debug)]
enum Op {
    /// Routes a prompt of `blocks` blocks whose first two share `prefix`, expecting
    /// `output` tokens (none: the default), at `at` ms when given, asking for admission
    /// when `asks` gives its priority (0 sheddable, 1 standard, 2 critical) and its
    /// targets to the first token and per output token, in ms.
    Route {
        prefix: u32,
        blocks: u32,
        output: Option<u32>,
        at: Option<u64>,
        asks: Option<(u8, u64, u64)>,
    },
    /// Completes the oldest open request.
    Complete,
    /// The newest open request's first token came, after `elapsed_ms` when given (the
    /// worker learns from it).
    FirstToken { elapsed_ms: Option<u64> },
    /// The newest open request's `tokens` output tokens took `elapsed_ms`.
    Tokens { tokens: u32, elapsed_ms: u64 },
    /// Worker `worker` reports `waiting` and `running` requests, `kv` percent of its KV in
    /// use, and pending prefill when given, at `at` ms.
    Report {
        worker: u32,
        waiting: u64,
        running: u64,
        kv: u8,
        prefill: Option<u64>,
        at: u64,
    },
    /// Worker `worker`'s profile: `speed` percent, `kv_tokens` of KV (0: unknown).
    Profile {
        worker: u32,
        speed: u32,
        kv_tokens: u64,
    },
    /// Worker `worker` is made unavailable, or available again.
    Available { worker: u32, available: bool },
    /// Worker `worker` is removed, or added again when it was.
    Toggle { worker: u32 },
    /// Worker `worker`'s engine stores the two blocks of `prefix`, on its host tier when
    /// `host` (a hit there costs its reload).
    Store {
        worker: u32,
        prefix: u32,
        host: bool,
    },
    /// A peer replica routes a prompt of `blocks` blocks whose first two share `prefix`,
    /// completes its oldest request when `complete`, and its sync frame is applied at `at` ms.
    Peer {
        prefix: u32,
        blocks: u32,
        complete: bool,
        at: u64,
    },
}

fn op() -> impl proptest::strategy::Strategy<Value = Op> {
    use proptest::prelude::*;
    prop_oneof![
        6 => (
            (0u32..6, 1u32..8, proptest::option::of(1u32..600), proptest::option::of(0u64..20_000)),
            proptest::option::weighted(0.4, (0u8..3, 20u64..3_000, 2u64..200)),
        )
            .prop_map(|((prefix, blocks, output, at), asks)| Op::Route { prefix, blocks, output, at, asks }),
        3 => Just(Op::Complete),
        2 => proptest::option::of(1u64..400).prop_map(|elapsed_ms| Op::FirstToken { elapsed_ms }),
        1 => (1u32..200, 1u64..4_000).prop_map(|(tokens, elapsed_ms)| Op::Tokens { tokens, elapsed_ms }),
        1 => (0u32..12, 0u64..12, 0u64..12, 0u8..=100, proptest::option::of(0u64..20_000), 0u64..20_000)
            .prop_map(|(worker, waiting, running, kv, prefill, at)| {
                Op::Report { worker, waiting, running, kv, prefill, at }
            }),
        1 => (0u32..12, 25u32..400, prop_oneof![Just(0u64), 500u64..20_000])
            .prop_map(|(worker, speed, kv_tokens)| Op::Profile { worker, speed, kv_tokens }),
        1 => (0u32..12, any::<bool>()).prop_map(|(worker, available)| Op::Available { worker, available }),
        1 => (1u32..12).prop_map(|worker| Op::Toggle { worker }),
        2 => (0u32..12, 0u32..6, any::<bool>()).prop_map(|(worker, prefix, host)| Op::Store { worker, prefix, host }),
        2 => (0u32..6, 1u32..8, any::<bool>(), 0u64..20_000)
            .prop_map(|(prefix, blocks, complete, at)| Op::Peer { prefix, blocks, complete, at }),
    ]
}

/// Applies `op` to every router of `routers` alike (after a route, `open` holds each
/// one's decision); `i` numbers the step. Errors must agree.
fn apply(
    routers: [&dyn Router; 2],
    open: &mut Vec<[RouteDecision; 2]>,
    (op, seq): (&Op, u64),
    workers: u32,
) {
    use std::time::Duration;
    let ms = Duration::from_millis;
    match *op {
        Op::Route { .. } | Op::Peer { .. } => {}
        Op::Complete => {
            if !open.is_empty() {
                let [a, b] = open.remove(0);
                routers[0].complete(&a);
                routers[1].complete(&b);
            }
        }
        Op::FirstToken { elapsed_ms } => {
            if let Some([a, b]) = open.last() {
                for (r, d) in routers.iter().zip([a, b]) {
                    match elapsed_ms {
                        Some(e) => r.first_token_after(d, ms(e)),
                        None => r.first_token(d),
                    }
                }
            }
        }
        Op::Tokens { tokens, elapsed_ms } => {
            if let Some([a, b]) = open.last() {
                for (r, d) in routers.iter().zip([a, b]) {
                    r.tokens_after(d, tokens, ms(elapsed_ms));
                }
            }
        }
        Op::Report {
            worker,
            waiting,
            running,
            kv,
            prefill,
            at,
        } => {
            let w = WorkerId::new(worker % workers);
            let mut load =
                EngineLoad::new(waiting, running, ms(at)).with_kv_usage(f64::from(kv) / 100.0);
            if let Some(p) = prefill {
                load = load.with_prefill_tokens(p);
            }
            let results = routers.map(|r| r.report_load(w, load).is_ok());
            assert_eq!(results[0], results[1]);
        }
        Op::Profile {
            worker,
            speed,
            kv_tokens,
        } => {
            let w = WorkerId::new(worker % workers);
            let profile = WorkerProfile::default()
                .with_speed(f64::from(speed) / 100.0)
                .with_kv_capacity_tokens(kv_tokens);
            let results = routers.map(|r| r.set_profile(w, profile).is_ok());
            assert_eq!(results[0], results[1]);
        }
        Op::Available { worker, available } => {
            let w = WorkerId::new(worker % workers);
            // Worker 0 stays available, so that a route always has a worker.
            let available = available || w.get() == 0;
            let results = routers.map(|r| r.set_available(w, available).is_ok());
            assert_eq!(results[0], results[1]);
        }
        Op::Store {
            worker,
            prefix,
            host,
        } => {
            let w = WorkerId::new(worker % workers);
            let tokens: Vec<u32> = (0..32).map(|t| prefix * 1000 + t).collect();
            let hashes = vec![u64::from(prefix) * 2 + 1, u64::from(prefix) * 2 + 2];
            let mut event = CacheEvent::stored(None, hashes, tokens);
            if host {
                event = event.with_tier(Tier::Host);
            }
            let results =
                routers.map(|r| r.cache_sync().unwrap().apply_event(w, seq, &event).is_ok());
            assert_eq!(results[0], results[1]);
        }
        Op::Toggle { worker } => {
            // Worker 0 stays, so that a route always has a worker.
            let w = WorkerId::new(1 + worker % (workers - 1));
            for r in routers {
                if r.remove_worker(w).is_err() {
                    r.add_worker(w).unwrap();
                }
            }
        }
    }
}

/// Two workers hold a prompt's prefix on their host tier, where reloading it is slow: the
/// idle one is the least loaded, but the other, four times faster, reloads it in a quarter
/// of the time and wins despite its queue. The shortlist reaches it: the floor it prices
/// the class at reloads at the fleet's greatest speed.
#[test]
fn a_faster_holder_behind_a_queue_is_reached() {
    let mut reload = ReloadConfig::default();
    reload.host_bytes_per_s = 1e9;
    // A miss weighing a fixed 10: the idle worker holding nothing stays dearer.
    let config = BalancedConfig::default()
        .with_reload(reload)
        .with_miss_weight(10.0);
    let router = BalancedRouter::with_config(3, config).unwrap();
    let every = PolicyRouter::with_policy(
        3,
        EveryWorker(Balanced::new(config).unwrap()),
        IndexConfig::default(),
    )
    .unwrap();
    let tokens: Vec<u32> = (0..512).map(|t| 1_000 + t).collect();
    let prompt: Vec<u32> = (0..528).map(|t| 1_000 + t).collect();
    let fast = WorkerId::new(1);
    let routers: [&dyn Router; 2] = [&router, &every];
    for r in routers {
        for w in [0, 1] {
            let stored =
                CacheEvent::stored(None, (1..=32).collect(), tokens.clone()).with_tier(Tier::Host);
            r.cache_sync()
                .unwrap()
                .apply_event(WorkerId::new(w), 0, &stored)
                .unwrap();
        }
        r.set_profile(fast, WorkerProfile::default().with_speed(4.0))
            .unwrap();
        let queue = EngineLoad::new(2, 0, std::time::Duration::ZERO).with_prefill_tokens(2_000);
        r.report_load(fast, queue).unwrap();
    }
    let (d, receipt) = router
        .route_with_receipt(&RouteRequest::new(&prompt))
        .unwrap();
    assert_eq!(d.worker(), fast, "{receipt}");
    assert_eq!(
        d.worker(),
        every.route(&RouteRequest::new(&prompt)).unwrap().worker()
    );
}

/// Records, for each route, the fleet's load each candidate carries and each candidate's
/// load.
struct FleetLoadSeen(Mutex<Vec<(Vec<f64>, Vec<u64>)>>);

impl Policy for FleetLoadSeen {
    fn name(&self) -> &'static str {
        "fleet_load_seen"
    }
    fn select(&self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let shares = candidates.iter().map(Candidate::fleet_load).collect();
        let loads = candidates.iter().map(Candidate::load_ns).collect();
        self.0.lock().unwrap().push((shares, loads));
        0
    }
}

/// The fleet's load recomputed from every worker's load: capped at the busy horizon,
/// beyond an idle worker's step, as a share of the horizon beyond it.
fn fleet_load_of(loads: &[u64], horizon_ns: u64) -> f64 {
    let idle = (StepModel::default().step_base_s * 1e9) as u64;
    let busy: f64 = loads
        .iter()
        .map(|&l| l.min(horizon_ns) as f64 - idle as f64)
        .sum();
    (busy / (loads.len() as f64 * (horizon_ns - idle) as f64)).clamp(0.0, 1.0)
}

/// Queued prefill of `seconds` at the configured rate, reported by `worker`.
fn queue(router: &dyn Router, worker: u32, seconds: f64) {
    let tokens = (seconds * LoadConfig::default().prefill_tokens_per_s) as u64;
    let report = EngineLoad::new(1, 0, std::time::Duration::ZERO).with_prefill_tokens(tokens);
    router.report_load(WorkerId::new(worker), report).unwrap();
}

/// The fleet's load is 0 on an idle fleet, the same for every candidate of one request,
/// the mean of the workers' loads beyond an idle worker's, capped at the busy horizon, as
/// a share of it, and rises with them.
#[test]
fn every_candidate_carries_the_fleet_s_load() {
    let policy = FleetLoadSeen(Mutex::new(Vec::new()));
    let load = LoadConfig::default().with_busy_horizon(std::time::Duration::from_secs(1));
    let router =
        PolicyRouter::with_policy_and_load(4, policy, IndexConfig::default(), load).unwrap();
    let prompt: Vec<u32> = (0..64).collect();
    let mut seen = Vec::new();
    for (worker, seconds) in [(0, 0.0), (0, 0.5), (1, 0.5), (2, 3.0), (3, 3.0)] {
        if seconds > 0.0 {
            queue(&router, worker, seconds);
        }
        let d = router.route(&RouteRequest::new(&prompt)).unwrap();
        router.complete(&d);
        let routes = router.policy().0.lock().unwrap();
        let (shares, _) = routes.last().unwrap();
        assert!(shares.iter().all(|&l| l == shares[0]), "{shares:?}");
        seen.push(shares[0]);
    }
    assert_eq!(seen[0], 0.0);
    assert!(seen.windows(2).all(|w| w[0] < w[1]), "{seen:?}");
    // Two queues of half a second and two past the horizon (capped at 1 s): (0.5 + 0.5 +
    // 1 + 1) / 4 of the horizon, give or take the step each queued prefill takes.
    assert!((seen[4] - 0.75).abs() < 0.02, "{seen:?}");
}

/// The weight of a miss follows the fleet's load: on an idle fleet a worker holding
/// nothing costs its own recomputation only (as with a fixed weight of 1), and what a miss
/// costs above a holder grows as every worker's queue grows alike.
#[test]
fn a_miss_costs_one_recomputation_on_an_idle_fleet_and_more_as_it_fills() {
    let prompt: Vec<u32> = (0..2_048).collect();
    let extra = |router: &BalancedRouter| {
        let (d, receipt) = router
            .route_with_receipt(&RouteRequest::new(&prompt))
            .unwrap();
        router.complete(&d);
        let cost = |w: u32| {
            receipt
                .candidates
                .iter()
                .find(|c| c.worker == WorkerId::new(w))
                .and_then(|c| c.cost.clone())
                .map(|c| c.total())
                .unwrap()
        };
        cost(1) - cost(0)
    };
    let fleet = BalancedRouter::new(2).unwrap();
    let one =
        BalancedRouter::with_config(2, BalancedConfig::default().with_miss_weight(1.0)).unwrap();
    for r in [&fleet, &one] {
        r.replace_worker_cache(WorkerId::new(0), &[&prompt])
            .unwrap();
    }
    let idle = extra(&fleet);
    assert!(idle > 0.0);
    assert!((idle - extra(&one)).abs() < 1e-9, "{idle} {}", extra(&one));
    let mut previous = idle;
    for seconds in [0.05, 0.1, 0.2, 0.4, 0.8] {
        for w in 0..2 {
            queue(&fleet, w, seconds);
        }
        let now = extra(&fleet);
        assert!(now > previous, "{seconds} s queued: {now} after {previous}");
        previous = now;
    }
}

/// One hot prompt held by one worker with a queue, on a fleet otherwise idle: a new request
/// opens a second holder, paying the prompt's prefill once, where a fixed weight of 10 would
/// queue it behind the holder; with no queue at the holder, the holder keeps it.
#[test]
fn a_queued_holder_of_a_hot_prompt_gets_company_on_an_idle_fleet() {
    let system: Vec<u32> = (0..6_000).collect();
    let mut prompt = system.clone();
    prompt.extend([900_001, 900_002]);
    let route = |router: &BalancedRouter| {
        let d = router.route(&RouteRequest::new(&prompt)).unwrap();
        router.complete(&d);
        d.worker()
    };
    let holder = WorkerId::new(0);
    let fleet = BalancedRouter::new(8).unwrap();
    let fixed =
        BalancedRouter::with_config(8, BalancedConfig::default().with_miss_weight(10.0)).unwrap();
    for r in [&fleet, &fixed] {
        r.replace_worker_cache(holder, &[&system]).unwrap();
    }
    assert_eq!(route(&fleet), holder);
    for r in [&fleet, &fixed] {
        queue(r, 0, 1.0);
    }
    assert_ne!(route(&fleet), holder);
    assert_eq!(route(&fixed), holder);
}

/// A prompt of `blocks` blocks whose first two share `prefix`, the rest unique to step `i`.
fn prompt_of(prefix: u32, blocks: u32, i: usize) -> Vec<u32> {
    (0..blocks * 16)
        .map(|t| {
            if t < 32 {
                prefix * 1000 + t
            } else {
                i as u32 * 1000 + t
            }
        })
        .collect()
}

/// A peer replica of the routers under test: what it routes and completes reaches them as
/// its sync frames.
struct Peer {
    router: BalancedRouter,
    open: Mutex<Vec<RouteDecision>>,
}

impl Peer {
    fn new(workers: u32, config: BalancedConfig) -> Self {
        let router = BalancedRouter::with_config(workers, config)
            .unwrap()
            .with_replica_sync(ReplicaConfig::new(1, 0))
            .unwrap();
        Peer {
            router,
            open: Mutex::new(Vec::new()),
        }
    }

    /// Routes `prompt`, completes the oldest open request when `complete`, and applies the
    /// frame drained to each of `routers` at `at_ms`; what each made of it, as text.
    fn step(
        &self,
        routers: [&dyn Router; 2],
        (prompt, complete): (Vec<u32>, bool),
        at_ms: u64,
    ) -> [String; 2] {
        let mut open = self.open.lock().unwrap();
        open.push(self.router.route(&RouteRequest::new(&prompt)).unwrap());
        if complete {
            let oldest = open.remove(0);
            self.router.complete(&oldest);
        }
        let mut frame = Vec::new();
        self.router.drain_replica_sync(&mut frame, usize::MAX);
        let now = std::time::Duration::from_millis(at_ms);
        routers.map(|r| format!("{:?}", r.apply_replica_sync(&frame, now)))
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(256))]

    /// `BalancedRouter` scores a shortlist (the least loaded worker of each amount cached,
    /// and of none, widened to every worker that could cost less) and decides exactly as the
    /// same policy scoring every worker does, with a miss priced by the fleet's load (at the
    /// default horizon and at one that every queue passes) or fixed: through shared prefixes, loads that come and
    /// go, engine reports (fresh and stale, with and without pending prefill), host-tier
    /// hits and their reloads, timings the
    /// workers learn from, speeds and KV capacities told, few running slots, unavailable
    /// workers, workers removed and added again, and a peer replica's bookings and prompts.
    #[test]
    fn the_shortlist_decides_as_every_worker_does(
        ops in proptest::collection::vec(op(), 1..160),
        workers in 2u32..12,
        max_num_seqs in 2usize..8,
        staleness in proptest::sample::select(vec![Staleness::Ignore, Staleness::Saturated, Staleness::Hold]),
        host_gb_per_s in proptest::sample::select(vec![0.1, 1.0, 50.0]),
        miss_weight in proptest::sample::select(vec![
            MissWeight::default(),
            MissWeight::Fleet { max: 3.0 },
            MissWeight::Fixed(10.0),
            MissWeight::Fixed(1.0),
        ]),
    ) {
        let mut load = LoadConfig::default()
            .with_staleness(staleness)
            .with_max_report_age(std::time::Duration::from_secs(2));
        load.step.max_num_seqs = max_num_seqs;
        let mut reload = ReloadConfig::default();
        reload.host_bytes_per_s = host_gb_per_s * 1e9;
        let config = BalancedConfig::default()
            .with_load(load)
            .with_reload(reload)
            .with_miss_weight(miss_weight);
        let shortlist = BalancedRouter::with_config(workers, config)
            .unwrap()
            .with_replica_sync(ReplicaConfig::new(0, 0))
            .unwrap();
        let every = PolicyRouter::with_policy_and_load(
            workers,
            EveryWorker(Balanced::new(config).unwrap()),
            IndexConfig::default(),
            load,
        )
        .unwrap()
        .with_replica_sync(ReplicaConfig::new(0, 0))
        .unwrap();
        let peer = Peer::new(workers, config);
        let routers: [&dyn Router; 2] = [&shortlist, &every];
        let mut open: Vec<[RouteDecision; 2]> = Vec::new();
        for (i, op) in ops.iter().enumerate() {
            if let Op::Peer { prefix, blocks, complete, at } = *op {
                let outcomes = peer.step(routers, (prompt_of(prefix, blocks, i), complete), at);
                proptest::prop_assert_eq!(&outcomes[0], &outcomes[1]);
                continue;
            }
            let Op::Route { prefix, blocks, output, at, asks } = *op else {
                apply(routers, &mut open, (op, i as u64), workers);
                continue;
            };
            let prompt = prompt_of(prefix, blocks, i);
            let mut request = RouteRequest::new(&prompt);
            if let Some(output) = output {
                request = request.with_expected_output(output);
            }
            if let Some(at) = at {
                request = request.with_time(std::time::Duration::from_millis(at));
            }
            if let Some((priority, ttft_ms, tpot_ms)) = asks {
                let priorities = [Priority::Sheddable, Priority::Standard, Priority::Critical];
                request = request
                    .with_priority(priorities[usize::from(priority)])
                    .with_ttft_target(std::time::Duration::from_millis(ttft_ms))
                    .with_tpot_target(std::time::Duration::from_millis(tpot_ms));
            }
            match (routers[0].route(&request), routers[1].route_with_receipt(&request)) {
                (Ok(a), Ok((b, receipt))) => {
                    proptest::prop_assert_eq!(a.worker(), b.worker(), "op {}: {}", i, receipt);
                    proptest::prop_assert_eq!(a.cached_tokens(), b.cached_tokens());
                    open.push([a, b]);
                }
                (a, b) => {
                    // Both refuse alike: the same gate, best worker and figures.
                    let (a, b) = (format!("{:?}", a.err()), format!("{:?}", b.err()));
                    proptest::prop_assert_eq!(a, b, "op {}", i);
                }
            }
        }
    }
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(128))]

    /// The fleet's load, kept summed as load keys change, is on every route what recomputing
    /// it from every worker's load gives: through engine reports repeated, late (older than
    /// the last) and out of order, routes, first tokens, completions, and workers removed and
    /// added again.
    #[test]
    fn the_fleet_s_load_follows_every_worker_s_load(
        ops in proptest::collection::vec(
            (0u8..6, 0u32..4, 0u64..40_000, 0u64..20_000),
            1..80,
        ),
    ) {
        let policy = FleetLoadSeen(Mutex::new(Vec::new()));
        let router = PolicyRouter::with_policy(4, policy, IndexConfig::default()).unwrap();
        let horizon = LoadConfig::default().busy_horizon.as_nanos() as u64;
        let mut open: Vec<RouteDecision> = Vec::new();
        for (i, &(kind, worker, tokens, at_ms)) in ops.iter().enumerate() {
            let w = WorkerId::new(worker);
            match kind {
                0 | 1 => {
                    // A report, at any time: repeated, late and out of order alike.
                    let at = std::time::Duration::from_millis(at_ms);
                    let report = EngineLoad::new(tokens % 7, tokens % 300, at)
                        .with_prefill_tokens(tokens);
                    let _ = router.report_load(w, report);
                    if kind == 1 {
                        let _ = router.report_load(w, report);
                    }
                }
                2 => {
                    let prompt: Vec<u32> = (0..(tokens % 4_000) as u32 + 1)
                        .map(|t| t + i as u32 * 100_000)
                        .collect();
                    if let Ok(d) = router.route(&RouteRequest::new(&prompt)) {
                        open.push(d);
                    }
                }
                3 => {
                    if let Some(d) = open.first() {
                        router.first_token(d);
                    }
                }
                4 => {
                    if !open.is_empty() {
                        router.complete(&open.remove(0));
                    }
                }
                _ => {
                    // Worker 0 stays, so that a route always has a worker.
                    if worker > 0 && router.remove_worker(w).is_err() {
                        router.add_worker(w).unwrap();
                    }
                }
            }
            let probe: Vec<u32> = vec![7; 16];
            let d = router.route(&RouteRequest::new(&probe)).unwrap();
            router.complete(&d);
            let routes = router.policy().0.lock().unwrap();
            let (shares, loads) = routes.last().unwrap();
            let expected = fleet_load_of(loads, horizon);
            proptest::prop_assert!(shares.iter().all(|&l| l == shares[0]));
            proptest::prop_assert!(
                (shares[0] - expected).abs() < 1e-4,
                "op {}: carried {}, recomputed {} from {:?}", i, shares[0], expected, loads
            );
        }
    }
}

/// Sessions on an idle fleet that share one prompt, each with a context of its own, on
/// workers whose KV holds three of them: told the capacity, the router fills the holder of
/// the shared prompt up to its room and then opens new holders, every worker ends with
/// three sessions, and each session's next turn stays where its context is. Not told the
/// capacity, it piles every session onto the first holder, whose cache then evicts their
/// contexts.
#[test]
fn sessions_do_not_pile_onto_one_worker_past_its_room() {
    const ROOM: u64 = 16_384;
    let shared: Vec<u32> = (0..1_024).collect();
    let turn = |session: u32, turns: u32| -> Vec<u32> {
        let own = 4_096 + 456 * (turns - 1);
        let mut p = shared.clone();
        p.extend((0..own).map(|t| 1_000_000 * (session + 1) + t));
        p
    };
    let route = |router: &BalancedRouter, prompt: &[u32]| {
        let request = RouteRequest::new(prompt).with_expected_output(256);
        let d = router.route(&request).unwrap();
        router.complete(&d);
        d.worker().index()
    };
    let told = BalancedRouter::new(4).unwrap();
    let blind = BalancedRouter::new(4).unwrap();
    for w in 0..4 {
        let profile = WorkerProfile::default().with_kv_capacity_tokens(ROOM);
        told.set_profile(WorkerId::new(w), profile).unwrap();
    }
    let mut placed = [0usize; 4];
    let mut blind_placed = [0usize; 4];
    let mut homes = Vec::new();
    for s in 0..12 {
        let home = route(&told, &turn(s, 1));
        placed[home] += 1;
        homes.push(home);
        blind_placed[route(&blind, &turn(s, 1))] += 1;
    }
    assert_eq!(placed, [3; 4], "told the room: {placed:?}");
    assert_eq!(
        blind_placed.iter().max(),
        Some(&12),
        "not told: {blind_placed:?}"
    );
    for (s, &home) in homes.iter().enumerate() {
        assert_eq!(
            route(&told, &turn(s as u32, 2)),
            home,
            "session {s}'s next turn"
        );
    }
}
