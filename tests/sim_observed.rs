//! The simulator's host reports what it observes: warm starts count only the measured
//! part, and admission in front of a fleet slower than the router believes keeps what it
//! admits within the targets once it has seen the fleet's first tokens and progress.

#![cfg(feature = "sim")]
#![allow(clippy::unwrap_used)]

use prefix_router::sim::*;
use prefix_router::*;

fn agentic() -> Vec<Request> {
    let (_, workload) = Workload::builtin()
        .into_iter()
        .find(|(name, _)| *name == "agentic_open")
        .unwrap();
    workload.generate(42)
}

fn config(speedup: f64) -> ClusterConfig {
    ClusterConfig::default()
        .with_engine(Engine::Batched)
        .with_speedup(speedup)
        .with_priorities(PriorityMix::parse("sheddable:0.3,standard:0.6,critical:0.1").unwrap())
        .with_measure_decision_time(false)
}

/// A fleet of eight workers three times slower than the router's model, which it is not
/// told.
fn slow_run(admission: bool) -> SimReport {
    let config = config(4.0).with_admission(admission);
    let fleet = WorkerSpec::parse_fleet("8x0.333", config.capacity_tokens).unwrap();
    let sim = Simulation::with_fleet(agentic(), config, fleet).unwrap();
    sim.run(&BalancedRouter::new(8).unwrap()).unwrap()
}

/// The 99th percentiles of the admitted requests' time to first token and per output
/// token, after the first `skip` arrivals.
fn admitted_p99(report: &SimReport, skip: usize) -> (f64, f64) {
    let mut records: Vec<&RequestRecord> = report.request_records.iter().collect();
    records.sort_by(|a, b| a.arrival_s.total_cmp(&b.arrival_s));
    let served = || records[skip..].iter().filter(|r| !r.shed);
    let p99 = |mut v: Vec<f64>| {
        v.sort_by(f64::total_cmp);
        v[(v.len() * 99 / 100).min(v.len() - 1)]
    };
    (
        p99(served().filter_map(|r| r.ttft_s).collect()),
        p99(served().filter_map(|r| r.tpot_s).collect()),
    )
}

#[test]
fn a_fleet_three_times_slower_is_admitted_within_its_targets() {
    let (ttft, tpot) = admitted_p99(&slow_run(true), 200);
    assert!(ttft <= 1.1 * 2.0, "admitted TTFT p99 {ttft}");
    assert!(tpot <= 1.1 * 0.1, "admitted TPOT p99 {tpot}");
    // Without admission the same fleet misses them: the bound is what keeps them.
    let (ttft, tpot) = admitted_p99(&slow_run(false), 200);
    assert!(ttft > 2.0 || tpot > 0.1, "TTFT p99 {ttft}, TPOT p99 {tpot}");
}

#[test]
fn a_warm_start_reports_only_the_measured_part() {
    let requests = agentic();
    let n = requests.len();
    let cold = Simulation::new(requests.clone(), config(2.0)).unwrap();
    let warm = Simulation::new(requests, config(2.0).with_warmup_s(30.0)).unwrap();
    assert_eq!(warm.requests().len(), n);
    for (w, c) in warm.requests().iter().zip(cold.requests()) {
        // The measured requests as given, arriving after 30 s at 1× (60 stored at 2×).
        assert!(w.prompt == c.prompt && w.output_tokens == c.output_tokens);
        assert!((w.arrival_s - c.arrival_s - 60.0).abs() < 1e-9);
    }
    let report = warm.run(&BalancedRouter::new(8).unwrap()).unwrap();
    assert_eq!(report.requests, n);
    assert_eq!(report.request_records.len(), n);
    for (i, r) in report.request_records.iter().enumerate() {
        assert_eq!(r.index, i);
        assert!(r.e2e_s.is_some(), "every measured request ran");
    }
    let first = report
        .request_records
        .iter()
        .map(|r| r.arrival_s)
        .fold(f64::INFINITY, f64::min);
    assert!(
        first >= 30.0,
        "the measured part starts after the warm-up: {first}"
    );
    assert!((0.0..=1.0).contains(&report.goodput_min_10s_ratio));
    let bad = ClusterConfig::default().with_warmup_s(-1.0);
    assert!(matches!(bad.validate(), Err(Error::InvalidConfig { .. })));
}
