//! Fleet signals: the counters a router keeps agree with the decisions it returned (a
//! naive model summing them), the best holder's reuse bounds the chosen worker's, rates run
//! on the requests' clock, and refusals are counted by reason, whichever rule made them.

use std::time::Duration;

use prefix_router::{
    Admit, BalancedRouter, Candidate, Error, LIMITS, Limit, Policy, PolicyRouter, Priority,
    RouteRequest, Router, WorkerId,
};
use proptest::prelude::*;

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]

    /// Routed, prompt, captured and uncached tokens are the sums of the decisions, per worker
    /// and in all; what the best holders held is at least what the chosen workers held.
    #[test]
    fn signals_sum_the_decisions(
        prompts in prop::collection::vec((0u32..6, 1usize..200), 1..60),
        workers in 1u32..6,
    ) {
        let router = BalancedRouter::new(workers).expect("router");
        let mut by_worker = vec![(0u64, 0u64, 0u64); workers as usize];
        for (i, (family, len)) in prompts.iter().enumerate() {
            // Prompts of one family share their beginning.
            let tokens: Vec<u32> = (0..*len as u32).map(|t| family * 1_000 + t).collect();
            let request = RouteRequest::new(&tokens).with_time(Duration::from_millis(i as u64));
            let d = router.route(&request).expect("route");
            let w = &mut by_worker[d.worker().index()];
            w.0 += 1;
            w.1 += d.prompt_tokens() as u64;
            w.2 += d.cached_tokens() as u64;
            if i % 3 == 0 {
                router.complete(&d);
            }
        }
        let signals = router.fleet_signals();
        prop_assert_eq!(signals.workers.len(), workers as usize);
        for (s, (routed, prompt, cached)) in signals.workers.iter().zip(&by_worker) {
            prop_assert_eq!(s.routed, *routed);
            prop_assert_eq!(s.prompt_tokens, *prompt);
            prop_assert_eq!(s.captured_tokens, *cached);
            prop_assert!(s.wait_s >= 0.0);
        }
        let prompt: u64 = by_worker.iter().map(|w| w.1).sum();
        let cached: u64 = by_worker.iter().map(|w| w.2).sum();
        prop_assert_eq!(signals.routed(), prompts.len() as u64);
        prop_assert_eq!(signals.uncached_tokens(), prompt - cached);
        prop_assert!(signals.available_tokens() >= signals.captured_tokens());
        prop_assert!(signals.available_tokens() <= prompt);
        prop_assert_eq!(signals.at, Duration::from_millis(prompts.len() as u64 - 1));
        prop_assert_eq!(signals.shed(), 0);
    }
}

/// Rates between two snapshots run on the requests' clock; a clock that did not move gives
/// none.
#[test]
fn rates_run_on_the_requests_clock() {
    let router = BalancedRouter::new(2).expect("router");
    let prompt: Vec<u32> = (0..160).collect();
    let at = |s| RouteRequest::new(&prompt).with_time(Duration::from_secs(s));
    router.route(&at(10)).expect("route");
    let before = router.fleet_signals();
    assert!(before.rates_since(&before).is_none());
    for s in [12, 14] {
        router.route(&at(s)).expect("route");
    }
    let rates = router
        .fleet_signals()
        .rates_since(&before)
        .expect("the clock moved");
    assert_eq!(rates.seconds, 4.0);
    assert_eq!(rates.requests_per_s, 0.5);
    // Both later requests found the prompt where the first went: nothing to prefill.
    assert_eq!(rates.uncached_tokens_per_s, 0.0);
    assert_eq!(rates.predicted_hit_ratio, 1.0);
}

/// A policy with its own admission rule: refuses everything but critical requests on its
/// own limit, or admits everything.
struct OwnRule(Admit);

impl Policy for OwnRule {
    fn name(&self) -> &'static str {
        "own_rule"
    }

    fn select(&self, _: &RouteRequest<'_>, _: &[Candidate]) -> usize {
        0
    }

    fn admit(&self, request: &RouteRequest<'_>, _: &[Candidate]) -> Admit {
        if request.priority() == Priority::Critical {
            Admit::Predicted
        } else {
            self.0
        }
    }
}

/// A policy's own rule decides, its refusals carry its limit with the load model's best
/// prediction, and the fleet signals count them by limit and priority.
#[test]
fn a_policy_s_own_rule_decides_and_is_counted() {
    let router =
        PolicyRouter::with_policy(2, OwnRule(Admit::Refuse(Limit::Kv)), Default::default())
            .expect("router");
    let tokens = vec![1u32; 64];
    let request = RouteRequest::new(&tokens).with_ttft_target(Duration::from_secs(60));
    for priority in [Priority::Sheddable, Priority::Standard, Priority::Standard] {
        let Err(Error::Shed(shed)) = router.route(&request.with_priority(priority)) else {
            panic!("the policy's rule refuses");
        };
        assert_eq!(shed.limit, Limit::Kv);
        assert!(
            shed.best_ttft < shed.target,
            "the prediction is reported all the same"
        );
    }
    router
        .route(&request.with_priority(Priority::Critical))
        .expect("the crate's rule admits a critical request");
    let signals = router.fleet_signals();
    let kv = LIMITS.iter().position(|l| *l == Limit::Kv).expect("kv");
    assert_eq!(signals.shed_by_limit[kv], 3);
    assert_eq!(signals.shed(), 3);
    assert_eq!(signals.shed_by_priority, [1, 2, 0]);
    assert_eq!(signals.routed(), 1);
    // Admitting everything: a target nobody meets is routed all the same.
    let open =
        PolicyRouter::with_policy(1, OwnRule(Admit::All), Default::default()).expect("router");
    let impossible = request.with_ttft_target(Duration::from_nanos(1));
    assert_eq!(
        open.route(&impossible).expect("admitted").worker(),
        WorkerId::new(0)
    );
}
