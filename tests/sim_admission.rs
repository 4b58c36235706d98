//! Admission in the simulator: refused requests are counted by priority and never run,
//! critical ones are never refused, and without admission nothing is.

#![cfg(feature = "sim")]
#![allow(clippy::unwrap_used)]

use prefix_router::sim::*;
use prefix_router::*;

/// Four small workers under the conversations workload at many times its rate: past what
/// they can serve within a second.
fn overloaded() -> ClusterConfig {
    ClusterConfig::default()
        .with_workers(4)
        .with_engine(Engine::Batched)
        .with_capacity_tokens(200_000)
        .with_prefill_tokens_per_s(4_000.0)
        .with_speedup(40.0)
        .with_ttft_target_s(1.0)
        .with_measure_decision_time(false)
}

fn conversations() -> Vec<Request> {
    Workload::builtin()[1].1.generate(5)
}

fn run(config: ClusterConfig) -> SimReport {
    let router = BalancedRouter::with_config(
        config.workers,
        BalancedConfig::default().with_prefill_tokens_per_s(config.prefill_tokens_per_s),
    )
    .unwrap();
    Simulation::new(conversations(), config)
        .unwrap()
        .run(&router)
        .unwrap()
}

#[test]
fn admission_sheds_by_priority_and_loses_nothing() {
    let mix = PriorityMix::parse("critical:0.2,standard:0.4,sheddable:0.4").unwrap();
    let report = run(overloaded().with_admission(true).with_priorities(mix));
    assert!(report.shed > 0, "nothing shed under overload");
    let [sheddable, standard, critical] = report.shed_by_priority;
    assert_eq!(critical, 0, "a critical request was shed");
    assert_eq!(sheddable + standard, report.shed);
    // Every record carries its request's priority, run or shed: about a fifth critical.
    let criticals = report
        .request_records
        .iter()
        .filter(|r| r.priority == Priority::Critical)
        .count();
    let share = criticals as f64 / report.request_records.len() as f64;
    assert!(
        (0.15..0.25).contains(&share),
        "{criticals} critical records"
    );
    // Every request is accounted for: run to its end, shed, or dropped as too large.
    let records = &report.request_records;
    for r in records {
        let ran = r.e2e_s.is_some();
        assert!(
            [ran, r.shed, r.rejected].iter().filter(|&&b| b).count() == 1,
            "request {} is neither run, shed nor rejected: {r:?}",
            r.index
        );
        assert_eq!(r.shed, r.ttft_s.is_none() && !r.rejected);
    }
    // Sheddable requests go first: a larger share of them is shed than of standard ones.
    let of = |p: Priority| records.iter().filter(|r| r.priority == p).count().max(1) as f64;
    let share = |n: usize, p: Priority| n as f64 / of(p);
    assert!(
        share(sheddable, Priority::Sheddable) > share(standard, Priority::Standard),
        "sheddable {sheddable} of {}, standard {standard} of {}",
        of(Priority::Sheddable),
        of(Priority::Standard)
    );
    assert!(
        report
            .to_json()
            .contains(&format!("\"shed\":{}", report.shed))
    );
}

#[test]
fn admission_improves_goodput_under_overload() {
    let without = run(overloaded());
    let with = run(overloaded().with_admission(true));
    assert_eq!(without.shed, 0);
    assert!(
        with.goodput_rps > without.goodput_rps,
        "goodput {} req/s with admission, {} without",
        with.goodput_rps,
        without.goodput_rps
    );
    // Admitted requests meet their target far more often than when every one is run.
    assert!(with.ttft_p50_s < without.ttft_p50_s);
}

/// Requests ask for admission at both goodput targets: with a time-to-first-token target
/// every request meets, none is refused for its first token, and the decode bound refuses
/// at most the needless-shed share (the requests' time per output token stays within its
/// target); with a time-per-output-token target no decode step meets, every request is
/// refused, for its decode.
#[test]
fn admission_holds_requests_to_the_tpot_target_too() {
    let lenient = overloaded().with_speedup(1.0).with_ttft_target_s(1e6);
    let report = run(lenient.with_admission(true));
    let by = |gate: Gate| report.shed_by_gate[GATES.iter().position(|&g| g == gate).unwrap()];
    for gate in [Gate::Model, Gate::Prompt, Gate::PrefillWindow] {
        assert_eq!(by(gate), 0, "shed for its first token by {}", gate.name());
    }
    assert!(
        by(Gate::DecodeBound) * 200 <= report.requests,
        "{} of {} refused by the decode bound",
        by(Gate::DecodeBound),
        report.requests
    );
    assert!(report.tpot_p99_s <= 0.1, "TPOT p99 {} s", report.tpot_p99_s);
    let report = run(lenient.with_tpot_target_s(1e-9).with_admission(true));
    assert_eq!(
        report.shed, report.requests,
        "a request ran past its TPOT target"
    );
}

/// Targets longer than a `Duration` holds are valid and refuse nothing, whatever the
/// priority.
#[test]
fn targets_beyond_a_duration_refuse_nothing() {
    let mix = PriorityMix::parse("sheddable:0.5,standard:0.5").unwrap();
    let huge = overloaded()
        .with_speedup(1.0)
        .with_ttft_target_s(1e300)
        .with_tpot_target_s(f64::MAX)
        .with_priorities(mix);
    let report = run(huge.with_admission(true));
    assert_eq!(report.shed, 0);
}

#[test]
fn bad_priority_mixes_are_errors() {
    for spec in [
        "standard:0.5",
        "urgent:1",
        "standard:x",
        "standard:0.5,standard:0.5",
        "standard",
        "standard:1.5,sheddable:-0.5",
    ] {
        assert!(
            matches!(PriorityMix::parse(spec), Err(Error::InvalidConfig { .. })),
            "{spec}"
        );
    }
    let mix = PriorityMix::parse("sheddable:0.25,critical:0.75").unwrap();
    assert_eq!(mix.pick(0.1), Priority::Sheddable);
    assert_eq!(mix.pick(0.9), Priority::Critical);
}

/// The priorities of each session's records under `scope`: how many sessions had one
/// priority, and how many more than one.
fn sessions_by_priorities(scope: PriorityScope) -> (usize, usize) {
    let mix = PriorityMix::parse("critical:0.5,standard:0.5").unwrap();
    let config = overloaded()
        .with_speedup(1.0)
        .with_admission(true)
        .with_priorities(mix)
        .with_priority_scope(scope);
    let requests = conversations();
    let report = run(config);
    let mut seen: std::collections::HashMap<&str, Vec<Priority>> = Default::default();
    for r in &report.request_records {
        let session = requests[r.index].session.as_deref().unwrap();
        seen.entry(session).or_default().push(r.priority);
    }
    let mixed = seen
        .values()
        .filter(|p| p.iter().any(|q| *q != p[0]))
        .count();
    (seen.len() - mixed, mixed)
}

#[test]
fn a_session_draws_one_priority_for_its_requests() {
    let (one, mixed) = sessions_by_priorities(PriorityScope::Session);
    assert_eq!(mixed, 0, "a session's requests drew different priorities");
    assert!(one > 10, "{one} sessions");
    let (_, mixed) = sessions_by_priorities(PriorityScope::Request);
    assert!(
        mixed > 0,
        "drawn per request, every session kept one priority"
    );
}

/// A fleet that slows thirtyfold for 30 s and then recovers, under admission: in the minute
/// after the spell it serves within targets at least 0.9 of what the same fleet serves in
/// that minute when it never slowed. Admission must reopen once first tokens are fast
/// again, and what it learned in the spell must not hold it shut.
#[test]
fn admission_recovers_after_the_fleet_stalls() {
    let workload = Workload::SharedPrompts {
        requests: 4_800,
        systems: 50,
        system_tokens: 2_000,
        question_tokens: 200,
        zipf_s: 1.0,
        rate_per_s: 40.0,
        output_tokens: 100,
    };
    let requests = workload.generate(7);
    let config = ClusterConfig::default()
        .with_workers(4)
        .with_engine(Engine::Batched)
        .with_admission(true)
        .with_measure_decision_time(false);
    let goodput_per_s = |config: ClusterConfig| {
        let router = BalancedRouter::new(config.workers).unwrap();
        let report = Simulation::new(requests.clone(), config)
            .unwrap()
            .run(&router)
            .unwrap();
        let (ttft, tpot) = (config.ttft_target_s, config.tpot_target_s);
        let good = report
            .request_records
            .iter()
            .filter(|r| (60.0..120.0).contains(&r.arrival_s))
            .filter(|r| r.ttft_s.is_some_and(|t| t <= ttft))
            .filter(|r| r.tpot_s.is_none_or(|t| t <= tpot))
            .count();
        (good as f64 / 60.0, report.shed)
    };
    let (steady, steady_shed) = goodput_per_s(config);
    let spell = SlowSpell::new(30.0, 60.0, 30.0);
    let mut slowed = config;
    slowed.batch = slowed.batch.with_slow_spell(Some(spell));
    let (after, shed) = goodput_per_s(slowed);
    assert!(shed > steady_shed, "the spell refused nothing: {shed}");
    assert!(
        after >= 0.9 * steady,
        "{after:.2}/s in the minute after the spell against {steady:.2}/s without it"
    );
}
