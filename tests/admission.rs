//! Admission: a request with a time-to-first-token target is refused exactly when no worker
//! is predicted to meet it, sheddable requests go before standard ones and critical ones
//! never, and a refusal charges nothing.

use std::time::Duration;

use prefix_router::{
    AdmissionConfig, BalancedConfig, BalancedRouter, EngineLoad, Error, Limit, LoadConfig,
    Priority, RouteRequest, Router, WorkerId,
};
use proptest::prelude::*;

/// A router over `loads.len()` workers, each told its load.
fn fleet(loads: &[EngineLoad]) -> BalancedRouter {
    let router = BalancedRouter::new(loads.len() as u32).expect("router");
    for (w, load) in loads.iter().enumerate() {
        router
            .report_load(WorkerId::new(w as u32), *load)
            .expect("report");
    }
    router
}

fn load(waiting: u64, running: u64, prefill: u64) -> EngineLoad {
    EngineLoad::new(waiting, running, Duration::ZERO).with_prefill_tokens(prefill)
}

fn admitted(router: &BalancedRouter, request: &RouteRequest<'_>) -> bool {
    match router.route(request) {
        Ok(decision) => {
            router.complete(&decision);
            true
        }
        Err(Error::Shed(_)) => false,
        Err(e) => panic!("unexpected error {e}"),
    }
}

fn arb_load() -> impl Strategy<Value = EngineLoad> {
    (0u64..300, 0u64..300, 0u64..2_000_000).prop_map(|(w, r, p)| load(w, r, p))
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(200))]

    /// The fleet refuses a request exactly when each of its workers, alone, would: the
    /// refusal holds for every worker's prediction, and one worker meeting the targets is
    /// enough to admit it.
    #[test]
    fn shedding_is_exact(
        loads in prop::collection::vec(arb_load(), 1..8),
        prompt in 16usize..20_000,
        target_ms in 1u64..60_000,
        tpot_us in prop::option::of(1_000u64..200_000),
        sheddable in any::<bool>(),
    ) {
        let tokens: Vec<u32> = (0..prompt as u32).collect();
        let priority = if sheddable { Priority::Sheddable } else { Priority::Standard };
        let mut request = RouteRequest::new(&tokens)
            .with_ttft_target(Duration::from_millis(target_ms))
            .with_priority(priority);
        if let Some(us) = tpot_us {
            request = request.with_tpot_target(Duration::from_micros(us));
        }
        let alone: Vec<bool> = loads
            .iter()
            .map(|l| admitted(&fleet(&[*l]), &request))
            .collect();
        let router = fleet(&loads);
        match router.route(&request) {
            Ok(decision) => {
                prop_assert!(alone.iter().any(|&a| a), "admitted though no worker alone admits");
                // It went to a worker that meets the target alone.
                prop_assert!(alone[decision.worker().index()]);
            }
            Err(Error::Shed(shed)) => {
                prop_assert!(alone.iter().all(|&a| !a), "shed though a worker alone admits");
                let over_tpot = shed.tpot_target.is_some_and(|t| shed.best_tpot > t);
                prop_assert!(shed.best_ttft > shed.target || over_tpot);
                prop_assert_eq!(shed.priority, priority);
                // Asking for the best predictions (and a little more) admits it.
                let relax = |d: Duration| (d + Duration::from_micros(10)).mul_f64(1.0 / share(priority));
                let mut relaxed = request.with_ttft_target(relax(shed.best_ttft));
                if tpot_us.is_some() {
                    relaxed = relaxed.with_tpot_target(relax(shed.best_tpot));
                }
                prop_assert!(admitted(&router, &relaxed));
            }
            Err(e) => return Err(TestCaseError::fail(format!("unexpected error {e}"))),
        }
    }

    /// A critical request is never refused.
    #[test]
    fn critical_is_never_shed(
        loads in prop::collection::vec(arb_load(), 1..8),
        prompt in 16usize..200_000,
        target_ms in 1u64..10_000,
    ) {
        let tokens: Vec<u32> = (0..prompt as u32).collect();
        let request = RouteRequest::new(&tokens)
            .with_ttft_target(Duration::from_millis(target_ms))
            .with_priority(Priority::Critical);
        prop_assert!(fleet(&loads).route(&request).is_ok());
    }
}

fn share(priority: Priority) -> f64 {
    match priority {
        Priority::Sheddable => AdmissionConfig::default().sheddable_share,
        _ => 1.0,
    }
}

/// Under a rising queue, sheddable requests are refused first, then standard ones;
/// critical ones never.
#[test]
fn lower_priorities_go_first() {
    let tokens = vec![1u32; 4_096];
    let first_shed = |priority: Priority| {
        (0..200u64).find(|&step| {
            let queued = step * 5_000;
            let router = fleet(&[load(step, 4, queued), load(step, 4, queued)]);
            let request = RouteRequest::new(&tokens)
                .with_ttft_target(Duration::from_secs(2))
                .with_priority(priority);
            !admitted(&router, &request)
        })
    };
    let sheddable = first_shed(Priority::Sheddable).expect("sheddable shed at some load");
    let standard = first_shed(Priority::Standard).expect("standard shed at some load");
    assert!(
        sheddable < standard,
        "sheddable at {sheddable}, standard at {standard}"
    );
    assert_eq!(first_shed(Priority::Critical), None);
}

/// A refused request charges no worker and records nothing in the mirror.
#[test]
fn a_refusal_charges_nothing() {
    let router = fleet(&[load(100, 8, 900_000), load(100, 8, 900_000)]);
    let before: Vec<_> = (0..2)
        .map(|w| router.load(WorkerId::new(w)).expect("load").in_flight)
        .collect();
    let tokens = vec![3u32; 8_192];
    let request = RouteRequest::new(&tokens).with_ttft_target(Duration::from_millis(500));
    let Err(Error::Shed(shed)) = router.route(&request) else {
        panic!("expected a refusal");
    };
    assert_eq!(shed.limit, Limit::Queue);
    assert!(shed.retry_after.is_some_and(|d| d > Duration::ZERO));
    let after: Vec<_> = (0..2)
        .map(|w| router.load(WorkerId::new(w)).expect("load").in_flight)
        .collect();
    assert_eq!(before, after);
    // Without a target the same request is routed, and finds nothing cached: the refusal
    // did not record its prompt.
    let decision = router.route(&RouteRequest::new(&tokens)).expect("routed");
    assert_eq!(decision.cached_tokens(), 0);
}

/// A router over one worker with `load`, admitting oversized requests whose wait is within
/// `share` of their target.
fn oversized_fleet(load: EngineLoad, share: f64) -> BalancedRouter {
    let admission = AdmissionConfig::default().with_oversized_wait_share(share);
    let mut config = BalancedConfig::default();
    config.load = LoadConfig::default().with_admission(admission);
    let router = BalancedRouter::with_config(1, config).expect("router");
    router.report_load(WorkerId::new(0), load).expect("report");
    router
}

/// A prompt whose own prefill misses the target even on an idle worker is served where it
/// waits little, and refused as such (no wait helps) where the fleet is busy, or always
/// when oversized requests may not wait at all.
#[test]
fn a_prompt_too_long_for_its_target() {
    let tokens = vec![5u32; 200_000];
    let request = RouteRequest::new(&tokens).with_ttft_target(Duration::from_secs(1));
    assert!(admitted(&oversized_fleet(load(0, 0, 0), 1.0), &request));
    for (busy, share) in [(load(40, 200, 2_000_000), 1.0), (load(0, 0, 0), 0.0)] {
        let Err(Error::Shed(shed)) = oversized_fleet(busy, share).route(&request) else {
            panic!("expected a refusal");
        };
        assert_eq!(shed.limit, Limit::Prompt);
        assert_eq!(shed.retry_after, None);
        assert!(shed.to_string().contains("bound by prompt"), "{shed}");
    }
}

/// A time-per-output-token target alone asks for admission: a worker whose decodes are
/// many and long is refused for it ([`Limit::Decode`]), an idle one takes the request.
#[test]
fn a_tpot_target_refuses_a_busy_decoder() {
    let tokens = vec![3u32; 1_000];
    let request = RouteRequest::new(&tokens).with_tpot_target(Duration::from_millis(30));
    assert!(admitted(&fleet(&[load(0, 0, 0)]), &request));
    let router = fleet(&[load(0, 250, 0).with_kv_blocks(900_000, 1_000_000)]);
    let Err(Error::Shed(shed)) = router.route(&request) else {
        panic!("expected a refusal");
    };
    assert_eq!(shed.limit, Limit::Decode);
    assert_eq!(shed.tpot_target, Some(Duration::from_millis(30)));
    assert!(shed.best_tpot > Duration::from_millis(30), "{shed}");
    assert!(shed.to_string().contains("per output token"), "{shed}");
}

/// A sheddable request is held to a share of its time-to-first-token target, and to the
/// whole of its time-per-output-token target, as every request is: a decode step is shared
/// by the requests running there, so a share of it would spare no standard request. On a
/// worker whose predicted decode step is two thirds of the target, a sheddable request is
/// admitted; one whose first token is predicted past half its target is not.
#[test]
fn a_sheddable_request_shares_the_steps_whole() {
    let tokens = vec![3u32; 1_000];
    let router = fleet(&[load(0, 250, 0).with_kv_blocks(900_000, 1_000_000)]);
    let probe = RouteRequest::new(&tokens).with_tpot_target(Duration::from_micros(1));
    let Err(Error::Shed(shed)) = router.route(&probe) else {
        panic!("expected a refusal for the decode");
    };
    let step = shed.best_tpot;
    let target = step.mul_f64(1.5);
    for priority in [Priority::Standard, Priority::Sheddable] {
        let request = RouteRequest::new(&tokens)
            .with_tpot_target(target)
            .with_priority(priority);
        assert!(admitted(&router, &request), "{priority:?} at {step:?}");
    }
    // Its first token is held to half the target: refused where that half is passed.
    let ttft = shed.best_ttft.mul_f64(1.5);
    let request = RouteRequest::new(&tokens)
        .with_ttft_target(ttft)
        .with_tpot_target(target);
    assert!(admitted(&router, &request));
    let Err(Error::Shed(refused)) = router.route(&request.with_priority(Priority::Sheddable))
    else {
        panic!("expected a refusal for the first token");
    };
    assert_eq!(refused.tpot_target, Some(target), "{refused}");
    assert_eq!(refused.target, ttft.mul_f64(0.5), "{refused}");
}

/// The prefill queued on a worker runs before a new request's first token, so it does not
/// count against the request's time-per-output-token target: a short answer behind a long
/// queue of prompts, on a worker with few decodes, is admitted for its decode (a generous
/// time-to-first-token target leaves the queue to it), and refused only for its first token.
#[test]
fn queued_prefill_does_not_count_against_the_tpot_target() {
    let tokens = vec![3u32; 1_000];
    let router = fleet(&[load(20, 2, 200_000)]);
    let short = RouteRequest::new(&tokens).with_expected_output(4);
    let request = short.with_tpot_target(Duration::from_millis(30));
    assert!(admitted(&router, &request));
    let lenient = request.with_ttft_target(Duration::from_secs(3_600));
    assert!(admitted(&router, &lenient));
    let Err(Error::Shed(shed)) =
        router.route(&request.with_ttft_target(Duration::from_millis(100)))
    else {
        panic!("expected a refusal for the first token");
    };
    // The queue ahead bounds it, as the model's check found: not its decode.
    assert_eq!(shed.limit, Limit::Queue, "{shed}");
    assert_eq!(shed.gate, prefix_router::Gate::Model, "{shed}");
    assert!(shed.best_tpot <= Duration::from_millis(30), "{shed}");
}

/// A target as long as a `Duration` holds asks for admission and refuses nothing, a
/// sheddable request's share of it included.
#[test]
fn the_longest_target_refuses_nothing() {
    let tokens = vec![3u32; 1_000];
    let request = RouteRequest::new(&tokens)
        .with_ttft_target(Duration::MAX)
        .with_tpot_target(Duration::MAX)
        .with_priority(Priority::Sheddable);
    for share in [0.5, 1.0] {
        let admission = AdmissionConfig::default().with_sheddable_share(share);
        let held = admission.target_of(Priority::Sheddable, Duration::MAX);
        assert!(held >= Duration::from_secs(1 << 40), "{held:?}");
        // A router with that share, on a worker past any finite target, admits it.
        let mut config = BalancedConfig::default();
        config.load = LoadConfig::default().with_admission(admission);
        let router = BalancedRouter::with_config(1, config).expect("router");
        router
            .report_load(WorkerId::new(0), load(300, 250, 2_000_000))
            .expect("report");
        assert!(admitted(&router, &request), "share {share}");
    }
}

/// Bad settings and names are errors, not panics.
#[test]
fn bad_admission_settings_are_errors() {
    let bad = [0.0, -1.0, 1.5, f64::NAN]
        .map(|share| AdmissionConfig::default().with_sheddable_share(share))
        .into_iter()
        .chain(
            [-0.1, 1.5, f64::NAN]
                .map(|share| AdmissionConfig::default().with_oversized_wait_share(share)),
        );
    for admission in bad {
        let mut config = BalancedConfig::default();
        config.load = LoadConfig::default().with_admission(admission);
        assert!(matches!(
            BalancedRouter::with_config(2, config),
            Err(Error::InvalidConfig { .. })
        ));
    }
    assert!(matches!(
        Priority::parse("urgent"),
        Err(Error::InvalidConfig { .. })
    ));
    for p in Priority::ALL {
        assert_eq!(Priority::parse(p.name()).expect("own name"), p);
    }
}
