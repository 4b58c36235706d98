//! The simulator on a disaggregated fleet (`Simulation::run_pd`): hand-computed timings of
//! a split request, the aggregated path against a plain run, the decode worker's true cache
//! after a handoff, bytes moved, fleet specs, and a naive model of one prefill and one
//! decode worker.

#![cfg(feature = "sim")]
#![allow(clippy::unwrap_used)]

use std::cmp::Reverse;
use std::collections::HashSet;

use prefix_router::sim::*;
use prefix_router::*;
use proptest::prelude::*;

const KV: u64 = 131_072;
const BANDWIDTH: f64 = 50e9;

/// A batched fleet of 16-token blocks with default step and transfer figures.
fn config() -> ClusterConfig {
    ClusterConfig::default()
        .with_engine(Engine::Batched)
        .with_block_size(16)
        .with_measure_decision_time(false)
}

/// A router over `fleet`'s roles deciding with `decider`.
fn router(fleet: &[WorkerSpec], decider: Box<dyn Decide>) -> PdRouter<Box<dyn Decide>> {
    router_of_blocks(fleet, decider, 16)
}

/// [`router`] hashing blocks of `block_size` tokens.
fn router_of_blocks(
    fleet: &[WorkerSpec],
    decider: Box<dyn Decide>,
    block_size: usize,
) -> PdRouter<Box<dyn Decide>> {
    let roles: Vec<Role> = fleet.iter().map(|w| w.role).collect();
    let mut balanced = BalancedConfig::default();
    balanced.index = balanced.index.with_block_size(block_size);
    let config = PdConfig::default().with_balanced(balanced);
    PdRouter::with_decider(&roles, config, decider).unwrap()
}

fn run_pd(
    requests: Vec<Request>,
    config: ClusterConfig,
    spec: &str,
    decider: Box<dyn Decide>,
) -> SimReport {
    let fleet = WorkerSpec::parse_fleet(spec, 1 << 20).unwrap();
    let router = router_of_blocks(&fleet, decider, config.block_size);
    let sim = Simulation::with_fleet(requests, config, fleet).unwrap();
    sim.run_pd(&router).unwrap()
}

/// A decode step's time with the default step model: one decode attending to `context`.
fn decode_step(context: usize) -> f64 {
    let m = StepModel::default();
    m.step_base_s + m.step_s_per_decode + context as f64 * m.step_s_per_context_token
}

/// A prefill step's time with the default step model: `tokens` prompt tokens, no decodes.
fn prefill_step(tokens: usize) -> f64 {
    StepModel::default().step_base_s + tokens as f64 / 33_000.0
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() < 1e-9
}

/// One 4,000-token request split on an idle fleet: its first token comes after its prefill
/// step on the prefill worker, the move of all its KV (the decode worker holds none), and
/// one decode step on the decode worker; its later tokens one decode step each.
#[test]
fn a_split_request_waits_for_its_prefill_its_transfer_and_one_decode_step() {
    let request = Request::new(0.0, (0..4_000).collect(), 3);
    let r = run_pd(vec![request], config(), "1xP,1xD", Box::new(AlwaysSplit));
    let bytes = 4_000 * KV;
    let ttft = prefill_step(4_000) + bytes as f64 / BANDWIDTH + decode_step(4_000);
    let e2e = ttft + decode_step(4_001) + decode_step(4_002);
    let x = &r.request_records[0];
    assert!(close(x.ttft_s.unwrap(), ttft), "{:?} vs {ttft}", x.ttft_s);
    assert!(close(x.e2e_s.unwrap(), e2e), "{:?} vs {e2e}", x.e2e_s);
    assert!(close(x.tpot_s.unwrap(), (e2e - ttft) / 2.0));
    assert_eq!((x.worker, x.prefill_worker), (1, Some(0)));
    assert_eq!(
        (x.transfer_bytes, r.transfer_bytes, r.transfers),
        (bytes, bytes, 1)
    );
    assert_eq!(
        r.worker_prefill_tokens,
        [4_000, 0],
        "the decode leg prefills nothing"
    );
    assert_eq!(r.pd_decider.as_deref(), Some("always"));
    let json: serde_json::Value = serde_json::from_str(&r.to_json()).unwrap();
    assert_eq!(json["transfers"], 1);
    assert_eq!(json["transfer_bytes"], bytes);
    assert_eq!(json["pd_decider"], "always");
    let record: serde_json::Value = serde_json::from_str(&x.to_json()).unwrap();
    assert_eq!(record["prefill_worker"], 0);
    assert_eq!(record["transfer_bytes"], bytes);
}

/// The same request aggregated: prefilled and decoded on one worker, nothing moved.
#[test]
fn an_aggregated_request_prefills_where_it_decodes() {
    let request = Request::new(0.0, (0..4_000).collect(), 1);
    let r = run_pd(vec![request], config(), "1xP,1xD", Box::new(NeverSplit));
    assert!(close(r.ttft_p50_s, prefill_step(4_000)), "{}", r.ttft_p50_s);
    assert_eq!((r.transfers, r.transfer_bytes), (0, 0));
    assert_eq!(r.worker_prefill_tokens, [0, 4_000]);
    assert_eq!(r.request_records[0].prefill_worker, None);
}

/// Picks the candidate holding most, then with fewest requests, then of lowest id.
fn most_cached_then_fewest(candidates: &[Candidate]) -> usize {
    (0..candidates.len())
        .min_by_key(|&i| {
            let c = &candidates[i];
            (Reverse(c.cached_tokens()), c.requests(), c.worker())
        })
        .unwrap()
}

/// [`most_cached_then_fewest`] as a plain router's policy.
struct Rule;

impl Policy for Rule {
    fn name(&self) -> &'static str {
        "rule"
    }
    fn reads_cache(&self) -> bool {
        true
    }
    fn select(&self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        most_cached_then_fewest(candidates)
    }
}

/// [`most_cached_then_fewest`] as a decider, always aggregated.
struct RuleAggregated;

impl Decide for RuleAggregated {
    fn name(&self) -> &'static str {
        "rule"
    }
    fn decide(&self, _: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        Plan::Aggregated {
            decode: most_cached_then_fewest(view.candidates()),
        }
    }
}

/// On workers that prefill and decode, a decider that never splits runs every request as
/// a plain run does when both choose by the same rule: the same report, record for record,
/// with each sync mode. (`NeverSplit` against a `BalancedRouter` is not compared: they
/// choose by different costs, see the single-worker case below.)
#[test]
fn aggregated_plans_run_as_a_plain_run_does() {
    let requests = Workload::builtin()[1].1.generate(3); // conversations
    for sync in [SyncMode::None, SyncMode::Feedback, SyncMode::Events] {
        let c = config().with_sync(sync).with_speedup(4.0);
        let fleet = vec![WorkerSpec::new(1.0, 60_000); 4];
        let sim = Simulation::with_fleet(requests.clone(), c, fleet.clone()).unwrap();
        let b = BalancedConfig::default();
        let plain = PolicyRouter::with_policy_and_load(4, Rule, b.index, b.load).unwrap();
        let plain = sim.run(&plain).unwrap();
        let mut pd = sim
            .run_pd(&router(&fleet, Box::new(RuleAggregated)))
            .unwrap();
        assert_eq!(pd.pd_decider.take().as_deref(), Some("rule"));
        assert_eq!(pd.policy, "balanced", "the inner router's name");
        pd.policy.clone_from(&plain.policy);
        assert!(plain.requests > 100 && plain.cached_tokens > 0);
        assert_eq!(pd, plain, "{sync:?}");
    }
}

/// With one worker there is one choice: `NeverSplit` runs exactly as a `BalancedRouter`.
#[test]
fn never_split_on_one_worker_runs_as_a_balanced_router() {
    let requests = Workload::builtin()[1].1.generate(5);
    let c = config().with_sync(SyncMode::Events).with_speedup(8.0);
    let fleet = vec![WorkerSpec::new(1.0, 200_000)];
    let sim = Simulation::with_fleet(requests, c, fleet.clone()).unwrap();
    let plain = sim.run(&BalancedRouter::new(1).unwrap()).unwrap();
    let mut pd = sim.run_pd(&router(&fleet, Box::new(NeverSplit))).unwrap();
    assert!(plain.requests > 100 && plain.cached_tokens > 0);
    assert_eq!(pd.pd_decider.take().as_deref(), Some("never"));
    assert_eq!(pd, plain);
}

/// Splits a request no decode worker is believed to hold any of; else aggregates it on the
/// decode worker holding most.
struct SplitNew;

impl Decide for SplitNew {
    fn name(&self) -> &'static str {
        "split_new"
    }
    fn decide(&self, _: &RouteRequest<'_>, view: &PairView<'_>) -> Plan {
        let decode = view
            .decoders()
            .max_by_key(|&d| (view.candidates()[d].cached_tokens(), Reverse(d)))
            .unwrap();
        match view.prefillers().find(|&p| p != decode) {
            Some(prefill) if view.candidates()[decode].cached_tokens() == 0 => {
                Plan::Split { prefill, decode }
            }
            _ => Plan::Aggregated { decode },
        }
    }
}

/// Two turns of one conversation: the first split, the second finds the first's prompt in
/// the decode worker's pool (its true cache, the blocks loaded at the handoff): aggregated
/// there it prefills only its new tokens; split again, only those move.
#[test]
fn a_second_turn_finds_the_first_turns_prompt_on_the_decode_worker() {
    let first: Vec<u32> = (0..4_000).collect();
    let second: Vec<u32> = (0..5_000).collect();
    let turns = vec![
        Request::new(0.0, first, 4).with_session("s"),
        Request::new(10.0, second, 4).with_session("s"),
    ];
    for sync in [SyncMode::None, SyncMode::Feedback, SyncMode::Events] {
        let c = config().with_sync(sync);
        let r = run_pd(turns.clone(), c, "1xP,1xD", Box::new(SplitNew));
        let (one, two) = (&r.request_records[0], &r.request_records[1]);
        assert_eq!(one.prefill_worker, Some(0), "{sync:?}");
        assert_eq!((two.worker, two.prefill_worker), (1, None), "{sync:?}");
        assert_eq!(two.cached_tokens, 4_000, "{sync:?}");
        assert_eq!(r.worker_prefill_tokens, [4_000, 1_000], "{sync:?}");
        let r = run_pd(turns.clone(), c, "1xP,1xD", Box::new(AlwaysSplit));
        let two = &r.request_records[1];
        assert_eq!(two.prefill_worker, Some(0));
        assert_eq!(
            two.transfer_bytes,
            1_000 * KV,
            "only what the decode pool lacks"
        );
        assert_eq!(two.cached_tokens, 4_000, "the prefill worker's own hit");
        assert_eq!(r.worker_prefill_tokens, [5_000, 0]);
    }
}

/// Over a whole workload, split or not by cost: the records' bytes add up to the report's,
/// each split moves whole tokens of KV, never more than its prompt, and a request that did
/// not split moved nothing; every request finished.
#[test]
fn bytes_moved_add_up() {
    let requests = Workload::builtin()[1].1.generate(11);
    for (spec, decider) in [
        ("2xP,2xD", Box::new(AlwaysSplit) as Box<dyn Decide>),
        ("1xP,1xD,2x1.0", Box::new(ByCost)),
        ("1xP0.5@200000,3xD", Box::new(ByCost)),
    ] {
        let c = config().with_speedup(4.0).with_sync(SyncMode::Events);
        let r = run_pd(requests.clone(), c, spec, decider);
        let records = &r.request_records;
        assert!(records.iter().all(|x| x.e2e_s.is_some() && !x.rejected));
        let split: Vec<_> = records
            .iter()
            .filter(|x| x.prefill_worker.is_some())
            .collect();
        assert_eq!(split.len(), r.transfers, "{spec}");
        assert!(r.transfers > 0, "{spec}: nothing split");
        let sum: u64 = records.iter().map(|x| x.transfer_bytes).sum();
        assert_eq!(sum, r.transfer_bytes, "{spec}");
        for x in &split {
            assert_eq!(x.transfer_bytes % KV, 0);
            assert!(x.transfer_bytes >= KV && x.transfer_bytes <= x.prompt_tokens as u64 * KV);
            assert_ne!(x.prefill_worker, Some(x.worker));
        }
        assert!(
            records
                .iter()
                .all(|x| x.prefill_worker.is_some() || x.transfer_bytes == 0)
        );
        let cached: usize = records.iter().map(|x| x.cached_tokens).sum();
        assert_eq!(cached as u64, r.cached_tokens);
    }
}

#[test]
fn fleets_with_roles_parse_and_bad_specs_are_errors() {
    let fleet = WorkerSpec::parse_fleet("2xP,1xD, 1xP0.5@100000,1x2.0,1x1.0@64", 32).unwrap();
    let p = Role::Prefill;
    assert_eq!(
        fleet,
        [
            WorkerSpec::new(1.0, 32).with_role(p),
            WorkerSpec::new(1.0, 32).with_role(p),
            WorkerSpec::new(1.0, 32).with_role(Role::Decode),
            WorkerSpec::new(0.5, 100_000).with_role(p),
            WorkerSpec::new(2.0, 32),
            WorkerSpec::new(1.0, 64),
        ]
    );
    assert_eq!(fleet[4].role, Role::Both);
    for bad in [
        "2xQ", "2xp", "2xPD", "2xP-1", "2xP0", "2xPnan", "2xPinf", "0xP", "2x", "2xP@", "2xP@x",
        "xP", "P", "2xP,", "2xD1.0.0",
    ] {
        let err = WorkerSpec::parse_fleet(bad, 64).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{bad:?}");
        assert!(err.to_string().contains("COUNTx"), "{bad:?}: {err}");
    }
}

/// Admission in a disaggregated run: a burst beyond what one prefill and one decode worker
/// can serve within the target is partly refused; every request is either shed or
/// finished, the shed ones never routed, and the finished ones by far within the target.
#[test]
fn admission_sheds_what_no_plan_serves_in_time() {
    let requests: Vec<Request> = (0..40)
        .map(|i| Request::new(0.0, (0..16_384).map(|t| i * 100_000 + t).collect(), 8))
        .collect();
    let c = config().with_admission(true).with_ttft_target_s(1.0);
    let report = run_pd(requests, c, "1xP,1xD", Box::new(ByCost));
    assert!(
        report.shed > 0,
        "a burst of 40 prefills of half a second each"
    );
    assert!(report.shed < 40, "the first requests fit");
    let records = &report.request_records;
    for r in records {
        assert!(
            r.shed != r.e2e_s.is_some(),
            "request {} shed or finished",
            r.index
        );
        if r.shed {
            assert!(r.ttft_s.is_none() && r.transfer_bytes == 0, "{r:?}");
        }
    }
    let served: Vec<f64> = records.iter().filter_map(|r| r.ttft_s).collect();
    let worst = served.iter().copied().fold(0.0, f64::max);
    assert!(
        worst < 2.0,
        "served within twice the target, at worst {worst} s"
    );
}

#[test]
fn bad_transfer_settings_and_bad_pairings_are_errors() {
    let requests = vec![Request::new(0.0, (0..64).collect(), 2)];
    let invalid = |c: ClusterConfig| {
        let sim = Simulation::new(requests.clone(), c);
        matches!(sim, Err(Error::InvalidConfig { .. }))
    };
    assert!(invalid(config().with_kv_bytes_per_token(0)));
    for bw in [0.0, -1.0, f64::NAN, f64::INFINITY] {
        assert!(invalid(config().with_kv_transfer_bytes_per_s(bw)), "{bw}");
    }
    let fleet = WorkerSpec::parse_fleet("1xP,1xD", 1 << 20).unwrap();
    let pd = router(&fleet, Box::new(AlwaysSplit));
    let refused = |c: ClusterConfig, fleet: Vec<WorkerSpec>| {
        let sim = Simulation::with_fleet(requests.clone(), c, fleet).unwrap();
        matches!(sim.run_pd(&pd), Err(Error::InvalidConfig { .. }))
    };
    assert!(refused(config().with_engine(Engine::Simple), fleet.clone()));
    let swapped = WorkerSpec::parse_fleet("1xD,1xP", 1 << 20).unwrap();
    assert!(refused(config(), swapped), "roles not the router's");
    let more = WorkerSpec::parse_fleet("1xP,1xD,1x1.0", 1 << 20).unwrap();
    assert!(refused(config(), more), "a worker the router does not know");
    let sim = Simulation::with_fleet(requests.clone(), config(), fleet.clone()).unwrap();
    let faulty = sim.with_faults(vec![Fault::new(0, 1.0, 2.0)]).unwrap();
    assert!(matches!(
        faulty.run_pd(&pd),
        Err(Error::InvalidConfig { .. })
    ));
    let sim = Simulation::with_fleet(requests.clone(), config(), fleet).unwrap();
    let plain = sim.run(&BalancedRouter::new(2).unwrap());
    assert!(
        matches!(plain, Err(Error::InvalidConfig { .. })),
        "roles need run_pd"
    );
    assert!(sim.run_pd(&pd).is_ok());
}

/// The naive model of one prefill and one decode worker with room for everything, each
/// request arriving after the last finished: every prompt's full blocks are cached on both
/// once it ran; a request's prefill step computes what the prefill worker lacks, its KV
/// moves what the decode worker lacks (neither counting the last token's block as a hit),
/// and its first decode step attends to its prompt.
struct Naive {
    prefill: HashSet<Vec<u32>>,
    decode: HashSet<Vec<u32>>,
}

impl Naive {
    /// Leading full blocks of `prompt` in `cache`, never covering the last token.
    fn hit(cache: &HashSet<Vec<u32>>, prompt: &[u32], block: usize) -> usize {
        let max = (prompt.len() - 1) / block;
        (1..=max)
            .take_while(|&b| cache.contains(&prompt[..b * block]))
            .count()
            * block
    }

    /// Request `prompt`'s (TTFT, cached tokens, bytes moved).
    fn run(&mut self, prompt: &[u32], block: usize) -> (f64, usize, u64) {
        let (p, d) = (
            Self::hit(&self.prefill, prompt, block),
            Self::hit(&self.decode, prompt, block),
        );
        for b in 1..=prompt.len() / block {
            self.prefill.insert(prompt[..b * block].to_vec());
            self.decode.insert(prompt[..b * block].to_vec());
        }
        let bytes = (prompt.len() - d) as u64 * KV;
        let ttft =
            prefill_step(prompt.len() - p) + bytes as f64 / BANDWIDTH + decode_step(prompt.len());
        (ttft, p, bytes)
    }
}

/// Prompts of 1 to 6 blocks of 4 tokens from an alphabet of 3 blocks (sharing prefixes),
/// some with a partial last block, with 1 to 5 output tokens.
fn prompts() -> impl Strategy<Value = Vec<(Vec<u32>, u32)>> {
    let one = (
        proptest::collection::vec(0u32..3, 1..7),
        any::<bool>(),
        1u32..6,
    );
    proptest::collection::vec(one, 1..25).prop_map(|reqs| {
        reqs.into_iter()
            .map(|(blocks, odd, output)| {
                let mut tokens: Vec<u32> = blocks
                    .iter()
                    .flat_map(|&b| (0..4).map(move |i| b * 10 + i))
                    .collect();
                if odd {
                    tokens.push(99);
                }
                (tokens, output)
            })
            .collect()
    })
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(48))]

    /// Every split request's TTFT, prefill-side hit and bytes moved are the naive model's.
    #[test]
    fn split_requests_one_at_a_time_match_a_naive_model(
        prompts in prompts(),
        sync in prop_oneof![Just(SyncMode::None), Just(SyncMode::Events)],
    ) {
        let requests: Vec<Request> = prompts
            .iter()
            .enumerate()
            .map(|(i, (t, out))| Request::new(i as f64 * 10.0, t.clone(), *out))
            .collect();
        let c = config().with_block_size(4).with_sync(sync);
        let r = run_pd(requests, c, "1xP,1xD", Box::new(AlwaysSplit));
        let mut naive = Naive { prefill: HashSet::new(), decode: HashSet::new() };
        prop_assert_eq!(r.transfers, prompts.len());
        for ((prompt, _), x) in prompts.iter().zip(&r.request_records) {
            let (ttft, cached, bytes) = naive.run(prompt, 4);
            prop_assert!(close(x.ttft_s.unwrap(), ttft), "{:?} vs {}", x.ttft_s, ttft);
            prop_assert_eq!(x.cached_tokens, cached);
            prop_assert_eq!(x.transfer_bytes, bytes);
            prop_assert_eq!(x.prefill_worker, Some(0));
        }
    }
}
