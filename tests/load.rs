//! Engine load reports as the router reads them: their age and the staleness policies,
//! this router's counts reconciled with a later report, and speeds learned from timings.

#![allow(clippy::unwrap_used)]

use std::sync::Mutex;
use std::time::Duration;

use prefix_router::*;
use proptest::prelude::*;

/// Offers its choice to worker 0 and keeps what every candidate looked like.
#[derive(Default)]
struct Snapshot {
    seen: Mutex<Vec<Candidate>>,
}

impl Policy for Snapshot {
    fn name(&self) -> &'static str {
        "snapshot"
    }

    fn select(&self, _: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        *self.seen.lock().unwrap() = candidates.to_vec();
        0
    }
}

type Probe = PolicyRouter<Snapshot>;

fn probe(workers: u32, load: LoadConfig) -> Probe {
    PolicyRouter::with_policy_and_load(workers, Snapshot::default(), IndexConfig::default(), load)
        .unwrap()
}

fn s(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds)
}

/// Routes a one-token request at `at` (to worker 0) and returns worker `w`'s candidate as
/// the policy saw it, with the decision.
fn look(r: &Probe, w: usize, at: f64) -> (Candidate, RouteDecision) {
    let d = r.route(&RouteRequest::new(&[7]).with_time(s(at))).unwrap();
    let c = r.policy().seen.lock().unwrap()[w];
    (c, d)
}

#[test]
fn a_fresh_report_counts_and_a_stale_one_follows_the_staleness_policy() {
    for staleness in [Staleness::Hold, Staleness::Ignore, Staleness::Saturated] {
        let config = LoadConfig::default()
            .with_max_report_age(s(2.0))
            .with_staleness(staleness);
        let r = probe(2, config);
        let report = EngineLoad::new(30, 20, s(10.0)).with_kv_usage(0.9);
        r.report_load(WorkerId::new(1), report).unwrap();
        let (fresh, d) = look(&r, 1, 11.0);
        r.complete(&d);
        assert_eq!((fresh.waiting(), fresh.decoding()), (30, 20));
        assert!((fresh.kv_usage() - 0.9).abs() < 1e-6);
        assert!(!fresh.saturated());
        // 2 s is the limit: at 12.5 s the report is 2.5 s old.
        let (stale, d) = look(&r, 1, 12.5);
        r.complete(&d);
        match staleness {
            Staleness::Hold => assert_eq!(stale.requests(), 50),
            Staleness::Ignore => {
                assert_eq!((stale.requests(), stale.kv_usage()), (0, 0.0));
            }
            Staleness::Saturated => assert!(stale.saturated() && stale.requests() == 50),
            _ => unreachable!(),
        }
    }
}

#[test]
fn without_request_times_the_newest_report_is_the_clock() {
    let config = LoadConfig::default().with_max_report_age(s(1.0));
    let r = probe(2, config);
    r.report_load(WorkerId::new(1), EngineLoad::new(9, 0, s(5.0)))
        .unwrap();
    let d = r.route(&RouteRequest::new(&[1])).unwrap();
    assert_eq!(r.policy().seen.lock().unwrap()[1].requests(), 9);
    r.complete(&d);
    // Worker 0 reports at 7 s: worker 1's report is now 2 s old, and ignored.
    r.report_load(WorkerId::new(0), EngineLoad::new(0, 0, s(7.0)))
        .unwrap();
    let d = r.route(&RouteRequest::new(&[1])).unwrap();
    assert_eq!(r.policy().seen.lock().unwrap()[1].requests(), 0);
    r.complete(&d);
}

#[test]
fn a_saturated_worker_is_chosen_only_when_every_worker_is() {
    let config = LoadConfig::default()
        .with_max_report_age(s(1.0))
        .with_staleness(Staleness::Saturated);
    let balanced = BalancedConfig::default().with_load(config);
    let r = BalancedRouter::with_config(2, balanced).unwrap();
    let prompt: Vec<u32> = (0..64).collect();
    r.report_load(WorkerId::new(0), EngineLoad::new(0, 0, s(0.0)))
        .unwrap();
    r.report_load(WorkerId::new(1), EngineLoad::new(0, 0, s(5.0)))
        .unwrap();
    // Worker 0's report is 5 s old: saturated, so the prompt goes to worker 1 and stays.
    for _ in 0..3 {
        let d = r
            .route(&RouteRequest::new(&prompt).with_time(s(5.0)))
            .unwrap();
        assert_eq!(d.worker(), WorkerId::new(1));
        r.complete(&d);
    }
    // Both stale: saturation no longer separates them, and the cache decides.
    let d = r
        .route(&RouteRequest::new(&prompt).with_time(s(60.0)))
        .unwrap();
    assert_eq!(d.worker(), WorkerId::new(1));
}

#[test]
fn local_counts_add_to_a_report_until_the_next_replaces_them() {
    let r = probe(1, LoadConfig::default());
    r.report_load(
        WorkerId::new(0),
        EngineLoad::new(5, 3, s(0.0)).with_prefill_tokens(1_000),
    )
    .unwrap();
    let (_, a) = look(&r, 0, 0.1);
    let (c, b) = look(&r, 0, 0.2);
    // What the policy saw before b: the report and a.
    assert_eq!(
        (c.waiting(), c.decoding(), c.prefill_tokens()),
        (6, 3, 1_001)
    );
    r.first_token(&a);
    r.complete(&b);
    let (c, x) = look(&r, 0, 0.3);
    r.complete(&x);
    // a decodes, b left before its first token.
    assert_eq!((c.waiting(), c.decoding()), (5, 4));
    assert_eq!(c.prefill_tokens(), 1_000);
    // A new report replaces the counts; a (still in flight) is in it.
    r.report_load(WorkerId::new(0), EngineLoad::new(0, 1, s(1.0)))
        .unwrap();
    let (c, x) = look(&r, 0, 1.1);
    r.complete(&x);
    assert_eq!((c.requests(), c.decoding()), (1, 1));
    // A report that misses this router's own requests does not hide them.
    r.report_load(WorkerId::new(0), EngineLoad::new(0, 0, s(2.0)))
        .unwrap();
    let (c, x) = look(&r, 0, 2.1);
    r.complete(&x);
    assert_eq!(c.requests(), 1, "a is still in flight here");
    r.complete(&a);
}

/// A prefill under way: this router counts its whole prompt until the first token, the
/// engine counts what is left. Reading reports so, a fresh report's figure wins (with this
/// router's routes since it); once the report is stale and held, the larger of the two
/// does, as it always does by default.
#[test]
fn a_fresh_report_counts_the_progress_of_a_prefill_under_way() {
    let config = LoadConfig::default()
        .with_max_report_age(s(2.0))
        .with_staleness(Staleness::Hold);
    let larger = probe(1, config);
    let prompt: Vec<u32> = (0..10_000).collect();
    let long = larger
        .route(&RouteRequest::new(&prompt).with_time(s(0.0)))
        .unwrap();
    let report = EngineLoad::new(1, 0, s(0.5)).with_prefill_tokens(4_000);
    larger.report_load(WorkerId::new(0), report).unwrap();
    let (c, a) = look(&larger, 0, 0.6);
    assert_eq!(
        c.prefill_tokens(),
        10_000,
        "the router's own count, the larger"
    );
    larger.complete(&a);
    larger.complete(&long);
    let r = probe(1, config.with_prefill_from_report(true));
    let prompt: Vec<u32> = (0..10_000).collect();
    let long = r
        .route(&RouteRequest::new(&prompt).with_time(s(0.0)))
        .unwrap();
    r.report_load(
        WorkerId::new(0),
        EngineLoad::new(1, 0, s(0.5)).with_prefill_tokens(4_000),
    )
    .unwrap();
    let (fresh, a) = look(&r, 0, 0.6);
    assert_eq!(fresh.prefill_tokens(), 4_000, "the engine's remainder");
    let (fresh, b) = look(&r, 0, 0.7);
    assert_eq!(
        fresh.prefill_tokens(),
        4_001,
        "with a route since the report"
    );
    let (stale, c) = look(&r, 0, 3.0);
    assert_eq!(stale.prefill_tokens(), 10_002, "this router's own count");
    for d in [&long, &a, &b, &c] {
        r.complete(d);
    }
}

/// One operation on a worker's load.
#[derive(Clone, Debug)]
enum Op {
    Route,
    FirstToken(usize),
    Complete(usize),
    Report { waiting: u64, running: u64 },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => Just(Op::Route),
        2 => (0..32usize).prop_map(Op::FirstToken),
        2 => (0..32usize).prop_map(Op::Complete),
        1 => (0..20u64, 0..20u64).prop_map(|(waiting, running)| Op::Report { waiting, running }),
    ]
}

proptest! {
    /// Whatever the order of routes, first tokens, completions and reports, the estimate
    /// never counts fewer requests than this router has in flight, never more decoding
    /// than requests, and right after a report it is the report or the local count,
    /// whichever is larger.
    #[test]
    fn the_estimate_bounds_hold_under_any_interleaving(ops in proptest::collection::vec(op(), 1..60)) {
        let r = probe(1, LoadConfig::default());
        let mut decisions: Vec<RouteDecision> = Vec::new();
        let mut t = 0.0;
        for op in ops {
            t += 0.01;
            match op {
                Op::Route => {
                    let (c, d) = look(&r, 0, t);
                    let live = decisions.iter().filter(|d| !d.is_completed()).count() as u64;
                    prop_assert!(c.requests() >= live);
                    prop_assert!(c.decoding() <= c.requests());
                    prop_assert_eq!(c.in_flight(), live);
                    decisions.push(d);
                }
                Op::FirstToken(i) => {
                    if let Some(d) = decisions.get(i) {
                        r.first_token_after(d, s(0.05));
                    }
                }
                Op::Complete(i) => {
                    if let Some(d) = decisions.get(i) {
                        r.complete(d);
                    }
                }
                Op::Report { waiting, running } => {
                    r.report_load(WorkerId::new(0), EngineLoad::new(waiting, running, s(t))).unwrap();
                    let load = r.load(WorkerId::new(0)).unwrap();
                    prop_assert_eq!(load.estimated_requests, load.in_flight.max(waiting + running));
                }
            }
        }
        for d in &decisions {
            r.complete(d);
        }
        let load = r.load(WorkerId::new(0)).unwrap();
        prop_assert_eq!((load.in_flight, load.prefill_tokens), (0, 0));
    }
}

/// Worker 1 is configured twice as fast as it is: the times it takes to its first tokens
/// (twice the prediction at the configured speed, give or take a fifth) teach the router
/// its real speed within a few requests (within a quarter, the noise being a fifth), and it
/// stays learned.
#[test]
fn a_worker_configured_twice_as_fast_as_it_is_is_found_within_ten_requests() {
    let r = BalancedRouter::new(2).unwrap();
    r.set_profile(WorkerId::new(1), WorkerProfile::default().with_speed(2.0))
        .unwrap();
    assert_eq!(r.load(WorkerId::new(1)).unwrap().speed, 2.0);
    let noise = [1.2, 0.8, 1.1, 0.9, 1.0];
    // The truth: what the router predicts at speed 1, the real speed of both workers.
    let truth = BalancedRouter::new(2).unwrap();
    let mut found = None;
    for i in 0..40 {
        let prompt: Vec<u32> = (0..2_000).map(|t| t + i * 10_000).collect();
        let d = r.route(&RouteRequest::new(&prompt)).unwrap();
        let t = truth.route(&RouteRequest::new(&prompt)).unwrap();
        let n = noise[i as usize % noise.len()];
        r.first_token_after(&d, s(t.predicted_ttft_s() * n));
        truth.complete(&t);
        r.complete(&d);
        let speed = r.load(WorkerId::new(1)).unwrap().speed;
        let near = (speed - 1.0).abs() < 0.25;
        if found.is_none() && near {
            found = Some(i);
        }
        if let Some(at) = found {
            assert!(near, "found at request {at}, lost at {i}: {speed}");
        }
    }
    assert!(found.is_some_and(|i| i < 10), "{found:?}");
    // Worker 0 served nothing (worker 1 was believed faster throughout): it keeps its
    // configured speed, since one worker's timings are not the fleet's.
    let zero = r.load(WorkerId::new(0)).unwrap();
    assert_eq!((zero.ttft_timings, zero.speed), (0, 1.0));
    // The model's error is reported per worker: after learning, worker 1's first tokens
    // come about as predicted.
    let one = r.load(WorkerId::new(1)).unwrap();
    assert!(one.ttft_timings >= 5, "{one:?}");
    let error = one.ttft_measured_over_predicted.unwrap();
    assert!((0.8..1.35).contains(&error), "{error}");
}

/// A host that reports no timings (first tokens without their time, no streamed output
/// tokens) gets the configured step model: every decision and prediction is the one a
/// router that never learns makes, though that router is told times far from its
/// predictions; every worker keeps its configured speed.
#[test]
fn a_host_that_reports_no_timings_gets_the_configured_terms() {
    let silent = BalancedRouter::new(4).unwrap();
    let never = BalancedConfig::default().with_load(LoadConfig::default().with_learning_rate(0.0));
    let deaf = BalancedRouter::with_config(4, never).unwrap();
    let mut open = Vec::new();
    for i in 0..60u32 {
        // Four prompt families, each growing by a turn, so some requests hit.
        let len = 500 + 300 * (i / 4);
        let prompt: Vec<u32> = (0..len).map(|t| t + (i % 4) * 100_000).collect();
        let request = RouteRequest::new(&prompt).with_expected_output(100);
        let (a, b) = (
            silent.route(&request).unwrap(),
            deaf.route(&request).unwrap(),
        );
        assert_eq!(a.worker(), b.worker(), "request {i}");
        assert_eq!(a.predicted_ttft_s(), b.predicted_ttft_s(), "request {i}");
        assert_eq!(a.predicted_tpot_s(), b.predicted_tpot_s(), "request {i}");
        silent.first_token(&a);
        deaf.first_token_after(&b, s(5.0));
        deaf.tokens_after(&b, 50, s(9.0));
        open.push((a, b));
        if open.len() > 6 {
            let (a, b) = open.remove(0);
            silent.complete(&a);
            deaf.complete(&b);
        }
    }
    for w in 0..4 {
        let load = silent.load(WorkerId::new(w)).unwrap();
        assert_eq!((load.speed, load.ttft_timings), (1.0, 0), "worker {w}");
    }
}

/// Before five timings a worker's error is not reported.
#[test]
fn the_model_error_needs_five_timings() {
    let r = BalancedRouter::new(1).unwrap();
    for i in 0..4u32 {
        let prompt: Vec<u32> = (0..512).map(|t| t + i * 1_000).collect();
        let d = r.route(&RouteRequest::new(&prompt)).unwrap();
        r.first_token_after(&d, s(0.5));
        r.complete(&d);
        let load = r.load(WorkerId::new(0)).unwrap();
        assert_eq!(load.ttft_timings, u64::from(i + 1));
        assert_eq!(load.ttft_measured_over_predicted, None);
    }
}

/// The load model's cost on a hand-computed fleet: worker `h` holds a 2,000-token prompt and
/// runs `running` decodes of 2,100 tokens each (its KV 1M tokens); the other worker is idle
/// and empty. A request extending the prompt by 100 tokens, expecting 200 output tokens,
/// goes to the idle worker exactly when its predicted time (to first token, plus decode)
/// is lower, by the step model's figures, with a miss weighing a fixed 10 (and nothing for
/// the decodes it holds up: the stall weight at 0).
#[test]
fn an_idle_worker_beats_a_holder_full_of_decodes_exactly_when_it_predicts_less_time() {
    let step = StepModel::default();
    let cost = |running: f64, miss: f64, weight: f64| {
        let held = running * 2_100.0;
        let per_step = |decodes: f64, context: f64| {
            decodes * step.step_s_per_decode + context * step.step_s_per_context_token
        };
        let busy = step.step_base_s + per_step(running, held);
        let seats = (running + 1.0 - step.max_num_seqs as f64).max(0.0) / running.max(1.0);
        let memory = if held > 0.0 {
            (held + miss + 200.0 - 1e6).max(0.0) / held
        } else {
            0.0
        };
        let wait = seats.max(memory) * 200.0 * busy / 2.0;
        let ttft = weight * miss / 33_000.0 + busy + wait;
        let decode = 200.0 * per_step(running + 1.0, held + 2_100.0);
        (ttft, decode)
    };
    let mut chose = Vec::new();
    for running in [0u64, 50, 150, 255, 256, 300, 400, 470] {
        // A fixed weight: what is checked is the load model's cost.
        let fixed = BalancedConfig::default()
            .with_miss_weight(10.0)
            .with_stall_weight(0.0);
        let r = BalancedRouter::with_config(2, fixed).unwrap();
        let profile = WorkerProfile::default().with_kv_capacity_tokens(1_000_000);
        for w in [0, 1] {
            r.set_profile(WorkerId::new(w), profile).unwrap();
        }
        let prompt: Vec<u32> = (0..2_100).collect();
        let first = r.route(&RouteRequest::new(&prompt[..2_000])).unwrap();
        r.complete(&first);
        let h = first.worker();
        let idle = WorkerId::new(1 - h.get());
        let usage = running as f64 * 2_100.0 / 1e6;
        let busy = EngineLoad::new(0, running, s(1.0)).with_kv_usage(usage.min(1.0));
        r.report_load(h, busy).unwrap();
        r.report_load(idle, EngineLoad::new(0, 0, s(1.0))).unwrap();
        let request = RouteRequest::new(&prompt)
            .with_expected_output(200)
            .with_time(s(1.0));
        let (d, receipt) = r.route_with_receipt(&request).unwrap();
        let (h_ttft, h_decode) = cost(running as f64, 100.0, 10.0);
        let (i_ttft, i_decode) = cost(0.0, 2_100.0, 10.0);
        let line = |w: WorkerId| {
            let line = receipt.candidates.iter().find(|l| l.worker == w).unwrap();
            let terms = &line.cost.as_ref().unwrap().terms;
            (terms[0].value, terms[1].value)
        };
        let close =
            |a: (f64, f64), b: (f64, f64)| (a.0 - b.0).abs() < 1e-9 && (a.1 - b.1).abs() < 1e-9;
        assert!(close(line(h), (h_ttft, h_decode)), "{running}: {receipt}");
        assert!(
            close(line(idle), (i_ttft, i_decode)),
            "{running}: {receipt}"
        );
        let expected = if i_ttft + i_decode < h_ttft + h_decode {
            idle
        } else {
            h
        };
        assert_eq!(d.worker(), expected, "{running}: {receipt}");
        chose.push(d.worker() == idle);
    }
    // Both answers occur: the holder while its batch is light, the idle worker past it.
    assert_eq!(chose.first(), Some(&false));
    assert_eq!(chose.last(), Some(&true));
}

/// A token a worker must compute holds up every answer it is decoding: with a stall weight
/// of 0.2, each token a worker decoding 50 answers computes weighs 0.2 × 50 more than on
/// an idle one, and the receipt's time-to-first-token term says so; an idle worker's is
/// unchanged.
#[test]
fn a_recomputation_weighs_the_decodes_it_holds_up() {
    let prompt: Vec<u32> = (0..2_000).collect();
    // The time-to-first-token terms of the holder of the first 1,024 tokens (64 blocks;
    // decoding 50 answers) and of the idle worker.
    let ttft_terms = |stall: f64| {
        let config = BalancedConfig::default()
            .with_miss_weight(1.0)
            .with_stall_weight(stall);
        let r = BalancedRouter::with_config(2, config).unwrap();
        let first = r.route(&RouteRequest::new(&prompt[..1_024])).unwrap();
        r.complete(&first);
        let (holder, idle) = (first.worker(), WorkerId::new(1 - first.worker().get()));
        r.report_load(holder, EngineLoad::new(0, 50, s(1.0)))
            .unwrap();
        r.report_load(idle, EngineLoad::new(0, 0, s(1.0))).unwrap();
        let request = RouteRequest::new(&prompt)
            .with_expected_output(16)
            .with_time(s(1.0));
        let (_, receipt) = r.route_with_receipt(&request).unwrap();
        [holder, idle].map(|w| {
            let line = receipt.candidates.iter().find(|l| l.worker == w);
            let cost = line.and_then(|l| l.cost.as_ref());
            cost.unwrap_or_else(|| panic!("{w:?} not scored: {receipt}"))
                .terms[0]
                .value
        })
    };
    let (without, with) = (ttft_terms(0.0), ttft_terms(0.2));
    let rate = LoadConfig::default().prefill_tokens_per_s;
    let held_up = 0.2 * 50.0 * 976.0 / rate;
    assert!(
        (with[0] - without[0] - held_up).abs() < 1e-9,
        "{with:?} against {without:?}"
    );
    assert_eq!(with[1], without[1], "an idle worker holds up nothing");
    for bad in [-1.0, f64::NAN, f64::INFINITY] {
        let config = BalancedConfig::default().with_stall_weight(bad);
        assert!(
            matches!(config.validate(), Err(Error::InvalidConfig { .. })),
            "{bad}"
        );
    }
}

/// A request's streamed time per output token teaches the worker's forecast terms net of
/// the prefill the worker did while it decoded: a host whose engine runs exactly the
/// configured step model, where each short answer shares its steps with a long prompt
/// routed after it, leaves a new request's predicted time per output token on the idle
/// worker where a router that never learns puts it. (Learned against the prefill queued
/// when the answer was routed, none here, the long prompts' chunks would read as a decode
/// step several times slower.)
#[test]
fn decode_terms_learn_net_of_the_prefill_that_shared_the_steps() {
    let config = LoadConfig::default();
    let learning = BalancedRouter::new(1).unwrap();
    let never = BalancedConfig::default().with_load(config.with_learning_rate(0.0));
    let deaf = BalancedRouter::with_config(1, never).unwrap();
    let long_prompt = 8_000u32;
    let shared_s = f64::from(long_prompt) / config.prefill_tokens_per_s;
    for i in 0..80u32 {
        let short: Vec<u32> = (0..64).map(|t| t + i * 100_000).collect();
        let long: Vec<u32> = (0..long_prompt).map(|t| t + i * 100_000 + 50_000).collect();
        let answer = learning
            .route(&RouteRequest::new(&short).with_expected_output(16))
            .unwrap();
        // Every first token comes when the model predicts it: they teach nothing.
        learning.first_token_after(&answer, s(answer.predicted_ttft_s()));
        let prompt = learning.route(&RouteRequest::new(&long)).unwrap();
        learning.first_token_after(&prompt, s(prompt.predicted_ttft_s()));
        // The answer's 16 steps took their decode time and the long prompt's prefill.
        let elapsed = 16.0 * answer.predicted_tpot_s() + shared_s;
        learning.tokens_after(&answer, 16, s(elapsed));
        learning.complete(&answer);
        learning.complete(&prompt);
    }
    let probe: Vec<u32> = (0..64).map(|t| t + 9_000_000).collect();
    let request = RouteRequest::new(&probe).with_expected_output(16);
    let (learned, configured) = (
        learning.route(&request).unwrap().predicted_tpot_s(),
        deaf.route(&request).unwrap().predicted_tpot_s(),
    );
    assert!(
        (learned / configured - 1.0).abs() < 0.1,
        "learned {learned} s per token against the configured {configured} s"
    );
}

/// A session answering at length keeps its context where it is: its next step on the
/// worker holding 16,000 tokens of it, decoding 20 answers, beats recomputing them on an
/// idle worker, since the worker's present batch counts over the first
/// `decode_horizon_tokens` (256) of the 2,000-token answer, not all of them (the batch
/// it joins lasts as long as its decodes; beyond, it is what the router sends meanwhile).
/// Counted over the whole answer, the lighter batch of the moment wins and the session
/// leaves its context behind. The receipt's decode term is the horizon's share of the
/// whole answer's.
#[test]
fn a_long_answer_keeps_its_context_over_a_lighter_batch() {
    let context: Vec<u32> = (0..16_600).collect();
    let step = |horizon: u32| {
        let config = BalancedConfig::default()
            .with_load(LoadConfig::default().with_decode_horizon_tokens(horizon));
        let r = BalancedRouter::with_config(2, config).unwrap();
        let first = r.route(&RouteRequest::new(&context[..16_000])).unwrap();
        r.complete(&first);
        let (holder, idle) = (first.worker(), WorkerId::new(1 - first.worker().get()));
        r.report_load(holder, EngineLoad::new(0, 20, s(1.0)))
            .unwrap();
        r.report_load(idle, EngineLoad::new(0, 0, s(1.0))).unwrap();
        let request = RouteRequest::new(&context)
            .with_expected_output(2_000)
            .with_time(s(1.0));
        let (d, receipt) = r.route_with_receipt(&request).unwrap();
        let line = receipt.candidates.iter().find(|l| l.worker == holder);
        let terms = &line.unwrap().cost.as_ref().unwrap().terms;
        assert_eq!(terms[1].name, "decode_s");
        (d.worker() == holder, terms[1].value, receipt)
    };
    assert_eq!(LoadConfig::default().decode_horizon_tokens, 256);
    let (stays, horizon_decode, receipt) = step(256);
    assert!(stays, "{receipt}");
    let (stays, whole_decode, receipt) = step(u32::MAX);
    assert!(!stays, "{receipt}");
    let share = horizon_decode / whole_decode;
    assert!((share - 256.0 / 2_000.0).abs() < 1e-12, "{share}");
}
