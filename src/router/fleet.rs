//! The worker registry and load tracker every policy shares.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};

use smallvec::SmallVec;

use super::estimate::{Estimate, LoadState, nanos};
use super::load::{EngineLoad, LoadConfig, WorkerProfile};
use super::signals::ShedCounts;
use super::{Candidate, RouteDecision, RouteRequest, Shed};
use crate::{Error, RadixTree, WorkerId};

/// A snapshot of one worker's load as the router sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct WorkerLoad {
    /// Whether the worker takes new requests.
    pub available: bool,
    /// Requests routed to it by this router and not yet completed.
    pub in_flight: u64,
    /// Uncached prompt tokens of those requests whose prefill is not known to be done
    /// (prefill work queued or running on it; see [`Router::first_token`](crate::Router::first_token)).
    pub prefill_tokens: u64,
    /// Requests on the worker as the router estimates them: the engine's last report
    /// reconciled with this router's counts since (see [`EngineLoad`]).
    pub estimated_requests: u64,
    /// Of those, requests decoding (past their first token).
    pub estimated_decoding: u64,
    /// Uncached prompt tokens to prefill before a new request's, as estimated.
    pub estimated_prefill_tokens: u64,
    /// The worker's speed relative to the configured one: its profile's, corrected by the
    /// timings the host reported ([`Router::first_token_after`](crate::Router::first_token_after)).
    pub speed: f64,
    /// Requests routed to it since it was added.
    pub routed: u64,
    /// Prompt tokens predicted cached, summed over those requests.
    pub predicted_cached_tokens: u64,
    /// Prompt tokens predicted cached, summed over every request routed to it (those
    /// completed too).
    pub captured_tokens: u64,
    /// Prompt tokens predicted uncached (to prefill), summed over every request routed to
    /// it.
    pub uncached_tokens: u64,
    /// Prompt tokens the best holder of each of those prompts held: what sending each to its
    /// best holder would have found cached.
    pub available_cached_tokens: u64,
    /// The load model's predicted wait before a new request's own prefill starts, in
    /// seconds (what the least-loaded rule compares; see
    /// [`WorkerSignals::wait_s`](crate::WorkerSignals::wait_s)).
    pub wait_s: f64,
    /// The last [`EngineLoad`] reported for it.
    pub reported: Option<EngineLoad>,
    /// The load model's error on this worker: measured over predicted time to first token
    /// (weighted towards the recent timings, [`LoadConfig::learning_rate`]), from the timings
    /// the host reported ([`Router::first_token_after`](crate::Router::first_token_after));
    /// `None` before five. 1.0 is a model that predicts the worker exactly; 2.0, first
    /// tokens twice as late as predicted (which admission and the cost then expect).
    pub ttft_measured_over_predicted: Option<f64>,
    /// First-token timings the router learned from for this worker.
    pub ttft_timings: u64,
    /// Cached-token reports received for it
    /// ([`CacheSync::report_cached`](crate::CacheSync::report_cached)).
    pub reports: u64,
    /// Prompt tokens those reports said were cached (in the mirror's whole blocks).
    pub reported_cached_tokens: u64,
    /// Prompt tokens the mirror predicted cached for the same prompts when each report came:
    /// beside `reported_cached_tokens`, how far the mirror is from the truth (a block size,
    /// LoRA, group or hash mismatch shows as a large gap instead of staying silent).
    pub predicted_for_reports_tokens: u64,
    /// Reports that disagreed with the mirror's prediction.
    pub mispredicted_reports: u64,
}

/// One registered worker's counters that the least-loaded pass compares, in the order it
/// compares them: lock-free, read and written under the registry's read lock.
#[derive(Debug)]
struct LoadKey {
    /// The worker's load (nanoseconds, [`Estimate::load_s`]), refreshed whenever it
    /// changes.
    load_ns: AtomicU64,
    /// Uncached prompt tokens of every request routed to it since it was added.
    assigned_prefill: AtomicU64,
    routed: AtomicU64,
}

impl LoadKey {
    /// A key with `value` in every field: [`LoadKey::VACANT`] for an id with no worker
    /// (above every registered worker's key), 0 for a new registration.
    fn filled(value: u64) -> Self {
        LoadKey {
            load_ns: AtomicU64::new(value),
            assigned_prefill: AtomicU64::new(value),
            routed: AtomicU64::new(value),
        }
    }

    /// The value of every field of an id with no worker.
    const VACANT: u64 = u64::MAX;

    /// The fields, in the order the least-loaded pass compares them.
    fn get(&self) -> (u64, u64, u64) {
        (
            self.load_ns.load(Relaxed),
            self.assigned_prefill.load(Relaxed),
            self.routed.load(Relaxed),
        )
    }
}

/// One registered worker's other counters, lock-free like its [`LoadKey`].
#[derive(Debug)]
struct Slot {
    available: AtomicBool,
    /// Distinguishes this registration from an earlier one of the same id, so that a
    /// decision made before a remove / add does not release the new registration's load.
    epoch: u64,
    load: LoadState,
    predicted_cached: AtomicU64,
    /// Blocks the deepest holder held, summed over the requests routed here.
    available_blocks: AtomicU64,
    /// Tokens predicted cached here, summed over the requests routed here.
    captured: AtomicU64,
    reports: AtomicU64,
    reported_cached: AtomicU64,
    predicted_for_reports: AtomicU64,
    mispredicted: AtomicU64,
}

/// Candidates of one route call; on the stack for fleets of up to 64 workers.
pub(crate) type Candidates = SmallVec<[Candidate; 64]>;

/// The workers by id: a slot per id (`None` where no worker is registered) and, apart, the
/// column of their load keys, which the least-loaded pass reads from end to end.
///
/// Invariant: `keys.len() == slots.len()`, and the key of an id with no worker is
/// filled with [`LoadKey::VACANT`].
#[derive(Debug, Default)]
struct Registry {
    slots: Vec<Option<Slot>>,
    keys: Vec<LoadKey>,
}

/// A registered worker's slot and load key.
#[derive(Clone, Copy)]
struct Registered<'a> {
    slot: &'a Slot,
    key: &'a LoadKey,
}

impl Registry {
    /// Worker `i`, if registered.
    #[inline]
    fn get(&self, i: usize) -> Option<Registered<'_>> {
        let slot = self.slots.get(i)?.as_ref()?;
        let key = self.keys.get(i)?;
        Some(Registered { slot, key })
    }

    /// Worker `i`, if registered and available.
    #[inline]
    fn available(&self, i: usize) -> Option<Registered<'_>> {
        self.get(i).filter(|r| r.slot.available.load(Relaxed))
    }

    /// Registered workers by id, in id order.
    fn iter(&self) -> impl Iterator<Item = (usize, Registered<'_>)> {
        (0..self.slots.len()).filter_map(|i| Some((i, self.get(i)?)))
    }
}

/// Registry of workers plus per-worker load counters, shared by every policy.
///
/// The registry is behind a `RwLock` taken for writing only by add / remove; routing takes
/// it for reading, and the counters are atomics.
#[derive(Debug)]
pub(crate) struct Fleet {
    registry: RwLock<Registry>,
    epochs: AtomicU64,
    config: LoadConfig,
    /// Tokens per KV block of the workers' engines: reported blocks in tokens.
    block_size: u64,
    /// The router's clock: the latest time a report or a request carried (nanoseconds).
    now_ns: AtomicU64,
    /// No report goes stale before this time (nanoseconds; a lower bound): past it, the
    /// load keys are refreshed ([`Fleet::expire`]).
    expiry_ns: AtomicU64,
    /// The fleet's reference log ratio of observed to predicted first-token times (f64
    /// bits; see [`Fleet::recalibrate`]).
    reference_bits: AtomicU64,
    /// Timings learned from, fleet-wide.
    timings: AtomicU64,
    /// Requests refused by admission.
    shed: ShedCounts,
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
            registry: RwLock::new(Registry::default()),
            epochs: AtomicU64::new(0),
            config,
            block_size: block_size as u64,
            now_ns: AtomicU64::new(0),
            expiry_ns: AtomicU64::new(u64::MAX),
            reference_bits: AtomicU64::new(0.0f64.to_bits()),
            timings: AtomicU64::new(0),
            shed: ShedCounts::default(),
        };
        for w in 0..num_workers {
            fleet.add(WorkerId::new(w))?;
        }
        Ok(fleet)
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, Registry> {
        // Nothing panics while holding the lock; a poisoned lock still holds valid data.
        self.registry
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, Registry> {
        self.registry
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub(crate) fn add(&self, worker: WorkerId) -> Result<(), Error> {
        check_id(worker.get())?;
        let mut registry = self.write();
        let registry = &mut *registry;
        let i = worker.index();
        if registry.slots.len() <= i {
            registry.slots.resize_with(i + 1, || None);
            registry
                .keys
                .resize_with(i + 1, || LoadKey::filled(LoadKey::VACANT));
        }
        if registry.slots[i].is_some() {
            return Err(Error::WorkerExists(worker));
        }
        registry.keys[i] = LoadKey::filled(0);
        registry.slots[i] = Some(Slot {
            epoch: self.epochs.fetch_add(1, Relaxed) + 1,
            available: AtomicBool::new(true),
            load: LoadState::default(),
            predicted_cached: AtomicU64::new(0),
            available_blocks: AtomicU64::new(0),
            captured: AtomicU64::new(0),
            reports: AtomicU64::new(0),
            reported_cached: AtomicU64::new(0),
            predicted_for_reports: AtomicU64::new(0),
            mispredicted: AtomicU64::new(0),
        });
        Ok(())
    }

    pub(crate) fn remove(&self, worker: WorkerId) -> Result<(), Error> {
        let mut registry = self.write();
        let i = worker.index();
        match registry.slots.get_mut(i) {
            Some(slot @ Some(_)) => {
                *slot = None;
                if let Some(key) = registry.keys.get_mut(i) {
                    *key = LoadKey::filled(LoadKey::VACANT);
                }
                Ok(())
            }
            _ => Err(Error::UnknownWorker(worker)),
        }
    }

    fn with_slot<T>(
        &self,
        worker: WorkerId,
        f: impl FnOnce(Registered<'_>) -> T,
    ) -> Result<T, Error> {
        let registry = self.read();
        match registry.get(worker.index()) {
            Some(r) => Ok(f(r)),
            None => Err(Error::UnknownWorker(worker)),
        }
    }

    /// `Ok` when `worker` is registered.
    pub(crate) fn check(&self, worker: WorkerId) -> Result<(), Error> {
        self.with_slot(worker, |_| ())
    }

    pub(crate) fn set_available(&self, worker: WorkerId, available: bool) -> Result<(), Error> {
        self.with_slot(worker, |r| r.slot.available.store(available, Relaxed))
    }

    /// How the fleet reads load.
    pub(crate) fn config(&self) -> &LoadConfig {
        &self.config
    }

    /// Counts a refusal.
    #[cold]
    pub(crate) fn shed(&self, shed: &Shed) {
        self.shed.count(shed);
    }

    /// The router's clock and the refusal counts.
    pub(crate) fn clock_and_shed(&self) -> (std::time::Duration, ([u64; 5], [u64; 3])) {
        let at = std::time::Duration::from_nanos(self.now_ns.load(Relaxed));
        (at, self.shed.get())
    }

    /// Moves the router's clock to `at`, if later.
    pub(crate) fn observe_time(&self, at: std::time::Duration) {
        let now = nanos(at);
        self.now_ns.fetch_max(now, Relaxed);
        if now > self.expiry_ns.load(Relaxed) {
            self.expire(now);
        }
    }

    /// Some report went stale by `now`: refreshes every worker's load key (the staleness
    /// policy changes its load) and finds when the next fresh report goes stale.
    #[cold]
    fn expire(&self, now: u64) {
        let max_age = nanos(self.config.max_report_age);
        let mut next = u64::MAX;
        let registry = self.read();
        for (_, r) in registry.iter() {
            if let Some(at) = r.slot.load.report_ns() {
                let stale_at = at.saturating_add(max_age);
                if stale_at >= now {
                    next = next.min(stale_at);
                }
            }
            self.refresh(r);
        }
        self.expiry_ns.store(next, Relaxed);
    }

    pub(crate) fn report_load(&self, worker: WorkerId, load: EngineLoad) -> Result<(), Error> {
        load.validate()?;
        self.observe_time(load.measured_at);
        self.with_slot(worker, |r| {
            r.slot.load.report(&load);
            self.refresh(r);
        })?;
        if self.config.staleness != super::load::Staleness::Hold {
            let stale_at =
                nanos(load.measured_at).saturating_add(nanos(self.config.max_report_age));
            self.expiry_ns.fetch_min(stale_at, Relaxed);
        }
        Ok(())
    }

    pub(crate) fn set_profile(
        &self,
        worker: WorkerId,
        profile: WorkerProfile,
    ) -> Result<(), Error> {
        profile.validate()?;
        self.with_slot(worker, |r| {
            r.slot.load.set_profile(&profile);
            r.slot.load.update_speed(self.reference());
            self.refresh(r);
        })
    }

    /// Worker `r`'s load as estimated now.
    fn estimate(&self, r: Registered<'_>) -> Estimate {
        let routed = r.key.routed.load(Relaxed).max(1);
        let mean_prefill = r.key.assigned_prefill.load(Relaxed) / routed;
        let now = self.now_ns.load(Relaxed);
        let context = (mean_prefill, self.block_size);
        r.slot.load.estimate(&self.config, now, context)
    }

    /// Recomputes worker `r`'s load key after its load changed.
    fn refresh(&self, r: Registered<'_>) {
        let load = self.estimate(r).load_s(&self.config);
        r.key.load_ns.store((load * 1e9) as u64, Relaxed);
    }

    pub(crate) fn load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        self.with_slot(worker, |r| {
            let Registered { slot: s, key } = r;
            let e = self.estimate(r);
            WorkerLoad {
                available: s.available.load(Relaxed),
                in_flight: s.load.in_flight.load(Relaxed),
                prefill_tokens: s.load.prefill_tokens.load(Relaxed),
                estimated_requests: e.requests,
                estimated_decoding: e.decoding,
                estimated_prefill_tokens: e.prefill_tokens,
                speed: f64::from(e.speed),
                routed: key.routed.load(Relaxed),
                predicted_cached_tokens: s.predicted_cached.load(Relaxed),
                captured_tokens: s.captured.load(Relaxed),
                uncached_tokens: key.assigned_prefill.load(Relaxed),
                available_cached_tokens: s.available_blocks.load(Relaxed) * self.block_size,
                wait_s: key.load_ns.load(Relaxed) as f64 * 1e-9,
                reported: s.load.last_report(),
                ttft_measured_over_predicted: s.load.timing_error().map(|(ratio, _)| ratio),
                ttft_timings: s.load.timings(),
                reports: s.reports.load(Relaxed),
                reported_cached_tokens: s.reported_cached.load(Relaxed),
                predicted_for_reports_tokens: s.predicted_for_reports.load(Relaxed),
                mispredicted_reports: s.mispredicted.load(Relaxed),
            }
        })
        .ok()
    }

    /// Counts a cached-token report for `worker`: the mirror predicted `predicted` tokens,
    /// the worker reported `reported` (both in whole blocks of the mirror).
    pub(crate) fn reported(&self, worker: WorkerId, predicted: usize, reported: usize) {
        let _ = self.with_slot(worker, |Registered { slot: s, .. }| {
            s.reports.fetch_add(1, Relaxed);
            s.reported_cached.fetch_add(reported as u64, Relaxed);
            s.predicted_for_reports.fetch_add(predicted as u64, Relaxed);
            if predicted != reported {
                s.mispredicted.fetch_add(1, Relaxed);
            }
        });
    }

    /// Registered workers (available or not), in id order.
    pub(crate) fn workers(&self) -> Vec<WorkerId> {
        let registry = self.read();
        registry
            .iter()
            .map(|(i, _)| WorkerId::new(i as u32))
            .collect()
    }

    /// Fills `out` with the available workers, in id order.
    pub(crate) fn candidates(&self, out: &mut Candidates) {
        out.clear();
        let registry = self.read();
        out.reserve(registry.slots.len());
        for (i, r) in registry.iter() {
            if r.slot.available.load(Relaxed) {
                out.push(self.snapshot(i, r));
            }
        }
    }

    /// Fills `out`, in id order, with the least loaded available worker of each class:
    /// `class_of[i]` is worker `i`'s class (`classes` of them), [`NO_CLASS`] or beyond the
    /// slice a class of its own. "Least loaded" is the fewest outstanding prefill tokens, then
    /// the least prefill handed out, then the fewest routed, then a per-request rotation
    /// (`salt`), as [`pick_min`] breaks ties.
    pub(crate) fn least_of_each(
        &self,
        class_of: &[u16],
        classes: usize,
        salt: u64,
        out: &mut Candidates,
    ) {
        out.clear();
        let registry = self.read();
        let mut all: SmallVec<[Least; 8]> = if classes < 8 {
            SmallVec::from_buf_and_len([Least::default(); 8], classes + 1)
        } else {
            smallvec::smallvec![Least::default(); classes + 1]
        };
        let least = all.as_mut_slice();
        let keys = &registry.keys;
        let nothing = classes;
        // Workers past `class_of` are of no class.
        let split = class_of.len().min(keys.len());
        for ((i, key), &class) in keys[..split].iter().enumerate().zip(class_of) {
            if let Some(l) = least.get_mut(usize::from(class).min(nothing)) {
                l.offer(i, key, &registry, salt);
            }
        }
        if let Some(l) = least.get_mut(nothing) {
            for (i, key) in keys.iter().enumerate().skip(split) {
                l.offer(i, key, &registry, salt);
            }
        }
        let mut winners: SmallVec<[usize; 8]> = all.iter().filter_map(Least::slot).collect();
        winners.sort_unstable();
        for i in winners {
            if let Some(r) = registry.get(i) {
                out.push(self.snapshot(i, r));
            }
        }
    }

    /// Charges the chosen worker with the request (and the candidate's predicted cached
    /// tokens), unless it was removed (or removed and added again) since it was chosen: then
    /// `None`, and the caller chooses again.
    pub(crate) fn commit(
        &self,
        candidate: &Candidate,
        request: &RouteRequest<'_>,
        available_blocks: u32,
    ) -> Option<RouteDecision> {
        let (matched_blocks, cached_tokens) =
            (candidate.matched_blocks(), candidate.cached_tokens());
        let by_tier = candidate.cached_by_tier;
        let registry = self.read();
        let r = registry.get(candidate.worker.index())?;
        let Registered { slot, key } = r;
        if slot.epoch != candidate.epoch {
            return None;
        }
        let prompt_tokens = request.tokens().len();
        let cached_tokens = cached_tokens.min(prompt_tokens);
        let prefill = (prompt_tokens - cached_tokens) as u64;
        // What the load model predicts at the worker's configured speed (its load key, at
        // its estimated speed, and this request's prefill): the timing the host reports
        // later is compared with it.
        let speed = f64::from(candidate.estimate.speed);
        let profile = slot.load.profile_speed();
        let before = key.load_ns.load(Relaxed) as f64 * 1e-9;
        let rate = self.config.prefill_tokens_per_s * profile;
        let predicted = before * speed / profile + prefill as f64 / rate;
        let output = request
            .expected_output()
            .unwrap_or(self.config.default_output_tokens);
        slot.load.routed(prompt_tokens as u64, prefill, output);
        slot.predicted_cached
            .fetch_add(cached_tokens as u64, Relaxed);
        slot.available_blocks
            .fetch_add(u64::from(available_blocks), Relaxed);
        slot.captured.fetch_add(cached_tokens as u64, Relaxed);
        key.routed.fetch_add(1, Relaxed);
        key.assigned_prefill.fetch_add(prefill, Relaxed);
        // The candidate's snapshot with this request added, as a refresh would read it.
        let mut after = candidate.estimate;
        after.requests += 1;
        after.prefill_tokens += prefill;
        after.context_tokens += prompt_tokens as u64 + u64::from(output);
        after.kv_tokens += prefill + u64::from(output);
        let load = after.load_s(&self.config);
        key.load_ns.store((load * 1e9) as u64, Relaxed);
        Some(
            RouteDecision::new(
                candidate.worker,
                candidate.epoch,
                prompt_tokens,
                matched_blocks,
                cached_tokens,
                by_tier,
            )
            .with_prediction(predicted, output),
        )
    }

    /// Takes the decision's prefill tokens off its worker's outstanding prefill, once;
    /// with the time the first token took, learns the worker's speed from it.
    pub(crate) fn prefilled(&self, decision: &RouteDecision, elapsed: Option<std::time::Duration>) {
        if !decision.mark_prefilled() {
            return;
        }
        self.with_current(decision, |r| {
            r.slot.load.first_token(decision.prefill_tokens() as u64);
            if let Some(elapsed) = elapsed {
                let rate = self.config.learning_rate;
                r.slot
                    .load
                    .learn(elapsed.as_secs_f64(), decision.predicted_ttft_s(), rate);
                r.slot.load.update_speed(self.reference());
            }
            self.refresh(r);
        });
        if elapsed.is_some() && self.timings.fetch_add(1, Relaxed) % RECALIBRATE_EVERY == 0 {
            self.recalibrate();
        }
    }

    /// Sets the fleet's reference to the lower quartile of the workers' log ratios of
    /// observed to predicted first-token times: what most workers' timings share (queueing
    /// the load model does not see, a prefill rate configured too high) is not any one
    /// worker's speed, and the lower quartile keeps a slow half of the fleet slow.
    #[cold]
    fn recalibrate(&self) {
        let registry = self.read();
        let mut ratios: SmallVec<[f64; 64]> = registry
            .iter()
            .filter_map(|(_, r)| r.slot.load.log_ratio())
            .collect();
        if ratios.is_empty() {
            return;
        }
        ratios.sort_unstable_by(f64::total_cmp);
        let reference = ratios[(ratios.len() - 1) / 4];
        let before = self.reference_bits.swap(reference.to_bits(), Relaxed);
        if before == reference.to_bits() {
            return;
        }
        for (_, r) in registry.iter() {
            r.slot.load.update_speed(reference);
            self.refresh(r);
        }
    }

    /// The fleet's reference log ratio (see [`Fleet::recalibrate`]).
    fn reference(&self) -> f64 {
        f64::from_bits(self.reference_bits.load(Relaxed))
    }

    /// Runs `f` on the decision's worker slot if it is still the same registration.
    fn with_current(&self, decision: &RouteDecision, f: impl FnOnce(Registered<'_>)) {
        let registry = self.read();
        if let Some(r) = registry.get(decision.worker().index()) {
            if r.slot.epoch == decision.epoch() {
                f(r);
            }
        }
    }

    /// Releases what `commit` charged, once; a no-op when the decision was already released
    /// or its worker was removed since.
    pub(crate) fn release(&self, decision: &RouteDecision) {
        let Some(prefill_outstanding) = decision.mark_released() else {
            return;
        };
        let prefill = if prefill_outstanding {
            decision.prefill_tokens() as u64
        } else {
            0
        };
        self.with_current(decision, |r| {
            if prefill_outstanding {
                r.slot.load.first_token(prefill);
            }
            let prompt = decision.prompt_tokens() as u64;
            let uncached = decision.prefill_tokens() as u64;
            r.slot
                .load
                .completed(prompt, uncached, decision.output_tokens());
            sub(&r.slot.predicted_cached, decision.cached_tokens() as u64);
            self.refresh(r);
        });
    }
}

/// Takes back what `commit` added. Each decision is released once (its state bits and the
/// registration epoch see to it), so a counter never goes below zero.
fn sub(counter: &AtomicU64, by: u64) {
    counter.fetch_sub(by, Relaxed);
}

/// Worker ids index dense arrays (and the tree's bitsets): they are bounded.
fn check_id(id: u32) -> Result<(), Error> {
    if id >= RadixTree::MAX_WORKERS {
        return Err(Error::WorkerOutOfRange {
            worker: id,
            limit: RadixTree::MAX_WORKERS,
        });
    }
    Ok(())
}

/// A deterministic 64-bit mix (SplitMix64's finaliser), for tie-breaks and seeded choices.
#[inline]
pub(crate) fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// First-token timings between two recalibrations of the fleet's reference.
const RECALIBRATE_EVERY: u64 = 16;

/// A worker of no class in [`Fleet::least_of_each`].
pub(crate) const NO_CLASS: u16 = u16::MAX;

/// The least loaded slot offered so far, by (prefill tokens, prefill handed out, routed),
/// then the per-request rotation: [`pick_min`]'s order among workers a policy scores alike.
/// `slot` is `usize::MAX` until a slot is offered (whose key is then below the initial one).
#[derive(Clone, Copy)]
struct Least {
    slot: usize,
    key: (u64, u64, u64),
    /// The slot's rotation, computed when it became the least.
    spread: u64,
}

impl Default for Least {
    fn default() -> Self {
        Least {
            slot: usize::MAX,
            key: (u64::MAX, u64::MAX, u64::MAX),
            spread: u64::MAX,
        }
    }
}

impl Least {
    /// Offers id `i`, whose key is `key`; each field is read only where the ones before it
    /// tie. Whether a worker is registered and available is read only when it would become
    /// the least (an id with no worker has the highest key).
    #[inline(always)]
    fn offer(&mut self, i: usize, key: &LoadKey, registry: &Registry, salt: u64) {
        let prefill = key.load_ns.load(Relaxed);
        if prefill != self.key.0 {
            if prefill < self.key.0 {
                self.take(i, registry, salt);
            }
            return;
        }
        let assigned = key.assigned_prefill.load(Relaxed);
        if assigned != self.key.1 {
            if assigned < self.key.1 {
                self.take(i, registry, salt);
            }
            return;
        }
        let routed = key.routed.load(Relaxed);
        if routed < self.key.2 || (routed == self.key.2 && spread(salt, i) < self.spread) {
            self.take(i, registry, salt);
        }
    }

    /// Id `i` becomes the least if it is an available worker.
    #[cold]
    fn take(&mut self, i: usize, registry: &Registry, salt: u64) {
        if let Some(r) = registry.available(i) {
            *self = Least {
                slot: i,
                key: r.key.get(),
                spread: spread(salt, i),
            };
        }
    }

    fn slot(&self) -> Option<usize> {
        (self.slot != usize::MAX).then_some(self.slot)
    }
}

impl Fleet {
    /// A candidate snapshot of slot `i`.
    #[inline]
    fn snapshot(&self, i: usize, r: Registered<'_>) -> Candidate {
        let (_, assigned_prefill, routed) = r.key.get();
        Candidate {
            worker: WorkerId::new(i as u32),
            epoch: r.slot.epoch,
            in_flight: r.slot.load.in_flight.load(Relaxed),
            routed,
            assigned_prefill,
            estimate: self.estimate(r),
            matched_blocks: 0,
            cached_tokens: 0,
            cached_by_tier: [0; 4],
        }
    }
}

/// The per-request rotation that breaks a full tie in favour of worker `i`: the id, xored
/// with the request's salt, times an odd constant. For each salt it orders the ids
/// differently (a bijection), and it costs two instructions a worker in the
/// least-loaded pass, where idle workers all tie.
#[inline]
fn spread(salt: u64, i: usize) -> u64 {
    ((i as u64) ^ salt).wrapping_mul(0x9E37_79B9_7F4A_7C15)
}

/// Picks the candidate with the smallest `key`; remaining ties go to the worker that has
/// been routed the fewest requests so far, then to a per-request rotation (`salt`), never
/// to the lowest id.
pub(crate) fn pick_min<K: PartialOrd>(
    candidates: &[Candidate],
    salt: u64,
    mut key: impl FnMut(usize, &Candidate) -> K,
) -> Option<usize> {
    let spread = |c: &Candidate| spread(salt, c.worker.index());
    let mut best: Option<(usize, K)> = None;
    for (i, c) in candidates.iter().enumerate() {
        let k = key(i, c);
        let better = match &best {
            None => true,
            Some((b, bk)) => match k.partial_cmp(bk) {
                Some(core::cmp::Ordering::Less) => true,
                Some(core::cmp::Ordering::Greater) => false,
                Some(core::cmp::Ordering::Equal) | None => {
                    let bc = &candidates[*b];
                    (c.routed, spread(c)) < (bc.routed, spread(bc))
                }
            },
        };
        if better {
            best = Some((i, k));
        }
    }
    best.map(|(i, _)| i)
}
