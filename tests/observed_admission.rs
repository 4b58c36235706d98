//! Admission's observed gates: the prefill window bound by timed first tokens, the decode
//! bound by streamed progress, refusals that name their gate, and a host that reports
//! nothing timed getting the model's check alone.

use std::time::Duration;

use prefix_router::{
    BalancedRouter, Error, Gate, Priority, RouteDecision, RouteRequest, Router, Shed,
};
use proptest::prelude::*;

const TTFT_TARGET: Duration = Duration::from_secs(2);
const TPOT_TARGET: Duration = Duration::from_millis(100);

/// A request of `n` tokens (distinct per `seed`) at `at` seconds asking for both targets.
fn request(tokens: &[u32], at: f64) -> RouteRequest<'_> {
    RouteRequest::new(tokens)
        .with_time(Duration::from_secs_f64(at))
        .with_ttft_target(TTFT_TARGET)
        .with_tpot_target(TPOT_TARGET)
        .with_priority(Priority::Standard)
        .with_expected_output(64)
}

fn prompt(seed: u32, n: u32) -> Vec<u32> {
    (0..n).map(|i| seed.wrapping_mul(1_000_003) ^ i).collect()
}

/// Whether `shed`'s figures agree with its gate: measured past the threshold, the threshold
/// the target the gate holds, and a retry time unless no wait helps.
fn consistent(shed: &Shed) -> bool {
    let ttft_gate =
        matches!(shed.gate, Gate::Model | Gate::PrefillWindow) && shed.threshold <= shed.target;
    let tpot_gate = matches!(shed.gate, Gate::Model | Gate::DecodeBound | Gate::Prompt)
        && Some(shed.threshold) == shed.tpot_target;
    let prompt_gate = shed.gate == Gate::Prompt && shed.retry_after.is_none();
    (ttft_gate || tpot_gate || prompt_gate)
        && (shed.measured > shed.threshold || shed.gate == Gate::Prompt)
        && (shed.retry_after.is_some() || shed.gate == Gate::Prompt)
}

/// Routes request after request (`route(k)` routes the `k`-th) until one is refused: the
/// decisions admitted before it, and the refusal. Fails past `most` admitted.
fn until_shed(
    most: usize,
    mut route: impl FnMut(u32) -> Result<RouteDecision, Error>,
) -> (Vec<RouteDecision>, Shed) {
    let mut admitted = Vec::new();
    loop {
        match route(admitted.len() as u32) {
            Ok(d) => admitted.push(d),
            Err(Error::Shed(shed)) => return (admitted, shed),
            Err(e) => panic!("{e}"),
        }
        assert!(admitted.len() <= most, "never refused");
    }
}

#[test]
fn a_slow_worker_is_bounded_by_its_first_tokens() {
    let router = BalancedRouter::new(1).expect("router");
    // The worker is three times slower than the model: each first token comes at three
    // times its prediction.
    let mut t = 0.0;
    for seed in 0..20 {
        let tokens = prompt(seed, 4_096);
        let d = router
            .route(&request(&tokens, t))
            .expect("an idle worker admits");
        let elapsed = Duration::from_secs_f64(3.0 * d.predicted_ttft_s());
        // Requests a few seconds apart: the prefill leaves the decodes room.
        t += elapsed.as_secs_f64() + 3.0;
        router.first_token_after(&d, elapsed);
        router.complete(&d);
    }
    let signals = router.fleet_signals();
    let observed = signals.workers[0].observed.expect("timed first tokens");
    assert!((observed.prefill_factor - 3.0).abs() < 0.01, "{observed:?}");
    // Now requests queue: the model admits until its prediction passes 2 s, the window
    // once three times it does.
    let (mut held, shed) = until_shed(500, |k| {
        router.route(&request(&prompt(1_000 + k, 4_096), t))
    });
    assert_eq!(shed.gate, Gate::PrefillWindow, "{shed}");
    assert!(consistent(&shed), "{shed:?}");
    assert!(
        shed.best_ttft <= TTFT_TARGET,
        "the model alone would admit: {shed}"
    );
    assert!(shed.to_string().contains("gate prefill_window"), "{shed}");
    // A first token frees room: the next request is admitted.
    let first = held.remove(0);
    router.first_token_after(
        &first,
        Duration::from_secs_f64(3.0 * first.predicted_ttft_s()),
    );
    router.complete(&first);
    let tokens = prompt(9_999, 16);
    assert!(router.route(&request(&tokens, t)).is_ok());
}

/// Chunked prefill shares the decode steps: a worker admitted prefill at a rate that leaves
/// its decodes too little time is refused for the time-per-output-token target, and admits
/// again once that prefill is behind it.
#[test]
fn prefill_admitted_faster_than_the_decodes_allow_is_bounded() {
    let router = BalancedRouter::new(1).expect("router");
    let first = router
        .route(&request(&prompt(0, 64), 0.0))
        .expect("admitted");
    router.first_token_after(&first, Duration::from_millis(10));
    router.tokens_after(&first, 16, Duration::from_millis(160));
    // `first` stays in flight: a worker with nothing in flight passes the observed gates
    // (a probe), and the bound protects the decodes running there.
    // A time-to-first-token target no queue reaches: only the decode bound refuses.
    let (admitted, shed) = until_shed(200, |k| {
        let tokens = prompt(10 + k, 16_384);
        let patient = request(&tokens, 1.0).with_ttft_target(Duration::from_secs(1_000_000));
        let d = router.route(&patient)?;
        router.first_token(&d);
        router.complete(&d);
        Ok(d)
    });
    let admitted = admitted.len();
    assert!(admitted > 5, "the bound leaves room: {admitted}");
    assert_eq!(shed.gate, Gate::DecodeBound, "{shed}");
    assert!(consistent(&shed), "{shed:?}");
    assert!(shed.to_string().contains("gate decode_bound"), "{shed}");
    let observed = router.fleet_signals().workers[0]
        .observed
        .expect("observed");
    assert!(observed.prefill_share > 0.5, "{observed:?}");
    let by_gate = router.fleet_signals().shed_by_gate;
    let at = prefix_router::GATES
        .iter()
        .position(|g| *g == Gate::DecodeBound);
    assert_eq!(by_gate[at.expect("a gate")], 1);
    // A minute later that prefill is behind the worker: a request is admitted.
    let tokens = prompt(9_999, 16_384);
    let later = RouteRequest::new(&tokens)
        .with_time(Duration::from_secs(61))
        .with_ttft_target(Duration::from_secs(1_000_000))
        .with_tpot_target(TPOT_TARGET)
        .with_expected_output(64);
    assert!(router.route(&later).is_ok());
}

#[test]
fn progress_reports_repeated_reordered_late_or_unknown_change_nothing() {
    let router = BalancedRouter::new(2).expect("router");
    let tokens = prompt(1, 512);
    let d = router.route(&request(&tokens, 0.0)).expect("admitted");
    router.first_token_after(&d, Duration::from_millis(40));
    router.tokens_after(&d, 32, Duration::from_millis(640));
    let before = router.fleet_signals();
    // Repeated, reordered, going back in time: nothing changes.
    router.tokens_after(&d, 32, Duration::from_millis(640));
    router.tokens_after(&d, 16, Duration::from_millis(320));
    router.tokens_after(&d, 48, Duration::from_millis(100));
    router.tokens_after(&d, 0, Duration::ZERO);
    assert_eq!(router.fleet_signals(), before);
    // Late, after completion: the worker's observations stay.
    router.complete(&d);
    let completed = router.fleet_signals();
    router.tokens_after(&d, 64, Duration::from_millis(5_000));
    assert_eq!(router.fleet_signals(), completed);
    // A decision of another router, for a worker this one removed: harmless.
    let other = BalancedRouter::new(2).expect("router");
    let foreign = other.route(&request(&tokens, 0.0)).expect("admitted");
    router.remove_worker(foreign.worker()).expect("removed");
    router.tokens_after(&foreign, 16, Duration::from_millis(10));
    router.first_token_after(&foreign, Duration::from_millis(10));
    let signals = router.fleet_signals();
    assert_eq!(signals.workers.len(), 1);
}

#[test]
fn the_initial_window_holds_a_worker_before_its_first_progress_report() {
    let router = BalancedRouter::new(1).expect("router");
    let first = router
        .route(&request(&prompt(0, 64), 0.0))
        .expect("admitted");
    router.first_token_after(&first, Duration::from_millis(10));
    let (held, shed) = until_shed(100, |k| router.route(&request(&prompt(1 + k, 64), 0.1)));
    let held = held.len() as u32 + 1;
    let window = prefix_router::AdmissionConfig::default().initial_decode_window;
    assert_eq!(held, window, "the initial window");
    assert_eq!(shed.gate, Gate::DecodeBound);
    assert!(consistent(&shed), "{shed:?}");
}

#[derive(Clone, Debug)]
enum Op {
    Route {
        seed: u32,
        tokens: u32,
        critical: bool,
    },
    FirstToken {
        which: usize,
        factor: f64,
    },
    Progress {
        which: usize,
        tokens: u32,
        ms: u64,
    },
    Complete {
        which: usize,
    },
    Wait {
        ms: u64,
    },
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        (any::<u32>(), 16u32..8_000, prop::bool::weighted(0.1)).prop_map(
            |(seed, tokens, critical)| Op::Route {
                seed,
                tokens,
                critical
            }
        ),
        (any::<usize>(), 0.2f64..6.0).prop_map(|(which, factor)| Op::FirstToken { which, factor }),
        (any::<usize>(), 0u32..200, 0u64..30_000).prop_map(|(which, tokens, ms)| Op::Progress {
            which,
            tokens,
            ms
        }),
        any::<usize>().prop_map(|which| Op::Complete { which }),
        (0u64..3_000).prop_map(|ms| Op::Wait { ms }),
    ]
}

/// Runs `ops` on `router`, timing reports only when `timed`; returns the refusals.
fn replay(router: &BalancedRouter, ops: &[Op], timed: bool) -> Vec<Shed> {
    let mut held: Vec<RouteDecision> = Vec::new();
    let mut sheds = Vec::new();
    let mut t = 0.0;
    for op in ops {
        match *op {
            Op::Route {
                seed,
                tokens,
                critical,
            } => {
                let p = prompt(seed, tokens);
                let priority = if critical {
                    Priority::Critical
                } else {
                    Priority::Standard
                };
                match router.route(&request(&p, t).with_priority(priority)) {
                    Ok(d) => held.push(d),
                    Err(Error::Shed(shed)) => sheds.push(shed),
                    Err(e) => panic!("{e}"),
                }
            }
            Op::FirstToken { which, factor } if !held.is_empty() => {
                let d = &held[which % held.len()];
                if timed {
                    let s = (factor * d.predicted_ttft_s()).min(1e6);
                    router.first_token_after(d, Duration::from_secs_f64(s));
                } else {
                    router.first_token(d);
                }
            }
            Op::Progress { which, tokens, ms } if timed && !held.is_empty() => {
                let d = &held[which % held.len()];
                router.tokens_after(d, tokens, Duration::from_millis(ms));
            }
            Op::Complete { which } if !held.is_empty() => {
                let d = held.swap_remove(which % held.len());
                router.complete(&d);
            }
            Op::Wait { ms } => t += ms as f64 / 1_000.0,
            _ => {}
        }
    }
    sheds
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// On any sequence of routes, first tokens, progress and completions, every refusal's
    /// gate, measured value and threshold agree; no critical request is refused.
    #[test]
    fn every_refusal_names_a_consistent_gate(ops in prop::collection::vec(op(), 1..200)) {
        let router = BalancedRouter::new(3).expect("router");
        for shed in replay(&router, &ops, true) {
            prop_assert!(consistent(&shed), "{:?}", shed);
            prop_assert!(shed.priority != Priority::Critical);
        }
        let signals = router.fleet_signals();
        prop_assert_eq!(
            signals.shed_by_gate.iter().sum::<u64>(),
            signals.shed_by_priority.iter().sum::<u64>()
        );
    }

    /// A host that reports nothing timed gets the model's check alone: the same decisions
    /// and refusals as before the observed gates, none of them named by an observed gate,
    /// and no observed load.
    #[test]
    fn a_host_reporting_nothing_timed_gets_the_models_check(
        ops in prop::collection::vec(op(), 1..200),
    ) {
        let router = BalancedRouter::new(3).expect("router");
        for shed in replay(&router, &ops, false) {
            prop_assert!(matches!(shed.gate, Gate::Model | Gate::Prompt), "{:?}", shed);
            prop_assert!(consistent(&shed), "{:?}", shed);
        }
        for w in router.fleet_signals().workers {
            prop_assert_eq!(w.observed, None);
        }
    }
}
