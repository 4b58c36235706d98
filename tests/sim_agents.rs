//! Closed-loop agents in the simulator: a step arrives its tool's time after the answers it
//! waits for, sub-agents share their parent's context, and a session's completion time is
//! measured from its first arrival to its last token.

#![cfg(feature = "sim")]
#![allow(clippy::unwrap_used)]

use prefix_router::sim::*;
use prefix_router::*;

/// A small agent workload: 6 sessions of 5 steps, fanning out to 2 sub-agents of 2 steps
/// at steps 2 and 4.
fn agents() -> Workload {
    Workload::AgentLoop {
        sessions: 6,
        steps: 5,
        agents: 2,
        system_tokens: 400,
        task_tokens: 50,
        tool_tokens: 100,
        action_tokens: 20,
        tool_time_s: 1.0,
        rate_per_s: 2.0,
        fan_out_every: 2,
        subagents: 2,
        subagent_steps: 2,
    }
}

fn config(engine: Engine) -> ClusterConfig {
    ClusterConfig::default()
        .with_workers(3)
        .with_engine(engine)
        .with_speedup(2.0)
        .with_measure_decision_time(false)
}

fn run(requests: Vec<Request>, config: ClusterConfig) -> SimReport {
    let sim = Simulation::new(requests, config).unwrap();
    sim.run(&BalancedRouter::new(config.workers).unwrap())
        .unwrap()
}

/// Each session: 5 steps and 2 fan-outs of 2 sub-agents of 2 steps.
const PER_SESSION: usize = 5 + 2 * 2 * 2;

#[test]
fn the_workload_has_its_shape_and_every_wait_points_back() {
    let requests = agents().generate(3);
    assert_eq!(requests.len(), 6 * PER_SESSION);
    let starts = requests.iter().filter(|r| r.follows.is_none()).count();
    assert_eq!(starts, 6, "one start per session");
    for (i, r) in requests.iter().enumerate() {
        let Some(f) = &r.follows else { continue };
        assert!(!f.requests.is_empty() && f.requests.iter().all(|&p| p < i));
        assert!(f.gap_s >= 0.5, "half the tool time is fixed: {}", f.gap_s);
        let latest = f
            .requests
            .iter()
            .map(|&p| requests[p].arrival_s)
            .fold(0.0, f64::max);
        assert!((r.arrival_s - (latest + f.gap_s)).abs() < 1e-9);
    }
    // The steps after a fan-out wait for both sub-agents' last steps.
    let joins = requests
        .iter()
        .filter(|r| r.follows.as_ref().is_some_and(|f| f.requests.len() == 2))
        .count();
    assert_eq!(joins, 6 * 2);
}

#[test]
fn subagents_share_their_parents_context() {
    let requests = agents().generate(3);
    let mut subagents = 0;
    for r in &requests {
        let (Some(f), Some(session)) = (&r.follows, &r.session) else {
            continue;
        };
        let parent = &requests[f.requests[0]];
        let parent_session = parent.session.as_deref().unwrap();
        if parent_session.starts_with(session.as_str()) {
            continue; // a later step of the same session, or one after its sub-agents
        }
        subagents += 1;
        assert!(
            session.starts_with(parent_session),
            "{session} under {parent_session}"
        );
        let (mut mine, mut theirs) = (Vec::new(), Vec::new());
        r.prompt.tokens_into(&mut mine);
        parent.prompt.tokens_into(&mut theirs);
        assert!(mine.len() > theirs.len() + 20);
        assert_eq!(
            &mine[..theirs.len()],
            &theirs[..],
            "the parent's prompt first"
        );
    }
    assert_eq!(subagents, 6 * 2 * 2, "each sub-agent's first step");
}

#[test]
fn no_step_arrives_before_the_answers_it_waits_for() {
    for engine in [Engine::Simple, Engine::Batched] {
        let requests = agents().generate(5);
        let cfg = config(engine);
        let report = run(requests.clone(), cfg);
        let records = &report.request_records;
        assert!(records.iter().all(|r| r.e2e_s.is_some()), "all finish");
        for (r, req) in records.iter().zip(&requests) {
            let Some(f) = &req.follows else {
                assert!((r.arrival_s - req.arrival_s / cfg.speedup).abs() < 1e-9);
                continue;
            };
            let end = f
                .requests
                .iter()
                .map(|&p| records[p].arrival_s + records[p].e2e_s.unwrap())
                .fold(0.0, f64::max);
            let expected = end + f.gap_s / cfg.speedup;
            assert!(
                (r.arrival_s - expected).abs() < 1e-6,
                "{engine:?}: request {} arrived at {}, its answers ended at {end}",
                r.index,
                r.arrival_s
            );
        }
        assert_eq!(report.sessions, 6, "{engine:?}");
        assert!(report.session_p99_s >= report.session_p50_s);
        assert!(report.session_p50_s > report.e2e_p99_s);
    }
}

#[test]
fn seeded_closed_loop_runs_repeat_exactly() {
    let cfg = config(Engine::Batched);
    let a = run(agents().generate(9), cfg);
    let b = run(agents().generate(9), cfg);
    assert_eq!(a.request_records, b.request_records);
    assert_eq!(a.session_p99_s, b.session_p99_s);
    assert_ne!(agents().generate(9), agents().generate(10));
}

#[test]
fn a_refused_step_releases_what_waits_for_it() {
    let cfg = config(Engine::Batched)
        .with_workers(1)
        .with_prefill_tokens_per_s(2_000.0)
        .with_speedup(50.0)
        .with_ttft_target_s(0.3)
        .with_admission(true);
    let report = run(agents().generate(5), cfg);
    assert!(report.shed > 0, "nothing shed");
    for r in &report.request_records {
        assert!(r.shed || r.e2e_s.is_some(), "request {} lost", r.index);
    }
    assert!(
        report.sessions < 6,
        "a session with a refused step is not complete"
    );
}

#[test]
fn a_wait_that_does_not_point_back_is_refused() {
    let request = |follows: Option<Follows>| {
        let r = Request::new(0.0, vec![1, 2, 3], 4);
        match follows {
            Some(f) => r.with_follows(f),
            None => r,
        }
    };
    for (follows, what) in [
        (Follows::new(vec![1], 1.0), "itself"),
        (Follows::new(vec![2], 1.0), "a later request"),
        (Follows::new(vec![], 1.0), "nothing"),
        (Follows::new(vec![0], -1.0), "a negative gap"),
        (Follows::new(vec![0], f64::NAN), "a gap that is no number"),
    ] {
        let requests = vec![request(None), request(Some(follows)), request(None)];
        let err = Simulation::new(requests, config(Engine::Batched)).unwrap_err();
        assert!(
            matches!(err, Error::InvalidConfig { .. }),
            "{what}: {err:?}"
        );
    }
}
