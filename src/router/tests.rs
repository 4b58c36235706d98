use super::*;

fn candidate(worker: u32, in_flight: u64, routed: u64) -> Candidate {
    Candidate {
        worker: WorkerId::new(worker),
        epoch: 1,
        in_flight,
        routed,
        assigned_prefill: 0,
        estimate: estimate::Estimate {
            requests: in_flight,
            ..Default::default()
        },
        matched_blocks: 0,
        cached_tokens: 0,
        cached_by_tier: [0; 4],
    }
}

#[test]
fn pick_min_breaks_ties_by_routed_then_rotation() {
    let cs = [candidate(0, 1, 5), candidate(1, 1, 2), candidate(2, 3, 0)];
    assert_eq!(pick_min(&cs, 0, |_, c| c.in_flight), Some(1));
    // Equal everything: the choice depends on the salt, and different salts reach every worker.
    let idle = [candidate(0, 0, 0), candidate(1, 0, 0), candidate(2, 0, 0)];
    let reached: std::collections::HashSet<usize> = (0..64)
        .filter_map(|salt| pick_min(&idle, salt, |_, _| 0))
        .collect();
    assert_eq!(reached.len(), 3);
    assert_eq!(pick_min(&[], 0, |_, c: &Candidate| c.in_flight), None);
}

#[test]
fn session_table_is_bounded_and_forgets_the_least_recent() {
    let config = AffinityConfig {
        max_sessions: 3,
        ..AffinityConfig::default()
    };
    let router = AffinityRouter::with_config(4, config).unwrap();
    let router = &router;
    let route = |s: &str| {
        let d = router
            .route(&RouteRequest::new(&[1]).with_session(s))
            .unwrap();
        router.complete(&d);
        d.worker()
    };
    let a = route("a");
    route("b");
    route("c");
    assert_eq!(route("a"), a, "a is remembered and refreshed");
    route("d"); // forgets b, the least recent
    assert_eq!(router.session_count(), 3);
}
