//! [`Fleet`]: the registry of workers and what the router believes of each one's load, shared
//! by every policy. It composes the parts below it: the [`Registry`], the [`Clock`], each
//! worker's [`LoadState`](super::registry::state::LoadState), the learned timings and the
//! refusal counts; a route's charges are in `charge.rs`.

use std::sync::Mutex;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::time::Duration;

use super::candidate::{Candidate, Candidates};
use super::clock::{Clock, nanos};
use super::config::{LoadConfig, WorkerProfile};
use super::learned::floor::Floor;
use super::learned::learn::FleetLearned;
use super::learned::timing::TermCounts;
use super::prediction::estimate::{Estimate, Forecast};
use super::registry::least::{Tie, Widened};
use super::registry::slots::{Registered, Registry, check_id};
use super::registry::state::ReportContext;
use super::replicas::peers::{Limits, PeerTable};
use super::report::{EngineLoad, Staleness};
use super::signals::{FleetSignals, ShedCounts, WorkerLoad, WorkerSignals};
use crate::error::Error;
use crate::request::Shed;
use crate::tree::WorkerId;

/// Registry of workers plus per-worker load counters, shared by every policy.
#[derive(Debug)]
pub(crate) struct Fleet {
    pub(super) registry: Registry,
    pub(super) config: LoadConfig,
    /// Tokens per KV block of the workers' engines: reported blocks in tokens.
    pub(super) block_size: u64,
    pub(super) clock: Clock,
    /// Timings learned from, fleet-wide.
    timings: AtomicU64,
    /// What the fleet learned (see `learn.rs`) the workers' timings were last updated with.
    published: Mutex<FleetLearned>,
    /// What the fleet's forecast terms learned (`forecast.rs`), published with `published`.
    forecast_published: Mutex<FleetLearned>,
    /// Requests refused by admission.
    shed: ShedCounts,
    /// The least step terms and greatest speed of any worker.
    floor: Floor,
    /// Peer replicas' requests (`booking.rs` applies their frames).
    pub(super) peers: Mutex<PeerTable>,
    /// Peers heard now (the table's count, read without its lock).
    pub(super) heard: AtomicU64,
    /// [`LoadConfig::busy_horizon`] in nanoseconds.
    busy_horizon_ns: u64,
    /// Whether the host has reported a timed first token or progress for any worker:
    /// until it does, admission's observed gates have nothing to read (`factors.rs`).
    pub(super) reporting: AtomicBool,
}

impl Fleet {
    /// A fleet of workers `0..num_workers`, all available.
    pub(crate) fn new(
        num_workers: u32,
        config: LoadConfig,
        block_size: usize,
    ) -> Result<Self, Error> {
        check_id(num_workers.saturating_sub(1))?;
        config.validate()?;
        let fleet = Self {
            registry: Registry::default(),
            config,
            block_size: block_size as u64,
            clock: Clock::default(),
            timings: AtomicU64::new(0),
            published: Mutex::new(FleetLearned::configured()),
            forecast_published: Mutex::new(FleetLearned::configured()),
            shed: ShedCounts::default(),
            floor: Floor::default(),
            peers: Mutex::new(PeerTable::new(Limits::of(
                &crate::replica::ReplicaConfig::new(0, 0),
            ))),
            heard: AtomicU64::new(0),
            busy_horizon_ns: nanos(config.busy_horizon),
            reporting: AtomicBool::new(false),
        };
        fleet.registry.set_cap(fleet.busy_horizon_ns);
        for w in 0..num_workers {
            fleet.add(WorkerId::new(w))?;
        }
        Ok(fleet)
    }

    pub(crate) fn add(&self, worker: WorkerId) -> Result<(), Error> {
        self.registry.add(worker)?;
        let fleet = *lock(&self.published);
        self.registry.with_slot(worker, |r| {
            self.retime(r, &fleet);
        })
    }

    pub(crate) fn remove(&self, worker: WorkerId) -> Result<(), Error> {
        self.registry.remove(worker)
    }

    /// `Ok` when `worker` is registered.
    pub(crate) fn check(&self, worker: WorkerId) -> Result<(), Error> {
        self.registry.with_slot(worker, |_| ())
    }

    pub(crate) fn set_available(&self, worker: WorkerId, available: bool) -> Result<(), Error> {
        self.registry
            .with_slot(worker, |r| r.slot.available.store(available, Relaxed))
    }

    /// Registered workers (available or not), in id order.
    pub(crate) fn workers(&self) -> Vec<WorkerId> {
        self.registry.workers()
    }

    /// How the fleet reads load.
    #[inline]
    pub(crate) fn config(&self) -> &LoadConfig {
        &self.config
    }

    /// Counts a refusal.
    #[cold]
    pub(crate) fn shed(&self, shed: &Shed) {
        self.shed.count(shed);
    }

    /// Moves the router's clock to `at`, if later.
    #[inline]
    pub(crate) fn observe_time(&self, at: Duration) {
        if let Some(now) = self.clock.observe(at) {
            self.expire(now);
        }
    }

    /// Some report went stale by `now`: refreshes every worker's load key (the staleness
    /// policy changes its load) and finds when the next fresh report goes stale.
    #[cold]
    fn expire(&self, now: u64) {
        let max_age = nanos(self.config.max_report_age);
        let mut next = self.expire_peers(now);
        let slots = self.registry.read();
        for (_, r) in slots.iter() {
            if let Some(at) = r.slot.load.report_ns() {
                let stale_at = at.saturating_add(max_age);
                if stale_at >= now {
                    next = next.min(stale_at);
                }
            }
            self.refresh(r);
        }
        self.clock.next_expiry(next);
    }

    pub(crate) fn report_load(&self, worker: WorkerId, load: EngineLoad) -> Result<(), Error> {
        load.validate()?;
        self.observe_time(load.measured_at);
        self.registry.with_slot(worker, |r| {
            r.slot.load.report(&load);
            self.refresh(r);
        })?;
        if self.config.staleness != Staleness::Hold {
            let stale_at =
                nanos(load.measured_at).saturating_add(nanos(self.config.max_report_age));
            self.clock.expires_at(stale_at);
        }
        Ok(())
    }

    pub(crate) fn set_profile(
        &self,
        worker: WorkerId,
        profile: WorkerProfile,
    ) -> Result<(), Error> {
        profile.validate()?;
        let fleet = *lock(&self.published);
        self.registry.with_slot(worker, |r| {
            r.slot.load.set_profile(&profile);
            self.retime(r, &fleet);
        })
    }

    /// Worker `r`'s load as estimated now.
    #[inline]
    pub(super) fn estimate(&self, r: Registered<'_>) -> Estimate {
        let context = || {
            let routed = r.key.routed.load(Relaxed).max(1);
            let mean_prefill = r.key.assigned_prefill.load(Relaxed) / routed;
            // Replicas not heard through sync are guessed from `replicas` (see `booking.rs`).
            let heard = self.heard.load(Relaxed) + 1;
            ReportContext {
                mean_prefill,
                block_size: self.block_size,
                replicas_over_heard: (u64::from(self.config.replicas).max(heard), heard),
            }
        };
        let now_ns = self.clock.now_ns();
        let mut e = r.slot.load.estimate(&self.config, now_ns, context);
        // The forecast needs timings to read its queue's progress by and to learn from.
        if self.reporting.load(Relaxed) && self.learns() {
            let queued = e.prefill_tokens > 0;
            e.forecast = Some(Forecast {
                timing: r.slot.load.forecast.timing(),
                under_way_s: if queued {
                    self.under_way_s(r, now_ns)
                } else {
                    0.0
                },
            });
        }
        e
    }

    /// Seconds worker `r`'s queued prefill has been under way at `now_ns`: since its last
    /// first token or the route that found none queued, or since the report whose pending
    /// prefill the estimate reads, whichever is later.
    #[cold]
    fn under_way_s(&self, r: Registered<'_>, now_ns: u64) -> f32 {
        let since = r.slot.observed.since_ns();
        let reported = r.slot.load.prefill_report_ns(&self.config, now_ns);
        let start = reported.map_or(since, |at| at.max(since));
        (now_ns.saturating_sub(start) as f64 * 1e-9) as f32
    }

    /// Recomputes worker `r`'s load key after its load changed.
    #[inline]
    pub(super) fn refresh(&self, r: Registered<'_>) {
        self.set_load(r, &self.estimate(r));
    }

    /// A snapshot of `worker`'s load; `None` when it is not registered.
    pub(crate) fn load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        self.registry
            .with_slot(worker, |r| {
                let e = self.estimate(r);
                let reading = (e.prefill_tokens > 0, false);
                let factors =
                    r.slot
                        .observed
                        .factors(self.clock.now_ns(), reading, &e.forecast_timing());
                WorkerLoad::of(r, &e, self.block_size, factors)
            })
            .ok()
    }

    /// The fleet's signals: every worker's, and the refusal counts, at the router's clock.
    pub(crate) fn signals(&self) -> FleetSignals {
        let workers = self
            .workers()
            .into_iter()
            .filter_map(|w| Some(WorkerSignals::of(w, &self.load(w)?)))
            .collect();
        FleetSignals::new(self.clock.now(), workers, self.shed.get())
            .with_shed_by_gate(self.shed.by_gate())
    }

    /// Counts a cached-token report for `worker`: the mirror predicted `predicted` tokens,
    /// the worker reported `reported` (both in whole blocks of the mirror).
    pub(crate) fn reported(&self, worker: WorkerId, predicted: usize, reported: usize) {
        let _ = self
            .registry
            .with_slot(worker, |Registered { slot: s, .. }| {
                s.reports.fetch_add(1, Relaxed);
                s.reported_cached.fetch_add(reported as u64, Relaxed);
                s.predicted_for_reports.fetch_add(predicted as u64, Relaxed);
                if predicted != reported {
                    s.mispredicted.fetch_add(1, Relaxed);
                }
            });
    }

    /// Fills `out` with the available workers, in id order.
    /// The fleet's load (see [`Candidate::fleet_load`]): the mean over the registered
    /// workers of their load capped at [`LoadConfig::busy_horizon`], beyond an idle
    /// worker's (one step of the fleet's least fixed time), as a share of the horizon
    /// beyond it; 0 for an idle fleet of alike workers, 1 once every worker's load reaches
    /// the horizon. Kept summed as load keys change, so a route reads it in O(1).
    #[inline]
    pub(crate) fn load_share(&self) -> f32 {
        let idle_ns = self.floor.step_base_ns();
        self.registry.busy_share(self.busy_horizon_ns, idle_ns)
    }

    /// Sets worker `r`'s load key from `estimate`.
    #[inline]
    pub(super) fn set_load(&self, r: Registered<'_>, estimate: &Estimate) {
        let load_s = estimate.load_s(&self.config);
        self.registry.set_load(r.key, load_s, self.busy_horizon_ns);
    }

    pub(crate) fn candidates(&self, out: &mut Candidates) {
        out.clear();
        let slots = self.registry.read();
        out.reserve(slots.len());
        for (i, r) in slots.iter() {
            if r.slot.available.load(Relaxed) {
                out.push(self.snapshot(i, r));
            }
        }
    }

    /// Fills `out`, in id order, with the least loaded available worker of each class (see
    /// [`Slots::least_of_each`](super::registry::slots::Slots)); returns the number of slots in the
    /// registry (at least the registered workers).
    pub(crate) fn least_of_each(
        &self,
        class_of: &[u16],
        classes: usize,
        salt: u64,
        out: &mut Candidates,
    ) -> usize {
        out.clear();
        let slots = self.registry.read();
        slots.least_of_each(class_of, classes, salt, |i, r| {
            out.push(self.snapshot(i, r));
        });
        slots.len()
    }

    /// Adds to `out` every available worker of a `widened` class that could come before
    /// `best` (see [`Slots::each_below`](super::registry::slots::Slots)) and is not in `out`.
    pub(crate) fn widen(
        &self,
        classes: (&[u16], usize),
        widened: &[Widened],
        best: ((u64, Tie), u64),
        out: &mut Candidates,
    ) {
        let slots = self.registry.read();
        let offered = out.len();
        slots.each_below(classes, widened, best, |i, r| {
            let listed = out[..offered].iter().any(|c| c.worker.index() == i);
            if !listed {
                out.push(self.snapshot(i, r));
            }
        });
    }

    /// A candidate snapshot of slot `i`.
    #[inline]
    fn snapshot(&self, i: usize, r: Registered<'_>) -> Candidate {
        let (load_ns, assigned_prefill, routed) = r.key.get();
        Candidate {
            worker: WorkerId::new(i as u32),
            epoch: r.slot.epoch,
            in_flight: r.slot.load.in_flight.load(Relaxed) + r.slot.load.peers.in_flight(),
            routed,
            assigned_prefill,
            load_ns,
            estimate: self.estimate(r),
            matched_blocks: 0,
            cached_tokens: 0,
            cached_by_tier: [0; 4],
            fleet_load: 0.0,
            kv_room: u32::MAX,
        }
    }

    /// A time `measured` of what `terms` count came from worker `r` (a time to first token
    /// when `first_token`): the worker learns from it, and its timing is updated at once;
    /// every so many timings the fleet's ratios are taken afresh from every worker's and
    /// every worker's timing is updated with them.
    pub(super) fn learn(
        &self,
        r: Registered<'_>,
        (terms, measured): (&TermCounts, f64),
        first_token: bool,
    ) {
        let fleet = *lock(&self.published);
        r.slot
            .load
            .learn(&self.config, &fleet, (terms, measured), first_token);
        if self.timings.fetch_add(1, Relaxed) % PUBLISH_EVERY == 0 {
            self.publish();
        } else {
            self.retime(r, &fleet);
        }
    }

    /// A time `measured` of what the forecast `terms` count came from worker `r` (a time to
    /// first token when `first_token`): its forecast terms learn from it and are updated at
    /// once (the fleet's forecast ratios are taken afresh with the fleet's).
    pub(super) fn learn_forecast(
        &self,
        r: Registered<'_>,
        (terms, measured): (&TermCounts, f64),
        first_token: bool,
    ) {
        let fleet = *lock(&self.forecast_published);
        let configured = r.slot.load.configured(&self.config);
        let forecast = &r.slot.load.forecast;
        forecast.learn((&configured, &fleet), (terms, measured), first_token);
        forecast.update(&configured, &fleet);
    }

    /// Takes what the fleet learned afresh from every worker and updates every worker's
    /// timing with it.
    #[cold]
    fn publish(&self) {
        let slots = self.registry.read();
        let learned: Vec<_> = slots.iter().map(|(_, r)| r.slot.load.learned()).collect();
        let fleet = FleetLearned::of(&learned);
        *lock(&self.published) = fleet;
        let forecast: Vec<_> = slots
            .iter()
            .map(|(_, r)| r.slot.load.forecast.learned())
            .collect();
        *lock(&self.forecast_published) = FleetLearned::of(&forecast);
        for (_, r) in slots.iter() {
            self.retime(r, &fleet);
        }
        let terms = slots
            .iter()
            .map(|(_, r)| (r.slot.load.timing(), r.slot.load.speed()));
        self.floor.reset(terms);
    }

    /// Updates worker `r`'s timing with what the `fleet` learned, the fleet's floor under it
    /// and its load key.
    fn retime(&self, r: Registered<'_>, fleet: &FleetLearned) {
        r.slot.load.update_timing(&self.config, fleet);
        let forecast = *lock(&self.forecast_published);
        let configured = r.slot.load.configured(&self.config);
        r.slot.load.forecast.update(&configured, &forecast);
        self.floor.lower(&r.slot.load.timing(), r.slot.load.speed());
        self.refresh(r);
    }

    /// The load figures of an idle worker with the fleet's least step terms and greatest
    /// speed: no worker's predicted time beyond its load is less than such a worker's (see
    /// [`Estimate::beyond_load_s`]).
    #[inline]
    pub(crate) fn floor(&self) -> Estimate {
        let (timing, speed) = self.floor.get();
        Estimate {
            timing,
            speed,
            ..Estimate::default()
        }
    }
}

/// Timings between two publications of the fleet's ratios to every worker.
const PUBLISH_EVERY: u64 = 16;

/// `mutex`, locked; nothing panics while holding it, so a poisoned one still holds valid
/// data.
pub(super) fn lock<T>(mutex: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    mutex
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}
