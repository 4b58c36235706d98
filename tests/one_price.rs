//! One prediction, read everywhere: what admission checks is what a decision records, and a
//! receipt's costs rank the candidates as the policy chose among them. Through the public
//! API, on fleets of any load, with timings reported (so that admission forecasts) or not.

use std::time::Duration;

use prefix_router::{
    BalancedConfig, BalancedRouter, EngineLoad, Error, Priority, RouteDecision, RouteRequest,
    Router, Scoring, WorkerId,
};
use proptest::prelude::*;

const TTFT_TARGET_S: f64 = 2.0;
const TPOT_TARGET_S: f64 = 0.1;

/// A router with `config` over `loads.len()` workers, each told its load at time 0.
fn fleet(config: BalancedConfig, loads: &[(u64, u64, u64)]) -> BalancedRouter {
    let router = BalancedRouter::with_config(loads.len() as u32, config).expect("router");
    for (w, &(waiting, running, prefill)) in loads.iter().enumerate() {
        let load = EngineLoad::new(waiting, running, Duration::ZERO).with_prefill_tokens(prefill);
        router
            .report_load(WorkerId::new(w as u32), load)
            .expect("report");
    }
    router
}

/// A prompt of `n` tokens sharing its first `shared` with every other prompt.
fn prompt(seed: u32, n: u32, shared: u32) -> Vec<u32> {
    (0..n)
        .map(|i| {
            if i < shared {
                i
            } else {
                seed.wrapping_mul(2_654_435_761) ^ (i + 1_000_000)
            }
        })
        .collect()
}

fn arb_loads() -> impl Strategy<Value = Vec<(u64, u64, u64)>> {
    prop::collection::vec((0u64..40, 0u64..200, 0u64..200_000), 1..8)
}

/// Routes `requests` (seed, length, shared length, output) one after another 10 ms apart,
/// reporting a first token `factor` times its prediction for every other admitted one
/// when `timed`; returns the admitted decisions.
fn drive(
    router: &BalancedRouter,
    requests: &[(u32, u32, u32, u32)],
    (timed, factor): (bool, f64),
) -> Vec<RouteDecision> {
    let mut admitted = Vec::new();
    for (k, &(seed, n, shared, output)) in requests.iter().enumerate() {
        let tokens = prompt(seed, n, shared.min(n));
        let request = RouteRequest::new(&tokens)
            .with_time(Duration::from_millis(10 * k as u64))
            .with_ttft_target(Duration::from_secs_f64(TTFT_TARGET_S))
            .with_tpot_target(Duration::from_secs_f64(TPOT_TARGET_S))
            .with_priority(Priority::Standard)
            .with_expected_output(output);
        match router.route(&request) {
            Ok(d) => {
                // Every request fits an idle worker's target: none is admitted as oversized.
                assert!(
                    d.predicted_ttft_s() <= TTFT_TARGET_S,
                    "admitted at a predicted {} s against a {TTFT_TARGET_S} s target",
                    d.predicted_ttft_s()
                );
                assert!(
                    d.predicted_tpot_s() <= TPOT_TARGET_S,
                    "admitted at a predicted {} s per token against {TPOT_TARGET_S} s",
                    d.predicted_tpot_s()
                );
                if timed && k % 2 == 0 {
                    let s = (factor * d.predicted_ttft_s()).max(1e-3);
                    router.first_token_after(&d, Duration::from_secs_f64(s));
                }
                admitted.push(d);
            }
            Err(Error::Shed(_)) => {}
            Err(e) => panic!("{e}"),
        }
    }
    admitted
}

fn arb_requests() -> impl Strategy<Value = Vec<(u32, u32, u32, u32)>> {
    prop::collection::vec((any::<u32>(), 16u32..8_000, 0u32..4_000, 1u32..256), 1..60)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// An admitted request records the prediction admission held to its targets: its
    /// predicted time to first token and per output token are within them, whether the
    /// host reports timings (admission forecasts) or not.
    #[test]
    fn a_decision_records_what_admission_checked(
        loads in arb_loads(),
        requests in arb_requests(),
        timed in any::<bool>(),
        factor in 0.5f64..3.0,
    ) {
        let router = fleet(BalancedConfig::default(), &loads);
        let admitted = drive(&router, &requests, (timed, factor));
        for d in &admitted {
            router.complete(d);
        }
    }

    /// The chosen worker's receipt cost is the least of its receipt, for both scorings:
    /// a receipt explains the choice it comes with.
    #[test]
    fn a_receipt_ranks_as_the_policy_chose(
        loads in arb_loads(),
        requests in arb_requests(),
        weighted in any::<bool>(),
    ) {
        let scoring = if weighted { Scoring::Weighted } else { Scoring::PredictedTtft };
        let router = fleet(BalancedConfig::default().with_scoring(scoring), &loads);
        for &(seed, n, shared, _) in &requests {
            let tokens = prompt(seed, n, shared.min(n));
            let (d, receipt) = router
                .route_with_receipt(&RouteRequest::new(&tokens))
                .expect("routed");
            let total = |w: WorkerId| {
                receipt
                    .candidates
                    .iter()
                    .find(|line| line.worker == w)
                    .and_then(|line| line.cost.as_ref())
                    .map(|cost| cost.total())
                    .expect("every candidate explained")
            };
            let least = receipt
                .candidates
                .iter()
                .map(|line| total(line.worker))
                .fold(f64::INFINITY, f64::min);
            let chosen = total(d.worker());
            // Predicted time ranks in whole nanoseconds: a choice within a few of the least.
            prop_assert!(
                chosen <= least + 1e-8,
                "chose {:?} at {chosen}, the least is {least}: {receipt}",
                d.worker()
            );
        }
    }
}
