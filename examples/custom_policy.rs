//! A routing policy written outside the crate, compared in the simulator with built-in ones.
//!
//! ```sh
//! cargo run --release --example custom_policy
//! ```
//!
//! `LongestMatchWithin` routes to the worker holding the most of the prompt unless it has
//! `slack` more requests than the least loaded worker: about a dozen lines of policy. Wrapped
//! in a `PolicyRouter`, it gets load tracking, the cache mirror, event sync and the
//! simulator from the crate.

use prefix_router::sim::{ClusterConfig, Simulation, Workload};
use prefix_router::{
    BalancedRouter, Candidate, Error, IndexConfig, Policy, PolicyRouter, RoundRobinRouter,
    RouteRequest, Router, choose_min,
};

/// The longest cached prefix, unless its worker has `slack` more requests than the least
/// loaded one.
struct LongestMatchWithin {
    slack: u64,
}

impl Policy for LongestMatchWithin {
    fn name(&self) -> &'static str {
        "longest_match_within"
    }

    fn reads_cache(&self) -> bool {
        true
    }

    fn select(&self, request: &RouteRequest<'_>, candidates: &[Candidate]) -> usize {
        let least = candidates
            .iter()
            .map(Candidate::requests)
            .min()
            .unwrap_or(0);
        choose_min(request, candidates, |c| {
            let overloaded = c.requests() > least + self.slack;
            (
                overloaded,
                std::cmp::Reverse(c.cached_tokens()),
                c.requests(),
            )
        })
    }
}

fn main() -> Result<(), Error> {
    let workers = 8;
    let (name, workload) = &Workload::builtin()[1];
    let config = ClusterConfig::default()
        .with_workers(workers)
        .with_measure_decision_time(false);
    let sim = Simulation::new(workload.generate(42), config)?;
    let custom = PolicyRouter::with_policy(
        workers,
        LongestMatchWithin { slack: 4 },
        IndexConfig::default(),
    )?;
    let routers: [&dyn Router; 3] = [
        &RoundRobinRouter::new(workers)?,
        &custom,
        &BalancedRouter::new(workers)?,
    ];
    println!("workload {name}, {workers} workers");
    println!("| policy | hit ratio | TTFT p50 | TTFT p99 |");
    println!("|---|---|---|---|");
    for router in routers {
        let r = sim.run(router)?;
        println!(
            "| {} | {:.3} | {:.2} s | {:.2} s |",
            r.policy, r.hit_ratio, r.ttft_p50_s, r.ttft_p99_s
        );
    }
    Ok(())
}
