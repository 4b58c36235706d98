//! The simulator: the DESIGN worked examples with exact numbers, determinism, traces.

#![cfg(feature = "sim")]
#![allow(clippy::unwrap_used)]

use prefix_router::sim::*;
use prefix_router::*;

fn config(workers: u32, block_size: usize) -> ClusterConfig {
    let mut c = ClusterConfig::default();
    c.workers = workers;
    c.block_size = block_size;
    c.capacity_tokens = 1 << 20;
    c.measure_decision_time = false;
    c
}

const ENGINES: [Engine; 2] = [Engine::Simple, Engine::Batched];

#[test]
fn shared_system_prompt_is_prefilled_once_instead_of_four_times() {
    for engine in ENGINES {
        shared_system_prompt(engine);
    }
}

fn shared_system_prompt(engine: Engine) {
    let system: Vec<u32> = (0..2_000).map(|i| 1_000 + i).collect();
    let requests: Vec<Request> = (0..4u32)
        .map(|i| {
            let mut p = system.clone();
            p.extend((0..16).map(|j| 500_000 + i * 100 + j));
            Request::new(f64::from(i) * 10.0, p, 10)
        })
        .collect();
    let sim = Simulation::new(requests, config(4, 16).with_engine(engine)).unwrap();
    let rr = sim.run(&RoundRobinRouter::new(4).unwrap()).unwrap();
    assert_eq!(
        rr.prefill_tokens,
        4 * 2_016,
        "round robin prefills the prompt 4 times"
    );
    assert!(rr.worker_prefill_tokens.iter().all(|&t| t == 2_016));
    for router in [
        Box::new(CacheAwareRouter::new(4).unwrap()) as Box<dyn Router>,
        Box::new(BalancedRouter::new(4).unwrap()),
    ] {
        let r = sim.run(router.as_ref()).unwrap();
        assert_eq!(
            r.prefill_tokens,
            2_016 + 3 * 16,
            "{}: once, then suffixes",
            r.policy
        );
        assert_eq!(r.cached_tokens, 3 * 2_000);
    }
    assert!((sim.ideal_hit_ratio() - 6_000.0 / 8_064.0).abs() < 1e-12);
}

#[test]
fn a_three_turn_conversation_prefills_1200_tokens_with_affinity_and_2500_without() {
    for engine in ENGINES {
        three_turns(engine);
    }
}

fn three_turns(engine: Engine) {
    let convo: Vec<u32> = (0..1_200).map(|i| 70_000 + i).collect();
    let requests: Vec<Request> = [500, 800, 1_200]
        .iter()
        .enumerate()
        .map(|(t, &len)| {
            Request::new(t as f64 * 100.0, convo[..len].to_vec(), 20).with_session("c")
        })
        .collect();
    // Block size 1: every token is its own block, so the numbers are exact.
    let sim = Simulation::new(requests, config(4, 1).with_engine(engine)).unwrap();
    let rr = sim.run(&RoundRobinRouter::new(4).unwrap()).unwrap();
    assert_eq!(rr.prefill_tokens, 500 + 800 + 1_200);
    let affinity = sim.run(&AffinityRouter::new(4).unwrap()).unwrap();
    assert_eq!(affinity.prefill_tokens, 500 + 300 + 400);
    let mut balanced = BalancedConfig::default();
    balanced.index.block_size = 1;
    let balanced = sim
        .run(&BalancedRouter::with_config(4, balanced).unwrap())
        .unwrap();
    assert_eq!(balanced.prefill_tokens, 1_200);
}

#[test]
fn the_same_seed_gives_the_same_report() {
    let workload = &Workload::builtin()[4].1; // the mix
    for engine in ENGINES {
        let run = |seed| {
            let c = config(8, 16).with_engine(engine);
            let sim = Simulation::new(workload.generate(seed), c).unwrap();
            let router = BalancedRouter::new(8).unwrap();
            sim.run(&router).unwrap()
        };
        let (a, b) = (run(3), run(3));
        assert_eq!(a, b);
        assert!(a.requests > 1_000 && a.hit_ratio > 0.0 && a.ttft_p99_s >= a.ttft_p50_s);
        assert!(a.e2e_p99_s >= a.ttft_p99_s && a.goodput > 0.0 && a.goodput <= 1.0);
        assert_ne!(run(4), a);
    }
}

#[test]
fn feedback_mode_reports_true_cache_hits_to_the_router() {
    for engine in ENGINES {
        feedback_mode(engine);
    }
}

fn feedback_mode(engine: Engine) {
    let workload = &Workload::builtin()[0].1;
    let mut c = config(4, 16).with_engine(engine);
    c.capacity_tokens = 20_000; // small caches: the optimistic mirror is often wrong
    c.sync = SyncMode::Feedback;
    let sim = Simulation::new(workload.generate(1), c).unwrap();
    let router = CacheAwareRouter::new(4).unwrap();
    let r = sim.run(&router).unwrap();
    assert!(r.hit_ratio <= r.ideal_hit_ratio + 1e-12);
    // Preempted requests compute their tokens again.
    assert!(r.prefill_tokens + r.cached_tokens >= r.prompt_tokens);
    if r.preemptions == 0 {
        assert_eq!(r.prefill_tokens + r.cached_tokens, r.prompt_tokens);
    }
    for w in 0..4 {
        assert!(
            router
                .index()
                .with_tree(|t| t.worker_block_count(WorkerId::new(w)))
                <= 20_000
        );
    }
}

#[test]
fn mooncake_lines_parse_and_bad_lines_name_their_number() {
    let good = "{\"timestamp\": 1500, \"input_length\": 600, \"output_length\": 7, \"hash_ids\": [3, 9]}\n\n\
                {\"timestamp\": 0, \"input_length\": 512, \"output_length\": 1, \"hash_ids\": [3]}\n";
    let requests = parse_mooncake(good.as_bytes()).unwrap();
    assert_eq!(requests.len(), 2);
    assert_eq!(requests[0].arrival_s, 0.0, "sorted by arrival");
    assert_eq!(
        (requests[1].prompt.len(), requests[1].output_tokens),
        (600, 7)
    );
    let (mut a, mut b) = (Vec::new(), Vec::new());
    requests[0].prompt.tokens_into(&mut a);
    requests[1].prompt.tokens_into(&mut b);
    assert_eq!(a[..], b[..512], "equal hash ids give equal tokens");
    assert_eq!(b.len(), 600, "the last block is cut to input_length");
    for (bad, line) in [
        ("{\"timestamp\": 0}\nnot json\n", 1),
        (
            "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}\nnot json\n",
            2,
        ),
        (
            "{\"timestamp\": -5, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [1]}",
            1,
        ),
        (
            "{\"timestamp\": 0, \"input_length\": 900, \"output_length\": 1, \"hash_ids\": [1]}",
            1,
        ),
        (
            "{\"timestamp\": 0, \"input_length\": 5, \"output_length\": 1, \"hash_ids\": [\"x\"]}",
            1,
        ),
    ] {
        match parse_mooncake(bad.as_bytes()) {
            Err(Error::Trace { line: l, .. }) => assert_eq!(l, line, "{bad}"),
            other => panic!("{bad}: {other:?}"),
        }
    }
    assert!(matches!(
        load_mooncake("/nonexistent/trace.jsonl"),
        Err(Error::Trace { line: 0, .. })
    ));
}

#[test]
fn bad_cluster_configs_are_errors() {
    let mut c = config(0, 16);
    assert!(Simulation::new(Vec::new(), c).is_err());
    c = config(2, 16);
    c.speedup = f64::NAN;
    assert!(Simulation::new(Vec::new(), c).is_err());
    c = config(2, 16);
    c.capacity_tokens = 3;
    assert!(Simulation::new(Vec::new(), c).is_err());
    c = config(2, 0);
    assert!(matches!(
        Simulation::new(Vec::new(), c),
        Err(Error::InvalidBlockSize { .. })
    ));
    // The batched engine's settings, and event sync without a block pool.
    let batched = config(2, 16).with_engine(Engine::Batched);
    for bad in [
        batched.with_batch(step(StepModel::default().with_max_num_batched_tokens(0))),
        batched.with_batch(step(StepModel::default().with_max_num_seqs(0))),
        batched.with_batch(step(StepModel::default().with_step_base_s(-1.0))),
        batched.with_batch(step(
            StepModel::default().with_step_s_per_context_token(f64::NAN),
        )),
        batched.with_ttft_target_s(f64::INFINITY),
        config(2, 16)
            .with_engine(Engine::Simple)
            .with_sync(SyncMode::Events),
    ] {
        assert!(matches!(
            Simulation::new(Vec::new(), bad),
            Err(Error::InvalidConfig { .. })
        ));
    }
    // A router with more workers than the fleet is caught, not a panic, in both engines.
    for engine in ENGINES {
        let c = config(2, 16).with_engine(engine);
        let sim = Simulation::new(vec![Request::new(0.0, vec![1; 40], 1); 8], c).unwrap();
        let err = sim.run(&RoundRobinRouter::new(5).unwrap()).unwrap_err();
        assert!(matches!(err, Error::UnknownWorker(_)));
    }
    // A request longer than a worker's whole cache is rejected, not queued forever.
    let small = config(1, 16)
        .with_engine(Engine::Batched)
        .with_capacity_tokens(64);
    let sim = Simulation::new(
        vec![
            Request::new(0.0, vec![7; 100], 1),
            Request::new(0.1, vec![8; 32], 4),
        ],
        small,
    )
    .unwrap();
    let r = sim.run(&RoundRobinRouter::new(1).unwrap()).unwrap();
    assert_eq!((r.rejected, r.requests), (1, 2));
    assert!(r.goodput > 0.0 && r.goodput <= 0.5);
}

/// With event sync the router's mirror follows the workers' pools: a repeated prompt is
/// routed where its blocks are, and the mirror holds no more than the pools do.
#[test]
fn event_sync_feeds_the_mirror_from_the_pools() {
    let system: Vec<u32> = (0..1_024).map(|i| 5_000 + i).collect();
    let requests: Vec<Request> = (0..40u32)
        .map(|i| {
            let mut p = system.clone();
            p.extend((0..64).map(|j| 900_000 + i * 100 + j));
            Request::new(f64::from(i) * 0.5, p, 8)
        })
        .collect();
    let c = config(4, 16)
        .with_engine(Engine::Batched)
        .with_sync(SyncMode::Events)
        .with_capacity_tokens(2_048);
    let sim = Simulation::new(requests, c).unwrap();
    let router = BalancedRouter::new(4).unwrap();
    let r = sim.run(&router).unwrap();
    // The system prompt is computed once, then hit (never its last token's block).
    assert_eq!(r.cached_tokens, 39 * 1_024);
    for w in 0..4 {
        let held = router
            .index()
            .with_tree(|t| t.worker_block_count(WorkerId::new(w)));
        assert!(held <= 2_048 / 16, "worker {w} mirrors {held} blocks");
    }
}

#[test]
fn mooncake_conversation_trace_ideal_hit_ratio_at_its_own_granularity() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/data/mooncake_conversation_trace.jsonl"
    );
    let requests = load_mooncake(path).unwrap();
    assert_eq!(requests.len(), 12_031);
    let sim = Simulation::new(requests, config(8, MOONCAKE_BLOCK_TOKENS)).unwrap();
    // Counted in the trace's own blocks (each hash id one block, trailing partial ones too).
    let blocks = sim.ideal_block_hit_ratio().unwrap();
    assert!((blocks - 0.3664).abs() < 0.00005, "{blocks}");
    // Counted in tokens, where a partial trailing block is never a hit.
    assert!(
        (sim.ideal_hit_ratio() - 0.3734).abs() < 0.00005,
        "{}",
        sim.ideal_hit_ratio()
    );
}

/// With one request at a time and a step time of prefill alone, the batched engine's time
/// to first token is the simple engine's: chunked prefill (here 3 chunks of 8,192 tokens at
/// most) adds up to the whole prompt at the same rate.
#[test]
fn one_request_at_a_time_prefills_as_the_simple_engine_does() {
    let requests: Vec<Request> = [20_000u32, 3_000, 16]
        .iter()
        .enumerate()
        .map(|(i, &len)| {
            let tokens = (0..len).map(|t| i as u32 * 1_000_000 + t).collect();
            Request::new(i as f64 * 100.0, tokens, 1)
        })
        .collect();
    let batch = step(prefill_only());
    let run = |engine| {
        let c = config(1, 16).with_engine(engine).with_batch(batch);
        let sim = Simulation::new(requests.clone(), c).unwrap();
        sim.run(&RoundRobinRouter::new(1).unwrap()).unwrap()
    };
    let (simple, batched) = (run(Engine::Simple), run(Engine::Batched));
    assert!((simple.ttft_p99_s - 20_000.0 / 33_000.0).abs() < 1e-12);
    for (s, b) in [
        (simple.ttft_p50_s, batched.ttft_p50_s),
        (simple.ttft_p99_s, batched.ttft_p99_s),
    ] {
        assert!((s - b).abs() < 1e-9, "simple {s} batched {b}");
    }
    assert_eq!(simple.prefill_tokens, batched.prefill_tokens);
    assert_eq!(batched.preemptions, 0);
}

/// Each request's record adds up to the report: cached tokens, percentiles, preemptions;
/// its JSON is one object with every field.
#[test]
fn request_records_add_up_to_the_report() {
    let workload = &Workload::builtin()[1].1; // conversations
    for engine in ENGINES {
        let c = config(4, 16)
            .with_engine(engine)
            .with_capacity_tokens(30_000)
            .with_speedup(4.0);
        let sim = Simulation::new(workload.generate(5), c).unwrap();
        let r = sim.run(&BalancedRouter::new(4).unwrap()).unwrap();
        let records = &r.request_records;
        assert_eq!(records.len(), r.requests);
        assert!(records.iter().enumerate().all(|(i, x)| x.index == i));
        let cached: usize = records.iter().map(|x| x.cached_tokens).sum();
        assert_eq!(cached as u64, r.cached_tokens);
        let preemptions: u32 = records.iter().map(|x| x.preemptions).sum();
        assert_eq!(u64::from(preemptions), r.preemptions);
        let ttft: Vec<f64> = records.iter().filter_map(|x| x.ttft_s).collect();
        assert_eq!(ttft.len(), r.requests);
        assert!(ttft.contains(&r.ttft_p99_s) && ttft.contains(&r.ttft_p50_s));
        let above = ttft.iter().filter(|&&t| t > r.ttft_p99_s).count();
        assert!(
            above * 100 <= r.requests,
            "{above} above the 99th percentile"
        );
        for x in records {
            let (ttft, e2e) = (x.ttft_s.unwrap(), x.e2e_s.unwrap());
            assert!(x.admitted_s.unwrap() >= x.arrival_s && ttft > 0.0 && e2e >= ttft);
            let json: serde_json::Value = serde_json::from_str(&x.to_json()).unwrap();
            assert_eq!(json["index"], x.index);
            assert_eq!(json["worker"], x.worker);
            assert!(json["tpot_s"].is_f64() || json["tpot_s"].is_null());
        }
    }
}

#[test]
fn fleets_parse_and_bad_groups_are_named() {
    let fleet = WorkerSpec::parse_fleet("2x1.0, 1x0.5@2000", 64).unwrap();
    assert_eq!(
        fleet,
        [
            WorkerSpec::new(1.0, 64),
            WorkerSpec::new(1.0, 64),
            WorkerSpec::new(0.5, 2_000)
        ]
    );
    for bad in [
        "",
        "4",
        "0x1.0",
        "2x0",
        "2x-1",
        "2xNaN",
        "2x1.0@lots",
        "x1.0",
    ] {
        let err = WorkerSpec::parse_fleet(bad, 64).unwrap_err();
        assert!(matches!(err, Error::InvalidConfig { .. }), "{bad:?}");
    }
    let empty = Simulation::with_fleet(Vec::new(), config(1, 16), Vec::new());
    assert!(matches!(empty, Err(Error::InvalidConfig { .. })));
    let tiny = vec![WorkerSpec::new(1.0, 8)];
    assert!(Simulation::with_fleet(Vec::new(), config(1, 16), tiny).is_err());
}

/// A worker at half speed takes twice as long, in both engines, and a mixed fleet's
/// pooled reference holds every worker's capacity.
#[test]
fn a_half_speed_worker_takes_twice_as_long() {
    let request = Request::new(0.0, (0..4_000).collect(), 1);
    let batch = step(prefill_only());
    for engine in ENGINES {
        let ttft = |speed: f64| {
            let c = config(1, 16).with_engine(engine).with_batch(batch);
            let fleet = vec![WorkerSpec::new(speed, 1 << 20)];
            let sim = Simulation::with_fleet(vec![request.clone()], c, fleet).unwrap();
            sim.run(&RoundRobinRouter::new(1).unwrap())
                .unwrap()
                .ttft_p99_s
        };
        let (full, half) = (ttft(1.0), ttft(0.5));
        assert!(
            (full - 4_000.0 / 33_000.0).abs() < 1e-9,
            "{engine:?}: {full}"
        );
        assert!(
            (half - 2.0 * full).abs() < 1e-9,
            "{engine:?}: {half} vs {full}"
        );
    }
    // One prompt seen twice: a 16-token pool holds one block, a larger one both.
    let twice = vec![
        Request::new(0.0, (0..32).collect(), 1),
        Request::new(1.0, (0..32).collect(), 1),
    ];
    let pooled = |fleet: Vec<WorkerSpec>| {
        Simulation::with_fleet(twice.clone(), config(1, 16), fleet)
            .unwrap()
            .pooled_ideal_hit_ratio()
    };
    let small = pooled(vec![WorkerSpec::new(1.0, 16)]);
    let mixed = pooled(vec![WorkerSpec::new(1.0, 16), WorkerSpec::new(0.5, 16)]);
    assert!(mixed > small, "{mixed} vs {small}");
}

/// The default batch settings with `model` as the step model.
fn step(model: StepModel) -> BatchConfig {
    BatchConfig::default().with_step(model)
}

/// A step model whose steps cost only their prefill.
fn prefill_only() -> StepModel {
    StepModel::default()
        .with_step_base_s(0.0)
        .with_step_s_per_decode(0.0)
        .with_step_s_per_context_token(0.0)
}

/// The long-context workload: prompts within their bounds, in arrival order, each
/// repository's requests sharing the shorter one's context, and the same requests for the
/// same seed.
#[test]
fn long_context_prompts_share_their_repository() {
    let workload = Workload::builtin()
        .into_iter()
        .find(|(name, _)| *name == "long_context")
        .expect("built in")
        .1;
    let requests = workload.generate(7);
    assert_eq!(requests, workload.generate(7));
    assert_eq!(requests.len(), 400);
    let mut shared = 0;
    let prompts: Vec<Vec<u32>> = requests
        .iter()
        .map(|r| {
            let mut t = Vec::new();
            r.prompt.tokens_into(&mut t);
            t
        })
        .collect();
    for (i, r) in requests.iter().enumerate() {
        assert!(
            (16_384..=131_072 + 300).contains(&r.prompt.len()),
            "{}",
            r.prompt.len()
        );
        assert_eq!(r.output_tokens, 96);
        if i > 0 {
            assert!(requests[i - 1].arrival_s <= r.arrival_s);
            let common = prompts[i - 1]
                .iter()
                .zip(&prompts[i])
                .take_while(|(a, b)| a == b)
                .count();
            shared += usize::from(common >= 16_384);
        }
    }
    // Six repositories: about one neighbour in six reads the same one.
    assert!((30..120).contains(&shared), "{shared}");
}
