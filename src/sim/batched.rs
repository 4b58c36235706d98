//! [`Engine::Batched`](super::Engine::Batched): the replay loop over iteration-level
//! workers ([`Scheduler`]), and what the router replicas hear from them.
//!
//! A worker with work runs steps back to back; a step's outcomes (admissions, first
//! tokens, finished and preempted requests) take effect at its end, as an engine returns
//! them. A step that would start at an instant when more requests are still to arrive
//! starts once they all have (and been routed): as vLLM's engine drains its input queue
//! before it schedules a step, and as NVIDIA's replay releases every arrival of an instant
//! before it drives its engines (`aisimulate-core` 0.13.0, `src/replay/agg.rs:885-890`),
//! requests arriving together on an idle worker share its first step.
//!
//! The replica that routed a request hears `first_token` at its first token, `complete`
//! when it finishes, and with [`SyncMode::Feedback`] the cached tokens it found at its
//! first admission. Every replica hears each worker's load
//! ([`Router::report_load`](crate::Router::report_load)) every
//! [`ClusterConfig::scrape_interval_s`](super::ClusterConfig::scrape_interval_s) and, with
//! [`SyncMode::Events`], every block its pool caches or evicts, through the [`EventBus`].
//! A [`Fault`](super::Fault) takes a worker out: its requests are routed again and it
//! returns empty. A disaggregated fleet runs on the same loop (the [`pd`] module).

use super::clock::{Clock, Tick};
use super::config::SyncMode;
use super::events::{DELIVER, EventBus, REPLAY};
use super::replica_bus::{ReplicaBus, SYNC};
use super::replicas::{Replica, Replicas};
use super::report::SimReport;
use super::rng::Rng;
use super::scheduler::{Outcome, Scheduler, Seq, Step};
use super::simulation::Simulation;
use super::tally::{Tally, Workers};
use crate::error::Error;
use crate::request::RouteDecision;
use crate::sync::CacheSync;
use crate::tree::WorkerId;

mod pd;

pub(super) use pd::run as run_pd;

/// Timed events, in the order they go at equal times (with [`DELIVER`] = 1 and
/// [`REPLAY`] = 2 of the event bus). A step's end: subject `worker + workers × generation`.
const STEP_DONE: u8 = 0;
/// Every worker reports its load (subject 0).
const SCRAPE: u8 = 3;
/// Fault `k` takes its worker out (subject `k`).
const DOWN: u8 = 4;
/// Fault `k`'s worker returns (subject `k`).
const UP: u8 = 5;
/// Request `i`'s KV has moved to its decode worker (subject `i`; disaggregated runs).
const HANDOFF: u8 = 6;

/// Replays `sim` through `replicas` on batched workers.
pub(super) fn run(
    sim: &Simulation,
    replicas: Replicas<'_>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimReport, Error> {
    Run::with_replicas_sinks(sim, replicas).drive(progress)
}

/// One modelled worker.
struct Worker {
    /// Relative speed: step times are divided by it.
    speed: f64,
    scheduler: Scheduler,
    /// The step running and when it ends, if any.
    step: Option<(Step, f64)>,
    /// Restarts so far: a step-end tick of an earlier generation is void.
    generation: usize,
    /// Whether the worker is out of the fleet (a fault).
    down: bool,
    /// The sequence number of its next event batch.
    batches: u64,
    prefill_tokens: u64,
    busy_s: f64,
    /// Draws each step's jitter ([`BatchConfig::step_jitter`](super::BatchConfig)).
    jitter: Rng,
}

/// A routed request until it finishes.
struct Flight {
    replica: Replica,
    decision: RouteDecision,
    /// When it was routed, seconds.
    at: f64,
}

/// The state of one replay.
struct Run<'s> {
    sim: &'s Simulation,
    replicas: Replicas<'s>,
    bus: EventBus<'s>,
    /// Replica sync's frames between the replicas.
    sync: ReplicaBus,
    workers: Vec<Worker>,
    seqs: Vec<Option<Seq>>,
    flights: Vec<Option<Flight>>,
    clock: Clock<'s>,
    tally: Tally,
    outcomes: Vec<Outcome>,
    /// The disaggregated run's state; `None` for a run through plain routers.
    pd: Option<pd::PdHost<'s>>,
    /// Idle workers with work whose step waits for the requests still to arrive at the
    /// current instant (each at most once; empty whenever no arrival is pending at the
    /// current instant, see [`Run::start_deferred`]).
    deferred: Vec<usize>,
}

impl<'s> Run<'s> {
    /// A replay through `replicas`, publishing the workers' pool changes to each replica
    /// that takes engine events.
    fn with_replicas_sinks(sim: &'s Simulation, replicas: Replicas<'s>) -> Self {
        let sinks = replicas
            .iter()
            .map(|(r, _)| sim.sync_of(&replicas, r, SyncMode::Events))
            .collect();
        Self::new(sim, replicas, sinks)
    }

    /// A replay through `replicas`, publishing the workers' pool changes to `sinks` (one
    /// per replica).
    fn new(
        sim: &'s Simulation,
        replicas: Replicas<'s>,
        sinks: Vec<Option<&'s dyn CacheSync>>,
    ) -> Self {
        let cfg = sim.config();
        let bus = EventBus::new(sinks, sim.fleet().len(), cfg);
        let n = sim.replayed().len();
        Self {
            sim,
            replicas,
            workers: (0..sim.fleet().len())
                .map(|w| Self::fresh_worker(sim, w, bus.is_listened()))
                .collect(),
            bus,
            sync: ReplicaBus::new(cfg),
            seqs: (0..n).map(|_| None).collect(),
            flights: (0..n).map(|_| None).collect(),
            clock: sim.clock(),
            tally: sim.tally(),
            outcomes: Vec::new(),
            pd: None,
            deferred: Vec::new(),
        }
    }

    /// Worker `w` as it starts: an empty pool, recording its changes when `record`.
    fn fresh_worker(sim: &Simulation, w: usize, record: bool) -> Worker {
        let cfg = sim.config();
        let spec = sim.fleet()[w];
        Worker {
            speed: spec.speed,
            scheduler: Scheduler::new(
                spec.capacity_tokens / cfg.block_size,
                cfg.block_size,
                cfg.batch,
                record,
            )
            .with_progress_every(cfg.progress_every),
            step: None,
            generation: 0,
            down: false,
            batches: 0,
            prefill_tokens: 0,
            busy_s: 0.0,
            jitter: Rng::new(crate::fold::mix64(
                cfg.seed ^ 0x6a69_7474_6572 ^ ((w as u64) << 32),
            )),
        }
    }

    /// Runs the replay to its end, calling `progress(arrived, total)` at every arrival.
    fn drive(mut self, progress: &mut dyn FnMut(usize, usize)) -> Result<SimReport, Error> {
        self.schedule_faults_and_scrapes();
        let sim = self.sim;
        let n = sim.replayed().len();
        while let Some((now, tick)) = self.clock.next() {
            if let Tick::Arrival(_) = tick {
                progress(self.clock.arrived(), n);
            }
            self.tick(now, tick)?;
        }
        Ok(self.report())
    }

    /// Puts the faults and the first load report on the clock.
    fn schedule_faults_and_scrapes(&mut self) {
        for (k, f) in self.sim.faults().iter().enumerate() {
            self.clock.schedule(f.down_s, DOWN, k);
            if f.up_s.is_finite() {
                self.clock.schedule(f.up_s, UP, k);
            }
        }
        let interval = self.sim.config().scrape_interval_s;
        if interval > 0.0 && !self.sim.replayed().is_empty() {
            self.clock
                .schedule(self.sim.arrival(0) + interval, SCRAPE, 0);
        }
    }

    /// Handles one tick of the clock at `now`.
    fn tick(&mut self, now: f64, tick: Tick) -> Result<(), Error> {
        self.handle_tick(now, tick)?;
        self.start_deferred(now)
    }

    /// Starts the deferred steps once no request is left to arrive at `now`, in worker
    /// order.
    fn start_deferred(&mut self, now: f64) -> Result<(), Error> {
        if self.deferred.is_empty() || self.clock.arrival_at(now) {
            return Ok(());
        }
        let mut deferred = std::mem::take(&mut self.deferred);
        deferred.sort_unstable();
        for &w in &deferred {
            if self.workers[w].step.is_none() && !self.workers[w].down {
                self.start_step(w, now)?;
            }
        }
        deferred.clear();
        self.deferred = deferred;
        Ok(())
    }

    /// Starts idle worker `w`'s next step at `now`, or defers it while requests are still
    /// to arrive at `now` (see the module docs).
    fn start_or_defer(&mut self, w: usize, now: f64) -> Result<(), Error> {
        if self.clock.arrival_at(now) {
            if !self.deferred.contains(&w) {
                self.deferred.push(w);
            }
            return Ok(());
        }
        self.start_step(w, now)
    }

    fn handle_tick(&mut self, now: f64, tick: Tick) -> Result<(), Error> {
        match tick {
            Tick::Arrival(i) => self.dispatch(i, now),
            Tick::Timed(STEP_DONE, subject) => self.step_done(subject, now),
            Tick::Timed(DELIVER, _) => self.bus.deliver(now, &mut self.clock),
            Tick::Timed(REPLAY, channel) => self.bus.replayed(channel),
            Tick::Timed(SCRAPE, _) => self.scrape(now),
            Tick::Timed(DOWN, k) => self.down(k, now),
            Tick::Timed(HANDOFF, i) => self.handoff(i, now),
            Tick::Timed(SYNC, _) => self.sync.deliver(&self.replicas, now),
            Tick::Timed(_, k) => self.up(k),
        }
    }

    /// Routes request `i` (arriving, or again after its worker left) and queues it on its
    /// worker, which starts a step if idle.
    fn dispatch(&mut self, i: usize, now: f64) -> Result<(), Error> {
        if self.pd.is_some() {
            return self.dispatch_pair(i, now);
        }
        let Some(routed) = self
            .sim
            .route(&mut self.replicas, i, now, &mut self.tally)?
        else {
            self.clock.ended(i, now);
            return Ok(());
        };
        let w = routed.worker;
        self.sync
            .send(&self.replicas, routed.replica, now, false, &mut self.clock);
        if self.workers[w].down {
            self.replicas
                .router(routed.replica)
                .complete(&routed.decision);
            return Err(Error::UnknownWorker(routed.decision.worker()));
        }
        let output = self.sim.replayed()[i].output_tokens;
        self.seqs[i] = Some(Seq::new(routed.tokens, routed.blocks, output));
        self.flights[i] = Some(Flight {
            replica: routed.replica,
            decision: routed.decision,
            at: routed.at,
        });
        self.workers[w].scheduler.enqueue(i);
        if self.workers[w].step.is_none() {
            self.start_or_defer(w, now)?;
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
        self.publish(w, now)?;
        for &o in &outcomes {
            self.handle(o, w, now)?;
        }
        self.outcomes = outcomes;
        if step.work.is_empty() {
            return Ok(());
        }
        let cfg = self.sim.config();
        let workers = self.workers.len();
        let worker = &mut self.workers[w];
        let jitter = worker.jitter.lognormal_factor(cfg.batch.step_jitter);
        let slow = cfg
            .batch
            .slow_spell
            .map_or(1.0, |spell| spell.factor_at(now));
        let duration =
            step.duration(&cfg.batch, cfg.prefill_tokens_per_s) / worker.speed * jitter * slow;
        worker.prefill_tokens += step.prefill as u64;
        worker.busy_s += duration;
        worker.step = Some((step, now + duration));
        let subject = w + workers * worker.generation;
        self.clock.schedule(now + duration, STEP_DONE, subject);
        Ok(())
    }

    /// A step ends at `now` (`subject` names its worker and generation): its outcomes take
    /// effect, and the next step starts.
    fn step_done(&mut self, subject: usize, now: f64) -> Result<(), Error> {
        let w = subject % self.workers.len();
        if subject / self.workers.len() != self.workers[w].generation {
            return Ok(()); // the step of an engine that has since restarted
        }
        let Some((step, _)) = self.workers[w].step.take() else {
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
        self.publish(w, now)?;
        for &o in &outcomes {
            self.handle(o, w, now)?;
        }
        self.outcomes = outcomes;
        if self.workers[w].scheduler.has_work() {
            self.start_or_defer(w, now)?;
        }
        Ok(())
    }

    /// What outcome `o` of worker `w` at `now` means to the replicas and the tally.
    fn handle(&mut self, o: Outcome, w: usize, now: f64) -> Result<(), Error> {
        if self.pd.is_some() {
            return self.handle_leg(o, w, now);
        }
        match o {
            Outcome::Admitted { seq, hit, host } => {
                self.tally.admitted(seq, now, hit, host);
                let replica = self.flights[seq].as_ref().map(|f| f.replica);
                let feedback =
                    replica.and_then(|r| self.sim.sync_of(&self.replicas, r, SyncMode::Feedback));
                if let (Some(sync), Some(s)) = (feedback, self.seqs[seq].as_ref()) {
                    sync.report_cached(WorkerId::new(w as u32), &s.prompt, hit)?;
                }
            }
            Outcome::FirstToken(i) => {
                self.tally.first_token(i, now);
                if let Some(f) = self.flights[i].as_ref() {
                    let elapsed = std::time::Duration::from_secs_f64((now - f.at).max(0.0));
                    self.replicas
                        .router(f.replica)
                        .first_token_after(&f.decision, elapsed);
                    self.sync
                        .send(&self.replicas, f.replica, now, false, &mut self.clock);
                }
            }
            Outcome::Progress(i) => {
                let generated = self.seqs[i].as_ref().map_or(0, |s| s.generated);
                self.stream(i, generated.saturating_sub(1), now);
            }
            Outcome::Finished(i) => {
                let output = self.sim.replayed()[i].output_tokens.max(1);
                self.tally.finished(i, now, output);
                self.stream(i, output - 1, now);
                self.release(i, now);
                self.clock.ended(i, now);
            }
            Outcome::Preempted(i) => self.tally.preempted(i),
            Outcome::Rejected(i) => {
                self.tally.rejected(i);
                self.release(i, now);
                self.clock.ended(i, now);
            }
        }
        Ok(())
    }

    /// The host streaming request `i`'s answer saw `tokens` output tokens after the first by
    /// `now`: it reports them to the replica that routed it (cumulative, from the first
    /// token), which learns the worker's decode terms and observed step from them.
    fn stream(&mut self, i: usize, tokens: u32, now: f64) {
        if let (Some(f), Some(first)) = (&self.flights[i], self.tally.first_token_at(i)) {
            let elapsed = std::time::Duration::from_secs_f64((now - first).max(0.0));
            self.replicas
                .router(f.replica)
                .tokens_after(&f.decision, tokens, elapsed);
        }
    }

    /// Request `i` leaves its worker at `now`: its replica completes its decision.
    fn release(&mut self, i: usize, now: f64) {
        self.seqs[i] = None;
        if let Some(f) = self.flights[i].take() {
            self.replicas.router(f.replica).complete(&f.decision);
            self.sync
                .send(&self.replicas, f.replica, now, false, &mut self.clock);
        }
    }

    /// Publishes worker `w`'s pool changes since its last batch as its next batch.
    fn publish(&mut self, w: usize, now: f64) -> Result<(), Error> {
        let worker = &mut self.workers[w];
        let (pool, host) = worker.scheduler.drain_changes();
        if pool.changes.is_empty() && host.is_empty() {
            return Ok(());
        }
        let events = super::publish::events(&pool, &host);
        let seq = worker.batches;
        worker.batches += 1;
        let id = WorkerId::new(w as u32);
        self.bus.publish(now, id, seq, events, &mut self.clock)
    }

    /// Every worker in the fleet reports its load to every replica; the next report is
    /// scheduled while requests remain.
    fn scrape(&mut self, now: f64) -> Result<(), Error> {
        for (w, worker) in self.workers.iter().enumerate() {
            if !worker.down {
                let load = worker.scheduler.load(&self.seqs, now);
                self.replicas.report_load(WorkerId::new(w as u32), load)?;
            }
        }
        for r in 0..self.replicas.len() {
            let r = self.replicas.nth(r);
            self.sync
                .send(&self.replicas, r, now, true, &mut self.clock);
        }
        let moving = self.pd.as_ref().is_some_and(pd::PdHost::moving);
        let busy = moving || self.workers.iter().any(|w| w.step.is_some());
        if busy || !self.clock.arrivals_done() {
            let interval = self.sim.config().scrape_interval_s;
            self.clock.schedule(now + interval, SCRAPE, 0);
        }
        Ok(())
    }

    /// Fault `k`'s worker leaves at `now`: every replica removes it, its engine stops and
    /// loses its pool, and its requests are routed again.
    fn down(&mut self, k: usize, now: f64) -> Result<(), Error> {
        let w = self.sim.faults()[k].worker as usize;
        if self.workers[w].down {
            return Ok(());
        }
        self.replicas.remove_worker(WorkerId::new(w as u32))?;
        let old = &self.workers[w];
        let lost: Vec<usize> = old.scheduler.seqs().collect();
        let unspent = old.step.as_ref().map_or(0.0, |&(_, end)| end - now);
        let fresh = Self::fresh_worker(self.sim, w, self.bus.is_listened());
        let old = std::mem::replace(&mut self.workers[w], fresh);
        let worker = &mut self.workers[w];
        worker.generation = old.generation + 1;
        worker.down = true;
        worker.prefill_tokens = old.prefill_tokens;
        worker.busy_s = old.busy_s - unspent;
        for i in lost {
            self.release(i, now);
            self.dispatch(i, now)?;
        }
        Ok(())
    }

    /// Fault `k`'s worker returns, empty: every replica adds it.
    fn up(&mut self, k: usize) -> Result<(), Error> {
        let w = self.sim.faults()[k].worker as usize;
        if !self.workers[w].down {
            return Ok(());
        }
        self.workers[w].down = false;
        self.replicas.add_worker(WorkerId::new(w as u32))
    }

    fn report(mut self) -> SimReport {
        let workers = Workers {
            prefill_tokens: self.workers.iter().map(|w| w.prefill_tokens).collect(),
            busy_s: self.workers.iter().map(|w| w.busy_s).collect(),
        };
        self.tally.lost_event_batches = self.bus.lost();
        self.tally.replica_sync = (self.sync.sent.0, self.sync.sent.1, self.sync.lost);
        self.sim.report(&self.replicas, self.tally, workers)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::index::{CacheIndex, IndexConfig};
    use crate::policies::RoundRobinRouter;
    use crate::sim::{ClusterConfig, Request};
    use proptest::prelude::*;

    /// Prompts of 1 to 6 blocks of 4 tokens from an alphabet of 3 blocks (so that they
    /// share prefixes), arriving 0 to 30 ms apart, with 1 to 8 output tokens.
    pub(super) fn requests() -> impl Strategy<Value = Vec<Request>> {
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

        /// Fed every worker's pool and host-tier changes with no delay and no loss, a mirror
        /// predicts exactly the prefix each worker's pool and host tier would give every
        /// prompt of the run, after every step: the events tell the whole truth.
        #[test]
        fn events_keep_a_mirror_equal_to_every_pool(
            requests in requests(),
            workers in 1u32..4,
            blocks in 2usize..12,
            budget in 4usize..24,
            host_chunks in 0usize..8,
            chunk in 1usize..4,
        ) {
            let batch = crate::sim::BatchConfig::default()
                .with_step(crate::fleet::StepModel::default().with_max_num_batched_tokens(budget))
                .with_host_capacity_tokens(host_chunks * chunk * 4)
                .with_host_chunk_blocks(chunk);
            let config = ClusterConfig::default()
                .with_workers(workers)
                .with_block_size(4)
                .with_capacity_tokens(blocks * 4)
                .with_measure_decision_time(false)
                .with_batch(batch);
            let sim = Simulation::new(requests, config).unwrap();
            let router = RoundRobinRouter::new(workers).unwrap();
            let routers: [&dyn crate::router::Router; 1] = [&router];
            let mirror = CacheIndex::new(
                IndexConfig::default().with_block_size(4).with_host_chunk_blocks(chunk),
            )
            .unwrap();
            let replicas = Replicas::new(&routers, sim.config()).unwrap();
            let mut run = Run::new(&sim, replicas, vec![Some(&mirror)]);
            while let Some((now, tick)) = run.clock.next() {
                run.tick(now, tick).unwrap();
                let arrived = run.clock.arrived();
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
            prop_assert_eq!(report.requests, sim.requests().len());
            let done = report.request_records.iter().all(|r| r.e2e_s.is_some() || r.rejected);
            prop_assert!(done, "every request finished or was dropped");
        }
    }

    /// Requests arriving at one instant on an idle worker share its first step (as the
    /// replay releases an instant's arrivals before it drives its engines); one arriving
    /// during a step waits for the step's end. Steps of 100 ms whatever their work.
    #[test]
    fn requests_arriving_together_share_the_first_step() {
        let profile = crate::sim::StepProfile {
            base_s: 0.1,
            ..crate::sim::StepProfile::default()
        };
        let config = ClusterConfig::default()
            .with_workers(1)
            .with_block_size(4)
            .with_engine(crate::sim::Engine::Batched)
            .with_batch(crate::sim::BatchConfig::default().with_profile(Some(profile)))
            .with_measure_decision_time(false);
        let requests = vec![
            Request::new(0.0, (0..40).collect(), 2),
            Request::new(0.0, (100..140).collect(), 2),
            Request::new(0.0, (200..240).collect(), 2),
            Request::new(0.05, (300..340).collect(), 2),
        ];
        let sim = Simulation::new(requests, config).unwrap();
        let report = sim.run(&RoundRobinRouter::new(1).unwrap()).unwrap();
        let ttft: Vec<f64> = report
            .request_records
            .iter()
            .map(|r| r.ttft_s.unwrap_or(f64::NAN))
            .collect();
        let close = |a: f64, b: f64| (a - b).abs() < 1e-9;
        assert!(
            ttft[..3].iter().all(|&t| close(t, 0.1)),
            "one first step for the three arriving at 0: {ttft:?}"
        );
        assert!(
            close(ttft[3], 0.15),
            "admitted at the first step's end: {ttft:?}"
        );
    }

    /// A request whose prompt fits its worker's pool but whose output does not, alone
    /// there, preempts itself and is then dropped, not left waiting on an idle worker.
    #[test]
    fn a_lone_request_outgrowing_the_pool_is_dropped_not_stranded() {
        let config = ClusterConfig::default()
            .with_workers(1)
            .with_block_size(4)
            .with_capacity_tokens(12)
            .with_engine(crate::sim::Engine::Batched)
            .with_measure_decision_time(false);
        let sim = Simulation::new(vec![Request::new(0.0, (0..12).collect(), 6)], config).unwrap();
        let report = sim.run(&RoundRobinRouter::new(1).unwrap()).unwrap();
        let r = &report.request_records[0];
        assert!(r.ttft_s.is_some(), "its prompt fits: {r:?}");
        assert_eq!((r.preemptions, r.rejected), (1, true), "{r:?}");
    }
}
