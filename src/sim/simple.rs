//! [`Engine::Simple`](super::Engine::Simple): each worker prefills one request at a time
//! from a FIFO queue; decoding takes a fixed time per token beside it and holds nothing;
//! the cache is an LRU over blocks that a request's blocks join when its prefill ends.
//! It reports no load and publishes no events (it keeps no pool).

use std::collections::VecDeque;

use super::clock::{Clock, Tick};
use super::config::SyncMode;
use super::references::unbounded;
use super::replicas::Replicas;
use super::report::SimReport;
use super::simulation::{Routed, Simulation};
use super::tally::{Tally, Workers};
use crate::error::Error;
use crate::tree::{RadixTree, WorkerId};

const W0: WorkerId = WorkerId::new(0);

/// Timed events, in the order they go at equal times.
const PREFILL_DONE: u8 = 0;
const COMPLETE: u8 = 1;

/// Replays `sim` through `replicas` on simple workers.
pub(super) fn run(
    sim: &Simulation,
    replicas: Replicas<'_>,
    progress: &mut dyn FnMut(usize, usize),
) -> Result<SimReport, Error> {
    let mut run = Run::new(sim, replicas)?;
    let n = sim.replayed().len();
    while let Some((now, tick)) = run.clock.next() {
        match tick {
            Tick::Arrival(i) => {
                progress(run.clock.arrived(), n);
                run.arrive(i, now)?;
            }
            Tick::Timed(PREFILL_DONE, i) => run.prefill_done(i, now)?,
            Tick::Timed(_, i) => run.complete(i, now),
        }
    }
    Ok(run.report())
}

/// One modelled worker.
struct WorkerSim {
    /// Relative speed.
    speed: f64,
    /// The worker's true KV cache: an LRU over blocks with prefix matching.
    cache: RadixTree,
    queue: VecDeque<usize>,
    busy: bool,
    prefill_tokens: u64,
    busy_s: f64,
}

/// A routed request until it completes.
struct InFlight {
    routed: Routed,
}

/// The state of one replay.
struct Run<'s> {
    sim: &'s Simulation,
    replicas: Replicas<'s>,
    fleet: Vec<WorkerSim>,
    flights: Vec<Option<InFlight>>,
    clock: Clock<'s>,
    tally: Tally,
}

impl<'s> Run<'s> {
    fn new(sim: &'s Simulation, replicas: Replicas<'s>) -> Result<Self, Error> {
        let cfg = sim.config();
        let fleet = sim
            .fleet()
            .iter()
            .map(|spec| {
                let mut cache = unbounded()?;
                cache.set_capacity(W0, spec.capacity_tokens / cfg.block_size);
                Ok(WorkerSim {
                    speed: spec.speed,
                    cache,
                    queue: VecDeque::new(),
                    busy: false,
                    prefill_tokens: 0,
                    busy_s: 0.0,
                })
            })
            .collect::<Result<_, Error>>()?;
        let n = sim.replayed().len();
        Ok(Self {
            sim,
            replicas,
            fleet,
            flights: (0..n).map(|_| None).collect(),
            clock: sim.clock(),
            tally: sim.tally(),
        })
    }

    /// Routes request `i` and queues it on its worker.
    fn arrive(&mut self, i: usize, now: f64) -> Result<(), Error> {
        let Some(routed) = self
            .sim
            .route(&mut self.replicas, i, now, &mut self.tally)?
        else {
            self.clock.ended(i, now);
            return Ok(());
        };
        let w = routed.worker;
        self.flights[i] = Some(InFlight { routed });
        self.fleet[w].queue.push_back(i);
        if !self.fleet[w].busy {
            self.start(w, now)?;
        }
        Ok(())
    }

    /// Request `i`'s first token: its blocks are cached, decoding starts, the worker takes
    /// the next prefill.
    fn prefill_done(&mut self, i: usize, now: f64) -> Result<(), Error> {
        let Some(flight) = self.flights[i].as_ref() else {
            return Ok(());
        };
        let w = flight.routed.worker;
        self.tally.first_token(i, now);
        flight.routed.first_token(&self.replicas, now);
        self.fleet[w].cache.insert(W0, &flight.routed.blocks);
        let output = f64::from(self.sim.replayed()[i].output_tokens);
        let decode = output * self.sim.config().decode_s_per_token / self.fleet[w].speed;
        self.clock.schedule(now + decode, COMPLETE, i);
        self.fleet[w].busy = false;
        if !self.fleet[w].queue.is_empty() {
            self.start(w, now)?;
        }
        Ok(())
    }

    fn complete(&mut self, i: usize, now: f64) {
        if let Some(flight) = self.flights[i].take() {
            self.replicas
                .router(flight.routed.replica)
                .complete(&flight.routed.decision);
            self.tally
                .finished(i, now, self.sim.replayed()[i].output_tokens);
            self.clock.ended(i, now);
        }
    }

    /// Starts the prefill of worker `w`'s next queued request at `now`.
    fn start(&mut self, w: usize, now: f64) -> Result<(), Error> {
        let worker = &mut self.fleet[w];
        let Some(i) = worker.queue.pop_front() else {
            return Ok(());
        };
        let Some(flight) = self.flights[i].as_ref() else {
            return Ok(());
        };
        let cfg = self.sim.config();
        let prompt = flight.routed.tokens.len();
        let cached =
            (worker.cache.held_prefix(W0, &flight.routed.blocks) * cfg.block_size).min(prompt);
        self.tally.admitted(i, now, cached, 0);
        let uncached = prompt - cached;
        worker.prefill_tokens += uncached as u64;
        worker.busy = true;
        let feedback = self
            .sim
            .sync_of(&self.replicas, flight.routed.replica, SyncMode::Feedback);
        if let Some(sync) = feedback {
            sync.report_cached(WorkerId::new(w as u32), &flight.routed.tokens, cached)?;
        }
        let duration = uncached as f64 / (cfg.prefill_tokens_per_s * worker.speed);
        worker.busy_s += duration;
        self.clock.schedule(now + duration, PREFILL_DONE, i);
        Ok(())
    }

    fn report(self) -> SimReport {
        let workers = Workers {
            prefill_tokens: self.fleet.iter().map(|w| w.prefill_tokens).collect(),
            busy_s: self.fleet.iter().map(|w| w.busy_s).collect(),
        };
        self.sim.report(&self.replicas, self.tally, workers)
    }
}
