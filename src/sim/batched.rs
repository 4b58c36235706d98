//! [`Engine::Batched`](super::Engine::Batched): the replay loop over iteration-level
//! workers ([`Scheduler`]), and what the router hears from them.
//!
//! A worker with work runs steps back to back; a step's outcomes (admissions, first
//! tokens, finished and preempted requests) take effect at its end, as an engine returns
//! them. The router hears: `first_token` at a request's first token, `complete` when it
//! finishes; with [`SyncMode::Feedback`] the cached tokens a request found at its first
//! admission; with [`SyncMode::Events`] every block the worker's pool cached or evicted,
//! one batch per step with the step's number as its sequence number.

use super::clock::{Clock, Tick};
use super::config::SyncMode;
use super::pool::PoolChange;
use super::report::SimReport;
use super::scheduler::{Outcome, Scheduler, Seq, Step};
use super::simulation::Simulation;
use super::tally::{Tally, Workers};
use crate::{CacheEvent, CacheSync, Error, RouteDecision, Router, WorkerId};

/// Timed event: worker `w`'s step ends.
const STEP_DONE: u8 = 0;

/// Replays `sim` through `router` on batched workers.
pub(super) fn run(
    sim: &Simulation,
    router: &dyn Router,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimReport, Error> {
    let events = router
        .cache_sync()
        .filter(|_| sim.config().sync == SyncMode::Events);
    let mut run = Run::new(sim, router, events);
    let n = sim.requests().len();
    while let Some((now, tick)) = run.clock.next(n, |i| sim.arrival(i)) {
        match tick {
            Tick::Arrival(i) => {
                progress(i + 1, n);
                run.arrive(i, now)?;
            }
            Tick::Timed(_, w) => run.step_done(w, now)?,
        }
    }
    Ok(run.report())
}

/// One modelled worker.
struct Worker {
    /// Relative speed: step times are divided by it.
    speed: f64,
    scheduler: Scheduler,
    /// The step running, if any.
    step: Option<Step>,
    /// Steps finished: the sequence number of its event batches.
    steps: u64,
    prefill_tokens: u64,
    busy_s: f64,
}

/// A routed request until it finishes.
struct Flight {
    decision: RouteDecision,
}

/// The state of one replay.
struct Run<'s> {
    sim: &'s Simulation,
    router: &'s dyn Router,
    feedback: Option<&'s dyn CacheSync>,
    events: Option<&'s dyn CacheSync>,
    workers: Vec<Worker>,
    seqs: Vec<Option<Seq>>,
    flights: Vec<Option<Flight>>,
    clock: Clock,
    tally: Tally,
    outcomes: Vec<Outcome>,
}

impl<'s> Run<'s> {
    /// A replay through `router`, publishing the workers' pool changes to `events`.
    fn new(sim: &'s Simulation, router: &'s dyn Router, events: Option<&'s dyn CacheSync>) -> Self {
        let cfg = sim.config();
        let record = events.is_some();
        let n = sim.requests().len();
        Self {
            sim,
            router,
            feedback: router
                .cache_sync()
                .filter(|_| cfg.sync == SyncMode::Feedback),
            events,
            workers: sim
                .fleet()
                .iter()
                .map(|spec| Worker {
                    speed: spec.speed,
                    scheduler: Scheduler::new(
                        spec.capacity_tokens / cfg.block_size,
                        cfg.block_size,
                        cfg.batch,
                        record,
                    ),
                    step: None,
                    steps: 0,
                    prefill_tokens: 0,
                    busy_s: 0.0,
                })
                .collect(),
            seqs: (0..n).map(|_| None).collect(),
            flights: (0..n).map(|_| None).collect(),
            clock: Clock::default(),
            tally: sim.tally(),
            outcomes: Vec::new(),
        }
    }

    /// Routes request `i` and queues it on its worker, which starts a step if idle.
    fn arrive(&mut self, i: usize, now: f64) -> Result<(), Error> {
        let routed = self.sim.route(self.router, i, now, &mut self.tally)?;
        let w = routed.worker;
        let output = self.sim.requests()[i].output_tokens;
        self.seqs[i] = Some(Seq::new(routed.tokens, routed.blocks, output));
        self.flights[i] = Some(Flight {
            decision: routed.decision,
        });
        self.workers[w].scheduler.enqueue(i);
        if self.workers[w].step.is_none() {
            self.start_step(w, now)?;
        }
        Ok(())
    }

    /// Builds and starts worker `w`'s next step at `now`, if it has work it can run.
    fn start_step(&mut self, w: usize, now: f64) -> Result<(), Error> {
        let mut outcomes = std::mem::take(&mut self.outcomes);
        outcomes.clear();
        let step = self.workers[w]
            .scheduler
            .schedule(&mut self.seqs, &mut outcomes);
        self.publish(w)?;
        for &o in &outcomes {
            self.handle(o, w, now)?;
        }
        self.outcomes = outcomes;
        if step.work.is_empty() {
            return Ok(());
        }
        let cfg = self.sim.config();
        let worker = &mut self.workers[w];
        let duration = step.duration(&cfg.batch, cfg.prefill_tokens_per_s) / worker.speed;
        worker.prefill_tokens += step.prefill as u64;
        worker.busy_s += duration;
        worker.step = Some(step);
        self.clock.schedule(now + duration, STEP_DONE, w);
        Ok(())
    }

    /// Worker `w`'s step ends at `now`: its outcomes take effect, and the next step starts.
    fn step_done(&mut self, w: usize, now: f64) -> Result<(), Error> {
        let Some(step) = self.workers[w].step.take() else {
            return Ok(());
        };
        let mut outcomes = std::mem::take(&mut self.outcomes);
        outcomes.clear();
        self.workers[w].scheduler.finish_step(
            &step,
            &mut self.seqs,
            self.sim.hasher(),
            &mut outcomes,
        );
        self.workers[w].steps += 1;
        self.publish(w)?;
        for &o in &outcomes {
            self.handle(o, w, now)?;
        }
        self.outcomes = outcomes;
        if self.workers[w].scheduler.has_work() {
            self.start_step(w, now)?;
        }
        Ok(())
    }

    /// What outcome `o` of worker `w` at `now` means to the router and the tally.
    fn handle(&mut self, o: Outcome, w: usize, now: f64) -> Result<(), Error> {
        match o {
            Outcome::Admitted { seq, hit } => {
                self.tally.admitted(seq, now, hit);
                if let (Some(sync), Some(s)) = (self.feedback, self.seqs[seq].as_ref()) {
                    sync.report_cached(WorkerId::new(w as u32), &s.prompt, hit)?;
                }
            }
            Outcome::FirstToken(i) => {
                self.tally.first_token(i, now);
                if let Some(f) = self.flights[i].as_ref() {
                    self.router.first_token(&f.decision);
                }
            }
            Outcome::Finished(i) => self.finish(i, now),
            Outcome::Preempted(i) => self.tally.preempted(i),
            Outcome::Rejected(i) => {
                self.tally.rejected(i);
                self.seqs[i] = None;
                if let Some(f) = self.flights[i].take() {
                    self.router.complete(&f.decision);
                }
            }
        }
        Ok(())
    }

    /// Request `i` has all its tokens.
    fn finish(&mut self, i: usize, now: f64) {
        let Some(flight) = self.flights[i].take() else {
            return;
        };
        self.router.complete(&flight.decision);
        self.seqs[i] = None;
        self.tally
            .finished(i, now, self.sim.requests()[i].output_tokens.max(1));
    }

    /// With event sync, applies worker `w`'s pool changes since the last call as one batch.
    fn publish(&mut self, w: usize) -> Result<(), Error> {
        let Some(sync) = self.events else {
            return Ok(());
        };
        let worker = &mut self.workers[w];
        let seq = worker.steps;
        for change in worker.scheduler.drain_changes() {
            let event = match change {
                PoolChange::Cached {
                    hash,
                    parent,
                    tokens,
                } => CacheEvent::stored(parent.map(|p| p.get()), vec![hash.get()], tokens),
                PoolChange::Evicted(hash) => CacheEvent::removed(vec![hash.get()]),
            };
            sync.apply_event(WorkerId::new(w as u32), seq, &event)?;
        }
        Ok(())
    }

    fn report(self) -> SimReport {
        let workers = Workers {
            prefill_tokens: self.workers.iter().map(|w| w.prefill_tokens).collect(),
            busy_s: self.workers.iter().map(|w| w.busy_s).collect(),
        };
        self.sim.report(self.router, self.tally, workers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sim::{ClusterConfig, Request};
    use crate::{CacheIndex, IndexConfig, RoundRobinRouter};
    use proptest::prelude::*;

    /// Prompts of 1 to 6 blocks of 4 tokens from an alphabet of 3 blocks (so that they
    /// share prefixes), arriving 0 to 30 ms apart, with 1 to 8 output tokens.
    fn requests() -> impl Strategy<Value = Vec<Request>> {
        let one = (
            proptest::collection::vec(0u32..3, 1..7),
            0u32..30,
            1u32..9,
            any::<bool>(),
        );
        proptest::collection::vec(one, 1..40).prop_map(|reqs| {
            let mut at = 0.0;
            reqs.into_iter()
                .map(|(blocks, gap_ms, output, odd)| {
                    at += f64::from(gap_ms) / 1_000.0;
                    let mut tokens: Vec<u32> = blocks
                        .iter()
                        .flat_map(|&b| (0..4).map(move |i| b * 10 + i))
                        .collect();
                    if odd {
                        tokens.push(99); // a partial last block
                    }
                    Request::new(at, tokens, output)
                })
                .collect()
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(64))]

        /// Fed every worker's pool changes with no delay and no loss, a mirror predicts
        /// exactly the prefix each worker's pool would give every prompt of the run, after
        /// every step: the events tell the whole truth.
        #[test]
        fn events_keep_a_mirror_equal_to_every_pool(
            requests in requests(),
            workers in 1u32..4,
            blocks in 2usize..12,
            budget in 4usize..24,
        ) {
            let config = ClusterConfig::default()
                .with_workers(workers)
                .with_block_size(4)
                .with_capacity_tokens(blocks * 4)
                .with_measure_decision_time(false)
                .with_batch(crate::sim::BatchConfig::default().with_max_num_batched_tokens(budget));
            let sim = Simulation::new(requests, config).unwrap();
            let router = RoundRobinRouter::new(workers).unwrap();
            let mirror = CacheIndex::new(IndexConfig::default().with_block_size(4)).unwrap();
            let mut run = Run::new(&sim, &router, Some(&mirror));
            let n = sim.requests().len();
            let mut arrived = 0;
            while let Some((now, tick)) = run.clock.next(n, |i| sim.arrival(i)) {
                match tick {
                    Tick::Arrival(i) => {
                        run.arrive(i, now).unwrap();
                        arrived = i + 1;
                    }
                    Tick::Timed(_, w) => run.step_done(w, now).unwrap(),
                }
                for w in 0..workers as usize {
                    for r in &sim.requests()[..arrived] {
                        let mut tokens = Vec::new();
                        r.prompt.tokens_into(&mut tokens);
                        let hashes = sim.hasher().hash(&tokens);
                        let truth = run.workers[w].scheduler.cached_prefix(&hashes) * 4;
                        let predicted = mirror.cached_tokens(WorkerId::new(w as u32), &[], &tokens);
                        prop_assert_eq!(predicted, truth, "worker {} at {}", w, now);
                    }
                }
            }
            let report = run.report();
            prop_assert_eq!(report.requests, n);
        }
    }
}
