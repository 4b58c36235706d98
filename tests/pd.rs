//! Prefill/decode pair routing: plan costs on hand-built fleets, the cost decider against a
//! brute-force search, the handoff credit, and bad input.

use std::time::Duration;

use prefix_router::{
    AlwaysSplit, ByCost, CacheSync, Decide, EngineLoad, Error, NeverSplit, PairView, PdConfig,
    PdRouter, Plan, Priority, Role, RouteRequest, Router, Topology, WorkerId,
};
use proptest::prelude::*;

fn tokens(n: u32, family: u32) -> Vec<u32> {
    (0..n).map(|t| family * 1_000_000 + t).collect()
}

/// Tells `router` that `worker` runs `running` requests and has `prefill` tokens queued.
fn busy(router: &PdRouter<impl Decide>, worker: u32, running: u64, prefill: u64) {
    let load = EngineLoad::new(0, running, Duration::ZERO).with_prefill_tokens(prefill);
    router
        .router()
        .report_load(WorkerId::new(worker), load)
        .expect("report");
}

/// An idle decode worker that holds the prompt takes it aggregated: nothing to prefill,
/// nothing to move.
#[test]
fn an_idle_holder_takes_the_request_aggregated() {
    let roles = [Role::Prefill, Role::Decode, Role::Decode];
    let router = PdRouter::new(&roles, PdConfig::default()).expect("router");
    let prompt = tokens(8_192, 1);
    router
        .router()
        .replace_worker_cache(WorkerId::new(2), &[&prompt])
        .expect("snapshot");
    let pair = router
        .route_pair(&RouteRequest::new(&prompt))
        .expect("route");
    assert!(!pair.is_split());
    assert_eq!(pair.decode().worker(), WorkerId::new(2));
    assert_eq!(pair.cost().transfer_bytes, 0);
    router.complete(&pair);
}

/// A long uncached prompt on decode workers busy decoding splits: its prefill there would
/// stall their running requests for longer than moving its KV takes.
#[test]
fn a_long_prompt_on_busy_decoders_splits() {
    let roles = [Role::Prefill, Role::Decode, Role::Decode];
    let router = PdRouter::new(&roles, PdConfig::default()).expect("router");
    for w in 1..3 {
        busy(&router, w, 128, 0);
    }
    let prompt = tokens(32_768, 2);
    let pair = router
        .route_pair(&RouteRequest::new(&prompt).with_expected_output(128))
        .expect("route");
    assert!(pair.is_split(), "{:?}", pair.cost());
    assert_eq!(pair.prefill().map(|d| d.worker()), Some(WorkerId::new(0)));
    assert_eq!(pair.cost().transfer_bytes, 32_768 * 131_072);
    // The decode worker is charged with no prefill, the prefill worker with all of it.
    assert_eq!(pair.decode().prefill_tokens(), 0);
    assert_eq!(pair.prefill().map(|d| d.prefill_tokens()), Some(32_768));
    router.prefill_done(&pair);
    router.complete(&pair);
    for w in 0..3 {
        let load = router.router().load(WorkerId::new(w)).expect("load");
        assert_eq!((load.in_flight, load.prefill_tokens), (0, 0), "worker {w}");
    }
}

/// After a split first turn and its handoff, the second turn is predicted cached on the
/// decode worker, and the pair routing uses it: once the decoders are idle it goes there
/// aggregated. Without the handoff nothing is predicted there.
#[test]
fn the_handoff_credits_the_decode_worker() {
    let roles = [Role::Prefill, Role::Decode, Role::Decode];
    let first = tokens(4_096, 3);
    let mut second = first.clone();
    second.extend(tokens(512, 4));
    for handoff in [true, false] {
        let router = PdRouter::new(&roles, PdConfig::default()).expect("router");
        for w in 1..3 {
            busy(&router, w, 128, 0);
        }
        let pair = router
            .route_pair(&RouteRequest::new(&first))
            .expect("route");
        assert!(pair.is_split(), "{:?}", pair.cost());
        let decoder = pair.decode().worker();
        if handoff {
            router.prefill_done(&pair);
            router.prefill_done(&pair);
        }
        router.complete(&pair);
        for w in 1..3 {
            busy(&router, w, 0, 0);
        }
        let again = router
            .route_pair(&RouteRequest::new(&second))
            .expect("route");
        if handoff {
            assert!(!again.is_split(), "{:?}", again.cost());
            assert_eq!(again.decode().worker(), decoder);
            assert_eq!(again.decode().cached_tokens(), 4_096);
        } else {
            // The prefill worker holds the first turn; the decode workers hold nothing, so
            // the whole prompt moves.
            assert!(again.is_split(), "{:?}", again.cost());
            assert_eq!(again.cost().transfer_bytes, 4_608 * 131_072);
        }
        router.complete(&again);
    }
}

/// The cost decider picks the cheapest plan the roles allow, as a search over every plan
/// finds it; a short prompt never pays a transfer longer than prefilling it where it
/// decodes would take.
#[test]
fn the_cost_decider_is_the_cheapest_plan() {
    struct Check;
    impl Decide for Check {
        fn name(&self) -> &'static str {
            "check"
        }
        fn decide(&self, request: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
            let chosen = ByCost.decide(request, view);
            let cost = view.cost(chosen).total_s();
            for d in view.decoders() {
                assert!(cost <= view.cost(Plan::Aggregated { decode: d }).total_s());
                for p in view.prefillers().filter(|&p| p != d) {
                    let split = Plan::Split {
                        prefill: p,
                        decode: d,
                    };
                    assert!(cost <= view.cost(split).total_s());
                }
            }
            chosen
        }
    }
    proptest!(ProptestConfig::with_cases(64), |(
        roles in prop::collection::vec(prop::sample::select(Role::ALL.to_vec()), 2..7),
        loads in prop::collection::vec((0u64..200, 0u64..100_000), 7),
        prompt in 16u32..40_000,
        slow_link in any::<bool>(),
    )| {
        prop_assume!(roles.iter().any(|r| r.decodes()));
        let topology = Topology::new(if slow_link { 1e9 } else { 50e9 });
        let config = PdConfig::default().with_topology(topology);
        let router = PdRouter::with_decider(&roles, config, Check).expect("router");
        for (w, (running, prefill)) in loads.iter().enumerate().take(roles.len()) {
            busy(&router, w as u32, *running, *prefill);
        }
        let prompt = tokens(prompt, 5);
        let pair = router.route_pair(&RouteRequest::new(&prompt)).expect("route");
        let d = pair.decode().worker().index();
        prop_assert!(roles[d].decodes());
        if let Some(p) = pair.prefill() {
            prop_assert!(roles[p.worker().index()] != Role::Decode);
            let idle_decoder = loads[d].0 == 0;
            if prompt.len() <= 1_024 && idle_decoder {
                let own_prefill = prompt.len() as f64 / 33_000.0;
                prop_assert!(pair.cost().transfer_s <= own_prefill, "{:?}", pair.cost());
            }
        }
    });
}

/// Splits every request to the first decoder, and keeps the harm of an aggregated plan on
/// each decoder, in candidate order.
struct SplitToFirst(std::sync::Arc<std::sync::Mutex<Vec<f64>>>);

impl Decide for SplitToFirst {
    fn name(&self) -> &'static str {
        "split-to-first"
    }
    fn decide(&self, _: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        let decoders: Vec<usize> = view.decoders().collect();
        *self.0.lock().expect("lock") = decoders
            .iter()
            .map(|&d| view.cost(Plan::Aggregated { decode: d }).harm_s)
            .collect();
        let prefill = view.prefillers().next().expect("a prefill worker");
        Plan::Split {
            prefill,
            decode: decoders[0],
        }
    }
}

/// A prefill on a decode worker delays the first token of each request whose KV is on its
/// way there by the prefill's whole compute: the aggregated plan pays it as harm until the
/// handoff (or the request's end) comes, and no longer.
#[test]
fn a_prefill_where_kv_is_arriving_pays_for_the_wait_it_causes() {
    let roles = [Role::Prefill, Role::Decode, Role::Decode];
    let seen = std::sync::Arc::default();
    let decider = SplitToFirst(std::sync::Arc::clone(&seen));
    let router = PdRouter::with_decider(&roles, PdConfig::default(), decider).expect("router");
    let first = tokens(2_048, 7);
    let family = std::cell::Cell::new(8);
    // The harm of prefilling a new prompt of 3,300 tokens on worker 1 over that on worker 2
    // (equal loads).
    let extra = || {
        family.set(family.get() + 1);
        let prompt = tokens(3_300, family.get());
        let pair = router
            .route_pair(&RouteRequest::new(&prompt))
            .expect("route");
        let harm = seen.lock().expect("lock").clone();
        router.prefill_done(&pair);
        router.complete(&pair);
        harm[0] - harm[1]
    };
    assert!(extra().abs() < 1e-9, "nothing arriving");
    let on_the_way = router
        .route_pair(&RouteRequest::new(&first))
        .expect("route");
    assert_eq!(on_the_way.decode().worker(), WorkerId::new(1));
    let whole = 3_300.0 / 33_000.0;
    assert!(
        (extra() - whole).abs() < 1e-9,
        "one request arriving at worker 1"
    );
    router.prefill_done(&on_the_way);
    assert!(extra().abs() < 1e-9, "handed off");
    router.complete(&on_the_way);
    let dropped = router
        .route_pair(&RouteRequest::new(&first))
        .expect("route");
    router.complete(&dropped);
    assert!(extra().abs() < 1e-9, "dropped before its handoff");
}

/// A split request's decode leg joins its worker's queue at the handoff, so its timing
/// measures no prediction: it teaches the router nothing, where the same timing of a
/// prefill leg does.
#[test]
fn a_split_decode_legs_timing_teaches_nothing() {
    let roles = [Role::Prefill, Role::Decode, Role::Decode];
    let taught = PdRouter::with_decider(&roles, PdConfig::default(), AlwaysSplit).expect("router");
    let told = PdRouter::with_decider(&roles, PdConfig::default(), AlwaysSplit).expect("router");
    for i in 0..40 {
        let prompt = tokens(1_024, 100 + i);
        let a = taught
            .route_pair(&RouteRequest::new(&prompt))
            .expect("route");
        let b = told.route_pair(&RouteRequest::new(&prompt)).expect("route");
        assert!(a.is_split() && b.is_split());
        for (router, pair) in [(&taught, &a), (&told, &b)] {
            router.prefill_done(pair);
        }
        taught.first_token_after(&a, Duration::from_secs(30));
        told.first_token(&b);
        for (router, pair) in [(&taught, &a), (&told, &b)] {
            router.complete(pair);
        }
    }
    for w in 0..3 {
        let id = WorkerId::new(w);
        let (a, b) = (taught.router().load(id), told.router().load(id));
        assert_eq!(a, b, "worker {w}");
    }
}

/// Asserts that the cheapest plan is the first plan of least total cost in `plans()`'
/// order, as costing every plan finds it, for each kind of plan allowed; decides by cost.
struct Exact;

impl Decide for Exact {
    fn name(&self) -> &'static str {
        "exact"
    }
    fn decide(&self, request: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        for (aggregate, split) in [(true, true), (true, false), (false, true)] {
            let brute = view
                .plans()
                .filter(|p| match p {
                    Plan::Aggregated { .. } => aggregate,
                    Plan::Split { .. } => split,
                })
                .map(|p| (p, view.cost(p)))
                .min_by(|a, b| a.1.total_s().total_cmp(&b.1.total_s()));
            assert_eq!(
                view.cheapest(aggregate, split),
                brute,
                "{aggregate} {split}"
            );
        }
        ByCost.decide(request, view)
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// The cheapest plan is found without costing every pair, and is the one costing every
    /// pair finds (ties to the first): on fleets of every role, with loads, cached
    /// prefixes, requests on their way and a topology of two levels.
    #[test]
    fn the_cheapest_plan_is_exact(
        roles in prop::collection::vec(prop::sample::select(Role::ALL.to_vec()), 2..12),
        loads in prop::collection::vec((0u64..4, 0u64..3, 0u64..3), 12),
        labels in prop::collection::vec((0u8..3, 0u8..2), 12),
        cached in prop::collection::vec(0usize..5, 12),
        on_the_way in 0usize..4,
    ) {
        prop_assume!(roles.iter().any(|r| r.decodes()));
        let mut topology = Topology::new(10e9)
            .with_level("node", 400e9)
            .expect("level")
            .with_level("rack", 100e9)
            .expect("level");
        for (w, (node, rack)) in labels.iter().enumerate().take(roles.len()) {
            let (node, rack) = (format!("n{node}{rack}"), format!("r{rack}"));
            topology
                .place(WorkerId::new(w as u32), &[("node", &node), ("rack", &rack)])
                .expect("place");
        }
        let config = PdConfig::default().with_topology(topology);
        let router = PdRouter::with_decider(&roles, config, Exact).expect("router");
        let prompt = tokens(8_192, 11);
        for (w, &(running, prefill, share)) in loads.iter().enumerate().take(roles.len()) {
            busy(&router, w as u32, running * 8, prefill * 2_048);
            let held = &prompt[..2_048 * cached[w].min(4)];
            if share > 0 && !held.is_empty() {
                router
                    .router()
                    .replace_worker_cache(WorkerId::new(w as u32), &[held])
                    .expect("snapshot");
            }
        }
        let mut pending = Vec::new();
        for i in 0..on_the_way {
            let other = tokens(4_096, 20 + i as u32);
            pending.push(router.route_pair(&RouteRequest::new(&other)).expect("route"));
        }
        let pair = router.route_pair(&RouteRequest::new(&prompt)).expect("route");
        router.complete(&pair);
        for p in &pending {
            router.complete(p);
        }
    }
}

/// A pair router whose load model spreads a queued prefill over 8 output tokens of the
/// decodes running beside it (the default 256 would hide a 2,048-token prefill), held to
/// `limit` by default.
fn short_outputs(limit: Option<f64>) -> PdConfig {
    let mut config = PdConfig::default().with_decode_step_limit_s(limit);
    config.balanced.load.default_output_tokens = 8;
    config
}

/// A default TPOT target prices out an aggregated plan whose prefill would stretch the
/// running decodes' time per output token past it (2,048 tokens over 8 output tokens: about
/// 16 ms against 8 ms): a prompt a decode worker would take itself goes split once decodes
/// run there, and a worker with no decodes running may still prefill.
#[test]
fn a_decode_step_limit_keeps_long_prefills_off_decoding_workers() {
    let roles = [Role::Prefill, Role::Decode];
    let prompt = tokens(4_096, 12);
    let request = RouteRequest::new(&prompt).with_expected_output(16);
    let plan_of = |limit: Option<f64>, running: u64| {
        let config = short_outputs(limit);
        let router = PdRouter::new(&roles, config).expect("router");
        busy(&router, 1, running, 0);
        // The decode worker holds most of the prompt: prefilling there is cheap.
        router
            .router()
            .replace_worker_cache(WorkerId::new(1), &[&prompt[..2_048]])
            .expect("snapshot");
        let pair = router.route_pair(&request).expect("route");
        router.complete(&pair);
        (pair.is_split(), pair.cost())
    };
    let (split, cost) = plan_of(None, 4);
    assert!(
        !split,
        "cheaper to prefill 2,048 tokens beside 4 decodes: {cost:?}"
    );
    let (split, cost) = plan_of(Some(0.012), 4);
    assert!(
        split,
        "2,048 tokens stretch the decodes to about 16 ms: {cost:?}"
    );
    let (split, cost) = plan_of(Some(0.012), 0);
    assert!(!split, "no decode to stall: {cost:?}");
}

/// The time-per-output-token targets of the requests decoding on a worker bind a prefill
/// there, as a request's own does: with no default target, a prompt the decode worker would
/// prefill itself goes split while a request held to 12 ms decodes there, and aggregated
/// again once that request completes.
#[test]
fn the_targets_of_the_requests_decoding_there_bind_a_prefill() {
    let roles = [Role::Prefill, Role::Decode];
    let held = tokens(2_048, 12);
    // Prompts sharing the held 2,048 tokens, each with its own 2,048 more.
    let prompt = |seed: u32| [&held[..], &tokens(2_048, seed)].concat();
    let router = PdRouter::new(&roles, short_outputs(None)).expect("router");
    busy(&router, 1, 4, 0);
    router
        .router()
        .replace_worker_cache(WorkerId::new(1), &[&held])
        .expect("snapshot");
    let route = |tokens: &[u32], target: Option<u64>| {
        let mut request = RouteRequest::new(tokens).with_expected_output(16);
        if let Some(ms) = target {
            request = request
                .with_tpot_target(Duration::from_millis(ms))
                .with_priority(Priority::Critical);
        }
        router.route_pair(&request).expect("route")
    };
    let before = route(&prompt(20), None);
    router.complete(&before);
    assert!(!before.is_split(), "no target binds: {:?}", before.cost());
    let running = route(&tokens(64, 13), Some(12));
    assert_eq!(running.decode().worker(), WorkerId::new(1));
    let during = route(&prompt(21), None);
    router.complete(&during);
    assert!(
        during.is_split(),
        "the running request's 12 ms binds: {:?}",
        during.cost()
    );
    router.complete(&running);
    let after = route(&prompt(22), None);
    router.complete(&after);
    assert!(
        !after.is_split(),
        "completed, it binds no more: {:?}",
        after.cost()
    );
    let own = route(&prompt(23), Some(12));
    router.complete(&own);
    assert!(
        own.is_split(),
        "the request's own 12 ms binds: {:?}",
        own.cost()
    );
}

/// A decider that answers the plan it was built with.
struct Fixed(Plan);

impl Decide for Fixed {
    fn name(&self) -> &'static str {
        "fixed"
    }
    fn decide(&self, _: &RouteRequest<'_>, _: &PairView<'_>) -> Plan {
        self.0
    }
}

/// Admission by plans: when the decider's plan is predicted to miss the target but another
/// meets it, that one runs; when none does the request is refused with `Error::Shed` (bound
/// by the queue, counted in the fleet's signals) and nothing is charged; a critical request
/// is never refused.
#[test]
fn admission_runs_a_plan_that_meets_the_target_or_refuses() {
    let roles = [Role::Prefill, Role::Decode, Role::Decode];
    let target = Duration::from_secs(1);
    let prompt = tokens(3_300, 9);
    let asking = RouteRequest::new(&prompt).with_ttft_target(target);
    // The decider insists on prefilling on worker 1, ten seconds of prefill behind.
    let stubborn = Fixed(Plan::Aggregated { decode: 1 });
    let router = PdRouter::with_decider(&roles, PdConfig::default(), stubborn).expect("router");
    busy(&router, 1, 0, 330_000);
    let pair = router.route_pair(&asking).expect("admitted elsewhere");
    assert_eq!(pair.decode().worker(), WorkerId::new(2));
    assert!(pair.cost().ttft_s <= 1.0, "{:?}", pair.cost());
    router.prefill_done(&pair);
    router.complete(&pair);
    // Both decode workers ten seconds behind: every plan waits there for its first token.
    busy(&router, 2, 0, 330_000);
    let shed = match router.route_pair(&asking) {
        Err(Error::Shed(shed)) => shed,
        other => panic!(
            "every plan misses the target: {:?}",
            other.map(|p| p.cost())
        ),
    };
    assert_eq!(shed.limit, prefix_router::Limit::Queue);
    assert!(shed.best_ttft > Duration::from_secs(9), "{shed:?}");
    assert_eq!(
        router
            .router()
            .fleet_signals()
            .shed_by_limit
            .iter()
            .sum::<u64>(),
        1
    );
    for w in 0..3 {
        let load = router.router().load(WorkerId::new(w)).expect("load");
        assert_eq!(
            load.in_flight, 0,
            "worker {w} charged for a refused request"
        );
    }
    let critical = asking.with_priority(prefix_router::Priority::Critical);
    let pair = router
        .route_pair(&critical)
        .expect("a critical request is never refused");
    assert_eq!(
        pair.decode().worker(),
        WorkerId::new(1),
        "the decider's plan"
    );
    router.complete(&pair);
}

/// The receipt lists every plan the roles allow with its predicted cost, marks the one
/// that ran (the cheapest, for the cost decider) and says when admission overrode the
/// decider.
#[test]
fn the_receipt_explains_the_plan() {
    let roles = [Role::Prefill, Role::Decode, Role::Decode, Role::Both];
    let router = PdRouter::new(&roles, PdConfig::default()).expect("router");
    busy(&router, 1, 64, 0);
    let prompt = tokens(16_384, 10);
    let (pair, receipt) = router
        .route_pair_with_receipt(&RouteRequest::new(&prompt))
        .expect("route");
    // Three decode-capable workers, each aggregated and split with the other prefillers.
    assert_eq!(receipt.plans.len(), 3 + 2 + 2 + 1, "{receipt}");
    assert_eq!(receipt.decider, "cost");
    assert_eq!(receipt.decided, receipt.chosen);
    let chosen = receipt.chosen_line().expect("a chosen line");
    assert_eq!(chosen.decode, pair.decode().worker());
    assert_eq!(chosen.prefill, pair.prefill().map(|p| p.worker()));
    assert_eq!(chosen.cost, pair.cost());
    let least = receipt
        .plans
        .iter()
        .map(|l| l.cost.total_s())
        .fold(f64::MAX, f64::min);
    assert!((chosen.cost.total_s() - least).abs() < 1e-12);
    let line = receipt.to_string();
    assert!(line.starts_with("cost ran w"), "{line}");
    assert_eq!(line.matches("[*").count(), 1, "{line}");
    router.complete(&pair);

    let stubborn = Fixed(Plan::Aggregated { decode: 1 });
    let router =
        PdRouter::with_decider(&roles[..3], PdConfig::default(), stubborn).expect("router");
    busy(&router, 1, 0, 330_000);
    let asking = RouteRequest::new(&prompt).with_ttft_target(Duration::from_secs(2));
    let (pair, receipt) = router.route_pair_with_receipt(&asking).expect("admitted");
    assert_ne!(receipt.decided, receipt.chosen);
    assert!(
        receipt.to_string().contains("(admission; decided w1)"),
        "{receipt}"
    );
    router.complete(&pair);
}

/// Bad input is a clear error: a fleet with no worker that decodes, a prefill-only worker
/// as the decode side, a worker paired with itself, an unknown topology level.
#[test]
fn bad_input_is_an_error() {
    assert!(matches!(
        PdRouter::new(&[Role::Prefill, Role::Prefill], PdConfig::default()),
        Err(Error::InvalidConfig { .. })
    ));
    let roles = [Role::Prefill, Role::Decode, Role::Both];
    let prompt = tokens(1_024, 6);
    let request = RouteRequest::new(&prompt);
    for plan in [
        Plan::Aggregated { decode: 0 },
        Plan::Split {
            prefill: 1,
            decode: 2,
        },
        Plan::Split {
            prefill: 2,
            decode: 2,
        },
    ] {
        let router =
            PdRouter::with_decider(&roles, PdConfig::default(), Fixed(plan)).expect("router");
        let err = router.route_pair(&request).expect_err("refused");
        assert!(matches!(err, Error::WrongRole { .. }), "{plan:?}: {err}");
        // Nothing was charged.
        for w in 0..3 {
            let load = router.router().load(WorkerId::new(w)).expect("load");
            assert_eq!(load.in_flight, 0);
        }
    }
    let router = PdRouter::with_decider(
        &roles,
        PdConfig::default(),
        Fixed(Plan::Aggregated { decode: 9 }),
    )
    .expect("router");
    assert!(matches!(
        router.route_pair(&request),
        Err(Error::InvalidChoice { .. })
    ));
    let mut topology = Topology::new(10e9)
        .with_level("node", 400e9)
        .expect("level");
    assert!(topology.place(WorkerId::new(0), &[("rack", "r1")]).is_err());
    assert!(Topology::new(10e9).with_level("node", 0.0).is_err());
    assert!(
        PdConfig::default()
            .with_topology(Topology::new(-1.0))
            .topology
            .validate()
            .is_err()
    );
    assert!(Role::parse("prefiller").is_err());
    for config in [
        PdConfig::default().with_stall_weight(-1.0),
        PdConfig::default().with_stall_weight(f64::NAN),
        PdConfig::default().with_decode_step_limit_s(Some(0.0)),
        PdConfig::default().with_decode_step_limit_s(Some(f64::NAN)),
        PdConfig::default().with_kv_bytes_per_token(0),
        PdConfig::default().with_topology(Topology::new(0.0)),
    ] {
        assert!(matches!(
            PdRouter::new(&roles, config),
            Err(Error::InvalidConfig { .. })
        ));
    }
}

/// The transfer runs at the bandwidth of the innermost domain the pair shares: a prefill
/// worker on the decode worker's node is preferred when moving KV matters.
#[test]
fn a_pair_in_one_domain_is_preferred() {
    let mut topology = Topology::new(1e9).with_level("node", 400e9).expect("level");
    for (w, node) in [(0, "a"), (1, "b"), (2, "b")] {
        topology
            .place(WorkerId::new(w), &[("node", node)])
            .expect("place");
    }
    let roles = [Role::Prefill, Role::Prefill, Role::Decode];
    let config = PdConfig::default().with_topology(topology);
    let router = PdRouter::with_decider(&roles, config, AlwaysSplit).expect("router");
    let prompt = tokens(16_384, 7);
    let pair = router
        .route_pair(&RouteRequest::new(&prompt))
        .expect("route");
    assert_eq!(pair.prefill().map(|d| d.worker()), Some(WorkerId::new(1)));
}

/// The fixed deciders: never split keeps the prefill on the decode worker, always split
/// moves it even where it is cached.
#[test]
fn never_and_always_do_as_named() {
    let roles = [Role::Both, Role::Decode, Role::Prefill];
    let prompt = tokens(2_048, 8);
    let request = RouteRequest::new(&prompt);
    let never = PdRouter::with_decider(&roles, PdConfig::default(), NeverSplit).expect("router");
    assert_eq!(never.decider_name(), "never");
    for _ in 0..4 {
        let pair = never.route_pair(&request).expect("route");
        assert!(!pair.is_split());
        assert_ne!(pair.decode().worker(), WorkerId::new(2));
    }
    let always = PdRouter::with_decider(&roles, PdConfig::default(), AlwaysSplit).expect("router");
    for _ in 0..4 {
        assert!(always.route_pair(&request).expect("route").is_split());
    }
}
