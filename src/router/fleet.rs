//! The worker registry and load tracker every policy shares.

use std::sync::RwLock;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering::Relaxed};

use smallvec::SmallVec;

use super::{Candidate, RouteDecision, RouteRequest};
use crate::{Error, RadixTree, WorkerId};

/// Load a host pushes from a worker's own metrics (for example its `/metrics` endpoint).
#[derive(Clone, Copy, Debug, PartialEq, Default)]
#[non_exhaustive]
pub struct ReportedLoad {
    /// Requests waiting or running on the worker, as the worker counts them (this router's
    /// and any other router's).
    pub queue_len: u64,
    /// Fraction of the worker's KV cache in use, `0.0..=1.0`.
    pub kv_usage: f32,
}

impl ReportedLoad {
    /// A report of `queue_len` requests and `kv_usage` (fraction of KV cache in use).
    #[must_use]
    pub fn new(queue_len: u64, kv_usage: f32) -> Self {
        Self {
            queue_len,
            kv_usage,
        }
    }
}

/// A snapshot of one worker's load as the router sees it.
#[derive(Clone, Copy, Debug, PartialEq)]
#[non_exhaustive]
pub struct WorkerLoad {
    /// Whether the worker takes new requests.
    pub available: bool,
    /// Requests routed to it and not yet completed.
    pub in_flight: u64,
    /// Uncached prompt tokens of those requests whose prefill is not known to be done
    /// (prefill work queued or running on it; see [`Router::first_token`](crate::Router::first_token)).
    pub prefill_tokens: u64,
    /// Requests routed to it since it was added.
    pub routed: u64,
    /// Prompt tokens predicted cached, summed over those requests.
    pub predicted_cached_tokens: u64,
    /// The last [`ReportedLoad`] pushed for it.
    pub reported: ReportedLoad,
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
    prefill_tokens: AtomicU64,
    /// Uncached prompt tokens of every request routed to it since it was added.
    assigned_prefill: AtomicU64,
    routed: AtomicU64,
}

impl LoadKey {
    /// A key with `value` in every field: [`LoadKey::VACANT`] for an id with no worker
    /// (above every registered worker's key), 0 for a new registration.
    fn filled(value: u64) -> Self {
        LoadKey {
            prefill_tokens: AtomicU64::new(value),
            assigned_prefill: AtomicU64::new(value),
            routed: AtomicU64::new(value),
        }
    }

    /// The value of every field of an id with no worker.
    const VACANT: u64 = u64::MAX;

    /// The fields, in the order the least-loaded pass compares them.
    fn get(&self) -> (u64, u64, u64) {
        (
            self.prefill_tokens.load(Relaxed),
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
    in_flight: AtomicU64,
    predicted_cached: AtomicU64,
    queue_len: AtomicU64,
    kv_usage_bits: AtomicU32,
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
}

impl Fleet {
    /// A fleet of workers `0..num_workers`, all available.
    pub(crate) fn new(num_workers: u32) -> Result<Self, Error> {
        check_id(num_workers.saturating_sub(1))?;
        let fleet = Self {
            registry: RwLock::new(Registry::default()),
            epochs: AtomicU64::new(0),
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
            in_flight: AtomicU64::new(0),
            predicted_cached: AtomicU64::new(0),
            queue_len: AtomicU64::new(0),
            kv_usage_bits: AtomicU32::new(0),
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

    pub(crate) fn report_load(&self, worker: WorkerId, load: ReportedLoad) -> Result<(), Error> {
        if !(0.0..=1.0).contains(&load.kv_usage) {
            return Err(Error::InvalidConfig {
                field: "kv_usage",
                value: load.kv_usage.to_string(),
                allowed: "a fraction between 0.0 and 1.0",
            });
        }
        self.with_slot(worker, |Registered { slot: s, .. }| {
            s.queue_len.store(load.queue_len, Relaxed);
            s.kv_usage_bits.store(load.kv_usage.to_bits(), Relaxed);
        })
    }

    pub(crate) fn load(&self, worker: WorkerId) -> Option<WorkerLoad> {
        self.with_slot(worker, |Registered { slot: s, key }| WorkerLoad {
            available: s.available.load(Relaxed),
            in_flight: s.in_flight.load(Relaxed),
            prefill_tokens: key.prefill_tokens.load(Relaxed),
            routed: key.routed.load(Relaxed),
            predicted_cached_tokens: s.predicted_cached.load(Relaxed),
            reported: ReportedLoad {
                queue_len: s.queue_len.load(Relaxed),
                kv_usage: f32::from_bits(s.kv_usage_bits.load(Relaxed)),
            },
            reports: s.reports.load(Relaxed),
            reported_cached_tokens: s.reported_cached.load(Relaxed),
            predicted_for_reports_tokens: s.predicted_for_reports.load(Relaxed),
            mispredicted_reports: s.mispredicted.load(Relaxed),
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
                out.push(snapshot(i, r));
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
        let mut all: SmallVec<[Least; 8]> = smallvec::smallvec![Least::default(); classes + 1];
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
                out.push(snapshot(i, r));
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
    ) -> Option<RouteDecision> {
        let (matched_blocks, cached_tokens) =
            (candidate.matched_blocks(), candidate.cached_tokens());
        let by_tier = candidate.cached_by_tier;
        let registry = self.read();
        let Registered { slot, key } = registry.get(candidate.worker.index())?;
        if slot.epoch != candidate.epoch {
            return None;
        }
        let prompt_tokens = request.tokens().len();
        let cached_tokens = cached_tokens.min(prompt_tokens);
        let prefill = (prompt_tokens - cached_tokens) as u64;
        slot.in_flight.fetch_add(1, Relaxed);
        key.prefill_tokens.fetch_add(prefill, Relaxed);
        slot.predicted_cached
            .fetch_add(cached_tokens as u64, Relaxed);
        key.routed.fetch_add(1, Relaxed);
        key.assigned_prefill.fetch_add(prefill, Relaxed);
        Some(RouteDecision::new(
            candidate.worker,
            candidate.epoch,
            prompt_tokens,
            matched_blocks,
            cached_tokens,
            by_tier,
        ))
    }

    /// Takes the decision's prefill tokens off its worker's outstanding prefill, once.
    pub(crate) fn prefilled(&self, decision: &RouteDecision) {
        if !decision.mark_prefilled() {
            return;
        }
        self.with_current(decision, |r| {
            sub(&r.key.prefill_tokens, decision.prefill_tokens() as u64);
        });
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
        self.with_current(decision, |Registered { slot, key }| {
            sub(&slot.in_flight, 1);
            sub(&key.prefill_tokens, prefill);
            sub(&slot.predicted_cached, decision.cached_tokens() as u64);
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
        let prefill = key.prefill_tokens.load(Relaxed);
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

/// A candidate snapshot of slot `i`.
#[inline]
fn snapshot(i: usize, Registered { slot: s, key }: Registered<'_>) -> Candidate {
    let (prefill_tokens, assigned_prefill, routed) = key.get();
    Candidate {
        worker: WorkerId::new(i as u32),
        epoch: s.epoch,
        in_flight: s.in_flight.load(Relaxed),
        prefill_tokens,
        routed,
        assigned_prefill,
        queue_len: s.queue_len.load(Relaxed),
        matched_blocks: 0,
        cached_tokens: 0,
        cached_by_tier: [0; 4],
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
